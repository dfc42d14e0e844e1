"""A session: the tokens of one conversation, their KV cache, and the latest logits.

What lives here: chunked evaluation (prefill in chunks of up to n_batch tokens, decode
one token at a time) on preallocated buffers, prefix reuse, in-memory snapshots
(`snapshot` / `restore`, a `SessionState`), and the invariant
`cache.n_tokens == len(tokens)` after every call, including one that raised or was
interrupted. What does not: sampling (sampling.py), text (tokenizer.py), the public
facade (llama.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .cache import KVCache
from .errors import ContextFullError, EdgeKVError
from .models.base import Scratch

log = logging.getLogger("edgekv")


@dataclass(frozen=True)
class SessionState:
    """A session's conversation at one moment (`Session.snapshot`); its arrays are read-only copies."""

    tokens: tuple[int, ...]
    k: tuple[np.ndarray, ...]  # per layer u16[n_kv_heads, n_ctx, head_dim], the cache's K
    v: tuple[np.ndarray, ...]  # per layer u16[n_kv_heads, n_ctx, head_dim_v], the cache's V
    slot_pos: np.ndarray  # i32[n_ctx]
    n_tokens: int
    n_vocab: int
    logits: np.ndarray | None  # f32[n_vocab] after the last token, None before any evaluation

    @property
    def n_ctx(self) -> int:
        return self.slot_pos.shape[0]


def _geometry(k: Sequence[np.ndarray], v: Sequence[np.ndarray], n_vocab: int) -> dict[str, int]:
    """What a state and the session restoring it must agree on, named as the hyperparameters."""
    return dict(n_layers=len(k), n_kv_heads=k[0].shape[0], n_ctx=k[0].shape[1], head_dim=k[0].shape[2],
                head_dim_v=v[0].shape[2], n_vocab=n_vocab)


