// K/V rows of a chunk into a layer's ring, in the cache's type (ek_kv.cuh): src f32[n_tok,
// n_kv, hd] (already rotated when the type is quantized: the backend's step), slots i32[n_tok]
// (the ring slot each token takes), ring u8[n_kv, cap, row_bytes]. One thread per 32-value
// block (quantized types) or per value (f32, f16, bf16); grid.x covers them all.
#include "ek_kv.cuh"

extern "C" __global__ void ek_kv_write(const float* __restrict__ src, const int* __restrict__ slots,
                                       ek_u8* __restrict__ ring, int type, float limit, int n_tok, int n_kv, int hd,
                                       int cap, int row_bytes) {
    const bool blocks = ek_kv_block_bytes(type) != 0;
    const int per_row = blocks ? hd / 32 : hd;
    const ek_u64 item = (ek_u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (item >= (ek_u64)n_tok * n_kv * per_row) return;
    const int j = (int)(item % per_row), h = (int)(item / per_row % n_kv), t = (int)(item / per_row / n_kv);
    const float* x = src + ((ek_u64)t * n_kv + h) * hd;
    ek_u8* row = ring + ((ek_u64)h * cap + slots[t]) * row_bytes;
    if (!blocks) {
        ek_kv_store_value(type, ek_clamp(x[j], limit), row, j);
        return;
    }
    float v[32];
    for (int k = 0; k < 32; ++k) v[k] = ek_clamp(x[32 * j + k], limit);
    ek_kv_store_block(type, v, row, j);
}
