"""The key map of the calibrated 4-bit cache type (iq4_cal): measured once per model.

Why (benchmarks/kv4_study.py measured each step on SmolLM2 and gemma3; the figures are in
benchmarks/README.md): a 4-bit cache loses its quality in K, not V. K has a large mean
(the channels RoPE barely turns) and channels of very different spread, and a per-token
block of 32 values spends its 16 levels on both. So before the Hadamard rotation and
IQ4_NL's 16 non-uniform levels, iq4_cal stores per layer and KV head

    k' = (k - mean) * s,   q' = q / s,   s_c = (E q_c^2 / E (k_c - mean_c)^2)^(1/4)

Centering is free: q' . k' = q . k - q . mean, the same for every key a query sees, which
softmax ignores. s is the diagonal map that minimizes E (q . dk)^2 for rounding noise dk
of equal size in every channel: the channels the queries weigh most get the finest steps.
(The full-matrix optimum measured no better; one scale per channel costs nothing per token.)

The statistics come from one pass over a fixed text shipped with edgekv (data/calibration.txt,
written for this: prose, a chat, code, figures, three other languages; not any text the
quality is measured on) with an f32 cache; they depend only on the model, are kept in
memory per model and context size and on disk beside the kernel cache (keyed by the model's
fingerprint, the context size and CALIBRATION_VERSION), and travel inside saved states, so
a state always decodes with the map its rows were stored through. The map depends on the
context size because RoPE turns K's mean with the position (measure() says how); a cache
that grows re-codes its K rows for the larger context's map (kv/growth.py copy_into).
What does not live here: applying the map (kv/key_map.KeyMap, the backend's attend).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

import numpy as np

from .cache import SINKS, KeyMap
from ..kernels.jit_cache import kernel_cache_dir
from .layer_types import spec_types
from .types import KV_CACHE_TYPES

log = logging.getLogger("edgekv")

CALIBRATION_TEXT = Path(__file__).resolve().parents[1] / "data" / "calibration.txt"
CALIBRATION_VERSION = 2  # bump when the text or the estimator changes: cached maps go stale
MAX_TOKENS = 1024
OFFSETS = 16  # the calibration text counted at this many offsets over the trained context
SCALE_RANGE = (1e-3, 1e3)  # a channel K never varies in (or Q never reads) must not blow up


class Moments:
    """Running sums of one pass: per layer, KV head and channel, K's sum and sum of squares
    and the mean square of the queries of the head's group (float64)."""

    def __init__(self, n_layers: int, n_kv: int, head_dim: int):
        self.count = np.zeros(n_layers)
        self.k_sum = np.zeros((n_layers, n_kv, head_dim))
        self.k_sq = np.zeros((n_layers, n_kv, head_dim))
        self.q_sq = np.zeros((n_layers, n_kv, head_dim))

    def observe(self, layer: int, positions: np.ndarray, q: np.ndarray, k: np.ndarray) -> None:
        # q: f32[n, n_heads, hd], k: f32[n, n_kv, hd] at positions, as the layer attends with
        # them; the sinks' K is kept apart from the map (cache.SINKS): it must not pull the mean
        rows = positions >= SINKS
        q, k = q[rows], k[rows]
        n, n_kv, hd = k.shape
        k64 = k.astype(np.float64)
        self.count[layer] += n
        self.k_sum[layer] += k64.sum(0)
        self.k_sq[layer] += (k64 * k64).sum(0)
        q64 = q.astype(np.float64).reshape(n, n_kv, -1, hd)
        self.q_sq[layer] += (q64 * q64).mean(2).sum(0)

    def key_map(self) -> KeyMap:
        count = self.count[:, None, None]
        mean = self.k_sum / count
        var_k = np.maximum(self.k_sq / count - mean * mean, 0.0)
        ms_q = self.q_sq / count
        tiny = 1e-12 * (var_k.mean(-1, keepdims=True) + ms_q.mean(-1, keepdims=True)) + 1e-30
        scale = ((ms_q + tiny) / (var_k + tiny)) ** 0.25
        scale /= np.exp(np.log(scale).mean(-1, keepdims=True))  # geometric mean 1 per head: values keep their size
        return KeyMap(mean.astype(np.float32), np.clip(scale, *SCALE_RANGE).astype(np.float32))


