"""`edgekv perplexity`: llama.cpp's llama-perplexity method, exactly, on a text file.

What lives here: the command and its report; progress prints the running PPL after each
chunk, `[1]18.1234,`. What does not: the method (edgekv/perplexity.py), the forward pass
(models/, session.py).
"""

from __future__ import annotations

import argparse
import sys
import time

from .common import add_kv_options, add_model_options, read_text_file


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("perplexity", parents=[common], help="perplexity of a model on a text file",
                       description="Perplexity over a text file with llama.cpp's llama-perplexity method.")
    p.add_argument("-f", "--file", required=True, help="text file to score")
    add_model_options(p, ctx_default=512, ctx_auto=False)
    add_kv_options(p, shift_default=None, budget=False)  # chunks never overflow; --layer-window only
    p.add_argument("--chunks", type=int, default=-1, help="score at most this many chunks (default: all)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..context import parse_layer_windows
    from ..kernels.config import set_num_threads
    from ..loader import load
    from ..perplexity import compute, count_chunks

    text = read_text_file(args.file)
    if args.threads is not None:
        set_num_threads(args.threads)
    model = load(args.model, args.backend)
    tok = model.tokenizer
    tokens = tok.encode(text, add_bos=None, special=False)
    n_ctx = args.ctx_size
    n_chunks = count_chunks(len(tokens), n_ctx, args.chunks)
    windows = parse_layer_windows(args.layer_window, model.hp.n_layers) if args.layer_window else None
    session = model.session(n_ctx, args.batch_size, args.cache_type_k, args.cache_type_v, layer_windows=windows)
    print(f"perplexity: {len(tokens)} tokens, {n_chunks} chunks of n_ctx={n_ctx}, "
          f"n_batch={session.n_batch}, {n_ctx - 1 - n_ctx // 2} "
          f"tokens scored per chunk", file=sys.stderr, flush=True)
    t0 = time.perf_counter()

    def progress(i: int, ppl: float) -> None:
        if i == 0:
            per_pass = time.perf_counter() - t0
            print(f"perplexity: {per_pass:.2f} seconds per pass", file=sys.stderr, flush=True)
        print(f"[{i + 1}]{ppl:.4f},", end="", flush=True)

    result = compute(session, tokens, n_ctx, tok.bos_id if tok.add_bos else None, args.chunks, progress)
    print()
    print(f"Final estimate: PPL = {result.ppl:.4f} +/- {result.uncertainty:.5f}", flush=True)
    return 0
