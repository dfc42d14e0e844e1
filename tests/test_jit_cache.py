"""The kernel cache (edgekv/kernels/jit_cache.py) and `edgekv warmup` (edgekv/warmup.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from edgekv.cli import main
from edgekv.kernels import jit_cache
from edgekv.warmup import run_item

PACKAGE = Path(__file__).resolve().parents[1] / "edgekv"
# a kernel of the package, called in a fresh interpreter; prints Numba's cache hits and misses
PROBE = """
import numpy as np
from edgekv.kernels.ops import add_inplace
x = np.ones((2, 3), np.float32)
add_inplace(x, x)
assert x[0, 0] == 2
print(sum(add_inplace.stats.cache_hits.values()), sum(add_inplace.stats.cache_misses.values()))
"""


def _probe(cache: Path) -> tuple[int, int]:
    """(cache hits, cache misses) of one kernel call in a new process with this kernel cache."""
    env = dict(os.environ, EDGEKV_KERNEL_CACHE=str(cache))
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    hits, misses = done.stdout.split()
    return int(hits), int(misses)


def test_kernels_are_cached_in_the_kernel_folder_and_loaded_from_it(tmp_path):
    cache = tmp_path / "kernels"
    assert _probe(cache) == (0, 1)  # compiled, and saved there
    assert list(cache.rglob("ops.add_inplace-*.nbi")) and list(cache.rglob("ops.add_inplace-*.nbc"))
    assert _probe(cache) == (1, 0)  # the next process loads it


def test_the_sources_key_follows_contents_not_file_times(tmp_path):
    copy = tmp_path / "edgekv"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert jit_cache._sources_key(copy) == jit_cache.SOURCES_KEY
    ops = copy / "kernels" / "ops.py"
    os.utime(ops, (1, 1))  # a reinstall writes the same files anew
    assert jit_cache._sources_key(copy) == jit_cache.SOURCES_KEY
    ops.write_text(ops.read_text() + "\n# changed\n")  # a callee's change invalidates every kernel
    assert jit_cache._sources_key(copy) != jit_cache.SOURCES_KEY


def test_warm_marker_per_backend(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEKV_KERNEL_CACHE", str(tmp_path))
    assert not jit_cache.kernels_cached("cpu")
    jit_cache.mark_warm("cpu")
    assert jit_cache.kernels_cached("cpu") and not jit_cache.kernels_cached("cpu-portable")


def test_warmup_does_nothing_when_warm(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("EDGEKV_KERNEL_CACHE", str(tmp_path))
    jit_cache.mark_warm("cpu-portable")
    assert main(["warmup", "--backend", "cpu-portable"]) == 0
    assert "kernels already compiled" in capsys.readouterr().err


def test_a_warmup_item_runs_its_path_through_a_shift(tmp_path):
    for path in ("exact", "batch"):
        assert run_item("gemma3", "Q4_K", path, "cpu", str(tmp_path)) > 0  # asserts the shift itself


def test_warmup_into_a_folder_that_cannot_be_written_is_a_clear_error(monkeypatch, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("EDGEKV_KERNEL_CACHE", str(blocker / "kernels"))  # under a file: nobody can create it
    assert main(["warmup", "--backend", "cpu-portable"]) == 1
    err = capsys.readouterr().err
    assert "cannot write the kernel cache" in err and "EDGEKV_KERNEL_CACHE" in err and "compiling" not in err


def _blas_timeout_after(imports: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    code = f"{imports}; import os; print(os.environ.get('OPENBLAS_THREAD_TIMEOUT', 'unset'))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_import_edgekv_first_makes_openblas_threads_sleep_and_respects_a_users_choice():
    assert _blas_timeout_after("import edgekv; import numpy") == "4"
    # NumPy already loaded: OpenBLAS has read its environment, so edgekv leaves it alone
    assert _blas_timeout_after("import numpy; import edgekv") == "unset"
    env = dict(os.environ, OPENBLAS_THREAD_TIMEOUT="10")
    out = subprocess.run([sys.executable, "-c", "import edgekv, os; print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == "10"
