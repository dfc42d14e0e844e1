"""Handcrafted GGUF bytes for the loader's hostile-file tests: every field written as given,
however wrong (the `gguf` package's writer refuses most of what these tests need).

    craft(kvs=[("general.architecture", STRING, "llama")], tensors=[("a", [32], F32, 0)],
          data=b"...")  -> bytes

A kv is (key, value type, value): value types are GGUF's ids (UINT8=0 ... FLOAT64=12), an
ARRAY value is (element type, [elements]) and nested arrays nest the same way; `raw`
replaces the encoded value bytes. A tensor is (name, dims, ggml type, offset). Counts and
the version can be forced to lie.
"""

from __future__ import annotations

import struct

UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_FMT = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f", BOOL: "<?",
        UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}
F32 = 0


def string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value(vtype: int, v) -> bytes:
    if vtype == STRING:
        return string(v)
    if vtype == ARRAY:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(value(etype, x) for x in items)
    return struct.pack(_FMT[vtype], v)


def craft(kvs=(), tensors=(), data: bytes = b"", version: int = 3, n_tensors: int | None = None,
          n_kv: int | None = None, alignment: int = 32, magic: bytes = b"GGUF") -> bytes:
    out = bytearray(magic + struct.pack("<I", version))
    out += struct.pack("<QQ", len(tensors) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv)
    for kv in kvs:
        key, vtype, v = kv[:3]
        out += string(key) + struct.pack("<I", vtype) + (kv[3] if len(kv) > 3 else value(vtype, v))
    for name, dims, ggml_type, offset in tensors:
        out += string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ggml_type, offset)
    out += b"\0" * (-len(out) % alignment)
    return bytes(out + data)


def rewrite(src, dst, key: str, new: tuple | None) -> None:
    """Copy the GGUF src to dst with metadata `key` replaced by new = (value type, value,
    element type or None), or removed when new is None; tensors copied as they are."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(src)
    writer = GGUFWriter(str(dst), arch="", use_temp_file=False)
    writer.kv_data[0].clear()  # the writer's own general.architecture: the copy has its own
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):
            continue
        if field.name == key:
            if new is not None:
                vtype, value, sub = new
                writer.add_key_value(key, value, GGUFValueType(vtype), None if sub is None else GGUFValueType(sub))
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)  # the reader's shape: bytes for packed types
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
