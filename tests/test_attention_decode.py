"""attention_f16_deep: one query over a deep f16 cache must give attention_f16's exact bits.

attention_f16 is the kernel the reference-model tests hold to llama.cpp bit for bit
(test_reference_models); the deep kernel only reorders when each operation runs, so every
output float, and the softmax numerators it leaves in `scores`, must be identical. The
float64 reference (helpers/f16_attention.py) checks that both are attention at all.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgekv.kernels.attention import attention_f16, softmax_numerators
from edgekv.kernels.attention_decode import DEPTH_MIN_SLOTS, attention_f16_deep, fits
from edgekv.kernels.attention_deep_ir import softmax_numerators_16
from edgekv.kernels.intrinsics import HAS_FMA
from edgekv.kernels.config import max_threads
from helpers.f16_attention import F16_ATTENTION_ATOL, reference_attention

rng = np.random.default_rng(7)


def _both(n_heads, n_kv, hd_k, hd_v, cap, n_slots, slot_pos, q_pos, window, scale=0.125, k=None, v=None):
    k = rng.normal(size=(n_kv, cap, hd_k)).astype(np.float16) if k is None else k
    v = rng.normal(size=(n_kv, cap, hd_v)).astype(np.float16) if v is None else v
    q = rng.normal(size=(1, n_heads, hd_k)).astype(np.float32) * 2
    qp = np.array([q_pos], np.int32)
    ku, vu = k.view(np.uint16), v.view(np.uint16)
    out_old, out_new = (np.zeros((1, n_heads, hd_v), np.float32) for _ in range(2))
    scores_old = np.zeros((n_heads, cap), np.float32)
    pv = np.zeros((max_threads(), 4, 16, max(hd_v, 64)), np.float32)
    attention_f16(q.copy(), qp, ku, vu, slot_pos, n_slots, window, np.float32(scale), scores_old, pv, out_old)
    scores_new, probs = np.zeros((n_heads + 2, cap), np.float32), np.zeros((n_heads, cap), np.float32)
    lanes = np.zeros((n_heads, 4, 16, hd_v), np.float32)
    attention_f16_deep(q.copy(), qp, ku, vu, slot_pos, n_slots, window, np.float32(scale), scores_new, probs,
                       lanes, out_new)
    assert out_new.view(np.uint32).tolist() == out_old.view(np.uint32).tolist()
    assert scores_new[:n_heads, :n_slots].tobytes() == scores_old[:, :n_slots].tobytes()
    return q, k, v, out_new


@pytest.mark.parametrize("n_heads,n_kv,hd_k,hd_v,n_slots", [
    (9, 3, 64, 64, 1037),  # SmolLM2's heads; two whole 512-slot chunks and a partial 16-slot block
    (4, 1, 256, 256, 1300),  # gemma3's; a partial chunk too
    (4, 4, 128, 64, 768),  # no GQA, K and V head sizes differ
    (10, 2, 64, 64, 530),  # groups of 5: served as 4 + 1 heads
    (6, 6, 96, 96, 1037),  # Phi-3's 96: 64 + 32 summed in float64 per dot, V columns 64 + 2 x 16
    (4, 2, 80, 48, 600),  # 64 + 16; V narrower than a chunk of 64
    (2, 1, 32, 32, 530),  # no whole chunk: the whole K dot in float64
])
def test_deep_kernel_matches_attention_f16_bit_for_bit(n_heads, n_kv, hd_k, hd_v, n_slots):
    cap = n_slots + 20
    slot_pos = np.arange(cap, dtype=np.int32)
    q, k, v, out = _both(n_heads, n_kv, hd_k, hd_v, cap, n_slots, slot_pos, n_slots - 1, 0)
    ref = reference_attention(q, np.array([n_slots - 1]), k[:, :n_slots].astype(np.float32),
                              v[:, :n_slots].astype(np.float32), slot_pos[:n_slots], 0, 0.125)
    np.testing.assert_allclose(out, ref, rtol=0, atol=F16_ATTENTION_ATOL)


@pytest.mark.parametrize("window", [0, 300])
def test_deep_kernel_honours_masks_in_a_wrapped_ring(window):
    # a ring that wrapped: positions out of slot order, empty slots, future slots (a
    # reservation), and a sliding window; masked slots hold NaN keys and infinite values,
    # which must not leak into the result
    cap = 1024
    slot_pos = np.full(cap, -1, np.int32)
    slot_pos[:1000] = np.roll(np.arange(1000), 377)
    slot_pos[5] = 2000  # a position after the query's
    k = rng.normal(size=(2, cap, 64)).astype(np.float16)
    v = rng.normal(size=(2, cap, 64)).astype(np.float16)
    k[:, 1000:] = np.nan
    v[:, 1000:] = np.inf
    q, k, v, out = _both(6, 2, 64, 64, cap, cap, slot_pos, 999, window, k=k, v=v)
    assert np.isfinite(out).all()
    ref = reference_attention(q, np.array([999]), k[:, :1000].astype(np.float32), v[:, :1000].astype(np.float32),
                              slot_pos[:1000], window, 0.125)
    np.testing.assert_allclose(out, ref, rtol=0, atol=F16_ATTENTION_ATOL)


def test_deep_kernel_skips_underflowed_slots_as_attention_f16_does():
    # one dominant key: every other slot's exp underflows to 0 and is skipped, so an
    # infinite value there must not turn the sum into NaN (0 * inf)
    cap, hd = 768, 64
    slot_pos = np.arange(cap, dtype=np.int32)
    k = np.zeros((1, cap, hd), np.float16)
    v = rng.normal(size=(1, cap, hd)).astype(np.float16)
    k[0, 100] = 60.0
    v[0, 200] = np.inf
    q = np.full((1, 2, hd), 1.0, np.float32)
    qp = np.array([cap - 1], np.int32)
    scores, probs = np.zeros((2, cap), np.float32), np.zeros((2, cap), np.float32)
    lanes, out = np.zeros((2, 4, 16, hd), np.float32), np.zeros((1, 2, hd), np.float32)
    attention_f16_deep(q, qp, k.view(np.uint16), v.view(np.uint16), slot_pos, cap, 0, np.float32(1.0), scores,
                       probs, lanes, out)
    np.testing.assert_array_equal(out[0, 0], v[0, 100].astype(np.float32))


def test_fits_only_deep_single_queries_in_whole_vectors():
    assert fits(1, DEPTH_MIN_SLOTS, 0, 64, 64) and fits(1, 16384, 0, 256, 256)
    assert not fits(2, 4096, 0, 64, 64)  # a chunk of queries sums in one register (tinyBLAS)
    assert not fits(1, DEPTH_MIN_SLOTS - 1, 0, 64, 64)
    assert fits(1, 4096, 0, 96, 96) and fits(1, 4096, 0, 80, 48)  # whole 16-element vectors
    assert not fits(1, 4096, 0, 72, 64) and not fits(1, 4096, 0, 64, 40)
    # a sliding window caps what the query sees: gemma3's local layers (512 of 1088) take
    # it, a window below the switch does not, whatever the ring holds
    assert fits(1, 1088, 512, 256, 256) and fits(1, 1024, 4096, 64, 64)
    assert not fits(1, 4096, DEPTH_MIN_SLOTS - 1, 64, 64)


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["smollm2_path", "gemma3_path"])
def test_real_model_decodes_the_same_logits_past_the_switch(request, monkeypatch, fixture):
    # the model's own decode at depth ~600 (past DEPTH_MIN_SLOTS, in every layer of
    # SmolLM2 and gemma3's; its local layers' window of 512 hides ~90 slots: skipped blocks)
    # with the deep kernel and with attention_f16 only:
    # bit-identical logits, step after step
    import edgekv.kernels.attention_decode as attention_decode
    from edgekv.loader import load

    model = load(request.getfixturevalue(fixture))
    prompt = [int(t) for t in np.random.default_rng(3).integers(100, 5000, 600)]
    calls = []
    deep_kernel = attention_decode.attention_f16_deep
    monkeypatch.setattr(attention_decode, "attention_f16_deep", lambda *a: calls.append(a[5:7]) or deep_kernel(*a))

    def run():
        s = model.session(n_ctx=1024)
        s.eval(prompt)
        logits = []
        for t in (11, 222, 3333):
            s.eval([t])
            logits.append(s.logits.copy())
        return np.array(logits)

    deep = run()
    assert len(calls) >= 3 and min(n for n, _ in calls) >= attention_decode.DEPTH_MIN_SLOTS  # it ran, at depth
    assert any(window for _, window in calls) == (fixture == "gemma3_path")  # and on local layers
    monkeypatch.setattr(attention_decode, "DEPTH_MIN_SLOTS", 1 << 30)
    assert not attention_decode.fits(1, 1024, 0, 64, 64)
    calls.clear()
    plain = run()
    assert not calls
    assert deep.tobytes() == plain.tobytes()


def test_warmup_compiles_the_deep_kernel():
    # `edgekv warmup` must reach the deep kernel, or a user's first long conversation
    # would stall mid-answer while it compiles
    from edgekv import warmup

    assert warmup.DEEP_FILL > DEPTH_MIN_SLOTS
    assert ("llama", "Q8_0", "deep") in warmup.work_items("exact")


@pytest.mark.skipif(not HAS_FMA, reason="without FMA v_expf rounds twice and the vector exp once")
@pytest.mark.parametrize("n", [16, 37, 530])
def test_blocked_softmax_numerators_are_softmax_numerators(n):
    # the exps 16 lanes at a time (v_expf_ir) against the scalar ggml_v_expf, over the
    # whole range softmax meets: 0 down to underflow, masked -inf slots, a partial block
    row = rng.uniform(-120, 0, n).astype(np.float32)
    row[rng.random(n) < 0.2] = -np.inf
    row[:4] = [0.0, -1e-30, -87.5, -103.9]
    m = np.float64(row.max())
    old, new = row.copy(), np.concatenate([row, np.full(5, 7.0, np.float32)])
    total_old = softmax_numerators(old, n, m)
    total_new = softmax_numerators_16(new, n, m)
    assert new[:n].tobytes() == old.tobytes() and total_new == total_old
    assert (new[n:] == 7.0).all()  # nothing past n is touched
    assert (new[:n][row == -np.inf] == 0).all()
