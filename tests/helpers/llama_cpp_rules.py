"""The rules for comparing edgekv with llama.cpp's recorded results (tests/reference/README.md),
shared by the real models' test (test_reference_models.py) and the tiny families'
(test_families_llama_cpp.py).
"""

from __future__ import annotations

import numpy as np

NEAR_TIE = 0.05  # llama.cpp top-2 gap under which a divergence is not a bug (reference README)
LOGPROB_TOL = 1e-3  # the reference stores log-probs rounded to 5 decimals


def log_softmax(logits):
    z = logits - logits.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))
