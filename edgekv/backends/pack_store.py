"""Repacked weights kept on disk, so that a model loads the second time without repacking.

What lives here: `PackStore`, one per GGUF file being loaded: `packed(...)` gives a weight in
the kernels' lane layout (repack.py), from the store's file when an earlier load of the same
file on this CPU wrote it (mapped copy-on-write: no copy in memory, pages shared with the page
cache; the GGUF's own pages of that weight are never read), else by repacking; `save()` writes
what this load repacked, once the model is whole. What does not: the layout (kernels/repack.py), the
kernels, which weights a model has (models/).

Where: EDGEKV_PACK_DIR, else kernel_cache_dir()/packed (EDGEKV_KERNEL_CACHE), a `<key>.pack` of every array (each on
a 4 KiB boundary) and its `<key>.json` index, written under temporary names and renamed, the
index last: a store without its index, or whose sizes disagree with it, is ignored and
rewritten. The key: the file's identity (size, modification time, inode, a hash of its first
and last MiB) and the layout's source (repack.py's text); what the kernels chose per weight
(lanes) is in each entry's key. Older stores of the same file are deleted
when a new one is written, and so are stores whose file is gone. Files under MIN_BYTES (64 MiB)
are not stored: they repack in well under a second. EDGEKV_PACK_STORE=0 turns the store off
(a disk without room for a second copy of the weights: a failed write is logged and loading
goes on).
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
from pathlib import Path

import numpy as np

from ..gguf.reader import release_mapped
from ..kernels.jit_cache import kernel_cache_dir
from ..kernels.repack import Packed, repack

log = logging.getLogger("edgekv")
ALIGN = 4096
MIN_BYTES = 64 << 20  # smaller files repack in well under a second: not worth a second copy on disk
FIELDS = ("qs", "qh", "sc", "d", "w")
_SOURCE = (Path(__file__).resolve().parents[1] / "kernels" / "repack.py").read_bytes()


def enabled(path: str) -> bool:
    """Whether loading `path` keeps and looks for a store (the loader makes one only then):
    EDGEKV_PACK_STORE is not 0, and the file is at least MIN_BYTES."""
    if os.environ.get("EDGEKV_PACK_STORE", "1").strip().lower() in ("0", "off", "false", "no"):
        return False
    return os.path.getsize(path) >= MIN_BYTES


def release(a: np.ndarray) -> None:
    """Drop the pages under `a` from resident memory where `a` views a store's mapping (a
    weight the CPU backend has copied elsewhere: a RowStack); the file keeps them. Arrays in
    ordinary memory are left alone."""
    root = a
    while isinstance(root, np.ndarray) and root.base is not None:
        root = root.base
    if isinstance(root, mmap.mmap) and a.nbytes:
        release_mapped(root, a)


def store_dir() -> Path:
    """EDGEKV_PACK_DIR, else kernel_cache_dir()/packed."""
    given = os.environ.get("EDGEKV_PACK_DIR")
    return Path(given) if given else kernel_cache_dir() / "packed"


def file_key(path: str) -> str:
    """The identity of a file's bytes, cheaply: stat, and a hash of its first and last MiB."""
    st = os.stat(path)
    h = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}".encode())
    h.update(_SOURCE)
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, st.st_size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()[:24]


