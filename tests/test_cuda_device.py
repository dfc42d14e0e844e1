"""The native/ kernels on a real GPU (marker `gpu`: tools/gpu_check.sh runs these on a machine
that has one), and the same tests on the emulated driver in `make test`, which checks their
own launches and byte layouts (the `dev` fixture).

Each kernel against an independent reference: gguf.quants for the bytes of weights and
K/V rows, float64 NumPy for the arithmetic. Also: weights used through mapped host memory
(Jetson's unified memory) give the uploaded weights' results, and a sequence captured as a
CUDA graph replays to the same numbers as the launches it recorded.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from helpers.native_reference import (CACHE_TYPES, FLOAT_CACHE_TYPES, QUANTIZED, cache_rows, reference_attention,
                                      weights)

ROWS_PER_BLOCK = 4  # matvec.cu's EK_ROWS_PER_BLOCK


@pytest.fixture(scope="module", params=[pytest.param("gpu", marks=pytest.mark.gpu), "emulated",
                                        pytest.param("cpu", marks=pytest.mark.cuda_cpu)])
def dev(request):
    """The GPU (marker gpu); the emulated driver (tests/cuda_emulator.py), which runs each
    kernel's NumPy twin: in `make test` it checks these tests' own launches, buffers and
    byte layouts, so the scarce GPU run fails only on what the kernels do; and the real
    kernels on this CPU (marker cuda_cpu: tests/cuda_cpu.py, under the sanitizers)."""
    from edgekv.cuda.runtime import Device

    if request.param == "emulated":
        from cuda_emulator import EmulatedDevice

        d = EmulatedDevice(integrated=False)
    elif request.param == "cpu":
        from cuda_cpu import CpuCudaDevice

        d = CpuCudaDevice(integrated=False)
    else:
        d = Device()
        print(f"\n{d.info.name}, sm_{d.info.arch}, NVRTC {d.nvrtc.version}")
    yield d
    d.close()


def _stored(x, t) -> np.ndarray:
    """x in GGUF type t as the bytes its rows hold (gguf.quants gives F16 as float16 values)."""
    return np.ascontiguousarray(cache_rows(x, t)).view(np.uint8)


def _f32(dev, a):
    return dev.upload(np.ascontiguousarray(a, np.float32))


def _q8_1(dev, x: np.ndarray):
    """x f32[n_tok, n_cols] quantized on the device: (buffer, the blocks read back)."""
    n_blocks = x.size // 32
    out = dev.alloc(n_blocks * 36)
    dev.launch("ek_quantize_q8_1", ((n_blocks + 7) // 8,), (256,), _f32(dev, x), out, n_blocks)
    return out, dev.download(out, np.zeros((n_blocks, 36), np.uint8))


def _matvec(dev, name, w_buf, x_buf, n_rows, n_cols, row_bytes, n_tok):
    out = dev.alloc(n_tok * n_rows * 4)
    dev.launch(name, ((n_rows + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK, n_tok), (32, ROWS_PER_BLOCK), w_buf, x_buf,
               out, n_rows, n_cols, row_bytes)
    return dev.download(out, np.zeros((n_tok, n_rows), np.float32))


def test_activations_quantize_to_q8_1(dev):
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    _, blocks = _q8_1(dev, x)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)[:, 0]
    q = blocks[:, 4:].view(np.int8).astype(np.int32)
    s = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0]
    xb = x.reshape(-1, 32)
    assert np.allclose(d, np.abs(xb).max(axis=1) / 127, rtol=1e-3)
    assert np.abs(q - np.round(xb / (np.abs(xb).max(axis=1, keepdims=True) / 127))).max() <= 1
    assert np.allclose(s, d * q.sum(axis=1), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kind", QUANTIZED)
@pytest.mark.parametrize("n_tok", [1, 3])
def test_quantized_matvec(dev, kind, n_tok):
    rng = np.random.default_rng(2)
    n_rows, n_cols = 37, 512
    rows = weights(kind, n_rows, n_cols, rng)
    x = rng.standard_normal((n_tok, n_cols)).astype(np.float32)
    xq, blocks = _q8_1(dev, x)
    got = _matvec(dev, f"ek_matvec_{kind.lower().replace('_k', '_K')}", dev.upload(rows), xq, n_rows, n_cols,
                  rows.shape[1], n_tok)
    xd = (blocks[:, :2].copy().view(np.float16).astype(np.float64) * blocks[:, 4:].view(np.int8)).reshape(n_tok, -1)
    w = dequantize(rows, T[kind]).astype(np.float64)
    want = xd @ w.T
    scale = np.abs(xd) @ np.abs(w).T
    assert (np.abs(got - want) <= 2e-3 * scale + 1e-4).all(), np.abs(got - want).max()


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16"])
def test_float_matvec(dev, kind):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((29, 384)).astype(np.float32)
    raw = _stored(w, T[kind]) if kind != "F32" else w.view(np.uint8)
    x = rng.standard_normal((2, 384)).astype(np.float32)
    got = _matvec(dev, f"ek_matvec_{kind.lower()}", dev.upload(raw), _f32(dev, x), 29, 384, raw.shape[1], 2)
    wd = dequantize(raw, T[kind]).astype(np.float64) if kind != "F32" else w.astype(np.float64)
    assert np.allclose(got, x.astype(np.float64) @ wd.T, rtol=1e-4, atol=1e-4)


def _matmul(dev, name, w_buf, x_buf, n_rows, n_cols, row_bytes, n_tok):
    out = dev.alloc(n_tok * n_rows * 4)
    dev.launch(name, ((n_rows + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK, (n_tok + 7) // 8), (32, ROWS_PER_BLOCK), w_buf,
               x_buf, out, n_rows, n_cols, row_bytes, n_tok)
    return dev.download(out, np.zeros((n_tok, n_rows), np.float32))


@pytest.mark.parametrize("kind", QUANTIZED + ["F32", "F16", "BF16"])
def test_matmul_gives_each_token_the_matvecs_sums(dev, kind):
    # 19 tokens: two warps' worth of 8 and a partial third; the same sums in the same order
    rng = np.random.default_rng(4)
    n_rows, n_cols, n_tok = 37, 512, 19
    w = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
    rows = w.view(np.uint8) if kind == "F32" else _stored(w, T[kind]) if kind in ("F16", "BF16") else \
        weights(kind, n_rows, n_cols, rng)
    x = rng.standard_normal((n_tok, n_cols)).astype(np.float32)
    x_buf = _f32(dev, x) if kind in ("F32", "F16", "BF16") else _q8_1(dev, x)[0]
    suffix, w_buf = kind.lower().replace("_k", "_K"), dev.upload(rows)
    got = _matmul(dev, f"ek_matmul_{suffix}", w_buf, x_buf, n_rows, n_cols, rows.shape[1], n_tok)
    want = _matvec(dev, f"ek_matvec_{suffix}", w_buf, x_buf, n_rows, n_cols, rows.shape[1], n_tok)
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6), np.abs(got - want).max()


@pytest.mark.parametrize("kind", QUANTIZED + ["F16", "F32"])
def test_embedding_rows_are_gguf_quants_values(dev, kind):
    rng = np.random.default_rng(4)
    rows = weights(kind, 10, 256, rng) if kind in QUANTIZED else _stored(
        rng.standard_normal((10, 256)).astype(np.float32), T[kind])
    ids = np.array([3, 0, 9, 3], np.int32)
    out = dev.alloc(4 * 256 * 4)
    dev.launch("ek_get_rows", (256 // 32, 4), (32,), dev.upload(rows), int(T[kind]), rows.shape[1], dev.upload(ids),
               out, 256)
    got = dev.download(out, np.zeros((4, 256), np.float32))
    assert np.array_equal(got, dequantize(rows, T[kind])[ids].astype(np.float32))


def test_norms_rope_and_activations(dev):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 576)).astype(np.float32)
    w = rng.standard_normal(576).astype(np.float32)
    out = dev.alloc(x.nbytes)
    dev.launch("ek_rms_norm", (3,), (256,), _f32(dev, x), _f32(dev, w), out, 576, 1e-5)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-5) * w
    assert np.allclose(dev.download(out, np.zeros_like(x)), want, rtol=1e-5, atol=1e-5)

    for mode in (0, 2):  # ROPE_NORM, ROPE_NEOX
        q = rng.standard_normal((2, 9, 64)).astype(np.float32)
        ang = rng.uniform(0, 6, (2, 32))
        buf = _f32(dev, q)
        dev.launch("ek_rope", (1, 9, 2), (32,), buf, _f32(dev, np.cos(ang)), _f32(dev, np.sin(ang)), 9, 64, 32, mode)
        got = dev.download(buf, np.zeros_like(q))
        a, b = (np.arange(32), np.arange(32) + 32) if mode == 2 else (np.arange(0, 64, 2), np.arange(1, 64, 2))
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        want = q.astype(np.float64).copy()
        want[..., a], want[..., b] = q[..., a] * c - q[..., b] * s, q[..., a] * s + q[..., b] * c
        assert np.allclose(got, want, rtol=1e-5, atol=1e-5), mode

    g, u = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    for name, f in (("ek_silu_mul", lambda v: v / (1 + np.exp(-v))),
                    ("ek_gelu_mul", lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v**3))))):
        buf = _f32(dev, g)
        dev.launch(name, (4,), (256,), buf, _f32(dev, u), 1000)
        assert np.allclose(dev.download(buf, np.zeros_like(g)), f(g.astype(np.float64)) * u, rtol=1e-5,
                           atol=1e-6), name

    rows = rng.standard_normal((4, 300)).astype(np.float32) * 5
    buf = _f32(dev, rows)
    dev.launch("ek_softmax_rows", (4,), (128,), buf, 300)
    e = np.exp(rows - rows.max(axis=1, keepdims=True))
    assert np.allclose(dev.download(buf, np.zeros_like(rows)), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)

    buf = _f32(dev, g * 40)  # gemma's final softcap: cap * tanh(x / cap)
    dev.launch("ek_softcap", (4,), (256,), buf, 30.0, 1000)
    assert np.allclose(dev.download(buf, np.zeros_like(g)), 30 * np.tanh(g.astype(np.float64) * 40 / 30), rtol=1e-5,
                       atol=1e-5)


@pytest.mark.parametrize("name", sorted(CACHE_TYPES))
def test_kv_rows_written_on_the_device_are_gguf_quants_bytes(dev, name):
    rng = np.random.default_rng(6)
    n_tok, n_kv, hd, cap = 3, 2, 64, 16
    src = (rng.standard_normal((n_tok, n_kv, hd)) * 4).astype(np.float32)
    t = CACHE_TYPES[name]
    block, size = gguf.GGML_QUANT_SIZES[t]
    row_bytes = hd // block * size
    ring = dev.upload(np.zeros((n_kv, cap, row_bytes), np.uint8))
    slots = np.array([5, 0, 15], np.int32)
    per_row = hd // 32 if block == 32 else hd
    n_items = n_tok * n_kv * per_row
    dev.launch("ek_kv_write", ((n_items + 127) // 128,), (128,), _f32(dev, src), dev.upload(slots), ring, int(t),
               np.inf, n_tok, n_kv, hd, cap, row_bytes)
    got = dev.download(ring, np.zeros((n_kv, cap, row_bytes), np.uint8))
    for i, slot in enumerate(slots):
        want = _stored(src[i], t) if name not in ("f32",) else src[i].view(np.uint8)
        assert np.array_equal(got[:, slot], want.reshape(n_kv, row_bytes)), (name, slot)


@pytest.mark.parametrize("type_k, type_v", [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q5_1", "bf16"),
                                            ("iq4_nl", "iq4_nl")])
def test_attention_over_a_wrapped_ring(dev, type_k, type_v):
    rng = np.random.default_rng(7)
    n_heads, n_kv, hd, cap, n_tok = 9, 3, 64, 40, 2
    tk, tv = CACHE_TYPES[type_k], CACHE_TYPES[type_v]
    k = _stored(rng.standard_normal((n_kv, cap, hd)).astype(np.float32), tk)
    v = _stored(rng.standard_normal((n_kv, cap, hd)).astype(np.float32), tv)
    slot_pos = rng.permutation(cap).astype(np.int32) + 10
    slot_pos[7] = -1
    q_pos = np.array([slot_pos.max() - 3, slot_pos.max()], np.int32)
    q = rng.standard_normal((n_tok, n_heads, hd)).astype(np.float32)
    out = dev.alloc(q.nbytes)
    chunk, n_splits = 7, 6  # split attention: ranges of 7 slots (the last past the 40 written), merged
    parts = dev.alloc(n_tok * n_heads * n_splits * (2 + hd) * 4)
    for window, split in ((0, False), (12, False), (0, True), (12, True)):
        ring = (_f32(dev, q), dev.upload(q_pos), dev.upload(k), dev.upload(v), dev.upload(slot_pos),
                dev.upload(np.array([cap], np.int32)), window, 0.125, int(tk), int(tv), n_heads, n_kv, hd, hd, cap,
                k.shape[-1], v.shape[-1], 0, 0)
        if split:
            dev.launch("ek_attention_split", (n_heads, n_tok, n_splits), (32,), *ring, chunk, parts)
            dev.launch("ek_attention_merge", (n_heads, n_tok), (32,), parts, n_splits, n_heads, hd, out)
        else:
            dev.launch("ek_attention", (n_heads, n_tok), (32,), *ring, out)
        got = dev.download(out, np.zeros_like(q))
        kd, vd = dequantize(k, tk), dequantize(v, tv)
        for t in range(n_tok):
            for h in range(n_heads):
                want = reference_attention(q[t, h], kd[h // 3], vd[h // 3], slot_pos, q_pos[t], window, 0.125)
                assert np.allclose(got[t, h], want, rtol=1e-4, atol=1e-5), (t, h, window, split)


@pytest.mark.parametrize("type_k", ["f16", "q8_0"])
def test_keep_tallies_add_each_slots_softmax_weight_into_mapped_memory(dev, type_k):
    from edgekv.cuda.arrays import page_aligned

    rng = np.random.default_rng(17)
    n_heads, n_kv, hd, cap, n_tok, n_slots, window = 6, 2, 64, 45, 3, 41, 20
    tk = CACHE_TYPES[type_k]
    k = _stored(rng.standard_normal((n_kv, cap, hd)).astype(np.float32), tk)
    slot_pos = rng.permutation(cap).astype(np.int32)
    slot_pos[[3, 30]] = -1
    q_pos = np.array([30, 38, 44], np.int32)
    q = (2 * rng.standard_normal((n_tok, n_heads, hd))).astype(np.float32)
    mass = page_aligned((n_kv, cap), np.float32)  # the tallies: host memory the GPU adds to
    mass[...] = rng.uniform(0, 1, mass.shape)
    before = mass.copy()
    ring = (_f32(dev, q), dev.upload(q_pos), dev.upload(k), dev.upload(k), dev.upload(slot_pos),
            dev.upload(np.array([n_slots], np.int32)), window, 0.125, int(tk), int(tk), n_heads, n_kv, hd, hd, cap,
            k.shape[-1], k.shape[-1], 0, 0)
    stats = dev.alloc(n_tok * n_heads * 2 * 4)
    dev.launch("ek_attention_stats", (n_heads, n_tok), (32,), *ring, stats)
    dev.launch("ek_attention_tally", ((cap + 3) // 4, n_kv), (128,), *ring, stats, dev.map(mass, read_only=False),
               n_tok)
    dev.synchronize()
    kd = dequantize(k, tk).astype(np.float64)
    want = before.astype(np.float64)
    pos = slot_pos[:n_slots]
    for t in range(n_tok):
        visible = (pos >= 0) & (pos <= q_pos[t]) & (q_pos[t] - pos < window)
        for h in range(n_heads):
            scores = kd[h // 3, :n_slots] @ q[t, h] * 0.125
            p = np.where(visible, np.exp(scores - scores[visible].max()), 0)
            want[h // 3, :n_slots] += p / p.sum()
    assert np.allclose(mass, want, rtol=1e-4, atol=1e-6), np.abs(mass - want).max()


def test_mapped_weights_and_a_graph_replay_the_same_numbers(dev):
    from edgekv.cuda.arrays import page_aligned

    rng = np.random.default_rng(8)
    rows = _stored(rng.standard_normal((64, 576)).astype(np.float32), T.Q8_0)
    x = rng.standard_normal((1, 576)).astype(np.float32)
    xq, _ = _q8_1(dev, x)
    uploaded = _matvec(dev, "ek_matvec_q8_0", dev.upload(rows), xq, 64, 576, rows.shape[1], 1)
    host = page_aligned(rows.shape, rows.dtype)  # memory registered for the GPU: whole pages of its own
    host[...] = rows
    mapped = _matvec(dev, "ek_matvec_q8_0", dev.map(host), xq, 64, 576, rows.shape[1], 1)
    assert np.array_equal(uploaded, mapped)

    x_buf, q_buf, out = _f32(dev, x), dev.alloc(18 * 36), dev.alloc(64 * 4)
    w_buf = dev.upload(rows)
    drv = dev.driver
    drv.begin_capture(dev.stream)
    dev.launch("ek_quantize_q8_1", (3,), (256,), x_buf, q_buf, 18)
    dev.launch("ek_matvec_q8_0", (16, 1), (32, 4), w_buf, q_buf, out, 64, 576, rows.shape[1])
    graph = drv.end_capture(dev.stream)
    drv.launch_graph(graph, dev.stream)
    assert np.array_equal(dev.download(out, np.zeros((1, 64), np.float32)), uploaded)


@pytest.mark.parametrize("name", ["f16", "q8_0", "q4_0", "iq4_nl"])
def test_a_context_shift_re_rotates_keys_on_the_device(dev, name):
    from edgekv.kernels.rows import rotation_for

    rng = np.random.default_rng(13)
    n_kv, hd, cap, t = 2, 64, 8, CACHE_TYPES[name]
    h = rotation_for(name not in FLOAT_CACHE_TYPES, hd, largest=True)
    x = rng.standard_normal((n_kv, cap, hd)).astype(np.float32)
    ring = _stored((x @ h if h is not None else x).astype(np.float32), t)
    slots = np.array([1, 4, 6], np.int32)
    ang = rng.uniform(-3, 3, (3, hd // 2))
    buf = dev.upload(ring)
    hm = h if h is not None else np.zeros((1, 1))
    dev.launch("ek_kv_shift", (1,), (32,), buf, dev.upload(slots), _f32(dev, np.cos(ang)), _f32(dev, np.sin(ang)),
               _f32(dev, hm), 0 if h is None else h.shape[0], int(t), np.inf, 3, n_kv, hd, cap, ring.shape[-1],
               hd // 2, 2)
    got = dequantize(dev.download(buf, np.zeros_like(ring)), t).astype(np.float64)
    before = dequantize(ring, t).astype(np.float64)
    for j, slot in enumerate(slots):
        v = before[:, slot] @ h if h is not None else before[:, slot].copy()
        a, b = np.arange(32), np.arange(32) + 32
        v[:, a], v[:, b] = (v[:, a] * np.cos(ang[j]) - v[:, b] * np.sin(ang[j]),
                            v[:, a] * np.sin(ang[j]) + v[:, b] * np.cos(ang[j]))
        want = v @ h if h is not None else v
        levels = {"f16": 500, "q8_0": 127, "q4_0": 8, "iq4_nl": 127 / 24 / 1.1}[name]  # a step of the type
        step = 1.01 * np.abs(want).max() / levels
        assert np.abs(got[:, slot] - want).max() <= step, (name, slot)
    untouched = np.setdiff1d(np.arange(cap), slots)
    assert np.array_equal(got[:, untouched], before[:, untouched])
