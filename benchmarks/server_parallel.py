"""Issue 15: `edgekv serve` with parallel streams, against llama.cpp's llama-batched-bench.

For each catalog model:
- aggregate decode t/s with 1, 2 and 4 concurrent generations (64 tokens each, ignore_eos,
  greedy, distinct prompts) in the server's engine without HTTP: `Llama.fork()`s on worker
  threads whose forward passes run on a StepScheduler, as `edgekv serve --parallel 4` runs
  them; repetitions alternate the counts. Two rates: while all n streams decode (from the
  last stream's first token to the first stream's last: llama-batched-bench's S_TG, which
  prefills every prompt before it decodes), and over the whole run (generated tokens over
  the longest generation time: the other prompts' prefill chunks and the smaller batches
  while streams start and end included). Target: 4 streams >= 2x one stream. Also the
  same through HTTP (a server in this process, streaming clients in this process too: they
  take CPU from it, so these figures are lower).
- time to first token of a request (a 100-token prompt) on an idle server, and arriving
  while 3 other streams are generating (HTTP). Target: busy within 2x of idle.
llama.cpp's side, same run: llama-batched-bench on the same GGUF (-npp 16 -ntg 64
-npl 1,2,4, 2 threads), its S_TG (aggregate decode t/s) per stream count, no HTTP in it.

    python benchmarks/server_parallel.py [--llama-batched-bench PATH] [-r 3] [-o results.md]

llama-batched-bench comes from `--llama-batched-bench` or $LLAMA_BATCHED_BENCH (built from
the reference tree as tests/reference/README.md says for llama-bench); without it only
edgekv's figures are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = ("smollm2-135m-instruct", "gemma3-270m")
STREAMS = (1, 2, 4)
N_GEN = 64
PROMPTS = ["Once upon a time", "The history of the Roman Empire", "def quicksort(xs):", "A recipe for bread:"]


def stream_once(port: int, prompt: str, max_tokens: int, marks: dict) -> None:
    """One streaming completion; marks: first (time of the first text), last, tokens."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = dict(model="m", prompt=prompt, max_tokens=max_tokens, temperature=0, ignore_eos=True, stream=True,
                stream_options=dict(include_usage=True))
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("choices") and chunk["choices"][0].get("text") and "first" not in marks:
            marks["first"] = time.perf_counter()
        if chunk.get("usage"):
            marks["tokens"] = chunk["usage"]["completion_tokens"]
    marks["last"] = time.perf_counter()
    conn.close()


