"""`edgekv mem`'s report: what a context plan costs in KV cache, weights and compute buffers.

What lives here: `memory_report` (every figure `edgekv mem` prints, as numbers), bytes per
token for each cache type, and the report as text. What does not: choosing the context
(kv/plan.py), the estimates of compute buffers, runtime and peak memory (kv/fit.py), the
command's options (cli/mem.py).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from ..kv import fit
from ..kv.memory import format_bytes
from ..kv.plan import KVPlan, weight_bytes
from ..kv.types import KV_CACHE_TYPES

if TYPE_CHECKING:
    from ..backends.base import DeviceMemory

def compute_bytes(hp, plan: KVPlan) -> dict[str, int]:
    """Estimated working buffers of a forward pass under `plan` (kv/fit.py compute_bytes)."""
    return fit.compute_bytes(hp, plan.n_batch, max(plan.capacities) if plan.capacities else plan.n_ctx)


def bytes_per_token_by_type(hp) -> dict[str, int]:
    """{cache type: bytes one token takes in K and V over all layers} with K = V = that
    type, for the types whose blocks the model's head sizes allow."""
    per_type = {}
    for name, kind in KV_CACHE_TYPES.items():
        if hp.head_dim % kind.quant.block_size == 0 and hp.head_dim_v % kind.quant.block_size == 0:
            row = kind.row_nbytes(hp.head_dim) + kind.row_nbytes(hp.head_dim_v)
            per_type[name] = hp.n_layers * hp.n_kv_heads * row
    return per_type


def memory_report(gguf_file, hp, plan: KVPlan, device: DeviceMemory | None = None) -> dict[str, Any]:
    """Everything `edgekv mem` prints, as numbers (bytes); device: the GPU the backend
    computes on (backends.base.Backend.device_memory), None on the CPU."""
    kinds = plan.kinds()
    weights = weight_bytes(gguf_file)
    compute = compute_bytes(hp, plan)
    per_type = bytes_per_token_by_type(hp)
    return {
        "model": str(gguf_file.get("general.name", os.path.basename(gguf_file.path))),
        "arch": hp.arch, "n_layers": hp.n_layers, "n_kv_heads": hp.n_kv_heads,
        "head_dim": hp.head_dim, "head_dim_v": hp.head_dim_v, "n_ctx_train": hp.n_ctx_train,
        "n_ctx": plan.n_ctx, "reason": plan.reason, "detail": plan.detail, "n_batch": plan.n_batch,
        "cache_type_k": plan.cache_type_k, "cache_type_v": plan.cache_type_v,
        "bytes_per_token_k": plan.bytes_per_token_k, "bytes_per_token_v": plan.bytes_per_token_v,
        "bytes_per_token_by_type": per_type,
        "kv_by_kind": {kind: asdict(s) for kind, s in kinds.items()},
        "kv_bytes": plan.kv_bytes,
        "weights_bytes": weights,
        "compute": compute,
        "compute_bytes": sum(compute.values()),
        "runtime_bytes": fit.RUNTIME_BYTES,
        "total_bytes": fit.process_bytes(weights, plan.kv_bytes, compute),
        "mem_budget": plan.mem_budget,
        "gpu": None if device is None else gpu_report(device, weights, plan.kv_bytes, compute),
    }


def gpu_report(device: DeviceMemory, weights: int, kv_bytes: int, compute: dict[str, int]) -> dict[str, Any]:
    """What the GPU holds: on an integrated GPU (Jetson) nothing of its own, since the
    weights and the rings are the host's memory, mapped (counted once, above); on a discrete
    GPU the uploaded weights, a device copy of each K/V ring and the activations (the
    scratch rows and the logits: attention runs in place, with no score buffer)."""
    out = asdict(device)
    if device.integrated:
        return {**out, "bytes": 0, "fits": True}
    activations = compute["scratch"] + compute["logits"]
    held = weights + kv_bytes + activations
    return {**out, "weights": weights, "kv": kv_bytes, "activations": activations, "bytes": held,
            "fits": held <= device.free}


def _both(n: int) -> str:
    return f"{n:,} bytes ({format_bytes(n)})"


def format_memory_report(report: dict[str, Any]) -> str:
    """The report as text: the plan (n_ctx and why, bytes per token, KV total), then the
    weights, the compute buffers, the runtime and the sum."""
    r = report
    lines = [
        f"model:           {r['model']} ({r['arch']}, {r['n_layers']} layers, {r['n_kv_heads']} KV heads, "
        f"head size {r['head_dim']}" + (f"/{r['head_dim_v']}" if r["head_dim_v"] != r["head_dim"] else "") + ")",
        f"n_ctx:           {r['n_ctx']} ({r['reason']}: {r['detail']}); trained context {r['n_ctx_train']}",
        f"cache types:     K {r['cache_type_k']}, V {r['cache_type_v']}",
        f"KV per token:    K {r['bytes_per_token_k']:,} + V {r['bytes_per_token_v']:,} = "
        f"{r['bytes_per_token_k'] + r['bytes_per_token_v']:,} bytes (all layers)",
        "  by type (K=V): " + ", ".join(f"{name} {n:,}" for name, n in r["bytes_per_token_by_type"].items()),
        "KV cache by layer kind:",
    ]
    for kind, s in r["kv_by_kind"].items():
        cap = (str(s["capacity_min"]) if s["capacity_min"] == s["capacity_max"]
               else f"{s['capacity_min']}-{s['capacity_max']}")
        lines.append(f"  {kind:<15}{s['n_layers']:>4} layers x {cap:>7} slots, "
                     f"{s['bytes_per_token_k'] + s['bytes_per_token_v']:,} bytes/token: {_both(s['kv_bytes'])}")
    lines.append(f"KV cache total:  {_both(r['kv_bytes'])}")
    lines.append(f"weights:         {_both(r['weights_bytes'])}")
    lines.append(f"compute (est.):  {_both(r['compute_bytes'])} = "
                 + " + ".join(f"{name} {format_bytes(n)}" for name, n in r["compute"].items())
                 + f" (n_batch {r['n_batch']})")
    lines.append(f"runtime (est.):  {_both(r['runtime_bytes'])} (Python, NumPy, Numba/LLVM, the compiled kernels)")
    lines.append(f"total:           {_both(r['total_bytes'])} (the process's peak resident memory, predicted)")
    if r["mem_budget"] is not None:
        lines.append(f"KV budget:       {_both(r['mem_budget'])}")
    if r["gpu"] is not None:
        lines += _gpu_lines(r["gpu"])
    return "\n".join(lines)


def _gpu_lines(gpu: dict[str, Any]) -> list[str]:
    kind = "integrated: shares the host's memory" if gpu["integrated"] else "discrete"
    lines = [f"gpu:             {gpu['name']} ({kind}), {format_bytes(gpu['free'])} free of "
             f"{format_bytes(gpu['total'])}"]
    if gpu["integrated"]:
        lines.append("gpu holds:       no copy of its own: the weights and the KV cache above are mapped "
                     "(counted once)")
        return lines
    lines.append(f"gpu holds:       {_both(gpu['bytes'])} = weights {format_bytes(gpu['weights'])} + KV cache "
                 f"{format_bytes(gpu['kv'])} + activations {format_bytes(gpu['activations'])}")
    if not gpu["fits"]:
        lines.append(f"gpu fit:         no: {format_bytes(gpu['bytes'])} > {format_bytes(gpu['free'])} free; "
                     "loading this plan on the GPU fails: use a smaller model, context or cache type, or "
                     "--backend cpu")
    return lines
