"""The `llama` architecture: Llama 2/3, TinyLlama, Mistral, SmolLM2 and kin; and the
graph its relatives (qwen2.py, qwen3.py, phi3.py) share by subclassing `LlamaModel`.

Graph per layer: x += Wo·attn(rope(Wq·n(x) + bq), rope(Wk·n(x) + bk), Wv·n(x) + bv);
x += Wdown·(silu(Wgate·n(x)) * Wup·n(x)), with RMS norms n(). The biases are optional
(llama.cpp loads them for every architecture of this graph; Qwen2 has them). RoPE in
ggml's NORM layout for llama (Q/K rows were permuted by the converter), with the GGUF's
scaling (models/rope.py) and per-dim frequency factors (`rope_freqs.weight`, Llama 3.1+).
The output matrix falls back to the token embedding when the GGUF has no `output.weight`
(tied, as in SmolLM2).

Mistral-style sliding-window attention: when `llama.attention.sliding_window` is set,
every layer attends to that many positions only, as the model was trained. llama.cpp
0c1e570 ignores the key for `llama` GGUFs, so beyond the window its logits differ.

What a subclass sets: `arch`, `rope_mode`, `default_norm_eps`, `scale_q_first` (scale Q
before attention, as llama.cpp's phi3 graph does), `honours_sliding_window`, and may
override `read_hparams`, `load_layer` and `rope_factors`.
"""

from __future__ import annotations

import numpy as np

from ..backends import Backend
from ..backends.base import ROPE_NORM
from ..gguf.reader import GGUFFile
from .base import Decoder, HParams, LayerWeights, Scratch, WeightLoader, load_layer, read_common_hparams
from .keys import read_int

BIASES = ("attn_q.bias", "attn_k.bias", "attn_v.bias")


class LlamaModel(Decoder):
    arch = "llama"
    rope_mode = ROPE_NORM
    default_norm_eps = 1e-5
    scale_q_first = False
    honours_sliding_window = True  # `{arch}.attention.sliding_window` windows every layer

    def __init__(self, g: GGUFFile, backend: Backend):
        self.hp = hp = self.read_hparams(g)
        self.backend = backend
        w = WeightLoader(g, backend)
        self.tok_embd, self.output_norm, self.output = w.embeddings_and_output(hp)
        self.output_bias = w.bias("output.bias", hp.n_vocab)
        self.layers = [self.load_layer(w, i) for i in range(hp.n_layers)]
        half = hp.rope_dims // 2
        self.freq_factors = w.vector("rope_freqs.weight", half) if w.has("rope_freqs.weight") else np.ones(half, np.float32)

    @classmethod
    def read_hparams(cls, g: GGUFFile) -> HParams:
        common = read_common_hparams(g, cls.arch, norm_eps=cls.default_norm_eps, rope_theta=10000.0)
        key = f"{cls.arch}.attention.sliding_window"
        window = read_int(g, key) if cls.honours_sliding_window and g.get(key) else 0
        return HParams(**common, rope_mode=cls.rope_mode, rope_theta_local=common["rope_theta"], window=window,
                       local_layers=(bool(window),) * common["n_layers"])

    def load_layer(self, w: WeightLoader, i: int) -> LayerWeights:
        L = load_layer(w, self.hp, i, {})
        self.load_biases(w, i, L)
        return L

    def load_biases(self, w: WeightLoader, i: int, L: LayerWeights) -> None:
        hp = self.hp
        sizes = (hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim_v)
        for name, n in zip(BIASES, sizes):
            b = w.bias(f"blk.{i}.{name}", n)
            if b is not None:
                L.extra[name] = b

    def forward(self, tokens: np.ndarray, cache, res, s: Scratch, rows: np.ndarray, logits: np.ndarray) -> None:
        """Run a chunk of tokens through the model in the cache slots `res` reserved; write
        the logits of the chunk rows `rows`."""
        hp, be, n = self.hp, self.backend, tokens.shape[0]
        x, h, o, gate, up = s.x[:n], s.h[:n], s.o[:n], s.gate[:n], s.up[:n]
        be.embed(self.tok_embd, tokens, x)
        rope = self.fill_rope(s, "global", res.positions, hp.rope_theta, cache.capacity)
        be.rms_norm(x, self.layers[0].attn_norm, hp.norm_eps, h)
        for il, L in enumerate(self.layers):
            self.attention(il, L, h, rope, cache, res, s, o)
            be.add_rms_norm(x, o, L.ffn_norm, hp.norm_eps, h)
            be.project_many([L.w_gate, L.w_up], h, [gate, up])
            be.silu_mul(gate, up)
            be.project(L.w_down, gate, o)
            self.end_layer(il, x, o, h)
        self.output_logits(x, self.output_norm, self.output, rows, logits)
        if self.output_bias is not None:
            be.add_bias(logits, self.output_bias)

    def attention(self, il: int, L: LayerWeights, h: np.ndarray, rope: tuple, cache, res, s: Scratch,
                  o: np.ndarray) -> None:
        """o = Wo·attention of the normed input h over the cache, for layer il."""
        hp, be, n = self.hp, self.backend, h.shape[0]
        q, k, v, att = s.q[:n], s.k[:n], s.v[:n], s.att[:n]
        be.project_many([L.wq, L.wk, L.wv], h, [q, k, v])
        if L.extra:
            for name, out in zip(BIASES, (q, k, v)):
                if name in L.extra:
                    be.add_bias(out, L.extra[name])
        q3, k3 = q.reshape(n, hp.n_heads, hp.head_dim), k.reshape(n, hp.n_kv_heads, hp.head_dim)
        if "attn_q_norm" in L.extra:  # per-head RMS norms before RoPE (qwen3)
            be.rms_norm_heads(q3, L.extra["attn_q_norm"], hp.norm_eps)
            be.rms_norm_heads(k3, L.extra["attn_k_norm"], hp.norm_eps)
        cos, sin = rope
        be.rope_qk(q3, k3, cos, sin, hp.rope_mode)
        scale = hp.attn_scale
        if self.scale_q_first:
            be.scale(q, scale)
            scale = 1.0
        self.attend(cache, s, il, res, q, k, v, att, scale)
        be.project(L.wo, att, o)
