/* A stand-in for libcuda.so.1 on machines without a GPU (tests/test_cuda.py): cuInit returns
   $FAKE_CUDA_INIT (default 0, success), and then one device, "Fake Orin", reports Jetson Orin's
   attributes. Only the calls edgekv's probe makes are here. */
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;

CUresult cuInit(unsigned int flags) {
    const char *v = getenv("FAKE_CUDA_INIT");
    (void)flags;
    return v ? atoi(v) : 0;
}
CUresult cuDriverGetVersion(int *version) { *version = 12060; return 0; }
CUresult cuGetErrorName(CUresult error, const char **name) {
    *name = error == 100 ? "CUDA_ERROR_NO_DEVICE" : error == 999 ? "CUDA_ERROR_UNKNOWN" : "CUDA_ERROR_FAKE";
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
        case 75: *value = 8; return 0;   /* compute capability 8.7 */
        case 76: *value = 7; return 0;
        default: return 1;
    }
}
