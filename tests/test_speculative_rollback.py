"""A verify pass of drafted tokens (Session.verify / settle, kv/drafts.py) on both real models:
each row's logits are the bits a decode step gives, and after keeping n of the tokens the
session is bit for bit a session that decoded those n one at a time and never saw the others:
K and V rows, slot positions, ring pointers and scan lengths, the last logits, the tokens,
the `keep` policy's tallies; in every cache type, in windowed rings that wrap, near a full
context under shift / stream / keep, and through the overflows that come after."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from edgekv.errors import EdgeKVError
from edgekv.kv.types import KV_CACHE_TYPES
from edgekv.loader import load

pytestmark = pytest.mark.slow  # every test here needs a real model

TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps on. "


@functools.lru_cache(maxsize=None)
def _load(path):
    return load(path)


def _state(s) -> dict:
    """Everything a session is, as comparable arrays."""
    snap = s.snapshot()
    out = {f"k{i}": a for i, a in enumerate(snap.k)} | {f"v{i}": a for i, a in enumerate(snap.v)}
    out |= {f"pos{i}": p for i, p in enumerate(snap.slot_pos)}
    out |= dict(ring=snap.ring, logits=snap.logits, tokens=np.array(snap.tokens))
    if snap.attention is not None:
        out |= dict(attention=snap.attention, attention_seen=snap.attention_seen)
    return out


def _assert_same(a, b) -> None:
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys()
    for name in sa:
        assert np.array_equal(sa[name], sb[name]), name


def _pair(model, prompt, **kw):
    a, b = model.session(**kw), model.session(**kw)
    a.prefill(prompt)
    b.prefill(prompt)
    return a, b


def _stepped(s, ids) -> list[np.ndarray]:
    rows = []
    for t in ids:
        s.eval([t])
        rows.append(s.logits.copy())
    return rows


@pytest.mark.parametrize("cache_type", sorted(KV_CACHE_TYPES))
def test_verify_rows_are_decode_steps_and_settle_forgets_the_rest(smollm2_path, cache_type):
    model = _load(smollm2_path)
    prompt = model.tokenizer.encode(TEXT * 3)
    ids = prompt[3:12]  # a token and 8 drafts
    plain, spec = _pair(model, prompt, n_ctx=256, cache_type_k=cache_type, cache_type_v=cache_type)
    steps = _stepped(plain, ids[:5])
    logits = spec.verify(ids)
    for i, row in enumerate(steps):
        assert np.array_equal(logits[i], row), f"row {i}"
    spec.settle(5)
    _assert_same(spec, plain)
    # and the sessions go on alike
    assert np.array_equal(_stepped(spec, ids[5:8])[-1], _stepped(plain, ids[5:8])[-1])
    _assert_same(spec, plain)


def test_settle_nothing_is_the_session_before(gemma3_path):
    model = _load(gemma3_path)
    a, b = _pair(model, model.tokenizer.encode(TEXT * 2), n_ctx=128, cache_type_k="q8_0", cache_type_v="q4_0")
    b.verify(model.tokenizer.encode(TEXT)[1:9])
    b.settle(0)
    _assert_same(b, a)


@pytest.mark.parametrize("cache_type", ["f16", "q4_0"])
def test_windowed_rings_that_wrap(gemma3_path, cache_type):
    # windows of 12 on every layer, n_batch 8: rings of 20 slots, long wrapped by the prompt
    model = _load(gemma3_path)
    windows = {layer: 12 for layer in range(model.hp.n_layers)}
    prompt = model.tokenizer.encode(TEXT * 4)
    kw = dict(n_ctx=256, n_batch=8, cache_type_k=cache_type, cache_type_v=cache_type, layer_windows=windows)
    plain, spec = _pair(model, prompt, **kw)
    assert spec.cache.ring(0) and spec.n_tokens > 2 * spec.cache.caps[0]
    ids = prompt[5:13]
    steps = _stepped(plain, ids[:3])
    logits = spec.verify(ids)
    assert all(np.array_equal(logits[i], steps[i]) for i in range(3))
    spec.settle(3)
    _assert_same(spec, plain)
    for n_kept in (8, 1):  # all kept, then one more pass keeping one
        steps = _stepped(plain, ids[:n_kept])
        spec.verify(ids)
        spec.settle(n_kept)
        _assert_same(spec, plain)


@pytest.mark.parametrize("policy", ["shift", "stream", "keep"])
def test_near_a_full_context_and_through_the_overflows_after(smollm2_path, policy):
    model = _load(smollm2_path)
    prompt = model.tokenizer.encode(TEXT * 5)[:100]
    kw = dict(n_ctx=112, cache_type_k="q8_0", cache_type_v="f16", context_shift=policy)
    plain, spec = _pair(model, prompt, **kw)
    more = model.tokenizer.encode(TEXT * 4)
    at = 0
    while at < 60:  # passes of up to 8 keeping 3, plain steps where the room is short
        room = spec.max_verify()
        if room >= 2:
            ids = more[at : at + min(8, room)]
            n_kept = min(3, len(ids))
            _stepped(plain, ids[:n_kept])
            logits = spec.verify(ids)
            assert np.array_equal(logits[n_kept - 1], plain.logits)
            spec.settle(n_kept)
            at += n_kept
        else:  # a plain step makes room as the policy says, in both
            _stepped(plain, more[at : at + 1])
            spec.eval(more[at : at + 1])
            at += 1
        _assert_same(spec, plain)
    assert spec.n_discarded > 0  # the policy did run


def test_a_pending_pass_guards_the_session(smollm2_path):
    model = _load(smollm2_path)
    s = model.session(64)
    with pytest.raises(EdgeKVError, match="after at least one"):
        s.verify([1, 2])
    s.prefill(model.tokenizer.encode(TEXT * 4)[:50])
    with pytest.raises(EdgeKVError, match="at most"):
        s.verify(list(range(20)))  # 14 free slots
    s.verify([5, 6])
    for call in (lambda: s.eval([1]), lambda: s.truncate(3), lambda: s.verify([1])):
        with pytest.raises(EdgeKVError, match="settle"):
            call()
    s.settle(1)
    assert s.n_tokens == 51 and s.tokens[-1] == 5


def test_an_error_in_the_pass_leaves_the_session_as_it_was(smollm2_path, monkeypatch):
    model = _load(smollm2_path)
    a, b = _pair(model, model.tokenizer.encode(TEXT * 2), n_ctx=128, layer_windows={0: 8}, n_batch=8)
    calls = {"n": 0}
    real = model.network.backend.attend

    def failing(*args, **kw):  # the pass dies half way through, its rows half written
        calls["n"] += 1
        if calls["n"] == model.hp.n_layers // 2:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(model.network.backend, "attend", failing)
    with pytest.raises(KeyboardInterrupt):
        b.verify(model.tokenizer.encode(TEXT)[1:7])
    monkeypatch.undo()
    _assert_same(b, a)
    b.verify([7, 8])  # and the session works on
    b.settle(2)
