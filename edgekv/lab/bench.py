"""Speed measurement in the manner of llama.cpp's llama-bench (`edgekv bench`, benchmarks/).

What lives here: the test matrix (`BenchTest`, `bench_matrix`), checking it against a model
before anything runs (`check_tests`), timing one test one repetition at a time
(`BenchRunner`) or all of it (`run_test`), the model description llama-bench prints
(`ModelInfo`), a test's result as llama-bench's JSON record (`BenchResult`), and the output
formats md, json, jsonl and csv (`ResultPrinter`). What does not: the command line
(cli/bench.py) and llama.cpp's side of a comparison (benchmarks/compare_llama_cpp.py).

The method is llama-bench's, so that the two tools' figures compare:
- a pp test evaluates n_prompt random token ids (the first one BOS when the model adds
  BOS) in chunks of n_batch; a tg test decodes n_gen random ids one at a time. No
  tokenization and no sampling: the ids are drawn before the clock starts.
- the context holds exactly n_depth + n_prompt + n_gen tokens.
- one warm-up before the repetitions, on an empty cache (the whole prompt for pp, one
  token for tg), not counted; it also pays for JIT compilation.
- every repetition starts from an empty cache plus, for n_depth > 0, a random prefix of
  n_depth tokens: evaluated once, then restored from a snapshot; never timed.
- tokens/s of a repetition = (n_prompt + n_gen) / its time; the reported t/s is the mean
  of those, with the sample standard deviation (n - 1; 0 for a single repetition).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import statistics
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable, Sequence, TextIO

import numpy as np

from ..errors import EdgeKVError
from ..system_info import cpu_info
from ..version import version

if TYPE_CHECKING:
    from ..board.power import PowerMeter, Reading
    from ..gguf.reader import GGUFFile
    from ..loader import Model
    from ..models.base import HParams

BACKEND = "numba"
RECORD_FIELDS = ("edgekv_version", "cpu_info", "backends", "model_filename", "model_type", "model_size",
                 "model_n_params", "n_batch", "n_threads", "type_k", "type_v", "n_prompt", "n_gen", "n_depth",
                 "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts",
                 "power_mode", "clocks_locked", "avg_power_w", "tokens_per_joule", "power_source")
OUTPUT_FORMATS = ("md", "json", "jsonl", "csv")
DEFAULT_N_BATCH = 512


@dataclass(frozen=True)
class BenchTest:
    """One llama-bench test instance: n_prompt > 0 and n_gen == 0 (pp), or the reverse (tg)."""

    n_prompt: int
    n_gen: int
    n_depth: int = 0
    n_batch: int = DEFAULT_N_BATCH
    type_k: str = "f16"
    type_v: str = "f16"
    n_threads: int = 1

    @property
    def n_ctx(self) -> int:
        return self.n_depth + self.n_prompt + self.n_gen

    @property
    def n_tokens(self) -> int:
        """Tokens one repetition times."""
        return self.n_prompt + self.n_gen

    @property
    def name(self) -> str:
        """llama-bench's test column: pp512, tg128, pp512 @ d4096."""
        if self.n_gen == 0:
            name = f"pp{self.n_prompt}"
        elif self.n_prompt == 0:
            name = f"tg{self.n_gen}"
        else:
            name = f"pp{self.n_prompt}+tg{self.n_gen}"
        return name + (f" @ d{self.n_depth}" if self.n_depth else "")


def bench_matrix(n_prompt: Sequence[int], n_gen: Sequence[int], n_depth: Sequence[int] = (0,),
                n_batch: Sequence[int] = (DEFAULT_N_BATCH,), type_k: Sequence[str] = ("f16",),
                type_v: Sequence[str] = ("f16",), n_threads: Sequence[int] = (1,)) -> list[BenchTest]:
    """The cartesian product of the lists, in llama-bench's order: for each combination of
    batch, cache types, threads and depth, the pp tests then the tg tests; zeros are skipped."""
    tests = []
    for nb, tk, tv, nt, nd in itertools.product(n_batch, type_k, type_v, n_threads, n_depth):
        tests += [BenchTest(p, 0, nd, nb, tk, tv, nt) for p in n_prompt if p > 0]
        tests += [BenchTest(0, n, nd, nb, tk, tv, nt) for n in n_gen if n > 0]
    return tests


