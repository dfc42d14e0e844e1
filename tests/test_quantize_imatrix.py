"""`edgekv quantize --imatrix` against llama-quantize's output, byte for byte, and its errors.

The oracle is the "imatrix" part of tests/reference/quantize/<model>.json (made by
tools/make_quantize_reference.py): llama-quantize run on the F16 source with a synthetic
importance matrix (`synthetic_imatrix` in that tool, regenerated here the same way, as
imatrix.gguf and the older imatrix.dat) for each set of flags. Compared: each file type's plan
(the imatrix turns llama.cpp's rules for IQ4 and Q4_0/Q5_0 ffn_down), every (tensor, type) pair's
bytes, and whole files from the command line, whose metadata records the matrix.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from conftest import load_tool
from helpers.quantize_reference import MODELS, file_sha, reference, run_cli, short_sha

from edgekv.cli import main
from edgekv.gguf.reader import GGUFFile
from edgekv.quantize.imatrix import load_imatrix
from edgekv.quantize.plan import Options, plan_quantization


@pytest.fixture(scope="module")
def imatrix_dir(tmp_path_factory, source):
    """imatrix_dir(model) -> a folder holding that model's imatrix.gguf and imatrix.dat."""
    made = {}

    def get(model: str):
        if model not in made:
            made[model] = tmp_path_factory.mktemp(f"imatrix-{model}")
            load_tool("make_quantize_reference").synthetic_imatrix(source(model, "F16"), made[model])
        return made[model]

    return get


def loaded(folder, flags: str):
    words = flags.split()
    im = load_imatrix(folder / words[1])
    include = [words[i + 1] for i, w in enumerate(words) if w == "--include-weights"]
    exclude = [words[i + 1] for i, w in enumerate(words) if w == "--exclude-weights"]
    im = im.filtered(include, exclude)
    im.path = words[1]  # as typed, relative: the name llama-quantize recorded
    return im


