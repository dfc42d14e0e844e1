"""The backend seam (edgekv/backends/): choosing a backend, the models' ignorance of kernels,
`cpu` and `cpu-portable` giving the same bits on the exact path, and `edgekv info`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from edgekv import Llama
from edgekv.backends import available_backends, get_backend, kernel_map, resolve_backend_name
from edgekv.cli import main
from edgekv.errors import EdgeKVError
from edgekv.loader import load

PACKAGE = Path(__file__).resolve().parents[1] / "edgekv"
TOKENS = [5, 17, 42, 3, 99, 7, 64, 12, 8, 30, 2, 77, 51]


def test_auto_and_names(monkeypatch):
    monkeypatch.delenv("EDGEKV_BACKEND", raising=False)
    monkeypatch.setenv("EDGEKV_LIBCUDA", "/nonexistent/libcuda.so.1")  # a machine with no GPU (test_cuda.py: one with)
    assert resolve_backend_name() == resolve_backend_name("auto") == "cpu"
    assert resolve_backend_name(" CPU-Portable ") == "cpu-portable"
    monkeypatch.setenv("EDGEKV_BACKEND", "cpu-portable")
    assert resolve_backend_name() == "cpu-portable" and get_backend().name == "cpu-portable"
    assert resolve_backend_name("cpu") == "cpu"  # an explicit name beats the environment
    assert set(available_backends()) == {"cpu", "cpu-portable"}


@pytest.mark.parametrize("name, reason", [("vulkan", "no such backend"), ("cuda", "libcuda")])
def test_a_backend_that_cannot_run_is_an_error_naming_the_ones_that_can(name, reason, monkeypatch):
    monkeypatch.setenv("EDGEKV_LIBCUDA", "/nonexistent/libcuda.so.1")  # no driver, on any machine
    with pytest.raises(EdgeKVError, match=reason) as err:
        resolve_backend_name(name)
    assert "available: auto, cpu, cpu-portable" in str(err.value)
    monkeypatch.setenv("EDGEKV_BACKEND", name)
    with pytest.raises(EdgeKVError, match="from EDGEKV_BACKEND"):
        get_backend()


def test_llama_and_cli_refuse_an_unknown_backend(tiny_model, capsys):
    with pytest.raises(EdgeKVError, match="'nope'"):
        Llama(str(tiny_model()), backend="nope")
    assert main(["run", "-m", str(tiny_model()), "-p", "hi", "-n", "1", "--backend", "nope"]) == 1
    assert "backend 'nope' cannot run here" in capsys.readouterr().err


def test_models_call_only_their_backend():
    """No architecture module imports a kernel: a second backend needs no change in them."""
    for path in sorted((PACKAGE / "models").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert "kernels" not in (node.module or ""), f"{path.name} imports {node.module}"


@pytest.mark.parametrize("weight_type", ["Q4_0", "Q5_1", "Q8_0", "Q4_K", "F16"])
def test_cpu_and_portable_give_the_same_bits_on_the_exact_path(tiny_model, weight_type):
    path = tiny_model("llama", weight_type, dim=256, n_heads=4, n_kv_heads=2, head_dim=64, ff=512)
    fast, portable = load(path, "cpu"), load(path, "cpu-portable")
    assert {w.uses_int8dot for w in (fast.network.layers[0].wq, portable.network.layers[0].wq)} == \
        ({kernel_map.takes_int8dot(fast.network.layers[0].wq.ggml_type, True), False})
    # K-quants: the fast backend sums on the int8 dot instructions wherever `edgekv info` says so
    info_says = "K-quant tiles" in kernel_map.weight_kernels(fast.network.layers[0].wq.ggml_type, True)[0]
    assert fast.network.layers[0].wq.sums_on_int8dot == info_says
    assert not portable.network.layers[0].wq.sums_on_int8dot
    runs = []
    for model in (fast, portable):
        s = model.session(n_ctx=64)
        chunk = s.eval(TOKENS[:9], all_logits=True)  # a short chunk: llama.cpp's tiled orders
        steps = [s.eval([t], all_logits=True) for t in TOKENS[9:]]  # decode
        runs.append(np.concatenate([chunk] + steps))
    np.testing.assert_array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))


def test_info_reports_the_machine_and_a_models_kernels(tiny_model, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEKV_KERNEL_CACHE", str(tmp_path / "kc"))
    path = tiny_model("llama", "Q4_0", dim=256, n_heads=4, n_kv_heads=2, head_dim=64, ff=512)
    assert main(["info", "-m", str(path), "--backend", "cpu-portable"]) == 0
    out = capsys.readouterr().out
    facts = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines())  # "key   value"
    assert facts["backend"] == "cpu-portable" and facts["kernel cache"] == str(tmp_path / "kc")
    assert "threads" in facts and "cpu features" in facts and facts["edgekv"]
    assert "dot_q lanes (exact)" in facts["weights Q4_0"] and "tiles + BLAS" in facts["weights Q4_0"]
    # bytes per token, from the formats: 2 layers x 2 KV heads x (K row + V row) of 64 values
    assert facts["cache f16"].startswith(f"{2 * 2 * (128 + 128)} bytes/token")
    assert facts["cache q8_0"].startswith(f"{2 * 2 * (2 * 34 + 2 * 34)} bytes/token")
    assert facts["cache q4_0"].startswith(f"{2 * 2 * (2 * 18 + 2 * 18)} bytes/token")


def test_verbose_start_logs_the_system_info_line(tiny_model, capsys):
    assert main(["run", "-m", str(tiny_model()), "-p", "hi", "-n", "1", "-v", "--backend", "cpu-portable"]) == 0
    line = next(l for l in capsys.readouterr().err.splitlines() if "system_info:" in l)
    assert "backend = cpu-portable" in line and "cpu features = " in line and "kernel cache = " in line
