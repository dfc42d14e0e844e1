"""The `edgekv` command line: one subcommand per module, dispatched from `main`.

What lives here: the top-level parser, logging set-up (`-v`), and the one place where
exceptions become exit codes: EdgeKVError (and unreadable files) -> a one-line message on
stderr and status 1, usage errors -> argparse's message and status 2, Ctrl-C -> 130.
What does not: the commands themselves (run.py, chat.py, serve.py, perplexity.py, kv_report.py,
bench.py, mem.py, models.py, info.py, inspect.py, quantize.py, imatrix.py, convert.py, warmup.py) and the options they share (common.py).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from typing import Callable, Sequence

from ..errors import EdgeKVError
from . import bench, chat, convert, imatrix, info, inspect, kv_report, mem, models, perplexity, quantize, run, serve, warmup

COMMANDS = (run, chat, serve, perplexity, kv_report, bench, mem, models, info, inspect, quantize, imatrix, convert,
            warmup)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgekv", description="Run GGUF language models on CPUs and edge devices.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                        help="show progress messages (-vv: debug messages)")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                        help="show progress messages (-vv: debug messages)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.add_parsers(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one edgekv command; returns the process exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else 2
    restore_logging = setup_logging(getattr(args, "verbose", 0))
    try:
        return int(args.handler(args) or 0)
    except EdgeKVError as exc:
        print(f"edgekv: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `edgekv run ... | head -1`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    finally:
        restore_logging()


def console_main() -> int:
    """The process entry point (`edgekv`, `python -m edgekv`): main(), then a fast exit.

    gc.freeze() moves every live object out of the collector's reach, so the interpreter's
    shutdown does not walk the model's and Numba's object graph one last time (~0.1 s of a
    one-shot `edgekv run`). Not in main(): tests call main() many times in one process."""
    status = main()
    gc.freeze()
    return status


def setup_logging(verbosity: int) -> Callable[[], None]:
    """edgekv's messages on stderr: warnings by default, info with -v, debug with -vv.
    Returns a function that puts the "edgekv" logger back as it was (main() in tests)."""
    log = logging.getLogger("edgekv")
    old_level = log.level
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("edgekv: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG)

    def restore() -> None:
        log.removeHandler(handler)
        log.setLevel(old_level)

    return restore


def _version() -> str:
    from ..version import version

    return version()
