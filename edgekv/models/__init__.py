"""Architectures, keyed by the GGUF's `general.architecture`.

Each module defines a model class with `hp` (HParams) and
`forward(tokens, positions, cache, slots, scratch, rows, logits)`.
"""

from __future__ import annotations

from ..errors import UnsupportedModelError
from ..gguf import GGUFFile
from .gemma3 import Gemma3Model
from .llama import LlamaModel

ARCHITECTURES = {cls.arch: cls for cls in (LlamaModel, Gemma3Model)}


def build_model(g: GGUFFile):
    arch = g.architecture
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{g.path}: architecture {arch!r} is not supported (supported: {', '.join(sorted(ARCHITECTURES))})")
    return ARCHITECTURES[arch](g)
