"""Load-time repacking of a weight into the "lane" layout the matrix kernels read.

What lives here: `repack(raw, ggml_type, n_rows, n_cols, type_size, lanes) -> Packed`, NumPy,
run once per weight at model load. What does not: the kernels that read the layout
(dot_q.py, dot_k.py, unpack.py, matvec.py) and the file layout itself (gguf/quants.py).

The lane layout: rows are taken R = `lanes` at a time (a "group"; the last group is
padded with zero rows) and every field of a block is stored with the group's R rows
side by side, so the kernels' innermost loop runs over R contiguous lanes with no
horizontal reductions, and LLVM turns it into plain SIMD. The code bytes travel four
at a time: one uint32 word holds bytes 4i..4i+3 of a row (byte 4i + k in bits 8k..),
which are the four consecutive values llama.cpp's SIMD sums in one integer lane, so a
lane's four products come from one load and LLVM sums them with 16-bit multiply-adds
(vpmaddwd / vpdpwssd). For a group g, block b:

    qs[g, b, i, r]   word i of the block's codes, row g*R + r        u32[G, NB, Q/4, R]
    qh[g, b, i, r]   word i of the high bits (Q5_*, Q5_K, Q6_K; Q3_K's
                     hmask)                                           u32[G, NB, H/4, R]
    sc[g, b, i, r]   sub-block scale i (K-quants; Q4_K/Q5_K: 8 scales
                     then 8 mins, unpacked from 6 bits; Q6_K: int8;
                     Q3_K: 16 six-bit, value - 32; Q2_K: the file's
                     bytes, scale | min << 4; IQ4_XS: the 8 six-bit
                     ls, value ls - 32)                                u8[G, NB, S, R]
    d[g, b, i, r]    f16 bits of the block scales: (d,) or (d, m) or
                     (d, dmin)                                        u16[G, NB, D, R]

Byte i of qs/qh (byte i % 4 of word i / 4) is exactly byte i of that field in the
file, so every kernel uses ggml's own value order. Fields a type lacks have size 0. Float weights keep one value
per lane: F32 in w[g, c, r] (f32), F16/BF16 as their uint16 bits in d[g, c, 0, r]. The scales
stay f16: converting them in the kernel is free next to the memory traffic it saves.
Total size = the quantized size + the K-quants' unpacked 6-bit scales (+3%) + padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

# (offset, length) of each field inside one block of the file layout
_FIELDS: dict[int, dict[str, tuple[int, int]]] = {
    int(T.Q8_0): {"d": (0, 2), "qs": (2, 32)},
    int(T.Q4_0): {"d": (0, 2), "qs": (2, 16)},
    int(T.Q4_1): {"d": (0, 4), "qs": (4, 16)},
    int(T.Q5_0): {"d": (0, 2), "qh": (2, 4), "qs": (6, 16)},
    int(T.Q5_1): {"d": (0, 4), "qh": (4, 4), "qs": (8, 16)},
    int(T.Q4_K): {"d": (0, 4), "sc": (4, 12), "qs": (16, 128)},
    int(T.Q5_K): {"d": (0, 4), "sc": (4, 12), "qh": (16, 32), "qs": (48, 128)},
    int(T.Q6_K): {"qs": (0, 128), "qh": (128, 64), "sc": (192, 16), "d": (208, 2)},
    int(T.Q2_K): {"sc": (0, 16), "qs": (16, 64), "d": (80, 4)},
    int(T.Q3_K): {"qh": (0, 32), "qs": (32, 64), "sc": (96, 12), "d": (108, 2)},
    int(T.IQ4_NL): {"d": (0, 2), "qs": (2, 16)},
    int(T.IQ4_XS): {"d": (0, 2), "sc": (2, 6), "qs": (8, 128)},
}
FLOAT_TYPES = (int(T.F32), int(T.F16), int(T.BF16))
CHUNK_BYTES = 8 << 20  # file bytes repacked per step


@dataclass
class Packed:
    """A weight in lane layout. Quantized types fill qs/qh/sc/d, float types fill w."""

    lanes: int
    n_groups: int
    qs: np.ndarray
    qh: np.ndarray
    sc: np.ndarray
    d: np.ndarray
    w: np.ndarray

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.qs, self.qh, self.sc, self.d, self.w))


def unpack_k4_scales(s: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K packed scales u8[..., 12] -> u8[..., 16]: 8 six-bit scales, then 8 mins."""
    lo_sc, lo_mn, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo_sc & 63, (hi & 0xF) | ((lo_sc >> 6) << 4)], axis=-1)
    mn = np.concatenate([lo_mn & 63, (hi >> 4) | ((lo_mn >> 6) << 4)], axis=-1)
    return np.concatenate([sc, mn], axis=-1).astype(np.uint8)


