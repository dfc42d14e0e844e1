"""A model under a memory limit (issue 43 item 5): an 8 GB Jetson leaves a process about
6 GiB, a container less. In a cgroup with a memory limit (tests/helpers/cgroup.py), a
model that fits loads, plans its context and generates with no OOM kill, and its peak
resident memory is what `edgekv mem` predicts within 10%; one that cannot fit is refused
before its weights are read, with what would fit. Here on the Qwen2.5-0.5B twin (the
Llama-3.1-8B twin under 6 GiB and 4 GiB: the issue's note, by hand).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from edgekv.kv.fit import MIN_CONTEXT, RUNTIME_BYTES, ModelTooLargeError, check_fits, minimum_bytes
from edgekv.kv.memory import FreeMemory
from edgekv.testing.twins import make_twin
from tests.helpers.cgroup import MemoryCgroup, unavailable

MIB = 1 << 20
NO_CGROUP = unavailable()


# `edgekv ...` in a child that reports its own peak RSS (VmHWM) as its last line on stderr:
# ru_maxrss would not do, since a child starts with its parent's peak (it survives fork and
# exec), and this test's parent is a pytest process that may have held gigabytes
EDGEKV = """import sys
from edgekv.cli import main
status = main(sys.argv[1:])
hwm = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
print(f"peak {int(hwm.split()[1]) * 1024}", file=sys.stderr)
sys.exit(status)
"""


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    path = make_twin("qwen2.5-0.5b", "Q4_K_M", tmp_path_factory.mktemp("twin") / "qwen2.5-0.5b-Q4_K_M.gguf")
    yield path
    path.unlink()  # 0.37 GiB: pytest keeps the last three runs' folders


def _predicted(path, *args) -> tuple[int, int]:
    """(`edgekv mem`'s total, its weights) for the plan of `edgekv run ... args`."""
    out = subprocess.run([sys.executable, "-m", "edgekv", "mem", "-m", str(path), *args],
                         capture_output=True, text=True, check=True).stdout
    total = int(re.search(r"^total:\s+([\d,]+) bytes", out, re.M).group(1).replace(",", ""))
    weights = int(re.search(r"^weights:\s+([\d,]+) bytes", out, re.M).group(1).replace(",", ""))
    return total, weights


def _run(path, limit: int, n: int = 16, command: tuple = ("run", "-p", "Hello", "--ignore-eos", "-c", "auto")):
    """The edgekv command in a cgroup of `limit` bytes: its run, with max_rss its own VmHWM."""
    group = MemoryCgroup(limit)
    try:
        run = group.run([sys.executable, "-c", EDGEKV, command[0], "-m", str(path), "-n", str(n), *command[1:]],
                        timeout=300)
    finally:
        group.close()
    peak = re.search(r"^peak (\d+)$", run.stderr, re.M)
    assert peak is not None or run.oom_killed, run.stderr[-2000:]
    run.max_rss = int(peak.group(1)) if peak else -1
    return run


@pytest.mark.skipif(NO_CGROUP is not None, reason=f"no memory cgroup: {NO_CGROUP}")
def test_a_model_that_fits_runs_under_the_limit_as_mem_predicts(twin):
    predicted, weights = _predicted(twin, "-p", "2", "-n", "16")
    run = _run(twin, int(predicted * 1.5))
    assert run.returncode == 0 and not run.oom_killed, run.stderr[-2000:]
    assert abs(run.max_rss - predicted) <= 0.10 * predicted, (
        f"peak RSS {run.max_rss / MIB:.0f} MiB, edgekv mem predicted {predicted / MIB:.0f} MiB")


@pytest.mark.skipif(NO_CGROUP is not None, reason=f"no memory cgroup: {NO_CGROUP}")
def test_a_model_that_cannot_fit_is_refused_before_its_weights_are_read(twin):
    _, weights = _predicted(twin)
    run = _run(twin, weights + 100 * MIB)
    assert run.returncode == 1 and not run.oom_killed, run.stderr[-2000:]
    assert "needs at least" in run.stderr and "nothing was loaded" in run.stderr and "at most" in run.stderr
    assert "cgroup" in run.stderr  # which figure ran short
    assert run.max_rss < weights, f"peak RSS {run.max_rss / MIB:.0f} MiB: the weights were read"
    mem = _run(twin, weights + 100 * MIB, command=("mem",))  # edgekv mem says so too, with its plan
    assert mem.returncode == 1 and "total:" in mem.stdout, mem.stderr[-2000:]
    assert "fits:            no: loading refuses it:" in mem.stdout and "nothing was loaded" in mem.stdout


class _HP:  # the shapes check_fits reads, of Llama-3.1-8B
    n_layers, n_kv_heads, head_dim, head_dim_v = 32, 8, 128, 128
    n_heads, dim, ff, n_vocab = 32, 4096, 14336, 128256


def test_check_fits_says_what_would_fit():
    weights = 4912898304  # the Q4_K_M file's tensors
    need = minimum_bytes(_HP, weights)
    kv = MIN_CONTEXT * 32 * 8 * 256 * 2
    assert need > weights + RUNTIME_BYTES + kv
    check_fits("8b.gguf", _HP, weights, FreeMemory(need, "test"))  # exactly enough: no error
    check_fits("8b.gguf", _HP, weights, None)  # unknown: not checked
    with pytest.raises(ModelTooLargeError) as err:
        check_fits("8b.gguf", _HP, weights, FreeMemory(4 << 30, "cgroup v1 memory.limit_in_bytes"))
    text = str(err.value)
    assert "8b.gguf needs at least" in text and "4.00 GiB is available (4.00 GiB (cgroup v1" in text
    fits = (4 << 30) - (need - weights)
    assert f"at most {fits / (1 << 30):.2f} GiB of weights" in text
    # what the process already holds of the runtime counts as room
    check_fits("8b.gguf", _HP, weights, FreeMemory(need - 100 * MIB, "test"), in_use=100 * MIB)


def test_memory_check_off_loads_what_does_not_fit_with_a_warning(tiny_model, monkeypatch, caplog):
    # a Jetson's zram (or any swap) takes what MemAvailable leaves out: EDGEKV_MEMORY_CHECK=0
    # loads anyway, says what is short, and the auto context keeps to its smallest
    from edgekv import Llama
    from edgekv.kv import memory as kv_memory

    path = str(tiny_model("llama"))
    monkeypatch.setattr(kv_memory, "free_memory", lambda: FreeMemory(1 * MIB, "test: 1 MiB"))
    with pytest.raises(ModelTooLargeError, match="EDGEKV_MEMORY_CHECK=0 loads it anyway"):
        Llama(path)
    monkeypatch.setenv("EDGEKV_MEMORY_CHECK", "0")
    with caplog.at_level("WARNING", logger="edgekv"):
        llm = Llama(path)
    assert "but only" in caplog.text and "loading it anyway (EDGEKV_MEMORY_CHECK=0)" in caplog.text
    assert llm("Hello", max_tokens=2, temperature=0.0)["usage"]["completion_tokens"] == 2
    assert llm.n_ctx() == MIN_CONTEXT
