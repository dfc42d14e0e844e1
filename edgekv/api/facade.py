"""The `Llama` facade: llama-cpp-python's high-level API on top of edgekv's Model and Session.

What lives here: `Llama` (the model and its session, tokenize, eval, generate, kv_status)
and checking llama-cpp-python's options.
What does not: create_completion / create_chat_completion and the generation loop under
them (completions.py, a mixin of `Llama`), the context's size (the n_ctx="auto" plan, the memory budget, growth, making
the session: context_growth.py), stop strings, the OpenAI-shaped response dicts and the
generation statistics (responses.py), save_state/load_state and state files
(llama_state.py), the forward pass, the cache and its snapshots
(models/, session.py, kv/cache.py), the state file format (state_file.py), the sampler chain
(sampling.py), the step generator (generate.py), log-probs (logprobs.py), text <-> ids
(text/tokenizer.py), chat templates (text/chat_format.py).

Compatibility: where llama-cpp-python and edgekv overlap, names, defaults and response
shapes are llama-cpp-python's, so switching is a change of import. Options edgekv cannot
honour (grammars, mirostat, suffix, tools, ...) raise an EdgeKVError instead of being ignored;
hardware options that mean nothing here (use_mmap, ...) are accepted and logged; n_gpu_layers asks for
the GPU (backends.offload_choice).
"""

from __future__ import annotations

import copy
import logging
import os
from typing import Any, Iterator, Sequence

import numpy as np

from ..kv.plan import KVPlan
from ..errors import EdgeKVError
from ..generate import generate_step
from ..speculative import DraftModel, as_speculation
from ..loader import load
from ..sampling import LogitsProcessor, Sampler, sampler_for
from ..session import Session
from ..text.chat_format import CHATML_TEMPLATE, GEMMA_TEMPLATE, ChatFormatter
from ..backends import offload_choice, say_whole_offload
from .compat import check_compat, check_options, log_to_stderr, set_threads
from .completions import CompletionsMixin
from .context_growth import ContextManager
from .llama_state import LlamaState, StateMixin  # noqa: F401  (LlamaState: also importable from here)
from .responses import GenerationStats

log = logging.getLogger("edgekv")

_CHAT_TEMPLATES = {"chatml": CHATML_TEMPLATE, "gemma": GEMMA_TEMPLATE}