def _write(f, at: int, p: Packed) -> tuple[int, dict]:
    """p's arrays into file f from offset `at`, each on an ALIGN boundary: (the end, its index entry)."""
    fields = {}
    for name in FIELDS:
        a = np.ascontiguousarray(getattr(p, name))
        if a.nbytes:  # an empty field (a type without it) takes no room, and no padding
            at = -(-at // ALIGN) * ALIGN
            f.seek(at)
            f.write(a.data)
        fields[name] = (at, a.nbytes, a.dtype.str, list(a.shape))
        at += a.nbytes
    return at, {"n_groups": p.n_groups, "fields": fields}


class PackStore:
    def __init__(self, path: str, base: int, folder: Path | None = None):
        """path: the GGUF file; base: the address its mapping starts at (a weight's bytes are
        known by their offset from it)."""
        self.path, self.base = path, base
        self.folder = folder or store_dir()
        where = hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:8]
        self.prefix = f"{Path(path).name}-{where}-"  # every store of this file, whatever its bytes
        self.stem = self.prefix + file_key(path)
        self.index: dict[str, dict] = {}
        self._new: list[tuple[str, Packed]] = []  # repacked in memory, for a store that lacked them
        self._map: np.ndarray | None = None  # a whole store from an earlier load, mapped
        self._writer = None  # this load's store being written (a first load), and what is in it
        self._partial: Path | None = None
        self._written: dict[str, dict] = {}
        self._at = 0
        self._failed = False
        self._open()

    @property
    def warm(self) -> bool:
        return self._map is not None

    def _open(self) -> None:
        pack, index = self.folder / f"{self.stem}.pack", self.folder / f"{self.stem}.json"
        try:
            entries = json.loads(index.read_text())
            size = pack.stat().st_size
        except (OSError, ValueError):
            return
        if not isinstance(entries, dict) or size != entries.pop("_bytes", -1):
            log.warning("ignoring a damaged store of repacked weights (%s): repacking", pack)
            return
        entries.pop("_source", None)  # what _forget_others reads: not a weight
        self.index = entries
        # copy-on-write (writeable arrays: the kernels' compiled signatures) and a plain
        # ndarray (a memmap subclass would make Numba compile them again)
        self._map = np.memmap(pack, np.uint8, mode="c").view(np.ndarray) if size else np.zeros(0, np.uint8)

    def packed(self, raw: np.ndarray, ggml_type: int, n_rows: int, n_cols: int, type_size: int, lanes: int,
               release=None) -> Packed:
        key = f"{raw.ctypes.data - self.base}:{raw.nbytes}:{ggml_type}:{n_rows}:{n_cols}:{lanes}"
        entry = self.index.get(key)
        if entry is not None and self._map is not None:
            return self._views(self._map, 0, lanes, entry)
        p = repack(raw, ggml_type, n_rows, n_cols, type_size, lanes, release)
        if self._map is None and not self._failed:  # a first load: stored as it goes
            written = self._append(key, p)
            if written is not None:
                return written
        self._new.append((key, p))  # a store that lacks it (other lanes): rewritten whole by save()
        return p

    @staticmethod
    def _views(mapped: np.ndarray, start: int, lanes: int, entry: dict) -> Packed:
        arrays = {name: mapped[at - start: at - start + nbytes].view(dtype).reshape(shape)
                  for name, (at, nbytes, dtype, shape) in entry["fields"].items()}
        return Packed(lanes, entry["n_groups"], **arrays)

    def _append(self, key: str, p: Packed) -> Packed | None:
        """p written at the end of this load's store, and mapped back from there: the repacked
        copy in memory goes as soon as the caller drops p, so a first load holds no more than
        a later one (None: the store cannot be written; p stays in memory)."""
        try:
            if self._writer is None:
                self.folder.mkdir(parents=True, exist_ok=True)
                self._partial = self.folder / f"{self.stem}.pack.{os.getpid()}"
                self._writer = open(self._partial, "wb")
            start = -(-self._at // ALIGN) * ALIGN
            at, entry = _write(self._writer, start, p)
            self._writer.flush()
            self._at = at
            self._written[key] = entry
            if at == start:
                return self._views(np.zeros(0, np.uint8), start, p.lanes, entry)
            mapped = np.memmap(self._partial, np.uint8, mode="c", offset=start, shape=(at - start,))
            return self._views(mapped.view(np.ndarray), start, p.lanes, entry)
        except OSError as exc:
            log.warning("could not keep the repacked weights for the next load (%s): the next load repacks", exc)
            self._abandon()
            return None

    def _abandon(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._partial.unlink(missing_ok=True)
        self._writer, self._written, self._failed = None, {}, True

    def save(self) -> None:
        """The store this load made, kept for the next: renamed into place with its index (or,
        where a store lacked weights, rewritten whole). Nothing when all came from the store."""
        pack, index = self.folder / f"{self.stem}.pack", self.folder / f"{self.stem}.json"
        try:
            if self._writer is not None:
                self._writer.close()
                self._partial.replace(pack)
                self._writer = None
                self._write_index(index, self._written, self._at)
            elif self._new and self._map is not None:
                self._rewrite(pack, index)
        except OSError as exc:
            log.warning("could not keep the repacked weights for the next load (%s): the next load repacks", exc)
            self._abandon()
        self._new.clear()

    def _write_index(self, index: Path, entries: dict, nbytes: int) -> None:
        partial = index.with_name(f"{index.name}.{os.getpid()}")
        partial.write_text(json.dumps({**entries, "_bytes": nbytes, "_source": os.path.realpath(self.path)}))
        partial.replace(index)  # last: a store is whole once its index is there
        self._forget_others()

    def _rewrite(self, pack: Path, index: Path) -> None:
        entries, at = dict(self.index), self._map.nbytes
        partial = pack.with_name(f"{pack.name}.{os.getpid()}")
        with open(partial, "wb") as f:
            f.write(self._map)  # what the store had
            for key, p in self._new:
                at, entries[key] = _write(f, at, p)
            f.truncate(at)
        partial.replace(pack)
        self._write_index(index, entries, at)

    def _forget_others(self) -> None:
        """Delete the stores of this file's earlier bytes, and of files that are gone."""
        for index in self.folder.glob("*.json"):
            if index.name.startswith(self.stem):
                continue
            if not index.name.startswith(self.prefix):
                try:
                    source = json.loads(index.read_text()).get("_source")
                except (OSError, ValueError, AttributeError):
                    source = None
                if source is None or os.path.exists(source):
                    continue
            index.unlink(missing_ok=True)
            index.with_suffix(".pack").unlink(missing_ok=True)