def aggregate(port: int, n: int) -> float:
    marks = [dict() for _ in range(n)]
    threads = [threading.Thread(target=stream_once, args=(port, PROMPTS[i], N_GEN, marks[i])) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    span = max(m["last"] for m in marks) - min(m["first"] for m in marks)
    return sum(m["tokens"] - 1 for m in marks) / span


def ttft(port: int, prompt: str) -> float:
    marks: dict = {}
    t0 = time.perf_counter()
    stream_once(port, prompt, 2, marks)
    return marks["first"] - t0


def ttft_busy(port: int, prompt: str) -> float:
    marks = [dict() for _ in range(3)]
    threads = [threading.Thread(target=stream_once, args=(port, PROMPTS[i], 4 * N_GEN, marks[i])) for i in range(3)]
    for t in threads:
        t.start()
    while not all("first" in m for m in marks):  # the others are generating
        time.sleep(0.01)
    time.sleep(0.2)
    took = ttft(port, prompt)
    for t in threads:
        t.join()
    return took


def engine(llm, scheduler, n: int) -> tuple[float, float]:
    """n concurrent greedy generations on forks of llm. Returns (whole, steady): whole =
    generated tokens over the longest generation's time, so the first tokens, the prompts'
    prefill chunks run between steps and the smaller batches while streams start and end
    count; steady = decode tokens the scheduler ran per second from the moment the last
    stream had its first token to the moment the first one had its last: all n decoding,
    what llama-batched-bench's S_TG (which prefills every prompt first) measures."""
    forks = [llm.fork(scheduler) for _ in range(n)]
    took: dict[int, tuple[int, float]] = {}
    marks: dict[int, list[tuple[float, int]]] = {i: [] for i in range(n)}  # (time, scheduler.step_tokens) per token

    def one(i: int) -> None:
        def stamp(ids, logits) -> bool:  # a stopping criterion that never stops: called once per token
            marks[i].append((time.perf_counter(), scheduler.step_tokens))
            return False

        with scheduler.member():
            r = forks[i].create_completion(PROMPTS[i], max_tokens=N_GEN, temperature=0, ignore_eos=True,
                                           stopping_criteria=stamp)
            took[i] = (r["usage"]["completion_tokens"], forks[i].last_stats.gen_s)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    whole = sum(k for k, _ in took.values()) / max(s for _, s in took.values())
    (t_start, tok_start), (t_end, tok_end) = max(m[0] for m in marks.values()), min(m[-1] for m in marks.values())
    return whole, (tok_end - tok_start) / (t_end - t_start)


def run_engine(model: str, reps: int) -> dict[int, list[tuple[float, float]]]:
    from edgekv import Llama
    from edgekv.server.scheduler import StepScheduler

    llm = Llama(model, n_ctx=1024)
    scheduler = StepScheduler(llm._model.network, max(STREAMS))
    for n in (4, 2, 1):  # warm-up: kernels, every batch size
        engine(llm, scheduler, n)
    rates = {n: [] for n in STREAMS}
    for _ in range(reps):
        for n in STREAMS:
            rates[n].append(engine(llm, scheduler, n))
    scheduler.stop()
    return rates


def run_edgekv(model: str, reps: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from helpers.server import serving  # uvicorn on a free port in a thread, as the server tests run it

    from edgekv import Llama
    from edgekv.server import create_app

    llm = Llama(model, n_ctx=1024)
    app = create_app(llm, parallel=4, slots=5)
    probe = "Summarise the following text. " + "The quick brown fox jumps over the lazy dog. " * 9
    with serving(app) as port:
        aggregate(port, 4)  # warm-up: kernels, every batch size
        aggregate(port, 2)
        rates = {n: [] for n in STREAMS}
        idle, busy = [], []
        for _ in range(reps):
            for n in STREAMS:
                rates[n].append(aggregate(port, n))
            # prompts that share no prefix with any earlier one: nothing comes from a cache
            idle.append(ttft(port, f"Request {len(idle)} (idle). " + probe))
            busy.append(ttft_busy(port, f"Query {len(busy)} (busy). " + probe))
    return dict(rates=rates, idle=idle, busy=busy, max_rows=app.state.scheduler.max_rows)


def run_llama(exe: str, model: str) -> dict[int, float]:
    from edgekv.catalog import ensure_model

    cmd = [exe, "-m", str(ensure_model(model)), "-c", "2048", "-b", "512", "-ub", "512", "-npp", "16",
           "-ntg", str(N_GEN), "-npl", ",".join(map(str, STREAMS)), "-t", str(os.cpu_count())]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rates = {}
    for line in out.splitlines():  # |    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s | ...
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and re.fullmatch(r"\d+", cells[2] or ""):
            rates[int(cells[2])] = float(cells[7])
    return rates


def mean_sd(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.1f} ± {statistics.stdev(xs):.1f}" if len(xs) > 1 else f"{xs[0]:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-batched-bench", default=os.environ.get("LLAMA_BATCHED_BENCH"))
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("-o", "--output", default=None, help="also write the table to this Markdown file")
    args = ap.parse_args()
    from edgekv.system_info import machine_summary

    lines = [f"Machine: {machine_summary(os.cpu_count())}", "",
             "| model | streams | edgekv t/s, all decoding | x one stream | llama.cpp S_TG t/s | x one stream "
             "| edgekv / llama.cpp | edgekv t/s, whole run | x one stream | edgekv t/s via HTTP | x one stream |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    ttft_lines = ["", "| model | TTFT idle ms | TTFT while 3 stream ms | busy / idle |", "|---|---|---|---|"]
    for model in MODELS:
        pairs = run_engine(model, args.repetitions)
        whole = {n: [w for w, _ in pairs[n]] for n in STREAMS}
        steady = {n: [s for _, s in pairs[n]] for n in STREAMS}
        theirs = run_llama(args.llama_batched_bench, model) if args.llama_batched_bench else {}
        ours = run_edgekv(model, args.repetitions)
        one, whole_one = statistics.mean(steady[1]), statistics.mean(whole[1])
        http_one = statistics.mean(ours["rates"][1])
        for n in STREAMS:
            mean, http = statistics.mean(steady[n]), statistics.mean(ours["rates"][n])
            lc = theirs.get(n)
            lc_cells = (f"{lc:.1f} | {lc / theirs[1]:.2f}x | {mean / lc:.2f}x" if lc else "- | - | -")
            lines.append(f"| {model} | {n} | {mean_sd(steady[n])} | {mean / one:.2f}x | {lc_cells} "
                         f"| {mean_sd(whole[n])} | {statistics.mean(whole[n]) / whole_one:.2f}x "
                         f"| {mean_sd(ours['rates'][n])} | {http / http_one:.2f}x |")
        idle, busy = statistics.median(ours["idle"]) * 1e3, statistics.median(ours["busy"]) * 1e3
        ttft_lines.append(f"| {model} | {idle:.0f} | {busy:.0f} | {busy / idle:.2f}x |")
        print(f"{model}: largest decode batch {ours['max_rows']}", file=sys.stderr)
    text = "\n".join(lines + ttft_lines) + "\n"
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
