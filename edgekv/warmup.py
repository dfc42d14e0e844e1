"""`edgekv warmup`: compile every kernel a backend will use on this CPU, once per install.

Numba compiles a kernel on its first call (for SmolLM2 about half a minute, for gemma3
a minute) and keeps the machine code in the kernel cache (kernels/jit_cache.py). This
runs every path a model can take, so the first real answer loads them instead: both
architectures, every weight type, an f16 and a quantized cache, decode, short chunks
(llama.cpp's 4-token and tiled orders), long chunks (the batch path), a context
shift and the server's batched decode step, on tiny random models (testing/tiny_model.py). On two or more cores the exact path and
the batch path compile side by side in two processes. A marker in the kernel
cache records that this version's kernels are warm for this CPU and backend.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable

from .errors import EdgeKVError
from .kernels.jit_cache import kernel_cache_dir

log = logging.getLogger("edgekv")

ARCHES = ("llama", "gemma3")
# every matrix a whole number of 256-value blocks, so a K-quant request is a K-quant
DIMS = dict(dim=256, n_heads=4, n_kv_heads=2, head_dim=64, ff=512, n_ctx=1024)
CACHES = (("f16", "f16"), ("q8_0", "q4_0"))
# The two paths share few kernels, so they are the two shares of the work: the exact path
# (5 and 9 tokens: llama.cpp's gemm and tiled orders; then single tokens until the shift
# policy frees slots) and the batch path (long chunks, then a shift).
CHUNKS = {"exact": (5, 9) + (1,) * 20, "batch": (70, 70)}
N_CTX = {"exact": 24, "batch": 96}
# One query over a deep f16 cache has its own kernel (attention_decode.py): the exact share
# also fills one cache past DEPTH_MIN_SLOTS in exact-path chunks and decodes there.
DEEP_FILL, DEEP_CHUNK = 520, 8


def work_items(path: str) -> list[tuple[str, str, str]]:
    from .testing.tiny_model import WEIGHT_TYPES

    # the families on llama's graph add one kernel (qwen2's biases): one model compiles it
    extra = [("qwen2", "Q8_0", "exact"), ("llama", "Q8_0", "deep")] if path == "exact" else []
    return [(arch, wtype, path) for wtype in WEIGHT_TYPES for arch in ARCHES] + extra


def run_item(arch: str, weight_type: str, path: str, backend: str, folder: str) -> float:
    """Run one tiny model through the exact or batch path with both caches; seconds taken."""
    import numpy as np

    from .loader import load
    from .testing.tiny_model import make_tiny_model

    t0 = time.perf_counter()
    file = Path(folder) / f"{arch}-{weight_type}-{path}.gguf"
    model = load(make_tiny_model(file, arch=arch, weight_type=weight_type, **DIMS), backend)
    rng = np.random.default_rng(0)
    if path == "deep":
        s = model.session(n_ctx=DEEP_FILL + 8, n_batch=DEEP_CHUNK)
        for _ in range(DEEP_FILL // DEEP_CHUNK):
            s.eval(rng.integers(0, model.hp.n_vocab, DEEP_CHUNK))
        s.eval(rng.integers(0, model.hp.n_vocab, 1))
        return time.perf_counter() - t0
    for cache_k, cache_v in CACHES:
        s = model.session(n_ctx=N_CTX[path], n_batch=max(CHUNKS[path]), cache_type_k=cache_k, cache_type_v=cache_v,
                          context_shift="shift")
        for n in CHUNKS[path]:
            s.eval(rng.integers(0, model.hp.n_vocab, n), all_logits=n > 1)
        assert s.n_discarded, "the warm-up was meant to shift the context"
    if path == "exact":
        _decode_together(model, rng)
    return time.perf_counter() - t0


def _decode_together(model, rng) -> None:
    # the server's batched decode step (kv/batch.py): two sessions' tokens in one pass
    import numpy as np

    from .kv.batch import DecodeStep, decode_together

    net, n_vocab = model.network, model.hp.n_vocab
    sessions = [model.session(n_ctx=N_CTX["exact"]) for _ in range(2)]
    for s in sessions:
        s.eval(rng.integers(0, n_vocab, 3))
    rows = np.zeros((2, n_vocab), np.float32)
    steps = [DecodeStep(1, s.cache, s.cache.reserve(1), rows[i : i + 1]) for i, s in enumerate(sessions)]
    decode_together(net, steps, net.backend.scratch(net.hp, 2), np.zeros_like(rows))


def _run_share(items: list[tuple[str, str, str]], backend: str, folder: str) -> float:
    quiet, level = logging.getLogger("edgekv"), logging.getLogger("edgekv").level
    quiet.setLevel(logging.ERROR)  # no "compiling kernels" notice per tiny model
    try:
        return sum(run_item(arch, wtype, path, backend, folder) for arch, wtype, path in items)
    finally:
        quiet.setLevel(level)


def _check_writable(folder: Path) -> None:
    """EdgeKVError unless compiled kernels can be saved in folder (else the work is lost)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as exc:
        raise EdgeKVError(f"cannot write the kernel cache {folder} ({exc.strerror or exc}); set "
                          f"EDGEKV_KERNEL_CACHE to a writable folder") from None


def warmup(backend: str | None = None, jobs: int | None = None, force: bool = False,
           on_start: Callable[[str, Path], None] | None = None) -> tuple[bool, float]:
    """Compile the kernels of `backend` (None: EDGEKV_BACKEND / auto) for this CPU with
    `jobs` processes (CUDA: its kernels for the GPU, then the cpu backend's, which its host
    work and a fallback run) (None: one per core, at most 2 are useful). Returns (whether anything
    was run, seconds); a warm cache and not force: nothing is run. on_start(backend name,
    kernel cache folder) is called when compiling begins."""
    from .backends import get_backend, resolve_backend_name
    from .kernels.jit_cache import kernels_cached, mark_warm

    name = resolve_backend_name(backend)
    if name == "cuda":  # its kernels are built (NVRTC, cached) when it is made; its host work runs the cpu kernels
        if on_start is not None:
            on_start("cuda", kernel_cache_dir() / "cuda")
        get_backend(backend)
        name = "cpu"
    if kernels_cached(name) and not force:
        return False, 0.0
    _check_writable(kernel_cache_dir())
    if on_start is not None:
        on_start(name, kernel_cache_dir())
    t0 = time.perf_counter()
    shares = [work_items("exact"), work_items("batch")]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(shares)))
    with tempfile.TemporaryDirectory(prefix="edgekv-warmup-") as folder:
        if jobs == 1:
            _run_share(shares[0] + shares[1], name, folder)
        else:
            with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
                for done in [pool.submit(_run_share, share, name, folder) for share in shares]:
                    done.result()
    mark_warm(name)
    return True, time.perf_counter() - t0
