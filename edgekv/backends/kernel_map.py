"""Which kernel serves which operation: every such decision of the CPU backends, in one place.

A forward pass runs a chunk of n tokens (decode: n = 1). Chunks of fewer than
BATCH_MIN_TOKENS tokens take the *exact* path, which reproduces llama.cpp's x86 float
arithmetic bit for bit (these small models are sensitive enough that one ulp in an
activation can flip a greedy token, tests/test_reference_models.py); longer chunks take
the *batch* path, which reads each weight once for the whole chunk and differs from
llama.cpp in the last bits (perplexity within 1%, tests/test_perplexity.py).

Weights (`cpu` = the int8 dot-product kernels where the CPU has them: AVX512-VNNI on x86
with avx512vnni + avx512f + f16c, else AVX2's vpmaddubsw pair with avx2 + fma + f16c, sdot on Arm with asimddp (ARMv8.2 dot product, e.g.
Jetson Orin); else the portable kernels. `cpu-portable` = always the portable kernels):

| weight type               | n < 64 (decode, short chunks)              | n >= 64, cpu with int8 dot         | n >= 64, portable                 |
|---------------------------|--------------------------------------------|------------------------------------|-----------------------------------|
| Q8_0 Q4_0 Q4_1 Q5_0 Q5_1  | int8 dot: dot_ir.py matvec; else dot_q.py  | dot_ir.py IR GEMM, q8 acts         | unpack.py tiles + BLAS, f32 acts  |
| Q4_K Q5_K Q6_K            | int8 dot: gemm_k_ir.py whole-tile kernels  | gemm_k_ir.py, the same kernels:    | unpack.py tiles + BLAS            |
|                           | (q8_K acts, llama.cpp's 3 orders); else    | llama.cpp's batch orders, exact    |                                   |
|                           | dot_k.py (the same orders)                 |                                    |                                   |
| Q3_K IQ4_XS Q2_K          | int8 dot: gemm_low_ir.py whole-tile        | gemm_low_ir.py, the same kernels:  | unpack.py tiles + BLAS            |
|                           | kernels (q8_K acts, vec_dot / tiled; Q2_K: | llama.cpp's batch orders, exact    |                                   |
|                           | its repacked gemv / gemm); else dot_k_low, |                                    |                                   |
|                           | dot_iq.py (the same orders)                |                                    |                                   |
| IQ4_NL                    | int8 dot: dot_ir.py GEMM tiles (q8_0 acts, | dot_ir.py, the same tiles, exact   | unpack.py tiles + BLAS            |
|                           | llama.cpp's repacked order); else dot_iq.py|                                    |                                   |
| Q2_K IQ4_NL in file layout| dot_k_low.py, dot_iq.py (llama.cpp's       | unpack.py tiles + BLAS             | unpack.py tiles + BLAS            |
| (rows % 8, tied output)   | vec_dot, tiled, tinyBLAS orders)           |                                    |                                   |
| F32 F16 BF16              | matvec_drivers.py dot_float (x rounded);   | unpack.py tiles + BLAS             | unpack.py tiles + BLAS            |
|                           | 2+ tokens: float_ir.py (the same bits)     |                                    |                                   |

A short chunk, or several sessions' decode steps run together (kv/batch.py), takes the n < 64
column token by token with each token's bits, but the int8-dot kernels read each weight
from memory once for all the tokens (int8dot.matvec_chunks_rows; the K-quants' gemv tiles
likewise), and on AVX512-VNNI and AVX2 build a block's codes once for 4 tokens; float
weights likewise, up to 6 tokens per load (float_ir.py; F32 weights larger than the L3, 2
threads on Zen 3: 2 / 4 / 6 tokens cost 1.4-1.5x / 1.5-1.7x / 2.0-2.3x one token's time,
against 1.4x / 2.0x / 2.8x token by token).

Bit-exact with llama.cpp's x86 build: the whole n < 64 column except the float weights,
and the K-quants' batch column (so Gemma 3's Q4_K/Q6_K prefill rounds as llama.cpp's does),
on both backends and on every CPU (the VNNI, sdot and portable kernels give the same bits:
tests/test_fast_kernels.py, and tests/aarch64 under emulation). Float weights (F32, F16,
BF16): dot_float sums a row in order, where llama.cpp's llamafile sgemm / ggml_vec_dot sum
16-lane vectors, so they agree within float32 rounding only (a tiny qwen2 with tied F32
embeddings, logits up to 98: log-probs 2.2e-3 from llama.cpp's; with Q8_0 weights 1e-5). On Arm edgekv keeps llama.cpp's x86 (AVX-512) float
order, not its NEON build's (which sums 4-lane vectors in another order, and whose
expf/softmax differ): one set of bits on every CPU, so a result checked on a desktop holds
on a Jetson, and the reference ids in tests/reference (made on x86) test Arm too. The batch
columns are not (q8 vs float32 activations, BLAS summation order).

Attention (either backend; the IR kernels are plain LLVM vector code, any CPU):

| cache K / V        | n < 64                                           | n >= 64                                        |
|--------------------|--------------------------------------------------|------------------------------------------------|
| f16 / f16          | attention.py attention_f16 (exact); one query over >= 512 slots: attention_decode.py attention_f16_deep (same bits, slot-blocked); several sessions' decode steps (the server's batch): attention_sessions.py, one call (same bits) | attention_chunk_blas on the f16 rows (f16 roundings, BLAS order) |
| any other pair     | attention_q.py attention_rows (Q8_0/Q4_0 rows read in place) | rows dequantized + attention_chunk_blas |

Element-wise kernels (ops.py: RMS norm, RoPE, SiLU/GELU, residual adds) are the same on
every CPU backend and bit-exact.

Planned: a `cuda` backend (its own table: NVRTC-compiled kernels,
not bit-exact with the CPU). A CPU or backend lacking a kernel falls back to the portable
one for that weight type, and `edgekv info -m MODEL` shows which one serves each type.

What does not live here: the kernels (kernels/), the interface (backends/base.py), the
backend objects (backends/cpu.py).
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as T

from ..kernels.int8dot import HAS_INT8DOT, ISA, K_TYPES, TYPES as INT8DOT_TYPES

BATCH_MIN_TOKENS = 64  # chunks at least this long take the batch path


def batched(n_tokens: int) -> bool:
    """Whether a chunk of n_tokens takes the batch path (else the exact one)."""
    return n_tokens >= BATCH_MIN_TOKENS


def int8dot_available() -> bool:
    """Whether this CPU runs the int8 dot-product kernels (AVX512-VNNI, AVX2 or sdot)."""
    return HAS_INT8DOT


def int8dot_name() -> str:
    """This CPU's int8 dot-product instruction set ("avx512-vnni", "avx2", "sdot"), or "none"."""
    return ISA.name if ISA is not None else "none"


