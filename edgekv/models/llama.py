"""The `llama` architecture: Llama 2/3, TinyLlama, Mistral, SmolLM2 and kin.

Graph per layer: x += Wo·attn(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x));
x += Wdown·(silu(Wgate·n(x)) * Wup·n(x)), with RMS norms n(). RoPE in ggml's NORM
layout (Q/K rows were permuted by the converter), optional linear scaling and per-dim
frequency factors (`rope_freqs.weight`, Llama 3.1). The output matrix falls back to the
token embedding when the GGUF has no `output.weight` (tied, as in SmolLM2).
"""

from __future__ import annotations

import numpy as np

from ..backends import Backend
from ..backends.base import ROPE_NORM
from ..errors import UnsupportedModelError
from ..gguf import GGUFFile
from .base import Decoder, HParams, Scratch, WeightLoader, load_layer, read_common_hparams, read_float

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

    def __init__(self, g: GGUFFile, backend: Backend):
        self.hp = hp = read_hparams(g)
        self.backend = backend
        w = WeightLoader(g, backend)
        self.tok_embd, self.output_norm, self.output = w.embeddings_and_output(hp)
        self.layers = [load_layer(w, hp, i, {}) for i in range(hp.n_layers)]
        half = hp.rope_dims // 2
        self.freq_factors = w.vector("rope_freqs.weight", half) if w.has("rope_freqs.weight") else np.ones(half, np.float32)

    def forward(self, tokens: np.ndarray, cache, res, s: Scratch, rows: np.ndarray, logits: np.ndarray) -> None:
        """Run a chunk of tokens through the model in the cache slots `res` reserved; write
        the logits of the chunk rows `rows`."""
        hp, be, n = self.hp, self.backend, tokens.shape[0]
        x, h, o = s.x[:n], s.h[:n], s.o[:n]
        q, k, v, att, gate, up = s.q[:n], s.k[:n], s.v[:n], s.att[:n], s.gate[:n], s.up[:n]
        be.embed(self.tok_embd, tokens, x)
        cos, sin = self.fill_rope(s, "global", res.positions, hp.rope_theta)
        for il, L in enumerate(self.layers):
            be.rms_norm(x, L.attn_norm, hp.norm_eps, h)
            be.project_many([L.wq, L.wk, L.wv], h, [q, k, v])
            be.rope(q.reshape(n, hp.n_heads, hp.head_dim), cos, sin, hp.rope_mode)
            be.rope(k.reshape(n, hp.n_kv_heads, hp.head_dim), cos, sin, hp.rope_mode)
            self.attend(cache, s, il, res, q, k, v, att, hp.attn_scale)
            be.project(L.wo, att, o)
            be.add(x, o)
            be.rms_norm(x, L.ffn_norm, hp.norm_eps, h)
            be.project_many([L.w_gate, L.w_up], h, [gate, up])
            be.silu_mul(gate, up)
            be.project(L.w_down, gate, o)
            be.add(x, o)
        self.output_logits(x, self.output_norm, self.output, rows, logits)
