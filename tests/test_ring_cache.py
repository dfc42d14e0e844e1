"""The ring cache under each overflow policy against a float64 NumPy reference of the same
semantics (tests/numpy_reference.py ReferenceSession, with ggml's f16 GELU steps), on
tiny models with F32 weights and an f32 cache."""

from __future__ import annotations

import numpy as np
import pytest

from edgekv.kv import heavy_hitters
from edgekv.errors import ContextFullError
from edgekv.loader import load
from numpy_reference import ReferenceModel, ReferenceSession

rng = np.random.default_rng(7)


def _run(session, ref, tokens, policy_keep, policy_discard):
    """Feed tokens one at a time to both; the reference makes its own eviction choice, which
    must be the session's (up to near-ties of the attention tallies), then mirrors it."""
    errs = []
    for t in tokens:
        before = session.n_tokens
        session.eval([t])
        dropped = before + 1 - session.n_tokens
        if dropped:
            _mirror_eviction(session, ref, policy_keep, dropped)
        want = ref.step(t)
        errs.append(np.abs(session.logits - want).max() / np.abs(want).max())
        assert session.n_tokens == session.cache.n_tokens == len(ref.pos) <= session.n_ctx
    return np.array(errs)


def _mirror_eviction(session, ref, n_keep, dropped):
    got = session.last_evicted
    if session.context_shift == "keep":
        want = ref.heavy_hitter_evictions(n_keep, heavy_hitters.recent_window(session.n_ctx), dropped)
        differ = np.setxor1d(got, want)
        if differ.size:  # float32 tallies against float64: only near-ties may be ordered otherwise
            scores = ref.keep_scores()
            assert np.ptp(scores[differ]) < 1e-4 * scores.max(), (got, want, scores[differ])
    else:
        np.testing.assert_array_equal(got, np.arange(n_keep, n_keep + dropped))
    ref.evict(got)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("capacity", [16, 64, pytest.param(257, marks=pytest.mark.long)])  # 257: ~70% of the time
@pytest.mark.parametrize("policy", ["shift", "stream", "keep"])
def test_policies_match_reference_over_ten_capacities(tiny_model, arch, capacity, policy):
    path = tiny_model(arch)
    model = load(path)
    keep = 2
    s = model.session(n_ctx=capacity, n_batch=1, cache_type_k="f32", cache_type_v="f32",
                      context_shift=policy, n_keep=keep)
    ref = ReferenceSession(ReferenceModel(path))
    tokens = rng.integers(0, model.hp.n_vocab, 10 * capacity)
    errs = _run(s, ref, tokens, keep, None)
    # gemma3: ggml's GELU rounds its input to f16 (the reference does too), a step that a
    # last-bit difference can land on either side of: ~4e-4 of the logit scale at worst
    limit = 1e-4 if arch == "llama" else 1e-3
    assert errs.max() < limit, errs.max()
    # no growth of the error over time: the last stretch is no worse than the first
    assert errs[-capacity:].max() < 10 * max(errs[:capacity].max(), 1e-7)


def test_none_policy_refuses_and_stays_usable(tiny_model):
    s = load(tiny_model("llama")).session(n_ctx=16, n_batch=4)
    s.eval(list(range(1, 15)))
    with pytest.raises(ContextFullError):
        s.eval([1, 2, 3])
    assert s.n_tokens == 14
    s.eval([1, 2])
    assert s.n_tokens == 16


def test_shift_keeps_prefix_and_drops_half(tiny_model):
    s = load(tiny_model("llama")).session(n_ctx=16, n_batch=1, context_shift="shift", n_keep=3)
    toks = list(range(1, 17))
    s.eval(toks)
    s.eval([99])
    # 13 movable tokens, half (6) dropped after the kept 3: llama.cpp's n_discard default
    assert s.tokens == toks[:3] + toks[9:] + [99]
    assert sorted(int(p) for p in s.cache.pos[0] if p >= 0) == list(range(len(s.tokens)))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("capacity", [16, 64, 257])
def test_before_the_first_wrap_the_ring_equals_a_linear_cache(tiny_model, arch, capacity):
    model = load(tiny_model(arch))
    tokens = rng.integers(0, model.hp.n_vocab, capacity)
    ring = model.session(n_ctx=capacity, n_batch=1, cache_type_k="f32", cache_type_v="f32", context_shift="shift")
    linear = model.session(n_ctx=4 * capacity, n_batch=1, cache_type_k="f32", cache_type_v="f32")
    for t in tokens:
        ring.eval([t])
        linear.eval([t])
        np.testing.assert_array_equal(ring.logits, linear.logits)


def test_reuse_after_a_wrap_recomputes_what_the_ring_lost(tiny_model):
    # gemma3's local layers keep window (8) + n_batch slots: a prompt that shares only an
    # old prefix with the session must not be served from slots that were overwritten
    model = load(tiny_model("gemma3"))
    tokens = [int(t) for t in rng.integers(0, model.hp.n_vocab, 40)]
    s = model.session(n_ctx=64, n_batch=1)
    s.eval(tokens)
    assert s.cache.reusable_prefix(30) == 0 and s.cache.reusable_prefix(39) == 39
    edited = tokens[:30] + [7, 8, 9]
    before = s.n_evaluated
    s.prefill(edited)
    assert s.n_evaluated - before > len(edited) - 30  # recomputed more than the edited tail
    fresh = model.session(n_ctx=64, n_batch=1)
    fresh.eval(edited)
    np.testing.assert_allclose(s.logits, fresh.logits, rtol=0, atol=1e-5 * np.abs(fresh.logits).max())
