"""Batched decode: the next token of several sessions in one forward pass.

What lives here: `DecodeStep` (one session's next token, the slots its cache reserved for
it and the row its logits go to) and `decode_together`, which runs the steps' tokens as the
rows of one forward pass: the weights are read once for all rows (the matvecs become small
matmuls) and each row attends to its own session's ring. Every row comes out bit for bit as
that session's own one-token pass gives it (`Backend.independent_rows`), so a stream's
greedy text does not depend on who it was batched with. `CacheBatch` and
`ReservationBatch` are what the architectures' forward passes see in place of one cache
and one reservation (Decoder.attend splits them again).
What does not: deciding which steps run together and when (server/scheduler.py), reserving
and committing the slots (session.py), the arithmetic (backends/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .cache import KVCache, Reservation


@dataclass
class DecodeStep:
    """One session's next token: `res` is its cache's reservation for it, `logits` the
    f32[1, n_vocab] row its logits go to."""

    token: int
    cache: KVCache
    res: Reservation
    logits: np.ndarray


class CacheBatch:
    """Several sessions' caches as one forward pass sees a cache: its `capacity` (the
    sessions share it: RoPE's factors may depend on it) and no observer."""

    observer = None

    def __init__(self, caches: Sequence[KVCache]):
        capacities = {c.capacity for c in caches}
        if len(capacities) != 1:
            raise ValueError(f"sessions decoded together must share their context size, got {sorted(capacities)}")
        self.caches = list(caches)
        self.capacity = capacities.pop()


class ReservationBatch:
    """The reservations of a batch's rows (one token each), with their positions in row order."""

    def __init__(self, parts: Sequence[Reservation]):
        if any(r.positions.shape[0] != 1 for r in parts):
            raise ValueError("a batched decode step holds one token per session")
        self.parts = list(parts)
        self.positions = np.concatenate([r.positions for r in parts]).astype(np.int32)


def decode_together(network, steps: Sequence[DecodeStep], scratch, logits: np.ndarray) -> None:
    """Run the steps' tokens through `network` (a models.base.Decoder) as one pass and write
    each step's logits; scratch: a models.base.Scratch with room for len(steps) rows, logits:
    f32[>= len(steps), n_vocab] to compute them in."""
    n = len(steps)
    tokens = np.fromiter((st.token for st in steps), np.int32, n)
    logits = logits[:n]
    with network.backend.independent_rows():
        network.forward(tokens, CacheBatch([st.cache for st in steps]), ReservationBatch([st.res for st in steps]),
                        scratch, np.arange(n), logits)
    for i, st in enumerate(steps):
        st.logits[0] = logits[i]
