"""Tests for edgekv/testing/tiny_model.py: the tiny GGUFs open with edgekv.gguf.reader.GGUFFile, carry the
requested metadata, tensors, types and tokenizer, and their weights dequantize to finite
values of the intended scale."""

from __future__ import annotations

import jinja2
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from edgekv.gguf.reader import GGUFFile

from edgekv.testing import tiny_model as mtm  # noqa: E402
from edgekv.testing import tiny_vocab  # noqa: E402
K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")  # 256-value blocks
K_DIMS = dict(dim=256, n_heads=4, n_kv_heads=2, head_dim=64, ff=512)  # every row a multiple of 256
# relative RMS error of a quantize -> dequantize round trip of normal(0, 1) rows
ROUND_TRIP_TOL = {"F32": 0.0, "F16": 1e-3, "BF16": 1e-2, "Q8_0": 0.01, "Q6_K": 0.03, "Q5_0": 0.05, "Q5_1": 0.05,
                  "Q5_K": 0.05, "Q4_0": 0.11, "Q4_1": 0.10, "Q4_K": 0.10, "IQ4_NL": 0.10, "IQ4_XS": 0.10,
                  "Q3_K": 0.20, "Q2_K": 0.36}


def as_f32(tensor) -> np.ndarray:
    """Dequantized values of a TensorInfo, shaped (ne1, ne0)."""
    qtype = GGMLQuantizationType(tensor.ggml_type)
    values = dequantize(tensor.data, qtype)
    return np.asarray(values, dtype=np.float32).reshape(tensor.shape[::-1])


def expected_tensors(arch: str, n_layers: int, dim: int, q_dim: int, kv_dim: int, ff: int, head_dim: int,
                     n_vocab: int, tied: bool) -> dict[str, tuple[int, ...]]:
    shapes = {"token_embd.weight": (dim, n_vocab), "output_norm.weight": (dim,)}
    if not tied:
        shapes["output.weight"] = (dim, n_vocab)
    for i in range(n_layers):
        layer = {"attn_norm": (dim,), "attn_q": (dim, q_dim), "attn_k": (dim, kv_dim), "attn_v": (dim, kv_dim),
                 "attn_output": (q_dim, dim), "ffn_norm": (dim,), "ffn_gate": (dim, ff), "ffn_up": (dim, ff),
                 "ffn_down": (ff, dim)}
        if arch == "gemma3":
            layer.update(attn_q_norm=(head_dim,), attn_k_norm=(head_dim,), post_attention_norm=(dim,),
                         post_ffw_norm=(dim,))
        shapes.update({f"blk.{i}.{name}.weight": shape for name, shape in layer.items()})
    return shapes


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("weight_type", mtm.WEIGHT_TYPES)
def test_every_weight_type_writes_a_valid_model(tmp_path, arch, weight_type):
    dims = K_DIMS if weight_type in K_TYPES else dict(dim=64, n_heads=4, n_kv_heads=2, head_dim=16, ff=128)
    path = mtm.make_tiny_model(tmp_path / "m.gguf", arch=arch, weight_type=weight_type, **dims)
    f = GGUFFile(path)
    n_layers = 2 if arch == "llama" else 7
    assert f.architecture == arch
    for key, value in [("block_count", n_layers), ("embedding_length", dims["dim"]), ("context_length", 256),
                       ("feed_forward_length", dims["ff"]), ("attention.head_count", dims["n_heads"]),
                       ("attention.head_count_kv", dims["n_kv_heads"])]:
        assert f.require(f"{arch}.{key}") == value, key
    n_vocab = len(f.require("tokenizer.ggml.tokens"))
    q_dim, kv_dim = dims["n_heads"] * dims["head_dim"], dims["n_kv_heads"] * dims["head_dim"]
    expected = expected_tensors(arch, n_layers, dims["dim"], q_dim, kv_dim, dims["ff"], dims["head_dim"],
                                n_vocab, tied=arch == "gemma3")
    assert {name: t.shape for name, t in f.tensors.items()} == expected
    for name, t in f.tensors.items():
        values = as_f32(t)
        assert np.isfinite(values).all(), name
        if len(t.shape) == 1:  # norms: F32, around 1
            assert t.ggml_type == GGMLQuantizationType.F32 and abs(values.mean() - 1) < 0.1, name
            continue
        assert GGMLQuantizationType(t.ggml_type).name == weight_type, name
        fan_in_std = 1.0 if (name == "token_embd.weight" and arch == "llama") else t.shape[0] ** -0.5
        if name == "token_embd.weight" and arch == "gemma3":
            fan_in_std = dims["dim"] ** -0.5
        assert 0.85 < values.std() / fan_in_std < 1.15, (name, values.std(), fan_in_std)


