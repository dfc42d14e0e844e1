"""native/*.cu as written, run on the CPU: each source compiled by the system C++ compiler
with tests/cuda_cpu/cuda_cpu.h (CUDA's built-ins for the host) and linked with
tests/cuda_cpu/executor.cc (each block's threads as fibers: barriers and warp shuffles keep
their CUDA meaning), under UndefinedBehaviorSanitizer, and AddressSanitizer where the process
has its runtime (`make test` runs the tests marked `cuda_cpu` with it preloaded: `sanitized_env`).

    build()                     the shared library (cached by content under the kernel cache,
                                or EDGEKV_CUDA_CPU_CACHE)
    CpuKernels().launch(...)    a kernel over a grid, its arguments packed as cuLaunchKernel's
    CpuCudaDevice(integrated)   runtime.Device on the emulated driver, launches running the real
                                kernels instead of their NumPy twins (tests/cuda_twins.py)
    asan_loaded()               whether this process runs with AddressSanitizer's runtime
    sanitized_env()             the environment a child process needs to have it
    never_launched()            the kernels no launch of this process has run (conftest.py
                                fails a whole `-m cuda_cpu` run that left one out)

As a script: `python tests/cuda_cpu.py [pytest options]` runs pytest -m cuda_cpu with ASan
preloaded (make test and make test-fast do).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cffi

from cuda_emulator import EmulatedDevice, EmulatedDriver
from edgekv.cuda import programs
from edgekv.cuda.driver import pack_args
from edgekv.kernels.jit_cache import kernel_cache_dir

HERE = Path(__file__).resolve().parent / "cuda_cpu"
CXX = os.environ.get("CXX", "g++")
FLAGS = ["-std=c++17", "-O1", "-g", "-fPIC", "-fno-omit-frame-pointer", "-ffp-contract=off", "-Wall", "-Werror",
         "-Wno-unknown-pragmas", "-fsanitize=undefined", "-fno-sanitize-recover=all"]
ASAN = ["-fsanitize=address"]


def asan_loaded() -> bool:
    return hasattr(ctypes.CDLL(None), "__asan_init")


def sanitized_env(env: dict | None = None) -> dict:
    """os.environ (or env) with AddressSanitizer's runtime preloaded: what a Python process
    needs to load a library built with -fsanitize=address. Leaks are not checked (CPython's
    own allocations at exit are not ours); the first error ends the process."""
    env = dict(os.environ if env is None else env)
    runtime = subprocess.run([CXX, "-print-file-name=libasan.so"], capture_output=True, text=True,
                             check=True).stdout.strip()
    env["LD_PRELOAD"] = runtime
    env["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=1:abort_on_error=0:detect_stack_use_after_return=0"
    env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    return env


def _entries(source: str) -> list[str]:
    return programs.kernel_names(source)


def _unit(name: str, source: str) -> str:
    """The translation unit of one native/ source: the source itself, then an entry point
    per kernel taking kernelParams (void*[])."""
    lines = [f'#include "{programs.native_dir() / name}"']
    lines += [f'extern "C" void ek_cpu_entry_{k}(void** p) {{ ek_cpu_invoke({k}, p); }}' for k in _entries(source)]
    return "\n".join(lines) + "\n"


def _key(flags: list[str], native: Path) -> str:
    h = hashlib.sha256()
    version = subprocess.run([CXX, "--version"], capture_output=True, text=True).stdout
    texts = [version, " ".join(flags), str(native), *(p.read_text() for p in sorted(HERE.iterdir()))]
    texts += [f"{k}\0{v}" for k, v in {**programs.sources(), **programs.headers()}.items()]
    for text in texts:
        h.update(text.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def build(sanitize_address: bool | None = None) -> Path:
    """native/ and the executor as one shared library, with ASan when asked (default: when
    this process has its runtime, which a library built with it requires)."""
    if sanitize_address is None:
        sanitize_address = asan_loaded()
    flags = FLAGS + (ASAN if sanitize_address else [])
    native = programs.native_dir()
    folder = Path(os.environ.get("EDGEKV_CUDA_CPU_CACHE") or kernel_cache_dir() / "cuda_cpu") / _key(flags, native)
    lib = folder / "libek_cuda_cpu.so"
    if lib.exists():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    common = [CXX, *flags, "-include", str(HERE / "cuda_cpu.h"), "-I", str(native)]
    jobs = [(folder / "executor.o", [CXX, *flags, "-c", str(HERE / "executor.cc")])]
    for name, source in programs.sources().items():
        unit = folder / f"{Path(name).stem}.cc"
        unit.write_text(_unit(name, source))
        jobs.append((folder / f"{Path(name).stem}.o", [*common, "-c", str(unit)]))

    def compile_one(job):
        out, cmd = job
        done = subprocess.run([*cmd, "-o", str(out)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr}")
        return out

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        objects = list(pool.map(compile_one, jobs))
    partial = folder / f"libek_cuda_cpu.so.{os.getpid()}"
    done = subprocess.run([CXX, *flags, "-shared", "-o", str(partial), *map(str, objects)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"linking {lib} failed:\n{done.stderr}")
    partial.replace(lib)
    return lib


class KernelFault(RuntimeError):
    """What CUDA leaves undefined, found while a kernel ran (the executor's message)."""


class CpuKernels:
    """The real kernels, launched over a grid on this CPU."""

    def __init__(self, sanitize_address: bool | None = None):
        self.path = build(sanitize_address)
        self.ffi = cffi.FFI()
        names = [k for source in programs.sources().values() for k in _entries(source)]
        self.ffi.cdef("int ek_cpu_launch(void (*entry)(void **), void **params, unsigned gx, unsigned gy, unsigned gz,"
                      " unsigned bx, unsigned by, unsigned bz);\nconst char *ek_cpu_error(void);\n"
                      + "".join(f"void ek_cpu_entry_{k}(void **);\n" for k in names))
        self.lib = self.ffi.dlopen(str(self.path))
        self.launched: set[str] = set()

    def launch(self, name: str, grid, block, signature: str, args) -> None:
        grid, block = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
        params, _holders = pack_args(self.ffi, signature, args)
        entry = getattr(self.lib, f"ek_cpu_entry_{name}")
        if self.lib.ek_cpu_launch(entry, params, *grid, *block) != 0:
            raise KernelFault(f"{name}: {self.ffi.string(self.lib.ek_cpu_error()).decode()}")
        self.launched.add(name)


def never_launched() -> list[str]:
    """The kernels of native/ this process has not run through shared_kernels()."""
    ran = shared_kernels().launched if shared_kernels.cache_info().currsize else set()
    return sorted(k for source in programs.sources().values() for k in _entries(source) if k not in ran)


@functools.lru_cache(maxsize=None)
def shared_kernels() -> CpuKernels:
    """One library per process (loading it again would only map it again)."""
    return CpuKernels()


class CpuCudaDriver(EmulatedDriver):
    """The emulated driver (its checks of pointers, kinds, capture), launching real kernels."""

    def __init__(self, kernels: CpuKernels, integrated: bool = True, **attributes):
        super().__init__(integrated, **attributes)
        self.kernels = kernels

    def run_kernel(self, fn: str, grid, block, signature: str, args) -> None:
        self.kernels.launch(fn, grid, block, signature, args)


class CpuCudaDevice(EmulatedDevice):
    """runtime.Device whose launches run native/'s own code on this CPU."""

    def __init__(self, integrated: bool = True, kernels: CpuKernels | None = None, **attributes):
        super(EmulatedDevice, self).__init__(driver=CpuCudaDriver(kernels or shared_kernels(), integrated, **attributes),
                                             nvrtc=object())


if __name__ == "__main__":
    import sys

    args = [sys.executable, "-m", "pytest", *(sys.argv[1:] or ["-m", "cuda_cpu"])]
    os.execve(sys.executable, args, sanitized_env())
