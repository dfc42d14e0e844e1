"""Log-probabilities of generated tokens, in the two shapes llama-cpp-python (and OpenAI) return.

What lives here: `TokenLogprob` (one generated token: its text, log-prob and the most likely
alternatives), `LogprobRecorder`, which makes one per step from the logits the sampler saw and
hands them out as the text they belong to is emitted (so a streamed chunk carries the
log-probs of its own tokens, and tokens cut off by a stop string carry none), and the two
response shapes: the completions API's {"tokens", "text_offset", "token_logprobs",
"top_logprobs"} and the chat API's {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}.
What does not: sampling (sampling.py), the generation loop (facade.py), the rest of the
response dicts (responses.py).

The log-probs are the log-softmax of the logits after logits processors, logit bias and
penalties, before top-k/top-p/min-p and temperature: the distribution the sampler starts
from, as llama-cpp-python reports it (it too ignores temperature).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import EdgeKVError
from ..sampling import log_softmax, top_k_ids

# Llama.detokenize: (tokens, prev_tokens) -> bytes
Detokenize = Callable[[Sequence[int], Sequence[int]], bytes]
# StreamingDetokenizer.push: token -> the characters it completes
PushText = Callable[[int], str]


@dataclass
class TokenLogprob:
    """One generated token and its alternatives."""

    token: int
    text: str  # the characters this token completes in the generated text ("" inside a UTF-8 character)
    raw: bytes  # the token's own bytes
    logprob: float
    top: list[tuple[str, bytes, float]]  # the n most likely (text, bytes, logprob), most likely first;
    # their text is their bytes decoded on their own (a partial UTF-8 character as U+FFFD)
    start: int  # offset of `text` in the generated text


class LogprobRecorder:
    """TokenLogprobs of a completion, recorded per step and released as text is emitted.

    A token's text comes from `push` (a streaming detokenizer like the one that makes the
    completion's text), so the tokens' texts add up to the text and the offsets agree."""

    def __init__(self, detokenize: Detokenize, n_top: int, prev_token: int | None, push: PushText | None = None):
        self.detokenize = detokenize
        self.push = push or (lambda token: self._piece(token)[0])
        self.n_top = n_top
        self.prev = [] if prev_token is None else [prev_token]  # gives SPM pieces their leading space
        self.records: list[TokenLogprob] = []
        self.n_released = 0
        self.n_chars = 0  # length of the recorded tokens' text

    def _piece(self, token: int) -> tuple[str, bytes]:
        raw = self.detokenize([token], self.prev)
        return raw.decode("utf-8", errors="replace"), raw

    def add(self, token: int, logits: np.ndarray) -> None:
        """Record `token`, sampled from `logits` (f32[n_vocab], the sampler's view)."""
        logprobs = log_softmax(logits)
        top = [(*self._piece(int(i)), float(logprobs[i])) for i in top_k_ids(logprobs, self.n_top)[: self.n_top]]
        text, raw = self.push(token), self.detokenize([token], self.prev)
        self.records.append(TokenLogprob(token, text, raw, float(logprobs[token]), top, self.n_chars))
        self.n_chars += len(text)
        self.prev = [token]

    def release(self, n_emitted: int | None) -> list[TokenLogprob]:
        """The records not yet released whose text starts before `n_emitted` characters of
        generated text were emitted (None: all of them)."""
        end = self.n_released
        while end < len(self.records) and (n_emitted is None or self.records[end].start < n_emitted):
            end += 1
        out, self.n_released = self.records[self.n_released : end], end
        return out


def make_recorder(n_top: int | bool | None, detokenize: Detokenize, prompt: Sequence[int],
                  push: PushText | None = None) -> LogprobRecorder | None:
    """A recorder for `logprobs=n_top` (None or False: no log-probs; True means 1)."""
    if n_top is None or n_top is False:
        return None
    if not isinstance(n_top, (int, np.integer)) or n_top < 0:
        raise EdgeKVError(f"logprobs={n_top!r}: expected None or a number of alternatives >= 0")
    return LogprobRecorder(detokenize, int(n_top), prompt[-1] if prompt else None, push)


def chat_recorder(logprobs: bool | None, top_logprobs: int | None, detokenize: Detokenize,
                  prompt: Sequence[int], push: PushText | None = None) -> LogprobRecorder | None:
    """A recorder for the chat API's `logprobs=True, top_logprobs=n`."""
    if not logprobs:
        if top_logprobs:
            raise EdgeKVError(f"top_logprobs={top_logprobs!r} needs logprobs=True")
        return None
    return make_recorder(top_logprobs or 0, detokenize, prompt, push)


def completion_logprobs(records: list[TokenLogprob], text_offset: int) -> dict[str, list]:
    """The completions API's logprobs (text offsets count from the start of the prompt's text;
    each top_logprobs dict holds the n most likely tokens and the chosen one)."""
    return dict(
        tokens=[r.text for r in records],
        text_offset=[text_offset + r.start for r in records],
        token_logprobs=[r.logprob for r in records],
        top_logprobs=[{**{text: lp for text, _, lp in r.top}, r.text: r.logprob} for r in records],
    )


def chat_logprobs(records: list[TokenLogprob]) -> dict[str, Any]:
    """The chat API's logprobs: one entry per token, bytes as lists of ints."""
    content = [dict(token=r.text, logprob=r.logprob, bytes=list(r.raw),
                    top_logprobs=[dict(token=text, logprob=lp, bytes=list(raw)) for text, raw, lp in r.top])
               for r in records]
    return dict(content=content, refusal=None)
