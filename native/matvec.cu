// Matrix-vector and small matrix products with the weights in their GGUF types.
//
// Quantized weights (every type of ek_blocks.cuh) multiply activations quantized to Q8_1
// (quantize.cu): one warp per output row, its lanes taking the row's 32-value sub-blocks in
// turn (__dp4a on the integers, four float operations per sub-block), then a warp sum.
// blockDim = (32, EK_ROWS_PER_BLOCK): grid.x covers the rows, grid.y the tokens: one each
// for ek_matvec_* (a decode step), EK_MATMUL_TOKENS each for ek_matmul_* (prefill chunks and
// batched sessions: a warp unpacks each weight sub-block once for all of its tokens, whose
// sums it keeps in registers; each token's sum is the matvec's, in the same order). Float
// weights (F32, F16, BF16) multiply float activations the same way.
#include "ek_blocks.cuh"

#define EK_ROWS_PER_BLOCK 4
#define EK_MATMUL_TOKENS 8

// the dot products of a quantized row with a token's Q8_1 blocks: this lane's sub-blocks
template <int TYPE>
struct ek_quant_dot {
    typedef ek_block_q8_1 input;
    __device__ static ek_u64 input_stride(int n_cols) { return n_cols / 32; }
    __device__ static float lane_part(const ek_u8* w_row, const ek_block_q8_1* x_row, int n_cols) {
        float sum = 0.0f;
        for (int s = threadIdx.x; s < n_cols / 32; s += EK_WARP) {
            ek_sub32 u;
            ek_unpack(TYPE, w_row, s, &u);
            sum += ek_sub32_dot_q8_1(&u, x_row + s);
        }
        return sum;
    }
    // lane_part for n (<= EK_MATMUL_TOKENS) consecutive tokens' rows at x, into sums[0:n]
    __device__ static void lane_parts(const ek_u8* w_row, const ek_block_q8_1* x, int n_cols, int n, float* sums) {
        const int n_blocks = n_cols / 32;
        for (int s = threadIdx.x; s < n_blocks; s += EK_WARP) {
            ek_sub32 u;
            ek_unpack(TYPE, w_row, s, &u);
#pragma unroll
            for (int t = 0; t < EK_MATMUL_TOKENS; ++t)
                if (t < n) sums[t] += ek_sub32_dot_q8_1(&u, x + (ek_u64)t * n_blocks + s);
        }
    }
};

// weight element i of a float row
template <int TYPE>
__device__ __forceinline__ float ek_float_weight(const ek_u8* row, int i) {
    if (TYPE == EK_F32) return ((const float*)row)[i];
    const ek_u16 h = ((const ek_u16*)row)[i];
    return TYPE == EK_F16 ? ek_half_to_float(h) : ek_bf16_to_float(h);
}

// the dot products of a float row (F32, F16, BF16) with a token's float activations
template <int TYPE>
struct ek_float_dot {
    typedef float input;
    __device__ static ek_u64 input_stride(int n_cols) { return n_cols; }
    __device__ static float lane_part(const ek_u8* w_row, const float* x_row, int n_cols) {
        float sum = 0.0f;
        for (int i = threadIdx.x; i < n_cols; i += EK_WARP) sum += ek_float_weight<TYPE>(w_row, i) * x_row[i];
        return sum;
    }
    __device__ static void lane_parts(const ek_u8* w_row, const float* x, int n_cols, int n, float* sums) {
        for (int i = threadIdx.x; i < n_cols; i += EK_WARP) {
            const float w = ek_float_weight<TYPE>(w_row, i);
#pragma unroll
            for (int t = 0; t < EK_MATMUL_TOKENS; ++t)
                if (t < n) sums[t] += w * x[(ek_u64)t * n_cols + i];
        }
    }
};

// out[tok, row] = W[row] . x[tok]: one warp per row (threadIdx.y picks it), grid.y the token
template <class DOT>
__device__ __forceinline__ void ek_matvec(const ek_u8* __restrict__ w, const typename DOT::input* __restrict__ x,
                                         float* __restrict__ out, int n_rows, int n_cols, int row_bytes) {
    const int row = blockIdx.x * EK_ROWS_PER_BLOCK + threadIdx.y, tok = blockIdx.y;
    if (row >= n_rows) return;
    const float sum = ek_warp_sum(DOT::lane_part(w + (ek_u64)row * row_bytes, x + tok * DOT::input_stride(n_cols),
                                                 n_cols));
    if (threadIdx.x == 0) out[(ek_u64)tok * n_rows + row] = sum;
}

