"""native/'s arithmetic built for this CPU: the headers the kernels share (ek_blocks.cuh,
ek_kv.cuh, ek_attention.cuh, ek_shift.cuh) compiled by the system C++ compiler through cffi,
with one lane standing in for a warp, against independent references: gguf.quants for the
bytes and values of weight blocks and K/V rows, float64 NumPy for dot products, attention
and the context shift. What runs only on a GPU (warp sums, launches) is
tests/test_cuda_device.py's.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import cffi
import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from helpers.native_reference import (CACHE_TYPES, FLOAT_CACHE_TYPES, QUANTIZED, cache_rows, reference_attention,
                                      weights)

NATIVE = Path(__file__).resolve().parents[1] / "native"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """native/ek_blocks.cuh compiled by the system C++ compiler (no FMA contraction, as NumPy)."""
    ffi = cffi.FFI()
    ffi.cdef("""
        int ek_host_unpack(int type, const unsigned char *row, int s, float *values);
        float ek_host_dot(int type, const unsigned char *row, int s, const unsigned char *y);
        float ek_host_half(unsigned short h);
        float ek_host_bf16(unsigned short h);
        unsigned short ek_host_to_half(float f);
        unsigned short ek_host_to_bf16(float f);
        void ek_host_kv_row(int type, const float *x, int n, float limit, unsigned char *row);
        float ek_host_kv_element(int type, const unsigned char *row, int i);
        void ek_host_attend(const float *q, const unsigned char *k, const unsigned char *v, const int *slot_pos,
                            int n_slots, int qp, int window, int type_k, int type_v, int hd_k, int hd_v,
                            int row_bytes_k, int row_bytes_v, float scale, float *out);
        void ek_host_attend_split(const float *q, const unsigned char *k, const unsigned char *v,
                                  const int *slot_pos, int n_slots, int qp, int window, int type_k, int type_v,
                                  int hd_k, int hd_v, int row_bytes_k, int row_bytes_v, float scale, int chunk,
                                  int n_splits, float *parts, float *out);
        void ek_host_shift_row(unsigned char *row, int type, int hd, int mode, const float *cos_t,
                               const float *sin_t, const float *h, int r, float limit);
        void ek_host_attend_sinks(const float *q, const unsigned char *k, const unsigned char *v,
                                  const int *slot_pos, int n_slots, int qp, int type_k, int hd, int row_bytes_k,
                                  const float *sink, int n_sinks, float *out);
        void ek_host_tally(const float *q, const int *q_pos, const unsigned char *k, const int *slot_pos,
                           int n_slots, int window, int type_k, int n_tok, int n_heads, int n_kv, int hd_k, int cap,
                           int row_bytes_k, float scale, float *stats, float *mass);
    """)
    ffi.set_source("_ek_native_host", """
        #include <cmath>
        #include "ek_attention.cuh"
        #include "ek_shift.cuh"
        struct ek_one_lane {  // the host's stand-in for a warp: one lane owns every dim
            static constexpr int lanes = 1;
            int lane() const { return 0; }
            float sum(float v) const { return v; }
            float exp(float x) const { return expf(x); }
        };
        extern "C" {
        unsigned short ek_host_to_half(float f) { return ek_float_to_half(f); }
        unsigned short ek_host_to_bf16(float f) { return ek_float_to_bf16(f); }
        void ek_host_kv_row(int type, const float *x, int n, float limit, unsigned char *row) {
            if (ek_kv_block_bytes(type)) {
                for (int b = 0; b < n / 32; ++b) {
                    float v[32];
                    for (int k = 0; k < 32; ++k) v[k] = ek_clamp(x[32 * b + k], limit);
                    ek_kv_store_block(type, v, row, b);
                }
            } else {
                for (int i = 0; i < n; ++i) ek_kv_store_value(type, ek_clamp(x[i], limit), row, i);
            }
        }
        float ek_host_kv_element(int type, const unsigned char *row, int i) { return ek_kv_element(type, row, i); }
        void ek_host_attend(const float *q, const unsigned char *k, const unsigned char *v, const int *slot_pos,
                            int n_slots, int qp, int window, int type_k, int type_v, int hd_k, int hd_v,
                            int row_bytes_k, int row_bytes_v, float scale, float *out) {
            ek_attend_args a = {q, k, v, slot_pos, n_slots, qp, window, type_k, type_v, hd_k, hd_v,
                                row_bytes_k, row_bytes_v, scale, out};
            ek_attend_head(ek_one_lane(), a);
        }
        void ek_host_attend_split(const float *q, const unsigned char *k, const unsigned char *v,
                                  const int *slot_pos, int n_slots, int qp, int window, int type_k, int type_v,
                                  int hd_k, int hd_v, int row_bytes_k, int row_bytes_v, float scale, int chunk,
                                  int n_splits, float *parts, float *out) {
            for (int z = 0; z < n_splits; ++z) {  // as ek_attention_split's blocks, then ek_attention_merge
                const int s0 = z * chunk, s1 = s0 + chunk < n_slots ? s0 + chunk : n_slots;
                ek_attend_args a = {q, k, v, slot_pos, n_slots, qp, window, type_k, type_v, hd_k, hd_v,
                                    row_bytes_k, row_bytes_v, scale, parts + z * (2 + hd_v)};
                ek_attend_slots(ek_one_lane(), a, s0, s1, true);
            }
            ek_attend_merge(ek_one_lane(), parts, n_splits, hd_v, out);
        }
        void ek_host_shift_row(unsigned char *row, int type, int hd, int mode, const float *cos_t,
                               const float *sin_t, const float *h, int r, float limit) {
            ek_shift_args a = {type, hd, hd / 2, mode, r, limit, cos_t, sin_t, h};
            ek_shift_row(row, a);
        }
        void ek_host_attend_sinks(const float *q, const unsigned char *k, const unsigned char *v,
                                  const int *slot_pos, int n_slots, int qp, int type_k, int hd, int row_bytes_k,
                                  const float *sink, int n_sinks, float *out) {
            ek_attend_args a = {q, k, v, slot_pos, n_slots, qp, 0, type_k, EK_F32, hd, hd, row_bytes_k, 4 * hd,
                                0.125f, out, sink, n_sinks};
            ek_attend_head(ek_one_lane(), a);
        }
        void ek_host_tally(const float *q, const int *q_pos, const unsigned char *k, const int *slot_pos,
                           int n_slots, int window, int type_k, int n_tok, int n_heads, int n_kv, int hd_k, int cap,
                           int row_bytes_k, float scale, float *stats, float *mass) {
            const int group = n_heads / n_kv;  // as ek_attention_stats' blocks, then ek_attention_tally's warps
            for (int t = 0; t < n_tok; ++t)
                for (int h = 0; h < n_heads; ++h) {
                    ek_attend_args a = {q + (t * n_heads + h) * hd_k, k + (h / group) * cap * row_bytes_k, k,
                                        slot_pos, n_slots, q_pos[t], window, type_k, type_k, hd_k, 0,
                                        row_bytes_k, row_bytes_k, scale, stats + (t * n_heads + h) * 2};
                    ek_attend_slots(ek_one_lane(), a, 0, n_slots, true);
                }
            for (int kv = 0; kv < n_kv; ++kv)
                for (int s = 0; s < n_slots; ++s) {
                    ek_tally_args a = {q, q_pos, k + kv * cap * row_bytes_k, slot_pos, stats, n_tok, n_heads, group,
                                       kv, window, type_k, hd_k, row_bytes_k, scale};
                    mass[kv * cap + s] += ek_tally_slot(ek_one_lane(), a, s);
                }
        }
        int ek_host_unpack(int type, const unsigned char *row, int s, float *values) {
            ek_sub32 u;
            if (!ek_unpack(type, row, s, &u)) return 0;
            for (int i = 0; i < 32; ++i) values[i] = ek_sub32_value(&u, i);
            return 1;
        }
        float ek_host_dot(int type, const unsigned char *row, int s, const unsigned char *y) {
            ek_sub32 u;
            ek_unpack(type, row, s, &u);
            return ek_sub32_dot_q8_1(&u, (const ek_block_q8_1 *)y);
        }
        float ek_host_half(unsigned short h) { return ek_half_to_float(h); }
        float ek_host_bf16(unsigned short h) { return ek_bf16_to_float(h); }
        }
    """, source_extension=".cpp", include_dirs=[str(NATIVE)], extra_compile_args=["-O1", "-ffp-contract=off"])
    folder = tmp_path_factory.mktemp("native_host")
    built = ffi.compile(tmpdir=str(folder))
    spec = importlib.util.spec_from_file_location("_ek_native_host", built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules.pop("_ek_native_host", None)
    return module


def test_half_and_bfloat16_conversions_are_exact_for_every_pattern(host):
    bits = np.arange(65536, dtype=np.uint16)
    halves = np.array([host.lib.ek_host_half(int(b)) for b in bits], np.float32)
    want = bits.view(np.float16).astype(np.float32)
    same = (halves.view(np.uint32) == want.view(np.uint32)) | (np.isnan(halves) & np.isnan(want))
    assert same.all(), f"first wrong pattern {bits[~same][0]:#06x}"
    for b in (0x3F80, 0xC000, 0x0001, 0x7F80):
        assert np.float32(host.lib.ek_host_bf16(b)).view(np.uint32) == np.uint32(b) << 16


@pytest.mark.parametrize("kind", QUANTIZED)
def test_sub_blocks_unpack_to_gguf_quants_values_bit_for_bit(host, kind):
    rng = np.random.default_rng(7)
    rows = weights(kind, 3, 512, rng)
    want = dequantize(rows, T[kind])
    ffi, lib = host.ffi, host.lib
    got = np.zeros_like(want)
    values = ffi.new("float[32]")
    for r in range(rows.shape[0]):
        row = np.ascontiguousarray(rows[r])
        for s in range(512 // 32):
            assert lib.ek_host_unpack(int(T[kind]), ffi.from_buffer(row), s, values)
            got[r, 32 * s: 32 * s + 32] = ffi.unpack(values, 32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), kind


@pytest.mark.parametrize("kind", QUANTIZED)
def test_the_int8_dot_with_q8_1_activations_matches_float64(host, kind):
    # activations as Q8_1 blocks whose s = d * sum(q) is exact in f16 (d a power of two, |q| < 64),
    # so the one rounding the block format adds is absent and the float64 sum is the reference
    rng = np.random.default_rng(11)
    row = np.ascontiguousarray(weights(kind, 1, 256, rng)[0])
    w = dequantize(row[None], T[kind])[0].astype(np.float64)
    ffi, lib = host.ffi, host.lib
    for s in range(8):
        q = rng.integers(-63, 64, 32).astype(np.int8)
        d = 2.0 ** -7
        block = np.concatenate([np.array([d, d * int(q.astype(np.int64).sum())], np.float16).view(np.uint8),
                                q.view(np.uint8)])
        got = lib.ek_host_dot(int(T[kind]), ffi.from_buffer(row), s, ffi.from_buffer(block))
        terms = w[32 * s: 32 * s + 32] * (d * q.astype(np.float64))
        assert abs(got - terms.sum()) <= 1e-6 * np.abs(terms).sum() + 1e-30, (kind, s, got, terms.sum())


def _row_bytes(t, n: int) -> int:
    block, size = gguf.GGML_QUANT_SIZES[t]
    return n // block * size


def _kv_rows(host, name: str, x: np.ndarray, limit: float = np.inf) -> np.ndarray:
    t = CACHE_TYPES[name]
    out = np.zeros((x.shape[0], _row_bytes(t, x.shape[1])), np.uint8)
    for r in range(x.shape[0]):
        row = np.ascontiguousarray(x[r], dtype=np.float32)
        host.lib.ek_host_kv_row(int(t), host.ffi.from_buffer("float[]", row), row.size, limit,
                                host.ffi.from_buffer(out[r]))
    return out


def test_float_to_half_and_bfloat16_round_to_nearest_even(host):
    rng = np.random.default_rng(3)
    bits = np.concatenate([rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32),
                           np.array([0x477FEFFF, 0x477FF000, 0x38800000, 0x387FFFFF, 0x33000000, 0x33000001,
                                     0x7F800000, 0xFF800000, 0x80000000, 0x00000001], np.uint32)])
    x = bits.view(np.float32)
    x = x[~np.isnan(x)]
    halves = np.array([host.lib.ek_host_to_half(float(v)) for v in x], np.uint16)
    with np.errstate(over="ignore"):  # NumPy warns as it rounds the large ones to inf, which is the test
        assert np.array_equal(halves, x.astype(np.float16).view(np.uint16))
    b16 = np.array([host.lib.ek_host_to_bf16(float(v)) for v in x[:20000]], np.uint16)
    want = ((x[:20000].view(np.uint32).astype(np.uint64) + 0x7FFF + ((x[:20000].view(np.uint32) >> 16) & 1)) >> 16)
    assert np.array_equal(b16, want.astype(np.uint16))


@pytest.mark.parametrize("name", sorted(CACHE_TYPES))
def test_kv_rows_are_written_as_gguf_quants_writes_them_and_read_back_in_place(host, name):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((6, 128)) * rng.uniform(0.1, 30, (6, 1))).astype(np.float32)
    rows = _kv_rows(host, name, x)
    t = CACHE_TYPES[name]
    want = {"f32": lambda: x.view(np.uint8), "f16": lambda: x.astype(np.float16).view(np.uint8),
            "bf16": lambda: quantize(x, T.BF16)}.get(name, lambda: cache_rows(x, t))()
    assert np.array_equal(rows, want.reshape(rows.shape)), name
    values = dequantize(rows, t)
    got = np.array([[host.lib.ek_host_kv_element(int(t), host.ffi.from_buffer(rows[r]), i) for i in range(128)]
                    for r in range(rows.shape[0])], np.float32)
    assert np.array_equal(got.view(np.uint32), values.astype(np.float32).view(np.uint32)), name


def test_kv_rows_saturate_at_the_limit_and_keep_nan(host):
    x = np.array([[1e6, -1e6, np.nan] + [0.5] * 29], np.float32)
    row = _kv_rows(host, "f16", x, limit=65504.0)
    assert row.view(np.float16)[0, :2].tolist() == [65504.0, -65504.0] and np.isnan(row.view(np.float16)[0, 2])


@pytest.mark.parametrize("type_k, type_v", [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "f16"), ("q4_1", "q5_0"),
                                            ("q5_1", "bf16"), ("f32", "q4_0"), ("iq4_nl", "iq4_nl")])
@pytest.mark.parametrize("window", [0, 5])
def test_attention_over_a_ring_matches_float64(host, type_k, type_v, window):
    # a wrapped ring: positions out of storage order, empty slots, a slot beyond the query
    rng = np.random.default_rng(9)
    hd_k, hd_v, cap = 64, 96, 24
    slot_pos = rng.permutation(np.arange(cap, dtype=np.int32) + 3).astype(np.int32)
    slot_pos[[2, 11]] = -1
    qp = int(slot_pos.max()) - 2  # the two newest slots are in the query's future
    q = rng.standard_normal(hd_k).astype(np.float32)
    k_rows = _kv_rows(host, type_k, rng.standard_normal((cap, hd_k)).astype(np.float32))
    v_rows = _kv_rows(host, type_v, rng.standard_normal((cap, hd_v)).astype(np.float32))
    k, v = dequantize(k_rows, CACHE_TYPES[type_k]), dequantize(v_rows, CACHE_TYPES[type_v])
    out = np.zeros(hd_v, np.float32)
    ffi = host.ffi
    host.lib.ek_host_attend(ffi.from_buffer("float[]", q), ffi.from_buffer(k_rows), ffi.from_buffer(v_rows),
                            ffi.from_buffer("int[]", slot_pos), cap, qp, window, int(CACHE_TYPES[type_k]),
                            int(CACHE_TYPES[type_v]), hd_k, hd_v, k_rows.shape[1], v_rows.shape[1], 0.125,
                            ffi.from_buffer("float[]", out))
    want = reference_attention(q, k, v, slot_pos, qp, window, 0.125)
    assert np.allclose(out, want, rtol=1e-5, atol=1e-6), np.abs(out - want).max()


@pytest.mark.parametrize("type_k, type_v", [("f16", "f16"), ("q8_0", "q4_1"), ("q4_0", "q5_0")])
@pytest.mark.parametrize("window", [0, 5])
def test_attention_split_over_slot_ranges_and_merged_matches_float64(host, type_k, type_v, window):
    # ranges of 5 slots over a wrapped ring of 24: some ranges see no visible slot (a window
    # of 5 leaves most of them empty), and the last ranges lie past the slots written
    rng = np.random.default_rng(19)
    hd_k, hd_v, cap, chunk, n_splits = 64, 32, 24, 5, 7
    slot_pos = rng.permutation(np.arange(cap, dtype=np.int32) + 3).astype(np.int32)
    slot_pos[[2, 11]] = -1
    n_slots = 21  # slots 21.. never written
    qp = int(slot_pos[:n_slots].max()) - 1
    q = (3 * rng.standard_normal(hd_k)).astype(np.float32)  # scores far apart: the merge's rescaling matters
    k_rows = _kv_rows(host, type_k, rng.standard_normal((cap, hd_k)).astype(np.float32))
    v_rows = _kv_rows(host, type_v, rng.standard_normal((cap, hd_v)).astype(np.float32))
    k, v = dequantize(k_rows, CACHE_TYPES[type_k]), dequantize(v_rows, CACHE_TYPES[type_v])
    parts = np.full((n_splits, 2 + hd_v), np.nan, np.float32)
    out, whole = np.zeros(hd_v, np.float32), np.zeros(hd_v, np.float32)
    ffi = host.ffi
    args = (ffi.from_buffer("float[]", q), ffi.from_buffer(k_rows), ffi.from_buffer(v_rows),
            ffi.from_buffer("int[]", slot_pos), n_slots, qp, window, int(CACHE_TYPES[type_k]),
            int(CACHE_TYPES[type_v]), hd_k, hd_v, k_rows.shape[1], v_rows.shape[1], 0.125)
    host.lib.ek_host_attend_split(*args, chunk, n_splits, ffi.from_buffer("float[]", parts),
                                  ffi.from_buffer("float[]", out))
    host.lib.ek_host_attend(*args, ffi.from_buffer("float[]", whole))
    visible = (slot_pos[:n_slots] >= 0) & (slot_pos[:n_slots] <= qp) & ((window == 0) |
                                                                      (qp - slot_pos[:n_slots] < window))
    seen = [visible[z * chunk:(z + 1) * chunk].any() for z in range(n_splits)]
    assert not all(seen) and any(seen)
    np.testing.assert_array_equal(parts[:, 1] > 0, seen)  # a range with nothing visible says so (l = 0)
    want = reference_attention(q, k[:n_slots], v[:n_slots], slot_pos[:n_slots], qp, window, 0.125)
    assert np.allclose(out, want, rtol=1e-5, atol=1e-6), np.abs(out - want).max()
    assert np.allclose(out, whole, rtol=1e-5, atol=1e-6)  # as the one-warp pass


def test_attention_reads_the_sink_rows_for_the_first_positions(host):
    # a calibrated K type (iq4_cal) keeps the stored K of positions < n_sinks in f32 rows
    # beside the ring: a slot holding such a position is scored with its sink row
    rng = np.random.default_rng(23)
    hd, cap, n_sinks = 64, 12, 2
    slot_pos = rng.permutation(cap).astype(np.int32)
    q = (2 * rng.standard_normal(hd)).astype(np.float32)
    k_rows = _kv_rows(host, "iq4_nl", rng.standard_normal((cap, hd)).astype(np.float32))
    v = rng.standard_normal((cap, hd)).astype(np.float32)
    sink = rng.standard_normal((n_sinks, hd)).astype(np.float32)  # unlike the rows: which is read shows
    out = np.zeros(hd, np.float32)
    ffi = host.ffi
    host.lib.ek_host_attend_sinks(ffi.from_buffer("float[]", q), ffi.from_buffer(k_rows), ffi.from_buffer(v),
                                  ffi.from_buffer("int[]", slot_pos), cap, cap - 1, int(T.IQ4_NL), hd,
                                  k_rows.shape[1], ffi.from_buffer("float[]", sink), n_sinks,
                                  ffi.from_buffer("float[]", out))
    keys = dequantize(k_rows, T.IQ4_NL).astype(np.float64)
    at = np.flatnonzero(slot_pos < n_sinks)
    keys[at] = sink[slot_pos[at]]
    want = reference_attention(q, keys, v, slot_pos, cap - 1, 0, 0.125)
    assert np.allclose(out, want, rtol=1e-5, atol=1e-6), np.abs(out - want).max()


@pytest.mark.parametrize("type_k", ["f16", "q8_0", "iq4_nl"])
@pytest.mark.parametrize("window", [0, 6])
def test_keep_tallies_are_each_slots_softmax_weight_summed_over_queries_and_heads(host, type_k, window):
    # kv/heavy_hitters.py's tallies: per KV head and slot, the softmax weight it gets from every
    # query that sees it and every query head of its group, added to what the slot had
    rng = np.random.default_rng(21)
    n_tok, n_heads, n_kv, hd, cap, n_slots = 3, 6, 2, 64, 20, 17
    slot_pos = rng.permutation(np.arange(cap, dtype=np.int32) + 2).astype(np.int32)
    slot_pos[[4, 9]] = -1
    q_pos = np.array([slot_pos[:n_slots].max() - 5, slot_pos[:n_slots].max() - 1, slot_pos[:n_slots].max()], np.int32)
    q = (2 * rng.standard_normal((n_tok, n_heads, hd))).astype(np.float32)
    k_rows = _kv_rows(host, type_k, rng.standard_normal((n_kv * cap, hd)).astype(np.float32))
    keys = dequantize(k_rows, CACHE_TYPES[type_k]).reshape(n_kv, cap, hd).astype(np.float64)
    before = rng.uniform(0, 1, (n_kv, cap)).astype(np.float32)
    mass, stats = before.copy(), np.zeros((n_tok, n_heads, 2), np.float32)
    ffi = host.ffi
    host.lib.ek_host_tally(ffi.from_buffer("float[]", q), ffi.from_buffer("int[]", q_pos), ffi.from_buffer(k_rows),
                           ffi.from_buffer("int[]", slot_pos), n_slots, window, int(CACHE_TYPES[type_k]), n_tok,
                           n_heads, n_kv, hd, cap, k_rows.shape[1], 0.125, ffi.from_buffer("float[]", stats),
                           ffi.from_buffer("float[]", mass))
    want = before.astype(np.float64)
    pos = slot_pos[:n_slots]
    for t in range(n_tok):
        visible = (pos >= 0) & (pos <= q_pos[t]) & ((window == 0) | (q_pos[t] - pos < window))
        for h in range(n_heads):
            scores = keys[h // (n_heads // n_kv), :n_slots] @ q[t, h].astype(np.float64) * 0.125
            p = np.where(visible, np.exp(scores - scores[visible].max()), 0)
            want[h // (n_heads // n_kv), :n_slots] += p / p.sum()
    assert np.allclose(mass, want, rtol=1e-5, atol=1e-6), np.abs(mass - want).max()
    assert (mass[:, n_slots:] == before[:, n_slots:]).all()  # slots never written: untouched


@pytest.mark.parametrize("name", ["f32", "f16", "q8_0", "q4_0", "q5_1", "iq4_nl"])
@pytest.mark.parametrize("mode", [0, 2])
def test_a_context_shift_re_rotates_cached_keys_in_their_type(host, name, mode):
    # the row as the CPU cache stores it (a quantized type Hadamard-rotated), shifted by a
    # RoPE angle per pair, against float64: undo H, rotate the pairs, apply H, store
    from edgekv.kernels.rows import rotation_for

    rng = np.random.default_rng(12)
    hd, t = 64, CACHE_TYPES[name]
    h = rotation_for(name not in FLOAT_CACHE_TYPES, hd, largest=True)
    x = rng.standard_normal((1, hd)).astype(np.float32)
    stored = x @ h if h is not None else x
    row = _kv_rows(host, name, stored.astype(np.float32))[0]
    before = dequantize(row[None], t)[0].astype(np.float64)
    ang = rng.uniform(-3, 3, hd // 2)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    ffi = host.ffi
    hm = np.ascontiguousarray(h if h is not None else np.zeros((1, 1)), np.float32)
    host.lib.ek_host_shift_row(ffi.from_buffer(row), int(t), hd, mode, ffi.from_buffer("float[]", cos),
                               ffi.from_buffer("float[]", sin), ffi.from_buffer("float[]", hm),
                               0 if h is None else h.shape[0], np.inf)
    got = dequantize(row[None], t)[0].astype(np.float64)
    v = before @ h if h is not None else before.copy()  # H @ H = I
    a, b = (np.arange(32), np.arange(32) + 32) if mode == 2 else (np.arange(0, 64, 2), np.arange(1, 64, 2))
    v[a], v[b] = v[a] * np.cos(ang) - v[b] * np.sin(ang), v[a] * np.sin(ang) + v[b] * np.cos(ang)
    want = v @ h if h is not None else v
    step = {"f32": 1e-5, "f16": 2e-3}.get(name, None)
    if step is None:  # a quantized row may land one level away: the largest block scale
        # (iq4_nl: the widest gap between its levels is 24 of 127, and its least-squares d
        # may exceed max / 127 a little)
        step = 1.01 * np.abs(want).max() / {"q8_0": 127, "q4_0": 8, "q5_1": 15.5, "iq4_nl": 127 / 24 / 1.1}[name]
        assert np.abs(got - want).max() <= step, (name, mode, np.abs(got - want).max())
    else:
        assert np.allclose(got, want, rtol=step, atol=step), (name, mode)
