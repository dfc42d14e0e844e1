"""A Hugging Face config.json as GGUF metadata, key for key as llama.cpp's converter writes it.

What lives here: `write_params`, the hyperparameter keys (TextModel.set_gguf_parameters and
the Llama / Gemma 3 / Qwen overrides of llama.cpp's conversion/ package), `write_vocab` (the
tokenizer keys of each family's set_vocab), and `rope_parameters`. The keys go through
gguf's `GGUFWriter.add_*` methods, so names and value types are gguf's own; convert.py
serialises them. What does not: tensors (families.py, convert.py), reading tokenizers
(vocab.py).
"""

from __future__ import annotations

import math
import os

import gguf
import numpy as np

from ..errors import ConvertError
from .families import Family
from .json_files import json_file
from .special_vocab import special_vocab
from .vocab import bpe_vocab, spm_size, spm_vocab


# transformers' config defaults (4.57) for the keys the converter reads: llama.cpp's converter
# loads config.json through AutoConfig, so a key a checkpoint leaves out still reaches the file.
_DEFAULTS = {
    "llama": {"max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "vocab_size": 32000,
              "rope_scaling": None, "tie_word_embeddings": False},
    "mistral": {"max_position_embeddings": 131072, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
                "vocab_size": 32000, "sliding_window": 4096, "head_dim": None, "tie_word_embeddings": False},
    "qwen2": {"max_position_embeddings": 32768, "num_key_value_heads": 32, "rope_theta": 10000.0,
              "rms_norm_eps": 1e-6, "vocab_size": 151936, "sliding_window": None, "rope_scaling": None,
              "use_sliding_window": False, "max_window_layers": 28, "tie_word_embeddings": False},
    "gemma3_text": {"max_position_embeddings": 131072, "num_key_value_heads": 4, "rope_theta": 1_000_000.0,
                    "rms_norm_eps": 1e-6, "head_dim": 256, "vocab_size": 262208, "sliding_window": 4096,
                    "final_logit_softcapping": None, "attn_logit_softcapping": None, "rope_scaling": None,
                    "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 256, "tie_word_embeddings": True},
}
_DEFAULTS["qwen3"] = dict(_DEFAULTS["qwen2"], head_dim=128)


def with_defaults(hp: dict) -> dict:
    """config.json as transformers' AutoConfig(...).to_dict() has it, for the keys that matter."""
    kind = hp.get("model_type")
    out = {**_DEFAULTS.get(kind, {}), **hp}
    if kind == "llama" and out.get("head_dim") is None and out.get("num_attention_heads"):
        out["head_dim"] = out["hidden_size"] // out["num_attention_heads"]
    if kind in ("llama", "mistral") and out.get("num_key_value_heads") is None:
        out["num_key_value_heads"] = out.get("num_attention_heads")
    return out


def find(hparams: dict, keys: tuple[str, ...], optional: bool = True):
    for k in keys:
        if k in hparams:
            return hparams[k]
    if not optional:
        raise ConvertError(f"config.json has none of {', '.join(keys)}")
    return None


def rope_parameters(hp: dict) -> dict:
    """TextModel.__init__'s rope_parameters: rope_scaling / rope_parameters with the global
    values mirrored in."""
    rp = dict(hp.get("rope_parameters", hp.get("rope_scaling")) or {})
    theta = find(hp, ("global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta", "rotary_emb_base"))
    local = find(hp, ("local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta",
                      "rope_local_base_freq"))
    if "full_attention" not in rp and "sliding_attention" not in rp:
        if local is not None:
            rp["sliding_attention"] = {"rope_theta": local}
        if "rope_theta" not in rp and theta is not None:
            rp["rope_theta"] = theta
        if "rope_type" not in rp and rp.get("type") is not None:
            rp["rope_type"] = rp["type"]
        for k in ("partial_rotary_factor", "original_max_position_embeddings"):
            if k not in rp and hp.get(k) is not None:
                rp[k] = hp[k]
    return rp


def _rope_scaling(w: gguf.GGUFWriter, rp: dict) -> None:
    rope_type, factor = rp.get("rope_type"), rp.get("factor")
    if rope_type == "linear" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(factor)
    elif rope_type == "yarn" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
        for key, add in (("extrapolation_factor", w.add_rope_scaling_yarn_ext_factor),
                         ("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                         ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
            if rp.get(key) is not None:
                add(rp[key])
    elif rope_type in ("su", "longrope"):
        w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
    elif rope_type is not None and rope_type.lower() not in ("llama3", "dynamic", "default"):
        raise ConvertError(f"config.json: rope scaling type {rope_type!r} is not one edgekv converts "
                           f"(linear, yarn, longrope, llama3)")


def _text_params(w: gguf.GGUFWriter, hp: dict, n_layer: int, ftype: int) -> None:
    """TextModel.set_gguf_parameters, the keys a dense model has."""
    w.add_block_count(n_layer)
    for keys, add in (
        (("max_position_embeddings", "n_ctx", "n_positions", "max_length", "max_sequence_length",
          "model_max_length"), w.add_context_length),
        (("hidden_size", "n_embd", "dim"), w.add_embedding_length),
        (("prefix_dense_intermediate_size", "dense_intermediate_size", "intermediate_size", "n_inner",
          "hidden_dim"), w.add_feed_forward_length),
        (("num_attention_heads", "n_head", "n_heads"), w.add_head_count),
        (("num_key_value_heads", "n_kv_heads"), w.add_head_count_kv),
    ):
        if (v := find(hp, keys)) is not None:
            add(v)
    if hp.get("is_causal") is False:
        w.add_causal_attention(False)
    rp = rope_parameters(hp)
    full = rp.get("full_attention", rp)
    _rope_scaling(w, full)
    if full.get("rope_theta") is not None:
        w.add_rope_freq_base(full["rope_theta"])
    if (local := rp.get("sliding_attention", {}).get("rope_theta")) is not None:
        w.add_rope_freq_base_swa(local)
    if (eps := find(hp, ("rms_norm_eps", "norm_eps"))) is not None:
        w.add_layer_norm_rms_eps(eps)
    if (eps := find(hp, ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"))) is not None:
        w.add_layer_norm_eps(eps)
    if hp.get("head_dim") is not None:
        w.add_key_length(hp["head_dim"])
        w.add_value_length(hp["head_dim"])
    w.add_file_type(ftype)


def write_params(w: gguf.GGUFWriter, fam: Family, hp: dict, n_layer: int, ftype: int) -> None:
    _text_params(w, hp, n_layer, ftype)
    if fam.gguf_arch == "llama":
        w.add_vocab_size(hp["vocab_size"])
        rope_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
        w.add_rope_dimension_count(rope_dim)
    elif fam.gguf_arch == "gemma3":
        w.add_context_length(hp.get("max_position_embeddings", 131072))
        w.add_head_count(hp.get("num_attention_heads", 8))
        w.add_layer_norm_rms_eps(hp.get("rms_norm_eps", 1e-6))
        w.add_key_length(hp.get("head_dim", 256))
        w.add_value_length(hp.get("head_dim", 256))
        rp = rope_parameters(hp)
        w.add_rope_freq_base(rp.get("full_attention", rp).get("rope_theta", 1_000_000.0))
        if hp.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(hp["final_logit_softcapping"])
        if hp.get("sliding_window_pattern") != 1:
            w.add_sliding_window(hp["sliding_window"])
        w.add_head_count_kv(hp.get("num_key_value_heads", 4))


def llama3_rope_factors(hp: dict) -> np.ndarray | None:
    """LlamaModel.generate_extra_tensors: rope_freqs for rope_type llama3 (Llama 3.1+)."""
    rp = rope_parameters(hp)
    rp = rp.get("full_attention", rp)
    if str(rp.get("rope_type", "")).lower() != "llama3":
        return None
    base = rp.get("rope_theta", 10000.0)
    dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rp.get("factor", 8.0), rp.get("low_freq_factor", 1.0), rp.get("high_freq_factor", 4.0)
    old = rp.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _set_vocab_gpt2(w: gguf.GGUFWriter, directory: str, hp: dict, pre: str | None) -> None:
    v = bpe_vocab(directory, hp.get("vocab_size"), pre)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(v.pre)
    w.add_token_list(v.tokens)
    w.add_token_types(v.types)
    special_vocab(directory, load_merges=True).keys(w)


def _set_vocab_spm(w: gguf.GGUFWriter, directory: str, hp: dict) -> int:
    tokens, scores, types = spm_vocab(directory, hp.get("vocab_size"))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    special_vocab(directory, n_vocab=len(tokens)).keys(w)
    return len(tokens)


def has_spm(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, "tokenizer.model"))


def write_vocab(w: gguf.GGUFWriter, fam: Family, directory: str, hp: dict, pre: str | None = None) -> None:
    """Each family's set_vocab. Llama's tokenizer.json-only SentencePiece-style vocabularies
    (LlamaHfVocab) need tokenizer.model here."""
    llama, spm = fam.gguf_arch == "llama", has_spm(directory)
    if llama and (aps := json_file(directory, "tokenizer_config.json").get("add_prefix_space")) is not None:
        w.add_add_space_prefix(aps)
    if spm:
        _set_vocab_spm(w, directory, hp)
    else:
        if llama:
            _require_byte_level(directory)
        _set_vocab_gpt2(w, directory, hp, pre)
    if llama and hp.get("vocab_size", 32000) == 49152:  # llama.cpp's Granite rule, which SmolLM's vocabulary also meets
        w.add_add_bos_token(False)
    if fam.gguf_arch == "gemma3" and spm:
        w.add_add_space_prefix(False)


def _require_byte_level(directory: str) -> None:
    tj = json_file(directory, "tokenizer.json")
    model = tj.get("model", {})
    if model.get("type") == "BPE" and model.get("byte_fallback") and tj.get("decoder", {}).get("type") == "Sequence":
        raise ConvertError(f"{directory}: this tokenizer.json is a SentencePiece-style BPE (byte fallback); "
                           f"edgekv reads such vocabularies from tokenizer.model, which the original checkpoint "
                           f"ships: copy it into the directory")


def embedding_rows(fam: Family, directory: str, hp: dict) -> int | None:
    """Gemma 3's converter keeps only the tokenizer's rows of token_embd: as many as the
    SentencePiece vocabulary it writes (config.json's vocab_size, else tokenizer.model's), or
    tokenizer.json's tokens."""
    if fam.gguf_arch != "gemma3":
        return None
    if has_spm(directory):
        return hp.get("vocab_size") or spm_size(directory)
    tj = json_file(directory, "tokenizer.json")
    return len(tj["model"]["vocab"]) + len(tj.get("added_tokens", []))
