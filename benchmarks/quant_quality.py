"""Issue 44 item 4: what each low-bit file type costs in size and quality, edgekv beside llama.cpp.

For each catalog model: an F16 made from the catalog file (`edgekv quantize --allow-requantize
... F16`, llama-quantize's bytes), an importance matrix `edgekv imatrix` makes from that F16 over
benchmarks/texts/apache-2.0.txt (-c 256: calibration text apart from the evaluation text), then
each file type with and without it (`edgekv quantize`, checked equal to llama-quantize's file).
For each file: size, bits per weight (tensor data of the whole file over the weights' element
count), and PPL and mean KL divergence against the F16 on gpl3.txt (-c 512, --chunks N), measured
by `edgekv perplexity --kl-divergence` (tokens one by one, as llama-perplexity rounds activations)
and by llama-perplexity --kl-divergence, each against a base its own runtime saved from the F16.

    python benchmarks/quant_quality.py --llama-perplexity PATH --llama-quantize PATH [--chunks 3]

Both tools come from the flags or $LLAMA_PERPLEXITY / $LLAMA_QUANTIZE (built as
tests/reference/README.md says); without them the script says so and exits 0.
"""

from __future__ import annotations

import argparse
import math
import filecmp
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

MODELS = ("smollm2-135m-instruct", "gemma3-270m")
# (file type, with the importance matrix); Q2_K_S is made only with one, as llama.cpp requires
FILES = (("Q4_K_M", False), ("Q4_K_M", True), ("IQ4_XS", False), ("IQ4_XS", True), ("IQ4_NL", False),
         ("IQ4_NL", True), ("Q3_K_L", False), ("Q3_K_L", True), ("Q3_K_M", False), ("Q3_K_M", True),
         ("Q3_K_S", False), ("Q3_K_S", True), ("Q2_K", False), ("Q2_K", True), ("Q2_K_S", True))
EVAL = REPO / "tests/reference/gpl3.txt"
CALIBRATION = REPO / "benchmarks/texts/apache-2.0.txt"
N_CTX = 512


def sh(cmd) -> str:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(map(str, cmd[:4]))}... failed:\n{done.stderr[-2000:]}")
    return done.stdout + done.stderr


def edgekv(*args) -> list:
    return [sys.executable, "-m", "edgekv", *args]


def bits_per_weight(path: Path) -> float:
    from edgekv.gguf.reader import GGUFFile

    g = GGUFFile(path)
    n = sum(math.prod(t.shape) for t in g.tensors.values())
    return 8.0 * sum(t.data.size for t in g.tensors.values()) / n


def quality(tool: str, model: Path, base: Path) -> tuple[float, float]:
    """(PPL of the file, mean KLD against the base) from a --kl-divergence run."""
    from make_kld_reference import parse_statistics

    if tool == "edgekv":
        text = sh(edgekv("perplexity", "-m", model, "--kl-divergence-base", base, "--kl-divergence"))
    else:
        text = sh([tool, "-m", model, "-t", "2", "--kl-divergence-base", base, "--kl-divergence"])
    stats = parse_statistics(text)
    return stats["Mean PPL(Q)"][0], stats["Mean    KLD"][0]


def one_model(model: str, exe_ppl: str, exe_quant: str, chunks: int, work: Path) -> list[str]:
    from edgekv.catalog import ensure_model

    f16 = work / f"{model}-F16.gguf"
    sh(edgekv("quantize", "--allow-requantize", ensure_model(model), f16, "F16"))
    imatrix = work / "imatrix.gguf"
    sh(edgekv("imatrix", "-m", f16, "-f", CALIBRATION, "-o", imatrix, "-c", "256", "--no-ppl"))
    bases = {"edgekv": work / "base-edgekv.kld", exe_ppl: work / "base-llama.kld"}
    common = ["-f", EVAL, "-c", N_CTX, "--chunks", chunks]
    sh(edgekv("perplexity", "-m", f16, *common, "--kl-divergence-base", bases["edgekv"]))
    sh([exe_ppl, "-m", f16, "-t", "2", *common, "--kl-divergence-base", bases[exe_ppl]])
    rows = []
    for ftype, with_imatrix in FILES:
        flags = ["--imatrix", imatrix] if with_imatrix else []
        ours, theirs = work / "ours.gguf", work / "theirs.gguf"
        sh(edgekv("quantize", *flags, f16, ours, ftype))
        sh([exe_quant, *flags, f16, theirs, ftype])
        if not filecmp.cmp(ours, theirs, shallow=False):
            raise SystemExit(f"{model} {ftype}: edgekv's file differs from llama-quantize's")
        ppl_e, kld_e = quality("edgekv", ours, bases["edgekv"])
        ppl_l, kld_l = quality(exe_ppl, ours, bases[exe_ppl])
        rows.append(f"| {model} | {ftype} | {'yes' if with_imatrix else 'no'} | {ours.stat().st_size / 2**20:.1f} | "
                    f"{bits_per_weight(ours):.2f} | {ppl_e:.3f} | {ppl_l:.3f} | {kld_e:.5f} | {kld_l:.5f} |")
        print(rows[-1], file=sys.stderr, flush=True)
    ppl_f16 = quality("edgekv", f16, bases["edgekv"])[0], quality(exe_ppl, f16, bases[exe_ppl])[0]
    rows.insert(0, f"| {model} | F16 | - | {f16.stat().st_size / 2**20:.1f} | {bits_per_weight(f16):.2f} | "
                   f"{ppl_f16[0]:.3f} | {ppl_f16[1]:.3f} | 0 | 0 |")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-perplexity", default=os.environ.get("LLAMA_PERPLEXITY"))
    ap.add_argument("--llama-quantize", default=os.environ.get("LLAMA_QUANTIZE"))
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    args = ap.parse_args(argv)
    tools = (args.llama_perplexity, args.llama_quantize)
    if not all(t and os.access(t, os.X_OK) for t in tools):
        print("quant_quality: skipped: pass --llama-perplexity PATH and --llama-quantize PATH (or set "
              "LLAMA_PERPLEXITY / LLAMA_QUANTIZE)", file=sys.stderr)
        return 0
    from edgekv.system_info import machine_summary

    print(f"Machine: {machine_summary(os.cpu_count())}; gpl3.txt, -c {N_CTX}, {args.chunks} chunks; "
          f"imatrix from apache-2.0.txt (-c 256)")
    print("| model | type | imatrix | MiB | bits/weight | PPL edgekv | PPL llama.cpp | mean KLD edgekv | "
          "mean KLD llama.cpp |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for model in args.models:
            print("\n".join(one_model(model, *tools, args.chunks, Path(work))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
