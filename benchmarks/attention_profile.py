"""Where one decode token's f16-cache attention spends its time at depth (issue 19, item 1).

For a catalog model's attention geometry (query heads, KV heads, head size) and a cache
holding `--depth` tokens in f16, times per layer and per token:

- `attention_f16` whole (llama.cpp's non-flash decode arithmetic, one slot at a time: what
  short contexts run) and `attention_f16_deep` whole (the same bits, slot-blocked: what
  decode runs from attention_decode.DEPTH_MIN_SLOTS on),
- the deep kernel's three phases alone: K dots with the masks and chunk maxima, the
  softmax (ggml's exp 16 lanes at a time) with the f16 weights, and the V sums,
- a plain parallel read of the same K and V bytes (the memory floor),
- the deep kernel and the read again over one cache per layer, 64 MiB or more in all, so
  that each layer's K and V come from DRAM as they do in a real decode step.

Then x n_layers for the per-token figure (gemma3: its global layers only; its local
layers see at most the 512-token window). Random data; the time does not depend on it.

    python benchmarks/attention_profile.py [-m NAME,...] [--depth 4096] [-r 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numba as nb
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgekv.catalog import resolve_model  # noqa: E402
from edgekv.kernels import attention_decode as deep  # noqa: E402
from edgekv.kernels.attention import attention_f16  # noqa: E402
from edgekv.kernels.config import JIT_FLAGS  # noqa: E402
from edgekv.loader import load  # noqa: E402
from edgekv.system_info import machine_summary  # noqa: E402


@nb.njit(**dict(JIT_FLAGS, parallel=True))
def stream_read(k_cache, v_cache, n_slots):
    total = 0
    for kvh in nb.prange(k_cache.shape[0]):
        for s in range(n_slots):
            for e in range(k_cache.shape[2]):
                total += k_cache[kvh, s, e] + v_cache[kvh, s, e]
    return total


def best_us(fn, repetitions: int) -> float:
    fn()
    times = []
    for _ in range(repetitions):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * float(np.median(times))


def profile(name: str, depth: int, repetitions: int) -> list[str]:
    hp = load(str(resolve_model(name))).hp
    n_heads, n_kv, hd = hp.n_heads, hp.n_kv_heads, hp.head_dim
    n_global = sum(not local for local in hp.local_layers)
    rng = np.random.default_rng(0)

    def cache():
        return rng.standard_normal((n_kv, depth, hd)).astype(np.float16).view(np.uint16)

    k, v = cache(), cache()
    # a cache per layer, at least 64 MiB in all (more than L3): what decode reads from DRAM
    layers = [(cache(), cache()) for _ in range(max(n_global, -(-(64 << 20) // (2 * k.nbytes))))]
    q = rng.standard_normal((1, n_heads, hd)).astype(np.float32)
    pos = np.arange(depth, dtype=np.int32)
    qpos = np.array([depth], np.int32)
    scores, probs = np.zeros((n_heads, depth), np.float32), np.zeros((n_heads, depth), np.float32)
    pv = np.zeros((nb.config.NUMBA_NUM_THREADS, 4, 16, max(hd, 64)), np.float32)
    lanes = np.zeros((n_heads, 4, 16, hd), np.float32)
    out = np.zeros((1, n_heads, hd), np.float32)
    scale = np.float32(hp.attn_scale)
    end = depth - depth % 16
    maxima = np.full((n_heads, (end + deep.SLOT_CHUNK - 1) // deep.SLOT_CHUNK + 1), -np.inf, np.float32)
    qh = q[0].astype(np.float16).astype(np.float32)

    def deep_layer(kc, vc):
        deep.attention_f16_deep(q.copy(), qpos, kc, vc, pos, depth, 0, scale, scores, probs, lanes, out)

    def every_layer(kernel):
        for kc, vc in layers:
            kernel(kc, vc)

    def phase_softmax():
        scores[:] = saved
        deep._softmax(scores, probs, n_heads, depth, maxima)

    deep._k_scores(qh, depth, k, v, pos, depth, 0, scale, scores, maxima)
    saved = scores.copy()
    parts = {
        "attention_f16 (whole; short contexts)": lambda: attention_f16(q.copy(), qpos, k, v, pos, depth, 0, scale,
                                                                       scores, pv, out),
        "attention_f16_deep (whole)": lambda: deep_layer(k, v),
        "deep: K dots, masks, maxima": lambda: deep._k_scores(qh, depth, k, v, pos, depth, 0, scale, scores, maxima),
        "deep: softmax and f16 weights": phase_softmax,
        "deep: V sums": lambda: deep._v_sums(saved, probs, v, n_heads, depth, lanes),
        "read K and V once (floor)": lambda: stream_read(k, v, depth),
        "attention_f16_deep, each layer's cache from DRAM": lambda: every_layer(deep_layer),
        "read each layer's K and V from DRAM (floor)": lambda: every_layer(lambda kc, vc: stream_read(kc, vc, depth)),
    }
    kv_bytes = k.nbytes + v.nbytes
    lines = [f"\n{name}: {n_heads} query heads, {n_kv} KV heads, head size {hd}, depth {depth}; "
             f"{n_global} of {hp.n_layers} layers attend to the whole cache; K+V {kv_bytes / 2**20:.1f} MiB per layer\n",
             "| part | us per layer | ms per token | GB/s of K+V |", "|---|---:|---:|---:|"]
    for label, fn in parts.items():
        us = best_us(fn, repetitions) / (len(layers) if "DRAM" in label else 1)
        lines.append(f"| {label} | {us:.0f} | {us * n_global / 1e3:.2f} | {kv_bytes / us / 1e3:.1f} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2-135m-instruct,gemma3-270m")
    ap.add_argument("--depth", type=int, default=4096)
    ap.add_argument("-r", type=int, default=20, help="repetitions, the median counts (default: 20)")
    args = ap.parse_args()
    print(f"Machine: {machine_summary()}")
    for name in args.model.split(","):
        print("\n".join(profile(name, args.depth, args.r)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
