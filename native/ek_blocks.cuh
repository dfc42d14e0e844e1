// ggml's quantized weight blocks, and each one's values as 32-value sub-blocks.
//
// Every quantized type is read the same way: sub-block s of a row (values 32s .. 32s+31)
// unpacks to 32 small integers q (8 words of 4 signed bytes, value i in byte i % 4 of word
// i / 4) and three floats: value i = a * q[i] + b with a = a_lo for i < 16 and a_hi above
// (they differ for the types whose scales cover 16 values: Q2_K, Q3_K, Q6_K). A dot product
// with activations quantized to Q8_1 (scale d8, s8 = d8 * the sum of their integers) is then
//     d8 * (a_lo * dp4a(q[0:16], y[0:16]) + a_hi * dp4a(q[16:32], y[16:32])) + b * s8,
// integer products on __dp4a and four float operations per 32 weights. Q2_K's offsets (its
// mins) also differ per 16 values (`split`: b for values 0..15, b_hi above), so its dot
// takes the two halves' sums of y from __dp4a too:
//     d8 * (a_lo * lo + a_hi * hi + b * sum(y[0:16]) + b_hi * sum(y[16:32])).
// Layouts as in ggml's ggml-common.h; the unpacking follows ggml's dequantize_row_*
// (ggml-quants.c); the IQ4 types' codes are indices of 16 non-linear levels.
#pragma once
#include "ek_common.cuh"

// ggml type ids (gguf.GGMLQuantizationType)
#define EK_F32 0
#define EK_F16 1
#define EK_Q4_0 2
#define EK_Q4_1 3
#define EK_Q5_0 6
#define EK_Q5_1 7
#define EK_Q8_0 8
#define EK_Q8_1 9
#define EK_Q2_K 10
#define EK_Q3_K 11
#define EK_Q4_K 12
#define EK_Q5_K 13
#define EK_Q6_K 14
#define EK_IQ4_NL 20
#define EK_IQ4_XS 23
#define EK_BF16 30

struct ek_block_q4_0 { ek_u16 d; ek_u8 qs[16]; };                               // 18 bytes / 32 values
struct ek_block_q4_1 { ek_u16 d, m; ek_u8 qs[16]; };                            // 20
struct ek_block_q5_0 { ek_u16 d; ek_u8 qh[4]; ek_u8 qs[16]; };                  // 22
struct ek_block_q5_1 { ek_u16 d, m; ek_u8 qh[4]; ek_u8 qs[16]; };               // 24
struct ek_block_q8_0 { ek_u16 d; ek_i8 qs[32]; };                               // 34
struct ek_block_q8_1 { ek_u16 d, s; ek_i8 qs[32]; };                            // 36 (s = d * sum(qs))
struct ek_block_q4_K { ek_u16 d, dmin; ek_u8 scales[12]; ek_u8 qs[128]; };      // 144 / 256
struct ek_block_q5_K { ek_u16 d, dmin; ek_u8 scales[12]; ek_u8 qh[32]; ek_u8 qs[128]; };  // 176
struct ek_block_q6_K { ek_u8 ql[128]; ek_u8 qh[64]; ek_i8 scales[16]; ek_u16 d; };         // 210
struct ek_block_q2_K { ek_u8 scales[16]; ek_u8 qs[64]; ek_u16 d, dmin; };                  // 84
struct ek_block_q3_K { ek_u8 hmask[32]; ek_u8 qs[64]; ek_u8 scales[12]; ek_u16 d; };       // 110
struct ek_block_iq4_nl { ek_u16 d; ek_u8 qs[16]; };                                         // 18 / 32
struct ek_block_iq4_xs { ek_u16 d, scales_h; ek_u8 scales_l[4]; ek_u8 qs[128]; };           // 136 / 256

struct ek_sub32 {
    int q[8];
    float a_lo, a_hi, b;
    float b_hi;  // the offset of values 16..31 where `split` (Q2_K), else b covers all 32
    bool split;
};

// IQ4_NL's 16 non-linear levels (ggml's kvalues_iq4nl): the IQ4 weights' and the iq4_nl cache's
EK_HD int ek_iq4nl_code(int i) {
    const signed char levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    return levels[i];
}

