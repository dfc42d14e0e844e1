"""Where the arithmetic runs: choosing a backend.

Backends: `cpu` (Numba; the int8 dot-product LLVM-IR kernels where the CPU has them,
AVX512-VNNI or else AVX2 on x86, sdot on Arm, the portable kernels elsewhere) and `cpu-portable`
(always the portable kernels: a way to check them on any machine), and `cuda` (backends/cuda.py:
native/ kernels compiled by NVRTC, launched through the driver API; asking for it where it cannot
run says what this machine lacks).
Chosen by `backend=` (Llama, edgekv.load), `--backend` on the CLI, or EDGEKV_BACKEND;
`auto` (the default) takes CUDA where a GPU is usable, else `cpu`; where this machine has
an NVIDIA GPU that cannot be used (no NVRTC, an architecture it lacks), auto says so in one
line on stderr before running on the CPU. A backend that was asked for and cannot run is
an error naming the ones that can, never a silent fallback.

The interface is backends/base.py, the kernel choices backends/kernel_map.py.
"""

from __future__ import annotations

import ctypes
import os
import sys

from ..errors import EdgeKVError
from .base import Backend, DeviceMemory
from .contract import LayerView, RowCodec, Scratch, SessionRings

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

    return _cuda_failed or probe().problem


def offload_choice(backend: str | Backend | None, n_gpu_layers: int | None) -> str | Backend | None:
    """llama-cpp-python's n_gpu_layers, where the backend is left to auto (`backend` None or
    "auto", EDGEKV_BACKEND unset): None leaves it to auto; 0 (no layer on the GPU) is "cpu";
    nonzero (-1: all) asks for the GPU: auto where CUDA runs (auto takes it, and falls back
    saying why if the device then fails), else `backend` unchanged after one line on stderr
    saying why the GPU is not used (llama-cpp-python falls back to the
    CPU silently, which its users cannot tell from a slow GPU)."""
    global _offload_said
    env = os.environ.get("EDGEKV_BACKEND", "").strip().lower()
    if n_gpu_layers is None or not (backend is None or backend == "auto") or env not in ("", "auto"):
        return backend
    if n_gpu_layers == 0:
        return "cpu"
    reason = why_unavailable("cuda")
    if reason is None:
        return "auto"
    if not _offload_said:
        print(f"edgekv: n_gpu_layers={n_gpu_layers} asks for the GPU, but CUDA cannot be used here: {reason}; "
              "running on the CPU", file=sys.stderr)
        _offload_said = True
    return backend


def say_whole_offload(model, n_gpu_layers: int | None) -> None:
    """One line on stderr where n_gpu_layers asked for part of the model on the GPU (0 <
    n_gpu_layers < its layers) and the model went to the GPU: edgekv offloads whole models
    (llama-cpp-python would have put only those layers there)."""
    n_layers = model.hp.n_layers
    if model.backend.name == "cuda" and n_gpu_layers is not None and 0 < n_gpu_layers < n_layers:
        print(f"edgekv: n_gpu_layers={n_gpu_layers}: edgekv offloads whole models, so all {n_layers} layers run "
              "on the GPU (n_gpu_layers=0 keeps them all on the CPU)", file=sys.stderr)


_offload_said = False  # the fallback line is printed once per process
_auto_said = False
_cuda_failed: str | None = None  # why making the CUDA backend failed in this process (auto then runs on the CPU)


def _auto() -> str:
    """auto: "cuda" where it runs, else "cpu", saying why once per process when the machine
    has an NVIDIA device that cannot be used (a machine with no driver or no device is a CPU
    machine: nothing to say)."""
    from ..cuda import probe
    from ..cuda.driver import LIBCUDA

    try:  # no driver library: a CPU machine (a plain dlopen: quicker to fail than cffi's search)
        ctypes.CDLL(os.environ.get("EDGEKV_LIBCUDA") or LIBCUDA)
    except OSError:
        return "cpu"
    status = probe()
    if status.problem is None:
        return "cuda"
    if status.devices:
        _say_auto_fallback(f"found {status.devices[0].name} but CUDA cannot be used: {status.problem}")
    return "cpu"


def _say_auto_fallback(why: str) -> None:
    global _auto_said
    if not _auto_said:
        print(f"edgekv: {why}; running on the CPU", file=sys.stderr)
        _auto_said = True


def available_backends() -> list[str]:
    return [name for name in BACKENDS if why_unavailable(name) is None]


def resolve_backend_name(name: str | None = None) -> str:
    """The backend `name` (None: EDGEKV_BACKEND, default auto) stands for; EdgeKVError if
    it is unknown or cannot run here."""
    asked = name if name is not None else os.environ.get("EDGEKV_BACKEND", "") or "auto"
    asked = asked.strip().lower()
    if asked == "auto":
        return "cpu" if _cuda_failed is not None else _auto()
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
        try:
            _made[resolved] = _make(resolved)
        except EdgeKVError as exc:  # the device or the kernel build failed after the probe passed
            if resolved != "cuda":
                raise
            return cpu_instead(name, exc)
    return _made[resolved]


def cpu_instead(name: str | Backend | None, exc: EdgeKVError) -> Backend:
    """After CUDA failed with exc (it could not be made, a model does not fit the GPU): the
    CPU backend where `name` left the choice to auto, saying why in one line (auto then takes
    the CPU for the rest of the process); else exc, raised: CUDA was asked for by name."""
    global _cuda_failed
    asked = "" if isinstance(name, Backend) else name if name is not None else \
        os.environ.get("EDGEKV_BACKEND", "") or "auto"
    if asked.strip().lower() != "auto":
        raise exc
    _cuda_failed = str(exc)
    _say_auto_fallback(f"CUDA cannot be used: {exc}")
    return get_backend("cpu")


def _make(name: str) -> Backend:
    if name == "cuda":
        from .cuda import CUDABackend

        return CUDABackend()
    from .cpu import CPUBackend

    return CPUBackend(name, use_int8dot=name == "cpu")


__all__ = ["BACKENDS", "Backend", "DeviceMemory", "LayerView", "RowCodec", "Scratch", "SessionRings",
           "available_backends", "cpu_instead", "get_backend", "offload_choice", "resolve_backend_name",
           "say_whole_offload"]
