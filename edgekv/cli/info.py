"""`edgekv info`: what edgekv runs with here (and, with -m, how it runs that model).

What lives here: the command's options and output. What does not: the facts themselves
(system_info.py) or any choice of kernel (backends/).
"""

from __future__ import annotations

import argparse

from .common import add_backend_option


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("info", parents=[common], help="show the version, CPU features, backend and kernels",
                       description="What edgekv runs with on this machine: version, CPU features found, backend, "
                                   "threads, kernel cache folder, CUDA driver, devices and NVRTC; on a Jetson the "
                                   "board, JetPack, power mode, clocks, temperatures and power rails "
                                   "(EDGEKV_SYSFS_ROOT reads another board's files); with -m also which kernel "
                                   "serves each weight type of the model and what a token costs in each KV cache type.")
    p.add_argument("-m", "--model", default=None, help="GGUF file or catalog name to describe")
    add_backend_option(p)
    p.set_defaults(handler=info)


def info(args: argparse.Namespace) -> int:
    from ..backends import get_backend
    from ..system_info import model_info, system_info

    from ..cuda import probe

    backend = get_backend(args.backend)
    facts = system_info(backend)
    facts.update(probe().lines())
    facts.update(board_lines())
    if args.model:
        from ..loader import load

        facts.update(model_info(load(args.model, backend)))
    width = max(len(k) for k in facts)
    for key, value in facts.items():
        print(f"{key.ljust(width)}  {value}")
    return 0


def board_lines() -> dict[str, str]:
    """The board's lines (a Jetson's facts, its power rails now, or the RAPL counters that read)."""
    from ..board.jetson import info_lines, read_board
    from ..board.power import rails, rapl_counters

    board = read_board()
    lines = info_lines(board) if board is not None else {}
    readings = [(r.label, r.watts()) for r in rails()]
    if readings:
        lines["power rails"] = ", ".join(f"{label} {'?' if w is None else f'{w:.2f} W'}" for label, w in readings)
    elif rapl_counters():
        lines["power"] = "RAPL energy counters of " + ", ".join(name for name, _, _ in rapl_counters())
    return lines
