"""llama.cpp's llama-perplexity method, exactly: the scored tokens' logits and their NLL.

The method (the project's tests/reference/perplexity.json): tokenize the whole file (BOS
added when the model adds one); cut it into consecutive chunks of n_ctx tokens (the
remainder is dropped; at least two chunks are needed, as llama.cpp requires); in each chunk
the first token is replaced by BOS when the model adds BOS; each chunk is evaluated from an
empty cache; the logits at positions n_ctx/2 .. n_ctx-2 score the tokens that follow them
(n_ctx/2 - 1 tokens per chunk); PPL = exp(mean NLL). The NLL of one token is
-(logit[tok] - max - log(sum(exp(logit - max)))), with exp in f32 and the sum in f64 as
llama.cpp computes it.

Only the scored half of a chunk asks for logits, in pieces of at most LOGIT_ROWS rows, so
a 262k vocabulary needs ~130 MB of logits rather than n_ctx full rows.
What does not live here: the commands (cli/perplexity.py; lab/kv_report.py compares cache types
with the same chunks), KL divergence against a saved base (lab/kl_divergence.py), the forward
pass (models/, session.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Iterator, Sequence

import numpy as np

from ..errors import EdgeKVError

LOGIT_ROWS = 128


@dataclass
class PerplexityResult:
    ppl: float
    uncertainty: float  # llama.cpp's "+/-": ppl * sqrt((E[nll^2] - E[nll]^2) / (n - 1))
    n_chunks: int
    n_scored: int
    running: list[float] = field(default_factory=list)  # PPL after each chunk


def token_nll(rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log p(target) for each row of logits f32[b, n_vocab], as f64[b]."""
    out = np.empty(rows.shape[0], np.float64)
    for i in range(rows.shape[0]):
        row = rows[i]
        top = row.max()
        sum_exp = np.exp(row - top).sum(dtype=np.float64)
        out[i] = -(float(row[targets[i]] - top) - math.log(sum_exp))
    return out


def chunk_logits(session, chunk: Sequence[int], bos_id: int | None,
                 as_steps: bool = False) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One chunk (n_ctx tokens) evaluated from an empty cache: (logits f32[b, n_vocab],
    the tokens they score i64[b]) for the scored positions, at most LOGIT_ROWS rows at a time.
    as_steps: every token as a one-token decode step computes it (what -b 1 gives), several
    tokens per pass (`step_passes`)."""
    n_ctx = len(chunk)
    first = n_ctx // 2
    inputs = list(chunk)
    if bos_id is not None:
        inputs[0] = bos_id
    session.reset()
    run = partial(step_passes, session) if as_steps else session.eval
    run(inputs[:first])
    targets = np.asarray(chunk, dtype=np.int64)
    for start in range(first, n_ctx - 1, LOGIT_ROWS):  # position n_ctx-1 predicts nothing scored
        stop = min(start + LOGIT_ROWS, n_ctx - 1)
        yield run(inputs[start:stop], all_logits=True), targets[start + 1 : stop + 1]


def step_passes(session, ids: Sequence[int], all_logits: bool = False) -> np.ndarray | None:
    """session.eval(ids) with each token's logits and cache rows a one-token decode step's,
    bit for bit, but several tokens per pass: Session.verify (the speculative decoding pass,
    whose rows are decode steps on a backend with exact_verify) keeping every row. The
    weights are read once per pass instead of once per token (2-3x faster on 2 cores)."""
    ids = list(ids)
    rows = np.empty((len(ids), session.n_vocab), np.float32) if all_logits else None
    done = 0
    if not session.n_tokens:  # a pass follows at least one evaluated token
        out = session.eval(ids[:1], all_logits=all_logits)
        if all_logits:
            rows[0] = out[0]
        done = 1
    while done < len(ids):
        size = min(session.max_verify(), len(ids) - done)
        logits = session.verify(ids[done:done + size])
        session.settle(size)
        if all_logits:
            rows[done:done + size] = logits
        done += size
    return rows


def count_chunks(n_tokens: int, n_ctx: int, max_chunks: int = -1, purpose: str = "to evaluate perplexity") -> int:
    """Chunks the method scores; raises llama.cpp's errors for too little text."""
    if n_ctx < 3:
        raise EdgeKVError(f"the chunks need a context of at least 3 tokens, got -c {n_ctx}")
    if n_tokens < 2 * n_ctx:
        raise EdgeKVError(f"you need at least {2 * n_ctx} tokens {purpose} with a context of "
                          f"{n_ctx}; the file tokenizes to only {n_tokens} tokens")
    n_chunks = n_tokens // n_ctx
    return min(n_chunks, max_chunks) if max_chunks > 0 else n_chunks


def compute(session, tokens: Sequence[int], n_ctx: int, bos_id: int | None, max_chunks: int = -1,
            on_chunk: Callable[[int, float], None] | None = None,
            on_rows: Callable[[np.ndarray], None] | None = None, as_steps: bool = False) -> PerplexityResult:
    """Run the method over `tokens` (already tokenized, BOS included when the model adds it).
    bos_id: the token that replaces each chunk's first one, None when the model adds no BOS.
    on_rows: given the logits of the scored positions, in order (saving a KL-divergence base).
    as_steps: chunk_logits's."""
    n_chunks = count_chunks(len(tokens), n_ctx, max_chunks)
    nll = nll2 = 0.0
    count = 0
    running = []
    for i in range(n_chunks):
        parts = []
        for rows, targets in chunk_logits(session, tokens[i * n_ctx : (i + 1) * n_ctx], bos_id, as_steps):
            if on_rows is not None:
                on_rows(rows)
            parts.append(token_nll(rows, targets))
        values = np.concatenate(parts)
        nll += float(values.sum())
        nll2 += float((values * values).sum())
        count += values.size
        running.append(math.exp(nll / count))
        if on_chunk is not None:
            on_chunk(i, running[-1])
    mean, mean2 = nll / count, nll2 / count
    variance = mean2 - mean * mean
    ppl = math.exp(mean)
    uncertainty = ppl * math.sqrt(variance / (count - 1)) if variance > 0 and count > 1 else float("nan")
    return PerplexityResult(ppl, uncertainty, n_chunks, count, running)


