"""Tests for edgekv/lab/bench.py and `edgekv bench` (and the test plan and worker protocol of
benchmarks/compare_llama_cpp.py): the sweep is the cartesian product in llama-bench's order,
each output format parses with llama-bench's fields, the counts and the statistics follow
llama-bench's definitions, the clock covers exactly the tested tokens (never the depth
prefix), and mistakes get one-line errors. No test looks at how fast anything is."""

from __future__ import annotations

import csv
import importlib.util
import io
import itertools
import json
import re
import statistics
from pathlib import Path

import numpy as np
import pytest

import edgekv
from edgekv.lab import bench
from edgekv.lab.bench import BenchResult, BenchRunner, BenchTest, ModelInfo, bench_matrix, run_test
from edgekv.cli import main
from edgekv.gguf.reader import GGUFFile
from edgekv.loader import load

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
LLAMA_BENCH_FIELDS = ("model_filename", "model_type", "model_size", "model_n_params", "n_batch", "n_threads",
                      "type_k", "type_v", "n_prompt", "n_gen", "n_depth", "test_time", "avg_ns", "stddev_ns",
                      "avg_ts", "stddev_ts", "samples_ns", "samples_ts")
INT_FIELDS = ("model_size", "model_n_params", "n_batch", "n_threads", "n_prompt", "n_gen", "n_depth", "avg_ns",
              "stddev_ns")


@pytest.fixture(scope="module")
def tiny(tiny_model) -> str:
    return str(tiny_model(head_dim=32))  # 32: q8_0 and q4_0 cache rows fit


@pytest.fixture(scope="module")
def tiny_gemma(tiny_model) -> str:
    return str(tiny_model("gemma3", head_dim=32))  # sliding-window layers of 8 tokens


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["bench", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- the test matrix ----------------------------------------------------------------------------

def test_matrix_is_the_cartesian_product_in_llama_bench_order():
    tests = bench_matrix([128, 512], [0, 32], [0, 8], [256], ["f16", "q8_0"], ["q4_0"], [1, 2])
    assert len(tests) == 2 * 2 * 2 * (2 + 1)  # type_k x threads x depth x (two pp + one tg; n_gen 0 is no test)
    assert {(t.n_prompt, t.n_gen, t.n_depth, t.type_k, t.n_threads) for t in tests} == {
        (p, g, d, k, n) for (p, g), d, k, n in itertools.product([(128, 0), (512, 0), (0, 32)], [0, 8],
                                                                  ["f16", "q8_0"], [1, 2])}
    assert all(t.n_batch == 256 and t.type_v == "q4_0" for t in tests)
    assert [t.name for t in tests[:6]] == ["pp128", "pp512", "tg32", "pp128 @ d8", "pp512 @ d8", "tg32 @ d8"]
    assert tests[0].n_ctx == 128 and tests[5].n_ctx == 40


def test_statistics_are_llama_bench_s():
    r = BenchResult(ModelInfo("m.gguf", "llama 1M F32", 1, 1), BenchTest(0, 10), "2026-01-01T00:00:00Z",
                    [1_000_000_000, 2_000_000_000])
    assert r.samples_ts == [10.0, 5.0]
    assert r.avg_ts == 7.5 and r.stddev_ts == pytest.approx(statistics.stdev([10.0, 5.0]))  # n - 1, not n
    assert r.avg_ns == 1_500_000_000 and r.stddev_ns == int(statistics.stdev([1e9, 2e9]))
    one = BenchResult(r.model, r.test, r.test_time, [123_456])
    assert one.stddev_ts == 0.0 and one.stddev_ns == 0


# ---- what is timed ------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["tiny", "tiny_gemma"])
@pytest.mark.parametrize("n_prompt, n_gen", [(12, 0), (0, 5)])
def test_the_clock_covers_exactly_the_tested_tokens(request, monkeypatch, arch, n_prompt, n_gen):
    model = load(request.getfixturevalue(arch))
    depth = 20  # more than gemma3's window: the restored prefix must bring back wrapped rings
    runner = BenchRunner(model, BenchTest(n_prompt, n_gen, depth, n_batch=8))
    s = runner.session
    assert s.n_evaluated == (n_prompt or 1)  # the warm-up: the whole prompt, or one generated token
    # a clock that reads the number of tokens evaluated so far: a sample is then the tokens it timed
    monkeypatch.setattr(bench.time, "perf_counter_ns", lambda: s.n_evaluated)
    prefixes = []
    for _ in range(3):
        assert runner.sample() == n_prompt + n_gen
        assert s.n_tokens == depth + n_prompt + n_gen == s.n_ctx
        prefixes.append(list(s.tokens[:depth]))
    assert s.n_evaluated == (n_prompt or 1) + depth + 3 * (n_prompt + n_gen)  # the depth prefix ran once
    assert prefixes[0] == prefixes[1] == prefixes[2]
    bos = model.tokenizer.bos_id if model.tokenizer.add_bos else None
    if bos is not None:  # llama-bench starts the depth prefix, a prompt and a generation with BOS
        assert s.tokens[0] == s.tokens[depth] == bos


def test_run_test_reports_counts_and_samples(tiny):
    model = load(tiny)
    result = run_test(model, BenchTest(8, 0, 4, n_batch=4, type_k="q8_0", type_v="q4_0", n_threads=1), 3)
    assert (result.test.n_prompt, result.test.n_gen, result.test.n_depth) == (8, 0, 4)
    assert len(result.samples_ns) == 3 and all(ns > 0 for ns in result.samples_ns)
    assert result.avg_ts == pytest.approx(statistics.mean(result.samples_ts)) and result.stddev_ts >= 0
    assert result.test.n_threads == 1


def test_model_info_counts_the_tensors(tiny):
    g = GGUFFile(tiny)
    info = ModelInfo.from_gguf(g)
    assert info.n_params == sum(int(np.prod(t.shape)) for t in g.tensors.values())
    assert info.size == sum(t.data.nbytes for t in g.tensors.values())
    assert re.fullmatch(r"llama \d+K F32", info.type) and info.filename == tiny


# ---- the command --------------------------------------------------------------------------------

def test_json_sweep_has_llama_bench_records(capsys, tiny):
    rc, out, err = run_cli(capsys, "-m", tiny, "-p", "8,16", "-n", "4", "-d", "0", "-d", "6", "-r", "2",
                           "-ctk", "f16,q8_0", "-t", "1", "-o", "json")
    assert rc == 0, err
    records = json.loads(out)
    assert len(records) == 2 * 2 * 3  # -ctk x -d x (pp8, pp16, tg4)
    assert {(r["type_k"], r["n_depth"], r["n_prompt"], r["n_gen"]) for r in records} == {
        (k, d, p, g) for k, d, (p, g) in itertools.product(["f16", "q8_0"], [0, 6], [(8, 0), (16, 0), (0, 4)])}
    for r in records:
        assert set(LLAMA_BENCH_FIELDS) <= set(r)
        assert r["edgekv_version"] == edgekv.__version__ and "build_commit" not in r
        assert all(isinstance(r[k], int) for k in INT_FIELDS)
        assert r["n_threads"] == 1 and r["n_batch"] == 512 and r["type_v"] == "f16"
        assert r["model_filename"] == tiny and r["model_type"].startswith("llama ")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["test_time"])
        assert len(r["samples_ns"]) == len(r["samples_ts"]) == 2
        assert all(ns > 0 for ns in r["samples_ns"]) and r["avg_ts"] > 0 and r["stddev_ts"] >= 0
        assert r["avg_ts"] == pytest.approx(statistics.mean(r["samples_ts"]))
        assert r["samples_ts"][0] == pytest.approx(1e9 * (r["n_prompt"] + r["n_gen"]) / r["samples_ns"][0])


