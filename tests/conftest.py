"""Shared fixtures: the two real models (fetched once per machine) and llama.cpp's reference data.

A test that needs a real model and cannot get it fails loudly: it is never skipped.
"""

from __future__ import annotations

import os

# as `import edgekv` does when it comes first (edgekv/__init__.py): OpenBLAS's threads sleep
# after a call instead of spinning against the kernels' threads; NumPy reads it on import
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
# the suite checks the CPU backend (llama.cpp's exact bits) wherever it runs: auto would take a
# GPU where there is one. Tests of backend choice set this themselves; GPU tests name "cuda".
os.environ["EDGEKV_BACKEND"] = "cpu"

import json
import platform
from pathlib import Path

import pytest

# tests/helpers/ holds what several test modules share (its __init__ says what lives where):
# its asserts report their values as a test's do
pytest.register_assert_rewrite("helpers")


def pytest_configure(config):
    # a test's speed class is declared where the test is. `slow` (pyproject.toml): needs a real
    # model. `long`: no real model, but long (make test-fast, the quick loop, leaves both out)
    config.addinivalue_line("markers", "long: runs for many seconds without a real model (fuzz loops, load, "
                                       "interrupts, the heaviest sweeps); make test runs it, make test-fast does not")


def pytest_report_header(config):
    if "cuda_cpu" in (config.option.markexpr or "") and "not cuda_cpu" not in config.option.markexpr:
        from cuda_cpu import asan_loaded

        return ("native/*.cu on the CPU: UBSan and ASan (tests/cuda_cpu.py)" if asan_loaded() else
                "native/*.cu on the CPU: UBSan only; ASan needs its runtime preloaded: python tests/cuda_cpu.py ...")


def pytest_sessionfinish(session, exitstatus):
    """The whole cuda_cpu run (`-m cuda_cpu`, nothing else selecting) must have launched every
    kernel native/ defines: a kernel no test runs is a kernel the CPU has not checked."""
    import sys

    option = session.config.option
    if exitstatus != 0 or (option.markexpr or "").strip() != "cuda_cpu" or option.keyword or "cuda_cpu" not in sys.modules:
        return
    if any(not a.startswith("-") and Path(a).exists() for a in session.config.invocation_params.args):
        return  # some files only
    from cuda_cpu import never_launched

    missing = never_launched()
    if missing:
        print(f"\nnative/ kernels no cuda_cpu test launched: {', '.join(missing)}")
        session.exitstatus = 1


REFERENCE_DIR = Path(__file__).resolve().parent / "reference"  # llama.cpp's results (its README)


@pytest.fixture(scope="session")
def reference() -> dict:
    path = REFERENCE_DIR / "llama_cpp_reference.json"
    assert path.is_file(), f"llama.cpp reference data missing at {path} (tests/reference/README.md says how it is made)"
    return json.loads(path.read_text())


def _model(name: str) -> Path:
    from edgekv.catalog import ensure_model

    return ensure_model(name)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return _model("gemma3-270m")


REPO = Path(__file__).resolve().parents[1]


def load_tool(name: str):
    """Import tools/<name>.py once, by path (tools/ is a folder of scripts, not a package)."""
    import importlib.util
    import sys

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """tiny_model(arch="llama", weight_type="F32", **kw) -> Path of a cached tiny random GGUF."""
    made: dict = {}
    folder = tmp_path_factory.mktemp("tiny")
    from edgekv.testing.tiny_model import make_tiny_model as make

    def factory(arch: str = "llama", weight_type: str = "F32", **kw) -> Path:
        key = (arch, weight_type, repr(sorted(kw.items())))
        if key not in made:
            made[key] = make(folder / f"{arch}-{weight_type}-{len(made)}.gguf", arch=arch, weight_type=weight_type, **kw)
        return made[key]

    return factory


@pytest.fixture(params=["twins", pytest.param("real", marks=[pytest.mark.cuda_cpu, pytest.mark.long])])
def emulated_kernels(request, monkeypatch):
    """What the emulated driver's launches run (helpers/emulated_cuda.py), a test for each: the
    kernels' NumPy twins, and (markers cuda_cpu and long: minutes under ASan, so make test's,
    not make test-fast's) native/'s own code on the CPU under the sanitizers (tests/cuda_cpu.py)."""
    from helpers import emulated_cuda

    monkeypatch.setitem(emulated_cuda.KERNELS, "real", request.param == "real")
    return request.param


# tests/aarch64 runs on Arm CPUs only: tools/test_aarch64.sh runs it in an emulated arm64
# root (make test-aarch64, and CI after make test); on other CPUs it is not collected
if platform.machine().lower() not in ("aarch64", "arm64"):
    collect_ignore = ["aarch64"]


@pytest.fixture(scope="session")
def source(tmp_path_factory, smollm2_path, gemma3_path):
    """source(model, "F32"|"F16") -> the catalog model dequantized by `edgekv quantize`
    (tests/test_quantize*.py)."""
    made: dict = {}
    folder = tmp_path_factory.mktemp("quantize-sources")
    originals = {"smollm2-135m-instruct": smollm2_path, "gemma3-270m": gemma3_path}

    def get(model: str, src_type: str) -> Path:
        from edgekv.cli import main

        if (model, src_type) not in made:
            path = folder / f"{model}-{src_type}.gguf"
            assert main(["quantize", "--allow-requantize", str(originals[model]), str(path), src_type]) == 0
            made[model, src_type] = path
        return made[model, src_type]

    return get
