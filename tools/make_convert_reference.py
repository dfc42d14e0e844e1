"""Record llama.cpp's convert_hf_to_gguf.py outputs for tests/test_convert.py.

For each checkpoint (the two catalog models turned into Hugging Face folders by
`edgekv convert --to-hf`, and the tiny random llama / qwen2 / qwen3 of tests/hf_checkpoints.py)
and each outtype, it runs llama.cpp's converter and writes tests/reference/convert/<name>.json:
the sha256 of every input file (so a test can tell a changed input from a changed converter),
and per output the whole file's sha256 and size, every metadata entry's sha (its raw bytes:
key, value type, value) and every tensor's type, shape and sha.

    python tools/make_convert_reference.py --llama-cpp /path/to/llama.cpp --python /path/to/python

--python must have torch and transformers (the converter's requirements); edgekv runs in the
interpreter that runs this script. Made with llama-cpp-python 0.3.36's vendor/llama.cpp,
torch 2.13.0+cpu, transformers 4.57.6.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tools")]

from hf_checkpoints import TINY, real_checkpoint, tiny_checkpoint  # noqa: E402
from make_quantize_reference import file_sha, sha  # noqa: E402

from edgekv.catalog import resolve_model  # noqa: E402
from edgekv.gguf.reader import GGUFFile  # noqa: E402

REAL = {"smollm2-135m-instruct": ("f32", "f16", "bf16", "q8_0"), "gemma3-270m": ("f32", "f16", "bf16", "q8_0")}
TINY_OUTTYPES = {"tiny-llama": ("auto", "q8_0"), "tiny-qwen2": ("auto", "f16"), "tiny-qwen3": ("auto", "q8_0")}
OUT = ROOT / "tests" / "reference" / "convert"


def describe(path: Path) -> dict:
    """What the tests compare: whole file, each metadata entry, each tensor."""
    g = GGUFFile(path)
    return {"file_sha256": file_sha(path), "bytes": path.stat().st_size,
            "kv": {k: sha(g.raw_kv(k)) for k in g.metadata},
            "tensors": {n: [int(t.ggml_type), list(t.shape), sha(t.data)] for n, t in g.tensors.items()}}


def inputs(folder: Path) -> dict:
    return {p.name: file_sha(p) for p in sorted(folder.iterdir()) if p.is_file()}


def record(name: str, folder: Path, outtypes, args, work: Path) -> None:
    entry = {"llama_cpp": args.label, "checkpoint": name, "inputs": inputs(folder), "outputs": {}}
    for outtype in outtypes:
        out = work / f"{name}-{outtype}.gguf"
        subprocess.run([args.python, str(Path(args.llama_cpp) / "convert_hf_to_gguf.py"), str(folder),
                        "--outtype", outtype, "--outfile", str(out)], check=True, capture_output=True)
        entry["outputs"][outtype] = describe(out)
        out.unlink()
        print(f"{name} {outtype}: {entry['outputs'][outtype]['file_sha256'][:16]}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(entry, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source tree (its convert_hf_to_gguf.py)")
    ap.add_argument("--python", required=True, help="a Python with torch and transformers")
    ap.add_argument("--label", default="llama-cpp-python 0.3.36 sdist vendor/llama.cpp convert_hf_to_gguf.py, "
                                        "torch 2.13.0+cpu, transformers 4.57.6")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for model, outtypes in REAL.items():
            folder = real_checkpoint(resolve_model(model), work / model)
            record(model, folder, outtypes, args, work)
        for name in TINY:
            folder = tiny_checkpoint(name, work / "smollm2-135m-instruct", work / name)
            record(name, folder, TINY_OUTTYPES[name], args, work)


if __name__ == "__main__":
    main()
