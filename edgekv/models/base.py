"""Shared building blocks of the decoder-only architectures.

What lives here: hyperparameters read from GGUF keys (`HParams`), weight loading with
shape and type checks before any kernel runs (`WeightLoader`), and what every
architecture shares (`Decoder`: attention through the cache's one call, RoPE tables, key
shifts, final logits). What does not: an architecture's own graph (one file each:
llama.py, gemma3.py), the per-session buffers (backends/contract.py Scratch), the cache
and its policies (kv/), and any kernel: models call only their backend
(backends/base.py) and their cache's `attend`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from ..backends import Backend
from ..backends.contract import Scratch
from ..errors import GGUFError, UnsupportedModelError
from ..gguf.quants import QUANT_TYPES, dequantize, non_finite_tensors
from ..gguf.reader import GGUFFile
from .keys import read_float, read_int
from .rope import RopeScaling, read_rope_scaling


@dataclass(frozen=True)
class HParams:
    """A model's hyperparameters, read once from its GGUF keys and never changed after: a
    value that derives from others (`local_layers`, `attn_scale`) is set when it is made."""

    arch: str
    n_vocab: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int  # K (and Q) head size
    head_dim_v: int
    ff: int
    n_ctx_train: int
    norm_eps: float
    rope_mode: int
    rope_theta: float
    rope_dims: int
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    rope_theta_local: float = 0.0  # sliding-window layers' RoPE base (gemma3)
    window: int = 0  # sliding-window size of local layers, 0 = none
    local_layers: tuple[bool, ...] = ()
    attn_scale: float = 0.0
    embed_scale: float = 1.0
    final_softcap: float = 0.0

    def __post_init__(self):  # the derived defaults (frozen: set through object.__setattr__, once)
        if not self.local_layers:
            object.__setattr__(self, "local_layers", (False,) * self.n_layers)
        if not self.attn_scale:
            object.__setattr__(self, "attn_scale", kq_scale(self.head_dim))


def kq_scale(n: int) -> float:
    """1/sqrt(n) as llama.cpp computes it, in float32 (`1.0f/sqrtf(float(n))`): for a head
    size that is not a power of 4 (Phi-3's 96) the float64 value rounds to the next float32
    up, and Q.K (or Q, where it is scaled first) differs in its last bit from llama.cpp's,
    which is enough to flip f16 roundings of Q and of the probabilities."""
    return float(np.float32(1) / np.sqrt(np.float32(n)))


def check_block_count(g: GGUFFile, n_layers: int, key: str) -> None:
    """The layer count must be the number of `blk.N.` tensor groups in the file (checked
    before anything is sized from it: a mutated count must not allocate per layer)."""
    blocks = {name.split(".", 2)[1] for name in g.tensors if name.startswith("blk.")}
    expected = {str(i) for i in range(min(n_layers, len(blocks) + 1))}
    if n_layers != len(blocks) or blocks != expected:
        raise GGUFError(f"{g.path}: metadata {key!r} = {n_layers}, but the file has tensors for "
                        f"{len(blocks)} blocks ({', '.join(sorted(blocks, key=lambda b: (len(b), b))[:4])}"
                        f"{', ...' if len(blocks) > 4 else ''})")


def read_common_hparams(g: GGUFFile, arch: str, norm_eps: float, rope_theta: float) -> dict:
    """The hyperparameters every decoder here shares, from the `{arch}.*` keys, as HParams
    keyword arguments; defaults are the architecture's when a key is absent."""
    dim, n_heads = read_int(g, f"{arch}.embedding_length"), read_int(g, f"{arch}.attention.head_count")
    head_dim = read_int(g, f"{arch}.attention.key_length", dim // n_heads)
    tokens = g.get("tokenizer.ggml.tokens")
    if tokens is not None and not isinstance(tokens, list):
        raise GGUFError(f"{g.path}: metadata 'tokenizer.ggml.tokens' must be an array of strings")
    n_ctx_train = read_int(g, f"{arch}.context_length")
    n_layers = read_int(g, f"{arch}.block_count")
    check_block_count(g, n_layers, f"{arch}.block_count")
    return check_shapes(g, arch, dict(
        arch=arch,
        n_vocab=read_int(g, f"{arch}.vocab_size", len(tokens) if tokens is not None else None),
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=read_int(g, f"{arch}.attention.head_count_kv", n_heads),
        head_dim=head_dim,
        head_dim_v=read_int(g, f"{arch}.attention.value_length", head_dim),
        ff=read_int(g, f"{arch}.feed_forward_length"),
        n_ctx_train=n_ctx_train,
        norm_eps=read_float(g, f"{arch}.attention.layer_norm_rms_epsilon", norm_eps),
        rope_theta=read_float(g, f"{arch}.rope.freq_base", rope_theta),
        rope_dims=read_int(g, f"{arch}.rope.dimension_count", head_dim),
        rope_scaling=read_rope_scaling(g, arch, n_ctx_train),
    ), tokens)


def check_shapes(g: GGUFFile, arch: str, hp: dict, tokens) -> dict:
    """What the kernels index by and no tensor shape checks: heads that group evenly, RoPE
    inside a head, no token id beyond the embedding. A GGUFError naming the key otherwise
    (a kernel would read or write out of bounds)."""
    if hp["n_heads"] % hp["n_kv_heads"]:
        raise GGUFError(f"{g.path}: {arch}.attention.head_count = {hp['n_heads']} is not a multiple of "
                        f"{arch}.attention.head_count_kv = {hp['n_kv_heads']}")
    if hp["rope_dims"] % 2 or hp["rope_dims"] > hp["head_dim"]:
        raise GGUFError(f"{g.path}: {arch}.rope.dimension_count = {hp['rope_dims']} must be even and at most "
                        f"the head size {hp['head_dim']}")
    if tokens is not None and len(tokens) > hp["n_vocab"]:
        raise GGUFError(f"{g.path}: the tokenizer has {len(tokens)} tokens but {arch}.vocab_size is "
                        f"{hp['n_vocab']}: ids past it would index beyond the embedding")
    return hp


def unsupported_type_message(path, name: str, ggml_type: int) -> str:
    """What to say of a tensor whose type no kernel here reads: its name and type, what
    is supported, and how to make a file that loads."""
    try:
        label = GGMLQuantizationType(int(ggml_type)).name
    except ValueError:
        label = f"unknown ggml type {int(ggml_type)}"
    supported = ", ".join(q.name for q in QUANT_TYPES.values())
    return (f"{path}: tensor {name!r} is {label}, which edgekv cannot run yet (it runs {supported}); "
            f"use the model's Q4_K_M, IQ4_XS or Q8_0 file, or make one from its F16 GGUF: "
            f"`edgekv quantize MODEL-F16.gguf MODEL-Q4_K_M.gguf Q4_K_M`")


class WeightLoader:
    """Fetches named tensors, checking shape and type before any kernel sees them; the
    backend makes each matrix its own (`Backend.weight`)."""

    def __init__(self, g: GGUFFile, backend: Backend):
        self.g = g
        self.backend = backend

    def _info(self, name: str, shape: tuple[int, ...]):
        info = self.g.tensor(name)
        if info.shape != shape:
            raise GGUFError(f"{self.g.path}: tensor {name!r} has shape {list(info.shape)}, "
                            f"expected {list(shape)} from the model's hyperparameters")
        if info.ggml_type not in QUANT_TYPES:
            raise UnsupportedModelError(unsupported_type_message(self.g.path, name, info.ggml_type))
        return info

    def has(self, name: str) -> bool:
        return name in self.g.tensors

    def vector(self, name: str, n: int) -> np.ndarray:
        """A 1-D tensor (norm weights) as float32."""
        info = self._info(name, (n,))
        return np.ascontiguousarray(dequantize(info.data, info.ggml_type, (n,)), dtype=np.float32).reshape(n)

    def bias(self, name: str, n: int) -> np.ndarray | None:
        """An optional 1-D tensor (a projection's bias) as float32, None when absent."""
        return self.vector(name, n) if self.has(name) else None

    def matrix(self, name: str, n_cols: int, n_rows: int):
        """A weight with rows of n_cols elements (ggml shape [n_cols, n_rows])."""
        info = self._info(name, (n_cols, n_rows))
        # the file pages go as soon as each piece is repacked: peak memory ~ the repacked weights
        w = self.backend.weight(info.data, info.ggml_type, n_rows, n_cols, release=self.g.release_pages,
                                store=self.g.pack_store)
        self.backend.named(w, name)
        return w

    def split_matrix(self, name: str, n_cols: int, parts: tuple[int, ...]) -> list:
        """A fused weight (Phi-3's attn_qkv, ffn_up) as one backend weight per consecutive
        block of rows: parts are the blocks' row counts. Rows are independent, so the
        pieces compute exactly what the fused matrix would."""
        info = self._info(name, (n_cols, sum(parts)))
        rows = info.data.reshape(sum(parts), -1)
        bounds = np.cumsum((0,) + parts)
        ws = [self.backend.weight(rows[a:b].reshape(-1), info.ggml_type, int(b - a), n_cols, store=self.g.pack_store)
              for a, b in zip(bounds[:-1], bounds[1:])]
        for w in ws:
            self.backend.named(w, name)
        return ws

    def embeddings_and_output(self, hp: HParams) -> tuple:
        """token_embd, output_norm and output; output is the embedding when the GGUF has
        no `output.weight` (tied)."""
        tok_embd = self.matrix("token_embd.weight", hp.dim, hp.n_vocab)
        output_norm = self.vector("output_norm.weight", hp.dim)
        if self.has("output.weight"):
            return tok_embd, output_norm, self.matrix("output.weight", hp.dim, hp.n_vocab)
        self.backend.tied_output(tok_embd)
        return tok_embd, output_norm, tok_embd


class Decoder:
    """What every architecture's model class shares beyond its forward pass: `hp`, the
    `backend` its weights live on, `freq_factors` (RoPE's per-dimension factors), and the
    steps every graph takes the same way (attention over the cache, RoPE tables, a layer's
    residual with the next layer's norm, final logits, re-rotating cached keys)."""

    hp: HParams
    backend: Backend
    layers: list[LayerWeights]
    freq_factors: np.ndarray
    source: GGUFFile  # the file the weights came from (build_model sets it)

    def non_finite_weights(self) -> dict[str, int]:
        """Tensors of the file holding NaN or inf (values, or block scales) -> how many.
        Reads every tensor once (an error path: the pages are released again after)."""
        return non_finite_tensors(self.source)

    def explain_non_finite(self) -> str:
        """Why logits came out NaN or inf, for NumericalError's message."""
        bad = self.non_finite_weights()
        if not bad:
            return ("every weight is finite, so an activation overflowed float32 on this input; "
                    "another input or cache type may work")
        listed = ", ".join(f"{name} ({n})" for name, n in list(bad.items())[:3])
        more = f" and {len(bad) - 3} more tensors" if len(bad) > 3 else ""
        return (f"the model file holds NaN or inf in {listed}{more}; it is corrupt or was converted wrongly: "
                f"download or convert it again")

    def rope_factors(self, n_ctx: int) -> np.ndarray:
        """RoPE's per-dimension frequency divisors for a session of n_ctx tokens (Phi-3's
        LongRoPE picks its long or short set by n_ctx; the others have one)."""
        return self.freq_factors

    def attend(self, cache, s: Scratch, layer: int, res, q: np.ndarray, k: np.ndarray, v: np.ndarray,
               out: np.ndarray, scale: float) -> None:
        """Write this chunk's K/V (q, k, v: f32[n, heads * head_dim]) into the slots `res`
        (the cache's reservation) reserved and attend over everything visible; scores are
        (q . k) * scale; out: f32[n, n_heads * head_dim_v]. The model's one call on its cache
        (kv/cache.py KVCache.attend, or a kv/batch.py CacheBatch's): it never reads the rings."""
        hp, n = self.hp, q.shape[0]
        q, k = q.reshape(n, hp.n_heads, hp.head_dim), k.reshape(n, hp.n_kv_heads, hp.head_dim)
        v, out = v.reshape(n, hp.n_kv_heads, hp.head_dim_v), out.reshape(n, hp.n_heads, hp.head_dim_v)
        cache.attend(layer, res, q, k, v, out, scale, s)

    def fill_rope(self, s: Scratch, kind: str, positions: np.ndarray, theta: float,
                  n_ctx: int) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin: f32[n, rope_dims / 2] for positions, in the scratch's `kind` buffers."""
        n = positions.shape[0]
        cos, sin = s.cos[kind][:n], s.sin[kind][:n]
        self.backend.rope_tables(positions, self.hp.rope_dims, theta, self.hp.rope_scaling, self.rope_factors(n_ctx),
                                 cos, sin)
        return cos, sin

    def end_layer(self, il: int, x: np.ndarray, o: np.ndarray, h: np.ndarray) -> None:
        """x += o, the residual of layer il, and h = the next layer's normed input (one
        backend step); after the last layer the add only (output_logits norms its rows)."""
        if il + 1 < len(self.layers):
            self.backend.add_rms_norm(x, o, self.layers[il + 1].attn_norm, self.hp.norm_eps, h)
        else:
            self.backend.add(x, o)

    def output_logits(self, x: np.ndarray, norm_w: np.ndarray, w_out, rows: np.ndarray, logits: np.ndarray) -> None:
        """logits[j] = W_out @ rms_norm(x[rows[j]]) for the requested rows only."""
        be = self.backend
        sel = be.take_rows(x, rows)
        be.rms_norm(sel, norm_w, self.hp.norm_eps, sel)
        be.project(w_out, sel, logits)
        if self.hp.final_softcap:
            be.softcap(logits, self.hp.final_softcap)

    def shift_keys(self, layer: int, k: np.ndarray, delta, n_ctx: int = 0) -> None:
        """Rotate cached keys k: f32[m, n_kv, head_dim] by RoPE as if their positions moved by
        delta (an int, or i32[m]: one per key; a RoPE rotation composes additively in the
        position), with the layer's base and the RoPE factors of a session of n_ctx tokens. With a RoPE magnitude factor
        (YaRN, LongRoPE) llama.cpp's shift multiplies the keys by it again; so does this."""
        cos, sin = self.shift_tables(layer, delta, k.shape[0], n_ctx)
        self.backend.rope(k, cos, sin, self.hp.rope_mode)

    def shift_tables(self, layer: int, delta, m: int, n_ctx: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin: f32[m, rope_dims / 2], the rotation shift_keys applies to m keys."""
        hp = self.hp
        theta = hp.rope_theta_local if hp.local_layers[layer] else hp.rope_theta
        half = hp.rope_dims // 2
        cos, sin = np.empty((m, half), np.float32), np.empty((m, half), np.float32)
        deltas = np.broadcast_to(np.asarray(delta, np.int32), (m,)).copy()
        self.backend.rope_tables(deltas, hp.rope_dims, theta, hp.rope_scaling, self.rope_factors(n_ctx), cos, sin)
        return cos, sin


class KeyShift:
    """A session's context shift of its cached keys (what KVCache.evict is given): called on
    keys read out of the cache, or, where the backend re-rotates them in the ring itself
    (Backend.shift_ring), asked for the rotation's tables and layout."""

    def __init__(self, model: Decoder, n_ctx: int):
        self.model, self.n_ctx = model, n_ctx
        self.mode = model.hp.rope_mode

    def __call__(self, layer: int, k: np.ndarray, delta) -> None:
        self.model.shift_keys(layer, k, delta, self.n_ctx)

    def tables(self, layer: int, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.model.shift_tables(layer, delta, len(delta), self.n_ctx)


@dataclass
class LayerWeights:
    attn_norm: np.ndarray
    wq: Any  # weights: what the backend's `weight` made (QuantMatrix on the CPU)
    wk: Any
    wv: Any
    wo: Any
    ffn_norm: np.ndarray
    w_gate: Any
    w_up: Any
    w_down: Any
    extra: dict = field(default_factory=dict)  # architecture-specific norms


def share_inputs(backend: Backend, L: LayerWeights) -> LayerWeights:
    """Tell the backend which of a layer's weights multiply the same input (project_many)."""
    backend.share_input([L.wq, L.wk, L.wv])
    backend.share_input([L.w_gate, L.w_up])
    return L


def load_layer(w: WeightLoader, hp: HParams, i: int, extra_vectors: dict[str, int]) -> LayerWeights:
    p = f"blk.{i}."
    q_dim, k_dim, v_dim = hp.n_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim, hp.n_kv_heads * hp.head_dim_v
    return share_inputs(w.backend, LayerWeights(
        attn_norm=w.vector(p + "attn_norm.weight", hp.dim),
        wq=w.matrix(p + "attn_q.weight", hp.dim, q_dim),
        wk=w.matrix(p + "attn_k.weight", hp.dim, k_dim),
        wv=w.matrix(p + "attn_v.weight", hp.dim, v_dim),
        wo=w.matrix(p + "attn_output.weight", hp.n_heads * hp.head_dim_v, hp.dim),
        ffn_norm=w.vector(p + "ffn_norm.weight", hp.dim),
        w_gate=w.matrix(p + "ffn_gate.weight", hp.dim, hp.ff),
        w_up=w.matrix(p + "ffn_up.weight", hp.dim, hp.ff),
        w_down=w.matrix(p + "ffn_down.weight", hp.ff, hp.dim),
        extra={name: w.vector(p + name + ".weight", n) for name, n in extra_vectors.items()},
    ))
