"""Issue 14 item 3: does a per-layer cache type mix beat a uniform type on the Pareto front?

Step 1, the scan (on the first --scan-chunks chunks of the text): for each layer i, the mean
KL divergence from an f32 cache when only layer i's K (then only its V) is stored in the
--low type and every other layer in f32 (the kv-report method: kv_report.measure_quality).
Not from the f16 cache: its attention follows llama.cpp's f16 arithmetic, whose own rounding
moves SmolLM2's next-token distributions by a KLD of 0.0037 from an f32 cache's, and one
f32 layer among f16 ones moves them by 0.0005 (layer 29) to 0.0037 (layer 0): a floor
larger than most single layers' 4-bit cost, and different per layer.
Step 2, the mixes it suggests: K in --high for the n layers whose K costs most (n in
--n-high), --low elsewhere, V in --low; and the positional rules others use (the first and
last two layers high, the first four high). Printed as kv-report `--types` entries; step 3
is `edgekv kv-report --types ...` on the whole text, which gives the table, the Pareto
front and the verdict (benchmarks/README.md has the commands and results).

    python benchmarks/kv_layer_mix.py [-m smollm2-135m-instruct] [-f tests/reference/gpl3.txt]
        [--low iq4_cal] [--high q8_0] [--n-high 2,4,6] [--scan-chunks 4]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgekv.catalog import resolve_model  # noqa: E402
from edgekv.kv_report import CachePair, measure_quality  # noqa: E402
from edgekv.layer_types import spec_name  # noqa: E402
from edgekv.loader import load  # noqa: E402
from edgekv.quants import kv_cache_type  # noqa: E402

GROUP = 8  # pairs measured against one base pass (each holds a session of n_ctx)


def per_layer(types: list[str]) -> str:
    """The spec giving layer i types[i]."""
    return spec_name([kv_cache_type(t) for t in types])


def one_layer(n_layers: int, layer: int, low: str) -> str:
    """The spec with `low` in layer `layer` and f32 in the others."""
    return per_layer(["f32"] * layer + [low] + ["f32"] * (n_layers - 1 - layer))


def scan(model, tokens, n_ctx: int, low: str, chunks: int, both: bool) -> tuple[list[float], list[float]]:
    """Per layer: the KLD of storing only its K, then (both) only its V, in `low`."""
    n = model.hp.n_layers
    pairs = [CachePair(one_layer(n, i, low), "f32") for i in range(n)]
    pairs += [CachePair("f32", one_layer(n, i, low)) for i in range(n)] if both else []
    kld: dict[CachePair, float] = {}
    t0 = time.perf_counter()
    for g in range(0, len(pairs), GROUP):
        group = pairs[g : g + GROUP]
        kld.update({p: q.kld for p, q in measure_quality(model, tokens, n_ctx, group, chunks,
                                                         base_pair=CachePair("f32", "f32")).items()})
        print(f"scan: {min(g + GROUP, len(pairs))}/{len(pairs)} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return [kld[p] for p in pairs[:n]], [kld[p] for p in pairs[n:]] or [float("nan")] * n


def mixes(k_cost: list[float], low: str, high: str, n_high: list[int]) -> list[str]:
    n = len(k_cost)
    ranked = sorted(range(n), key=lambda i: -k_cost[i])
    out = []
    for m in n_high:
        top = set(ranked[:m])
        out.append(per_layer([high if i in top else low for i in range(n)]) + f"/{low}")
    out.append(f"{high}:2+{low}+{high}:2/{low}")
    out.append(f"{high}:4+{low}/{low}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2-135m-instruct")
    ap.add_argument("-f", "--file", default="tests/reference/gpl3.txt")
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("--low", default="iq4_cal")
    ap.add_argument("--high", default="q8_0")
    ap.add_argument("--n-high", default="2,4,6")
    ap.add_argument("--scan-chunks", type=int, default=4)
    ap.add_argument("--scan-v", action="store_true", help="scan V too (the mixes change K only)")
    args = ap.parse_args()
    model = load(resolve_model(args.model))
    tokens = model.tokenizer.encode(Path(args.file).read_text(), add_bos=None, special=False)
    k_cost, v_cost = scan(model, tokens, args.ctx_size, args.low, args.scan_chunks, args.scan_v)
    print(f"{model.name}: KLD from an f32 cache with one layer in {args.low}, the rest f32 ({args.scan_chunks} chunks of "
          f"{args.ctx_size}):\n\n| layer | K | V |\n|---|---|---|")
    for i, (k, v) in enumerate(zip(k_cost, v_cost)):
        print(f"| {i} | {k:.5f} | {v:.5f} |")
    print(f"| sum | {sum(k_cost):.5f} | {sum(v_cost):.5f} |")
    print("\nkv-report --types " + ",".join(mixes(k_cost, args.low, args.high,
                                                    [int(x) for x in args.n_high.split(",")])))


if __name__ == "__main__":
    main()
