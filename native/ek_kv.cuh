// Writing K/V rows into the cache's ring in its type: f32, f16, bf16, or the 32-value
// blocks q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, quantized exactly as ggml's quantize_row_*_ref
// (and edgekv's CPU cache: kernels/quantize.py), so a ring is the same bytes on either device
// and state files move between them. Values beyond the type's finite range are saturated
// to +-limit first (cache.py's numerical policy); NaN stays NaN.
#pragma once
#include "ek_blocks.cuh"

// float -> IEEE half bits, round to nearest even (overflow to inf, NaN kept quiet)
EK_HD ek_u16 ek_float_to_half(float f) {
#ifdef __CUDA_ARCH__
    ek_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    union { float f; ek_u32 u; } v;
    v.f = f;
    const ek_u32 sign = (v.u >> 16) & 0x8000u, a = v.u & 0x7fffffffu;
    if (a > 0x7f800000u) return (ek_u16)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (ek_u16)(sign | 0x7c00u);
    if (a < 0x38800000u) {  // a half subnormal or zero: steps of 2^-24, ties to even
        union { float f; ek_u32 u; } w;
        w.u = a;
        const float scaled = w.f * 16777216.0f;  // exact: a power of two
        ek_u32 q = (ek_u32)scaled;
        const float rest = scaled - (float)q;
        if (rest > 0.5f || (rest == 0.5f && (q & 1u))) ++q;
        return (ek_u16)(sign | q);
    }
    const ek_u32 rounded = a + 0x0fffu + ((a >> 13) & 1u);
    return (ek_u16)(sign | ((rounded - 0x38000000u) >> 13));
#endif
}

