"""Weights that multiply the same input (a layer's q/k/v, its gate/up), multiplied together:
`RowStack` (32-value block types: one block of row groups) and `KStack` (K-quants: the
weights where they are, one kernel call over all their row groups), made at load time by
the CPU backend's share_input (`stack_of`).

Why: in decode each weight product has a fixed cost (quantizing the token's activations,
a Numba call, a parallel region) next to its arithmetic; a stack pays it once for all its
weights. Hot, SmolLM2's q/k/v take 20 us as one stack against 43 us as three calls.
What lives here: RowStack, KStack. What does not: the single weight and its kernels (matvec.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .int8dot import CHUNK, gemm_chunks
from .matvec import QuantMatrix, _check, quantize_chunk, thread_scratch
from .matvec_drivers import matvec_int8dot, matvec_int8dot_rows, matvec_k_many


class RowStack:
    """Weights that multiply the same input, stored as one block of row groups (their
    packed arrays become views of its parts): one matvec, one activation quantization and
    one parallel region for all of them instead of one each, and the same bits, since each
    row is computed as its own weight's matvec computes it. Made by `RowStack.of`.
    The scratch lives on the instance: one thread at a time."""

    chunks = True  # several tokens go through the stack too (matvec_rows, matmul_batch)

    @classmethod
    def of(cls, ws: list[QuantMatrix]) -> RowStack | None:
        """Store the weights ws as one block of row groups, each of them a view of its part,
        and return the RowStack that multiplies them all in one call; None (nothing
        changed) unless all run on the int8 dot kernels with one type, one row length and
        no padded rows."""
        first = ws[0]
        if not all(w.uses_int8dot and w.ggml_type == first.ggml_type and w.n_cols == first.n_cols
                   and w.n_rows == w._p.n_groups * w.lanes and w.lanes == first.lanes for w in ws):
            return None
        return cls(ws)

    def __init__(self, ws: list[QuantMatrix]):
        first = ws[0]
        self.members = ws
        self.ggml_type, self.n_cols = first.ggml_type, first.n_cols
        self.n_rows = sum(w.n_rows for w in ws)
        self.qs, self.qh, self.d = (np.concatenate([getattr(w._p, f) for w in ws]) for f in ("qs", "qh", "d"))
        g0 = 0
        self._cols = []  # each member's part of a product (no padded rows: groups x lanes)
        for w in ws:  # each member's arrays: its groups of the block (the originals are freed)
            g1 = g0 + w._p.n_groups
            w._p = dataclasses.replace(w._p, qs=self.qs[g0:g1], qh=self.qh[g0:g1], d=self.d[g0:g1])
            self._cols.append(slice(g0 * w.lanes, g1 * w.lanes))
            g0 = g1
        self._xq, self._xd, self._xsum = first._xq, first._xd, first._xsum
        self._out = np.zeros(self.n_rows, np.float32)
        self._no_pad = np.zeros(0, np.float32)

    def is_of(self, ws) -> bool:
        """Whether ws are exactly this stack's weights, in order (QuantMatrix has no __eq__:
        list equality is identity, compared in C)."""
        return list(ws) == self.members

    def matvec(self, x: np.ndarray, outs) -> None:
        """outs[i] = members[i] @ x (one token), each as members[i].matvec computes it."""
        _check("x", x, (self.n_cols,))
        matvec_int8dot(self.ggml_type, x, self.qs, self.qh, self.d, self._xq, self._xd, self._xsum, self._no_pad,
                       self._out)
        self._split(self._out, outs)

    def matvec_rows(self, x: np.ndarray, outs) -> None:
        """outs[i][t] = members[i] @ x[t] for a few tokens (a short chunk, or separate
        sequences' decode steps), each as members[i].matvec computes it; the block is read
        from memory once for all of them."""
        n_tok = x.shape[0] if x.ndim == 2 else -1
        _check("x", x, (n_tok, self.n_cols))
        xq, xd, xsum = self.members[0].row_acts(n_tok)
        out = thread_scratch("stack_out", n_tok * self.n_rows).reshape(n_tok, self.n_rows)
        matvec_int8dot_rows(self.ggml_type, x, self.qs, self.qh, self.d, xq, xd, xsum, out)
        self._split(out, outs)

    def matmul_batch(self, x: np.ndarray, outs) -> None:
        """outs[i] = x @ members[i]^T for a long chunk, as members[i].matmul_batch computes it."""
        n_tok = x.shape[0] if x.ndim == 2 else -1
        _check("x", x, (n_tok, self.n_cols))
        xq, xd, xsum = quantize_chunk(x)
        out = thread_scratch("stack_out", n_tok * self.n_rows).reshape(n_tok, self.n_rows)
        gemm_chunks(self.ggml_type, self.qs, self.qh, self.d, xq.view(np.int32), xsum, xd, out)
        self._split(out, outs)

    def _split(self, out: np.ndarray, outs) -> None:
        for cols, part in zip(self._cols, outs):
            part[...] = out[..., cols]


class KStack:
    """K-quant weights (on the int8 dot instructions) that multiply the same input, multiplied
    in one call for one token: one activation quantization, one Numba call and one parallel
    region over all their row groups (matvec_drivers.matvec_k_many), each row with its own
    weight's matvec bits. The weights stay where they are (a store's mapping included): the
    stack holds tuples of their arrays. Several tokens go through each weight as before
    (`chunks` False: the backend projects them one weight at a time, in llama.cpp's orders).
    Made by `KStack.of`; the scratch lives on the instance: one thread at a time.

    A 1.5B decode step makes 196 weight products; stacking q/k/v and gate/up makes 112."""

    chunks = False

    @classmethod
    def of(cls, ws: list[QuantMatrix]) -> KStack | None:
        """A KStack of ws, or None unless there are two or more, all K-quants on the int8 dot
        kernels in CHUNK-row groups, of one row length, with no padded rows."""
        first = ws[0]
        if len(ws) < 2 or not all(w.sums_on_int8dot and w.n_cols == first.n_cols and w.lanes == CHUNK
                                  and w.n_rows == w._p.n_groups * w.lanes for w in ws):
            return None
        return cls(ws)

    def __init__(self, ws: list[QuantMatrix]):
        self.members = ws
        self.n_cols = ws[0].n_cols
        self._kinds = np.array([w.ggml_type for w in ws], np.int64)
        self._starts = np.cumsum([0] + [w._p.n_groups for w in ws]).astype(np.int64)
        self._arrays = tuple(tuple(getattr(w._p, f) for w in ws) for f in ("qs", "qh", "sc", "d"))
        self._outs = tuple(np.zeros((1, w.n_rows), np.float32) for w in ws)
        self._xq, self._xd, self._xsum = ws[0]._xq, ws[0]._xd, ws[0]._xsum

    def is_of(self, ws) -> bool:
        """Whether ws are exactly this stack's weights, in order."""
        return list(ws) == self.members

    def matvec(self, x: np.ndarray, outs) -> None:
        """outs[i] = members[i] @ x (one token), each as members[i].matvec computes it."""
        _check("x", x, (self.n_cols,))
        qss, qhs, scs, ds = self._arrays
        matvec_k_many(x, self._kinds, self._starts, qss, qhs, scs, ds, self._xq, self._xd, self._xsum, self._outs)
        for part, out in zip(outs, self._outs):
            part[...] = out[0]


def stack_of(ws: list[QuantMatrix]) -> RowStack | KStack | None:
    """The stack that multiplies ws together (RowStack, else KStack), or None where neither
    takes them."""
    return RowStack.of(ws) or KStack.of(ws)
