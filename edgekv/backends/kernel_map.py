"""Which kernel serves which operation: every such decision of the CPU backends, in one place.

A forward pass runs a chunk of n tokens (decode: n = 1). Chunks of fewer than
BATCH_MIN_TOKENS tokens take the *exact* path, which reproduces llama.cpp's x86 float
arithmetic bit for bit (these small models are sensitive enough that one ulp in an
activation can flip a greedy token, tests/test_reference_models.py); longer chunks take
the *batch* path, which reads each weight once for the whole chunk and differs from
llama.cpp in the last bits (perplexity within 1%, tests/test_perplexity.py).

Weights (`cpu` = AVX512-VNNI where the CPU has avx512vnni + avx512f + f16c, else the
portable kernels; `cpu-portable` = always the portable kernels, what an aarch64 CPU runs):

| weight type               | n < 64 (decode, short chunks)              | n >= 64, cpu with VNNI             | n >= 64, portable                 |
|---------------------------|--------------------------------------------|------------------------------------|-----------------------------------|
| Q8_0 Q4_0 Q4_1 Q5_0 Q5_1  | VNNI: vnni.py IR matvec; portable: dot_q.py | gemm_vnni.py IR GEMM, q8 acts      | unpack.py tiles + BLAS, f32 acts  |
| Q4_K Q5_K                 | dot_k.py (q8_K acts, llama.cpp's 3 orders)  | unpack.py tiles + BLAS             | unpack.py tiles + BLAS            |
| Q6_K                      | dot_k.py dot_q6_k (q8_K acts)               | unpack.py tiles + BLAS             | unpack.py tiles + BLAS            |
| F32 F16 BF16              | matvec.py dot_float (x rounded like ggml)   | unpack.py tiles + BLAS             | unpack.py tiles + BLAS            |

Bit-exact with llama.cpp's x86 build: the whole n < 64 column, on both backends (the
VNNI and portable kernels give the same bits; tests/test_fast_kernels.py). The batch
columns are not (q8 vs float32 activations, BLAS summation order).

Attention (either backend; the IR kernels are plain LLVM vector code, any CPU):

| cache K / V        | n < 64                                           | n >= 64                                        |
|--------------------|--------------------------------------------------|------------------------------------------------|
| f16 / f16          | attention.py attention_f16 (exact)               | attention_chunk_blas on the f16 rows (f16 roundings, BLAS order) |
| any other pair     | attention_q.py attention_rows (Q8_0/Q4_0 rows read in place) | rows dequantized + attention_chunk_blas |

Element-wise kernels (ops.py: RMS norm, RoPE, SiLU/GELU, residual adds) are the same on
every CPU backend and bit-exact.

Planned columns: aarch64 `sdot` kernels for the 32-value block types (the same bits as
portable on the exact path), and a `cuda` backend (its own table: NVRTC-compiled kernels,
not bit-exact with the CPU). A CPU or backend lacking a kernel falls back to the portable
one for that weight type, and `edgekv info -m MODEL` shows which one serves each type.

What does not live here: the kernels (kernels/), the interface (backends/base.py), the
backend objects (backends/cpu.py).
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as T

from ..kernels.vnni import HAS_VNNI, VNNI_TYPES

BATCH_MIN_TOKENS = 64  # chunks at least this long take the batch path


def batched(n_tokens: int) -> bool:
    """Whether a chunk of n_tokens takes the batch path (else the exact one)."""
    return n_tokens >= BATCH_MIN_TOKENS


def vnni_available() -> bool:
    """Whether this CPU runs the AVX512-VNNI kernels."""
    return HAS_VNNI


def takes_vnni(ggml_type: int, vnni: bool) -> bool:
    """Whether a weight of ggml_type runs on the VNNI kernels on a backend that uses them (vnni)."""
    return vnni and HAS_VNNI and ggml_type in VNNI_TYPES


def weight_kernels(ggml_type: int, vnni: bool) -> tuple[str, str]:
    """(exact path, batch path) kernel names for a weight of ggml_type, as in the table."""
    if takes_vnni(ggml_type, vnni):
        return "vnni matvec (exact)", "vnni GEMM, q8 activations"
    if ggml_type in VNNI_TYPES:
        exact = "dot_q lanes (exact)"
    elif ggml_type in (T.Q4_K, T.Q5_K, T.Q6_K):
        exact = "dot_k lanes (exact)"
    else:
        exact = "dot_float (exact)"
    return exact, "dequantized tiles + BLAS"


def attention_kernels(type_k: str, type_v: str) -> tuple[str, str]:
    """(exact path, batch path) attention kernels for a cache of these types."""
    if type_k == type_v == "f16":
        return "attention_f16 (exact)", "BLAS over f16 rows"
    return "attention_rows", "BLAS over dequantized rows"
