"""The server's generation queue: requests' generations on `parallel` worker threads.

What lives here: `GenerationQueue` (at most `parallel` generations at once, each on its own
worker thread, and at most `max_queue` requests waiting: 429 beyond) and `_Job`, one
request's generation, whose items (a response dict, or the chunks of a stream) reach the
event loop through an asyncio queue; a client that goes away stops its generation at the
next token. The worker threads only drive the `Llama` facade: forward passes run on the
model's own thread (scheduler.py), which batches the generations' decode steps.
What does not: HTTP (app.py), conversations (sessions.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

from .limits import DEFAULT_MAX_QUEUE
from .requests import ApiError

END = object()  # a job's last item


class _Job:
    """One request's generation: `work()` runs on the worker thread and returns a response
    dict or an iterator of chunk dicts; the items reach the event loop through `next()`."""

    def __init__(self, work: Callable[["_Job"], Any]):
        self.work = work
        self.loop = asyncio.get_running_loop()
        self.items: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()  # set from the event loop when the client is gone
        self.stopped_early = False

    def cancel(self) -> None:
        self.cancelled.set()

    def should_stop(self, *_: Any) -> bool:
        """A stopping criterion for the facade: stop at the next token once cancelled."""
        return self.cancelled.is_set()

    def run(self) -> None:  # on the worker thread
        try:
            if self.cancelled.is_set():  # the client left while waiting
                self.stopped_early = True
                return
            result = self.work(self)
            if isinstance(result, dict):
                self._put(result)
            else:
                self._drain(result)
            self.stopped_early = self.stopped_early or self.cancelled.is_set()
        except Exception as exc:  # handed to the request, which answers it
            self._put(exc)
        finally:
            self._put(END)

    def _drain(self, chunks: Iterator[dict]) -> None:
        try:
            for chunk in chunks:
                if self.cancelled.is_set():
                    self.stopped_early = True
                    return
                self._put(chunk)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def _put(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancelled.set()

    async def next(self) -> Any:
        item = await self.items.get()
        if isinstance(item, BaseException):
            raise item
        return item


class GenerationQueue:
    """Runs jobs on `parallel` worker threads; admits at most parallel + max_queue at once.

    Counters (read them for monitoring and tests): `pending` (running + waiting), `running`,
    `finished`, `stopped_early` (generations cut short because the client went away)."""

    def __init__(self, max_queue: int = DEFAULT_MAX_QUEUE, parallel: int = 1):
        assert max_queue >= 0 and parallel >= 1
        self.max_queue, self.parallel = max_queue, parallel
        self._executor = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="edgekv-generate")
        self._lock = threading.Lock()
        self.pending = self.running = self.finished = self.stopped_early = 0

    @property
    def waiting(self) -> int:
        return self.pending - self.running

    def _admit(self) -> None:
        with self._lock:
            if self.pending >= self.parallel + self.max_queue:
                raise ApiError(429, f"the server is busy: {self.waiting} requests are already waiting "
                                    f"(--queue {self.max_queue}); retry later", type="rate_limit_error",
                               code="queue_full")
            self.pending += 1

    def _started(self, delta: int) -> None:
        with self._lock:
            self.running += delta

    def _done(self, stopped_early: bool) -> None:
        with self._lock:
            self.pending -= 1
            self.finished += 1
            self.stopped_early += bool(stopped_early)

    def submit(self, work: Callable[[_Job], Any]) -> _Job:
        """Queue `work` (ApiError 429 when the queue is full); call from the event loop."""
        self._admit()
        job = _Job(work)

        def run() -> None:
            self._started(1)
            try:
                job.run()
            finally:
                self._started(-1)
                self._done(job.stopped_early)

        self._executor.submit(run)
        return job

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Occupy one worker outside any request until the block ends, as a request would
        (maintenance work; tests of a full queue). Callable from any thread."""
        self._admit()
        started, release = threading.Event(), threading.Event()

        def occupy() -> None:
            started.set()
            release.wait()

        future = self._executor.submit(occupy)
        started.wait()
        try:
            yield
        finally:
            release.set()
            future.result()
            self._done(False)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
