"""The CUDA driver API (libcuda.so.1), opened with cffi in ABI mode: no cudart, no compiler.

What lives here: `open_driver` (the library, initialised, or `CudaUnavailable` saying why
not and what to do), `Driver.devices` (`DeviceInfo`: name, compute capability, memory,
integrated or discrete), and the calls a backend makes: a primary context, modules from
CUBINs, memory (allocated, or host memory registered and mapped: Jetson's unified memory),
streams, kernel launches (`Driver.launch`, arguments packed by `pack_args`) and CUDA graphs.
What does not: compiling (nvrtc.py), which kernels exist (programs.py).

Errors: every failing call raises CudaError with the driver's own name for the code
(CUDA_ERROR_OUT_OF_MEMORY ...) and the call that failed.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Sequence

import cffi

from ..errors import EdgeKVError

_CDEF = """
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuGetErrorName(CUresult error, const char **name);
CUresult cuGetErrorString(CUresult error, const char **text);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxSynchronize(void);
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleUnload(CUmodule module);
CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name);
CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr ptr);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream);
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, CUstream stream);
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t bytes, CUstream stream);
CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned int flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *ptr, void *p, unsigned int flags);
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params,
                        void **extra);
CUresult cuStreamCreate(CUstream *stream, unsigned int flags);
CUresult cuStreamDestroy_v2(CUstream stream);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuStreamBeginCapture_v2(CUstream stream, int mode);
CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult cuGraphExecDestroy(CUgraphExec exec);
CUresult cuGraphDestroy(CUgraph graph);
"""
FUNCTIONS = re.findall(r"^CUresult (\w+)\(", _CDEF, re.MULTILINE)  # each must be in the driver
# cuda.h's values
ATTR_MULTIPROCESSOR_COUNT = 16
ATTR_INTEGRATED = 18
ATTR_CAN_MAP_HOST_MEMORY = 19
ATTR_CC_MAJOR = 75
ATTR_CC_MINOR = 76
ATTR_HOST_REGISTER_SUPPORTED = 99  # cuMemHostRegister works (pinned and mapped host memory)
ATTR_READ_ONLY_HOST_REGISTER_SUPPORTED = 113  # ... with CU_MEMHOSTREGISTER_READ_ONLY (a read-only file mapping)
ERROR_INVALID_VALUE = 1
MEMHOSTREGISTER_DEVICEMAP = 0x02
MEMHOSTREGISTER_READ_ONLY = 0x08
STREAM_NON_BLOCKING = 0x1
CAPTURE_MODE_THREAD_LOCAL = 1
ERROR_STUB_LIBRARY = 34
ERROR_INSUFFICIENT_DRIVER = 35
ERROR_NO_DEVICE = 100
ERROR_OUT_OF_MEMORY = 2

LIBCUDA = "libcuda.so.1"
MIN_ARCH = 61  # __dp4a (the int8 dot products of every quantized matvec): Pascal sm_61 and newer
FIX_DRIVER = ("install the NVIDIA driver (on Jetson: JetPack 5 or 6), or run on the CPU with --backend cpu "
              "(EDGEKV_BACKEND=cpu)")
# the kernel argument kinds `pack_args` knows: device pointer, int32, uint64, float32
ARG_TYPES = {"p": "unsigned long long *", "i": "int *", "q": "unsigned long long *", "f": "float *"}


class CudaUnavailable(EdgeKVError):
    """CUDA cannot be used here: no driver, no device, or a driver too old (the message says which)."""


class CudaError(EdgeKVError):
    """A CUDA driver call failed; `code` is its CUresult."""

    def __init__(self, message: str, code: int = 0):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class DeviceInfo:
    ordinal: int
    name: str
    capability: tuple[int, int]  # (8, 7) for Jetson Orin
    total_memory: int  # bytes
    integrated: bool  # shares the host's memory (Jetson): weights are mapped, not copied
    can_map_host_memory: bool
    multiprocessors: int
    host_register: bool = True  # cuMemHostRegister supported: host arrays can be pinned and mapped
    read_only_register: bool = True  # ... read-only ones too (a GGUF file's pages: the weights, mapped)

    @property
    def maps_host_memory(self) -> bool:
        """Whether kernels can read host arrays through a mapping (registered by edgekv)."""
        return self.can_map_host_memory and self.host_register

    @property
    def arch(self) -> int:
        """The sm_XY number NVRTC compiles for (87 for Orin)."""
        return 10 * self.capability[0] + self.capability[1]


def version_text(version: int) -> str:
    """The driver's CUDA version as cuDriverGetVersion reports it (12060) -> '12.6'."""
    return f"{version // 1000}.{version % 1000 // 10}"


