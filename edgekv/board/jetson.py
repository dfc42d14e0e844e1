"""A Jetson's facts as its owners look them up: module and carrier, L4T and JetPack, the
nvpmodel power mode, CPU/GPU/EMC clocks and whether jetson_clocks locked them, temperatures
and thermal throttling.

Where each file's layout comes from (all read through sysfs.py's root):
  - /proc/device-tree/model and /proc/device-tree/compatible: NUL-terminated strings; the
    compatible list's first entry is "nvidia,<carrier>+<module>" (e.g. "nvidia,p3768-0000+
    p3767-0005"), the part numbers of NVIDIA's Jetson Linux developer guide ("Jetson modules
    and configurations");
  - /etc/nv_tegra_release: "# R36 (release), REVISION: 4.3, GCID: ..., BOARD: generic, ...";
    /var/lib/dpkg/status's nvidia-l4t-core stanza has the full version ("36.4.3-2025...");
  - /etc/nvpmodel.conf: "< POWER_MODEL ID=0 NAME=15W >" per mode and "< PM_CONFIG DEFAULT=2 >";
    /var/lib/nvpmodel/status: "pmode:0000 ...", the mode nvpmodel last set (the guide's
    "Power Management for Jetson ... Devices", nvpmodel);
  - clocks: cpufreq's policy*/scaling_{cur,min,max}_freq and cpuinfo_max_freq in kHz (the
    kernel's cpufreq ABI), the GPU's devfreq device (/sys/class/devfreq/*.ga10b on Orin,
    *.gv11b on Xavier) cur_freq/min_freq/max_freq in Hz (the devfreq ABI), the EMC clock in
    BPMP's debugfs (/sys/kernel/debug/bpmp/debug/clk/emc/{rate,min_rate,max_rate}, Hz; root
    only). jetson_clocks pins each minimum to its maximum: that is what "locked" means here;
  - /sys/class/thermal/thermal_zone*/{type,temp,trip_point_*_{type,temp}}: millidegrees (the
    thermal sysfs ABI); a zone at or above its lowest passive or hot trip point is throttling.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import sysfs

# L4T release -> JetPack (NVIDIA's JetPack archive)
JETPACK = {"36.4.4": "6.2.1", "36.4.3": "6.2", "36.4.0": "6.1", "36.3.0": "6.0", "36.2.0": "6.0 DP",
           "35.6.1": "5.1.5", "35.6.0": "5.1.4", "35.5.0": "5.1.3", "35.4.1": "5.1.2", "35.3.1": "5.1.1",
           "35.2.1": "5.1", "35.1.0": "5.0.2"}
# module part numbers (the developer guide's "Jetson modules and configurations")
MODULES = {"p3767-0000": "Orin NX 16GB", "p3767-0001": "Orin NX 8GB", "p3767-0003": "Orin Nano 8GB",
           "p3767-0004": "Orin Nano 4GB", "p3767-0005": "Orin Nano 8GB (developer kit)",
           "p3701-0000": "AGX Orin 32GB", "p3701-0004": "AGX Orin 32GB", "p3701-0005": "AGX Orin 64GB",
           "p3701-0008": "AGX Orin Industrial 64GB", "p3668-0000": "Xavier NX", "p3668-0001": "Xavier NX",
           "p2888-0001": "AGX Xavier 16GB", "p2888-0004": "AGX Xavier 32GB"}
GPU_DEVFREQ = ("ga10b", "gv11b", "gp10b")


@dataclass
class Clock:
    name: str
    cur_mhz: float | None = None
    min_mhz: float | None = None
    max_mhz: float | None = None
    pinned: bool | None = None  # where several domains make it up: whether each one's min is its max

    @property
    def locked(self) -> bool | None:
        if self.pinned is not None:
            return self.pinned
        if self.min_mhz is None or self.max_mhz is None:
            return None
        return self.min_mhz == self.max_mhz

    def describe(self) -> str:
        mhz = (lambda v: "?" if v is None else f"{v:.0f}")
        return f"{self.name} {mhz(self.cur_mhz)} MHz [min {mhz(self.min_mhz)}, max {mhz(self.max_mhz)}]"


@dataclass
class Zone:
    name: str
    celsius: float
    trip_celsius: float | None = None  # the lowest passive or hot trip point

    @property
    def throttling(self) -> bool:
        return self.trip_celsius is not None and self.celsius >= self.trip_celsius


@dataclass
class Board:
    model: str | None = None
    compatible: list[str] = field(default_factory=list)
    l4t: str | None = None
    power_mode: str | None = None
    power_mode_id: int | None = None
    default_mode: str | None = None
    clocks: list[Clock] = field(default_factory=list)
    zones: list[Zone] = field(default_factory=list)

    @property
    def module(self) -> str | None:
        """The module's part number ("p3767-0005"): after the "+" of the compatible list's first entry."""
        m = re.search(r"\+(p\d{4}-\d{4})", self.compatible[0] if self.compatible else "")
        return m.group(1) if m else None

    @property
    def carrier(self) -> str | None:
        m = re.search(r",(p\d{4}-\d{4})[^+,]*\+", self.compatible[0] if self.compatible else "")
        return m.group(1) if m else None

    @property
    def jetpack(self) -> str | None:
        return JETPACK.get(self.l4t or "")

    @property
    def clocks_locked(self) -> bool | None:
        """Whether every clock known is pinned (jetson_clocks); None when the CPU's or the
        GPU's settings could not be read."""
        states = {c.name: c.locked for c in self.clocks}
        if states.get("cpu") is None or states.get("gpu") is None:
            return None
        return all(v for v in states.values() if v is not None)

    @property
    def throttling(self) -> list[Zone]:
        return [z for z in self.zones if z.throttling]


