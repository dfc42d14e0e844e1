"""The program side of tools/aarch64/count_instructions.sh (runs on aarch64, under QEMU's
gdb stub): compiles one C-callable function per kernel and weight type, each running one
row chunk of a weight over NB blocks, writes their addresses, stops for the debugger
(SIGTRAP), then calls each once per block count so the debugger can count its steps.

Kernels: "sdot" = one 8-row chunk of the sdot matvec (dot_ir.chunk_codegen), "portable"
= one 64-row group of dot_q.dot_blocks, both on one token's q8 activations.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

import numba as nb
import numpy as np
from gguf import GGMLQuantizationType as T
from numba import types

from edgekv.kernels import dot_ir, dot_q, int8dot
from edgekv.kernels.sdot import SDOT

TYPES = {"Q8_0": T.Q8_0, "Q4_0": T.Q4_0, "Q4_1": T.Q4_1, "Q5_0": T.Q5_0, "Q5_1": T.Q5_1}
BLOCKS = (1, 9)  # the difference of the two counts / 8 = one block's instructions
P = types.CPointer


def _sdot_cfunc(kind):
    chunk = dot_ir.chunk_intrinsics(SDOT)[kind]
    n_words, R = 8, SDOT.width
    d_cols = 2 if kind in (T.Q4_1, T.Q5_1) else 1
    q_rows = 1 if kind in (T.Q5_0, T.Q5_1) else 0

    @nb.cfunc(types.void(P(types.uint32), P(types.uint32), P(types.uint16), P(types.int32), P(types.int32),
                         P(types.float32), P(types.float32), types.int64), nopython=True)
    def run(qs, qh, d, x4, xs, xd, out, nblk):
        chunk(nb.carray(qs, (1, nblk, n_words, R)), nb.carray(qh, (1, nblk, q_rows, R)),
              nb.carray(d, (1, nblk, d_cols, R)), nb.carray(x4, (nblk, 8)), nb.carray(xs, (nblk, 16)),
              nb.carray(xd, (nblk, 2)), 0, 0, nb.carray(out, (R,)))

    return run, R


def _portable_cfunc(kind):
    R = 64
    n_words = 8 if kind == T.Q8_0 else 4
    d_cols = 2 if kind in (T.Q4_1, T.Q5_1) else 1
    q_rows = 1 if kind in (T.Q5_0, T.Q5_1) else 0
    k = int(kind)

    @nb.cfunc(types.void(P(types.uint32), P(types.uint32), P(types.uint16), P(types.int8), P(types.float32),
                         P(types.float32), P(types.int32), types.int64), nopython=True)
    def run(qs, qh, d, xq, xd, acc, isum, nblk):
        dot_q.dot_blocks(k, nb.carray(qs, (1, nblk, n_words, R)), nb.carray(qh, (1, nblk, q_rows, R)),
                         nb.carray(d, (1, nblk, d_cols, R)), nb.carray(xq, (nblk, 32)), nb.carray(xd, (nblk, 2)),
                         0, nb.carray(acc, (10, R)), nb.carray(isum, (25, R)))

    return run, R


def main(address_file: str) -> None:
    assert int8dot.ISA is SDOT, "no sdot here: run with QEMU_CPU=max on an aarch64 root"
    rng = np.random.default_rng(0)
    qs, qh = (rng.integers(0, 1 << 32, 64 * 9 * 8, dtype=np.uint64).astype(np.uint32) for _ in range(2))
    d = rng.integers(0x3000, 0x3800, 64 * 9 * 2, dtype=np.uint16)  # small positive halves
    x4 = rng.integers(-2**31, 2**31, 9 * 8, dtype=np.int64).astype(np.int32)
    xs, xd = np.zeros(9 * 16, np.int32), np.ones(9 * 2, np.float32)
    out, isum = np.zeros(64 * 10, np.float32), np.zeros(25 * 64, np.int32)
    c_type = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 7, ctypes.c_int64)
    sdot_args = [a.ctypes.data for a in (qs, qh, d, x4, xs, xd, out)]
    portable_args = [a.ctypes.data for a in (qs, qh, d, x4, xd, out, isum)]
    calls, fns = [], []
    for name, kind in TYPES.items():
        for label, (fn, rows), args in (("sdot", _sdot_cfunc(kind), sdot_args),
                                        ("portable", _portable_cfunc(kind), portable_args)):
            fns.append(fn)
            for nblk in BLOCKS:
                calls.append((dict(type=name, kernel=label, rows=rows, blocks=nblk, address=fn.address),
                              c_type(fn.address), args + [nblk]))
    with open(address_file, "w") as f:
        json.dump(sorted({info["address"] for info, _, _ in calls}), f)
    os.kill(os.getpid(), signal.SIGTRAP)  # the debugger sets its breakpoints here
    for _, call, args in calls:
        call(*args)
    print(json.dumps([info for info, _, _ in calls]))


if __name__ == "__main__":
    main(sys.argv[1])