def test_llama_metadata_and_bpe_tokenizer(tmp_path):
    f = GGUFFile(mtm.make_tiny_model(tmp_path / "m.gguf"))
    assert f.require("llama.rope.freq_base") == pytest.approx(10000.0)
    assert f.require("llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    assert f.require("llama.rope.dimension_count") == 16
    tokens, types = f.require("tokenizer.ggml.tokens"), f.require("tokenizer.ggml.token_type")
    assert f.require("llama.vocab_size") == len(tokens) == len(types)
    assert (f.require("tokenizer.ggml.model"), f.require("tokenizer.ggml.pre")) == ("gpt2", "smollm")
    assert tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] and types[:3] == [3, 3, 3]
    assert (f.require("tokenizer.ggml.bos_token_id"), f.require("tokenizer.ggml.eos_token_id")) == (1, 2)
    assert tokens[3:3 + 256] == [c for _, c in tiny_vocab.gpt2_byte_chars()]
    assert tokens[3] == "!" and "Ġ" in tokens and "Ā" in tokens  # byte 0x20 is Ġ, 0x00 is Ā
    merges = f.require("tokenizer.ggml.merges")
    assert 24 <= len(merges) <= 64
    for merge in merges:  # every merge joins two tokens into a token
        left, right = merge.split(" ")
        assert left in tokens and right in tokens and left + right in tokens, merge
    assert "Ġthe" in tokens
    prompt = render(f, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert prompt == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_gemma3_metadata_and_spm_tokenizer(tmp_path):
    f = GGUFFile(mtm.make_tiny_model(tmp_path / "m.gguf", arch="gemma3"))
    assert f.require("gemma3.attention.sliding_window") == 8
    assert f.require("gemma3.attention.key_length") == f.require("gemma3.attention.value_length") == 16
    assert f.require("gemma3.rope.freq_base") == pytest.approx(1e6)
    assert f.require("gemma3.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6)
    tokens, types = f.require("tokenizer.ggml.tokens"), f.require("tokenizer.ggml.token_type")
    scores = f.require("tokenizer.ggml.scores")
    assert len(tokens) == len(types) == len(scores)
    assert (f.require("tokenizer.ggml.model"), f.require("tokenizer.ggml.pre")) == ("llama", "default")
    assert f.require("tokenizer.ggml.add_bos_token") is True
    ids = {t: i for i, t in enumerate(tokens)}
    for name in ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"):
        assert types[ids[name]] == 3, name
    assert types[ids["<unk>"]] == 2
    assert f.require("tokenizer.ggml.bos_token_id") == ids["<bos>"]
    assert f.require("tokenizer.ggml.eos_token_id") == ids["<eos>"]
    first_byte = ids["<0x00>"]
    assert tokens[first_byte:first_byte + 256] == [f"<0x{b:02X}>" for b in range(256)]
    assert set(types[first_byte:first_byte + 256]) == {6}
    assert types[ids["\n\n"]] == 4 and types[ids["  "]] == 4  # raw whitespace runs, as in Gemma 3
    assert types[ids["▁the"]] == 1 and scores[ids["▁the"]] > scores[ids["e"]]
    prompt = render(f, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "},
                        {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}])
    assert prompt == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                      "<start_of_turn>model\nHello<end_of_turn>\n"
                      "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")


