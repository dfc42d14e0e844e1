"""The `gemma3` architecture (Gemma 3 text models).

Differences from llama: the embedding is scaled by sqrt(dim); Q and K are RMS-normed
per head before NEOX-layout RoPE; attention and FFN outputs get their own RMS norms
before the residual add; the FFN uses tanh-GELU; five of every six layers attend only
to a sliding window (`attention.sliding_window`) and use RoPE base 10000, the sixth is
global with the model's own base. Output is tied to the token embedding.
"""

from __future__ import annotations

import numpy as np

from ..gguf import GGUFFile
from ..kernels.ggml_math import GELU_F16_TABLE
from ..kernels.ops import ROPE_NEOX, add_inplace, gelu_mul, rms_norm, rms_norm_heads, rope_apply
from .base import (Decoder, HParams, Scratch, WeightLoader, attend, fill_rope, load_layer, output_logits, project,
                   project_many, read_common_hparams, read_float, read_int)

ARCH = "gemma3"
SWA_PATTERN = 6  # layer i is local unless i % 6 == 5 (llama.cpp's set_swa_pattern(6))
ROPE_THETA_LOCAL = 10000.0


def read_hparams(g: GGUFFile) -> HParams:
    common = read_common_hparams(g, ARCH, norm_eps=1e-6, rope_theta=1e6)
    window = read_int(g, f"{ARCH}.attention.sliding_window", 0) if g.get(f"{ARCH}.attention.sliding_window") else 0
    n_layers, head_dim, dim = common["n_layers"], common["head_dim"], common["dim"]
    return HParams(
        **common,
        rope_mode=ROPE_NEOX,
        rope_theta_local=read_float(g, f"{ARCH}.rope.freq_base_swa", ROPE_THETA_LOCAL),
        window=window,
        local_layers=tuple(bool(window) and i % SWA_PATTERN < SWA_PATTERN - 1 for i in range(n_layers)),
        attn_scale=1.0 / float(np.sqrt(head_dim)),
        embed_scale=float(np.sqrt(np.float32(dim))),
        final_softcap=float(g.get(f"{ARCH}.final_logit_softcapping", 0.0) or 0.0),
    )


class Gemma3Model(Decoder):
    arch = ARCH

    def __init__(self, g: GGUFFile):
        self.hp = hp = read_hparams(g)
        w = WeightLoader(g)
        self.tok_embd, self.output_norm, self.output = w.embeddings_and_output(hp)
        extra = {"attn_q_norm": hp.head_dim, "attn_k_norm": hp.head_dim,
                 "post_attention_norm": hp.dim, "post_ffw_norm": hp.dim}
        self.layers = [load_layer(w, hp, i, extra) for i in range(hp.n_layers)]
        self.freq_factors = np.ones(hp.rope_dims // 2, np.float32)

    def forward(self, tokens: np.ndarray, cache, res, s: Scratch, rows: np.ndarray, logits: np.ndarray) -> None:
        """Run a chunk of tokens through the model in the cache slots `res` reserved; write
        the logits of the chunk rows `rows`."""
        hp, n, positions = self.hp, tokens.shape[0], res.positions
        eps = np.float32(hp.norm_eps)
        x, h, o = s.x[:n], s.h[:n], s.o[:n]
        q, k, v, att, gate, up = s.q[:n], s.k[:n], s.v[:n], s.att[:n], s.gate[:n], s.up[:n]
        self.tok_embd.rows(tokens, x)
        x *= np.float32(hp.embed_scale)
        rope = {"global": fill_rope(s, "global", positions, hp, hp.rope_theta, self.freq_factors),
                "local": fill_rope(s, "local", positions, hp, hp.rope_theta_local, self.freq_factors)}
        for il, L in enumerate(self.layers):
            cos, sin = rope["local" if hp.local_layers[il] else "global"]
            rms_norm(x, L.attn_norm, eps, h)
            project_many([L.wq, L.wk, L.wv], h, [q, k, v])
            q3, k3 = q.reshape(n, hp.n_heads, hp.head_dim), k.reshape(n, hp.n_kv_heads, hp.head_dim)
            rms_norm_heads(q3, L.extra["attn_q_norm"], eps)
            rms_norm_heads(k3, L.extra["attn_k_norm"], eps)
            rope_apply(q3, cos, sin, hp.rope_mode)
            rope_apply(k3, cos, sin, hp.rope_mode)
            q *= np.float32(hp.attn_scale)  # before attention, as llama.cpp does (it rounds Q to f16)
            attend(hp, cache, s, il, res, q, k, v, att, 1.0)
            project(L.wo, att, o)
            rms_norm(o, L.extra["post_attention_norm"], eps, o)
            add_inplace(x, o)
            rms_norm(x, L.ffn_norm, eps, h)
            project_many([L.w_gate, L.w_up], h, [gate, up])
            gelu_mul(gate, up, GELU_F16_TABLE)
            project(L.w_down, gate, o)
            rms_norm(o, L.extra["post_ffw_norm"], eps, o)
            add_inplace(x, o)
        output_logits(hp, x, self.output_norm, self.output, rows, logits)
