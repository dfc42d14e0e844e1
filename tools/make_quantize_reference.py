"""Regenerate tests/reference/quantize/: what llama-quantize writes for our two real models.

For each model, llama-quantize (built from the llama.cpp in llama-cpp-python 0.3.36's sdist,
`vendor/llama.cpp`, with the CPU flags of tests/reference/README.md; the quantizers live in
ggml's base library, compiled with no architecture flags, so no FMA contraction) makes:

1. the sources: the catalog GGUF dequantized to F32 and to F16 (`--allow-requantize`);
2. from each source, every file type `edgekv quantize` offers, and a few flag variants.

Recorded per model, in `<model>.json`: each source's per-tensor sha256; each output's
per-tensor type (the "plan"), its whole-file sha256 and size; and the sha256 of every
(tensor, type) pair that occurs, per source. Hashes are cut to 16 hex digits (64 bits).

    python tools/make_quantize_reference.py --llama-quantize /path/to/build/bin/llama-quantize

Models come from edgekv's model cache (`edgekv pull NAME`). Takes ~15 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgekv.catalog import resolve_model  # noqa: E402
from edgekv.gguf.reader import GGUFFile  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402

MODELS = ("smollm2-135m-instruct", "gemma3-270m")
SOURCES = ("F32", "F16")
FILE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
              "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K",
              "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_NL", "IQ4_XS")
# (label, flags, file type), from the F16 source
VARIANTS = (
    ("Q4_K_M --pure", ["--pure"], "Q4_K_M"),
    ("Q6_K --pure", ["--pure"], "Q6_K"),
    ("Q4_K_M --output-tensor-type q8_0 --token-embedding-type q4_0",
     ["--output-tensor-type", "q8_0", "--token-embedding-type", "q4_0"], "Q4_K_M"),
    ("Q5_K_S --leave-output-tensor", ["--leave-output-tensor"], "Q5_K_S"),
    ("Q2_K --pure", ["--pure"], "Q2_K"),  # Q2_K itself: the mixture keeps it off rows of 256s
    ("IQ4_XS --pure", ["--pure"], "IQ4_XS"),
)
# (flags, file types) quantized from the F16 source with a synthetic importance matrix
# (`synthetic_imatrix`); the file is passed by the relative name, which the output records
IMATRIX_RUNS = (
    (["--imatrix", "imatrix.gguf"], ("Q2_K_S", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_NL", "IQ4_XS",
                                     "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")),
    (["--imatrix", "imatrix.dat"], ("Q3_K_M", "IQ4_XS")),
    (["--imatrix", "imatrix.gguf", "--exclude-weights", "ffn_down"], ("IQ4_XS", "Q4_0")),
    (["--imatrix", "imatrix.gguf", "--include-weights", "attn_v", "--include-weights", "ffn_up"], ("Q3_K_M",)),
)
SHORT = 16


def sha(data) -> str:
    return hashlib.sha256(memoryview(data)).hexdigest()[:SHORT]


def file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def quantize(exe: str, src: Path, dst: Path, ftype: str, flags=(), cwd=None) -> None:
    cmd = [exe, *flags, str(src), str(dst), ftype, "2"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)


def synthetic_imatrix(model: Path, folder: Path) -> None:
    """imatrix.gguf and imatrix.dat in `folder` for the GGUF model: one entry per block weight
    matrix as llama-imatrix makes (column sums of squared activations over counts), values
    drawn from a seeded generator per name; one entry with a zero count (its weights become
    1.0) and one naming no tensor of the model, as files made on other models have."""
    import zlib

    import numpy as np

    from edgekv.quantize.imatrix import write_imatrix, write_imatrix_dat

    g = GGUFFile(model)
    names = [n for n, t in g.tensors.items() if n.startswith("blk.") and len(t.shape) == 2]
    stats = {}
    for n in [*names, "blk.999.ffn_up.weight"]:
        ne0 = g.tensors[n].shape[0] if n in g.tensors else 64
        rng = np.random.default_rng(zlib.crc32(n.encode()))
        count = 0.0 if n == "blk.1.attn_k.weight" else float(512 * int(rng.integers(1, 9)))
        stats[n] = (np.exp(rng.normal(0.0, 1.5, ne0)).astype(np.float32) * np.float32(max(count, 1.0)),
                    np.array([count], np.float32))
    write_imatrix(folder / "imatrix.gguf", stats, ["synthetic.txt"], 7, 512)
    values = {n: np.where(c[0] > 0, s / np.float32(c[0] if c[0] else 1.0), np.float32(1.0)) * np.float32(3.0)
              for n, (s, c) in stats.items()}
    write_imatrix_dat(folder / "imatrix.dat", values, dict.fromkeys(values, 3), 7, "synthetic.txt")


def record_output(path: Path, pairs: dict) -> dict:
    g = GGUFFile(path)
    plan = {}
    for name, t in g.tensors.items():
        tname = T(t.ggml_type).name
        plan[name] = tname
        h = sha(t.data)
        old = pairs.setdefault(name, {}).setdefault(tname, h)
        if old != h:
            raise SystemExit(f"{path}: {name} as {tname} hashes {h}, earlier output {old}")
    return {"plan": plan, "file_sha256": file_sha(path), "bytes": path.stat().st_size}


def one_model(exe: str, model: str, work: Path, old: dict | None = None) -> dict:
    """old: the model's earlier record; its outputs are kept and only new labels are run."""
    orig = Path(resolve_model(model))
    out = {"model": model, "source_file": orig.name, "sources": {}}
    for src_type in SOURCES:
        src = work / f"{model}-{src_type}.gguf"
        quantize(exe, orig, src, src_type, ["--allow-requantize"])
        g = GGUFFile(src)
        entry = {"file_sha256": file_sha(src), "tensors": {n: sha(t.data) for n, t in g.tensors.items()},
                 "outputs": {}, "pairs": {}}
        if old:
            kept = old["sources"][src_type]
            if kept["file_sha256"] != entry["file_sha256"]:
                raise SystemExit(f"{model} {src_type}: the source differs from the recorded one; rerun without --update")
            entry["outputs"], entry["pairs"] = kept["outputs"], kept["pairs"]
            if "imatrix" in kept:
                entry["imatrix"] = kept["imatrix"]
        pairs = entry["pairs"]
        runs = [(ft, [], ft) for ft in FILE_TYPES] + (list(VARIANTS) if src_type == "F16" else [])
        for label, flags, ftype in runs:
            if label in entry["outputs"]:
                continue
            dst = work / "out.gguf"
            quantize(exe, src, dst, ftype, flags)
            entry["outputs"][label] = record_output(dst, pairs)
            dst.unlink()
            print(f"{model} {src_type} -> {label}", file=sys.stderr)
        if src_type == "F16":
            imatrix_outputs(exe, src, work, entry, old)
        out["sources"][src_type] = entry
        src.unlink()
    return out


