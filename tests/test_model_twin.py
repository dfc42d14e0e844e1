"""tools/model_twin.py: a model's header carried where the model cannot go, and a twin made
from it with random weights (tools/gpu_check.sh times the twins on a GPU machine that
cannot fetch the real models). Checked: the header is small enough to carry, the twin has
its model's header byte for byte and so its tensor directory, and its weights are
finite, centred and within the promised spread, read back by gguf.quants (not by
edgekv's own dequantizers)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from conftest import load_tool
from edgekv.gguf.reader import GGUFFile
from edgekv.loader import load
from edgekv.gguf.quants import non_finite_tensors

twin = load_tool("model_twin")
CARRY = 64 << 20  # what one call to a lent GPU machine takes along, wheels included


def make_twin(src, tmp_path, name="m"):
    header, out = tmp_path / f"{name}.header", tmp_path / f"{name}.twin.gguf"
    n = twin.write_header(src, header)
    assert twin.main(["twin", str(header), str(out)]) == 0
    return n, out


@pytest.mark.slow
def test_the_real_models_travel_as_headers_and_come_back_as_twins(smollm2_path, gemma3_path, tmp_path):
    sizes = []
    for name, src in (("smollm2", smollm2_path), ("gemma3", gemma3_path)):
        n, out = make_twin(src, tmp_path, name)
        sizes.append(n)
        real, copy = GGUFFile(src), GGUFFile(out)
        assert out.stat().st_size == src.stat().st_size
        assert out.read_bytes()[:n] == src.read_bytes()[:n]  # metadata, tokenizer, directory
        assert [(t.name, t.shape, t.ggml_type) for t in copy.tensors.values()] == \
               [(t.name, t.shape, t.ggml_type) for t in real.tensors.values()]
        assert not np.array_equal(copy.tensors["token_embd.weight"].data, real.tensors["token_embd.weight"].data)
        assert non_finite_tensors(copy) == {}
    assert sum(sizes) < CARRY // 4 < min(smollm2_path.stat().st_size, gemma3_path.stat().st_size) / 1.4


@pytest.mark.parametrize("weight_type", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
                                         "F16", "BF16"])
def test_twin_weights_are_centred_and_within_the_spread(tiny_model, tmp_path, weight_type):
    src = tiny_model("llama", weight_type, dim=256, ff=512, n_heads=4, n_kv_heads=2, head_dim=64)
    _, out = make_twin(src, tmp_path)
    g = GGUFFile(out)
    matrices = [t for t in g.tensors.values() if len(t.shape) == 2 and t.ggml_type == T[weight_type]]
    assert matrices
    for t in matrices:
        x = dequantize(t.data, T(t.ggml_type)).astype(np.float64) if t.ggml_type != T.F16 else \
            t.data.view(np.float16).astype(np.float64)
        assert np.isfinite(x).all()
        limit = 0.11 if weight_type not in ("F16", "BF16") else 0.2  # floats: N(0, 0.02)
        assert np.abs(x).max() <= limit and x.std() > 0.005, (t.name, np.abs(x).max(), x.std())
        assert abs(x.mean()) < 0.15 * x.std(), (t.name, x.mean(), x.std())  # Q4_0: codes -8..7, mean -d/2
    norms = [t for t in g.tensors.values() if len(t.shape) == 1]
    assert norms and all((t.data.view(np.float32) == 1).all() for t in norms)


def test_a_twin_runs_with_finite_logits(tiny_model, tmp_path):
    _, out = make_twin(tiny_model("gemma3", "Q4_K", dim=256, ff=512, n_heads=4, n_kv_heads=1, head_dim=256), tmp_path)
    s = load(out, backend="cpu").session(n_ctx=64, n_batch=8)
    logits = s.eval([1, 2, 3, 4, 5], all_logits=True)
    assert np.isfinite(logits).all() and logits.std() > 0


def test_a_type_without_random_weights_says_which_it_has(tmp_path):
    with pytest.raises(ValueError, match="no random weights for IQ2_XXS tensors"):
        twin.random_weights(T.IQ2_XXS, 256, 2, np.random.default_rng(0))
