"""GGUF metadata back into Hugging Face config.json and generation_config.json.

What lives here: `hf_config` (per family: the transformers config fields that the GGUF keys
determine, with float32 values written as their shortest decimal, 1e-05 rather than
9.999999747378752e-06) and `llama3_rope_scaling` (Llama 3.1+ rope_freqs back into the
rope_scaling block that produced them). What does not: tensors and tokenizer files (to_hf.py,
tokenizer_files.py).
"""

from __future__ import annotations

import json

import numpy as np

from ..errors import ConvertError
from ..gguf.reader import GGUFFile
from .families import Family

_SPECIAL_IDS = {"bos": "bos", "eos": "eos", "unknown": "unk", "seperator": "sep", "padding": "pad",
                "cls": "cls", "mask": "mask"}  # GGUF key part (llama.cpp's spelling) -> HF name


def short_float(x) -> float:
    """A float32 value as the shortest decimal that reads back to it."""
    return float(str(np.float32(x)))


def special_ids(g: GGUFFile) -> dict[str, int]:
    """HF name (bos, eos, unk, ...) -> id, for the special tokens the GGUF names."""
    out = {}
    for key, name in _SPECIAL_IDS.items():
        v = g.get(f"tokenizer.ggml.{key}_token_id")
        if v is not None and 0 <= int(v) < len(g.get("tokenizer.ggml.tokens", [])):
            out[name] = int(v)
    return out


def _llama3_factors(hp: dict, factor, low, high, old) -> np.ndarray:
    from .gguf_params import llama3_rope_factors

    return llama3_rope_factors({**hp, "rope_scaling": {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                                                       "high_freq_factor": high,
                                                       "original_max_position_embeddings": old}})


def llama3_rope_scaling(g: GGUFFile, hp: dict) -> dict | None:
    """The rope_scaling of Meta's Llama 3.1 / 3.2 releases that gives the file's rope_freqs."""
    if "rope_freqs.weight" not in g.tensors:
        return None
    have = np.frombuffer(g.tensors["rope_freqs.weight"].data, "<f4")
    for factor in (8.0, 16.0, 32.0, 4.0, 2.0):
        for old in (8192, 4096, 2048, 16384, 32768):
            if np.array_equal(_llama3_factors(hp, factor, 1.0, 4.0, old), have):
                return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": old}
    raise ConvertError(f"{g.path}: rope_freqs.weight matches no Llama 3 rope_scaling edgekv knows; "
                       f"--to-hf cannot write a config.json that reproduces it")


def hf_config(fam: Family, g: GGUFFile, torch_dtype: str) -> dict:
    a = fam.gguf_arch

    def p(key, default=None):
        return g.get(f"{a}.{key}", default)

    n_head = int(p("attention.head_count"))
    n_embd = int(p("embedding_length"))
    head_dim = int(p("attention.key_length", n_embd // n_head))
    ids = special_ids(g)
    hp = {
        "architectures": [fam.hf_archs[0]], "model_type": fam.model_type,
        "hidden_size": n_embd, "intermediate_size": int(p("feed_forward_length")),
        "num_hidden_layers": int(p("block_count")), "num_attention_heads": n_head,
        "num_key_value_heads": int(p("attention.head_count_kv", n_head)),
        "max_position_embeddings": int(p("context_length")),
        "rms_norm_eps": short_float(p("attention.layer_norm_rms_epsilon")),
        "rope_theta": short_float(p("rope.freq_base", 10000.0)),
        "vocab_size": len(g.require("tokenizer.ggml.tokens")),
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "torch_dtype": torch_dtype,
        **{f"{k}_token_id": v for k, v in ids.items() if k in ("bos", "eos", "pad", "unk")},
    }
    if a == "gemma3":
        n_layer = hp["num_hidden_layers"]
        hp.update(head_dim=head_dim, query_pre_attn_scalar=head_dim, hidden_activation="gelu_pytorch_tanh",
                  sliding_window=int(p("attention.sliding_window", 4096)), _sliding_window_pattern=6,
                  layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n_layer)],
                  rope_local_base_freq=short_float(p("rope.freq_base_swa", 10000.0)),
                  final_logit_softcapping=p("final_logit_softcapping"), attn_logit_softcapping=None,
                  rope_scaling=None, attention_bias=False, attention_dropout=0.0, use_bidirectional_attention=False)
    else:
        hp.update(hidden_act="silu", attention_bias=a == "qwen2", mlp_bias=False)
        if f"{a}.attention.key_length" in g.metadata or a == "qwen3":
            hp["head_dim"] = head_dim
        if a == "llama":
            hp["rope_scaling"] = llama3_rope_scaling(g, hp) or _linear_scaling(g, a)
        if a == "qwen2":
            hp.update(use_sliding_window=False)
    return hp


def _linear_scaling(g: GGUFFile, a: str) -> dict | None:
    kind = g.get(f"{a}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind != "linear":
        raise ConvertError(f"{g.path}: rope scaling {kind!r}: --to-hf writes none, linear and llama3 scaling")
    return {"rope_type": "linear", "factor": short_float(g.require(f"{a}.rope.scaling.factor"))}


# general.* key -> the model card (README.md front matter) key llama.cpp's gguf-py reads it back from
_CARD = {"name": "name", "author": "author", "version": "version", "organization": "organization",
         "description": "description", "finetune": "finetune", "basename": "basename", "size_label": "size_label",
         "license": "license", "license.name": "license_name", "license.link": "license_link", "tags": "tags",
         "languages": "language", "source.url": "url", "source.doi": "doi", "source.uuid": "uuid",
         "source.repo_url": "repo_url"}


def model_card(g: GGUFFile) -> str:
    """README.md whose front matter carries the GGUF's general.* description (JSON is YAML)."""
    card = {}
    for key, card_key in _CARD.items():
        v = g.get(f"general.{key}")
        if v is not None:
            card[card_key] = [str(x) for x in v] if isinstance(v, (list, np.ndarray)) else v
    title = card.get("name") or g.architecture
    return (f"---\n{json.dumps(card, indent=1, ensure_ascii=False)}\n---\n\n# {title}\n\n"
            f"Made by `edgekv convert {g.path.rsplit('/', 1)[-1]} --to-hf` from a GGUF file: the weights are its "
            f"tensors dequantized, the tokenizer is rebuilt from its vocabulary.\n")


def generation_config(g: GGUFFile) -> dict:
    ids = special_ids(g)
    return {k: v for k, v in (("bos_token_id", ids.get("bos")), ("eos_token_id", ids.get("eos")),
                              ("pad_token_id", ids.get("pad"))) if v is not None}
