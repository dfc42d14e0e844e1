"""Where compiled kernels are kept on disk, and when they are stale.

What lives here: the kernel cache folder (`kernel_cache_dir`), the Numba cache locator
that puts edgekv's kernels there, and the warm-up marker (`kernels_cached`,
`mark_warm`). What does not: compiling anything (`edgekv warmup`, warmup.py) or the JIT
flags (config.py).

Numba caches a function's machine code next to its module (`__pycache__`) and checks
only that module's source, although callees from other modules are compiled into it.
edgekv's locator changes both: the code goes to one folder outside the package
(EDGEKV_KERNEL_CACHE, default ~/.cache/edgekv/kernels, so reinstalling the same
version keeps it), and a cached kernel is fresh only while the *contents* of every
module kernels are made from are unchanged (SOURCES_KEY), so a change to a callee
recompiles its callers instead of running stale inlined code. Numba's own data key
still holds the signature and the CPU (name and features), so one folder serves
several machines that share a home directory.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from numba.core import caching

_PACKAGE = Path(__file__).resolve().parents[1]


def kernel_cache_dir() -> Path:
    """The folder compiled kernels live in: EDGEKV_KERNEL_CACHE, else
    $XDG_CACHE_HOME/edgekv/kernels, else ~/.cache/edgekv/kernels."""
    given = os.environ.get("EDGEKV_KERNEL_CACHE")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "edgekv" / "kernels"


def _sources_key(package: Path = _PACKAGE) -> str:
    """A hash of the contents of what compiled kernels are made from: every module of
    kernels/ (kernels, intrinsics, JIT flags) and any other edgekv module with a kernel."""
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        text = path.read_bytes()
        if path.parent.name == "kernels" or b"njit" in text:
            h.update(str(path.relative_to(package)).encode() + b"\0" + text + b"\0")
    return h.hexdigest()[:16]


SOURCES_KEY = _sources_key()


class EdgeKVCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """Numba cache locator for edgekv's own modules (see the module docstring)."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = str(kernel_cache_dir() / self.get_suitable_cache_subpath(py_file))

    def get_cache_path(self) -> str:
        return self._cache_path

    def get_source_stamp(self):
        return super().get_source_stamp(), SOURCES_KEY

    @classmethod
    def from_function(cls, py_func, py_file):
        try:
            Path(py_file).resolve().relative_to(_PACKAGE)
        except ValueError:  # not edgekv's: Numba's own locators decide
            return None
        return super().from_function(py_func, py_file)  # None when the folder is not writable


def install_locator() -> None:
    """Make Numba ask EdgeKVCacheLocator first (idempotent)."""
    locators = caching.CacheImpl._locator_classes
    if EdgeKVCacheLocator not in locators:
        locators.insert(0, EdgeKVCacheLocator)


def _marker(backend: str) -> Path:
    from .cpu_features import host_cpu_name

    return kernel_cache_dir() / f"warm-{SOURCES_KEY}-{host_cpu_name()}-{backend}"


def kernels_cached(backend: str) -> bool:
    """Whether `edgekv warmup` compiled this version's kernels of `backend` for this CPU."""
    return _marker(backend).is_file()


def mark_warm(backend: str) -> None:
    marker = _marker(backend)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("compiled by `edgekv warmup`\n")
