// What native/*.cu use of CUDA, for the host C++ compiler: tests/cuda_cpu.py includes this
// before each source (-include) and links the result with executor.cc, which runs every CUDA
// thread of a block as a fiber. `__CUDACC__` is defined (the device code is compiled) and
// `__CUDA_ARCH__` is not (the few lines of PTX asm take their host spelling, which
// tests/test_cuda_host.py checks against gguf.quants).
//
// Memory semantics kept: `__shared__` is one static per block (blocks run one after another),
// `__syncthreads` and the warp shuffles are points where the fiber yields until its block or
// warp arrives, with a compiler barrier either side so no shared value is cached across them.
#pragma once
#include <cmath>
#include <math.h>
#include <cstring>
#include <type_traits>
#include <utility>

#define __CUDACC__ 1
#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static

struct ek_cpu_dim3 {
    unsigned x, y, z;
};

extern "C" {
extern ek_cpu_dim3 ek_cpu_block_idx, ek_cpu_block_dim, ek_cpu_grid_dim;
extern const ek_cpu_dim3* ek_cpu_thread_idx;  // the running fiber's
void ek_cpu_syncthreads(void);
unsigned ek_cpu_shfl_xor(unsigned mask, unsigned bits, int lane_mask, int width);
}

#define threadIdx (*ek_cpu_thread_idx)
#define blockIdx ek_cpu_block_idx
#define blockDim ek_cpu_block_dim
#define gridDim ek_cpu_grid_dim

#define EK_CPU_COMPILER_BARRIER() __asm__ __volatile__("" ::: "memory")

inline void __syncthreads() {
    EK_CPU_COMPILER_BARRIER();
    ek_cpu_syncthreads();
    EK_CPU_COMPILER_BARRIER();
}

template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only (all native/ uses)");
    unsigned bits;
    std::memcpy(&bits, &v, 4);
    EK_CPU_COMPILER_BARRIER();
    bits = ek_cpu_shfl_xor(mask, bits, lane_mask, width);
    EK_CPU_COMPILER_BARRIER();
    std::memcpy(&v, &bits, 4);
    return v;
}

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline float __uint_as_float(unsigned i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline int __float2int_rn(float x) { return (int)std::nearbyint(x); }  // the default mode: to nearest even
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// kernelParams (void*[], as cuLaunchKernel takes them) -> a call of the kernel
template <class... A, std::size_t... I>
inline void ek_cpu_call(void (*kernel)(A...), void** params, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_reference_t<A>*>(params[I])...);
}
template <class... A>
inline void ek_cpu_invoke(void (*kernel)(A...), void** params) {
    ek_cpu_call(kernel, params, std::index_sequence_for<A...>{});
}
