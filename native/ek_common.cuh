// What every edgekv CUDA source shares: fixed-width types without libc headers (NVRTC has
// none), half and bfloat16 conversion, the int8 dot product of four lanes, warp sums.
// Functions marked EK_HD compile for the device (NVRTC) and for the host (tests/native_host.py
// builds them with the system C++ compiler to check them against gguf.quants on a CPU).
#pragma once

#ifdef __CUDACC__
#define EK_HD __host__ __device__ __forceinline__
#else
#define EK_HD static inline
#endif

typedef unsigned char ek_u8;
typedef signed char ek_i8;
typedef unsigned short ek_u16;
typedef unsigned int ek_u32;
typedef unsigned long long ek_u64;

// a * b and a + b rounded separately (NVRTC contracts a * b + c into an FMA by default; the
// quantizers and dequantizers must round as ggml's C reference does, so they say so here)
#ifdef __CUDA_ARCH__
#define EK_MUL(a, b) __fmul_rn((a), (b))
#define EK_ADD(a, b) __fadd_rn((a), (b))
#else
#define EK_MUL(a, b) ((a) * (b))
#define EK_ADD(a, b) ((a) + (b))
#endif

// IEEE half bits -> float (exact; subnormals, inf and NaN included)
EK_HD float ek_half_to_float(ek_u16 h) {
#ifdef __CUDA_ARCH__
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    ek_u32 sign = (ek_u32)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int e = -1;
        do { man <<= 1; ++e; } while (!(man & 0x400u));
        bits = sign | ((ek_u32)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    union { ek_u32 u; float f; } v;
    v.u = bits;
    return v.f;
#endif
}

// bfloat16 bits -> float (the upper half of an IEEE single)
EK_HD float ek_bf16_to_float(ek_u16 h) {
#ifdef __CUDA_ARCH__
    return __uint_as_float((ek_u32)h << 16);
#else
    union { ek_u32 u; float f; } v;
    v.u = (ek_u32)h << 16;
    return v.f;
#endif
}

// sum of the four signed byte products of a and b, plus c (__dp4a on the device)
EK_HD int ek_dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
    return __dp4a(a, b, c);
#else
    for (int i = 0; i < 4; ++i) c += (int)(ek_i8)(a >> (8 * i)) * (int)(ek_i8)(b >> (8 * i));
    return c;
#endif
}

#ifdef __CUDACC__
#define EK_WARP 32
// each element index i < n of an element-wise kernel, a thread at a time over the grid
#define EK_GRID_STRIDE(i, n) for (ek_u64 i = (ek_u64)blockIdx.x * blockDim.x + threadIdx.x; i < (ek_u64)(n); \
                                  i += (ek_u64)gridDim.x * blockDim.x)
#define EK_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float ek_warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float ek_warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// the sum of v over a block of up to 1024 threads (a whole number of warps); every thread gets it
__device__ __forceinline__ float ek_block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x % EK_WARP, warp = threadIdx.x / EK_WARP, n_warps = blockDim.x / EK_WARP;
    v = ek_warp_sum(v);
    __syncthreads();  // partial may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < n_warps ? partial[lane] : 0.0f;
    return ek_warp_sum(v);
}
#endif
