"""tools/gpu_check.sh rehearsed as a new user's GPU machine would run it, as far as a machine
without a GPU goes: a fresh Python 3.12 venv holding what such a machine has (numpy, numba,
pytest) and one NVRTC wheel (CUDA 13's `nvidia-cuda-nvrtc`, as PyTorch cu130 images carry,
or CUDA 12's `nvidia-cuda-nvrtc-cu12`), the wheels and model headers `--prepare` makes, and
no network (a network namespace of its own, where `unshare` may make one; else no package
index and no models). The script must compile every kernel with that NVRTC (test_cuda.py's
checks for sm_87 and sm_90), build them for the host, and stop at the driver step with its
line and status 3. Marked slow: it downloads the venv's wheels (~150 MB) and needs the real
models for --prepare's headers (~3 minutes per wheel here; CUDA 13's by default, see REHEARSED).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
BASE = ["numpy", "numba", "pytest", "PyYAML", "tqdm"]  # what a GPU machine's Python has, beyond gpu_check's own wheels
NVRTC = {"13": "nvidia-cuda-nvrtc==13.0.*", "12": "nvidia-cuda-nvrtc-cu12==12.*"}  # 13.0: no RPATH (finding 1)
# The rehearsal runs with CUDA 13's wheel, the lent GPU machines' (4-5 of make test's minutes
# each); CUDA 12's compiles every kernel in tests/test_nvrtc_versions.py, and
# EDGEKV_REHEARSE_NVRTC=12,13 rehearses the script with each wheel alone
REHEARSED = os.environ.get("EDGEKV_REHEARSE_NVRTC", "13").split(",")


def _python312() -> str:
    pyenv = sorted(Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")).glob("versions/3.12*/bin/python3.12"))
    for candidate in [*map(str, pyenv), shutil.which("python3.12")]:
        if candidate and subprocess.run([candidate, "-c", "import venv"], capture_output=True).returncode == 0:
            return candidate
    raise AssertionError("the rehearsal needs Python 3.12 (python3.12 on PATH, or `pyenv install 3.12`)")


@pytest.fixture(scope="module")
def prepared(smollm2_path, gemma3_path):
    """`tools/gpu_check.sh --prepare`, as a developer runs it where PyPI answers."""
    env = os.environ | {"PYTHON": sys.executable}
    done = subprocess.run(["bash", "tools/gpu_check.sh", "--prepare"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (REPO / ".gpu_models").iterdir()) == ["gemma3-270m.header",
                                                                       "smollm2-135m-instruct.header"]


@pytest.mark.parametrize("cuda", sorted(REHEARSED))
def test_gpu_check_compiles_every_kernel_and_stops_at_the_driver_without_network(prepared, tmp_path, cuda):
    wheels = tmp_path / "wheels"
    fetch = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version",
                            "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64", "--platform",
                            "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "-d", str(wheels), *BASE,
                            NVRTC[cuda]], capture_output=True, text=True, timeout=900)
    assert fetch.returncode == 0, fetch.stderr
    venv = tmp_path / "venv"
    subprocess.run([_python312(), "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    install = subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels), *BASE,
                              NVRTC[cuda].split("==")[0]], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr
    home = tmp_path / "home"  # no models, no kernel cache: a new machine
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHON": py, "EDGEKV_HOME": str(home / "edgekv"),
           "EDGEKV_KERNEL_CACHE": str(home / "kernels"), "PIP_NO_INDEX": "1",
           "PIP_INDEX_URL": "http://127.0.0.1:9/simple"}
    isolated = subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0
    args = (["unshare", "-rn"] if isolated else []) + ["bash", "tools/gpu_check.sh"]
    run = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    out = run.stdout + run.stderr
    assert run.returncode == 3, out
    nvrtc = next(line for line in run.stdout.splitlines() if line.startswith("nvrtc"))
    assert nvrtc.split()[1].startswith(f"{cuda}."), nvrtc  # edgekv info: this wheel's NVRTC
    assert "failed" not in out and " passed" in out, out
    assert "test_every_source_compiles" not in out, out  # none of its compile checks failed or skipped
    last = run.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu_check: STOPPED at the driver step") and "no NVIDIA driver" in last, out
