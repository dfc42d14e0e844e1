"""The executor that runs native/*.cu on the CPU (tests/cuda_cpu.py) and what it is for.

Its CUDA semantics on kernels of its own: a block's barrier, warp shuffles, and what CUDA
leaves undefined (a barrier or a full-warp shuffle in divergent code, a shuffle in a partial
warp) failing the launch with a message. Then that it finds what it exists to find: a kernel
with a broken index fails a test, out of bounds (AddressSanitizer, in a child process it
ends) or in bounds (the reference comparison). Last, a real model: SmolLM2's greedy tokens on
the real kernels equal the CPU backend's.

The kernels' own tests on this executor: test_cuda_device.py (param `cpu`: each kernel
against gguf.quants and float64) and test_cuda_backend.py (param `real`: whole tiny models
against the float64 reference and the CPU backend). All of them carry the marker cuda_cpu:
`make test` runs them with AddressSanitizer preloaded.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cuda_cpu import CpuKernels, KernelFault, sanitized_env

pytestmark = pytest.mark.cuda_cpu
TESTS = Path(__file__).resolve().parent

PROBES = r"""
#include "ek_common.cuh"

// out[i] = the value thread (n - 1 - i) wrote: needs the barrier
extern "C" __global__ void ek_probe_reverse(const float* x, float* out, int n) {
    __shared__ float run[1024];
    const int i = threadIdx.x;
    run[i] = x[i] * 2.0f;
    __syncthreads();
    out[i] = run[n - 1 - i];
}

// out[lane] = the value of lane ^ m for m = 1, 16, then each warp's sum (ek_warp_sum)
extern "C" __global__ void ek_probe_shuffle(const float* x, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = x[i];
    out[3 * i] = __shfl_xor_sync(0xffffffffu, v, 1);
    out[3 * i + 1] = __shfl_xor_sync(0xffffffffu, v, 16);
    out[3 * i + 2] = ek_warp_sum(v);
}

