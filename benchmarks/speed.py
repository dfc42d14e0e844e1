"""Prefill (pp) and decode (tg) tokens per second of the catalog models, beside llama.cpp's
recorded figures.

edgekv is measured exactly as `edgekv bench` measures it (edgekv/lab/bench.py: llama-bench's
tests on random ids, one warm-up, a depth prefix that is not timed). llama.cpp's figures
are the ones in tests/reference/README.md (llama-bench -t 2 on a machine of the same
class, on another day), so the ratio is a first indication; compare_llama_cpp.py measures
both engines in one run.

    python benchmarks/speed.py [-m NAME ...] [-p 512] [-n 128] [-r 3] [-t THREADS] [-d 4096 [-ct f16 q8_0 q4_0]]
"""

from __future__ import annotations

import argparse
import os

LLAMA_CPP = {  # llama-bench -t 2, tokens/s (tests/reference/README.md)
    "smollm2-135m-instruct": {"pp512": 347.0, "tg128": 108.0,
                              "tg64 @ d4096 f16": 30.5, "tg64 @ d4096 q8_0": 31.2, "tg64 @ d4096 q4_0": 21.9},
    "gemma3-270m": {"pp512": 699.0, "tg128": 52.0},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", nargs="*", default=list(LLAMA_CPP))
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-d", type=int, default=0, help="also decode 64 tokens at this depth, per cache type")
    ap.add_argument("-ct", nargs="*", default=["f16", "q8_0", "q4_0"], help="cache types for -d (K and V alike)")
    args = ap.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.t))  # before NumPy is imported

    from edgekv.lab.bench import BenchTest, run_test
    from edgekv.loader import load
    from edgekv.system_info import machine_summary

    print(f"Machine: {machine_summary(args.t)}\n")
    print("| model | test | edgekv t/s | llama.cpp t/s | ratio |\n|---|---|---|---|---|")
    for name in args.model:
        model = load(name)
        tests = [(f"pp{args.p}", BenchTest(args.p, 0, n_threads=args.t)),
                 (f"tg{args.n}", BenchTest(0, args.n, n_threads=args.t))]
        if args.d:
            tests += [(f"tg64 @ d{args.d} {ct}", BenchTest(0, 64, args.d, type_k=ct, type_v=ct, n_threads=args.t))
                      for ct in args.ct]
        for label, test in tests:
            result = run_test(model, test, args.r)
            ref = LLAMA_CPP.get(name, {}).get(label)
            ratio = f"{result.avg_ts / ref:.2f}x" if ref else "-"
            print(f"| {name} | {label} | {result.avg_ts:.1f} ± {result.stddev_ts:.1f} | {ref or '-'} | {ratio} |",
                  flush=True)


if __name__ == "__main__":
    main()