def check_tests(tests: Sequence[BenchTest], hp: "HParams", model_name: str, max_threads: int) -> None:
    """EdgeKVError for the first test this model cannot run: a cache type unknown or not
    fitting its head size, a context beyond the trained one, more threads than there are."""
    from ..kv.layer_types import layer_kinds

    if not tests:
        raise EdgeKVError("nothing to measure: every prompt length (-p) and generation length (-n) is 0")
    for t in tests:
        if min(t.n_prompt, t.n_gen) < 0 or t.n_depth < 0 or t.n_tokens < 1 or t.n_batch < 1 or t.n_threads < 1:
            raise EdgeKVError(f"test {t}: counts must be >= 0 with n_prompt + n_gen >= 1, n_batch and threads >= 1")
        layer_kinds("-ctk", t.type_k, hp.head_dim, hp.n_layers)
        layer_kinds("-ctv", t.type_v, hp.head_dim_v, hp.n_layers)
        if t.n_ctx > hp.n_ctx_train:
            raise EdgeKVError(f"{t.name} needs a context of {t.n_ctx} tokens (depth + prompt + generation), but "
                              f"{model_name} was trained for {hp.n_ctx_train}; use a smaller -d, -p or -n")
        if t.n_threads > max_threads:
            raise EdgeKVError(f"-t {t.n_threads}: at most {max_threads} threads are available "
                              f"(the cores, or NUMBA_NUM_THREADS)")


@dataclass(frozen=True)
class ModelInfo:
    """What llama-bench reports about a model: file, type ("llama 135M Q4_1"), bytes, parameters."""

    filename: str
    type: str
    size: int  # bytes of all tensors
    n_params: int

    @classmethod
    def from_gguf(cls, g: "GGUFFile") -> "ModelInfo":
        n_params = sum(int(np.prod(t.shape, dtype=np.int64)) for t in g.tensors.values())
        size = sum(int(t.data.nbytes) for t in g.tensors.values())
        return cls(g.path, f"{g.architecture} {_params_label(n_params)} {_file_type(g)}", size, n_params)


