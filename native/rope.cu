// Rotary position embedding, in place, with the cos/sin tables the host makes per step
// (Backend.rope_tables: ggml's rope cache, YaRN included). x: f32[n_tok, n_heads, head_dim],
// rotated on its first n_rot = 2 * half dims; cos, sin: f32[n_tok, half].
// mode 0 (ROPE_NORM): pairs (2i, 2i+1), llama's GGUFs; mode 2 (ROPE_NEOX): pairs (i, i + half).
// One thread per pair: grid = (ceil(half / blockDim.x), n_heads, n_tok).
#include "ek_common.cuh"

#define EK_ROPE_NEOX 2

extern "C" __global__ void ek_rope(float* x, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                   int n_heads, int head_dim, int half, int mode) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, h = blockIdx.y, t = blockIdx.z;
    if (i >= half) return;
    float* v = x + ((ek_u64)t * n_heads + h) * head_dim;
    const int a = mode == EK_ROPE_NEOX ? i : 2 * i, b = mode == EK_ROPE_NEOX ? i + half : 2 * i + 1;
    const float c = cos_t[(ek_u64)t * half + i], s = sin_t[(ek_u64)t * half + i];
    const float x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
}