// float -> bfloat16 bits, round to nearest even (NaN made quiet)
EK_HD ek_u16 ek_float_to_bf16(float f) {
    union { float f; ek_u32 u; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (ek_u16)(((v.u & 0xffff0000u) | 0x00400000u) >> 16);
    return (ek_u16)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

EK_HD float ek_clamp(float x, float limit) { return x > limit ? limit : x < -limit ? -limit : x; }

EK_HD void ek_store2(ek_u8* p, ek_u16 v) {
    p[0] = (ek_u8)(v & 0xff);
    p[1] = (ek_u8)(v >> 8);
}

EK_HD float ek_roundf(float x) {  // C roundf: halfway cases away from zero
    const float t = (float)(int)x;
    const float r = x - t;
    return r >= 0.5f ? t + 1.0f : r <= -0.5f ? t - 1.0f : t;
}

// the value of largest magnitude (its sign kept; the first one on ties), and min / max
EK_HD float ek_signed_absmax(const float* x) {
    float amax = 0.0f, vmax = 0.0f;
    for (int j = 0; j < 32; ++j) {
        const float a = x[j] < 0 ? -x[j] : x[j];
        if (amax < a) { amax = a; vmax = x[j]; }
    }
    return vmax;
}

EK_HD void ek_min_max(const float* x, float* lo, float* hi) {
    *lo = 3.402823466e38f;
    *hi = -3.402823466e38f;
    for (int j = 0; j < 32; ++j) {
        *lo = x[j] < *lo ? x[j] : *lo;
        *hi = x[j] > *hi ? x[j] : *hi;
    }
}

EK_HD int ek_min_int(int a, int b) { return a < b ? a : b; }

EK_HD void ek_quantize_q8_0(const float* x, ek_u8* dst) {  // 34 bytes
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = (x[j] < 0 ? -x[j] : x[j]) > amax ? (x[j] < 0 ? -x[j] : x[j]) : amax;
    const float d = amax / 127.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
    ek_store2(dst, ek_float_to_half(d));
    for (int j = 0; j < 32; ++j) dst[2 + j] = (ek_u8)((int)ek_roundf(EK_MUL(x[j], inv)) & 0xff);
}

EK_HD void ek_quantize_q4_0(const float* x, ek_u8* dst) {  // 18 bytes
    const float d = ek_signed_absmax(x) / -8.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
    ek_store2(dst, ek_float_to_half(d));
    for (int j = 0; j < 16; ++j) {
        const int q0 = ek_min_int(15, (int)EK_ADD(EK_MUL(x[j], inv), 8.5f)),
                  q1 = ek_min_int(15, (int)EK_ADD(EK_MUL(x[16 + j], inv), 8.5f));
        dst[2 + j] = (ek_u8)(q0 | (q1 << 4));
    }
}

// Q4_1 and Q5_1's block head: d = (max - min) / levels and m = min as halves at dst;
// returns 1 / d (0 when d is 0) and the min in *lo
EK_HD float ek_store_scale_min(const float* x, float levels, ek_u8* dst, float* lo) {
    float hi;
    ek_min_max(x, lo, &hi);
    const float d = (hi - *lo) / levels;
    ek_store2(dst, ek_float_to_half(d));
    ek_store2(dst + 2, ek_float_to_half(*lo));
    return d != 0.0f ? 1.0f / d : 0.0f;
}

EK_HD void ek_quantize_q4_1(const float* x, ek_u8* dst) {  // 20 bytes
    float lo;
    const float inv = ek_store_scale_min(x, 15.0f, dst, &lo);
    for (int j = 0; j < 16; ++j) {
        const int q0 = ek_min_int(15, (int)EK_ADD(EK_MUL(x[j] - lo, inv), 0.5f));
        const int q1 = ek_min_int(15, (int)EK_ADD(EK_MUL(x[16 + j] - lo, inv), 0.5f));
        dst[4 + j] = (ek_u8)(q0 | (q1 << 4));
    }
}

// 32 five-bit codes min(31, trunc((x - lo) * inv + offset)): qh (bit j = code j's fifth) then nibbles
EK_HD void ek_put_q5(const float* x, float lo, float inv, float offset, ek_u8* dst) {
    ek_u32 qh = 0;
    for (int j = 0; j < 16; ++j) {
        const int q0 = ek_min_int(31, (int)EK_ADD(EK_MUL(x[j] - lo, inv), offset));
        const int q1 = ek_min_int(31, (int)EK_ADD(EK_MUL(x[16 + j] - lo, inv), offset));
        dst[4 + j] = (ek_u8)((q0 & 15) | ((q1 & 15) << 4));
        qh |= ((ek_u32)((q0 >> 4) & 1) << j) | ((ek_u32)((q1 >> 4) & 1) << (j + 16));
    }
    for (int i = 0; i < 4; ++i) dst[i] = (ek_u8)((qh >> (8 * i)) & 0xff);
}

EK_HD void ek_quantize_q5_0(const float* x, ek_u8* dst) {  // 22 bytes
    const float d = ek_signed_absmax(x) / -16.0f, inv = d != 0.0f ? 1.0f / d : 0.0f;
    ek_store2(dst, ek_float_to_half(d));
    ek_put_q5(x, 0.0f, inv, 16.5f, dst + 2);
}

EK_HD void ek_quantize_q5_1(const float* x, ek_u8* dst) {  // 24 bytes
    float lo;
    const float inv = ek_store_scale_min(x, 31.0f, dst, &lo);
    ek_put_q5(x, lo, inv, 0.5f, dst + 4);
}

// ggml's best_index_int8: the level nearest x, ties to the upper one
EK_HD int ek_iq4nl_nearest(float x) {
    if (x <= ek_iq4nl_level(0)) return 0;
    if (x >= ek_iq4nl_level(15)) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < ek_iq4nl_level(mid)) hi = mid; else lo = mid;
    }
    return x - ek_iq4nl_level(hi - 1) < ek_iq4nl_level(hi) - x ? hi - 1 : hi;
}

// 18 bytes, x = d * level[q]: each value to the level nearest x / (max / -127), then d the
// least-squares scale for those levels weighted by x^2, summed in order (ggml's
// quantize_row_iq4_nl_ref without an importance matrix)
EK_HD void ek_quantize_iq4_nl(const float* x, ek_u8* dst) {
    const float mx = ek_signed_absmax(x);
    float d = 0.0f;
    for (int j = 0; j < 16; ++j) dst[2 + j] = 0;
    if ((mx < 0 ? -mx : mx) >= 1e-15f) {
        const float inv = 1.0f / (mx / -127.0f);
        float sumqx = 0.0f, sumq2 = 0.0f;
        for (int j = 0; j < 32; ++j) {
            const int code = ek_iq4nl_nearest(EK_MUL(inv, x[j]));
            const float q = ek_iq4nl_level(code), w = EK_MUL(x[j], x[j]);
            sumqx = EK_ADD(sumqx, EK_MUL(EK_MUL(w, q), x[j]));
            sumq2 = EK_ADD(sumq2, EK_MUL(EK_MUL(w, q), q));
            dst[2 + (j & 15)] |= (ek_u8)(code << (j < 16 ? 0 : 4));
        }
        d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
    }
    ek_store2(dst, ek_float_to_half(d));
}

