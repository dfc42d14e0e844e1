"""The two real models against llama.cpp's own results (../shared/reference).

Comparison rules from the reference README: greedy ids must be equal, except that after
a step where llama.cpp's top-two log-probs differ by less than 0.05 a divergence is a
near-tie; top-32 log-probs should be close. These models are numerically sensitive:
one-ulp differences that flip an 8-bit activation rounding move log-probs by ~0.3, so
edgekv reproduces llama.cpp's roundings (q8 activations, f16 Q and softmax weights,
the RMS-norm and GELU arithmetic) rather than computing more precisely.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgekv.loader import load

MODELS = {"smollm2-135m-instruct-q4_1": "smollm2_path", "gemma3-270m-q4_k_m": "gemma3_path"}
NEAR_TIE = 0.05  # llama.cpp top-2 gap under which a divergence is not a bug (reference README)
CLEAR_MARGIN = 1.0  # teacher-forced: where llama.cpp's top-2 gap exceeds this, top-1 must agree
LOGPROB_MEAN_TOL = 0.15  # mean |Δ log-prob| over each step's top-32 ids
LOGPROB_MAX_TOL = 1.5

_loaded: dict = {}


def _model(request, key):
    if key not in _loaded:
        _loaded[key] = load(request.getfixturevalue(MODELS[key]))
    return _loaded[key]


def _log_softmax(logits):
    z = logits - logits.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _cases(reference):
    return [(key, i) for key in MODELS for i in range(len(reference["models"][key]["greedy"]))]


def pytest_generate_tests(metafunc):
    if "greedy_case" in metafunc.fixturenames:
        import json
        from conftest import REFERENCE_DIR

        ref = json.loads((REFERENCE_DIR / "llama_cpp_reference.json").read_text())
        metafunc.parametrize("greedy_case", _cases(ref), ids=lambda c: f"{c[0]}-{c[1]}")


def test_teacher_forced_logprobs_match_llama_cpp(request, reference, greedy_case):
    key, i = greedy_case
    case = reference["models"][key]["greedy"][i]
    model = _model(request, key)
    ids = case["prompt_ids"] + case["greedy_ids"][:-1]
    lp = _log_softmax(model.session(n_ctx=128).eval(ids, all_logits=True))
    # prompt_logprobs_top[p] is the distribution after prompt token p; the last one is
    # also steps_top[0], the distribution that chose greedy_ids[0]
    tops = case["prompt_logprobs_top"][:-1] + case["steps_top"]
    diffs, disagreements = [], []
    for pos, top in enumerate(tops[: len(ids)]):
        d = np.abs(lp[pos, top["ids"]] - np.array(top["logprobs"]))
        diffs.append(d)
        gap = top["logprobs"][0] - top["logprobs"][1]
        if gap > CLEAR_MARGIN and int(lp[pos].argmax()) != top["ids"][0]:
            disagreements.append((pos, gap))
    diffs = np.concatenate(diffs)
    assert not disagreements, f"top-1 differs from llama.cpp where it is clear: {disagreements}"
    assert diffs.mean() < LOGPROB_MEAN_TOL and diffs.max() < LOGPROB_MAX_TOL, (diffs.mean(), diffs.max())


def greedy(model, prompt_ids, n):
    s = model.session(n_ctx=128)
    s.eval(prompt_ids)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(s.logits)))
        s.eval(out[-1:])
    return out


def first_real_divergence(ours, case):
    """Index of the first step where ours differs and llama.cpp was not at a near-tie, else None."""
    for step, (a, b) in enumerate(zip(ours, case["greedy_ids"])):
        top = case["steps_top"][step]["logprobs"]
        if top[0] - top[1] < NEAR_TIE:
            return None  # from here on, llama.cpp itself could have gone either way
        if a != b:
            return step
    return None


# Cases whose free-running greedy continuation still leaves llama.cpp's path at a step
# where llama.cpp was not at a near-tie (measured; see the issue note). edgekv is not
# bit-identical to ggml (float summation order inside dot products differs), and these
# models amplify one-ulp differences; the teacher-forced test above bounds the error.
KNOWN_DIVERGENCES: dict[tuple[str, int], str] = {}


def test_greedy_continuation_matches_llama_cpp(request, reference, greedy_case):
    key, i = greedy_case
    if greedy_case in KNOWN_DIVERGENCES:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_DIVERGENCES[greedy_case], strict=True))
    case = reference["models"][key]["greedy"][i]
    ours = greedy(_model(request, key), case["prompt_ids"], len(case["greedy_ids"]))
    step = first_real_divergence(ours, case)
    assert step is None, f"diverged at step {step}: ours {ours[step]}, llama.cpp {case['greedy_ids'][step]}"


def test_smollm2_chat_greedy_matches_llama_cpp(request, reference):
    key = "smollm2-135m-instruct-q4_1"
    model = _model(request, key)
    for chat in reference["models"][key]["chat"]:
        ids = model.chat_formatter.encode(chat["messages"])
        assert ids == chat["prompt_ids"]
        ours = greedy(model, ids, len(chat["greedy_ids"]))
        assert first_real_divergence(ours, chat) is None
