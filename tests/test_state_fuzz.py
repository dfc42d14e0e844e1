"""1,000 hostile state files (issue 16): corrupt bytes, truncations, and hand-edited headers
and arrays with a correct checksum recomputed (what a person or a bug could write). Each is
refused with a StateFileError naming a field, or (if the edit keeps the state valid) loads;
either way a session that was not given it keeps producing the same tokens, and a refused
load leaves the target session exactly as it was."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest

from edgekv.errors import StateFileError
from edgekv.loader import load
from edgekv.state_file import load_session, model_fingerprint, save_session

PROMPT = [5, 17, 42, 3, 99, 7, 64, 12]
JUNK = [None, True, -1, 0, 1, 2**31, 2**63, 1e308, float("nan"), "x", [], [1], {}, {"a": 1}, [[-1]], [2**40]]


def _seal(header: dict, data: bytes) -> bytes:
    """A state file with a valid preamble and checksum around header and data."""
    head = json.dumps(header, separators=(",", ":")).encode()
    body = struct.pack("<4sIQQ", b"EKVS", 1, len(head), len(data)) + head + data
    return body + hashlib.sha256(body).digest()


def _split(blob: bytes) -> tuple[dict, bytes]:
    _, _, nh, nd = struct.unpack_from("<4sIQQ", blob)
    return json.loads(blob[24 : 24 + nh]), blob[24 + nh : 24 + nh + nd]


def _edit(rng, header: dict, data: bytes) -> bytes:
    """One hand edit: a header field or an array descriptor field set to junk, a token id or
    array byte changed, or a slot/position value moved; the checksum recomputed."""
    header = json.loads(json.dumps(header))
    kind = rng.integers(5)
    if kind == 0:
        key = list(header)[rng.integers(len(header))]
        header[key] = JUNK[rng.integers(len(JUNK))]
    elif kind == 1:
        d = header["arrays"][rng.integers(len(header["arrays"]))]
        key = list(d)[rng.integers(len(d))]
        d[key] = JUNK[rng.integers(len(JUNK))]
    elif kind == 2 and header["tokens"]:
        header["tokens"][rng.integers(len(header["tokens"]))] = int(rng.choice([-1, 10**6, 2**31, 0, 3]))
    else:  # bytes of the data section: slots, positions, ring, K/V rows, logits
        data = bytearray(data)
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(len(data)))
            data[at] = int(rng.integers(256)) if kind == 3 else data[at] ^ 0x80
        data = bytes(data)
    return _seal(header, data)


def test_a_thousand_hostile_state_files(tiny_model, tmp_path):
    model = load(tiny_model())
    fp = model_fingerprint(model)
    source = model.session(n_ctx=64)
    source.eval(PROMPT)
    good = tmp_path / "good.ekvs"
    save_session(source, fp, good)
    blob = good.read_bytes()
    header, data = _split(blob)
    assert _seal(header, data) == blob  # the test's own writer is the format
    rng = np.random.default_rng(21)
    target, control = model.session(n_ctx=64), model.session(n_ctx=64)
    for s in (target, control):
        s.eval([9, 8, 7])
    outcomes = {"refused": 0, "loaded": 0}
    path = tmp_path / "hostile.ekvs"
    for i in range(1000):
        if i < 100:  # raw damage: bytes flipped anywhere, or cut short
            b = bytearray(blob)
            b[int(rng.integers(len(b)))] ^= 1 << int(rng.integers(8))
            candidate = bytes(b) if i % 2 else blob[: int(rng.integers(len(blob)))]
        else:
            candidate = _edit(rng, header, data)
        path.write_bytes(candidate)
        before = (list(target.tokens), target.n_tokens, target.cache.n_tokens)
        try:
            load_session(target, fp, path)
        except StateFileError as exc:
            outcomes["refused"] += 1
            assert exc.field and exc.field in str(exc)
            assert (list(target.tokens), target.n_tokens, target.cache.n_tokens) == before, i
            continue
        except Exception as exc:  # what this test exists to find
            pytest.fail(f"hostile state {i}: {type(exc).__name__}: {exc}")
        outcomes["loaded"] += 1  # a valid edit (e.g. a changed K byte): it is the state now
        assert target.n_tokens == target.cache.n_tokens == len(target.tokens) <= 64
        target = model.session(n_ctx=64)
        target.eval([9, 8, 7])
    assert outcomes["refused"] > 500, outcomes
    # the control session, never given a file, and a fresh target agree token for token
    a, b = model.session(n_ctx=64), control
    a.eval([9, 8, 7])
    for _ in range(8):
        t = int(np.argmax(b.logits))
        np.testing.assert_array_equal(a.logits, b.logits)
        a.eval([t])
        b.eval([t])