def _params_label(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    return f"{round(n / 1e6)}M" if n >= 1e6 else f"{round(n / 1e3)}K"


def _file_type(g: "GGUFFile") -> str:
    """general.file_type's name (Q4_1, Q4_K_M, ...), else the type of most of the weights."""
    from gguf import GGMLQuantizationType, LlamaFileType

    ftype = g.get("general.file_type")
    try:
        return LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (TypeError, ValueError):
        weights = Counter()
        for t in g.tensors.values():
            weights[t.ggml_type] += int(np.prod(t.shape, dtype=np.int64))
        return GGMLQuantizationType(weights.most_common(1)[0][0]).name if weights else "?"


class BenchRunner:
    """One test on one model, ready to time: the session is made and the warm-up done.
    `sample()` times one repetition and returns its nanoseconds."""

    def __init__(self, model: "Model", test: BenchTest, warmup: bool = True, seed: int = 0):
        from ..kernels.config import set_num_threads

        self._set_threads = set_num_threads
        self.test = replace(test, n_threads=set_num_threads(test.n_threads))
        self.session = model.session(n_ctx=test.n_ctx, n_batch=test.n_batch, cache_type_k=test.type_k,
                                     cache_type_v=test.type_v)
        self.rng = np.random.default_rng(seed)
        tok = model.tokenizer
        self.bos = tok.bos_id if tok.add_bos and tok.bos_id is not None else None
        self._depth_state = None
        if warmup:
            if test.n_prompt:
                self.session.eval(self._ids(test.n_prompt))
            if test.n_gen:
                self.session.eval(self._ids(1))

    def _ids(self, n: int) -> np.ndarray:
        """n random ids, the first one BOS when the model adds BOS (llama-bench's test_prompt/test_gen)."""
        ids = self.rng.integers(0, self.session.n_vocab, n, dtype=np.int32)
        if n and self.bos is not None:
            ids[0] = self.bos
        return ids

    def _start(self) -> None:
        """An empty cache, or the depth prefix: evaluated the first time, restored after."""
        s = self.session
        s.reset()
        if not self.test.n_depth:
            return
        if self._depth_state is None:
            s.eval(self._ids(self.test.n_depth))
            self._depth_state = s.snapshot()
        else:
            s.restore(self._depth_state)

    def sample(self) -> int:
        t = self.test
        self._set_threads(t.n_threads)  # Numba's setting is per calling thread
        self._start()
        prompt = self._ids(t.n_prompt)
        steps = list(self._ids(t.n_gen).reshape(-1, 1))  # one array per decode step
        t0 = time.perf_counter_ns()
        if t.n_prompt:
            self.session.eval(prompt)
        for step in steps:
            self.session.eval(step)
        return time.perf_counter_ns() - t0


@dataclass
class BenchResult:
    """One test's samples and llama-bench's statistics over them."""

    model: ModelInfo
    test: BenchTest
    test_time: str  # RFC 3339, UTC
    samples_ns: list[int]
    backend: str = BACKEND
    power: "Reading | None" = None  # over the timed repetitions
    power_mode: str | None = None  # a Jetson's nvpmodel mode
    clocks_locked: bool | None = None

    @property
    def tokens_per_joule(self) -> float | None:
        if self.power is None or self.power.joules <= 0:
            return None
        return self.test.n_tokens * len(self.samples_ns) / self.power.joules

    @property
    def samples_ts(self) -> list[float]:
        return [1e9 * self.test.n_tokens / ns for ns in self.samples_ns]

    @property
    def avg_ns(self) -> int:
        return int(statistics.mean(self.samples_ns)) if self.samples_ns else 0

    @property
    def stddev_ns(self) -> int:
        return int(_stdev(self.samples_ns))

    @property
    def avg_ts(self) -> float:
        return statistics.mean(self.samples_ts) if self.samples_ns else 0.0

    @property
    def stddev_ts(self) -> float:
        return _stdev(self.samples_ts)

    def record(self) -> dict:
        """llama-bench's JSON record (RECORD_FIELDS), with `edgekv_version` in place of
        build_commit and build_number, and the power fields (null where unknown)."""
        t, m, p = self.test, self.model, self.power
        values = (version(), cpu_info(), self.backend, m.filename, m.type, m.size, m.n_params, t.n_batch,
                  t.n_threads, t.type_k, t.type_v, t.n_prompt, t.n_gen, t.n_depth, self.test_time, self.avg_ns,
                  self.stddev_ns, self.avg_ts, self.stddev_ts, list(self.samples_ns), self.samples_ts,
                  self.power_mode, self.clocks_locked, None if p is None else p.watts, self.tokens_per_joule,
                  None if p is None else p.source)
        return dict(zip(RECORD_FIELDS, values, strict=True))


def _stdev(values: Sequence[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def run_test(model: "Model", test: BenchTest, repetitions: int, info: ModelInfo | None = None,
             warmup: bool = True, meter: "PowerMeter | None" = None) -> BenchResult:
    """Warm up, then time `repetitions` repetitions of one test (with a meter, the power over
    them: the warm-up and the JIT compilation are not in it)."""
    if repetitions < 1:
        raise EdgeKVError(f"repetitions must be at least 1, got {repetitions}")
    test_time = now_rfc3339()
    runner = BenchRunner(model, test, warmup)
    if meter is not None:
        meter.start()
    samples = [runner.sample() for _ in range(repetitions)]
    return BenchResult(info or ModelInfo.from_gguf(model.gguf), runner.test, test_time, samples,
                       backend_label(model.backend), power=None if meter is None else meter.stop())


def backend_label(backend) -> str:
    """llama-bench's `backends` for where a model ran: "CUDA" on the GPU (llama-bench's own
    name for it), else "numba" (the CPU backends)."""
    return "CUDA" if backend.name == "cuda" else BACKEND


# ---- output -------------------------------------------------------------------------------------

# (field, width): negative widths are left-aligned, as in llama-bench's markdown printer
MD_FIELDS = (("model", -30), ("size", 10), ("params", 10), ("backend", -8), ("threads", 7), ("n_batch", 7),
              ("type_k", -6), ("type_v", -6), ("test", 15), ("t/s", 20), ("W", 7), ("t/J", 8))
POWER_MD_FIELDS = ("W", "t/J")  # shown when a power source was read
CSV_FIELDS = tuple(k for k in RECORD_FIELDS if not k.startswith("samples_"))  # llama-bench's csv leaves them out


def _size(n_bytes: int) -> str:
    gib = 1024 ** 3
    return f"{n_bytes / gib:.2f} GiB" if n_bytes >= gib else f"{n_bytes / 1024 ** 2:.2f} MiB"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def md_cells(r: BenchResult) -> dict[str, str]:
    t = r.test
    return {"model": r.model.type, "size": _size(r.model.size), "params": _params(r.model.n_params),
            "backend": r.backend, "threads": str(t.n_threads), "n_batch": str(t.n_batch), "type_k": t.type_k,
            "type_v": t.type_v, "test": t.name, "t/s": f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}",
            "W": "-" if r.power is None else f"{r.power.watts:.2f}",
            "t/J": "-" if r.tokens_per_joule is None else f"{r.tokens_per_joule:.2f}"}


class ResultPrinter:
    """Writes results as they come: `begin()`, `add(result)` per test, `end()`.
    md_fields: the markdown columns (default: all but n_batch)."""

    def __init__(self, fmt: str, out: TextIO, md_fields: Iterable[str] | None = None):
        if fmt not in OUTPUT_FORMATS:
            raise EdgeKVError(f"output format {fmt!r} is not one of {', '.join(OUTPUT_FORMATS)}")
        self.fmt, self.out, self.count = fmt, out, 0
        wanted = set(md_fields) if md_fields is not None else {f for f, _ in MD_FIELDS} - {"n_batch"}
        self.md_fields = [(f, w) for f, w in MD_FIELDS if f in wanted]

    def begin(self) -> None:
        if self.fmt == "md":
            self._line("|" + "".join(f" {f:{'<' if w < 0 else '>'}{abs(w)}} |" for f, w in self.md_fields))
            self._line("|" + "".join(f" {'-' * (abs(w) - 1)}{':' if w > 0 else '-'} |" for f, w in self.md_fields))
        elif self.fmt == "json":
            self._line("[")
        elif self.fmt == "csv":
            self._line(_csv_row(CSV_FIELDS))

    def add(self, r: BenchResult) -> None:
        record = r.record()
        if self.fmt == "md":
            cells = md_cells(r)
            self._line("|" + "".join(f" {cells[f]:{'<' if w < 0 else '>'}{abs(w)}} |" for f, w in self.md_fields))
        elif self.fmt == "json":  # as llama-bench: the separator comes with the next record
            text = "  " + json.dumps(record, indent=2).replace("\n", "\n  ")
            self._write(text if self.count == 0 else ",\n" + text)
        elif self.fmt == "jsonl":
            self._line(json.dumps(record))
        else:
            self._line(_csv_row([record[k] for k in CSV_FIELDS]))
        self.count += 1

    def end(self) -> None:
        if self.fmt == "md":
            self._line(f"\nedgekv: {version()}")
        elif self.fmt == "json":
            self._line(("\n" if self.count else "") + "]")

    def _line(self, text: str) -> None:
        self._write(text + "\n")

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()


def _csv_row(values: Sequence) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(values)
    return buf.getvalue()


