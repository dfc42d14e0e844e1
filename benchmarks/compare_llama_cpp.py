"""edgekv beside llama.cpp on the same GGUF and settings, measured in one run (issues 4, 19).

Both sides time llama-bench's tests the llama-bench way: edgekv through edgekv/lab/bench.py
(what `edgekv bench` runs), llama.cpp through llama-cpp-python's low-level API in
_llama_cpp_worker.py, a subprocess of the interpreter that has `llama_cpp` (edgekv's venv
need not). The two alternate repetition by repetition (edgekv, llama.cpp, edgekv, ...) so
that noise from a shared machine hits both alike. Prints a Markdown table with both t/s and
the ratio edgekv / llama.cpp; -o json prints both sides' llama-bench records instead.

The targets, all with 512-token chunks, on both catalog models: pp512, tg128, and the depth
sweep of issue 19: tg64 with d = 0, 1024, 4096, 8192, 16384 tokens already in the cache, K and
V in f16, q8_0 and q4_0. A depth the model was not trained for is run at the deepest it was
(d + 64 = its context; SmolLM2: 8128) and named so in the table. The first line printed is the
machine (CPU model, features, int8 kernels, threads): results from two machines are never one.

    python benchmarks/compare_llama_cpp.py [-m NAME,...] [--tests pp,tg,depth] [-p 512] [-n 128]
        [-d 0,1024,4096,8192,16384] [--depth-gen 64] [-ct f16,q8_0,q4_0] [-r 3] [-t THREADS]
        [-o md|json] [--llama-python PYTHON] [--flash-attn auto|on|off]

--llama-python defaults to $LLAMA_CPP_PYTHON, else this interpreter if it can import
llama_cpp; when neither is there the comparison is skipped with a message. A quick smoke
run: -r 1 -p 16 -n 4 -d 64 --depth-gen 4.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).resolve().with_name("_llama_cpp_worker.py")
TARGETS = {"smollm2-135m-instruct": ("pp", "tg", "depth"), "gemma3-270m": ("pp", "tg", "depth")}
DEPTHS = "0,1024,4096,8192,16384"
TEST_KINDS = ("pp", "tg", "depth")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=",".join(TARGETS),
                    help="catalog names or GGUF paths, comma-separated (default: %(default)s)")
    ap.add_argument("--tests", default=",".join(TEST_KINDS),
                    help="kinds of test to run where a model has them: pp, tg, depth (default: all)")
    ap.add_argument("-p", type=int, default=512, help="prompt length of the pp test (default: 512)")
    ap.add_argument("-n", type=int, default=128, help="generation length of the tg test (default: 128)")
    ap.add_argument("-d", default=DEPTHS, help="depths of the depth tests, comma-separated (default: %(default)s)")
    ap.add_argument("--depth-gen", type=int, default=64, help="tokens decoded at depth (default: 64)")
    ap.add_argument("-ct", default="f16,q8_0,q4_0", help="cache types of the depth tests, K and V alike "
                                                          "(default: %(default)s)")
    ap.add_argument("-r", type=int, default=3, help="repetitions per test and engine (default: 3)")
    ap.add_argument("-t", type=int, default=os.cpu_count() or 1, help="threads, both engines (default: all cores)")
    ap.add_argument("-o", choices=("md", "json"), default="md", help="output format (default: md)")
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_CPP_PYTHON"),
                    help="interpreter with llama-cpp-python (default: $LLAMA_CPP_PYTHON, else this one if it "
                         "has llama_cpp)")
    ap.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto",
                    help="llama.cpp's flash attention (default: auto, as llama-bench)")
    args = ap.parse_args(argv)
    for name in ("p", "n", "depth_gen", "r", "t"):
        if getattr(args, name) < 1:
            ap.error(f"-{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    try:
        args.d = [int(d) for d in args.d.split(",")]
    except ValueError:
        ap.error(f"-d: expected comma-separated token counts, got {args.d!r}")
    if min(args.d) < 0:
        ap.error(f"-d: depths must be >= 0, got {args.d}")
    unknown = set(args.tests.split(",")) - set(TEST_KINDS)
    if unknown:
        ap.error(f"--tests: unknown kinds {sorted(unknown)} (choose from {', '.join(TEST_KINDS)})")
    return args


def planned_tests(name: str, args: argparse.Namespace, n_ctx_train: int) -> list:
    """The BenchTests for one model: its targets, as selected by --tests; a depth beyond the
    trained context is run at the deepest that fits (once)."""
    from edgekv.lab.bench import BenchTest

    wanted = [kind for kind in TARGETS.get(name, TEST_KINDS) if kind in args.tests.split(",")]
    tests = []
    if "pp" in wanted:
        tests.append(BenchTest(args.p, 0, n_threads=args.t))
    if "tg" in wanted:
        tests.append(BenchTest(0, args.n, n_threads=args.t))
    if "depth" in wanted:
        depths = list(dict.fromkeys(min(d, n_ctx_train - args.depth_gen) for d in args.d))
        tests += [BenchTest(0, args.depth_gen, d, type_k=ct, type_v=ct, n_threads=args.t)
                  for ct in args.ct.split(",") for d in depths]
    return tests


class LlamaCppWorker:
    """The worker subprocess: `call(op, **fields)` sends one request and returns its reply."""

    def __init__(self, python: str):
        try:
            self.proc = subprocess.Popen([python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True)
        except OSError as exc:
            raise SystemExit(f"compare_llama_cpp: cannot start the llama.cpp worker with {python}: {exc}") from None
        self.version = self._reply("start")["version"]

    def call(self, op: str, **fields) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        return self._reply(op)

    def _reply(self, op: str) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"compare_llama_cpp: the llama.cpp worker ended during {op!r} "
                             f"(exit status {self.proc.wait()}); see its messages above")
        reply = json.loads(line)
        if not reply.pop("ok"):
            raise SystemExit(f"compare_llama_cpp: llama.cpp {op}: {reply['error']}")
        return reply

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def measure(model, worker: LlamaCppWorker, test, repetitions: int, flash_attn: str) -> tuple[list, list]:
    """Warm both engines up, then alternate: one edgekv repetition, one llama.cpp repetition, ..."""
    from edgekv.lab.bench import BenchRunner

    runner = BenchRunner(model, test)
    worker.call("open", n_prompt=test.n_prompt, n_gen=test.n_gen, n_depth=test.n_depth, n_batch=test.n_batch,
                n_threads=test.n_threads, type_k=test.type_k, type_v=test.type_v, flash_attn=flash_attn)
    edgekv_ns, llama_ns = [], []
    for i in range(repetitions):
        edgekv_ns.append(runner.sample())
        llama_ns.append(worker.call("sample")["ns"])
        print(f"  {test.name} {test.type_k}/{test.type_v}: repetition {i + 1}/{repetitions}: edgekv "
              f"{1e9 * test.n_tokens / edgekv_ns[-1]:.1f} t/s, llama.cpp {1e9 * test.n_tokens / llama_ns[-1]:.1f} t/s",
              file=sys.stderr, flush=True)
    worker.call("close")
    return edgekv_ns, llama_ns


def md_row(name: str, ours, theirs) -> str:
    t = ours.test
    return (f"| {name} | {t.name} | {t.type_k}/{t.type_v} | {ours.avg_ts:.1f} ± {ours.stddev_ts:.1f} | "
            f"{theirs.avg_ts:.1f} ± {theirs.stddev_ts:.1f} | {ours.avg_ts / theirs.avg_ts:.2f}x |")


def compare(args: argparse.Namespace, python: str) -> list[dict]:
    from edgekv.lab.bench import BenchResult, ModelInfo, check_tests, now_rfc3339
    from edgekv.catalog import resolve_model
    from edgekv.kernels.config import max_threads
    from edgekv.loader import load
    from edgekv.system_info import machine_summary

    worker = LlamaCppWorker(python)
    rows = []
    machine = machine_summary(args.t)
    if args.o == "md":
        print(f"Machine: {machine}\n", flush=True)
        print("| model | test | K/V cache | edgekv t/s | llama.cpp t/s | edgekv / llama.cpp |", flush=True)
        print("|---|---|---|---:|---:|---:|", flush=True)
    for name in args.model.split(","):
        path = resolve_model(name)
        model = load(path)
        tests = planned_tests(name, args, model.hp.n_ctx_train)
        check_tests(tests, model.hp, name, max_threads())
        info = ModelInfo.from_gguf(model.gguf)
        theirs = worker.call("load", model=str(path))
        their_info = ModelInfo(str(path), theirs["model_type"], theirs["model_size"], theirs["model_n_params"])
        for test in tests:
            test_time = now_rfc3339()
            ours_ns, theirs_ns = measure(model, worker, test, args.r, args.flash_attn)
            ours = BenchResult(info, test, test_time, ours_ns)
            llama = BenchResult(their_info, test, test_time, theirs_ns, backend="llama.cpp (CPU)")
            record = {k: v for k, v in llama.record().items() if k != "edgekv_version"}
            rows.append({"model": name, "machine": machine, "test": test.name, "type_k": test.type_k, "type_v": test.type_v,
                         "ratio": ours.avg_ts / llama.avg_ts, "edgekv": ours.record(),
                         "llama_cpp": {"llama_cpp_python_version": worker.version, "flash_attn": args.flash_attn,
                                       **record}})
            if args.o == "md":
                print(md_row(name, ours, llama), flush=True)
    worker.close()
    if args.o == "md":
        from edgekv import __version__

        print(f"\nedgekv {__version__}, llama-cpp-python {worker.version} (flash_attn {args.flash_attn}); "
              f"{args.t} threads, {args.r} repetitions, alternating")
    else:
        print(json.dumps(rows, indent=2))
    return rows


def find_llama_python(given: str | None) -> str | None:
    if given:
        return given
    return sys.executable if importlib.util.find_spec("llama_cpp") else None


def main(argv=None) -> int:
    args = parse_args(argv)
    # before NumPy is imported: prefill's BLAS keeps its own thread pool (see kernels/config.py)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.t))
    python = find_llama_python(args.llama_python)
    if python is None:
        print("compare_llama_cpp: skipped: llama-cpp-python is not importable here; pass --llama-python PYTHON "
              "or set LLAMA_CPP_PYTHON to an interpreter that has it", file=sys.stderr)
        return 0
    from edgekv.errors import EdgeKVError

    try:
        compare(args, python)
    except EdgeKVError as exc:
        print(f"compare_llama_cpp: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
