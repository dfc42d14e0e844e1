"""Context-size management for `Llama`: which context the conversation lives in, and when it changes.

What lives here: `ContextManager`, which owns the model's current `Session` and its `KVPlan`
and decides their size: the n_ctx="auto" plan from the first call, the cap (the trained
context within the memory budget), geometric growth when a call needs more (the
conversation copied once), re-sizing to a restored snapshot, and the one-line plan that
`Llama.plan_line` and `edgekv chat` show. Also checking the `n_ctx`, `mem_budget` and
`layer_windows` options that decide it.
What does not: the planning arithmetic (capacities, bytes, budgets: kv/plan.py), the cache
and what a full context does (session.py, kv/cache.py), the generation loop and the
llama-cpp-python API (facade.py). Not a Python `with` context manager.
"""

from __future__ import annotations

import copy
import dataclasses
import logging

import numpy as np

from ..kv import plan as ctxplan
from ..errors import EdgeKVError
from ..kv.calibration import key_map_for
from ..kv.memory import format_bytes, parse_size
from ..session import Session, SessionState
from ..state_file import load_session, state_file_n_ctx

log = logging.getLogger("edgekv")


class ContextManager:
    """A model's current session and plan. n_ctx "auto" (or None): planned from the first
    call and grown up to `cap`; 0: the trained context; another int: fixed."""

    def __init__(self, model, n_ctx: int | str | None, n_batch: int, mem_budget: int | str | None, *,
                 cache_type_k: str, cache_type_v: str, context_shift: str, n_keep: int, n_discard: int,
                 layer_windows: dict[int, int] | str | None):
        self.model = model
        self.n_batch = n_batch
        self.runner = None  # given to every session this manager makes (Session.runner)
        self.kv = dict(cache_type_k=cache_type_k, cache_type_v=cache_type_v, context_shift=context_shift,
                       n_keep=n_keep, n_discard=n_discard,
                       layer_windows=_layer_windows(layer_windows, model.hp.n_layers))
        self.auto = _plan_n_ctx(n_ctx) is None
        self.mem_budget = self._budget(mem_budget)
        if self.auto:
            try:
                self._cap = self._plan(0, -1).n_ctx  # the trained context, within the memory budget
            except EdgeKVError:
                if mem_budget is not None:
                    raise
                budget, self.mem_budget = self.mem_budget, None
                # the loader found room for the smallest context: keep to it (an error not
                # about the budget is raised here)
                self._cap = min(self._plan(0, -1).n_ctx, ctxplan.CTX_ALIGN)
                log.warning("the default memory budget (%s) cannot hold more than the smallest context: the context "
                            "stays at %d tokens (mem_budget / --mem-budget allows more)", format_bytes(budget or 0),
                            self._cap)
            self.plan = self._plan(0, 0)
        else:
            requested = _plan_n_ctx(n_ctx) or model.hp.n_ctx_train
            self.plan = self._plan(0, 0, requested)
            self._cap = requested
        self.session = self.new_session(self.plan.n_ctx)
        self._log_plan()

    @property
    def session(self) -> Session:
        return self._session

    @session.setter
    def session(self, session: Session) -> None:
        session.runner = self.runner
        self._session = session

    def fork(self, runner=None) -> "ContextManager":
        """A manager with the same options and plan over a new, empty session of the
        current plan's size (another conversation on the same model); runner: Session.runner."""
        other = copy.copy(self)
        other.runner = runner
        other.session = self.new_session(self.plan.n_ctx)
        return other

    def _budget(self, mem_budget: int | str | None) -> int | None:
        if mem_budget is None:
            room = getattr(self.model, "memory_room", None)  # read before the weights were
            weights = ctxplan.weight_bytes(self.model.gguf)
            host = ctxplan.budget_from(room, weights) if room is not None else ctxplan.default_mem_budget(weights)
            return ctxplan.within_device(host, self.model.backend.kv_memory_limit())  # a discrete GPU holds the rings
        if isinstance(mem_budget, str):
            return parse_size(mem_budget)
        if isinstance(mem_budget, bool) or not isinstance(mem_budget, (int, np.integer)) or mem_budget < 0:
            raise EdgeKVError(f"mem_budget must be a number of bytes, a size like '2G', or None; got {mem_budget!r}")
        return int(mem_budget)

    def _plan(self, n_prompt: int, n_predict: int, n_ctx: int | str = "auto") -> ctxplan.KVPlan:
        kv = self.kv
        return ctxplan.plan_context(self.model.hp, n_prompt, n_predict, n_ctx, kv["cache_type_k"],
                                   kv["cache_type_v"], self.mem_budget, kv["layer_windows"], self.n_batch)

    def new_session(self, n_ctx: int) -> Session:
        """An empty session of n_ctx tokens with this manager's cache options (not adopted)."""
        return self.model.session(n_ctx, self.n_batch, **self.kv)

    @property
    def cap(self) -> int:
        """The most tokens the context can hold without the overflow policy."""
        return self._cap if self.auto else self.session.n_ctx

    def plan_line(self) -> str:
        """The current context plan in one line: n_ctx and why, K/V bytes per token, KV bytes."""
        p, c = self.plan, self.session.cache
        bk, bv = c.bytes_per_token()
        grow = f", grows up to {self._cap} as needed" if self.auto and self._cap > p.n_ctx else ""
        return (f"n_ctx={self.session.n_ctx} because {p.reason} ({p.detail}){grow}; K/V bytes per token "
                f"{bk:,}/{bv:,} ({c.type_k}/{c.type_v}, {len(c.k)} layers); KV cache "
                f"{format_bytes(c.nbytes)}; overflow policy {self.session.context_shift}")

    def _log_plan(self) -> None:
        log.info("%s", self.plan_line())

    def ensure(self, n_tokens: int, n_predict: int = 0) -> None:
        """n_ctx="auto": make the context hold n_tokens (+ n_predict to generate), growing it
        (at least doubling, rounded to 256, the conversation copied once) up to the cap.
        Never shrinks."""
        cur, needed = self.session.n_ctx, n_tokens + n_predict
        if not self.auto or needed <= cur or cur >= self._cap:
            return
        plan = self._plan(n_tokens, n_predict)
        target = plan.n_ctx
        if self.session.n_tokens:
            align = ctxplan.CTX_ALIGN
            target = max(target, -(-2 * cur // align) * align)
        target = min(target, self._cap)
        if target <= cur:
            return
        if self.session.n_tokens:
            self.session = self.session.grown(target, self.n_batch,
                                              key_map_for(self.model, self.kv["cache_type_k"], target))
            self.plan = dataclasses.replace(self._plan(0, 0, target), reason="growth",
                                            detail=f"{needed} tokens needed, grown from {cur}")
        else:
            self.session = self.new_session(target)
            self.plan = plan if plan.n_ctx == target else self._plan(0, 0, target)
        self._log_plan()

    def restore(self, state: SessionState) -> None:
        """Return the session to `state`. With n_ctx="auto" the context takes the snapshot's
        size when it differs (within the cap); otherwise Session.restore decides."""
        if self.auto and state.n_ctx != self.session.n_ctx and state.n_ctx <= self._cap:
            session = self.new_session(state.n_ctx)
            session.restore(state)
            self.session = session
            self.plan = self._plan(0, 0, session.n_ctx)
        else:
            self.session.restore(state)


    def load_file(self, path, fingerprint: str) -> None:
        """Put a state file into the session. With n_ctx="auto" the context first takes the
        file's size when it differs (within the cap); on any error the session stays as it was."""
        n_ctx = state_file_n_ctx(path)
        if self.auto and n_ctx and n_ctx != self.session.n_ctx and n_ctx <= self._cap:
            session = self.new_session(n_ctx)
            load_session(session, fingerprint, path)
            self.session = session
            self.plan = self._plan(0, 0, session.n_ctx)
        else:
            load_session(self.session, fingerprint, path)


CHAT_TAIL = 16  # cache tokens that locate the end of the cache in a re-rendered conversation


def continue_after_shift(cached: list[int], ids: list[int]) -> list[int]:
    """The prompt for a re-rendered conversation `ids` once the overflow policy has dropped
    tokens from the cache, whose tokens (`cached`) then no longer start like `ids`, so that
    prefix reuse would evaluate all of it again each turn. When `ids` contains the cache's
    last CHAT_TAIL tokens: the cache's tokens, then what follows them in `ids` (the new turn),
    as llama.cpp's chat does. Otherwise (the conversation was edited before its end) `ids`."""
    if len(cached) < CHAT_TAIL or ids[:len(cached)] == cached:
        return ids
    tail = cached[-CHAT_TAIL:]
    for p in range(len(ids) - CHAT_TAIL, -1, -1):
        if ids[p:p + CHAT_TAIL] == tail:
            return list(cached) + ids[p + CHAT_TAIL:]
    return ids


def _plan_n_ctx(n_ctx: int | str | None) -> int | None:
    """None for "auto"/None; 0 (the trained context, as llama-cpp-python) or the int."""
    if n_ctx is None or (isinstance(n_ctx, str) and n_ctx == "auto"):
        return None
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, (int, np.integer)) or n_ctx < 0:
        raise EdgeKVError(f"n_ctx must be a positive integer or 'auto', got {n_ctx!r}")
    return int(n_ctx)


def _layer_windows(spec: dict[int, int] | str | None, n_layers: int) -> dict[int, int] | None:
    if spec is None or isinstance(spec, dict):
        return spec or None
    if isinstance(spec, str):
        return ctxplan.parse_layer_windows(spec, n_layers) if spec.strip() else None
    raise EdgeKVError(f"layer_windows must be None, a dict {{layer: window}} or a string like '0-9:512', got {spec!r}")
