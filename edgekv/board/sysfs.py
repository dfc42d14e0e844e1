"""Reading the machine's /proc, /sys, /etc and /var files through one root.

`EDGEKV_SYSFS_ROOT` points the reads elsewhere (default /): the tests mount file trees of
real boards there, and a user can point it at a copy of a board's files to see what edgekv
would make of them. A file that is missing or unreadable reads as None.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT_VARIABLE = "EDGEKV_SYSFS_ROOT"


def path(name: str) -> Path:
    """The absolute path `name` (e.g. "/sys/class/hwmon") under the root."""
    return Path(os.environ.get(ROOT_VARIABLE) or "/") / name.lstrip("/")


def read_text(name: str | Path) -> str | None:
    """A file's text without trailing NULs and whitespace (device-tree strings end in NUL),
    or None when it cannot be read."""
    try:
        target = name if isinstance(name, Path) else path(name)
        return target.read_bytes().decode("utf-8", "replace").rstrip("\x00 \n\t")
    except OSError:
        return None


def read_int(name: str | Path) -> int | None:
    text = read_text(name)
    try:
        return None if text is None else int(text.split()[0])
    except (ValueError, IndexError):
        return None


def glob(pattern: str) -> list[Path]:
    """The paths under the root that match `pattern` (e.g. "/sys/class/hwmon/hwmon*"), sorted
    with numbers in order (hwmon2 before hwmon10)."""
    base = path("/")
    found = base.glob(pattern.lstrip("/"))
    return sorted(found, key=lambda p: [int(t) if t.isdigit() else t for t in _tokens(p.as_posix())])


def _tokens(text: str) -> list[str]:
    out, current = [], ""
    for c in text:
        if current and c.isdigit() != current[-1].isdigit():
            out.append(current)
            current = ""
        current += c
    return out + ([current] if current else [])
