"""One decode step of several sessions in one call: each row's query over its own
session's f16 ring, with attention_f16's bits.

Why: sessions decoded together (kv/batch.py) each bring one query per layer. Through
attention_f16 that is one call per session and layer, each paying a parallel region and
Numba's dispatch (SmolLM2, 40 cached tokens: 12 us a call, of which 7 us is fixed); here
one call spreads every session's heads over the threads. The rings are separate arrays of
one shape (the sessions of a batch share their context size), passed by address: one
compiled kernel serves any number of sessions.
What lives here: `attention_f16_sessions`, which also writes each session's new K/V rows
(store_rows_kv, in the same call). What does not: the per-head arithmetic
(attention.attend_head), choosing this path (backends/cpu.py).
"""

from __future__ import annotations

import numba as nb
from numba.core import types
from numba.extending import intrinsic

from .attention import attend_head
from .config import PARALLEL_FLAGS
from .quantize import store_rows_kv

F16 = 1  # ggml's type id of the f16 rows these rings hold


def _pointer_intrinsic(element):
    @intrinsic
    def at(typingctx, address):
        # an i64 address (numpy's .ctypes.data of a live array) as a pointer to `element`
        sig = types.CPointer(element)(types.int64)

        def codegen(context, builder, sig, args):
            return builder.inttoptr(args[0], context.get_value_type(sig.return_type))

        return sig, codegen

    return at


_u8_at = _pointer_intrinsic(types.uint8)
_u16_at = _pointer_intrinsic(types.uint16)
_i32_at = _pointer_intrinsic(types.int32)


@nb.njit(**PARALLEL_FLAGS)
def attention_f16_sessions(q, k, v, q_pos, slots, at, n_slots, windows, cap, limit_k, limit_v, scale, scores, pv,
                           kv_row, out):
    # q: f32[n, n_heads, hd_k], k: f32[n, n_kv, hd_k], v: f32[n, n_kv, hd_v]: row t is session
    # t's token at q_pos[t], stored into slot slots[t] of its ring (store_rows_kv: clamped to
    # +-limit, f16), then attending to it; the ring's arrays at addresses at[t] (i64[3]):
    # k u16[n_kv, cap, hd_k], v u16[n_kv, cap, hd_v], slot_pos i32[cap]; n_slots[t] slots
    # written (the new one included), windows[t] (0: none). scores: f32[>= n * n_heads, >= cap],
    # pv: attention_f16's lane scratch, kv_row: f32[>= max(hd_k, hd_v)], out: f32[n, n_heads, hd_v].
    # Every head as attention_f16 computes a lone decode step (ggml_vec_dot_f16's order).
    n, n_heads, hd_k = q.shape
    n_kv, hd_v = k.shape[1], v.shape[2]
    group = n_heads // n_kv
    for t in range(n):
        store_rows_kv(k[t : t + 1], v[t : t + 1], F16, F16, slots[t : t + 1],
                      nb.carray(_u8_at(at[t, 0]), (n_kv, cap, 2 * hd_k)), nb.carray(_u8_at(at[t, 1]), (n_kv, cap, 2 * hd_v)),
                      limit_k, limit_v, kv_row)
    for job in nb.prange(n * n_heads):
        t, h = job // n_heads, job % n_heads
        k_rows = nb.carray(_u16_at(at[t, 0]), (n_kv, cap, hd_k))[h // group]
        v_rows = nb.carray(_u16_at(at[t, 1]), (n_kv, cap, hd_v))[h // group]
        slot_pos = nb.carray(_i32_at(at[t, 2]), (cap,))
        attend_head(q[t, h], q_pos[t], k_rows, v_rows, slot_pos, n_slots[t], windows[t], scale, scores[job],
                    pv[nb.get_thread_id()], out[t, h], False)
