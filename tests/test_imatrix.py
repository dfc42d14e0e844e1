"""`edgekv imatrix` against llama-imatrix, and the files it writes.

The oracle is tests/reference/imatrix.json (tools/make_imatrix_reference.py: llama-imatrix on
both catalog models over gpl3.txt, -c 256, 3 chunks): the same entries with the same token
counts and a file of the same layout; each entry's total and sampled columns close to llama.cpp's
(each runtime rounds its activations its own way: measured here at most 0.52% on the totals and
2.6% relative L2 on the sampled columns), and the PPL it prints within 1%.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import REFERENCE_DIR, load_tool

from edgekv.cli import main
from edgekv.gguf.reader import GGUFFile
from edgekv.quantize.imatrix import load_imatrix

MODELS = ("smollm2-135m-instruct", "gemma3-270m")


def reference() -> dict:
    return json.loads((REFERENCE_DIR / "imatrix.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_imatrix_matches_llama_imatrix(tmp_path, capsys, smollm2_path, gemma3_path, model):
    ref = reference()
    want = ref["models"][model]
    path = {"smollm2-135m-instruct": smollm2_path, "gemma3-270m": gemma3_path}[model]
    out = tmp_path / "imatrix.gguf"
    assert main(["imatrix", "-m", str(path), "-f", str(REFERENCE_DIR / ref["text"]), "-o", str(out),
                 "-c", str(ref["n_ctx"]), "--chunks", str(ref["chunks"])]) == 0
    ppl = float(capsys.readouterr().out.split("PPL = ")[1].split()[0])
    assert abs(ppl / want["ppl"] - 1) < 0.01, (ppl, want["ppl"])
    assert out.stat().st_size == want["file_bytes"]
    ours = load_tool("make_imatrix_reference").summarize(out)
    assert sorted(ours) == sorted(want["entries"])
    for name, e in want["entries"].items():
        o = ours[name]
        assert o["count"] == e["count"] == ref["n_ctx"] * ref["chunks"], name
        assert abs(o["total"] / e["total"] - 1) < 0.02, (name, o["total"], e["total"])
        a, b = np.array(o["cols"]), np.array(e["cols"])
        # each runtime rounds its activations its own way, and the difference grows with depth:
        # against this reference (llama.cpp on AVX-512), edgekv's worst entry is 2.6% on a Zen 4
        # and 6.0% on an AVX2 Zen 3 (Gemma's last ffn_down: one outlier column, 20.0 vs 18.2; the
        # next entry 2.5%; the same at e510efd, before the Q3_K/IQ4_XS kernels; not isolated:
        # the batch path's attention runs on BLAS, whose kernels differ per CPU)
        assert np.linalg.norm(a - b) / np.linalg.norm(b) < 0.08, name
    g = GGUFFile(out)
    assert g.get("imatrix.chunk_count") == ref["chunks"] and g.get("imatrix.chunk_size") == ref["n_ctx"]


def text_file(tmp_path, n_words: int = 2000):
    words = [f"word{i % 97} and more text {i % 13}." for i in range(n_words)]
    path = tmp_path / "text.txt"
    path.write_text(" ".join(words))
    return path


def test_imatrix_of_a_tiny_model_quantizes_it(tiny_model, tmp_path, capsys):
    # the column sums of squared inputs of every block matrix, counted per token; the .dat
    # format holds the same means; quantize takes either
    src = tiny_model(dim=256, ff=512, head_dim=64)
    text = text_file(tmp_path)
    assert main(["imatrix", "-m", str(src), "-f", str(text), "-o", str(tmp_path / "i.gguf"), "-c", "64",
                 "--chunks", "2"]) == 0
    assert main(["imatrix", "-m", str(src), "-f", str(text), "-o", str(tmp_path / "i.dat"), "-c", "64",
                 "--chunks", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("PPL = ") == 2 and len(set(out.splitlines())) == 1  # the same run twice
    g = GGUFFile(src)
    blocks = {n for n, t in g.tensors.items() if n.startswith("blk.") and len(t.shape) == 2}
    a, b = load_imatrix(tmp_path / "i.gguf"), load_imatrix(tmp_path / "i.dat")
    assert set(a.entries) == set(b.entries) == blocks
    raw = GGUFFile(tmp_path / "i.gguf")
    for n in blocks:
        assert np.frombuffer(raw.tensors[n + ".counts"].data, np.float32)[0] == 128
        assert np.isfinite(a.entries[n]).all() and (a.entries[n] > 0).all()
        np.testing.assert_allclose(b.entries[n], a.entries[n], rtol=1e-6)
    assert a.datasets == [str(text)] and a.chunk_count == 2
    for name in ("i.gguf", "i.dat"):
        assert main(["quantize", "--imatrix", str(tmp_path / name), str(src), str(tmp_path / "q.gguf"),
                     "Q2_K_S"]) == 0
        assert GGUFFile(tmp_path / "q.gguf").get("quantize.imatrix.entries_count") == len(blocks)


def test_imatrix_output_weight_on_request(tiny_model, tmp_path, capsys):
    src = tiny_model(tied=False)
    text = text_file(tmp_path)
    assert main(["imatrix", "-m", str(src), "-f", str(text), "-o", str(tmp_path / "i.gguf"), "-c", "64",
                 "--chunks", "2", "--process-output", "--no-ppl"]) == 0
    assert "PPL" not in capsys.readouterr().out
    im = load_imatrix(tmp_path / "i.gguf")
    assert "output.weight" in im.entries and "token_embd.weight" not in im.entries


def test_imatrix_errors(tiny_model, tmp_path, capsys):
    src = tiny_model()
    short = tmp_path / "short.txt"
    short.write_text("too short")
    assert main(["imatrix", "-m", str(src), "-f", str(short), "-o", str(tmp_path / "i.gguf")]) == 1
    err = "".join(line for line in capsys.readouterr().err.splitlines(True) if "on first use" not in line)
    assert "you need at least 1024 tokens for an importance matrix" in err and len(err.strip().splitlines()) == 1
    assert main(["imatrix", "-m", str(src), "-f", str(tmp_path / "none.txt")]) == 1
    assert "none.txt" in capsys.readouterr().err
    assert not (tmp_path / "i.gguf").exists()
