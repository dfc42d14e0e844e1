"""Speculative decoding beside plain decoding and llama.cpp's llama-lookup / llama-speculative (issue 45).

Prompt lookup: for each catalog model and each prompt of benchmarks/texts/speculative_prompts.json
(code edits and quotes, which copy the prompt, and free prose, which does not), rendered with
the model's chat template into one text that both engines read: greedy decode of -n tokens,
plain and with prompt lookup. edgekv: `Llama(draft_model=PromptLookupDecoding(...))` against the
same Llama without it (the texts must be equal: the script stops otherwise); llama.cpp:
llama-lookup with --spec-draft-n-max K against the same binary with 0 drafts. The engines
alternate repetition by repetition; the figure is each side's best of -r.

Draft models (--pairs): a bandwidth-heavy target, the catalog model converted to F32 (edgekv
quantize --allow-requantize), drafted by its own catalog file (SmolLM2 Q4_1, gemma3 Q4_K_M):
edgekv `DraftModel(...)` against plain decoding of the F32 file, llama-speculative on the same pair.

    python benchmarks/speculative.py [-m NAME ...] [-n 128] [-r 2] [-t 2] [-k 16] [--pairs]
        [--llama-bin DIR]

--llama-bin: the folder with llama-lookup and llama-speculative built from the vendored llama.cpp
of llama-cpp-python 0.3.36 (cmake -DLLAMA_BUILD_EXAMPLES=ON, the flags of
../shared/reference/README.md); without it the llama.cpp columns are left out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMPTS = HERE / "texts" / "speculative_prompts.json"
MODELS = ["smollm2-135m-instruct", "gemma3-270m"]


def llama_tool(binary: Path, args: list[str]) -> tuple[float, int, int]:
    """(decode t/s, drafted, accepted) of one llama-lookup / llama-speculative run."""
    out = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=900)
    log = out.stdout + out.stderr
    if out.returncode != 0:
        raise RuntimeError(f"{binary.name} failed: {log[-2000:]}")
    speed = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", log)
    drafted = re.search(r"n_drafted\s+=\s+(\d+)", log)
    accepted = re.search(r"n_accept\s+=\s+(\d+)", log)
    return float(speed.group(1)), int(drafted.group(1)) if drafted else 0, int(accepted.group(1)) if accepted else 0


def edgekv_run(llm, text: str, n: int) -> tuple[str, float, int, int]:
    """(text, decode t/s, drafted, accepted) of one greedy completion, from an empty session: a
    session's history (which slots a reused prefix leaves, how the rest is chunked) can flip a
    near-tie, so the plain and speculative texts are compared from the same (empty) state."""
    llm.reset()
    out = llm.create_completion(text, max_tokens=n, temperature=0.0, ignore_eos=True)
    s = llm.last_stats
    return out["choices"][0]["text"], s.gen_tokens_per_s, s.draft_n or 0, s.draft_n_accepted or 0


def rendered(llm, content: str) -> str:
    return llm.chat_formatter.render([{"role": "user", "content": content}])


def best(runs: list[tuple]) -> tuple:
    return max(runs, key=lambda r: r[1])


def side_by_side(args, label: str, plain, spec, prompts, llama_plain, llama_spec) -> None:
    """A table row per prompt: plain and speculative decoding of edgekv (their texts must be
    equal), and llama.cpp's two commands (argument lists after the common ones) when built."""
    for p in prompts:
        text = rendered(plain, p["content"])
        a, b, la, lb = [], [], [], []
        for _ in range(args.r):
            a.append(edgekv_run(plain, text, args.n))
            b.append(edgekv_run(spec, text, args.n))
            if args.llama_bin:
                common = ["-m", plain.model_path, "-p", text, "-n", str(args.n), "-t", str(args.t), "--temp", "0",
                          "-c", "2048", "--ignore-eos"]
                la.append(llama_tool(args.llama_bin / llama_plain[0], common + llama_plain[1:]))
                lb.append(llama_tool(args.llama_bin / llama_spec[0], common + llama_spec[1:]))
        if a[0][0] != b[0][0]:
            raise SystemExit(f"{label} / {p['name']}: speculative text differs from plain decoding")
        (_, t0, _, _), (_, t1, d, acc) = best(a), best(b)
        row = f"| {label} | {p['name']} | {t0:.1f} | {t1:.1f} | {t1 / t0:.2f}x | {acc}/{d} |"
        if la:
            (u0, _, _), (u1, ud, ua) = best(la), best(lb)
            row += f" {u0:.1f} | {u1:.1f} | {u1 / u0:.2f}x | {ua}/{ud} |"
        else:
            row += " - | - | - | - |"
        print(row, flush=True)


