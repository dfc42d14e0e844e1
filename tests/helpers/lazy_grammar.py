"""Feeding a text to a lazy grammar's constraint token by token, as generation would."""

from __future__ import annotations

import numpy as np


def feed(constraint, tokenizer, text: str) -> bool:
    """Whether every token of `text` is allowed by `constraint` (a LazyConstraint) in turn;
    while it is not triggered, no token may be masked. Ends with the mask after the text."""
    history = [1, 2]
    for token in tokenizer.encode(text, add_bos=False):
        logits = np.zeros(tokenizer.n_vocab, np.float32)
        constraint.apply(logits, history)
        if constraint.inner is None:
            assert np.isfinite(logits).all()  # free text: no mask
        if not np.isfinite(logits[token]):
            return False
        history.append(token)
    constraint.apply(np.zeros(tokenizer.n_vocab, np.float32), history)
    return True
