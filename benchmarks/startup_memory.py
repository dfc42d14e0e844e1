"""Start-up and memory as a user feels them (issue 19, item 5), beside llama.cpp.

Two commands per model, each run `-r` times alternating with llama.cpp's `llama-completion`
on the same GGUF, after one warm-up run of each (the kernel cache and the page cache warm):

- first token: `edgekv run -m M -p Hi -n 1` against `llama-completion -m M -p Hi -n 1 -no-cnv`:
  wall seconds from exec to exit;
- memory: `-c 4096 -n 64` on both: the peak resident set (the kernel's ru_maxrss of that
  child alone, os.wait4).

Then where edgekv's first-token time goes, in one process: importing edgekv, loading the
model (file mapping, weight repacking), making the session (the cache and scratch
buffers), the first token. Targets: first token <= 1.0 s, peak RSS <= 1.2x llama.cpp.

    python benchmarks/startup_memory.py --llama-completion PATH [-m NAME,...] [-r 5]

PATH defaults to $LLAMA_COMPLETION; without it only edgekv's figures are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgekv.catalog import resolve_model  # noqa: E402
from edgekv.system_info import machine_summary  # noqa: E402

PHASES = """
import time
t0 = time.perf_counter()
from edgekv import load
t1 = time.perf_counter()
model = load({path!r})
t2 = time.perf_counter()
session = model.session(n_ctx=4096)
t3 = time.perf_counter()
ids = model.tokenizer.encode(b"Hi")
session.eval(ids)
t4 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3)
"""


# As a user runs it: an installed package has its bytecode, so a PYTHONDONTWRITEBYTECODE
# in this shell (some CI images set it) must not make every run recompile edgekv's modules
# (~0.13 s).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of one command, its output discarded."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=CHILD_ENV)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"startup_memory: {' '.join(cmd)} failed (status {status})")
    return wall, usage.ru_maxrss / 1024


def commands(path: Path, llama: str | None, extra: list[str]) -> dict[str, list[str]]:
    cmds = {"edgekv": [sys.executable, "-m", "edgekv", "run", "-m", str(path), "-p", "Hi", *extra]}
    if llama:
        cmds["llama.cpp"] = [llama, "-m", str(path), "-p", "Hi", "-no-cnv", "-t", str(os.cpu_count()), *extra]
    return cmds


def measure(cmds: dict[str, list[str]], repetitions: int) -> dict[str, list[tuple[float, float]]]:
    results: dict[str, list] = {name: [] for name in cmds}
    for name, cmd in cmds.items():  # warm-up
        run(cmd)
    for _ in range(repetitions):
        for name, cmd in cmds.items():
            results[name].append(run(cmd))
    return results


def row(label: str, results: dict, index: int, unit: str) -> str:
    ours = statistics.median(r[index] for r in results["edgekv"])
    if "llama.cpp" not in results:
        return f"| {label} | {ours:.2f} {unit} | - | - |"
    theirs = statistics.median(r[index] for r in results["llama.cpp"])
    return f"| {label} | {ours:.2f} {unit} | {theirs:.2f} {unit} | {ours / theirs:.2f}x |"


def phases(path: Path, repetitions: int) -> list[float]:
    runs = []
    for _ in range(repetitions):
        out = subprocess.run([sys.executable, "-c", PHASES.format(path=str(path))], capture_output=True, text=True,
                             check=True, env=CHILD_ENV).stdout
        runs.append([float(v) for v in out.split()])
    return [statistics.median(r[i] for r in runs) for i in range(4)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m-instruct,gemma3-270m")
    ap.add_argument("-r", type=int, default=5, help="alternating repetitions, the median counts (default: 5)")
    ap.add_argument("--llama-completion", default=os.environ.get("LLAMA_COMPLETION"))
    args = ap.parse_args()
    print(f"Machine: {machine_summary(os.cpu_count())}\n")
    print("| model | measure | edgekv | llama.cpp | edgekv / llama.cpp |\n|---|---|---:|---:|---:|")
    notes = []
    for name in args.model.split(","):
        path = resolve_model(name)
        first = measure(commands(path, args.llama_completion, ["-n", "1"]), args.r)
        memory = measure(commands(path, args.llama_completion, ["-c", "4096", "-n", "64"]), args.r)
        print(row(f"{name} | first token, `-p Hi -n 1`, wall", first, 0, "s"))
        print(row(f"{name} | peak RSS, `-c 4096 -n 64`", memory, 1, "MiB"), flush=True)
        imp, load, session, token = phases(path, args.r)
        notes.append(f"{name}: import edgekv's API {imp:.2f} s, load the model {load:.2f} s, session at -c 4096 "
                     f"{session:.2f} s, first token (prompt 'Hi') {token:.2f} s")
    print("\nWhere edgekv's first-token time goes (one process, medians):\n")
    print("\n".join(f"- {n}" for n in notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
