"""RoPE scaling: what a GGUF's `{arch}.rope.scaling.*` keys ask for, read as llama.cpp reads them.

What lives here: `RopeScaling` (the numbers the RoPE tables need: linear frequency scale,
YaRN's extrapolation mix and its correction dimensions, the magnitude factor) and
`read_rope_scaling`, which turns the keys into one. What does not: the tables themselves
(Backend.rope_tables, kernels/ops.py), per-dimension frequency factors (tensors: the
model's `rope_freqs` or Phi-3's LongRoPE `rope_factors_long/short`, chosen in the model).

The types, as llama.cpp 0c1e570 applies them (src/llama-context.cpp, ggml's rope_yarn):
- none: no scaling, whatever `scaling.factor` says.
- linear (llama.cpp's default when the type key is absent): theta *= 1 / factor.
- yarn: per pair i, theta mixes the scaled and unscaled angle with a ramp between the
  correction dimensions of beta_fast = 32 and beta_slow = 1 at the original context
  length, and cos/sin are multiplied by (1 + 0.1 ln factor), llama.cpp's cancelled and
  re-applied attention factor.
- longrope: no scaling of its own; Phi-3's per-dimension factors do the work, and
  `scaling.attn_factor` (written by the converter) multiplies cos/sin.
"llama3" scaling (Llama 3.1+) is not a GGUF type: the converter writes `rope_freqs.weight`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedModelError
from ..gguf.reader import GGUFFile
from .keys import read_float

SCALING_TYPES = ("none", "linear", "yarn", "longrope")
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "none"
    freq_scale: float = 1.0  # theta *= freq_scale (1 / factor)
    ext_factor: float = 0.0  # YaRN: weight of the unscaled angle at the fast end of the ramp
    attn_factor: float = 1.0  # llama.cpp's cparams.yarn_attn_factor, times cos/sin
    n_ctx_orig: int = 0  # the context the model was trained at before scaling
    beta_fast: float = YARN_BETA_FAST
    beta_slow: float = YARN_BETA_SLOW

    def corr_dims(self, n_rot: int, base: float) -> tuple[float, float]:
        """YaRN's ramp ends in pair units (ggml_rope_yarn_corr_dims), in float32 as ggml computes them."""
        if not self.ext_factor:
            return 0.0, 0.0

        def dim(beta: float) -> np.float32:
            ratio = np.float32(self.n_ctx_orig) / (np.float32(beta) * np.float32(2) * np.float32(math.pi))
            return np.float32(n_rot) * np.log(np.float32(ratio)) / (np.float32(2) * np.log(np.float32(base)))

        start, end = math.floor(dim(self.beta_fast)), math.ceil(dim(self.beta_slow))
        return float(max(0, start)), float(min(n_rot - 1, end))

    def mscale(self) -> float:
        """The factor cos/sin are multiplied by (ggml's rope_yarn: attn_factor, times
        1 + 0.1 ln(1 / freq_scale) when YaRN's mix is on), in float32."""
        m = np.float32(self.attn_factor)
        if self.ext_factor:
            m = np.float32(m * (np.float32(1) + np.float32(0.1) * np.log(np.float32(1) / np.float32(self.freq_scale))))
        return float(m)


def _yarn_attn_factor(factor: np.float32, log_mul: float) -> np.float32:
    """llama.cpp's cparams.yarn_attn_factor before the GGUF's attn_factor multiplies it."""

    def get_mscale(scale: np.float32, m: float) -> np.float32:
        return np.float32(1) if scale <= 1 else np.float32(np.float32(0.1) * np.float32(m) * np.log(scale) + 1)

    attn = get_mscale(factor, 1.0) / get_mscale(factor, log_mul) if log_mul else get_mscale(factor, 1.0)
    return np.float32(attn * (np.float32(1) / (np.float32(1) + np.float32(0.1) * np.log(factor))))


def read_rope_scaling(g: GGUFFile, arch: str, n_ctx_train: int) -> RopeScaling:
    """The scaling `{arch}.rope.scaling.*` asks for (absent type: llama.cpp's 'linear')."""
    kind = g.get(f"{arch}.rope.scaling.type", "linear")
    if kind not in SCALING_TYPES:
        raise UnsupportedModelError(f"{g.path}: {arch}.rope.scaling.type = {str(kind)[:40]!r} is not a RoPE scaling "
                                    f"edgekv (or llama.cpp) knows (known: {', '.join(SCALING_TYPES)})")
    factor = read_float(g, f"{arch}.rope.scaling.factor", 0.0) or read_float(g, f"{arch}.rope.scale_linear", 0.0)
    if factor < 0:
        raise UnsupportedModelError(f"{g.path}: {arch}.rope.scaling.factor = {factor} must be a positive number")
    freq_scale = 1.0 if kind == "none" or factor == 0 else float(np.float32(1) / np.float32(factor))
    ext_factor = 1.0 if kind == "yarn" else 0.0
    attn = np.float32(1)
    if ext_factor:
        attn = _yarn_attn_factor(np.float32(1) / np.float32(freq_scale),
                                 read_float(g, f"{arch}.rope.scaling.yarn_log_multiplier", 0.0))
    attn = np.float32(attn * np.float32(read_float(g, f"{arch}.rope.scaling.attn_factor", 1.0)))
    n_ctx_orig = int(read_float(g, f"{arch}.rope.scaling.original_context_length", 0)) or n_ctx_train
    return RopeScaling(kind=kind, freq_scale=freq_scale, ext_factor=ext_factor, attn_factor=float(attn),
                       n_ctx_orig=n_ctx_orig)
