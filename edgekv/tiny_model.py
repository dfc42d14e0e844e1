"""Write tiny random-weight GGUF models (llama, gemma3) for fast unit tests.

What lives here: `make_tiny_model()` and its command line. A tiny model has the real
architecture's metadata keys and tensor names, a real (synthetic) tokenizer - GPT-2
byte-level BPE with ChatML for llama, SentencePiece with byte fallback and a Gemma-style
template for gemma3 - and random weights scaled as normal(0, 1/sqrt(fan_in)) so
activations stay O(1) through the layers. Norm weights stay F32 as in real GGUFs; the
matrices take the requested type. What does not live here: reading GGUFs (edgekv/gguf.py)
and the reference block formats (edgekv/quants.py). It needs only numpy and `gguf` (no
other edgekv module): tests build their models with it, `edgekv warmup` compiles the
kernels on its models, and tools/make_tiny_model.py is its command line.

Quantization: F16 by numpy; BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 by `gguf.quants.quantize`;
Q4_K, Q5_K and Q6_K, which that package can only dequantize, by the simple (not
error-minimizing) quantizers below, laid out exactly as `gguf.quants` reads them. Like
llama.cpp, a K-type request falls back per tensor when a row is not a multiple of 256
(Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0); so use dim=256, ff=512, n_heads*head_dim=256
to get K-type blocks in every matrix.

    python tools/make_tiny_model.py tiny.gguf --arch gemma3 --type Q8_0
    python -m edgekv.tiny_model tiny.gguf --arch gemma3 --type Q8_0
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf.quants import quantize

WEIGHT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
K_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
FILE_TYPES = {"F32": "ALL_F32", "Q4_K": "MOSTLY_Q4_K_S", "Q5_K": "MOSTLY_Q5_K_S"}  # else MOSTLY_<type>
ARCH_DEFAULTS = {
    "llama": dict(n_layers=2, rope_theta=10000.0, norm_eps=1e-5, tied=False),
    "gemma3": dict(n_layers=7, rope_theta=1e6, norm_eps=1e-6, tied=True, sliding_window=8),
}
OVERRIDES = ("tied", "rope_theta", "norm_eps", "sliding_window", "embd_type", "metadata")
N_MERGES = 48
CORPUS = (
    "Hello world! The quick brown fox jumps over the lazy dog. "
    "A small model on the edge keeps its cache in a ring; the ring holds the keys and the values "
    "of the tokens that came before, and the oldest tokens leave when the ring is full. "
    "Is it there? Yes, it is there, and then it is not. 1 2 3 4 5 10 100 2024."
)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
GEMMA_TEMPLATE = (  # a system message is folded into the first user turn, as Gemma does
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}{% set prefix = messages[0]['content'] + '\\n\\n' %}"
    "{% set turns = messages[1:] %}{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
    "{% for message in turns %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
WHITESPACE_RUNS = ["\n", "\n\n", "\n\n\n", "  ", "   ", "\t\t"]
# llama.cpp's token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6


# --- tokenizers -----------------------------------------------------------------------------


def gpt2_byte_chars() -> list[tuple[int, str]]:
    """GPT-2's byte -> printable character map, in its vocabulary order: the bytes that are
    printable Latin-1 map to themselves, the rest to U+0100 onwards."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in keep]
    return [(b, chr(b)) for b in keep] + [(b, chr(0x100 + i)) for i, b in enumerate(shifted)]


def train_merges(words: list[str], n_merges: int) -> list[tuple[str, str]]:
    """Plain BPE training: repeatedly merge the most frequent adjacent pair (ties: largest pair)."""
    seqs = [list(w) for w in words]
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        counts = Counter(pair for seq in seqs for pair in zip(seq, seq[1:]))
        if not counts:
            break
        best = max(counts, key=lambda pair: (counts[pair], pair))
        merges.append(best)
        for seq in seqs:
            i = 0
            while i < len(seq) - 1:
                if (seq[i], seq[i + 1]) == best:
                    seq[i : i + 2] = [seq[i] + seq[i + 1]]
                i += 1
    return merges


def bpe_vocab() -> dict:
    """GPT-2 byte-level BPE like SmolLM2's: 3 control tokens, 256 byte tokens, merged tokens."""
    to_char = dict(gpt2_byte_chars())
    pieces = re.findall(r"'s|'t| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+", CORPUS)
    words = ["".join(to_char[b] for b in p.encode("utf-8")) for p in pieces]
    merges = train_merges(words, N_MERGES)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [c for _, c in gpt2_byte_chars()]
    tokens += list(dict.fromkeys(a + b for a, b in merges if a + b not in tokens))
    types = [CONTROL] * 3 + [NORMAL] * (len(tokens) - 3)
    return dict(model="gpt2", pre="smollm", tokens=tokens, types=types, scores=None,
                merges=[f"{a} {b}" for a, b in merges], bos=1, eos=2, unk=0, pad=2,
                add_bos=False, template=CHATML_TEMPLATE)


