"""What a one-shot `edgekv run` does at start-up and exit (issue 19, item 5).

The time itself is measured by benchmarks/startup_memory.py, never here; these tests hold
the behaviours the figures rest on: `import edgekv` pays for nothing it does not use, a
load leaves the garbage collector as it found it and no thread behind, and the process
entry point passes main()'s exit status through.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
from importlib import metadata

import pytest

from edgekv import GGUFError
from edgekv.loader import load


def _python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=300).stdout.strip()


def test_import_edgekv_loads_neither_numba_nor_package_metadata():
    probe = "import edgekv, sys; print(sorted(m for m in ('numba', 'importlib.metadata') if m in sys.modules))"
    assert _python(probe) == "[]"


def test_the_version_is_read_on_first_use():
    assert _python("import edgekv; print(edgekv.__version__)") == metadata.version("edgekv")
    from edgekv.system_info import edgekv_version

    assert edgekv_version() == metadata.version("edgekv")


@pytest.mark.parametrize("enabled", [True, False])
def test_load_leaves_the_collector_as_it_was_and_no_thread_running(tiny_model, enabled):
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        model = load(tiny_model())
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert not [t for t in threading.enumerate() if t.name == "edgekv-numba-start"]
    session = model.session(n_ctx=32)
    session.eval([1, 2, 3])  # the kernel the start-up thread loaded runs here too


def test_load_after_a_failed_load_still_works(tmp_path, tiny_model):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(GGUFError):
        load(bad)
    assert gc.isenabled()
    load(tiny_model()).session(n_ctx=32).eval([1, 2])


def test_the_process_entry_point_passes_the_exit_status_through(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "edgekv", "--version"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and metadata.version("edgekv") in ok.stdout
    missing = subprocess.run([sys.executable, "-m", "edgekv", "run", "-m", str(tmp_path / "none.gguf"), "-p", "Hi"],
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 1 and "edgekv: error:" in missing.stderr
