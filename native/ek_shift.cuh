// Context shift on the device: cached keys whose positions moved by delta are re-rotated by
// RoPE in place (positions live in K), as cache.KVCache._shift_rows does on the CPU: the row
// is read in its cache type, a quantized type's Hadamard rotation is undone (H @ H = I),
// the pairs are rotated by the delta's angle (cos/sin from the host's rope tables, so YaRN
// and frequency factors apply as in a forward pass), the Hadamard rotation is applied again,
// and the row is stored back in its type, saturated at the type's limit.
#pragma once
#include "ek_kv.cuh"
#include "ek_attention.cuh"  // EK_MAX_HEAD_DIM

#define EK_ROPE_NEOX_MODE 2

// x[0:hd] <- each run of r values times the symmetric r x r matrix h (kernels/rows.rotate)
EK_HD void ek_rotate_runs(float* x, int hd, const float* h, int r) {
    float tmp[EK_MAX_HEAD_DIM];
    for (int base = 0; base < hd; base += r) {
        for (int j = 0; j < r; ++j) {
            float acc = 0.0f;
            for (int i = 0; i < r; ++i) acc += x[base + i] * h[i * r + j];
            tmp[j] = acc;
        }
        for (int j = 0; j < r; ++j) x[base + j] = tmp[j];
    }
}

struct ek_shift_args {
    int type, hd, half, mode, r;  // r: the rotation's size (0: the type is stored unrotated)
    float limit;
    const float* cos_t;  // [half]: this key's delta
    const float* sin_t;
    const float* h;  // [r * r] or null
};

// one cached key row (hd values in `type`) re-rotated in place
EK_HD void ek_shift_row(ek_u8* row, const ek_shift_args& a) {
    float x[EK_MAX_HEAD_DIM];
    for (int i = 0; i < a.hd; ++i) x[i] = ek_kv_element(a.type, row, i);
    if (a.r) ek_rotate_runs(x, a.hd, a.h, a.r);
    for (int i = 0; i < a.half; ++i) {
        const int p = a.mode == EK_ROPE_NEOX_MODE ? i : 2 * i, q = a.mode == EK_ROPE_NEOX_MODE ? i + a.half : 2 * i + 1;
        const float x0 = x[p], x1 = x[q], c = a.cos_t[i], s = a.sin_t[i];
        x[p] = x0 * c - x1 * s;
        x[q] = x0 * s + x1 * c;
    }
    if (a.r) ek_rotate_runs(x, a.hd, a.h, a.r);
    for (int i = 0; i < a.hd; ++i) x[i] = ek_clamp(x[i], a.limit);
    if (ek_kv_block_bytes(a.type)) {
        for (int b = 0; b < a.hd / 32; ++b) ek_kv_store_block(a.type, x + 32 * b, row, b);
    } else {
        for (int i = 0; i < a.hd; ++i) ek_kv_store_value(a.type, x[i], row, i);
    }
}
