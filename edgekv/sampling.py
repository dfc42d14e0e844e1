"""Sampling: logits of one position -> the next token id, with an explicit seeded RNG.

What lives here: `SamplingParams` (the knobs, with llama.cpp's defaults), the logits
processors as small functions (logit bias, repetition penalties, top-k, top-p, min-p,
temperature), and `Sampler`, which chains them in llama.cpp's default order and draws
from a `np.random.Generator` it owns, so a run with the same seed repeats exactly.
What does not: evaluating the model (session.py), stop conditions and text (generate.py, api/facade.py).

The chain, as llama.cpp's common_sampler builds it (logit bias is added before the
sampler sequence there, so it comes first here too):

    logits_processor callables -> logit_bias -> penalties (repeat, frequency, presence over
    the last repeat_last_n tokens) -> grammar mask -> top_k -> top_p -> min_p -> temperature
    -> draw

The grammar mask (grammar.py's GrammarConstraint, when one is given) comes last before
the choice, so no bias can bring back a token the grammar forbids.

temperature <= 0 is greedy: the argmax after bias and penalties. Per token, the work on
the full vocabulary is one copy into a buffer the sampler keeps, a few scattered updates,
and one argpartition (O(n_vocab), no full sort unless top_k is disabled); everything after
top_k runs on the k survivors. Greedy with nothing but a logit bias (ignore_eos bans the end
ids that way) reads the logits once and copies nothing (`biased_argmax`): one pass instead of
three over 49k-262k logits, on caches the forward pass has just swept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

# llama-cpp-python's logits processor: (input_ids int[n], scores f32[n_vocab]) -> scores
LogitsProcessor = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class SamplingParams:
    """Sampler settings; the defaults are llama.cpp's."""

    temperature: float = 0.8
    top_k: int = 40  # <= 0: keep the whole vocabulary
    top_p: float = 0.95  # >= 1: off
    min_p: float = 0.05  # <= 0: off
    repeat_penalty: float = 1.0  # 1: off
    repeat_last_n: int = 64  # tokens the penalties look back over; 0: none, -1: all
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: Mapping[int, float] | None = None
    min_keep: int = 1  # top_p and min_p never keep fewer candidates than this

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


# --- processors: each works on logits in place or returns candidate counts ---------------


def apply_logit_bias(logits: np.ndarray, bias: Mapping[int, float]) -> None:
    """logits[id] += bias[id], in place (keys may be str, as OpenAI clients send them)."""
    for token, value in bias.items():
        logits[int(token)] += value


def biased_argmax(logits: np.ndarray, bias: Mapping[int, float] | None) -> int | None:
    """np.argmax of logits after apply_logit_bias, without the copy: the argmax of the logits
    and the biased ids' own sums, the first index winning a tie as np.argmax's does. None when
    the argmax of the logits is itself biased (the best unbiased logit is then unknown) or an id
    is biased twice (as "5" and 5): the caller takes the general path."""
    best = int(np.argmax(logits))
    if not bias:
        return best
    ids = [int(token) for token in bias]
    if best in ids or len(set(ids)) != len(ids):
        return None
    sums = logits[ids]  # a copy: the additions below are apply_logit_bias's, element by element
    for k, value in enumerate(bias.values()):
        sums[k] += value
    top, at = logits[best], best
    for k, token in enumerate(ids):
        if sums[k] > top or (sums[k] == top and token < at):
            top, at = sums[k], token
    return at


def recent_tokens(history: Sequence[int], last_n: int) -> Sequence[int]:
    """The tokens the penalties look at: the last `last_n` (all when -1, none when 0)."""
    if last_n == 0:
        return ()
    return history if last_n < 0 else history[-last_n:]


def penalizes(recent: Sequence[int], repeat_penalty: float = 1.0, frequency_penalty: float = 0.0,
              presence_penalty: float = 0.0) -> bool:
    """Whether apply_penalties would change any logit."""
    return len(recent) > 0 and not (repeat_penalty == 1.0 and frequency_penalty == 0.0 and presence_penalty == 0.0)


