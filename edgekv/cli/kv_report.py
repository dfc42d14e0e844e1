"""`edgekv kv-report -m MODEL -f TEXT`: what each KV cache type pair costs, as a table and a plot.

What lives here: the command's options, the Markdown table on stdout, progress on stderr.
What does not: the measurements (kv_report.py), the PNG (lab/kv_plot.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ..errors import EdgeKVError
from .common import add_backend_option, mem_size, non_negative_int, positive_int, read_text_file


DEFAULT_TYPES = "f16,q8_0,q5_0,q4_0,q8_0/q4_0,iq4_cal"  # --types


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:

    p = sub.add_parser("kv-report", parents=[common], help="what each KV cache type costs in quality, memory, speed",
                       description="For each K/V cache type pair: perplexity, mean KL divergence from the f16 "
                                   "cache and same-top %% (llama-perplexity's method and figures), bits per value, "
                                   "bytes per token, the longest context that fits --mem-budget, and decode "
                                   "speed at --depth. A Markdown table on stdout; --png draws quality against "
                                   "memory with the Pareto front.")
    p.add_argument("-m", "--model", required=True, help="GGUF file or catalog name (see `edgekv list`)")
    p.add_argument("-f", "--file", required=True, help="text file to score")
    p.add_argument("-c", "--ctx-size", type=positive_int, default=512, help="context of each chunk (default: 512)")
    p.add_argument("-b", "--batch-size", type=positive_int, default=512, help="prompt chunk size (default: 512)")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: all cores)")
    p.add_argument("--types", default=DEFAULT_TYPES,
                   help=f"pairs to compare: TYPE (K and V) or K_TYPE/V_TYPE, comma-separated; a TYPE may mix "
                        f"types over the layers, e.g. q8_0:2+q4_0+q8_0:2 (first and last two layers q8_0); "
                        f"the f16 base is always measured (default: {DEFAULT_TYPES})")
    p.add_argument("--chunks", type=int, default=-1, help="score at most this many chunks (default: all)")
    p.add_argument("--mem-budget", metavar="BYTES", type=mem_size, default="1G",
                   help="memory for the KV cache in the 'longest context' column, e.g. 512M (default: 1G)")
    p.add_argument("--depth", type=non_negative_int, default=4096,
                   help="cached tokens before the decode-speed test; 0 skips the speed test (default: 4096)")
    p.add_argument("--n-gen", type=positive_int, default=32, help="tokens the speed test decodes (default: 32)")
    p.add_argument("--png", metavar="OUT", default=None, help="also draw quality vs memory into this PNG file")
    p.add_argument("--layer-scan", action="store_true",
                   help="first measure what a 4-bit K costs in each layer alone (against an f32 cache, on "
                        "--scan-chunks chunks), then add mixes with the 2, 4 and 6 costliest layers' K in q8_0 "
                        "to --types (about n_layers x 20 s on SmolLM2 with 2 cores)")
    p.add_argument("--scan-chunks", type=positive_int, default=4, help="chunks the layer scan reads (default: 4)")
    p.add_argument("--scan-type", default="iq4_cal", help="the 4-bit type the layer scan tries (default: iq4_cal)")
    add_backend_option(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..lab import kv_report as kv
    from ..kernels.config import set_num_threads
    from ..loader import load

    text = read_text_file(args.file)
    if args.png and not args.png.lower().endswith(".png"):
        raise EdgeKVError(f"--png {args.png!r}: give a file name ending in .png")
    threads = set_num_threads(args.threads)
    model = load(args.model, args.backend)
    hp = model.hp
    pairs = kv.parse_pairs(args.types, hp)
    tokens = model.tokenizer.encode(text, add_bos=None, special=False)
    t0 = time.perf_counter()
    if args.layer_scan:
        pairs += [p for p in layer_scan(model, tokens, args) if p not in pairs]

    def progress(i: int, n: int) -> None:
        print(f"kv-report: chunk {i + 1}/{n} for {len(pairs)} cache pairs ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr, flush=True)

    quality = kv.measure_quality(model, tokens, args.ctx_size, pairs, args.chunks, args.batch_size, progress)
    speed = {}
    for pair in pairs if args.depth else ():
        print(f"kv-report: decode speed of {pair.name} at depth {args.depth}", file=sys.stderr, flush=True)
        speed[pair] = kv.decode_speed(model, pair, args.depth, args.n_gen, 2, threads)
    stores = {p: kv.storage(hp, p, args.mem_budget) for p in pairs}
    points = {p: (stores[p].bytes_per_token, quality[p].kld) for p in pairs}
    front = kv.pareto_front(points)
    print(table(pairs, quality, stores, speed, front, args))
    verdicts = kv.mix_verdicts(points)
    if verdicts:
        print("\nPer-layer mixes against the uniform types:\n" + "\n".join(f"- {v}" for v in verdicts))
    print(f"\n{quality[pairs[0]].n_scored} tokens scored per pair; max ctx is what the memory holds (the model "
          f"was trained for {hp.n_ctx_train:,}); took {time.perf_counter() - t0:.0f} s on {threads} threads", flush=True)
    if args.png:
        from ..lab.kv_plot import save_plot

        rows = [(p.label, (stores[p].bits_k + stores[p].bits_v) / 2, quality[p].kld, p in front) for p in pairs]
        title = f"{model.name}: KV cache types on {os.path.basename(args.file)} (-c {args.ctx_size})"
        save_plot(args.png, title, rows)
        print(f"kv-report: plot written to {args.png}", file=sys.stderr)
    return 0


def layer_scan(model, tokens, args: argparse.Namespace) -> list:
    """Print each layer's K cost (layer_scan.key_costs) and return the mixes it suggests."""
    from ..lab.layer_scan import key_costs, suggested_mixes
    from ..kv.layer_types import cache_type_for

    low = cache_type_for("--scan-type", args.scan_type, model.hp.head_dim).name
    t0 = time.perf_counter()

    def progress(done: int, n: int) -> None:
        print(f"kv-report: layer scan {done}/{n} layers ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    costs = key_costs(model, tokens, args.ctx_size, low, args.scan_chunks, args.batch_size, progress)
    print(f"Mean KLD from an f32 cache with one layer's K in {low} ({args.scan_chunks} chunks of {args.ctx_size}):\n")
    print("| layer | K in " + low + " |\n|---|---|")
    print("\n".join(f"| {i} | {c:.4g} |" for i, c in enumerate(costs)) + "\n", flush=True)
    return suggested_mixes(costs, low)


def table(pairs, quality, stores, speed, front, args) -> str:
    """The Markdown table: one row per pair, the base first."""
    from ..kv.memory import format_bytes

    budget = format_bytes(args.mem_budget)
    head = ["K", "V", "bits/value", "KV bytes/token", "PPL", "mean KLD", "same top", f"max ctx in {budget}"]
    if speed:
        head.append(f"tg{args.n_gen} t/s @ d{args.depth}")
    head.append("Pareto")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in pairs:
        q, s = quality[p], stores[p]
        cells = [p.type_k, p.type_v, f"{(s.bits_k + s.bits_v) / 2:.2f}", f"{s.bytes_per_token:,}",
                 f"{q.ppl:.4f} ± {q.ppl_uncertainty:.4f}", f"{q.kld:.5f} ± {q.kld_uncertainty:.5f}",
                 f"{q.same_top:.2f}%", f"{s.max_ctx:,}"]
        if speed:
            cells.append(f"{speed[p]:.2f}")
        cells.append("yes" if p in front else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)

