"""Cache type specs: one KV cache type for every layer, or a mix of types over the layers.

A spec is what -ctk / -ctv, `Llama(cache_type_k=...)`, state files and `edgekv kv-report
--types` take: a type name (`q4_0`: every layer), or segments joined by `+`, each `TYPE:N`
(the next N layers) or `TYPE` (the layers the other segments leave; at most one such):

    q8_0:2+q4_0+q8_0:2     first and last two layers q8_0, every layer between q4_0
    q8_0:4+q4_0            the first four q8_0, the rest q4_0
    q8_0:10+q4_0:20        exactly these 30 layers (a model of any other depth refuses it)

so one spec fits models of any depth, and `:` and `+` need no quoting in a shell nor
collide with kv-report's `,` between pairs and `/` between K and V. Why mix: layers differ
in how much a cache type's rounding costs the output (kv-report measures whether a mix
beats a uniform type for a model and text; benchmarks/README.md has what it found).
A spec's canonical name (`spec_name`) spells every segment's count, so two specs that
give each layer the same type have the same name: state files and saved chats compare it.

What does not live here: the types themselves (kv/types.py), the rows they make
(kv/cache.py).
"""

from __future__ import annotations

import re
from typing import Sequence

from ..errors import EdgeKVError
from .types import KVCacheType, kv_cache_type

_SEGMENT = re.compile(r"^([A-Za-z0-9_]+)(?::(\d+))?$")


def cache_type_for(option: str, name: str, head_dim: int) -> KVCacheType:
    """The cache type `name` for rows of head_dim values, or EdgeKVError saying why not."""
    try:
        t = kv_cache_type(name)
    except EdgeKVError as exc:
        raise EdgeKVError(f"{option}={name!r}: {exc}") from None
    block = t.quant.block_size
    if head_dim % block:
        raise EdgeKVError(f"{option}={name!r} stores blocks of {block} values, but this model's head size is "
                          f"{head_dim}, not a multiple of {block}; choose f16, bf16 or f32 for {option}")
    return t


def segments(option: str, spec: str) -> list[tuple[str, int | None]]:
    """`q8_0:2+q4_0` -> [("q8_0", 2), ("q4_0", None)]; EdgeKVError for a malformed spec."""
    out = []
    for part in str(spec).split("+"):
        m = _SEGMENT.match(part.strip())
        if m is None:
            raise EdgeKVError(f"{option}={spec!r}: {part.strip()!r} is not TYPE or TYPE:N; a per-layer mix is "
                              f"segments joined by '+', e.g. q8_0:2+q4_0+q8_0:2")
        out.append((m.group(1), None if m.group(2) is None else int(m.group(2))))
    if sum(n is None for _, n in out) > 1:
        raise EdgeKVError(f"{option}={spec!r}: only one segment may leave out its layer count (it takes the "
                          f"layers the others leave)")
    return out


def spec_types(spec: str) -> set[str]:
    """The type names a spec mentions (lower case), or an empty set when it is malformed."""
    try:
        return {name.lower() for name, _ in segments("", spec)}
    except EdgeKVError:
        return set()


def layer_kinds(option: str, spec: str, head_dim: int, n_layers: int) -> tuple[KVCacheType, ...]:
    """Every layer's cache type under `spec`, or EdgeKVError naming what does not fit."""
    parts = segments(option, spec)
    if len(parts) == 1 and parts[0][1] is None:
        return (cache_type_for(option, parts[0][0], head_dim),) * n_layers
    counted = sum(n for _, n in parts if n is not None)
    rest = n_layers - counted
    if rest < 0 or (rest and all(n is not None for _, n in parts)):
        raise EdgeKVError(f"{option}={spec!r} names {counted} layers, but the model has {n_layers}; give the "
                          f"counts of all {n_layers} layers or leave one segment's count out")
    kinds: list[KVCacheType] = []
    for name, n in parts:
        kinds.extend([cache_type_for(option, name, head_dim)] * (rest if n is None else n))
    return tuple(kinds)


def canonical(option: str, spec: str, head_dim: int, n_layers: int) -> str:
    """The canonical name of `spec` for a model of n_layers (EdgeKVError when it does not fit)."""
    return spec_name(layer_kinds(option, spec, head_dim, n_layers))


def spec_name(kinds: Sequence[KVCacheType]) -> str:
    """The canonical spec of per-layer types: the name when all are one type, else every
    run as TYPE:N (`q8_0:2+q4_0:26+q8_0:2`)."""
    runs: list[list] = []
    for kind in kinds:
        if runs and runs[-1][0] == kind.name:
            runs[-1][1] += 1
        else:
            runs.append([kind.name, 1])
    return runs[0][0] if len(runs) == 1 else "+".join(f"{name}:{n}" for name, n in runs)


def summary(spec: str) -> str:
    """A short label for a canonical spec: the type most layers have, then where the others
    are (`q8_0:2+q4_0:26+q8_0:2` -> `q4_0 (q8_0 in 0-1, 28-29)`); a single type as it is."""
    layers: dict[str, list[int]] = {}
    start = 0
    for name, n in segments("", spec):
        layers.setdefault(name, []).extend(range(start, start + (n or 0)))
        start += n or 0
    if len(layers) == 1:
        return spec
    most = max(layers, key=lambda name: len(layers[name]))
    return most + " (" + "; ".join(f"{name} in {_ranges(ids)}" for name, ids in layers.items() if name != most) + ")"


def _ranges(ids: list[int]) -> str:
    runs: list[list[int]] = []
    for i in ids:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
