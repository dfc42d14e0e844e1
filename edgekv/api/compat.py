"""Compatibility with llama-cpp-python's keyword arguments.

What lives here: which `Llama(...)` options edgekv accepts and ignores (GPU offload,
mmap, ...), which generation options it accepts only at their "off" value, and the
checks that raise a clear error for the rest; what `n_threads` and `verbose` do. What does
not: the options edgekv implements (facade.py, context_growth.py).
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import EdgeKVError

log = logging.getLogger("edgekv")

IGNORED_OPTIONS = frozenset({
    "split_mode", "main_gpu", "tensor_split", "vocab_only", "use_mmap", "use_mlock",
    "kv_overrides", "n_ubatch", "n_threads_batch", "rope_scaling_type", "pooling_type", "yarn_ext_factor",
    "yarn_attn_factor", "yarn_beta_fast", "yarn_beta_slow", "yarn_orig_ctx", "offload_kqv", "flash_attn",
    "no_perf", "last_n_tokens_size", "numa", "embedding", "type_k", "type_v", "spm_infill",
})
# llama-cpp-python generation options edgekv does not implement -> the values meaning "off"
# (anything else raises); None: accepted and ignored, as llama.cpp itself dropped them
# (tfs_z, penalize_nl) or they act only with an option that is off (mirostat_tau/eta).
# top_logprobs is the chat API's (create_chat_completion takes it); create_completion only
# accepts it unset, as llama-cpp-python's has no such option.
OFF_VALUES: dict[str, tuple | None] = {
    "suffix": (None,), "top_logprobs": (None,), "typical_p": (1.0,),
    "mirostat_mode": (0,), "functions": (None,), "function_call": (None,),
    "tfs_z": None, "penalize_nl": None, "mirostat_tau": None, "mirostat_eta": None,
}
# generate() keywords that create_completion passes through **options
SAMPLER_OPTIONS = frozenset({"logits_processor", "stopping_criteria", "repeat_last_n"})


def check_compat(where: str, options: dict[str, Any]) -> None:
    """llama-cpp-python options: unknown names are a TypeError, known ones set to a value
    edgekv cannot honour an EdgeKVError; ignored ones pass."""
    for name, value in options.items():
        if name not in OFF_VALUES:
            raise TypeError(f"{where}() got an unexpected keyword argument {name!r}")
        allowed = OFF_VALUES[name]
        if allowed is not None and not any(value is a or value == a for a in allowed):
            raise EdgeKVError(f"{name}={value!r} is not supported by edgekv yet")


def check_options(options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - IGNORED_OPTIONS)
    if unknown:
        raise TypeError(f"Llama() got unexpected keyword arguments: {', '.join(unknown)}")
    if options:
        log.info("ignoring llama-cpp-python options that do not apply here: %s", ", ".join(sorted(options)))


def set_threads(n_threads: int) -> None:
    """n_threads: the kernels' thread count (logged; a warning where it cannot be set)."""
    try:
        from ..kernels.config import set_num_threads
    except ImportError:  # a build without the Numba kernels
        log.warning("n_threads=%s ignored: the kernels' thread control is unavailable", n_threads)
        return
    log.info("using %d threads", set_num_threads(n_threads))


def log_to_stderr() -> None:
    """verbose=True: show edgekv's info messages on stderr unless logging is already set up."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("edgekv: %(message)s"))
        log.addHandler(handler)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
