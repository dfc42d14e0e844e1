"""llama-perplexity's KL divergence: save a base model's log-probabilities, then measure how far
another model (or the same model with another cache type) strays from them.

What lives here: the base file, in llama-perplexity's format so that either program reads the
other's (`BaseWriter`, `BaseFile`); the per-token statistics (`KLDStats.add`, llama.cpp's
log_softmax against a base row: KLD, same top token, probability of the right token) and the
report llama-perplexity prints (`KLDStats.report`). What does not: evaluating chunks
(lab/perplexity.py), the command (cli/perplexity.py).

The format: "_logits_", then int32 n_ctx, n_vocab, n_chunk, then the n_chunk * n_ctx tokens
(int32, as tokenized: the BOS that replaces each chunk's first token is not written), then for
every chunk the n_ctx - 1 - n_ctx/2 scored positions, each a row of 2*ceil(n_vocab/2) + 4
uint16: two float32 (scale, min log-prob) and each token's log-prob as
min_log_prob + scale * q (q = 0 for anything more than 16 below the top logit).
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..atomic_file import AtomicFile
from ..errors import EdgeKVError

MAGIC = b"_logits_"
FLOOR = 16.0  # log-probs more than this below the top are stored as the floor


def row_width(n_vocab: int) -> int:
    """uint16 values per stored row."""
    return 2 * ((n_vocab + 1) // 2) + 4


def _log_sum_exp(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # (max f32[b], log(sum(exp(row - max))) f32[b]): exp in f32, the sum in f64, as llama.cpp
    top = rows.max(axis=1)
    sums = np.exp(rows - top[:, None]).sum(axis=1, dtype=np.float64)
    return top, np.log(sums).astype(np.float32)


def encode_rows(rows: np.ndarray) -> np.ndarray:
    """Logits f32[b, n_vocab] -> stored rows u16[b, row_width]."""
    b, n_vocab = rows.shape
    top, lse = _log_sum_exp(rows)
    low = np.maximum(rows.min(axis=1), top - np.float32(FLOOR))
    scale = ((top - low) / np.float32(65535.0)).astype(np.float32)
    out = np.zeros((b, row_width(n_vocab)), np.uint16)
    head = out[:, :4].view(np.float32)
    head[:, 0] = scale
    head[:, 1] = low - top - lse
    inv = np.divide(np.float32(1.0), scale, out=np.zeros_like(scale), where=scale != 0)
    q = np.rint(inv[:, None] * (rows - low[:, None]))
    out[:, 4:4 + n_vocab] = np.where(rows > low[:, None], q, 0).astype(np.uint16)
    return out


def decode_rows(stored: np.ndarray, n_vocab: int) -> np.ndarray:
    """Stored rows u16[b, row_width] -> the log-probabilities f32[b, n_vocab] they hold."""
    head = np.ascontiguousarray(stored[:, :4]).view(np.float32)
    return head[:, :1] * stored[:, 4:4 + n_vocab].astype(np.float32) + head[:, 1:2]


class BaseWriter:
    """`--kl-divergence-base FILE` without `--kl-divergence`: the header and tokens at once,
    then each chunk's rows; `with BaseWriter(...) as w:` the file appears under its name when
    the block ends without an error (atomic_file.py)."""

    def __init__(self, path: str | os.PathLike, n_ctx: int, n_vocab: int, tokens, n_chunks: int):
        self._header = MAGIC + struct.pack("<iii", n_ctx, n_vocab, n_chunks)
        self._tokens = np.asarray(tokens[:n_chunks * n_ctx], dtype="<i4")
        self.path = os.fspath(path)

    def __enter__(self) -> BaseWriter:
        self._file = AtomicFile(self.path)
        self._file.write(self._header)
        self._file.write(self._tokens.tobytes())
        return self

    def add(self, rows: np.ndarray) -> None:
        self._file.write(encode_rows(rows).astype("<u2").tobytes())

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self._file.commit()
        else:
            self._file.discard()


class BaseFile:
    """A base file read back: its context, vocabulary size, tokens and stored rows."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            size = os.path.getsize(self.path)
            with open(self.path, "rb") as f:
                head = f.read(20)
        except OSError as exc:
            raise EdgeKVError(f"{self.path}: cannot read the base log-probabilities: {exc.strerror}") from None
        if len(head) < 20 or head[:8] != MAGIC:
            raise EdgeKVError(f"{self.path}: not a log-probability file (make one with "
                              f"`edgekv perplexity -m BASE -f TEXT --kl-divergence-base {self.path}`)")
        self.n_ctx, self.n_vocab, self.n_chunks = struct.unpack("<iii", head[8:20])
        self.n_scored = self.n_ctx - 1 - self.n_ctx // 2
        need = 20 + 4 * self.n_ctx * self.n_chunks + 2 * self.n_chunks * self.n_scored * row_width(self.n_vocab)
        if min(self.n_ctx, self.n_vocab, self.n_chunks) < 1 or size != need:
            raise EdgeKVError(f"{self.path}: {size} bytes, but its header (n_ctx {self.n_ctx}, n_vocab "
                              f"{self.n_vocab}, {self.n_chunks} chunks) needs {need}: truncated or corrupt")
        self.tokens = np.memmap(self.path, "<i4", "r", 20, (self.n_chunks * self.n_ctx,))
        self.rows = np.memmap(self.path, "<u2", "r", 20 + 4 * self.tokens.size,
                              (self.n_chunks, self.n_scored, row_width(self.n_vocab)))


