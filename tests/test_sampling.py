"""Tests for edgekv/sampling.py: each processor against a slow, obviously correct NumPy (or
plain Python) version on random logits, the chain's order, greedy == argmax, and seeded
reproducibility of the draws."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgekv.sampling import (
    Sampler,
    SamplingParams,
    apply_logit_bias,
    apply_penalties,
    draw,
    make_rng,
    min_p_count,
    recent_tokens,
    top_k_ids,
    top_p_count,
)

N_VOCAB = 1000


def random_logits(seed: int, n: int = N_VOCAB) -> np.ndarray:
    return (3.0 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


# --- references -----------------------------------------------------------------------------


def ref_penalties(logits, recent, repeat, freq, presence):
    out = logits.copy()
    for token in set(recent):
        count = list(recent).count(token)
        value = float(out[token])
        value = value * repeat if value <= 0 else value / repeat
        out[token] = value - count * freq - presence
    return out


def ref_top_p(sorted_logits, p, min_keep=1):
    probs = np.exp(sorted_logits.astype(np.float64) - sorted_logits.max())
    probs /= probs.sum()
    total = 0.0
    for i, prob in enumerate(probs):
        total += prob
        if total >= p and i + 1 >= min_keep:
            return i + 1
    return len(probs)


def ref_min_p(sorted_logits, p, min_keep=1):
    probs = np.exp(sorted_logits.astype(np.float64) - sorted_logits.max())
    kept = int(np.sum(probs >= p * probs.max()))
    return max(kept, min_keep)


def ref_chain(logits, history, p: SamplingParams):
    """The full llama.cpp chain, written out with full sorts: the token distribution."""
    x = logits.astype(np.float64).copy()
    for token, bias in (p.logit_bias or {}).items():
        x[token] += bias
    x = ref_penalties(x, list(recent_tokens(history, p.repeat_last_n)), p.repeat_penalty,
                      p.frequency_penalty, p.presence_penalty)
    order = sorted(range(len(x)), key=lambda i: -x[i])
    if 0 < p.top_k < len(x):
        order = order[: p.top_k]
    kept = np.array([x[i] for i in order])
    kept = kept[: ref_top_p(kept, p.top_p)] if p.top_p < 1 else kept
    kept = kept[: ref_min_p(kept, p.min_p)] if p.min_p > 0 else kept
    probs = np.exp((kept - kept.max()) / p.temperature)
    return np.array(order[: len(kept)]), probs / probs.sum()


# --- processors -----------------------------------------------------------------------------


@pytest.mark.parametrize("repeat,freq,presence", [(1.3, 0.0, 0.0), (1.0, 0.2, 0.5), (0.8, 0.1, -0.3)])
def test_penalties_match_reference(repeat, freq, presence):
    logits = random_logits(1)
    recent = list(np.random.default_rng(2).integers(0, 50, 64))  # repeats guaranteed
    got = logits.copy()
    apply_penalties(got, recent, repeat, freq, presence)
    np.testing.assert_allclose(got, ref_penalties(logits, recent, repeat, freq, presence), rtol=1e-6, atol=1e-6)
    untouched = np.setdiff1d(np.arange(N_VOCAB), recent)
    assert (got[untouched] == logits[untouched]).all()


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits():
    logits = np.array([2.0, -2.0, 0.0, 1.0], np.float32)
    apply_penalties(logits, [0, 1, 2], repeat_penalty=2.0)
    assert logits.tolist() == [1.0, -4.0, 0.0, 1.0]


def test_recent_tokens_window():
    history = list(range(100))
    assert list(recent_tokens(history, 64)) == list(range(36, 100))
    assert list(recent_tokens(history, -1)) == history
    assert list(recent_tokens(history, 0)) == []


def test_logit_bias_accepts_string_keys():
    logits = np.zeros(5, np.float32)
    apply_logit_bias(logits, {"1": 2.5, 3: -1.0})
    assert logits.tolist() == [0.0, 2.5, 0.0, -1.0, 0.0]


@pytest.mark.parametrize("k", [1, 5, 40, N_VOCAB - 1, N_VOCAB, 0, -1])
def test_top_k_matches_full_sort(k):
    logits = random_logits(3)
    expected = np.argsort(-logits, kind="stable")
    if 0 < k < N_VOCAB:
        expected = expected[:k]
    np.testing.assert_array_equal(top_k_ids(logits, k), expected)


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 0.95, 0.999999, 1.0])
@pytest.mark.parametrize("seed", [4, 5])
def test_top_p_matches_reference(p, seed):
    sorted_logits = np.sort(random_logits(seed, 200))[::-1]
    assert top_p_count(sorted_logits, p) == ref_top_p(sorted_logits, p)
    assert top_p_count(sorted_logits, p, min_keep=7) == ref_top_p(sorted_logits, p, min_keep=7)


@pytest.mark.parametrize("p", [0.0, 0.01, 0.05, 0.3, 0.9, 1.0])
def test_min_p_matches_reference(p):
    sorted_logits = np.sort(random_logits(6, 200))[::-1]
    expected = len(sorted_logits) if p <= 0 else ref_min_p(sorted_logits, p)
    assert min_p_count(sorted_logits, p) == expected
    assert min_p_count(sorted_logits, p, min_keep=3) == max(expected, 3)


def test_draw_follows_the_distribution():
    probs = np.array([0.5, 0.3, 0.2])
    rng = np.random.default_rng(0)
    counts = np.bincount([draw(probs, rng) for _ in range(20000)], minlength=3) / 20000
    np.testing.assert_allclose(counts, probs, atol=0.015)
    assert draw(np.array([0.0, 1.0]), rng) == 1


# --- the chain ------------------------------------------------------------------------------


def test_greedy_is_argmax():
    for seed in range(5):
        logits = random_logits(seed, 262_144)  # a Gemma-sized vocabulary
        assert Sampler(SamplingParams(temperature=0.0)).sample(logits) == int(np.argmax(logits))
        assert Sampler(SamplingParams(temperature=-1.0, top_k=1)).sample(logits) == int(np.argmax(logits))


def test_greedy_sees_bias_and_penalties():
    logits = np.array([5.0, 4.0, 3.0], np.float32)
    assert Sampler(SamplingParams(temperature=0, repeat_penalty=2.0)).sample(logits, [0]) == 1
    assert Sampler(SamplingParams(temperature=0, logit_bias={2: 10.0})).sample(logits) == 2


def _biased(logits, bias):
    # the reference: a biased copy, as the general path makes it
    buf = logits.copy()
    apply_logit_bias(buf, bias)
    return buf


def test_greedy_with_a_bias_alone_skips_the_copy_and_picks_the_same_token():
    # the fast path (no copy) against argmax of a biased copy, over the cases it must get
    # right: the top id banned, a bias that lifts an id into a tie (the lower index wins),
    # negative, positive and -inf biases, string keys, an id biased twice as "5" and 5
    rng = np.random.default_rng(3)
    cases = []
    for seed in range(40):
        logits = random_logits(seed)
        top = int(np.argmax(logits))
        lo = int(rng.integers(0, top + 1))
        gap = float(logits[top] - logits[lo])
        cases += [(logits, {top: -math.inf}), (logits, {top: -math.inf, 7: 0.5, 9: 30.0}),
                  (logits, {lo: gap}), (logits, {str(lo): gap, top + 1 if top + 1 < N_VOCAB else 0: gap + 1.0}),
                  (logits, {3: -2.0, 4: 2.0}), (logits, {"5": 100.0, 5: -300.0}), (logits, {})]
    tied = np.zeros(N_VOCAB, np.float32)
    cases += [(tied, {}), (tied, {0: -1.0}), (tied, {500: 0.0}), (tied, {2: 1.0, 1: 1.0})]
    fast = 0
    for logits, bias in cases:
        sampler = Sampler(SamplingParams(temperature=0, logit_bias=bias))
        token = sampler.sample(logits, [1, 2, 3])
        assert token == int(np.argmax(_biased(logits, bias))), bias
        fast += sampler._buf is None  # the fast path leaves the buffer unmade until asked for
        # log-probs read last_logits: the biased logits, made on request
        np.testing.assert_array_equal(sampler.last_logits, _biased(logits, bias))
    assert fast >= len(cases) // 2


def test_greedy_with_penalties_or_processors_takes_the_general_path():
    logits = np.array([5.0, 4.0, 3.0], np.float32)
    sampler = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0, logit_bias={1: 0.5}))
    assert sampler.sample(logits, [0]) == 1 and sampler._buf is not None
    sampler = Sampler(SamplingParams(temperature=0), processors=[lambda ids, x: x[::-1].copy()])
    assert sampler.sample(logits) == 2


def test_sampler_leaves_the_input_logits_alone():
    logits = random_logits(7)
    before = logits.copy()
    Sampler(SamplingParams(repeat_penalty=1.5, logit_bias={3: 1.0})).sample(logits, [1, 2, 3])
    np.testing.assert_array_equal(logits, before)


@pytest.mark.parametrize("params", [
    SamplingParams(),
    SamplingParams(temperature=1.5, top_k=0, top_p=0.9, min_p=0.0),
    SamplingParams(temperature=0.7, top_k=10, top_p=1.0, min_p=0.2, repeat_penalty=1.3, presence_penalty=0.4,
                   frequency_penalty=0.1, repeat_last_n=8, logit_bias={11: 4.0}),
])
def test_chain_distribution_matches_reference(params):
    """Empirical frequencies of many draws match the reference chain's probabilities."""
    logits = random_logits(8, 200)
    history = [int(t) for t in np.random.default_rng(9).integers(0, 30, 20)]
    ids, probs = ref_chain(logits, history, params)
    sampler = Sampler(params, seed=123)
    n = 20000
    drawn = np.array([sampler.sample(logits, history) for _ in range(n)])
    assert set(drawn.tolist()) <= set(ids.tolist())
    freq = np.array([(drawn == i).sum() / n for i in ids])
    np.testing.assert_allclose(freq, probs, atol=4 * math.sqrt(0.25 / n))


def test_seeded_runs_repeat_and_seeds_differ():
    logits = random_logits(10)
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    a, b, c = Sampler(params, seed=42), Sampler(params, seed=42), Sampler(params, seed=43)
    seq_a = [a.sample(logits) for _ in range(50)]
    assert seq_a == [b.sample(logits) for _ in range(50)]
    assert seq_a != [c.sample(logits) for _ in range(50)]


def test_random_seed_values():
    assert make_rng(None).random() != make_rng(None).random()
    assert make_rng(-1).random() != make_rng(0xFFFFFFFF).random()
    assert make_rng(5).random() == make_rng(5).random()


def test_logits_processor_runs_first():
    seen = []

    def processor(input_ids, scores):
        seen.append(input_ids.tolist())
        out = scores.copy()
        out[:] = -np.inf
        out[7] = 0.0
        return out

    sampler = Sampler(SamplingParams(), seed=0, processors=[processor])
    assert sampler.sample(random_logits(11), [1, 2]) == 7
    assert seen == [[1, 2]]
