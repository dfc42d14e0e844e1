"""Regenerate tests/reference/kl_divergence.json: llama-perplexity's KL-divergence statistics.

For each case, llama-perplexity (built from llama-cpp-python 0.3.36's `vendor/llama.cpp`, as
tests/reference/README.md says) first saves the base's log-probabilities
(`--kl-divergence-base FILE`, gpl3.txt, -c 512, --chunks N), then compares another model or
cache type against them (`--kl-divergence`). Recorded: the statistics it prints after
"====== Perplexity statistics ======" (parsed into numbers), and the sha256 of the base file's
header and tokens (the part that does not depend on the arithmetic).

    python tools/make_kld_reference.py --llama-perplexity /path/to/llama-perplexity \\
        --llama-quantize /path/to/llama-quantize

The SmolLM2 model comparison quantizes the catalog file to F16 and Q4_K_M with llama-quantize.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgekv.catalog import resolve_model  # noqa: E402

TEXT = REPO / "tests/reference/gpl3.txt"
N_CTX = 512
# name -> (base model, base cache type, model, cache type, chunks); "f16-source" and
# "q4_k_m" are the catalog SmolLM2 requantized by llama-quantize
CASES = {
    "smollm2-cache-q4_0": ("smollm2-135m-instruct", "f16", "smollm2-135m-instruct", "q4_0", 6),
    "smollm2-model-q4_k_m": ("f16-source", "f16", "q4_k_m", "f16", 6),
    "gemma3-cache-q8_0": ("gemma3-270m", "f16", "gemma3-270m", "q8_0", 3),
}
_NUMBER = r"(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?|-?nan|-?inf)"


def parse_statistics(text: str) -> dict:
    """llama-perplexity's final report -> {label: value or [value, uncertainty]}."""
    out = {}
    body = text[text.index("====== Perplexity statistics ======"):]
    for line in body.splitlines():
        if ":" not in line or line.startswith("="):
            continue
        label, _, rest = line.partition(":")
        nums = [float(x) for x in re.findall(_NUMBER, rest)]
        if nums:
            out[label.strip()] = nums if len(nums) > 1 else nums[0]
        if label.startswith("Same top p"):  # the last line; log lines may follow
            break
    return out


def run(exe: str, model: Path, cache: str, extra: list[str], n_ctx: int = N_CTX) -> str:
    cmd = [exe, "-m", str(model), "-c", str(n_ctx), "-t", "2", "-ctk", cache, "-ctv", cache, *extra]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return done.stdout + done.stderr


def tiny_case(exe: str, work: Path) -> dict:
    """A tiny random llama (vocabulary 307): llama-perplexity's base files for its f16 and its
    q4_0 cache, kept in tests/reference/kld/ (~150 KB each), and its statistics of the second
    against the first: the test recomputes them from the two files alone."""
    from edgekv.testing.tiny_model import make_tiny_model

    model = make_tiny_model(work / "tiny.gguf", dim=128, head_dim=32, ff=256)  # q4_0 rows: 32-value heads
    folder = REPO / "tests/reference/kld"
    folder.mkdir(exist_ok=True)
    common = ["-f", str(TEXT), "--chunks", "8"]
    for cache in ("f16", "q4_0"):
        run(exe, model, cache, [*common, "--kl-divergence-base", str(folder / f"tiny-{cache}.kld")], n_ctx=64)
    text = run(exe, model, "q4_0", ["--kl-divergence-base", str(folder / "tiny-f16.kld"), "--kl-divergence"],
               n_ctx=64)
    return {"model": "edgekv.testing.tiny_model.make_tiny_model(path, dim=128, head_dim=32, ff=256) (llama, F32, seed 0)", "n_ctx": 64, "chunks": 8,
            "base": "tiny-f16.kld", "compared": "tiny-q4_0.kld", "statistics": parse_statistics(text)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-perplexity", required=True)
    ap.add_argument("--llama-quantize", required=True)
    ap.add_argument("--out", default=str(REPO / "tests/reference/kl_divergence.json"))
    args = ap.parse_args()
    result = {"method": f"llama-perplexity -f gpl3.txt -c {N_CTX} -t 2 --chunks N, flash attention as its default; "
                        "base: --kl-divergence-base FILE; then --kl-divergence-base FILE --kl-divergence",
              "cases": {}}
    with tempfile.TemporaryDirectory() as work:
        smollm2 = resolve_model("smollm2-135m-instruct")
        files = {"f16-source": Path(work) / "f16.gguf", "q4_k_m": Path(work) / "q4km.gguf"}
        subprocess.run([args.llama_quantize, "--allow-requantize", str(smollm2), str(files["f16-source"]), "F16"],
                       check=True, capture_output=True)
        subprocess.run([args.llama_quantize, str(files["f16-source"]), str(files["q4_k_m"]), "Q4_K_M"],
                       check=True, capture_output=True)
        for name, (base, base_cache, model, cache, chunks) in CASES.items():
            paths = [files[m] if m in files else resolve_model(m) for m in (base, model)]
            kld = Path(work) / "base.kld"
            run(args.llama_perplexity, paths[0], base_cache,
                ["-f", str(TEXT), "--chunks", str(chunks), "--kl-divergence-base", str(kld)])
            with open(kld, "rb") as f:
                head = f.read(20)
                n_ctx, n_vocab, n_chunk = (int.from_bytes(head[i:i + 4], "little") for i in (8, 12, 16))
                tokens = f.read(4 * n_ctx * n_chunk)
            text = run(args.llama_perplexity, paths[1], cache, ["--kl-divergence-base", str(kld), "--kl-divergence"])
            result["cases"][name] = {
                "base": [base, base_cache], "compared": [model, cache], "chunks": chunks,
                "base_file_head_sha256": hashlib.sha256(head + tokens).hexdigest(),
                "statistics": parse_statistics(text)}
            print(name, result["cases"][name]["statistics"].get("Mean    KLD"), file=sys.stderr)
            kld.unlink()
        result["tiny"] = tiny_case(args.llama_perplexity, Path(work))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
