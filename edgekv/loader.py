"""Loading a model: GGUF file -> architecture + tokenizer + chat formatter.

`load()` is the lower-level entry point for programs that keep several conversations:
one `Model` (weights, read-only, shared) and any number of `Session`s from
`model.session(...)`. The `Llama` facade (api/facade.py) is built on it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import time

import numpy as np

from .backends import Backend, cpu_instead, get_backend
from .catalog import resolve_model
from .errors import EdgeKVError, GpuCannotRun
from .gguf.reader import GGUFFile
from .kernels.jit_cache import kernels_cached
from .kv import fit
from .kv.calibration import key_map_for
from .kv import memory as kv_memory
from .kv.plan import weight_bytes
from .models import build_model, read_hparams
from .session import Session
from .system_info import system_info_line
from .text.chat_format import ChatFormatter
from .text.tokenizer import Tokenizer

log = logging.getLogger("edgekv")


class Model:
    """A loaded model: the network, its hyperparameters, tokenizer and chat template."""

    def __init__(self, path: str | os.PathLike, backend: Backend | str | None = None):
        t0 = time.perf_counter()
        self.backend = get_backend(backend)  # before the file is read: an unknown backend fails at once
        if log.isEnabledFor(logging.INFO):
            log.info("system_info: %s", system_info_line(self.backend))
        if not kernels_cached("cpu" if self.backend.name == "cuda" else self.backend.name):  # CUDA's host work
            log.warning("compiling kernels for this CPU on first use (up to a minute); "
                        "`edgekv warmup` does it ahead, once per install")
        self.path = str(path)
        self._fingerprint: str | None = None
        self.draft: Model | None = None  # a draft model for speculative decoding (load's draft=)
        numba_start = _start_numba_in_background()
        with _gc_paused():
            self.gguf = GGUFFile(self.path)
            # what this process may use, read before any weight is (the auto context's budget)
            self.memory_room = check_host_memory(self.gguf, read_hparams(self.gguf), self.backend.device_memory(),
                                                 fit.check_enforced())
            self.gguf.pack_store = _pack_store(self.gguf, self.backend)
            try:
                self.network = build_model(self.gguf, self.backend)
            except GpuCannotRun as exc:  # too large for a discrete GPU, or beyond its kernels: auto takes the CPU
                self.backend = cpu_instead(backend, exc)
                self.network = build_model(self.gguf, self.backend)
            self.hp = self.network.hp
            self.tokenizer = Tokenizer.from_gguf(self.gguf.metadata)
            self.chat_formatter = ChatFormatter.from_gguf(self.gguf.metadata, self.tokenizer)
        self.name = str(self.gguf.get("general.name", os.path.basename(self.path)))
        if self.gguf.pack_store is not None:
            self.gguf.pack_store.save()  # the layout this load made, for the next one
        self.gguf.release_pages()  # the weights were copied into the kernels' layout
        numba_start.join()
        log.info("loaded %s (%s, %d layers) on backend %s in %.2f s", self.name, self.hp.arch, self.hp.n_layers,
                 self.backend.name, time.perf_counter() - t0)

    @property
    def n_ctx_train(self) -> int:
        return self.hp.n_ctx_train

    def session(self, n_ctx: int | None = None, n_batch: int = 512, cache_type_k: str = "f16",
                cache_type_v: str = "f16", context_shift: str = "none", n_keep: int = 0, n_discard: int = 0,
                layer_windows: dict[int, int] | None = None) -> Session:
        """A fresh conversation state; n_ctx defaults to the model's trained context, capped at 4096.
        context_shift: what a full context does ("none": ContextFullError, "shift", "stream", "keep")."""
        n_ctx = n_ctx or min(self.hp.n_ctx_train, 4096)
        return Session(self.network, n_ctx, n_batch, cache_type_k, cache_type_v, context_shift, n_keep, n_discard,
                       layer_windows, key_map_for(self, cache_type_k, n_ctx))

    def fingerprint(self) -> str:
        """sha256 identifying the model (state_file.model_fingerprint), computed once."""
        if self._fingerprint is None:
            from .state_file import model_fingerprint  # ~1 ms of hashing: only when a state or a key map needs it

            self._fingerprint = model_fingerprint(self)
        return self._fingerprint

    # -- what kv/calibration.py measures a calibrated cache type's key map with ------------------

    def measuring_network(self):
        """The network whose pass the key map is measured on: this model's own, or on a GPU the
        same file loaded for the CPU (the observer reads Q and K as host arrays; the map is a
        property of the model, kept on disk: the pass runs once per model and context)."""
        if self.backend.name in ("cpu", "cpu-portable"):
            return self.network
        return load(self.gguf.path, backend="cpu").network

    @staticmethod
    def observed_pass(network, tokens: list[int], observer, n_batch: int = 512) -> None:
        """One pass of `network` over `tokens` with an f32 cache whose observer sees each
        layer's Q and K (KVCache.attend), in chunks of n_batch."""
        session = Session(network, len(tokens), n_batch, "f32", "f32")
        session.cache.observer = observer
        session.eval(tokens)