// out[tok, row] for tokens [EK_MATMUL_TOKENS * blockIdx.y, +EK_MATMUL_TOKENS) of n_tok
template <class DOT>
__device__ __forceinline__ void ek_matmul(const ek_u8* __restrict__ w, const typename DOT::input* __restrict__ x,
                                         float* __restrict__ out, int n_rows, int n_cols, int row_bytes, int n_tok) {
    const int row = blockIdx.x * EK_ROWS_PER_BLOCK + threadIdx.y, tok0 = blockIdx.y * EK_MATMUL_TOKENS;
    if (row >= n_rows) return;
    const int n = min(EK_MATMUL_TOKENS, n_tok - tok0);
    float sums[EK_MATMUL_TOKENS];
#pragma unroll
    for (int t = 0; t < EK_MATMUL_TOKENS; ++t) sums[t] = 0.0f;
    DOT::lane_parts(w + (ek_u64)row * row_bytes, x + (ek_u64)tok0 * DOT::input_stride(n_cols), n_cols, n, sums);
#pragma unroll
    for (int t = 0; t < EK_MATMUL_TOKENS; ++t) {
        if (t < n) {  // the same for the whole warp
            const float sum = ek_warp_sum(sums[t]);
            if (threadIdx.x == 0) out[(ek_u64)(tok0 + t) * n_rows + row] = sum;
        }
    }
}

#define EK_MATVEC(type, DOT)                                                                             \
    extern "C" __global__ void ek_matvec_##type(const ek_u8* w, const DOT::input* x, float* out, int n_rows,  \
                                                int n_cols, int row_bytes) {                            \
        ek_matvec<DOT>(w, x, out, n_rows, n_cols, row_bytes);                                            \
    }                                                                                                    \
    extern "C" __global__ void ek_matmul_##type(const ek_u8* w, const DOT::input* x, float* out, int n_rows,  \
                                                int n_cols, int row_bytes, int n_tok) {                 \
        ek_matmul<DOT>(w, x, out, n_rows, n_cols, row_bytes, n_tok);                                     \
    }

EK_MATVEC(q4_0, ek_quant_dot<EK_Q4_0>)
EK_MATVEC(q4_1, ek_quant_dot<EK_Q4_1>)
EK_MATVEC(q5_0, ek_quant_dot<EK_Q5_0>)
EK_MATVEC(q5_1, ek_quant_dot<EK_Q5_1>)
EK_MATVEC(q8_0, ek_quant_dot<EK_Q8_0>)
EK_MATVEC(q4_K, ek_quant_dot<EK_Q4_K>)
EK_MATVEC(q5_K, ek_quant_dot<EK_Q5_K>)
EK_MATVEC(q6_K, ek_quant_dot<EK_Q6_K>)
EK_MATVEC(q2_K, ek_quant_dot<EK_Q2_K>)
EK_MATVEC(q3_K, ek_quant_dot<EK_Q3_K>)
EK_MATVEC(iq4_nl, ek_quant_dot<EK_IQ4_NL>)
EK_MATVEC(iq4_xs, ek_quant_dot<EK_IQ4_XS>)
EK_MATVEC(f32, ek_float_dot<EK_F32>)
EK_MATVEC(f16, ek_float_dot<EK_F16>)
EK_MATVEC(bf16, ek_float_dot<EK_BF16>)

// embedding lookup: out[t] = row ids[t] of w, dequantized; one block of 32 threads per
// (token, sub-block) for the quantized types, per (token, 32 columns) for the float ones
extern "C" __global__ void ek_get_rows(const ek_u8* w, int type, int row_bytes, const int* ids, float* out,
                                       int n_cols) {
    const int tok = blockIdx.y, s = blockIdx.x, i = threadIdx.x, col = 32 * s + i;
    if (col >= n_cols) return;
    const ek_u8* row = w + (ek_u64)ids[tok] * row_bytes;
    float v;
    ek_sub32 u;
    if (ek_unpack(type, row, s, &u)) {
        v = ek_sub32_value(&u, i);
    } else if (type == EK_F32) {
        v = ((const float*)row)[col];
    } else {
        const ek_u16 h = ((const ek_u16*)row)[col];
        v = type == EK_F16 ? ek_half_to_float(h) : ek_bf16_to_float(h);
    }
    out[(ek_u64)tok * n_cols + col] = v;
}
