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
from .base import (Decoder, HParams, Scratch, WeightLoader, attend, fill_rope, load_layer, output_logits, project,
                   project_many, read_common_hparams, read_float)

ARCH = "llama"


def read_hparams(g: GGUFFile) -> HParams:
    scaling = g.get(f"{ARCH}.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise UnsupportedModelError(f"{g.path}: rope scaling {scaling!r} is not supported (supported: none, linear)")
    factor = read_float(g, f"{ARCH}.rope.scaling.factor", 1.0) if scaling == "linear" else 1.0
    return HParams(**read_common_hparams(g, ARCH, norm_eps=1e-5, rope_theta=10000.0), rope_mode=ROPE_NORM,
                   rope_freq_scale=1.0 / factor if factor else 1.0)


class LlamaModel(Decoder):
    arch = ARCH

    def __init__(self, g: GGUFFile):
        self.hp = hp = read_hparams(g)
        w = WeightLoader(g)
        self.tok_embd, self.output_norm, self.output = w.embeddings_and_output(hp)
        self.layers = [load_layer(w, hp, i, {}) for i in range(hp.n_layers)]
        half = hp.rope_dims // 2
        self.freq_factors = w.vector("rope_freqs.weight", half) if w.has("rope_freqs.weight") else np.ones(half, np.float32)

    def forward(self, tokens: np.ndarray, cache, res, s: Scratch, rows: np.ndarray, logits: np.ndarray) -> None:
        """Run a chunk of tokens through the model in the cache slots `res` reserved; write
        the logits of the chunk rows `rows`."""
        hp, n, positions = self.hp, tokens.shape[0], res.positions
        eps = np.float32(hp.norm_eps)
        x, h, o = s.x[:n], s.h[:n], s.o[:n]
        q, k, v, att, gate, up = s.q[:n], s.k[:n], s.v[:n], s.att[:n], s.gate[:n], s.up[:n]
        self.tok_embd.rows(tokens, x)
        cos, sin = fill_rope(s, "global", positions, hp, hp.rope_theta, self.freq_factors)
        for il, L in enumerate(self.layers):
            rms_norm(x, L.attn_norm, eps, h)
            project_many([L.wq, L.wk, L.wv], h, [q, k, v])
            rope_apply(q.reshape(n, hp.n_heads, hp.head_dim), cos, sin, hp.rope_mode)
            rope_apply(k.reshape(n, hp.n_kv_heads, hp.head_dim), cos, sin, hp.rope_mode)
            attend(hp, cache, s, il, res, q, k, v, att, hp.attn_scale)
            project(L.wo, att, o)
            add_inplace(x, o)
            rms_norm(x, L.ffn_norm, eps, h)
            project_many([L.w_gate, L.w_up], h, [gate, up])
            silu_mul(gate, up)
            project(L.w_down, gate, o)
            add_inplace(x, o)
        output_logits(hp, x, self.output_norm, self.output, rows, logits)
