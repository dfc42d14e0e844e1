"""SmolLM2's greedy continuation of the first reference prompt, printed as one line of ids.

tools/test_aarch64.sh runs it on the x86 host (`python -m tests.aarch64.greedy_ids`) and
test_on_arm.py runs the same function in the emulated arm64 root, so the two machines'
ids are compared with each other and with llama.cpp's (tests/reference/).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

REFERENCE = Path(__file__).resolve().parents[1] / "reference" / "llama_cpp_reference.json"
MODEL_KEY = "smollm2-135m-instruct-q4_1"  # its key in the reference file
N_TOKENS = 16


def reference_case() -> dict:
    """llama.cpp's record of the first greedy prompt for SmolLM2 (prompt_ids, greedy_ids, ...)."""
    return json.loads(REFERENCE.read_text())["models"][MODEL_KEY]["greedy"][0]


def greedy_ids(n: int = N_TOKENS) -> list[int]:
    """The first n greedy ids after the prompt, one token evaluated at a time (the exact path)."""
    from edgekv.catalog import ensure_model
    from edgekv.loader import load

    case = reference_case()
    session = load(ensure_model("smollm2-135m-instruct")).session(n_ctx=128)
    session.eval(case["prompt_ids"])
    ids = []
    for _ in range(n):
        ids.append(int(np.argmax(session.logits)))
        session.eval([ids[-1]])
    return ids


if __name__ == "__main__":
    print(" ".join(map(str, greedy_ids())))
