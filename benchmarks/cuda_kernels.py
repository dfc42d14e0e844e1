"""Issue 12: the native/ kernels' speed on the GPU found, at the real models' shapes.

Per kernel call (mean of 200 after 20 warm-up launches, one stream, synchronised at the
end): the weight matvecs of one SmolLM2-135M and one gemma3-270M layer in their GGUF
types, their output matrices, and attention over 4096 cached tokens with the f16, q8_0 and
q4_0 caches, split into ranges or not, and the `keep` policy's tallies after it; the
gate+up matrix times 512 prompt tokens by the matvec and the matmul kernels. `per token` adds one layer's kernels times the layer count plus the output:
a floor for a decode step on this GPU before launch overhead (what a CUDA graph removes).
The weights are random, in the models' shapes and types; only time is measured here
(tests/test_cuda_device.py checks the numbers).

    python benchmarks/cuda_kernels.py        # prints a Markdown table; needs an NVIDIA GPU
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (name, rows, cols, type) per layer, and the output, as the catalog files hold them
# (tests/test_cuda_kernels_benchmark.py checks them against the files' headers). SmolLM2: Q4_1
# layers, Q8_0 output (tied). gemma3-270m Q4_K_M: Q5_0 q/k/gate/up, a Q4_K attn_output (1024
# columns: whole 256-value blocks), and in 9 of its 18 layers (2, 3, 5, 6, ...) a Q5_0 attn_v
# with a Q4_K ffn_down, the layers timed here (the other 9: Q8_0 attn_v, Q6_K ffn_down)
SHAPES = {
    "smollm2-135m": dict(layers=30, heads=(9, 3, 64), matrices=[("qkv", 960, 576, "Q4_1"), ("o", 576, 576, "Q4_1"),
                                                                  ("gate+up", 3072, 576, "Q4_1"),
                                                                  ("down", 576, 1536, "Q4_1")],
                         output=(49152, 576, "Q8_0")),
    "gemma3-270m": dict(layers=18, heads=(4, 1, 256), matrices=[("qkv", 1536, 640, "Q5_0"), ("o", 640, 1024, "Q4_K"),
                                                                 ("gate+up", 4096, 640, "Q5_0"),
                                                                 ("down", 640, 2048, "Q4_K")],
                        output=(262144, 640, "Q8_0")),
}
# the catalog model each entry's shapes come from, and its tensors behind each matrix (stacked rows)
SOURCES = {"smollm2-135m": "smollm2-135m-instruct", "gemma3-270m": "gemma3-270m"}
TENSORS = {"qkv": ("attn_q", "attn_k", "attn_v"), "o": ("attn_output",), "gate+up": ("ffn_gate", "ffn_up"),
           "down": ("ffn_down",)}
DEPTH = 4096
CACHE_TYPES = ("f16", "q8_0", "q4_0")


def _time(dev, fn, n=200, warm=20) -> float:
    for _ in range(warm):
        fn()
    dev.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dev.synchronize()
    return (time.perf_counter() - t) / n


def _weights(rows: int, cols: int, kind: str, rng) -> np.ndarray:
    import gguf
    from gguf.quants import quantize

    t = gguf.GGMLQuantizationType[kind]
    if cols % gguf.GGML_QUANT_SIZES[t][0]:  # a kernel would read past every row and past the buffer
        raise ValueError(f"a {kind} row of {cols} values is not a whole number of blocks: no file holds it")
    if kind in ("Q4_K", "Q5_K", "Q6_K"):  # gguf.quants cannot quantize these: random codes, sane scales
        block, size = gguf.GGML_QUANT_SIZES[t]
        raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
        for at in ((208,) if kind == "Q6_K" else (0, 2)):
            raw[..., at: at + 2] = np.full(raw.shape[:2], 0.01, np.float16).view(np.uint8).reshape(*raw.shape[:2], 2)
        return raw.reshape(rows, -1)
    return quantize(rng.standard_normal((rows, cols)).astype(np.float32), t)


def matvec_us(dev, rows: int, cols: int, kind: str, rng) -> tuple[float, float]:
    w = _weights(rows, cols, kind, rng)
    wb = dev.upload(w)
    x = dev.upload(rng.standard_normal(cols).astype(np.float32))
    xq, out = dev.alloc(cols // 32 * 36), dev.alloc(rows * 4)
    name = f"ek_matvec_{kind.lower().replace('_k', '_K')}"

    def step():
        dev.launch("ek_quantize_q8_1", ((cols // 32 + 7) // 8,), (256,), x, xq, cols // 32)
        dev.launch(name, ((rows + 3) // 4, 1), (32, 4), wb, xq, out, rows, cols, w.shape[1])

    s = _time(dev, step)
    return s * 1e6, w.nbytes / s / 1e9


PREFILL = 512


def prefill_us(dev, rows: int, cols: int, kind: str, rng, matmul: bool) -> float:
    """One matrix times PREFILL tokens: the matvec kernel with a token per grid row, or the
    matmul kernel (each weight sub-block unpacked once per 8 tokens), as prefill runs it."""
    w = _weights(rows, cols, kind, rng)
    wb = dev.upload(w)
    xq, out = dev.alloc(PREFILL * cols // 32 * 36), dev.alloc(PREFILL * rows * 4)
    dev.launch("ek_quantize_q8_1", ((PREFILL * cols // 32 + 7) // 8,), (256,),
               dev.upload(rng.standard_normal((PREFILL, cols)).astype(np.float32)), xq, PREFILL * cols // 32)
    name = f"ek_{'matmul' if matmul else 'matvec'}_{kind.lower().replace('_k', '_K')}"
    args = (wb, xq, out, rows, cols, w.shape[1]) + ((PREFILL,) if matmul else ())
    grid = ((rows + 3) // 4, (PREFILL + 7) // 8 if matmul else PREFILL)
    return _time(dev, lambda: dev.launch(name, grid, (32, 4), *args), n=20, warm=3) * 1e6


def _ring(dev, heads: tuple[int, int, int], cache: str, rng) -> tuple:
    """The attention kernels' ring arguments for one decode query over DEPTH slots."""
    import gguf
    from gguf.quants import quantize

    n_heads, n_kv, hd = heads
    t = gguf.GGMLQuantizationType[cache.upper()]
    rows = quantize(rng.standard_normal((n_kv, DEPTH, hd)).astype(np.float32), t).view(np.uint8)  # F16: halves
    k, v = dev.upload(rows), dev.upload(rows)
    q = dev.upload(rng.standard_normal((n_heads, hd)).astype(np.float32))
    pos = dev.upload(np.arange(DEPTH, dtype=np.int32))
    qp = dev.upload(np.array([DEPTH - 1], np.int32))
    n_slots = dev.upload(np.array([DEPTH], np.int32))
    rb = rows.shape[-1]
    return (q, qp, k, v, pos, n_slots, 0, 0.125, int(t), int(t), n_heads, n_kv, hd, hd, DEPTH, rb, rb, 0, 0)


