"""Regenerate tests/reference/twins.json: llama.cpp's log-probs and greedy ids on a twin of a
real 0.5B-4B model of each family (qwen2, llama, gemma3, phi3): the real shapes, vocabulary
size and Q4_K_M tensor types, random weights (edgekv/testing/twins.py).

The twins are made beforehand with this repository's own environment (the writer needs
NumPy and gguf, llama-cpp-python's virtualenv need not have them), seeded, so the same bytes
every time; the JSON records each file's sha256 and tests/test_twins_llama_cpp.py rebuilds
and checks it:

    for t in qwen2.5-0.5b llama-3.2-1b gemma-3-1b phi-3.5-mini; do
        .venv/bin/python tools/model_twin.py make $t Q4_K_M /tmp/twins/$t-Q4_K_M.gguf; done
    /tmp/lcpp/bin/python tools/make_twin_reference.py tests/reference/twins.json --twins /tmp/twins

Per twin, as tools/make_family_reference.py does for the tiny families: `greedy` (each
prompt, BOS as the vocabulary says, evaluated as one batch with all logits, then N_GREEDY
argmax steps one token at a time, with the top TOP log-probs at every position), in a
context of N_CTX tokens with flash attention off.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from make_reference import greedy_run  # noqa: E402
import make_reference  # noqa: E402

# family -> the twin (edgekv/testing/twins.py SHAPES name, file type, seed)
TWINS = {
    "qwen2": dict(name="qwen2.5-0.5b", file_type="Q4_K_M", seed=0),
    "llama": dict(name="llama-3.2-1b", file_type="Q4_K_M", seed=0),
    "gemma3": dict(name="gemma-3-1b", file_type="Q4_K_M", seed=0),
    "phi3": dict(name="phi-3.5-mini", file_type="Q4_K_M", seed=0),
}
PROMPTS = ["The quick brown fox", "Is it there? Yes, it is"]
N_CTX, N_GREEDY, TOP = 64, 16, 8
SOURCE = "llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36, CPU build), greedy = argmax of logits"


def file_name(recipe: dict) -> str:
    return f"{recipe['name']}-{recipe['file_type']}.gguf"


def twin_reference(path: Path, recipe: dict) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=N_CTX, n_batch=N_CTX, n_threads=2, logits_all=True, flash_attn=False,
                          verbose=False)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llm._model.vocab))
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    out = dict(recipe=recipe, sha256=digest.hexdigest(), n_ctx=N_CTX, add_bos=add_bos, greedy=[])
    for prompt in PROMPTS:
        ids = llm.tokenize(prompt.encode(), add_bos=add_bos, special=False)
        out["greedy"].append(dict(prompt=prompt, **greedy_run(llm, ids, N_GREEDY, stop_at_eog=False)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the JSON file to write")
    parser.add_argument("--twins", type=Path, required=True, help="the folder the twins were made in")
    args = parser.parse_args(argv)
    make_reference.TOP = TOP
    twins = {}
    for family, recipe in TWINS.items():
        twins[family] = twin_reference(args.twins / file_name(recipe), recipe)
        print(family, twins[family]["greedy"][0]["greedy_ids"], flush=True)
    args.out.write_text(json.dumps({"source": SOURCE, "twins": twins}, indent=1, ensure_ascii=False))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
