// Activations to Q8_1 for the integer matvec (matvec.cu): per 32 values, d = max|x| / 127,
// q = round(x / d), s = d * sum(q) (ggml's quantize_row_q8_1). One warp per block of 32:
// blockDim.x = 32 * warps, grid.x covers the blocks of all tokens (n_tok * n_cols / 32).
#include "ek_kv.cuh"

extern "C" __global__ void ek_quantize_q8_1(const float* __restrict__ x, ek_block_q8_1* __restrict__ y, int n_blocks) {
    const int b = blockIdx.x * (blockDim.x / EK_WARP) + threadIdx.x / EK_WARP, lane = threadIdx.x % EK_WARP;
    if (b >= n_blocks) return;
    const float v = x[(ek_u64)b * 32 + lane];
    const float amax = ek_warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const int q = amax == 0.0f ? 0 : __float2int_rn(v / d);
    const float sum = ek_warp_sum((float)q);  // exact: |sum| <= 32 * 127
    y[b].qs[lane] = (ek_i8)q;
    if (lane == 0) {
        y[b].d = ek_float_to_half(d);
        y[b].s = ek_float_to_half(d * sum);
    }
}
