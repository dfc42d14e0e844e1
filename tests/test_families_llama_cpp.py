"""The model families against llama.cpp itself: a tiny random GGUF of each (qwen2, qwen3,
phi3, Mistral-style llama, YaRN, LongRoPE, linear scaling), rebuilt here from the recipe
in tests/reference/tiny_families.json (tools/make_family_reference.py made it with
llama-cpp-python 0.3.36), must tokenize as llama.cpp did and give its log-probs and greedy
ids. The comparison rules are the real models' (test_reference_models.py, tests/helpers/llama_cpp_rules.py)."""

from __future__ import annotations

import hashlib
import json

import pytest

from conftest import REFERENCE_DIR
from edgekv.loader import load
from helpers.llama_cpp_rules import LOGPROB_TOL, assert_greedy_matches

DATA = json.loads((REFERENCE_DIR / "tiny_families.json").read_text())
FAMILIES = sorted(DATA["families"])
EXACT_TOL = 2e-5
_models: dict = {}


def _model(tiny_model, name: str):
    """The family's tiny model, rebuilt from its recipe: the very bytes llama.cpp read."""
    if name not in _models:
        ref = DATA["families"][name]
        path = tiny_model(**ref["recipe"])
        assert hashlib.sha256(path.read_bytes()).hexdigest() == ref["sha256"], (
            f"{name}: edgekv.testing.tiny_model no longer writes the file llama.cpp was run on; "
            "regenerate tests/reference/tiny_families.json (tools/make_family_reference.py)")
        _models[name] = load(path)
    return _models[name]


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenization_matches_llama_cpp(tiny_model, family):
    model, ref = _model(tiny_model, family), DATA["families"][family]
    assert model.tokenizer.add_bos == ref["add_bos"]
    for case in ref["tokenize"]:
        assert model.tokenizer.encode(case["text"], add_bos=False, special=True) == case["ids"], case["text"]


@pytest.mark.parametrize("family", FAMILIES)
def test_logprobs_and_greedy_ids_match_llama_cpp(tiny_model, family):
    model, ref = _model(tiny_model, family), DATA["families"][family]
    # quantized weights take the exact path: llama.cpp's bits, so its log-probs to the
    # file's 5 decimals (measured <= 8.7e-6); float weights within float32 rounding
    # (backends/kernel_map.py; measured 5.3e-4)
    tol = LOGPROB_TOL if ref["recipe"]["weight_type"] in ("F32", "F16", "BF16") else EXACT_TOL
    for case in ref["greedy"]:
        assert_greedy_matches(model, case, ref["n_ctx"], tol)


def test_every_family_is_covered():
    archs = {ref["recipe"]["arch"] for ref in DATA["families"].values()}
    assert archs >= {"qwen2", "qwen3", "phi3", "mistral", "llama"}