def apply_penalties(logits: np.ndarray, recent: Sequence[int], repeat_penalty: float = 1.0,
                    frequency_penalty: float = 0.0, presence_penalty: float = 0.0) -> None:
    """llama.cpp's penalties sampler, in place, for every token that occurs in `recent`:
    a logit <= 0 is multiplied by repeat_penalty, a positive one divided by it; then
    count * frequency_penalty + presence_penalty is subtracted."""
    if not penalizes(recent, repeat_penalty, frequency_penalty, presence_penalty):
        return
    ids, counts = np.unique(np.asarray(recent, dtype=np.int64), return_counts=True)
    values = logits[ids]
    values = np.where(values <= 0, values * repeat_penalty, values / repeat_penalty)
    values -= counts * frequency_penalty + presence_penalty
    logits[ids] = values


def top_k_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits, largest first (k <= 0 or >= n_vocab: all ids)."""
    n = logits.shape[0]
    if k <= 0 or k >= n:
        return np.argsort(-logits, kind="stable")
    ids = np.argpartition(logits, n - k)[n - k:]
    return ids[np.argsort(-logits[ids], kind="stable")]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities in float64 (the sums run over up to the whole vocabulary)."""
    z = logits.astype(np.float64) - np.max(logits)
    np.exp(z, out=z)
    return z / z.sum()


def top_p_count(sorted_logits: np.ndarray, p: float, min_keep: int = 1) -> int:
    """How many of the descending `sorted_logits` nucleus sampling keeps: the smallest
    prefix whose probability mass reaches p (llama.cpp: at least min_keep; p >= 1 keeps all)."""
    n = sorted_logits.shape[0]
    if p >= 1.0:
        return n
    cumulative = np.cumsum(softmax(sorted_logits))
    first_reaching = int(np.searchsorted(cumulative, p, side="left"))
    return min(n, max(first_reaching + 1, min_keep))


