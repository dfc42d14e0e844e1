// RMS norm (llama.cpp's rms_norm: x / sqrt(mean(x^2) + eps) * weight) and the fused step
// between two layers: x += y, then the next layer's normed input. One block per row
// (blockDim.x a multiple of 32, at most 1024); the sum of squares in float.
#include "ek_common.cuh"

__device__ __forceinline__ float ek_rms_scale(const float* row, int dim, float eps) {
    float sq = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) sq += row[i] * row[i];
    return rsqrtf(ek_block_sum(sq) / (float)dim + eps);
}

// out[t] = rms_norm(x[t]) * w; x and out may alias
extern "C" __global__ void ek_rms_norm(const float* x, const float* __restrict__ w, float* out, int dim, float eps) {
    const float* row = x + (ek_u64)blockIdx.x * dim;
    float* dst = out + (ek_u64)blockIdx.x * dim;
    const float scale = ek_rms_scale(row, dim, eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = row[i] * scale * w[i];
}

// x[t] += y[t]; out[t] = rms_norm(x[t]) * w (Backend.add_rms_norm)
extern "C" __global__ void ek_add_rms_norm(float* __restrict__ x, const float* __restrict__ y, const float* __restrict__ w,
                                           float* __restrict__ out, int dim, float eps) {
    float* row = x + (ek_u64)blockIdx.x * dim;
    const float* add = y + (ek_u64)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) row[i] += add[i];
    __syncthreads();
    const float scale = ek_rms_scale(row, dim, eps);
    float* dst = out + (ek_u64)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = row[i] * scale * w[i];
}

// per head of x: f32[n_tok, n_heads, head_dim], the same norm over head_dim (gemma3's Q/K
// norms); one block per (token, head)
extern "C" __global__ void ek_rms_norm_heads(float* x, const float* __restrict__ w, int head_dim, float eps) {
    float* row = x + (ek_u64)blockIdx.x * head_dim;
    const float scale = ek_rms_scale(row, head_dim, eps);
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) row[i] = row[i] * scale * w[i];
}