def pack_args(ffi: cffi.FFI, signature: str, args: Sequence[Any]) -> tuple[Any, list[Any]]:
    """cuLaunchKernel's kernelParams for args of the given kinds ('p' device pointer, 'i'
    int32, 'q' uint64, 'f' float32, one letter per argument): a void*[] of pointers to
    the values, and the cffi objects that must outlive the launch."""
    if len(signature) != len(args):
        raise ValueError(f"kernel takes {len(signature)} arguments ({signature}), got {len(args)}")
    holders = []
    for kind, value in zip(signature, args):
        if kind not in ARG_TYPES:
            raise ValueError(f"unknown kernel argument kind {kind!r} in {signature!r}")
        holders.append(ffi.new(ARG_TYPES[kind], value))
    params = ffi.new("void *[]", [ffi.cast("void *", h) for h in holders])
    return params, holders


class Driver:
    def __init__(self, path: str = LIBCUDA):
        self.ffi = cffi.FFI()
        self.ffi.cdef(_CDEF)
        try:
            self._lib = self.ffi.dlopen(path)
        except OSError as exc:
            reason = str(exc).split(".  Additionally")[0]  # cffi appends its ctypes.util search
            raise CudaUnavailable(f"no NVIDIA driver: {path} cannot be opened ({reason}); {FIX_DRIVER}") from None
        self.path = path
        self.context: Any = None  # use_device's: made current in each thread that calls the driver
        self._thread = threading.local()
        missing = [name for name in FUNCTIONS if not hasattr(self._lib, name)]
        if missing:
            raise CudaUnavailable(f"the NVIDIA driver ({path}) lacks {', '.join(missing[:3])}"
                                  f"{' and more' if len(missing) > 3 else ''}: it is older than edgekv needs "
                                  "(CUDA 11.4 or newer); update it (on Jetson: JetPack 5 or 6), or run on the "
                                  "CPU with --backend cpu")
        result = self.lib.cuInit(0)
        if result == ERROR_NO_DEVICE:
            raise CudaUnavailable(f"the NVIDIA driver ({path}) found no CUDA device; check `nvidia-smi` (on Jetson: "
                                  "`tegrastats`), that this user may use the GPU (group video/render), and "
                                  "CUDA_VISIBLE_DEVICES; or run on the CPU with --backend cpu")
        if result == ERROR_STUB_LIBRARY:
            raise CudaUnavailable(f"{path} is the CUDA toolkit's stub library, not a driver; {FIX_DRIVER}")
        if result == ERROR_INSUFFICIENT_DRIVER:
            raise CudaUnavailable(f"the NVIDIA driver ({path}) is too old for this CUDA; update it (on Jetson: "
                                  "JetPack), or run on the CPU with --backend cpu")
        if result != 0:
            raise CudaUnavailable(f"cuInit failed: {self.error_name(result)}; {FIX_DRIVER}")
        version = self.ffi.new("int *")
        self.check(self.lib.cuDriverGetVersion(version), "cuDriverGetVersion")
        self.version = version[0]

    @property
    def lib(self) -> Any:
        """The driver's functions, with the device's context current in the calling thread."""
        self.make_current()
        return self._lib

    def make_current(self) -> None:
        """use_device's context current in this thread, once per thread: a CUDA context is
        current per thread, and a server's model thread, an app's worker or a finalizer run
        by the garbage collector may call where use_device did not."""
        if self.context is not None and getattr(self._thread, "context", None) is not self.context:
            self.check(self._lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
            self._thread.context = self.context

    def error_name(self, result: int) -> str:
        name, text = self.ffi.new("const char **"), self.ffi.new("const char **")
        if self._lib.cuGetErrorName(result, name) != 0:  # needs no context (and may explain a failure to make one)
            return f"CUDA error {result}"
        self._lib.cuGetErrorString(result, text)
        return f"{self.ffi.string(name[0]).decode()} ({self.ffi.string(text[0]).decode()})"

    def check(self, result: int, what: str) -> None:
        if result != 0:
            raise CudaError(f"{what} failed: {self.error_name(result)}", result)

    # -- devices ---------------------------------------------------------------------------

    def devices(self) -> list[DeviceInfo]:
        count = self.ffi.new("int *")
        self.check(self.lib.cuDeviceGetCount(count), "cuDeviceGetCount")
        return [self.device(i) for i in range(count[0])]

    def device(self, ordinal: int) -> DeviceInfo:
        ffi, lib = self.ffi, self.lib
        dev = ffi.new("CUdevice *")
        self.check(lib.cuDeviceGet(dev, ordinal), f"cuDeviceGet({ordinal})")
        name = ffi.new("char[]", 256)
        self.check(lib.cuDeviceGetName(name, 256, dev[0]), "cuDeviceGetName")
        total = ffi.new("size_t *")
        self.check(lib.cuDeviceTotalMem_v2(total, dev[0]), "cuDeviceTotalMem")

        def attribute(which: int, unknown: int | None = None) -> int:
            value = ffi.new("int *")
            result = lib.cuDeviceGetAttribute(value, which, dev[0])
            if result == ERROR_INVALID_VALUE and unknown is not None:  # a driver older than the attribute
                return unknown
            self.check(result, f"cuDeviceGetAttribute({which})")
            return value[0]

        return DeviceInfo(ordinal, ffi.string(name).decode(errors="replace"),
                          (attribute(ATTR_CC_MAJOR), attribute(ATTR_CC_MINOR)), total[0],
                          bool(attribute(ATTR_INTEGRATED)), bool(attribute(ATTR_CAN_MAP_HOST_MEMORY)),
                          attribute(ATTR_MULTIPROCESSOR_COUNT), bool(attribute(ATTR_HOST_REGISTER_SUPPORTED, 0)),
                          bool(attribute(ATTR_READ_ONLY_HOST_REGISTER_SUPPORTED, 0)))

    def use_device(self, ordinal: int) -> Any:
        """Make the device's primary context current on this thread; returns it."""
        dev = self.ffi.new("CUdevice *")
        self.check(self.lib.cuDeviceGet(dev, ordinal), f"cuDeviceGet({ordinal})")
        ctx = self.ffi.new("CUcontext *")
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctx, dev[0]), "cuDevicePrimaryCtxRetain")
        self.context = ctx[0]
        self.make_current()  # here now; in another thread at its first call
        return self.context

    # -- code --------------------------------------------------------------------------------

    def load_module(self, cubin: bytes) -> Any:
        module = self.ffi.new("CUmodule *")
        self.check(self.lib.cuModuleLoadData(module, cubin), "cuModuleLoadData")
        return module[0]

    def function(self, module: Any, name: str) -> Any:
        fn = self.ffi.new("CUfunction *")
        self.check(self.lib.cuModuleGetFunction(fn, module, name.encode()), f"cuModuleGetFunction({name})")
        return fn[0]

    def launch(self, fn: Any, grid: tuple[int, int, int], block: tuple[int, int, int], signature: str,
               args: Sequence[Any], stream: Any = None, shared: int = 0) -> None:
        params, _holders = pack_args(self.ffi, signature, args)
        self.check(self.lib.cuLaunchKernel(fn, *grid, *block, shared, stream or self.ffi.NULL, params, self.ffi.NULL),
                   "cuLaunchKernel")

    # -- memory ------------------------------------------------------------------------------

    def alloc(self, nbytes: int) -> int:
        ptr = self.ffi.new("CUdeviceptr *")
        self.check(self.lib.cuMemAlloc_v2(ptr, max(nbytes, 1)), f"cuMemAlloc({nbytes} bytes)")
        return int(ptr[0])

    def free(self, ptr: int) -> None:
        self.check(self.lib.cuMemFree_v2(ptr), "cuMemFree")

    def to_device(self, dst: int, src: Any, nbytes: int, stream: Any = None) -> None:
        self.check(self.lib.cuMemcpyHtoDAsync_v2(dst, self.ffi.from_buffer(src), nbytes, stream or self.ffi.NULL),
                   "cuMemcpyHtoD")

    def to_host(self, dst: Any, src: int, nbytes: int, stream: Any = None) -> None:
        self.check(self.lib.cuMemcpyDtoHAsync_v2(self.ffi.from_buffer(dst), src, nbytes, stream or self.ffi.NULL),
                   "cuMemcpyDtoH")

    def copy_in(self, dst: int, src: int, nbytes: int, stream: Any = None) -> None:
        """Host address src -> device dst, queued on the stream: a graph can hold it where src
        is registered (pinned) memory."""
        self.check(self.lib.cuMemcpyHtoDAsync_v2(dst, self.ffi.cast("void *", src), nbytes, stream or self.ffi.NULL),
                   "cuMemcpyHtoD")

    def copy_out(self, dst: int, src: int, nbytes: int, stream: Any = None) -> None:
        """Device src -> host address dst, queued on the stream (as copy_in)."""
        self.check(self.lib.cuMemcpyDtoHAsync_v2(self.ffi.cast("void *", dst), src, nbytes, stream or self.ffi.NULL),
                   "cuMemcpyDtoH")

    def memset(self, dst: int, value: int, nbytes: int, stream: Any = None) -> None:
        self.check(self.lib.cuMemsetD8Async(dst, value, nbytes, stream or self.ffi.NULL), "cuMemsetD8")

    def map_host(self, buffer: Any, read_only: bool = True) -> int:
        """Register host memory (a NumPy array or mmap; page-aligned regions work best) and
        return the device pointer to it: on an integrated GPU the weights stay where they are."""
        ptr = self.ffi.from_buffer(buffer)
        return self.register_host(int(self.ffi.cast("uintptr_t", ptr)), len(ptr), read_only)

    def register_host(self, address: int, nbytes: int, read_only: bool = True) -> int:
        """Register the host range [address, address + nbytes) (whole pages, registered once)
        and return the device pointer to its first byte."""
        ptr = self.ffi.cast("void *", address)
        flags = MEMHOSTREGISTER_DEVICEMAP | (MEMHOSTREGISTER_READ_ONLY if read_only else 0)
        self.check(self.lib.cuMemHostRegister_v2(ptr, nbytes, flags), f"cuMemHostRegister({nbytes} bytes)")
        dptr = self.ffi.new("CUdeviceptr *")
        self.check(self.lib.cuMemHostGetDevicePointer_v2(dptr, ptr, 0), "cuMemHostGetDevicePointer")
        return int(dptr[0])

    def unregister_host(self, address: int) -> None:
        self.check(self.lib.cuMemHostUnregister(self.ffi.cast("void *", address)), "cuMemHostUnregister")

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current context's device."""
        free, total = self.ffi.new("size_t *"), self.ffi.new("size_t *")
        self.check(self.lib.cuMemGetInfo_v2(free, total), "cuMemGetInfo")
        return free[0], total[0]

    # -- streams and graphs ------------------------------------------------------------------

    def stream(self) -> Any:
        s = self.ffi.new("CUstream *")
        self.check(self.lib.cuStreamCreate(s, STREAM_NON_BLOCKING), "cuStreamCreate")
        return s[0]

    def synchronize(self, stream: Any) -> None:
        self.check(self.lib.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def begin_capture(self, stream: Any) -> None:
        self.check(self.lib.cuStreamBeginCapture_v2(stream, CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture")

    def end_capture(self, stream: Any) -> Any:
        """The graph of what was launched on stream since begin_capture, instantiated."""
        graph, exe = self.ffi.new("CUgraph *"), self.ffi.new("CUgraphExec *")
        self.check(self.lib.cuStreamEndCapture(stream, graph), "cuStreamEndCapture")
        try:
            self.check(self.lib.cuGraphInstantiateWithFlags(exe, graph[0], 0), "cuGraphInstantiate")
        finally:
            self.lib.cuGraphDestroy(graph[0])
        return exe[0]

    def launch_graph(self, exe: Any, stream: Any) -> None:
        self.check(self.lib.cuGraphLaunch(exe, stream), "cuGraphLaunch")

    def destroy_graph(self, exe: Any) -> None:
        self.check(self.lib.cuGraphExecDestroy(exe), "cuGraphExecDestroy")


def open_driver() -> Driver:
    """The driver, initialised: EDGEKV_LIBCUDA (a path) or libcuda.so.1 from the loader's search path."""
    return Driver(os.environ.get("EDGEKV_LIBCUDA") or LIBCUDA)
