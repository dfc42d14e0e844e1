"""The `gemma3` architecture (Gemma 3 text models).

Differences from llama: the embedding is scaled by sqrt(dim); Q and K are RMS-normed
per head before NEOX-layout RoPE; attention and FFN outputs get their own RMS norms
before the residual add; the FFN uses tanh-GELU; five of every six layers attend only
to a sliding window (`attention.sliding_window`) and use RoPE base 10000, the sixth is
global with the model's own base. Output is tied to the token embedding.
"""

from __future__ import annotations

import numpy as np

from ..backends import Backend
from ..backends.base import ROPE_NEOX
from ..gguf.reader import GGUFFile
from .base import Decoder, HParams, Scratch, WeightLoader, kq_scale, load_layer, read_common_hparams
from .keys import read_float, read_int

ARCH = "gemma3"
SWA_PATTERN = 6  # layer i is local unless i % 6 == 5 (llama.cpp's set_swa_pattern(6))
ROPE_THETA_LOCAL = 10000.0
LAYERS_27B = 62  # Gemma 3 27B scales Q by 1/sqrt(dim / heads) = 1/sqrt(168), not its head size
                 # (llama.cpp's LLM_TYPE_27B, after gemma_pytorch's config)


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
        attn_scale=kq_scale(dim // common["n_heads"] if n_layers == LAYERS_27B else head_dim),
        embed_scale=float(np.sqrt(np.float32(dim))),
        final_softcap=read_float(g, f"{ARCH}.final_logit_softcapping", 0.0),
    )


class Gemma3Model(Decoder):
    arch = ARCH
    read_hparams = staticmethod(read_hparams)

    def __init__(self, g: GGUFFile, backend: Backend):
        self.hp = hp = read_hparams(g)
        self.backend = backend
        w = WeightLoader(g, backend)
        self.tok_embd, self.output_norm, self.output = w.embeddings_and_output(hp)
        extra = {"attn_q_norm": hp.head_dim, "attn_k_norm": hp.head_dim,
                 "post_attention_norm": hp.dim, "post_ffw_norm": hp.dim}
        self.layers = [load_layer(w, hp, i, extra) for i in range(hp.n_layers)]
        self.freq_factors = np.ones(hp.rope_dims // 2, np.float32)

    def forward(self, tokens: np.ndarray, cache, res, s: Scratch, rows: np.ndarray, logits: np.ndarray) -> None:
        """Run a chunk of tokens through the model in the cache slots `res` reserved; write
        the logits of the chunk rows `rows`."""
        hp, be, n = self.hp, self.backend, tokens.shape[0]
        x, h, o = s.x[:n], s.h[:n], s.o[:n]
        q, k, v, att, gate, up = s.q[:n], s.k[:n], s.v[:n], s.att[:n], s.gate[:n], s.up[:n]
        be.embed(self.tok_embd, tokens, x)
        be.scale(x, hp.embed_scale)
        rope = {"global": self.fill_rope(s, "global", res.positions, hp.rope_theta, cache.capacity),
                "local": self.fill_rope(s, "local", res.positions, hp.rope_theta_local, cache.capacity)}
        be.rms_norm(x, self.layers[0].attn_norm, hp.norm_eps, h)
        for il, L in enumerate(self.layers):
            cos, sin = rope["local" if hp.local_layers[il] else "global"]
            be.project_many([L.wq, L.wk, L.wv], h, [q, k, v])
            q3, k3 = q.reshape(n, hp.n_heads, hp.head_dim), k.reshape(n, hp.n_kv_heads, hp.head_dim)
            be.rms_norm_heads(q3, L.extra["attn_q_norm"], hp.norm_eps)
            be.rms_norm_heads(k3, L.extra["attn_k_norm"], hp.norm_eps)
            be.rope_qk(q3, k3, cos, sin, hp.rope_mode)
            be.scale(q, hp.attn_scale)  # before attention, as llama.cpp does (it rounds Q to f16)
            self.attend(cache, s, il, res, q, k, v, att, 1.0)
            be.project(L.wo, att, o)
            be.rms_norm(o, L.extra["post_attention_norm"], hp.norm_eps, o)
            be.add_rms_norm(x, o, L.ffn_norm, hp.norm_eps, h)
            be.project_many([L.w_gate, L.w_up], h, [gate, up])
            be.gelu_mul(gate, up)
            be.project(L.w_down, gate, o)
            be.rms_norm(o, L.extra["post_ffw_norm"], hp.norm_eps, o)
            self.end_layer(il, x, o, h)
        self.output_logits(x, self.output_norm, self.output, rows, logits)
