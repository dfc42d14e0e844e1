"""edgekv.kernels.matvec: QuantMatrix.matvec / matmul / rows against float64 NumPy references.

References are built from `gguf.quants.dequantize` (independent of our kernels). Tolerances
are named and come from the arithmetic:
- matvec quantizes x to 8-bit blocks, so |W x - ours| is bounded by sum |w| * |x - x_hat|,
  with |x - x_hat| <= amax(block) * X8_STEP (q8_0/q8_1: half a step of amax/127 plus the
  f16 rounding of the block scale; q8_K: half a step, float32 scale), plus float32
  accumulation. A second, tight test replays llama.cpp's activation quantization in NumPy
  and compares with float64 sum w * x_hat: only float32 rounding (F32_SUM) remains.
- matmul multiplies dequantized float32 tiles with BLAS: float32 accumulation only.
- rows is bit-identical to the reference dequantization.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from helpers.quant_rows import ALL_TYPES, random_rows, reference_dequantize, same_bits

from edgekv.gguf import quants
from edgekv.errors import UnsupportedModelError
from edgekv.gguf.reader import GGUFFile
from edgekv.kernels import activations as act
from edgekv.kernels import matvec as mv
from edgekv.backends.kernel_map import BATCH_MIN_TOKENS
from edgekv.kernels import repack as rp
from edgekv.kernels.int8dot import TYPES as INT8DOT_TYPES
from edgekv.kernels.matvec import QuantMatrix

F32_SUM = 2.0**-24  # per accumulated term: |error| <= n * F32_SUM * sum |w x| (float32 sums of n terms)
X8_STEP = {"q8_0": 1 / 254 + 2.0**-11, "q8_1": 1 / 254 + 2.0**-11, "q8_K": 1 / 254 * (1 + 1e-6)}
X_FLOAT_REL = {"f32": 0.0, "f16": 2.0**-11, "bf16": 2.0**-8}  # x rounded to the weight's float type


def block_scale_m(raw: np.ndarray, ggml_type: int) -> np.ndarray | None:
    """The per-block minimum m (f64[n_rows, n_blocks]) of Q4_1/Q5_1, else None."""
    if ggml_type not in (int(T.Q4_1), int(T.Q5_1)):
        return None
    q = quants.QUANT_TYPES[ggml_type]
    blocks = raw.reshape(raw.shape[0], -1, q.type_size)
    return np.ascontiguousarray(blocks[..., 2:4]).view(np.float16)[..., 0].astype(np.float64)


def matvec_bound(q, W: np.ndarray, x: np.ndarray, m: np.ndarray | None) -> np.ndarray:
    """Per-row worst-case |W x - matvec(x)| from 8-bit (or f16/bf16) rounding of x and float32 sums."""
    aw, ax = np.abs(W), np.abs(x.astype(np.float64))
    float_part = W.shape[1] * F32_SUM * (aw @ ax)
    if q.act in X_FLOAT_REL:
        return X_FLOAT_REL[q.act] * (aw @ ax) + float_part
    bs = 256 if q.act == "q8_K" else 32
    amax = ax.reshape(-1, bs).max(1)  # [n_blocks]
    per_block = aw.reshape(W.shape[0], -1, bs).sum(2)  # sum |w| per row and block
    if m is not None:  # q8_1: the min term uses s = f16(d * sum q), off by <= 32 amax X8_STEP
        per_block = per_block + 64 * np.abs(m)
    return X8_STEP[q.act] * (per_block @ amax) + float_part


def emulate_activation(q, x: np.ndarray):
    """llama.cpp's quantization of x for weight type q: (x_hat f64[n], s f64[n_blocks] or None)."""
    x = x.astype(np.float32)
    if q.act in ("q8_0", "q8_1"):  # x86 SIMD path: id = 127/amax, round half to even, d kept as f16
        b = x.reshape(-1, 32)
        amax = np.abs(b).max(1)
        with np.errstate(divide="ignore"):
            inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
        codes = np.rint(b * inv[:, None])
        d = (amax / np.float32(127)).astype(np.float32)
        s = (d * codes.sum(1).astype(np.float32)).astype(np.float16).astype(np.float64)
        return (codes * d.astype(np.float16).astype(np.float64)[:, None]).reshape(-1), s
    b = x.reshape(-1, 256)  # q8_K reference: iscale = -127/max (signed max), d = 1/iscale in float32
    vmax = b[np.arange(b.shape[0]), np.abs(b).argmax(1)]
    with np.errstate(divide="ignore"):
        iscale = np.where(vmax != 0, np.float32(-127) / vmax, np.float32(0)).astype(np.float32)
        d = np.where(vmax != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    codes = np.minimum(127, np.rint(iscale[:, None] * b))
    return (codes * d[:, None].astype(np.float64)).reshape(-1), None


def emulated_matvec(q, W: np.ndarray, x: np.ndarray, m: np.ndarray | None) -> np.ndarray:
    x_hat, s = emulate_activation(q, x)
    y = W @ x_hat
    if m is not None:  # the min part of w = d*q + m meets s instead of sum(x_hat)
        y += m @ (s - x_hat.reshape(-1, 32).sum(1))
    return y


def make_weight(ggml_type: int, n_rows: int, n_cols: int, seed: int):
    raw = random_rows(ggml_type, n_rows, n_cols, np.random.default_rng(seed))
    W = reference_dequantize(raw, ggml_type).astype(np.float64)
    return raw, W, QuantMatrix(raw, ggml_type, n_rows, n_cols)


@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=lambda t: T(t).name)
def test_matvec_within_the_activation_rounding_bound(ggml_type):
    n_rows, n_cols = 200, 512  # 200: the last 64-row group is padded
    raw, W, m = make_weight(ggml_type, n_rows, n_cols, seed=ggml_type)
    rng = np.random.default_rng(1)
    for x in (rng.standard_normal(n_cols), rng.standard_normal(n_cols) * rng.uniform(0, 10, n_cols)):
        x = x.astype(np.float32)
        x[:32] = 0  # an all-zero block
        out = np.full(n_rows, np.nan, np.float32)
        m.matvec(x, out)
        err = np.abs(out - W @ x.astype(np.float64))
        bound = matvec_bound(m.quant, W, x, block_scale_m(raw, ggml_type))
        assert np.all(err <= bound), f"{m.quant.name}: worst error / bound {np.max(err / bound):.3f}"


