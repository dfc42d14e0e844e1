// Attention over a layer's ring (ek_attention.cuh): one warp per (query token, head).
// q f32[n_tok, n_heads, hd_k], q_pos i32[n_tok], k u8[n_kv, cap, row_bytes_k],
// v u8[n_kv, cap, row_bytes_v], slot_pos i32[cap], out f32[n_tok, n_heads, hd_v].
// grid = (n_heads, n_tok), blockDim.x = 32. n_slots: device memory holding the count of slots
// ever written (scan [0, *n_slots)): read at run time, so a captured decode step replays as
// the ring fills (the host writes the count into the step's inputs).
#include "ek_attention.cuh"

struct ek_warp {
    static constexpr int lanes = EK_WARP;
    __device__ int lane() const { return threadIdx.x % EK_WARP; }
    __device__ float sum(float v) const { return ek_warp_sum(v); }
    __device__ float exp(float x) const { return expf(x); }
};

extern "C" __global__ void ek_attention(const float* __restrict__ q, const int* __restrict__ q_pos,
                                        const ek_u8* __restrict__ k, const ek_u8* __restrict__ v,
                                        const int* __restrict__ slot_pos, const int* __restrict__ n_slots, int window,
                                        float scale, int type_k, int type_v, int n_heads, int n_kv, int hd_k,
                                        int hd_v, int cap, int row_bytes_k, int row_bytes_v,
                                        float* __restrict__ out) {
    const int h = blockIdx.x, t = blockIdx.y, kv = h / (n_heads / n_kv);
    const ek_attend_args a = {q + ((ek_u64)t * n_heads + h) * hd_k, k + (ek_u64)kv * cap * row_bytes_k,
                              v + (ek_u64)kv * cap * row_bytes_v, slot_pos, *n_slots, q_pos[t], window, type_k,
                              type_v, hd_k, hd_v, row_bytes_k, row_bytes_v, scale,
                              out + ((ek_u64)t * n_heads + h) * hd_v};
    ek_attend_head(ek_warp(), a);
}