def takes_int8dot(ggml_type: int, int8dot: bool) -> bool:
    """Whether a weight of ggml_type runs on the int8 dot kernels on a backend that uses them (int8dot)."""
    return int8dot and HAS_INT8DOT and ggml_type in INT8DOT_TYPES


def weight_kernels(ggml_type: int, int8dot: bool) -> tuple[str, str]:
    """(exact path, batch path) kernel names for a weight of ggml_type, as in the table."""
    # llama.cpp keeps a Q2_K / IQ4_NL weight whose rows are not a multiple of 8 (or a tied
    # output) in file layout, with its own orders: those stay on the portable kernels
    unrepacked = {T.Q2_K: "; file layout: dot_k_low lanes", T.IQ4_NL: "; file layout: dot_iq lanes"}.get(ggml_type, "")
    if takes_int8dot(ggml_type, int8dot):
        if ggml_type == T.IQ4_NL:  # its repacked order, the same for any number of tokens
            return f"{ISA.name} IQ4_NL tiles (exact{unrepacked})", f"{ISA.name} IQ4_NL tiles, q8 activations (exact)"
        return f"{ISA.name} matvec (exact)", f"{ISA.name} GEMM, q8 activations"
    if ggml_type in K_TYPES and int8dot and HAS_INT8DOT:
        return f"{ISA.name} K-quant tiles (exact{unrepacked})", f"{ISA.name} K-quant tiles, q8_K activations (exact)"
    if ggml_type in (T.IQ4_NL, T.IQ4_XS):
        exact = "dot_iq lanes (exact)"
    elif ggml_type in INT8DOT_TYPES:
        exact = "dot_q lanes (exact)"
    elif ggml_type in (T.Q4_K, T.Q5_K, T.Q6_K):
        exact = "dot_k lanes (exact)"
    elif ggml_type in (T.Q2_K, T.Q3_K):
        exact = "dot_k_low lanes (exact)"
    else:
        exact = "dot_float; 2+ tokens float_ir (exact)"
    return exact, "dequantized tiles + BLAS"


def attention_kernels(type_k: str, type_v: str) -> tuple[str, str]:
    """(exact path, batch path) attention kernels for a cache of these types."""
    if type_k == type_v == "f16":
        return "attention_f16 / attention_f16_deep (exact)", "BLAS over f16 rows"
    return "attention_rows", "BLAS over dequantized rows"
