"""A stand-in for the CUDA driver that runs each native/ kernel as NumPy arithmetic, so the
CUDA backend's host side (which kernel, with which arguments, over which grid, on which
memory) runs whole forward passes on a machine without a GPU (tests/test_cuda_backend.py).

What it checks as a GPU would fail: each launch's arguments against the kernel's declared
kinds (driver.pack_args); every pointer argument inside memory the device can address
(allocated, or host memory registered: an unmapped host array is an error here as it would
be a fault there); the grid and block each kernel's indexing needs (the comment atop each
.cu file); host registrations that overlap a registered page (CUDA refuses them). What it
cannot check: the kernels' own code, which tests/test_cuda_host.py builds for the CPU and
tests/test_cuda_device.py runs on a GPU. The kernels' arithmetic, in NumPy: tests/cuda_twins.py.
"""

from __future__ import annotations

import ctypes

import cffi
import numpy as np

from cuda_twins import KERNELS, matvec
from edgekv.cuda import programs
from edgekv.cuda.driver import ERROR_OUT_OF_MEMORY, CudaError, DeviceInfo, pack_args
from edgekv.cuda.runtime import Device

PAGE = 4096


class EmulatedDriver:
    def __init__(self, integrated: bool = True, host_register: bool = True, read_only_register: bool = True):
        """host_register, read_only_register: the device attributes (HOST_REGISTER_SUPPORTED,
        READ_ONLY_HOST_REGISTER_SUPPORTED); a registration they do not allow is refused."""
        self.info = DeviceInfo(0, "Emulated GPU", (8, 7), 8 << 30, integrated, True, 8, host_register,
                               read_only_register)
        self.version = 12060
        self._memory: dict[int, np.ndarray] = {}  # allocated: address -> bytes
        self.capacity = self.info.total_memory  # what cuMemAlloc may hand out in all
        self.registered: list[tuple[int, int]] = []  # host ranges [start, end)
        self.register_limit = 1 << 62  # bytes of host memory that may be registered in all
        self.launches: list[str] = []  # kernel names, in order
        self.last_args: dict[str, list] = {}  # kernel name -> the arguments of its latest launch
        self.copies_to_host = 0
        self.capture: list | None = None  # launches recorded since begin_capture
        self.graph_launches = 0
        self._ffi = cffi.FFI()

    # -- what runtime.Device calls ----------------------------------------------------------

    def device(self, ordinal: int) -> DeviceInfo:
        return self.info

    def use_device(self, ordinal: int):
        return None

    def stream(self):
        return None

    def synchronize(self, stream) -> None:
        self.not_capturing("cuStreamSynchronize")

    # -- CUDA graphs: launches recorded under capture, run again by launch_graph ------------

    def not_capturing(self, what: str) -> None:
        if self.capture is not None:
            raise RuntimeError(f"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: {what} while the stream is captured")

    def begin_capture(self, stream) -> None:
        self.not_capturing("cuStreamBeginCapture")
        self.capture = []

    def end_capture(self, stream):
        graph, self.capture = self.capture, None
        return graph

    def launch_graph(self, graph, stream) -> None:
        self.not_capturing("cuGraphLaunch")
        self.graph_launches += 1
        for node in graph:
            if node[0] == "copy":
                ctypes.memmove(*node[1:])
            else:
                self.launch(*node[1:])

    def destroy_graph(self, graph) -> None:
        graph.clear()

    def load_module(self, cubin):
        return cubin

    def function(self, module, name: str) -> str:
        return name

    def alloc(self, nbytes: int) -> int:
        self.not_capturing("cuMemAlloc")
        if self.allocated() + nbytes > self.capacity:
            raise CudaError("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)", ERROR_OUT_OF_MEMORY)
        buf = np.zeros(max(nbytes, 1), np.uint8)
        self._memory[buf.ctypes.data] = buf
        return buf.ctypes.data

    def free(self, ptr: int) -> None:
        self.not_capturing("cuMemFree")
        del self._memory[ptr]

    def allocated(self) -> int:
        return sum(buf.nbytes for buf in self._memory.values())

    def memory_info(self) -> tuple[int, int]:
        return self.capacity - self.allocated(), self.info.total_memory

    def memset(self, dst: int, value: int, nbytes: int, stream=None) -> None:
        self.not_capturing("cuMemsetD8Async")
        self.check_pointer(dst, nbytes)
        ctypes.memset(dst, value, nbytes)

    def to_device(self, dst: int, src: np.ndarray, nbytes: int, stream=None) -> None:
        self.not_capturing("cuMemcpyHtoDAsync from pageable memory")
        self.check_pointer(dst, nbytes)
        ctypes.memmove(dst, np.ascontiguousarray(src).ctypes.data, nbytes)

    def to_host(self, dst: np.ndarray, src: int, nbytes: int, stream=None) -> None:
        self.not_capturing("cuMemcpyDtoHAsync to pageable memory")
        self.check_pointer(src, nbytes)
        ctypes.memmove(dst.ctypes.data, src, nbytes)
        self.copies_to_host += 1

    def copy_in(self, dst: int, src: int, nbytes: int, stream=None) -> None:
        self.check_pointer(dst, nbytes)
        self._copy(dst, src, nbytes, src, "cuMemcpyHtoDAsync from pageable memory")

    def copy_out(self, dst: int, src: int, nbytes: int, stream=None) -> None:
        self.check_pointer(src, nbytes)
        self._copy(dst, src, nbytes, dst, "cuMemcpyDtoHAsync to pageable memory")
        self.copies_to_host += 1

    def _copy(self, dst: int, src: int, nbytes: int, host: int, refused: str) -> None:
        """A copy between device memory and host memory; a graph holds it where the host side
        is registered (pinned), as CUDA's stream capture does."""
        pinned = any(a <= host and host + nbytes <= b for a, b in self.registered)
        if self.capture is not None and pinned:
            self.capture.append(("copy", dst, src, nbytes))
            return
        self.not_capturing(refused)
        ctypes.memmove(dst, src, nbytes)

    def register_host(self, address: int, nbytes: int, read_only: bool = True) -> int:
        self.not_capturing("cuMemHostRegister")
        if not self.info.host_register or (read_only and not self.info.read_only_register):
            raise CudaError(f"cuMemHostRegister({nbytes} bytes) failed: CUDA_ERROR_NOT_SUPPORTED", 801)
        start, end = address - address % PAGE, -(-(address + nbytes) // PAGE) * PAGE
        if sum(b - a for a, b in self.registered) + end - start > self.register_limit:  # NvMap's ENOMEM
            raise CudaError(f"cuMemHostRegister({nbytes} bytes) failed: CUDA_ERROR_OUT_OF_MEMORY", ERROR_OUT_OF_MEMORY)
        if any(a < end and start < b for a, b in self.registered):
            raise RuntimeError("CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: a page of this range is registered")
        self.registered.append((start, end))
        return address  # an integrated GPU's view of host memory: the same addresses

    def unregister_host(self, address: int) -> None:
        self.not_capturing("cuMemHostUnregister")
        (entry,) = [r for r in self.registered if r[0] == address - address % PAGE]
        self.registered.remove(entry)

    # -- launches ---------------------------------------------------------------------------

    def check_pointer(self, ptr: int, nbytes: int = 1) -> None:
        for base, buf in self._memory.items():
            if base <= ptr and ptr + nbytes <= base + buf.nbytes:
                return
        if any(a <= ptr and ptr + nbytes <= b for a, b in self.registered):
            return
        raise RuntimeError(f"CUDA_ERROR_ILLEGAL_ADDRESS: {ptr:#x} (+{nbytes}) is not device-addressable memory")

    def launch(self, fn: str, grid, block, signature: str, args, stream=None, shared: int = 0) -> None:
        pack_args(self._ffi, signature, args)  # the kinds and count the kernel declares
        for kind, value in zip(signature, args):
            if kind == "p" and value != 0:  # a null pointer argument is fine until it is read
                self.check_pointer(value)
        if self.capture is not None:
            self.capture.append(("launch", fn, grid, block, signature, list(args)))
            return
        self.launches.append(fn)
        self.last_args[fn] = list(args)
        self.run_kernel(fn, grid, block, signature, args)

    def run_kernel(self, fn: str, grid, block, signature: str, args) -> None:
        """The kernel's NumPy twin (tests/cuda_cpu.py's driver runs the real code instead)."""
        name = fn[3:]
        kernel = KERNELS.get(name) or (matvec if name.startswith(("matvec_", "matmul_")) else None)
        kernel(Launch(fn, tuple(grid), tuple(block)), *args)


class EmulatedDevice(Device):
    """runtime.Device on the emulated driver; kernels are looked up, not compiled."""

    def __init__(self, integrated: bool = True, **attributes):
        super().__init__(driver=EmulatedDriver(integrated, **attributes), nvrtc=object())

    def load_kernels(self) -> None:  # nothing to compile: the kernels are NumPy twins
        pass

    def function(self, name: str):
        for text in programs.sources().values():
            signatures = programs.kernel_signatures(text)
            if name in signatures:
                return name, signatures[name]
        raise KeyError(name)


class Launch:
    def __init__(self, name, grid, block):
        self.name, self.grid, self.block = name, grid, block

    def need(self, ok: bool, what: str) -> None:
        if not ok:
            raise AssertionError(f"{self.name}: grid {self.grid}, block {self.block}: {what}")
