"""A slow, obviously correct float64 NumPy forward pass of the supported architectures.

Tests compare edgekv's kernels against it on tiny random models: it reads the same GGUF
through `gguf.quants.dequantize` (the format's reference), recomputes the whole prompt
at every call, and shares no code with edgekv's models beyond the hyperparameters.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from edgekv.gguf.reader import GGUFFile
from edgekv.models import build_model


def _weights(g: GGUFFile) -> dict[str, np.ndarray]:
    out = {}
    for name, t in g.tensors.items():
        w = dequantize(np.asarray(t.data), GGMLQuantizationType(t.ggml_type))
        out[name] = np.asarray(w, np.float64).reshape(tuple(reversed(t.shape)))
    return out


def _sylvester(n: int) -> np.ndarray:
    """The orthonormal n x n Walsh-Hadamard matrix, Sylvester's construction."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def _rotation_size(head_dim: int, largest: bool) -> int:
    """llama.cpp rotates rows of a quantized cache by a Hadamard matrix (when head_dim is a
    multiple of 64): K by the largest power of two >= 64 dividing head_dim, V by 64."""
    if head_dim % 64:
        return 0
    n = 64
    while largest and head_dim % (2 * n) == 0:
        n *= 2
    return n


IQ4_NL_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def quantize_iq4_nl(rows: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_iq4_nl_ref (gguf.quants has no IQ4_NL quantizer), in float32 step
    by step: per block of 32, the level nearest x / (max / -127) for each value (ties to
    the upper level, as best_index_int8), then d = sum(w q x) / sum(w q q) with w = x^2,
    summed in order. rows: f32[n, m] -> u8[n, m / 32 * 18] blocks {f16 d, nibbles}."""
    b = np.ascontiguousarray(rows, np.float32).reshape(-1, 32)
    mx = b[np.arange(len(b)), np.abs(b).argmax(1)]
    live = np.abs(mx) >= np.float32(1e-15)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.float32(1) / (mx / np.float32(-127))
        al = np.where(live[:, None], inv[:, None] * b, 0).astype(np.float32)
    levels = IQ4_NL_LEVELS
    upper = np.clip(np.searchsorted(levels, al, side="right"), 1, 15)
    lower_closer = (al - levels[upper - 1]) < (levels[upper] - al)
    codes = np.where(al <= levels[0], 0, np.where(al >= levels[15], 15, np.where(lower_closer, upper - 1, upper)))
    codes = np.where(live[:, None], codes, 0)
    q = levels[codes]
    sumqx, sumq2 = np.zeros(len(b), np.float32), np.zeros(len(b), np.float32)
    for j in range(32):
        w = b[:, j] * b[:, j]
        sumqx += w * q[:, j] * b[:, j]
        sumq2 += w * q[:, j] * q[:, j]
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(live & (sumq2 > 0), sumqx / sumq2, 0).astype(np.float16)
    nibbles = (codes[:, :16] | (codes[:, 16:] << 4)).astype(np.uint8)
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), nibbles], axis=1)
    return out.reshape(rows.shape[0], -1)


def _quantize_dequantize(rows: np.ndarray, cache_type: str) -> np.ndarray:
    if cache_type in ("iq4_nl", "iq4_cal"):
        return dequantize(quantize_iq4_nl(rows), GGMLQuantizationType.IQ4_NL).reshape(rows.shape)
    qtype = GGMLQuantizationType[cache_type.upper()]
    return dequantize(quantize(rows, qtype), qtype)


def cache_round(x: np.ndarray, cache_type: str, largest: bool, key_map=None) -> np.ndarray:
    """What a cache of `cache_type` gives back for rows x[..., n_kv_heads, head_dim]: the
    values rounded to f16/bf16, or rotated, quantized into ggml blocks by `gguf.quants` (or
    quantize_iq4_nl), dequantized and rotated back (largest: the K rule of the rotation
    size, else V's). key_map = (mean, scale), f[n_kv_heads, head_dim]: the K of a calibrated
    type goes through (x - mean) * scale first and back after."""
    if cache_type == "f32":
        return x
    if cache_type == "f16":
        return x.astype(np.float16).astype(np.float64)
    if key_map is not None:
        mean, scale = (np.asarray(a, np.float64) for a in key_map)
        return cache_round((x - mean) * scale, cache_type, largest) / scale + mean
    n = _rotation_size(x.shape[-1], largest)
    h = _sylvester(n) if n else None
    y = (x.reshape(-1, n) @ h).reshape(x.shape) if n else x
    rows = y.reshape(-1, x.shape[-1]).astype(np.float32)
    y = _quantize_dequantize(rows, cache_type).astype(np.float64).reshape(x.shape)
    return (y.reshape(-1, n) @ h).reshape(x.shape) if n else y


def _split_fused(w: dict[str, np.ndarray], hp) -> None:
    """Phi-3's fused attn_qkv (rows Q, K, V) and ffn_up (rows gate, up) as separate weights."""
    q_dim, kv_dim = hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim
    for i in range(hp.n_layers):
        p = f"blk.{i}."
        if p + "attn_qkv.weight" in w:
            qkv = w.pop(p + "attn_qkv.weight")
            w[p + "attn_q.weight"], w[p + "attn_k.weight"], w[p + "attn_v.weight"] = np.split(
                qkv, [q_dim, q_dim + kv_dim])
        if p + "ffn_gate.weight" not in w:
            w[p + "ffn_gate.weight"], w[p + "ffn_up.weight"] = np.split(w[p + "ffn_up.weight"], 2)


def _of_layer(cache_type, layer: int) -> str:
    return cache_type if isinstance(cache_type, str) else cache_type[layer]


class ReferenceModel:
    """cache_type_k / cache_type_v: the cache types whose rounding K and V go through
    (`cache_round`); f32 = none; a list gives each layer its own (a per-layer mix). key_map: a calibrated K type's (mean, scale), each
    [n_layers, n_kv_heads, head_dim] (the session's KeyMap: a parameter of the format, like
    the rotation), whose K at positions below `sinks` is kept unrounded. n_ctx: the
    session's context size, which picks Phi-3's long or short LongRoPE factors. RoPE
    scaling is read from the GGUF's keys here, as llama.cpp applies it (linear, YaRN with
    beta 32/1, attn_factor), in float64."""

    def __init__(self, path, cache_type_k: str = "f32", cache_type_v: str = "f32", n_ctx: int = 0,
                 key_map=None, sinks: int = 1):
        g = GGUFFile(path)
        self.hp = hp = build_model(g).hp
        self.w = _weights(g)
        _split_fused(self.w, hp)
        self.cache_type_k, self.cache_type_v = cache_type_k, cache_type_v
        self.key_map, self.sinks = key_map, sinks if key_map is not None else 0
        self._rope_setup(g, n_ctx)

    def _rope_setup(self, g: GGUFFile, n_ctx: int) -> None:
        hp, arch = self.hp, self.hp.arch
        half = hp.rope_dims // 2
        n_orig = g.get(f"{arch}.rope.scaling.original_context_length") or hp.n_ctx_train
        self.factors = self.w.get("rope_freqs.weight", np.ones(half))
        if "rope_factors_long.weight" in self.w:
            padded = -(-n_ctx // 256) * 256  # llama.cpp judges "long" on its context, padded to 256
            self.factors = self.w["rope_factors_long.weight" if padded > n_orig else "rope_factors_short.weight"]
        kind = g.get(f"{arch}.rope.scaling.type", "linear")
        factor = g.get(f"{arch}.rope.scaling.factor", 0.0) or 1.0
        self.freq_scale = 1.0 if kind == "none" else 1.0 / factor
        self.mscale = float(g.get(f"{arch}.rope.scaling.attn_factor", 1.0))
        self.ramp = np.zeros(half)
        if kind == "yarn":  # ggml's rope_yarn: mix towards the unscaled angle below the corrected dims
            def corr(beta):
                return hp.rope_dims * np.log(n_orig / (beta * 2 * np.pi)) / (2 * np.log(hp.rope_theta))
            lo, hi = max(0.0, np.floor(corr(32.0))), min(hp.rope_dims - 1.0, np.ceil(corr(1.0)))
            self.ramp = 1 - np.clip((np.arange(half) - lo) / max(0.001, hi - lo), 0, 1)
            self.mscale *= 1 + 0.1 * np.log(factor)

    def _mm(self, x: np.ndarray, name: str) -> np.ndarray:
        """x @ W^T for the weight `name` (dequantized by gguf.quants)."""
        return x @ self.w[name].T

    def round_k(self, layer: int, k: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """K rows [n, n_kv, hd] at positions pos as the cache gives them back."""
        cache_type = _of_layer(self.cache_type_k, layer)
        if cache_type != "iq4_cal":  # only a calibrated type has a key map and keeps sinks
            return cache_round(k, cache_type, largest=True)
        key_map = None if self.key_map is None else (self.key_map[0][layer], self.key_map[1][layer])
        out = cache_round(k, cache_type, largest=True, key_map=key_map)
        sink = pos < self.sinks
        out[sink] = k[sink]
        return out

    def _rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.hp.norm_eps) * w

    def _rope(self, x, pos, theta):
        hp = self.hp
        half = hp.rope_dims // 2
        extrap = theta ** (-np.arange(half) * 2.0 / hp.rope_dims) / self.factors
        inv = self.freq_scale * extrap * (1 - self.ramp) + extrap * self.ramp
        ang = pos[:, None, None] * inv[None, None, :]
        c, s = np.cos(ang) * self.mscale, np.sin(ang) * self.mscale
        out = x.copy()
        if hp.rope_mode == 2:  # NEOX: halves of the first rope_dims
            a, b = x[..., :half], x[..., half : 2 * half]
            out[..., :half], out[..., half : 2 * half] = a * c - b * s, a * s + b * c
        else:  # NORM: adjacent pairs
            a, b = x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2]
            out[..., 0 : 2 * half : 2], out[..., 1 : 2 * half : 2] = a * c - b * s, a * s + b * c
        return out

    def theta(self, layer: int) -> float:
        hp = self.hp
        return hp.rope_theta_local if hp.local_layers[layer] else hp.rope_theta

    def embed(self, tokens) -> np.ndarray:
        hp = self.hp
        return self.w["token_embd.weight"][np.asarray(tokens)] * (hp.embed_scale if hp.arch == "gemma3" else 1.0)

    def qkv(self, i: int, x: np.ndarray, pos: np.ndarray):
        """Layer i's roped Q and cache-rounded K, V for the residual rows x at positions pos."""
        hp, w, n, p = self.hp, self.w, x.shape[0], f"blk.{i}."
        h = self._rms(x, w[p + "attn_norm.weight"])
        q, k, v = (self._mm(h, p + f"attn_{c}.weight") + w.get(p + f"attn_{c}.bias", 0.0) for c in "qkv")
        q, k = q.reshape(n, hp.n_heads, hp.head_dim), k.reshape(n, hp.n_kv_heads, hp.head_dim)
        if p + "attn_q_norm.weight" in w:  # gemma3, qwen3
            q, k = self._rms(q, w[p + "attn_q_norm.weight"]), self._rms(k, w[p + "attn_k_norm.weight"])
        q, k = self._rope(q, pos, self.theta(i)), self._rope(k, pos, self.theta(i))
        k = self.round_k(i, k, pos)
        v = v.reshape(n, hp.n_kv_heads, hp.head_dim_v)
        return q, k, cache_round(v, _of_layer(self.cache_type_v, i), largest=False)

    def finish(self, i: int, x: np.ndarray, att: np.ndarray, gelu=None) -> np.ndarray:
        """The residual stream after layer i, given its attention output att: [n, n_heads * head_dim_v]."""
        w, p, gemma = self.w, f"blk.{i}.", self.hp.arch == "gemma3"
        o = self._mm(att, p + "attn_output.weight")
        x = x + (self._rms(o, w[p + "post_attention_norm.weight"]) if gemma else o)
        h = self._rms(x, w[p + "ffn_norm.weight"])
        a, b = self._mm(h, p + "ffn_gate.weight"), self._mm(h, p + "ffn_up.weight")
        if gemma:
            act = gelu(a) if gelu else 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a**3)))
        else:
            act = a / (1 + np.exp(-a))
        f = self._mm(act * b, p + "ffn_down.weight")
        return x + (self._rms(f, w[p + "post_ffw_norm.weight"]) if gemma else f)

    def output(self, x: np.ndarray) -> np.ndarray:
        hp, w = self.hp, self.w
        logits = self._mm(self._rms(x, w["output_norm.weight"]),
                          "output.weight" if "output.weight" in w else "token_embd.weight")
        logits = logits + w.get("output.bias", 0.0)
        if hp.final_softcap:
            logits = hp.final_softcap * np.tanh(logits / hp.final_softcap)
        return logits

    def _attention(self, q, k, v, pos, window):
        hp = self.hp
        n, group = q.shape[0], hp.n_heads // hp.n_kv_heads
        out = np.zeros((n, hp.n_heads, hp.head_dim_v))
        delta = pos[:, None] - pos[None, :]
        visible = delta >= 0
        if window:
            visible &= delta < window
        for h in range(hp.n_heads):
            s = q[:, h] @ k[:, h // group].T * hp.attn_scale
            s = np.where(visible, s, -np.inf)
            p = np.exp(s - s.max(1, keepdims=True))
            out[:, h] = (p / p.sum(1, keepdims=True)) @ v[:, h // group]
        return out.reshape(n, -1)

    def logits(self, tokens) -> np.ndarray:
        """float64 logits [len(tokens), n_vocab] for positions 0..len-1."""
        hp = self.hp
        pos = np.arange(len(tokens), dtype=np.float64)
        x = self.embed(tokens)
        for i in range(hp.n_layers):
            q, k, v = self.qkv(i, x, pos)
            x = self.finish(i, x, self._attention(q, k, v, pos, hp.window if hp.local_layers[i] else 0))
        return self.output(x)


def _ggml_gelu(a: np.ndarray) -> np.ndarray:
    """GELU as ggml computes it on CPUs (GGML_GELU_FP16): x rounded to f16, the result
    rounded to f16, identity above 10 and 0 below -10. The step semantics the ring
    tests hold edgekv to; the tanh formula itself is the textbook one."""
    x16 = a.astype(np.float16).astype(np.float64)
    g = (0.5 * x16 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x16 + 0.044715 * x16**3)))).astype(np.float16)
    return np.where(a <= -10, 0.0, np.where(a >= 10, a, g.astype(np.float64)))


