"""edgekv's exceptions: one tree under EdgeKVError, raised at the boundary.

Each message names the bad value and what was expected, so the CLI can print it as is.
Internal invariants use assert, not these.
"""


class EdgeKVError(Exception):
    """Base of every error edgekv raises on purpose."""


class GGUFError(EdgeKVError):
    """A GGUF file is missing, truncated, corrupt or inconsistent."""


class UnsupportedModelError(EdgeKVError):
    """A well-formed GGUF whose architecture, tokenizer or tensor type edgekv cannot run."""


class ModelNotFoundError(EdgeKVError):
    """`-m NAME` is neither a file nor a catalog entry, or a download failed."""


class TokenizerError(EdgeKVError):
    """Tokenizer metadata is missing or inconsistent, or an id is out of range."""


class ContextFullError(EdgeKVError):
    """The tokens do not fit in the context and the overflow policy says stop."""

    def __init__(self, message: str, n_tokens: int = 0, n_ctx: int = 0):
        super().__init__(message)
        self.n_tokens = n_tokens
        self.n_ctx = n_ctx


class NumericalError(EdgeKVError):
    """The model produced NaN or infinite logits; the input that did it was not kept."""


class ChatTemplateError(EdgeKVError):
    """A chat template failed to render or tried something the sandbox forbids."""


class StateFileError(EdgeKVError):
    """A state file is corrupt, truncated, or from another model or cache geometry.

    `field` names what did not match (e.g. "checksum", "n_ctx", "model_fingerprint")."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


class QuantizeError(EdgeKVError):
    """A quantization that cannot be done as asked: an unknown type, a quantized source
    without --allow-requantize, a source that is not a model file."""


class ConvertError(EdgeKVError):
    """A Hugging Face checkpoint that cannot be converted as asked (or a GGUF that cannot be
    turned back into one): a missing or corrupt file, an architecture or tokenizer edgekv does
    not know. The message says what to do."""


class GpuCannotRun(EdgeKVError):
    """The GPU backend cannot run this model; where the backend was left to auto, the model
    loads on the CPU instead (saying why in one line)."""


class GpuOutOfMemory(GpuCannotRun):
    """The GPU has too little free memory for what was asked (cuda.runtime.Device.alloc);
    where the backend was left to auto, the model loads on the CPU instead."""
