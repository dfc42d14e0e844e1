"""Prefill (pp) and decode (tg) tokens per second of the catalog models, beside llama.cpp.

Like llama-bench: random token ids (no tokenization), an empty cache for pp, decode of
n tokens after a 1-token prompt for tg; the first repetition warms up (JIT, page cache)
and is not counted. Prints a Markdown table with the ratio to llama.cpp's figures from
../shared/reference/README.md (2 threads, same machine class).

    python benchmarks/speed.py [-m NAME ...] [-p 512] [-n 128] [-r 3] [-t THREADS] [-d 4096 [-ct f16 q8_0 q4_0]]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from edgekv.kernels.config import set_num_threads
from edgekv.loader import load

LLAMA_CPP = {  # llama-bench -t 2, tokens/s (../shared/reference/README.md)
    "smollm2-135m-instruct": {"pp512": 347.0, "tg128": 108.0,
                              "tg64@d4096 f16": 30.5, "tg64@d4096 q8_0": 31.2, "tg64@d4096 q4_0": 21.9},
    "gemma3-270m": {"pp512": 699.0, "tg128": 52.0},
}


def bench_pp(model, n_prompt: int) -> float:
    s = model.session(n_ctx=n_prompt + 8, n_batch=512)
    ids = np.random.default_rng(0).integers(0, model.hp.n_vocab, n_prompt)
    t0 = time.perf_counter()
    s.eval(ids)
    return n_prompt / (time.perf_counter() - t0)


def bench_tg(model, n_gen: int, depth: int = 0, cache_type: str = "f16") -> float:
    """Decode n_gen tokens after `depth` tokens of random prompt (llama-bench's tg at -d)."""
    s = model.session(n_ctx=depth + n_gen + 8, n_batch=512, cache_type_k=cache_type, cache_type_v=cache_type)
    s.eval(np.random.default_rng(1).integers(0, model.hp.n_vocab, depth + 1))
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
    ap.add_argument("-d", type=int, default=0, help="also decode 64 tokens at this depth, per cache type")
    ap.add_argument("-ct", nargs="*", default=["f16", "q8_0", "q4_0"], help="cache types for -d")
    args = ap.parse_args()
    set_num_threads(args.t)
    print("| model | test | edgekv t/s | llama.cpp t/s | ratio |\n|---|---|---|---|---|")
    for name in args.model:
        model = load(name)
        tests = [(f"pp{args.p}", lambda: bench_pp(model, args.p)), (f"tg{args.n}", lambda: bench_tg(model, args.n))]
        if args.d:
            tests += [(f"tg64@d{args.d} {ct}", lambda ct=ct: bench_tg(model, 64, args.d, ct)) for ct in args.ct]
        for test, fn in tests:
            runs = [fn() for _ in range(args.r + 1)][1:]
            mean, sd = statistics.mean(runs), statistics.pstdev(runs)
            ref = LLAMA_CPP.get(name, {}).get(test)
            ratio = f"{mean / ref:.2f}x" if ref else "-"
            print(f"| {name} | {test} | {mean:.1f} ± {sd:.1f} | {ref or '-'} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
