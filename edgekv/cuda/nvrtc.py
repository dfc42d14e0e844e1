"""NVRTC, CUDA's runtime compiler, opened with cffi in ABI mode (no compiler, no headers).

What lives here: `find_nvrtc` (where libnvrtc is: EDGEKV_NVRTC, the `nvidia-cuda-nvrtc-cu12`
wheel of the `cuda` extra or CUDA 13's `nvidia-cuda-nvrtc`, the system's CUDA or JetPack
(first on a Jetson), the loader's search path; the one whose CUDA version matches the
driver's), `Nvrtc`
(its version, the architectures it targets, and `compile`: CUDA C++ source -> a CUBIN for one
exact sm_XY, with the compiler's log) and `NvrtcError`.
Why a CUBIN and not PTX: PTX from a newer toolkit is refused by an older driver (JetPack's);
machine code for the device's own capability is loaded by any driver that runs the device.
What does not: which sources, the disk cache (programs.py), the driver (driver.py).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import cffi

from ..errors import EdgeKVError

_CDEF = """
typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;
const char *nvrtcGetErrorString(nvrtcResult result);
nvrtcResult nvrtcVersion(int *major, int *minor);
nvrtcResult nvrtcGetNumSupportedArchs(int *numArchs);
nvrtcResult nvrtcGetSupportedArchs(int *supportedArchs);
nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name, int numHeaders,
                               const char * const *headers, const char * const *includeNames);
nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog);
nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char * const *options);
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *logSizeRet);
nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log);
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t *cubinSizeRet);
nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char *cubin);
"""
NVRTC_COMPILATION_ERROR = 6
# the system's CUDA: desktop toolkits, and JetPack (Jetson keeps its libraries under targets/)
SYSTEM_DIRS = ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/aarch64-linux/lib",
               "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/aarch64-linux-gnu", "/usr/lib/x86_64-linux-gnu")
SONAMES = ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so")
HOW_TO_GET = ("install the cuda extra (pip install 'edgekv[cuda]', which brings nvidia-cuda-nvrtc-cu12), "
              "or JetPack's CUDA, or set EDGEKV_NVRTC to a libnvrtc.so")


class NvrtcError(EdgeKVError):
    """NVRTC is missing, or a source did not compile (the message carries its log)."""


def _wheel_libraries() -> list[str]:
    # the nvidia-cuda-nvrtc-cu12 (nvidia/cuda_nvrtc/lib) and CUDA 13 (nvidia/cu13/lib) wheels
    found = []
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if base.is_dir():
            found += sorted(glob.glob(str(base / "*" / "lib" / "libnvrtc.so*")), reverse=True)
    return [p for p in found if "builtins" not in p and ".alt." not in p]


def on_jetson() -> bool:
    """A Jetson (L4T): JetPack's own CUDA is the one its driver was made with."""
    return os.path.exists("/etc/nv_tegra_release")


def candidates() -> list[str]:
    """Where libnvrtc is looked for, in order (absolute paths, then sonames for dlopen): the
    wheels, CUDA_HOME / CUDA_PATH, the system's CUDA; on a Jetson, JetPack's first."""
    given = os.environ.get("EDGEKV_NVRTC")
    if given:
        return [given]
    homes = []
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home:
            homes += sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")), reverse=True)
    system = []
    for folder in SYSTEM_DIRS:
        system += sorted(glob.glob(os.path.join(folder, "libnvrtc.so*")), reverse=True)
    paths = system + homes + _wheel_libraries() if on_jetson() else _wheel_libraries() + homes + system
    paths = [p for p in paths if "builtins" not in p and ".alt." not in p]
    return paths + list(SONAMES)


