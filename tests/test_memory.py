"""The free-memory figure the `auto` context budget comes from (edgekv/kv/memory.py), on fake
/proc and cgroup trees: MemAvailable, cgroup v2 and v1 limits of the process's cgroup and
its ancestors, the container case, and `edgekv mem` saying which figure it used."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekv.kv import plan as context
from edgekv.kv import memory
from edgekv.kv.fit import RUNTIME_BYTES
from edgekv.cli import main
from edgekv.gguf.reader import GGUFFile

GiB = 1 << 30


def fake_proc(tmp_path: Path, avail_kb: int | None, cgroup: str) -> str:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    if avail_kb is not None:
        (proc / "meminfo").write_text(f"MemTotal:       65536000 kB\nMemFree:  1000 kB\nMemAvailable:   {avail_kb} kB\n")
    (proc / "self" / "cgroup").write_text(cgroup)
    return str(proc)


def cgroup_dir(root: Path, rel: str, **files: str) -> None:
    folder = root / rel
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text)


def test_mem_available_when_no_cgroup_limits(tmp_path):
    proc = fake_proc(tmp_path, 8 * 1024 * 1024, "0::/user.slice\n")
    root = tmp_path / "cg"
    cgroup_dir(root, "", cgroup_controllers="memory\n")
    cgroup_dir(root, "user.slice", memory_max="max\n", memory_current="123\n")
    free = memory.free_memory(proc, str(root))
    assert free == memory.FreeMemory(8 * GiB, "MemAvailable (/proc/meminfo)")


def test_a_cgroup_v2_limit_below_mem_available_wins(tmp_path):
    proc = fake_proc(tmp_path, 16 * 1024 * 1024, "0::/docker/abc\n")
    root = tmp_path / "cg"
    cgroup_dir(root, "", cgroup_controllers="memory\n")
    # the container's own limit is loose; its parent's (2 GiB) binds; inactive file cache is reclaimable
    cgroup_dir(root, "docker/abc", memory_max=f"{8 * GiB}\n", memory_current=f"{GiB}\n",
               memory_stat=f"anon 1\ninactive_file {256 << 20}\n")
    cgroup_dir(root, "docker", memory_max=f"{2 * GiB}\n", memory_current=f"{GiB + (512 << 20)}\n",
               memory_stat="inactive_file 0\n")
    free = memory.free_memory(proc, str(root))
    assert free.bytes == 512 << 20
    assert free.source.startswith("cgroup v2 memory.max 2,147,483,648 bytes minus use") and "docker)" in free.source


def test_a_cgroup_v1_limit_and_a_container_path_that_is_not_mounted(tmp_path):
    # v1 memory controller; inside a container the path in /proc/self/cgroup is the host's
    proc = fake_proc(tmp_path, 16 * 1024 * 1024, "4:memory:/kubepods/pod1/c1\n1:cpu:/\n")
    root = tmp_path / "cg"
    cgroup_dir(root, "memory", memory_limit_in_bytes=f"{3 * GiB}\n", memory_usage_in_bytes=f"{GiB}\n",
               memory_stat=f"inactive_file 5\ntotal_inactive_file {GiB}\n")
    free = memory.free_memory(proc, str(root))
    assert free.bytes == 3 * GiB and free.source.startswith("cgroup v1 memory.limit_in_bytes")
    # v1's "no limit" is a huge number, not a limit
    cgroup_dir(root, "memory", memory_limit_in_bytes="9223372036854771712\n")
    assert memory.free_memory(proc, str(root)).source == "MemAvailable (/proc/meminfo)"


def test_a_cgroup_over_its_limit_has_no_room(tmp_path):
    proc = fake_proc(tmp_path, 16 * 1024 * 1024, "0::/\n")
    root = tmp_path / "cg"
    cgroup_dir(root, "", cgroup_controllers="memory\n", memory_max=f"{GiB}\n", memory_current=f"{2 * GiB}\n")
    assert memory.free_memory(proc, str(root)).bytes == 0


def test_nothing_readable_falls_back_to_sysconf(tmp_path):
    proc = fake_proc(tmp_path, None, "")
    free = memory.free_memory(proc, str(tmp_path / "none"))
    assert free.source == "sysconf free pages" and free.bytes > 0


def test_this_machine_has_a_figure():
    free = memory.free_memory()
    assert free.bytes > 0 and context.available_memory() == free.bytes


@pytest.mark.slow
def test_edgekv_mem_says_which_figure_the_budget_came_from(capsys, smollm2_path, monkeypatch):
    monkeypatch.setattr("edgekv.kv.memory.free_memory", lambda: memory.FreeMemory(4 * GiB, "cgroup v2 memory.max (test)"))
    assert main(["mem", "-m", str(smollm2_path), "-c", "auto"]) == 0
    out = capsys.readouterr().out
    weights = context.weight_bytes(GGUFFile(smollm2_path))
    assert "budget from:     half of 4.00 GiB (cgroup v2 memory.max (test)) less the weights and the runtime" in out
    budget = int(out.split("KV budget:")[1].split("bytes")[0].replace(",", ""))
    assert budget == (4 * GiB - weights - RUNTIME_BYTES) // 2
    assert main(["mem", "-m", str(smollm2_path), "--mem-budget", "1G"]) == 0
    assert "budget from:     --mem-budget" in capsys.readouterr().out