def read_board() -> Board | None:
    """The Jetson's facts, or None when this is not a Jetson (no Tegra device tree and no L4T)."""
    compatible = [c for c in (sysfs.read_text("/proc/device-tree/compatible") or "").split("\x00") if c]
    l4t = _l4t()
    if not any("tegra" in c for c in compatible) and l4t is None:
        return None
    board = Board(model=sysfs.read_text("/proc/device-tree/model"), compatible=compatible, l4t=l4t)
    board.power_mode_id, board.power_mode, board.default_mode = _power_mode()
    board.clocks = [c for c in (_cpu_clock(), _gpu_clock(), _emc_clock()) if c is not None]
    board.zones = _zones()
    return board


def _l4t() -> str | None:
    """The L4T release: nvidia-l4t-core's package version, else /etc/nv_tegra_release's."""
    status = sysfs.read_text("/var/lib/dpkg/status") or ""
    m = re.search(r"^Package: nvidia-l4t-core\n(?:[^\n]+\n)*?Version: (\d+\.\d+\.\d+)", status, re.M)
    if m:
        return m.group(1)
    release = sysfs.read_text("/etc/nv_tegra_release") or ""
    m = re.search(r"R(\d+) \(release\), REVISION: (\d+)\.(\d+)", release)
    return f"{m.group(1)}.{m.group(2)}.{m.group(3)}" if m else None


