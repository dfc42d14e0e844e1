/* A stand-in for libcuda.so.1 on machines without a GPU (tests/test_cuda.py): cuInit returns
   $FAKE_CUDA_INIT (default 0, success), and then one device, "Fake Orin", reports Jetson Orin's
   attributes (compute capability $FAKE_CUDA_CC where set, e.g. 53 for a Jetson Nano; host
   registration as $FAKE_CUDA_REGISTER says). The
   calls edgekv's probe makes answer; every other call the driver API has for edgekv fails with CUDA_ERROR_NOT_SUPPORTED (a device that cannot run kernels), and built
   with -DFAKE_OLD_DRIVER they are missing (a driver older than edgekv needs). */
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;

CUresult cuInit(unsigned int flags) {
    const char *v = getenv("FAKE_CUDA_INIT");
    (void)flags;
    return v ? atoi(v) : 0;
}
CUresult cuDriverGetVersion(int *version) {  /* FAKE_CUDA_DRIVER: e.g. 13000; default CUDA 12.6 */
    *version = getenv("FAKE_CUDA_DRIVER") ? atoi(getenv("FAKE_CUDA_DRIVER")) : 12060;
    return 0;
}
CUresult cuGetErrorName(CUresult error, const char **name) {
    *name = error == 100 ? "CUDA_ERROR_NO_DEVICE" : error == 999 ? "CUDA_ERROR_UNKNOWN" :
            error == 801 ? "CUDA_ERROR_NOT_SUPPORTED" :
            error == 201 ? "CUDA_ERROR_INVALID_CONTEXT" : "CUDA_ERROR_FAKE";
    return 0;
}
CUresult cuGetErrorString(CUresult error, const char **text) { (void)error; *text = "a fake error"; return 0; }
CUresult cuDeviceGetCount(int *count) { *count = 1; return 0; }
CUresult cuDeviceGet(CUdevice *device, int ordinal) { *device = ordinal; return ordinal == 0 ? 0 : 101; }
CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    (void)dev;
    strncpy(name, "Fake Orin", (size_t)len);
    return 0;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) { (void)dev; *bytes = (size_t)8 << 30; return 0; }
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) {
    (void)dev;
    switch (attribute) {
        case 16: *value = 8; return 0;   /* multiprocessors */
        case 18: *value = 1; return 0;   /* integrated */
        case 19: *value = 1; return 0;   /* can map host memory */
        case 75: *value = getenv("FAKE_CUDA_CC") ? atoi(getenv("FAKE_CUDA_CC")) / 10 : 8; return 0;  /* 8.7 */
        case 76: *value = getenv("FAKE_CUDA_CC") ? atoi(getenv("FAKE_CUDA_CC")) % 10 : 7; return 0;
        /* host registration, and of read-only memory: $FAKE_CUDA_REGISTER "11" (default), "10",
           "00", or "old" (a driver that knows neither attribute: CUDA_ERROR_INVALID_VALUE) */
        case 99:
        case 113: {
            const char *r = getenv("FAKE_CUDA_REGISTER") ? getenv("FAKE_CUDA_REGISTER") : "11";
            if (strcmp(r, "old") == 0) return 1;
            *value = r[attribute == 99 ? 0 : 1] == '1';
            return 0;
        }
        default: return 1;
    }
}

#ifndef FAKE_OLD_DRIVER
/* C calls with more arguments than a function takes are harmless: these ignore theirs */
#define NOT_SUPPORTED(name) CUresult name(void) { return 801; }
NOT_SUPPORTED(cuDevicePrimaryCtxRelease_v2)
NOT_SUPPORTED(cuCtxSynchronize)
NOT_SUPPORTED(cuMemGetInfo_v2)
NOT_SUPPORTED(cuModuleLoadData)
NOT_SUPPORTED(cuModuleUnload)
NOT_SUPPORTED(cuModuleGetFunction)
NOT_SUPPORTED(cuMemcpyHtoDAsync_v2)
NOT_SUPPORTED(cuMemcpyDtoHAsync_v2)
NOT_SUPPORTED(cuMemsetD8Async)
NOT_SUPPORTED(cuMemHostRegister_v2)
NOT_SUPPORTED(cuMemHostUnregister)
NOT_SUPPORTED(cuMemHostGetDevicePointer_v2)
NOT_SUPPORTED(cuLaunchKernel)
NOT_SUPPORTED(cuStreamDestroy_v2)
NOT_SUPPORTED(cuStreamBeginCapture_v2)
NOT_SUPPORTED(cuStreamEndCapture)
NOT_SUPPORTED(cuGraphInstantiateWithFlags)
NOT_SUPPORTED(cuGraphLaunch)
NOT_SUPPORTED(cuGraphExecDestroy)
NOT_SUPPORTED(cuGraphDestroy)

/* with $FAKE_CUDA_CONTEXTS set: a primary context that is current per thread, as the real
   driver's, and calls that fail with CUDA_ERROR_INVALID_CONTEXT in a thread without it */
static __thread const void *current;
static int the_context;
static int contexts(void) { return getenv("FAKE_CUDA_CONTEXTS") != 0; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice dev) {
    (void)dev;
    if (!contexts()) return 801;
    *ctx = &the_context;
    return 0;
}
CUresult cuCtxSetCurrent(void *ctx) {
    if (!contexts()) return 801;
    current = ctx;
    return 0;
}
CUresult cuStreamCreate(void **stream, unsigned int flags) {
    (void)flags;
    if (!contexts()) return 801;
    if (!current) return 201;
    *stream = &the_context;
    return 0;
}
CUresult cuStreamSynchronize(void *stream) {
    (void)stream;
    if (!contexts()) return 801;
    return current ? 0 : 201;
}
CUresult cuMemAlloc_v2(unsigned long long *ptr, size_t bytes) {
    if (!contexts()) return 801;
    if (!current) return 201;
    *ptr = (unsigned long long)(size_t)malloc(bytes);
    return 0;
}
CUresult cuMemFree_v2(unsigned long long ptr) {
    if (!contexts()) return 801;
    if (!current) return 201;
    free((void *)(size_t)ptr);
    return 0;
}
#endif
