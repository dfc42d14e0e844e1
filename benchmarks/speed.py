"""Prefill (pp) and decode (tg) tokens per second of the catalog models, beside llama.cpp.

Like llama-bench: random token ids (no tokenization), an empty cache for pp, decode of
n tokens after a 1-token prompt for tg; the first repetition warms up (JIT, page cache)
and is not counted. Prints a Markdown table with the ratio to llama.cpp's figures from
../shared/reference/README.md (2 threads, same machine class).

    python benchmarks/speed.py [-m NAME ...] [-p 512] [-n 128] [-r 3] [-t THREADS]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from edgekv.kernels.config import set_num_threads
from edgekv.loader import load

LLAMA_CPP = {  # llama-bench -t 2, tokens/s (../shared/reference/README.md)
    "smollm2-135m-instruct": {"pp512": 347.0, "tg128": 108.0},
    "gemma3-270m": {"pp512": 699.0, "tg128": 52.0},
}


def bench_pp(model, n_prompt: int) -> float:
    s = model.session(n_ctx=n_prompt + 8, n_batch=512)
    ids = np.random.default_rng(0).integers(0, model.hp.n_vocab, n_prompt)
    t0 = time.perf_counter()
    s.eval(ids)
    return n_prompt / (time.perf_counter() - t0)


def bench_tg(model, n_gen: int) -> float:
    s = model.session(n_ctx=n_gen + 8, n_batch=512)
    s.eval([1])
    tok = 1
    t0 = time.perf_counter()
    for _ in range(n_gen):
        s.eval([tok])
        tok = int(np.argmax(s.logits))
    return n_gen / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", nargs="*", default=list(LLAMA_CPP))
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-t", type=int, default=2)
    args = ap.parse_args()
    set_num_threads(args.t)
    print("| model | test | edgekv t/s | llama.cpp t/s | ratio |\n|---|---|---|---|---|")
    for name in args.model:
        model = load(name)
        for test, fn, n in ((f"pp{args.p}", bench_pp, args.p), (f"tg{args.n}", bench_tg, args.n)):
            runs = [fn(model, n) for _ in range(args.r + 1)][1:]
            mean, sd = statistics.mean(runs), statistics.pstdev(runs)
            ref = LLAMA_CPP.get(name, {}).get(test)
            ratio = f"{mean / ref:.2f}x" if ref else "-"
            print(f"| {name} | {test} | {mean:.1f} ± {sd:.1f} | {ref or '-'} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
