"""State files: a session's live KV slots, tokens and last logits on disk, safe to reload.

What lives here: the file format, `save_session` (atomic: temp file + rename),
`load_session` (transactional: the whole file is validated before the session changes)
and `model_fingerprint`. What does not: the in-memory snapshot itself
(`Session.snapshot` / `Session.restore`, session.py) and the facade methods
(`Llama.save_state_file` / `load_state_file`, api/llama_state.py).

Layout (all integers little-endian; version 1):

    offset  size  field
    0       4     magic b"EKVS"
    4       4     u32 version
    8       8     u64 header_nbytes
    16      8     u64 data_nbytes
    24      H     header: UTF-8 JSON object (H = header_nbytes)
    24+H    D     data: the arrays' raw bytes, C order, each at its `offset` from here
    24+H+D  32    SHA-256 of every byte before it

Header keys: format ("edgekv-state"), model_fingerprint, n_layers, n_kv_heads, head_dim_k,
head_dim_v, n_ctx, layer_capacities (per layer: n_ctx, or a windowed ring's size), n_vocab,
cache_type_k, cache_type_v, n_tokens, tokens (list of ids), arrays (list of {name, dtype,
shape, offset, nbytes}). Arrays, with m_i live slots in layer i:

    slots.{i}      i32[m_i]                             layer i's live slots
    positions.{i}  i32[m_i]                             their absolute positions (slot_pos)
    k.{i}          u8[n_kv_heads, m_i, row_bytes_k]     their K rows, in cache_type_k
    v.{i}          u8[n_kv_heads, m_i, row_bytes_v]     their V rows, in cache_type_v
    ring           i64[2, n_layers]                     slots ever used, windowed rings' write pointer
    logits         f32[n_vocab]                         after the last token (absent if none)
    key_mean       f32[n_layers, n_kv_heads, head_dim_k]  a calibrated K type's key map (kv/key_map.KeyMap)
    key_scale      f32[n_layers, n_kv_heads, head_dim_k]  (these three only when cache_type_k is one)
    sink_k         f32[n_layers, n_kv_heads, SINKS, head_dim_k]  its sink rows (KVCache.sink_k)
    attention      f32[n_layers, n_kv_heads, n_tokens]  the attention each position received per
                                                        layer and KV head (`keep` sessions only)
    attention_seen f32[n_tokens]                        from how many queries (with `attention`)

Only live slots are stored (slot_pos >= 0), so a state of 100 tokens in a 4096-token
context is small; loading puts each row back in the slot it came from. Dtypes are a fixed
list of plain numeric types: nothing in a file is ever executed or unpickled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
from typing import Any

import numpy as np

from .kv.cache import KeyMap
from .errors import StateFileError
from .session import Session, SessionState

MAGIC = b"EKVS"
VERSION = 1
FORMAT = "edgekv-state"
_PREAMBLE = struct.Struct("<4sIQQ")  # magic, version, header_nbytes, data_nbytes
_DIGEST_NBYTES = 32
_DTYPES = {"<i4": np.int32, "<i8": np.int64, "|u1": np.uint8, "<f4": np.float32}
_MAX_HEADER_NBYTES = 64 << 20  # tokens as JSON: far more than any context needs
_FINGERPRINT_EDGE = 64 << 10


def model_fingerprint(model) -> str:
    """sha256 (hex) of a loaded model's architecture, hyperparameters, every tensor's name,
    type and shape, and the file's first and last 64 KiB: tells models apart without
    hashing gigabytes. `model` is a loader.Model."""
    h = hashlib.sha256()
    meta = dict(arch=model.gguf.architecture, hp=dataclasses.asdict(model.hp),
                tensors=[[t.name, int(t.ggml_type), list(map(int, t.shape)), int(t.data.nbytes)]
                         for t in model.gguf.tensors.values()])
    h.update(json.dumps(meta, sort_keys=True, default=str).encode())
    with open(model.path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        h.update(f.read(_FINGERPRINT_EDGE))
        f.seek(max(0, size - _FINGERPRINT_EDGE))
        h.update(f.read(_FINGERPRINT_EDGE))
    return h.hexdigest()


def _geometry(session: Session) -> dict[str, Any]:
    """The header fields a state and the session loading it must agree on."""
    c = session.cache
    return dict(n_layers=len(c.k), n_kv_heads=c.k[0].shape[0], head_dim_k=c.head_dim_k, head_dim_v=c.head_dim_v,
                n_ctx=session.n_ctx, layer_capacities=[a.shape[1] for a in c.k], n_vocab=session.n_vocab,
                cache_type_k=c.type_k, cache_type_v=c.type_v)


def _expected_arrays(session: Session, n_live: list[int], has_logits: bool, has_attention: bool,
                     n_tokens: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) of every array a state with n_live[i] live slots in layer i must hold."""
    c = session.cache
    out = {}
    for i, (k, v, m) in enumerate(zip(c.k, c.v, n_live)):
        out[f"slots.{i}"] = out[f"positions.{i}"] = ("<i4", (m,))
        out[f"k.{i}"] = ("|u1", (k.shape[0], m, k.shape[2]))
        out[f"v.{i}"] = ("|u1", (v.shape[0], m, v.shape[2]))
    out["ring"] = ("<i8", (2, len(c.k)))
    if c.sink_k is not None:
        out["key_mean"] = out["key_scale"] = ("<f4", c.key_map.mean.shape)
        out["sink_k"] = ("<f4", c.sink_k.shape)
    if has_logits:
        out["logits"] = ("<f4", (session.n_vocab,))
    if has_attention:
        out["attention"] = ("<f4", (len(c.k), c.k[0].shape[0], n_tokens))
        out["attention_seen"] = ("<f4", (n_tokens,))
    return out


