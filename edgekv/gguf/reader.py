"""Validated, memory-mapped access to a GGUF file.

What lives here: parsing the header, metadata and tensor directory, with every length,
count and offset checked against the file before it is used, and raw tensor bytes as
zero-copy views of one read-only memory map. What does not: block formats (gguf/quants.py)
and what a tensor means to a model (models/).

Why our own parser: the `gguf` package's GGUFReader makes a NumPy view per array
element, which takes ~8 s for Gemma 3's 262,144-token vocabulary; reading arrays in
bulk takes ~0.1 s. We still use the package's constants (value and tensor types,
block sizes), which are the format's reference.

Layout (little-endian): "GGUF" u32 version, u64 n_tensors, u64 n_kv; n_kv times
(string key, u32 value type, value); n_tensors times (string name, u32 n_dims,
u64 ne[n_dims], u32 ggml type, u64 offset); padding to `general.alignment` (32);
tensor data. A string is u64 length + UTF-8 bytes; an array is u32 element type,
u64 count, elements.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import GGUFError

GGUF_MAGIC = b"GGUF"
MAX_DIMS = 4

# value type id -> (struct format, numpy dtype) for fixed-size scalars
_SCALARS = {0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
            4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_),
            10: ("<Q", np.uint64), 11: ("<q", np.int64), 12: ("<d", np.float64)}
_STRING, _ARRAY = 8, 9


def tensor_nbytes(shape: tuple[int, ...], ggml_type: int) -> int:
    """Bytes of a tensor of this shape (ggml order) and type; Python ints, no wrap-around."""
    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    return math.prod(shape) // block * type_size


@dataclass(frozen=True)
class TensorInfo:
    """One tensor: ggml shape order (ne[0] is the contiguous row length) and raw bytes."""

    name: str
    shape: tuple[int, ...]  # (ne0, ne1, ...): ne0 elements per row
    ggml_type: int
    data: np.ndarray  # uint8 view into the mapping, exactly the tensor's bytes

    @property
    def n_rows(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def row_length(self) -> int:
        return int(self.shape[0])


class _Cursor:
    """Bounds-checked little-endian reads from the mapped file."""

    def __init__(self, buf: mmap.mmap, path: str):
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def take(self, n: int, what: str) -> int:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(f"{self.path}: truncated or corrupt: {what} needs {n} bytes at offset "
                            f"{self.pos}, the file has {self.size}")
        start = self.pos
        self.pos += n
        return start

    def scalar(self, fmt: str, what: str):
        start = self.take(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.buf, start)[0]

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what + " length")
        start = self.take(n, what)
        try:
            return bytes(self.buf[start : start + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: {what} at offset {start} is not valid UTF-8") from None

    def strings(self, count: int, what: str) -> list[str]:
        # string() in a loop, inlined: a vocabulary holds 50k-260k of them
        buf, pos, size, out = self.buf, self.pos, self.size, []
        length = struct.Struct("<Q").unpack_from
        for i in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.take(8, f"{what}[{i}] length")
            n = length(buf, pos)[0]
            pos += 8
            if n > size - pos:
                self.pos = pos
                self.take(n, f"{what}[{i}]")
            try:
                out.append(buf[pos:pos + n].decode("utf-8"))
            except UnicodeDecodeError:
                raise GGUFError(f"{self.path}: {what}[{i}] at offset {pos} is not valid UTF-8") from None
            pos += n
        self.pos = pos
        return out

    def value(self, vtype: int, what: str) -> Any:
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype][0], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            etype = self.scalar("<I", what + " element type")
            count = self.scalar("<Q", what + " element count")
            return self.array(etype, count, what)
        raise GGUFError(f"{self.path}: {what} has unknown value type {vtype} (expected 0..12)")

    def array(self, etype: int, count: int, what: str) -> Any:
        if etype in _SCALARS:
            dtype = np.dtype(_SCALARS[etype][1])
            start = self.take(count * dtype.itemsize, what)
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=start)
            return arr.tolist()
        if etype == _STRING:
            if count * 8 > self.size - self.pos:  # each string takes 8 bytes at least
                raise GGUFError(f"{self.path}: {what} claims {count} strings, more than the file could hold")
            return self.strings(count, what)
        if etype == _ARRAY:
            if count * 12 > self.size - self.pos:  # each nested array takes 12 bytes at least
                raise GGUFError(f"{self.path}: {what} claims {count} nested arrays, more than the file could hold")
            return [self.value(_ARRAY, f"{what}[{i}]") for i in range(count)]
        raise GGUFError(f"{self.path}: {what} has unknown element type {etype}")


def release_mapped(mapping: mmap.mmap, view: np.ndarray | None = None) -> None:
    """Drop the pages of a read-only memory map under `view` (an array into it; None: all
    of it) from this process's resident memory. The OS keeps them in its page cache, and
    reading them again faults them back in, so this only lowers the peak memory of callers
    that have copied what they need (weights repacked at load, tensors written out)."""
    if not hasattr(mmap, "MADV_DONTNEED"):
        return
    if view is None:
        mapping.madvise(mmap.MADV_DONTNEED)
        return
    base = np.frombuffer(mapping, np.uint8, count=1).ctypes.data
    start = view.ctypes.data - base
    end = start + view.nbytes
    if 0 <= start <= end <= len(mapping):
        start -= start % mmap.PAGESIZE  # whole pages; a neighbour's page is merely re-read
        mapping.madvise(mmap.MADV_DONTNEED, start, end - start)


class GGUFFile:
    """A GGUF file opened read-only through a memory map. `pack_store`: where the loader keeps
    the CPU layout of its weights between loads (backends/pack_store.py; None: nowhere)."""

    pack_store = None

    @property
    def base_address(self) -> int:
        """Where the file's mapping starts: a tensor's bytes lie at base_address + their offset."""
        return np.frombuffer(self._map, np.uint8, count=1).ctypes.data

    def release_pages(self, view: np.ndarray | None = None) -> None:
        """Drop the file's pages under `view` (a tensor's data or a slice of it; None: the
        whole file) from this process's resident memory (`release_mapped`)."""
        release_mapped(self._map, view)

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise GGUFError(f"{self.path}: no such file")
        with open(self.path, "rb") as f:
            if os.fstat(f.fileno()).st_size < 24:
                raise GGUFError(f"{self.path}: too short to be a GGUF file")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        cur = _Cursor(self._map, self.path)
        self.version, n_tensors, n_kv = self._header(cur)
        self.metadata: dict[str, Any] = {}
        self.kv_spans: dict[str, tuple[int, int]] = {}  # key -> byte span of its whole entry
        for i in range(n_kv):
            entry = cur.pos
            key = cur.string(f"metadata key #{i}")
            if key in self.metadata:
                raise GGUFError(f"{self.path}: metadata key {key!r} appears twice")
            vtype = cur.scalar("<I", f"type of {key!r}")
            if key == "general.alignment" and vtype != 4:
                raise GGUFError(f"{self.path}: general.alignment has value type {vtype}, expected 4 (uint32)")
            self.metadata[key] = cur.value(vtype, f"metadata {key!r}")
            self.kv_spans[key] = (entry, cur.pos)
        infos = [self._tensor_info(cur, i) for i in range(n_tensors)]
        alignment = int(self.metadata.get("general.alignment", 32))
        if alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"{self.path}: general.alignment = {alignment} must be a power of two")
        data_start = -(-cur.pos // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, ggml_type, offset in infos:
            if name in self.tensors:
                raise GGUFError(f"{self.path}: tensor {name!r} appears twice in the tensor directory")
            if offset % alignment:
                raise GGUFError(f"{self.path}: tensor {name!r} has offset {offset}, not a multiple of the "
                                f"alignment {alignment}")
            self.tensors[name] = self._tensor(name, shape, ggml_type, data_start + offset)
        self._check_overlaps()

    def _header(self, cur: _Cursor) -> tuple[int, int, int]:
        magic = bytes(self._map[:4])
        cur.take(4, "magic")
        if magic != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        version = cur.scalar("<I", "version")
        if version not in (2, 3):
            raise GGUFError(f"{self.path}: GGUF version {version} is not supported (expected 2 or 3)")
        n_tensors, n_kv = cur.scalar("<Q", "tensor count"), cur.scalar("<Q", "metadata count")
        if n_tensors > cur.size or n_kv > cur.size:
            raise GGUFError(f"{self.path}: corrupt header ({n_tensors} tensors, {n_kv} metadata keys)")
        return version, n_tensors, n_kv

    def _tensor_info(self, cur: _Cursor, i: int):
        name = cur.string(f"tensor #{i} name")
        n_dims = cur.scalar("<I", f"tensor {name!r} n_dims")
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFError(f"{self.path}: tensor {name!r} has {n_dims} dimensions (expected 1..{MAX_DIMS})")
        shape = tuple(cur.scalar("<Q", f"tensor {name!r} shape") for _ in range(n_dims))
        ggml_type = cur.scalar("<I", f"tensor {name!r} type")
        offset = cur.scalar("<Q", f"tensor {name!r} offset")
        return name, shape, ggml_type, offset

    def _tensor(self, name: str, shape: tuple[int, ...], ggml_type: int, start: int) -> TensorInfo:
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            raise GGUFError(f"{self.path}: tensor {name!r} has unknown ggml type {ggml_type}") from None
        if any(d <= 0 for d in shape) or shape[0] % block:
            raise GGUFError(f"{self.path}: tensor {name!r} shape {list(shape)} is invalid for type "
                            f"{GGMLQuantizationType(ggml_type).name} (rows must be a multiple of {block})")
        n_bytes = math.prod(shape) // block * type_size  # Python ints: a lying shape cannot wrap around
        if start + n_bytes > len(self._map):
            raise GGUFError(f"{self.path}: tensor {name!r} needs bytes {start}..{start + n_bytes} but the "
                            f"file has {len(self._map)} bytes (truncated download?)")
        data = np.frombuffer(self._map, dtype=np.uint8, count=n_bytes, offset=start)
        return TensorInfo(name, shape, ggml_type, data)

    def _check_overlaps(self) -> None:
        spans = sorted((int(t.data.ctypes.data), int(t.data.nbytes), t.name) for t in self.tensors.values())
        for (a, n, first), (b, _, second) in zip(spans, spans[1:]):
            if b < a + n:
                raise GGUFError(f"{self.path}: tensors {first!r} and {second!r} overlap in the file")

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture"))

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: required metadata key {key!r} is missing")
        return self.metadata[key]

    def raw_kv(self, key: str) -> bytes:
        """A metadata entry exactly as the file encodes it (key, value type, value), for
        copying it into another file."""
        start, end = self.kv_spans[key]
        return bytes(self._map[start:end])

    def tensor(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise GGUFError(f"{self.path}: required tensor {name!r} is missing")
        return self.tensors[name]
