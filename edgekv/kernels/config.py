"""JIT settings shared by every Numba kernel, and the thread count.

What lives here: the flag sets kernels are compiled with and `set_num_threads`.
What does not: any kernel.

Three flag sets, chosen per kernel:
- EXACT_FLAGS: no fast-math at all. Quantizers and activation quantization use it:
  ggml's rounding is reproduced bit for bit only if `x * (1/d)` stays a multiply by
  a reciprocal and `a*b + c` is not fused into an FMA.
- JIT_FLAGS: fast-math without `nnan`/`ninf`, so reassociation, FMA contraction and
  reciprocal tricks are allowed (they let LLVM vectorize reductions) while an inf or
  NaN that reaches a kernel still propagates instead of being assumed away.
- PARALLEL_FLAGS: JIT_FLAGS + `parallel=True`, for kernels whose outer loop is a
  `prange` over independent rows or row groups.

Every set caches the machine code on disk (`cache=True`) in the kernel cache folder
(jit_cache.py: ~/.cache/edgekv/kernels, kept across reinstalls of the same version), so
only the first run on a machine, or `edgekv warmup`, pays for compilation. Set
EDGEKV_NUMBA_CACHE=0 to compile in memory only.
"""

from __future__ import annotations

import os

# How idle OpenMP workers wait for the next parallel region. Decode runs hundreds of
# small regions per token (one per weight product, each 10-100 us), so a worker that
# goes to sleep after each one costs a futex wake-up (10-30 us) every time: SmolLM2
# decoded at 12.2 ms/token with sleeping workers and 7.7 with spinning ones. But a
# worker that spins forever fights any other busy process for the cores: on this
# 2-core machine with one busy process a decode step took 100x its time. So by
# default workers spin briefly (GOMP_SPINCOUNT, about the gap between two products of
# one token), then sleep; with one busy process beside it, decode then takes ~3.5x
# its idle time, against 1x for always-sleeping workers. Set OMP_WAIT_POLICY=PASSIVE
# on a machine that runs other work (workers sleep at once, and small products stay
# on the calling thread: PARALLEL_MIN_WEIGHTS), or ACTIVE on one that runs nothing
# else. Read once, when Numba first loads its OpenMP layer.
WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY", "").upper()
if not WAIT_POLICY:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")

# On an AArch64 CPU whose features LLVM cannot read (QEMU's user-mode emulation), tell
# Numba what the kernel says the CPU has, before Numba is first imported (cpu_features.py).
from .cpu_features import numba_cpu_features  # noqa: E402

_FEATURES = numba_cpu_features()
if _FEATURES and "NUMBA_CPU_FEATURES" not in os.environ:
    os.environ["NUMBA_CPU_FEATURES"] = _FEATURES

import numba  # noqa: E402  (after the environment defaults above)

if _FEATURES:  # Numba may have been imported already: it reads NUMBA_* again only when asked
    numba.core.config.reload_config()

from .jit_cache import install_locator  # noqa: E402

CACHE = os.environ.get("EDGEKV_NUMBA_CACHE", "1") != "0"
if CACHE:
    install_locator()

# fast-math minus the two flags that would let LLVM assume inputs are finite
SAFE_FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}

EXACT_FLAGS: dict = dict(cache=CACHE, nogil=True, fastmath=False)
JIT_FLAGS: dict = dict(cache=CACHE, nogil=True, fastmath=SAFE_FASTMATH)
PARALLEL_FLAGS: dict = dict(JIT_FLAGS, parallel=True)

# A matvec with fewer weights than this runs on the calling thread only. With workers
# that sleep at once (OMP_WAIT_POLICY=PASSIVE) waking them costs 10-30 us, more than
# such a product takes on one core (1M Q4_1 weights: ~25 us); spinning workers answer
# in ~1 us, so every product is split. EDGEKV_PARALLEL_MIN_WEIGHTS overrides.
PARALLEL_MIN_WEIGHTS = int(os.environ.get("EDGEKV_PARALLEL_MIN_WEIGHTS", 1 << 20 if WAIT_POLICY == "PASSIVE" else 0))

# Rows of a weight that the matvec kernels process side by side (see matvec.py).
# 64 int32 lanes = 4 AVX-512 or 8 AVX2/NEON registers: the vectorizer's main loop.
LANES = 64


def max_threads() -> int:
    """The most threads the parallel kernels can use (NUMBA_NUM_THREADS, default: all cores)."""
    return int(numba.config.NUMBA_NUM_THREADS)


def set_num_threads(n: int | None) -> int:
    """Use n threads in every parallel kernel (None or <= 0: all); returns the count in use.

    Clamped to [1, max_threads()]. Numba's setting is per calling thread, so call it
    from the thread that runs the model. NumPy's BLAS (prefill matmul) keeps its own
    pool; limit it with OPENBLAS_NUM_THREADS before NumPy is imported.
    """
    limit = max_threads()
    n = limit if n is None or n <= 0 else min(int(n), limit)
    numba.set_num_threads(n)
    return n


def get_num_threads() -> int:
    return int(numba.get_num_threads())