def save_session(session: Session, model_fingerprint: str, path: str | os.PathLike) -> None:
    """Write the session's live state to `path` atomically: a reader sees the old file or the
    new one, never a part (the data goes to path.tmp, which is then renamed over path)."""
    snap = session.snapshot()
    arrays: dict[str, np.ndarray] = {}
    for i, (pos, k, v) in enumerate(zip(snap.slot_pos, snap.k, snap.v)):
        live = np.flatnonzero(pos >= 0)
        arrays[f"slots.{i}"], arrays[f"positions.{i}"] = live.astype(np.int32), pos[live].astype(np.int32)
        arrays[f"k.{i}"], arrays[f"v.{i}"] = k[:, live, :], v[:, live, :]  # fancy index: contiguous copies
    arrays["ring"] = snap.ring.astype(np.int64)
    if snap.key_map is not None:
        arrays["key_mean"], arrays["key_scale"], arrays["sink_k"] = snap.key_map.mean, snap.key_map.scale, snap.sink_k
    if snap.logits is not None:
        arrays["logits"] = snap.logits.astype(np.float32)
    if snap.attention is not None:
        arrays["attention"], arrays["attention_seen"] = snap.attention, snap.attention_seen
    descriptors, offset = [], 0
    for name, a in arrays.items():
        a = arrays[name] = np.ascontiguousarray(a)
        descriptors.append(dict(name=name, dtype=a.dtype.str, shape=list(a.shape), offset=offset, nbytes=a.nbytes))
        offset += a.nbytes
    header = dict(format=FORMAT, model_fingerprint=model_fingerprint, **_geometry(session),
                  n_tokens=snap.n_tokens, tokens=list(snap.tokens), arrays=descriptors)
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    _write_atomically(os.fspath(path), [_PREAMBLE.pack(MAGIC, VERSION, len(header_bytes), offset), header_bytes,
                                        *(memoryview(a.reshape(-1).view(np.uint8)) for a in arrays.values())])


def _write_atomically(path: str, parts: list) -> None:
    tmp = path + ".tmp"
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                digest.update(part)
                f.write(part)
            f.write(digest.digest())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def load_session(session: Session, model_fingerprint: str, path: str | os.PathLike) -> None:
    """Put the state saved in `path` into `session`. The file is read and checked completely
    first (magic, version, size, checksum, model fingerprint, geometry, every array); on any
    mismatch StateFileError names the field and the session is left as it was."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            buf = f.read()
    except OSError as exc:
        raise StateFileError(f"cannot read the state file {path}: {exc}", field="path") from exc
    state = _parse(buf, path, session, model_fingerprint)
    session.restore(state)


def _fail(path: str, field: str, message: str) -> StateFileError:
    return StateFileError(f"state file {path}: {field}: {message}", field=field)


def state_file_n_ctx(path: str | os.PathLike) -> int | None:
    """The n_ctx a state file was saved with, or None when it cannot be read (load_session
    then says exactly why). Lets a caller with an automatic context size match it first."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            header, _, _ = _read_header(f.read(), path)
    except (OSError, StateFileError):
        return None
    n_ctx = header.get("n_ctx")
    return n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0 else None


def _parse(buf: bytes, path: str, session: Session, fingerprint: str) -> SessionState:
    header, body, header_end = _read_header(buf, path)
    _check_header(header, path, session, fingerprint)
    arrays = _read_arrays(header, body[header_end:], path, session)
    return _to_state(header, arrays, path, session)


