"""Regenerate tests/reference/tiny_families.json: llama.cpp's tokens and logits for a tiny
random GGUF of each model family (qwen2, qwen3, phi3, Mistral-style llama, RoPE scalings).

The models are written by edgekv.testing.tiny_model from the recipes below (its random weights are
seeded, so the file is the same bytes every time: the JSON records each one's sha256 and
the tests check they rebuilt the same file). llama.cpp reads them through llama-cpp-python
0.3.36 built as tests/reference/README.md says; run this with that virtualenv's interpreter
after `pip install gguf==0.19.0` in it (the GGUF writer tiny_model uses):

    /tmp/lcpp/bin/python tools/make_family_reference.py tests/reference/tiny_families.json

Per family: `tokenize` (texts -> ids without BOS, special tokens parsed), and `greedy` (each
prompt, BOS as the vocabulary says, evaluated as one batch with all logits, then N_GREEDY
argmax steps one token at a time, with the top TOP log-probs at every position), in a
context of N_CTX tokens with flash attention off, as tools/make_reference.py does for the
real models.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from edgekv.testing.tiny_model import make_tiny_model  # noqa: E402
from make_reference import greedy_run  # noqa: E402
import make_reference  # noqa: E402

DIMS = dict(dim=128, n_heads=4, n_kv_heads=2, head_dim=32, ff=256)
# name -> make_tiny_model keyword arguments (JSON-able). Q8_0 weights take edgekv's exact
# path (llama.cpp's bits); "phi3" keeps F32 weights, which agree within float32 rounding
# only (backends/kernel_map.py). The sliding window of "mistral"
# is wider than any run here, because llama.cpp ignores it for `llama` GGUFs. A random model
# with tied embeddings repeats its input token (its logits are the embedding's self-
# similarity), so only "qwen2" keeps Qwen's tied output and the others untie it.
FAMILIES = {
    "qwen2": dict(arch="qwen2", weight_type="Q8_0", **DIMS),
    "qwen2-q8_0": dict(arch="qwen2", weight_type="Q8_0", seed=1, tied=False, **DIMS),
    "qwen2-yarn": dict(arch="qwen2", weight_type="Q8_0", seed=2, tied=False, metadata={
        "qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0,
        "qwen2.rope.scaling.original_context_length": 32}, **DIMS),
    "qwen3": dict(arch="qwen3", weight_type="Q8_0", tied=False, **{**DIMS, "head_dim": 64}),
    "phi3": dict(arch="phi3", weight_type="F32", rope_dims=24, **DIMS),
    "phi3-longrope": dict(arch="phi3", weight_type="Q8_0", rope_dims=24, longrope=32, **DIMS),
    # an original context (128) above the session's (64) but below llama.cpp's padded one (256)
    "phi3-longrope-padded": dict(arch="phi3", weight_type="Q8_0", seed=3, rope_dims=24, longrope=128, **DIMS),
    "mistral": dict(arch="mistral", weight_type="Q8_0", sliding_window=128, **DIMS),
    "llama-linear": dict(arch="llama", weight_type="Q8_0", metadata={
        "llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}, **DIMS),
    # IQ4_XS in every matrix (rows of 256 and 512 values): vec_dot under 8 tokens, the
    # tiled matmul from 8 (the long prompt)
    "llama-iq4_xs": dict(arch="llama", weight_type="IQ4_XS", seed=4, dim=256, n_heads=4, n_kv_heads=2, head_dim=64,
                         ff=512),
    # IQ4_NL with odd block counts (rows of 96 and 160 values): llama.cpp repacks the matrices
    # whose rows are a multiple of 8 and keeps K and V (36 rows) and the tied output in file
    # layout, summed in vec_dot's (one token) and tinyBLAS's (a prompt) orders
    "llama-iq4_nl": dict(arch="llama", weight_type="IQ4_NL", seed=5, tied=True, dim=96, n_heads=8, n_kv_heads=1,
                         head_dim=36, ff=160),
    # Q3_K; Q2_K repacked by llama.cpp where the rows are a multiple of 8 (its gemv and gemm
    # orders), K and V (36 rows) in file layout (vec_dot, and the tiled matmul from 8 tokens)
    "llama-q3_k": dict(arch="llama", weight_type="Q3_K", seed=6, dim=256, n_heads=4, n_kv_heads=2, head_dim=64,
                       ff=512),
    "llama-q2_k": dict(arch="llama", weight_type="Q2_K", seed=7, dim=256, n_heads=64, n_kv_heads=1, head_dim=36,
                       ff=512),
}
# families whose kernels change with the chunk's length also run a prompt of 8+ tokens
LONG_PROMPT = "Yes, the quick brown fox is there."
LONG_PROMPT_FAMILIES = ("llama-iq4_xs", "llama-iq4_nl", "llama-q3_k", "llama-q2_k")
TEXTS = ["Hello world", " Hello world", "The quick brown fox jumps over the lazy dog.",
         "tabs\tand\nnew\n\nlines", "numbers 1234567890 and 3.14159", "it's don't we'll"]
SPECIAL_TEXTS = {"qwen": "<|im_start|>user\nhi<|im_end|>", "phi3": "<|user|>\nhi<|end|>\n<|assistant|>",
                 "mistral": "<s>[INST] hi [/INST]", "llama": "<|im_start|>user\nhi<|im_end|>"}
PROMPTS = ["The quick brown fox", "Is it there? Yes, it is"]
N_CTX, N_GREEDY, TOP = 64, 16, 8
SOURCE = "llama.cpp 0c1e570 (vendored in llama-cpp-python 0.3.36, CPU build), greedy = argmax of logits"


def family_reference(name: str, path: Path, recipe: dict) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=N_CTX, n_batch=N_CTX, n_threads=2, logits_all=True, flash_attn=False,
                          verbose=False)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llm._model.vocab))
    special = SPECIAL_TEXTS[recipe["arch"][:4] if recipe["arch"].startswith("qwen") else recipe["arch"]]
    out = dict(recipe=recipe, sha256=hashlib.sha256(path.read_bytes()).hexdigest(), n_ctx=N_CTX, add_bos=add_bos,
               tokenize=[], greedy=[])
    for text in TEXTS + [special]:
        out["tokenize"].append(dict(text=text, ids=llm.tokenize(text.encode(), add_bos=False, special=True)))
    for prompt in PROMPTS + ([LONG_PROMPT] if name in LONG_PROMPT_FAMILIES else []):
        ids = llm.tokenize(prompt.encode(), add_bos=add_bos, special=False)
        out["greedy"].append(dict(prompt=prompt, **greedy_run(llm, ids, N_GREEDY, stop_at_eog=False)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the JSON file to write")
    args = parser.parse_args(argv)
    make_reference.TOP = TOP
    families = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, recipe in FAMILIES.items():
            path = make_tiny_model(Path(folder) / f"{name}.gguf", **recipe)
            families[name] = family_reference(name, path, recipe)
            print(name, families[name]["greedy"][0]["greedy_ids"], flush=True)
    data = {"source": SOURCE, "families": families}
    args.out.write_text(json.dumps(data, indent=1, ensure_ascii=False))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
