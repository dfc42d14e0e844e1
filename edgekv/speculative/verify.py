"""The speculative generation loop: draft, verify in one pass, keep what the model would have said.

After a token t is sampled, a drafter guesses d1..dk; the session evaluates [t, d1..dk] in one
pass (Session.verify), every row as a decode step computes it, bit for bit. Then, row by row,
the sampler picks the token that follows exactly as plain decoding would (same logits, same
history, same random draw) and the draft is accepted while they agree; the first
disagreement's token is the next one anyway, and the rows after it are forgotten exactly
(Session.settle, kv/drafts.py).

This is the speculative sampling rule (accept a drafted token with probability
min(1, p/q), else draw from the residual) for a drafter that proposes one token for certain
(q a point mass: prompt lookup, a greedy draft model): accepting iff a draw from p equals the
draft has probability p(d), and a rejected draw is a draw from p without d, the residual. So
the output keeps the model's distribution at any temperature, and more: with the same seed
it is token for token the output of plain decoding, since each emitted token consumes the
same draw from the same sampler (tests/test_speculative.py checks both). Grammars, logit bias,
penalties and stop strings therefore behave as without speculation: the sampler sees the
same history, and a rejected draft was never shown to it.

What does not live here: drafters (drafters.py), the draft length (draft_length.py), the
arithmetic of a verify pass (the backend's independent rows).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from ..sampling import Sampler
from ..session import Session
from .draft_length import DraftLength
from .drafters import PromptLookup, draft_tokens

_STOP = object()


@dataclass
class DraftCounts:
    """Drafted and accepted tokens (llama-server's draft_n / draft_n_accepted)."""

    drafted: int = 0
    accepted: int = 0

    def snapshot(self) -> tuple[int, int]:
        return self.drafted, self.accepted

    def since(self, before: tuple[int, int]) -> tuple[int, int]:
        """(drafted, accepted) since a `snapshot`."""
        return self.drafted - before[0], self.accepted - before[1]


def speculative_step(current: Callable[[], Session], sampler: Sampler, drafter: Any, *,
                     evaluate: Callable[[list[int]], Any], length: DraftLength,
                     stopping_criteria: Callable[[np.ndarray, np.ndarray], bool] | None = None,
                     record: Callable[[int, np.ndarray], None] | None = None,
                     counts: DraftCounts | None = None) -> Iterator[int]:
    """generate_step's loop with drafts (generate.py): the session holds its prompt and logits;
    yields sampled ids without end, with the same contract (each id is evaluated when the
    generator resumes; a list sent in is evaluated after it). record(at, rows): the kept
    rows' logits of a verify pass, whose first token is the session's token `at`."""
    counts = counts if counts is not None else DraftCounts()
    length.restart()
    token = guess = None
    while True:
        s = current()
        if token is None:
            logits = s.logits
            token = sampler.sample(logits, s.tokens)
            if guess is not None:  # what a draft would have said, against what came
                length.observed(token == guess)
                guess = None
            if stopping_criteria is not None and stopping_criteria(np.asarray(s.tokens, np.intc), logits):
                return
        extra = yield token
        if extra:
            evaluate([token] + list(extra))
            token = None
            continue
        k = length.next(s.max_verify())
        drafts: list[int] = []
        if k or isinstance(drafter, PromptLookup):  # a lookup costs nothing: ask it even when not verifying
            t0 = time.perf_counter()
            drafts = draft_tokens(drafter, s.tokens + [token], max(k, 1))
            own = getattr(drafter, "draft_seconds", None)  # a DraftModel's steps, without its catch-up
            length.drafted(len(drafts), own if own is not None else time.perf_counter() - t0)
        if k and not drafts and not isinstance(drafter, PromptLookup):
            length.declined()  # a draft model unsure of its first token (p_min) cost a step of its own for nothing
        if not k or not drafts:
            guess = drafts[0] if drafts else None
            t0 = time.perf_counter()
            evaluate([token])
            length.stepped(time.perf_counter() - t0)
            token = None
            continue
        outcome = yield from _verified(s, sampler, [token] + drafts, stopping_criteria, length, record, counts)
        if outcome is _STOP:
            return
        token, extra = outcome
        if extra:
            evaluate(list(extra))


def _verified(s: Session, sampler: Sampler, ids: list[int], stopping_criteria, length: DraftLength,
              record, counts: DraftCounts):
    """Verify ids = [token, drafts...], yield the accepted drafts; returns (the next token or
    None, ids sent in to evaluate or None), or _STOP."""
    at = s.n_tokens
    t0 = time.perf_counter()
    logits = s.verify(ids)
    length_seconds = time.perf_counter() - t0
    history = s.tokens + [ids[0]]
    k, kept = len(ids) - 1, 1
    try:
        for i in range(k + 1):
            row = logits[i]
            if not np.isfinite(row).all():
                return None, None  # settle raises, as the plain step evaluating ids[i] would
            t = sampler.sample(row, history)
            if stopping_criteria is not None and stopping_criteria(np.asarray(history, np.intc), row):
                return _STOP
            if i == k or t != ids[i + 1]:
                return t, None  # sampled from row i: the next token either way
            extra = yield t  # the draft was right: already evaluated
            kept += 1
            history.append(t)
            if extra:
                return None, extra
        raise AssertionError("unreachable")
    finally:
        s.settle(kept)
        counts.drafted += k
        counts.accepted += kept - 1
        length.verified(k, kept - 1, length_seconds)
        if record is not None:
            record(at, logits[:kept])
