"""Completion results: from generated ids to the text, responses and statistics a caller sees.

What lives here: stop-string handling (`StopText`: whole UTF-8 characters, cut at the first
stop string even when it spans tokens), the OpenAI-shaped `text_completion` and
`chat.completion` dicts and their streamed chunks (llama-cpp-python's shapes, key order
included), and `GenerationStats`, the timings the CLI prints.
What does not: the `Llama` object and its conversation state, prompt evaluation and the
generation loop (facade.py, generate.py), sampling (sampling.py), ids -> bytes (text/tokenizer.py), the
log-probs' own shapes (logprobs.py).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

from .logprobs import TokenLogprob, chat_logprobs, completion_logprobs
from .reasoning import ReasoningSplitter
from .tool_reader import CallReader

# What Llama._stream yields: (text, None, logprobs) pieces, then (text, finish_reason, logprobs)
# once; logprobs: the tokens whose text starts in that piece (None when not asked for).
Pieces = Iterator[tuple[str, str | None, "list[TokenLogprob] | None"]]


@dataclass
class GenerationStats:
    """Timings of the latest completion (what `edgekv run` and `edgekv chat` print)."""

    prompt_tokens: int = 0  # tokens in the prompt
    prompt_eval_tokens: int = 0  # of those, evaluated now (the rest came from prefix reuse)
    prompt_eval_s: float = 0.0
    gen_tokens: int = 0
    gen_s: float = 0.0
    # speculative decoding (None without): tokens drafted, and of those the ones the model kept
    draft_n: int | None = None
    draft_n_accepted: int | None = None

    @property
    def prompt_cached(self) -> int:
        """Prompt tokens that came from the cache (prefix reuse), not evaluated."""
        return max(0, self.prompt_tokens - self.prompt_eval_tokens)

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.prompt_eval_tokens / self.prompt_eval_s if self.prompt_eval_s > 0 else 0.0

    @property
    def gen_tokens_per_s(self) -> float:
        return self.gen_tokens / self.gen_s if self.gen_s > 0 else 0.0

    def draft_summary(self, lead: str = "") -> str:
        """'drafted N, accepted M (x%)' after lead, or "" without speculative decoding."""
        if self.draft_n is None:
            return ""
        share = f" ({100 * self.draft_n_accepted / self.draft_n:.0f}%)" if self.draft_n else ""
        return f"{lead}drafted {self.draft_n}, accepted {self.draft_n_accepted}{share}"


class StopText:
    """Generated ids -> text that is safe to show: whole UTF-8 characters, cut before the
    first stop string, and holding back any tail that could be the start of one."""

    def __init__(self, detokenizer: Any, stops: list[str]):
        self.detokenizer = detokenizer
        self.stops = [s for s in stops if s]
        self.pending = ""

    def push(self, token: int) -> tuple[str, bool]:
        """(text to emit now, whether a stop string was found)."""
        self.pending += self.detokenizer.push(token)
        return self._scan(final=False)

    def finish(self) -> tuple[str, bool]:
        self.pending += self.detokenizer.flush()
        return self._scan(final=True)

    def _scan(self, final: bool) -> tuple[str, bool]:
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.pending = self.pending[: min(hits)], ""
            return out, True
        hold = 0 if final else max((_overlap(self.pending, s) for s in self.stops), default=0)
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False


def _overlap(text: str, stop: str) -> int:
    """Length of the longest end of `text` that is a proper start of `stop`."""
    for n in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0


def stop_list(stop: str | list[str] | None) -> list[str]:
    """The `stop` option (None, one string or several) as a list."""
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def collect(pieces: Pieces) -> tuple[str, str, list[TokenLogprob] | None]:
    """All of a completion's text, its finish reason and its tokens' log-probs (or None)."""
    parts, finish, records = [], "length", None
    for text, reason, logprobs in pieces:
        parts.append(text)
        finish = reason or finish
        if logprobs is not None:
            records = (records or []) + logprobs
    return "".join(parts), finish, records


def usage(stats: GenerationStats) -> dict[str, int]:
    return dict(prompt_tokens=stats.prompt_tokens, completion_tokens=stats.gen_tokens,
                total_tokens=stats.prompt_tokens + stats.gen_tokens)


# -- text completions ---------------------------------------------------------------------------

def completion_head(model: str) -> dict[str, Any]:
    """The fields every `text_completion` response and chunk shares."""
    return dict(id=f"cmpl-{uuid.uuid4()}", object="text_completion", created=int(time.time()), model=model)


def text_completion(head: dict, text: str, finish: str, stats: GenerationStats,
                    records: list[TokenLogprob] | None = None, text_offset: int = 0) -> dict:
    """A `text_completion` response; with records, logprobs whose text offsets start at text_offset."""
    logprobs = None if records is None else completion_logprobs(records, text_offset)
    choice = dict(text=text, index=0, logprobs=logprobs, finish_reason=finish)
    return dict(head, choices=[choice], usage=usage(stats))


def completion_chunks(head: dict, prefix: str, pieces: Pieces, text_offset: int = 0) -> Iterator[dict]:
    """Streamed `text_completion` chunks: the echoed prompt (if any), then the pieces."""
    if prefix:
        yield dict(head, choices=[dict(text=prefix, index=0, logprobs=None, finish_reason=None)])
    for text, finish, records in pieces:
        if text or finish or records:
            logprobs = None if records is None else completion_logprobs(records, text_offset)
            yield dict(head, choices=[dict(text=text, index=0, logprobs=logprobs, finish_reason=finish)])


# -- chat completions ---------------------------------------------------------------------------

def chat_head(model: str, kind: str) -> dict[str, Any]:
    """The fields a chat response (object "chat.completion") or its chunks ("chat.completion.chunk") share."""
    return dict(id=f"chatcmpl-{uuid.uuid4()}", created=int(time.time()), model=model, object=kind)


def chat_completion(head: dict, text: str, finish: str, stats: GenerationStats,
                    records: list[TokenLogprob] | None = None, splitter: ReasoningSplitter | None = None,
                    tool_calls: list[dict] | None = None, thought: str = "") -> dict:
    """A `chat.completion` response (logprobs from records when given); with a splitter, the
    reasoning goes to message["reasoning_content"] (when there is any) and the answer to content
    (thought: reasoning already split off); with tool_calls, content is the text around the
    calls or None (OpenAI's shape; the finish reason, "tool_calls" for a complete answer, is
    the caller's)."""
    logprobs = None if records is None else chat_logprobs(records)
    if splitter is not None:
        thought, text = splitter.whole(text)
    message = dict(role="assistant", content=text)
    if thought:
        message["reasoning_content"] = thought.rstrip()
    if tool_calls:
        message.update(content=text or None, tool_calls=tool_calls)
    choice = dict(index=0, message=message, logprobs=logprobs, finish_reason=finish)
    return dict(head, choices=[choice], usage=usage(stats))


def _deltas(text: str, splitter: ReasoningSplitter | None, last: bool) -> dict[str, str]:
    if splitter is None:
        return dict(content=text) if text else {}
    reasoning, content = splitter.whole(text) if last else splitter.push(text)
    return {k: v for k, v in (("reasoning_content", reasoning), ("content", content)) if v}


def tool_chat_chunks(head: dict, pieces: Pieces, reader: CallReader,
                     splitter: ReasoningSplitter | None = None) -> Iterator[dict]:
    """Streamed `chat.completion.chunk`s of an answer that may be a tool call: the role, then
    the content or the call as the reader hands it out (the call's id and name, then its
    arguments piece by piece, as OpenAI streams them), then the finish reason; with a
    splitter, a leading reasoning block first, as reasoning_content."""
    yield dict(head, choices=[dict(index=0, delta=dict(role="assistant"), logprobs=None, finish_reason=None)])
    for text, finish, _ in pieces:
        thought = ""
        if splitter is not None:
            thought, text = splitter.whole(text) if finish else splitter.push(text)
        deltas = ([dict(reasoning_content=thought)] if thought else []) + reader.push(text)
        if finish:
            last, finish = reader.finish(finish)
            deltas += last
        for delta in deltas:
            yield dict(head, choices=[dict(index=0, delta=delta, logprobs=None, finish_reason=None)])
        if finish:
            yield dict(head, choices=[dict(index=0, delta={}, logprobs=None, finish_reason=finish)])


def chat_chunks(head: dict, pieces: Pieces, splitter: ReasoningSplitter | None = None) -> Iterator[dict]:
    """Streamed `chat.completion.chunk`s: the role, the content pieces (with a splitter,
    `reasoning_content` pieces first), then the finish reason."""
    yield dict(head, choices=[dict(index=0, delta=dict(role="assistant"), logprobs=None, finish_reason=None)])
    for text, finish, records in pieces:
        delta = _deltas(text, splitter, last=bool(finish))
        if delta or records:
            logprobs = None if records is None else chat_logprobs(records)
            yield dict(head, choices=[dict(index=0, delta=delta or dict(content=""), logprobs=logprobs,
                                           finish_reason=None)])
        if finish:
            yield dict(head, choices=[dict(index=0, delta={}, logprobs=None, finish_reason=finish)])
