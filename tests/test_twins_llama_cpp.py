"""Twins of the models users run (issue 43) against llama.cpp itself: the Qwen2.5-0.5B,
Llama-3.2-1B, Gemma-3-1B and Phi-3.5-mini twins (real shapes, vocabulary sizes and Q4_K_M
tensor types, random weights: edgekv/testing/twins.py), rebuilt here from the recipes in
tests/reference/twins.json (tools/make_twin_reference.py ran llama-cpp-python 0.3.36 on the
same bytes), must give llama.cpp's log-probs and greedy ids under the rules of
tests/reference (tests/helpers/llama_cpp_rules.py). Their K-quant and Q5_0/Q8_0 weights take
the exact path at real sizes: the row-group layout, the prefetching kernels, the tiled and
repacked orders that tiny models never reach."""

from __future__ import annotations

import hashlib
import json

import pytest

from conftest import REFERENCE_DIR
from edgekv.loader import load
from edgekv.testing.twins import make_twin
from helpers.llama_cpp_rules import assert_greedy_matches

DATA = json.loads((REFERENCE_DIR / "twins.json").read_text())
EXACT_TOL = 2e-5  # as test_families_llama_cpp: quantized weights give llama.cpp's bits


def _sha256(path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(DATA["twins"]))
def test_twin_logprobs_and_greedy_ids_match_llama_cpp(tmp_path, family):
    ref = DATA["twins"][family]
    recipe = ref["recipe"]
    path = make_twin(recipe["name"], recipe["file_type"], tmp_path / f"{recipe['name']}.gguf", recipe["seed"])
    try:
        assert _sha256(path) == ref["sha256"], (
            f"{family}: edgekv.testing.twins no longer writes the file llama.cpp was run on; regenerate "
            "tests/reference/twins.json (tools/make_twin_reference.py)")
        model = load(path)
        assert model.tokenizer.add_bos == ref["add_bos"]
        for case in ref["greedy"]:
            assert model.tokenizer.encode(case["prompt"], add_bos=ref["add_bos"]) == case["prompt_ids"]
            assert_greedy_matches(model, case, ref["n_ctx"], EXACT_TOL)
    finally:  # 0.4-2.4 GB each: pytest keeps the last three runs' folders
        path.unlink()


def test_every_family_has_a_twin():
    assert set(DATA["twins"]) == {"qwen2", "llama", "gemma3", "phi3"}
