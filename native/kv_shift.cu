// A context shift's K re-rotation (ek_shift.cuh) for the moved slots of one layer: ring
// u8[n_kv, cap, row_bytes], slots i32[m], cos/sin f32[m, half] (each slot's delta), h the
// quantized type's Hadamard matrix f32[r, r] (r = 0: none). One thread per (slot, KV head).
#include "ek_shift.cuh"

extern "C" __global__ void ek_kv_shift(ek_u8* ring, const int* __restrict__ slots, const float* __restrict__ cos_t,
                                       const float* __restrict__ sin_t, const float* __restrict__ h, int r, int type,
                                       float limit, int m, int n_kv, int hd, int cap, int row_bytes, int half,
                                       int mode) {
    const int item = blockIdx.x * blockDim.x + threadIdx.x;
    if (item >= m * n_kv) return;
    const int j = item / n_kv, kv = item % n_kv;
    const ek_shift_args a = {type, hd, half, mode, r, limit, cos_t + (ek_u64)j * half, sin_t + (ek_u64)j * half, h};
    ek_shift_row(ring + ((ek_u64)kv * cap + slots[j]) * row_bytes, a);
}
