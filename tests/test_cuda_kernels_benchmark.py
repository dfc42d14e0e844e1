"""benchmarks/cuda_kernels.py runs only where a GPU is, which is rarely: run it here on the
emulated driver at small sizes, so a kernel whose arguments changed fails here and not in
the scarce GPU run (tools/gpu_check.sh). The times it prints here mean nothing."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

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
