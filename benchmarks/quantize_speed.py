"""Issues 13 and 44: `edgekv quantize` against llama-quantize, side by side in one run.

For each catalog model, an F16 source is made first (`edgekv quantize --allow-requantize
... F16`, equal to llama-quantize's); then for each file type, repetition by repetition and
alternating, llama-quantize (subprocess, all threads) and edgekv:
- `edgekv` in-process: `quantize_model` after one warm-up run (kernels compiled, imports
  done), the figure that compares the quantizers;
- `edgekv` CLI: the whole `python -m edgekv quantize` command, start-up included, what a
  user waits for.
Throughput is source bytes (F16) per second; the ratio is llama-quantize's time / edgekv's
(above 1: edgekv faster). Targets: >= 0.5x (issue 13), and for the low-bit types of issue 44
>= 1.0x with peak RSS <= the source file + 300 MB (the CLI's and llama-quantize's peak RSS are
printed, MiB). Types marked "+imatrix" use an importance matrix `edgekv imatrix` makes from the
F16 over benchmarks/texts/apache-2.0.txt (-c 256). The outputs are checked equal byte for byte
on the way (a benchmark of a wrong answer is worthless).

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
TYPES = ("Q8_0", "Q4_0", "Q4_K_M", "Q6_K", "Q2_K", "Q3_K_M", "IQ4_XS", "Q2_K_S+imatrix", "Q3_K_M+imatrix",
         "IQ4_XS+imatrix")
TEXT = Path(__file__).resolve().parent / "texts" / "apache-2.0.txt"


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_peak(cmd) -> tuple[float, float]:
    """(seconds, peak RSS MiB) of a command run to completion. Through /usr/bin/time: a child
    forked from this process would count this process's pages in its own peak until exec."""
    with tempfile.NamedTemporaryFile("r") as out:
        t0 = time.perf_counter()
        subprocess.run(["/usr/bin/time", "-f", "%M", "-o", out.name, *map(str, cmd)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seconds = time.perf_counter() - t0
        return seconds, int(out.read().split()[-1]) / 1024


def one_model(model: str, exe: str, reps: int, work: Path) -> list[str]:
    from edgekv.catalog import ensure_model
    from edgekv.quantize.imatrix import load_imatrix
    from edgekv.quantize.model import quantize_model
    from edgekv.quantize.plan import Options

    src = work / f"{model}-F16.gguf"
    quantize_model(ensure_model(model), src, "F16", Options(allow_requantize=True), progress=False)
    size = src.stat().st_size
    imatrix = work / "imatrix.gguf"
    subprocess.run([sys.executable, "-m", "edgekv", "imatrix", "-m", str(src), "-f", str(TEXT), "-o", str(imatrix),
                    "-c", "256", "--no-ppl"], check=True, capture_output=True)
    rows = []
    for label in TYPES:
        ftype, _, with_imatrix = label.partition("+")
        flags = ["--imatrix", str(imatrix)] if with_imatrix else []
        opts = Options(imatrix=load_imatrix(imatrix)) if with_imatrix else Options()
        ours, theirs = work / "ours.gguf", work / "theirs.gguf"
        quantize_model(src, ours, ftype, opts, progress=False)  # warm-up: compile, page cache
        times: dict[str, list[float]] = {"llama": [], "inproc": [], "cli": []}
        peaks: dict[str, float] = {"llama": 0.0, "cli": 0.0}
        for _ in range(reps):
            t, peak = run_peak([exe, *flags, str(src), str(theirs), ftype])
            times["llama"].append(t)
            peaks["llama"] = max(peaks["llama"], peak)
            times["inproc"].append(timed(lambda: quantize_model(src, ours, ftype, opts, progress=False)))
            t, peak = run_peak([sys.executable, "-m", "edgekv", "quantize", *flags, str(src), str(ours), ftype])
            times["cli"].append(t)
            peaks["cli"] = max(peaks["cli"], peak)
        if not filecmp.cmp(ours, theirs, shallow=False):
            raise SystemExit(f"{model} {label}: edgekv's file differs from llama-quantize's")
        m = {k: statistics.mean(v) for k, v in times.items()}
        rows.append(f"| {model} | {label} | {m['llama']:.2f} | {m['inproc']:.2f} | {m['cli']:.2f} | "
                    f"{size / m['llama'] / 2**20:.0f} | {size / m['inproc'] / 2**20:.0f} | "
                    f"{m['llama'] / m['inproc']:.2f}x | {m['llama'] / m['cli']:.2f}x | "
                    f"{peaks['llama']:.0f} | {peaks['cli']:.0f} | {size / 2**20 + 300:.0f} |")
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
          "edgekv MiB/s | ratio in-process | ratio CLI | llama peak RSS MiB | edgekv CLI peak RSS MiB | "
          "RSS target MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for model in args.models:
            print("\n".join(one_model(model, args.llama_quantize, args.reps, Path(work))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
