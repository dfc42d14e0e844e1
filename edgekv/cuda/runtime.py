"""One GPU as edgekv uses it: its context, the native/ kernels loaded for it, and buffers.

What lives here: `Device` (open the driver, make the device's primary context current,
compile and load each native/ source on first use for the device's own sm_XY, launch a
kernel by name with its arguments packed from the source's declaration), `Buffer` (device
memory of a known size, or host memory registered and mapped: on an integrated GPU, such
as Jetson's, weights are used where they lie instead of being copied into a second buffer).
What does not: compiling (nvrtc.py, programs.py), the driver's calls (driver.py), which
kernels a forward pass runs (backends/cuda.py).

Device memory lives as long as what owns it: `alloc(n, owner)` gives it back when `owner`
goes (a session's scratch, a model's uploaded weights), at the next synchronize, since the
stream may still be reading it; without an owner it lives as long as the Device.

    dev = Device()
    w = dev.upload(weights)                      # or dev.map(weights) on an integrated GPU
    dev.launch("ek_matvec_q8_0", grid, block, w, x, out, n_rows, n_cols, row_bytes)
    dev.download(out, host_array)
"""

from __future__ import annotations

import logging
import mmap
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import programs
from . import arrays
from .arrays import DeviceArray, page_aligned, viewed_array
from ..errors import GpuOutOfMemory
from .driver import ERROR_OUT_OF_MEMORY, CudaError, DeviceInfo, Driver, open_driver
from .nvrtc import Nvrtc, find_nvrtc

