"""edgekv/testing/twins.py: twins of the models edge users run (0.5B-8B), for benchmarks/sizes.py.

Checked without writing the big ones: every twin's tensor directory has its model's shapes
(widths, layers, heads, vocabulary rows, tied output, Llama 3's rope_freqs, Phi-3's fused
matrices), the file type's tensor types as llama-quantize's rules give them (the sizes land
where the published files' do), and a tokenizer of the real size whose grown tokens are
reachable (each BPE merge's parts come before it). Written and run: the smallest (Qwen2.5-0.5B
Q4_K_M, 0.37 GiB) loads with edgekv's model-size hyperparameters, tokenizes, and decodes to
finite logits. That llama.cpp loads each twin and agrees with edgekv on its tokens and greedy
text is recorded in benchmarks/README.md (no llama.cpp in make test).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from edgekv.gguf.reader import GGUFFile
from edgekv.testing.twins import SHAPES, grown_vocab, make_twin, tensor_types, twin_header
from edgekv.text.tokenizer import Tokenizer

# the published Q4_K_M files' sizes in GiB, as Hugging Face lists Qwen's, bartowski's and unsloth's
# GGUFs (recalled, not fetched: no network here), which a twin's tensor data must land near
PUBLISHED_Q4_K_M = {"qwen2.5-0.5b": 0.37, "llama-3.2-1b": 0.75, "qwen2.5-1.5b": 0.92, "gemma-3-1b": 0.75,
                    "llama-3.2-3b": 1.88, "phi-3.5-mini": 2.23, "qwen2.5-7b": 4.36, "llama-3.1-8b": 4.58}


def _nbytes(shape, t) -> int:
    block, size = GGML_QUANT_SIZES[t]
    return math.prod(shape) // block * size


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_each_twin_has_its_models_shapes_and_the_file_types_tensor_types(name):
    hp = SHAPES[name]
    tensors = {n: (shape, t) for n, shape, t in tensor_types(name, "Q4_K_M")}
    assert tensors["token_embd.weight"][0] == (hp["dim"], hp["n_vocab"])
    assert ("output.weight" in tensors) == (not hp["tied"])
    assert sum(n.endswith("ffn_down.weight") for n in tensors) == hp["n_layers"]
    assert ("rope_freqs.weight" in tensors) == ("llama3_rope" in hp)
    q = hp["n_heads"] * hp["head_dim"]
    if hp["arch"] == "phi3":
        assert tensors["blk.0.attn_qkv.weight"][0] == (hp["dim"], q + 2 * hp["n_kv_heads"] * hp["head_dim"])
    else:
        assert tensors["blk.0.attn_q.weight"][0] == (hp["dim"], q)
    # Q4_K_M: attn_v and ffn_down in Q6_K in the first and last eighth and every third layer
    # between (where their rows are whole 256-blocks), the rest of the matrices Q4_K or its fallback
    down = [tensors[f"blk.{i}.ffn_down.weight"][1] for i in range(hp["n_layers"])]
    assert down[0] in (T.Q6_K, T.Q8_0) and T.Q4_K in down or hp["ff"] % 256
    assert all(t == T.F32 for n, (s, t) in tensors.items() if len(s) == 1)
    gib = sum(_nbytes(s, t) for s, t in tensors.values()) / 2**30
    assert abs(gib - PUBLISHED_Q4_K_M[name]) < 0.08 * PUBLISHED_Q4_K_M[name], gib


@pytest.mark.parametrize("arch, n_vocab", [("qwen2", 151936), ("llama", 128256), ("gemma3", 262144),
                                           ("phi3", 32064)])
def test_a_grown_vocabulary_has_the_real_size_and_every_token_is_reachable(arch, n_vocab):
    vocab = grown_vocab(arch, n_vocab)
    tokens = vocab["tokens"]
    assert len(tokens) == len(set(tokens)) == n_vocab == len(vocab["types"])
    if vocab["merges"] is not None:  # BPE: each merge joins two tokens that exist, into one that does
        index = {t: i for i, t in enumerate(tokens)}
        for merge in vocab["merges"][-1000:]:
            a, b = merge.split(" ")
            assert a in index and b in index and index[a + b] > max(index[a], index[b]) - 1
    else:
        assert len(vocab["scores"]) == n_vocab and vocab["scores"][-1] < vocab["scores"][-2]


def test_a_twin_header_reads_back_as_its_model(tmp_path):
    path = twin_header("llama-3.1-8b", "Q4_K_M", tmp_path / "8b.header")
    assert path.stat().st_size < 16 << 20  # metadata, a 128256-token vocabulary, the directory
    with open(path, "r+b") as f:
        f.truncate(8 << 30)  # sparse: where the data would be, for the reader to map
    g = GGUFFile(path)
    assert len(g.tensors) == 2 + 1 + 1 + 32 * 9 and "output.weight" in g.tensors
    assert g.get("llama.block_count") == 32 and g.tensors["rope_freqs.weight"].shape == (64,)
    want = {n: (shape, t) for n, shape, t in tensor_types("llama-3.1-8b", "Q4_K_M")}
    assert {n: (t.shape, t.ggml_type) for n, t in g.tensors.items()} == want


@pytest.mark.long
def test_the_smallest_twin_loads_tokenizes_and_decodes(tmp_path):
    from edgekv.loader import load

    path = make_twin("qwen2.5-0.5b", "Q4_K_M", tmp_path / "q.gguf")
    g = GGUFFile(path)
    assert abs(path.stat().st_size / 2**30 - PUBLISHED_Q4_K_M["qwen2.5-0.5b"]) < 0.03
    tok = Tokenizer.from_gguf(g.metadata)
    ids = tok.encode("Hello world, the ring holds keys")
    assert tok.decode(ids) == b"Hello world, the ring holds keys"
    model = load(path)
    hp = model.hp
    assert (hp.dim, hp.n_layers, hp.n_heads, hp.n_kv_heads, hp.ff, hp.n_vocab) == (896, 24, 14, 2, 4864, 151936)
    s = model.session(n_ctx=64)
    s.eval(ids)
    assert s.logits.shape == (151936,) and np.isfinite(s.logits).all()
