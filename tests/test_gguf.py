"""GGUF loading: the parser against the gguf package's reader, and every kind of bad file
refused with edgekv's own error naming the file and what was wrong."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader

from edgekv.errors import GGUFError, UnsupportedModelError
from edgekv.gguf.reader import GGUFFile
from edgekv.loader import Model


def test_parser_agrees_with_gguf_package(tiny_model):
    path = tiny_model("gemma3", "Q8_0")
    ours, ref = GGUFFile(path), GGUFReader(path)
    for key, field in ref.fields.items():
        if not key.startswith("GGUF."):
            assert ours.metadata[key] == pytest.approx(field.contents()) if isinstance(ours.metadata[key], float) \
                else ours.metadata[key] == field.contents(), key
    for t in ref.tensors:
        mine = ours.tensors[t.name]
        assert mine.shape == tuple(int(x) for x in t.shape) and mine.ggml_type == int(t.tensor_type)
        assert np.array_equal(mine.data, np.asarray(t.data).reshape(-1).view(np.uint8))


def _corrupt(tmp_path, src, name, edit):
    data = bytearray(src.read_bytes())
    edit(data)
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("name, edit, message", [
    ("magic.gguf", lambda d: d.__setitem__(slice(0, 4), b"GGUX"), "not a GGUF file"),
    ("version.gguf", lambda d: d.__setitem__(slice(4, 8), (9).to_bytes(4, "little")), "version 9"),
    ("truncated.gguf", lambda d: d.__delitem__(slice(len(d) - 1000, len(d))), "truncated"),
    ("header.gguf", lambda d: d.__delitem__(slice(200, len(d))), "truncated or corrupt"),
    ("count.gguf", lambda d: d.__setitem__(slice(16, 24), (2**40).to_bytes(8, "little")), "corrupt header"),
])
def test_bad_files_raise_gguf_error_naming_the_file(tmp_path, tiny_model, name, edit, message):
    path = _corrupt(tmp_path, tiny_model("llama"), name, edit)
    with pytest.raises(GGUFError, match=message) as info:
        Model(path)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(GGUFError, match="no such file"):
        GGUFFile(tmp_path / "absent.gguf")


def test_unsupported_architecture_lists_the_supported_ones(tiny_model):
    path = tiny_model("llama", metadata={"general.architecture": "mamba"})
    with pytest.raises(UnsupportedModelError, match="'mamba'.*gemma3, llama"):
        Model(path)


def test_tensor_shape_is_checked_against_hyperparameters(tiny_model):
    path = tiny_model("llama", metadata={"llama.feed_forward_length": 96})
    with pytest.raises(GGUFError, match=r"blk\.0\.ffn_gate\.weight.*expected \[64, 96\]"):
        Model(path)


def test_missing_hyperparameter_is_named(tiny_model):
    path = tiny_model("llama", metadata={"llama.attention.head_count": 0})
    with pytest.raises(GGUFError, match="head_count"):
        Model(path)
