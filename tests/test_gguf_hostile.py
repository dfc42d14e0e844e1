"""Hostile GGUF files: each malformed kind llama.cpp's test-gguf knows, handcrafted
(tests/gguf_craft.py), must raise a GGUFError naming the problem before anything is
allocated from it; and the regressions the mutation fuzzer found (test_gguf_fuzz.py)."""

from __future__ import annotations

import struct

import pytest

from edgekv.errors import GGUFError
from edgekv.gguf.reader import GGUFFile
from gguf_craft import ARRAY, FLOAT32, STRING, craft, string
from helpers.hostile_gguf import ARCH, CASES, DATA, ONE


def _open(tmp_path, blob: bytes) -> GGUFFile:
    path = tmp_path / "bad.gguf"
    path.write_bytes(blob)
    return GGUFFile(path)


def test_the_crafted_base_file_is_valid(tmp_path):
    g = _open(tmp_path, craft([ARCH], [ONE], DATA))
    assert g.architecture == "llama" and g.tensors["w"].data.nbytes == 128


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_file_is_refused_by_name(tmp_path, case):
    fields, message = CASES[case]
    spec = {"tensors": [ONE], "data": DATA, **fields}
    spec["kvs"] = [ARCH] + fields.get("kvs", [])  # every file names its architecture first
    with pytest.raises(GGUFError, match=message):
        _open(tmp_path, craft(**spec))


def test_truncation_at_every_byte_of_a_small_file(tmp_path):
    blob = craft([ARCH, ("tokenizer.ggml.tokens", ARRAY, (STRING, ["a", "b", "c"])),
                  ("x.scores", ARRAY, (FLOAT32, [0.5, 1.5]))], [ONE, ("v", [8], 0, 128)], DATA + b"\1" * 32)
    assert _open(tmp_path, blob).tensors["v"].data.nbytes == 32
    for cut in range(len(blob)):
        with pytest.raises(GGUFError):
            _open(tmp_path, blob[:cut])


def test_truncation_of_a_tiny_model(tmp_path):
    """The tiny model the fuzzer mutates, cut at every byte of its header, metadata and tensor
    directory and at every 101st byte of its tensor data: always a GGUFError (no cut leaves
    a loadable file: the last tensor ends at the end). Every byte of the data too:
    `tools/fuzz_gguf.py --truncate`, 38,144 cuts in 62 s."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("fuzz_gguf", Path(__file__).parents[1] / "tools" / "fuzz_gguf.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    blob = tool.tiny_blob("llama", tmp_path)
    start = tool.data_offset(blob, tmp_path / "whole.gguf")
    assert tool.truncations(blob, tmp_path, list(range(start)) + list(range(start, len(blob), 101))) == []


def test_block_count_is_checked_against_the_tensors_before_anything_is_sized(tiny_model, tmp_path):
    # the fuzzer's find: block_count 2 -> 1073741826 grew the process to 8.3 GB before failing
    import resource

    from edgekv.loader import load

    blob = bytearray(tiny_model("llama").read_bytes())
    key = b"llama.block_count"
    at = blob.index(string(key.decode())) + 8 + len(key) + 4  # past the key and its value type
    assert struct.unpack_from("<I", blob, at)[0] == 2
    struct.pack_into("<I", blob, at, 1073741826)
    path = tmp_path / "many-blocks.gguf"
    path.write_bytes(bytes(blob))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(GGUFError, match=r"'llama.block_count' = 1073741826, but the file has tensors for 2 blocks"):
        load(path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: nothing sized from it


@pytest.mark.parametrize("metadata,message", [
    # a kernel indexes by these without a tensor shape to check them against. Mutant 2419 of
    # seed 2 (tools/fuzz_gguf.py) set rope.dimension_count to 62480: RoPE wrote past the
    # activations and the process died in the garbage collector (SIGSEGV) a few loads later
    ({"llama.rope.dimension_count": 62480}, "dimension_count = 62480 must be even and at most the head size 16"),
    ({"llama.rope.dimension_count": 15}, "must be even"),
    ({"llama.attention.head_count_kv": 3}, "head_count = 4 is not a multiple of llama.attention.head_count_kv = 3"),
    ({"llama.vocab_size": 100}, "ids past it would index beyond the embedding"),
    # a float where an integer belongs: once an int of 3e38 reached NumPy (TypeError)
    ({"llama.embedding_length": 3e38}, "'llama.embedding_length' = 3.0+[0-9]*e\\+38 is not an integer"),
    ({"llama.context_length": 2**32 - 1}, "must be in 1..2147483647"),
    ({"llama.attention.layer_norm_rms_epsilon": "tiny"}, "is not a finite number"),
    ({"llama.rope.scaling.factor": "x"}, "is not a finite number"),
])
def test_hyperparameters_a_kernel_trusts_are_checked(tiny_model, metadata, message):
    from edgekv.loader import load

    with pytest.raises(GGUFError, match=message):
        load(tiny_model("llama", **{"metadata": metadata}))


@pytest.mark.parametrize("key,value,message", [
    ("tokenizer.ggml.scores", ["a"] * 400, "scores must be an array of numbers"),
    ("tokenizer.ggml.token_type", 7, "token_type must be an array of numbers"),
    ("tokenizer.ggml.merges", [1, 2], "merges must be an array of strings"),
    ("tokenizer.ggml.bos_token_id", "one", "bos_token_id must be an integer"),
    ("tokenizer.ggml.pre", [1], "pre must be a string"),
])
def test_tokenizer_metadata_of_the_wrong_type_is_refused(tiny_model, key, value, message):
    from edgekv.errors import EdgeKVError
    from edgekv.text.tokenizer import Tokenizer
    from edgekv.gguf.reader import GGUFFile

    metadata = dict(GGUFFile(tiny_model("llama")).metadata)
    metadata[key] = value
    with pytest.raises(EdgeKVError, match=message):
        Tokenizer.from_gguf(metadata)