class ReferenceSession:
    """Token-by-token float64 evaluation with an explicit cache of roped K and V per layer,
    and llama.cpp's context shift on it: the semantics the ring cache must reproduce."""

    def __init__(self, model: ReferenceModel):
        self.m, hp = model, model.hp
        self.k = [np.zeros((0, hp.n_kv_heads, hp.head_dim)) for _ in range(hp.n_layers)]
        self.v = [np.zeros((0, hp.n_kv_heads, hp.head_dim_v)) for _ in range(hp.n_layers)]
        self.pos = np.zeros(0)
        # the `keep` policy's tallies: the attention each cached token has received in each
        # full-context layer and KV head (softmax weights summed over the head's query heads
        # and the queries), and from how many queries
        self.mass = np.zeros((hp.n_layers, hp.n_kv_heads, 0))
        self.seen = np.zeros(0)

    def discard(self, n_keep: int, n_discard: int) -> None:
        self.evict(np.arange(n_keep, n_keep + n_discard))

    def evict(self, drop: np.ndarray) -> None:
        """Forget the cached tokens at indices `drop`; the others move down to contiguous
        positions, each K re-rotated by RoPE by minus the number of dropped tokens before it."""
        keep = np.setdiff1d(np.arange(len(self.pos)), drop)
        delta = -np.searchsorted(np.sort(drop), keep).astype(np.float64)
        moved = delta != 0
        for i in range(self.m.hp.n_layers):
            k = self.k[i][keep]
            k[moved] = self.m._rope(k[moved], delta[moved], self.m.theta(i))
            k[moved] = self.m.round_k(i, k[moved], np.flatnonzero(moved) + 0.0)  # re-stored after the shift
            self.k[i], self.v[i] = k, self.v[i][keep]
        self.pos = np.arange(len(keep), dtype=np.float64)
        self.mass, self.seen = self.mass[:, :, keep], self.seen[keep]

    def keep_scores(self) -> np.ndarray:
        """Each cached token's largest mean attention per query over layers and KV heads."""
        return (self.mass / np.maximum(self.seen, 1)).max(axis=(0, 1))

    def heavy_hitter_evictions(self, n_keep: int, recent: int, n: int) -> np.ndarray:
        """The `keep` choice as kv/heavy_hitters.py describes it: of the tokens outside the n_keep
        first and the `recent` last, the n whose largest mean attention per query in any layer
        and KV head is the smallest (ties: the older)."""
        score = self.keep_scores()
        candidates = np.arange(n_keep, max(n_keep + n, len(self.pos) - recent))
        return np.sort(sorted(candidates, key=lambda t: (score[t], t))[:n])

    def step(self, token: int) -> np.ndarray:
        m, hp = self.m, self.m.hp
        p = float(len(self.pos))
        self.pos = np.append(self.pos, p)
        self.mass = np.concatenate([self.mass, np.zeros((hp.n_layers, hp.n_kv_heads, 1))], axis=2)
        self.seen = np.append(self.seen, 0.0) + 1
        x = m.embed([token])
        for i in range(hp.n_layers):
            q, k, v = m.qkv(i, x, np.array([p]))
            self.k[i], self.v[i] = np.concatenate([self.k[i], k]), np.concatenate([self.v[i], v])
            window = hp.window if hp.local_layers[i] else 0
            vis = (p - self.pos) < window if window else np.ones(len(self.pos), bool)
            group = hp.n_heads // hp.n_kv_heads
            o = np.zeros((hp.n_heads, hp.head_dim_v))
            for hh in range(hp.n_heads):
                sc = self.k[i][vis, hh // group] @ q[0, hh] * hp.attn_scale
                e = np.exp(sc - sc.max())
                o[hh] = e @ self.v[i][vis, hh // group] / e.sum()
                if not window:
                    self.mass[i, hh // group, vis] += e / e.sum()
            x = m.finish(i, x, o.reshape(1, -1), gelu=_ggml_gelu)
        return m.output(x)[0]
