"""`edgekv quantize IN.gguf OUT.gguf TYPE`: llama-quantize's command, with its flag names.

What lives here: the command's options and its messages. What does not: the type rules
(quantize/plan.py) and the work (quantize/model.py).
"""

from __future__ import annotations

import argparse
import sys

from ..gguf.file_types import ALIASES, FILE_TYPE_NAMES


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    types = ", ".join(FILE_TYPE_NAMES) + " (" + ", ".join(f"{a} = {b}" for a, b in ALIASES.items()) + ")"
    p = sub.add_parser(
        "quantize", parents=[common], help="quantize a GGUF model to another type or mixture",
        description="Write IN's model with its weights in TYPE: " + types + ". The mixtures (Q4_K_M, ...) "
                    "choose a type per tensor by llama.cpp's rules; the output equals llama-quantize's, "
                    "byte for byte. Norms and other 1-D tensors stay as they are.")
    p.add_argument("input", help="the GGUF model to quantize (F32, F16 or BF16; a quantized one needs "
                                 "--allow-requantize)")
    p.add_argument("output", nargs="?", help="the file to write (not needed with --dry-run)")
    p.add_argument("type", metavar="TYPE", help="the file type: " + types)
    p.add_argument("--pure", action="store_true",
                   help="every quantized tensor in TYPE's base type: no mixture rules (rows that do not "
                        "fit the type still fall back)")
    p.add_argument("--output-tensor-type", metavar="T", help="type of output.weight (e.g. Q8_0, F16)")
    p.add_argument("--token-embedding-type", metavar="T", help="type of token_embd.weight")
    p.add_argument("--allow-requantize", action="store_true",
                   help="accept a source whose tensors are already quantized (loses more quality)")
    p.add_argument("--leave-output-tensor", action="store_true", help="keep output.weight as it is")
    p.add_argument("--imatrix", metavar="FILE",
                   help="an importance matrix for this model (llama-imatrix's imatrix.gguf, or its older .dat): "
                        "each tensor's values are fitted weighting the columns its activations use most; "
                        "Q2_K_S needs one")
    p.add_argument("--include-weights", metavar="NAME", action="append", default=[],
                   help="use the importance matrix only for tensors whose name contains NAME (repeatable)")
    p.add_argument("--exclude-weights", metavar="NAME", action="append", default=[],
                   help="do not use the importance matrix for tensors whose name contains NAME (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="print each tensor's type and the sizes; write nothing")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: all cores)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import QuantizeError
    from ..kernels.config import set_num_threads
    from ..quantize.model import plan_lines, quantize_model
    from ..quantize.plan import Options, tensor_type

    if args.output is None and not args.dry_run:
        raise QuantizeError("give the output file: edgekv quantize IN.gguf OUT.gguf TYPE (or --dry-run)")
    opts = Options(
        imatrix=_imatrix(args),
        pure=args.pure, allow_requantize=args.allow_requantize, leave_output_tensor=args.leave_output_tensor,
        output_tensor_type=tensor_type(args.output_tensor_type, "--output-tensor-type")
        if args.output_tensor_type else None,
        token_embedding_type=tensor_type(args.token_embedding_type, "--token-embedding-type")
        if args.token_embedding_type else None)
    set_num_threads(args.threads)
    try:
        result = quantize_model(args.input, args.output or "", args.type, opts, dry_run=args.dry_run)
    except OSError as exc:
        where = exc.filename or args.output
        raise QuantizeError(f"{where}: {exc.strerror or exc}; nothing was written") from None
    if args.dry_run:
        print("\n".join(plan_lines(result.plan)))
        print(f"dry run: {result.summary()}")
    else:
        print(f"{args.output}: {result.summary()}", file=sys.stderr)
    return 0


def _imatrix(args: argparse.Namespace):
    from ..errors import QuantizeError
    from ..quantize.imatrix import load_imatrix

    if args.include_weights and args.exclude_weights:
        raise QuantizeError("--include-weights and --exclude-weights cannot be used together (as in llama-quantize)")
    if not args.imatrix:
        if args.include_weights or args.exclude_weights:
            raise QuantizeError("--include-weights / --exclude-weights choose entries of --imatrix FILE; give it")
        return None
    return load_imatrix(args.imatrix).filtered(args.include_weights, args.exclude_weights)
