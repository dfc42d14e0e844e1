"""Regenerate tests/reference/imatrix.json: what llama-imatrix computes on the catalog models.

For each catalog model, llama-imatrix (built from llama-cpp-python 0.3.36's `vendor/llama.cpp`
as tests/reference/README.md says) runs over gpl3.txt with -c N_CTX --chunks CHUNKS, 2 threads.
Recorded per model: its final PPL; the file's size (its layout, which edgekv's writer must
match); and per entry the token count, the sum and L2 norm of the column values, and COLUMNS
columns spread over the row (the values themselves differ from edgekv's in float rounding: each
runtime rounds its activations its own way).

    python tools/make_imatrix_reference.py --llama-imatrix /path/to/build/bin/llama-imatrix
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgekv.catalog import resolve_model  # noqa: E402
from edgekv.gguf.reader import GGUFFile  # noqa: E402

TEXT = REPO / "tests/reference/gpl3.txt"
MODELS = ("smollm2-135m-instruct", "gemma3-270m")
N_CTX = 256
CHUNKS = 3
COLUMNS = 32


def columns(n: int) -> list[int]:
    """The sampled columns of a row of n values."""
    return sorted({int(i) for i in np.linspace(0, n - 1, COLUMNS)})


def summarize(path: Path) -> dict:
    """name -> {count, total, l2, cols}: an imatrix file's entries, in the recorded form."""
    g = GGUFFile(path)
    out = {}
    for name, t in g.tensors.items():
        if not name.endswith(".in_sum2"):
            continue
        base = name[: -len(".in_sum2")]
        v = np.frombuffer(t.data, np.float32).astype(np.float64)
        count = np.frombuffer(g.tensors[base + ".counts"].data, np.float32)
        out[base] = {"count": int(count[0]), "total": float(v.sum()), "l2": float(np.sqrt((v * v).sum())),
                     "cols": [float(v[i]) for i in columns(v.size)]}
    return out


def one_model(exe: str, model: str, work: Path) -> dict:
    out = work / "imatrix.gguf"
    run = subprocess.run([exe, "-m", resolve_model(model), "-f", str(TEXT), "-o", str(out), "-c", str(N_CTX),
                          "--chunks", str(CHUNKS), "-t", "2"], check=True, capture_output=True, text=True)
    ppl = re.search(r"Final estimate: PPL = ([0-9.]+)", run.stdout + run.stderr)
    if ppl is None:
        raise SystemExit(f"{model}: no final PPL in llama-imatrix's output")
    return {"ppl": float(ppl.group(1)), "file_bytes": out.stat().st_size, "entries": summarize(out)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-imatrix", required=True, help="llama.cpp's llama-imatrix binary")
    ap.add_argument("--out", default=str(REPO / "tests/reference/imatrix.json"))
    args = ap.parse_args()
    data = {"n_ctx": N_CTX, "chunks": CHUNKS, "text": TEXT.name, "columns": COLUMNS, "models": {},
            "llama_cpp": "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp, cmake Release, GGML_NATIVE=OFF "
                         "AVX2 FMA F16C AVX512 AVX512_VNNI, AMX off; llama-imatrix -t 2"}
    with tempfile.TemporaryDirectory() as work:
        for model in MODELS:
            data["models"][model] = one_model(args.llama_imatrix, model, Path(work))
            print(f"{model}: PPL {data['models'][model]['ppl']}", file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump(data, f, indent=0, sort_keys=True)
        f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