def test_markdown_table_like_llama_bench(capsys, tiny):
    rc, out, err = run_cli(capsys, "-m", tiny, "-p", "8", "-n", "3", "-d", "0,5", "-r", "1")
    assert rc == 0, err
    lines = out.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["model", "size", "params", "backend", "threads", "type_k", "type_v", "test", "t/s"]
    assert re.fullmatch(r"\|( -+[-:] \|)+", lines[1])
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:6]]
    assert [row[7] for row in rows] == ["pp8", "tg3", "pp8 @ d5", "tg3 @ d5"]
    for row in rows:
        assert re.fullmatch(r"\d+\.\d\d ± 0\.00", row[8])  # one repetition: no spread
        assert row[1].endswith(" MiB") and row[2].endswith(" M") and row[3] == "numba"
    assert lines[7] == f"edgekv: {edgekv.__version__}"
    rc, out, _ = run_cli(capsys, "-m", tiny, "-p", "8", "-n", "0", "-b", "4,8", "-r", "1")
    assert rc == 0 and "n_batch" in out.splitlines()[0] and len(out.splitlines()) == 2 + 2 + 2


def test_csv_and_jsonl(capsys, tiny):
    rc, out, _ = run_cli(capsys, "-m", tiny, "-p", "8", "-n", "2", "-r", "1", "-o", "csv")
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 2 and [(r["n_prompt"], r["n_gen"]) for r in rows] == [("8", "0"), ("0", "2")]
    assert set(LLAMA_BENCH_FIELDS) - {"samples_ns", "samples_ts"} <= set(rows[0]) and "samples_ns" not in rows[0]
    assert float(rows[0]["avg_ts"]) > 0
    rc, out, _ = run_cli(capsys, "-m", tiny, "-p", "8", "-n", "2", "-r", "1", "-o", "jsonl")
    records = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and [(r["n_prompt"], r["n_gen"]) for r in records] == [(8, 0), (0, 2)]