def find_nvrtc(driver_version: int | None = None) -> "Nvrtc":
    """The NVRTC to compile with: the first that opens whose CUDA major version is the
    driver's (driver_version: cuDriverGetVersion's, e.g. 12060; None: no driver to match),
    else the newest older one (a CUBIN from a newer CUDA than the driver's may be refused:
    JetPack 5's driver is CUDA 11.4); NvrtcError naming what was tried and how to get one."""
    tried, opened = [], []
    for where in candidates():
        try:
            nvrtc = Nvrtc(where)
        except OSError as exc:
            tried.append(f"{where} ({exc})" if os.environ.get("EDGEKV_NVRTC") else where)
            continue
        if driver_version is None or nvrtc.version[0] == driver_version // 1000:
            return nvrtc
        opened.append(nvrtc)
    older = [n for n in opened if n.version[0] < driver_version // 1000] if opened else []
    if older:
        return max(older, key=lambda n: n.version)
    if opened:
        found = ", ".join(f"{n.version[0]}.{n.version[1]} ({n.path})" for n in opened)
        raise NvrtcError(f"the NVIDIA driver runs CUDA {driver_version // 1000}.{driver_version % 1000 // 10}, but "
                         f"the NVRTC found makes code for a newer CUDA: {found}; install the NVRTC of your CUDA "
                         f"version (JetPack's, or nvidia-cuda-nvrtc-cu{driver_version // 1000}) or update the driver")
    raise NvrtcError(f"NVRTC (libnvrtc.so) not found: tried {', '.join(tried[:6])}"
                     f"{' ...' if len(tried) > 6 else ''}; {HOW_TO_GET}")


@dataclass(frozen=True)
class Compiled:
    cubin: bytes
    log: str  # the compiler's messages (warnings) for a source that compiled


def preload_builtins(path: str) -> list[str]:
    """Open the libnvrtc-builtins beside the libnvrtc at `path` (RTLD_GLOBAL), so that NVRTC
    finds it whatever the loader's search path: the CUDA 13.0 wheel (nvidia-cuda-nvrtc
    13.0.x) ships libnvrtc.so.13 without an RPATH, and every compile then fails with
    NVRTC_ERROR_BUILTIN_OPERATION_FAILURE. Returns what was opened (nothing for a soname)."""
    folder = os.path.dirname(path)
    if not folder:
        return []
    opened = []
    for lib in sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so*"))):
        if ".alt." not in lib:
            try:
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
                opened.append(lib)
            except OSError:  # NVRTC itself then says what is missing
                pass
    return opened


class Nvrtc:
    def __init__(self, path: str):
        self.ffi = cffi.FFI()
        self.ffi.cdef(_CDEF)
        self.builtins = preload_builtins(path)
        self.lib = self.ffi.dlopen(path)
        self.path = path
        major, minor = self.ffi.new("int *"), self.ffi.new("int *")
        self._check(self.lib.nvrtcVersion(major, minor), "nvrtcVersion")
        self.version = (major[0], minor[0])

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            message = self.ffi.string(self.lib.nvrtcGetErrorString(result)).decode()
            raise NvrtcError(f"{what} failed: {message} (NVRTC {self.path})")

    def supported_archs(self) -> list[int]:
        """The sm_XY this NVRTC can compile for, as XY integers (e.g. 87 for Jetson Orin)."""
        n = self.ffi.new("int *")
        self._check(self.lib.nvrtcGetNumSupportedArchs(n), "nvrtcGetNumSupportedArchs")
        archs = self.ffi.new("int[]", n[0])
        self._check(self.lib.nvrtcGetSupportedArchs(archs), "nvrtcGetSupportedArchs")
        return list(archs)

    def compile(self, source: str, name: str, arch: int, headers: dict[str, str] | None = None,
                options: tuple[str, ...] = ()) -> Compiled:
        """source -> a CUBIN for sm_<arch>; headers: include name -> text (the sources'
        #include "..." are served from here, nothing is read from disk). NvrtcError with the
        log on a compile error, or when this NVRTC does not target the architecture."""
        if arch not in self.supported_archs():
            raise NvrtcError(f"NVRTC {self.version[0]}.{self.version[1]} ({self.path}) cannot compile for sm_{arch} "
                             f"(it targets sm_{min(self.supported_archs())}..sm_{max(self.supported_archs())}; "
                             "CUDA 13's NVRTC targets sm_75 and newer, Jetson Orin's sm_87 included; CUDA 12's sm_50 and "
                             "newer): " + HOW_TO_GET)
        ffi, lib = self.ffi, self.lib
        headers = headers or {}
        keep = [ffi.new("char[]", text.encode()) for text in headers.values()]
        keep_names = [ffi.new("char[]", n.encode()) for n in headers]
        opts = [ffi.new("char[]", o.encode()) for o in (f"--gpu-architecture=sm_{arch}", "--std=c++17", *options)]
        prog = ffi.new("nvrtcProgram *")
        self._check(lib.nvrtcCreateProgram(prog, source.encode(), name.encode(), len(headers),
                                           ffi.new("char *[]", keep), ffi.new("char *[]", keep_names)),
                    "nvrtcCreateProgram")
        try:
            result = lib.nvrtcCompileProgram(prog[0], len(opts), ffi.new("char *[]", opts))
            log = self._log(prog[0])
            if result == NVRTC_COMPILATION_ERROR:
                raise NvrtcError(f"{name} does not compile for sm_{arch} with NVRTC "
                                 f"{self.version[0]}.{self.version[1]}:\n{log}")
            if result != 0:  # NVRTC failed (not the source): its log says why, when it says anything
                message = ffi.string(lib.nvrtcGetErrorString(result)).decode()
                raise NvrtcError(f"compiling {name} for sm_{arch} failed: {message} (NVRTC "
                                 f"{self.version[0]}.{self.version[1]}, {self.path})" + (f":\n{log}" if log else ""))
            size = ffi.new("size_t *")
            self._check(lib.nvrtcGetCUBINSize(prog[0], size), "nvrtcGetCUBINSize")
            cubin = ffi.new("char[]", size[0])
            self._check(lib.nvrtcGetCUBIN(prog[0], cubin), "nvrtcGetCUBIN")
            return Compiled(bytes(ffi.buffer(cubin, size[0])), log)
        finally:
            lib.nvrtcDestroyProgram(prog)

    def _log(self, prog) -> str:
        size = self.ffi.new("size_t *")
        self._check(self.lib.nvrtcGetProgramLogSize(prog, size), "nvrtcGetProgramLogSize")
        text = self.ffi.new("char[]", max(size[0], 1))
        self._check(self.lib.nvrtcGetProgramLog(prog, text), "nvrtcGetProgramLog")
        return self.ffi.string(text).decode(errors="replace").strip()