@dataclass
class KLDStats:
    """llama-perplexity's kl_divergence_result, and the per-token values for its quantiles."""

    sums: dict = field(default_factory=lambda: dict.fromkeys(
        ("nll", "nll2", "nll_base", "nll_base2", "nll_nll_base", "kld", "kld2", "p_diff", "p_diff2", "p_diff4"), 0.0))
    same_top: int = 0
    count: int = 0
    klds: list = field(default_factory=list)
    p_diffs: list = field(default_factory=list)

    def add(self, rows: np.ndarray, base: np.ndarray, targets: np.ndarray) -> None:
        """Logits f32[b, n_vocab] against stored base rows u16[b, width] for tokens i64[b]."""
        n_vocab = rows.shape[1]
        top, lse = _log_sum_exp(rows)
        base_lp = decode_rows(base, n_vocab)
        idx = np.arange(len(targets))
        nll = (top + lse - rows[idx, targets]).astype(np.float64)
        nll_base = (-base_lp[idx, targets]).astype(np.float64)
        norm = (top + lse)[:, None]
        kept = base_lp > -FLOOR
        terms = np.where(kept, np.exp(np.where(kept, base_lp, 0)) * (base_lp - rows + norm), 0)
        kld = terms.sum(axis=1, dtype=np.float64)
        p_diff = (np.exp(-nll.astype(np.float32)) - np.exp(-nll_base.astype(np.float32))).astype(np.float64)
        s = self.sums
        for name, v in (("nll", nll), ("nll_base", nll_base), ("kld", kld), ("p_diff", p_diff)):
            s[name] += float(v.sum())
            s[name + "2"] += float((v * v).sum())
        s["nll_nll_base"] += float((nll * nll_base).sum())
        s["p_diff4"] += float((p_diff ** 4).sum())
        self.same_top += int((rows.argmax(axis=1) == base_lp.argmax(axis=1)).sum())
        self.count += len(targets)
        self.klds.extend(kld.tolist())
        self.p_diffs.extend(p_diff.tolist())

    def mean(self, name: str, square: str | None = None) -> tuple[float, float]:
        """llama.cpp's mean_and_uncertainty of a summed value."""
        n = self.count
        f = self.sums[name] / n
        df = self.sums[square or name + "2"] / n - f * f
        return f, (math.sqrt(df / (n - 1)) if df > 0 and n > 10 else 0.0)

    def covariance(self) -> float:
        n, s = self.count, self.sums
        if n < 10:
            return 0.0
        return (s["nll_nll_base"] / n - (s["nll"] / n) * (s["nll_base"] / n)) / (n - 1)

    def chunk_line(self, i: int) -> str:
        """The running figures llama-perplexity prints after chunk i (0-based)."""
        lp, lp_unc = self.mean("nll")
        ratio, ratio_unc = self._ratio()
        kld, kld_unc = self.mean("kld")
        rms, rms_unc = self._rms()
        top, top_unc = self._same_top()
        return (f"{i + 1:4d}    {math.exp(lp):9.4f} ± {math.exp(lp) * lp_unc:9.4f}    {ratio:10.5f} ± {ratio_unc:10.5f}"
                f"    {kld:10.5f} ± {kld_unc:10.5f}    {100 * rms:6.3f} ± {100 * rms_unc:6.3f} %"
                f"    {100 * top:6.3f} ± {100 * top_unc:6.3f} %")

    def _ratio(self) -> tuple[float, float]:
        lp, lp_unc = self.mean("nll")
        lb, lb_unc = self.mean("nll_base")
        return lp - lb, math.sqrt(max(0.0, lp_unc * lp_unc + lb_unc * lb_unc - 2.0 * self.covariance()))

    def _rms(self) -> tuple[float, float]:
        mse, mse_unc = self.mean("p_diff2", "p_diff4")
        rms = math.sqrt(mse)
        return rms, (0.5 / rms * mse_unc if rms > 0 else 0.0)

    def _same_top(self) -> tuple[float, float]:
        p = self.same_top / self.count
        return p, math.sqrt(p * (1 - p) / (self.count - 1)) if self.count > 1 else 0.0

    def report(self) -> list[str]:
        """llama-perplexity's final statistics, line for line."""
        lp, lp_unc = self.mean("nll")
        lb, lb_unc = self.mean("nll_base")
        ppl, base = math.exp(lp), math.exp(lb)
        ppl_unc, base_unc = ppl * lp_unc, base * lb_unc
        cov = self.covariance()
        ratio, ratio_unc = self._ratio()
        diff_unc = math.sqrt(max(0.0, ppl_unc ** 2 + base_unc ** 2 - 2.0 * ppl * base * cov))
        cor = cov / (lp_unc * lb_unc) if lp_unc * lb_unc else float("nan")
        kld, kld_unc = self.mean("kld")
        dp, dp_unc = self.mean("p_diff")
        rms, rms_unc = self._rms()
        top, top_unc = self._same_top()
        k, d = np.sort(np.asarray(self.klds, np.float32)), np.sort(np.asarray(self.p_diffs, np.float32))
        lines = ["====== Perplexity statistics ======",
                 f"Mean PPL(Q)                   : {ppl:10.6f} ± {ppl_unc:10.6f}",
                 f"Mean PPL(base)                : {base:10.6f} ± {base_unc:10.6f}",
                 f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * cor:6.2f}%",
                 f"Mean ln(PPL(Q)/PPL(base))     : {ratio:10.6f} ± {ratio_unc:10.6f}",
                 f"Mean PPL(Q)/PPL(base)         : {math.exp(ratio):10.6f} ± {math.exp(ratio) * ratio_unc:10.6f}",
                 f"Mean PPL(Q)-PPL(base)         : {ppl - base:10.6f} ± {diff_unc:10.6f}", "",
                 "====== KL divergence statistics ======",
                 f"Mean    KLD: {kld:10.6f} ± {kld_unc:10.6f}", f"Maximum KLD: {k[-1]:10.6f}"]
        lines += [f"{_pct(q)}   KLD: {percentile(k, q):10.6f}" for q in (0.999, 0.99, 0.95, 0.90)]
        lines.append(f"Median  KLD: {median(k):10.6f}")
        lines += [f"{_pct(q)}   KLD: {percentile(k, q):10.6f}" for q in (0.10, 0.05, 0.01, 0.001)]
        lines += [f"Minimum KLD: {k[0]:10.6f}", "", "====== Token probability statistics ======",
                  f"Mean    Δp: {100 * dp:6.3f} ± {100 * dp_unc:5.3f} %", f"Maximum Δp: {100 * d[-1]:6.3f}%"]
        lines += [f"{_pct(q)}   Δp: {100 * percentile(d, q):6.3f}%" for q in (0.999, 0.99, 0.95, 0.90, 0.75)]
        lines.append(f"Median  Δp: {100 * median(d):6.3f}%")
        lines += [f"{_pct(q)}   Δp: {100 * percentile(d, q):6.3f}%" for q in (0.25, 0.10, 0.05, 0.01, 0.001)]
        lines += [f"Minimum Δp: {100 * d[0]:6.3f}%",
                  f"RMS Δp    : {100 * rms:6.3f} ± {100 * rms_unc:5.3f} %",
                  f"Same top p: {100 * top:6.3f} ± {100 * top_unc:5.3f} %"]
        return lines


