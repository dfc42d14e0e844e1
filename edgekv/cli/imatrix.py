"""`edgekv imatrix -m MODEL -f TEXT [-o imatrix.gguf]`: llama-imatrix's importance matrix.

What lives here: the command, its progress bar (chunks, ETA, running PPL) and its report. What
does not: the method (lab/imatrix.py), the file formats (quantize/imatrix.py). The file it
writes is what `edgekv quantize --imatrix` and llama-quantize read.
"""

from __future__ import annotations

import argparse
import sys
import time

from .common import add_backend_option, positive_int, read_text_file


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("imatrix", parents=[common], help="an importance matrix for quantizing (llama-imatrix)",
                       description="Run the model over a text and record, for every weight matrix of its blocks, "
                                   "the mean squared activation of each input column: the importance matrix "
                                   "`edgekv quantize --imatrix` (and llama-quantize) use to fit low-bit types. "
                                   "llama-imatrix's method and file format.")
    p.add_argument("-m", "--model", required=True, help="GGUF file or catalog name (the F16/BF16 original is best)")
    p.add_argument("-f", "--file", required=True, help="the calibration text (a few hundred kB of varied text)")
    p.add_argument("-o", "--output", default="imatrix.gguf", help="the file to write (default: imatrix.gguf)")
    p.add_argument("--output-format", choices=("gguf", "dat"), default=None,
                   help="gguf (default unless -o ends in .dat) or llama.cpp's older dat")
    p.add_argument("-c", "--ctx-size", type=positive_int, default=512, help="tokens per chunk (default: 512)")
    p.add_argument("--chunks", type=int, default=-1, help="use at most this many chunks (default: all)")
    p.add_argument("--process-output", action="store_true", help="also collect output.weight's activations")
    p.add_argument("--no-ppl", action="store_true", help="do not compute the perplexity (a little faster)")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: all cores)")
    add_backend_option(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..kernels.config import set_num_threads
    from ..lab.imatrix import PURPOSE, collect
    from ..lab.perplexity import count_chunks
    from ..loader import load
    from ..quantize.imatrix import write_imatrix, write_imatrix_dat

    text = read_text_file(args.file)
    fmt = args.output_format or ("dat" if args.output.endswith(".dat") else "gguf")
    if args.threads is not None:
        set_num_threads(args.threads)
    model = load(args.model, args.backend or "cpu")
    tok = model.tokenizer
    tokens = tok.encode(text, add_bos=None, special=False)
    n_ctx = args.ctx_size
    n_chunks = count_chunks(len(tokens), n_ctx, args.chunks, PURPOSE)
    session = model.session(n_ctx, n_ctx, "f16", "f16")
    print(f"imatrix: {len(tokens)} tokens, {n_chunks} chunks of n_ctx={n_ctx}", file=sys.stderr, flush=True)
    bar = _bar(n_chunks)
    t0 = time.perf_counter()

    def progress(i: int, n: int, ppl: float | None) -> None:
        bar.update(1)
        if ppl is not None:
            bar.set_postfix_str(f"PPL {ppl:.4f}")

    try:
        result = collect(model, session, tokens, n_ctx, tok.bos_id if tok.add_bos else None, args.chunks,
                         args.process_output, not args.no_ppl, progress)
    finally:
        bar.close()
    if fmt == "gguf":
        write_imatrix(args.output, result.stats(), [args.file], result.n_chunks, n_ctx)
    else:
        write_imatrix_dat(args.output, *_dat_values(result, n_ctx), result.n_chunks, args.file)
    if result.ppl is not None:
        print(f"Final estimate: PPL = {result.ppl:.4f}", flush=True)
    print(f"{args.output}: {len(result.sums)} entries from {result.n_chunks} chunks of {n_ctx} tokens, "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def _dat_values(result, chunk_size: int):
    # the older format stores (sum / count) * ncall, ncall = count / chunk_size rounded up
    import numpy as np

    values, ncall = {}, {}
    for name, sums in result.sums.items():
        count = result.counts[name]
        ncall[name] = (count + chunk_size - 1) // chunk_size
        values[name] = (sums / np.float32(count)) * np.float32(ncall[name])
    return values, ncall


def _bar(total: int):
    from tqdm import tqdm

    return tqdm(total=total, unit="chunk", file=sys.stderr, dynamic_ncols=True, leave=False,
                disable=not sys.stderr.isatty())
