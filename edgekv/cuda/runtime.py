"""One GPU as edgekv uses it: its context, the native/ kernels loaded for it, and buffers.

What lives here: `Device` (open the driver, make the device's primary context current,
compile and load each native/ source on first use for the device's own sm_XY, launch a
kernel by name with its arguments packed from the source's declaration), `Buffer` (device
memory of a known size, or host memory registered and mapped: on an integrated GPU, such
as Jetson's, weights are used where they lie instead of being copied into a second buffer).
What does not: compiling (nvrtc.py, programs.py), the driver's calls (driver.py), which
kernels a forward pass runs (the CUDA backend, to come: issue 12).

    dev = Device()
    w = dev.upload(weights)                      # or dev.map(weights) on an integrated GPU
    dev.launch("ek_matvec_q8_0", grid, block, w, x, out, n_rows, n_cols, row_bytes)
    dev.download(out, host_array)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import programs
from .driver import DeviceInfo, Driver, open_driver
from .nvrtc import Nvrtc, find_nvrtc


@dataclass
class Buffer:
    """A device address and the bytes behind it; `host` keeps a mapped host array alive."""

    ptr: int
    nbytes: int
    mapped: bool = False
    host: Any = None

    def __int__(self) -> int:
        return self.ptr


class Device:
    def __init__(self, ordinal: int = 0, driver: Driver | None = None, nvrtc: Nvrtc | None = None):
        self.driver = driver or open_driver()
        self.info: DeviceInfo = self.driver.device(ordinal)
        self.nvrtc = nvrtc or find_nvrtc()
        self.context = self.driver.use_device(ordinal)
        self.stream = self.driver.stream()
        self._functions: dict[str, tuple[Any, str]] = {}
        self._modules: dict[str, Any] = {}
        self._owned: list[Buffer] = []

    # -- kernels -------------------------------------------------------------------------------

    def function(self, name: str) -> tuple[Any, str]:
        """The kernel `name` and its argument kinds, its source compiled and loaded on first use."""
        if name not in self._functions:
            for source, text in programs.sources().items():
                signatures = programs.kernel_signatures(text)
                if name in signatures:
                    if source not in self._modules:
                        self._modules[source] = self.driver.load_module(
                            programs.cubin(source, self.info.arch, self.nvrtc))
                    self._functions[name] = (self.driver.function(self._modules[source], name), signatures[name])
                    break
            else:
                raise KeyError(f"no kernel {name!r} in native/")
        return self._functions[name]

    def launch(self, name: str, grid: tuple[int, ...], block: tuple[int, ...], *args: Any, shared: int = 0) -> None:
        fn, signature = self.function(name)
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        block3 = tuple(block) + (1,) * (3 - len(block))
        values = [int(a) if isinstance(a, Buffer) else a for a in args]
        self.driver.launch(fn, grid3, block3, signature, values, self.stream, shared)

    def synchronize(self) -> None:
        self.driver.synchronize(self.stream)

    # -- memory --------------------------------------------------------------------------------

    def alloc(self, nbytes: int) -> Buffer:
        buf = Buffer(self.driver.alloc(nbytes), nbytes)
        self._owned.append(buf)
        return buf

    def upload(self, array: np.ndarray) -> Buffer:
        a = np.ascontiguousarray(array)
        buf = self.alloc(a.nbytes)
        self.driver.to_device(buf.ptr, a, a.nbytes, self.stream)
        self.synchronize()  # `a` may be a temporary
        return buf

    def map(self, array: np.ndarray) -> Buffer:
        """array (contiguous, kept alive by the buffer) as device memory without a copy."""
        if not array.flags.c_contiguous:
            raise ValueError("only a contiguous array can be mapped")
        return Buffer(self.driver.map_host(array), array.nbytes, mapped=True, host=array)

    def weights(self, array: np.ndarray) -> Buffer:
        """Weights as the device should hold them: mapped where the GPU shares the host's
        memory (one copy in RAM, as `edgekv mem` counts it), uploaded to a discrete GPU."""
        if self.info.integrated and self.info.can_map_host_memory and array.flags.c_contiguous:
            return self.map(array)
        return self.upload(array)

    def download(self, buf: Buffer, out: np.ndarray) -> np.ndarray:
        self.driver.to_host(out, buf.ptr, out.nbytes, self.stream)
        self.synchronize()
        return out

    def close(self) -> None:
        for buf in self._owned:
            self.driver.free(buf.ptr)
        self._owned.clear()
