"""Save the logits of fixed runs of the real models, or compare two such files bit for bit.

A refactor that must not change arithmetic (a new backend seam, a moved kernel) is checked
by running this before and after it:

    python tools/logits_fingerprint.py save before.npz
    ... change the code ...
    python tools/logits_fingerprint.py save after.npz
    python tools/logits_fingerprint.py compare before.npz after.npz

The runs cover every path a forward pass can take: a short prompt (the bit-exact chunk
path), one token at a time (decode), a 200-token chunk (the integer GEMM / BLAS prefill
path) and the same with q8_0 and q4_0 caches, for both catalog models. Greedy ids
follow from the logits, so equal logits mean equal ids.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

MODELS = ("smollm2-135m-instruct", "gemma3-270m")
PROMPT = "The capital of France is a city that many people visit every year because"
LONG_TEXT = (Path(__file__).resolve().parents[1] / "tests" / "reference" / "gpl3.txt")
N_DECODE = 16
N_LONG = 200


def runs(model_name: str) -> dict[str, np.ndarray]:
    from edgekv.loader import load

    model = load(model_name)
    tok = model.tokenizer
    out = {}
    short = tok.encode(PROMPT)
    s = model.session(n_ctx=512)
    steps = [s.eval(short, all_logits=True)]
    for _ in range(N_DECODE):
        steps.append(s.eval([int(np.argmax(s.logits))], all_logits=True))
    out["short+decode"] = np.concatenate(steps)
    long = tok.encode(LONG_TEXT.read_text()[:4000])[:N_LONG]
    for cache in ("f16", "q8_0", "q4_0"):
        s = model.session(n_ctx=512, cache_type_k=cache, cache_type_v=cache)
        logits = [s.eval(long, all_logits=True)]
        for _ in range(4):
            logits.append(s.eval([int(np.argmax(s.logits))], all_logits=True))
        out[f"long-{cache}"] = np.concatenate(logits)
    return {f"{model_name}/{k}": v for k, v in out.items()}


def save(path: str) -> None:
    arrays: dict[str, np.ndarray] = {}
    for name in MODELS:
        arrays.update(runs(name))
    np.savez_compressed(path, **arrays)
    print(f"saved {len(arrays)} runs to {path}")


def compare(a_path: str, b_path: str) -> int:
    a, b = np.load(a_path), np.load(b_path)
    bad = 0
    for key in sorted(set(a.files) | set(b.files)):
        if key not in a.files or key not in b.files:
            print(f"{key}: only in {'the first' if key in a.files else 'the second'} file")
            bad += 1
            continue
        x, y = a[key], b[key]
        same = x.shape == y.shape and np.array_equal(x.view(np.uint32), y.view(np.uint32))
        diff = "" if same or x.shape != y.shape else f", max |diff| {np.abs(x - y).max():.3g}"
        print(f"{key}: {'identical' if same else 'DIFFERENT'} {x.shape}{diff}")
        bad += not same
    print("all identical" if not bad else f"{bad} run(s) differ")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("save").add_argument("path")
    cmp = sub.add_parser("compare")
    cmp.add_argument("first")
    cmp.add_argument("second")
    args = parser.parse_args(argv)
    if args.command == "save":
        save(args.path)
        return 0
    return compare(args.first, args.second)


if __name__ == "__main__":
    sys.exit(main())
