"""The `Llama` facade: llama-cpp-python's high-level API on top of edgekv's Model and Session.

What lives here: `Llama` (tokenize, eval, generate, create_completion, create_chat_completion,
in-memory state, state files), the generation loop (prompt reuse, end-of-generation tokens,
max_tokens) and checking llama-cpp-python's options.
What does not: the context's size (the n_ctx="auto" plan, the memory budget, growth, making
the session: context_growth.py), stop strings, the OpenAI-shaped response dicts and the
generation statistics (responses.py), save_state/load_state and state files
(llama_state.py), the forward pass, the cache and its snapshots
(models/, session.py, cache.py), the state file format (state_file.py), the sampler chain
(sampling.py), the step generator (generate.py), log-probs (logprobs.py), text <-> ids
(text/tokenizer.py), chat templates (text/chat_format.py).

Compatibility: where llama-cpp-python and edgekv overlap, names, defaults and response
shapes are llama-cpp-python's, so switching is a change of import. Options edgekv cannot
honour (grammars, mirostat, suffix, tools, ...) raise an EdgeKVError instead of being ignored;
hardware options that mean nothing here (n_gpu_layers, use_mmap, ...) are accepted and logged.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from ..context import KVPlan
from ..errors import ContextFullError, EdgeKVError
from ..generate import generate_step
from ..loader import load
from ..sampling import LogitsProcessor, Sampler, sampler_for, with_banned
from ..session import Session
from ..text.chat_format import CHATML_TEMPLATE, GEMMA_TEMPLATE, ChatFormatter
from .compat import SAMPLER_OPTIONS, check_compat, check_options, log_to_stderr, set_threads
from .context_growth import ContextManager, continue_after_shift
from .llama_state import LlamaState, StateMixin  # noqa: F401  (LlamaState: also importable from here)
from .logprobs import LogprobRecorder, chat_recorder, make_recorder
from .responses import (GenerationStats, Pieces, StopText, chat_chunks, chat_completion, chat_head, collect,
                        completion_chunks, completion_head, stop_list, text_completion)

log = logging.getLogger("edgekv")

_CHAT_TEMPLATES = {"chatml": CHATML_TEMPLATE, "gemma": GEMMA_TEMPLATE}


class Llama(StateMixin):
    """A model plus one conversation, with llama-cpp-python's high-level API."""

    def __init__(self, model_path: str | os.PathLike, *, n_ctx: int | str = "auto", n_batch: int = 512,
                 n_threads: int | None = None, seed: int = 0, logits_all: bool = False, verbose: bool = False,
                 cache_type_k: str = "f16", cache_type_v: str = "f16", chat_format: str | None = None,
                 context_shift: str = "none", n_keep: int = 0, n_discard: int = 0,
                 layer_windows: dict[int, int] | str | None = None, mem_budget: int | str | None = None,
                 backend: str | None = None, **options: Any):
        """Load `model_path` (a GGUF path or a catalog name).

        n_ctx: tokens the context holds. "auto" (also None): planned from the input of the
        first call (prompt + max_tokens, rounded up to 256) and grown geometrically (at least
        doubled, the conversation copied once) when a later call needs more, up to a cap:
        the trained context and the memory budget. 0: the model's trained context (as
        llama-cpp-python). Any other int is fixed. The overflow policy applies only at the
        cap (auto) or at n_ctx (an int).
        context_shift: what a full context does: "none" (ContextFullError), "shift"
        (llama.cpp's context shift: keep n_keep tokens, drop n_discard (default half) of the
        others) or "stream" (StreamingLLM: n_keep (default 4) sinks + a sliding window).
        layer_windows: {layer: window} or "0-9:512,12:256": those layers keep only a window.
        mem_budget: bytes (or "2G") the KV cache may take; None: half the available memory
        minus the weights (context.default_mem_budget).
        backend: where the arithmetic runs: "auto", "cpu", "cpu-portable" (edgekv.backends);
        None: EDGEKV_BACKEND, default auto."""
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
        self.tokenizer_ = self._model.tokenizer
        self._ctx = ContextManager(self._model, n_ctx, n_batch, mem_budget, cache_type_k=cache_type_k,
                                   cache_type_v=cache_type_v, context_shift=context_shift, n_keep=n_keep,
                                   n_discard=n_discard, layer_windows=layer_windows)
        self._scores = np.empty((0, self._session.n_vocab), np.float32)  # grows when logits_all
        self.chat_formatter = self._make_chat_formatter(chat_format)
        self.metadata = {k: str(v) for k, v in self._model.gguf.metadata.items()
                         if not isinstance(v, (list, tuple, np.ndarray))}
        self.last_stats = GenerationStats()
        self._fingerprint: str | None = None

    # -- the context plan --------------------------------------------------------------------

    @property
    def _session(self) -> Session:  # the current Session; ContextManager replaces it when the context grows
        return self._ctx.session

    @property
    def kv_plan(self) -> KVPlan:
        """The current context plan (edgekv.context.KVPlan)."""
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
                                 stopping_criteria=stopping_criteria)

    def _stream(self, prompt: list[int], max_tokens: int | None, stop: list[str], stop_ids: Sequence[int],
                sampling: dict[str, Any], recorder: LogprobRecorder | None = None, ignore_eos: bool = False) -> Pieces:
        """(text, None, logprobs) pieces of the completion, then (text, finish_reason, logprobs)
        once (completion.Pieces). sampling: sampler_for's keywords, seed and stopping_criteria.
        ignore_eos: llama.cpp's --ignore-eos: the end-of-generation tokens (and stop_ids) get a
        logit bias of -inf, so only max_tokens, a stop string or a full context ends the text."""
        tokens = self._fit_prompt(prompt)
        limit = self._room_for(tokens, max_tokens)
        stats = self.last_stats = GenerationStats(prompt_tokens=len(tokens))
        text = StopText(self.tokenizer_.detokenizer(skip_special=True), stop)
        is_end = set(stop_ids) | self.tokenizer_.eog_ids
        finish, hit, n_before, t0, n_emitted = "length", False, self._session.n_evaluated, time.perf_counter(), 0
        sampling = dict(sampling)
        if ignore_eos:
            sampling["logit_bias"] = with_banned(sampling.get("logit_bias"), is_end)
            is_end = set()
        criteria, seed = sampling.pop("stopping_criteria", None), sampling.pop("seed", None)
        sampler = sampler_for(**sampling, seed=self._seed if seed is None else seed)

        def prompt_done() -> None:  # called once, when the prompt's logits exist
            stats.prompt_eval_s = time.perf_counter() - t0
            stats.prompt_eval_tokens = self._session.n_evaluated - n_before

        def released(n_chars: int | None) -> list | None:  # log-probs of the tokens whose text is out
            return None if recorder is None else recorder.release(n_chars)

        stream = self._generate(tokens, sampler, True, criteria)
        try:
            if limit <= 0:  # the prompt fills the context: evaluate it, generate nothing
                self._prefill(tokens)
                prompt_done()
            for token in stream if limit > 0 else ():
                if stats.gen_tokens == 0:
                    prompt_done()
                if token in is_end:
                    finish = "stop"
                    break
                stats.gen_tokens += 1
                if recorder is not None:
                    recorder.add(token, sampler.last_logits)
                piece, hit = text.push(token)
                if piece:
                    n_emitted += len(piece)
                    yield piece, None, released(n_emitted)
                if hit or stats.gen_tokens >= limit:
                    finish = "stop" if hit else finish
                    break
            else:
                finish = "stop" if limit > 0 else finish  # the stopping_criteria said stop
        finally:
            stream.close()
            stats.gen_s = time.perf_counter() - t0 - stats.prompt_eval_s
        tail, hit_at_end = ("", False) if hit else text.finish()
        # tokens after a stop string's start are not part of the answer: their log-probs go too
        yield tail, "stop" if hit_at_end else finish, released(n_emitted + len(tail) if hit or hit_at_end else None)

    def _room_for(self, tokens: list[int], max_tokens: int | None) -> int:
        """How many tokens to generate after `tokens`: max_tokens; None or <= 0: until the
        context is full (as llama-cpp-python). Without an overflow policy, never past a full context."""
        until_full = max_tokens is None or max_tokens <= 0
        self._ctx.ensure(len(tokens), 0 if until_full else max_tokens)
        room = self._ctx.cap - len(tokens)
        if until_full:
            return room
        if self._session.context_shift != "none":  # the overflow policy makes room
            return max_tokens
        return min(max_tokens, room)

    def _token_text(self) -> Callable[[int], str]:  # a fresh streaming detokenizer's push, as _stream's StopText uses
        return self.tokenizer_.detokenizer(skip_special=True).push

    def _fit_prompt(self, prompt: list[int]) -> list[int]:
        if not prompt:
            raise EdgeKVError("the prompt is empty (and the model adds no BOS token)")
        cap = self._ctx.cap
        if len(prompt) > cap and self._session.context_shift == "none":
            raise ContextFullError(f"the prompt has {len(prompt)} tokens but the context holds at most {cap}; "
                                   f"use a larger n_ctx (-c) or a shorter prompt",
                                   n_tokens=len(prompt), n_ctx=cap)
        # under shift/stream the session drops the oldest middle tokens while it prefills
        return prompt

    # -- OpenAI-shaped responses -------------------------------------------------------------

    def create_completion(self, prompt: str | bytes | Sequence[int], *, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05, top_k: int = 40,
                          stop: str | list[str] | None = None, echo: bool = False, stream: bool = False,
                          repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
                          presence_penalty: float = 0.0, seed: int | None = None, model: str | None = None,
                          logit_bias: dict[int, float] | None = None, logprobs: int | None = None,
                          ignore_eos: bool = False, **options: Any) -> dict | Iterator[dict]:
        """Complete `prompt` (text, or token ids). max_tokens None or <= 0: until the context
        is full or an end-of-generation token. stop: a string or several; the text ends before
        the first one found (also across tokens, also when streaming). seed None: the Llama's.
        logit_bias: {token id: added to its logit}. ignore_eos: never sample an end-of-generation
        token (llama.cpp's --ignore-eos; for long benchmark and test runs). logprobs=n: choices[0]["logprobs"] in the
        completions shape (tokens, text_offset, token_logprobs, top_logprobs with the n most
        likely and the chosen token; edgekv/logprobs.py), per chunk when streaming.
        Returns a `text_completion` dict (with `usage`), or an iterator of chunks when stream.
        options: logits_processor, stopping_criteria, repeat_last_n, and llama-cpp-python's
        options that edgekv accepts only when off (suffix, grammar, mirostat_mode, ...)."""
        passed = {k: options.pop(k) for k in SAMPLER_OPTIONS if k in options}
        check_compat("create_completion", options)
        ids = list(prompt) if not isinstance(prompt, (str, bytes)) else self.tokenize(prompt, special=True)
        self._fit_prompt(ids)
        recorder = make_recorder(logprobs, self.detokenize, ids, self._token_text())
        if recorder is not None and echo:
            raise EdgeKVError("logprobs with echo=True (log-probs of the prompt) is not supported by edgekv yet")
        sampling = dict(passed, temp=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                        repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                        presence_penalty=presence_penalty, logit_bias=logit_bias)
        head = completion_head(model or self.model_path)
        prompt_text = self.detokenize(ids).decode("utf-8", errors="replace")
        prefix = prompt_text if echo else ""
        pieces = self._stream(ids, max_tokens, stop_list(stop), (), sampling, recorder, ignore_eos)
        if stream:
            return completion_chunks(head, prefix, pieces, len(prompt_text))
        text, finish, records = collect(pieces)
        return text_completion(head, prefix + text, finish, self.last_stats, records, len(prompt_text))

    __call__ = create_completion

    def create_chat_completion(self, messages: list[dict[str, Any]], *, max_tokens: int | None = None,
                               temperature: float = 0.2, top_p: float = 0.95, min_p: float = 0.05, top_k: int = 40,
                               stop: str | list[str] | None = None, stream: bool = False,
                               repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
                               presence_penalty: float = 0.0, seed: int | None = None, model: str | None = None,
                               logit_bias: dict[int, float] | None = None, logprobs: bool | None = None,
                               top_logprobs: int | None = None, ignore_eos: bool = False,
                               **options: Any) -> dict | Iterator[dict]:
        """Answer `messages` with the chat template, stopping at the end of the assistant's turn.
        Sampling options as for create_completion (max_tokens None: until the turn ends or the
        context is full; ignore_eos: the turn-end tokens are never sampled either). logprobs=True: choices[0]["logprobs"] = {"content": [{"token",
        "logprob", "bytes", "top_logprobs": the top_logprobs most likely}]}, per chunk when streaming.
        Returns a `chat.completion` dict (with `usage`), or an iterator of `chat.completion.chunk` dicts.
        options: as for create_completion (tools, response_format, ... only when off)."""
        passed = {k: options.pop(k) for k in SAMPLER_OPTIONS if k in options}
        check_compat("create_chat_completion", options)
        formatter = self.chat_formatter
        ids = formatter.encode(messages, add_generation_prompt=True)
        if self._session.n_discarded:  # the cache lost the conversation's start: append the new turn
            ids = continue_after_shift(self._session.tokens, ids)
        ids = self._fit_prompt(ids)
        recorder = chat_recorder(logprobs, top_logprobs, self.detokenize, ids, self._token_text())
        sampling = dict(passed, temp=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                        repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                        presence_penalty=presence_penalty, logit_bias=logit_bias)
        stops = stop_list(stop) + [s for s in formatter.stop_strings if s not in stop_list(stop)]
        kind = "chat.completion.chunk" if stream else "chat.completion"
        head = chat_head(model or self.model_path, kind)
        pieces = self._stream(ids, max_tokens, stops, formatter.stop_token_ids, sampling, recorder, ignore_eos)
        if stream:
            return chat_chunks(head, pieces)
        text, finish, records = collect(pieces)
        return chat_completion(head, text, finish, self.last_stats, records)

    def kv_status(self) -> dict[str, Any]:
        """The KV cache at a glance, for status lines (read-only): n_tokens, n_ctx, n_keep,
        cache_type_k, cache_type_v and the ring's `start` / `cur` (KVCache.ring_pointers)."""
        c = self._session.cache
        start, cur = c.ring_pointers()
        return dict(n_tokens=self.n_tokens, n_ctx=self.n_ctx(), n_keep=c.n_keep, start=start, cur=cur,
                    cache_type_k=c.type_k, cache_type_v=c.type_v)
