"""The `qwen3` architecture (Qwen3 dense models): llama's graph with per-head RMS norms of
Q and K before RoPE, and no biases.

As llama.cpp's src/models/qwen3.cpp: `attn_q_norm` / `attn_k_norm` (one weight of
head_dim each) normalize every head, then NEOX-layout RoPE; the head size comes from
`qwen3.attention.key_length` and need not be dim / n_heads (Qwen3-0.6B: 1024 / 16 heads,
head size 128).
"""

from __future__ import annotations

from ..backends.base import ROPE_NEOX
from .base import LayerWeights, WeightLoader, load_layer
from .llama import LlamaModel


class Qwen3Model(LlamaModel):
    arch = "qwen3"
    rope_mode = ROPE_NEOX
    default_norm_eps = 1e-6

    def load_layer(self, w: WeightLoader, i: int) -> LayerWeights:
        hp = self.hp
        L = load_layer(w, hp, i, {"attn_q_norm": hp.head_dim, "attn_k_norm": hp.head_dim})
        self.load_biases(w, i, L)
        return L
