"""Continuous batching: one thread runs every forward pass of the server's sessions.

What lives here: `StepScheduler`, a session's `runner` (session.py): a session's thread
hands it each chunk and waits. Decode steps (one token) of the sessions that are generating
are run together, one `batch.decode_together` pass per step; prefill chunks (a prompt, in
chunks of the session's n_batch) run one at a time, alternating with the decode steps, so a
long prompt arriving mid-generation delays each streaming user by one chunk at a time, not
by the whole prompt. A request joins the batch with its first decode step and leaves it
when its generation ends (`member()`), between steps.

When does a decode step start? When every member thread that is decoding has handed in its
next token (they sample between steps), or `max_wait_s` after a token waited on a free model
(a member busy elsewhere does not hold the others up). Who is decoding: a member thread that
handed in a decode step since its last prefill chunk.

Errors: a pass that raises fails its own chunk only; a batched step that raises is re-run
row by row so that only the session that caused it sees the error.
What does not: which conversation a request belongs to (sessions.py), HTTP (app.py), the
arithmetic (kv/batch.py, models/).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from typing import Callable, Iterator

import numpy as np

from ..kv.batch import DecodeStep, decode_together

log = logging.getLogger("edgekv")

MAX_WAIT_S = 0.02  # how long a decode step waits for the other generating sessions' tokens


class _Pending:
    """A chunk handed in by a session's thread, and its outcome."""

    def __init__(self, thread: int, step: DecodeStep | None = None, run: Callable[[], None] | None = None):
        self.thread, self.step, self.run = thread, step, run
        # held until finish(): a bare lock, not an Event, whose wait allocates a lock and
        # takes two more every time (a session's thread waits once per token)
        self._pending = threading.Lock()
        self._pending.acquire()
        self.error: BaseException | None = None
        self.since = time.monotonic()

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        if self._pending.locked():
            self._pending.release()

    def wait(self) -> None:
        """Until finish() (on the model's thread or by stop())."""
        self._pending.acquire()


