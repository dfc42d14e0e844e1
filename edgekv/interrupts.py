"""Blocks that a Ctrl-C cannot cut in two.

What lives here: `Uninterrupted`, a context manager for the bookkeeping that keeps a
session consistent (reserving, committing or rolling back cache slots, a context shift,
a truncation). A SIGINT that arrives inside is held and delivered, to whatever handler was
installed before (KeyboardInterrupt by default; the chat's stop-after-this-token handler),
as the block ends. Inside, `interruptible()` opens a window where SIGINT acts at once, for
the long computation (the forward pass) between two pieces of bookkeeping: its
KeyboardInterrupt reaches the block's own `except`, which rolls back.
Python runs signal handlers only in the main thread, between bytecodes; in other threads
(a server's worker) no KeyboardInterrupt can arrive and both are no-ops.
What does not: deciding what to roll back (session.py, kv/cache.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from types import FrameType
from typing import Any, Iterator


class Uninterrupted:
    def __init__(self) -> None:
        self._old: Any = None
        self._held: FrameType | None = None
        self._caught = False
        self._active = False

    def __enter__(self) -> "Uninterrupted":
        if threading.current_thread() is threading.main_thread():
            old = signal.getsignal(signal.SIGINT)
            if old is not None:  # None: installed outside Python; it cannot be put back, so leave it
                self._old = signal.signal(signal.SIGINT, self._hold)
                self._active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._active:
            signal.signal(signal.SIGINT, self._old)
            self._active = False
            self._deliver()

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        self._caught, self._held = True, frame

    def _deliver(self) -> None:
        """Hand a held SIGINT to the handler it was meant for (which may raise)."""
        if not self._caught:
            return
        self._caught, frame = False, self._held
        self._held = None
        if callable(self._old):
            self._old(signal.SIGINT, frame)
        elif self._old == signal.SIG_DFL:  # the process was to die of it: let it
            os.kill(os.getpid(), signal.SIGINT)

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """Within the block, let SIGINT act at once (a held one is delivered on entry)."""
        if not self._active:
            yield
            return
        signal.signal(signal.SIGINT, self._old)
        try:
            self._deliver()
            yield
        finally:
            signal.signal(signal.SIGINT, self._hold)