EK_HD float ek_iq4nl_level(int i) { return (float)ek_iq4nl_code(i); }

// 4 nibble indices (bytes of w, 0..15) -> their 4 levels as signed bytes
EK_HD int ek_iq4nl_levels(int w) {
    int r = 0;
    for (int i = 0; i < 4; ++i) r |= (ek_iq4nl_code((w >> (8 * i)) & 0x0f) & 0xff) << (8 * i);
    return r;
}

// four bytes from p (any alignment) as one little-endian word
EK_HD int ek_load4(const ek_u8* p) {
    return (int)((ek_u32)p[0] | ((ek_u32)p[1] << 8) | ((ek_u32)p[2] << 16) | ((ek_u32)p[3] << 24));
}

EK_HD ek_u16 ek_load2(const ek_u8* p) { return (ek_u16)(p[0] | (p[1] << 8)); }

// words of 4 nibbles -> 4 bytes each: the low nibbles of 4 consecutive bytes, or the high ones
EK_HD int ek_low_nibbles(int w) { return w & 0x0f0f0f0f; }
EK_HD int ek_high_nibbles(int w) { return (w >> 4) & 0x0f0f0f0f; }

// bit k of each of the 4 bytes of w, moved to bit `to` of that byte
EK_HD int ek_byte_bits(int w, int k, int to) {
    const ek_u32 u = ((ek_u32)w >> k) & 0x01010101u;
    return (int)(u << to);
}

// bits 0..3 of b to bit `to` of bytes 0..3 (the high bits of 4 consecutive Q5 values)
EK_HD int ek_spread_bits(int b, int to) {
    const ek_u32 u = ((ek_u32)b & 1u) | (((ek_u32)b & 2u) << 7) | (((ek_u32)b & 4u) << 14) | (((ek_u32)b & 8u) << 21);
    return (int)(u << to);
}

// x - c in every byte, each result as a signed byte
EK_HD int ek_sub_bytes(int x, int c) {
    int r = 0;
    for (int i = 0; i < 4; ++i) r |= (int)((ek_u8)(((x >> (8 * i)) & 0xff) - c)) << (8 * i);
    return r;
}

// Q4_0: value = d * (nibble - 8); low nibbles are values 0..15, high ones 16..31
EK_HD void ek_unpack_q4_0(const ek_u8* row, int s, ek_sub32* o) {
    const ek_u8* blk = row + s * 18;
    for (int j = 0; j < 4; ++j) {
        const int w = ek_load4(blk + 2 + 4 * j);
        o->q[j] = ek_sub_bytes(ek_low_nibbles(w), 8);
        o->q[4 + j] = ek_sub_bytes(ek_high_nibbles(w), 8);
    }
    o->a_lo = o->a_hi = ek_half_to_float(ek_load2(blk));
    o->b = 0.0f;
}

// Q4_1: value = d * nibble + m
EK_HD void ek_unpack_q4_1(const ek_u8* row, int s, ek_sub32* o) {
    const ek_u8* blk = row + s * 20;
    for (int j = 0; j < 4; ++j) {
        const int w = ek_load4(blk + 4 + 4 * j);
        o->q[j] = ek_low_nibbles(w);
        o->q[4 + j] = ek_high_nibbles(w);
    }
    o->a_lo = o->a_hi = ek_half_to_float(ek_load2(blk));
    o->b = ek_half_to_float(ek_load2(blk + 2));
}

// Q5_0: value = d * ((nibble | high bit << 4) - 16); bit i of qh is value i's high bit
EK_HD void ek_unpack_q5_0(const ek_u8* row, int s, ek_sub32* o) {
    const ek_u8* blk = row + s * 22;
    const int qh = ek_load4(blk + 2);
    for (int j = 0; j < 4; ++j) {
        const int w = ek_load4(blk + 6 + 4 * j);
        o->q[j] = ek_sub_bytes(ek_low_nibbles(w) | ek_spread_bits(qh >> (4 * j), 4), 16);
        o->q[4 + j] = ek_sub_bytes(ek_high_nibbles(w) | ek_spread_bits(qh >> (16 + 4 * j), 4), 16);
    }
    o->a_lo = o->a_hi = ek_half_to_float(ek_load2(blk));
    o->b = 0.0f;
}