class StepScheduler:
    """Runs the forward passes of the sessions whose `runner` it is, on its own thread.

    network: the model's Decoder; max_batch: most decode steps in one pass (--parallel).
    Counters (for /metrics and tests): steps, step_tokens (decode tokens run in steps),
    max_rows (the largest batch seen), prefill_chunks."""

    def __init__(self, network, max_batch: int, max_wait_s: float = MAX_WAIT_S):
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.network, self.max_batch, self.max_wait_s = network, max_batch, max_wait_s
        hp = network.hp
        self._scratch = network.backend.scratch(hp, max_batch)
        self._logits = np.zeros((max_batch, hp.n_vocab), np.float32)
        self._cv = threading.Condition()
        self._decode: list[_Pending] = []
        self._prefill: deque[_Pending] = deque()
        self._members: set[int] = set()
        self._decoding: set[int] = set()
        self._prefill_next = False
        self._free_since = 0.0  # when the last pass ended
        self._stopped = False
        self.steps = self.step_tokens = self.max_rows = self.prefill_chunks = 0
        self._thread = threading.Thread(target=self._loop, name="edgekv-model", daemon=True)
        self._thread.start()

    # -- the sessions' side ----------------------------------------------------------------------

    @contextlib.contextmanager
    def member(self) -> Iterator[None]:
        """The calling thread generates until the block ends: while it decodes, steps wait
        (up to max_wait_s) for its token."""
        me = threading.get_ident()
        with self._cv:
            self._members.add(me)
        try:
            yield
        finally:
            with self._cv:
                self._members.discard(me)
                self._decoding.discard(me)
                self._cv.notify_all()

    def forward(self, session, chunk: np.ndarray, res, rows: np.ndarray, logits: np.ndarray,
                as_steps: bool = False) -> None:
        """Session._eval_chunk's forward pass, run on the scheduler's thread; returns when it
        is done (raising what the pass raised). as_steps: every row as a one-token pass
        computes it (Session.verify's drafted tokens, Backend.independent_rows)."""
        me = threading.get_ident()
        if chunk.size == 1 and rows.size == 1 and not as_steps:
            item = _Pending(me, step=DecodeStep(int(chunk[0]), session.cache, res, logits))
        else:
            def run() -> None:
                with session.model.backend.independent_rows() if as_steps else contextlib.nullcontext():
                    session.model.forward(chunk, session.cache, res, session.scratch, rows, logits)

            item = _Pending(me, run=run)
        with self._cv:
            if self._stopped:
                raise RuntimeError("the model's scheduler has stopped")
            if item.step is not None:
                if me in self._members:
                    self._decoding.add(me)
                self._decode.append(item)
            else:
                self._decoding.discard(me)
                self._prefill.append(item)
            if item.step is None or len(self._decode) == 1 or self._steps_ready():
                # the model's thread has something to do or a wait to time; waking it for
                # each token that leaves a step still incomplete only makes the sessions'
                # threads queue behind it for the GIL
                self._cv.notify()
        item.wait()
        if item.error is not None:
            raise item.error

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            pending = list(self._decode) + list(self._prefill)
            self._decode.clear()
            self._prefill.clear()
            self._cv.notify_all()
        for item in pending:
            item.finish(RuntimeError("the server is shutting down"))

    # -- the model's thread -----------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cv:
                work = self._next_work()
                while work is None and not self._stopped:
                    self._cv.wait(self._wait_time())
                    work = self._next_work()
                if self._stopped:
                    return
            if isinstance(work, list):
                self._run_steps(work)
            else:
                self._run_prefill(work)
            self._free_since = time.monotonic()

    def _steps_ready(self) -> bool:
        if not self._decode:
            return False
        handed_in = {item.thread for item in self._decode}
        if self._decoding <= handed_in or len(self._decode) >= self.max_batch:
            return True
        return time.monotonic() - self._waiting_since() >= self.max_wait_s

    def _waiting_since(self) -> float:
        # from when the model was free and a step waited: a token handed in during the previous
        # pass must not start the next one alone while the others are still sampling theirs
        # (two streams would alternate for ever, never batched)
        return max(self._decode[0].since, self._free_since)

    def _wait_time(self) -> float | None:
        if not self._decode:
            return None
        return max(0.0, self.max_wait_s - (time.monotonic() - self._waiting_since()))

    def _next_work(self) -> list[_Pending] | _Pending | None:
        """Under the lock: the decode steps to run together, or a prefill chunk, or None.
        Prefill chunks and decode steps alternate while both wait."""
        ready = self._steps_ready()
        if self._prefill and (self._prefill_next or not ready):
            self._prefill_next = False
            return self._prefill.popleft()
        if not ready:
            return None
        # one pass holds sessions of one context size (RoPE's factors may depend on it)
        capacity = self._decode[0].step.cache.capacity
        batch = [item for item in self._decode if item.step.cache.capacity == capacity][: self.max_batch]
        self._decode = [item for item in self._decode if item not in batch]
        self._prefill_next = bool(self._prefill)
        return batch

    def _run_prefill(self, item: _Pending) -> None:
        try:
            item.run()
        except BaseException as exc:  # handed to the session's thread
            item.finish(exc)
            return
        self.prefill_chunks += 1
        item.finish()

    def _run_steps(self, batch: list[_Pending]) -> None:
        try:
            decode_together(self.network, [item.step for item in batch], self._scratch, self._logits)
        except BaseException as exc:
            if len(batch) == 1:
                batch[0].finish(exc)
                return
            log.warning("a batched decode step failed (%s); running its %d rows one by one", exc, len(batch))
            for item in batch:
                self._run_steps([item])
            return
        self.steps += 1
        self.step_tokens += len(batch)
        self.max_rows = max(self.max_rows, len(batch))
        for item in batch:
            item.finish()
