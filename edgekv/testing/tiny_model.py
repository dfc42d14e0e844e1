"""Write tiny random-weight GGUF models (llama, mistral, gemma3, qwen2, qwen3, phi3) for fast unit tests.

What lives here: `make_tiny_model()` and its command line. A tiny model has the real
architecture's metadata keys and tensor names (Qwen2's biases, Qwen3's Q/K norms, Phi-3's
fused attn_qkv and gate+up, LongRoPE factors; "mistral" is a `llama` GGUF with a sliding
window and Llama 2's SentencePiece), a real (synthetic) tokenizer of its family
(testing/tiny_vocab.py) and random weights scaled as normal(0, 1/sqrt(fan_in)) so
activations stay O(1) through the layers. Norm weights stay F32 as in real GGUFs; the
matrices take the requested type. What does not live here: reading GGUFs (edgekv/gguf/reader.py)
and the reference block formats (edgekv/gguf/quants.py). It needs only numpy, `gguf` and
testing/tiny_vocab.py and tiny_quants.py (no other edgekv module): tests build their models with
it, `edgekv warmup` compiles the
kernels on its models, and tools/make_tiny_model.py is its command line.

Quantization: F16 by numpy; BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 by `gguf.quants.quantize`;
Q2_K-Q6_K, IQ4_NL and IQ4_XS, which that package can only dequantize, by the simple
(not error-minimizing) quantizers of testing/tiny_quants.py, laid out exactly as `gguf.quants`
reads them. Like llama.cpp, a 256-value type request falls back per tensor when a row is
not a multiple of 256 (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K/IQ4_XS -> IQ4_NL);
so use dim=256, ff=512, n_heads*head_dim=256 to get 256-value blocks in every matrix.

    python tools/make_tiny_model.py tiny.gguf --arch gemma3 --type Q8_0
    python -m edgekv.testing.tiny_model tiny.gguf --arch gemma3 --type Q8_0
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf.quants import quantize

from .tiny_quants import K_QUANTIZERS, quantize_iq4_nl
from .tiny_vocab import add_tokenizer, vocab_for

WEIGHT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                "IQ4_NL", "IQ4_XS")
K_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "IQ4_NL", "Q3_K": "IQ4_NL", "IQ4_XS": "IQ4_NL"}
FILE_TYPES = {"F32": "ALL_F32", "Q3_K": "MOSTLY_Q3_K_S", "Q4_K": "MOSTLY_Q4_K_S", "Q5_K": "MOSTLY_Q5_K_S"}  # else MOSTLY_<type>
ARCH_DEFAULTS = {
    "llama": dict(n_layers=2, rope_theta=10000.0, norm_eps=1e-5, tied=False),
    "mistral": dict(n_layers=2, rope_theta=10000.0, norm_eps=1e-5, tied=False, sliding_window=8),
    "gemma3": dict(n_layers=7, rope_theta=1e6, norm_eps=1e-6, tied=True, sliding_window=8),
    "qwen2": dict(n_layers=2, rope_theta=1e6, norm_eps=1e-6, tied=True),
    "qwen3": dict(n_layers=2, rope_theta=1e6, norm_eps=1e-6, tied=True),
    "phi3": dict(n_layers=2, rope_theta=10000.0, norm_eps=1e-5, tied=False),
}
GGUF_ARCH = {"mistral": "llama"}  # families written under another architecture's name
OVERRIDES = ("tied", "rope_theta", "norm_eps", "sliding_window", "embd_type", "metadata", "rope_dims", "longrope")

def encode(values: np.ndarray, type_name: str) -> tuple[np.ndarray, GGMLQuantizationType | None]:
    """(ne1, ne0) f32 -> what GGUFWriter.add_tensor takes: an array and, for packed types, its raw dtype."""
    if type_name == "F32":
        return values.astype(np.float32), None
    if type_name == "F16":
        return values.astype(np.float16), None
    qtype = GGMLQuantizationType[type_name]
    if type_name in K_QUANTIZERS or type_name == "IQ4_NL":
        rows, ne0 = values.shape
        block = 32 if type_name == "IQ4_NL" else 256
        packed = (quantize_iq4_nl if block == 32 else K_QUANTIZERS[type_name])(values.astype(np.float32).reshape(-1, block))
        return packed.reshape(rows, (ne0 // block) * packed.shape[1]), qtype
    return quantize(values.astype(np.float32), qtype), qtype


def matrix_type(weight_type: str, ne0: int) -> str:
    """The type a matrix with rows of ne0 values gets (llama.cpp's K-quant fallback)."""
    return K_FALLBACK[weight_type] if weight_type in K_FALLBACK and ne0 % 256 else weight_type


# --- the model ------------------------------------------------------------------------------


def layer_specs(arch: str, hp: dict) -> list[tuple[str, tuple[int, ...]]]:
    """One layer's tensors (name without `blk.i.` and `.weight`/`.bias`, ggml shape) in file order."""
    dim, ff, head_dim = hp["dim"], hp["ff"], hp["head_dim"]
    q_dim, kv_dim = hp["n_heads"] * head_dim, hp["n_kv_heads"] * head_dim
    layer = [("attn_norm.weight", (dim,))]
    if arch == "phi3":  # fused Q/K/V rows
        layer.append(("attn_qkv.weight", (dim, q_dim + 2 * kv_dim)))
    else:
        layer += [("attn_q.weight", (dim, q_dim)), ("attn_k.weight", (dim, kv_dim)), ("attn_v.weight", (dim, kv_dim))]
    if arch == "qwen2":
        layer += [("attn_q.bias", (q_dim,)), ("attn_k.bias", (kv_dim,)), ("attn_v.bias", (kv_dim,))]
    if arch in ("gemma3", "qwen3"):
        layer += [("attn_q_norm.weight", (head_dim,)), ("attn_k_norm.weight", (head_dim,))]
    layer.append(("attn_output.weight", (q_dim, dim)))
    if arch == "gemma3":
        layer.append(("post_attention_norm.weight", (dim,)))
    layer.append(("ffn_norm.weight", (dim,)))
    if arch == "phi3":  # gate rows, then up rows
        layer.append(("ffn_up.weight", (dim, 2 * ff)))
    else:
        layer += [("ffn_gate.weight", (dim, ff)), ("ffn_up.weight", (dim, ff))]
    layer.append(("ffn_down.weight", (ff, dim)))
    if arch == "gemma3":
        layer.append(("post_ffw_norm.weight", (dim,)))
    return layer


def tensor_specs(arch: str, hp: dict, n_vocab: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ggml shape (ne0, ne1), kind) in file order; kind is norm, bias, factors, embd or matrix."""
    dim = hp["dim"]
    specs = [("token_embd.weight", (dim, n_vocab), "embd"), ("output_norm.weight", (dim,), "norm")]
    if not hp["tied"]:
        specs.append(("output.weight", (dim, n_vocab), "matrix"))
    if hp.get("longrope"):
        half = hp["rope_dims"] // 2
        specs += [("rope_factors_long.weight", (half,), "factors"), ("rope_factors_short.weight", (half,), "factors")]
    for i in range(hp["n_layers"]):
        for name, shape in layer_specs(arch, hp):
            kind = "matrix" if len(shape) == 2 else "bias" if name.endswith(".bias") else "norm"
            specs.append((f"blk.{i}.{name}", shape, kind))
    return specs


def add_hparams(w: GGUFWriter, arch: str, hp: dict, n_vocab: int, name: str | None = None) -> None:
    family, arch = arch, GGUF_ARCH.get(arch, arch)
    w.add_string("general.name", name or f"tiny-{family}")
    w.add_uint32(f"{arch}.context_length", hp["n_ctx"])
    w.add_uint32(f"{arch}.embedding_length", hp["dim"])
    w.add_uint32(f"{arch}.block_count", hp["n_layers"])
    w.add_uint32(f"{arch}.feed_forward_length", hp["ff"])
    w.add_uint32(f"{arch}.attention.head_count", hp["n_heads"])
    w.add_uint32(f"{arch}.attention.head_count_kv", hp["n_kv_heads"])
    w.add_float32(f"{arch}.rope.freq_base", hp["rope_theta"])
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", hp["norm_eps"])
    if arch in ("llama", "phi3") or hp["rope_dims"] != hp["head_dim"]:
        w.add_uint32(f"{arch}.rope.dimension_count", hp["rope_dims"])
    if arch == "llama":
        w.add_uint32("llama.vocab_size", n_vocab)
    if arch == "gemma3" or hp["head_dim"] * hp["n_heads"] != hp["dim"]:
        w.add_uint32(f"{arch}.attention.key_length", hp["head_dim"])
        w.add_uint32(f"{arch}.attention.value_length", hp["head_dim"])
    if hp.get("sliding_window"):
        w.add_uint32(f"{arch}.attention.sliding_window", hp["sliding_window"])
    if hp.get("longrope"):  # as the converter writes Phi-3's LongRoPE: the factors are tensors
        n_orig = hp["longrope"]
        w.add_uint32(f"{arch}.rope.scaling.original_context_length", n_orig)
        scale = hp["n_ctx"] / n_orig
        w.add_float32(f"{arch}.rope.scaling.attn_factor", math.sqrt(1 + math.log(scale) / math.log(n_orig)))
    file_type = FILE_TYPES.get(hp["weight_type"], "MOSTLY_" + hp["weight_type"])
    w.add_uint32("general.file_type", int(LlamaFileType[file_type]))
    w.add_uint32("general.quantization_version", 2)


def check_hparams(arch: str, hp: dict) -> None:
    if arch not in ARCH_DEFAULTS:
        raise ValueError(f"arch {arch!r} is not one of {sorted(ARCH_DEFAULTS)}")
    for key in ("weight_type", "embd_type"):
        if hp[key] not in WEIGHT_TYPES:
            raise ValueError(f"{key} {hp[key]!r} is not one of {WEIGHT_TYPES}")
    if hp["n_heads"] % hp["n_kv_heads"]:
        raise ValueError(f"n_heads={hp['n_heads']} is not a multiple of n_kv_heads={hp['n_kv_heads']}")
    if hp["rope_dims"] % 2 or not 0 < hp["rope_dims"] <= hp["head_dim"]:
        raise ValueError(f"rope_dims={hp['rope_dims']} must be even and in 2..head_dim={hp['head_dim']}")
    if hp.get("longrope") and (arch != "phi3" or not 1 < hp["longrope"] < hp["n_ctx"]):
        raise ValueError("longrope (the original context length) is for phi3 and must be in 2..n_ctx-1")
    quantized = {hp["weight_type"], hp["embd_type"]} - {"F32", "F16", "BF16"}
    for name, ne0 in (("dim", hp["dim"]), ("n_heads*head_dim", hp["n_heads"] * hp["head_dim"]), ("ff", hp["ff"])):
        if quantized and ne0 % 32:
            raise ValueError(f"{name}={ne0} must be a multiple of 32 for {sorted(quantized)} blocks")


def make_tiny_model(path, arch: str = "llama", weight_type: str = "F32", n_layers: int | None = None,
                    dim: int = 64, n_heads: int = 4, n_kv_heads: int = 2, head_dim: int = 16, ff: int = 128,
                    n_ctx: int = 256, seed: int = 0, **overrides) -> Path:
    """Write a tiny random `arch` model to `path` and return the path.

    overrides: tied (writes no output.weight; default per ARCH_DEFAULTS), rope_theta,
    norm_eps, sliding_window (gemma3 and mistral default 8), embd_type (token_embd's type,
    default weight_type), rope_dims (partial rotary: RoPE on the first rope_dims of a head,
    default head_dim), longrope (phi3: the original context length; writes LongRoPE
    factors and attn_factor as the converter does) and metadata ({key: value} added last;
    str, bool, int (u32), float (f32)), e.g. {"qwen2.rope.scaling.type": "yarn", ...}.
    """
    unknown = set(overrides) - set(OVERRIDES)
    if unknown:
        raise TypeError(f"unknown overrides {sorted(unknown)}; known: {OVERRIDES}")
    hp = dict(ARCH_DEFAULTS.get(arch, {}), dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
              ff=ff, n_ctx=n_ctx, weight_type=weight_type, embd_type=overrides.get("embd_type", weight_type),
              rope_dims=head_dim)
    hp.update({k: v for k, v in overrides.items() if k not in ("embd_type", "metadata")})
    hp["n_layers"] = n_layers if n_layers is not None else hp.get("n_layers", 2)
    check_hparams(arch, hp)
    vocab = vocab_for(arch)
    n_vocab = len(vocab["tokens"])
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), GGUF_ARCH.get(arch, arch))
    add_hparams(w, arch, hp, n_vocab)
    add_tokenizer(w, vocab)
    for key, value in overrides.get("metadata", {}).items():
        _add_raw(w, key, value)
    # gemma3 scales embeddings by sqrt(dim) at run time, so its rows are 1/sqrt(dim) here
    embd_std = dim ** -0.5 if arch == "gemma3" else 1.0
    for name, shape, kind in tensor_specs(arch, hp, n_vocab):
        if kind in ("norm", "bias", "factors"):
            w.add_tensor(name, _vector(kind, shape[0], rng))
            continue
        ne0, ne1 = shape
        std = embd_std if kind == "embd" else ne0 ** -0.5
        values = (std * rng.standard_normal((ne1, ne0))).astype(np.float32)
        data, raw_dtype = encode(values, matrix_type(hp["embd_type"] if kind == "embd" else weight_type, ne0))
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def _vector(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """A norm weight near 1, a bias of O(0.5), or LongRoPE divisors in [1, 4)."""
    if kind == "norm":
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    if kind == "bias":
        return (0.5 * rng.standard_normal(n)).astype(np.float32)
    return (1.0 + 3.0 * rng.random(n)).astype(np.float32)


def _add_raw(w: GGUFWriter, key: str, value) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    else:
        raise TypeError(f"metadata {key!r}: {type(value).__name__} is not str, bool, int or float")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write a tiny random-weight GGUF model for tests.")
    p.add_argument("path", type=Path)
    p.add_argument("--arch", choices=sorted(ARCH_DEFAULTS), default="llama")
    p.add_argument("--type", dest="weight_type", choices=WEIGHT_TYPES, default="F32", help="type of the matrices")
    p.add_argument("--embd-type", choices=WEIGHT_TYPES, help="type of token_embd (default: --type)")
    p.add_argument("--layers", dest="n_layers", type=int, help="default: 7 for gemma3, else 2")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", dest="n_heads", type=int, default=4)
    p.add_argument("--kv-heads", dest="n_kv_heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--ff", type=int, default=128)
    p.add_argument("--ctx", dest="n_ctx", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tied", action=argparse.BooleanOptionalAction, help="omit output.weight (default: per arch)")
    p.add_argument("--sliding-window", type=int, help="gemma3 / mistral attention window (default 8)")
    p.add_argument("--rope-dims", type=int, help="partial rotary: RoPE on the first N dims of a head")
    p.add_argument("--longrope", type=int, metavar="N_CTX_ORIG", help="phi3: LongRoPE factors, original context")
    args = vars(p.parse_args(argv))
    optional = {k: args.pop(k) for k in ("embd_type", "tied", "sliding_window", "rope_dims", "longrope")}
    overrides = {k: v for k, v in optional.items() if v is not None}
    try:
        path = make_tiny_model(**args, **overrides)
    except ValueError as exc:
        p.error(str(exc))
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
