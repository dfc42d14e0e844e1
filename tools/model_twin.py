"""A model's twin, for timing a model where its file cannot go: the same GGUF header
(metadata, tokenizer, tensor directory: every name, shape, type and offset) followed by
random weights in those types.

    python tools/model_twin.py header MODEL.gguf OUT.header   # MODEL's bytes up to its tensor data
    python tools/model_twin.py twin OUT.header TWIN.gguf      # that header, then random weights
    python tools/model_twin.py make qwen2.5-1.5b Q4_K_M TWIN.gguf  # a model edge users run, from its shapes

Why: the GPU machines lent to sessions reach no network and take 64 MiB of files per call,
less than either real model (SmolLM2-135M Q4_1: 94 MiB; gemma3-270m Q4_K_M: 241 MiB), while
their headers are 1.7 and 6.2 MiB. A decode or prefill step does the same work on any
values of the same shapes and types, so a twin's tg/pp speed is its model's; its text is
noise, so no parity check runs on it (tools/gpu_check.sh labels what it measures so).

`make` writes a twin of a model no file of which is here: its shapes, vocabulary size and
the file type's tensor types (edgekv/testing/twins.py: Qwen2.5 0.5B/1.5B/7B, Llama 3.2 1B/3B,
Llama 3.1 8B, Gemma 3 1B, Phi-3.5-mini), for benchmarks/sizes.py. The weights' values:
edgekv/testing/twin_weights.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gguf import GGUFReader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgekv.testing.twin_weights import fill_weights, random_weights  # noqa: E402,F401 (random_weights: the tests')
from edgekv.testing.twins import FILE_TYPES, SHAPES, make_twin  # noqa: E402


def write_header(src: Path, dst: Path) -> int:
    """The first bytes of src, up to its tensor data; returns their count."""
    n = GGUFReader(src).data_offset
    with open(src, "rb") as f, open(dst, "wb") as out:
        out.write(f.read(n))
    return n


write_twin = fill_weights


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    h = sub.add_parser("header", help="write MODEL's header (metadata, tokenizer, tensor directory)")
    h.add_argument("model", type=Path)
    h.add_argument("out", type=Path)
    w = sub.add_parser("twin", help="write a model of that header with random weights")
    w.add_argument("header", type=Path)
    w.add_argument("out", type=Path)
    w.add_argument("--seed", type=int, default=0)
    m = sub.add_parser("make", help="write the twin of a model edge users run, from its shapes")
    m.add_argument("name", choices=sorted(SHAPES))
    m.add_argument("file_type", choices=FILE_TYPES)
    m.add_argument("out", type=Path)
    m.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.verb == "make":
        make_twin(args.name, args.file_type, args.out, args.seed)
        print(f"{args.out}: {args.out.stat().st_size / 2**30:.2f} GiB, a {args.file_type} twin of {args.name}")
    elif args.verb == "header":
        n = write_header(args.model, args.out)
        print(f"{args.out}: {n / 2**20:.1f} MiB of header from {args.model}")
    else:
        n = write_twin(args.header, args.out, args.seed)
        print(f"{args.out}: {n / 2**20:.1f} MiB, {args.header}'s model with random weights")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ValueError as exc:  # a type without random weights, an unknown twin
        sys.exit(f"model_twin: {exc}")
