"""A memory-limited cgroup for one child process: how the tests put a command on an 8 GB
device's budget.

`MemoryCgroup(limit)` makes a cgroup under this process's own memory cgroup (cgroup v2's
memory.max where the unified hierarchy has the memory controller, else v1's
memory.limit_in_bytes, as kv/memory.py reads them), `run(cmd)` starts a child inside it
(it joins before exec) and returns its exit status, output, ru_maxrss (which starts at the
parent's peak: a child that must know its own reports VmHWM itself) and whether the
kernel's OOM killer struck; `close()` removes the cgroup.
`unavailable()` says why no cgroup can be made here (not root, no memory controller).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


@dataclass
class LimitedRun:
    returncode: int
    stdout: str
    stderr: str
    max_rss: int  # bytes, ru_maxrss: at least the parent's peak (it survives fork and exec)
    oom_killed: bool  # the cgroup's OOM killer struck


def _own() -> tuple[Path, str] | None:
    # (this process's cgroup folder, "v1" / "v2") in the hierarchy with the memory controller
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            base = ROOT if (ROOT / "cgroup.controllers").exists() else ROOT / "unified"
            listed = base / "cgroup.controllers"
            if listed.exists() and "memory" in listed.read_text().split():
                return base / path.strip("/"), "v2"
        elif "memory" in controllers.split(","):
            return ROOT / "memory" / path.strip("/"), "v1"
    return None


def unavailable() -> str | None:
    """Why a memory cgroup cannot be made here, or None."""
    if os.geteuid() != 0:
        return "making a cgroup needs root"
    try:
        own = _own()
    except OSError as exc:
        return f"cannot read this process's cgroups: {exc}"
    if own is None:
        return "no cgroup hierarchy here has the memory controller"
    folder, _ = own
    if not os.access(folder, os.W_OK):
        return f"{folder} is not writable"
    return None


class MemoryCgroup:
    def __init__(self, limit: int):
        folder, self.version = _own()
        self.path = folder / f"edgekv-test-{uuid.uuid4().hex[:8]}"
        self.path.mkdir()
        if self.version == "v2":
            (self.path / "memory.max").write_text(str(limit))
            if (self.path / "memory.swap.max").exists():
                (self.path / "memory.swap.max").write_text("0")
        else:
            (self.path / "memory.limit_in_bytes").write_text(str(limit))

    def run(self, cmd: list[str], timeout: float = 300, env: dict | None = None) -> LimitedRun:
        procs = str(self.path / "cgroup.procs")

        def join():  # in the child, before exec
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                 preexec_fn=join)
        outputs = {}
        readers = [threading.Thread(target=lambda k=k, f=f: outputs.__setitem__(k, f.read()))
                   for k, f in (("out", child.stdout), ("err", child.stderr))]
        for r in readers:
            r.start()
        timer = threading.Timer(timeout, child.kill)
        timer.start()
        try:  # wait4, not Popen.wait: the child's own rusage (its peak resident memory)
            _, status, usage = os.wait4(child.pid, 0)
        finally:
            timer.cancel()
        child.returncode = os.waitstatus_to_exitcode(status)
        for r in readers:
            r.join()
        return LimitedRun(child.returncode, outputs["out"], outputs["err"], usage.ru_maxrss * 1024,
                          self._oom_killed())

    def _oom_killed(self) -> bool:
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and int(value) > 0:
                return True
        return False

    def close(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:  # the child's pages are still being uncharged
                time.sleep(0.1)
