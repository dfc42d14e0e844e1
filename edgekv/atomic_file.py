"""A file that appears under its name only when complete.

What lives here: `AtomicFile`, written under a temporary name beside its destination and
renamed over it by `commit()` (after an fsync); `discard()` removes it. A failure at any point,
disk full included, leaves no partial file and an existing one untouched. Used by the GGUF
writer (gguf/writer.py) and the KL-divergence base files (lab/kl_divergence.py).
"""

from __future__ import annotations

import os
import tempfile


class AtomicFile:
    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(self.path))
        fd, self.tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(self.path) + ".", suffix=".part")
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would outlive the rename
        self.file = os.fdopen(fd, "wb")

    def write(self, data) -> None:
        self.file.write(data)

    def commit(self) -> None:
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.tmp, self.path)
        except BaseException:
            self.discard()
            raise

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()

    def discard(self) -> None:
        try:
            self.file.close()
        except OSError:
            pass
        try:
            os.unlink(self.tmp)
        except OSError:
            pass
