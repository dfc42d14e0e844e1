"""The model families `edgekv convert` knows, described once for both directions.

What lives here: per family, the Hugging Face architecture names, the GGUF architecture, the
tensor names on each side (one table serves HF -> GGUF and GGUF -> HF), and the per-tensor
transforms llama.cpp's `convert_hf_to_gguf.py` applies: Llama's Q/K row permutation (rotary
pairs interleaved -> halves; undone by `--to-hf`), Gemma 3's `+1` on RMSNorm weights, Gemma 3's
embedding rows cut to the tokenizer's vocabulary. What does not: metadata keys
(gguf_params.py, hf_config.py), tokenizers (vocab.py), the streaming (convert.py, to_hf.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConvertError

_BLOCK = {  # GGUF name in a block -> HF name under model.layers.{i}
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


@dataclass(frozen=True)
class Family:
    gguf_arch: str
    hf_archs: tuple[str, ...]  # the first is what --to-hf writes
    model_type: str  # config.json's model_type
    block: dict[str, str]  # GGUF block tensor -> HF name under model.layers.{i}
    permute_qk: bool = False  # llama.cpp's LlamaModel.permute on q_proj / k_proj
    norm_shift: float = 0.0  # added to every *norm.weight
    biases: tuple[str, ...] = ()  # GGUF block tensors that also have a .bias
    globals: dict[str, str] = field(default_factory=lambda: dict(_GLOBAL))

    def gguf_name(self, hf_name: str) -> str | None:
        """The GGUF name of a checkpoint tensor (None: not a tensor of this family)."""
        return _reverse(self)[0].get(hf_name) or _block_name(self, hf_name)

    def hf_name(self, gguf_name: str) -> str:
        m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
        if m and m[2] in self.block:
            return f"model.layers.{m[1]}.{self.block[m[2]]}.{m[3]}"
        base, _, suffix = gguf_name.rpartition(".")
        if base in self.globals:
            return f"{self.globals[base]}.{suffix}"
        raise ConvertError(f"tensor {gguf_name!r} has no Hugging Face name in the {self.gguf_arch} family")


def _reverse(fam: Family) -> tuple[dict[str, str], dict[str, str]]:
    glob = {f"{hf}.weight": f"{g}.weight" for g, hf in fam.globals.items()}
    return glob, {hf: g for g, hf in fam.block.items()}


def _block_name(fam: Family, hf_name: str) -> str | None:
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf_name)
    if not m:
        return None
    g = _reverse(fam)[1].get(m[2])
    if g is None or (m[3] == "bias" and g not in fam.biases):
        return None
    return f"blk.{m[1]}.{g}.{m[3]}"


LLAMA = Family("llama", ("LlamaForCausalLM", "LLaMAForCausalLM", "MistralForCausalLM"), "llama",
               dict(_BLOCK, ffn_norm="post_attention_layernorm"), permute_qk=True)
QWEN2 = Family("qwen2", ("Qwen2ForCausalLM",), "qwen2", dict(_BLOCK, ffn_norm="post_attention_layernorm"),
               biases=("attn_q", "attn_k", "attn_v"))
QWEN3 = Family("qwen3", ("Qwen3ForCausalLM",), "qwen3",
               dict(_BLOCK, ffn_norm="post_attention_layernorm", attn_q_norm="self_attn.q_norm",
                    attn_k_norm="self_attn.k_norm"))
GEMMA3 = Family("gemma3", ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"), "gemma3_text",
                dict(_BLOCK, attn_q_norm="self_attn.q_norm", attn_k_norm="self_attn.k_norm",
                     post_attention_norm="post_attention_layernorm", ffn_norm="pre_feedforward_layernorm",
                     post_ffw_norm="post_feedforward_layernorm"), norm_shift=1.0)
FAMILIES = (LLAMA, QWEN2, QWEN3, GEMMA3)


def family_for_hf(config: dict) -> Family:
    archs = config.get("architectures") or []
    for fam in FAMILIES:
        if archs and archs[0] in fam.hf_archs:
            return fam
    known = ", ".join(a for f in FAMILIES for a in f.hf_archs)
    raise ConvertError(f"config.json: architecture {archs[0] if archs else '(none given)'!r} is not one edgekv "
                       f"converts; it converts {known}. Other families need llama.cpp's convert_hf_to_gguf.py")


def family_for_gguf(arch: str) -> Family:
    for fam in FAMILIES:
        if fam.gguf_arch == arch:
            return fam
    raise ConvertError(f"architecture {arch!r}: --to-hf knows {', '.join(f.gguf_arch for f in FAMILIES)}")


def checkpoint_name(name: str) -> str:
    """A checkpoint name as llama.cpp's converter reads it: multimodal wrappers' language
    model under the plain model prefix."""
    return name.replace("language_model.", "")


def is_multimodal_part(name: str) -> bool:
    return name.startswith(("vision_tower.", "multi_modal_projector.", "mlp", "vit.")) \
        or "vision." in name or "visual." in name or "audio." in name


def permute(w: np.ndarray, n_head: int, inverse: bool = False) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: HF's rotary halves -> GGUF's interleaved pairs (inverse:
    back)."""
    pair = (w.shape[0] // n_head // 2, 2) if inverse else (2, w.shape[0] // n_head // 2)
    return w.reshape(n_head, *pair, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def transform(fam: Family, gguf_name: str, w: np.ndarray, n_head: int, n_head_kv: int,
              to_hf: bool = False) -> np.ndarray:
    """A checkpoint tensor (float32) as llama.cpp's converter writes it: Q/K rows permuted,
    Gemma's norms +1; to_hf: the other way."""
    if fam.permute_qk and re.search(r"\.attn_[qk]\.", gguf_name):
        w = permute(w, n_head if ".attn_q." in gguf_name else n_head_kv, inverse=to_hf)
    if fam.norm_shift and gguf_name.endswith("norm.weight"):
        w = w - np.float32(fam.norm_shift) if to_hf else w + np.float32(fam.norm_shift)
    return w
