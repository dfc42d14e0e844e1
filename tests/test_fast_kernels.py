"""The machine-specific fast paths against the portable kernels they replace.

The LLVM-IR kernels (kernels/dot_ir.py on AVX512-VNNI, AVX2 or Arm sdot, the f16 dot in attention.py, the in-place
Q8_0/Q4_0 cache rows in attention_q.py) and the intrinsics (kernels/intrinsics.py) exist
for speed only; the exact ones must give the same bits as the portable Numba code (which
test_reference_models holds to llama.cpp), the quantized-cache ones the same values up to
float32 summation order. Tests of a path the CPU lacks are skipped.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from helpers.quant_rows import random_rows

from edgekv.kernels import attention as att
from edgekv.kernels import attention_q as attq
from edgekv.kernels import fp16
from edgekv.kernels.dot_iq import FILE_LAYOUT, ORDER_CHUNK
from edgekv.kernels.dot_k import ORDER_GEMM, ORDER_GEMV, ORDER_TILED
from edgekv.kernels.intrinsics import fma
from edgekv.kernels.matvec import QuantMatrix, quantize_chunk
from edgekv.kernels.quantize import quantize_rows
from edgekv.kernels.row_stack import RowStack
from edgekv.kernels.int8dot import CHUNK, HAS_INT8DOT, ISA, TYPES as INT8DOT_TYPES

import numba as nb


NO_INT8DOT = "the CPU has no int8 dot product (AVX512-VNNI, AVX2, Arm sdot)"


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32))


def _repacked_rows(ggml_type: int, n_rows: int) -> int:
    # IQ4_NL and Q2_K rows a multiple of 8 (37 -> 40): else llama.cpp keeps the weight in file
    # layout, whose orders only the portable kernels follow (the file-layout test below)
    return -(-n_rows // 8) * 8 if ggml_type in (T.IQ4_NL, T.Q2_K) else n_rows


@pytest.mark.skipif(not HAS_INT8DOT, reason=NO_INT8DOT)
@pytest.mark.parametrize("shape", [(200, 1024), (37, 96), (8, 32)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("ggml_type", INT8DOT_TYPES, ids=lambda t: T(t).name)
def test_int8dot_matvec_has_the_portable_kernels_bits(ggml_type, shape):
    # 200 and 37 rows: a padded last group in both layouts; 8 x 32: one block, one group
    rng = np.random.default_rng(ggml_type)
    n_rows, n_cols = _repacked_rows(ggml_type, shape[0]), shape[1]
    raw = random_rows(ggml_type, n_rows, n_cols, rng)
    fast = QuantMatrix(raw, ggml_type, n_rows, n_cols)
    portable = QuantMatrix(raw, ggml_type, n_rows, n_cols, use_int8dot=False)
    assert fast.uses_int8dot and fast.lanes == CHUNK == ISA.width and portable.lanes == 64
    for scale in (1.0, 1e-3, 50.0):
        x = (rng.standard_normal(n_cols) * scale).astype(np.float32)
        x[n_cols - 32:] = 0  # a zero activation block
        a, b = np.zeros(n_rows, np.float32), np.zeros(n_rows, np.float32)
        fast.matvec(x, a)
        portable.matvec(x, b)
        assert same_bits(a, b)
    rows = np.zeros((3, n_cols), np.float32), np.zeros((3, n_cols), np.float32)
    fast.rows(np.array([0, 5, n_rows - 1]), rows[0])
    portable.rows(np.array([0, 5, n_rows - 1]), rows[1])
    assert same_bits(*rows)


@pytest.mark.skipif(not HAS_INT8DOT, reason=NO_INT8DOT)
@pytest.mark.parametrize("shape", [(200, 1024), (37, 96)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("ggml_type", INT8DOT_TYPES, ids=lambda t: T(t).name)
def test_int8dot_rows_have_each_tokens_matvec_bits(ggml_type, shape):
    # several tokens in one call (matvec_rows: separate sequences decoded together;
    # matmul_exact: a short chunk) give each token the bits of its own portable matvec
    rng = np.random.default_rng(ggml_type + 11)
    n_rows, n_cols = _repacked_rows(ggml_type, shape[0]), shape[1]
    raw = random_rows(ggml_type, n_rows, n_cols, rng)
    fast = QuantMatrix(raw, ggml_type, n_rows, n_cols)
    portable = QuantMatrix(raw, ggml_type, n_rows, n_cols, use_int8dot=False)
    for n_tok in (2, 4, 7, 63):
        x = rng.standard_normal((n_tok, n_cols)).astype(np.float32) * np.float32(rng.choice([1e-3, 1.0, 50.0]))
        x[1, :32] = 0  # a zero activation block
        expected = np.zeros((n_tok, n_rows), np.float32)
        for t in range(n_tok):
            portable.matvec(x[t], expected[t])
        rows, exact = np.zeros_like(expected), np.zeros_like(expected)
        fast.matvec_rows(x, rows)
        fast.matmul_exact(x, exact)
        assert same_bits(rows, expected) and same_bits(exact, expected), n_tok


@pytest.mark.parametrize("shape", [(200, 96), (64, 1536), (16, 8)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("ggml_type", [T.F32, T.F16, T.BF16], ids=lambda t: T(t).name)
def test_float_rows_have_each_tokens_matvec_bits(ggml_type, shape):
    # float weights for several tokens (float_ir.py: up to 6 per weight load, 13 = 5 + 4 + 4)
    # against dot_float one token at a time; 200 rows leave padding in the last 64-row group
    rng = np.random.default_rng(int(ggml_type) + 5)
    n_rows, n_cols = shape
    w = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
    w[0, :3] = [np.inf, 6e-8, -0.0]  # an inf, a half subnormal (F16), a negative zero
    raw = {T.F32: w, T.F16: w.astype(np.float16), T.BF16: (w.view(np.uint32) >> 16).astype(np.uint16)}[ggml_type]
    matrix = QuantMatrix(raw.view(np.uint8).reshape(n_rows, -1), ggml_type, n_rows, n_cols)
    for n_tok in (1, 2, 5, 6, 7, 13):
        x = rng.standard_normal((n_tok, n_cols)).astype(np.float32) * np.float32(rng.choice([1e-3, 1.0, 50.0]))
        expected = np.zeros((n_tok, n_rows), np.float32)
        for t in range(n_tok):
            matrix.matvec(x[t], expected[t])
        rows, exact = np.full_like(expected, np.nan), np.full_like(expected, np.nan)
        matrix.matvec_rows(x, rows)
        matrix.matmul_exact(x, exact)
        assert same_bits(rows, expected) and same_bits(exact, expected), n_tok


@pytest.mark.skipif(not HAS_INT8DOT, reason=NO_INT8DOT)
@pytest.mark.parametrize("codes", [(-128, -128), (127, 127), (-128, 127)], ids=str)
def test_int8dot_q8_0_extreme_codes_are_exact(codes):
    # the largest pair sums an int8 instruction sees (AVX2's vpmaddubsw adds byte products in
    # pairs into int16, saturating): codes at the ends of int8, activations at +-127 of one sign
    n_rows, n_cols = 16, 256
    blocks = np.zeros((n_rows, n_cols // 32, 34), np.uint8)
    blocks[..., :2] = np.full(blocks.shape[:2], 1.0, np.float16).view(np.uint8).reshape(*blocks.shape[:2], 2)
    blocks[..., 2::2], blocks[..., 3::2] = np.uint8(codes[0] & 0xFF), np.uint8(codes[1] & 0xFF)
    raw = blocks.reshape(n_rows, -1)
    fast = QuantMatrix(raw, int(T.Q8_0), n_rows, n_cols)
    portable = QuantMatrix(raw, int(T.Q8_0), n_rows, n_cols, use_int8dot=False)
    assert fast.uses_int8dot
    for sign in (1.0, -1.0):
        x = np.full(n_cols, sign, np.float32)  # every activation code is sign * 127, d_x = f16(1/127)
        out, ref = np.zeros(n_rows, np.float32), np.zeros(n_rows, np.float32)
        fast.matvec(x, out)
        portable.matvec(x, ref)
        assert same_bits(out, ref)
        np.testing.assert_allclose(out, sign * 128 * (codes[0] + codes[1]), rtol=1e-3)  # 8 blocks x 16 pairs


K_TILE_TYPES = [int(T.Q4_K), int(T.Q5_K), int(T.Q6_K), int(T.Q3_K), int(T.IQ4_XS), int(T.Q2_K)]


def _tile_rows(ggml_type: int) -> int:
    # rows of the whole-tile tests: a padded last row group (Q2_K's: where groups are 16 rows,
    # VNNI's; its rows must be a multiple of 8, else llama.cpp keeps it in file layout, whose
    # orders are the portable kernels')
    return 104 if ggml_type == T.Q2_K else 100


@pytest.mark.skipif(not HAS_INT8DOT, reason=NO_INT8DOT)
@pytest.mark.parametrize("ggml_type", K_TILE_TYPES, ids=lambda t: T(t).name)
def test_k_quant_sums_on_int8dot_have_the_portable_kernels_bits(ggml_type):
    # every llama.cpp order (dot_k.py), a padded last group, a zero activation super-block;
    # Q3_K's and IQ4_XS's signed codes meet q8_K's extreme -127 in every block (its largest |x|)
    rng = np.random.default_rng(ggml_type)
    n_rows, n_cols = _tile_rows(ggml_type), 768
    raw = random_rows(ggml_type, n_rows, n_cols, rng)
    fast = QuantMatrix(raw, ggml_type, n_rows, n_cols)
    portable = QuantMatrix(raw, ggml_type, n_rows, n_cols, use_int8dot=False)
    assert fast.sums_on_int8dot and not portable.sums_on_int8dot and (fast.lanes, portable.lanes) == (CHUNK, 64)
    for scale in (1.0, 1e-3, 50.0):
        x = (rng.standard_normal(n_cols) * scale).astype(np.float32)
        x[256:512] = 0
        for order in (ORDER_GEMV, ORDER_GEMM, ORDER_TILED, ORDER_GEMM | ORDER_TILED):
            a, b = np.zeros(n_rows, np.float32), np.zeros(n_rows, np.float32)
            fast.matvec(x, a, order)
            portable.matvec(x, b, order)
            assert same_bits(a, b), (scale, order)


@pytest.mark.skipif(not HAS_INT8DOT, reason=NO_INT8DOT)
@pytest.mark.parametrize("ggml_type, codes", [(int(T.Q3_K), slice(0, 96)), (int(T.IQ4_XS), slice(8, 136))],
                         ids=["Q3_K", "IQ4_XS"])
def test_the_most_negative_codes_times_extreme_activations_are_exact(ggml_type, codes):
    # every code at its most negative (Q3_K -4: hmask and qs bytes 0; IQ4_XS level -127: nibble
    # 0) and a positive spike in every 256 values, which q8_K maps to -127: the largest
    # products of the sign trick and the AVX2 pairs (2 x 127 x 127 must not saturate)
    rng = np.random.default_rng(3)
    n_rows, n_cols = 32, 512
    raw = random_rows(ggml_type, n_rows, n_cols, rng)
    blocks = raw.reshape(-1, raw.size // (n_rows * n_cols // 256))
    blocks[:, codes] = 0
    fast = QuantMatrix(raw, ggml_type, n_rows, n_cols)
    portable = QuantMatrix(raw, ggml_type, n_rows, n_cols, use_int8dot=False)
    x = rng.standard_normal((9, n_cols)).astype(np.float32)
    x[:, ::256] = 100.0
    a, b = np.zeros((9, n_rows), np.float32), np.zeros((9, n_rows), np.float32)
    fast.matmul_exact(x, a)  # from 8 tokens: the tiled order
    for t in range(9):
        portable.matvec(x[t], b[t], ORDER_TILED)
    assert same_bits(a, b)
    fast.matvec(x[0], a[0])
    portable.matvec(x[0], b[0], ORDER_GEMV)
    assert same_bits(a[0], b[0])
    xq, _, _ = quantize_chunk(x, 256)
    assert np.all(xq[:, :, 0] == -127)  # the spikes are q8_K's extreme code


@pytest.mark.skipif(not HAS_INT8DOT, reason=NO_INT8DOT)
@pytest.mark.parametrize("ggml_type", [int(T.Q2_K), int(T.IQ4_NL)], ids=lambda t: T(t).name)
def test_file_layout_weights_keep_llama_cpps_file_orders(ggml_type):
    # llama.cpp repacks a Q2_K or IQ4_NL weight only when its rows are a multiple of 8 and it
    # is not a tied output; the others it sums in vec_dot's, the tiled and tinyBLAS's orders,
    # which the IR kernels do not follow: such weights stay on the portable kernels
    # (dot_k_low.py, dot_iq.py), with their bits
    rng = np.random.default_rng(11)
    n_cols = 512
    x = rng.standard_normal((9, n_cols)).astype(np.float32)
    for n_rows, tied in ((100, False), (104, True)):
        raw = random_rows(ggml_type, n_rows, n_cols, rng)
        fast = QuantMatrix(raw, ggml_type, n_rows, n_cols)
        portable = QuantMatrix(raw, ggml_type, n_rows, n_cols, use_int8dot=False)
        assert (fast.sums_on_int8dot or fast.uses_int8dot) == tied
        if tied:
            repacked = np.zeros((1, n_rows), np.float32)
            fast.matvec(x[0], repacked[0])
            fast.keep_file_order()
            portable.keep_file_order()
            assert not (fast.sums_on_int8dot or fast.uses_int8dot)
        a, b = np.zeros((9, n_rows), np.float32), np.zeros((9, n_rows), np.float32)
        fast.matmul_exact(x, a)  # 9 tokens: the file layout's tiled (tinyBLAS) order
        for t in range(9):
            portable.matvec(x[t], b[t], ORDER_TILED | ORDER_CHUNK | FILE_LAYOUT)
        assert same_bits(a, b)
        fast.matvec(x[0], a[0])
        portable.matvec(x[0], b[0], ORDER_GEMV | FILE_LAYOUT)  # vec_dot's lanes
        assert same_bits(a[0], b[0])
    assert not same_bits(a[0], repacked[0])  # another order: other last bits


def _per_token_orders(m: QuantMatrix, x: np.ndarray) -> np.ndarray:
    # llama.cpp's batch orders token by token on the portable kernels (QuantMatrix.matmul_exact's rule)
    n_tok, n_gemm = x.shape[0], x.shape[0] - x.shape[0] % 4
    out = np.zeros((n_tok, m.n_rows), np.float32)
    for t in range(n_tok):
        m.matvec(x[t], out[t], (ORDER_GEMM if t < n_gemm else ORDER_GEMV) | (ORDER_TILED if n_tok >= 8 else 0))
    return out


@pytest.mark.skipif(not HAS_INT8DOT, reason=NO_INT8DOT)
@pytest.mark.parametrize("ggml_type", K_TILE_TYPES, ids=lambda t: T(t).name)
def test_k_quant_tile_gemm_has_llama_cpp_orders_bits(ggml_type):
    # gemm_k_ir.py's and gemm_low_ir.py's whole-tile kernels (the batch path, and matmul_exact from 8 tokens) against
    # per-token portable matvecs: token counts with and without a remainder of the 4-token
    # groups and of the Q6_K tiles, a padded last row group, a zero super-block, tiny and large x
    rng = np.random.default_rng(ggml_type + 1)
    n_rows, n_cols = _tile_rows(ggml_type), 768
    raw = random_rows(ggml_type, n_rows, n_cols, rng)
    fast = QuantMatrix(raw, ggml_type, n_rows, n_cols)
    portable = QuantMatrix(raw, ggml_type, n_rows, n_cols, use_int8dot=False)
    for n_tok in (4, 5, 8, 13, 64, 67):
        x = rng.standard_normal((n_tok, n_cols)).astype(np.float32) * np.float32(rng.choice([1e-3, 1.0, 50.0]))
        x[1, 256:512] = 0
        expected = _per_token_orders(portable, x)
        exact, batch = np.zeros_like(expected), np.zeros_like(expected)
        fast.matmul_exact(x, exact)
        assert same_bits(exact, expected), n_tok
        if n_tok >= 8:
            fast.matmul_batch(x, batch)
            assert same_bits(batch, expected), n_tok
        fast.matvec_rows(x, batch)  # separate sequences: each token as its own decode step
        for t in range(n_tok):
            portable.matvec(x[t], expected[t], ORDER_GEMV)
        assert same_bits(batch, expected), n_tok


@pytest.mark.parametrize("ggml_type", [int(T.Q4_K), int(T.Q6_K), int(T.Q5_0)], ids=lambda t: T(t).name)
def test_lane_count_does_not_change_a_bit(ggml_type):
    # 16-row groups (the VNNI layout) and 64-row groups through the portable kernels
    rng = np.random.default_rng(7)
    raw = random_rows(ggml_type, 100, 512, rng)
    x = rng.standard_normal(512).astype(np.float32)
    outs = []
    for lanes in (16, 64):
        m = QuantMatrix(raw, ggml_type, 100, 512, lanes=lanes, use_int8dot=False)
        for order in (ORDER_GEMV, ORDER_GEMM):
            out = np.zeros(100, np.float32)
            m.matvec(x, out, order)
            outs.append(out)
    assert same_bits(outs[0], outs[2]) and same_bits(outs[1], outs[3])


def test_half_conversions_match_the_integer_formulation():
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    halves = halves[(halves & 0x7C00) != 0x7C00]  # NaNs aside (an instruction quiets signalling ones)
    fast, soft = np.zeros(halves.size, np.float32), np.zeros(halves.size, np.float32)
    _convert(halves, fast, soft)
    assert same_bits(fast, soft)
    assert same_bits(soft, halves.view(np.float16).astype(np.float32))
    x = np.random.default_rng(0).standard_normal(200_000).astype(np.float32) * np.float32(3e4)
    x = np.concatenate([x, soft, np.float32([65519.99, 65520.0, 6e-8, 3e-8, -0.0])])
    a, b = np.zeros(x.size, np.uint16), np.zeros(x.size, np.uint16)
    _round(x, a, b)
    with np.errstate(over="ignore"):  # NumPy's own cast as the third opinion; beyond 65504 it is inf too
        assert np.array_equal(a, b) and np.array_equal(a, x.astype(np.float16).view(np.uint16))


@nb.njit
def _convert(h, fast, soft):
    for i in range(h.size):
        fast[i] = fp16.f16_to_f32(h[i])
        soft[i] = fp16.f16_to_f32_soft(h[i])


@nb.njit
def _round(x, fast, soft):
    for i in range(x.size):
        fast[i] = fp16.f32_to_f16(x[i])
        soft[i] = fp16.f32_to_f16_soft(x[i])


@nb.njit
def _fmas(a, b, c, out):
    for i in range(a.size):
        out[i] = fma(a[i], b[i], c[i])


def test_fma_rounds_once():
    # a*b + c with a*b exact in float64; where float64's sum is itself exact, one rounding
    # to float32 is the true FMA, so both must agree; and the classic case where a separate
    # multiply loses the low bits: (1 + 2^-12)^2 - (1 + 2^-11) = 2^-24
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((2, 100_000)).astype(np.float32)
    c = rng.standard_normal(100_000).astype(np.float32)
    out = np.zeros_like(a)
    _fmas(a, b, c, out)
    ref = (a.astype(np.float64) * b + c).astype(np.float32)
    assert np.mean(out == ref) > 0.9999
    e = np.float32(1 + 2.0**-12)
    one = np.zeros(1, np.float32)
    _fmas(np.array([e]), np.array([e]), np.array([-(1 + 2.0**-11)], np.float32), one)
    assert one[0] == np.float32(2.0**-24)


@pytest.mark.parametrize("hd", [64, 256])
def test_ir_f16_dot_has_the_portable_bits(hd):
    rng = np.random.default_rng(hd)
    acc = np.zeros(64, np.float32)
    for _ in range(200):
        q = rng.standard_normal(hd).astype(np.float16).astype(np.float32)
        k = (rng.standard_normal(hd) * rng.uniform(0.01, 100)).astype(np.float16).view(np.uint16)
        assert same_bits(att.dot_f16_4reg(q, k), att.dot_f16(q, k, acc, False))


@pytest.mark.parametrize("name, ggml_type", [("q8_0", 8), ("q4_0", 2)])
def test_in_place_cache_rows_against_dequantized_ones(name, ggml_type):
    rng = np.random.default_rng(ggml_type)
    hd = 128
    rows = rng.standard_normal((20, hd)).astype(np.float32)
    q = np.zeros((20, 34 * hd // 32 if ggml_type == 8 else 18 * hd // 32), np.uint8)
    quantize_rows(rows, ggml_type, q)
    deq = np.zeros((20, hd), np.float32)
    attq.dequant_rows(q, ggml_type, deq)
    x = rng.standard_normal(hd).astype(np.float32)
    scratch = np.zeros(hd, np.float32)
    for r in range(20):
        want = float(deq[r].astype(np.float64) @ x)
        assert abs(attq.dot_row(q[r], ggml_type, x, scratch) - want) <= 1e-5 * np.abs(deq[r] * x).sum()
        acc = np.ones(hd, np.float32)
        attq.add_row(q[r], ggml_type, np.float32(0.5), acc, scratch)
        np.testing.assert_allclose(acc, 1 + 0.5 * deq[r].astype(np.float64), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_released_file_pages_read_back_the_same(smollm2_path):
    from edgekv.gguf.reader import GGUFFile

    g = GGUFFile(smollm2_path)
    info = g.tensor("blk.0.attn_q.weight")
    before = np.array(info.data[:4096])
    g.release_pages(info.data[:4096])
    g.release_pages()
    assert np.array_equal(info.data[:4096], before)


@pytest.mark.skipif(not HAS_INT8DOT, reason=NO_INT8DOT)
@pytest.mark.parametrize("ggml_type", [int(T.Q4_1), int(T.Q5_0)], ids=lambda t: T(t).name)
def test_row_stack_has_each_weights_bits_and_shares_its_memory(ggml_type):
    # q/k/v-like weights of one input as one RowStack (backends' share_input): every part as its
    # own weight computes it, one token and a long chunk, with the members' arrays views of the block
    rng = np.random.default_rng(3)
    # row counts in whole row groups of this CPU's kernels (16 rows on AVX512-VNNI, 8 on AVX2)
    shapes, n_cols = (4 * CHUNK, CHUNK, 3 * CHUNK), 256
    raws = [random_rows(ggml_type, n, n_cols, rng) for n in shapes]
    alone = [QuantMatrix(raw, ggml_type, n, n_cols) for raw, n in zip(raws, shapes)]
    members = [QuantMatrix(raw, ggml_type, n, n_cols) for raw, n in zip(raws, shapes)]
    stack = RowStack.of(members)
    assert stack is not None and stack.is_of(members) and not stack.is_of(alone)
    assert all(np.shares_memory(w._p.qs, stack.qs) for w in members)
    x = rng.standard_normal((70, n_cols)).astype(np.float32)
    outs = [np.zeros((70, n), np.float32) for n in shapes]
    stack.matvec(x[0], [o[0] for o in outs])
    for w, o in zip(alone, outs):
        ref = np.zeros(w.n_rows, np.float32)
        w.matvec(x[0], ref)
        assert same_bits(o[0], ref)
    stack.matmul_batch(x, outs)
    for w, o in zip(alone, outs):
        ref = np.zeros((70, w.n_rows), np.float32)
        w.matmul_batch(x, ref)
        assert same_bits(o, ref)
    stack.matvec_rows(x[:5], [o[:5] for o in outs])  # separate sequences' tokens (or a short chunk)
    for w, o in zip(alone, outs):
        for t in range(5):
            ref = np.zeros(w.n_rows, np.float32)
            w.matvec(x[t], ref)
            assert same_bits(o[t], ref), t
    odd = QuantMatrix(random_rows(ggml_type, 13, n_cols, rng), ggml_type, 13, n_cols)  # a padded last group
    assert RowStack.of([alone[0], odd]) is None


@pytest.mark.skipif(not HAS_INT8DOT, reason=NO_INT8DOT)
@pytest.mark.parametrize("kinds", [(T.Q4_K, T.Q6_K, T.Q5_K), (T.Q3_K, T.IQ4_XS, T.Q2_K)],
                         ids=["q4_k_m", "q3_k+iq4_xs+q2_k"])
def test_k_stack_has_each_weights_bits_and_leaves_them_in_place(kinds):
    # q/k/v-like K-quant weights of one input (Q4_K, Q6_K and Q5_K mixed, as a Q4_K_M layer's
    # q/k/v are; Q3_K_M's Q3_K beside IQ4_XS) as one KStack: one token through all of them,
    # every part with its own weight's matvec bits; the weights keep their own arrays; the
    # backend projects a chunk through each weight alone (its orders differ from a lone token's)
    from edgekv.backends import get_backend
    from edgekv.kernels.row_stack import KStack, stack_of

    rng = np.random.default_rng(5)
    n_cols = 512
    shapes = (4 * CHUNK, CHUNK, 2 * CHUNK)
    raws = [random_rows(int(k), n, n_cols, rng) for k, n in zip(kinds, shapes)]
    alone = [QuantMatrix(raw, int(k), n, n_cols) for raw, k, n in zip(raws, kinds, shapes)]
    members = [QuantMatrix(raw, int(k), n, n_cols) for raw, k, n in zip(raws, kinds, shapes)]
    before = [w._p.qs for w in members]
    stack = stack_of(members)
    assert isinstance(stack, KStack) and stack.is_of(members) and not stack.is_of(alone)
    assert all(w._p.qs is qs for w, qs in zip(members, before))
    x = rng.standard_normal((9, n_cols)).astype(np.float32)
    for t in range(3):  # the scratch is reused call after call
        outs = [np.full(n, np.nan, np.float32) for n in shapes]
        stack.matvec(x[t], outs)
        for w, o in zip(alone, outs):
            ref = np.zeros(w.n_rows, np.float32)
            w.matvec(x[t], ref)
            assert same_bits(o, ref), (t, w)
    backend = get_backend("cpu")
    backend.share_input(members)
    assert members[0].stack is not None
    for n_tok in (1, 5, 9):  # one token through the stack; chunks weight by weight, as unstacked
        outs = [np.zeros((n_tok, n), np.float32) for n in shapes]
        backend.project_many(members, x[:n_tok], outs)
        for w, o in zip(alone, outs):
            ref = np.zeros((n_tok, w.n_rows), np.float32)
            backend.project(w, x[:n_tok], ref)
            assert same_bits(o, ref), (n_tok, w)
    odd = QuantMatrix(random_rows(int(T.Q4_K), 13, n_cols, rng), int(T.Q4_K), 13, n_cols)  # a padded last group
    assert KStack.of([alone[0], odd]) is None and KStack.of([alone[0]]) is None
