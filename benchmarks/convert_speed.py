"""Issue 13 item 1: `edgekv convert` against llama.cpp's convert_hf_to_gguf.py, side by side.

Each catalog model is made into a Hugging Face folder first (`edgekv convert --to-hf`, f32
safetensors: the catalog files are quantized); then for each outtype, repetition by
repetition and alternating, both converters run as whole commands (what a user waits for,
start-up and imports included), each in its own process, timed by the wall clock, with
its peak resident memory (the child's own ru_maxrss, from wait4). The outputs are checked
equal byte for byte on the way. The ratio is llama.cpp's time / edgekv's (above 1: edgekv
faster); the memory ratio is edgekv's peak / llama.cpp's. The issue's memory bound is
largest tensor x 3 + 300 MB.

    python benchmarks/convert_speed.py --llama-cpp /path/to/llama.cpp --python /path/to/python [-r 2]

--python needs torch and transformers (llama.cpp's converter's requirements); without
--llama-cpp and --python (or $LLAMA_CPP_DIR and $CONVERT_PYTHON) the script says so and exits 0.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from edgekv.system_info import machine_summary  # noqa: E402

MODELS = ("smollm2-135m-instruct", "gemma3-270m")
OUTTYPES = ("f32", "f16", "q8_0")


def run(argv: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS in MB) of one command."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(argv)}")
    return seconds, usage.ru_maxrss // 1024


def one_model(model: str, args, work: Path) -> list[str]:
    from edgekv.catalog import ensure_model

    folder = work / model  # in a child: this process stays small, and its size is what a fork starts from
    run([sys.executable, "-m", "edgekv", "convert", str(ensure_model(model)), "--to-hf", str(folder)])
    biggest = max((folder / "model.safetensors").stat().st_size // 2**20, 1)
    rows = []
    for outtype in OUTTYPES:
        ours, theirs = work / "ours.gguf", work / "theirs.gguf"
        edgekv = [sys.executable, "-m", "edgekv", "convert", str(folder), "--outtype", outtype, "-o", str(ours)]
        llama = [args.python, str(Path(args.llama_cpp) / "convert_hf_to_gguf.py"), str(folder),
                 "--outtype", outtype, "--outfile", str(theirs)]
        run(edgekv)  # warm: kernels compiled, files in the page cache
        times: dict[str, list] = {"edgekv": [], "llama": []}
        for _ in range(args.reps):
            times["llama"].append(run(llama))
            times["edgekv"].append(run(edgekv))
        assert filecmp.cmp(ours, theirs, shallow=False), f"{model} {outtype}: the files differ"
        e = statistics.median(t for t, _ in times["edgekv"])
        ll = statistics.median(t for t, _ in times["llama"])
        e_rss, l_rss = max(m for _, m in times["edgekv"]), max(m for _, m in times["llama"])
        rows.append(f"| {model} | {outtype} | {e:.2f} | {ll:.2f} | {ll / e:.2f}x | {e_rss} | {l_rss} | "
                    f"{e_rss / l_rss:.2f} |")
    print(f"({model}: safetensors {biggest} MB)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-cpp", default=os.environ.get("LLAMA_CPP_DIR"))
    ap.add_argument("--python", default=os.environ.get("CONVERT_PYTHON"))
    ap.add_argument("-r", "--reps", type=int, default=2)
    args = ap.parse_args()
    if not (args.llama_cpp and args.python):
        print("convert_speed: give --llama-cpp and --python (a Python with torch + transformers); skipped")
        return
    print(f"Machine: {machine_summary(os.cpu_count())}")
    print("| model | outtype | edgekv s | llama.cpp s | speed ratio | edgekv peak MB | llama.cpp peak MB | memory ratio |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            print("\n".join(one_model(model, args, Path(tmp))), flush=True)


if __name__ == "__main__":
    main()
