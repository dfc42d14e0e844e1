"""File trees of boards, to mount as EDGEKV_SYSFS_ROOT.

Not captured from real boards (none was at hand): written from where each file's layout is
documented, with values in the ranges those documents give. NVIDIA's Jetson Linux developer
guide (r36.4 for the Orin Nano, r35.4 for the AGX Orin): the device tree's model and
compatible strings (p3768-0000 carrier + p3767-0005 module for the Orin Nano developer kit,
p3737-0000 + p3701-0005 for the AGX Orin 64GB), /etc/nv_tegra_release's line, nvpmodel's
/etc/nvpmodel.conf (POWER_MODEL ID/NAME, PM_CONFIG DEFAULT) and the mode it records in
/var/lib/nvpmodel/status, the INA3221 rails (Orin Nano: VDD_IN, VDD_CPU_GPU_CV, VDD_SOC on
1-0040; AGX Orin: VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0 on 1-0040 and VDDQ_VDD2_1V8AO on 1-0041),
the GPU's devfreq node 17000000.ga10b, BPMP's EMC clock in debugfs, the thermal zones (cpu-,
gpu-, soc0-, tj-thermal). The kernel's ABI documents: cpufreq (kHz), devfreq (Hz), hwmon
(inN_input mV, currN_input mA), thermal (millidegrees, trip_point_N_type/temp), powercap's
RAPL (energy_uj, max_energy_range_uj).
"""

from __future__ import annotations

from pathlib import Path


def write(root: Path, files: dict[str, str]) -> Path:
    """Writes the files; a value LINK + path makes a symbolic link to that path (in the tree)."""
    for name, text in files.items():
        target = root / name.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if text.startswith(LINK):
            target.symlink_to(root / text[len(LINK):].lstrip("/"), target_is_directory=True)
        else:
            target.write_text(text)
    return root


LINK = "->"


def _cpufreq(policies: dict[int, tuple[int, int, int]]) -> dict[str, str]:
    """policy index -> (cur, min, max) in kHz."""
    files = {}
    for n, (cur, low, high) in policies.items():
        base = f"/sys/devices/system/cpu/cpufreq/policy{n}/"
        files.update({base + "scaling_cur_freq": f"{cur}\n", base + "scaling_min_freq": f"{low}\n",
                      base + "scaling_max_freq": f"{high}\n", base + "cpuinfo_max_freq": f"{high}\n"})
    return files


def _ina3221(device: str, hwmon: int, channels: list[tuple[str, int, int]]) -> dict[str, str]:
    """channels: (label, mV, mA); /sys/class/hwmon/hwmonN links to the device's directory."""
    base = f"/sys/bus/i2c/drivers/ina3221/{device}/hwmon/hwmon{hwmon}"
    files = {base + "/name": "ina3221\n"}
    for n, (label, mv, ma) in enumerate(channels, 1):
        files.update({base + f"/in{n}_label": f"{label}\n", base + f"/in{n}_input": f"{mv}\n",
                      base + f"/curr{n}_input": f"{ma}\n"})
    files[f"/sys/class/hwmon/hwmon{hwmon}"] = LINK + base
    return files


def _zone(n: int, name: str, millic: int, trips: list[tuple[str, int]]) -> dict[str, str]:
    base = f"/sys/class/thermal/thermal_zone{n}/"
    files = {base + "type": f"{name}\n", base + "temp": f"{millic}\n"}
    for i, (kind, temp) in enumerate(trips):
        files.update({base + f"trip_point_{i}_type": f"{kind}\n", base + f"trip_point_{i}_temp": f"{temp}\n"})
    return files


ORIN_NANO_CONF = """< PARAM TYPE=FILE NAME=CPU_ONLINE >
CORE_0 /sys/devices/system/cpu/cpu0/online
< POWER_MODEL ID=0 NAME=15W >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=1 NAME=25W >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=2 NAME=MAXN_SUPER >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=3 NAME=7W >
CPU_ONLINE CORE_0 1
< PM_CONFIG DEFAULT=2 >
"""


