"""Context planning: how many tokens the KV cache holds, per layer, and what that costs.

What lives here: `plan_context` (n_ctx="auto" or a number -> a `KVPlan` with the chosen
n_ctx, why it was chosen, every layer's ring capacity and the KV bytes), the default
memory budget (`default_mem_budget`), the `--layer-window` syntax (`parse_layer_windows`),
and the longest
context a budget holds (`max_context`, for `edgekv kv-report`). This is DESIGN.md
section 3's formula `2 * n_layers * n_kv_heads * head_dim * n_ctx * bytes_per_element`
made visible, per cache type and per layer kind.

What does not: the memory report of `edgekv mem` (lab/mem_report.py); allocating anything. The cache (kv/cache.py) makes the rings a plan describes,
the session decides when a ring grows or overflows; nothing here reads weight data.

Capacity of layer i (slots in its ring), with n_ctx the plan's context:
    global layer                         n_ctx
    sliding-window layer (gemma3 local)  min(window + n_batch, n_ctx)
    layer in `layer_windows`             min(layer window (, model window) + n_batch, n_ctx)
A window layer needs its window plus one prefill chunk: the chunk's first token still
attends to `window` older tokens while the chunk's own K/V are already written.
KV bytes = sum_i capacity_i * n_kv_heads * (row_bytes_k_i + row_bytes_v_i), row bytes from
layer i's cache type's ggml block format (gguf/quants.py; a type spec may mix types over the
layers, kv/layer_types.py).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from .fit import RUNTIME_BYTES
from .layer_types import layer_kinds, spec_name
from ..errors import EdgeKVError
from .memory import format_bytes, free_memory

log = logging.getLogger("edgekv")

CTX_ALIGN = 256  # "auto" contexts are multiples of this (and at least this)

# why a plan has its n_ctx
REASON_INPUT = "input length"
REASON_TRAINED = "trained context"
REASON_BUDGET = "memory budget"
REASON_REQUESTED = "requested"

# layer kinds, in report order
GLOBAL, SLIDING, WINDOWED = "global", "sliding-window", "windowed"
LAYER_KINDS = (GLOBAL, SLIDING, WINDOWED)


@dataclass(frozen=True)
class KindSummary:
    """The layers of one kind: how many, their ring capacities, bytes per token and in all."""

    n_layers: int
    capacity_min: int
    capacity_max: int
    bytes_per_token_k: int  # over these layers
    bytes_per_token_v: int
    kv_bytes: int


@dataclass(frozen=True)
class KVPlan:
    """A chosen context: make its cache as KVCache(..., n_ctx, cache_type_k, cache_type_v,
    windows=windows, n_batch=n_batch), whose layer i then has capacities[i] slots."""

    n_ctx: int
    reason: str  # REASON_*
    detail: str  # the reason in words, with the numbers
    cache_type_k: str
    cache_type_v: str
    n_batch: int
    capacities: tuple[int, ...]  # per layer: slots in its ring
    layer_kinds: tuple[str, ...]  # per layer: GLOBAL, SLIDING or WINDOWED
    windows: tuple[int, ...]  # per layer: tokens it attends back over, 0 = the whole context
    row_bytes_k: tuple[int, ...]  # per layer: K bytes of one token, all KV heads
    row_bytes_v: tuple[int, ...]
    mem_budget: int | None = None

    @property
    def n_layers(self) -> int:
        return len(self.capacities)

    @property
    def uniform(self) -> bool:
        """Every layer has the same capacity (no window is smaller than n_ctx - n_batch)."""
        return len(set(self.capacities)) <= 1

    @property
    def bytes_per_token_k(self) -> int:
        """K bytes one token takes over all layers (KVCache.bytes_per_token()[0])."""
        return sum(self.row_bytes_k)

    @property
    def bytes_per_token_v(self) -> int:
        return sum(self.row_bytes_v)

    @property
    def kv_bytes(self) -> int:
        return sum(c * (k + v) for c, k, v in zip(self.capacities, self.row_bytes_k, self.row_bytes_v))

    def kinds(self) -> dict[str, KindSummary]:
        """Layer kind -> its summary, for the kinds present, in LAYER_KINDS order."""
        out = {}
        for kind in LAYER_KINDS:
            layers = [i for i, k in enumerate(self.layer_kinds) if k == kind]
            if layers:
                caps = [self.capacities[i] for i in layers]
                rk, rv = [self.row_bytes_k[i] for i in layers], [self.row_bytes_v[i] for i in layers]
                out[kind] = KindSummary(len(caps), min(caps), max(caps), sum(rk), sum(rv),
                                        sum(c * (k + v) for c, k, v in zip(caps, rk, rv)))
        return out


def _layer_limits(hp, layer_windows: dict[int, int] | None,
                  n_batch: int) -> tuple[list[float], list[str], list[int]]:
    """Per layer: the most slots it can ever need (inf for global layers), its kind and window."""
    layer_windows = layer_windows or {}
    for i, w in layer_windows.items():
        if not 0 <= i < hp.n_layers:
            raise EdgeKVError(f"layer window for layer {i}: the model has layers 0..{hp.n_layers - 1}")
        if w < 1:
            raise EdgeKVError(f"layer window for layer {i} is {w}; a window must be at least 1 token")
    limits, kinds, windows = [], [], []
    local = tuple(hp.local_layers) or (False,) * hp.n_layers
    for i in range(hp.n_layers):
        window = hp.window if local[i] and hp.window else 0
        kind = SLIDING if window else GLOBAL
        if i in layer_windows:
            window = min(window, layer_windows[i]) if window else layer_windows[i]
            kind = WINDOWED
        limits.append(window + n_batch if window else float("inf"))
        kinds.append(kind)
        windows.append(window)
    return limits, kinds, windows


def _kv_bytes(n_ctx: int, limits: list[float], rows: list[int]) -> int:
    # rows: per layer, the K + V bytes of one token
    return sum(int(min(n_ctx, lim)) * row for lim, row in zip(limits, rows))


def plan_context(hp, n_prompt: int, n_predict: int, n_ctx: int | str = "auto", cache_type_k: str = "f16",
                 cache_type_v: str = "f16", mem_budget: int | None = None,
                 layer_windows: dict[int, int] | None = None, n_batch: int = 512) -> KVPlan:
    """Choose the context and every layer's ring capacity.

    n_ctx="auto": n_prompt + n_predict (n_predict < 0: generate until full, so the trained
    context) rounded up to a multiple of 256, capped by hp.n_ctx_train and by the largest
    multiple of 256 whose KV bytes fit in mem_budget (None: no budget; callers that want
    one pass `default_mem_budget(weight_bytes)`). An int n_ctx is taken as is; above the
    trained context or the budget it is logged as a warning, not refused (as llama.cpp).
    """
    if n_batch < 1:
        raise EdgeKVError(f"n_batch must be at least 1, got {n_batch}")
    kinds_k, kinds_v = _kinds(hp, cache_type_k, cache_type_v)
    row_k, row_v = _rows(hp, kinds_k, kinds_v)
    limits, kinds, windows = _layer_limits(hp, layer_windows, n_batch)
    row = [k + v for k, v in zip(row_k, row_v)]
    if n_ctx == "auto":
        n_ctx, reason, detail = _auto_ctx(hp, n_prompt, n_predict, mem_budget, limits, row)
    elif isinstance(n_ctx, int) and not isinstance(n_ctx, bool):
        if n_ctx < 1:
            raise EdgeKVError(f"n_ctx must be at least 1 or 'auto', got {n_ctx}; use -c auto or a positive number")
        reason, detail = REASON_REQUESTED, f"-c {n_ctx}"
        if n_ctx > hp.n_ctx_train:
            log.warning("n_ctx = %d is larger than the model's trained context of %d tokens; output past %d "
                        "tokens may degrade", n_ctx, hp.n_ctx_train, hp.n_ctx_train)
        if mem_budget is not None and _kv_bytes(n_ctx, limits, row) > mem_budget:
            log.warning("n_ctx = %d needs %s of KV cache, more than the memory budget of %s", n_ctx,
                        format_bytes(_kv_bytes(n_ctx, limits, row)), format_bytes(mem_budget))
    else:
        raise EdgeKVError(f"n_ctx must be a positive integer or 'auto', got {n_ctx!r}")
    capacities = tuple(int(min(n_ctx, lim)) for lim in limits)
    return KVPlan(n_ctx, reason, detail, spec_name(kinds_k), spec_name(kinds_v), n_batch, capacities, tuple(kinds),
                  tuple(windows), row_k, row_v, mem_budget)


def _auto_ctx(hp, n_prompt: int, n_predict: int, mem_budget: int | None, limits: list[float],
              row: list[int]) -> tuple[int, str, str]:
    if n_prompt < 0:
        raise EdgeKVError(f"n_prompt must be at least 0, got {n_prompt}")
    if n_predict < 0:
        n_ctx, reason = hp.n_ctx_train, REASON_TRAINED
        detail = f"n_predict = {n_predict} generates until the context is full"
    else:
        needed = n_prompt + n_predict
        n_ctx = max(CTX_ALIGN, -(-needed // CTX_ALIGN) * CTX_ALIGN)
        reason = REASON_INPUT
        detail = f"{n_prompt} prompt + {n_predict} predicted tokens, rounded up to a multiple of {CTX_ALIGN}"
        if n_ctx > hp.n_ctx_train:
            n_ctx, reason = hp.n_ctx_train, REASON_TRAINED
            detail = f"{needed} tokens needed, capped by the trained context of {hp.n_ctx_train}"
    if mem_budget is None or _kv_bytes(n_ctx, limits, row) <= mem_budget:
        return n_ctx, reason, detail
    smallest = min(CTX_ALIGN, n_ctx)
    if _kv_bytes(smallest, limits, row) > mem_budget:
        raise EdgeKVError(
            f"the memory budget of {format_bytes(mem_budget)} cannot hold even {smallest} tokens of KV cache "
            f"({format_bytes(_kv_bytes(smallest, limits, row))}); raise --mem-budget, free memory, or use a "
            f"smaller cache type (-ctk/-ctv q8_0 or q4_0)")
    fitted = max(_fitting_blocks(limits, row, mem_budget, n_ctx // CTX_ALIGN) * CTX_ALIGN, smallest)
    return fitted, REASON_BUDGET, f"{detail}; {n_ctx} tokens do not fit the memory budget of {format_bytes(mem_budget)}"


def max_context(hp, cache_type_k: str, cache_type_v: str, mem_budget: int,
                layer_windows: dict[int, int] | None = None, n_batch: int = 512) -> int:
    """The longest context (a multiple of CTX_ALIGN) whose KV cache fits mem_budget, not
    capped by the trained context; 0 when not even CTX_ALIGN tokens fit."""
    row = [k + v for k, v in zip(*kv_row_bytes(hp, cache_type_k, cache_type_v))]
    limits = _layer_limits(hp, layer_windows, n_batch)[0]
    hi = 1
    while _kv_bytes(hi * CTX_ALIGN, limits, row) <= mem_budget and hi < 1 << 24:
        hi *= 2
    return _fitting_blocks(limits, row, mem_budget, hi) * CTX_ALIGN


def _fitting_blocks(limits: list[float], row: list[int], mem_budget: int, hi: int) -> int:
    """The largest k <= hi whose k * CTX_ALIGN tokens of KV cache fit mem_budget (0: none)."""
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _kv_bytes(mid * CTX_ALIGN, limits, row) <= mem_budget else (lo, mid - 1)
    return lo


def kv_row_bytes(hp, cache_type_k: str, cache_type_v: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per layer, the bytes of one token's K and of its V, all KV heads (EdgeKVError for a
    type unknown, whose blocks do not divide the head size, or a mix that does not fit)."""
    return _rows(hp, *_kinds(hp, cache_type_k, cache_type_v))


