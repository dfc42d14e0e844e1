"""Whether a model fits the memory this process may use, decided before any weight is read.

Why: on an 8 GB Jetson (about 6 GiB left to a process) or in a container with a memory
limit, a model that cannot fit gets the process killed by the kernel's OOM killer partway
through loading, losing whatever else the process held. Refusing up front, with what would
fit, costs only the GGUF's header.

What lives here: the estimate of a process's peak resident memory (`process_bytes`: the
weights, the KV cache, the compute buffers and the runtime, the figure `edgekv mem` prints
as its total), the compute-buffer estimate, and `check_fits`, which the loader calls between
reading the header and reading the weights. What does not: the context plan (plan.py), the
memory figures (memory.py), the report's text (lab/mem_report.py).

The smallest process a model can run in is its weights, the runtime, and the KV cache and
buffers of a MIN_CONTEXT-token context with the f16 cache. Below that, loading raises
ModelTooLargeError; above it, the auto context is planned inside what is left (plan.py).
EDGEKV_MEMORY_CHECK=0 turns the refusal into a warning, for a machine whose swap or zram
(JetPack's default) takes what the free memory cannot, at their speed.
"""

from __future__ import annotations

import logging
import os

from ..errors import EdgeKVError
from .memory import FreeMemory, format_bytes

F32 = 4  # bytes of a float32
MIB = 1 << 20
# The interpreter, NumPy, Numba and LLVM, and the compiled kernels loaded from the kernel
# cache, beside a model's own buffers: peak RSS less weights, KV and compute buffers of
# `edgekv run -n 16` on x86-64 Linux, CPython 3.11, numba 0.6x: SmolLM2-135M 181 MiB, the
# Qwen2.5-0.5B twin 219 MiB, the 1.5B twin 207 MiB (2026-12-06).
RUNTIME_BYTES = 200 * MIB
MIN_CONTEXT = 256  # tokens: the smallest auto context (plan.CTX_ALIGN)
CHECK_ENV = "EDGEKV_MEMORY_CHECK"  # "0": load what does not fit, with a warning
log = logging.getLogger("edgekv")


def check_enforced() -> bool:
    """Whether loading refuses a model that cannot fit (EDGEKV_MEMORY_CHECK is not "0")."""
    return os.environ.get(CHECK_ENV, "1").strip() != "0"


class ModelTooLargeError(EdgeKVError):
    """The model cannot run in the memory this process may use; raised before its weights are read."""


def compute_bytes(hp, n_batch: int, capacity: int) -> dict[str, int]:
    """Estimated working buffers of a forward pass (models/base.py Scratch and attention)
    for chunks of n_batch tokens over rings of at most `capacity` slots: scratch rows for a
    chunk, one logits row, prefill attention scores over the context, and the float32
    copies of one layer's K and V that BLAS prefill attends over."""
    q_dim, kv_dim = hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim
    row = 3 * hp.dim + q_dim + kv_dim + hp.n_kv_heads * hp.head_dim_v + hp.n_heads * hp.head_dim_v + 2 * hp.ff
    return {
        "scratch": n_batch * row * F32,
        "logits": hp.n_vocab * F32,
        "attention scores": n_batch * hp.n_heads * capacity * F32,
        "attention K/V f32": hp.n_kv_heads * capacity * (hp.head_dim + hp.head_dim_v) * F32,
    }


def process_bytes(weights: int, kv_bytes: int, compute: dict[str, int]) -> int:
    """The peak resident memory of a process running a model: weights, KV cache, compute
    buffers and the runtime (RUNTIME_BYTES)."""
    return weights + kv_bytes + sum(compute.values()) + RUNTIME_BYTES


def minimum_bytes(hp, weights: int, n_batch: int = 512) -> int:
    """The smallest process the model runs in: MIN_CONTEXT tokens of f16 cache."""
    kv = MIN_CONTEXT * hp.n_layers * hp.n_kv_heads * (hp.head_dim + hp.head_dim_v) * 2
    return process_bytes(weights, kv, compute_bytes(hp, min(n_batch, MIN_CONTEXT), MIN_CONTEXT))


def check_fits(name: str, hp, weights: int, free: FreeMemory | None, in_use: int = 0, enforce: bool = True) -> None:
    """Raise ModelTooLargeError when the model's smallest process (minimum_bytes) exceeds
    the memory free now (memory.free_memory) plus in_use, what this process already holds
    of the runtime (its resident memory); enforce False: log it as a warning instead.
    free None (unknown): nothing is checked."""
    if free is None:
        return
    need = minimum_bytes(hp, weights)
    held = min(in_use, RUNTIME_BYTES)
    room = free.bytes + held  # what the runtime holds already is part of `need`
    if need <= room:
        return
    shortfall = (f"{name} needs at least {format_bytes(need)} of memory ({format_bytes(weights)} of weights, "
                 f"{format_bytes(need - weights - RUNTIME_BYTES)} of KV cache and buffers for a {MIN_CONTEXT}-token "
                 f"context, {format_bytes(RUNTIME_BYTES)} of runtime), but only {format_bytes(room)} is available "
                 f"({free}, and {format_bytes(held)} this process holds already)")
    if not enforce:
        log.warning("%s; loading it anyway (%s=0): swap or zram must take the rest, or the system's OOM killer "
                    "will", shortfall, CHECK_ENV)
        return
    fits = max(0, room - (need - weights))  # the weights that would fit beside the rest
    raise ModelTooLargeError(
        f"{shortfall}; nothing was loaded. A smaller context or a q8_0/iq4_cal cache (-ctk/-ctv) cannot make up "
        f"the difference: use a model with at most {format_bytes(fits)} of weights (a smaller model, or fewer bits "
        f"per weight), or free memory or raise the limit; with swap or zram to take the rest (at their speed), "
        f"{CHECK_ENV}=0 loads it anyway")
