// Element-wise steps of a layer: SwiGLU and GeGLU (gate <- act(gate) * up), residual add,
// scale, softcap, and a row softmax. One thread per element (grid-stride loops), n the
// element count of the whole f32 tensor.
#include "ek_common.cuh"

extern "C" __global__ void ek_silu_mul(float* gate, const float* __restrict__ up, ek_u64 n) {
    EK_GRID_STRIDE(i, n) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// GELU, tanh form (ggml_gelu_f32): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
extern "C" __global__ void ek_gelu_mul(float* gate, const float* __restrict__ up, ek_u64 n) {
    EK_GRID_STRIDE(i, n) {
        const float g = gate[i];
        const float inner = 0.7978845608028654f * g * (1.0f + 0.044715f * g * g);
        gate[i] = 0.5f * g * (1.0f + tanhf(inner)) * up[i];
    }
}

extern "C" __global__ void ek_add(float* x, const float* __restrict__ y, ek_u64 n) {
    EK_GRID_STRIDE(i, n) x[i] += y[i];
}

extern "C" __global__ void ek_scale(float* x, float s, ek_u64 n) {
    EK_GRID_STRIDE(i, n) x[i] *= s;
}

// gemma's logit softcap: x <- cap * tanh(x / cap)
extern "C" __global__ void ek_softcap(float* x, float cap, ek_u64 n) {
    EK_GRID_STRIDE(i, n) x[i] = cap * tanhf(x[i] / cap);
}

// rows of x: f32[n_rows, n] <- softmax; one block per row (blockDim.x a multiple of 32)
extern "C" __global__ void ek_softmax_rows(float* x, int n) {
    float* row = x + (ek_u64)blockIdx.x * n;
    __shared__ float shared_max[32];
    float m = EK_NEG_INF;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, row[i]);
    m = ek_warp_max(m);
    if (threadIdx.x % EK_WARP == 0) shared_max[threadIdx.x / EK_WARP] = m;
    __syncthreads();
    m = EK_NEG_INF;
    for (int w = 0; w < (int)blockDim.x / EK_WARP; ++w) m = fmaxf(m, shared_max[w]);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = expf(row[i] - m);
        row[i] = e;
        sum += e;
    }
    const float inv = 1.0f / ek_block_sum(sum);
    for (int i = threadIdx.x; i < n; i += blockDim.x) row[i] *= inv;
}

// a projection's bias on every row: x f32[n / d, d] += b f32[d]
extern "C" __global__ void ek_add_bias(float* x, const float* __restrict__ b, int d, ek_u64 n) {
    EK_GRID_STRIDE(i, n) x[i] += b[i % d];
}