def imatrix_outputs(exe: str, src: Path, work: Path, entry: dict, old: dict | None) -> None:
    """entry["imatrix"][flags] = {"outputs": {label: record}, "pairs": ...}: the pairs of a set of
    imatrix flags are its own (the same tensor and type differ with other weights)."""
    synthetic_imatrix(src, work)
    entry.setdefault("imatrix", {})
    for flags, ftypes in IMATRIX_RUNS:
        key = " ".join(flags)
        run = entry["imatrix"].setdefault(key, {"outputs": {}, "pairs": {}})
        for ftype in ftypes:
            if ftype in run["outputs"]:
                continue
            dst = work / "out.gguf"
            quantize(exe, src, dst, ftype, flags, cwd=work)
            run["outputs"][ftype] = record_output(dst, run["pairs"])
            dst.unlink()
            print(f"{src.name} -> {ftype} {key}", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-quantize", required=True, help="llama.cpp's llama-quantize binary")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests/reference/quantize"))
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--update", action="store_true", help="keep the recorded outputs, run only new ones")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        for model in args.models:
            path = Path(args.out) / f"{model}.json"
            old = json.loads(path.read_text()) if args.update and path.is_file() else None
            data = one_model(args.llama_quantize, model, Path(work), old)
            data["llama_cpp"] = ("llama-cpp-python 0.3.36 sdist, vendor/llama.cpp, cmake Release, "
                                 "GGML_NATIVE=OFF AVX2 FMA F16C AVX512 AVX512_VNNI, AMX off")
            with open(Path(args.out) / f"{model}.json", "w") as f:
                json.dump(data, f, indent=0, sort_keys=True)
                f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
