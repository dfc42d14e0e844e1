"""What test_quantize.py and test_quantize_imatrix.py share: llama-quantize's recorded outputs
(tests/reference/quantize/<model>.json), the hashes they are compared by, and the quantize
command run for its status and message."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import REFERENCE_DIR, load_tool

from edgekv.cli import main

MODELS = ("smollm2-135m-instruct", "gemma3-270m")


def reference(model: str) -> dict:
    path = REFERENCE_DIR / "quantize" / f"{model}.json"
    assert path.is_file(), f"{path} missing: tools/make_quantize_reference.py makes it"
    return json.loads(path.read_text())


def file_sha(path: Path) -> str:
    return load_tool("make_quantize_reference").file_sha(path)


def short_sha(data) -> str:
    return load_tool("make_quantize_reference").sha(data)


def run_cli(capsys, *argv) -> tuple[int, str]:
    """(exit status, stderr) of `edgekv quantize argv`, the one-time note of a first compilation left out"""
    rc = main(["quantize", *map(str, argv)])
    err = capsys.readouterr().err
    return rc, "".join(line for line in err.splitlines(True) if "on first use" not in line)
