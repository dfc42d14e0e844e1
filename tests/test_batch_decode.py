"""Batched decode (edgekv/kv/batch.py): several sessions' next tokens in one forward pass give,
row for row, the logits each session's own one-token pass gives (bit for bit), on both real
models, over cache types, depths and windowed layers whose rings wrap; the reference is the
plain Session.eval of each session alone."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from edgekv.kv.batch import DecodeStep, decode_together
from edgekv.loader import load
from edgekv.backends.contract import Scratch
from helpers.decode_steps import solo_logits

pytestmark = pytest.mark.slow  # every test here needs a real model

PROMPTS = ["The capital of France is", "Once upon a time there was a little fox who",
           "def fibonacci(n):\n    ", "Water boils at a temperature of"]


@functools.lru_cache(maxsize=None)
def _load(path):
    return load(path)


def _sessions(model, cache_type: str, n_ctx: int = 256):
    sessions = []
    for i, text in enumerate(PROMPTS):
        # layers 0 and 1 keep a 24-token window: rings that wrap at these depths
        s = model.session(n_ctx, 32, cache_type_k=cache_type, cache_type_v=cache_type, layer_windows={0: 24, 1: 24})
        ids = model.tokenizer.encode(text * (1 + 3 * i))  # depths from a few tokens to ~100
        s.eval(ids[: n_ctx - 8])
        sessions.append(s)
    return sessions


def _together(model, sessions, tokens) -> list[np.ndarray]:
    net = model.network
    rows = [np.zeros((1, net.hp.n_vocab), np.float32) for _ in sessions]
    steps = [DecodeStep(t, s.cache, s.cache.reserve(1), row) for s, t, row in zip(sessions, tokens, rows)]
    decode_together(net, steps, Scratch(net.hp, len(steps), net.backend.n_workers),
                    np.zeros((len(steps), net.hp.n_vocab), np.float32))
    for s, st in zip(sessions, steps):
        s.cache.rollback(st.res)
    return [r[0] for r in rows]


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
@pytest.mark.parametrize("cache_type", ["f16", "q8_0", "q4_0"])
def test_batched_rows_equal_solo_passes(which, cache_type, smollm2_path, gemma3_path):
    model = _load(smollm2_path if which == "smollm2" else gemma3_path)
    sessions = _sessions(model, cache_type)
    tokens = [int(np.argmax(s.logits)) for s in sessions]
    solo = solo_logits(sessions, tokens)
    for n in (len(sessions), 2):  # the whole batch, and a part of it in another order
        order = list(range(n))[::-1]
        together = _together(model, [sessions[i] for i in order], [tokens[i] for i in order])
        for i, row in zip(order, together):
            assert np.array_equal(row, solo[i]), f"session {i}: batched logits differ from its solo pass"


def test_shallow_f16_sessions_take_one_attention_call_per_layer(smollm2_path, monkeypatch):
    # the default cache at short depth: every layer (the wrapping 24-token rings included)
    # reads the step's table (batch.SessionRings) and makes one attention_sessions call,
    # never a per-session layer view or the per-row path
    from edgekv.backends import cpu
    model = _load(smollm2_path)
    calls = {"together": 0, "views": 0}
    kernel = cpu.attention_f16_sessions

    def counted(*args):
        calls["together"] += 1
        kernel(*args)

    def no_views(*args, **kwargs):
        calls["views"] += 1

    monkeypatch.setattr(cpu, "attention_f16_sessions", counted)
    monkeypatch.setattr(cpu.CPUBackend, "attend_sessions", no_views)
    sessions = _sessions(model, "f16")
    tokens = [int(np.argmax(s.logits)) for s in sessions]
    solo = solo_logits(sessions, tokens)
    for i, row in enumerate(_together(model, sessions, tokens)):
        assert np.array_equal(row, solo[i]), f"session {i}: batched logits differ from its solo pass"
    assert calls == {"together": model.hp.n_layers, "views": 0}


def test_deep_and_shallow_sessions_together_equal_solo_passes(smollm2_path):
    # an f16 session past the deep kernel's depth (attention_decode.py) decodes on its own
    # beside shallow ones that share one attention call (attention_sessions.py)
    model = _load(smollm2_path)
    sessions = []
    for i, depth in enumerate((600, 9, 30)):
        s = model.session(1024, 256)
        s.eval(np.random.default_rng(i).integers(0, model.hp.n_vocab, depth))
        sessions.append(s)
    tokens = [int(np.argmax(s.logits)) for s in sessions]
    solo = solo_logits(sessions, tokens)
    for i, row in enumerate(_together(model, sessions, tokens)):
        assert np.array_equal(row, solo[i]), f"session {i}: batched logits differ from its solo pass"


def test_sessions_of_different_context_sizes_are_refused(smollm2_path):
    model = _load(smollm2_path)
    a, b = model.session(128, 16), model.session(256, 16)
    for s in (a, b):
        s.eval([1, 2, 3])
    with pytest.raises(ValueError, match="share their context size"):
        _together(model, [a, b], [4, 5])