def _kinds(hp, cache_type_k: str, cache_type_v: str):
    """Every layer's K type and V type (layer_types.layer_kinds)."""
    return layer_kinds("cache_type_k", cache_type_k, hp.head_dim, hp.n_layers), \
        layer_kinds("cache_type_v", cache_type_v, hp.head_dim_v, hp.n_layers)


def _rows(hp, kinds_k, kinds_v) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (tuple(hp.n_kv_heads * kind.row_nbytes(hp.head_dim) for kind in kinds_k),
            tuple(hp.n_kv_heads * kind.row_nbytes(hp.head_dim_v) for kind in kinds_v))


# ---- memory budget -------------------------------------------------------------------------

def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (memory.free_memory: the smallest of
    MemAvailable and the cgroup limits' headroom); None when none can be read."""
    free = free_memory()
    return None if free is None else free.bytes


def default_mem_budget(weight_bytes: int) -> int | None:
    """Half of what the available memory leaves beside the model's weights and the runtime
    (never below 0); None if the available memory is unknown (no budget)."""
    return budget_from(available_memory(), weight_bytes)


def budget_from(avail: int | None, weight_bytes: int) -> int | None:
    """default_mem_budget for an available-memory figure already read (None: no budget),
    e.g. the one the loader read before the weights (Model.memory_room): half of
    avail - weights - fit.RUNTIME_BYTES. The other half stays free for the compute buffers,
    the page cache and the rest of the device (8 GB Jetson: an 8B Q4_K_M model under 6 GiB
    gets ~0.6 GiB, 4,864 tokens of f16 cache)."""
    if avail is None:
        return None
    return max(0, (int(avail) - int(weight_bytes) - RUNTIME_BYTES) // 2)


def within_device(host: int | None, device: int | None) -> int | None:
    """The KV budget where a backend's device also holds the rings (Backend.kv_memory_limit,
    None: it does not): the smaller of the two; None where neither bounds it."""
    return host if device is None else device if host is None else min(host, device)


# ---- --layer-window ------------------------------------------------------------------------

def parse_layer_windows(spec: str, n_layers: int | None = None) -> dict[int, int]:
    """'0-9:512,12:256' -> {0: 512, ..., 9: 512, 12: 256}: layers (a or a-b, inclusive) and
    the window their ring keeps. Layer indices are checked against n_layers when given."""
    out: dict[int, int] = {}
    for part in str(spec).split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?\s*:\s*(\d+)", part)
        if not m:
            raise EdgeKVError(f"layer window {part!r} in {spec!r}: expected LAYER:WINDOW or FIRST-LAST:WINDOW, "
                              f"e.g. 0-9:512,12:256")
        first, last, window = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3))
        if last < first:
            raise EdgeKVError(f"layer window {part!r}: layer range {first}-{last} runs backwards")
        if window < 1:
            raise EdgeKVError(f"layer window {part!r}: a window must be at least 1 token, got {window}")
        if n_layers is not None and last >= n_layers:
            raise EdgeKVError(f"layer window {part!r}: layer {last} does not exist; the model has layers "
                              f"0..{n_layers - 1}")
        for i in range(first, last + 1):
            if i in out:
                raise EdgeKVError(f"layer window {part!r}: layer {i} is given a window twice in {spec!r}")
            out[i] = window
    return out


# ---- memory report -------------------------------------------------------------------------

def weight_bytes(gguf_file) -> int:
    """Bytes of all tensors in the GGUF's directory (sizes of the mapped views; no data read)."""
    return sum(int(t.data.nbytes) for t in gguf_file.tensors.values())
