"""Reading and writing safetensors files without torch.

What lives here: `SafetensorsDir` (a Hugging Face checkpoint's weights: `model.safetensors`,
or the shards that `model.safetensors.index.json` names, memory-mapped; tensors come out as
NumPy arrays in the file's dtype, BF16 as float32) and `write_safetensors`, which streams
tensors into one file, all or nothing. What does not: what the tensors mean (families.py).

The format (github.com/huggingface/safetensors): an 8-byte little-endian header length, a JSON
header mapping each name to {dtype, shape, data_offsets} relative to the end of the header,
then the data, row-major, little-endian. The `safetensors` package reads into memory and has
no bfloat16 for NumPy, and a file is this simple, so edgekv reads and writes it itself.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

from ..atomic_file import AtomicFile
from ..errors import ConvertError
from ..gguf.reader import release_mapped
from .json_files import json_file

# safetensors dtype -> (NumPy dtype as stored, bytes per element)
DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
          "F64": np.dtype("<f8"), "I64": np.dtype("<i8"), "I32": np.dtype("<i4"),
          "I16": np.dtype("<i2"), "I8": np.dtype("i1"), "U8": np.dtype("u1"), "BOOL": np.dtype("?")}
MAX_HEADER = 100 << 20


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32, exactly."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def as_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Stored elements as float32 (F32 ones are not copied: treat the result as read-only)."""
    if dtype == "BF16":
        return bf16_to_f32(raw)
    return np.asarray(raw, dtype=np.float32)


@dataclass(frozen=True)
class StoredTensor:
    name: str
    dtype: str  # safetensors name: F32, F16, BF16, ...
    shape: tuple[int, ...]
    raw: np.ndarray  # the stored elements, a view into the mapping
    mapping: mmap.mmap

    def release(self, view: np.ndarray | None = None) -> None:
        """Drop the pages under `view` (default: the whole tensor) from resident memory once
        they are written out: peak memory stays near one slab whatever the model size."""
        release_mapped(self.mapping, self.raw if view is None else view)


class SafetensorsFile:
    """One .safetensors file, memory-mapped; `tensors` in the header's order."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise ConvertError(f"{self.path}: too short to be a safetensors file")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (n,) = struct.unpack("<Q", self._map[:8])
        if n > min(MAX_HEADER, size - 8):
            raise ConvertError(f"{self.path}: header length {n} does not fit the file; is it a safetensors file?")
        try:
            header = json.loads(self._map[8:8 + n])
        except ValueError as e:
            raise ConvertError(f"{self.path}: the header is not valid JSON ({e}); the file is corrupt") from None
        self.metadata = header.pop("__metadata__", None) or {}
        start, data = 8 + n, np.frombuffer(self._map, np.uint8)
        self.tensors: dict[str, StoredTensor] = {}
        for name, info in header.items():
            self.tensors[name] = self._tensor(name, info, data, start, size)

    def _tensor(self, name, info, data, start, size) -> StoredTensor:
        try:
            dtype, shape, (a, b) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ConvertError(f"{self.path}: tensor {name!r} has a malformed header entry {info!r}") from None
        if dtype not in DTYPES:
            raise ConvertError(f"{self.path}: tensor {name!r} has dtype {dtype}, which edgekv cannot read "
                               f"(known: {', '.join(DTYPES)})")
        nbytes = math.prod(shape) * DTYPES[dtype].itemsize
        if not (0 <= a <= b and b - a == nbytes and start + b <= size):
            raise ConvertError(f"{self.path}: tensor {name!r} ({dtype} {list(shape)}) has data offsets "
                               f"[{a}, {b}] that do not fit its size or the file; the file is truncated or corrupt")
        raw = data[start + a:start + b].view(DTYPES[dtype]).reshape(shape)
        return StoredTensor(name, dtype, shape, raw, self._map)


class SafetensorsDir:
    """The weights of a Hugging Face checkpoint directory, across shards, by name."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = os.fspath(directory)
        self.files = [SafetensorsFile(os.path.join(self.directory, p)) for p in self._part_names()]
        self.tensors: dict[str, StoredTensor] = {}
        for f in self.files:
            for name, t in f.tensors.items():
                if name in self.tensors:
                    raise ConvertError(f"{f.path}: tensor {name!r} is also in another shard")
                self.tensors[name] = t
        self._check_index()

    def _part_names(self) -> list[str]:
        index = os.path.join(self.directory, "model.safetensors.index.json")
        if os.path.isfile(index):
            self._weight_map = json_file(self.directory, "model.safetensors.index.json").get("weight_map")
            if not isinstance(self._weight_map, dict):
                raise ConvertError(f"{index}: no 'weight_map' object")
            parts = sorted(set(self._weight_map.values()))
        else:
            self._weight_map = None
            parts = sorted(p for p in os.listdir(self.directory)
                           if p.startswith("model") and p.endswith(".safetensors"))
        if not parts:
            raise ConvertError(f"{self.directory}: no model.safetensors (or model-0000x-of-0000y.safetensors "
                               f"shards); edgekv converts safetensors checkpoints, not pytorch_model.bin")
        missing = [p for p in parts if not os.path.isfile(os.path.join(self.directory, p))]
        if missing:
            raise ConvertError(f"{self.directory}: missing shard(s) {', '.join(missing)} named by the index; "
                               f"download them too")
        return parts

    def _check_index(self) -> None:
        if self._weight_map is None:
            return
        missing = sorted(set(self._weight_map) - set(self.tensors))
        if missing:
            raise ConvertError(f"{self.directory}: tensors named in model.safetensors.index.json are in no shard: "
                               f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")


def write_safetensors(path: str | os.PathLike, tensors: list[tuple[str, str, tuple[int, ...]]], chunks,
                      metadata: dict[str, str] | None = None) -> None:
    """Write `tensors` ((name, dtype, shape), in order) whose bytes `chunks` yields tensor by
    tensor (one array each); the file appears only when complete."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, dtype, shape in tensors:
        n = math.prod(shape) * DTYPES[dtype].itemsize
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the reference writer aligns the data to 8 bytes
    with AtomicFile(os.fspath(path)) as out:
        out.write(struct.pack("<Q", len(blob)) + blob)
        for (name, dtype, shape), arr in zip(tensors, chunks):
            arr = np.ascontiguousarray(arr)
            if arr.dtype != DTYPES[dtype] or arr.shape != tuple(shape):
                raise ValueError(f"{name}: got {arr.dtype} {arr.shape}, declared {dtype} {shape}")
            out.write(arr.tobytes())
