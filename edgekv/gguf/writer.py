"""Writing a GGUF file tensor by tensor, all or nothing.

What lives here: encoding metadata entries (`kv_u32`, `kv_string`, `kv_entry` for any type; entries copied from
another file pass through as their raw bytes, `GGUFFile.raw_kv`), and `GGUFOutput`, which
writes the header and tensor directory, then each tensor's bytes as they are produced, into an
AtomicFile (atomic_file.py) that becomes the destination only when every tensor is in. On any error, disk full included, the temporary file is removed and no
partial output is left. What does not: reading (gguf/reader.py), what goes in (quantize/model.py).

The layout is llama.cpp's (gguf.cpp): version 3; metadata in the order given; tensor offsets
and the data section aligned to `general.alignment` (32), zero padding after each tensor.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from gguf import GGMLQuantizationType as T

from ..atomic_file import AtomicFile
from .reader import tensor_nbytes

GGUF_VERSION = 3
_U32, _STRING = 4, 8


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv_u32(key: str, value: int) -> bytes:
    return _string(key) + struct.pack("<II", _U32, value)


def kv_string(key: str, value: str) -> bytes:
    return _string(key) + struct.pack("<I", _STRING) + _string(value)


# GGUF value type -> struct format (gguf.cpp's gguf_type)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_ARRAY = 9


def _value(value, vtype: int, sub_type: int | None) -> bytes:
    if vtype == _STRING:
        return _string(value) if isinstance(value, str) else struct.pack("<Q", len(value)) + bytes(value)
    if vtype == _ARRAY:
        items = list(value)
        return struct.pack("<IQ", sub_type, len(items)) + b"".join(_value(v, sub_type, None) for v in items)
    return struct.pack(_SCALARS[vtype], value)


def kv_entry(key: str, value, vtype: int, sub_type: int | None = None) -> bytes:
    """One metadata entry of any GGUF value type (arrays of scalars or strings; a string given
    as bytes is written as they are)."""
    return _string(key) + struct.pack("<I", vtype) + _value(value, vtype, sub_type)


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]  # ggml order, ne0 first
    ggml_type: T

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.shape, self.ggml_type)


def _pad(n: int, alignment: int) -> int:
    return -n % alignment


class GGUFOutput:
    """`with GGUFOutput(path, kvs, tensors) as out: out.write(chunk)...`: the tensors' bytes in
    directory order; the file appears at `path` when the block ends without an error and every
    tensor is complete."""

    def __init__(self, path: str | os.PathLike, kvs: list[bytes], tensors: list[TensorEntry],
                 alignment: int = 32):
        self.path = os.fspath(path)
        self.tensors, self.alignment = tensors, alignment
        self._kvs = kvs
        self._index, self._written = 0, 0  # tensor being written, its bytes so far
        self._file = None

    def __enter__(self) -> GGUFOutput:
        self._file = AtomicFile(self.path)
        try:
            self._file.write(self._header())
        except BaseException:
            self._file.discard()
            raise
        return self

    def _header(self) -> bytes:
        out = bytearray(b"GGUF" + struct.pack("<IQQ", GGUF_VERSION, len(self.tensors), len(self._kvs)))
        for kv in self._kvs:
            out += kv
        offset = 0
        for t in self.tensors:
            out += _string(t.name) + struct.pack("<I", len(t.shape))
            out += b"".join(struct.pack("<Q", d) for d in t.shape)
            out += struct.pack("<IQ", int(t.ggml_type), offset)
            offset += t.nbytes + _pad(t.nbytes, self.alignment)
        return bytes(out + b"\0" * _pad(len(out), self.alignment))

    def write(self, chunk) -> None:
        """The next bytes of the current tensor (any buffer); padding follows the last."""
        t = self.tensors[self._index]
        n = memoryview(chunk).nbytes
        if self._written + n > t.nbytes:
            raise ValueError(f"tensor {t.name!r}: {self._written + n} bytes written, it has {t.nbytes}")
        self._file.write(chunk)
        self._written += n
        if self._written == t.nbytes:
            self._file.write(b"\0" * _pad(t.nbytes, self.alignment))
            self._index, self._written = self._index + 1, 0

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._file.discard()
            return
        if self._index != len(self.tensors):
            self._file.discard()
            raise ValueError(f"{self.path}: only {self._index} of {len(self.tensors)} tensors were written")
        self._file.commit()
