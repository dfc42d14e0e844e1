"""What each KV cache type costs a model on a text: `edgekv kv-report`'s measurements.

For each K/V cache type pair: perplexity (llama.cpp's llama-perplexity method,
lab/perplexity.py), the mean KL divergence of its next-token distributions from the f16/f16
cache's and how often both put the same token on top (llama-perplexity's
--kl-divergence figures), the bits one value takes and the bytes one token takes over all
layers, the longest context whose cache fits a memory budget (kv/plan.py max_context),
and decode speed at a depth (llama-bench's tg at -d). One f16/f16 pass gives the base: each
chunk is evaluated by the base and then by every pair before the next chunk, so only one
chunk's base log-probs are ever held (~50 MB for a 49k vocabulary, ~270 MB for 262k).
A pair is on the Pareto front when no other pair is both smaller and closer to f16.
A type may be a per-layer mix (kv/layer_types.py: `q8_0:2+q4_0+q8_0:2`); `mix_verdicts`
says whether any mix beats the uniform types on the front (issue 14 item 3).
What does not live here: the command and its table (cli/kv_report.py), the plot
(lab/kv_plot.py), the method's chunks and NLL (lab/perplexity.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .bench import BenchTest, run_test
from ..kv.layer_types import canonical, summary
from ..kv.plan import kv_row_bytes, max_context
from ..errors import EdgeKVError
from .perplexity import chunk_logits, count_chunks, token_nll

BASE = ("f16", "f16")


@dataclass(frozen=True)
class CachePair:
    type_k: str
    type_v: str

    @property
    def name(self) -> str:
        return self.type_k if self.type_k == self.type_v else f"{self.type_k}/{self.type_v}"

    @property
    def label(self) -> str:
        """The name, with a mix summarised as its count of layers per type (for the plot)."""
        k, v = summary(self.type_k), summary(self.type_v)
        return k if self.type_k == self.type_v else f"{k} / {v}" if self.mixed else f"{k}/{v}"

    @property
    def mixed(self) -> bool:
        """K or V differs between layers."""
        return "+" in self.type_k or "+" in self.type_v


def parse_pairs(spec: str, hp) -> list[CachePair]:
    """`f16,q8_0,q8_0/q4_0,q8_0:2+q4_0` -> the pairs (a single type is K = V; a type may be
    a per-layer mix, named canonically); the f16/f16 base first, added when the list lacks
    it. Unknown types, types whose blocks do not divide the model's head size, or mixes that
    do not fit its layers are EdgeKVError naming the entry."""
    pairs = [CachePair(*BASE)]
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        k, _, v = entry.partition("/")
        if not k or entry.count("/") > 1 or (_ and not v):
            raise EdgeKVError(f"--types entry {entry!r}: give TYPE (K and V) or K_TYPE/V_TYPE, e.g. q8_0/q4_0")
        pair = CachePair(canonical("K", k, hp.head_dim, hp.n_layers),
                         canonical("V", v or k, hp.head_dim_v, hp.n_layers))
        if pair not in pairs:
            pairs.append(pair)
    return pairs


@dataclass
class _Tally:
    """Running sums over the scored tokens of one pair."""

    nll: list[np.ndarray] = field(default_factory=list)
    kld: list[np.ndarray] = field(default_factory=list)
    same: int = 0

    def add(self, nll: np.ndarray, kld: np.ndarray, same: int) -> None:
        self.nll.append(nll)
        self.kld.append(kld)
        self.same += same


@dataclass
class Quality:
    ppl: float
    ppl_uncertainty: float  # llama.cpp's "+/-"
    kld: float  # mean KL divergence from the base, nats per token
    kld_uncertainty: float  # standard error of the mean
    same_top: float  # % of tokens whose most likely next token is the base's
    n_scored: int


def _quality(t: _Tally) -> Quality:
    nll, kld = np.concatenate(t.nll), np.concatenate(t.kld)
    n = nll.size
    mean = float(nll.mean())
    var = float((nll * nll).mean()) - mean * mean
    ppl = math.exp(mean)
    ppl_unc = ppl * math.sqrt(var / (n - 1)) if var > 0 and n > 1 else float("nan")
    kld_unc = float(kld.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    return Quality(ppl, ppl_unc, float(kld.mean()), kld_unc, 100.0 * t.same / n, n)


def log_softmax(rows: np.ndarray) -> np.ndarray:
    """log p for each row of logits, computed in f64."""
    x = rows.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    return x


def kl_divergence(base_logp: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """KL(base || new) per row, in nats: sum p_base * (log p_base - log p_new)."""
    return (np.exp(base_logp) * (base_logp - log_softmax(logits))).sum(axis=1)


def measure_quality(model, tokens: Sequence[int], n_ctx: int, pairs: Sequence[CachePair], max_chunks: int = -1,
                    n_batch: int = 512, on_chunk: Callable[[int, int], None] | None = None,
                    base_pair: CachePair = CachePair(*BASE)) -> dict[CachePair, Quality]:
    """PPL, KLD from the base pair (f16/f16; it need not be among `pairs`) and same-top % of
    every pair over the text's chunks."""
    tok = model.tokenizer
    bos = tok.bos_id if tok.add_bos else None
    n_chunks = count_chunks(len(tokens), n_ctx, max_chunks)
    sessions = {p: model.session(n_ctx, n_batch, p.type_k, p.type_v) for p in pairs if p != base_pair}
    base = model.session(n_ctx, n_batch, base_pair.type_k, base_pair.type_v)
    tallies = {p: _Tally() for p in [base_pair, *pairs]}
    for i in range(n_chunks):
        chunk = tokens[i * n_ctx : (i + 1) * n_ctx]
        base_logp = []
        for rows, tgt in chunk_logits(base, chunk, bos):
            tallies[base_pair].add(token_nll(rows, tgt), np.zeros(len(tgt)), len(tgt))
            base_logp.append(log_softmax(rows))
        for pair, session in sessions.items():
            for j, (rows, tgt) in enumerate(chunk_logits(session, chunk, bos)):
                same = int((rows.argmax(axis=1) == base_logp[j].argmax(axis=1)).sum())
                tallies[pair].add(token_nll(rows, tgt), kl_divergence(base_logp[j], rows), same)
        if on_chunk is not None:
            on_chunk(i, n_chunks)
    return {p: _quality(tallies[p]) for p in pairs}  # the base's own only when asked for


