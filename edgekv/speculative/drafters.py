"""Who proposes the tokens a verify pass checks: the context itself, or a smaller model.

A drafter is llama-cpp-python's `LlamaDraftModel`: called with the sequence so far
(np.intc[n]: prompt, generated text and the token just sampled) it returns the ids it
guesses come next (np.intc[k], possibly none). `PromptLookup` finds the last n tokens
earlier in the sequence and proposes what followed them (llama.cpp's ngram-simple, llama-cpp-python's
`LlamaPromptLookupDecoding`, which is accepted as it is); `DraftModel` runs a second GGUF of the
same vocabulary greedily in a session of its own, which follows the target's tokens by prefix
reuse (a rejected draft is cut off the draft's session at the next call). Drafters take a
keyword `max_tokens`, the most the loop will verify now (speculative/draft_length.py); a
drafter without it (a user's own) is cut to length.
What does not live here: verification and the sampling rule (speculative/verify.py).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from ..errors import EdgeKVError
from ..loader import check_same_vocabulary, load

class PromptLookup:
    """Drafts copied from the context: the tokens that followed the latest earlier
    occurrence of the sequence's last `max_ngram_size` tokens (then shorter n-grams, down to
    `min_ngram_size`), at most `num_pred_tokens` of them. Code edits, quoting summaries and
    JSON that repeats keys copy long runs of the prompt; elsewhere it finds nothing and costs a
    search (np.intc compares over the sequence, ~20 us per 1000 tokens)."""

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10, min_ngram_size: int = 1):
        if not 1 <= min_ngram_size <= max_ngram_size or num_pred_tokens < 1:
            raise EdgeKVError(f"prompt lookup needs 1 <= min_ngram_size ({min_ngram_size}) <= max_ngram_size "
                              f"({max_ngram_size}) and num_pred_tokens >= 1 ({num_pred_tokens})")
        self.max_ngram_size, self.min_ngram_size, self.num_pred_tokens = max_ngram_size, min_ngram_size, num_pred_tokens

    def __call__(self, input_ids: np.ndarray, /, max_tokens: int | None = None, **_: Any) -> np.ndarray:
        ids = np.asarray(input_ids, np.intc)
        n = min(self.num_pred_tokens, max_tokens if max_tokens is not None else self.num_pred_tokens)
        if n < 1:
            return ids[:0]
        for size in range(min(self.max_ngram_size, ids.size - 1), self.min_ngram_size - 1, -1):
            starts = _occurrences(ids, size)
            if starts.size:
                start = int(starts[-1]) + size  # what followed the latest occurrence
                return ids[start : start + n].copy()
        return ids[:0]

    def describe(self) -> str:
        return f"prompt lookup (n-gram {self.min_ngram_size}..{self.max_ngram_size}, up to {self.num_pred_tokens})"


def _occurrences(ids: np.ndarray, size: int) -> np.ndarray:
    """Starts of the earlier occurrences of ids' last `size` tokens (the last itself excluded)."""
    tail = ids[-size:]
    body = ids[:-1]  # an occurrence must be followed by at least one token
    if body.size < size:
        return np.zeros(0, np.int64)
    hits = body[: body.size - size + 1] == tail[0]
    for j in range(1, size):
        hits &= body[j : body.size - size + 1 + j] == tail[j]
    return np.flatnonzero(hits)


class DraftModel:
    """A smaller GGUF of the same vocabulary drafting greedily: each call brings its own session
    up to the target's sequence (reusing the common prefix), then drafts up to n_draft tokens,
    stopping early where its most likely token's probability falls below p_min (llama.cpp's
    --spec-draft-p-min; default 0, never, as in the llama.cpp our references come from: a cut
    at 0.75 left gemma3's draft declining every ask on a quote, 0.91x of plain decoding against
    1.40-1.58x without it) or the context ends.

    model: a path, a catalog name or a loaded edgekv Model; cache_type_k / cache_type_v: the
    draft's own KV cache (llama.cpp's -ctkd / -ctvd)."""

    def __init__(self, model: Any, n_draft: int = 16, p_min: float = 0.0, cache_type_k: str = "f16",
                 cache_type_v: str = "f16", backend: str | None = None):
        if n_draft < 1 or not 0.0 <= p_min < 1.0:
            raise EdgeKVError(f"a draft model needs n_draft >= 1 ({n_draft}) and 0 <= p_min < 1 ({p_min})")
        if isinstance(model, (str, os.PathLike)):
            model = load(model, backend)
        self.model = model
        self.n_draft, self.p_min = n_draft, p_min
        self.cache_type_k, self.cache_type_v = cache_type_k, cache_type_v
        self.session = None
        # the last call's drafting steps alone, without its catch-up: after plain steps the
        # catch-up is a chunk of many tokens, which would make drafting look dear (draft_length.py)
        self.draft_seconds: float | None = None

    def fork(self) -> "DraftModel":
        """The same draft model (weights shared) with a session of its own, for another conversation."""
        return DraftModel(self.model, self.n_draft, self.p_min, self.cache_type_k, self.cache_type_v)

    def check_vocabulary(self, target) -> None:
        """Refuse a draft whose tokens differ from the target's (target: an edgekv Model)."""
        check_same_vocabulary(target, self.model)

    def __call__(self, input_ids: np.ndarray, /, max_tokens: int | None = None, **_: Any) -> np.ndarray:
        ids = [int(t) for t in input_ids]
        n = min(self.n_draft, self.n_draft if max_tokens is None else max_tokens)
        if n < 1 or not ids:
            return np.zeros(0, np.intc)
        s = self._session_for(len(ids) + n)
        s.prefill(ids)  # catching up with the target: the tokens it kept since the last call
        start = time.perf_counter()
        out: list[int] = []
        while True:
            logits = s.logits
            token = int(np.argmax(logits))
            if self.p_min > 0.0 and _top_probability(logits, token) < self.p_min:
                break
            out.append(token)
            if len(out) == n:
                break
            s.eval([token])
        self.draft_seconds = time.perf_counter() - start
        return np.asarray(out, np.intc)

    def _session_for(self, n_tokens: int):
        """The draft's session, large enough for n_tokens (grown by doubling, its tokens kept)."""
        s = self.session
        if s is None:
            n_ctx = min(max(256, 1 << (n_tokens - 1).bit_length()), max(self.model.n_ctx_train, n_tokens))
            self.session = self.model.session(n_ctx, cache_type_k=self.cache_type_k, cache_type_v=self.cache_type_v)
        elif n_tokens > s.n_ctx:
            self.session = s.grown(max(2 * s.n_ctx, n_tokens))
        return self.session

    def describe(self) -> str:
        return f"draft model {self.model.name} (up to {self.n_draft}, p_min {self.p_min})"


def _top_probability(logits: np.ndarray, token: int) -> float:
    """softmax(logits)[token] where token is the argmax: 1 / sum(exp(l - max))."""
    return float(1.0 / np.exp(logits - logits[token], dtype=np.float32).sum(dtype=np.float64))


def draft_tokens(drafter, sequence: list[int], max_tokens: int) -> list[int]:
    """Ask a drafter (ours or a llama-cpp-python LlamaDraftModel) for at most max_tokens ids."""
    ids = np.asarray(sequence, np.intc)
    # a LlamaDraftModel of llama-cpp-python's takes only the ids
    out = drafter(ids, max_tokens=max_tokens) if isinstance(drafter, (PromptLookup, DraftModel)) else drafter(ids)
    return [int(t) for t in np.asarray(out).reshape(-1)[:max_tokens]]