class Llama(CompletionsMixin, StateMixin):
    """A model plus one conversation, with llama-cpp-python's high-level API."""

    def __init__(self, model_path: str | os.PathLike, *, n_ctx: int | str = "auto", n_batch: int = 512,
                 n_threads: int | None = None, seed: int = 0, logits_all: bool = False, verbose: bool = False,
                 cache_type_k: str = "f16", cache_type_v: str = "f16", chat_format: str | None = None,
                 context_shift: str = "none", n_keep: int = 0, n_discard: int = 0,
                 layer_windows: dict[int, int] | str | None = None, mem_budget: int | str | None = None,
                 backend: str | None = None, draft_model: Any = None, **options: Any):
        """Load `model_path` (a GGUF path or a catalog name).

        n_ctx: tokens the context holds. "auto" (also None): planned from the input of the
        first call (prompt + max_tokens, rounded up to 256) and grown geometrically (at least
        doubled, the conversation copied once) when a later call needs more, up to a cap:
        the trained context and the memory budget. 0: the model's trained context (as
        llama-cpp-python). Any other int is fixed. The overflow policy applies only at the
        cap (auto) or at n_ctx (an int).
        context_shift: what a full context does: "none" (ContextFullError), "shift"
        (llama.cpp's context shift: keep n_keep tokens, drop n_discard (default half) of the
        others), "stream" (StreamingLLM: n_keep (default 4) sinks + a sliding window) or
        "keep" (n_keep (default 4) sinks + the most attended tokens + a recent window; H2O-like,
        kv/heavy_hitters.py).
        layer_windows: {layer: window} or "0-9:512,12:256": those layers keep only a window.
        mem_budget: bytes (or "2G") the KV cache may take; None: half of what the memory
        available before loading leaves beside the weights and the runtime (kv/plan.py
        budget_from; at least the smallest context, which loading checks fits).
        backend: where the arithmetic runs: "auto", "cpu", "cpu-portable", "cuda" (edgekv.backends);
        None: EDGEKV_BACKEND, default auto (CUDA where a GPU is usable, else the CPU).
        n_gpu_layers (llama-cpp-python's), with backend auto: 0 keeps the model on the CPU;
        nonzero asks for the GPU, and where CUDA cannot run, one line on stderr says why and
        the model runs on the CPU (offload is whole-model: a value below the layer count
        offloads them all, saying so in one line); unset: auto.
        draft_model: speculative decoding (edgekv.speculative): PromptLookupDecoding(...)
        (llama-cpp-python's LlamaPromptLookupDecoding works too), DraftModel("small.gguf",
        n_draft=8), a path to a draft GGUF, or any LlamaDraftModel; the same tokens, faster."""
        n_gpu_layers = options.pop("n_gpu_layers", None)
        backend = offload_choice(backend, n_gpu_layers)
        check_options(options)
        if verbose:
            log_to_stderr()
        if n_threads is not None:
            set_threads(n_threads)
        self.model_path = os.fspath(model_path)
        self.verbose = verbose
        self.logits_all = logits_all
        self._seed = seed
        self._model = load(model_path, backend)  # logs the system_info line when verbose
        say_whole_offload(self._model, n_gpu_layers)
        self.tokenizer_ = self._model.tokenizer
        self._ctx = ContextManager(self._model, n_ctx, n_batch, mem_budget, cache_type_k=cache_type_k,
                                   cache_type_v=cache_type_v, context_shift=context_shift, n_keep=n_keep,
                                   n_discard=n_discard, layer_windows=layer_windows)
        self._scores = np.empty((0, self._session.n_vocab), np.float32)  # grows when logits_all
        self.chat_formatter = self._make_chat_formatter(chat_format)
        self.metadata = {k: str(v) for k, v in self._model.gguf.metadata.items()
                         if not isinstance(v, (list, tuple, np.ndarray))}
        self.last_stats = GenerationStats()
        if isinstance(draft_model, (str, os.PathLike)):
            draft_model = DraftModel(draft_model, backend=backend)
        self._speculation = as_speculation(draft_model, self._model)
        if self._speculation is not None and context_shift == "keep" and not self._model.backend.exact_verify:
            raise EdgeKVError(f"speculative decoding with context_shift='keep' runs on the CPU backends for now, not "
                              f"on {self._model.backend.name}: use context_shift 'shift' or 'stream' there")

    def fork(self, runner: Any = None) -> "Llama":
        """Another conversation on the same loaded model: a Llama that shares the weights,
        tokenizer, chat template and options, with its own empty context (the current plan's
        size) and statistics. What `edgekv serve` gives each of its sessions; runner: who runs
        its forward passes (Session.runner; None: the calling thread)."""
        other = copy.copy(self)
        other._ctx = self._ctx.fork(runner)
        other._scores = np.empty((0, self.n_vocab()), np.float32)
        other.last_stats = GenerationStats()
        other._speculation = None if self._speculation is None else self._speculation.fork()
        return other

    # -- the context plan --------------------------------------------------------------------

    @property
    def _session(self) -> Session:  # the current Session; ContextManager replaces it when the context grows
        return self._ctx.session

    @property
    def kv_plan(self) -> KVPlan:
        """The current context plan (edgekv.kv.plan.KVPlan)."""
        return self._ctx.plan

    def plan_line(self) -> str:
        """The current context plan in one line: n_ctx and why, K/V bytes per token, KV bytes."""
        return self._ctx.plan_line()

    def _make_chat_formatter(self, name: str | None) -> ChatFormatter:
        if name is None:
            return self._model.chat_formatter
        if name not in _CHAT_TEMPLATES:
            raise EdgeKVError(f"chat_format={name!r} is not known; use None (the model's template) or one of "
                              f"{', '.join(_CHAT_TEMPLATES)}")
        own = self._model.chat_formatter
        return ChatFormatter(_CHAT_TEMPLATES[name], own.bos_token, own.eos_token, self.tokenizer_, name)

    # -- the model ---------------------------------------------------------------------------

    def n_ctx(self) -> int:
        """Tokens the context holds now (with n_ctx="auto" it may grow later)."""
        return self._session.n_ctx

    def n_vocab(self) -> int:
        """Tokens in the vocabulary (the length of a logits row)."""
        return self._session.n_vocab

    def n_embd(self) -> int:
        """The model's hidden size."""
        return self._model.hp.dim

    def token_bos(self) -> int:
        """The BOS id, -1 when the model has none."""
        return -1 if self.tokenizer_.bos_id is None else self.tokenizer_.bos_id

    def token_eos(self) -> int:
        """The EOS id, -1 when the model has none."""
        return -1 if self.tokenizer_.eos_id is None else self.tokenizer_.eos_id

    def set_seed(self, seed: int) -> None:
        """The seed every later generation starts its sampler from (-1: random each time)."""
        self._seed = seed

    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Text -> ids. add_bos=True adds BOS when the model wants one (llama-cpp-python's meaning)."""
        return self.tokenizer_.encode(text, add_bos=None if add_bos else False, special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None,
                   special: bool = False) -> bytes:
        """Ids -> bytes; special=True writes control tokens' text. With prev_tokens, the bytes
        that `tokens` add after them."""
        skip = not special
        if not prev_tokens:
            return self.tokenizer_.decode(tokens, skip_special=skip)
        before = self.tokenizer_.decode(prev_tokens, skip_special=skip)
        return self.tokenizer_.decode(list(prev_tokens) + list(tokens), skip_special=skip)[len(before):]

    # -- the conversation --------------------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        """Tokens in the conversation (evaluated so far)."""
        return self._session.n_tokens

    @property
    def input_ids(self) -> np.ndarray:
        """The conversation's ids, intc[n_tokens]."""
        return np.asarray(self._session.tokens, dtype=np.intc)

    @property
    def scores(self) -> np.ndarray:
        """f32[n_tokens, n_vocab] when logits_all; otherwise only the last row, f32[1, n_vocab]
        (f32[0, n_vocab] before anything was evaluated)."""
        if self.logits_all:
            return self._scores[: self.n_tokens]
        if self.n_tokens == 0:
            return self._scores[:0]
        return self._session.logits[None, :]

    def reset(self) -> None:
        """Forget the conversation (the context's memory stays allocated)."""
        self._session.reset()

    def eval(self, tokens: Sequence[int]) -> None:
        """Append `tokens` to the conversation and run them through the model."""
        tokens = list(tokens)
        self._ctx.ensure(self.n_tokens + len(tokens))
        if not self.logits_all:
            self._session.eval(tokens)
            return
        step = self._session.n_batch  # chunk by chunk, so rows of completed chunks are kept
        for start in range(0, len(tokens), step):
            n_before = self.n_tokens
            rows = self._session.eval(tokens[start : start + step], all_logits=True)
            self._store_scores(n_before, rows)

    def _store_scores(self, at: int, rows: np.ndarray) -> None:
        need = at + rows.shape[0]
        if need > self._scores.shape[0]:  # geometric growth: copied O(log n) times
            grown = np.empty((max(need, 2 * self._scores.shape[0], 16), self.n_vocab()), np.float32)
            grown[:at] = self._scores[:at]
            self._scores = grown
        self._scores[at:need] = rows

    def _prefill(self, tokens: list[int]) -> None:
        """Hold exactly `tokens`, reusing the longest prefix already evaluated."""
        self._ctx.ensure(len(tokens))
        if not self.logits_all:
            self._session.prefill(tokens)
            return
        if not tokens:
            raise EdgeKVError("cannot evaluate an empty prompt")
        keep = min(self._session.common_prefix(tokens), len(tokens) - 1)
        self._session.truncate(keep)
        self.eval(tokens[keep:])

    # -- generation --------------------------------------------------------------------------

    def generate(self, tokens: Sequence[int], *, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, repeat_last_n: int = 64,
                 logit_bias: dict[int, float] | None = None, seed: int | None = None,
                 logits_processor: Sequence[LogitsProcessor] | None = None, stopping_criteria: Any = None,
                 **compat: Any) -> Iterator[int]:
        """Evaluate `tokens` and yield sampled ids without end (the caller stops; EOS is yielded
        like any id). reset=True reuses the common prefix with the conversation; reset=False
        appends. A list sent into the generator is evaluated after the yielded token.
        seed None: the Llama's seed, so equal calls give equal tokens."""
        check_compat("generate", compat)
        sampler = sampler_for(temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                              repeat_last_n=repeat_last_n, frequency_penalty=frequency_penalty,
                              presence_penalty=presence_penalty, logit_bias=logit_bias,
                              seed=self._seed if seed is None else seed, logits_processor=logits_processor)
        return self._generate(list(tokens), sampler, reset, stopping_criteria)

    def _generate(self, tokens: list[int], sampler: Sampler, reset: bool, stopping_criteria: Any) -> Iterator[int]:
        if reset:
            self._prefill(tokens)
        elif tokens:
            self.eval(tokens)
        yield from generate_step(lambda: self._session, sampler, evaluate=self.eval,
                                 stopping_criteria=stopping_criteria, draft=self._speculation,
                                 record=self._store_scores if self.logits_all else None)

    def kv_status(self) -> dict[str, Any]:
        """The KV cache at a glance, for status lines (read-only): n_tokens, n_ctx, n_keep,
        cache_type_k, cache_type_v and the ring's `start` / `cur` (KVCache.ring_pointers)."""
        c = self._session.cache
        start, cur = c.ring_pointers()
        return dict(n_tokens=self.n_tokens, n_ctx=self.n_ctx(), n_keep=c.n_keep, start=start, cur=cur,
                    cache_type_k=c.type_k, cache_type_v=c.type_v)
