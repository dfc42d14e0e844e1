"""A session's conversation at one moment: `SessionState`, and how a session is copied into one
and put back (Session.snapshot / restore call these).

What lives here: the state record (tokens, K/V rows, slot positions, ring pointers, logits,
a calibrated type's key map and sinks, the `keep` tallies) and the checks that a state fits
the session restoring it. What does not: the file format (state_file.py), growth into a larger
context (kv/growth.py). The session is handed in (a Session: this module sits below it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .errors import EdgeKVError
from .interrupts import Uninterrupted
from .kv.cache import KeyMap, KVCache


@dataclass(frozen=True)
class SessionState:
    """A session's conversation at one moment (`Session.snapshot`); its arrays are read-only copies."""

    tokens: tuple[int, ...]
    k: tuple[np.ndarray, ...]  # per layer u8[n_kv_heads, cap, row_bytes_k], the cache's K rows
    v: tuple[np.ndarray, ...]  # per layer u8[n_kv_heads, cap, row_bytes_v], the cache's V rows
    slot_pos: tuple[np.ndarray, ...]  # per layer i32[cap], the position in each slot (-1: empty)
    ring: np.ndarray  # i64[2, n_layers]: slots ever used, write pointer of windowed rings
    cache_types: tuple[str, str]  # (K, V)
    n_tokens: int
    n_vocab: int
    logits: np.ndarray | None  # f32[n_vocab] after the last token, None before any evaluation
    # a calibrated K type's key map and sink rows (kv/key_map.KeyMap, KVCache.sink_k); None otherwise
    key_map: KeyMap | None = None
    sink_k: np.ndarray | None = None
    # the `keep` policy's tallies by position (KVCache.attention_by_position); else None
    attention: np.ndarray | None = None  # f32[n_layers, n_kv_heads, n_tokens]
    attention_seen: np.ndarray | None = None  # f32[n_tokens]

    @property
    def n_ctx(self) -> int:
        return max(p.shape[0] for p in self.slot_pos)


def _geometry(k: Sequence[np.ndarray], v: Sequence[np.ndarray], n_vocab: int) -> dict[str, int]:
    """What a state and the session restoring it must agree on, named as the hyperparameters
    (row_bytes: head size times the cache type's bytes per value)."""
    return dict(n_layers=len(k), n_kv_heads=k[0].shape[0], n_ctx=max(a.shape[1] for a in k),
                layer_capacities=tuple(a.shape[1] for a in k), row_bytes_k=k[0].shape[2],
                row_bytes_v=v[0].shape[2], n_vocab=n_vocab)


def _frozen_copy(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


def _tallies(cache: KVCache) -> dict[str, np.ndarray]:
    """A `keep` cache's attention tallies as SessionState fields (none for other caches)."""
    if cache.tallies is None:
        return {}
    mass, seen = cache.attention_by_position()
    return dict(attention=_frozen_copy(mass), attention_seen=_frozen_copy(seen))


def snapshot_of(session: Any) -> SessionState:
    """A copy of the session's tokens, cache and last logits (Session.snapshot)."""
    c = session.cache
    assert c.n_tokens == len(session.tokens)
    c.backend.rings_to_host(c)  # a device-resident ring's rows, copied back
    return SessionState(tokens=tuple(session.tokens), k=tuple(_frozen_copy(a) for a in c.k),
                        v=tuple(_frozen_copy(a) for a in c.v), slot_pos=tuple(_frozen_copy(p) for p in c.pos),
                        ring=_frozen_copy(np.stack([c.used, c.cur])), cache_types=(c.type_k, c.type_v),
                        n_tokens=c.n_tokens, n_vocab=session.n_vocab,
                        logits=_frozen_copy(session._last_logits[0]) if session._has_logits else None,
                        key_map=c.key_map, sink_k=None if c.sink_k is None else _frozen_copy(c.sink_k),
                        **_tallies(c))


def restore_into(session: Any, state: SessionState) -> None:
    """Put `state` into the session (Session.restore); a state that does not fit raises
    EdgeKVError and leaves the session as it was."""
    cache = session.cache
    ours = dict(_geometry(cache.k, cache.v, session.n_vocab), cache_types=(cache.type_k, cache.type_v))
    theirs = dict(_geometry(state.k, state.v, state.n_vocab), cache_types=state.cache_types)
    for name, value in ours.items():
        if theirs[name] != value:
            raise EdgeKVError(f"cannot restore a session state with {name}={theirs[name]} into a session with "
                              f"{name}={value}; a state fits only a session of the same model and context size")
    if cache.calibrated and (state.key_map is None or state.sink_k is None):
        raise EdgeKVError(f"cannot restore a state without its key map into a session whose cache type is {cache.type_k}")
    k, v, pos = [a.copy() for a in state.k], [a.copy() for a in state.v], [p.copy() for p in state.slot_pos]
    sink_k = None if state.sink_k is None else state.sink_k.copy()
    with Uninterrupted():
        cache.load(k, v, pos, state.ring, state.n_tokens, state.key_map, sink_k)  # the swap: nothing from here on can fail
        cache.set_attention_by_position(state.attention, state.attention_seen)
        session.tokens[:] = state.tokens
        session.n_discarded = 0  # unknown for a state: a chat re-renders (slower, never wrong)
        session._ends.clear()
        session._has_logits = state.logits is not None
        if state.logits is not None:
            session._last_logits[0] = state.logits
