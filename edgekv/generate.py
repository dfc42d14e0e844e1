"""Generation as a stack of generators (mlx-lm's shape): `generate_step` -> `stream_generate`.

What lives here: `generate_step` (the loop every generation runs: sample the next token,
yield it, evaluate it), `GenerationStep` (what `stream_generate` yields per token: its
text, id, log-prob on request, finish reason and live statistics) and `stream_generate` (a session
and a prompt -> steps). The `Llama` facade generates through `generate_step` too.
What does not: OpenAI-shaped responses, stop strings and log-prob records (api/facade.py,
api/responses.py, api/logprobs.py), context planning (api/context_growth.py).

    for step in stream_generate(model, session, prompt_ids, max_tokens=64, temperature=0):
        print(step.text, end="", flush=True)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .sampling import Sampler, log_softmax, sampler_for, with_banned
from .session import Session
from .speculative import Speculation, as_speculation, speculative_step


def generate_step(session: Session | Callable[[], Session], sampler: Sampler, prompt: Sequence[int] = (), *,
                  evaluate: Callable[[list[int]], Any] | None = None,
                  stopping_criteria: Callable[[np.ndarray, np.ndarray], bool] | None = None,
                  draft: Speculation | None = None,
                  record: Callable[[int, np.ndarray], None] | None = None) -> Iterator[int]:
    """Evaluate prompt (reusing what the session already holds of it; empty: continue from
    the session's last token), then yield sampled ids without end: the caller stops.

    Each yielded id is evaluated when the generator resumes, so the session always ends
    with every id the caller consumed but the last. A list sent into the generator is
    evaluated after the yielded id (llama-cpp-python's generate). session: a Session, or a
    function returning the current one (the facade's is replaced when its context grows);
    evaluate(ids) replaces session.eval (the facade records scores there);
    stopping_criteria(ids, logits) ends the generation before a token is yielded.
    draft: speculative decoding (speculative/): the same ids, drafted and verified several
    at a time; record(at, rows) then receives the logits of the verified tokens it keeps."""
    current = session if callable(session) and not isinstance(session, Session) else (lambda: session)
    evaluate = evaluate or (lambda ids: current().eval(ids))
    if prompt:
        current().prefill(list(prompt))
    if draft is not None:
        yield from speculative_step(current, sampler, draft.drafter, evaluate=evaluate, length=draft.length,
                                    stopping_criteria=stopping_criteria, record=record, counts=draft.counts)
        return
    while True:
        s = current()
        logits = s.logits
        token = sampler.sample(logits, s.tokens)
        if stopping_criteria is not None and stopping_criteria(np.asarray(s.tokens, np.intc), logits):
            return
        extra = yield token
        evaluate([token] + list(extra or ()))


@dataclass(frozen=True)
class GenerationStep:
    """One generated token and where the generation stands."""

    text: str  # the text this token completes ("" while a character is still incomplete)
    token: int
    logprob: float | None  # with logprobs=True: log-probability of `token` under the logits the sampler started from
    finish_reason: str | None  # None while going on; "stop" (an end token) or "length" on the last step
    prompt_tokens: int  # prompt tokens evaluated (those reused from the cache not counted)
    prompt_tps: float
    generation_tokens: int  # tokens generated so far, this one included
    generation_tps: float


def stream_generate(model, session: Session, prompt: Sequence[int], *, max_tokens: int | None = 256,
                    sampler: Sampler | None = None, stop_ids: Sequence[int] = (), ignore_eos: bool = False,
                    logprobs: bool = False, draft: Speculation | None = None,
                    **sampling: Any) -> Iterator[GenerationStep]:
    """Generate after prompt (token ids; reusing what the session holds of them) in session,
    a GenerationStep per token.

    model: an edgekv.loader.Model; its end-of-generation ids end the text, and so do stop_ids
    (e.g. model.chat_formatter.stop_token_ids for a chat turn); ignore_eos: never sample them.
    sampler: a Sampler, or sampling_for's keywords (temperature=..., top_k, seed, ...).
    The last step has a finish_reason: "stop" when an end token came (it is not yielded as
    text and not evaluated), "length" after max_tokens (None: no limit). logprobs: fill
    each step's logprob (a softmax over the vocabulary: 3.5 ms a token for gemma3's 262k
    ids on this project's CPUs, so only on request; None otherwise). draft: speculative
    decoding (a speculative.Speculation; default the model's own, `load(..., draft=...)`):
    the same tokens, several verified per pass."""
    end = set(stop_ids) | set(model.tokenizer.eog_ids)
    if sampler is None:
        sampling.setdefault("temp", sampling.pop("temperature", 0.8))
        sampler = sampler_for(**sampling)
    if ignore_eos:  # llama.cpp's --ignore-eos: the end ids can never be sampled
        params = replace(sampler.params, logit_bias=with_banned(sampler.params.logit_bias, end))
        sampler = Sampler(params, rng=sampler.rng, processors=sampler.processors)
        end = set()
    detokenizer = model.tokenizer.detokenizer(skip_special=True)
    t0, n_before = time.perf_counter(), session.n_evaluated
    steps = generate_step(session, sampler, prompt, draft=as_speculation(draft or getattr(model, "draft", None), model))
    prompt_tokens, prompt_s, n = 0, 0.0, 0
    try:
        for token in steps:
            if n == 0:
                prompt_s = time.perf_counter() - t0
                prompt_tokens = session.n_evaluated - n_before
            n += 1
            gen_s = max(time.perf_counter() - t0 - prompt_s, 1e-9)
            finish = "stop" if token in end else "length" if max_tokens is not None and n >= max_tokens else None
            text = "" if finish == "stop" else detokenizer.push(token)
            if finish is not None:
                text += detokenizer.flush()
            logprob = float(log_softmax(sampler.last_logits)[token]) if logprobs else None
            yield GenerationStep(text, token, logprob, finish, prompt_tokens,
                                 prompt_tokens / max(prompt_s, 1e-9), n, n / gen_s)
            if finish is not None:
                return
    finally:
        steps.close()
