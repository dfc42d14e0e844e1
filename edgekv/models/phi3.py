"""The `phi3` architecture (Phi-3, Phi-3.5; Phi-4-mini shares it): llama's graph with fused
tensors, partial rotary and LongRoPE.

As llama.cpp's src/models/phi3.cpp:
- `attn_qkv.weight` holds Wq, Wk and Wv stacked by rows, `ffn_up.weight` holds Wgate then
  Wup (2 * ff rows; the FFN is swiglu of the two halves). They are split here into the
  separate matrices of llama's graph at load: rows are independent, so the arithmetic is
  the fused matrix's. Separate `attn_q/k/v` tensors are taken too.
- RoPE in the NEOX layout over the first `phi3.rope.dimension_count` dimensions of a head
  (Phi-4-mini rotates 3/4 of them).
- LongRoPE (Phi-3-*-128k, Phi-3.5): per-dimension divisors `rope_factors_long.weight` for
  a session longer than `phi3.rope.scaling.original_context_length`, else
  `rope_factors_short.weight` (llama_model::get_rope_factors), and cos/sin multiplied by
  `phi3.rope.scaling.attn_factor`. "Longer" is judged as llama.cpp judges it, on the
  context rounded up to a multiple of 256 (llama_context pads n_ctx so): the same choice
  for the real models (original contexts of 4096 and 8192), and the same logits for a
  session of 64 over an original context of 128.
- Q is scaled by 1/sqrt(head_dim) before attention.
- `phi3.attention.sliding_window` is ignored, as llama.cpp ignores it ("Phi SWA is
  currently disabled"): one set of logits with llama.cpp matters more here.
"""

from __future__ import annotations

import numpy as np

from ..backends import Backend
from ..backends.base import ROPE_NEOX
from ..gguf.reader import GGUFFile
from .base import LayerWeights, WeightLoader, share_inputs
from .llama import LlamaModel


LLAMA_CPP_CTX_PAD = 256


def llama_cpp_context(n_ctx: int) -> int:
    """The context llama.cpp runs a request for n_ctx tokens in: GGML_PAD(n_ctx, 256)."""
    return -(-n_ctx // LLAMA_CPP_CTX_PAD) * LLAMA_CPP_CTX_PAD


class Phi3Model(LlamaModel):
    arch = "phi3"
    rope_mode = ROPE_NEOX
    default_norm_eps = 1e-5
    scale_q_first = True
    honours_sliding_window = False  # as llama.cpp: "Phi SWA is currently disabled"

    def __init__(self, g: GGUFFile, backend: Backend):
        super().__init__(g, backend)
        w, half = WeightLoader(g, backend), self.hp.rope_dims // 2
        self.factors_long = w.vector("rope_factors_long.weight", half) if w.has("rope_factors_long.weight") else None
        self.factors_short = w.vector("rope_factors_short.weight", half) if w.has("rope_factors_short.weight") else None

    def rope_factors(self, n_ctx: int) -> np.ndarray:
        if self.factors_long is not None and llama_cpp_context(n_ctx) > self.hp.rope_scaling.n_ctx_orig:
            return self.factors_long
        if self.factors_short is not None:
            return self.factors_short
        return self.freq_factors

    def load_layer(self, w: WeightLoader, i: int) -> LayerWeights:
        hp, p = self.hp, f"blk.{i}."
        q_dim, kv_dim = hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim
        if w.has(p + "attn_qkv.weight"):
            wq, wk, wv = w.split_matrix(p + "attn_qkv.weight", hp.dim, (q_dim, kv_dim, hp.n_kv_heads * hp.head_dim_v))
        else:
            wq, wk, wv = (w.matrix(p + f"attn_{x}.weight", hp.dim, n) for x, n in (("q", q_dim), ("k", kv_dim),
                                                                                    ("v", kv_dim)))
        w_gate, w_up = w.split_matrix(p + "ffn_up.weight", hp.dim, (hp.ff, hp.ff))
        L = LayerWeights(
            attn_norm=w.vector(p + "attn_norm.weight", hp.dim), wq=wq, wk=wk, wv=wv,
            wo=w.matrix(p + "attn_output.weight", q_dim, hp.dim),
            ffn_norm=w.vector(p + "ffn_norm.weight", hp.dim), w_gate=w_gate, w_up=w_up,
            w_down=w.matrix(p + "ffn_down.weight", hp.ff, hp.dim))
        self.load_biases(w, i, L)
        return share_inputs(w.backend, L)
