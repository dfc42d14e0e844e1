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


def assert_greedy_matches(model, case: dict, n_ctx: int, tol: float) -> None:
    """One recorded greedy run (tools/make_reference.py greedy_run: a prompt, llama.cpp's
    greedy ids, its top log-probs at every position) against `model`: the prompt as one
    chunk, then llama.cpp's ids one at a time (teacher forcing); every recorded log-prob
    within tol, and each argmax llama.cpp's id unless its top two were a near-tie."""
    s = model.session(n_ctx=n_ctx)
    steps = [s.eval(case["prompt_ids"], all_logits=True)]
    steps += [s.eval([t], all_logits=True) for t in case["greedy_ids"][:-1]]
    lp = log_softmax(np.concatenate(steps))
    tops = case["prompt_logprobs_top"][:-1] + case["steps_top"]
    diffs = [np.abs(lp[pos, top["ids"]] - np.array(top["logprobs"])).max() for pos, top in enumerate(tops)]
    assert max(diffs) < tol, f"{case['prompt']!r} position {int(np.argmax(diffs))}: {max(diffs):.2e}"
    for step, want in enumerate(case["greedy_ids"]):
        ours = int(lp[len(case["prompt_ids"]) - 1 + step].argmax())
        top = case["steps_top"][step]["logprobs"]
        assert ours == want or top[0] - top[1] < NEAR_TIE, f"{case['prompt']!r} step {step}: {ours} != {want}"
