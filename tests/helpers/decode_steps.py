"""Sessions stepped one token at a time with plain Session.eval: the references that batched
decode (test_batch_decode.py, test_cuda_backend.py) and CUDA-graph replays
(test_cuda_backend.py, test_cuda_memory.py) are compared against.

    solo_logits(sessions, tokens)  each session's logits after its own one-token pass,
                                   the session left as it was
    decode(model, tokens, **kw)    a new session fed the tokens one by one: (session, logits per step)
"""

from __future__ import annotations

import numpy as np


def solo_logits(sessions, tokens) -> list[np.ndarray]:
    out = []
    for s, t in zip(sessions, tokens):
        state = s.snapshot()
        s.eval([t])
        out.append(s.logits.copy())
        s.restore(state)
    return out


def decode(model, tokens, **session):
    s = model.session(**session)
    out = []
    for t in tokens:
        s.eval([int(t)])
        out.append(s.logits.copy())
    return s, np.array(out)
