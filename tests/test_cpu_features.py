"""What edgekv reads about the CPU (kernels/cpu_features.py, system_info.cpu_info), on the
files an aarch64 Linux gives it: the kernel's AT_HWCAP in /proc/self/auxv and
/proc/cpuinfo, as on a Jetson Orin, and as under QEMU's user-mode emulation."""

from __future__ import annotations

import numpy as np

from edgekv.kernels.cpu_features import arm_features
from edgekv.system_info import cpu_info

JETSON_CPUINFO = """processor\t: 0
BogoMIPS\t: 62.50
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp uscat ilrcpc flagm paca pacg
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd42
CPU revision\t: 1
"""
X86_CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu avx2\n"


def auxv(tmp_path, hwcap: int | None):
    pairs = [(6, 4096)] + ([(16, hwcap)] if hwcap is not None else []) + [(0, 0)]  # AT_PAGESZ, AT_HWCAP, AT_NULL
    path = tmp_path / f"auxv-{hwcap}"
    path.write_bytes(np.array(pairs, np.uint64).tobytes())
    return str(path)


def test_hwcap_decides_the_dot_product(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(X86_CPUINFO)  # what QEMU user mode shows: the host's
    orin_hwcap = (1 << 20) | 0xFF  # HWCAP_ASIMDDP and the base bits
    assert arm_features(auxv(tmp_path, orin_hwcap), str(cpuinfo), True) == {"dotprod"}
    assert arm_features(auxv(tmp_path, 0xFF), str(cpuinfo), True) == frozenset()  # e.g. a Cortex-A72 (Pi 4)
    assert arm_features(auxv(tmp_path, orin_hwcap), str(cpuinfo), False) == frozenset()  # not on x86


def test_cpuinfo_features_when_auxv_is_unreadable(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(JETSON_CPUINFO)
    assert arm_features(str(tmp_path / "none"), str(cpuinfo), True) == {"dotprod"}
    cpuinfo.write_text(JETSON_CPUINFO.replace(" asimddp", ""))
    assert arm_features(str(tmp_path / "none2"), str(cpuinfo), True) == frozenset()


def test_cpu_names(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(JETSON_CPUINFO)
    assert cpu_info(str(path), aarch64=True) == "Cortex-A78AE"
    path.write_text(JETSON_CPUINFO.replace("0xd42", "0xabc"))
    assert cpu_info(str(path), aarch64=True) == "Arm CPU implementer 0x41 part 0xabc"
    path.write_text(X86_CPUINFO)
    assert cpu_info(str(path), aarch64=True) == "an Arm CPU that /proc/cpuinfo does not describe (emulated?)"
    assert cpu_info(str(path), aarch64=False) == "Intel(R) Xeon(R) Processor"
