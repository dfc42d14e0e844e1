"""Which layers' keys a 4-bit cache hurts most: `edgekv kv-report --layer-scan`.

For each layer i, the mean KL divergence of the next-token distributions when only layer
i's K is stored in the 4-bit type (`low`, iq4_cal by default) and every other K and V in
f32, from an all-f32 cache (kv-report's method, kv_report.measure_quality, on the first
few chunks of the text). Against f32, not f16: the f16 cache's attention follows llama.cpp's
f16 arithmetic, whose own rounding moves SmolLM2's distributions by a KLD of 0.0037 from an
f32 cache's. From the costs, mixes that keep the n costliest layers' K in q8_0 (`high`)
and the rest in `low`, V in `low`: kv-report then measures them beside the uniform types.

Why measure: layers are not alike, and not by position. SmolLM2 (30 layers, gpl3, 4
chunks): one layer's K in iq4_cal costs 0.0012 (layer 29) to 0.0088 (layer 10, twice any
other); q8_0 in layers 2 and 10 takes iq4_cal's 0.0263 to 0.0198 at 4.63 bits, beating
uniform q5_0 (0.0222 at 5.5 bits), while the rule of thumb "first and last two layers"
gives 0.0245 at 4.77 bits (benchmarks/README.md has the tables). The costs do not add up:
their sum is 0.098, the all-iq4_cal cache's KLD 0.026, so they rank layers, nothing more.
What does not live here: the spec syntax (kv/layer_types.py), the measuring (lab/kv_report.py).
"""

from __future__ import annotations

from typing import Callable, Sequence

from .kv_report import CachePair, measure_quality
from ..kv.layer_types import spec_name
from ..kv.types import kv_cache_type

BASE = CachePair("f32", "f32")
GROUP = 8  # layers measured against one base pass (each holds a session of n_ctx)
DEFAULT_COUNTS = (2, 4, 6)


def per_layer(types: Sequence[str]) -> str:
    """The canonical spec giving layer i types[i]."""
    return spec_name([kv_cache_type(t) for t in types])


def one_layer(n_layers: int, layer: int, low: str) -> str:
    """The spec with `low` in layer `layer` and f32 in the others."""
    return per_layer(["f32"] * layer + [low] + ["f32"] * (n_layers - 1 - layer))


def key_costs(model, tokens: Sequence[int], n_ctx: int, low: str, chunks: int, n_batch: int = 512,
              on_group: Callable[[int, int], None] | None = None) -> list[float]:
    """Per layer: the mean KLD from an f32 cache of storing only that layer's K in `low`."""
    n = model.hp.n_layers
    pairs = [CachePair(one_layer(n, i, low), "f32") for i in range(n)]
    kld: dict[CachePair, float] = {}
    for g in range(0, n, GROUP):
        group = pairs[g : g + GROUP]
        kld.update({p: q.kld for p, q in measure_quality(model, tokens, n_ctx, group, chunks, n_batch,
                                                         base_pair=BASE).items()})
        if on_group is not None:
            on_group(min(g + GROUP, n), n)
    return [kld[p] for p in pairs]


def suggested_mixes(costs: Sequence[float], low: str, high: str = "q8_0",
                    counts: Sequence[int] = DEFAULT_COUNTS) -> list[CachePair]:
    """K in `high` for the n costliest layers (n in counts, below the layer count), `low`
    elsewhere; V in `low`."""
    ranked = sorted(range(len(costs)), key=lambda i: -costs[i])
    out = []
    for n in (n for n in counts if 0 < n < len(costs)):
        top = set(ranked[:n])
        k = per_layer([high if i in top else low for i in range(len(costs))])
        out.append(CachePair(k, kv_cache_type(low).name))
    return out