def _power_mode() -> tuple[int | None, str | None, str | None]:
    """(current mode id, its name, the default mode as "NAME (id N)") from nvpmodel's files."""
    conf = sysfs.read_text("/etc/nvpmodel.conf") or ""
    names = {int(i): n for i, n in re.findall(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)", conf)}
    default = re.search(r"<\s*PM_CONFIG\s+DEFAULT=(\d+)", conf)
    default_text = None if default is None else f"{names.get(int(default.group(1)), '?')} (id {default.group(1)})"
    m = re.search(r"pmode:(\d+)", sysfs.read_text("/var/lib/nvpmodel/status") or "")
    current = int(m.group(1)) if m else None
    return current, names.get(current) if current is not None else None, default_text


def _cpu_clock() -> Clock | None:
    """The CPU clusters' cpufreq settings (kHz): the highest current clock, the lowest of the
    minimums and the highest of the maximums; locked when every cluster's minimum is its maximum."""
    policies = sysfs.glob("/sys/devices/system/cpu/cpufreq/policy*")
    cur, low, high = ([sysfs.read_int(p / name) for p in policies]
                      for name in ("scaling_cur_freq", "scaling_min_freq", "scaling_max_freq"))
    if not policies or None in low or None in high:
        return None
    return Clock("cpu", _mhz(max((c for c in cur if c is not None), default=None), 1e3), min(low) / 1e3,
                 max(high) / 1e3, pinned=all(a == b for a, b in zip(low, high)))


def _gpu_clock() -> Clock | None:
    for device in sysfs.glob("/sys/class/devfreq/*"):
        if device.name.endswith(GPU_DEVFREQ):
            return Clock("gpu", *(_mhz(sysfs.read_int(device / n), 1e6) for n in ("cur_freq", "min_freq", "max_freq")))
    return None


def _emc_clock() -> Clock | None:
    base = "/sys/kernel/debug/bpmp/debug/clk/emc/"
    rate = sysfs.read_int(base + "rate")
    if rate is None:
        return None
    return Clock("emc", rate / 1e6, _mhz(sysfs.read_int(base + "min_rate"), 1e6), _mhz(sysfs.read_int(base + "max_rate"), 1e6))


def _mhz(value: int | None, per_mhz: float) -> float | None:
    return None if value is None else value / per_mhz


def _zones() -> list[Zone]:
    zones = []
    for zone in sysfs.glob("/sys/class/thermal/thermal_zone*"):
        name, temp = sysfs.read_text(zone / "type"), sysfs.read_int(zone / "temp")
        if name is None or temp is None or temp <= -40000:  # an unreadable or disabled sensor
            continue
        trips = [sysfs.read_int(zone / f"trip_point_{i}_temp")
                 for i in range(16) if sysfs.read_text(zone / f"trip_point_{i}_type") in ("passive", "hot")]
        trips = [t for t in trips if t is not None and t > 0]
        zones.append(Zone(name, temp / 1000, min(trips) / 1000 if trips else None))
    return zones


def info_lines(board: Board) -> dict[str, str]:
    """`edgekv info`'s lines for a Jetson: board, jetpack, power mode, clocks, thermal."""
    lines = {}
    module = board.module
    parts = [f"module {module}" + (f": {MODULES[module]}" if module in MODULES else "") if module else "",
             f"carrier {board.carrier}" if board.carrier else ""]
    detail = ", ".join(p for p in parts if p)
    lines["board"] = (board.model or "a Jetson") + (f" ({detail})" if detail else "")
    if board.l4t:
        lines["jetpack"] = f"{board.jetpack or 'unknown'} (L4T {board.l4t})"
    if board.power_mode is not None or board.default_mode is not None:
        lines["power mode"] = (f"{board.power_mode} (id {board.power_mode_id})" if board.power_mode is not None
                               else f"unknown (nvpmodel's status is not readable; its default is {board.default_mode})")
    if board.clocks:
        state = {True: "locked (jetson_clocks)", False: "not locked: run `sudo jetson_clocks` for repeatable "
                 "figures", None: "lock state unknown"}[board.clocks_locked]
        lines["clocks"] = ", ".join(c.describe() for c in board.clocks) + f"; {state}"
    if board.zones:
        hot = board.throttling
        lines["thermal"] = ", ".join(f"{z.name} {z.celsius:.1f} C" for z in board.zones) + (
            "; throttling: " + ", ".join(f"{z.name} at {z.celsius:.1f} C >= {z.trip_celsius:.1f} C" for z in hot)
            if hot else "")
    return lines


def memory_lines() -> dict[str, str]:
    """A Jetson's shared RAM as `edgekv mem` shows it: the board's total, what is available,
    and what other processes hold (total less available less this process's resident set);
    the GPU's clients where NvMap's debugfs list is readable (root only). /proc/meminfo and
    /proc/self/status as the kernel's proc(5) documents them (kB)."""
    meminfo = dict(re.findall(r"^(\w+):\s+(\d+) kB", sysfs.read_text("/proc/meminfo") or "", re.M))
    if "MemTotal" not in meminfo or "MemAvailable" not in meminfo:
        return {}
    total, available = int(meminfo["MemTotal"]) * 1024, int(meminfo["MemAvailable"]) * 1024
    rss = re.search(r"^VmRSS:\s+(\d+) kB", sysfs.read_text("/proc/self/status") or "", re.M)
    own = int(rss.group(1)) * 1024 if rss else 0
    gib = 2 ** 30
    lines = {"board memory": f"{total / gib:.1f} GiB shared by the CPU and the GPU, {available / gib:.1f} GiB available; "
                             f"other processes hold {max(total - available - own, 0) / gib:.1f} GiB"}
    clients = sysfs.read_text("/sys/kernel/debug/nvmap/iovmm/clients")
    if clients:  # "CLIENT PROCESS PID SIZE" rows, SIZE like 123456K
        rows = re.findall(r"^\s*\S+\s+(\S+)\s+(\d+)\s+(\d+)K", clients, re.M)
        held = sorted(((int(k) * 1024, name, pid) for name, pid, k in rows), reverse=True)
        if held:
            lines["gpu memory"] = ", ".join(f"{name} (pid {pid}) {n / 2**20:.0f} MiB" for n, name, pid in held[:5])
    return lines
