"""Whole models on the CUDA backend over the emulated driver (tests/cuda_emulator.py), for the
tests of its forward pass (test_cuda_backend.py) and of its memory (test_cuda_memory.py).

    cuda_model(path, integrated)  a model loaded on CUDABackend(emulated_device(integrated))
    emulated_device(integrated)   the emulated driver's device: kernels as NumPy twins, or with
                                  KERNELS['real'] (set by the fixture `kernels`) native/'s own code on the CPU
    WIDE                          tiny-model sizes where K-quants stay K-quants and heads rotate
    relative_error(got, want)     max |got - want| / max |want|
    rng                           the generator both modules draw their tokens from, in turn
"""

from __future__ import annotations

import numpy as np

from cuda_emulator import EmulatedDevice
from edgekv.backends.cuda import CUDABackend
from edgekv.loader import load

rng = np.random.default_rng(12)
KERNELS = {"real": False}  # set by the tests' `kernels` fixture
WIDE = dict(dim=256, ff=512, n_heads=4, n_kv_heads=2, head_dim=64)  # K-quants stay K-quants; 64-wide heads rotate


def emulated_device(integrated: bool = True, **attributes):
    """attributes: the emulated driver's (host_register, read_only_register)."""
    if KERNELS["real"]:
        from cuda_cpu import CpuCudaDevice

        return CpuCudaDevice(integrated, **attributes)
    return EmulatedDevice(integrated, **attributes)


def cuda_model(path, integrated: bool = True, **attributes):
    return load(path, backend=CUDABackend(emulated_device(integrated, **attributes)))


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())