def measure(network, tokens: list[int], n_ctx: int, observed_pass, n_offsets: int = OFFSETS) -> KeyMap:
    """The key map for a cache of n_ctx positions from one pass of `network` over token ids:
    observed_pass(network, tokens, observer) runs it with an f32 cache whose `observer` sees
    each layer's Q and K (the loader's Model.observed_pass: this module builds no session).
    When the text is shorter than n_ctx, its Q and K are also counted as if they sat at
    n_offsets - 1 later offsets up to n_ctx - len(tokens) (RoPE turned further by the
    model's shift_keys), so the statistics are those of every position the cache will
    hold: a channel pair that RoPE turns slowly keeps its mean, one it turns fast over the
    context has none (measured on SmolLM2: the map of positions 0-856 alone lost its whole
    gain at positions 2048-4095; one spread over 0-8191 halved it at -c 512)."""
    hp = network.hp
    moments = Moments(hp.n_layers, hp.n_kv_heads, hp.head_dim)
    room = max(n_ctx - len(tokens), 0)
    offsets = sorted({int(d) for d in np.linspace(0, room, n_offsets if room else 1)})

    def observe(layer: int, positions: np.ndarray, q: np.ndarray, k: np.ndarray) -> None:
        for delta in offsets:
            qq, kk = q.copy(), k.copy()
            if delta:
                network.shift_keys(layer, qq, delta)
                network.shift_keys(layer, kk, delta)
            moments.observe(layer, positions, qq, kk)

    observed_pass(network, tokens, observe)
    return moments.key_map()


def _cache_path(fingerprint: str, n_ctx: int) -> Path:
    text = hashlib.sha256(CALIBRATION_TEXT.read_bytes()).hexdigest()[:16]
    name = f"{fingerprint[:32]}-{text}-c{n_ctx}-v{CALIBRATION_VERSION}.npz"
    return kernel_cache_dir().parent / "calibration" / name


def _read(path: Path, hp) -> KeyMap | None:
    shape = (hp.n_layers, hp.n_kv_heads, hp.head_dim)
    try:
        with np.load(path) as f:
            m = KeyMap(f["mean"].astype(np.float32), f["scale"].astype(np.float32))
    except (OSError, KeyError, ValueError):
        return None  # absent, or a damaged file: measure again
    ok = m.mean.shape == m.scale.shape == shape and np.isfinite(m.mean).all() and (m.scale > 0).all()
    return m if ok else None


def _write(path: Path, m: KeyMap) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, mean=m.mean, scale=m.scale)
        os.replace(tmp, path)
    except OSError as exc:  # a read-only home: measure each time, say so once
        log.warning("could not keep the iq4_cal key map in %s (%s): it is measured again next time", path, exc)


def key_map(model, n_ctx: int) -> KeyMap:
    """The key map of a loaded model (loader.Model) for a cache of n_ctx positions: from
    memory, the disk cache, or one measuring pass over the calibration text (1-8 s for a
    135M model on 2 cores, the longer for a long context) on the network the model hands
    out for it (Model.measuring_network: on a GPU, the same file loaded for the CPU)."""
    maps = model.__dict__.setdefault("_key_maps", {})
    if n_ctx in maps:
        return maps[n_ctx]
    path = _cache_path(model.fingerprint(), n_ctx)
    found = _read(path, model.hp)
    if found is None:
        t0 = time.perf_counter()
        tokens = model.tokenizer.encode(CALIBRATION_TEXT.read_bytes())[:MAX_TOKENS]
        found = measure(model.measuring_network(), tokens, n_ctx, model.observed_pass)
        log.info("iq4_cal: measured the key map for %d positions on %d tokens in %.2f s", n_ctx, len(tokens),
                 time.perf_counter() - t0)
        _write(path, found)
    maps[n_ctx] = found
    return found


def key_map_for(model, cache_type_k: str, n_ctx: int) -> KeyMap | None:
    """key_map(model, n_ctx) when the spec cache_type_k gives some layer a calibrated type,
    else None (an unknown name or a malformed spec too: the cache refuses it, saying why)."""
    kinds = [KV_CACHE_TYPES.get(name) for name in spec_types(cache_type_k)]
    if not any(kind is not None and kind.calibrated for kind in kinds):
        return None
    return key_map(model, n_ctx)
