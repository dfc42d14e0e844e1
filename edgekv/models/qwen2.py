"""The `qwen2` architecture (Qwen2, Qwen2.5): llama's graph with biases on Q, K and V.

Differences from llama (llama.cpp's src/models/qwen2.cpp): RoPE in the NEOX layout (halves,
no permutation at conversion), RMS epsilon 1e-6 by default, and an optional output bias.
The biases themselves are loaded by LlamaModel, which takes them wherever a GGUF has them.
Qwen2.5's long-context variants use YaRN scaling (`qwen2.rope.scaling.type = yarn`, read by
models/rope.py).
"""

from __future__ import annotations

from ..backends.base import ROPE_NEOX
from .llama import LlamaModel


class Qwen2Model(LlamaModel):
    arch = "qwen2"
    rope_mode = ROPE_NEOX
    default_norm_eps = 1e-6