def spm_vocab() -> dict:
    """SentencePiece with byte fallback like Gemma 3's: controls, <0xNN> bytes, user-defined
    whitespace runs, then ▁-pieces scored so that earlier merges win."""
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    tokens = list(specials)
    types = [CONTROL, CONTROL, CONTROL, UNKNOWN, CONTROL, CONTROL]
    scores = [-1000.0] * len(specials)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    scores += [0.0] * 256
    # Gemma 3's user-defined tokens are raw whitespace runs (matched before spaces become ▁)
    tokens += WHITESPACE_RUNS
    types += [USER_DEFINED] * len(WHITESPACE_RUNS)
    scores += [-1000.0] * len(WHITESPACE_RUNS)
    text = CORPUS.replace(" ", "▁")
    merges = train_merges(re.findall(r"▁?[^▁]+", text), N_MERGES)
    merged = list(dict.fromkeys(a + b for a, b in merges))
    chars = sorted(set(text))
    tokens += merged + chars
    types += [NORMAL] * (len(merged) + len(chars))
    scores += [-float(i) for i in range(len(merged))] + [-1000.0 - i for i in range(len(chars))]
    return dict(model="llama", pre="default", tokens=tokens, types=types, scores=scores, merges=None,
                bos=2, eos=1, unk=3, pad=0, add_bos=True, template=GEMMA_TEMPLATE)


def add_tokenizer(w: GGUFWriter, vocab: dict) -> None:
    w.add_tokenizer_model(vocab["model"])
    w.add_tokenizer_pre(vocab["pre"])
    w.add_token_list(vocab["tokens"])
    if vocab["scores"] is not None:
        w.add_token_scores(vocab["scores"])
    w.add_token_types(vocab["types"])
    if vocab["merges"] is not None:
        w.add_token_merges(vocab["merges"])
    w.add_bos_token_id(vocab["bos"])
    w.add_eos_token_id(vocab["eos"])
    w.add_unk_token_id(vocab["unk"])
    w.add_pad_token_id(vocab["pad"])
    w.add_add_bos_token(vocab["add_bos"])
    w.add_add_eos_token(False)
    w.add_bool("tokenizer.ggml.add_space_prefix", False)
    w.add_chat_template(vocab["template"])


# --- K-quant blocks (256 values per block) ----------------------------------------------------


