"""`edgekv convert` against llama.cpp's convert_hf_to_gguf.py, and `--to-hf` round trips.

The oracle is tests/reference/convert/<checkpoint>.json (tools/make_convert_reference.py):
llama.cpp's converter (llama-cpp-python 0.3.36's tree, torch + transformers) run on the two
catalog models made into Hugging Face folders by `--to-hf`, and on tiny random llama (f32,
llama3 rope scaling), qwen2 (bf16, two shards + index, q/k/v biases) and qwen3 (f16, q/k
norms) checkpoints (tests/hf_checkpoints.py). Here the same folders are made again, checked to
be the inputs llama.cpp read, converted by edgekv, and the outputs compared whole, then key by
key and tensor by tensor for the message. The round trip GGUF -> HF -> GGUF is checked
against llama-quantize's own F32 dequantization of each catalog file and llama.cpp's
tokenizer ids.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from conftest import REFERENCE_DIR, load_tool
from hf_checkpoints import TINY, real_checkpoint, tiny_checkpoint

from edgekv.cli import main
from edgekv.errors import ConvertError
from edgekv.gguf.reader import GGUFFile
from edgekv.hf.convert import convert

REAL = ("smollm2-135m-instruct", "gemma3-270m")
CASES = [(name, outtype) for name in (*REAL, *TINY)
         for outtype in json.loads((REFERENCE_DIR / "convert" / f"{name}.json").read_text())["outputs"]]


def reference(name: str) -> dict:
    return json.loads((REFERENCE_DIR / "convert" / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, smollm2_path, gemma3_path):
    """checkpoint(name) -> the Hugging Face folder the reference was made from."""
    root = tmp_path_factory.mktemp("hf")
    paths = {"smollm2-135m-instruct": smollm2_path, "gemma3-270m": gemma3_path}

    def make(name: str) -> Path:
        if name in paths:
            return real_checkpoint(paths[name], root / name)
        return tiny_checkpoint(name, make("smollm2-135m-instruct"), root / name)

    return make


def describe(path: Path) -> dict:
    return load_tool("make_convert_reference").describe(path)


@pytest.mark.slow
@pytest.mark.parametrize("name", (*REAL, *TINY))
def test_checkpoint_is_what_llama_cpp_read(checkpoint, name):
    # --to-hf (and the tiny checkpoints' recipe) must still make the files the reference saw
    folder = checkpoint(name)
    assert load_tool("make_convert_reference").inputs(folder) == reference(name)["inputs"]


@pytest.mark.slow
@pytest.mark.parametrize("name,outtype", CASES)
def test_convert_writes_llama_cpp_file(checkpoint, tmp_path, name, outtype):
    out = tmp_path / "out.gguf"
    convert(str(checkpoint(name)), str(out), outtype)
    ref, got = reference(name)["outputs"][outtype], describe(out)
    if got["file_sha256"] != ref["file_sha256"]:  # say what differs
        assert list(got["kv"]) == list(ref["kv"]), "metadata keys or their order differ"
        assert {k for k in ref["kv"] if got["kv"][k] != ref["kv"][k]} == set(), "metadata values differ"
        assert list(got["tensors"]) == list(ref["tensors"]), "tensor names or order differ"
        assert {n for n in ref["tensors"] if got["tensors"][n] != ref["tensors"][n]} == set(), "tensors differ"
    assert got["file_sha256"] == ref["file_sha256"] and got["bytes"] == ref["bytes"]
    assert [p.name for p in tmp_path.iterdir()] == ["out.gguf"]  # no temporary file left


@pytest.mark.slow
@pytest.mark.parametrize("model", REAL)
def test_round_trip_keeps_every_weight(checkpoint, tmp_path, model):
    # GGUF -> --to-hf -> convert f32: each tensor is llama-quantize's F32 dequantization of the
    # catalog file, bit for bit (Llama's Q/K permutation and Gemma's +1 undone and redone)
    out = tmp_path / "rt.gguf"
    convert(str(checkpoint(model)), str(out), "f32")
    llama = json.loads((REFERENCE_DIR / "quantize" / f"{model}.json").read_text())["sources"]["F32"]["tensors"]
    got = {n: v[2] for n, v in describe(out)["tensors"].items()}
    assert got.keys() == llama.keys()
    assert {n for n in llama if got[n] != llama[n]} == set()


# what a round trip adds: keys llama.cpp's converter now writes from transformers' defaults
# (head_dim, gemma3's local rope base) or from a ByteLevel post-processor (no EOS), that
# the catalog files, made by an older converter, lack; each has the value the runtime
# assumed without it
ROUND_TRIP_EXTRA = {"smollm2-135m-instruct": {"llama.attention.key_length": 64, "llama.attention.value_length": 64,
                                              "tokenizer.ggml.add_eos_token": False},
                    "gemma3-270m": {"gemma3.rope.freq_base_swa": 10000.0}}


def same_value(a, b) -> bool:
    import numpy as np

    return bool(np.array_equal(a, b)) if isinstance(a, (list, np.ndarray)) else a == b


@pytest.mark.slow
@pytest.mark.parametrize("model", REAL)
def test_round_trip_keeps_the_metadata_and_tokenizes_as_llama_cpp(checkpoint, reference, tmp_path, smollm2_path,
                                                                   gemma3_path, model):
    from edgekv.text.tokenizer import Tokenizer

    out = tmp_path / "rt.gguf"
    convert(str(checkpoint(model)), str(out), "f32")
    got = GGUFFile(out).metadata
    original = GGUFFile({"smollm2-135m-instruct": smollm2_path, "gemma3-270m": gemma3_path}[model]).metadata
    assert {k for k in original if k != "general.file_type" and not same_value(original[k], got.get(k))} == set()
    extra = {k: got[k] for k in got if k not in original}
    assert extra.keys() == ROUND_TRIP_EXTRA[model].keys()
    assert all(same_value(extra[k], v) for k, v in ROUND_TRIP_EXTRA[model].items()), extra
    tok = Tokenizer.from_gguf(got)
    key = {"smollm2-135m-instruct": "smollm2-135m-instruct-q4_1", "gemma3-270m": "gemma3-270m-q4_k_m"}[model]
    for case in reference["models"][key]["tokenize"]:
        assert tok.encode(case["text"], add_bos=False, special=False) == case["ids_no_special"], case["text"]
        assert tok.encode(case["text"], add_bos=False, special=True) == case["ids_parse_special"], case["text"]


@pytest.mark.slow
def test_round_trip_requantized_is_the_catalog_file(checkpoint, tmp_path, smollm2_path):
    # SmolLM2 -> HF -> f32 GGUF -> `edgekv quantize Q4_1` gives back the catalog file's tensors,
    # every byte (Q4_1 of its own dequantization is itself), so it answers as the original.
    # (gemma3's Q4_K search does not return its own input for 31 of 236 tensors; its round
    # trip is checked through the F32 weights above.)
    from edgekv import Llama

    convert(str(checkpoint("smollm2-135m-instruct")), str(tmp_path / "rt.gguf"), "f32")
    assert main(["quantize", str(tmp_path / "rt.gguf"), str(tmp_path / "q.gguf"), "Q4_1"]) == 0
    a, b = GGUFFile(smollm2_path), GGUFFile(tmp_path / "q.gguf")
    assert sorted(a.tensors) == sorted(b.tensors)
    assert [n for n in a.tensors if (a.tensors[n].ggml_type, bytes(a.tensors[n].data))
            != (b.tensors[n].ggml_type, bytes(b.tensors[n].data))] == []
    texts = [Llama(str(p), n_ctx=64, verbose=False)("Once upon a time", max_tokens=16, temperature=0.0)
             ["choices"][0]["text"] for p in (tmp_path / "q.gguf", smollm2_path)]
    assert texts[0] == texts[1], texts


@pytest.mark.slow
def test_hf_tokenizer_json_encodes_as_the_gguf(checkpoint, reference):
    # the tokenizer.json --to-hf writes, run by Hugging Face's own tokenizers library, gives
    # llama.cpp's ids for SmolLM2 (the SentencePiece tokenizer.model is read back by the
    # round trip above)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(checkpoint("smollm2-135m-instruct") / "tokenizer.json"))
    for case in reference["models"]["smollm2-135m-instruct-q4_1"]["tokenize"]:
        assert tok.encode(case["text"], add_special_tokens=False).ids == case["ids_parse_special"], case["text"]


@pytest.mark.slow
def test_quantized_outtype_is_convert_then_quantize(checkpoint, tmp_path):
    # --outtype Q4_K_M converts losslessly, then quantizes: the file equals `edgekv quantize`
    # of an f32 conversion, and no intermediate file is left
    folder = checkpoint("tiny-qwen3")
    convert(str(folder), str(tmp_path / "a.gguf"), "Q4_K_M")
    convert(str(folder), str(tmp_path / "f32.gguf"), "f32")
    assert main(["quantize", str(tmp_path / "f32.gguf"), str(tmp_path / "b.gguf"), "Q4_K_M"]) == 0
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.gguf", "f32.gguf"]


# -- the pre-tokenizer name, when llama.cpp's hash table does not know the vocabulary --------


def with_pre_tokenizer(src: Path, dst: Path, pre_tokenizer: dict) -> Path:
    shutil.copytree(src, dst)
    tj = json.loads((dst / "tokenizer.json").read_text())
    tj["pre_tokenizer"] = pre_tokenizer
    (dst / "tokenizer.json").write_text(json.dumps(tj))
    return dst


QWEN2_SPLIT = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                                           "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}


@pytest.mark.slow
def test_unknown_vocabulary_is_named_by_its_pre_tokenizer(checkpoint, tmp_path, caplog):
    from edgekv.hf.tokenizer_files import pre_tokenizer_json

    # edgekv's own spelling of qwen2's regexes, on the SmolLM2 vocabulary: no hash matches
    folder = with_pre_tokenizer(checkpoint("tiny-qwen2"), tmp_path / "ck", pre_tokenizer_json("qwen2"))
    with caplog.at_level(logging.WARNING, logger="edgekv"):
        convert(str(folder), str(tmp_path / "o.gguf"), "f16")
    assert GGUFFile(tmp_path / "o.gguf").get("tokenizer.ggml.pre") == "qwen2"
    assert "not in llama.cpp's hash table" in caplog.text


@pytest.mark.slow
def test_unrecognised_pre_tokenizer_asks_for_pre(checkpoint, tmp_path, capsys):
    odd = {"type": "Split", "pattern": {"Regex": "[a-z]+"}, "behavior": "Isolated", "invert": False}
    folder = with_pre_tokenizer(checkpoint("tiny-qwen2"), tmp_path / "ck", odd)
    assert main(["convert", str(folder), "-o", str(tmp_path / "o.gguf")]) == 1
    err = capsys.readouterr().err
    assert "--pre NAME" in err and "qwen2" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o.gguf").exists()
    assert main(["convert", str(folder), "-o", str(tmp_path / "o.gguf"), "--pre", "gpt-2"]) == 0
    assert GGUFFile(tmp_path / "o.gguf").get("tokenizer.ggml.pre") == "gpt-2"


# -- errors: one line, nothing written ------------------------------------------------------


def run_cli(capsys, *argv) -> tuple[int, str]:
    rc = main(["convert", *map(str, argv)])
    return rc, capsys.readouterr().err


def copy_of(checkpoint, name: str, dst: Path) -> Path:
    shutil.copytree(checkpoint(name), dst)
    return dst


def test_missing_folder_and_config(tmp_path, capsys):
    rc, err = run_cli(capsys, tmp_path / "nowhere", "-o", tmp_path / "o.gguf")
    assert rc == 1 and "no such directory" in err
    (tmp_path / "empty").mkdir()
    rc, err = run_cli(capsys, tmp_path / "empty", "-o", tmp_path / "o.gguf")
    assert rc == 1 and "no config.json" in err
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.slow
def test_unknown_architecture_names_what_is_known(checkpoint, tmp_path, capsys):
    folder = copy_of(checkpoint, "tiny-llama", tmp_path / "ck")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, architectures=["MambaForCausalLM"])))
    rc, err = run_cli(capsys, folder, "-o", tmp_path / "o.gguf")
    assert rc == 1 and "MambaForCausalLM" in err and "Qwen2ForCausalLM" in err


@pytest.mark.slow
def test_truncated_weights_and_missing_shard(checkpoint, tmp_path, capsys):
    folder = copy_of(checkpoint, "tiny-llama", tmp_path / "ck")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:len(data) // 2])
    rc, err = run_cli(capsys, folder, "-o", tmp_path / "o.gguf")
    assert rc == 1 and "truncated or corrupt" in err
    sharded = copy_of(checkpoint, "tiny-qwen2", tmp_path / "sh")
    (sharded / "model-00002-of-00002.safetensors").unlink()
    rc, err = run_cli(capsys, sharded, "-o", tmp_path / "o.gguf")
    assert rc == 1 and "model-00002-of-00002.safetensors" in err
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.slow
def test_bad_outtype_and_busy_to_hf_folder(checkpoint, smollm2_path, tmp_path, capsys):
    rc, err = run_cli(capsys, checkpoint("tiny-llama"), "-o", tmp_path / "o.gguf", "--outtype", "iq2_xxs")
    assert rc == 1 and "iq2_xxs" in err and "Q4_K_M" in err
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("mine")
    rc, err = run_cli(capsys, smollm2_path, "--to-hf", tmp_path / "busy")
    assert rc == 1 and "not an empty folder" in err
    assert [p.name for p in (tmp_path / "busy").iterdir()] == ["x"]


def test_to_hf_refuses_an_unknown_architecture(tiny_model, tmp_path):
    with pytest.raises(ConvertError, match="--to-hf knows"):
        from edgekv.hf.to_hf import to_hf

        to_hf(str(tiny_model(arch="phi3")), str(tmp_path / "hf"))
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_merges_in_either_tokenizer_json_format(checkpoint, tmp_path):
    # older tokenizer.json files list merges as "a b" strings, newer ones as [a, b] pairs
    folder = copy_of(checkpoint, "tiny-llama", tmp_path / "ck")
    tj = json.loads((folder / "tokenizer.json").read_text())
    assert isinstance(tj["model"]["merges"][0], list)
    tj["model"]["merges"] = [" ".join(pair) for pair in tj["model"]["merges"]]
    (folder / "tokenizer.json").write_text(json.dumps(tj))
    convert(str(folder), str(tmp_path / "strings.gguf"), "f16")
    convert(str(checkpoint("tiny-llama")), str(tmp_path / "pairs.gguf"), "f16")
    a, b = GGUFFile(tmp_path / "strings.gguf"), GGUFFile(tmp_path / "pairs.gguf")
    assert a.raw_kv("tokenizer.ggml.merges") == b.raw_kv("tokenizer.ggml.merges")  # (general.name: the folder's)
