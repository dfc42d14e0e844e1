"""The `keep` overflow policy: when the context is full, evict the tokens attention uses least.

H2O (Zhang et al., 2023, "Heavy-Hitter Oracle") observed that a small share of tokens
draws most of the attention, and that keeping those "heavy hitters" plus a window of recent
tokens serves a model almost as well as the whole cache; StreamingLLM's sinks (the first
tokens) are heavy hitters of every layer. llama.cpp's `shift` drops the oldest half of the
context and `stream` (StreamingLLM) a sliding window: both forget a fact stated early, however
often the model looks at it. `keep` drops the least-attended tokens instead:

- The tallies: every full-context layer adds, per KV head, the softmax weights each slot
  receives (summed over the head's query heads and the queries) to `AttentionTallies.mass`,
  and the cache counts the queries each slot has been visible to (`seen`). The attention
  kernels leave the numerators in their score rows; the backend normalises and adds them, a
  few vector operations per layer and chunk. Sliding-window layers do not vote: they never
  see an old token, so their attention says nothing about which old tokens matter.
- The score (`score`): a token's mean attention per query, in the layer and KV head that uses
  it most. H2O sums over heads and over all the queries; the sum favours old tokens for
  being old. SmolLM2, gpl3.txt's first 1280 tokens, n_ctx 256, PPL of the tokens past the
  first window, chunks of 16, a recent quarter (stream: 20.76): sums, over heads 22.29, max
  over heads 22.91; means per query, over heads 20.53, max over heads 20.38 (the choice).
- The choice (`choose`): the n_keep first tokens (StreamingLLM's 4 sinks by default) and the
  most recent `recent_window(n_ctx)` = n_ctx // 2 tokens are always kept (H2O's even split
  between heavy hitters and recent tokens; as above in chunks of 32, stream 20.80: a recent
  eighth 20.52, a quarter 20.53, the half 20.22); of the others, the lowest scores go,
  min(16, n_ctx // 16) or as many as the next chunk needs at a time.
- The eviction (`KVCache.evict`): the same tokens leave every layer, and the others move down
  to contiguous positions with their K re-rotated by RoPE, as in a shift. One choice for all
  layers keeps what a session relies on exact: its token list is what the cache holds, so
  prefix reuse, state files (which carry the tallies) and growth work as after a shift.
  (H2O chooses per head; that would need positions per layer and head, and a token list
  per layer.)

benchmarks/kv_keep.py measures `keep` against `shift` and `stream` (perplexity past the first
window, a needle recalled after four times the capacity); benchmarks/README.md has the table.
"""

from __future__ import annotations

import numpy as np

RECENT_FRACTION = 2  # the recent window is n_ctx // RECENT_FRACTION tokens (measured above)


class AttentionTallies:
    """Per slot of the full-context layers (all of which hold a position in the same slot):
    mass f32[n_layers, n_kv_heads, capacity], the softmax weight it has received per layer
    and KV head (the backend adds to `mass[layer]`; windowed layers' rows stay 0), and seen
    f32[capacity], from how many queries. A chunk that fails after attending leaves its
    weights in `mass` (noise in a heuristic; the cache and the tokens stay exact)."""

    def __init__(self, n_layers: int, n_kv_heads: int, capacity: int, alloc=None):
        """alloc(shape, dtype, fill): where `mass` lives (the backend's ring_array: memory
        its kernels can add to; default NumPy's)."""
        shape = (n_layers, n_kv_heads, capacity)
        self.mass = np.zeros(shape, np.float32) if alloc is None else alloc(shape, np.float32, 0)
        self.seen = np.zeros(capacity, np.float32)

    def clear(self, slots: np.ndarray) -> None:
        """Slots about to take new tokens start from nothing."""
        self.mass[:, :, slots] = 0.0
        self.seen[slots] = 0.0

    def count(self, slot_pos: np.ndarray, slots: np.ndarray) -> None:
        """A chunk written to `slots` (in order) was evaluated: its n queries saw every older
        live slot, and its j-th token is seen by n - j of them."""
        n = slots.size
        self.seen[slot_pos >= 0] += n
        self.seen[slots] -= np.arange(n)

    def by_position(self, slot_pos: np.ndarray, n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """(mass f32[n_layers, n_kv_heads, n_tokens], seen f32[n_tokens]) by position."""
        mass = np.zeros((*self.mass.shape[:2], n_tokens), np.float32)
        seen = np.zeros(n_tokens, np.float32)
        live = np.flatnonzero(slot_pos >= 0)
        mass[:, :, slot_pos[live]], seen[slot_pos[live]] = self.mass[:, :, live], self.seen[live]
        return mass, seen

    def set_by_position(self, slot_pos: np.ndarray, mass: np.ndarray | None, seen: np.ndarray | None) -> None:
        """The inverse of `by_position` (None: all zeros)."""
        self.mass[...], self.seen[...] = 0.0, 0.0
        if mass is not None and seen is not None:
            live = np.flatnonzero((slot_pos >= 0) & (slot_pos < seen.size))
            self.mass[:, :, live], self.seen[live] = mass[:, :, slot_pos[live]], seen[slot_pos[live]]


def recent_window(n_ctx: int) -> int:
    """Tokens at the end of a full context that `keep` never evicts."""
    return n_ctx // RECENT_FRACTION


def score(mass: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """f64[n_tokens]: each position's largest mean attention per query over layers and KV
    heads, from the tallies f32[n_layers, n_kv_heads, n_tokens] and the number of queries
    that saw each position f32[n_tokens] (KVCache.attention_by_position)."""
    per_head = mass.reshape(-1, mass.shape[-1]).astype(np.float64) / np.maximum(seen, 1.0)
    return per_head.max(axis=0)


def choose(scores: np.ndarray, n_keep: int, recent: int, n: int) -> np.ndarray:
    """Positions to evict, sorted: the n lowest `scores` (f64[n_tokens], by position) of
    [n_keep, n_tokens - recent). When fewer than n lie there, the recent window gives up its
    oldest tokens first. Ties go to the older token."""
    n_tokens = scores.size
    assert 0 < n <= n_tokens - n_keep
    end = max(n_keep + n, n_tokens - recent)
    order = np.argsort(scores[n_keep:end], kind="stable")[:n] + n_keep
    return np.sort(order)