def _pack_scales_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins per block -> the 12-byte field of Q4_K/Q5_K: bytes 0-3 hold
    sc[0:4] (+ the top 2 bits of sc[4:8] in bits 6-7), bytes 4-7 the same for the mins,
    bytes 8-11 the low nibbles of sc[4:8] (bits 0-3) and mn[4:8] (bits 4-7)."""
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)
    return out


def _affine_codes(blocks: np.ndarray, nmax: int):
    """x ~ d*sc[j]*q - dmin*mn[j] over 8 sub-blocks of 32, q in 0..nmax, sc and mn 6-bit."""
    sub = blocks.reshape(len(blocks), 8, 32)
    lo = np.minimum(sub.min(-1), 0.0)
    step, offset = (sub.max(-1) - lo) / nmax, -lo  # (n_blocks, 8)
    d = (step.max(-1) / 63).astype(np.float16)
    dmin = (offset.max(-1) / 63).astype(np.float16)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.nan_to_num(np.rint(step / d.astype(np.float32)[:, None])).clip(0, 63).astype(np.uint8)
        mn = np.nan_to_num(np.rint(offset / dmin.astype(np.float32)[:, None])).clip(0, 63).astype(np.uint8)
        scale = (d.astype(np.float32)[:, None] * sc)[..., None]
        shift = (dmin.astype(np.float32)[:, None] * mn)[..., None]
        q = np.nan_to_num(np.rint((sub + shift) / scale)).clip(0, nmax).astype(np.uint8)
    return d, dmin, sc, mn, q  # q: (n_blocks, 8, 32)


def _nibbles(q: np.ndarray) -> np.ndarray:
    """Codes of 8 sub-blocks -> 128 bytes: byte l of chunk c = q[2c][l] | q[2c+1][l] << 4."""
    return ((q[:, 0::2] & 0xF) | ((q[:, 1::2] & 0xF) << 4)).reshape(len(q), 128)


def quantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    """(n, 256) f32 -> (n, 144) bytes: d f16 | dmin f16 | scales[12] | qs[128]."""
    d, dmin, sc, mn, q = _affine_codes(blocks, 15)
    return np.hstack([d[:, None].view(np.uint8), dmin[:, None].view(np.uint8), _pack_scales_k4(sc, mn), _nibbles(q)])


def quantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    """(n, 256) f32 -> (n, 176) bytes: d | dmin | scales[12] | qh[32] | qs[128]; bit j of
    qh[l] is the fifth bit of value l of sub-block j."""
    d, dmin, sc, mn, q = _affine_codes(blocks, 31)
    qh = sum(((q[:, j, :] >> 4) & 1) << j for j in range(8)).astype(np.uint8)
    head = [d[:, None].view(np.uint8), dmin[:, None].view(np.uint8), _pack_scales_k4(sc, mn)]
    return np.hstack(head + [qh, _nibbles(q)])


def quantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    """(n, 256) f32 -> (n, 210) bytes: ql[128] | qh[64] | scales[16] int8 | d f16; x ~ d*sc[i]*(u-32)
    over 16 sub-blocks of 16. Per half h of 128 values: ql[64h+b] holds the low nibbles of
    values b and 64+b; bits 2s..2s+1 of qh[32h+l] are the top bits of value 32s+l."""
    n = len(blocks)
    sub = blocks.reshape(n, 16, 16)
    step = np.abs(sub).max(-1) / 31
    d = (step.max(-1) / 127).astype(np.float16)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.nan_to_num(np.rint(step / d.astype(np.float32)[:, None])).clip(-128, 127).astype(np.int8)
        scale = (d.astype(np.float32)[:, None] * sc)[..., None]
        u = (np.nan_to_num(np.rint(sub / scale)).clip(-32, 31) + 32).astype(np.uint8).reshape(n, 2, 128)
    ql = ((u[:, :, :64] & 0xF) | ((u[:, :, 64:] & 0xF) << 4)).reshape(n, 128)
    top = (u >> 4).reshape(n, 2, 4, 32)
    qh = sum(top[:, :, s, :] << (2 * s) for s in range(4)).astype(np.uint8).reshape(n, 64)
    return np.hstack([ql, qh, sc.view(np.uint8), d[:, None].view(np.uint8)])


K_QUANTIZERS = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}


def encode(values: np.ndarray, type_name: str) -> tuple[np.ndarray, GGMLQuantizationType | None]:
    """(ne1, ne0) f32 -> what GGUFWriter.add_tensor takes: an array and, for packed types, its raw dtype."""
    if type_name == "F32":
        return values.astype(np.float32), None
    if type_name == "F16":
        return values.astype(np.float16), None
    qtype = GGMLQuantizationType[type_name]
    if type_name in K_QUANTIZERS:
        rows, ne0 = values.shape
        packed = K_QUANTIZERS[type_name](values.astype(np.float32).reshape(-1, 256))
        return packed.reshape(rows, (ne0 // 256) * packed.shape[1]), qtype
    return quantize(values.astype(np.float32), qtype), qtype


def matrix_type(weight_type: str, ne0: int) -> str:
    """The type a matrix with rows of ne0 values gets (llama.cpp's K-quant fallback)."""
    return K_FALLBACK[weight_type] if weight_type in K_FALLBACK and ne0 % 256 else weight_type


# --- the model ------------------------------------------------------------------------------


def tensor_specs(arch: str, hp: dict, n_vocab: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ggml shape (ne0, ne1), kind) in file order; kind is norm, embd or matrix."""
    dim, ff, head_dim = hp["dim"], hp["ff"], hp["head_dim"]
    q_dim, kv_dim = hp["n_heads"] * head_dim, hp["n_kv_heads"] * head_dim
    specs = [("token_embd.weight", (dim, n_vocab), "embd"), ("output_norm.weight", (dim,), "norm")]
    if not hp["tied"]:
        specs.append(("output.weight", (dim, n_vocab), "matrix"))
    for i in range(hp["n_layers"]):
        layer = [("attn_norm", (dim,)), ("attn_q", (dim, q_dim)), ("attn_k", (dim, kv_dim)), ("attn_v", (dim, kv_dim))]
        if arch == "gemma3":
            layer += [("attn_q_norm", (head_dim,)), ("attn_k_norm", (head_dim,))]
        layer.append(("attn_output", (q_dim, dim)))
        if arch == "gemma3":
            layer.append(("post_attention_norm", (dim,)))
        layer += [("ffn_norm", (dim,)), ("ffn_gate", (dim, ff)), ("ffn_up", (dim, ff)), ("ffn_down", (ff, dim))]
        if arch == "gemma3":
            layer.append(("post_ffw_norm", (dim,)))
        specs += [(f"blk.{i}.{n}.weight", shape, "norm" if len(shape) == 1 else "matrix") for n, shape in layer]
    return specs


def add_hparams(w: GGUFWriter, arch: str, hp: dict, n_vocab: int) -> None:
    w.add_string("general.name", f"tiny-{arch}")
    w.add_uint32(f"{arch}.context_length", hp["n_ctx"])
    w.add_uint32(f"{arch}.embedding_length", hp["dim"])
    w.add_uint32(f"{arch}.block_count", hp["n_layers"])
    w.add_uint32(f"{arch}.feed_forward_length", hp["ff"])
    w.add_uint32(f"{arch}.attention.head_count", hp["n_heads"])
    w.add_uint32(f"{arch}.attention.head_count_kv", hp["n_kv_heads"])
    w.add_float32(f"{arch}.rope.freq_base", hp["rope_theta"])
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", hp["norm_eps"])
    if arch == "llama":
        w.add_uint32("llama.rope.dimension_count", hp["head_dim"])
        w.add_uint32("llama.vocab_size", n_vocab)
    if arch == "gemma3" or hp["head_dim"] * hp["n_heads"] != hp["dim"]:
        w.add_uint32(f"{arch}.attention.key_length", hp["head_dim"])
        w.add_uint32(f"{arch}.attention.value_length", hp["head_dim"])
    if arch == "gemma3":
        w.add_uint32("gemma3.attention.sliding_window", hp["sliding_window"])
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
    quantized = {hp["weight_type"], hp["embd_type"]} - {"F32", "F16", "BF16"}
    for name, ne0 in (("dim", hp["dim"]), ("n_heads*head_dim", hp["n_heads"] * hp["head_dim"]), ("ff", hp["ff"])):
        if quantized and ne0 % 32:
            raise ValueError(f"{name}={ne0} must be a multiple of 32 for {sorted(quantized)} blocks")


def make_tiny_model(path, arch: str = "llama", weight_type: str = "F32", n_layers: int | None = None,
                    dim: int = 64, n_heads: int = 4, n_kv_heads: int = 2, head_dim: int = 16, ff: int = 128,
                    n_ctx: int = 256, seed: int = 0, **overrides) -> Path:
    """Write a tiny random `arch` model to `path` and return the path.

    overrides: tied (llama default False: writes output.weight; gemma3 True), rope_theta,
    norm_eps, sliding_window (gemma3, default 8), embd_type (token_embd's type, default
    weight_type) and metadata ({key: value} added last; str, bool, int (u32), float (f32)).
    """
    unknown = set(overrides) - set(OVERRIDES)
    if unknown:
        raise TypeError(f"unknown overrides {sorted(unknown)}; known: {OVERRIDES}")
    hp = dict(ARCH_DEFAULTS.get(arch, {}), dim=dim, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim,
              ff=ff, n_ctx=n_ctx, weight_type=weight_type, embd_type=overrides.get("embd_type", weight_type))
    hp.update({k: v for k, v in overrides.items() if k not in ("embd_type", "metadata")})
    hp["n_layers"] = n_layers if n_layers is not None else hp.get("n_layers", 2)
    check_hparams(arch, hp)
    vocab = bpe_vocab() if arch == "llama" else spm_vocab()
    n_vocab = len(vocab["tokens"])
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), arch)
    add_hparams(w, arch, hp, n_vocab)
    add_tokenizer(w, vocab)
    for key, value in overrides.get("metadata", {}).items():
        _add_raw(w, key, value)
    # gemma3 scales embeddings by sqrt(dim) at run time, so its rows are 1/sqrt(dim) here
    embd_std = 1.0 if arch == "llama" else dim ** -0.5
    for name, shape, kind in tensor_specs(arch, hp, n_vocab):
        if kind == "norm":
            w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(shape[0])).astype(np.float32))
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
    p.add_argument("--layers", dest="n_layers", type=int, help="default: 2 for llama, 7 for gemma3")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", dest="n_heads", type=int, default=4)
    p.add_argument("--kv-heads", dest="n_kv_heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--ff", type=int, default=128)
    p.add_argument("--ctx", dest="n_ctx", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tied", action=argparse.BooleanOptionalAction, help="omit output.weight (gemma3 always)")
    p.add_argument("--sliding-window", type=int, help="gemma3 local attention window (default 8)")
    args = vars(p.parse_args(argv))
    optional = {k: args.pop(k) for k in ("embd_type", "tied", "sliding_window")}
    overrides = {k: v for k, v in optional.items() if v is not None}
    try:
        path = make_tiny_model(**args, **overrides)
    except ValueError as exc:
        p.error(str(exc))
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
