// A calibrated K type (iq4_cal: edgekv/kv/key_map.py KeyMap, kv/cache.py SINKS), around a
// layer's K/V write. Element-wise, one thread per value (grid-stride loops).
// ek_key_map: x f32[n_tok, n_kv * group, hd] in place; mean, scale f32[n_kv, hd], one layer's
// map. Keys (queries = 0, group = 1): (x - mean) * scale, so that each channel fills the
// 4-bit levels; queries (queries = 1): x / scale, a KV head's scale for its group of query
// heads, which leaves every score q . k what it was up to the mean's constant shift.
// ek_keep_sinks: the stored (mapped, rotated) K f32[n_tok, n_kv, hd] of the tokens at
// positions p < n_sinks into sink f32[n_kv, n_sinks, hd], which attention reads instead of
// their quantized rows (the first token draws much of every query's attention).
#include "ek_common.cuh"

extern "C" __global__ void ek_key_map(float* x, const float* __restrict__ mean, const float* __restrict__ scale,
                                      ek_u64 n, int n_kv, int group, int hd, int queries) {
    EK_GRID_STRIDE(i, n) {
        const ek_u64 c = (i / hd / group % n_kv) * hd + i % hd;
        x[i] = queries ? x[i] / scale[c] : EK_MUL(x[i] - mean[c], scale[c]);
    }
}

extern "C" __global__ void ek_keep_sinks(const float* __restrict__ k, const int* __restrict__ positions,
                                         float* __restrict__ sink, ek_u64 n, int n_kv, int hd, int n_sinks) {
    EK_GRID_STRIDE(i, n) {  // n = n_tok * n_kv * hd
        const int p = positions[i / hd / n_kv];
        if (p >= 0 && p < n_sinks) sink[((i / hd % n_kv) * n_sinks + p) * hd + i % hd] = k[i];
    }
}
