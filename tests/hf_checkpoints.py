"""Hugging Face checkpoints for the converter tests, made the same way by the test and by
tools/make_convert_reference.py (which runs llama.cpp's convert_hf_to_gguf.py on them).

What lives here: `real_checkpoint` (a catalog GGUF turned into a checkpoint folder by
`edgekv convert --to-hf`, the issue's way to get a real Hugging Face model offline) and
`tiny_checkpoint` (a random 2-layer llama / qwen2 / qwen3 from a seeded NumPy generator, with
the SmolLM2 tokenizer files, in the dtypes and layouts real checkpoints use: bf16 sharded
with an index, f16, f32 with llama3 rope scaling). No torch: the weights are written by
edgekv's safetensors writer, which llama.cpp's reader must read the same way for the two
converters' outputs to agree.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from edgekv.hf.safetensors import write_safetensors
from edgekv.hf.to_hf import _f32_to_bf16, to_hf

HIDDEN, HEADS, KV_HEADS, LAYERS, FF = 64, 4, 2, 2, 128

TINY = {  # name -> (architecture, model_type, dtype, shards, config extras)
    "tiny-llama": ("LlamaForCausalLM", "llama", "F32", 1,
                   {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
                    "tie_word_embeddings": False}),
    "tiny-qwen2": ("Qwen2ForCausalLM", "qwen2", "BF16", 2, {"tie_word_embeddings": True}),
    "tiny-qwen3": ("Qwen3ForCausalLM", "qwen3", "F16", 1, {"head_dim": 32, "tie_word_embeddings": True}),
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def real_checkpoint(gguf_path: Path, out: Path) -> Path:
    if not (out / "config.json").is_file():
        to_hf(str(gguf_path), str(out))
    return out


def _tensors(arch: str, vocab: int, extras: dict) -> dict[str, tuple[int, ...]]:
    head_dim = extras.get("head_dim", HIDDEN // HEADS)
    shapes = {"model.embed_tokens.weight": (vocab, HIDDEN), "model.norm.weight": (HIDDEN,)}
    if not extras.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (vocab, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
            p + "self_attn.q_proj.weight": (HEADS * head_dim, HIDDEN),
            p + "self_attn.k_proj.weight": (KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.v_proj.weight": (KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, HEADS * head_dim),
            p + "mlp.gate_proj.weight": (FF, HIDDEN), p + "mlp.up_proj.weight": (FF, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, FF)})
        if arch == "qwen2":
            shapes.update({p + "self_attn.q_proj.bias": (HEADS * head_dim,),
                           p + "self_attn.k_proj.bias": (KV_HEADS * head_dim,),
                           p + "self_attn.v_proj.bias": (KV_HEADS * head_dim,)})
        if arch == "qwen3":
            shapes.update({p + "self_attn.q_norm.weight": (head_dim,), p + "self_attn.k_norm.weight": (head_dim,)})
    return shapes


def _values(rng, shape, dtype: str) -> np.ndarray:
    w = (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.05)).astype(np.float32)
    if dtype == "BF16":
        return _f32_to_bf16(w)
    return w.astype({"F32": "<f4", "F16": "<f2"}[dtype])


def tiny_checkpoint(name: str, tokenizer_dir: Path, out: Path) -> Path:
    """A tiny random checkpoint `name` (see TINY) with the tokenizer files of `tokenizer_dir`."""
    if (out / "config.json").is_file():
        return out
    arch, model_type, dtype, shards, extras = TINY[name]
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tokenizer_config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    vocab = json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
    config = {"architectures": [arch], "model_type": model_type, "hidden_size": HIDDEN, "intermediate_size": FF,
              "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
              "max_position_embeddings": 2048, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "vocab_size": vocab,
              "hidden_act": "silu", "torch_dtype": {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype],
              "bos_token_id": 1, "eos_token_id": 2, **extras}
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    for f in _TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / f, tmp / f)
    (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    rng = np.random.default_rng(sum(map(ord, name)))
    shapes = _tensors(model_type, vocab, extras)
    names = sorted(shapes)
    parts = [names[i::shards] for i in range(shards)]
    weight_map = {}
    for k, part in enumerate(parts):
        fname = "model.safetensors" if shards == 1 else f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(tmp / fname, [(n, dtype, shapes[n]) for n in part],
                          (_values(rng, shapes[n], dtype) for n in part), {"format": "pt"})
        weight_map.update({n: fname for n in part})
    if shards > 1:
        (tmp / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if name == "tiny-llama":  # the template as recent checkpoints ship it, beside tokenizer_config.json
        template = tokenizer_config.pop("chat_template")
        (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
        (tmp / "chat_template.jinja").write_text(template)
    if name == "tiny-qwen3":  # sampling defaults: llama.cpp writes them as general.sampling.*
        (tmp / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": 1, "eos_token_id": 2, "do_sample": True, "temperature": 0.6, "top_p": 0.95,
             "top_k": 20, "repetition_penalty": 1.05}))
    tmp.rename(out)
    return out