def _pct(q: float) -> str:
    return f"{100 * q:4.1f}%"


def percentile(values: np.ndarray, fraction: float) -> float:
    """llama.cpp's: linear between the two sorted values around fraction * (n - 1), in f32."""
    p = np.float32(fraction) * np.float32(values.size - 1)
    i = int(p)
    p -= np.float32(i)
    return float((np.float32(1) - p) * values[i] + p * values[min(i + 1, values.size - 1)])


def median(values: np.ndarray) -> float:
    n = values.size
    return float(np.float32(0.5) * (values[n // 2] + values[n // 2 - 1])) if n % 2 == 0 else float(values[n // 2])


def compare(session, base: BaseFile, bos_id: int | None, max_chunks: int = -1, on_chunk=None,
            as_steps: bool = False) -> KLDStats:
    """Evaluate the base file's chunks with `session` (n_ctx = the file's) and compare every
    scored position with the stored base row (as_steps: perplexity.chunk_logits's)."""
    from .perplexity import chunk_logits

    n = base.n_chunks if max_chunks <= 0 else min(max_chunks, base.n_chunks)
    stats = KLDStats()
    for c in range(n):
        chunk = base.tokens[c * base.n_ctx:(c + 1) * base.n_ctx].tolist()
        row = 0
        for rows, targets in chunk_logits(session, chunk, bos_id, as_steps):
            stats.add(rows, np.asarray(base.rows[c, row:row + len(targets)]), targets)
            row += len(targets)
        if on_chunk is not None:
            on_chunk(c, stats)
    return stats
