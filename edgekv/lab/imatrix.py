"""llama-imatrix's importance matrix: for each weight matrix of the blocks, the sum over a
text's tokens of each input column's squared activation, and how many tokens it saw.

The method (tools/imatrix/imatrix.cpp of the pinned llama.cpp): tokenize the whole file (BOS
when the model adds one); cut it into consecutive chunks of n_ctx tokens (the remainder is
dropped; at least two chunks, as llama.cpp requires), at most `max_chunks`; evaluate each
chunk from an empty cache, its first token replaced by BOS when the model adds one. Every
matrix product whose weight is named `blk.*` (and `output.weight` with process_output) adds
x*x of each of its input rows to that weight's sums, row after row in float32 as llama.cpp
adds them, and counts the rows. The logits of each chunk's second half score the next tokens
as llama-perplexity does: the PPL llama-imatrix prints.

What lives here: `collect` and the per-weight `Collector` (the CPU backend's observer,
backends/cpu.py). What does not: the command (cli/imatrix.py), the file formats
(quantize/imatrix.py), quantizing with the result (quantize/model.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import EdgeKVError
from .perplexity import LOGIT_ROWS, count_chunks, token_nll

PURPOSE = "for an importance matrix (give more text or a smaller -c)"


class Collector:
    """observer(name, x): the column sums of x*x per weight, and the rows seen."""

    def __init__(self, process_output: bool):
        self.process_output = process_output
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, int] = {}

    def __call__(self, name: str, x: np.ndarray) -> None:
        if not (name.startswith("blk.") or (self.process_output and name == "output.weight")):
            return
        acc = self.sums.get(name)
        if acc is None:
            acc = self.sums[name] = np.zeros(x.shape[1], np.float32)
            self.counts[name] = 0
        for row in x:
            acc += row * row
        self.counts[name] += x.shape[0]
        if not np.isfinite(acc).all():
            raise EdgeKVError(f"the activations of {name!r} are not finite: the model's weights are broken "
                              f"(check it with `edgekv inspect --check-tensors`)")


@dataclass
class ImatrixResult:
    sums: dict[str, np.ndarray]  # weight name -> f32[n_cols]
    counts: dict[str, int]  # weight name -> rows seen
    n_chunks: int
    ppl: float | None  # over the scored tokens, None when not computed

    def stats(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{name: (in_sum2 f32[1, n_cols], counts f32[1])}, what quantize/imatrix.write_imatrix takes."""
        return {n: (s.reshape(1, -1), np.array([self.counts[n]], np.float32)) for n, s in self.sums.items()}


def eval_chunk(session, chunk: Sequence[int], bos_id: int | None, all_rows: bool, logits: bool = True):
    """Evaluate one chunk from an empty cache; yields (logits, the tokens they score) for the
    second half (every row when all_rows: the output matrix is observed on them all; nothing
    but the pass when not logits)."""
    n_ctx = len(chunk)
    first = n_ctx // 2
    inputs = list(chunk)
    if bos_id is not None:
        inputs[0] = bos_id
    session.reset()
    if not logits and not all_rows:
        session.eval(inputs)
        return
    start = 0
    if not all_rows:
        session.eval(inputs[:first])
        start = first
    targets = np.asarray(chunk, dtype=np.int64)
    for a in range(start, n_ctx, LOGIT_ROWS):
        b = min(a + LOGIT_ROWS, n_ctx)
        rows = session.eval(inputs[a:b], all_logits=True)
        lo, hi = max(a, first), min(b, n_ctx - 1)  # scored: positions first .. n_ctx-2
        if lo < hi:
            yield rows[lo - a:hi - a], targets[lo + 1:hi + 1]


def collect(model, session, tokens: Sequence[int], n_ctx: int, bos_id: int | None, max_chunks: int = -1,
            process_output: bool = False, compute_ppl: bool = True,
            on_chunk: Callable[[int, int, float | None], None] | None = None) -> ImatrixResult:
    """The importance matrix of `model` over `tokens` (tokenized, BOS included when the model
    adds one) with session (n_ctx tokens, batch >= 16 rows). on_chunk(i, n_chunks, running PPL)."""
    n_chunks = count_chunks(len(tokens), n_ctx, max_chunks, PURPOSE)
    backend = model.backend
    if not hasattr(backend, "observer"):
        raise EdgeKVError(f"edgekv imatrix reads the activations on the CPU; the {backend.name} backend does not "
                          f"show them: use --backend cpu")
    collector = Collector(process_output)
    nll, count = 0.0, 0
    backend.observer = collector
    try:
        for i in range(n_chunks):
            chunk = tokens[i * n_ctx:(i + 1) * n_ctx]
            for logits, targets in eval_chunk(session, chunk, bos_id, process_output, compute_ppl):
                if compute_ppl:
                    values = token_nll(logits, targets)
                    nll += float(values.sum())
                    count += values.size
            if on_chunk is not None:
                on_chunk(i, n_chunks, math.exp(nll / count) if count else None)
    finally:
        backend.observer = None
    if not collector.sums:
        raise EdgeKVError("no matrix product was observed: this model has no blk.* weights")
    return ImatrixResult(collector.sums, collector.counts, n_chunks, math.exp(nll / count) if count else None)