def attention_us(dev, heads: tuple[int, int, int], cache: str, rng, split: bool) -> float:
    """One decode query over DEPTH slots: one warp per head, or split into ranges and merged
    (as the backend runs it at depth: cuda_launch.attention_splits)."""
    from edgekv.backends.cuda_launch import attention_splits

    n_heads, _, hd = heads
    ring = _ring(dev, heads, cache, rng)
    out = dev.alloc(n_heads * hd * 4)
    n_splits, chunk = attention_splits(DEPTH, 1)
    parts = dev.alloc(n_heads * n_splits * (2 + hd) * 4)

    def run():
        if not split:
            return dev.launch("ek_attention", (n_heads, 1), (32,), *ring, out)
        dev.launch("ek_attention_split", (n_heads, 1, n_splits), (32,), *ring, chunk, parts)
        dev.launch("ek_attention_merge", (n_heads, 1), (32,), parts, n_splits, n_heads, hd, out)

    return _time(dev, run, n=50) * 1e6


def tally_us(dev, heads: tuple[int, int, int], rng) -> float:
    """The `keep` policy's work after one decode query's attention over DEPTH f16 slots: the
    softmax stats, then each slot's weight added to the tallies in mapped host memory."""
    from edgekv.backends.cuda_launch import attention_tally
    from edgekv.cuda.arrays import page_aligned

    n_heads, n_kv, _ = heads
    ring = _ring(dev, heads, "f16", rng)
    stats, mass = dev.alloc(n_heads * 2 * 4), dev.map(page_aligned((n_kv, DEPTH), np.float32), read_only=False)
    shape = attention_tally(DEPTH, n_kv)

    def run():
        dev.launch("ek_attention_stats", (n_heads, 1), (32,), *ring, stats)
        dev.launch("ek_attention_tally", shape.grid, shape.block, *ring, stats, mass, 1)

    return _time(dev, run, n=50) * 1e6


def main(dev=None) -> int:
    from edgekv.cuda.driver import CudaUnavailable
    from edgekv.cuda.runtime import Device

    try:
        dev = dev or Device()
    except CudaUnavailable as exc:
        print(f"cuda_kernels: no CUDA device here, nothing measured ({exc})")
        return 0
    rng = np.random.default_rng(0)
    print(f"GPU: {dev.info.name} (sm_{dev.info.arch}, {dev.info.multiprocessors} SMs), NVRTC "
          f"{dev.nvrtc.version[0]}.{dev.nvrtc.version[1]}\n")
    print("| model | kernel | shape | type | us/call | GB/s (weights) |")
    print("|---|---|---|---|---:|---:|")
    for model, spec in SHAPES.items():
        layer = 0.0
        for name, rows, cols, kind in spec["matrices"]:
            us, gbs = matvec_us(dev, rows, cols, kind, rng)
            layer += us
            print(f"| {model} | {name} | {rows}x{cols} | {kind} | {us:.1f} | {gbs:.0f} |")
        name, rows, cols, kind = spec["matrices"][2]
        for matmul in (False, True):
            us = prefill_us(dev, rows, cols, kind, rng, matmul)
            print(f"| {model} | {name} x{PREFILL} tokens, {'matmul' if matmul else 'matvec'} | {rows}x{cols} | "
                  f"{kind} | {us:.1f} | |")
        rows, cols, kind = spec["output"]
        out_us, gbs = matvec_us(dev, rows, cols, kind, rng)
        print(f"| {model} | output | {rows}x{cols} | {kind} | {out_us:.1f} | {gbs:.0f} |")
        for cache in CACHE_TYPES:
            for split in (False, True):
                us = attention_us(dev, spec["heads"], cache, rng, split)
                print(f"| {model} | attention d{DEPTH}{' split' if split else ''} | {spec['heads']} | {cache} | "
                      f"{us:.1f} | |")
        us = tally_us(dev, spec["heads"], rng)
        print(f"| {model} | keep's tallies d{DEPTH} (per full-context layer) | {spec['heads']} | f16 | {us:.1f} | |")
        floor = layer * spec["layers"] + out_us
        print(f"| {model} | per token, matvecs only | {spec['layers']} layers + output | | {floor:.0f} | "
              f"(<= {1e6 / floor:.0f} t/s) |")
    dev.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