log = logging.getLogger("edgekv")


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
        self.nvrtc = nvrtc or find_nvrtc(self.driver.version)  # the NVRTC of the driver's CUDA version
        self.context = self.driver.use_device(ordinal)
        self.stream = self.driver.stream()
        self._functions: dict[str, tuple[Any, str]] = {}
        self._modules: dict[str, Any] = {}
        self._owned: dict[int, Buffer] = {}  # device pointer -> what alloc made
        self._dead: list[Buffer] = []  # buffers whose owner went: given back at the next synchronize
        self._registered: list[tuple[int, int, int]] = []  # host start, end, device pointer
        self._said_copying = False

    # -- kernels -------------------------------------------------------------------------------

    def load_kernels(self) -> None:
        """Compile (or take from the disk cache) and load every native/ source now, so a
        kernel that cannot be built is an error when the backend is made (where `auto`
        falls back to the CPU), not in the middle of a step."""
        for source in programs.sources():
            if source not in self._modules:
                self._modules[source] = self.driver.load_module(programs.cubin(source, self.info.arch, self.nvrtc))

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
        values = [int(a) if isinstance(a, (Buffer, DeviceArray)) else a for a in args]
        self.driver.launch(fn, grid3, block3, signature, values, self.stream, shared)

    def synchronize(self) -> None:
        self.driver.synchronize(self.stream)
        while self._dead:  # the stream is idle: nothing reads them any more
            self._give_back(self._dead.pop())

    # -- memory --------------------------------------------------------------------------------

    def alloc(self, nbytes: int, owner: object = None, what: str = "device memory") -> Buffer:
        """Device memory, given back when `owner` goes (None: when the Device closes).
        GpuOutOfMemory, saying what was asked (`what`: for what) and what is free, where it does
        not fit."""
        try:
            ptr = self.driver.alloc(nbytes)
        except CudaError as exc:
            if exc.code != ERROR_OUT_OF_MEMORY:
                raise
            raise self._out_of_memory(f"{nbytes / 2**20:.1f} MiB of {what} asked") from None
        buf = Buffer(ptr, nbytes)
        self._owned[buf.ptr] = buf
        if owner is not None:
            self.free_with(owner, buf)
        return buf

    def _out_of_memory(self, asked: str) -> GpuOutOfMemory:
        """The error for memory the GPU could not have: what was asked, what is free (on an
        integrated GPU, which shares the RAM, the system's MemAvailable too) and what to try."""
        from ..kv.memory import free_memory

        free, total = self.driver.memory_info()
        text = f"the GPU ({self.info.name}) is out of memory: {asked}, {free / 2**20:.0f} MiB of {total / 2**30:.1f} GiB free"
        if self.info.integrated:  # a Jetson: the GPU's memory is the board's RAM
            available = free_memory()
            if available is not None:
                text += f"; available to processes: {available}"
            return GpuOutOfMemory(text + "; use a smaller model, context (-c) or batch, a quantized KV cache "
                                  "(-ctk q8_0 -ctv q8_0, or iq4_cal), fewer server slots (--slots), close other "
                                  "programs that hold memory, or run on the CPU with --backend cpu")
        return GpuOutOfMemory(text + "; use a smaller model, context or batch, or run on the CPU with --backend cpu")

    def free_with(self, owner: object, buf: Buffer) -> None:
        """Give buf back when owner goes (a finalizer may run anywhere, even mid-capture: it
        only queues the buffer for the next synchronize)."""
        weakref.finalize(owner, self._dead.append, buf)

    def upload(self, array: np.ndarray, owner: object = None, what: str = "device memory") -> Buffer:
        a = np.ascontiguousarray(array)
        buf = self.alloc(a.nbytes, owner, what)
        self.driver.to_device(buf.ptr, a, a.nbytes, self.stream)
        self.synchronize()  # `a` may be a temporary
        return buf

    def map(self, array: np.ndarray, read_only: bool = True, what: str = "host memory") -> Buffer:
        """array (kept alive by the buffer) as device memory without a copy (host_pointer)."""
        return Buffer(self.host_pointer(array, read_only, what), array.nbytes, mapped=True, host=array)

    def host_pointer(self, array: np.ndarray, read_only: bool = True, what: str = "host memory") -> int:
        """The device address of a host array, its memory registered on first use. What is
        registered: the whole file mapping a GGUF tensor lies in (once per file), else the
        array's own pages, so it must own them (arrays.page_aligned): two registrations may
        not share a page. The caller keeps the array alive."""
        if not array.flags.c_contiguous:
            raise ValueError("only a contiguous array can be mapped")
        lo = array.ctypes.data
        for start, end, dptr in self._registered:
            if start <= lo and lo + array.nbytes <= end:
                return dptr + lo - start
        start, nbytes, owner = _region(array)
        try:
            dptr = self.driver.register_host(start, nbytes, read_only)
        except CudaError as exc:  # on a Jetson, NvMap could not pin the pages (ENOMEM)
            if exc.code != ERROR_OUT_OF_MEMORY:
                raise
            raise self._out_of_memory(f"{nbytes / 2**20:.1f} MiB of {what} to pin and map for it "
                                      "(the driver's host registration ran out of memory)") from None
        self._registered.append((start, start + nbytes, dptr))
        # unregistered when the memory goes (a new mapping may take its addresses)
        weakref.finalize(owner, self._unregister, start)
        return dptr + lo - start

    def _unregister(self, start: int) -> None:
        entry = next((e for e in self._registered if e[0] == start), None)
        if entry is not None:
            self._registered.remove(entry)
            self.driver.unregister_host(start)

    def weights(self, array: np.ndarray, owner: object = None, what: str = "the model's weights") -> Buffer:
        """Weights as the device should hold them: mapped where the GPU shares the host's
        memory (one copy in RAM, as `edgekv mem` counts it), uploaded to a discrete GPU (and
        given back when `owner` goes). A GGUF file's pages are mapped read-only, so mapping
        them needs read-only registration (READ_ONLY_HOST_REGISTER_SUPPORTED): where the
        device lacks it, or the driver refuses, they are copied, and a line says why."""
        if self.info.integrated and array.flags.c_contiguous:
            if not (self.info.maps_host_memory and self.info.read_only_register):
                self._copying("this GPU cannot register read-only host memory")
            else:
                try:
                    return self.map(array, what=what)
                except CudaError as exc:  # a driver that will not register this memory: one copy more
                    self._copying(str(exc))
        return self.upload(array, owner, what)

    def _copying(self, why: str) -> None:
        if not self._said_copying:
            log.warning("cannot map the weights where they lie (%s): copying them to the GPU", why)
            self._said_copying = True

    def array(self, shape: tuple[int, ...], dtype=np.float32, owner: object = None) -> DeviceArray:
        """A new device array (zeroed), given back when `owner` goes (None: with the Device)."""
        out = DeviceArray(0, tuple(shape), np.dtype(dtype))
        buf = self.alloc(out.nbytes, owner)
        self.driver.memset(buf.ptr, 0, buf.nbytes, self.stream)
        return DeviceArray(buf.ptr, out.shape, out.dtype)

    def mapped_array(self, shape: tuple[int, ...], dtype=np.float32) -> DeviceArray:
        """A new zeroed host array the device reads and writes through its mapping (for a
        step's inputs the host rewrites between launches); `.host` is the host's view. On a
        device that cannot map host memory: device memory, `.host` a host copy that `push`
        sends (a copy from pageable memory, so such a step cannot be captured)."""
        host = page_aligned(shape, dtype)
        if not self.info.maps_host_memory:
            return DeviceArray(self.alloc(host.nbytes).ptr, tuple(shape), host.dtype, host)
        return DeviceArray(self.host_pointer(host, read_only=False), tuple(shape), host.dtype, host)

    def push(self, ptr: int, host: np.ndarray) -> None:
        """What the host wrote into a mapped_array's `.host` (host: a view of it, at device
        address ptr) made visible to the kernels: nothing to do through a mapping."""
        if not self.info.maps_host_memory:
            self.driver.to_device(ptr, host, host.nbytes, self.stream)

    def copy_in(self, ptr: int, a: np.ndarray) -> None:
        """Host array a -> device memory at ptr, queued on the stream. Registered (pinned)
        first where the device can register host memory, so a captured step holds the copy
        and each replay makes it again; else a copy from pageable memory (not capturable)."""
        if self.info.host_register:
            self.host_pointer(a, read_only=False)
            self.driver.copy_in(ptr, a.ctypes.data, a.nbytes, self.stream)
        else:
            self.driver.to_device(ptr, a, a.nbytes, self.stream)

    def copy_out(self, a: np.ndarray, ptr: int) -> None:
        """Device memory at ptr -> host array a, queued on the stream (as copy_in); the host
        reads it after the step's synchronize."""
        if self.info.host_register:
            self.host_pointer(a, read_only=False)
            self.driver.copy_out(a.ctypes.data, ptr, a.nbytes, self.stream)
        else:
            self.driver.to_host(a, ptr, a.nbytes, self.stream)

    def free(self, buf: Buffer) -> None:
        """Give back memory alloc made (after the stream's work that may read it)."""
        self.synchronize()
        self._give_back(buf)

    def _give_back(self, buf: Buffer) -> None:
        if self._owned.pop(buf.ptr, None) is not None:  # not already freed (close, or free then owner gone)
            self.driver.free(buf.ptr)

    def allocated(self) -> int:
        """Bytes of device memory alloc has made and not given back."""
        return sum(buf.nbytes for buf in self._owned.values())

    def download(self, buf: Buffer, out: np.ndarray) -> np.ndarray:
        self.driver.to_host(out, buf.ptr, out.nbytes, self.stream)
        self.synchronize()
        return out

    def close(self) -> None:
        for ptr in self._owned:
            self.driver.free(ptr)
        self._owned.clear()
        self._dead.clear()


def _region(array: np.ndarray) -> tuple[int, int, object]:
    """(start, nbytes, owner) of the whole pages to register for array: its file mapping's,
    when it is a view of one (GGUF tensors), else those of the memory it is a view of, which
    must hold it (a view of a page_aligned array: the page_aligned array's own, so that views
    of it, such as one layer's row of the `keep` tallies, share one registration); owner is
    the object whose end frees them."""
    root = viewed_array(array)
    mapping = root.base.obj if isinstance(root.base, memoryview) else root.base
    if isinstance(mapping, mmap.mmap):
        return np.frombuffer(mapping, np.uint8, count=1).ctypes.data, len(mapping), mapping
    lo = array.ctypes.data
    page = arrays.PAGE
    first = -(-root.ctypes.data // page) * page  # the whole pages of the memory it is a view of (the
    end = (root.ctypes.data + root.nbytes) // page * page  # interior of page_aligned's allocation)
    if first <= lo and lo + array.nbytes <= end:
        return first, end - first, root
    if lo % page:
        raise ValueError("a host array the GPU addresses must own its pages (edgekv.cuda.arrays.page_aligned)")
    return lo, -(-array.nbytes // page) * page, root  # its own pages, the last one partly
