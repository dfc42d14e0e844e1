"""`edgekv warmup`: compile the kernels for this CPU ahead of the first answer.

What lives here: the command's options and output. What does not: the work (warmup.py).
"""

from __future__ import annotations

import argparse
import sys

from .common import add_backend_option


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("warmup", parents=[common], help="compile the kernels for this CPU (once per install)",
                       description="Compile every kernel the backend will use on this CPU into the kernel cache, "
                                   "so that the first answer does not wait for it. Does nothing when this "
                                   "version's kernels are already compiled here (see --force).")
    add_backend_option(p)
    p.add_argument("-j", "--jobs", type=int, default=None, help="processes to compile in (default: one per core)")
    p.add_argument("--force", action="store_true", help="run even if the kernels are already compiled")
    p.set_defaults(handler=warmup)


def warmup(args: argparse.Namespace) -> int:
    from ..warmup import warmup as run

    def announce(name: str, folder) -> None:
        print(f"edgekv: compiling the {name} backend's kernels for this {'GPU' if name == 'cuda' else 'CPU'} "
              f"into {folder} ...",
              file=sys.stderr, flush=True)

    ran, seconds = run(args.backend, args.jobs, args.force, on_start=announce)
    print(f"edgekv: kernels compiled in {seconds:.1f} s" if ran else "edgekv: kernels already compiled",
          file=sys.stderr)
    return 0
