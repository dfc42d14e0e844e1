"""Issue 14 item 4: the `keep` overflow policy against `shift` and `stream` at equal capacity.

For each capacity (n_ctx) and policy, on a long text:
  PPL past the window  perplexity of every token the text puts after the first n_ctx (the
                       tokens scored once the policy has started to evict), evaluated in
                       chunks of --batch tokens with all logits, as a chat or a long
                       generation would run into a full context
  needle               a fact stated first ("Remember this: the secret code is 4817."), then
                       4 x n_ctx tokens of the text, then "What was the secret code? The secret
                       code is": the mean log-probability of the code's tokens, how many of
                       --needles codes (each with the filler from another offset) the model
                       gives with p > 0.5 per token on average, and how many of the fact's
                       tokens are still in the cache when the question comes
  s                    seconds the PPL pass took (the cost of the evictions and the tallies)
Then the cost of keep's tallies alone: decode t/s at --speed-depth with `none` and `keep`
(a context large enough that nothing is evicted), alternating repetitions.
Row `full` is no policy at all: a context large enough for everything (the model's own
limit on the task: a needle it cannot recall with the whole text in view is not a test of
the policy). `shift` is llama.cpp's default (--keep 0); `shift4` keeps 4 tokens like the others.

    python benchmarks/kv_keep.py [-m smollm2-135m-instruct] [-f tests/reference/gpl3.txt]
        [--caps 128,256,512] [--policies full,shift,shift4,stream,keep] [--tokens 2048]
        [--speed-depth 2048] [--caps ""]   (an empty --caps: the speed comparison only)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgekv.kv import heavy_hitters  # noqa: E402
from edgekv.catalog import resolve_model  # noqa: E402
from edgekv.loader import load  # noqa: E402
from edgekv.lab.perplexity import token_nll  # noqa: E402
from edgekv.system_info import machine_summary  # noqa: E402

CODES = ("4817", "29361", "7053", "86124", "3390", "51748", "6602", "93175")


def session(model, policy: str, n_ctx: int, n_batch: int):
    if policy == "full":
        return model.session(n_ctx=n_ctx, n_batch=n_batch)
    if policy == "shift4":
        return model.session(n_ctx=n_ctx, n_batch=n_batch, context_shift="shift", n_keep=4)
    return model.session(n_ctx=n_ctx, n_batch=n_batch, context_shift=policy)


def ppl_past_window(model, text: list[int], policy: str, cap: int, n_batch: int) -> float:
    """PPL of the tokens after the first `cap`, the session holding at most cap tokens."""
    s = session(model, policy, len(text) if policy == "full" else cap, n_batch)
    nll = []
    for start in range(0, len(text) - 1, n_batch):
        chunk = text[start : start + n_batch]
        rows = s.eval(chunk, all_logits=True)
        targets = np.asarray(text[start + 1 : start + 1 + len(chunk)])
        scored = np.arange(start, start + targets.size) >= cap
        nll.append(token_nll(rows[: targets.size][scored], targets[scored]))
    return float(np.exp(np.concatenate(nll).mean()))


def needle(model, text: list[int], policy: str, cap: int, n_batch: int, code: str, offset: int):
    """(mean log p of the code's tokens, the fact's tokens still cached, of how many)."""
    tok = model.tokenizer
    fact = tok.encode(f"Remember this: the secret code is {code}.\n\n".encode(), add_bos=None)
    question = tok.encode(b"\n\nWhat was the secret code? The secret code is", add_bos=None)
    answer = tok.encode(f" {code}".encode(), add_bos=None)
    prompt = fact + text[offset : offset + 4 * cap] + question
    s = session(model, policy, len(prompt) + len(answer) if policy == "full" else cap, n_batch)
    origin = []  # the prompt index of each cached token
    for start in range(0, len(prompt), n_batch):
        s.eval(prompt[start : start + n_batch])
        if s.n_discarded and len(origin) + min(n_batch, len(prompt) - start) > s.n_tokens:
            origin = list(np.delete(origin, s.last_evicted))
        origin += range(start, min(start + n_batch, len(prompt)))
    kept = int((np.asarray(origin) < len(fact)).sum())
    logp = 0.0
    for t in answer:
        row = s.logits.astype(np.float64)
        logp += row[t] - row.max() - np.log(np.exp(row - row.max()).sum())
        s.eval([t])
    return logp / len(answer), kept, len(fact)


def decode_speed(model, policy: str, depth: int, n: int = 64) -> float:
    """Decode t/s of n tokens after a prefix of depth random tokens (not timed)."""
    rng = np.random.default_rng(0)
    s = model.session(n_ctx=depth + n + 1, n_batch=512, context_shift=policy)
    s.eval(rng.integers(0, model.hp.n_vocab, depth))
    ids = rng.integers(0, model.hp.n_vocab, n)
    t0 = time.perf_counter()
    for t in ids:
        s.eval([int(t)])
    return n / (time.perf_counter() - t0)


def speed_table(model, depth: int, reps: int = 3) -> None:
    runs: dict[str, list[float]] = {"none": [], "keep": []}
    decode_speed(model, "keep", 64, 8)  # warm-up
    for _ in range(reps):
        for policy in runs:
            runs[policy].append(decode_speed(model, policy, depth))
    print(f"\ndecode at depth {depth}, {reps} alternating repetitions of 64 tokens:\n")
    print("| policy | t/s |\n|---|---:|")
    for policy, ts in runs.items():
        print(f"| {policy} | {np.mean(ts):.1f} ± {np.std(ts, ddof=1):.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m-instruct")
    ap.add_argument("-f", "--file", default=str(Path(__file__).resolve().parents[1] / "tests/reference/gpl3.txt"))
    ap.add_argument("--caps", default="128,256,512")
    ap.add_argument("--policies", default="full,shift,shift4,stream,keep")
    ap.add_argument("--tokens", type=int, default=2048, help="tokens of the text for the PPL pass")
    ap.add_argument("--needles", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--speed-depth", type=int, default=2048, help="0: no speed comparison")
    ap.add_argument("--recent-fraction", type=int, default=heavy_hitters.RECENT_FRACTION,
                    help="keep's recent window is n_ctx // this (the study's knob)")
    args = ap.parse_args()
    heavy_hitters.RECENT_FRACTION = args.recent_fraction
    model = load(str(resolve_model(args.model)))
    text = model.tokenizer.encode(Path(args.file).read_bytes(), add_bos=None)
    print(f"Machine: {machine_summary()}\n")
    print(f"{args.model}, {Path(args.file).name}: PPL over tokens [n_ctx, {args.tokens}), chunks of {args.batch}; "
          f"{args.needles} needles; keep's recent window n_ctx // {args.recent_fraction}\n")
    print("| n_ctx | policy | PPL past the window | needle log p | needles recalled | fact tokens kept | s |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for cap in [int(c) for c in args.caps.split(",") if c]:
        for policy in args.policies.split(","):
            t0 = time.perf_counter()
            ppl = ppl_past_window(model, text[: args.tokens], policy, cap, args.batch)
            seconds = time.perf_counter() - t0
            runs = [needle(model, text, policy, cap, args.batch, code, 300 + 700 * j)
                    for j, code in enumerate(CODES[: args.needles])]
            logps = np.array([r[0] for r in runs])
            kept = " ".join(f"{r[1]}/{r[2]}" for r in runs)
            print(f"| {cap} | {policy} | {ppl:.3f} | {logps.mean():.3f} | {(logps > np.log(0.5)).sum()}/{len(runs)} "
                  f"| {kept} | {seconds:.0f} |", flush=True)
    if args.speed_depth:
        speed_table(model, args.speed_depth)


if __name__ == "__main__":
    main()
