"""The CPU backends: `cpu` (int8 dot-product kernels where the CPU has them: AVX512-VNNI
on x86, sdot on Arm) and `cpu-portable`.

What lives here: `CPUBackend`, which runs each operation of backends/base.py on the Numba
kernels in kernels/, choosing them as backends/kernel_map.py says. The two backends
differ only in whether weights of the 32-value block types take the int8 dot kernels; they
give the same bits on the exact path. What does not: the kernels, the choice of backend
(backends/__init__.py).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from gguf import GGMLQuantizationType as T

from ..kernels.rows import keep_sinks, map_keys, map_queries, rotate
from ..kernels import attention_decode
from ..kernels.attention import F16_TO_F32, attention_chunk_blas, attention_f16
from ..kernels.attention_q import attention_rows, dequant_rows
from ..kernels.attention_sessions import attention_f16_sessions
from ..kernels.config import max_threads
from ..kernels.ggml_math import gelu_f16_table
from ..kernels.matvec import QuantMatrix, quantize_chunk, thread_scratch
from ..kernels.ops import (add_bias, add_inplace, add_rms_norm, gelu_mul, normalize_rows, rms_norm, rms_norm_heads,
                           rope_apply, rope_apply_qk, rope_tables, silu_mul, softcap_inplace)
from ..kernels.quantize import store_rows, store_rows_kv
from ..kernels.row_stack import RowStack, stack_of
from . import kernel_map, pack_store
from .base import Backend
from .contract import LayerView


_NO_SINKS = np.zeros((1, 0, 1), np.float32)  # attention_rows' sink_k when the cache keeps none


class CPUBackend(Backend):
    exact_verify = True

    def __init__(self, name: str, use_int8dot: bool):
        self.name = name
        self.use_int8dot = use_int8dot and kernel_map.int8dot_available()
        self.n_workers = max_threads()
        self.weight_names: dict[int, str] = {}  # id(weight) -> its GGUF tensor name
        # observer(name, x): given each named weight's input x f32[n_tok, n_cols] before the
        # product (once per call for the pieces of a fused tensor); None: nothing is observed
        self.observer: Callable[[str, np.ndarray], None] | None = None

    # -- weights ----------------------------------------------------------------------------

    def weight(self, raw: np.ndarray, ggml_type: int, n_rows: int, n_cols: int,
               release: Callable[[np.ndarray], None] | None = None, store=None) -> QuantMatrix:
        # whether this backend may use the int8 dot instructions; QuantMatrix applies it per
        # type (the 32-value kernels, or the K-quants' integer sums) as kernel_map's table says
        return QuantMatrix(raw, ggml_type, n_rows, n_cols, use_int8dot=self.use_int8dot, release=release, store=store)

    def tied_output(self, w: QuantMatrix) -> None:
        w.keep_file_order()

    def embed(self, w: QuantMatrix, ids: np.ndarray, out: np.ndarray) -> None:
        w.rows(ids, out)

    def named(self, w: QuantMatrix, name: str) -> None:
        self.weight_names[id(w)] = name

    def observe(self, ws: Sequence[QuantMatrix], x: np.ndarray) -> None:
        seen = set()
        for w in ws:
            name = self.weight_names.get(id(w))
            if name is not None and name not in seen:
                seen.add(name)
                self.observer(name, x)

    def project(self, w: QuantMatrix, x: np.ndarray, out: np.ndarray) -> None:
        if self.observer is not None:
            self.observe((w,), x)
        self._project(w, x, out)

    def _project(self, w: QuantMatrix, x: np.ndarray, out: np.ndarray) -> None:
        n = x.shape[0]
        if n == 1:
            w.matvec(x[0], out[0])
        elif self.rows_independent:
            w.matvec_rows(x, out)
        elif kernel_map.batched(n):
            w.matmul_batch(x, out)
        else:
            w.matmul_exact(x, out)

    def share_input(self, ws: Sequence[QuantMatrix]) -> None:
        # weights on the int8 dot kernels become one RowStack or KStack: one kernel call for all of them
        replaced = [a for w in ws for a in (w._p.qs, w._p.qh, w._p.d)]  # what a RowStack takes the place of
        stack = stack_of(list(ws))
        for w in ws:
            w.stack = stack
        if isinstance(stack, RowStack):  # mapped from a store of repacked weights: those pages are not needed now
            for a in replaced:
                pack_store.release(a)

    def project_many(self, ws: Sequence[QuantMatrix], x: np.ndarray, outs: Sequence[np.ndarray]) -> None:
        if self.observer is not None:
            self.observe(ws, x)
        stack = ws[0].stack
        if stack is not None and (x.shape[0] == 1 or stack.chunks) and stack.is_of(ws):
            if x.shape[0] == 1:
                stack.matvec(x[0], [out[0] for out in outs])
            elif kernel_map.batched(x.shape[0]) and not self.rows_independent:
                stack.matmul_batch(x, outs)
            else:  # a short chunk or separate sequences' tokens: each token as matvec computes it
                stack.matvec_rows(x, outs)
            return
        # on the integer GEMM a chunk's activations are quantized once for all the weights
        if (not self.rows_independent and kernel_map.batched(x.shape[0])
                and all(w.uses_int8dot and w.n_cols == x.shape[1] for w in ws)):
            acts = quantize_chunk(x)
            for w, out in zip(ws, outs):
                w.matmul_batch(x, out, acts)
            return
        for w, out in zip(ws, outs):
            self._project(w, x, out)

    # -- element-wise and per-row -----------------------------------------------------------

    def rms_norm(self, x, weight, eps, out) -> None:
        rms_norm(x, weight, np.float32(eps), out)

    def rms_norm_heads(self, x, weight, eps) -> None:
        rms_norm_heads(x, weight, np.float32(eps))

    def rope_tables(self, positions, n_rot, theta, scaling, freq_factors, cos, sin) -> None:
        lo, hi = scaling.corr_dims(n_rot, theta)
        rope_tables(positions, n_rot, np.float32(theta), np.float32(scaling.freq_scale), np.float32(scaling.ext_factor),
                    np.float32(scaling.mscale()), np.float32(lo), np.float32(hi), freq_factors, cos, sin)

    def rope(self, x, cos, sin, mode) -> None:
        rope_apply(x, cos, sin, mode)

    def silu_mul(self, gate, up) -> None:
        silu_mul(gate, up)

    def gelu_mul(self, gate, up) -> None:
        gelu_mul(gate, up, gelu_f16_table())

    def add(self, x, y) -> None:
        add_inplace(x, y)

    def add_rms_norm(self, x, y, weight, eps, out) -> None:
        add_rms_norm(x, y, weight, np.float32(eps), out)

    def rope_qk(self, q, k, cos, sin, mode) -> None:
        rope_apply_qk(q, k, cos, sin, mode)

    def add_bias(self, x, b) -> None:
        add_bias(x, b)

    def scale(self, x, s) -> None:
        x *= np.float32(s)

    def softcap(self, x, cap) -> None:
        softcap_inplace(x, np.float32(cap))

    # -- the KV cache -------------------------------------------------------------------------

    def store_kv(self, dst, ggml_type, slots, src, limit) -> None:
        # one backend serves every session and thread: the clamped row is per thread
        store_rows(src, ggml_type, slots, dst, np.float32(limit), thread_scratch("kv_row", src.shape[2]))

    def load_kv(self, rows, ggml_type, hd, slots) -> np.ndarray:
        if ggml_type == T.F16:  # a table lookup
            return F16_TO_F32[rows[:, slots].view(np.uint16)]
        part = np.ascontiguousarray(rows[:, slots])
        n_kv, m = part.shape[0], part.shape[1]
        out = np.empty((n_kv * m, hd), np.float32)
        dequant_rows(part.reshape(n_kv * m, -1), ggml_type, out)
        return out.reshape(n_kv, m, hd)

    def attend(self, layer: LayerView, slots, positions, q, k, v, out, scale, scratch: Any) -> None:
        n, ck, cv = q.shape[0], layer.codec_k, layer.codec_v
        if ck.key_scale is not None:  # a calibrated K type (kv/key_map.KeyMap)
            map_keys(k, ck.key_mean, ck.key_scale)
            map_queries(q, ck.key_scale)
        turn = self._rotate_rows if self.rows_independent else rotate
        turn(q, ck.rotation)  # quantized caches store rotated K and V (kv/cache.py)
        turn(k, ck.rotation)
        turn(v, cv.rotation)
        store_rows_kv(k, v, ck.ggml_type, cv.ggml_type, slots, layer.k, layer.v, np.float32(ck.limit),
                      np.float32(cv.limit), thread_scratch("kv_row", max(k.shape[2], v.shape[2])))
        sinks = _NO_SINKS if ck.sink_k is None else ck.sink_k
        if ck.sink_k is not None:
            keep_sinks(ck.sink_k, positions, k)
        f16 = ck.ggml_type == cv.ggml_type == T.F16  # the path that follows llama.cpp's f16 arithmetic
        if kernel_map.batched(n):
            visible = slice(0, layer.n_slots)
            kf = self.load_kv(layer.k, ck.ggml_type, q.shape[2], visible)
            vf = self.load_kv(layer.v, cv.ggml_type, out.shape[2], visible)
            pos = layer.slot_pos[: layer.n_slots]
            at = np.flatnonzero((pos >= 0) & (pos < sinks.shape[1]))
            kf[:, at] = sinks[:, pos[at]]
            attention_chunk_blas(q, positions, kf, vf, layer.slot_pos, layer.n_slots, layer.window, scale, out, f16,
                                 layer.attn_mass)
        else:
            scores, pv = scratch.attn_scratch(n * q.shape[1], layer.slot_pos.shape[0])
            if f16 and attention_decode.fits(n, layer.n_slots, layer.window, q.shape[2], out.shape[2]):
                probs, lanes = scratch.deep_scratch(q.shape[1], layer.slot_pos.shape[0])
                attention_decode.attention_f16_deep(q, positions, layer.k.view(np.uint16), layer.v.view(np.uint16),
                                                    layer.slot_pos, layer.n_slots, layer.window, np.float32(scale),
                                                    scores, probs, lanes, out)
            elif f16:
                attention_f16(q, positions, layer.k.view(np.uint16), layer.v.view(np.uint16), layer.slot_pos,
                              layer.n_slots, layer.window, np.float32(scale), scores, pv, out, self.rows_independent)
            else:
                attention_rows(q, positions, layer.k, layer.v, ck.ggml_type, cv.ggml_type, layer.slot_pos,
                               layer.n_slots, layer.window, np.float32(scale), scores, scratch.kv_rows, out, sinks)
            if layer.attn_mass is not None:  # the kernels leave each row's softmax numerators
                add_tallies(layer.attn_mass, scores, n, q.shape[1], k.shape[1], layer.n_slots)
        turn(out, cv.rotation)

    @staticmethod
    def _rotate_rows(x: np.ndarray, h: np.ndarray | None) -> None:
        # token by token: BLAS rounds a row of a product differently as the row count changes,
        # and rows computed as decode steps must rotate as a one-token pass does
        for t in range(x.shape[0]):
            rotate(x[t], h)

    def attend_batch(self, batch, res, layer, q, k, v, out, scale, scratch) -> None:
        # the sessions whose layer is a plain f16 ring at short depth (the default cache) in one
        # kernel call (attention_sessions.py), from the step's table (contract.SessionRings); the
        # others one by one, as attend does them
        rings = batch.rings(res)
        hd_k, hd_v, cap = q.shape[2], out.shape[2], rings.caps[layer]
        n_slots, windows = rings.n_slots[layer], rings.windows[layer]
        together = [i for i in range(q.shape[0]) if rings.plain[layer, i]
                    and not attention_decode.fits(1, int(n_slots[i]), int(windows[i]), hd_k, hd_v)]
        if len(together) < 2:
            super().attend_batch(batch, res, layer, q, k, v, out, scale, scratch)
            return
        alone = [i for i in range(q.shape[0]) if i not in together]
        for i in alone:
            self.attend(batch.caches[i].layer_view(layer), res.parts[i].slots[layer], res.positions[i : i + 1],
                        q[i : i + 1], k[i : i + 1], v[i : i + 1], out[i : i + 1], scale, scratch)
        sel = np.array(together) if alone else slice(None)
        part = out[sel]
        scores, pv = scratch.attn_scratch(len(together) * q.shape[1], cap)
        attention_f16_sessions(q[sel], k[sel], v[sel], res.positions[sel], rings.slots[layer][sel],
                               rings.addresses[layer][sel], n_slots[sel], windows[sel], cap,
                               rings.limit_k[layer, together[0]], rings.limit_v[layer, together[0]], np.float32(scale),
                               scores, pv, thread_scratch("kv_row", max(hd_k, hd_v)), part)
        if alone:
            out[sel] = part

    def describe(self) -> dict[str, str]:
        return {"backend": self.name,
                "weight kernels": f"{kernel_map.int8dot_name()} (LLVM IR) + portable" if self.use_int8dot
                else "portable (Numba)"}



def add_tallies(mass: np.ndarray, scores: np.ndarray, n: int, n_heads: int, n_kv: int, n_slots: int) -> None:
    """The `keep` tallies of n queries from their softmax numerators (scores f32[>= n * n_heads,
    >= n_slots], the attention kernels' rows, normalised in place): mass f32[n_kv, cap] gains each slot's weight
    summed over each KV head's query heads and over the queries. mass f32[n, n_kv, cap] (a
    verify pass of drafted tokens: kv/cache.py DraftMark) takes each query's own weights, which
    the cache adds in order, as decode steps add them, once it knows which tokens are kept."""
    normalize_rows(scores, n * n_heads, n_slots)
    weights = scores[: n * n_heads, :n_slots].reshape(n, n_kv, -1, n_slots)
    if mass.ndim == 3:
        for t in range(n):
            mass[t, :, :n_slots] = weights[t].sum(axis=1)
    elif n == 1:  # a decode step: the order the per-query tallies are added in
        mass[:, :n_slots] += weights[0].sum(axis=1)
    else:
        mass[:, :n_slots] += weights.sum(axis=(0, 2))
