"""backends/pack_store.py: the CPU layout of a model's weights kept on disk between loads.

A second load of the same file maps the layout the first wrote instead of repacking, and
computes the same bits; a first load writes as it goes and maps each weight back, so no
repacked copy stays in memory; a file that changed, a damaged store, a store whose file is
gone, EDGEKV_PACK_STORE=0 and small files are each handled as the module says. The memory
claim itself (peak RSS of a load <= the file + 200 MiB, first load and later ones) on the
smallest real-size twin.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from edgekv.backends import pack_store
from edgekv.loader import load


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKV_PACK_DIR", str(tmp_path / "packed"))
    monkeypatch.setattr(pack_store, "MIN_BYTES", 0)
    return tmp_path / "packed"


def _logits(model, tokens=(1, 2, 3, 4, 5, 6)):
    s = model.session(n_ctx=32)
    return s.eval(list(tokens), all_logits=True)


def _from_store(model) -> bool:
    w = model.network.layers[0].wq if hasattr(model.network.layers[0], "wq") else None
    packed = (w or model.network.output)._p
    return not packed.qs.flags.owndata and not isinstance(packed.qs.base, type(None))


@pytest.mark.parametrize("weight_type", ["Q4_K", "Q8_0", "Q6_K", "F16"])
def test_a_second_load_maps_the_first_loads_layout_and_computes_the_same_bits(tiny_model, store_dir, weight_type):
    path = tiny_model("llama", weight_type, dim=256, ff=512, n_heads=4, n_kv_heads=2, head_dim=64)
    first = load(path)
    assert len(list(store_dir.glob("*.pack"))) == 1 and len(list(store_dir.glob("*.json"))) == 1
    second = load(path)
    assert second.gguf.pack_store.warm and not first.gguf.pack_store.warm
    np.testing.assert_array_equal(_logits(second), _logits(first))
    np.testing.assert_array_equal(_logits(second), _logits(load(path, backend="cpu")))


def test_a_changed_file_is_repacked_and_its_old_store_deleted(tiny_model, store_dir, tmp_path):
    src = tiny_model("llama", "Q8_0")
    path = tmp_path / "m.gguf"
    path.write_bytes(src.read_bytes())
    load(path)
    (old,) = store_dir.glob("*.json")
    other = tiny_model("llama", "Q8_0", seed=7)
    path.write_bytes(other.read_bytes())
    os.utime(path, ns=(1, 1))  # whatever the clock: a different identity
    model = load(path)
    assert not model.gguf.pack_store.warm
    (new,) = store_dir.glob("*.json")
    assert new != old and not old.exists() and len(list(store_dir.glob("*.pack"))) == 1
    np.testing.assert_array_equal(_logits(load(path)), _logits(load(other)))


def test_a_damaged_store_is_ignored_saying_so_and_rewritten(tiny_model, store_dir, caplog):
    path = tiny_model("llama", "Q4_K", dim=256, ff=512, n_heads=4, n_kv_heads=2, head_dim=64)
    want = _logits(load(path))
    (pack,) = store_dir.glob("*.pack")
    with open(pack, "r+b") as f:
        f.truncate(pack.stat().st_size // 2)
    model = load(path)
    assert "ignoring a damaged store" in caplog.text and not model.gguf.pack_store.warm
    np.testing.assert_array_equal(_logits(model), want)
    assert load(path).gguf.pack_store.warm  # rewritten whole


def test_the_store_of_a_file_that_is_gone_goes_at_the_next_save(tiny_model, store_dir, tmp_path):
    gone = tmp_path / "gone.gguf"
    gone.write_bytes(tiny_model("llama", "Q8_0").read_bytes())
    load(gone)
    gone.unlink()
    load(tiny_model("llama", "Q4_0"))
    names = [p.name for p in store_dir.glob("*.json")]
    assert len(names) == 1 and not names[0].startswith("gone.gguf")


def test_no_store_when_turned_off_or_for_a_small_file(tiny_model, store_dir, monkeypatch):
    path = tiny_model("llama", "Q8_0")
    monkeypatch.setenv("EDGEKV_PACK_STORE", "0")
    assert load(path).gguf.pack_store is None and not store_dir.exists()
    monkeypatch.delenv("EDGEKV_PACK_STORE")
    monkeypatch.setattr(pack_store, "MIN_BYTES", path.stat().st_size + 1)
    assert load(path).gguf.pack_store is None and not store_dir.exists()


# the child's own peak: VmHWM of the memory it was given at exec (ru_maxrss would start from this
# process's peak, which fork hands down)
LOAD = """
import sys
from edgekv.loader import load
load(sys.argv[1])
print(next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) * 1024)
"""


@pytest.mark.long
def test_loading_holds_one_copy_of_the_weights_first_time_and_after(tmp_path, store_dir, monkeypatch):
    """peak RSS of a whole load <= the file + 200 MiB (issue 43), the store's first load and a
    later one, on the Qwen2.5-0.5B Q4_K_M twin (0.37 GiB)."""
    from edgekv.testing.twins import make_twin

    path = make_twin("qwen2.5-0.5b", "Q4_K_M", tmp_path / "q.gguf")
    env = os.environ | {"EDGEKV_PACK_STORE": "1"}  # and EDGEKV_PACK_DIR: the fixture's folder
    peaks = [int(subprocess.run([sys.executable, "-c", LOAD, str(path)], env=env, capture_output=True, text=True,
                                check=True).stdout) for _ in range(2)]
    limit = path.stat().st_size + (200 << 20)
    assert max(peaks) <= limit, (peaks, limit)