def unpack_q3_k_scales(s: np.ndarray) -> np.ndarray:
    """Q3_K packed scales u8[..., 12] -> the 16 six-bit sub-block scales (value - 32) as
    u8[..., 16]: sub-block i's low 4 bits are nibble i // 8 of byte i % 8, its high 2 bits
    bits 2 (i // 4).. of byte 8 + i % 4."""
    out = np.empty(s.shape[:-1] + (16,), np.uint8)
    for i in range(16):
        low = (s[..., i % 8] >> (4 * (i // 8))) & 0xF
        out[..., i] = low | (((s[..., 8 + i % 4] >> (2 * (i // 4))) & 3) << 4)
    return out


def unpack_iq4_xs_scales(s: np.ndarray) -> np.ndarray:
    """IQ4_XS scale bytes u8[..., 6] (scales_h: u16, scales_l: u8[4]) -> the 8 six-bit
    sub-block scales ls (0..63; the value is ls - 32) as u8[..., 8]."""
    high = s[..., 0].astype(np.uint16) | (s[..., 1].astype(np.uint16) << 8)
    out = np.empty(s.shape[:-1] + (8,), np.uint8)
    for ib in range(8):
        low = (s[..., 2 + ib // 2] >> (4 * (ib % 2))) & 0xF
        out[..., ib] = low | (((high >> (2 * ib)) & 3) << 4).astype(np.uint8)
    return out


def row_fields(rows: np.ndarray, ggml_type: int, n_cols: int, type_size: int) -> dict[str, np.ndarray]:
    """File rows u8[n, row_nbytes] -> each field as [n, NB, X] (F32/F16/BF16: NB = n_cols, X = 1)."""
    n = rows.shape[0]
    if ggml_type == int(T.F32):
        return {"w": rows.view(np.float32).reshape(n, n_cols, 1)}
    if ggml_type in FLOAT_TYPES:  # F16/BF16 bits travel in d's place
        return {"d": rows.view(np.uint16).reshape(n, n_cols, 1)}
    blocks = rows.reshape(n, -1, type_size)
    fields = {}
    for name, (start, length) in _FIELDS[ggml_type].items():
        part = blocks[:, :, start:start + length]
        # views, no copies: the last axis is contiguous, so the bytes reinterpret in place
        if name == "d":
            part = part.view("<u2")
        elif name in ("qs", "qh"):  # bytes 4i..4i+3 -> word i, little-endian as in the file
            part = part.view("<u4")
        elif name == "sc" and ggml_type == int(T.IQ4_XS):
            part = unpack_iq4_xs_scales(part)
        elif name == "sc" and ggml_type == int(T.Q3_K):
            part = unpack_q3_k_scales(part)
        elif name == "sc" and ggml_type in (int(T.Q4_K), int(T.Q5_K)):
            part = unpack_k4_scales(part)
        fields[name] = part
    return fields


def repack(raw: np.ndarray, ggml_type: int, n_rows: int, n_cols: int, type_size: int, lanes: int,
           release=None) -> Packed:
    """The file bytes of an [n_rows, n_cols] weight -> lane layout (validated by the caller).

    Works through CHUNK_BYTES of the file at a time, so loading needs the repacked
    weight plus a few MB, not several copies of the largest tensor; `release(rows)`, when
    given, is called with each chunk of raw rows once it is copied (GGUFFile.release_pages).
    """
    raw = np.asarray(raw, np.uint8).reshape(n_rows, -1)
    n_groups = -(-n_rows // lanes)
    per_step = max(1, CHUNK_BYTES // (lanes * raw.shape[1]))  # groups per step
    out: dict[str, np.ndarray] = {}
    for g0 in range(0, n_groups, per_step):
        g1 = min(n_groups, g0 + per_step)
        rows = raw[g0 * lanes:g1 * lanes]
        if rows.shape[0] < (g1 - g0) * lanes:  # zero rows pad the last group
            rows = np.concatenate([rows, np.zeros(((g1 - g0) * lanes - rows.shape[0], raw.shape[1]), np.uint8)])
        for name, field in row_fields(rows, ggml_type, n_cols, type_size).items():
            _, nb, x = field.shape
            if name not in out:
                out[name] = np.empty((n_groups, nb, x, lanes), field.dtype.newbyteorder("="))
            out[name][g0:g1] = field.reshape(g1 - g0, lanes, nb, x).transpose(0, 2, 3, 1)
        if release is not None:
            release(raw[g0 * lanes:g1 * lanes])
    n_blocks = out["qs"].shape[1] if "qs" in out else 1
    none = np.zeros((n_groups, n_blocks, 0, lanes), np.uint32)
    return Packed(lanes, n_groups, out.get("qs", none), out.get("qh", none),
                  out.get("sc", np.zeros((n_groups, n_blocks, 0, lanes), np.uint8)),
                  out.get("d", np.zeros((n_groups, n_blocks, 0, lanes), np.uint16)),
                  out["w"][:, :, 0, :] if "w" in out else np.zeros((n_groups, 0, lanes), np.float32))
