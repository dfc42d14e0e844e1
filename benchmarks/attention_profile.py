"""Where one decode token's f16-cache attention spends its time at depth (issue 19, item 1).

For a catalog model's attention geometry (query heads, KV heads, head size) and a cache
holding `--depth` tokens in f16, times per layer and one token:

- `attention_f16` whole (the kernel decode runs: llama.cpp's non-flash arithmetic),
- its three phases run alone with the same helpers, in the same parallel split over heads:
  the K dots (scores), the softmax numerators (ggml's vector exp and 16-lane sums), and the
  V accumulation (probabilities rounded to f16, 4 x 16 lane registers),
- a plain parallel read of the same K and V bytes (the memory floor: what streaming the
  cache once costs here), and how many times the kernel reads them (GQA: every query
  head of a group reads its KV head's rows again).

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
from edgekv.kernels.attention import (_fold_lanes, _reduce16, _register, attention_f16,  # noqa: E402
                                      dot_f16_4reg, softmax_numerators)
from edgekv.kernels.config import JIT_FLAGS, PARALLEL_FLAGS  # noqa: E402
from edgekv.kernels.fp16 import f16_to_f32, round_f16  # noqa: E402
from edgekv.kernels.intrinsics import fma  # noqa: E402
from edgekv.loader import load  # noqa: E402
from edgekv.system_info import machine_summary  # noqa: E402


@nb.njit(**PARALLEL_FLAGS)
def k_phase(q, k_cache, n_slots, scale, scores):
    n_heads, group = q.shape[1], q.shape[1] // k_cache.shape[0]
    for h in nb.prange(n_heads):
        row = scores[h]
        for s in range(n_slots):
            row[s] = dot_f16_4reg(q[0, h], k_cache[h // group, s]) * scale


@nb.njit(**PARALLEL_FLAGS)
def softmax_phase(scores, n_slots, sums):
    for h in nb.prange(sums.shape[0]):
        row = scores[h]
        m = -np.inf
        for s in range(n_slots):
            m = max(m, row[s])
        sums[h] = softmax_numerators(row, n_slots, m)


@nb.njit(**PARALLEL_FLAGS)
def v_phase(probs, v_cache, n_slots, pv, out):
    n_heads, group = out.shape[1], out.shape[1] // v_cache.shape[0]
    for h in nb.prange(n_heads):
        lanes = pv[nb.get_thread_id()]
        lanes[:] = 0.0
        for s in range(n_slots):
            w = round_f16(probs[h, s])
            acc, v_row = lanes[_register(s, False), s % 16], v_cache[h // group, s]
            for e in range(v_row.shape[0]):
                acc[e] = fma(w, f16_to_f32(v_row[e]), acc[e])
        _fold_lanes(lanes)
        for e in range(v_cache.shape[2]):
            out[0, h, e] = _reduce16(lanes[0, :, e])


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
    k = rng.standard_normal((n_kv, depth, hd)).astype(np.float16).view(np.uint16)
    v = rng.standard_normal((n_kv, depth, hd)).astype(np.float16).view(np.uint16)
    q = rng.standard_normal((1, n_heads, hd)).astype(np.float32)
    pos = np.arange(depth, dtype=np.int32)
    qpos = np.array([depth], np.int32)
    scores = np.zeros((n_heads, depth), np.float32)
    pv = np.zeros((nb.config.NUMBA_NUM_THREADS, 4, 16, max(hd, 64)), np.float32)
    out = np.zeros((1, n_heads, hd), np.float32)
    sums = np.zeros(n_heads, np.float64)
    scale = np.float32(hp.attn_scale)
    probs = rng.random((n_heads, depth)).astype(np.float32) / depth
    parts = {
        "attention_f16 (whole)": lambda: attention_f16(q.copy(), qpos, k, v, pos, depth, 0, scale, scores, pv, out),
        "K dots": lambda: k_phase(q, k, depth, scale, scores),
        "softmax numerators": lambda: softmax_phase(scores, depth, sums),
        "V accumulation": lambda: v_phase(probs, v, depth, pv, out),
        "read K and V once (floor)": lambda: stream_read(k, v, depth),
    }
    kv_bytes = k.nbytes + v.nbytes
    lines = [f"\n{name}: {n_heads} query heads, {n_kv} KV heads, head size {hd}, depth {depth}; "
             f"{n_global} of {hp.n_layers} layers attend to the whole cache; K+V {kv_bytes / 2**20:.1f} MiB per layer, "
             f"read {n_heads // n_kv}x by the kernel (once per query head of a group)\n",
             "| part | us per layer | ms per token | GB/s of K+V |", "|---|---:|---:|---:|"]
    for label, fn in parts.items():
        us = best_us(fn, repetitions)
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
