"""Tests for `edgekv inspect` (edgekv/gguf/inspection.py, cli/inspect.py): the report of the real
model against the `gguf` package's own reading of the file; every handcrafted malformed
file and 3,000 fuzzer mutants: the report never raises, and lists a problem exactly when
loading fails (issue 16 asks the same of inspect as of the loader)."""

from __future__ import annotations

import json
import re
import random

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from edgekv.cli import main
from edgekv.errors import EdgeKVError
from edgekv.gguf.inspection import inspect_gguf
from edgekv.loader import load
from gguf_craft import craft
from helpers.hostile_gguf import ARCH, CASES, DATA, ONE, fuzz_tool, poisoned

N_MUTANTS = 3000


@pytest.mark.slow
def test_the_report_of_smollm2_matches_gguf_py(smollm2_path, capsys):
    assert main(["inspect", str(smollm2_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    reader = GGUFReader(smollm2_path)
    assert report["problems"] == [] and report["architecture"] == "llama"
    assert [t["name"] for t in report["tensors"]] == [t.name for t in reader.tensors]
    for mine, theirs in zip(report["tensors"], reader.tensors):
        assert mine["type"] == GGMLQuantizationType(theirs.tensor_type).name
        assert mine["shape"] == [int(d) for d in theirs.shape] and mine["bytes"] == int(theirs.n_bytes)
        assert mine["values"] == int(theirs.n_elements)
    keys = {name for name in reader.fields if not name.startswith("GGUF.")} - {"tokenizer.chat_template"}
    assert set(report["metadata"]) == keys
    tokens = report["metadata"]["tokenizer.ggml.tokens"]
    assert tokens["array_length"] == 49152 and tokens["first"][0] == "<|endoftext|>"
    assert report["chat_template"] == bytes(reader.fields["tokenizer.chat_template"].parts[-1]).decode()
    assert report["tensor_bytes"] == sum(int(t.n_bytes) for t in reader.tensors)
    assert sum(t["bytes"] for t in report["totals"].values()) == report["tensor_bytes"]


@pytest.mark.slow
def test_the_text_report(smollm2_path, capsys):
    assert main(["inspect", str(smollm2_path)]) == 0
    out = capsys.readouterr().out
    assert "architecture llama" in out and "272 tensors" in out and "134,515,008 parameters" in out
    assert "llama.attention.layer_norm_rms_epsilon = 1e-05" in out
    assert "general.file_type = 3 (MOSTLY_Q4_1)" in out  # the number, and what gguf-py calls it
    assert '(49152 items)' in out and "blk.0.attn_q.weight" in out and "Q4_1" in out
    assert "<|im_start|>" in out and out.rstrip().endswith("problems: none (edgekv can load this file)")


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_malformed_file_is_reported_not_raised(tmp_path, case):
    fields, message = CASES[case]
    spec = {"tensors": [ONE], "data": DATA, **fields}
    spec["kvs"] = [ARCH] + fields.get("kvs", [])
    path = tmp_path / "bad.gguf"
    path.write_bytes(craft(**spec))
    report = inspect_gguf(path)
    assert len(report["problems"]) >= 1
    assert any(re.search(message, p) for p in report["problems"])


def test_nan_weights_are_found_with_check_tensors(tiny_model, tmp_path, capsys):
    src = tiny_model("llama")
    bad = poisoned(src, tmp_path / "nan.gguf", "blk.0.ffn_up.weight",
                   lambda raw: bytearray(np.full(len(raw) // 4, np.nan, np.float32).tobytes()))
    assert main(["inspect", str(bad)]) == 0  # without reading the weights the file looks fine
    assert main(["inspect", str(bad), "--check-tensors"]) == 1
    n = int(next(t.n_elements for t in GGUFReader(bad).tensors if t.name == "blk.0.ffn_up.weight"))
    assert f"tensor 'blk.0.ffn_up.weight' holds {n} NaN or inf" in capsys.readouterr().out


def test_a_missing_file(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "none.gguf")]) == 1
    assert "no such file" in capsys.readouterr().out


@pytest.mark.long
def test_fuzzed_files_are_reported_exactly_when_loading_fails(tmp_path):
    """3,000 mutants of the fuzzer's tiny model: inspect never raises, and its report has a
    problem if and only if edgekv.load refuses the file."""
    tool = fuzz_tool()
    blob = tool.tiny_blob("llama", tmp_path)
    start = tool.data_offset(blob, tmp_path / "base.gguf")
    rng = random.Random(5)
    path = tmp_path / "mutant.gguf"
    disagree, outcomes = [], {"refused": 0, "loaded": 0}
    for i in range(N_MUTANTS):
        path.write_bytes(tool.mutate(blob, rng, start))
        report = inspect_gguf(path)
        try:
            load(path)
            refused = None
        except EdgeKVError as exc:
            refused = str(exc)
        outcomes["refused" if refused else "loaded"] += 1
        if bool(report["problems"]) != bool(refused):
            disagree.append((i, refused, report["problems"][:1]))
    assert not disagree, f"{len(disagree)} mutants: inspect and load disagree, e.g. {disagree[:3]}"
    assert outcomes["refused"] > 300 and outcomes["loaded"] > 300, outcomes
