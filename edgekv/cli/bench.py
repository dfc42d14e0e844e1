"""`edgekv bench`: prompt processing (pp) and generation (tg) speed, as llama.cpp's llama-bench.

What lives here: the command's options, with llama-bench's names and defaults (-m, -p, -n,
-d, -b, -ctk, -ctv, -t, -r, -o; each list option takes comma-separated values or repeats,
and the cartesian product of the lists is run), and checking every test against every
model before the first one runs; the board's state around the run (a Jetson's power mode and
clock lock in the header, a warning when clocks are not locked or the board throttled; the
power over each test where a source reads: board/). What does not: the method, the
statistics and the output formats (edgekv/lab/bench.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from typing import Callable

from .speculative import add_speculative_options, speculation_from
from ..errors import EdgeKVError
from .common import add_backend_option, non_negative_int, positive_int, read_text_file

log = logging.getLogger("edgekv")


def _list_of(item: Callable[[str], object]) -> Callable[[str], list]:
    """An argparse type: '128,512' -> [item('128'), item('512')]."""
    def parse(text: str) -> list:
        parts = [p.strip() for p in text.split(",")]
        if not all(parts):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
        return [item(p) for p in parts]

    return parse


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("bench", parents=[common], help="measure prompt and generation speed (llama-bench)",
                       description="Measure prompt processing (pp) and text generation (tg) speed in tokens/s "
                                   "on random token ids, as llama.cpp's llama-bench. List options take "
                                   "comma-separated values or repeat (-p 128,512 or -p 128 -p 512); every "
                                   "combination of them is run.")
    lists = (
        ("-m", "--model", str, None, "GGUF files or catalog names (default: the catalog's default model)"),
        ("-p", "--n-prompt", non_negative_int, [512], "prompt lengths, 0 = no pp test (default: 512)"),
        ("-n", "--n-gen", non_negative_int, [128], "generation lengths, 0 = no tg test (default: 128)"),
        ("-d", "--n-depth", non_negative_int, [0], "tokens already in the cache when a test starts (default: 0)"),
        ("-b", "--batch-size", positive_int, [512], "prompt chunk sizes (default: 512)"),
        ("-ctk", "--cache-type-k", str, ["f16"], "KV cache types for K (default: f16)"),
        ("-ctv", "--cache-type-v", str, ["f16"], "KV cache types for V (default: f16)"),
        ("-t", "--threads", positive_int, None, "thread counts (default: all cores)"),
    )
    for short, long, item, default, help_text in lists:
        p.add_argument(short, long, type=_list_of(item), action="append", default=None,
                       metavar="NAME" if item is str else "N", help=help_text)
        p.set_defaults(**{f"{long[2:].replace('-', '_')}_default": default})
    p.add_argument("-r", "--repetitions", type=positive_int, default=5, help="repetitions of each test (default: 5)")
    p.add_argument("-o", "--output", choices=("md", "json", "jsonl", "csv"), default="md",
                   help="output format (default: md)")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up run before each test")
    add_backend_option(p)
    add_speculative_options(p)
    p.add_argument("--spec-prompt", metavar="FILE", default=None,
                   help="with a speculative option: the user turn whose answer is decoded, plain and speculative "
                        "(default: an edit of a code snippet, lab/spec_bench.py)")
    p.set_defaults(handler=bench)


def _values(args: argparse.Namespace, name: str) -> list:
    """A list option's values, flattened over repeats, or its default."""
    given = getattr(args, name)
    return [v for group in given for v in group] if given else getattr(args, f"{name}_default")


