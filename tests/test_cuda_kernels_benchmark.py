"""benchmarks/cuda_kernels.py runs only where a GPU is, which is rarely: run it here on the
emulated driver at small sizes, so a kernel whose arguments changed fails here and not in
the scarce GPU run (tools/gpu_check.sh). The times it prints here mean nothing."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest

from cuda_emulator import EmulatedDevice


def test_the_kernel_benchmark_launches_every_kernel_as_the_kernels_take_them(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location(
        "cuda_kernels", Path(__file__).resolve().parents[1] / "benchmarks" / "cuda_kernels.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    small = {name: dict(s, matrices=[(n, 64, 256, kind) for n, _, _, kind in s["matrices"]],
                        output=(96, 256, s["output"][2])) for name, s in bench.SHAPES.items()}
    monkeypatch.setattr(bench, "SHAPES", small)
    monkeypatch.setattr(bench, "DEPTH", 1100)  # past 2 x 256 slots: the split kernels too
    monkeypatch.setattr(bench, "PREFILL", 16)
    monkeypatch.setattr(bench, "_time", lambda dev, fn, n=0, warm=0: (fn(), dev.synchronize(), 1e-3)[2])
    dev = EmulatedDevice(integrated=False)
    dev.nvrtc = types.SimpleNamespace(version=(12, 9))
    assert bench.main(dev) == 0
    out = capsys.readouterr().out
    assert out.count("| smollm2-135m |") == out.count("| gemma3-270m |") == 4 + 2 + 1 + 6 + 1 + 1
    assert "keep's tallies" in out and "split" in out


def _bench():
    spec = importlib.util.spec_from_file_location(
        "cuda_kernels", Path(__file__).resolve().parents[1] / "benchmarks" / "cuda_kernels.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.slow
def test_the_benchmark_times_matrices_the_real_files_hold():
    """Each (rows, cols, type) the benchmark times is a layer's tensors of the catalog file it
    names, stacked: a shape no file can hold (a Q4_K row of 640 values, issue 42's finding 6)
    would have the kernel read past every row."""
    import gguf

    from edgekv.catalog import resolve_model
    from edgekv.gguf.reader import GGUFFile

    bench = _bench()
    for model, spec in bench.SHAPES.items():
        g = GGUFFile(resolve_model(bench.SOURCES[model]))
        layers = [{n.split(".", 2)[2].removesuffix(".weight"): t for n, t in g.tensors.items()
                   if n.startswith(f"blk.{i}.")} for i in range(spec["layers"])]
        for name, rows, cols, kind in spec["matrices"]:
            held = [layer for layer in layers
                    if all(gguf.GGMLQuantizationType(layer[t].ggml_type).name == kind
                           and layer[t].shape[0] == cols for t in bench.TENSORS[name])
                    and sum(layer[t].shape[1] for t in bench.TENSORS[name]) == rows]
            assert held, f"{model} {name}: no layer holds {rows}x{cols} {kind}"
        rows, cols, kind = spec["output"]
        out = g.tensors.get("output.weight", g.tensors["token_embd.weight"])
        assert (tuple(out.shape), gguf.GGMLQuantizationType(out.ggml_type).name) == ((cols, rows), kind)


def test_a_shape_no_file_can_hold_is_refused():
    import numpy as np

    with pytest.raises(ValueError, match="640 values is not a whole number of blocks"):
        _bench()._weights(4096, 640, "Q4_K", np.random.default_rng(0))
