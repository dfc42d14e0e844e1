"""The server's conversations: which KV session a request continues, and which stay in memory.

What lives here: `SessionPool`. Each conversation is a `Llama.fork()` of the server's model
(weights loaded once) holding its own KV session. A request is matched to a conversation by
an explicit key (the `session_id` or `user` field) or else by the longest common token
prefix with an idle conversation, live or spilled (as llama-server's slot similarity: the
prefix must cover at least SIMILARITY of that conversation); otherwise it starts a new one.
At most `slots` conversations are live, and their caches together stay within `kv_budget`
bytes; to make room the least recently used idle conversation is spilled: its session is
written to `spill_dir` as a state file (state_file.py: checksummed, written atomically) and
its memory freed. When its conversation returns it is restored, so the next turn evaluates
only its new tokens. Spill files are bounded by `spill_max` bytes (the oldest are dropped:
those conversations are evaluated again from their text when they return). A spill file
that cannot be written or read back means the same clean re-evaluation, never a wrong
answer: the session is then empty, and the facade evaluates the whole prompt.

Sharing is only ever of identical token prefixes, so a request never sees another
conversation's tokens: a conversation continued by a request keeps only the prefix the
request shares with it (Llama._prefill truncates to it).
What does not: generation (the `Llama` facade), running forward passes (scheduler.py),
HTTP (app.py).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import EdgeKVError
from ..session import common_prefix

log = logging.getLogger("edgekv")

# a request continues an idle conversation when its prompt shares this much of the conversation's
# tokens (llama-server's --slot-prompt-similarity, whose 0.5 would let a new chat that shares only a
# system prompt take over, and truncate, a short idle one; the end of a previous answer may
# re-tokenize differently, so not 1.0)
SIMILARITY = 0.9


@dataclass(eq=False)
class Conversation:
    """One conversation: live (`llm` holds its session) or spilled (`spill` is its state
    file), its tokens either way (for matching), busy while a request uses it."""

    id: int
    key: str | None
    tokens: list[int] = field(default_factory=list)
    llm: Any = None  # a Llama fork while live
    spill: str | None = None
    spill_bytes: int = 0
    busy: bool = False
    last_used: float = field(default_factory=time.time)
    last_prompt_evaluated: int = 0  # of the last request: prompt tokens run through the model ...
    last_prompt_cached: int = 0  # ... and those its cache already held

    @property
    def state(self) -> str:
        return "busy" if self.busy else "live" if self.llm is not None else "spilled"

    @property
    def nbytes(self) -> int:
        return self.llm._session.cache.nbytes if self.llm is not None else 0


class SessionPool:
    """Conversations over one model `llm` (a Llama: its forks hold the sessions).

    slots: most live conversations; kv_budget: bytes their KV caches may take together (at
    least `parallel` sessions: each running generation holds one); runner: Session.runner;
    spill_dir / spill_max: where idle conversations go when room is needed, and how many bytes
    of files may wait there (None spill_dir: idle conversations are dropped instead).
    Counters: spills, restores, spill_errors, dropped (conversations forgotten)."""

    def __init__(self, llm: Any, slots: int, kv_budget: int, spill_dir: str | None, spill_max: int,
                 runner: Any = None, parallel: int = 1):
        self.llm, self.slots, self.kv_budget = llm, slots, kv_budget
        self.spill_dir, self.spill_max, self.runner = spill_dir, spill_max, runner
        self.session_bytes = llm._session.cache.nbytes  # a fork's, at the plan's n_ctx
        if slots < 1:
            raise EdgeKVError(f"--slots must be at least 1, got {slots}")
        if kv_budget < parallel * self.session_bytes:  # each running generation holds a live session
            raise EdgeKVError(f"--kv-budget {kv_budget:,} bytes cannot hold --parallel {parallel} sessions of "
                              f"{self.session_bytes:,} bytes (n_ctx={llm.n_ctx()}); raise it, or lower -c or "
                              f"--parallel")
        if spill_dir is not None:
            os.makedirs(spill_dir, exist_ok=True)
        llm.model_fingerprint  # computed once here, shared by every fork (state files carry it)
        self._cv = threading.Condition()
        self._conversations: list[Conversation] = []
        self._next_id = 0
        self.spills = self.restores = self.spill_errors = self.dropped = 0

    # -- a request's conversation --------------------------------------------------------------

    def checkout(self, ids: list[int], key: str | None = None, timeout: float | None = None) -> Conversation:
        """The conversation a request with prompt `ids` continues (or a new one), live and
        marked busy until `checkin`. Waits while the one named by `key` is busy."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while True:
                conv = self._match(ids, key)
                if conv is not None and not conv.busy:
                    break
                if not self._cv.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
                    raise EdgeKVError(f"session {key!r} stayed busy with another request")
            conv.busy = True
            if conv.llm is None:
                self._make_live(conv)
            return conv

    def checkin(self, conv: Conversation) -> None:
        """The request is done with `conv`: it is idle again, with its tokens as they are now."""
        with self._cv:
            llm = conv.llm
            conv.tokens = list(llm._session.tokens)
            stats = llm.last_stats
            conv.last_prompt_evaluated = stats.prompt_eval_tokens
            conv.last_prompt_cached = stats.prompt_cached
            conv.last_used = time.time()
            conv.busy = False
            self._cv.notify_all()

    def _match(self, ids: list[int], key: str | None) -> Conversation | None:
        if key is not None:
            for conv in self._conversations:
                if conv.key == key:
                    return conv
            return self._new(key)
        best, best_n = None, 0
        for conv in self._conversations:
            if conv.busy or conv.key is not None or not conv.tokens:
                continue
            n = common_prefix(conv.tokens, ids)
            if n > best_n and n >= SIMILARITY * len(conv.tokens):
                best, best_n = conv, n
        return best if best is not None else self._new(None)

    def _new(self, key: str | None) -> Conversation:
        conv = Conversation(self._next_id, key)
        self._next_id += 1
        self._conversations.append(conv)
        return conv

    # -- memory: live, spilled, dropped --------------------------------------------------------

    def _live(self) -> list[Conversation]:
        return [c for c in self._conversations if c.llm is not None]

    def _make_live(self, conv: Conversation) -> None:
        """Give `conv` a session (restored from its spill file if it has one), spilling the
        least recently used idle conversations while the slots or the budget are full."""
        while True:
            live = self._live()
            if len(live) < self.slots and sum(c.nbytes for c in live) + self.session_bytes <= self.kv_budget:
                break
            idle = [c for c in live if not c.busy]
            if not idle:
                self._cv.wait()  # every live session is generating: one will be released
                continue
            self._spill(min(idle, key=lambda c: c.last_used))
        conv.llm = self.llm.fork(self.runner)
        if conv.spill is not None:
            self._restore(conv)

    def _spill(self, conv: Conversation) -> None:
        llm, conv.llm = conv.llm, None
        if not conv.tokens or self.spill_dir is None:  # nothing to keep, or nowhere to keep it
            self._forget(conv)
            return
        path = os.path.join(self.spill_dir, f"session-{conv.id}.state")
        try:
            llm.save_state_file(path)
            conv.spill, conv.spill_bytes = path, os.path.getsize(path)
            self.spills += 1
        except (OSError, EdgeKVError) as exc:
            log.warning("could not spill session %d to %s (%s); it will be evaluated again when it returns",
                        conv.id, path, exc)
            self.spill_errors += 1
            self._forget(conv)
            return
        self._bound_spill_files()

    def _restore(self, conv: Conversation) -> None:
        path, conv.spill, conv.spill_bytes = conv.spill, None, 0
        try:
            conv.llm.load_state_file(path)
            self.restores += 1
        except (OSError, EdgeKVError) as exc:
            log.warning("could not restore session %d from %s (%s); evaluating it again", conv.id, path, exc)
            self.spill_errors += 1
            conv.llm.reset()
        _remove(path)

    def _bound_spill_files(self) -> None:
        spilled = sorted((c for c in self._conversations if c.spill is not None), key=lambda c: c.last_used)
        total = sum(c.spill_bytes for c in spilled)
        for conv in spilled:
            if total <= self.spill_max:
                break
            total -= conv.spill_bytes
            _remove(conv.spill)
            self._forget(conv)

    def _forget(self, conv: Conversation) -> None:
        """Drop a conversation that is not live (its next request starts afresh)."""
        conv.spill, conv.spill_bytes = None, 0
        if conv in self._conversations:
            self._conversations.remove(conv)
        self.dropped += 1

    def close(self) -> None:
        """Delete the spill files (the server is stopping)."""
        with self._cv:
            for conv in self._conversations:
                if conv.spill is not None:
                    _remove(conv.spill)

    # -- what /slots and /metrics show ----------------------------------------------------------

    def describe(self) -> list[dict[str, Any]]:
        with self._cv:
            return [dict(id=c.id, session_id=c.key, state=c.state, n_tokens=len(c.tokens),
                         n_ctx=c.llm.n_ctx() if c.llm is not None else None, bytes=c.nbytes,
                         spill_bytes=c.spill_bytes, last_used=c.last_used,
                         last_prompt_evaluated=c.last_prompt_evaluated, last_prompt_cached=c.last_prompt_cached)
                    for c in self._conversations]

    def totals(self) -> dict[str, int]:
        with self._cv:
            live = self._live()
            return dict(live=len(live), spilled=sum(c.spill is not None for c in self._conversations),
                        kv_bytes=sum(c.nbytes for c in live),
                        spill_bytes=sum(c.spill_bytes for c in self._conversations),
                        spills=self.spills, restores=self.restores, spill_errors=self.spill_errors,
                        dropped=self.dropped)


def _remove(path: str | None) -> None:
    if path is None:
        return
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove spill file %s: %s", path, exc)
