"""The CUDA backend's memory on the emulated driver (tests/cuda_emulator.py): where weights
and rings live (mapped on an integrated GPU, uploaded or device copies on a discrete one, and
the host arrays brought up to date when the host reads them), what the GPU may address
(only registered, page-owning host memory), device memory going with its owner, a model too
large for the GPU, and the context plan that fits the GPU (`n_ctx="auto"`, `edgekv mem`).
The forward pass's numbers are test_cuda_backend.py's.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from cuda_emulator import EmulatedDevice
from edgekv.backends.cuda import CUDABackend
from edgekv.cuda.arrays import page_aligned
from edgekv.loader import load
from helpers.decode_steps import decode
from helpers.emulated_cuda import WIDE, cuda_model, relative_error, rng


@pytest.mark.parametrize("integrated", [True, False])
def test_weights_are_mapped_on_an_integrated_gpu_and_uploaded_to_a_discrete_one(tiny_model, integrated):
    model = cuda_model(tiny_model("llama", "Q8_0", **WIDE), integrated)
    driver = model.backend.device.driver
    file_pages = [r for r in driver.registered if r[1] - r[0] >= len(model.network.source._map) - 4096]
    weights = model.network.layers[0].wq.buf
    assert weights.mapped == integrated and len(file_pages) == (1 if integrated else 0)
    s = model.session(n_ctx=32)
    s.eval([1, 2, 3])
    starts = {start for start, _ in driver.registered}  # slot positions (and on Jetson K, V): their own pages
    assert all(a.ctypes.data in starts for a in s.cache.pos)
    assert all((a.ctypes.data in starts) == integrated for a in s.cache.k + s.cache.v)  # discrete: device copies


def test_a_discrete_gpus_rings_live_in_device_memory_and_reach_the_host_when_it_reads_them(tiny_model, tmp_path):
    # snapshots, restores, state files and growth all cross between the device copies of the
    # rings and their host arrays; each continuation must be the CPU backend's
    from edgekv.state_file import load_session, save_session

    path = tiny_model("llama", "Q8_0", **WIDE)
    tokens = [int(t) for t in rng.integers(0, 200, 24)]
    options = dict(n_ctx=32, n_batch=4, cache_type_k="q8_0", cache_type_v="f16")
    cpu = load(path, backend="cpu").session(**options)
    model = cuda_model(path, integrated=False)
    gpu = model.session(**options)
    for s in (cpu, gpu):
        s.eval(tokens[:10])
    assert not gpu.cache.k[0].any()  # the host arrays were never read back: the rows are on the device
    state = gpu.snapshot()
    assert state.k[0][:, :10].any() and not state.k[0][:, 10:].any()  # copied back for the snapshot
    for t in tokens[10:14]:  # decode past the snapshot (captured and replayed)
        gpu.eval([t])
    gpu.restore(state)
    save_session(gpu, "fp", tmp_path / "s.edgekv")
    grown = gpu.grown(48)
    fresh = model.session(**options)
    load_session(fresh, "fp", tmp_path / "s.edgekv")
    for t in tokens[10:16]:
        cpu.eval([t])
        for s in (gpu, grown, fresh):
            s.eval([t])
            assert relative_error(s.logits, cpu.logits) < 2e-2
    assert model.backend.graphs.replayed > 0


def test_a_host_side_key_shift_on_a_discrete_gpu_reads_and_writes_back_the_device_rows(tiny_model, monkeypatch):
    path = tiny_model("llama", **WIDE)
    tokens = rng.integers(0, 200, 40)
    options = dict(n_ctx=16, n_batch=1, cache_type_k="q8_0", cache_type_v="f16", context_shift="shift", n_keep=2)
    _, want = decode(cuda_model(path, integrated=False), tokens, **options)  # shifted on the device
    model = cuda_model(path, integrated=False)
    monkeypatch.setattr(model.backend.rings, "shift", lambda *args: False)  # the cache's host path instead
    _, got = decode(model, tokens, **options)
    assert "ek_kv_shift" not in model.backend.device.driver.launches
    assert max(relative_error(g, w) for g, w in zip(got, want)) < 1e-2


@pytest.mark.parametrize("integrated", [True, False])
def test_the_auto_context_on_a_discrete_gpu_fits_half_its_free_memory(tiny_model, integrated, monkeypatch):
    from edgekv import Llama
    from edgekv.kv import plan as context
    from edgekv.kv.plan import budget_from, weight_bytes

    monkeypatch.setattr(context, "available_memory", lambda: 8 << 30)  # the host's, held still
    path = str(tiny_model("llama"))
    backend = CUDABackend(EmulatedDevice(integrated))
    backend.device.driver.capacity = 3 << 20  # a GPU with 3 MiB: less than the host allows
    llm = Llama(path, backend=backend, verbose=False)
    host = budget_from(llm._model.memory_room, weight_bytes(llm._model.gguf))  # read as loading began
    free_now = backend.device.driver.memory_info()[0]  # less the session made since the budget
    if integrated:
        assert llm._ctx.mem_budget == host  # the rings are the host's memory
    else:
        assert free_now // 2 <= llm._ctx.mem_budget <= (3 << 20) // 2 < host  # the GPU's free memory decided


def test_an_unmapped_host_array_never_reaches_a_kernel():
    device = EmulatedDevice()
    with pytest.raises(ValueError, match="must own its pages"):
        device.host_pointer(np.zeros(100, np.float32)[1:])
    a = page_aligned((3, 1000), np.float32, 7)
    assert a.ctypes.data % 4096 == 0 and (a == 7).all()
    base = device.host_pointer(a)
    assert device.host_pointer(a[1:]) == base + 4000  # inside a registered range: no new registration
    assert len(device.driver.registered) == 1
    with pytest.raises(RuntimeError, match="ILLEGAL_ADDRESS"):
        device.launch("ek_scale", (1,), (256,), np.zeros(4, np.float32).ctypes.data, 2.0, 4)


def test_weights_the_driver_will_not_map_are_copied_saying_so(tiny_model, monkeypatch, caplog):
    from edgekv.cuda.driver import CudaError

    device = EmulatedDevice(integrated=True)
    refuse = device.driver.register_host

    def register(address, nbytes, read_only=True):
        if read_only:
            raise CudaError("cuMemHostRegister failed: CUDA_ERROR_NOT_SUPPORTED")
        return refuse(address, nbytes, read_only)

    monkeypatch.setattr(device.driver, "register_host", register)
    path = tiny_model("llama", "Q8_0", **WIDE)
    model = load(path, backend=CUDABackend(device))
    assert not model.network.layers[0].wq.buf.mapped
    assert sum("copying them to the GPU" in r.message for r in caplog.records) == 1
    got = model.session(n_ctx=32).eval([1, 2, 3], all_logits=True)
    want = load(path, backend="cpu").session(n_ctx=32).eval([1, 2, 3], all_logits=True)
    assert relative_error(got, want) < 2e-2


def test_a_sessions_rings_are_unregistered_when_it_goes(tiny_model):
    model = cuda_model(tiny_model("llama"))
    driver = model.backend.device.driver
    s = model.session(n_ctx=32)
    s.eval([1, 2, 3])
    rings = {a.ctypes.data for a in s.cache.k + s.cache.v + s.cache.pos}
    assert rings <= {start for start, _ in driver.registered}
    del s
    gc.collect()
    assert not rings & {start for start, _ in driver.registered}  # a later allocation may take those pages


def test_device_memory_goes_with_the_session_and_the_model_that_own_it(tiny_model):
    backend = CUDABackend(EmulatedDevice(integrated=False))  # discrete: the weights are uploaded
    device, path = backend.device, tiny_model("llama")
    assert device.allocated() == 0
    model = load(path, backend=backend)
    loaded = device.allocated()
    assert loaded > 0  # the uploaded weights

    def a_session_comes_and_goes(model) -> int:
        s = model.session(n_ctx=32)
        s.eval([1, 2, 3])
        s.eval([4])
        held = device.allocated()
        del s
        gc.collect()
        backend.synchronize()
        return held

    held = a_session_comes_and_goes(model)
    after = device.allocated()
    assert after < held  # its activations went with it
    assert a_session_comes_and_goes(model) == held and device.allocated() == after  # and nothing piles up
    del model
    gc.collect()
    backend.synchronize()
    staging = sum(buf.nbytes for buf in backend._staging.values())  # the backend's own, reused by every model
    assert device.allocated() == staging and len(device.driver._memory) == len(backend._staging)


def test_a_model_too_large_for_the_gpu_is_a_clear_error_or_with_auto_runs_on_the_cpu(tiny_model, monkeypatch,
                                                                                        capfd):
    from edgekv import backends
    from edgekv.errors import GpuOutOfMemory

    path = tiny_model("llama")
    backend = CUDABackend(EmulatedDevice(integrated=False))  # discrete: the weights are uploaded
    driver = backend.device.driver
    driver.capacity = 64 << 10  # 64 KiB of GPU memory
    with pytest.raises(GpuOutOfMemory, match=r"GPU \(Emulated GPU\) is out of memory: [\d.]+ MiB of the model's "
                                             r"(weights \(F32 \d+x\d+\)|vectors) asked, 0 MiB of 8.0 GiB free; "
                                             r"use a smaller model.*--backend cpu"):
        load(path, backend=backend)  # asked for by name: the error
    monkeypatch.delenv("EDGEKV_BACKEND", raising=False)
    monkeypatch.setattr(backends, "_auto", lambda: "cuda")  # a machine whose probe found this GPU usable
    monkeypatch.setitem(backends._made, "cuda", backend)
    monkeypatch.setattr(backends, "_auto_said", False)
    monkeypatch.setattr(backends, "_cuda_failed", None)
    capfd.readouterr()
    model = load(path)  # left to auto
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CUDA cannot be used: the GPU (Emulated GPU) is out of memory" in err[0] \
        and err[0].endswith("running on the CPU")
    assert model.backend.name == "cpu" and backends.resolve_backend_name() == "cpu"
    want = load(path, backend="cpu").session(n_ctx=32).eval([1, 2, 3])
    np.testing.assert_array_equal(model.session(n_ctx=32).eval([1, 2, 3]), want)
    gc.collect()
    backend.synchronize()
    assert driver.allocated() == sum(b.nbytes for b in backend._staging.values())  # the weights that fit went


@pytest.mark.parametrize("integrated", [True, False])
def test_edgekv_mem_plans_the_context_loading_on_the_gpu_gets_and_says_what_the_gpu_holds(
        tiny_model, integrated, monkeypatch, capsys):
    from edgekv import Llama, backends
    from edgekv.kv import plan as context
    from edgekv.cli import main
    from edgekv.kv.plan import weight_bytes
    from edgekv.gguf.reader import GGUFFile

    monkeypatch.setattr(context, "available_memory", lambda: 8 << 30)  # the host's, held still
    monkeypatch.setattr("edgekv.kv.memory.free_memory", lambda: None)  # mem's own reading: no host budget
    monkeypatch.setattr(backends, "_why_not_cuda", lambda: None)  # a machine whose GPU the probe accepts

    def gpu(name):
        backend = CUDABackend(EmulatedDevice(integrated))
        backend.device.driver.capacity = 3 << 20  # 3 MiB: the GPU, not the host, bounds the context
        return backend

    monkeypatch.setattr(backends, "_make", gpu)
    monkeypatch.setattr(backends, "_made", {})
    path = str(tiny_model("llama", n_ctx=1 << 16))  # trained long: the memory, not the model, bounds the context
    assert main(["mem", "-m", path, "-p", "8", "-n", "-1", "--backend", "cuda"]) == 0
    out = capsys.readouterr().out
    n_ctx = int(out.split("n_ctx:")[1].split()[0])
    weights = weight_bytes(GGUFFile(path))
    if integrated:
        assert "(integrated: shares the host's memory)" in out and "no copy of its own" in out
        assert "budget from:     no budget" in out  # the rings are the host's: no GPU figure
        return
    free = int(3 << 20) - backends._made["cuda"].device.driver.allocated()
    budget = int(out.split("KV budget:")[1].split("bytes")[0].replace(",", ""))
    assert budget == (free - weights) // 2
    assert "budget from:     half the GPU's free memory once the weights are on it" in out
    assert "reason" not in out and "memory budget" in out.split("n_ctx:")[1].split("\n")[0]
    kv = int(out.split("KV cache total:")[1].split("bytes")[0].replace(",", ""))
    held = int(out.split("gpu holds:")[1].split("bytes")[0].replace(",", ""))
    assert kv <= budget and held > weights + kv and "gpu fit" not in out
    llm = Llama(path, n_ctx="auto", n_batch=512, backend=gpu("cuda"), verbose=False)
    vectors = sum(int(t.data.nbytes) for t in GGUFFile(path).tensors.values() if len(t.shape) == 1)
    assert 0 <= llm._ctx.mem_budget - budget <= vectors // 2  # the norm vectors go up at the first step
    assert llm._ctx._cap == n_ctx  # loading's plan: the one mem printed
    assert main(["mem", "-m", path, "-c", str(2 * n_ctx), "--backend", "cuda"]) == 0  # more than the GPU holds
    assert "gpu fit:         no: " in capsys.readouterr().out


def test_a_jetson_that_cannot_pin_more_memory_says_what_to_try(tiny_model, monkeypatch, capfd):
    """On shared RAM (an integrated GPU) NvMap may refuse to pin more pages (ENOMEM): loading
    is one error naming what was asked, what the GPU and the system have free and what to
    try; left to auto, the model runs on the CPU, and the process goes on."""
    from edgekv import backends
    from edgekv.errors import GpuOutOfMemory

    path = tiny_model("llama")
    backend = CUDABackend(EmulatedDevice(integrated=True))  # the weights are mapped: registered
    backend.device.driver.register_limit = 0
    with pytest.raises(GpuOutOfMemory, match=r"GPU \(Emulated GPU\) is out of memory: [\d.]+ MiB of the model's "
                                             r"weights \(F32 \d+x\d+\) to pin and map for it \(the driver's host "
                                             r"registration ran out of memory\), \d+ MiB of 8.0 GiB free; available "
                                             r"to processes: .*-ctk q8_0 -ctv q8_0, or iq4_cal.*--slots.*--backend cpu"):
        load(path, backend=backend)
    monkeypatch.delenv("EDGEKV_BACKEND", raising=False)
    monkeypatch.setattr(backends, "_auto", lambda: "cuda")
    monkeypatch.setitem(backends._made, "cuda", backend)
    monkeypatch.setattr(backends, "_auto_said", False)
    monkeypatch.setattr(backends, "_cuda_failed", None)
    capfd.readouterr()
    model = load(path)
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "to pin and map for it" in err[0] and err[0].endswith("running on the CPU")
    session = model.session(n_ctx=32)
    session.eval([1, 2, 3])
    want = load(path, backend="cpu").session(n_ctx=32)
    want.eval([1, 2, 3])
    assert model.backend.name == "cpu"
    np.testing.assert_array_equal(session.logits, want.logits)
    gc.collect()