def one_line_error(err: str, *fragments: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("edgekv: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_mistakes_exit_1_with_one_line_before_any_test_runs(capsys, tiny, tmp_path):
    cases = [
        (["-m", tiny, "-p", "4", "-n", "2", "-ctk", "f16,q3_weird"], ("-ctk", "q3_weird")),
        (["-m", tiny, "-p", "4", "-n", "0", "-d", "240,250", "-p", "16"], ("pp16 @ d250", "trained for 256")),
        (["-m", tiny, "-p", "0", "-n", "0"], ("nothing to measure",)),
        (["-m", tiny, "-p", "4", "-t", "100000"], ("-t 100000",)),
        (["-m", f"{tiny},{tmp_path / 'nope.gguf'}", "-p", "4"], ("nope.gguf",)),
    ]
    for argv, fragments in cases:
        rc, out, err = run_cli(capsys, *argv, "-r", "1")
        assert rc == 1 and out == "", (argv, out)
        one_line_error(err, *fragments)
    rc, out, err = run_cli(capsys, "-m", tiny, "-p", "4", "-n", "0", "-d", "240", "-ctv", "q8_0", "-r", "1")
    assert rc == 0 and "pp4 @ d240" in out, err  # the limits above are the model's, not the command's


def test_bad_numbers_are_usage_errors(capsys, tiny):
    for extra in (["-p", "-1"], ["-n", "x"], ["-d", "-4"], ["-r", "0"], ["-b", "0"], ["-t", "0"], ["-p", "8,,16"],
                  ["-o", "sql"]):
        rc, out, err = run_cli(capsys, "-m", tiny, *extra)
        assert rc == 2 and out == "" and "Traceback" not in err, extra


def test_several_models_and_windowed_layers(capsys, tiny_gemma):
    rc, out, err = run_cli(capsys, "-m", f"{tiny_gemma},{tiny_gemma}", "-p", "12", "-n", "2", "-d", "10", "-b", "4",
                           "-r", "2", "-o", "jsonl")
    assert rc == 0, err
    assert [(json.loads(line)["n_prompt"], json.loads(line)["model_type"].split()[0]) for line in out.splitlines()] \
        == [(12, "gemma3"), (0, "gemma3")] * 2


# ---- benchmarks/compare_llama_cpp.py ------------------------------------------------------------

def test_compare_plans_the_issue_targets():
    compare = load_script("compare_llama_cpp")
    args = compare.parse_args(["-t", "2"])
    smol = compare.planned_tests("smollm2-135m-instruct", args, 8192)
    sweep = ["tg64", "tg64 @ d1024", "tg64 @ d4096", "tg64 @ d8128"]  # 8192 and 16384: the deepest that fits
    assert [(t.name, t.type_k) for t in smol] == [("pp512", "f16"), ("tg128", "f16")] + [
        (name, ct) for ct in ("f16", "q8_0", "q4_0") for name in sweep]
    assert all(t.type_k == t.type_v for t in smol)
    gemma = compare.planned_tests("gemma3-270m", args, 32768)
    assert [t.name for t in gemma][-5:] == ["tg64", "tg64 @ d1024", "tg64 @ d4096", "tg64 @ d8192", "tg64 @ d16384"]
    assert all(t.n_threads == 2 and t.n_batch == 512 for t in smol)
    short = compare.parse_args(["-p", "16", "-n", "4", "-d", "64", "--depth-gen", "4", "--tests", "tg,depth",
                                "-ct", "q8_0"])
    assert [t.name for t in compare.planned_tests("smollm2-135m-instruct", short, 8192)] == ["tg4", "tg4 @ d64"]
    for bad in (["--tests", "pp,warp"], ["-d", "4k"], ["-d", "-1"]):
        with pytest.raises(SystemExit):
            compare.parse_args(bad)


def test_worker_protocol_answers_every_request(monkeypatch):
    worker = load_script("_llama_cpp_worker")

    class FakeBench:
        closed = 0

        def load(self, model):
            return {"model_type": f"fake {model}"}

        def open(self, **test):
            raise worker.WorkerError("no such cache type")

        def sample(self):
            return {"ns": 7}

        def close(self):
            FakeBench.closed += 1
            return {}

    requests = ['{"op": "load", "model": "m"}', "", '{"op": "open", "type_k": "q9"}', '{"op": "sample"}',
                '{"op": "warp"}', "not json"]
    replies = io.StringIO()
    worker.serve(FakeBench(), requests, replies)
    answers = [json.loads(line) for line in replies.getvalue().splitlines()]
    assert answers[0] == {"ok": True, "model_type": "fake m"} and answers[2] == {"ok": True, "ns": 7}
    assert answers[1]["ok"] is False and "no such cache type" in answers[1]["error"]
    assert answers[3]["ok"] is False and "warp" in answers[3]["error"]
    assert answers[4]["ok"] is False and len(answers) == 5
    assert FakeBench.closed == 1  # end of input closes the open test
