"""`edgekv perplexity`: llama.cpp's llama-perplexity method, exactly, on a text file.

What lives here: the command and its report; progress prints the running PPL after each
chunk, `[1]18.1234,`. With --kl-divergence-base it also saves the log-probabilities; with
--kl-divergence it compares against them instead (llama-perplexity's report, line for line). What does not: the method (edgekv/lab/perplexity.py), the forward pass
(models/, session.py).
"""

from __future__ import annotations

import argparse
import sys
import time

from ..errors import EdgeKVError
from .common import add_kv_options, add_model_options, read_text_file


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("perplexity", parents=[common], help="perplexity of a model on a text file",
                       description="Perplexity over a text file with llama.cpp's llama-perplexity method.")
    p.add_argument("-f", "--file", help="text file to score (not with --kl-divergence: the base file holds the tokens)")
    add_model_options(p, ctx_default=512, ctx_auto=False)
    add_kv_options(p, shift_default=None, budget=False)  # chunks never overflow; --layer-window only
    p.add_argument("--chunks", type=int, default=-1, help="score at most this many chunks (default: all)")
    p.add_argument("--kl-divergence-base", metavar="FILE",
                   help="alone: also save every scored token's log-probabilities to FILE (llama-perplexity's "
                        "format); with --kl-divergence: the base to compare against")
    p.add_argument("--kl-divergence", action="store_true",
                   help="compare this model and cache types with the base saved in --kl-divergence-base: KL "
                        "divergence, same top token, PPL ratio and their quantiles, as llama-perplexity prints. "
                        "With --kl-divergence-base, saving or comparing, tokens are evaluated as decode steps (-b 1's "
                        "bits; on the CPU several per pass) unless -b is given: the decode kernels round "
                        "activations to 8 bits as llama.cpp does, "
                        "so the figures are llama-perplexity's (the batched prefill's float tiles, -b 512, "
                        "measure less damage)")
    p.set_defaults(handler=run, batch_size=None)  # None: 512, or decode steps with --kl-divergence-base (_session)


def _session(args: argparse.Namespace, model, n_ctx: int):
    """The session, and whether its tokens go as decode steps several per pass (`-b 1`'s
    bits, faster: lab/perplexity.step_passes) rather than in batches of its n_batch."""
    from ..backends.kernel_map import BATCH_MIN_TOKENS
    from ..kv.plan import parse_layer_windows

    windows = parse_layer_windows(args.layer_window, model.hp.n_layers) if args.layer_window else None
    as_steps = bool(args.kl_divergence_base) and args.batch_size is None and model.backend.exact_verify
    n_batch = args.batch_size or (BATCH_MIN_TOKENS - 1 if as_steps else 1 if args.kl_divergence_base else 512)
    return model.session(n_ctx, n_batch, args.cache_type_k, args.cache_type_v, layer_windows=windows), as_steps


def _load(args: argparse.Namespace):
    from ..kernels.config import set_num_threads
    from ..loader import load

    if args.threads is not None:
        set_num_threads(args.threads)
    return load(args.model, args.backend)


def run(args: argparse.Namespace) -> int:
    from ..lab.perplexity import compute, count_chunks

    if args.kl_divergence:
        return run_kl_divergence(args)
    if not args.file:
        raise EdgeKVError("give the text to score: -f FILE")
    text = read_text_file(args.file)
    model = _load(args)
    tok = model.tokenizer
    tokens = tok.encode(text, add_bos=None, special=False)
    n_ctx = args.ctx_size
    n_chunks = count_chunks(len(tokens), n_ctx, args.chunks)
    session, as_steps = _session(args, model, n_ctx)
    batch = f"n_batch=1 (decode steps, up to {session.max_verify()} per pass)" if as_steps else f"n_batch={session.n_batch}"
    print(f"perplexity: {len(tokens)} tokens, {n_chunks} chunks of n_ctx={n_ctx}, {batch}, "
          f"{n_ctx - 1 - n_ctx // 2} tokens scored per chunk", file=sys.stderr, flush=True)
    t0 = time.perf_counter()

    def progress(i: int, ppl: float) -> None:
        if i == 0:
            per_pass = time.perf_counter() - t0
            print(f"perplexity: {per_pass:.2f} seconds per pass", file=sys.stderr, flush=True)
        print(f"[{i + 1}]{ppl:.4f},", end="", flush=True)

    bos = tok.bos_id if tok.add_bos else None
    if args.kl_divergence_base:
        from ..lab.kl_divergence import BaseWriter

        with BaseWriter(args.kl_divergence_base, n_ctx, model.hp.n_vocab, tokens, n_chunks) as writer:
            result = compute(session, tokens, n_ctx, bos, args.chunks, progress, writer.add, as_steps)
    else:
        result = compute(session, tokens, n_ctx, bos, args.chunks, progress)
    print()
    print(f"Final estimate: PPL = {result.ppl:.4f} +/- {result.uncertainty:.5f}", flush=True)
    return 0


def run_kl_divergence(args: argparse.Namespace) -> int:
    from ..lab.kl_divergence import BaseFile, compare

    if not args.kl_divergence_base:
        raise EdgeKVError("--kl-divergence compares with a saved base: add --kl-divergence-base FILE (made by "
                          "`edgekv perplexity -m BASE -f TEXT --kl-divergence-base FILE`)")
    base = BaseFile(args.kl_divergence_base)
    model = _load(args)
    if model.hp.n_vocab != base.n_vocab:
        raise EdgeKVError(f"{base.path} holds log-probabilities over {base.n_vocab} tokens, this model has "
                          f"{model.hp.n_vocab}: compare models that share a vocabulary")
    tok = model.tokenizer
    session, as_steps = _session(args, model, base.n_ctx)
    print(f"kl-divergence: {base.n_chunks} chunks of n_ctx={base.n_ctx} from {base.path} (its context, "
          f"whatever -c says), {base.n_scored} tokens scored per chunk", file=sys.stderr, flush=True)
    print("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              "
          "Δp RMS            Same top p", flush=True)
    stats = compare(session, base, tok.bos_id if tok.add_bos else None, args.chunks,
                    lambda c, st: print(st.chunk_line(c), flush=True), as_steps)
    print()
    if stats.count < 100:
        print(f"({stats.count} tokens: too few for the statistics; llama-perplexity prints none below 100)")
        return 0
    print("\n".join(stats.report()), flush=True)
    return 0
