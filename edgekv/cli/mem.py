"""`edgekv mem`: the memory plan of a model and context, without reading any weights.

What lives here: the command's options (llama.cpp's -c, -ctk, -ctv, -b, plus -p/-n as
token counts for the "auto" context, --layer-window, --mem-budget and --backend: on a
discrete GPU the auto context also fits the GPU's memory) and printing the report. What
does not: the planning (kv/plan.py), the report's arithmetic (lab/mem_report.py).
"""

from __future__ import annotations

import argparse

from ..errors import EdgeKVError
from .common import add_backend_option, ctx_size, non_negative_int, positive_int


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("mem", parents=[common], help="show the memory plan (KV cache, weights, buffers)",
                       description="Plan the context and print what the KV cache, the weights and the compute "
                                   "buffers take. Reads only the GGUF's metadata and tensor directory.")
    p.add_argument("-m", "--model", required=True, help="GGUF file or catalog name (see `edgekv list`)")
    p.add_argument("-c", "--ctx-size", type=ctx_size, default="auto",
                   help="context size in tokens, or 'auto' (from -p and -n; default: auto)")
    p.add_argument("-p", "--n-prompt", type=non_negative_int, default=512,
                   help="prompt tokens the 'auto' context must hold (default: 512)")
    p.add_argument("-n", "--n-predict", type=int, default=128,
                   help="tokens to generate, -1 = until the context is full (default: 128)")
    p.add_argument("-b", "--batch-size", type=positive_int, default=512, help="prompt chunk size (default: 512)")
    p.add_argument("-ctk", "--cache-type-k", default="f16",
                   help="KV cache type for K, or a per-layer mix such as q8_0:2+q4_0+q8_0:2 (default: f16)")
    p.add_argument("-ctv", "--cache-type-v", default="f16",
                   help="KV cache type for V, or a per-layer mix (default: f16)")
    p.add_argument("--layer-window", metavar="SPEC", default=None,
                   help="keep only a window in some layers: LAYERS:WINDOW[,...], e.g. 0-9:512,12:256")
    p.add_argument("--mem-budget", metavar="BYTES", default=None,
                   help="memory for the KV cache, e.g. 512M or 2G (default: half of what the available memory "
                        "leaves beside the weights and the runtime; available = the smallest of MemAvailable and "
                        "the cgroup limit's headroom)")
    add_backend_option(p)
    p.set_defaults(handler=mem)


def mem(args: argparse.Namespace) -> int:
    from ..backends import get_backend
    from ..catalog import resolve_model
    from ..gguf.reader import GGUFFile
    from ..kv import plan as kvplan
    from ..lab.mem_report import format_memory_report, memory_report
    from ..models import read_hparams

    g = GGUFFile(resolve_model(args.model))
    hp = read_hparams(g)
    windows = None
    if args.layer_window:
        windows = kvplan.parse_layer_windows(args.layer_window, hp.n_layers)
    backend = get_backend(args.backend)  # the one loading would use: auto may take a GPU
    device = backend.device_memory()
    budget, source = _budget(args, kvplan.weight_bytes(g), backend)
    refusal = _refusal(g, hp, device)
    if refusal is not None and args.mem_budget is None:
        budget, source = None, "no budget: the model does not fit (below)"

    def plan_with(budget):
        return kvplan.plan_context(hp, args.n_prompt, args.n_predict, args.ctx_size, args.cache_type_k,
                                   args.cache_type_v, mem_budget=budget, layer_windows=windows,
                                   n_batch=args.batch_size)

    try:
        plan = plan_with(budget)
    except EdgeKVError:
        if args.mem_budget is not None or budget is None:
            raise
        # as loading does: a default budget below the smallest context keeps the context there
        plan = plan_with(None)
        source += "; below the smallest context, which loading keeps to"
    print(format_memory_report(memory_report(g, hp, plan, device)))
    print(f"budget from:     {source}")
    _print_board_memory()
    if refusal is not None:
        print(f"fits:            no: loading refuses it: {refusal}")
        return 1
    return 0


def _print_board_memory() -> None:
    """On a Jetson: the shared RAM, what other processes hold, the GPU's clients (board/jetson.py)."""
    from ..board.jetson import memory_lines, read_board

    if read_board() is None:
        return
    for key, value in memory_lines().items():
        print(f"{(key + ':').ljust(17)}{value}")


def _refusal(g, hp, device) -> str | None:
    """What loading would say in refusing this model (loader.check_host_memory), or None."""
    from ..kv.fit import ModelTooLargeError
    from ..loader import check_host_memory

    try:
        check_host_memory(g, hp, device)
    except ModelTooLargeError as exc:
        return str(exc)
    return None


def _budget(args: argparse.Namespace, weights: int, backend) -> tuple[int | None, str]:
    """The KV budget an auto context gets, as loading computes it (api/context_growth.py),
    and where it came from in words."""
    from ..kv import plan as kvplan
    from ..kv.memory import format_bytes, free_memory, parse_size

    if args.mem_budget is not None:
        budget = parse_size(args.mem_budget)
        if budget < 1:
            raise EdgeKVError(f"--mem-budget {args.mem_budget!r} is zero; give a positive size such as 512M")
        return budget, "--mem-budget"
    free = free_memory()
    budget = kvplan.budget_from(None if free is None else free.bytes, weights)  # the figure printed
    source = ("no budget: the free memory cannot be read here" if free is None else
              f"half of {free} less the weights and the runtime")
    device = backend.kv_memory_limit(weights)  # a discrete GPU holds the rings (and the weights) too
    chosen = kvplan.within_device(budget, device)
    if device is None:
        return chosen, source
    gpu = f"half the GPU's free memory once the weights are on it ({format_bytes(device)})"
    if budget is None:
        return chosen, gpu
    return chosen, (gpu + f", less than {source}" if device < budget else source + f", less than {gpu}")