@dataclass
class Storage:
    bits_k: float  # bits one value takes, scales included
    bits_v: float
    bytes_per_token: int  # K + V of one token over all layers and KV heads
    max_ctx: int  # the longest context whose cache fits the budget (not capped by the trained context)


def storage(hp, pair: CachePair, mem_budget: int) -> Storage:
    row_k, row_v = kv_row_bytes(hp, pair.type_k, pair.type_v)  # per layer, all KV heads
    values_k, values_v = hp.n_layers * hp.n_kv_heads * hp.head_dim, hp.n_layers * hp.n_kv_heads * hp.head_dim_v
    return Storage(8 * sum(row_k) / values_k, 8 * sum(row_v) / values_v, sum(row_k) + sum(row_v),
                   max_context(hp, pair.type_k, pair.type_v, mem_budget))


def decode_speed(model, pair: CachePair, depth: int, n_gen: int, repetitions: int, threads: int | None) -> float:
    """Tokens per second of decode after `depth` cached tokens (llama-bench's tg N @ dD)."""
    test = BenchTest(0, n_gen, depth, type_k=pair.type_k, type_v=pair.type_v, n_threads=threads or 0)
    return run_test(model, test, repetitions).avg_ts


def pareto_front(points: dict[CachePair, tuple[float, float]]) -> set[CachePair]:
    """The pairs no other pair beats on both (bytes, KLD): smaller-or-equal on both and
    strictly smaller on one."""
    return {p for p in points if not any(_beats(points[q], points[p]) for q in points if q != p)}


def _beats(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[0] and a[1] <= b[1] and (a[0] < b[0] or a[1] < b[1])


def mix_verdicts(points: dict[CachePair, tuple[float, float]]) -> list[str]:
    """For each per-layer mix among the (bytes, KLD) points, in words: on the Pareto front
    or not, and which pairs it beats or is beaten by; empty when no pair is a mix."""
    out = []
    for p in (p for p in points if p.mixed):
        by = [q.name for q in points if q != p and _beats(points[q], points[p])]
        if by:
            out.append(f"{p.name}: not on the Pareto front, beaten by {', '.join(by)} (smaller and closer to f16)")
            continue
        beaten = [q.name for q in points if not q.mixed and _beats(points[p], points[q])]
        out.append(f"{p.name}: on the Pareto front" + (f", beats the uniform {', '.join(beaten)}" if beaten else
                                                         ", but beats no uniform pair (it only fills a gap)"))
    return out
