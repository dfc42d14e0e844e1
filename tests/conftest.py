"""Shared fixtures: the two real models (fetched once per machine) and llama.cpp's reference data.

A test that needs a real model and cannot get it fails loudly: it is never skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REFERENCE_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "reference"


@pytest.fixture(scope="session")
def reference() -> dict:
    path = REFERENCE_DIR / "llama_cpp_reference.json"
    assert path.is_file(), f"llama.cpp reference data missing at {path} (../shared beside the repo)"
    return json.loads(path.read_text())


def _model(name: str) -> Path:
    from edgekv.catalog import ensure_model

    return ensure_model(name)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return _model("gemma3-270m")
