"""Malformed GGUF files for the loader's and `edgekv inspect`'s tests (test_gguf_hostile.py,
test_gguf_fuzz.py, test_numerics.py, test_inspect.py).

    ARCH, ONE, DATA    the parts of the valid base file every handcrafted case starts from
    CASES              each malformed kind llama.cpp's test-gguf knows: name -> (the fields
                       gguf_craft.craft writes wrong, the message the loader must name)
    fuzz_tool()        tools/fuzz_gguf.py, the mutation fuzzer, imported afresh by path
    poisoned(...)      a copy of a GGUF file with one tensor's bytes edited
"""

from __future__ import annotations

import importlib.util
import shutil
import struct
from pathlib import Path

from gguf import GGUFReader

from gguf_craft import ARRAY, INT32, STRING, UINT32, UINT64, UINT8

TOOLS = Path(__file__).resolve().parents[2] / "tools"

ARCH = ("general.architecture", STRING, "llama")
ONE = ("w", [32], 0, 0)  # an F32 tensor of 32 values at offset 0
DATA = b"\0" * 128

CASES = {
    "bad magic": (dict(magic=b"GGML"), "not a GGUF file"),
    "version 1": (dict(version=1), "version 1 is not supported"),
    "version 4": (dict(version=4), "version 4 is not supported"),
    "tensor count over the bytes": (dict(n_tensors=2**40), "corrupt header"),
    "kv count over the bytes": (dict(n_kv=2**63), "corrupt header"),
    "kv count one too many": (dict(n_kv=2), "0 dimensions"),  # the tensor directory read as a kv
    "string length over the file": (dict(kvs=[("k", STRING, None, struct.pack("<Q", 2**62) + b"ab")]),
                                    "truncated or corrupt"),
    "array over the file": (dict(kvs=[("k", ARRAY, None, struct.pack("<IQ", UINT32, 2**61))]), "truncated or corrupt"),
    "array of u64 wrapping": (dict(kvs=[("k", ARRAY, None, struct.pack("<IQ", UINT64, 2**61 + 1))]),
                              "truncated or corrupt"),
    "string array over the file": (dict(kvs=[("k", ARRAY, None, struct.pack("<IQ", STRING, 2**63))]),
                                   "strings, more than the file"),
    "nested arrays over the file": (dict(kvs=[("k", ARRAY, None, struct.pack("<IQ", ARRAY, 2**63 - 1))]),
                                    "nested arrays, more than the file"),
    "unknown value type": (dict(kvs=[("k", 13, None, b"\0" * 8)]), "unknown value type 13"),
    "unknown element type": (dict(kvs=[("k", ARRAY, None, struct.pack("<IQ", 99, 1))]), "unknown element type 99"),
    "key not UTF-8": (dict(kvs=[(b"\xff\xfe", UINT8, 1)]), "not valid UTF-8"),
    "duplicate key": (dict(kvs=[ARCH]), "appears twice"),
    "alignment 0": (dict(kvs=[("general.alignment", UINT32, 0)]), "must be a power of two"),
    "alignment 48": (dict(kvs=[("general.alignment", UINT32, 48)]), "must be a power of two"),
    "alignment of the wrong type": (dict(kvs=[("general.alignment", INT32, 32)]), "expected 4 \\(uint32\\)"),
    "five dimensions": (dict(tensors=[("w", [32, 1, 1, 1, 1], 0, 0)]), "5 dimensions"),
    "zero dimension": (dict(tensors=[("w", [32, 0], 0, 0)]), "is invalid"),
    "element count overflows 64 bits": (dict(tensors=[("w", [2**32, 2**32, 2**32], 0, 0)]), "needs bytes"),
    "byte size near 2^63": (dict(tensors=[("w", [2**61], 0, 0)]), "needs bytes"),
    "unknown ggml type": (dict(tensors=[("w", [32], 99, 0)]), "unknown ggml type 99"),
    "negative ggml type": (dict(tensors=[("w", [32], 2**32 - 1, 0)]), "unknown ggml type 4294967295"),
    "row not a multiple of the block": (dict(tensors=[("w", [33], 8, 0)]), "multiple of 32"),
    "offset out of the file": (dict(tensors=[("w", [32], 0, 2**63)]), "needs bytes"),
    "offset not aligned": (dict(tensors=[("w", [8], 0, 4)]), "not a multiple of the alignment"),
    "duplicate tensor name": (dict(tensors=[ONE, ("w", [8], 0, 64)]), "appears twice"),
    "overlapping tensors": (dict(tensors=[ONE, ("v", [32], 0, 96)], data=b"\0" * 256), "overlap"),
    "tensor past the end": (dict(tensors=[("w", [64], 0, 0)]), "needs bytes"),
}


def fuzz_tool():
    spec = importlib.util.spec_from_file_location("fuzz_gguf", TOOLS / "fuzz_gguf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def poisoned(src, dst, tensor: str, edit) -> str:
    """Copy the GGUF src to dst with edit(bytes of `tensor`) -> new bytes of the same size."""
    shutil.copyfile(src, dst)
    t = next(t for t in GGUFReader(src).tensors if t.name == tensor)
    raw = bytearray(open(src, "rb").read()[t.data_offset : t.data_offset + t.n_bytes])
    new = edit(raw)
    assert len(new) == len(raw)
    with open(dst, "r+b") as f:
        f.seek(t.data_offset)
        f.write(new)
    return str(dst)
