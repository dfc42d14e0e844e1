"""The completion half of the `Llama` facade: create_completion and create_chat_completion
(llama-cpp-python's names, defaults and OpenAI-shaped responses) and the generation loop
under them (prompt fitting, max_tokens, end-of-generation tokens, stop strings, log-probs).

What lives here: `CompletionsMixin`, which `Llama` (facade.py) inherits. It uses the facade's
session, context manager (`_ctx`), tokenizer and chat formatter. What does not: the session
and model (facade.py), the response dicts and stop strings (responses.py), log-probs
(logprobs.py), reasoning text (reasoning.py), the sampler (sampling.py).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Sequence

from ..errors import ContextFullError, EdgeKVError
from ..grammar import GrammarConstraint, LazyConstraint, LazyGrammar, as_grammar, response_format_grammar
from ..sampling import sampler_for, with_banned
from . import reasoning
from .compat import SAMPLER_OPTIONS, check_compat
from .context_growth import continue_after_shift
from .logprobs import LogprobRecorder, chat_recorder, make_recorder
from .responses import (GenerationStats, Pieces, StopText, chat_chunks, chat_completion, chat_head, collect,
                        completion_chunks, completion_head, stop_list, text_completion, tool_chat_chunks)
from .tools import ToolCalling


class CompletionsMixin:
    """create_completion / create_chat_completion for `Llama`."""

    def _stream(self, prompt: list[int], max_tokens: int | None, stop: list[str], stop_ids: Sequence[int],
                sampling: dict[str, Any], recorder: LogprobRecorder | None = None, ignore_eos: bool = False,
                keep: frozenset[int] = frozenset()) -> Pieces:
        """(text, None, logprobs) pieces of the completion, then (text, finish_reason, logprobs)
        once (completion.Pieces). sampling: sampler_for's keywords, seed and stopping_criteria.
        ignore_eos: llama.cpp's --ignore-eos: the end-of-generation tokens (and stop_ids) get a
        logit bias of -inf, so only max_tokens, a stop string or a full context ends the text.
        keep: special tokens whose text the completion shows (a tool call format's markers)."""
        tokens = self._fit_prompt(prompt)
        limit = self._room_for(tokens, max_tokens)
        stats = self.last_stats = GenerationStats(prompt_tokens=len(tokens))
        text = StopText(self.tokenizer_.detokenizer(skip_special=True, keep=keep), stop)
        is_end = set(stop_ids) | self.tokenizer_.eog_ids
        finish, hit, n_before, t0, n_emitted = "length", False, self._session.n_evaluated, time.perf_counter(), 0
        sampler, criteria, is_end = self._stream_sampler(dict(sampling), is_end, ignore_eos)

        def prompt_done() -> None:  # called once, when the prompt's logits exist
            stats.prompt_eval_s = time.perf_counter() - t0
            stats.prompt_eval_tokens = self._session.n_evaluated - n_before

        def released(n_chars: int | None) -> list | None:  # log-probs of the tokens whose text is out
            return None if recorder is None else recorder.release(n_chars)

        stream = self._generate(tokens, sampler, True, criteria)
        drafts = self._speculation.counts.snapshot() if self._speculation is not None else None
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
            if drafts is not None:
                stats.draft_n, stats.draft_n_accepted = self._speculation.counts.since(drafts)
        tail, hit_at_end = ("", False) if hit else text.finish()
        # tokens after a stop string's start are not part of the answer: their log-probs go too
        yield tail, "stop" if hit_at_end else finish, released(n_emitted + len(tail) if hit or hit_at_end else None)

    def _stream_sampler(self, sampling: dict[str, Any], is_end: set[int], ignore_eos: bool):
        """(Sampler, stopping_criteria, the ids that end the text) for `_stream`: ignore_eos bans
        the end ids instead; a grammar masks the logits (lazily for a LazyGrammar)."""
        if ignore_eos:
            sampling["logit_bias"] = with_banned(sampling.get("logit_bias"), is_end)
            is_end = set()
        criteria, seed = sampling.pop("stopping_criteria", None), sampling.pop("seed", None)
        grammar = sampling.pop("grammar", None)
        if grammar is not None and ignore_eos:
            raise EdgeKVError("a grammar cannot be combined with ignore_eos: the grammar decides where the text ends")
        constraint = None if grammar is None else \
            (LazyConstraint if isinstance(grammar, LazyGrammar) else GrammarConstraint)(grammar, self.tokenizer_, is_end)
        return sampler_for(**sampling, seed=self._seed if seed is None else seed, constraint=constraint), criteria, is_end

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

    def _token_text(self, keep: frozenset[int] = frozenset()) -> Callable[[int], str]:
        """A fresh streaming detokenizer's push, as _stream's StopText uses."""
        return self.tokenizer_.detokenizer(skip_special=True, keep=keep).push

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
                          ignore_eos: bool = False, grammar: Any = None, **options: Any) -> dict | Iterator[dict]:
        """Complete `prompt` (text, or token ids). max_tokens None or <= 0: until the context
        is full or an end-of-generation token. stop: a string or several; the text ends before
        the first one found (also across tokens, also when streaming). seed None: the Llama's.
        logit_bias: {token id: added to its logit}. ignore_eos: never sample an end-of-generation
        token (llama.cpp's --ignore-eos; for long benchmark and test runs). logprobs=n: choices[0]["logprobs"] in the
        completions shape (tokens, text_offset, token_logprobs, top_logprobs with the n most
        likely and the chosen token; api/logprobs.py), per chunk when streaming.
        grammar: a grammar.Grammar (from_string for GBNF, from_json_schema, json_object, ...)
        or GBNF text: only text the grammar allows is generated, and it ends when it may.
        Returns a `text_completion` dict (with `usage`), or an iterator of chunks when stream.
        options: logits_processor, stopping_criteria, repeat_last_n, and llama-cpp-python's
        options that edgekv accepts only when off (suffix, mirostat_mode, ...)."""
        passed = {k: options.pop(k) for k in SAMPLER_OPTIONS if k in options}
        check_compat("create_completion", options)
        ids = list(prompt) if not isinstance(prompt, (str, bytes)) else self.tokenize(prompt, special=True)
        self._fit_prompt(ids)
        recorder = make_recorder(logprobs, self.detokenize, ids, self._token_text())
        if recorder is not None and echo:
            raise EdgeKVError("logprobs with echo=True (log-probs of the prompt) is not supported by edgekv yet")
        sampling = dict(passed, temp=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                        repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                        presence_penalty=presence_penalty, logit_bias=logit_bias, grammar=as_grammar(grammar))
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
                               chat_template_kwargs: dict[str, Any] | None = None, reasoning_format: str = "none",
                               response_format: dict[str, Any] | None = None, grammar: Any = None,
                               tools: list[dict] | None = None, tool_choice: Any = None,
                               parallel_tool_calls: bool = True, **options: Any) -> dict | Iterator[dict]:
        """Answer `messages` with the chat template, stopping at the end of the assistant's turn.
        Sampling options as for create_completion (max_tokens None: until the turn ends or the
        context is full; ignore_eos: the turn-end tokens are never sampled either).
        logprobs=True: choices[0]["logprobs"] = {"content": [{"token", "logprob", "bytes",
        "top_logprobs": the top_logprobs most likely}]}, per chunk when streaming.
        chat_template_kwargs: more variables for the template (llama-server's field), e.g.
        {"enable_thinking": False} for Qwen3. reasoning_format: "none" (the text as generated,
        as llama-cpp-python), "deepseek" or "auto" (llama-server's: a leading <think> block goes
        to message["reasoning_content"] / delta["reasoning_content"], the answer to content).
        response_format: {"type": "json_object"} (any JSON object, or with "schema": one valid
        against it) or OpenAI's {"type": "json_schema", "json_schema": {"schema": {...}}};
        grammar: as for create_completion (give one of grammar and response_format).
        tools / tool_choice / parallel_tool_calls: OpenAI's (api/tools.py): the answer holds
        calls whose arguments match the function's parameters (finish_reason "tool_calls",
        message["tool_calls"]; several unless parallel_tool_calls is False) or, with "auto",
        text, in which calls the model writes freely (fenced or bare JSON) are found too; a
        stream sends each call's index, id and name, then its arguments as they are generated
        (OpenAI's tool_calls deltas).
        Returns a `chat.completion` dict (with `usage`), or an iterator of `chat.completion.chunk` dicts.
        options: as for create_completion (functions, function_call, ... only when off)."""
        passed = {k: options.pop(k) for k in SAMPLER_OPTIONS if k in options}
        check_compat("create_chat_completion", options)
        split = reasoning.check_format(reasoning_format)
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
            raise EdgeKVError(f"chat_template_kwargs must be a dict of template variables, "
                              f"got {type(chat_template_kwargs).__name__}")
        formatter = self.chat_formatter
        calling = ToolCalling(tools, tool_choice, formatter.template, parallel_tool_calls)
        prompt = self._render_chat(messages, calling, chat_template_kwargs)
        opened = reasoning.opened_by(prompt, calling.thinking[0])
        shape = _answer_grammar(calling, grammar, response_format, opened)
        splitter = reasoning.ReasoningSplitter(opened, calling.thinking) if split else None
        ids = formatter.tokenize_prompt(prompt)
        if self._session.n_discarded:  # the cache lost the conversation's start: append the new turn
            ids = continue_after_shift(self._session.tokens, ids)
        ids = self._fit_prompt(ids)
        keep = self.tokenizer_.ids_of(calling.markers) if calling.active or split else frozenset()  # shown
        recorder = chat_recorder(logprobs, top_logprobs, self.detokenize, ids, self._token_text(keep))
        sampling = dict(passed, temp=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                        repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                        presence_penalty=presence_penalty, logit_bias=logit_bias, grammar=shape)
        stops = stop_list(stop) + [s for s in formatter.stop_strings if s not in stop_list(stop)]
        kind = "chat.completion.chunk" if stream else "chat.completion"
        head = chat_head(model or self.model_path, kind)
        pieces = self._stream(ids, max_tokens, stops, formatter.stop_token_ids, sampling, recorder, ignore_eos, keep)
        if calling.active or (split and calling.markers):  # (a family's markers are not content either)
            return _tool_answer(head, pieces, calling, stream, self, splitter)
        if stream:
            return chat_chunks(head, pieces, splitter)
        text, finish, records = collect(pieces)
        return chat_completion(head, text, finish, self.last_stats, records, splitter)


    def chat_prompt_tokens(self, messages: list[dict[str, Any]], *, tools: list[dict] | None = None,
                           tool_choice: Any = None, chat_template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """The ids create_chat_completion would evaluate for these arguments (before an
        overflow policy's adjustment): how the server finds a request's conversation."""
        calling = ToolCalling(tools, tool_choice, self.chat_formatter.template)
        return self.chat_formatter.tokenize_prompt(self._render_chat(messages, calling, chat_template_kwargs))

    def _render_chat(self, messages: list[dict[str, Any]], calling: ToolCalling,
                     chat_template_kwargs: dict[str, Any] | None) -> str:
        return self.chat_formatter.render(calling.messages(messages), add_generation_prompt=True,
                                          **{**calling.template_kwargs(), **(chat_template_kwargs or {})})


def _answer_grammar(calling: ToolCalling, grammar: Any, response_format: Any, opened: bool) -> Any:
    """The grammar a chat answer must follow: the tool call's, the `grammar=` one or the
    response_format's (at most one of them may be asked for), or None. opened: the prompt
    left the model inside a reasoning block."""
    if calling.active and (grammar is not None or response_format is not None):
        raise EdgeKVError("tools cannot be combined with grammar or response_format")
    if grammar is not None and response_format is not None:
        raise EdgeKVError("give either grammar or response_format, not both")
    return calling.grammar(opened) or as_grammar(grammar) or response_format_grammar(response_format)


def _tool_answer(head: dict, pieces: Pieces, calling: ToolCalling, stream: bool, llm: Any,
                 splitter: reasoning.ReasoningSplitter | None) -> dict | Iterator[dict]:
    """An answer that may be a tool call: streamed as the call is read out of the text
    (tool_reader.py), or generated whole and shaped; with a splitter, a leading reasoning
    block goes to reasoning_content and the calls are read from the rest."""
    if stream:
        return tool_chat_chunks(head, pieces, calling.reader(), splitter)
    text, finish, records = collect(pieces)
    thought, text = ("", text) if splitter is None else splitter.whole(text)
    content, calls, finish = calling.answer(text, finish)
    return chat_completion(head, content, finish, llm.last_stats, records, None, calls, thought)