def runs(model: str):
    return reference(model)["sources"]["F16"]["imatrix"]


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_plans_with_an_imatrix_follow_llama_quantize(source, imatrix_dir, model):
    g = GGUFFile(source(model, "F16"))
    for flags, run in runs(model).items():
        opts = Options(imatrix=loaded(imatrix_dir(model), flags))
        for ftype, out in run["outputs"].items():
            ours = {t.name: t.dst_type.name for t in plan_quantization(g, ftype, opts).tensors}
            wrong = {n: (ours.get(n), t) for n, t in out["plan"].items() if ours.get(n) != t}
            assert not wrong, f"{model} {ftype} {flags}: (ours, llama.cpp) {dict(list(wrong.items())[:6])}"


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_tensor_bytes_with_an_imatrix_equal_llama_quantize(source, imatrix_dir, model):
    # every (tensor, type) llama-quantize wrote with each set of imatrix flags
    from gguf import GGMLQuantizationType as T

    from edgekv.quantize.model import tensor_chunks
    from edgekv.quantize.plan import TensorPlan

    g = GGUFFile(source(model, "F16"))
    checked = set()
    for flags, run in runs(model).items():
        im = loaded(imatrix_dir(model), flags)
        wrong = []
        for name, types in run["pairs"].items():
            t = g.tensors[name]
            for dst, want in types.items():
                plan = TensorPlan(name, t.shape, T(t.ggml_type), T[dst], False)
                w = im.weights(name, t.shape) if plan.converts else None
                data = np.concatenate([np.asarray(c).reshape(-1) for c in tensor_chunks(g, plan, w)])
                if short_sha(data) != want:
                    wrong.append((name, dst))
                checked.add(dst)
        assert not wrong, f"{model} {flags}: {len(wrong)} tensors differ from llama-quantize's: {wrong[:6]}"
    assert {"Q2_K", "Q3_K", "IQ4_XS", "IQ4_NL", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1"} <= checked


CLI_RUNS = (("smollm2-135m-instruct", "Q2_K_S", "--imatrix imatrix.gguf"),
            ("gemma3-270m", "IQ4_XS", "--imatrix imatrix.dat"),
            ("smollm2-135m-instruct", "Q3_K_M", "--imatrix imatrix.gguf --include-weights attn_v "
                                                "--include-weights ffn_up"),
            ("gemma3-270m", "Q4_0", "--imatrix imatrix.gguf --exclude-weights ffn_down"))


@pytest.mark.slow
@pytest.mark.parametrize("model,ftype,flags", CLI_RUNS)
def test_command_with_an_imatrix_writes_llama_quantize_file(source, imatrix_dir, tmp_path, monkeypatch,
                                                            model, ftype, flags):
    folder = imatrix_dir(model)
    monkeypatch.chdir(folder)  # the matrix by its relative name, as llama-quantize was given it
    out = tmp_path / "out.gguf"
    assert main(["quantize", *flags.split(), str(source(model, "F16")), str(out), ftype]) == 0
    ref = runs(model)[flags]["outputs"][ftype]
    assert out.stat().st_size == ref["bytes"]
    assert file_sha(out) == ref["file_sha256"]
    g = GGUFFile(out)
    assert g.get("quantize.imatrix.file") == flags.split()[1] and g.get("quantize.imatrix.chunks_count") == 7


# -- errors, on a tiny model --------------------------------------------------------------


def test_q2_k_s_needs_an_imatrix(tiny_model, tmp_path, capsys):
    src = tiny_model(dim=256, ff=512, head_dim=64)
    rc, err = run_cli(capsys, src, tmp_path / "o.gguf", "Q2_K_S")
    assert rc == 1 and "needs an importance matrix" in err and "--imatrix" in err
    assert list(tmp_path.iterdir()) == []
    assert main(["quantize", "--dry-run", str(src), "Q2_K_S"]) == 0  # a dry run only plans


def tiny_imatrix(path, src, *, skip=(), ne0=None):
    from edgekv.quantize.imatrix import write_imatrix

    g = GGUFFile(src)
    stats = {n: (np.ones(ne0 or t.shape[0], np.float32), np.array([1.0], np.float32))
             for n, t in g.tensors.items() if n.startswith("blk.") and len(t.shape) == 2 and n not in skip}
    write_imatrix(path, stats, ["t.txt"], 1, 64)
    return path


def test_imatrix_of_another_model_is_refused(tiny_model, tmp_path, capsys):
    src = tiny_model(dim=256, ff=512, head_dim=64)
    wrong_size = tiny_imatrix(tmp_path / "a.gguf", src, ne0=64)
    rc, err = run_cli(capsys, "--imatrix", wrong_size, src, tmp_path / "o.gguf", "Q4_K_M")
    assert rc == 1 and "another model" in err and "blk.0." in err and "64 values" in err
    other = tiny_imatrix(tmp_path / "b.gguf", tiny_model(arch="gemma3"))
    names = GGUFFile(src).tensors
    im = load_imatrix(other)
    if any(n in names for n in im.entries):  # same names: make them another model's
        from edgekv.quantize.imatrix import write_imatrix
        write_imatrix(other, {"blk.99." + n: (v, np.array([1.0], np.float32)) for n, v in im.entries.items()},
                      ["t.txt"], 1, 64)
    rc, err = run_cli(capsys, "--imatrix", other, src, tmp_path / "o.gguf", "Q4_K_M")
    assert rc == 1 and "none of its" in err and "another model" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.gguf"]


def test_q2_k_s_tensor_missing_from_the_imatrix(tiny_model, tmp_path, capsys):
    src = tiny_model(dim=256, ff=512, head_dim=64)
    im = tiny_imatrix(tmp_path / "i.gguf", src, skip=("blk.0.ffn_up.weight",))
    rc, err = run_cli(capsys, "--imatrix", im, src, tmp_path / "o.gguf", "Q2_K_S")
    assert rc == 1 and "blk.0.ffn_up.weight" in err and "garbage" in err
    assert run_cli(capsys, "--imatrix", im, src, tmp_path / "o.gguf", "Q2_K")[0] == 0


def test_bad_imatrix_files_and_flags(tiny_model, tmp_path, capsys):
    src = tiny_model(dim=256, ff=512, head_dim=64)
    good = tiny_imatrix(tmp_path / "i.gguf", src)
    cut = tmp_path / "cut.dat"
    cut.write_bytes(struct.pack("<ii", 3, 5) + b"blk.0")
    bare = tmp_path / "bare.gguf"
    import gguf
    w = gguf.GGUFWriter(str(bare), arch="llama")
    w.add_tensor("blk.0.attn_q.weight.in_sum2", np.ones((1, 256), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    cases = ((["--imatrix", tmp_path / "none.gguf"], "cannot read"),
             (["--imatrix", cut], "truncated"),
             (["--imatrix", bare], "missing imatrix metadata"),
             (["--imatrix", good, "--include-weights", "a", "--exclude-weights", "b"], "cannot be used together"),
             (["--include-weights", "attn"], "give it"))
    for flags, message in cases:
        rc, err = run_cli(capsys, *flags, src, tmp_path / "o.gguf", "Q4_K_M")
        assert rc == 1 and message in err and len(err.strip().splitlines()) == 1, (flags, err)
    assert not (tmp_path / "o.gguf").exists()
