"""Typed reads of GGUF metadata for the models: what a hyperparameter key must hold.

What lives here: `read_int` (a positive integer-typed value within int32, as llama.cpp
keeps them) and `read_float` (a finite number), each a GGUFError naming the key otherwise.
What does not: which keys an architecture reads (models/base.py, the model files, rope.py).
"""

from __future__ import annotations

import math

from ..errors import GGUFError
from ..gguf.reader import GGUFFile

MAX_HPARAM = 2**31 - 1  # llama.cpp keeps these in (u)int32


def read_int(g: GGUFFile, key: str, default: int | None = None) -> int:
    """A positive integer hyperparameter (an integer-typed GGUF value, as llama.cpp requires)."""
    value = g.get(key, default)
    if value is None:
        g.require(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise GGUFError(f"{g.path}: metadata {key!r} = {str(value)[:40]} is not an integer")
    if not 0 < value <= MAX_HPARAM:
        raise GGUFError(f"{g.path}: metadata {key!r} = {value} must be in 1..{MAX_HPARAM}")
    return value


def read_float(g: GGUFFile, key: str, default: float | None = None) -> float:
    """A finite number (an integer or float GGUF value)."""
    value = g.get(key, default)
    if value is None:
        g.require(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GGUFError(f"{g.path}: metadata {key!r} = {str(value)[:40]} is not a finite number")
    return float(value)
