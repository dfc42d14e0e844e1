// The `keep` overflow policy's attention tallies (ek_attention.cuh: ek_attend_slots' {m, l},
// ek_tally_slot), after a layer's attention, with the same ring arguments as ek_attention.
// ek_attention_stats: grid = (n_heads, n_tok), blockDim.x = 32; stats f32[n_tok, n_heads, 2].
// ek_attention_tally: grid = (ceil(cap / 4), n_kv), blockDim.x = 128, a warp per slot;
// mass f32[n_kv, cap] (the layer's AttentionTallies row, mapped host memory) += each slot's
// weight. One warp owns a slot, so no atomics: the host's memory is written plainly.
#include "ek_attention.cuh"

extern "C" __global__ void ek_attention_stats(const float* __restrict__ q, const int* __restrict__ q_pos,
                                              const ek_u8* __restrict__ k, const ek_u8* __restrict__ v,
                                              const int* __restrict__ slot_pos, const int* __restrict__ n_slots,
                                              int window, float scale, int type_k, int type_v, int n_heads, int n_kv,
                                              int hd_k, int hd_v, int cap, int row_bytes_k, int row_bytes_v,
                                              const float* __restrict__ sink, int n_sinks,
                                              float* __restrict__ stats) {
    const int h = blockIdx.x, t = blockIdx.y, kv = h / (n_heads / n_kv);
    const ek_attend_args a = {q + ((ek_u64)t * n_heads + h) * hd_k, k + (ek_u64)kv * cap * row_bytes_k,
                              v, slot_pos, *n_slots, q_pos[t], window, type_k, type_v, hd_k, 0, row_bytes_k,
                              row_bytes_v, scale, stats + ((ek_u64)t * n_heads + h) * 2,
                              sink + (ek_u64)kv * n_sinks * hd_k, n_sinks};
    ek_attend_slots(ek_warp(), a, 0, *n_slots, true);  // hd_v = 0: the record is {m, l}
}

extern "C" __global__ void ek_attention_tally(const float* __restrict__ q, const int* __restrict__ q_pos,
                                              const ek_u8* __restrict__ k, const ek_u8* __restrict__ v,
                                              const int* __restrict__ slot_pos, const int* __restrict__ n_slots,
                                              int window, float scale, int type_k, int type_v, int n_heads, int n_kv,
                                              int hd_k, int hd_v, int cap, int row_bytes_k, int row_bytes_v,
                                              const float* __restrict__ sink, int n_sinks,
                                              const float* __restrict__ stats, float* __restrict__ mass, int n_tok) {
    const int s = blockIdx.x * (blockDim.x / EK_WARP) + threadIdx.x / EK_WARP, kv = blockIdx.y;
    if (s >= *n_slots) return;  // the whole warp: its slot is past the ones written
    const ek_tally_args t = {q, q_pos, k + (ek_u64)kv * cap * row_bytes_k, slot_pos, stats, n_tok, n_heads,
                             n_heads / n_kv, kv, window, type_k, hd_k, row_bytes_k, scale,
                             sink + (ek_u64)kv * n_sinks * hd_k, n_sinks};
    const float w = ek_tally_slot(ek_warp(), t, s);
    if (threadIdx.x % EK_WARP == 0) mass[(ek_u64)kv * cap + s] += w;
}