def bench(args: argparse.Namespace) -> int:
    if speculation_from(args) is not None:
        return spec_bench(args)
    from ..lab import bench as b
    from ..catalog import default_model_name, resolve_model
    from ..models import read_hparams
    from ..gguf.reader import GGUFFile
    from ..kernels.config import max_threads
    from ..loader import load

    names = _values(args, "model") or [default_model_name()]
    n_batch = _values(args, "batch_size")
    tests = b.bench_matrix(_values(args, "n_prompt"), _values(args, "n_gen"), _values(args, "n_depth"), n_batch,
                           _values(args, "cache_type_k"), _values(args, "cache_type_v"),
                           _values(args, "threads") or [max_threads()])
    paths = [resolve_model(name) for name in names]
    for name, path in zip(names, paths):  # every mistake is found before the first test runs
        b.check_tests(tests, read_hparams(GGUFFile(path)), name, max_threads())
    board, meter = _board_and_meter()
    md_fields = [f for f, _ in b.MD_FIELDS if (f != "n_batch" or n_batch != [b.DEFAULT_N_BATCH])
                 and (f not in b.POWER_MD_FIELDS or meter is not None)]
    printer = b.ResultPrinter(args.output, sys.stdout, md_fields)
    printer.begin()
    for path in paths:
        model = load(path, args.backend)
        info = b.ModelInfo.from_gguf(model.gguf)
        for i, test in enumerate(tests, 1):
            log.info("%s: test %d/%d: %s", info.type, i, len(tests), test.name)
            result = b.run_test(model, test, args.repetitions, info, warmup=not args.no_warmup, meter=meter)
            if board is not None:
                result = replace(result, power_mode=board.power_mode, clocks_locked=board.clocks_locked)
            printer.add(result)
    printer.end()
    _warn_if_throttled(board)
    return 0


def _board_and_meter():
    """The Jetson's facts (None elsewhere) and a power meter (None where nothing reads); the
    header's lines go to stderr, so that the results on stdout stay llama-bench's."""
    from ..board.jetson import read_board
    from ..board.power import PowerMeter

    board, meter = read_board(), PowerMeter.find()
    if board is not None:
        mode = board.power_mode if board.power_mode is not None else f"unknown (default {board.default_mode})"
        locked = {True: "locked", False: "not locked", None: "unknown"}[board.clocks_locked]
        print(f"edgekv bench: {board.model or 'Jetson'}, power mode {mode}, clocks {locked}", file=sys.stderr)
        if board.clocks_locked is False:
            log.warning("the clocks are not locked: figures vary with the governor; run `sudo jetson_clocks` "
                        "(and keep the same power mode) for repeatable figures")
    if meter is not None:
        print(f"edgekv bench: power from {meter.source}", file=sys.stderr)
    return board, meter


def _warn_if_throttled(board) -> None:
    from ..board.jetson import read_board

    if board is None:
        return
    hot = (read_board() or board).throttling
    if hot:
        log.warning("the board was throttling when the run ended (%s): its figures are lower than the board's "
                    "best; cool it or use a lower power mode", ", ".join(f"{z.name} {z.celsius:.1f} C" for z in hot))


def spec_bench(args: argparse.Namespace) -> int:
    """The speculative mode: each model's greedy answer to a prompt, plain and drafted (lab/spec_bench.py)."""
    from ..api.facade import Llama
    from ..catalog import default_model_name
    from ..lab.spec_bench import DEFAULT_PROMPT, MD_HEAD, run_spec_bench

    if args.output == "csv":
        raise EdgeKVError("the speculative mode of edgekv bench writes md, json or jsonl, not csv")

    prompt = DEFAULT_PROMPT if args.spec_prompt is None else read_text_file(args.spec_prompt).decode("utf-8", "replace")
    threads = (_values(args, "threads") or [None])[0]
    results = []
    if args.output == "md":
        print(MD_HEAD, flush=True)
    for name in _values(args, "model") or [default_model_name()]:
        kw = dict(n_ctx="auto", n_threads=threads, backend=args.backend)
        plain, spec = Llama(name, **kw), Llama(name, draft_model=speculation_from(args), **kw)
        for n_gen in [n for n in _values(args, "n_gen") if n > 0]:
            result = run_spec_bench(plain, spec, prompt, n_gen, args.repetitions)
            results.append(result)
            if args.output == "md":
                print(result.md_row(), flush=True)
            elif args.output == "jsonl":
                print(json.dumps(result.record()), flush=True)
    if args.output == "json":
        print(json.dumps([r.record() for r in results], indent=2))
    return 0
