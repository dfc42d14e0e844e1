"""The `llama` architecture: Llama 2/3, TinyLlama, Mistral, SmolLM2 and kin.

Graph per layer: x += Wo·attn(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x));
x += Wdown·(silu(Wgate·n(x)) * Wup·n(x)), with RMS norms n(). RoPE in ggml's NORM
layout (Q/K rows were permuted by the converter), optional linear scaling and per-dim
frequency factors (`rope_freqs.weight`, Llama 3.1). The output matrix falls back to the
token embedding when the GGUF has no `output.weight` (tied, as in SmolLM2).
"""

from __future__ import annotations

import numpy as np

from ..errors import UnsupportedModelError
from ..gguf import GGUFFile
from ..kernels.ops import ROPE_NORM, add_inplace, rms_norm, rope_apply, silu_mul
from .base import HParams, Scratch, WeightLoader, attend, fill_rope, load_layer, output_logits, project, read_float, read_int

ARCH = "llama"


def read_hparams(g: GGUFFile) -> HParams:
    a = ARCH
    dim, n_heads = read_int(g, f"{a}.embedding_length"), read_int(g, f"{a}.attention.head_count")
    head_dim = read_int(g, f"{a}.attention.key_length", dim // n_heads)
    scaling = g.get(f"{a}.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise UnsupportedModelError(f"{g.path}: rope scaling {scaling!r} is not supported (supported: none, linear)")
    factor = read_float(g, f"{a}.rope.scaling.factor", 1.0) if scaling == "linear" else 1.0
    tokens = g.get("tokenizer.ggml.tokens")
    return HParams(
        arch=a,
        n_vocab=read_int(g, f"{a}.vocab_size", len(tokens) if tokens is not None else None),
        dim=dim,
        n_layers=read_int(g, f"{a}.block_count"),
        n_heads=n_heads,
        n_kv_heads=read_int(g, f"{a}.attention.head_count_kv", n_heads),
        head_dim=head_dim,
        head_dim_v=read_int(g, f"{a}.attention.value_length", head_dim),
        ff=read_int(g, f"{a}.feed_forward_length"),
        n_ctx_train=read_int(g, f"{a}.context_length"),
        norm_eps=read_float(g, f"{a}.attention.layer_norm_rms_epsilon", 1e-5),
        rope_mode=ROPE_NORM,
        rope_theta=read_float(g, f"{a}.rope.freq_base", 10000.0),
        rope_dims=read_int(g, f"{a}.rope.dimension_count", head_dim),
        rope_freq_scale=1.0 / factor if factor else 1.0,
    )


class LlamaModel:
    arch = ARCH

    def __init__(self, g: GGUFFile):
        self.hp = hp = read_hparams(g)
        w = WeightLoader(g)
        self.tok_embd = w.matrix("token_embd.weight", hp.dim, hp.n_vocab)
        self.output_norm = w.vector("output_norm.weight", hp.dim)
        self.output = w.matrix("output.weight", hp.dim, hp.n_vocab) if w.has("output.weight") else self.tok_embd
        self.layers = [load_layer(w, hp, i, {}) for i in range(hp.n_layers)]
        half = hp.rope_dims // 2
        self.freq_factors = w.vector("rope_freqs.weight", half) if w.has("rope_freqs.weight") else np.ones(half, np.float32)

    def forward(self, tokens: np.ndarray, positions: np.ndarray, cache, slots: slice, s: Scratch,
                rows: np.ndarray, logits: np.ndarray) -> None:
        """Run a chunk of tokens through the model; write logits of the chunk rows `rows`."""
        hp, n = self.hp, tokens.shape[0]
        eps = np.float32(hp.norm_eps)
        x, h, o = s.x[:n], s.h[:n], s.o[:n]
        q, k, v, att, gate, up = s.q[:n], s.k[:n], s.v[:n], s.att[:n], s.gate[:n], s.up[:n]
        self.tok_embd.rows(tokens, x)
        cos, sin = fill_rope(s, "global", positions, hp, hp.rope_theta, self.freq_factors)
        for il, L in enumerate(self.layers):
            rms_norm(x, L.attn_norm, eps, h)
            project(L.wq, h, q)
            project(L.wk, h, k)
            project(L.wv, h, v)
            rope_apply(q.reshape(n, hp.n_heads, hp.head_dim), cos, sin, hp.rope_mode)
            rope_apply(k.reshape(n, hp.n_kv_heads, hp.head_dim), cos, sin, hp.rope_mode)
            attend(hp, cache, s, il, slots, positions, q, k, v, att, hp.attn_scale)
            project(L.wo, att, o)
            add_inplace(x, o)
            rms_norm(x, L.ffn_norm, eps, h)
            project(L.w_gate, h, gate)
            project(L.w_up, h, up)
            silu_mul(gate, up)
            project(L.w_down, gate, o)
            add_inplace(x, o)
        output_logits(hp, x, self.output_norm, self.output, rows, logits)
