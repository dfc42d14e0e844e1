"""Architectures, keyed by the GGUF's `general.architecture`.

Each module defines a model class (a models.base.Decoder) made from a GGUF file and a
backend, with `hp` (HParams) and `forward(tokens, cache, reservation, scratch, rows,
logits)`; a model calls only its backend, never a kernel.
"""

from __future__ import annotations

from ..backends import Backend, get_backend
from ..errors import UnsupportedModelError
from ..gguf.reader import GGUFFile
from .gemma3 import Gemma3Model
from .llama import LlamaModel
from .phi3 import Phi3Model
from .qwen2 import Qwen2Model
from .qwen3 import Qwen3Model

ARCHITECTURES = {cls.arch: cls for cls in (LlamaModel, Gemma3Model, Qwen2Model, Qwen3Model, Phi3Model)}


def architecture(g: GGUFFile):
    """The model class of the file's `general.architecture`, or UnsupportedModelError naming those there are."""
    arch = g.architecture
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{g.path}: architecture {arch!r} is not supported (supported: {', '.join(sorted(ARCHITECTURES))})")
    return ARCHITECTURES[arch]


def build_model(g: GGUFFile, backend: Backend | str | None = None):
    """The architecture's model with its weights on `backend` (a Backend, a name, or None:
    EDGEKV_BACKEND / auto)."""
    cls, backend = architecture(g), get_backend(backend)
    backend.check_model(cls.read_hparams(g))  # before any weight is read
    model = cls(g, backend)
    model.source = g
    return model


def read_hparams(g: GGUFFile):
    """HParams of a GGUFFile from its metadata alone, through the architecture's
    `read_hparams` (building the model would read the weights)."""
    return architecture(g).read_hparams(g)
