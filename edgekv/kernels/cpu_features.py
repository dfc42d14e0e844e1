"""What the CPU this process runs on can do, in LLVM's feature names, without Numba.

Why a module of its own: config.py must know the AArch64 features before Numba is first
imported (see `numba_cpu_features`), and the kernels ask the same questions later.
What does not live here: any choice of kernel (backends/kernel_map.py).
"""

from __future__ import annotations

import functools
import platform

import llvmlite.binding as llvm
import numpy as np

IS_AARCH64 = platform.machine().lower() in ("aarch64", "arm64")


def host_has(feature: str) -> bool:
    """Whether the CPU this process runs on has an instruction-set feature (LLVM's name).

    On AArch64: "fma" and "f16c" (x86 names, kept so callers need not ask which ISA) are
    base ARMv8; "dotprod" (sdot/udot) comes from arm_features()."""
    if IS_AARCH64:
        return feature in ("fma", "f16c") or feature in arm_features()
    try:
        return bool(llvm.get_host_cpu_features().get(feature, False))
    except RuntimeError:  # features unknown: stay portable
        return False


_AT_HWCAP = 16  # auxiliary vector key of the kernel's hardware-capability word
_HWCAP_ASIMDDP = 1 << 20  # AArch64 HWCAP bit of the int8 dot-product instructions


@functools.lru_cache(maxsize=None)
def arm_features(auxv: str = "/proc/self/auxv", cpuinfo: str = "/proc/cpuinfo", aarch64: bool = IS_AARCH64) -> frozenset:
    """LLVM's names of the optional AArch64 features this CPU has that kernels use.

    Read, in order, from the kernel's AT_HWCAP word (/proc/self/auxv: what the kernel,
    or QEMU's user-mode emulation, says the CPU has), /proc/cpuinfo's "Features" line
    (`asimddp`) and LLVM's host features. Empty on other CPUs."""
    if not aarch64:
        return frozenset()
    try:
        with open(auxv, "rb") as f:
            words = np.frombuffer(f.read(), dtype=np.uint64)
        pairs = words[: words.size // 2 * 2].reshape(-1, 2)
        hwcap = next((int(v) for k, v in pairs if k == _AT_HWCAP), None)
        if hwcap is not None:
            return frozenset({"dotprod"}) if hwcap & _HWCAP_ASIMDDP else frozenset()
    except OSError:
        pass
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Features"):
                    return frozenset({"dotprod"}) if "asimddp" in line.split(":", 1)[-1].split() else frozenset()
    except OSError:
        pass
    try:
        return frozenset({"dotprod"}) if llvm.get_host_cpu_features().get("dotprod", False) else frozenset()
    except RuntimeError:
        return frozenset()


def host_cpu_name() -> str:
    """LLVM's name for this CPU (e.g. znver4, cortex-a78ae); the kernels are compiled for it."""
    try:
        return llvm.get_host_cpu_name() or platform.machine()
    except RuntimeError:
        return platform.machine()


def numba_cpu_features() -> str | None:
    """The feature string Numba must compile for when LLVM cannot see what the CPU has,
    else None (Numba asks LLVM itself).

    LLVM reads AArch64 features from /proc/cpuinfo, which QEMU's user-mode emulation
    (and some container setups) leave showing another CPU, while the kernel's AT_HWCAP
    still says `sdot` exists. Compiling the dot-product kernels without "+dotprod" would
    abort the process in LLVM's instruction selection, so the features go to Numba."""
    if not IS_AARCH64 or "dotprod" not in arm_features():
        return None
    try:
        features = llvm.get_host_cpu_features()
    except RuntimeError:
        features = None
    if features is not None and features.get("dotprod", False):
        return None
    extra = ["+neon", "+fp-armv8", "+dotprod"]
    return ",".join(([features.flatten()] if features is not None and len(features) else []) + extra)
