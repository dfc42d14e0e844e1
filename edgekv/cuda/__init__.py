"""The CUDA path's plumbing: the driver, NVRTC and the native/ kernels, all without a build.

How it works (DESIGN.md section 8): native/*.cu are compiled at first use by NVRTC for the
exact architecture of the device found (a CUBIN, cached on disk: programs.py) and launched
through the CUDA driver API; both libraries are opened with cffi in ABI mode (driver.py,
nvrtc.py), so no compiler and no cudart are needed: the same code runs on Jetson Orin
(JetPack 5/6, sm_87) and on desktop GPUs (sm_75 and newer with CUDA 13's NVRTC, which
dropped only sm_50-72; sm_61 and newer with CUDA 12's). The NVRTC chosen is the one of the
driver's CUDA version (find_nvrtc): a CUBIN from a newer CUDA may be refused by the driver.

What lives here: `probe()` -> `CudaStatus`, what `edgekv info` reports and the backend
choice asks (driver version, devices, NVRTC, and the first reason CUDA cannot be used).
State of the work (issue 12): the driver, NVRTC, the compile cache, a runtime that
launches kernels by name (runtime.py), the kernels (native/README.md) and the backend that
runs a forward pass on them (backends/cuda.py, with CUDA-graph decode) exist and are
tested on the CPU (tests/test_cuda.py: every source compiles for sm_87 and sm_90;
tests/test_cuda_host.py: the kernels' arithmetic built for the host; tests/
test_cuda_backend.py: whole models on an emulated driver) and, on a GPU, by
tests/test_cuda_device.py and test_cuda_models.py through tools/gpu_check.sh, which has not
yet run on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import EdgeKVError
from .driver import MIN_ARCH, CudaUnavailable, DeviceInfo, open_driver, version_text


@dataclass
class CudaStatus:
    driver: str | None = None  # the driver's CUDA version ("12.6"); None without a driver
    devices: list[DeviceInfo] = field(default_factory=list)
    nvrtc: str | None = None  # "12.9 (path)"; None when not found
    problem: str | None = None  # the first reason CUDA cannot be used here; None: it can

    def lines(self) -> dict[str, str]:
        """`edgekv info`'s CUDA lines."""
        out = {"cuda driver": self.driver or "none"}
        for d in self.devices:
            out[f"cuda device {d.ordinal}"] = (f"{d.name}, sm_{d.arch}, {d.total_memory / 2**30:.1f} GiB, "
                                               f"{d.multiprocessors} SMs, "
                                               f"{'integrated (unified memory)' if d.integrated else 'discrete'}, "
                                               f"{host_memory(d)}")
        out["nvrtc"] = self.nvrtc or "not found"
        if self.problem:
            out["cuda"] = f"unavailable: {self.problem}"
        return out


def host_memory(d: DeviceInfo) -> str:
    """How the device can use host memory, as `edgekv info` says it: what the CUDA backend
    then maps, and what it copies instead (backends/cuda.py)."""
    if not d.maps_host_memory:
        return "host memory not mappable (inputs copied, no CUDA graphs)"
    return "host memory mapped" + ("" if d.read_only_register else ", weights copied (no read-only registration)")


def probe() -> CudaStatus:
    """What CUDA this machine has; never raises for a missing piece (it is `problem`)."""
    from .nvrtc import find_nvrtc

    status = CudaStatus()
    driver_version = None
    try:
        driver = open_driver()
        driver_version = driver.version
        status.driver = version_text(driver.version)
        status.devices = driver.devices()
        old = [d for d in status.devices if d.arch < MIN_ARCH]
        if not status.devices:
            status.problem = "the NVIDIA driver reports no CUDA device"
        elif old:
            status.problem = (f"{old[0].name} is sm_{old[0].arch}: edgekv's CUDA kernels need compute capability "
                              f"{MIN_ARCH // 10}.{MIN_ARCH % 10} or newer (__dp4a); "
                              "run on the CPU with --backend cpu")
    except CudaUnavailable as exc:
        status.problem = str(exc)
    try:
        nvrtc = find_nvrtc(driver_version)
        status.nvrtc = f"{nvrtc.version[0]}.{nvrtc.version[1]} ({nvrtc.path})"
        unsupported = [d for d in status.devices if d.arch not in nvrtc.supported_archs()]
        if unsupported and status.problem is None:
            d = unsupported[0]
            status.problem = (f"NVRTC {status.nvrtc} cannot compile for {d.name} (sm_{d.arch}): it targets "
                              f"sm_{min(nvrtc.supported_archs())} and newer; use an NVRTC of CUDA 12 "
                              "(pip install 'edgekv[cuda]') or JetPack's")
    except EdgeKVError as exc:
        status.problem = status.problem or str(exc)
    return status


__all__ = ["CudaStatus", "CudaUnavailable", "DeviceInfo", "probe"]
