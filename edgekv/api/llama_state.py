"""A Llama's saved conversations: in-memory snapshots (`save_state` / `load_state`, as
llama-cpp-python) and state files (`save_state_file` / `load_state_file`).

What lives here: `LlamaState` and `StateMixin`, the part of `Llama` that saves and restores
its conversation. What does not: the snapshot of the session itself (session.py), the file
format (state_file.py), the rest of `Llama` (api/facade.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..errors import EdgeKVError
from ..session import SessionState
from ..state_file import save_session


@dataclass
class LlamaState:
    """An in-memory snapshot of a Llama's conversation (`save_state` / `load_state`)."""

    session: SessionState  # tokens, KV cache and last logits
    scores: np.ndarray | None  # f32[n_tokens, n_vocab] when logits_all

    @property
    def input_ids(self) -> np.ndarray:  # intc[n_tokens]
        return np.asarray(self.session.tokens, dtype=np.intc)

    @property
    def logits(self) -> np.ndarray | None:  # f32[n_vocab] after the last token, None before any evaluation
        return self.session.logits

    @property
    def n_ctx(self) -> int:
        return self.session.n_ctx


class StateMixin:
    """Llama's state methods; they use its `_session`, `_ctx`, `scores` and `_store_scores`."""

    def save_state(self) -> LlamaState:
        """A snapshot of the conversation: tokens, KV cache, logits (and scores)."""
        return LlamaState(session=self._session.snapshot(), scores=self.scores.copy() if self.logits_all else None)

    def load_state(self, state: LlamaState) -> None:
        """Return to a snapshot taken with save_state on a Llama with the same model and n_ctx
        (EdgeKVError otherwise, and the conversation stays as it was). With n_ctx="auto" the
        context takes the snapshot's size when it differs (within the cap)."""
        self._ctx.restore(state.session)
        if state.scores is not None and self.logits_all:
            self._store_scores(0, state.scores)

    def save_state_file(self, path: str | os.PathLike) -> None:
        """Write the conversation (live KV slots, tokens, last logits) to `path` atomically,
        with this model's fingerprint and a checksum (format: edgekv/state_file.py). With
        logits_all, the scores of earlier tokens are not saved."""
        save_session(self._session, self.model_fingerprint, path)

    def load_state_file(self, path: str | os.PathLike) -> None:
        """Return to a state saved with save_state_file by this model with the same n_ctx and
        cache types (with n_ctx="auto" the context takes the file's size, within the cap).
        A file from another model or geometry, or a damaged one, raises StateFileError
        naming the field, and the conversation stays as it was."""
        self._ctx.load_file(path, self.model_fingerprint)
        if self.logits_all and self.n_tokens:  # only the last row is known (when the state has logits)
            try:
                self._store_scores(self.n_tokens - 1, self._session.logits[None, :])
            except EdgeKVError:
                pass

    @property
    def model_fingerprint(self) -> str:
        """sha256 identifying the model file (state_file.model_fingerprint), computed once."""
        return self._model.fingerprint()
