"""The low-bit weight types of 8 GB devices (Q2_K, Q3_K, IQ4_NL, IQ4_XS) beyond what the
per-type suites check (test_quants: dequantization against gguf; test_matvec: products
within the activation-rounding bound; test_families_llama_cpp: llama.cpp's own log-probs on
tiny models of each type): what llama.cpp keeps unrepacked sums in its other order, a
type no kernel reads is refused with the tensor's name and a way out, and `edgekv info`
names the kernels."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from edgekv.backends import kernel_map
from edgekv.errors import UnsupportedModelError
from edgekv.kernels.matvec import QuantMatrix
from edgekv.loader import load
from edgekv.testing import twin_weights
from edgekv.gguf.quants import dequantize
from helpers.quant_rows import random_rows, reference_dequantize

LOW_BIT = (T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS)


def _retype(path, name: str, ggml_type: int) -> None:
    # rewrite the type id of tensor `name` in the GGUF's directory (same sizes: Q3_K and
    # IQ3_S both take 110 bytes per 256 values)
    data = bytearray(path.read_bytes())
    key = name.encode()
    at = data.index(len(key).to_bytes(8, "little") + key) + 8 + len(key)
    n_dims = int.from_bytes(data[at:at + 4], "little")
    at += 4 + 8 * n_dims
    data[at:at + 4] = int(ggml_type).to_bytes(4, "little")
    path.write_bytes(bytes(data))


def test_a_type_no_kernel_reads_is_refused_naming_the_tensor_and_a_way_out(tiny_model):
    path = tiny_model("llama", weight_type="Q3_K", dim=256, ff=512, n_heads=4, head_dim=64)
    _retype(path, "blk.0.ffn_down.weight", T.IQ3_S)
    with pytest.raises(UnsupportedModelError) as err:
        load(path)
    message = str(err.value)
    assert "'blk.0.ffn_down.weight' is IQ3_S" in message and "Q3_K" in message and "IQ4_XS" in message
    assert "edgekv quantize" in message and "Traceback" not in message


@pytest.mark.parametrize("ggml_type", [T.IQ4_NL, T.Q2_K], ids=lambda t: t.name)
def test_file_layout_orders_differ_from_the_repacked_ones_and_stay_close(ggml_type):
    # llama.cpp repacks these types when the rows are a multiple of 8 and sums the rest (and
    # a tied output) in vec_dot's order: other float steps, the same products within rounding
    rng = np.random.default_rng(int(ggml_type))
    n_rows, n_cols = 64, 768
    raw = random_rows(int(ggml_type), n_rows, n_cols, rng)
    repacked, file_order = QuantMatrix(raw, int(ggml_type), n_rows, n_cols), QuantMatrix(raw, int(ggml_type), n_rows,
                                                                                          n_cols)
    file_order.keep_file_order()
    differ = 0
    for _ in range(4):
        x = (rng.standard_normal(n_cols) * 2).astype(np.float32)
        a, b = np.zeros(n_rows, np.float32), np.zeros(n_rows, np.float32)
        repacked.matvec(x, a)
        file_order.matvec(x, b)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(a).max())
        differ += int(np.count_nonzero(a != b))
    assert differ > 0  # the orders really are apart (else this test could not tell them)


@pytest.mark.parametrize("ggml_type", LOW_BIT, ids=lambda t: t.name)
def test_batch_orders_stay_within_rounding_of_the_decode_order(ggml_type):
    # a chunk of 9 tokens: whole groups of 4 (Q2_K's repacked gemm), the tiled matmul from 8
    # (Q2_K in file layout, Q3_K, IQ4_XS), tinyBLAS (IQ4_NL in file layout): each token close
    # to its lone decode step and to the float64 product of the dequantized weight
    rng = np.random.default_rng(10 + int(ggml_type))
    n_rows, n_cols = 40, 512
    raw = random_rows(int(ggml_type), n_rows, n_cols, rng)
    w = reference_dequantize(raw, int(ggml_type)).astype(np.float64)
    m = QuantMatrix(raw, int(ggml_type), n_rows, n_cols)
    x = rng.standard_normal((9, n_cols)).astype(np.float32)
    chunk = np.zeros((9, n_rows), np.float32)
    m.matmul_exact(x, chunk)
    for t in range(9):
        one = np.zeros(n_rows, np.float32)
        m.matvec(x[t], one)
        scale = np.abs(w) @ np.abs(x[t].astype(np.float64))
        assert np.all(np.abs(chunk[t] - one) <= 1e-5 * scale), t
        assert np.all(np.abs(chunk[t] - w @ x[t]) <= 0.02 * scale), t  # 8-bit activations


@pytest.mark.parametrize("ggml_type", LOW_BIT, ids=lambda t: t.name)
def test_twin_weights_of_each_type_are_finite_and_small(ggml_type):
    raw = twin_weights.random_weights(ggml_type, 256 * 64, 2, np.random.default_rng(0))
    values = dequantize(raw, int(ggml_type), (256, 64))
    assert np.isfinite(values).all() and 0.02 < np.abs(values).max() <= 0.2


def test_info_names_the_kernels_of_the_low_bit_types():
    # every low-bit type on the int8 dot tiles where the CPU has them (Q2_K and IQ4_NL when
    # llama.cpp repacks them), else the portable lanes
    isa = kernel_map.int8dot_name()
    for kind, portable, fast in (
            (T.IQ4_XS, "dot_iq lanes (exact)", f"{isa} K-quant tiles (exact)"),
            (T.Q3_K, "dot_k_low lanes (exact)", f"{isa} K-quant tiles (exact)"),
            (T.Q2_K, "dot_k_low lanes (exact)", f"{isa} K-quant tiles (exact; file layout: dot_k_low lanes)"),
            (T.IQ4_NL, "dot_iq lanes (exact)", f"{isa} IQ4_NL tiles (exact; file layout: dot_iq lanes)")):
        assert kernel_map.weight_kernels(int(kind), False)[0] == portable
        assert kernel_map.weight_kernels(int(kind), True)[0] == (fast if kernel_map.HAS_INT8DOT else portable)
