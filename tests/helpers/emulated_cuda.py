"""Whole models on the CUDA backend over the emulated driver (tests/cuda_emulator.py), for the
tests of its forward pass (test_cuda_backend.py) and of its memory (test_cuda_memory.py).

    cuda_model(path, integrated)  a model loaded on CUDABackend(EmulatedDevice(integrated))
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
WIDE = dict(dim=256, ff=512, n_heads=4, n_kv_heads=2, head_dim=64)  # K-quants stay K-quants; 64-wide heads rotate


def cuda_model(path, integrated: bool = True):
    return load(path, backend=CUDABackend(EmulatedDevice(integrated)))


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())
