"""How much memory a new allocation can really get, and where that figure came from.

Why: the `auto` context plan spends a share of the free memory on the KV cache. On a
Jetson the GPU and the CPU share one RAM, so what is free is what the kernel says is
available now (MemAvailable: free pages plus the reclaimable caches), not the physical
total; in a container (Docker, Kubernetes, systemd slices) the cgroup's limit can be far
below that. The budget takes the smallest of the figures that apply and says which.

Figures, in order of preference when equal:
- "cgroup v2 memory.max" / "cgroup v1 memory.limit_in_bytes": the limit of this process's
  cgroup or of any cgroup above it, minus what the cgroup uses now, not counting its
  inactive file cache (reclaimable, as `docker stats` counts it);
- "MemAvailable (/proc/meminfo)";
- "sysconf free pages": free physical pages, where /proc/meminfo cannot be read.
Also the byte sizes people type and read (`parse_size`: '2G'; `format_bytes`: '1.50 GiB').
What does not live here: the budget's arithmetic (kv/plan.py: default_mem_budget).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import EdgeKVError


@dataclass(frozen=True)
class FreeMemory:
    bytes: int
    source: str  # which figure, for `edgekv mem` and the logs

    def __str__(self) -> str:
        return f"{format_bytes(self.bytes)} ({self.source})"


def free_memory(proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> FreeMemory | None:
    """The memory available to a new allocation of this process, from the smallest figure
    that applies (see the module docstring); None when none can be read."""
    figures = [f for f in (_cgroup_headroom(proc, cgroup_root), _mem_available(proc)) if f is not None]
    if figures:
        return min(figures, key=lambda f: f.bytes)
    try:
        return FreeMemory(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "sysconf free pages")
    except (ValueError, OSError, AttributeError):
        return None


def resident_bytes(proc: str = "/proc") -> int:
    """This process's resident memory now (VmRSS), 0 where it cannot be read."""
    try:
        with open(f"{proc}/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _mem_available(proc: str) -> FreeMemory | None:
    try:
        with open(f"{proc}/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return FreeMemory(int(line.split()[1]) * 1024, "MemAvailable (/proc/meminfo)")  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_headroom(proc: str, root: str) -> FreeMemory | None:
    """The tightest cgroup memory limit over this process's cgroup and its ancestors,
    minus that cgroup's current use; None without a limit (or without cgroups)."""
    try:
        lines = Path(f"{proc}/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    best = None
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if controllers == "":  # cgroup v2 (the unified hierarchy)
            base, limit_file, usage_file, name = Path(root), "memory.max", "memory.current", "cgroup v2 memory.max"
            if not (base / "cgroup.controllers").exists() and (base / "unified").is_dir():
                base = base / "unified"  # hybrid layout: v2 mounted beside the v1 controllers
        elif "memory" in controllers.split(","):  # cgroup v1, the memory controller
            base, limit_file, usage_file = Path(root) / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
            name = "cgroup v1 memory.limit_in_bytes"
        else:
            continue
        for folder in _with_ancestors(base, path):
            room = _headroom(folder, limit_file, usage_file, name)
            if room is not None and (best is None or room.bytes < best.bytes):
                best = room
    return best


def _with_ancestors(base: Path, path: str) -> list[Path]:
    # the cgroup's folder and every one above it, up to the mount; in a container the
    # path seen from inside may not exist under the mount: then the mount itself is ours
    parts = [p for p in path.strip("/").split("/") if p]
    folders = [base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]
    return [f for f in folders if f.is_dir()]


def _headroom(folder: Path, limit_file: str, usage_file: str, name: str) -> FreeMemory | None:
    try:
        limit_text = (folder / limit_file).read_text().strip()
        if limit_text == "max":
            return None
        limit = int(limit_text)
        if limit >= 1 << 60:  # cgroup v1's "no limit" (PAGE_COUNTER_MAX pages)
            return None
        usage = int((folder / usage_file).read_text().strip())
    except (OSError, ValueError):
        return None
    usage -= _inactive_file(folder)
    return FreeMemory(max(0, limit - max(0, usage)), f"{name} {limit:,} bytes minus use ({folder})")


def _inactive_file(folder: Path) -> int:
    # v2: inactive_file; v1: total_inactive_file (the hierarchy's, as usage_in_bytes counts)
    try:
        stat = dict(line.split(" ", 1) for line in (folder / "memory.stat").read_text().splitlines() if " " in line)
        return int(stat.get("total_inactive_file", stat.get("inactive_file", 0)))
    except (OSError, ValueError):
        return 0


def format_bytes(n: int | float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """'512M', '2G', '1.5g', '4096', '2GiB' -> bytes (binary multiples: 1K = 1024)."""
    m = _SIZE.match(str(text))
    if not m:
        raise EdgeKVError(f"memory size {text!r}: expected a number with an optional K, M, G or T suffix "
                          f"(e.g. 512M, 2G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
