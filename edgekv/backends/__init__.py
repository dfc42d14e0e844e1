"""Where the arithmetic runs: choosing a backend.

Backends: `cpu` (Numba; the int8 dot-product LLVM-IR kernels where the CPU has them,
AVX512-VNNI or else AVX2 on x86, sdot on Arm, the portable kernels elsewhere) and `cpu-portable`
(always the portable kernels: a way to check them on any machine), and `cuda` (backends/cuda.py:
native/ kernels compiled by NVRTC, launched through the driver API; asking for it where it cannot
run says what this machine lacks).
Chosen by `backend=` (Llama, edgekv.load), `--backend` on the CLI, or EDGEKV_BACKEND;
`auto` (the default) takes the best that runs here. A backend that was asked for and
cannot run is an error naming the ones that can, never a silent fallback.

The interface is backends/base.py, the kernel choices backends/kernel_map.py.
"""

from __future__ import annotations

import os
import sys

from ..errors import EdgeKVError
from .base import Backend, LayerView

# in auto's order of preference: the CUDA backend is chosen when asked for (backend="cuda",
# n_gpu_layers) but not yet by auto, until tools/gpu_check.sh has passed on a GPU (native/README.md)
BACKENDS = ("cpu", "cpu-portable", "cuda")
_made: dict[str, Backend] = {}


def why_unavailable(name: str) -> str | None:
    """None if backend `name` runs on this machine, else why not."""
    if name in ("cpu", "cpu-portable"):  # Numba runs wherever edgekv installs
        return None
    if name == "cuda":
        return _why_not_cuda()
    return "no such backend"


def _why_not_cuda() -> str | None:
    from ..cuda import probe  # the driver and NVRTC are only looked for when CUDA is asked for

    return probe().problem


def offload_choice(backend: str | Backend | None, n_gpu_layers: int | None) -> str | Backend | None:
    """llama-cpp-python's n_gpu_layers: nonzero (-1: all) asks for the GPU when the backend
    is left to auto. Returns the backend to load with: "cuda" where it runs, else `backend`
    unchanged, after one line on stderr saying why the GPU is not used (llama-cpp-python
    falls back to the CPU silently, which its users cannot tell from a slow GPU)."""
    global _offload_said
    env = os.environ.get("EDGEKV_BACKEND", "").strip().lower()
    if not n_gpu_layers or not (backend is None or backend == "auto") or env not in ("", "auto"):
        return backend
    reason = why_unavailable("cuda")
    if reason is None:
        return "cuda"
    if not _offload_said:
        print(f"edgekv: n_gpu_layers={n_gpu_layers} asks for the GPU, but CUDA cannot be used here: {reason}; "
              "running on the CPU", file=sys.stderr)
        _offload_said = True
    return backend


_offload_said = False  # the fallback line is printed once per process


def available_backends() -> list[str]:
    return [name for name in BACKENDS if why_unavailable(name) is None]


def resolve_backend_name(name: str | None = None) -> str:
    """The backend `name` (None: EDGEKV_BACKEND, default auto) stands for; EdgeKVError if
    it is unknown or cannot run here."""
    asked = name if name is not None else os.environ.get("EDGEKV_BACKEND", "") or "auto"
    asked = asked.strip().lower()
    if asked == "auto":
        return next(name for name in BACKENDS if why_unavailable(name) is None)  # cpu: never probes CUDA
    reason = why_unavailable(asked)
    if reason is not None:
        source = "" if name is not None else " (from EDGEKV_BACKEND)"
        raise EdgeKVError(f"backend {asked!r}{source} cannot run here: {reason}; "
                          f"available: auto, {', '.join(available_backends())}")
    return asked


def get_backend(name: str | Backend | None = None) -> Backend:
    """The backend object for `name` (see resolve_backend_name), made once per process."""
    if isinstance(name, Backend):
        return name
    resolved = resolve_backend_name(name)
    if resolved not in _made:
        if resolved == "cuda":
            from .cuda import CUDABackend

            _made[resolved] = CUDABackend()
        else:
            from .cpu import CPUBackend

            _made[resolved] = CPUBackend(resolved, use_int8dot=resolved == "cpu")
    return _made[resolved]


__all__ = ["BACKENDS", "Backend", "LayerView", "available_backends", "get_backend", "offload_choice",
           "resolve_backend_name"]
