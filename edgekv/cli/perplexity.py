"""`edgekv perplexity`: llama.cpp's llama-perplexity method, exactly, on a text file.

What lives here: the method and its report. The method (the project's tests/reference/perplexity.json):
tokenize the whole file (BOS added when the model adds one); cut it into consecutive chunks
of n_ctx tokens (the remainder is dropped; at least two chunks are needed, as llama.cpp
requires); in each chunk the first token is replaced by BOS when the model adds BOS; each
chunk is evaluated from an empty cache; the logits at positions n_ctx/2 .. n_ctx-2 score the
tokens that follow them (n_ctx/2 - 1 tokens per chunk); PPL = exp(mean NLL). The NLL of one
token is -(logit[tok] - max - log(sum(exp(logit - max)))), with exp in f32 and the sum in f64
as llama.cpp computes it. Progress prints the running PPL after each chunk, `[1]18.1234,`.
What does not: the forward pass (models/, session.py).

Only the scored half of a chunk asks for logits, in pieces of at most LOGIT_ROWS rows, so
a 262k vocabulary needs ~130 MB of logits rather than n_ctx full rows.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..context import parse_layer_windows
from ..errors import EdgeKVError
from .common import add_kv_options, add_model_options

LOGIT_ROWS = 128


@dataclass
class PerplexityResult:
    ppl: float
    uncertainty: float  # llama.cpp's "+/-": ppl * sqrt((E[nll^2] - E[nll]^2) / (n - 1))
    n_chunks: int
    n_scored: int
    running: list[float] = field(default_factory=list)  # PPL after each chunk


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("perplexity", parents=[common], help="perplexity of a model on a text file",
                       description="Perplexity over a text file with llama.cpp's llama-perplexity method.")
    p.add_argument("-f", "--file", required=True, help="text file to score")
    add_model_options(p, ctx_default=512, ctx_auto=False)
    add_kv_options(p, shift_default=None, budget=False)  # chunks never overflow; --layer-window only
    p.add_argument("--chunks", type=int, default=-1, help="score at most this many chunks (default: all)")
    p.set_defaults(handler=run)


def token_nll(rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log p(target) for each row of logits f32[b, n_vocab], as f64[b]."""
    out = np.empty(rows.shape[0], np.float64)
    for i in range(rows.shape[0]):
        row = rows[i]
        top = row.max()
        sum_exp = np.exp(row - top).sum(dtype=np.float64)
        out[i] = -(float(row[targets[i]] - top) - math.log(sum_exp))
    return out


def chunk_nll(session, chunk: Sequence[int], bos_id: int | None) -> np.ndarray:
    """NLL of the scored tokens of one chunk (n_ctx tokens), evaluated from an empty cache."""
    n_ctx = len(chunk)
    first = n_ctx // 2
    inputs = list(chunk)
    if bos_id is not None:
        inputs[0] = bos_id
    session.reset()
    session.eval(inputs[:first])
    targets = np.asarray(chunk, dtype=np.int64)
    parts = []
    for start in range(first, n_ctx - 1, LOGIT_ROWS):  # position n_ctx-1 predicts nothing scored
        stop = min(start + LOGIT_ROWS, n_ctx - 1)
        rows = session.eval(inputs[start:stop], all_logits=True)
        parts.append(token_nll(rows, targets[start + 1 : stop + 1]))
    return np.concatenate(parts)


def count_chunks(n_tokens: int, n_ctx: int, max_chunks: int = -1) -> int:
    """Chunks the method scores; raises llama.cpp's errors for too little text."""
    if n_ctx < 3:
        raise EdgeKVError(f"perplexity needs a context of at least 3 tokens, got -c {n_ctx}")
    if n_tokens < 2 * n_ctx:
        raise EdgeKVError(f"you need at least {2 * n_ctx} tokens to evaluate perplexity with a context of "
                          f"{n_ctx}; the file tokenizes to only {n_tokens} tokens")
    n_chunks = n_tokens // n_ctx
    return min(n_chunks, max_chunks) if max_chunks > 0 else n_chunks


def compute(session, tokens: Sequence[int], n_ctx: int, bos_id: int | None, max_chunks: int = -1,
            on_chunk: Callable[[int, float], None] | None = None) -> PerplexityResult:
    """Run the method over `tokens` (already tokenized, BOS included when the model adds it).
    bos_id: the token that replaces each chunk's first one, None when the model adds no BOS."""
    n_chunks = count_chunks(len(tokens), n_ctx, max_chunks)
    nll = nll2 = 0.0
    count = 0
    running = []
    for i in range(n_chunks):
        values = chunk_nll(session, tokens[i * n_ctx : (i + 1) * n_ctx], bos_id)
        nll += float(values.sum())
        nll2 += float((values * values).sum())
        count += values.size
        running.append(math.exp(nll / count))
        if on_chunk is not None:
            on_chunk(i, running[-1])
    mean, mean2 = nll / count, nll2 / count
    variance = mean2 - mean * mean
    ppl = math.exp(mean)
    uncertainty = ppl * math.sqrt(variance / (count - 1)) if variance > 0 and count > 1 else float("nan")
    return PerplexityResult(ppl, uncertainty, n_chunks, count, running)


def run(args: argparse.Namespace) -> int:
    from ..kernels.config import set_num_threads
    from ..loader import load

    try:
        with open(args.file, "rb") as f:
            text = f.read()
    except OSError as exc:
        raise EdgeKVError(f"cannot read {args.file}: {exc.strerror or exc}") from exc
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