def _read_header(buf: bytes, path: str) -> tuple[dict, memoryview, int]:
    """Preamble, size, checksum and header of a state file: (header, body, end of header)."""
    if buf[:4] != MAGIC:
        raise _fail(path, "magic", f"found {buf[:4]!r}, expected {MAGIC!r} (not an edgekv state file)")
    if len(buf) < _PREAMBLE.size + _DIGEST_NBYTES:
        raise _fail(path, "size", f"the file has {len(buf)} bytes, fewer than the smallest state file "
                                  f"({_PREAMBLE.size + _DIGEST_NBYTES})")
    _, version, header_nbytes, data_nbytes = _PREAMBLE.unpack_from(buf)
    if version != VERSION:
        raise _fail(path, "version", f"the file is version {version}, this edgekv reads version {VERSION}")
    expected = _PREAMBLE.size + header_nbytes + data_nbytes + _DIGEST_NBYTES
    if len(buf) != expected:
        raise _fail(path, "size", f"the file has {len(buf)} bytes but its preamble promises {expected} "
                                  f"(truncated or damaged)")
    body = memoryview(buf)[: -_DIGEST_NBYTES]
    stored, actual = buf[-_DIGEST_NBYTES:].hex(), hashlib.sha256(body).hexdigest()
    if stored != actual:
        raise _fail(path, "checksum", f"the file says sha256 {stored[:16]}..., its contents hash to "
                                      f"{actual[:16]}... (the file is damaged)")
    header_end = _PREAMBLE.size + header_nbytes
    if header_nbytes > _MAX_HEADER_NBYTES:
        raise _fail(path, "header_nbytes", f"{header_nbytes} exceeds the limit of {_MAX_HEADER_NBYTES}")
    try:
        header = json.loads(bytes(body[_PREAMBLE.size : header_end]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(path, "header", f"not valid UTF-8 JSON ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise _fail(path, "format", f"found {header.get('format') if isinstance(header, dict) else header!r}, "
                                    f"expected {FORMAT!r}")
    return header, body, header_end


def _field(header: dict, name: str, kind: type, path: str) -> Any:
    value = header.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _fail(path, name, f"found {value!r}, expected a {kind.__name__}")
    return value


def _check_header(header: dict, path: str, session: Session, fingerprint: str) -> None:
    theirs = _field(header, "model_fingerprint", str, path)
    if theirs != fingerprint:
        raise _fail(path, "model_fingerprint", f"the state was saved with model {theirs[:16]}..., this model is "
                                               f"{fingerprint[:16]}... (a state fits only the model that made it)")
    for name, ours in _geometry(session).items():
        value = _field(header, name, type(ours), path)
        if value != ours:
            raise _fail(path, name, f"the state has {name}={value!r}, this session has {name}={ours!r}")
    n_tokens = _field(header, "n_tokens", int, path)
    tokens = _field(header, "tokens", list, path)
    if len(tokens) != n_tokens or not 0 <= n_tokens <= session.n_ctx:
        raise _fail(path, "n_tokens", f"{n_tokens} with {len(tokens)} tokens listed; expected equal counts "
                                      f"within n_ctx={session.n_ctx}")
    bad = [t for t in tokens if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < session.n_vocab]
    if bad:
        raise _fail(path, "tokens", f"token {bad[0]!r} is not an id below n_vocab={session.n_vocab}")
    _field(header, "arrays", list, path)


def _read_arrays(header: dict, data: memoryview, path: str, session: Session) -> dict[str, np.ndarray]:
    if not all(isinstance(d, dict) and isinstance(d.get("name"), str) for d in header["arrays"]):
        raise _fail(path, "arrays", "every entry must be an object with a string 'name'")
    described = {d["name"]: d for d in header["arrays"]}
    n_live = []
    for i, cap in enumerate(_geometry(session)["layer_capacities"]):
        shape = described.get(f"slots.{i}", {}).get("shape")
        if not (isinstance(shape, list) and len(shape) == 1 and isinstance(shape[0], int) and 0 <= shape[0] <= cap):
            raise _fail(path, f"arrays[slots.{i}].shape", f"found {shape!r}, expected [m] with 0 <= m <= {cap}")
        n_live.append(shape[0])
    expected = _expected_arrays(session, n_live, "logits" in described, "attention" in described,
                                header["n_tokens"])
    if set(described) != set(expected) or len(described) != len(header["arrays"]):
        raise _fail(path, "arrays", f"found {sorted(map(str, described))}, expected {sorted(expected)}")
    out = {}
    for name, (dtype, shape) in expected.items():
        d = described[name]
        if d.get("dtype") != dtype:
            raise _fail(path, f"arrays[{name}].dtype", f"found {d.get('dtype')!r}, expected {dtype!r}")
        if d.get("shape") != list(shape):
            raise _fail(path, f"arrays[{name}].shape", f"found {d.get('shape')!r}, expected {list(shape)}")
        itemsize = np.dtype(_DTYPES[dtype]).itemsize
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        offset = d.get("offset")
        if d.get("nbytes") != nbytes or not isinstance(offset, int) or not 0 <= offset <= len(data) - nbytes:
            raise _fail(path, f"arrays[{name}]", f"offset {offset!r} and nbytes {d.get('nbytes')!r} do not fit "
                                                 f"{nbytes} bytes in the {len(data)}-byte data section")
        out[name] = np.frombuffer(data, dtype=_DTYPES[dtype], count=nbytes // itemsize, offset=offset).reshape(shape)
    return out


def _check_full_layers_agree(slot_pos: list[np.ndarray], windows: list[int], path: str) -> None:
    """Layers that see the whole context fill their slots in the same order (cache.reserve
    finds free slots once for all of them), so a file where they differ did not come from a
    session and would make the next reservation overwrite live slots."""
    full = [i for i, w in enumerate(windows) if not w]
    for i in full[1:]:
        if not np.array_equal(slot_pos[i], slot_pos[full[0]]):
            raise _fail(path, f"positions.{i}", f"layer {i} holds other positions in its slots than layer "
                                                f"{full[0]}; every full-context layer must hold the same")


def _to_state(header: dict, arrays: dict[str, np.ndarray], path: str, session: Session) -> SessionState:
    n_tokens, ring = header["n_tokens"], arrays["ring"]
    k, v, slot_pos = [], [], []
    for i, (ck, cv) in enumerate(zip(session.cache.k, session.cache.v)):
        slots, positions, cap = arrays[f"slots.{i}"], arrays[f"positions.{i}"], ck.shape[1]
        if slots.size and (slots.min() < 0 or slots.max() >= cap or np.unique(slots).size != slots.size):
            raise _fail(path, f"slots.{i}", f"slot indices must be distinct and in [0, {cap}), found min "
                                            f"{slots.min()}, max {slots.max()}, {np.unique(slots).size} distinct")
        if positions.size and (positions.min() < 0 or positions.max() >= n_tokens):
            raise _fail(path, f"positions.{i}", f"positions must lie in [0, n_tokens={n_tokens}), found "
                                                f"{positions.min()}..{positions.max()}")
        used, cur = int(ring[0, i]), int(ring[1, i])
        if not (slots.max(initial=-1) < used <= cap and 0 <= cur < cap):
            raise _fail(path, f"ring[{i}]", f"used={used}, cur={cur} do not fit a ring of {cap} slots holding "
                                            f"slots up to {slots.max(initial=-1)}")
        pos = np.full(cap, -1, np.int32)  # (cap,)
        pos[slots] = positions
        slot_pos.append(pos)
        for rows, like, out in ((arrays[f"k.{i}"], ck, k), (arrays[f"v.{i}"], cv, v)):
            full = np.zeros_like(like)  # (n_kv_heads, cap, row_bytes)
            full[:, slots, :] = rows
            out.append(full)
    _check_full_layers_agree(slot_pos, session.cache.windows, path)
    key_map = _key_map(arrays, path)
    logits, attention, seen = arrays.get("logits"), arrays.get("attention"), arrays.get("attention_seen")
    for name, a in (("attention", attention), ("attention_seen", seen)):
        if a is not None and not (np.isfinite(a).all() and (a >= 0).all()):
            raise _fail(path, name, "attention tallies must be finite and non-negative")
    return SessionState(tokens=tuple(header["tokens"]), k=tuple(k), v=tuple(v), slot_pos=tuple(slot_pos),
                        ring=ring.copy(), cache_types=(header["cache_type_k"], header["cache_type_v"]),
                        n_tokens=n_tokens, n_vocab=session.n_vocab,
                        logits=None if logits is None else logits.copy(), key_map=key_map,
                        sink_k=None if key_map is None else arrays["sink_k"].copy(),
                        attention=None if attention is None else attention.copy(),
                        attention_seen=None if seen is None else seen.copy())


def _key_map(arrays: dict[str, np.ndarray], path: str) -> KeyMap | None:
    if "key_mean" not in arrays:
        return None
    mean, scale = arrays["key_mean"].copy(), arrays["key_scale"].copy()
    if not (np.isfinite(mean).all() and np.isfinite(scale).all() and (scale > 0).all()):
        raise _fail(path, "key_scale", "a key map needs finite means and finite positive scales")
    return KeyMap(mean, scale)
