"""edgekv: run GGUF language models on CPUs and edge devices, with a ring-buffer KV cache.

The public surface: `Llama` (llama-cpp-python's high-level API), `load` (one model, many
sessions: `edgekv.load("smollm2-135m-instruct").session(n_ctx=1024)`, see the README),
`stream_generate` (a session and a prompt -> a `GenerationStep` per token), the drafters of
speculative decoding (`PromptLookupDecoding`, `DraftModel`: `Llama(..., draft_model=...)`), and the
exceptions, all under `EdgeKVError`. Everything else is importable from
its module but not promised to stay put.

`Llama`, `LlamaState`, `Model`, `load` and `__version__` are made on first use (PEP 562), so that
`import edgekv.text.tokenizer` or `edgekv list` does not pay for Numba and the kernels.
"""

from __future__ import annotations

import os as _os
import sys as _sys

# OpenBLAS (NumPy's BLAS: prefill attention, the portable weight tiles) keeps its worker
# threads spinning for 2^28 cycles (~0.1 s) after each call; between BLAS calls that is
# time stolen from the Numba kernels' own threads. On 2 cores gemma3's pp512 took 1.82 s
# with the default and 1.02 s with workers that sleep after 2^4 cycles (1.21 s with one
# BLAS thread). OpenBLAS reads this when NumPy is first imported: an application that
# imports NumPy before edgekv should set OPENBLAS_THREAD_TIMEOUT=4 itself (README, Speed).
if "numpy" not in _sys.modules:
    _os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import (ChatTemplateError, ContextFullError, EdgeKVError, GGUFError, ModelNotFoundError, NumericalError,
                     TokenizerError, UnsupportedModelError)

if TYPE_CHECKING:
    from .api.facade import Llama
    from .api.llama_state import LlamaState
    from .generate import GenerationStep, stream_generate
    from .loader import Model, load
    from .speculative import DraftModel, PromptLookupDecoding


_LAZY = {"Llama": "api.facade", "LlamaState": "api.llama_state", "Model": "loader", "load": "loader",
         "stream_generate": "generate", "GenerationStep": "generate", "DraftModel": "speculative",
         "PromptLookupDecoding": "speculative"}

__all__ = [
    "ChatTemplateError", "ContextFullError", "DraftModel", "EdgeKVError", "GGUFError", "GenerationStep", "Llama",
    "LlamaState", "Model", "ModelNotFoundError", "NumericalError", "PromptLookupDecoding", "TokenizerError",
    "UnsupportedModelError", "__version__", "load", "stream_generate",
]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = value = import_module(".version", __name__).version()
        return value
    if name in _LAZY:
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'edgekv' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
