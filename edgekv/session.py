"""A session: the tokens of one conversation, their KV cache, and the latest logits.

What lives here: chunked evaluation (prefill in chunks of up to n_batch tokens, decode
one token at a time) on preallocated buffers, prefix reuse, verify passes of drafted tokens
(`verify` / `settle`: speculative decoding, kv/drafts.py), in-memory snapshots (`snapshot` /
`restore`, a `SessionState`: session_state.py), and the invariant
`cache.n_tokens == len(tokens)` after every call, including one that raised or was
interrupted (the bookkeeping runs as `Uninterrupted` blocks, so a Ctrl-C lands either
before or after it). What does not: sampling (sampling.py), text (text/tokenizer.py), the public
facade (api/facade.py).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Sequence

import numpy as np

from .backends.kernel_map import BATCH_MIN_TOKENS
from .kv.cache import KeyMap, KVCache
from .kv.drafts import reserve_draft, settle
from .kv.growth import copy_into
from .kv.overflow import overflow_policy
from .session_state import SessionState, restore_into, snapshot_of
from .errors import ContextFullError, EdgeKVError, NumericalError
from .interrupts import Uninterrupted
from .models.base import KeyShift

log = logging.getLogger("edgekv")

MAX_ENDS = 2  # prompt-end logits a session keeps (see Session._ends)
# The kinds of forward pass each model has run in this process. Numba loads (or compiles) a
# kernel on its first call, and a KeyboardInterrupt inside its loader leaves Numba broken
# (RuntimeError on the next call, a segfault later: test_interrupts.py found both), so the
# first pass of each kind runs whole and a Ctrl-C during it acts when it ends.
_PASSES_RUN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Session:
    def __init__(self, model, n_ctx: int, n_batch: int = 512, cache_type_k: str = "f16", cache_type_v: str = "f16",
                 context_shift: str = "none", n_keep: int = 0, n_discard: int = 0,
                 layer_windows: dict[int, int] | None = None, key_map: KeyMap | None = None):
        hp = model.hp
        if n_batch < 1:
            raise EdgeKVError(f"n_batch must be at least 1, got {n_batch}")
        self.policy = overflow_policy(context_shift, n_keep, n_discard)
        if n_keep < 0 or n_discard < 0 or n_keep >= n_ctx:
            raise EdgeKVError(f"n_keep={n_keep}, n_discard={n_discard}: need 0 <= n_keep < n_ctx={n_ctx}, n_discard >= 0")
        self.model = model
        self.context_shift, self.n_keep, self.n_discard = context_shift, n_keep, n_discard
        # a chunk must fit beside the kept tokens, and in one call of the backend
        self.n_batch = min(n_batch, n_ctx - self._kept(), model.backend.max_batch or n_batch)
        windows = [hp.window if local else 0 for local in hp.local_layers]
        for layer, w in (layer_windows or {}).items():
            if not 0 <= layer < hp.n_layers or w < 1:
                raise EdgeKVError(f"layer window {layer}:{w}: layers are 0..{hp.n_layers - 1}, windows at least 1")
            windows[layer] = min(windows[layer], w) if windows[layer] else w
        self.cache = KVCache(n_layers=hp.n_layers, n_kv_heads=hp.n_kv_heads, head_dim_k=hp.head_dim,
                             head_dim_v=hp.head_dim_v, capacity=n_ctx, backend=model.backend, type_k=cache_type_k,
                             type_v=cache_type_v, windows=windows, n_batch=self.n_batch, n_keep=self._kept(),
                             key_map=key_map, track_attention=self.policy.tracks_attention)
        self.scratch = model.backend.scratch(hp, self.n_batch)
        self.tokens: list[int] = []
        self.n_vocab = hp.n_vocab
        self._last_logits = np.zeros((1, hp.n_vocab), np.float32)
        self._spare_logits = np.zeros((1, hp.n_vocab), np.float32)  # written, then swapped in on success
        self._last_row = np.zeros(1, np.int64)
        self._has_logits = False
        # logits after the last token of recent multi-token chunks (prompts), by token count:
        # asking the same prompt again reuses them instead of replaying its last token, whose
        # logits a one-token pass computes in the decode kernels' order, not the prefill's
        # (on CPUs without int8 dot products the two differ in the last bits: a near-tie can flip)
        self._ends: dict[int, np.ndarray] = {}
        self.n_evaluated = 0  # tokens run through the model since creation (for reuse accounting)
        # tokens the overflow policy dropped since the last reset: while > 0, `tokens` is no
        # longer the start of the conversation (Llama's chat then appends instead of re-rendering)
        self.n_discarded = 0
        self.last_evicted = np.zeros(0, np.int64)  # the positions the last overflow dropped (numbered before it)
        # who runs this session's forward passes: None = the calling thread; the server's
        # StepScheduler batches the decode steps of its sessions (server/scheduler.py)
        self.runner = None
        self._draft: tuple | None = None  # a verify pass awaiting `settle`: (DraftMark, ids, logits)

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
        with Uninterrupted():
            self.cache.clear()
            self.tokens.clear()
            self._has_logits = False
            self._ends.clear()
            self.n_discarded = 0

    def truncate(self, n_tokens: int) -> None:
        """Keep the first n_tokens tokens; logits are gone until the next evaluation."""
        n_tokens = max(0, min(n_tokens, len(self.tokens)))
        self._check_settled()
        with Uninterrupted():
            self.cache.truncate(n_tokens)
            del self.tokens[n_tokens:]
            self._has_logits = False
            self._ends = {n: row for n, row in self._ends.items() if n <= n_tokens}

    def eval(self, ids: Sequence[int], all_logits: bool = False) -> np.ndarray | None:
        """Append ids to the session and run them through the model.

        Returns f32[len(ids), n_vocab] when all_logits, else None (see `logits`). On any
        error or interrupt the session keeps the tokens of the chunks that completed.
        """
        ids = np.asarray(ids, dtype=np.int32).reshape(-1)
        self._check_settled()
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_vocab):
            bad = int(ids[(ids < 0) | (ids >= self.n_vocab)][0])
            raise EdgeKVError(f"token id {bad} is out of range for a vocabulary of {self.n_vocab}")
        if self.context_shift == "none" and self.n_tokens + ids.size > self.n_ctx:
            raise ContextFullError(
                f"{self.n_tokens} tokens in the session + {ids.size} new = {self.n_tokens + ids.size} exceed "
                f"the context of {self.n_ctx} tokens; use a larger context (-c/n_ctx) or a shorter input",
                n_tokens=self.n_tokens + ids.size, n_ctx=self.n_ctx)
        out = np.empty((ids.size, self.n_vocab), np.float32) if all_logits else None
        for start in range(0, ids.size, self.n_batch):
            chunk = ids[start : start + self.n_batch]
            rows = np.arange(chunk.size) if all_logits else self._last_row_for(chunk.size)
            logits = out[start : start + chunk.size] if all_logits else self._spare_logits
            self._eval_chunk(chunk, rows, logits)
            if all_logits:
                self._last_logits[0] = out[start + chunk.size - 1]
        return out

    def _last_row_for(self, n: int) -> np.ndarray:
        self._last_row[0] = n - 1
        return self._last_row

    def _kept(self) -> int:
        """Tokens at the front an overflow keeps: n_keep, or StreamingLLM's sinks for `stream` and `keep`."""
        return self.policy.kept()

    def _make_room(self, n: int) -> None:
        """Apply the overflow policy until n more tokens fit (llama.cpp's context shift:
        keep n_keep, drop the oldest others; `stream` drops small blocks, StreamingLLM-like,
        keeping n_keep (default 4) attention sinks; `keep` drops the least-attended tokens
        outside the sinks and a recent window, kv/heavy_hitters.py)."""
        need = self.n_tokens + n - self.n_ctx
        if need <= 0:
            return
        keep = self._kept()
        movable = self.n_tokens - keep
        if movable < need:
            raise ContextFullError(
                f"a chunk of {n} tokens does not fit a context of {self.n_ctx} with {keep} kept tokens; "
                f"use a smaller n_batch or a larger context", n_tokens=self.n_tokens + n, n_ctx=self.n_ctx)
        drop = self.policy.to_evict(self.cache, need, self.n_tokens, self.n_ctx)
        log.info("context full: dropping %d tokens after the first %d (%s)", drop.size, keep, self.context_shift)
        n_ctx = self.cache.capacity
        self.cache.evict(drop, KeyShift(self.model, n_ctx))
        kept = np.ones(len(self.tokens), bool)
        kept[drop] = False
        self.tokens[:] = np.asarray(self.tokens)[kept].tolist()
        self.n_discarded += drop.size
        self.last_evicted = drop
        self._ends.clear()  # positions moved

    def _eval_chunk(self, chunk: np.ndarray, rows: np.ndarray, logits: np.ndarray) -> None:
        """Evaluate one chunk, all or nothing: on an error or a Ctrl-C the cache forgets the
        chunk's slots (a context shift made for it stays: it is complete and consistent)."""
        with Uninterrupted() as bookkeeping:
            if self.context_shift != "none":
                self._make_room(chunk.size)
            res = self.cache.reserve(chunk.size)
            kind = (self.cache.type_k, self.cache.type_v, chunk.size == 1, rows.size == chunk.size)
            ran = _PASSES_RUN.setdefault(self.model, set())
            try:
                with bookkeeping.interruptible() if kind in ran else contextlib.nullcontext():
                    if self.runner is None:
                        self.model.backend.run(self.model, chunk, self.cache, res, self.scratch, rows, logits)
                    else:
                        self.runner.forward(self, chunk, res, rows, logits)
                ran.add(kind)
            except BaseException:
                self.cache.rollback(res)
                raise
            if not np.isfinite(logits[rows.size - 1]).all():
                self.cache.rollback(res)
                raise NumericalError("the model produced NaN or infinite logits; the input was not added to the "
                                     f"session: {self.model.explain_non_finite()}")
            self.cache.commit(res)
            if chunk.size > 1:
                self._remember_end(len(self.tokens) + chunk.size, logits[rows.size - 1])
            if logits is self._spare_logits:
                self._last_logits, self._spare_logits = self._spare_logits, self._last_logits
            self.tokens.extend(int(t) for t in chunk)
            self.n_evaluated += chunk.size
            self._has_logits = True

    def verify(self, ids: Sequence[int]) -> np.ndarray:
        """Evaluate ids (a sampled token and the drafts after it: speculative/) in one pass,
        every row as a decode step computes it, bit for bit (Backend.independent_rows), and
        return their logits f32[len(ids), n_vocab]; nothing is part of the session until
        `settle(n)` keeps the first n and forgets the rest exactly (kv/drafts.py). The ids must
        fit the free room of the context (no overflow policy runs for drafts) in one chunk
        shorter than the batch path's (kernel_map.BATCH_MIN_TOKENS)."""
        ids = np.asarray(ids, dtype=np.int32).reshape(-1)
        self._check_settled()
        if not 1 <= ids.size <= self.max_verify() or not self.n_tokens:
            raise EdgeKVError(f"cannot verify {ids.size} tokens after {self.n_tokens}: at most {self.max_verify()}, "
                              "after at least one evaluated token")
        if ids.min() < 0 or ids.max() >= self.n_vocab:
            raise EdgeKVError(f"token ids must be in 0..{self.n_vocab - 1}")
        if self.cache.tallies is not None and not self.model.backend.exact_verify:
            raise EdgeKVError(f"speculative decoding with context_shift='keep' runs on the CPU backends for now, not "
                              f"on {self.model.backend.name}: use context_shift 'shift' or 'stream' there")
        logits = np.empty((ids.size, self.n_vocab), np.float32)
        rows = np.arange(ids.size)
        with Uninterrupted() as bookkeeping:
            mark = reserve_draft(self.cache, ids.size)
            kind = (self.cache.type_k, self.cache.type_v, "verify")
            ran = _PASSES_RUN.setdefault(self.model, set())
            try:
                with bookkeeping.interruptible() if kind in ran else contextlib.nullcontext():
                    if self.runner is not None:
                        self.runner.forward(self, ids, mark.res, rows, logits, as_steps=True)
                    else:
                        with self.model.backend.independent_rows():
                            self.model.backend.run(self.model, ids, self.cache, mark.res, self.scratch, rows, logits)
                ran.add(kind)
            except BaseException:
                settle(self.cache, mark, 0)
                raise
            self._draft = (mark, ids, logits)
            self.n_evaluated += ids.size
        return logits

    def max_verify(self) -> int:
        """The most tokens one `verify` pass takes now: the free room, one short chunk."""
        return max(0, min(self.n_ctx - self.n_tokens, self.n_batch, BATCH_MIN_TOKENS - 1))

    def settle(self, n_kept: int) -> None:
        """End the pending verify pass: its first n_kept tokens join the session with the
        logits after the last of them, the others leave no trace (0: as if it never ran).
        A kept row whose logits are not finite raises NumericalError, keeping those before it."""
        mark, ids, logits = self._draft
        bad = np.flatnonzero(~np.isfinite(logits[:n_kept]).all(axis=1))
        kept = int(bad[0]) if bad.size else n_kept
        with Uninterrupted():
            settle(self.cache, mark, kept)
            self._draft = None
            self.tokens.extend(int(t) for t in ids[:kept])
            if kept:
                self._last_logits[0] = logits[kept - 1]
                self._has_logits = True
        if bad.size:
            raise NumericalError("the model produced NaN or infinite logits; the input was not added to the "
                                 f"session: {self.model.explain_non_finite()}")

    def _check_settled(self) -> None:
        if self._draft is not None:
            raise EdgeKVError("a verify pass is waiting to be settled (Session.settle) before the session changes")

    def _remember_end(self, n_tokens: int, row: np.ndarray) -> None:
        if len(self._ends) >= MAX_ENDS:
            del self._ends[next(iter(self._ends))]
        self._ends[n_tokens] = row.copy()

    def common_prefix(self, ids: Sequence[int]) -> int:
        return common_prefix(self.tokens, ids)

    def snapshot(self) -> SessionState:
        """A copy of the tokens, the cache and the last logits, for `restore`."""
        self._check_settled()
        return snapshot_of(self)

    def restore(self, state: SessionState) -> None:
        """Return to `state`, a snapshot of a session of the same model and n_ctx. A state that
        does not fit raises EdgeKVError and leaves this session as it was."""
        self._check_settled()
        restore_into(self, state)

    def grown(self, new_n_ctx: int, n_batch: int | None = None, key_map: KeyMap | None = None) -> "Session":
        """A new session with a context of new_n_ctx (>= n_ctx) holding this one's conversation:
        tokens, K/V rows, positions, logits and counters are copied once (the `n_ctx="auto"`
        growth of DESIGN.md section 3; kv/growth.py copy_into). A calibrated K type takes key_map,
        the map for the new size (its rows are re-coded), else keeps its own. This session is
        left as it was."""
        if new_n_ctx < self.n_ctx:
            raise EdgeKVError(f"cannot grow a context of {self.n_ctx} tokens to {new_n_ctx}")
        c = self.cache
        new = Session(self.model, new_n_ctx, n_batch or self.n_batch, c.type_k, c.type_v, self.context_shift,
                      self.n_keep, self.n_discard, None, key_map or c.key_map)
        if new.cache.windows != c.windows:  # layer_windows are not kept on the session: rebuild the rings
            new.cache = KVCache(n_layers=len(c.k), n_kv_heads=c.k[0].shape[0], head_dim_k=c.head_dim_k,
                                head_dim_v=c.head_dim_v, capacity=new_n_ctx, backend=c.backend, type_k=c.type_k,
                                type_v=c.type_v, windows=c.windows, n_batch=new.n_batch, n_keep=new._kept(),
                                key_map=key_map or c.key_map, track_attention=c.tallies is not None)
        copy_into(new.cache, c)
        new.tokens = list(self.tokens)
        new._last_logits[...] = self._last_logits
        new._has_logits = self._has_logits
        new.n_evaluated, new.n_discarded = self.n_evaluated, self.n_discarded
        return new

    def prefill(self, ids: Sequence[int]) -> None:
        """Make the session hold exactly `ids` with logits for the last one, reusing the
        longest common prefix already in the cache."""
        ids = list(ids)
        if not ids:
            raise EdgeKVError("cannot evaluate an empty prompt")
        keep = self.common_prefix(ids)
        if keep == len(ids) == len(self.tokens) and self._has_logits:
            return
        if keep == len(ids) in self._ends and self.cache.reusable_prefix(keep) == keep:
            row = self._ends[keep]
            self.truncate(keep)  # the tokens after the prompt; its logits as first computed
            self._last_logits[0] = row
            self._has_logits = True
            return
        keep = self.cache.reusable_prefix(min(keep, len(ids) - 1))  # replay the last token for its logits
        self.truncate(keep)
        self.eval(ids[keep:])