// a barrier only the threads below `half` reach
extern "C" __global__ void ek_probe_divergent_barrier(float* out, int half) {
    if ((int)threadIdx.x >= half) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

// a full-warp sum whose upper lanes returned
extern "C" __global__ void ek_probe_divergent_shuffle(const float* x, float* out, int half) {
    if ((int)threadIdx.x >= half) return;
    out[threadIdx.x] = ek_warp_sum(x[threadIdx.x]);
}
"""


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("probes")
    shutil.copy(TESTS.parent / "native" / "ek_common.cuh", folder)
    (folder / "probes.cu").write_text(PROBES)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGEKV_NATIVE_DIR", str(folder))
        return CpuKernels()


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def test_a_barrier_makes_every_threads_write_visible_to_the_block(probes):
    x = np.arange(256, dtype=np.float32)
    out = np.zeros(256, np.float32)
    probes.launch("ek_probe_reverse", (1,), (256,), "ppi", [_ptr(x), _ptr(out), 256])
    np.testing.assert_array_equal(out, 2 * x[::-1])


def test_shuffles_exchange_within_each_warp_as_cuda_does(probes):
    x = np.random.default_rng(0).standard_normal(128).astype(np.float32)
    out = np.zeros((128, 3), np.float32)
    probes.launch("ek_probe_shuffle", (2,), (64,), "ppi", [_ptr(x), _ptr(out), 128])
    lanes = np.arange(128)
    np.testing.assert_array_equal(out[:, 0], x[lanes ^ 1])
    np.testing.assert_array_equal(out[:, 1], x[lanes ^ 16])
    np.testing.assert_allclose(out[:, 2], np.repeat(x.reshape(4, 32).sum(axis=1), 32), rtol=1e-5)


def test_a_barrier_in_divergent_code_fails_the_launch_saying_so(probes):
    out = np.zeros(64, np.float32)
    with pytest.raises(KernelFault, match=r"ek_probe_divergent_barrier: block \(0,0,0\).*divergent code"):
        probes.launch("ek_probe_divergent_barrier", (1,), (64,), "pi", [_ptr(out), 32])
    probes.launch("ek_probe_divergent_barrier", (1,), (64,), "pi", [_ptr(out), 64])  # usable after the fault
    assert (out == 1).all()


@pytest.mark.parametrize("block, half, what", [(32, 16, "a lane returned while others of its warp wait"),
                                               (16, 16, "fewer than 32 threads")])
def test_a_shuffle_without_its_whole_warp_fails_the_launch(probes, block, half, what):
    x, out = np.ones(32, np.float32), np.zeros(32, np.float32)
    with pytest.raises(KernelFault, match=what):
        probes.launch("ek_probe_divergent_shuffle", (1,), (block,), "ppi", [_ptr(x), _ptr(out), half])


# -- a broken index fails a test -----------------------------------------------------------------

BROKEN = {
    # out of bounds: the last row of every matvec written one float past `out`
    "out of bounds": ("matvec.cu", "if (threadIdx.x == 0) out[(ek_u64)tok * n_rows + row] = sum;",
                      "if (threadIdx.x == 0) out[(ek_u64)tok * n_rows + row + 1] = sum;",
                      "test_quantized_matvec and cpu-1-Q4_0", "heap-buffer-overflow"),
    # in bounds: GQA's query head -> KV head mapping
    "in bounds": ("attention.cu", "kv = h / (n_heads / n_kv);", "kv = h % n_kv;",
                  "test_attention_over_a_wrapped_ring and cpu-q8_0", "assert"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_kernel_with_a_broken_index_fails_its_test(tmp_path, case):
    source, good, bad, selection, symptom = BROKEN[case]
    native = tmp_path / "native"
    shutil.copytree(TESTS.parent / "native", native)
    text = (native / source).read_text()
    assert good in text, f"{source} no longer reads {good!r}: update this test's breakage"
    (native / source).write_text(text.replace(good, bad))
    # -s: AddressSanitizer's report is written to fd 2 as the process ends, past pytest's capture
    args = [sys.executable, "-m", "pytest", "-q", "-s", "-x", "-p", "no:cacheprovider", str(TESTS / "test_cuda_device.py"),
            "-m", "cuda_cpu", "-k", selection]
    sound = subprocess.run(args, env=sanitized_env(), capture_output=True, text=True, cwd=TESTS.parent, timeout=300)
    env = sanitized_env() | {"EDGEKV_NATIVE_DIR": str(native), "EDGEKV_CUDA_CPU_CACHE": str(tmp_path / "built")}
    assert sound.returncode == 0 and "1 passed" in sound.stdout, sound.stdout + sound.stderr
    broken = subprocess.run(args, env=env, capture_output=True, text=True, cwd=TESTS.parent, timeout=300)
    out = broken.stdout + broken.stderr
    assert broken.returncode != 0 and symptom in out, out
    if case == "out of bounds":
        assert f"{source}:" in out  # ASan names the line of the kernel


# -- a real model ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_smollm2_greedy_tokens_on_the_real_kernels_are_the_cpu_backends(smollm2_path):
    """16 greedy tokens of a real prompt (~2 minutes here under AddressSanitizer)."""
    from cuda_cpu import CpuCudaDevice
    from edgekv.backends.cuda import CUDABackend
    from edgekv.loader import load

    prompt = "The three primary colors are"

    def greedy(model):
        s = model.session(n_ctx=64, n_batch=16)
        ids = model.tokenizer.encode(prompt)
        s.eval(ids)
        out = []
        for _ in range(16):
            out.append(int(np.argmax(s.logits)))
            s.eval([out[-1]])
        return out

    cpu = greedy(load(smollm2_path, backend="cpu"))
    gpu = greedy(load(smollm2_path, backend=CUDABackend(CpuCudaDevice(integrated=False))))
    assert gpu == cpu
