"""Issue 13 item 2: `edgekv quantize` against llama-quantize, side by side in one run.

For each catalog model, an F16 source is made first (`edgekv quantize --allow-requantize
... F16`, equal to llama-quantize's); then for each file type, repetition by repetition and
alternating, llama-quantize (subprocess, all threads) and edgekv:
- `edgekv` in-process: `quantize_model` after one warm-up run (kernels compiled, imports
  done), the figure that compares the quantizers;
- `edgekv` CLI: the whole `python -m edgekv quantize` command, start-up included, what a
  user waits for.
Throughput is source bytes (F16) per second; the ratio is llama-quantize's time / edgekv's
(above 1: edgekv faster). Target (issue 13): >= 0.5x. The outputs are checked equal
byte for byte on the way (a benchmark of a wrong answer is worthless).

    python benchmarks/quantize_speed.py --llama-quantize /path/to/llama-quantize [-r 3]

llama-quantize comes from `--llama-quantize` or $LLAMA_QUANTIZE (built as
tests/reference/README.md says); without it the script says so and exits 0.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = ("smollm2-135m-instruct", "gemma3-270m")
TYPES = ("Q8_0", "Q4_0", "Q4_K_M", "Q6_K")


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def one_model(model: str, exe: str, reps: int, work: Path) -> list[str]:
    from edgekv.catalog import ensure_model
    from edgekv.quantize.model import quantize_model
    from edgekv.quantize.plan import Options

    src = work / f"{model}-F16.gguf"
    quantize_model(ensure_model(model), src, "F16", Options(allow_requantize=True), progress=False)
    size = src.stat().st_size
    rows = []
    for ftype in TYPES:
        ours, theirs = work / "ours.gguf", work / "theirs.gguf"
        quantize_model(src, ours, ftype, progress=False)  # warm-up: compile, page cache
        times: dict[str, list[float]] = {"llama": [], "inproc": [], "cli": []}
        for _ in range(reps):
            times["llama"].append(timed(lambda: subprocess.run(
                [exe, str(src), str(theirs), ftype], check=True, capture_output=True)))
            times["inproc"].append(timed(lambda: quantize_model(src, ours, ftype, progress=False)))
            times["cli"].append(timed(lambda: subprocess.run(
                [sys.executable, "-m", "edgekv", "quantize", str(src), str(ours), ftype],
                check=True, capture_output=True)))
        if not filecmp.cmp(ours, theirs, shallow=False):
            raise SystemExit(f"{model} {ftype}: edgekv's file differs from llama-quantize's")
        m = {k: statistics.mean(v) for k, v in times.items()}
        rows.append(f"| {model} | {ftype} | {m['llama']:.2f} | {m['inproc']:.2f} | {m['cli']:.2f} | "
                    f"{size / m['llama'] / 2**20:.0f} | {size / m['inproc'] / 2**20:.0f} | "
                    f"{m['llama'] / m['inproc']:.2f}x | {m['llama'] / m['cli']:.2f}x |")
        print(rows[-1], file=sys.stderr)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-quantize", default=os.environ.get("LLAMA_QUANTIZE"))
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    args = ap.parse_args(argv)
    if not args.llama_quantize or not os.access(args.llama_quantize, os.X_OK):
        print("quantize_speed: skipped: no llama-quantize; pass --llama-quantize PATH or set LLAMA_QUANTIZE",
              file=sys.stderr)
        return 0
    from edgekv.system_info import machine_summary

    print(f"Machine: {machine_summary(os.cpu_count())}; Python {platform.python_version()}; "
          f"mean of {args.reps} alternating repetitions, seconds")
    print("| model | type | llama-quantize s | edgekv in-process s | edgekv CLI s | llama MiB/s | "
          "edgekv MiB/s | ratio in-process | ratio CLI |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for model in args.models:
            print("\n".join(one_model(model, args.llama_quantize, args.reps, Path(work))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
