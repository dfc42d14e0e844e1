"""Batched decode: the next token of several sessions in one forward pass.

What lives here: `DecodeStep` (one session's next token, the slots its cache reserved for
it and the row its logits go to) and `decode_together`, which runs the steps' tokens as the
rows of one forward pass: the weights are read once for all rows (the matvecs become small
matmuls) and each row attends to its own session's ring. Every row comes out bit for bit as
that session's own one-token pass gives it (`Backend.independent_rows`), so a stream's
greedy text does not depend on who it was batched with. `CacheBatch` and
`ReservationBatch` are what the architectures' forward passes see in place of one cache
and one reservation (CacheBatch.attend hands them to Backend.attend_batch); `session_rings`
makes the step's contract.SessionRings, every layer's rings in arrays, once per step for a
backend that attends to all sessions in one call.
What does not: deciding which steps run together and when (server/scheduler.py), reserving
and committing the slots (session.py), the arithmetic (backends/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..backends.contract import SessionRings
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
    sessions share it: RoPE's factors may depend on it) and `attend`, each row to its own ring."""

    def __init__(self, caches: Sequence[KVCache]):
        capacities = {c.capacity for c in caches}
        if len(capacities) != 1:
            raise ValueError(f"sessions decoded together must share their context size, got {sorted(capacities)}")
        self.caches = list(caches)
        self.capacity = capacities.pop()
        self._rings: SessionRings | None = None

    def attend(self, layer: int, res: "ReservationBatch", q: np.ndarray, k: np.ndarray, v: np.ndarray,
               out: np.ndarray, scale: float, scratch) -> None:
        """KVCache.attend for a batched step: row i of q, k, v, out is session i's one token,
        written into and attending to its own cache (Backend.attend_batch)."""
        for i, (one, r) in enumerate(zip(self.caches, res.parts)):
            if one.observer is not None:
                one.observer(layer, r.positions, q[i : i + 1], k[i : i + 1])
        self.caches[0].backend.attend_batch(self, res, layer, q, k, v, out, scale, scratch)

    def graph_key(self) -> None:
        """A batched step is not captured (KVCache.graph_key)."""
        return None

    def rings(self, res: "ReservationBatch") -> SessionRings:
        """The step's SessionRings (made on the first call: a CacheBatch lives one step)."""
        if self._rings is None:
            self._rings = session_rings(self.caches, res)
        return self._rings


class ReservationBatch:
    """The reservations of a batch's rows (one token each), with their positions in row order."""

    def __init__(self, parts: Sequence[Reservation]):
        if any(r.positions.shape[0] != 1 for r in parts):
            raise ValueError("a batched decode step holds one token per session")
        self.parts = list(parts)
        self.positions = np.concatenate([r.positions for r in parts]).astype(np.int32)


def decode_together(network, steps: Sequence[DecodeStep], scratch, logits: np.ndarray) -> None:
    """Run the steps' tokens through `network` (a models.base.Decoder) as one pass and write
    each step's logits; scratch: a backends/contract.py Scratch with room for len(steps) rows, logits:
    f32[>= len(steps), n_vocab] to compute them in."""
    n = len(steps)
    tokens = np.fromiter((st.token for st in steps), np.int32, n)
    logits = logits[:n]
    with network.backend.independent_rows():
        network.forward(tokens, CacheBatch([st.cache for st in steps]), ReservationBatch([st.res for st in steps]),
                        scratch, np.arange(n), logits)
    for i, st in enumerate(steps):
        st.logits[0] = logits[i]


def session_rings(caches: Sequence[KVCache], res: ReservationBatch) -> SessionRings:
    """Every layer's rings in one batched step, gathered once (contract.SessionRings says what
    each array holds): what a backend that attends to all the sessions in one call reads per
    layer instead of each cache's layer view (4 sessions x 30 layers of SmolLM2: ~0.3 ms of
    views and ~0.4 ms of arrays a step)."""
    caps = caches[0].caps
    plain = [c.plain_f16_layers() for c in caches]
    return SessionRings(
        addresses=np.stack([c.ring_addresses() for c in caches], axis=1),
        n_slots=np.ascontiguousarray(np.stack([c.used for c in caches], axis=1), dtype=np.int64),
        windows=np.ascontiguousarray(np.array([c.windows for c in caches], np.int64).T),
        slots=np.array([[int(r.slots[layer][0]) for r in res.parts] for layer in range(len(caches[0].k))], np.int64),
        caps=caps,
        limit_k=np.array([[kind.limit for kind in c.kinds_k] for c in caches], np.float32).T,
        limit_v=np.array([[kind.limit for kind in c.kinds_v] for c in caches], np.float32).T,
        plain=np.array([[p[layer] and c.caps[layer] == caps[layer] for c, p in zip(caches, plain)]
                        for layer in range(len(caps))]),
    )
