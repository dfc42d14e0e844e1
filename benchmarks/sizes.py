"""The sizes people run (issue 43): twins of 0.5B-8B models beside llama.cpp, in one run.

For each twin (edgekv/testing/twins.py: the model's shapes and the file type's tensor types,
random weights; made on demand into ~/.cache/edgekv/twins, never committed), at each thread
count, edgekv and llama.cpp (llama-cpp-python 0.3.36 through compare_llama_cpp.py's worker) on
the same file:

- pp512, tg128, and tg64 at depth 4096 with f16 and q8_0 caches (compare_llama_cpp.py, which
  alternates the two engines repetition by repetition);
- the decode rate as a fraction of the memory roofline: the weight bytes a token reads (every
  matrix once, the token embedding's one row aside) over this machine's read bandwidth,
  measured here at the same thread count (a parallel sum over 1 GiB);
- first token (`edgekv run -p Hi -n 1` against llama-cpp-python loading the file and
  evaluating the same prompt for one token: both pay a Python start) and peak RSS at
  `-c 4096 -n 64`, each the median of -r alternating runs after a warm-up (page cache and
  kernel cache warm).

    python benchmarks/sizes.py [--twins qwen2.5-0.5b:Q4_K_M,...] [-t 1,2] [-r 3] [--quick]
        [--llama-python PYTHON]

--quick: pp64, tg16, depth 1024 (a smoke run). Prints the machine line, then a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgekv.system_info import machine_summary  # noqa: E402
from edgekv.testing.twins import SHAPES  # noqa: E402

DEFAULT = ",".join(f"{name}:Q4_K_M" for name in SHAPES)
TWINS = Path(os.environ.get("EDGEKV_TWINS", Path.home() / ".cache" / "edgekv" / "twins"))
LLAMA_FIRST = """
import sys
from llama_cpp import Llama
llm = Llama(sys.argv[1], n_ctx=int(sys.argv[2]), n_threads=int(sys.argv[3]), verbose=False)
ids = llm.tokenize(b"Hi")
llm.eval(ids)
for _ in range(int(sys.argv[4])):
    llm.eval([llm.sample(temp=0.0)])
"""


def twin_path(spec: str) -> Path:
    name, file_type = spec.split(":")
    path = TWINS / f"{name}-{file_type}.gguf"
    if not path.exists():
        TWINS.mkdir(parents=True, exist_ok=True)
        print(f"(making the {file_type} twin of {name} in {path})", file=sys.stderr, flush=True)
        # in a child: the pages it writes must not count in this process's peak RSS, which
        # every child below inherits as its own starting peak (ru_maxrss survives fork and exec)
        subprocess.run([sys.executable, str(ROOT / "tools" / "model_twin.py"), "make", name, file_type, str(path)],
                       check=True, stdout=subprocess.DEVNULL)
    return path


def read_bandwidth(threads: int) -> float:
    """Bytes per second a parallel sum reads from a 1 GiB array (best of 5), on `threads`;
    measured in a child, for the reason twin_path gives."""
    code = f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import sizes; print(sizes.bandwidth({threads}))"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def bandwidth(threads: int) -> float:
    import numba
    import numpy as np

    @numba.njit(parallel=True, cache=False)
    def total(a):
        s = 0
        for i in numba.prange(a.shape[0]):
            s += a[i]
        return s

    numba.set_num_threads(threads)
    a = np.ones(1 << 27, np.int64)  # 1 GiB
    total(a[:1024])
    best = min(_timed(total, a) for _ in range(5))
    return a.nbytes / best


def _timed(f, a) -> float:
    t = time.perf_counter()
    f(a)
    return time.perf_counter() - t


def bytes_per_token(path: Path) -> int:
    """What one decode step reads of the weights: every matrix, less the token embedding's
    other rows (unless it is the output too)."""
    from edgekv.gguf.reader import GGUFFile

    g = GGUFFile(path)
    tied = "output.weight" not in g.tensors
    return sum(t.data.nbytes for n, t in g.tensors.items() if len(t.shape) == 2 and (n != "token_embd.weight" or tied))


def speed(path: Path, threads: int, args) -> dict[str, tuple[float, float]]:
    """test name -> (edgekv t/s, llama.cpp t/s), from compare_llama_cpp.py's JSON records."""
    p, n, d, gen = (64, 16, 1024, 8) if args.quick else (512, 128, 4096, 64)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "compare_llama_cpp.py"), "-m", str(path), "-p", str(p),
           "-n", str(n), "-d", str(d), "--depth-gen", str(gen), "-ct", "f16,q8_0", "-r", str(args.r),
           "--tests", "pp,tg,depth",
           "-t", str(threads), "-o", "json"]
    if args.llama_python:
        cmd += ["--llama-python", args.llama_python]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    results = {}
    for r in json.loads(out[out.index("["):]):
        label = r["test"] + (f" {r['type_k']}" if r["edgekv"]["n_depth"] else "")
        results[label] = (r["edgekv"]["avg_ts"], r["llama_cpp"]["avg_ts"])
    return results