def _frozen_copy(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


class Session:
    def __init__(self, model, n_ctx: int, n_batch: int = 512, cache_type_k: str = "f16", cache_type_v: str = "f16"):
        hp = model.hp
        if n_batch < 1:
            raise EdgeKVError(f"n_batch must be at least 1, got {n_batch}")
        self.model = model
        self.n_batch = min(n_batch, n_ctx)
        self.cache = KVCache(hp.n_layers, hp.n_kv_heads, hp.head_dim, hp.head_dim_v, n_ctx, cache_type_k, cache_type_v)
        self.scratch = Scratch(hp, self.n_batch)
        self.tokens: list[int] = []
        self.n_vocab = hp.n_vocab
        self._last_logits = np.zeros((1, hp.n_vocab), np.float32)
        self._last_row = np.zeros(1, np.int64)
        self._has_logits = False
        self.n_evaluated = 0  # tokens run through the model since creation (for reuse accounting)

    @property
    def n_ctx(self) -> int:
        return self.cache.capacity

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def logits(self) -> np.ndarray:
        """Logits after the last evaluated token, f32[n_vocab]."""
        if not self._has_logits:
            raise EdgeKVError("no logits yet: evaluate at least one token first")
        return self._last_logits[0]

    def reset(self) -> None:
        self.cache.clear()
        self.tokens.clear()
        self._has_logits = False

    def truncate(self, n_tokens: int) -> None:
        """Keep the first n_tokens tokens; logits are gone until the next evaluation."""
        n_tokens = max(0, min(n_tokens, len(self.tokens)))
        self.cache.truncate(n_tokens)
        del self.tokens[n_tokens:]
        self._has_logits = False

    def eval(self, ids: Sequence[int], all_logits: bool = False) -> np.ndarray | None:
        """Append ids to the session and run them through the model.

        Returns f32[len(ids), n_vocab] when all_logits, else None (see `logits`). On any
        error or interrupt the session keeps the tokens of the chunks that completed.
        """
        ids = np.asarray(ids, dtype=np.int32).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_vocab):
            bad = int(ids[(ids < 0) | (ids >= self.n_vocab)][0])
            raise EdgeKVError(f"token id {bad} is out of range for a vocabulary of {self.n_vocab}")
        if self.n_tokens + ids.size > self.n_ctx:
            raise ContextFullError(
                f"{self.n_tokens} tokens in the session + {ids.size} new = {self.n_tokens + ids.size} exceed "
                f"the context of {self.n_ctx} tokens; use a larger context (-c/n_ctx) or a shorter input",
                n_tokens=self.n_tokens + ids.size, n_ctx=self.n_ctx)
        out = np.empty((ids.size, self.n_vocab), np.float32) if all_logits else None
        for start in range(0, ids.size, self.n_batch):
            chunk = ids[start : start + self.n_batch]
            rows = np.arange(chunk.size) if all_logits else self._last_row_for(chunk.size)
            logits = out[start : start + chunk.size] if all_logits else self._last_logits
            self._eval_chunk(chunk, rows, logits)
            if all_logits:
                self._last_logits[0] = out[start + chunk.size - 1]
        return out

    def _last_row_for(self, n: int) -> np.ndarray:
        self._last_row[0] = n - 1
        return self._last_row

    def _eval_chunk(self, chunk: np.ndarray, rows: np.ndarray, logits: np.ndarray) -> None:
        slots, positions = self.cache.reserve(chunk.size)
        try:
            self.model.forward(chunk, positions, self.cache, slots, self.scratch, rows, logits)
        except BaseException:
            self.cache.rollback(slots)
            raise
        if not np.isfinite(logits[rows.size - 1]).all():
            self.cache.rollback(slots)
            raise EdgeKVError("the model produced NaN or infinite logits; the input was not added to the session")
        self.cache.commit(slots)
        self.tokens.extend(int(t) for t in chunk)
        self.n_evaluated += chunk.size
        self._has_logits = True

    def common_prefix(self, ids: Sequence[int]) -> int:
        n = 0
        for a, b in zip(self.tokens, ids):
            if a != b:
                break
            n += 1
        return n

    def snapshot(self) -> SessionState:
        """A copy of the tokens, the cache and the last logits, for `restore`."""
        c = self.cache
        assert c.n_tokens == len(self.tokens)
        return SessionState(tokens=tuple(self.tokens), k=tuple(_frozen_copy(a) for a in c.k),
                            v=tuple(_frozen_copy(a) for a in c.v), slot_pos=_frozen_copy(c.slot_pos),
                            n_tokens=c.n_tokens, n_vocab=self.n_vocab,
                            logits=_frozen_copy(self._last_logits[0]) if self._has_logits else None)

    def restore(self, state: SessionState) -> None:
        """Return to `state`, a snapshot of a session of the same model and n_ctx. A state that
        does not fit raises EdgeKVError and leaves this session as it was."""
        ours = _geometry(self.cache.k, self.cache.v, self.n_vocab)
        theirs = _geometry(state.k, state.v, state.n_vocab)
        for name, value in ours.items():
            if theirs[name] != value:
                raise EdgeKVError(f"cannot restore a session state with {name}={theirs[name]} into a session with "
                                  f"{name}={value}; a state fits only a session of the same model and context size")
        k, v, slot_pos = [a.copy() for a in state.k], [a.copy() for a in state.v], state.slot_pos.copy()
        c = self.cache  # the swap: nothing from here on can fail
        c.k, c.v, c.slot_pos, c.n_tokens = k, v, slot_pos, state.n_tokens
        self.tokens[:] = state.tokens
        self._has_logits = state.logits is not None
        if state.logits is not None:
            self._last_logits[0] = state.logits

    def prefill(self, ids: Sequence[int]) -> None:
        """Make the session hold exactly `ids` with logits for the last one, reusing the
        longest common prefix already in the cache."""
        ids = list(ids)
        if not ids:
            raise EdgeKVError("cannot evaluate an empty prompt")
        keep = self.common_prefix(ids)
        if keep == len(ids) == len(self.tokens) and self._has_logits:
            return
        keep = min(keep, len(ids) - 1)  # the last token is replayed so its logits exist
        self.truncate(keep)
        self.eval(ids[keep:])
