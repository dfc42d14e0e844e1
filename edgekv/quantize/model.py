"""`edgekv quantize`: a GGUF model in, the same model in another type (or mixture) out.

What lives here: `quantize_model`, which plans (quantize/plan.py), checks the plan against
what the source holds, then streams the model tensor by tensor: rows are dequantized to
float32 in slabs of at most SLAB_BYTES, quantized on all cores (kernels/quantize_k.py), and
written to a temporary file that becomes the output only when complete (gguf/writer.py).
Memory stays at a slab or two whatever the model size: the source is memory-mapped and each
tensor's pages are released once written. With an importance matrix (quantize/imatrix.py) each
converted tensor gets its vector, checked against the model before anything is written. What
does not: the per-tensor type rules (quantize/plan.py), the CLI (cli/quantize.py).

The output is what llama-quantize writes for the same source, type and flags: the same
metadata (copied entry for entry, `general.quantization_version` and `general.file_type` set
last), tensor order, types and bytes (tests/test_quantize.py holds the sha256 of llama.cpp's
output per tensor).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..gguf import quants
from ..errors import QuantizeError
from ..gguf.reader import GGUFFile
from ..gguf.writer import GGUFOutput, TensorEntry, kv_u32
from ..kernels.jit_cache import kernels_cached, mark_warm
from .imatrix import METADATA_KEYS
from .plan import QUANTIZED, Options, QuantPlan, TensorPlan, block_size, plan_quantization, requires_imatrix

SLAB_BYTES = 64 << 20  # float32 bytes of source rows converted at once
QUANTIZATION_VERSION = 2  # ggml's GGML_QNT_VERSION
log = logging.getLogger("edgekv")
_DROPPED = ("general.quantization_version", "general.file_type", "split.no", "split.count", "split.tensors.count")


@dataclass(frozen=True)
class QuantResult:
    plan: QuantPlan
    n_elements: int
    bytes_before: int
    bytes_after: int
    seconds: float

    def summary(self) -> str:
        mib = 1 << 20
        bpw = 8.0 * self.bytes_after / max(1, self.n_elements)
        line = (f"{self.plan.file_type}: {self.bytes_before / mib:.2f} MiB -> {self.bytes_after / mib:.2f} MiB "
                f"({bpw:.2f} bits per weight), {len(self.plan.tensors)} tensors")
        if self.plan.n_fallback:
            line += f", {self.plan.n_fallback} fell back to a type their rows fit"
        return line + (f", {self.seconds:.1f} s" if self.seconds else "")


def check_plan(g: GGUFFile, plan: QuantPlan, opts: Options) -> None:
    """Refuse what llama-quantize refuses, before anything is written."""
    for t in plan.tensors:
        if not t.converts:
            continue
        block = block_size(t.dst_type)
        if t.shape[0] % block:  # only a type given by flag skips the fallbacks
            raise QuantizeError(
                f"{g.path}: tensor {t.name!r} has rows of {t.shape[0]} values, not a whole number of "
                f"{t.dst_type.name}'s {block}-value blocks; give --output-tensor-type / --token-embedding-type "
                f"a type with 32-value blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) or F16")
        if t.src_type in QUANTIZED and not opts.allow_requantize:
            raise QuantizeError(
                f"{g.path}: tensor {t.name!r} is already {t.src_type.name}; quantizing it again loses "
                f"more than quantizing the F16/F32 original would. Start from an F16, BF16 or F32 file, "
                f"or pass --allow-requantize")
        if int(t.src_type) not in quants.QUANT_TYPES:
            raise QuantizeError(f"{g.path}: tensor {t.name!r} has type {t.src_type.name}, which edgekv cannot read")


def imatrix_vectors(g: GGUFFile, plan: QuantPlan, opts: Options) -> dict[str, np.ndarray]:
    """Each converted tensor's importance weights, picked and checked before anything is
    written (a Q2_K_S file needs them; a matrix of another model is refused); {} without a matrix."""
    needs = next((t for t in plan.tensors if t.converts and requires_imatrix(plan, t)), None)
    if needs is not None and not opts.has_imatrix:
        raise QuantizeError(
            f"{plan.file_type} needs an importance matrix (tensor {needs.name!r} becomes Q2_K): pass "
            f"--imatrix FILE (llama-imatrix's imatrix.gguf or .dat for this model), or choose Q2_K or Q3_K_S")
    if not opts.has_imatrix:
        return {}
    opts.imatrix.check_model([t.name for t in plan.tensors], g.path)
    vectors = {t.name: tensor_imatrix(plan, t, opts) for t in plan.tensors}
    return {name: w for name, w in vectors.items() if w is not None}


def tensor_imatrix(plan: QuantPlan, t: TensorPlan, opts: Options) -> np.ndarray | None:
    """The importance weights a converted tensor is quantized with, as llama-quantize picks
    them; a Q2_K_S tensor without any is an error."""
    w = opts.imatrix.weights(t.name, t.shape) if opts.has_imatrix and t.converts else None
    if w is None and t.converts and requires_imatrix(plan, t):
        raise QuantizeError(f"{opts.imatrix.path if opts.imatrix else 'no --imatrix'}: no importance weights "
                            f"for {t.name!r}, which {plan.file_type} makes Q2_K (llama.cpp refuses it too: the "
                            f"result would be garbage); use a matrix made for this model, or choose Q2_K")
    return w


def output_metadata(g: GGUFFile, plan: QuantPlan, opts: Options) -> list[bytes]:
    # the source's keys, then the version and file type, then the importance matrix's (each
    # set anew, so a key of the source by that name is dropped, as gguf_set_val does)
    extra = opts.imatrix.metadata() if opts.has_imatrix else []
    dropped = _DROPPED + (METADATA_KEYS if extra else ())
    kvs = [g.raw_kv(k) for k in g.metadata if k not in dropped]
    return kvs + [kv_u32("general.quantization_version", QUANTIZATION_VERSION),
                  kv_u32("general.file_type", int(plan.ftype))] + extra


def tensor_chunks(g: GGUFFile, t: TensorPlan, imatrix: np.ndarray | None = None):
    """The output bytes of one planned tensor, in slabs of rows (uint8 arrays): the source's
    bytes when its type is kept, else its rows dequantized to float32 and quantized (with the
    importance weights `imatrix`, ne0 per expert, when given)."""
    from ..kernels.quantize_weights import NO_WEIGHTS, quantize_weight_rows

    src = g.tensors[t.name]
    if not t.converts:
        for start in range(0, src.data.size, SLAB_BYTES):
            yield src.data[start:start + SLAB_BYTES]
        g.release_pages(src.data)
        return
    ne0, n_rows = t.shape[0], t.n_elements // t.shape[0]
    src_row = quants.row_nbytes(t.src_type, ne0)
    dst_row = quants.row_nbytes(t.dst_type, ne0)
    per_expert = n_rows // (t.shape[2] if len(t.shape) > 2 else 1)
    step = max(1, min(SLAB_BYTES // (4 * ne0), per_expert))  # a slab never crosses experts
    r = 0
    while r < n_rows:
        rows = min(step, per_expert - r % per_expert)
        raw = src.data[r * src_row:(r + rows) * src_row]
        y = np.empty((rows, dst_row), np.uint8)
        qw = NO_WEIGHTS if imatrix is None else imatrix[(r // per_expert) * ne0:][:ne0]
        quantize_weight_rows(quants.dequantize(raw, t.src_type, (ne0, rows)), int(t.dst_type), y, qw)
        g.release_pages(raw)
        yield y
        r += rows


def quantize_model(src: str | os.PathLike, dst: str | os.PathLike, type_name: str, opts: Options = Options(),
                   *, dry_run: bool = False, progress: bool | None = None) -> QuantResult:
    """Quantize the GGUF model `src` to `type_name` (a file type: Q4_K_M, Q8_0, F16, ...) into
    `dst`. dry_run: plan and size only, nothing written. progress: a bar on stderr (default:
    when stderr is a terminal)."""
    g = GGUFFile(src)
    plan = plan_quantization(g, type_name, opts)
    check_plan(g, plan, opts)
    before, after = plan.sizes()
    n_elements = sum(t.n_elements for t in plan.tensors)
    if dry_run:
        return QuantResult(plan, n_elements, before, after, 0.0)
    vectors = imatrix_vectors(g, plan, opts)
    if os.path.abspath(src) == os.path.abspath(dst):
        raise QuantizeError(f"{dst}: the output would overwrite the input; choose another name")
    entries = [TensorEntry(t.name, t.shape, t.dst_type) for t in plan.tensors]
    t0 = time.perf_counter()
    bar = progress_bar(after, progress)
    with quantizers_compiled(), \
            GGUFOutput(dst, output_metadata(g, plan, opts), entries, int(g.get("general.alignment", 32))) as out:
        for t in plan.tensors:
            bar.set_postfix_str(f"{t.name} -> {t.dst_type.name}", refresh=False)
            for chunk in tensor_chunks(g, t, vectors.get(t.name)):
                out.write(chunk)
            bar.update(t.nbytes(t.dst_type))
    bar.close()
    return QuantResult(plan, n_elements, before, after, time.perf_counter() - t0)


@contextmanager
def quantizers_compiled():
    """Say once per install that the first use compiles the quantizers; mark them compiled
    when the block ends without an error."""
    first_use = not kernels_cached("quantize")
    if first_use:
        log.warning("compiling the quantizers for this CPU on first use (about a minute, once per install)")
    yield
    if first_use:
        mark_warm("quantize")


def progress_bar(total: int, show: bool | None):
    """A byte-count bar on stderr (show None: when stderr is a terminal)."""
    from tqdm import tqdm

    if show is None:
        show = sys.stderr.isatty()
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, disable=not show,
                file=sys.stderr, dynamic_ncols=True, leave=False)


def plan_lines(plan: QuantPlan) -> list[str]:
    """The --dry-run table: each tensor's shape, type now and after, size after."""
    mib = 1 << 20
    lines = []
    for i, t in enumerate(plan.tensors, 1):
        shape = "x".join(str(d) for d in t.shape)
        change = f"{t.src_type.name:>5} -> {t.dst_type.name:<5}" if t.converts else f"{t.src_type.name:>5} (kept)  "
        note = " (fallback: rows do not fit the mixture's type)" if t.fallback else ""
        lines.append(f"[{i:4d}/{len(plan.tensors)}] {t.name:<36} {shape:>14}  {change} "
                     f"{t.nbytes(t.dst_type) / mib:9.3f} MiB{note}")
    return lines
