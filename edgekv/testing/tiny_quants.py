"""Simple block quantizers for the weight types `gguf.quants` can only read (Q2_K-Q6_K, IQ4_NL,
IQ4_XS), for the tiny test models (tiny_model.py): each lays its blocks out exactly as
`gguf.quants` (and llama.cpp) read them, with scales fitted per block and codes rounded to
the nearest level; not llama-quantize's error-minimizing searches (edgekv/quantize does
those). Needs only numpy.

    K_QUANTIZERS[name](blocks f32[n, 256]) -> u8[n, type_size]   Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS
    quantize_iq4_nl(blocks f32[n, 32]) -> u8[n, 18]
"""

from __future__ import annotations

import numpy as np

def _pack_scales_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins per block -> the 12-byte field of Q4_K/Q5_K: bytes 0-3 hold
    sc[0:4] (+ the top 2 bits of sc[4:8] in bits 6-7), bytes 4-7 the same for the mins,
    bytes 8-11 the low nibbles of sc[4:8] (bits 0-3) and mn[4:8] (bits 4-7)."""
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)
    return out


def _affine_codes(blocks: np.ndarray, nmax: int):
    """x ~ d*sc[j]*q - dmin*mn[j] over 8 sub-blocks of 32, q in 0..nmax, sc and mn 6-bit."""
    sub = blocks.reshape(len(blocks), 8, 32)
    lo = np.minimum(sub.min(-1), 0.0)
    step, offset = (sub.max(-1) - lo) / nmax, -lo  # (n_blocks, 8)
    d = (step.max(-1) / 63).astype(np.float16)
    dmin = (offset.max(-1) / 63).astype(np.float16)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.nan_to_num(np.rint(step / d.astype(np.float32)[:, None])).clip(0, 63).astype(np.uint8)
        mn = np.nan_to_num(np.rint(offset / dmin.astype(np.float32)[:, None])).clip(0, 63).astype(np.uint8)
        scale = (d.astype(np.float32)[:, None] * sc)[..., None]
        shift = (dmin.astype(np.float32)[:, None] * mn)[..., None]
        q = np.nan_to_num(np.rint((sub + shift) / scale)).clip(0, nmax).astype(np.uint8)
    return d, dmin, sc, mn, q  # q: (n_blocks, 8, 32)


def _nibbles(q: np.ndarray) -> np.ndarray:
    """Codes of 8 sub-blocks -> 128 bytes: byte l of chunk c = q[2c][l] | q[2c+1][l] << 4."""
    return ((q[:, 0::2] & 0xF) | ((q[:, 1::2] & 0xF) << 4)).reshape(len(q), 128)


def quantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    """(n, 256) f32 -> (n, 144) bytes: d f16 | dmin f16 | scales[12] | qs[128]."""
    d, dmin, sc, mn, q = _affine_codes(blocks, 15)
    return np.hstack([d[:, None].view(np.uint8), dmin[:, None].view(np.uint8), _pack_scales_k4(sc, mn), _nibbles(q)])


def quantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    """(n, 256) f32 -> (n, 176) bytes: d | dmin | scales[12] | qh[32] | qs[128]; bit j of
    qh[l] is the fifth bit of value l of sub-block j."""
    d, dmin, sc, mn, q = _affine_codes(blocks, 31)
    qh = sum(((q[:, j, :] >> 4) & 1) << j for j in range(8)).astype(np.uint8)
    head = [d[:, None].view(np.uint8), dmin[:, None].view(np.uint8), _pack_scales_k4(sc, mn)]
    return np.hstack(head + [qh, _nibbles(q)])


def quantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    """(n, 256) f32 -> (n, 210) bytes: ql[128] | qh[64] | scales[16] int8 | d f16; x ~ d*sc[i]*(u-32)
    over 16 sub-blocks of 16. Per half h of 128 values: ql[64h+b] holds the low nibbles of
    values b and 64+b; bits 2s..2s+1 of qh[32h+l] are the top bits of value 32s+l."""
    n = len(blocks)
    sub = blocks.reshape(n, 16, 16)
    step = np.abs(sub).max(-1) / 31
    d = (step.max(-1) / 127).astype(np.float16)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.nan_to_num(np.rint(step / d.astype(np.float32)[:, None])).clip(-128, 127).astype(np.int8)
        scale = (d.astype(np.float32)[:, None] * sc)[..., None]
        u = (np.nan_to_num(np.rint(sub / scale)).clip(-32, 31) + 32).astype(np.uint8).reshape(n, 2, 128)
    ql = ((u[:, :, :64] & 0xF) | ((u[:, :, 64:] & 0xF) << 4)).reshape(n, 128)
    top = (u >> 4).reshape(n, 2, 4, 32)
    qh = sum(top[:, :, s, :] << (2 * s) for s in range(4)).astype(np.uint8).reshape(n, 64)
    return np.hstack([ql, qh, sc.view(np.uint8), d[:, None].view(np.uint8)])


def _low_k_bits(codes: np.ndarray) -> np.ndarray:
    """2-bit codes (n, 256) -> the 64 qs bytes of Q2_K/Q3_K: bits 2j.. of byte 32n + l hold
    value 128n + 32j + l."""
    c = codes.reshape(len(codes), 2, 4, 32).astype(np.uint8)
    return sum(c[:, :, j, :] << (2 * j) for j in range(4)).astype(np.uint8).reshape(len(codes), 64)


def quantize_q2_k(blocks: np.ndarray) -> np.ndarray:
    """(n, 256) f32 -> (n, 84) bytes: scales[16] (scale | min << 4) | qs[64] | d f16 | dmin f16;
    x ~ d * sc[s] * q - dmin * mn[s] over 16 sub-blocks of 16, q in 0..3, sc and mn 4-bit."""
    n = len(blocks)
    sub = blocks.reshape(n, 16, 16)
    lo = np.minimum(sub.min(-1), 0.0)
    step, offset = (sub.max(-1) - lo) / 3, -lo
    d, dmin = (step.max(-1) / 15).astype(np.float16), (offset.max(-1) / 15).astype(np.float16)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.nan_to_num(np.rint(step / d.astype(np.float32)[:, None])).clip(0, 15).astype(np.uint8)
        mn = np.nan_to_num(np.rint(offset / dmin.astype(np.float32)[:, None])).clip(0, 15).astype(np.uint8)
        scale = (d.astype(np.float32)[:, None] * sc)[..., None]
        shift = (dmin.astype(np.float32)[:, None] * mn)[..., None]
        q = np.nan_to_num(np.rint((sub + shift) / scale)).clip(0, 3).astype(np.uint8)
    return np.hstack([sc | (mn << 4), _low_k_bits(q.reshape(n, 256)), d[:, None].view(np.uint8),
                      dmin[:, None].view(np.uint8)])


def quantize_q3_k(blocks: np.ndarray) -> np.ndarray:
    """(n, 256) f32 -> (n, 110) bytes: hmask[32] | qs[64] | scales[12] | d f16; x ~ d * (sc - 32)
    * q over 16 sub-blocks of 16, q in -4..3 (low 2 bits in qs, bit 4n + j of hmask[l] set
    when q >= 0), sc 6-bit."""
    n = len(blocks)
    sub = blocks.reshape(n, 16, 16)
    step = np.abs(sub).max(-1) / 4
    d = (step.max(-1) / 31).astype(np.float16)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.nan_to_num(np.rint(step / d.astype(np.float32)[:, None])).clip(0, 31).astype(np.uint8) + 32
        scale = (d.astype(np.float32)[:, None] * (sc.astype(np.float32) - 32))[..., None]
        u = (np.nan_to_num(np.rint(sub / scale)).clip(-4, 3) + 4).astype(np.uint8).reshape(n, 2, 4, 32)
    hmask = sum(((u[:, m // 4, m % 4, :] >> 2) & 1) << m for m in range(8)).astype(np.uint8)
    scales = np.empty((n, 12), np.uint8)
    scales[:, 0:8] = (sc[:, 0:8] & 0xF) | ((sc[:, 8:16] & 0xF) << 4)
    scales[:, 8:12] = sum(((sc[:, 4 * k:4 * k + 4] >> 4) & 3) << (2 * k) for k in range(4)).astype(np.uint8)
    return np.hstack([hmask, _low_k_bits((u & 3).reshape(n, 256)), scales, d[:, None].view(np.uint8)])


IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def _iq4_codes(sub: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The nearest IQ4_NL level codes of sub (..., 32) / scale (...): 16 packed bytes per 32
    values, value j in the low nibble of byte j, value j + 16 in its high nibble."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.nan_to_num(sub / scale[..., None])
    q = np.abs(t[..., None] - IQ4_LEVELS).argmin(-1).astype(np.uint8)
    return q[..., :16] | (q[..., 16:] << 4)


def quantize_iq4_nl(blocks: np.ndarray) -> np.ndarray:
    """(n, 32) f32 -> (n, 18) bytes: d f16 | qs[16]; x ~ d * level[code], d = max|x| / 127."""
    d = (np.abs(blocks).max(-1) / 127).astype(np.float16)
    return np.hstack([d[:, None].view(np.uint8), _iq4_codes(blocks, d.astype(np.float32))])


def quantize_iq4_xs(blocks: np.ndarray) -> np.ndarray:
    """(n, 256) f32 -> (n, 136) bytes: d f16 | scales_h u16 | scales_l[4] | qs[128]; 8
    sub-blocks of 32 as IQ4_NL blocks under x = d * (ls - 32) * level[code], ls 6 bits."""
    n = len(blocks)
    sub = blocks.reshape(n, 8, 32)
    step = np.abs(sub).max(-1) / 127  # each sub-block's own IQ4_NL scale
    d = (step.max(-1) / 31).astype(np.float16)
    with np.errstate(divide="ignore", invalid="ignore"):
        ls = (np.nan_to_num(np.rint(step / d.astype(np.float32)[:, None])).clip(-32, 31) + 32).astype(np.uint16)
    scale = d.astype(np.float32)[:, None] * (ls.astype(np.float32) - 32)
    high = sum(((ls[:, j] >> 4) & 3) << (2 * j) for j in range(8)).astype(np.uint16)
    low = ((ls[:, 0::2] & 0xF) | ((ls[:, 1::2] & 0xF) << 4)).astype(np.uint8)
    return np.hstack([d[:, None].view(np.uint8), high[:, None].view(np.uint8), low,
                      _iq4_codes(sub, scale).reshape(n, 128)])


K_QUANTIZERS = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k, "IQ4_XS": quantize_iq4_xs,
                "Q2_K": quantize_q2_k, "Q3_K": quantize_q3_k}
