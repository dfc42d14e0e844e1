// The Walsh-Hadamard rotation a quantized cache stores K and V rows by (edgekv/kernels/rows.py):
// every run of r values of x (f32, r a power of two <= 256) <- run @ h, h f32[r, r]. Queries
// and keys are rotated on their way in, the attention output on its way out (h @ h = I).
// One block of r threads per run: grid.x = the number of runs.
#include "ek_common.cuh"

#define EK_MAX_ROTATION 256

extern "C" __global__ void ek_rotate(float* x, const float* __restrict__ h, int r) {
    __shared__ float run[EK_MAX_ROTATION];
    float* v = x + (ek_u64)blockIdx.x * r;
    const int j = threadIdx.x;
    run[j] = v[j];
    __syncthreads();
    float sum = 0.0f;
    for (int i = 0; i < r; ++i) sum += run[i] * h[(ek_u64)i * r + j];
    v[j] = sum;
}