@pytest.mark.parametrize("ggml_type", [t for t in ALL_TYPES if quants.QUANT_TYPES[t].act.startswith("q8")],
                         ids=lambda t: T(t).name)
def test_matvec_integer_path_equals_llama_cpp_arithmetic(ggml_type):
    raw, W, m = make_weight(ggml_type, 130, 768, seed=100 + ggml_type)
    x = (np.random.default_rng(2).standard_normal(768) * 3).astype(np.float32)
    out = np.zeros(130, np.float32)
    m.matvec(x, out)
    expected = emulated_matvec(m.quant, W, x, block_scale_m(raw, ggml_type))
    tol = 768 * F32_SUM * (np.abs(W) @ np.abs(x.astype(np.float64)))
    assert np.all(np.abs(out - expected) <= tol), f"worst error / tol {np.max(np.abs(out - expected) / tol):.3f}"


def test_activation_quantizers_match_llama_cpp():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(512) * 4).astype(np.float32)
    x[:32] = 0
    x[32:64] = np.arange(32) - 15.5
    x[63] = 127.0  # amax 127 -> 127/amax = 1: x[32:63] are exact .5 ties (round half to even)
    xq, xd, xsum = np.zeros((16, 32), np.int8), np.zeros((16, 2), np.float32), np.zeros((16, 16), np.int32)
    act.quantize_act_q8(x, xq, xd, xsum)
    x_hat, s = emulate_activation(quants.QUANT_TYPES[int(T.Q4_1)], x)
    assert np.array_equal(xq.astype(np.float64) * xd[:, :1], x_hat.reshape(16, 32))
    assert np.array_equal(xd[:, 1], s) and np.array_equal(xsum[:, 0], xq.astype(np.int32).sum(1))
    kq, kd, ksum = np.zeros((2, 256), np.int8), np.zeros((2, 2), np.float32), np.zeros((2, 16), np.int32)
    act.quantize_act_q8_k(x, kq, kd, ksum)
    k_hat, _ = emulate_activation(quants.QUANT_TYPES[int(T.Q4_K)], x)
    assert np.array_equal(kq.astype(np.float64) * kd[:, :1].astype(np.float64), k_hat.reshape(2, 256))
    assert np.array_equal(ksum, kq.astype(np.int32).reshape(2, 16, 16).sum(2))