def min_p_count(sorted_logits: np.ndarray, p: float, min_keep: int = 1) -> int:
    """How many of the descending `sorted_logits` min-p keeps: those whose probability is
    at least p times the largest one, i.e. logit >= max + log(p) (p <= 0 keeps all)."""
    n = sorted_logits.shape[0]
    if p <= 0.0 or n == 0:
        return n
    threshold = sorted_logits[0] + np.log(p)
    # sorted descending, so the survivors are a prefix: count them from the ascending view
    kept = n - int(np.searchsorted(sorted_logits[::-1], threshold, side="left"))
    return min(n, max(kept, min_keep))


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Index drawn from the distribution `probs` with one uniform number from rng."""
    cumulative = np.cumsum(probs)
    u = rng.random() * cumulative[-1]
    return min(int(np.searchsorted(cumulative, u, side="right")), probs.shape[0] - 1)


# --- the chain ------------------------------------------------------------------------------


def make_rng(seed: int | None) -> np.random.Generator:
    """A generator for `seed`; None, -1 or llama.cpp's 0xFFFFFFFF ("default seed") mean
    a fresh random seed."""
    if seed is None or seed < 0 or seed == 0xFFFFFFFF:
        return np.random.default_rng()
    return np.random.default_rng(seed)


class Sampler:
    """Applies the llama.cpp chain to logits and draws the next token.

    `sample(logits, history)` leaves `logits` untouched: the work happens in a buffer the
    sampler keeps between calls. `history` is the sequence evaluated so far (prompt +
    generated), of which the penalties use the last `repeat_last_n` tokens.
    """

    def __init__(self, params: SamplingParams | None = None, seed: int | None = 0,
                 rng: np.random.Generator | None = None,
                 processors: Sequence[LogitsProcessor] | None = None, constraint: Any = None):
        self.params = params or SamplingParams()
        self.constraint = constraint  # .apply(logits, history) masks in place (grammar.GrammarConstraint)
        self.rng = rng if rng is not None else make_rng(seed)
        self.processors = list(processors or ())
        self._buf: np.ndarray | None = None  # f32[n_vocab], reused every call
        self._unprocessed: tuple | None = None  # (logits, history) of a greedy pick made without _buf

    def processed_logits(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """The logits after processors, logit bias and penalties (the sampler's buffer)."""
        self._unprocessed = None
        if self._buf is None or self._buf.shape != logits.shape:
            self._buf = np.empty(logits.shape, np.float32)
        buf = self._buf
        np.copyto(buf, logits)
        for processor in self.processors:
            history_ids = np.asarray(history, dtype=np.intc)
            np.copyto(buf, processor(history_ids, buf))
        p = self.params
        if p.logit_bias:
            apply_logit_bias(buf, p.logit_bias)
        apply_penalties(buf, recent_tokens(history, p.repeat_last_n), p.repeat_penalty,
                        p.frequency_penalty, p.presence_penalty)
        if self.constraint is not None:
            self.constraint.apply(buf, history)
        return buf

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """The next token id for logits f32[n_vocab]."""
        p = self.params
        if p.greedy and self._bias_only(history):
            token = biased_argmax(logits, p.logit_bias)
            if token is not None:
                self._unprocessed = (logits, history)
                return token
        buf = self.processed_logits(logits, history)
        if p.greedy:
            return int(np.argmax(buf))
        ids = top_k_ids(buf, p.top_k)
        candidates = buf[ids]  # descending
        candidates = candidates[: top_p_count(candidates, p.top_p, p.min_keep)]
        candidates = candidates[: min_p_count(candidates, p.min_p, p.min_keep)]
        probs = softmax(candidates / np.float32(p.temperature))
        return int(ids[draw(probs, self.rng)])

    def _bias_only(self, history: Sequence[int]) -> bool:
        # whether processed_logits would do nothing but add the logit bias
        p = self.params
        return (not self.processors and self.constraint is None
                and not penalizes(recent_tokens(history, p.repeat_last_n), p.repeat_penalty, p.frequency_penalty,
                                  p.presence_penalty))

    @property
    def last_logits(self) -> np.ndarray | None:
        """The logits the latest `sample` worked from (after processors, bias and penalties;
        before top-k/top-p/min-p and temperature); overwritten by the next call. After a
        greedy pick that needed no buffer it is made here, from the logits that call was
        given: read it before they change (the next evaluation)."""
        if self._unprocessed is not None:
            self.processed_logits(*self._unprocessed)
        return self._buf


def with_banned(logit_bias: Mapping[int, float] | None, ids) -> dict[int, float]:
    """logit_bias plus -inf for every id in ids: they can never be sampled (llama.cpp's
    --ignore-eos bans the end-of-generation tokens this way)."""
    return {**(logit_bias or {}), **{int(t): -np.inf for t in ids}}


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """f32[n_vocab] -> f64[n_vocab] log-probabilities."""
    z = logits.astype(np.float64)
    z -= np.max(z)
    z -= np.log(np.sum(np.exp(z)))
    return z


def sampler_for(*, temp: float = 0.8, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                repeat_penalty: float = 1.0, repeat_last_n: int = 64, frequency_penalty: float = 0.0,
                presence_penalty: float = 0.0, logit_bias: Mapping[int, float] | None = None,
                seed: int | None = 0, logits_processor: Sequence[LogitsProcessor] | None = None,
                constraint: Any = None) -> Sampler:
    """A Sampler from llama-cpp-python's keyword names (`temp`, `logits_processor`)."""
    params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty,
                            repeat_last_n=repeat_last_n, frequency_penalty=frequency_penalty,
                            presence_penalty=presence_penalty, logit_bias=logit_bias)
    return Sampler(params, seed=seed, processors=logits_processor, constraint=constraint)
