"""Speculative decoding: tokens guessed cheaply, checked by the model in one pass, the same text faster.

    llm = Llama("smollm2-135m-instruct", draft_model=PromptLookupDecoding(num_pred_tokens=10))
    llm = Llama("target.gguf", draft_model=DraftModel("small.gguf", n_draft=8))

`drafters.py` (who guesses: `PromptLookup`, `DraftModel`, or llama-cpp-python's own
LlamaDraftModel objects), `draft_length.py` (how many to guess, from measured acceptance
and costs), `verify.py` (the generation loop and its sampling rule). The cache side, a verify
pass whose rejected rows leave no trace, is kv/drafts.py with Session.verify / settle.
"""

from __future__ import annotations

from typing import Any

from .draft_length import DraftLength
from .drafters import DraftModel, PromptLookup, check_same_vocabulary, draft_tokens
from .verify import DraftCounts, speculative_step

PromptLookupDecoding = PromptLookup  # llama-cpp-python's name (LlamaPromptLookupDecoding)
DEFAULT_N_MAX = 16

__all__ = ["DraftCounts", "DraftLength", "DraftModel", "PromptLookup", "PromptLookupDecoding", "Speculation",
           "as_speculation", "check_same_vocabulary", "draft_tokens", "speculative_step"]


class Speculation:
    """A drafter for one conversation, with its draft-length policy and its counts.

    drafter: PromptLookup, DraftModel or any llama-cpp-python LlamaDraftModel (a callable
    ids -> draft ids); n_max: the most tokens drafted at once (default: the drafter's own
    num_pred_tokens / n_draft, else 16); n_min: fewer drafted tokens are not verified;
    adaptive: choose the length from measured acceptance and costs (draft_length.py), else
    always draft n_max (llama.cpp's behaviour)."""

    def __init__(self, drafter: Any, n_max: int | None = None, n_min: int = 0, adaptive: bool = True):
        self.drafter = drafter
        own = getattr(drafter, "num_pred_tokens", None) or getattr(drafter, "n_draft", None)
        self.n_max = int(n_max or own or DEFAULT_N_MAX)
        self.n_min, self.adaptive = n_min, adaptive
        # a context match is right more often than a small model's guess (the prior only
        # decides the first passes: measured acceptance takes over)
        self.length = DraftLength(self.n_max, n_min, prior=0.8 if isinstance(drafter, PromptLookup) else 0.7,
                                  adaptive=adaptive)
        self.counts = DraftCounts()

    def bind(self, target) -> "Speculation":
        """Check the drafter against the target model (a draft model's vocabulary); self."""
        if isinstance(self.drafter, DraftModel):
            self.drafter.check_vocabulary(target)
        return self

    def fork(self) -> "Speculation":
        """The same drafter for another conversation (a draft model's own session apart)."""
        drafter = self.drafter.fork() if isinstance(self.drafter, DraftModel) else self.drafter
        return Speculation(drafter, self.n_max, self.n_min, self.adaptive)

    def describe(self) -> str:
        describe = getattr(self.drafter, "describe", None)
        return describe() if describe is not None else type(self.drafter).__name__


def as_speculation(draft: Any, target) -> Speculation | None:
    """A Speculation from what a caller gave (None; a Speculation; a drafter; a loaded draft
    Model, as `load(..., draft=...)` keeps it), checked against the target Model."""
    if draft is None or isinstance(draft, Speculation):
        return draft
    if hasattr(draft, "network") and hasattr(draft, "session"):  # an edgekv Model
        draft = DraftModel(draft)
    return Speculation(draft).bind(target)
