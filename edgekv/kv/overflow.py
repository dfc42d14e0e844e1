"""What a full context does: the overflow policies, one small object each.

A session asks its policy two things: how many tokens at the front every overflow keeps
(`kept`: llama.cpp's n_keep, or StreamingLLM's attention sinks), and, when n more tokens do
not fit, which positions to drop (`to_evict`); the cache then drops them from every layer and
renumbers the rest, their K re-rotated by RoPE (KVCache.evict). The policies:

- `none`: nothing is dropped; a full context is a ContextFullError (a hard cut-off).
- `shift`: llama.cpp's context shift: keep n_keep, drop n_discard of the oldest others
  (default: half of them).
- `stream`: StreamingLLM: n_keep sinks (default 4) and a sliding window, dropping the oldest
  in blocks of STREAM_BLOCK.
- `keep`: H2O-style: the sinks, a recent window, and of the others the least attended go
  (kv/heavy_hitters.py; the cache tallies attention for it: `tracks_attention`).

A new policy is a class here and its name in POLICIES. What does not live here: when a
chunk overflows (session.py), the eviction itself (kv/cache.py), the tallies (kv/heavy_hitters.py).
"""

from __future__ import annotations

import numpy as np

from ..errors import EdgeKVError
from . import heavy_hitters

STREAM_SINKS = 4  # StreamingLLM's attention sinks when n_keep is not given (`stream`, `keep`)
STREAM_BLOCK = 16  # tokens a `stream` overflow evicts at a time (`keep`: up to as many)


class OverflowPolicy:
    """The `none` policy, and what every policy shares: n_keep tokens at the front are kept."""

    name = "none"
    tracks_attention = False  # whether the cache must tally the attention each slot receives

    def __init__(self, n_keep: int = 0, n_discard: int = 0):
        self.n_keep, self.n_discard = n_keep, n_discard

    def kept(self) -> int:
        """Tokens at the front that an overflow never drops (and a windowed ring never overwrites)."""
        return 0

    def to_evict(self, cache, need: int, n_tokens: int, n_ctx: int) -> np.ndarray:
        """The positions (sorted) to drop so that at least `need` slots free up, of the n_tokens
        in a context of n_ctx; called only when n_tokens - kept() >= need."""
        raise AssertionError("the `none` policy evicts nothing: the session raises ContextFullError first")


class Shift(OverflowPolicy):
    name = "shift"

    def kept(self) -> int:
        return self.n_keep

    def to_evict(self, cache, need: int, n_tokens: int, n_ctx: int) -> np.ndarray:
        keep = self.kept()
        movable = n_tokens - keep
        n = min(max(need, self.n_discard or movable // 2), movable)
        return np.arange(keep, keep + n)


class Stream(OverflowPolicy):
    name = "stream"

    def kept(self) -> int:
        return self.n_keep or STREAM_SINKS

    def to_evict(self, cache, need: int, n_tokens: int, n_ctx: int) -> np.ndarray:
        keep = self.kept()
        n = min(max(need, STREAM_BLOCK), n_tokens - keep)
        return np.arange(keep, keep + n)


class Keep(Stream):
    name = "keep"
    tracks_attention = True

    def to_evict(self, cache, need: int, n_tokens: int, n_ctx: int) -> np.ndarray:
        keep = self.kept()
        # a block small beside the heavy hitters it chooses from
        n = min(max(need, min(STREAM_BLOCK, n_ctx // 16)), n_tokens - keep)
        scores = heavy_hitters.score(*cache.attention_by_position())
        return heavy_hitters.choose(scores, keep, heavy_hitters.recent_window(n_ctx), n)


POLICIES = {cls.name: cls for cls in (OverflowPolicy, Shift, Stream, Keep)}


def overflow_policy(name: str, n_keep: int = 0, n_discard: int = 0) -> OverflowPolicy:
    """The policy called `name` (--context-shift), or EdgeKVError listing those there are."""
    if name not in POLICIES:
        raise EdgeKVError(f"context_shift={name!r} is not a policy (choose one of {', '.join(POLICIES)})")
    return POLICIES[name](n_keep, n_discard)