def orin_nano(root: Path, status: bool = True) -> Path:
    """An Orin Nano 8GB developer kit (Super) on JetPack 6.2: 25W mode, clocks not locked, cool."""
    files = {
        "/proc/device-tree/model": "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super\x00",
        "/proc/device-tree/compatible": "nvidia,p3768-0000+p3767-0005-super\x00nvidia,p3767-0005\x00nvidia,tegra234\x00",
        "/etc/nv_tegra_release": "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, "
                                 "DATE: Wed Jan  8 01:49:37 UTC 2025\n",
        "/var/lib/dpkg/status": "Package: nvidia-l4t-bootloader\nStatus: install ok installed\nVersion: 36.4.3-20250107174145\n\n"
                                "Package: nvidia-l4t-core\nStatus: install ok installed\nPriority: standard\n"
                                "Architecture: arm64\nVersion: 36.4.3-20250107174145\n\n",
        "/etc/nvpmodel.conf": ORIN_NANO_CONF,
        "/sys/class/devfreq/17000000.ga10b/cur_freq": "306000000\n",
        "/sys/class/devfreq/17000000.ga10b/min_freq": "306000000\n",
        "/sys/class/devfreq/17000000.ga10b/max_freq": "1020000000\n",
        **_cpufreq({0: (1344000, 729600, 1728000), 4: (729600, 729600, 1728000)}),
        **_ina3221("1-0040", 1, [("VDD_IN", 5080, 1200), ("VDD_CPU_GPU_CV", 5072, 310), ("VDD_SOC", 5072, 420)]),
        **_zone(0, "cpu-thermal", 48500, [("passive", 99000), ("critical", 105000)]),
        **_zone(1, "gpu-thermal", 47000, [("passive", 99000)]),
        **_zone(2, "soc0-thermal", 47800, []),
        **_zone(3, "tj-thermal", 49000, [("passive", 99000)]),
        **_zone(4, "soc1-thermal", -256000, []),  # a disabled sensor
    }
    if status:
        files["/var/lib/nvpmodel/status"] = "pmode:0001 fmode:quiet\n"
    return write(root, files)


def agx_orin(root: Path) -> Path:
    """An AGX Orin 64GB developer kit on JetPack 5.1.2: MAXN, jetson_clocks on, throttling."""
    return write(root, {
        "/proc/device-tree/model": "Jetson AGX Orin Developer Kit\x00",
        "/proc/device-tree/compatible": "nvidia,p3737-0000+p3701-0005\x00nvidia,p3701-0005\x00nvidia,tegra234\x00",
        "/etc/nv_tegra_release": "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, "
                                 "DATE: Tue Aug  1 19:57:35 UTC 2023\n",
        "/etc/nvpmodel.conf": "< POWER_MODEL ID=0 NAME=MAXN >\n< POWER_MODEL ID=1 NAME=MODE_15W >\n"
                              "< POWER_MODEL ID=2 NAME=MODE_30W >\n< POWER_MODEL ID=3 NAME=MODE_50W >\n< PM_CONFIG DEFAULT=3 >\n",
        "/var/lib/nvpmodel/status": "pmode:0000 fmode:cool\n",
        "/sys/class/devfreq/17000000.ga10b/cur_freq": "1300500000\n",
        "/sys/class/devfreq/17000000.ga10b/min_freq": "1300500000\n",
        "/sys/class/devfreq/17000000.ga10b/max_freq": "1300500000\n",
        "/sys/kernel/debug/bpmp/debug/clk/emc/rate": "3199000000\n",
        "/sys/kernel/debug/bpmp/debug/clk/emc/min_rate": "3199000000\n",
        "/sys/kernel/debug/bpmp/debug/clk/emc/max_rate": "3199000000\n",
        **_cpufreq({0: (2201600, 2201600, 2201600), 4: (2201600, 2201600, 2201600), 8: (2201600, 2201600, 2201600)}),
        **_ina3221("1-0040", 1, [("VDD_GPU_SOC", 5088, 3100), ("VDD_CPU_CV", 5088, 1900), ("VIN_SYS_5V0", 5056, 900)]),
        **_ina3221("1-0041", 2, [("NC", 0, 0), ("VDDQ_VDD2_1V8AO", 5072, 300), ("NC", 0, 0)]),
        **_zone(0, "cpu-thermal", 97200, [("passive", 99000), ("critical", 105000)]),
        **_zone(1, "gpu-thermal", 96900, [("passive", 99000)]),
        **_zone(2, "tj-thermal", 99500, [("active", 80000), ("passive", 99000), ("critical", 104500)]),
    })


def x86_with_rapl(root: Path, energy_uj: int = 9_500_000, range_uj: int = 10_000_000) -> Path:
    """A PC: no Jetson files, one package's RAPL counter (and its core subzone, not a package)."""
    return write(root, {
        "/sys/class/powercap/intel-rapl:0/name": "package-0\n",
        "/sys/class/powercap/intel-rapl:0/energy_uj": f"{energy_uj}\n",
        "/sys/class/powercap/intel-rapl:0/max_energy_range_uj": f"{range_uj}\n",
        "/sys/class/powercap/intel-rapl:0:0/name": "core\n",
        "/sys/class/powercap/intel-rapl:0:0/energy_uj": "123\n",
    })