@pytest.mark.parametrize("ggml_type", ALL_TYPES, ids=lambda t: T(t).name)
def test_matmul_and_rows(ggml_type, monkeypatch):
    monkeypatch.setattr(mv, "TILE_BYTES", 512 * 4 * 128)  # 2 groups per tile: several tiles, a partial last one
    monkeypatch.setattr(rp, "CHUNK_BYTES", 1)  # repack one 64-row group per step
    n_rows, n_cols = 300, 512
    raw, W, m = make_weight(ggml_type, n_rows, n_cols, seed=7 + ggml_type)
    rng = np.random.default_rng(3)
    portable = QuantMatrix(raw, ggml_type, n_rows, n_cols, use_int8dot=False)  # the BLAS path on every CPU
    for mat in (m, portable):
        for n_tok, matmul in ((2, mat.matmul_exact), (BATCH_MIN_TOKENS + 1, mat.matmul_batch)):
            x = rng.standard_normal((n_tok, n_cols)).astype(np.float32)
            out = np.full((n_tok, n_rows), np.nan, np.float32)
            matmul(x, out)
            ref = x.astype(np.float64) @ W.T
            if matmul == mat.matmul_exact or mat.uses_int8dot or mat.sums_on_int8dot:  # q8 activations: their bound
                bound = np.stack([matvec_bound(m.quant, W, x[t], block_scale_m(raw, ggml_type))
                                  for t in range(n_tok)])
            else:  # dequantized tiles + BLAS: float32 accumulation only
                bound = n_cols * F32_SUM * (np.abs(x.astype(np.float64)) @ np.abs(W).T)
            assert np.all(np.abs(out - ref) <= bound), f"n_tok={n_tok}"
    ids = np.array([299, 0, 64, 63, 64, 257, 5])  # group edges, the padded last group, a repeat
    rows = np.zeros((ids.size, n_cols), np.float32)
    m.rows(ids, rows)
    assert same_bits(rows, W[ids].astype(np.float32))


def test_matmul_writes_into_strided_batches_of_a_scratch():
    raw, W, _ = make_weight(int(T.Q4_0), 128, 256, seed=1)
    m = QuantMatrix(raw, int(T.Q4_0), 128, 256, use_int8dot=False)  # the BLAS path
    n = BATCH_MIN_TOKENS + 4
    scratch_x = np.random.default_rng(0).standard_normal((n + 4, 256)).astype(np.float32)
    scratch_out = np.zeros((n + 4, 128), np.float32)
    m.matmul_batch(scratch_x[:n], scratch_out[:n])  # the first rows of a session's batch buffers
    ref = scratch_x[:n].astype(np.float64) @ W.T
    bound = 256 * F32_SUM * (np.abs(scratch_x[:n].astype(np.float64)) @ np.abs(W).T)
    assert np.all(np.abs(scratch_out[:n] - ref) <= bound)
    assert not scratch_out[n:].any()


