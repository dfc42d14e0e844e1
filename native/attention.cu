// Attention over a layer's ring (ek_attention.cuh): one warp per (query token, head), or
// with ek_attention_split one warp per (query token, head, range of `chunk` slots), whose
// records ek_attention_merge combines (decode at depth: n_heads warps alone leave the GPU idle).
// q f32[n_tok, n_heads, hd_k], q_pos i32[n_tok], k u8[n_kv, cap, row_bytes_k],
// v u8[n_kv, cap, row_bytes_v], slot_pos i32[cap], out f32[n_tok, n_heads, hd_v]; sink
// f32[n_kv, n_sinks, hd_k]: a calibrated K type's rows of positions < n_sinks (null, 0: none).
// grid = (n_heads, n_tok), blockDim.x = 32. n_slots: device memory holding the count of slots
// ever written (scan [0, *n_slots)): read at run time, so a captured decode step replays as
// the ring fills (the host writes the count into the step's inputs).
#include "ek_attention.cuh"

extern "C" __global__ void ek_attention(const float* __restrict__ q, const int* __restrict__ q_pos,
                                        const ek_u8* __restrict__ k, const ek_u8* __restrict__ v,
                                        const int* __restrict__ slot_pos, const int* __restrict__ n_slots, int window,
                                        float scale, int type_k, int type_v, int n_heads, int n_kv, int hd_k,
                                        int hd_v, int cap, int row_bytes_k, int row_bytes_v,
                                        const float* __restrict__ sink, int n_sinks, float* __restrict__ out) {
    const int h = blockIdx.x, t = blockIdx.y, kv = h / (n_heads / n_kv);
    const ek_attend_args a = {q + ((ek_u64)t * n_heads + h) * hd_k, k + (ek_u64)kv * cap * row_bytes_k,
                              v + (ek_u64)kv * cap * row_bytes_v, slot_pos, *n_slots, q_pos[t], window, type_k,
                              type_v, hd_k, hd_v, row_bytes_k, row_bytes_v, scale,
                              out + ((ek_u64)t * n_heads + h) * hd_v, sink + (ek_u64)kv * n_sinks * hd_k, n_sinks};
    ek_attend_head(ek_warp(), a);
}

// grid = (n_heads, n_tok, n_splits): range blockIdx.z covers slots [z * chunk, (z + 1) * chunk)
// of the *n_slots written; parts f32[n_tok, n_heads, n_splits, 2 + hd_v] ({m, l, acc} each)
extern "C" __global__ void ek_attention_split(const float* __restrict__ q, const int* __restrict__ q_pos,
                                              const ek_u8* __restrict__ k, const ek_u8* __restrict__ v,
                                              const int* __restrict__ slot_pos, const int* __restrict__ n_slots,
                                              int window, float scale, int type_k, int type_v, int n_heads,
                                              int n_kv, int hd_k, int hd_v, int cap, int row_bytes_k,
                                              int row_bytes_v, const float* __restrict__ sink, int n_sinks,
                                              int chunk, float* __restrict__ parts) {
    const int h = blockIdx.x, t = blockIdx.y, z = blockIdx.z, kv = h / (n_heads / n_kv);
    const int s0 = z * chunk, s1 = min(s0 + chunk, *n_slots);
    const ek_attend_args a = {q + ((ek_u64)t * n_heads + h) * hd_k, k + (ek_u64)kv * cap * row_bytes_k,
                              v + (ek_u64)kv * cap * row_bytes_v, slot_pos, *n_slots, q_pos[t], window, type_k,
                              type_v, hd_k, hd_v, row_bytes_k, row_bytes_v, scale,
                              parts + (((ek_u64)t * n_heads + h) * gridDim.z + z) * (2 + hd_v),
                              sink + (ek_u64)kv * n_sinks * hd_k, n_sinks};
    ek_attend_slots(ek_warp(), a, s0, s1, true);  // a range past *n_slots: {no score, 0, zeros}
}

// grid = (n_heads, n_tok), blockDim.x = 32: out[t, h] from its n_splits records
extern "C" __global__ void ek_attention_merge(const float* __restrict__ parts, int n_splits, int n_heads, int hd_v,
                                              float* __restrict__ out) {
    const int h = blockIdx.x, t = blockIdx.y;
    const ek_u64 head = (ek_u64)t * n_heads + h;
    ek_attend_merge(ek_warp(), parts + head * n_splits * (2 + hd_v), n_splits, hd_v, out + head * hd_v);
}