def _pack_store(g: GGUFFile, backend: Backend):
    """Where the CPU backend finds the layout an earlier load of this file made (and keeps
    this one's): backends/pack_store.py. None for other backends, or with EDGEKV_PACK_STORE=0."""
    from .backends import pack_store

    if not backend.name.startswith("cpu") or not pack_store.enabled(g.path):
        return None
    try:
        return pack_store.PackStore(g.path, g.base_address)
    except OSError as exc:  # an unreadable cache folder is no reason not to load
        log.warning("no store of repacked weights (%s): repacking", exc)
        return None


def _start_numba_in_background() -> threading.Thread:
    """Numba's first compiled call in a process costs ~0.2 s (it builds its typing and
    lowering registries, mostly imports); make it in a thread, on one small kernel the
    forward pass uses anyway, while this thread reads the file and repacks the weights
    (NumPy's copies release the GIL): ~40 ms off a one-shot `edgekv run`. Numba's compiler
    lock makes a kernel call in this thread wait for it, so nothing runs half-initialised."""
    from .kernels.ops import add_inplace

    def touch() -> None:
        x = np.zeros((1, 1), np.float32)
        try:
            add_inplace(x, x.copy())
        except Exception:  # noqa: BLE001 - the same call in the forward pass reports it
            pass

    thread = threading.Thread(target=touch, name="edgekv-numba-start", daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def _gc_paused():
    """No cyclic garbage collection while a model loads: the vocabulary and merges are
    ~10^5 new objects each, which set off full collections that walk Numba's whole heap
    (~80 ms of a 1 s start-up); loading makes no cycles worth collecting."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def check_host_memory(g: GGUFFile, hp, device, enforce: bool = True) -> int | None:
    """The host memory this process may use (free now, plus what it holds of the runtime;
    None: unknown), after checking that the model's smallest process fits it
    (fit.ModelTooLargeError; enforce False: a warning). device: the backend's
    (Backend.device_memory); a discrete GPU holds the weights in its own memory, and its
    backend checks those. `edgekv mem` asks too."""
    free, held = kv_memory.free_memory(), kv_memory.resident_bytes()
    if device is None or device.integrated:
        fit.check_fits(os.path.basename(g.path), hp, weight_bytes(g), free, held, enforce)
    return None if free is None else free.bytes + min(held, fit.RUNTIME_BYTES)


def load(model: str | os.PathLike, backend: Backend | str | None = None,
         draft: str | os.PathLike | None = None) -> Model:
    """Load a model from a GGUF path or a catalog name (fetched on first use), onto backend
    (a name from edgekv.backends.BACKENDS, "auto", or None: EDGEKV_BACKEND, default auto).
    draft: a smaller model of the same vocabulary (path or catalog name), loaded beside it as
    `Model.draft`: stream_generate then decodes speculatively (speculative/)."""
    target = Model(resolve_model(model), backend)
    if draft is not None:
        target.draft = Model(resolve_model(draft), backend)
        check_same_vocabulary(target, target.draft)
    return target


# llama.cpp's speculative decoding accepts a draft whose vocabulary is this much smaller or
# larger (padding of the output matrix); every token both have must be the same token
VOCAB_SIZE_SLACK = 128
VOCAB_CHECK_FROM = 5  # and compares the tokens from this id on (the first are control tokens a family varies)


def check_same_vocabulary(target, draft) -> None:
    """Raise EdgeKVError naming the first token where two models' vocabularies differ (or
    their sizes, beyond VOCAB_SIZE_SLACK): a draft must speak the target's ids."""
    a = list(target.gguf.get("tokenizer.ggml.tokens", []))
    b = list(draft.gguf.get("tokenizer.ggml.tokens", []))
    if not a or not b:
        raise EdgeKVError("a draft model needs both models' token lists (tokenizer.ggml.tokens)")
    if abs(len(a) - len(b)) > VOCAB_SIZE_SLACK or abs(target.hp.n_vocab - draft.hp.n_vocab) > VOCAB_SIZE_SLACK:
        raise EdgeKVError(f"the draft model's vocabulary has {len(b)} tokens, the target's {len(a)}: "
                          "a draft must come from the same model family (same tokenizer)")
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y and i >= VOCAB_CHECK_FROM:
            raise EdgeKVError(f"the draft model's token {i} is {y!r}, the target's is {x!r}: a draft must come from "
                              "the same model family (same tokenizer)")
    for name in ("bos_id", "eos_id"):
        if getattr(target.tokenizer, name) != getattr(draft.tokenizer, name):
            raise EdgeKVError(f"the draft model's {name} differs from the target's: a draft must use the same "
                              "special tokens")