def lookup_table(args, prompts) -> None:
    from edgekv import Llama, PromptLookupDecoding
    from edgekv.catalog import resolve_model

    print("| model | prompt | plain t/s | lookup t/s | speed-up | accepted | llama.cpp plain | llama-lookup | "
          "its speed-up | its accepted |\n|---|---|---|---|---|---|---|---|---|---|")
    for name in args.model:
        path = str(resolve_model(name))
        plain = Llama(path, n_ctx=2048, n_threads=args.t)
        spec = Llama(path, n_ctx=2048, n_threads=args.t,
                     draft_model=PromptLookupDecoding(max_ngram_size=args.ngram, num_pred_tokens=args.k))
        side_by_side(args, name, plain, spec, prompts, ["llama-lookup", "--spec-draft-n-max", "0"],
                     ["llama-lookup", "--spec-draft-n-max", str(args.k)])


def f32_of(name: str, folder: Path) -> Path:
    from edgekv.catalog import resolve_model
    from edgekv.cli import main

    out = folder / f"{name}-F32.gguf"
    if not out.exists():
        assert main(["quantize", "--allow-requantize", str(resolve_model(name)), str(out), "F32"]) == 0
    return out


def pair_table(args, prompts) -> None:
    from edgekv import DraftModel, Llama
    from edgekv.catalog import resolve_model

    folder = Path(os.path.expanduser("~/.cache/edgekv/bench"))
    folder.mkdir(parents=True, exist_ok=True)
    print("\n| target / draft | prompt | plain t/s | drafted t/s | speed-up | accepted | llama.cpp plain | "
          "llama-speculative | its speed-up | its accepted |\n|---|---|---|---|---|---|---|---|---|---|")
    for name in args.model:
        target, draft = str(f32_of(name, folder)), str(resolve_model(name))
        plain = Llama(target, n_ctx=2048, n_threads=args.t)
        spec = Llama(target, n_ctx=2048, n_threads=args.t, draft_model=DraftModel(draft, n_draft=args.k))
        side_by_side(args, f"{Path(target).name} / {Path(draft).name}", plain, spec, prompts,
                     ["llama-lookup", "--spec-draft-n-max", "0"],
                     ["llama-speculative", "-md", draft, "--spec-draft-n-max", str(args.k)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", nargs="*", default=MODELS)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=2)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-k", type=int, default=16, help="the most tokens drafted at once (both engines)")
    ap.add_argument("--ngram", type=int, default=2, help="edgekv's prompt lookup n-gram (llama-lookup: its own 1-4)")
    ap.add_argument("--prompts", nargs="*", default=None, help="names from the prompt file (default: all)")
    ap.add_argument("--pairs", action="store_true", help="also the draft-model pairs")
    ap.add_argument("--no-lookup", action="store_true", help="only the draft-model pairs")
    ap.add_argument("--llama-bin", type=Path, default=None)
    args = ap.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.t))
    from edgekv.system_info import machine_summary

    prompts = [p for p in json.loads(PROMPTS.read_text())["prompts"] if not args.prompts or p["name"] in args.prompts]
    print(f"Machine: {machine_summary(args.t)}; greedy, {args.n} tokens, best of {args.r}, up to {args.k} drafts\n")
    if not args.no_lookup:
        lookup_table(args, prompts)
    if args.pairs or args.no_lookup:
        pair_table(args, prompts)


if __name__ == "__main__":
    main()