def _run(cmd: list[str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"sizes: {' '.join(cmd)} failed (status {status})")
    return time.perf_counter() - t0, usage.ru_maxrss / 1024


def start_and_memory(path: Path, threads: int, args) -> dict[str, tuple[float, float]]:
    """first token (s) and peak RSS at -c 4096 (MiB): (edgekv, llama.cpp) medians."""
    py = args.llama_python or sys.executable
    cmds = {
        "first": ([sys.executable, "-m", "edgekv", "run", "-m", str(path), "-p", "Hi", "-n", "1", "-t", str(threads)],
                  [py, "-c", LLAMA_FIRST, str(path), "512", str(threads), "0"]),
        "rss": ([sys.executable, "-m", "edgekv", "run", "-m", str(path), "-p", "Hi", "-c", "4096", "-n", "64", "-t",
                 str(threads)], [py, "-c", LLAMA_FIRST, str(path), "4096", str(threads), "64"]),
    }
    out = {}
    for key, (ours, theirs) in cmds.items():
        _run(ours), _run(theirs)  # warm-up
        runs = [(_run(ours), _run(theirs)) for _ in range(args.r)]
        i = 0 if key == "first" else 1
        out[key] = (statistics.median(a[i] for a, _ in runs), statistics.median(b[i] for _, b in runs))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--twins", default=DEFAULT, help="name:file_type, comma-separated (default: every Q4_K_M twin)")
    ap.add_argument("-t", default="1,2", help="thread counts (default: 1,2)")
    ap.add_argument("-r", type=int, default=3, help="repetitions (default: 3)")
    ap.add_argument("--quick", action="store_true", help="pp64, tg16, depth 1024: a smoke run")
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_CPP_PYTHON"))
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.t.split(",")]
    print(f"Machine: {machine_summary(max(threads))}")
    rates = {t: read_bandwidth(t) for t in threads}
    print("Read bandwidth: " + ", ".join(f"{rates[t] / 1e9:.1f} GB/s at {t} thread(s)" for t in threads) + "\n")
    print("| twin | threads | test | edgekv | llama.cpp | edgekv / llama.cpp | edgekv of roofline |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for spec in args.twins.split(","):
        path = twin_path(spec)
        per_token = bytes_per_token(path)
        for t in threads:
            roofline = rates[t] / per_token  # tokens/s if decode only read the weights
            for test, (ours, theirs) in speed(path, t, args).items():
                share = f"{ours / roofline:.0%}" if test.startswith("tg") and "@" not in test else ""
                print(f"| {spec} | {t} | {test} | {ours:.2f} t/s | {theirs:.2f} t/s | "
                      f"{ours / theirs if theirs else float('nan'):.2f}x | {share} |", flush=True)
            sm = start_and_memory(path, t, args)
            (a, b), (c, d) = sm["first"], sm["rss"]
            print(f"| {spec} | {t} | first token (wall) | {a:.2f} s | {b:.2f} s | {a / b:.2f}x | |")
            print(f"| {spec} | {t} | peak RSS, -c 4096 -n 64 | {c:.0f} MiB | {d:.0f} MiB | {c / d:.2f}x | |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