// Q5_1: value = d * (nibble | high bit << 4) + m
EK_HD void ek_unpack_q5_1(const ek_u8* row, int s, ek_sub32* o) {
    const ek_u8* blk = row + s * 24;
    const int qh = ek_load4(blk + 4);
    for (int j = 0; j < 4; ++j) {
        const int w = ek_load4(blk + 8 + 4 * j);
        o->q[j] = ek_low_nibbles(w) | ek_spread_bits(qh >> (4 * j), 4);
        o->q[4 + j] = ek_high_nibbles(w) | ek_spread_bits(qh >> (16 + 4 * j), 4);
    }
    o->a_lo = o->a_hi = ek_half_to_float(ek_load2(blk));
    o->b = ek_half_to_float(ek_load2(blk + 2));
}

// Q8_0: value = d * q
EK_HD void ek_unpack_q8_0(const ek_u8* row, int s, ek_sub32* o) {
    const ek_u8* blk = row + s * 34;
    for (int j = 0; j < 8; ++j) o->q[j] = ek_load4(blk + 2 + 4 * j);
    o->a_lo = o->a_hi = ek_half_to_float(ek_load2(blk));
    o->b = 0.0f;
}

// Q4_K and Q5_K: sub-block j of a 256-value super-block has a 6-bit scale and min
// (ggml's get_scale_min_k4); value = d * scale * q - dmin * min
EK_HD void ek_scale_min_k4(int j, const ek_u8* sc, int* scale, int* min) {
    if (j < 4) {
        *scale = sc[j] & 63;
        *min = sc[j + 4] & 63;
    } else {
        *scale = (sc[j + 4] & 0x0f) | ((sc[j - 4] >> 6) << 4);
        *min = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

// Q4_K and Q5_K: 64-value chunk c = j / 2 has 32 bytes of nibbles at qs; the low nibbles
// are sub-block 2c, the high ones 2c + 1. Q5_K (qh != 0): bit j of qh[l] is the high bit
// (16) of value l of sub-block j. block_bytes: 144 (Q4_K) or 176 (Q5_K)
EK_HD void ek_unpack_k4(const ek_u8* row, int s, ek_sub32* o, int block_bytes, int qs_at, int qh_at) {
    const ek_u8* blk = row + (s / 8) * block_bytes;
    const int j = s % 8;
    const ek_u8* qs = blk + qs_at + 32 * (j / 2);
    for (int k = 0; k < 8; ++k) {
        const int w = ek_load4(qs + 4 * k);
        const int high = qh_at ? ek_byte_bits(ek_load4(blk + qh_at + 4 * k), j, 4) : 0;
        o->q[k] = (j % 2 ? ek_high_nibbles(w) : ek_low_nibbles(w)) | high;
    }
    int scale, min;
    ek_scale_min_k4(j, blk + 4, &scale, &min);
    o->a_lo = o->a_hi = ek_half_to_float(ek_load2(blk)) * (float)scale;
    o->b = -ek_half_to_float(ek_load2(blk + 2)) * (float)min;
}

EK_HD void ek_unpack_q4_K(const ek_u8* row, int s, ek_sub32* o) { ek_unpack_k4(row, s, o, 144, 16, 0); }
EK_HD void ek_unpack_q5_K(const ek_u8* row, int s, ek_sub32* o) { ek_unpack_k4(row, s, o, 176, 48, 16); }

// Q6_K: half n = j / 4 of the super-block (ql + 64n, qh + 32n, scales + 8n); quarter r = j % 4
// takes the low (r < 2) or high nibbles of ql[l + 32 (r % 2)] and bits 2r, 2r+1 of qh[l];
// value = d * scale * (q - 32), one int8 scale per 16 values
EK_HD void ek_unpack_q6_K(const ek_u8* row, int s, ek_sub32* o) {
    const ek_u8* blk = row + (s / 8) * 210;
    const int j = s % 8, n = j / 4, r = j % 4;
    const ek_u8* ql = blk + 64 * n + 32 * (r % 2);
    const ek_u8* qh = blk + 128 + 32 * n;
    for (int k = 0; k < 8; ++k) {
        const int w = ek_load4(ql + 4 * k);
        const int low = r < 2 ? ek_low_nibbles(w) : ek_high_nibbles(w);
        const int high = ((ek_load4(qh + 4 * k) >> (2 * r)) & 0x03030303) << 4;
        o->q[k] = ek_sub_bytes(low | high, 32);
    }
    const float d = ek_half_to_float(ek_load2(blk + 208));
    const ek_i8* sc = (const ek_i8*)(blk + 192) + 8 * n + 2 * r;
    o->a_lo = d * (float)sc[0];
    o->a_hi = d * (float)sc[1];
    o->b = 0.0f;
}

// Q2_K: half n = j / 4 of the super-block, shift 2 (j % 4) in qs[32n + l]; 16-value
// sub-blocks 2j, 2j + 1 with scale = the low nibble of scales[], min the high one;
// value = d * scale * q - dmin * min
EK_HD void ek_unpack_q2_K(const ek_u8* row, int s, ek_sub32* o) {
    const ek_u8* blk = row + (s / 8) * 84;
    const int j = s % 8, n = j / 4, shift = 2 * (j % 4);
    for (int k = 0; k < 8; ++k) o->q[k] = (ek_load4(blk + 16 + 32 * n + 4 * k) >> shift) & 0x03030303;
    const float d = ek_half_to_float(ek_load2(blk + 80)), dmin = ek_half_to_float(ek_load2(blk + 82));
    const ek_u8 lo = blk[2 * j], hi = blk[2 * j + 1];
    o->a_lo = d * (float)(lo & 0x0f);
    o->a_hi = d * (float)(hi & 0x0f);
    o->b = -(dmin * (float)(lo >> 4));
    o->b_hi = -(dmin * (float)(hi >> 4));
    o->split = true;
}

// Q3_K's 6-bit scale i (0..15) from its 12 bytes (ggml's kmask1/kmask2 unpacking), minus 32
EK_HD int ek_q3_K_scale(const ek_u8* sc, int i) {
    const int low = i < 8 ? sc[i] & 0x0f : sc[i - 8] >> 4;
    const int high = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (low | (high << 4)) - 32;
}

// Q3_K: the 2 low bits as Q2_K's, the third bit (4n + j % 4) of hmask[l]; a clear bit takes
// 4 off: q = -4 .. 3; value = d * (scale - 32) * q, scales per 16 values
EK_HD void ek_unpack_q3_K(const ek_u8* row, int s, ek_sub32* o) {
    const ek_u8* blk = row + (s / 8) * 110;
    const int j = s % 8, n = j / 4, shift = 2 * (j % 4);
    for (int k = 0; k < 8; ++k) {
        const int low = (ek_load4(blk + 32 + 32 * n + 4 * k) >> shift) & 0x03030303;
        o->q[k] = ek_sub_bytes(low | ek_byte_bits(ek_load4(blk + 4 * k), 4 * n + j % 4, 2), 4);
    }
    const float d = ek_half_to_float(ek_load2(blk + 108));
    o->a_lo = d * (float)ek_q3_K_scale(blk + 96, 2 * j);
    o->a_hi = d * (float)ek_q3_K_scale(blk + 96, 2 * j + 1);
    o->b = 0.0f;
}

// the IQ4 types: 16 bytes of nibbles at qs, the low ones values 0..15, the high ones 16..31
EK_HD void ek_unpack_iq4(const ek_u8* qs, float a, ek_sub32* o) {
    for (int k = 0; k < 4; ++k) {
        const int w = ek_load4(qs + 4 * k);
        o->q[k] = ek_iq4nl_levels(ek_low_nibbles(w));
        o->q[4 + k] = ek_iq4nl_levels(ek_high_nibbles(w));
    }
    o->a_lo = o->a_hi = a;
    o->b = 0.0f;
}

// IQ4_NL: value = d * level[nibble]
EK_HD void ek_unpack_iq4_nl(const ek_u8* row, int s, ek_sub32* o) {
    const ek_u8* blk = row + s * 18;
    ek_unpack_iq4(blk + 2, ek_half_to_float(ek_load2(blk)), o);
}

// IQ4_XS: block j of 8 in a 256-value super-block, a 6-bit scale ls (4 bits in scales_l,
// 2 in scales_h); value = d * (ls - 32) * level[nibble]
EK_HD void ek_unpack_iq4_xs(const ek_u8* row, int s, ek_sub32* o) {
    const ek_u8* blk = row + (s / 8) * 136;
    const int j = s % 8;
    const int ls = ((blk[4 + j / 2] >> (4 * (j % 2))) & 0x0f) | (((ek_load2(blk + 2) >> (2 * j)) & 3) << 4);
    ek_unpack_iq4(blk + 8 + 16 * j, ek_half_to_float(ek_load2(blk)) * (float)(ls - 32), o);
}

// sub-block s of a row of `type` (EK_Q4_0 ... EK_IQ4_XS); false for a type without sub-blocks
EK_HD bool ek_unpack(int type, const ek_u8* row, int s, ek_sub32* o) {
    o->split = false;
    switch (type) {
        case EK_Q4_0: ek_unpack_q4_0(row, s, o); return true;
        case EK_Q4_1: ek_unpack_q4_1(row, s, o); return true;
        case EK_Q5_0: ek_unpack_q5_0(row, s, o); return true;
        case EK_Q5_1: ek_unpack_q5_1(row, s, o); return true;
        case EK_Q8_0: ek_unpack_q8_0(row, s, o); return true;
        case EK_Q4_K: ek_unpack_q4_K(row, s, o); return true;
        case EK_Q5_K: ek_unpack_q5_K(row, s, o); return true;
        case EK_Q6_K: ek_unpack_q6_K(row, s, o); return true;
        case EK_Q2_K: ek_unpack_q2_K(row, s, o); return true;
        case EK_Q3_K: ek_unpack_q3_K(row, s, o); return true;
        case EK_IQ4_NL: ek_unpack_iq4_nl(row, s, o); return true;
        case EK_IQ4_XS: ek_unpack_iq4_xs(row, s, o); return true;
        default: return false;
    }
}

// value i (0..31) of an unpacked sub-block
EK_HD float ek_sub32_value(const ek_sub32* u, int i) {
    const int q = (int)(ek_i8)(u->q[i / 4] >> (8 * (i % 4)));
    const float v = EK_MUL(i < 16 ? u->a_lo : u->a_hi, (float)q);
    const float b = u->split && i >= 16 ? u->b_hi : u->b;
    return b == 0.0f ? v : EK_ADD(v, b);  // no + 0: ggml's d * q keeps the sign of a zero
}

// the dot product of an unpacked sub-block with a Q8_1 block of activations
EK_HD float ek_sub32_dot_q8_1(const ek_sub32* u, const ek_block_q8_1* y) {
    int lo = 0, hi = 0;
    for (int k = 0; k < 4; ++k) {
        lo = ek_dp4a(u->q[k], ek_load4((const ek_u8*)y->qs + 4 * k), lo);
        hi = ek_dp4a(u->q[4 + k], ek_load4((const ek_u8*)y->qs + 16 + 4 * k), hi);
    }
    const float d8 = ek_half_to_float(y->d);
    if (u->split) {  // Q2_K: an offset per 16 values, times those activations' own sum
        int y_lo = 0, y_hi = 0;
        for (int k = 0; k < 4; ++k) {
            y_lo = ek_dp4a(0x01010101, ek_load4((const ek_u8*)y->qs + 4 * k), y_lo);
            y_hi = ek_dp4a(0x01010101, ek_load4((const ek_u8*)y->qs + 16 + 4 * k), y_hi);
        }
        return d8 * (u->a_lo * (float)lo + u->a_hi * (float)hi + u->b * (float)y_lo + u->b_hi * (float)y_hi);
    }
    return d8 * (u->a_lo * (float)lo + u->a_hi * (float)hi) + u->b * ek_half_to_float(y->s);
}