@pytest.mark.parametrize("ggml_type", INT8DOT_TYPES, ids=lambda t: T(t).name)
def test_int8dot_matmul_writes_only_its_rows_and_agrees_with_matvec(ggml_type):
    n_rows = 136 if ggml_type == T.IQ4_NL else 130  # IQ4_NL's a multiple of 8: else not repacked (file layout)
    raw, _, m = make_weight(ggml_type, n_rows, 256, seed=2)
    if not m.uses_int8dot:
        pytest.skip("the CPU has no int8 dot product (AVX512-VNNI, AVX2, Arm sdot)")
    n = BATCH_MIN_TOKENS + 3
    scratch_x = np.random.default_rng(0).standard_normal((n + 4, 256)).astype(np.float32)
    scratch_out = np.zeros((n + 4, n_rows), np.float32)
    m.matmul_batch(scratch_x[:n], scratch_out[:n])
    assert not scratch_out[n:].any()
    one = np.zeros(n_rows, np.float32)
    for t in (0, n - 1):  # same integer block sums as the matvec; only the float order differs
        m.matvec(scratch_x[t], one)
        np.testing.assert_allclose(scratch_out[t], one, rtol=1e-5, atol=1e-5 * np.abs(one).max())


def test_bad_inputs_are_rejected_at_the_boundary():
    raw = random_rows(int(T.Q8_0), 4, 64, np.random.default_rng(0))
    with pytest.raises(UnsupportedModelError, match="IQ2_XXS .*supported: F32"):
        QuantMatrix(raw, int(T.IQ2_XXS), 4, 64)
    with pytest.raises(UnsupportedModelError, match="needs 272 uint8 bytes, got 136"):
        QuantMatrix(raw[:2], int(T.Q8_0), 4, 64)
    m = QuantMatrix(raw, int(T.Q8_0), 4, 64)
    with pytest.raises(ValueError, match="x: expected a C-contiguous float32 array of shape"):
        m.matvec(np.zeros(64, np.float64), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match=r"out: .*shape \(4,\)"):
        m.matvec(np.zeros(64, np.float32), np.zeros(5, np.float32))
    with pytest.raises(IndexError, match="row 4 is out of range"):
        m.rows(np.array([1, 4]), np.zeros((2, 64), np.float32))
    assert (m.n_rows, m.n_cols, m.ggml_type) == (4, 64, int(T.Q8_0)) and m.nbytes >= raw.nbytes


# ---- real models ------------------------------------------------------------------------

REAL = {
    "smollm2": ["blk.0.attn_q.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "token_embd.weight"],
    "gemma3": ["blk.0.ffn_gate.weight", "blk.0.attn_output.weight", "blk.0.ffn_down.weight",
               "blk.3.ffn_down.weight", "blk.2.attn_k.weight", "token_embd.weight"],
}


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(REAL))
def test_real_weights(model, request):
    f = GGUFFile(request.getfixturevalue(f"{model}_path"))
    rng = np.random.default_rng(0)
    for name in REAL[model]:
        info = f.tensor(name)
        n_cols, n_rows = info.shape
        m = QuantMatrix(info.data, info.ggml_type, n_rows, n_cols)
        assert m.nbytes < 1.1 * info.data.nbytes + 64 * 1024, name  # about the quantized size
        x = (rng.standard_normal(n_cols) * rng.uniform(0.1, 3, n_cols)).astype(np.float32)
        out = np.zeros(n_rows, np.float32)
        m.matvec(x, out)
        ids = np.sort(rng.choice(n_rows, size=min(n_rows, 256), replace=False))  # reference on a sample
        raw = np.ascontiguousarray(np.asarray(info.data).reshape(n_rows, -1)[ids])
        W = reference_dequantize(raw, info.ggml_type)
        rows = np.zeros((ids.size, n_cols), np.float32)
        m.rows(ids, rows)
        assert same_bits(rows, W), name
        W = W.astype(np.float64)
        expected = emulated_matvec(m.quant, W, x, block_scale_m(raw, info.ggml_type))
        tol = n_cols * F32_SUM * (np.abs(W) @ np.abs(x.astype(np.float64)))
        assert np.all(np.abs(out[ids] - expected) <= tol), name
        bound = matvec_bound(m.quant, W, x, block_scale_m(raw, info.ggml_type))
        assert np.all(np.abs(out[ids] - W @ x.astype(np.float64)) <= bound), name
