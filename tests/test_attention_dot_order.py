"""The Q.K dot of a lone decode step in ggml_vec_dot_f16's order, for every head size.

llama.cpp (AVX-512) sums the first hd - hd % 64 elements in four 16-lane FMA registers,
reduces them to one float32, then adds each leftover element's product in float64. A head
of 96 (Phi-3) is 64 + 32, a head of 32 is leftovers only. The transcription below is
written from ggml-cpu/vec.cpp, in NumPy float32/float64 arithmetic (an FMA of two f16
values is their product, exact in float32, added once). The Phi-3.5-mini twin against
llama.cpp itself (test_twins_llama_cpp.py) is the end-to-end proof: before this order its
log-probs differed by 0.1-0.5 from the second decoded token on.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgekv.kernels.attention import dot_f16

F32 = np.float32


def _reduce16(v: np.ndarray) -> np.float32:
    # _mm512_reduce_add_ps: lanes i + i+8, then i + i+4, then (0+2) + (1+3)
    a = (v[8:16] + v[0:8]).astype(F32)
    a = (a[4:8] + a[0:4]).astype(F32)
    return F32(F32(a[0] + a[2]) + F32(a[1] + a[3]))


def ggml_vec_dot_f16(q: np.ndarray, k: np.ndarray) -> np.float32:
    hd = q.shape[0]
    full = hd - hd % 64
    regs = np.zeros((4, 16), F32)
    for c in range(0, full, 64):
        for j in range(4):
            regs[j] = (regs[j] + q[c + 16 * j: c + 16 * j + 16] * k[c + 16 * j: c + 16 * j + 16]).astype(F32)
    folded = ((regs[0] + regs[2]).astype(F32) + (regs[1] + regs[3]).astype(F32)).astype(F32)
    total = np.float64(_reduce16(folded))
    for i in range(full, hd):
        total += np.float64(F32(q[i] * k[i]))
    return F32(total)


def lanes_only(q: np.ndarray, k: np.ndarray) -> np.float32:
    # the order edgekv used before: leftovers in the registers' lanes, not in float64
    regs = np.zeros((4, 16), F32)
    for i in range(q.shape[0]):
        regs[(i % 64) // 16, i % 16] = F32(regs[(i % 64) // 16, i % 16] + F32(q[i] * k[i]))
    return _reduce16(((regs[0] + regs[2]).astype(F32) + (regs[1] + regs[3]).astype(F32)).astype(F32))


@pytest.mark.parametrize("hd", [32, 80, 96, 128, 160])
def test_decode_dot_is_ggml_vec_dot_f16(hd):
    rng = np.random.default_rng(hd)
    acc = np.zeros(64, F32)
    differs_from_lanes = 0
    for _ in range(200):
        q = (4 * rng.standard_normal(hd)).astype(np.float16)
        k = (4 * rng.standard_normal(hd)).astype(np.float16)
        want = ggml_vec_dot_f16(q.astype(F32), k.astype(F32))
        got = dot_f16(q.astype(F32), k.view(np.uint16), acc, False)
        assert got == want, (hd, got, want)
        differs_from_lanes += lanes_only(q.astype(F32), k.astype(F32)) != want
    # the data tells the orders apart wherever there are leftovers (a test that can fail)
    assert (differs_from_lanes > 0) == (hd % 64 != 0)