def render(f: GGUFFile, messages: list[dict]) -> str:
    template = jinja2.Environment().from_string(f.require("tokenizer.chat_template"))
    bos = f.require("tokenizer.ggml.tokens")[f.require("tokenizer.ggml.bos_token_id")]
    return template.render(messages=messages, add_generation_prompt=True, bos_token=bos)


@pytest.mark.parametrize("weight_type", mtm.WEIGHT_TYPES)
def test_round_trip_error_of_each_type(weight_type):
    rows = np.random.default_rng(3).standard_normal((4, 512)).astype(np.float32)
    rows[1] *= 50.0  # large values: the f16 super-block scales must not overflow
    rows[2] = 0.0  # all-zero blocks decode to exact zeros, not NaN
    data, raw_dtype = mtm.encode(rows, weight_type)
    qtype = raw_dtype or GGMLQuantizationType[weight_type]
    back = np.asarray(dequantize(data, qtype), dtype=np.float32).reshape(rows.shape)
    assert np.isfinite(back).all() and (back[2] == 0).all()
    for i in (0, 1, 3):
        rel = np.sqrt(np.mean((back[i] - rows[i]) ** 2)) / rows[i].std()
        assert rel <= ROUND_TRIP_TOL[weight_type] + 1e-6, (i, rel)


def test_k_types_fall_back_per_tensor_like_llama_cpp(tmp_path):
    f = GGUFFile(mtm.make_tiny_model(tmp_path / "m.gguf", weight_type="Q6_K", dim=64, ff=256))
    type_of = {name: GGMLQuantizationType(t.ggml_type).name for name, t in f.tensors.items()}
    assert type_of["blk.0.attn_q.weight"] == "Q8_0"  # rows of 64
    assert type_of["blk.0.ffn_down.weight"] == "Q6_K"  # rows of 256
    assert f.require("general.file_type") == 18  # MOSTLY_Q6_K


def test_overrides_and_determinism(tmp_path):
    a = mtm.make_tiny_model(tmp_path / "a.gguf", tied=True, rope_theta=5e5, embd_type="Q8_0", n_layers=3,
                            metadata={"general.name": "custom", "llama.expert_count": 0})
    f = GGUFFile(a)
    assert "output.weight" not in f.tensors and f.require("llama.block_count") == 3
    assert f.require("llama.rope.freq_base") == pytest.approx(5e5)
    assert GGMLQuantizationType(f.tensor("token_embd.weight").ggml_type).name == "Q8_0"
    assert f.require("llama.expert_count") == 0
    b = mtm.make_tiny_model(tmp_path / "b.gguf", tied=True, rope_theta=5e5, embd_type="Q8_0", n_layers=3,
                            metadata={"general.name": "custom", "llama.expert_count": 0})
    c = mtm.make_tiny_model(tmp_path / "c.gguf", seed=1)
    d = mtm.make_tiny_model(tmp_path / "d.gguf", seed=0)
    assert a.read_bytes() == b.read_bytes()
    assert c.read_bytes() != d.read_bytes() and c.stat().st_size == d.stat().st_size


def test_bad_arguments_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="dim=48 must be a multiple of 32"):
        mtm.make_tiny_model(tmp_path / "m.gguf", weight_type="Q4_0", dim=48, n_heads=4, head_dim=8)
    with pytest.raises(ValueError, match="arch 'mamba'"):
        mtm.make_tiny_model(tmp_path / "m.gguf", arch="mamba")
    with pytest.raises(ValueError, match="not a multiple of n_kv_heads"):
        mtm.make_tiny_model(tmp_path / "m.gguf", n_heads=4, n_kv_heads=3)
    with pytest.raises(TypeError, match="unknown overrides"):
        mtm.make_tiny_model(tmp_path / "m.gguf", n_expert=4)


def test_command_line(tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    assert mtm.main([str(out), "--arch", "gemma3", "--type", "Q8_0", "--layers", "6", "--sliding-window", "4"]) == 0
    assert "wrote" in capsys.readouterr().out
    f = GGUFFile(out)
    assert f.require("gemma3.block_count") == 6 and f.require("gemma3.attention.sliding_window") == 4
    assert GGMLQuantizationType(f.tensor("blk.0.attn_q.weight").ggml_type).name == "Q8_0"