// bytes one 32-value block of a cache type takes (0: not a block type)
EK_HD int ek_kv_block_bytes(int type) {
    switch (type) {
        case EK_Q8_0: return 34;
        case EK_Q4_0: return 18;
        case EK_Q4_1: return 20;
        case EK_Q5_0: return 22;
        case EK_Q5_1: return 24;
        case EK_IQ4_NL: return 18;
        default: return 0;
    }
}

// 32 values (already clamped) of a row -> block `b` of dst, a cache row of `type`
EK_HD void ek_kv_store_block(int type, const float* x, ek_u8* row, int b) {
    ek_u8* dst = row + b * ek_kv_block_bytes(type);
    switch (type) {
        case EK_Q8_0: ek_quantize_q8_0(x, dst); break;
        case EK_Q4_0: ek_quantize_q4_0(x, dst); break;
        case EK_Q4_1: ek_quantize_q4_1(x, dst); break;
        case EK_Q5_0: ek_quantize_q5_0(x, dst); break;
        case EK_Q5_1: ek_quantize_q5_1(x, dst); break;
        case EK_IQ4_NL: ek_quantize_iq4_nl(x, dst); break;
        default: break;
    }
}

// one value of a float cache type (f32, f16, bf16) -> element i of a cache row
EK_HD void ek_kv_store_value(int type, float x, ek_u8* row, int i) {
    if (type == EK_F32) {
        ((float*)row)[i] = x;
    } else {
        ek_store2(row + 2 * i, type == EK_F16 ? ek_float_to_half(x) : ek_float_to_bf16(x));
    }
}

// element i of a cache row, decoded alone (attention reads each lane's own elements in place)
EK_HD float ek_kv_element(int type, const ek_u8* row, int i) {
    const int b = i / 32, j = i % 32;
    switch (type) {
        case EK_F32: return ((const float*)row)[i];
        case EK_F16: return ek_half_to_float(ek_load2(row + 2 * i));
        case EK_BF16: return ek_bf16_to_float(ek_load2(row + 2 * i));
        case EK_Q8_0: {
            const ek_u8* blk = row + 34 * b;
            return ek_half_to_float(ek_load2(blk)) * (float)(ek_i8)blk[2 + j];
        }
        case EK_Q4_0: {
            const ek_u8* blk = row + 18 * b;
            const int q = j < 16 ? blk[2 + j] & 15 : blk[2 + j - 16] >> 4;
            return ek_half_to_float(ek_load2(blk)) * (float)(q - 8);
        }
        case EK_Q4_1: {
            const ek_u8* blk = row + 20 * b;
            const int q = j < 16 ? blk[4 + j] & 15 : blk[4 + j - 16] >> 4;
            return EK_ADD(EK_MUL(ek_half_to_float(ek_load2(blk)), (float)q), ek_half_to_float(ek_load2(blk + 2)));
        }
        case EK_Q5_0: {
            const ek_u8* blk = row + 22 * b;
            const int high = (ek_load4(blk + 2) >> j) & 1;
            const int q = (j < 16 ? blk[6 + j] & 15 : blk[6 + j - 16] >> 4) | (high << 4);
            return ek_half_to_float(ek_load2(blk)) * (float)(q - 16);
        }
        case EK_Q5_1: {
            const ek_u8* blk = row + 24 * b;
            const int high = (ek_load4(blk + 4) >> j) & 1;
            const int q = (j < 16 ? blk[8 + j] & 15 : blk[8 + j - 16] >> 4) | (high << 4);
            return EK_ADD(EK_MUL(ek_half_to_float(ek_load2(blk)), (float)q), ek_half_to_float(ek_load2(blk + 2)));
        }
        case EK_IQ4_NL: {
            const ek_u8* blk = row + 18 * b;
            const int q = j < 16 ? blk[2 + j] & 15 : blk[2 + j - 16] >> 4;
            return ek_half_to_float(ek_load2(blk)) * ek_iq4nl_level(q);
        }
        default: return 0.0f;
    }
}
