"""Decode speed with a grammar vs without (issue 18's target: constrained >= 0.8x).

For each model: the same prompt generated greedily, unconstrained (ignore_eos, 128 tokens)
and under a JSON schema (an object holding a long array, so the text runs on), alternating
repetition by repetition; generation tokens/s from `Llama.last_stats` (prompt evaluation
excluded; the grammar's first mask, which builds llguidance's lexer, is part of the first
token). Also the mean time of one mask (GrammarConstraint.apply) over the constrained runs.

    python benchmarks/grammar_speed.py [-r 3] [-n 128] [-m MODEL ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgekv import Llama  # noqa: E402
from edgekv.catalog import resolve_model  # noqa: E402
from edgekv.grammar import Grammar, GrammarConstraint  # noqa: E402
from edgekv.system_info import machine_summary  # noqa: E402

SCHEMA = {"type": "object", "properties": {"values": {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                                                  "maximum": 999}}},
          "required": ["values"]}
PROMPT = "Here are many numbers in JSON:"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", action="append", default=None)
    p.add_argument("-r", "--repetitions", type=int, default=3)
    p.add_argument("-n", "--n-gen", type=int, default=128)
    args = p.parse_args()
    grammar = Grammar.from_json_schema(SCHEMA)
    mask_s: list[float] = []
    apply = GrammarConstraint.apply

    def timed_apply(self, logits, history):
        t0 = time.perf_counter()
        apply(self, logits, history)
        mask_s.append(time.perf_counter() - t0)

    GrammarConstraint.apply = timed_apply
    print(f"Machine: {machine_summary()}\n")
    print("| model | free t/s | JSON schema t/s | ratio | tokens under the schema | mask ms |")
    print("|---|---|---|---|---|---|")
    for name in args.model or ["smollm2-135m-instruct", "gemma3-270m"]:
        llm = Llama(str(resolve_model(name)), n_ctx=512)
        free, held, n_held = [], [], []
        llm(PROMPT, max_tokens=8, temperature=0)  # warm-up, not counted
        for _ in range(args.repetitions):
            llm(PROMPT, max_tokens=args.n_gen, temperature=0, ignore_eos=True)
            free.append(llm.last_stats.gen_tokens_per_s)
            mask_s.clear()
            llm(PROMPT, max_tokens=args.n_gen, temperature=0, grammar=grammar)
            held.append(llm.last_stats.gen_tokens_per_s)
            n_held.append(llm.last_stats.gen_tokens)
        f, h = statistics.mean(free), statistics.mean(held)
        print(f"| {name} | {f:.1f} ± {statistics.stdev(free) if len(free) > 1 else 0:.1f} | "
              f"{h:.1f} ± {statistics.stdev(held) if len(held) > 1 else 0:.1f} | {h / f:.2f} | "
              f"{min(n_held)}-{max(n_held)} | {1000 * statistics.mean(mask_s[1:] or mask_s):.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
