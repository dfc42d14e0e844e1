"""The CUDA backend's host side without a GPU: whole forward passes through CUDABackend on
the emulated driver (tests/cuda_emulator.py: each native/ kernel's arithmetic in NumPy,
every launch's arguments, grid and pointers checked as a GPU would), against the float64
NumPy reference (tests/numpy_reference.py) and the CPU backend: both architectures and
their relatives, every weight type, every cache type, rings that wrap under shift and
stream, the keep policy's tallies and evictions, the calibrated K type, CUDA-graph decode,
one copy out per decode step. Each test runs twice: on the kernels'
NumPy twins, and on native/'s own code built for the CPU and run under the sanitizers
(conftest.py's emulated_kernels: tests/cuda_cpu.py; markers cuda_cpu and long). Where memory lives is
tests/test_cuda_memory.py's; each kernel alone is tests/test_cuda_device.py's.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from edgekv.backends import cuda_launch as shape
from edgekv.backends.cuda import CUDABackend, DeviceScratch
from edgekv.cuda.arrays import DeviceArray
from edgekv.errors import EdgeKVError
from edgekv.loader import load
from helpers.decode_steps import decode, solo_logits
from helpers.emulated_cuda import WIDE, cuda_model, emulated_device, relative_error, rng
from numpy_reference import ReferenceModel, ReferenceSession


pytestmark = pytest.mark.usefixtures("emulated_kernels")  # each test on the twins, and on the real kernels


BLOCK_NOISE = {"q8_0": 1e-2, "q4_0": 8e-2, "q4_1": 6e-2, "q5_0": 5e-2, "q5_1": 5e-2, "iq4_nl": 8e-2}  # gemma3, below


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen2", "qwen3", "phi3"])
def test_decode_and_prefill_match_the_float64_reference(tiny_model, arch):
    path = tiny_model(arch)
    s = cuda_model(path).session(n_ctx=64, n_batch=8, cache_type_k="f32", cache_type_v="f32")
    ref = ReferenceSession(ReferenceModel(path))
    prompt = rng.integers(0, s.n_vocab, 11)
    got = s.eval(list(prompt), all_logits=True)  # chunks of 8 and 3
    want = np.stack([ref.step(int(t)) for t in prompt])
    errs = [relative_error(got, want)]
    for t in rng.integers(0, s.n_vocab, 6):
        s.eval([int(t)])
        errs.append(relative_error(s.logits, ref.step(int(t))))
    # gemma3: the reference rounds GELU's input to f16 as ggml does; the kernel does not
    assert max(errs) < (2e-3 if arch == "gemma3" else 1e-4), errs


@pytest.mark.parametrize("weight_type", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                                         "IQ4_NL", "IQ4_XS", "F16", "BF16"])
def test_every_weight_type_is_as_close_to_the_reference_as_the_cpu_backend(tiny_model, weight_type):
    path = tiny_model("llama", weight_type, **WIDE)
    tokens = [int(t) for t in rng.integers(0, 200, 12)]
    ref = ReferenceSession(ReferenceModel(path))  # float64 over the dequantized weights
    exact = np.stack([ref.step(t) for t in tokens])
    cpu = load(path, backend="cpu").session(n_ctx=32, cache_type_k="f32", cache_type_v="f32")
    gpu = cuda_model(path).session(n_ctx=32, cache_type_k="f32", cache_type_v="f32")
    cpu_err = relative_error(cpu.eval(tokens, all_logits=True), exact)
    gpu_err = relative_error(gpu.eval(tokens, all_logits=True), exact)
    # the quantized types multiply activations rounded to 8 bits per 32 values (Q8_1 here, the
    # CPU's Q8_0/Q8_K): an error of the same size as the CPU's; the float types none
    assert gpu_err < (1e-4 if weight_type in ("F16", "BF16") else max(2 * cpu_err, 1e-3)), (gpu_err, cpu_err)


@pytest.mark.parametrize("cache_type", ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"])
@pytest.mark.parametrize("arch", ["llama", pytest.param("gemma3", marks=pytest.mark.long)])  # gemma3: ~80% of the time
def test_every_cache_type_is_as_close_to_the_reference_as_the_cpu_backend(tiny_model, arch, cache_type):
    path = tiny_model(arch, **WIDE)
    tokens = [int(t) for t in rng.integers(0, 200, 20)]
    ref = ReferenceSession(ReferenceModel(path, cache_type, cache_type))  # K/V rounded through the type
    exact = np.stack([ref.step(t) for t in tokens])

    def errors(model):
        s = model.session(n_ctx=32, n_batch=8, cache_type_k=cache_type, cache_type_v=cache_type)
        out = [s.eval(tokens[:12], all_logits=True)]
        for t in tokens[12:]:
            s.eval([t])
            out.append(s.logits[None].copy())
        got = np.concatenate(out)
        return np.abs(got - exact).max(axis=1) / np.abs(exact).max(axis=1)

    # the ring holds the type's bytes (Hadamard-rotated when quantized), written by ek_kv_write
    # and read in place by ek_attention. llama: the values the reference rounds, so the error
    # is the CPU's size or less. gemma3: the GPU's GELU is tanhf, not ggml's f16 table (CUDA
    # ggml's too), so K/V differ by ~5e-4 and values near a rounding boundary land on the
    # other side: an error of the size of the type's own rounding noise, which a wrong
    # rotation, block layout or slot would exceed a hundredfold
    gpu, cpu = errors(cuda_model(path)), errors(load(path, backend="cpu"))
    if arch == "llama" or cache_type in ("f32", "f16", "bf16"):
        assert gpu.max() < max(3 * cpu.max(), 1e-3), (gpu.max(), cpu.max())
    else:
        assert gpu.max() < BLOCK_NOISE[cache_type] and np.median(gpu) < BLOCK_NOISE[cache_type] / 2, gpu


@pytest.mark.parametrize("policy", ["shift", "stream"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_ring_that_wraps_matches_the_reference(tiny_model, arch, policy):
    path = tiny_model(arch)
    s = cuda_model(path).session(n_ctx=16, n_batch=1, cache_type_k="f32", cache_type_v="f32", context_shift=policy,
                                 n_keep=2)
    ref = ReferenceSession(ReferenceModel(path))
    errs = []
    for t in rng.integers(0, s.n_vocab, 40):
        before = s.n_tokens
        s.eval([int(t)])
        if before + 1 - s.n_tokens:
            ref.evict(s.last_evicted)
        errs.append(relative_error(s.logits, ref.step(int(t))))
    assert s.n_tokens <= 16 and max(errs) < (2e-3 if arch == "gemma3" else 1e-4), max(errs)
    assert ("ek_kv_shift" in s.model.backend.device.driver.launches) == (policy == "shift")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_decode_over_a_long_ring_splits_attention_into_ranges_and_matches_the_reference(tiny_model, arch):
    # n_ctx 1024: the full layers' rings split into 4 ranges of 256 slots; 600 cached
    # tokens fill three of them (gemma3's sliding-window layers keep short rings, unsplit)
    path = tiny_model(arch)
    model = cuda_model(path)
    s = model.session(n_ctx=1024, n_batch=256, cache_type_k="f32", cache_type_v="f32")
    ref = ReferenceSession(ReferenceModel(path))
    tokens = [int(t) for t in rng.integers(0, s.n_vocab, 604)]
    s.eval(tokens[:600])
    for t in tokens[:600]:
        ref.step(t)
    driver = model.backend.device.driver
    prefill = list(driver.launches)
    assert "ek_attention_split" not in prefill  # prefill chunks: a warp per (head, token) is plenty
    assert any(k.startswith("ek_matmul_") for k in prefill)  # their weights read once per 8 tokens
    errs = []
    for t in tokens[600:]:  # eager, captured, replayed, replayed
        s.eval([t])
        errs.append(relative_error(s.logits, ref.step(t)))
    assert not any(k.startswith("ek_matmul_") for k in driver.launches[len(prefill):])  # decode: matvecs
    assert max(errs) < (2e-3 if arch == "gemma3" else 1e-4), errs
    assert driver.launches.count("ek_attention_split") == driver.launches.count("ek_attention_merge") > 0
    assert model.backend.graphs.replayed == 2
    assert shape.attention_splits(1024, 1) == (4, 256) and shape.attention_splits(512, 1) == (1, 512)
    assert shape.attention_splits(1024, 5) == (1, 1024) and shape.attention_splits(32768, 1) == (64, 512)


def test_greedy_text_is_the_cpu_backends(tiny_model):
    from edgekv import Llama

    path = str(tiny_model("gemma3", "Q8_0", **WIDE))
    want = Llama(path, n_ctx=64, backend="cpu", verbose=False)("hello", max_tokens=16, temperature=0)
    got = Llama(path, n_ctx=64, backend=CUDABackend(emulated_device()), verbose=False)("hello", max_tokens=16,
                                                                                       temperature=0)
    assert got["choices"][0]["text"] == want["choices"][0]["text"]


def test_a_decode_step_copies_the_logits_out_once_and_launches_the_same_kernels(tiny_model):
    model = cuda_model(tiny_model("gemma3"))
    driver = model.backend.device.driver
    s = model.session(n_ctx=32, n_batch=4)
    s.eval([1, 2, 3, 4, 5])
    steps = []
    for t in (6, 7, 8):
        copies, start = driver.copies_to_host, len(driver.launches)
        s.eval([t])
        assert driver.copies_to_host == copies + 1
        steps.append(driver.launches[start:])
    assert steps[0] == steps[1] == steps[2] and "ek_attention" in steps[0]


def test_a_state_restored_into_the_cache_is_attended_on_the_device(tiny_model):
    path = tiny_model("llama")
    s = cuda_model(path).session(n_ctx=32)
    s.eval([5, 6, 7, 8])
    state = s.snapshot()
    s.eval([9])
    want = s.logits.copy()
    s.restore(state)  # the cache takes over the state's arrays (copies the GPU can map)
    s.eval([9])
    np.testing.assert_array_equal(s.logits, want)


@pytest.mark.parametrize("arch, integrated", [("llama", True), ("llama", False), ("gemma3", False)])
def test_keep_tallies_and_evicts_as_the_cpu_backend_does(tiny_model, arch, integrated):
    # `keep` (kv/heavy_hitters.py): the tallies in mapped memory, added to by ek_attention_tally
    # after each full-context layer (gemma3's sliding-window layers do not vote), in chunks,
    # in captured and replayed decode steps, and through evictions that move the slots
    path = tiny_model(arch, **WIDE, n_ctx=1024)
    tokens = [int(t) for t in rng.integers(1, 200, 44)]

    def run(model):
        s = model.session(n_ctx=32, n_batch=8, context_shift="keep", n_keep=4, cache_type_k="f32",
                          cache_type_v="f32")
        s.eval(tokens[:20])
        tallies, logits = [s.cache.attention_by_position()[0].copy()], [s.logits.copy()]
        for t in tokens[20:]:
            s.eval([t])
            logits.append(s.logits.copy())
        tallies.append(s.cache.attention_by_position()[0].copy())
        return s, tallies, np.array(logits)

    gpu, gpu_tallies, gpu_logits = run(cuda_model(path, integrated))
    cpu, cpu_tallies, cpu_logits = run(load(path, backend="cpu"))
    assert gpu.n_tokens == cpu.n_tokens <= 32 < len(tokens)  # the context filled and `keep` evicted
    assert gpu.tokens == cpu.tokens  # the same tokens evicted
    tol = 2e-3 if arch == "gemma3" else 1e-4  # gemma3: the GPU's GELU is tanhf, not ggml's f16 table
    for got, want in zip(gpu_tallies, cpu_tallies):
        assert want.max() > 1 and relative_error(got, want) < tol
    assert relative_error(gpu_logits, cpu_logits) < tol


@pytest.mark.parametrize("integrated", [True, False])
def test_a_calibrated_k_cache_follows_the_cpu_backend_and_its_state_file(tiny_model, tmp_path, integrated):
    # iq4_cal: keys and queries through the model's key map (measured on the CPU, the same
    # map for both backends), K rows in iq4_nl, and position 0's stored K in an f32 sink row
    path = tiny_model("llama", **WIDE)
    tokens = [int(t) for t in rng.integers(1, 200, 16)]
    options = dict(n_ctx=32, n_batch=8, cache_type_k="iq4_cal", cache_type_v="q8_0")
    gpu_model = cuda_model(path, integrated)

    def run(model):
        s = model.session(**options)
        out = [s.eval(tokens[:10], all_logits=True)]
        for t in tokens[10:]:
            s.eval([t])
            out.append(s.logits[None].copy())
        return s, np.concatenate(out)

    def grow(s, model):  # n_ctx="auto" growth: a larger context's own key map, the rows re-coded on the host
        from edgekv.kv.calibration import key_map_for

        bigger = s.grown(64, key_map=key_map_for(model, "iq4_cal", 64))
        bigger.eval([7])
        return bigger.logits.copy()

    gpu, got = run(gpu_model)
    cpu_model = load(path, backend="cpu")
    cpu, want = run(cpu_model)
    grown_gpu, grown_cpu = grow(gpu, gpu_model), grow(cpu, cpu_model)
    assert relative_error(grown_gpu, grown_cpu) < BLOCK_NOISE["iq4_nl"]
    assert np.abs(gpu.cache.sink_k).max() > 0
    np.testing.assert_allclose(gpu.cache.sink_k, cpu.cache.sink_k, rtol=1e-5, atol=1e-6)
    errors = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
    assert errors.max() < BLOCK_NOISE["iq4_nl"] and np.median(errors) < BLOCK_NOISE["iq4_nl"] / 2, errors
    from edgekv.state_file import load_session, save_session

    save_session(gpu, "fp", tmp_path / "s.edgekv")  # the rows, the key map and the sink rows, into a new session
    again = gpu_model.session(**options)
    load_session(again, "fp", tmp_path / "s.edgekv")
    gpu.eval([5])
    again.eval([5])
    np.testing.assert_array_equal(again.logits, gpu.logits)


def test_device_arrays_slice_and_reshape_as_the_graphs_use_them():
    a = DeviceArray(4096, (8, 12))
    assert a[2:5].ptr == 4096 + 2 * 12 * 4 and a[2:5].shape == (3, 12)
    assert a[:3].reshape(3, 4, 3).shape == (3, 4, 3) and a.reshape(-1, 6).shape == (16, 6)
    with pytest.raises(TypeError):
        a[np.array([1, 2])]
    with pytest.raises(ValueError):
        a.reshape(5, 5)


def test_launch_shapes_cover_the_work():
    assert shape.matvec(577, 3) == shape.Launch((145, 3), (32, 4))
    assert shape.attention(9, 2) == shape.Launch((9, 2), (32,))
    assert shape.rows(5, 576).block == (256,) and shape.rows(5, 40).block == (64,)
    assert shape.elementwise(10**9).grid == (shape.ELEMENTWISE_MAX_BLOCKS,)
    assert shape.rotate(4 * 256, 256) == shape.Launch((4,), (256,))
    with pytest.raises(ValueError):
        shape.rotate(1024, 512)


def test_device_scratch_has_the_cpu_scratchs_buffers(tiny_model):
    from edgekv.backends.contract import Scratch

    hp = load(tiny_model("gemma3")).hp
    cpu, dev = Scratch(hp, 4, 1), DeviceScratch(hp, 4, emulated_device())
    for name in ("x", "h", "o", "q", "k", "v", "att", "gate", "up"):
        assert getattr(dev, name).shape == getattr(cpu, name).shape
    assert dev.cos["local"].shape == cpu.cos["local"].shape


@pytest.mark.long
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_replayed_decode_step_equals_the_plain_one(tiny_model, arch, monkeypatch):
    path = tiny_model(arch, **WIDE)
    tokens = rng.integers(0, 200, 40)
    options = dict(n_ctx=16, n_batch=1, cache_type_k="q8_0", cache_type_v="f16", context_shift="shift", n_keep=2)
    model = cuda_model(path)
    graphs, driver = model.backend.graphs, model.backend.device.driver
    collecting = []  # no collection (finalizers freeing or unregistering memory) runs while a step is captured
    monkeypatch.setattr(driver, "begin_capture", lambda stream, begin=driver.begin_capture:
                        (collecting.append(gc.isenabled()), begin(stream))[1])
    s, replayed = decode(model, tokens, **options)  # the ring wraps and shifts twice under the graph
    assert collecting == [False] and gc.isenabled()
    assert graphs.captured == 1 and graphs.replayed == len(tokens) - 2  # the first eager, the second captured
    assert driver.graph_launches == len(tokens) - 1
    assert "ek_kv_shift" in driver.launches  # the shifts re-rotated the q8_0 keys in the ring, on the device
    monkeypatch.setenv("EDGEKV_CUDA_GRAPHS", "0")
    plain_model = cuda_model(path)
    _, plain = decode(plain_model, tokens, **options)
    assert plain_model.backend.graphs.captured == 0
    np.testing.assert_array_equal(replayed, plain)


def test_a_graph_goes_with_its_cache_and_when_a_buffer_it_uses_grows(tiny_model):
    path = tiny_model("llama", "Q8_0", **WIDE)  # activations quantized in a staging buffer
    model = cuda_model(path)
    graphs = model.backend.graphs
    s, _ = decode(model, [1, 2, 3], n_ctx=64)
    assert len(graphs.graphs) == 1
    other = model.session(n_ctx=64)
    other.eval(list(range(1, 40)))  # a longer chunk than any before: the staging buffers grow
    assert len(graphs.graphs) == 0
    for t in (4, 5, 6):  # captured again, on the new buffers
        s.eval([t])
    assert len(graphs.graphs) == 1 and graphs.captured == 2
    ref = load(path, backend="cpu").session(n_ctx=64)
    ref.eval([1, 2, 3, 4, 5, 6])
    assert relative_error(s.logits, ref.logits) < 2e-2
    del s
    gc.collect()
    assert len(graphs.graphs) == 0  # the cache it pointed into is gone


def test_sessions_decoding_together_match_their_solo_steps(tiny_model):
    from edgekv.kv.batch import DecodeStep, decode_together

    model = cuda_model(tiny_model("gemma3", "Q8_0", **WIDE))  # windowed layers: rings that wrap
    net = model.network
    sessions = []
    for n in (3, 11, 30):
        s = model.session(n_ctx=64, n_batch=8, cache_type_k="q8_0", cache_type_v="f16")
        s.eval([int(t) for t in rng.integers(0, 200, n)])
        sessions.append(s)
    tokens = [7, 8, 9]
    solo = solo_logits(sessions, tokens)
    rows = [np.zeros((1, net.hp.n_vocab), np.float32) for _ in sessions]
    steps = [DecodeStep(t, s.cache, s.cache.reserve(1), row) for s, t, row in zip(sessions, tokens, rows)]
    decode_together(net, steps, net.backend.scratch(net.hp, 3), np.zeros((3, net.hp.n_vocab), np.float32))
    # on a GPU each (row, token) of a matvec is its own warp: bit for bit; NumPy's float64 products here
    for got, want in zip(rows, solo):
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)


def test_a_step_with_host_work_on_its_logits_is_not_captured(tiny_model):
    # gemma's final softcap runs on the host's logits after the copy out: a replay would skip it
    path = tiny_model("gemma3", metadata={"gemma3.final_logit_softcapping": 3.0})
    model = cuda_model(path)
    assert model.hp.final_softcap == 3.0
    _, got = decode(model, [1, 2, 3, 4, 5], n_ctx=32)
    assert model.backend.graphs.captured == 0 and len(model.backend.graphs.refused) == 1
    _, want = decode(load(path, backend="cpu"), [1, 2, 3, 4, 5], n_ctx=32)
    assert relative_error(got, want) < 2e-3 and np.abs(got).max() <= 3.0


def test_warmup_on_a_gpu_builds_the_cuda_backend_and_the_cpu_kernels_its_host_work_runs(monkeypatch, tmp_path,
                                                                                         capsys):
    from edgekv import backends
    from edgekv.cli import main
    from edgekv.kernels import jit_cache

    made = []
    monkeypatch.setattr(backends, "_why_not_cuda", lambda: None)  # a machine whose GPU the probe accepts
    monkeypatch.setattr(backends, "_make", lambda name: made.append(name) or CUDABackend(emulated_device()))
    monkeypatch.setattr(backends, "_made", {})  # made afresh here, and forgotten after
    monkeypatch.setenv("EDGEKV_KERNEL_CACHE", str(tmp_path))
    jit_cache.mark_warm("cpu")
    assert main(["warmup", "--backend", "cuda"]) == 0
    err = capsys.readouterr().err
    assert made == ["cuda"] and "compiling the cuda backend's kernels for this GPU" in err
    assert "kernels already compiled" in err  # the cpu kernels were warm


def test_a_cache_type_the_kernels_lack_is_an_error_not_an_empty_ring(tiny_model, monkeypatch):
    from edgekv.backends import cuda_attention

    monkeypatch.setattr(cuda_attention, "CACHE_TYPES", cuda_attention.CACHE_TYPES - {20})  # as if IQ4_NL were new
    s = cuda_model(tiny_model("llama", **WIDE)).session(n_ctx=32, n_batch=8, cache_type_k="iq4_nl")
    with pytest.raises(EdgeKVError, match="cache type iq4_nl is not on the CUDA backend"):
        s.eval([1, 2, 3])


def test_a_benchmark_on_the_gpu_says_cuda_where_llama_bench_does(tiny_model):
    from edgekv.lab.bench import BenchTest, run_test

    test = BenchTest(n_prompt=0, n_gen=4, n_depth=0, n_batch=8, n_threads=1, type_k="f16", type_v="f16")
    gpu = run_test(cuda_model(tiny_model("llama")), test, 1).record()
    cpu = run_test(load(tiny_model("llama"), backend="cpu"), test, 1).record()
    assert (gpu["backends"], cpu["backends"]) == ("CUDA", "numba") and gpu["n_gen"] == 4


def test_n_gpu_layers_below_the_layer_count_offloads_the_whole_model_saying_so(tiny_model, monkeypatch, capfd):
    from edgekv import Llama, backends

    monkeypatch.setattr(backends, "_auto", lambda: "cuda")  # a machine whose GPU auto takes
    monkeypatch.setattr(backends, "_make", lambda name: CUDABackend(emulated_device()))
    monkeypatch.setattr(backends, "_made", {})
    path = str(tiny_model("llama", n_layers=4))
    llm = Llama(path, n_ctx=32, n_gpu_layers=2, verbose=False)
    err = capfd.readouterr().err.strip().splitlines()
    assert llm._model.backend.name == "cuda"
    assert err == ["edgekv: n_gpu_layers=2: edgekv offloads whole models, so all 4 layers run on the GPU "
                   "(n_gpu_layers=0 keeps them all on the CPU)"]
    for n in (-1, 4, 99):  # all of them: nothing to say
        Llama(path, n_ctx=32, n_gpu_layers=n, verbose=False)
    assert capfd.readouterr().err == ""


def test_speculative_decoding_on_the_gpu_gives_the_plain_greedy_text(tiny_model):
    # a verify pass is a chunk of the CUDA backend's prefill path (its rows are not bit for bit
    # its decode steps, as the CPU's are: greedy equality holds unless a near-tie flips); the
    # `keep` policy's per-query tallies exist on the CPU backends only: refused at load, saying so
    from edgekv import Llama
    from edgekv.speculative import PromptLookup, Speculation

    path = str(tiny_model("gemma3", "Q8_0", **WIDE))
    prompt = "hello world hello world hello world hello"
    want = Llama(path, n_ctx=64, backend="cpu", verbose=False)(prompt, max_tokens=16, temperature=0)
    llm = Llama(path, n_ctx=64, backend=CUDABackend(emulated_device()), verbose=False,
                draft_model=Speculation(PromptLookup(), adaptive=False))
    got = llm(prompt, max_tokens=16, temperature=0)
    assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert llm.last_stats.draft_n > 0
    with pytest.raises(EdgeKVError, match="runs on the CPU backends"):
        Llama(path, n_ctx=64, backend=CUDABackend(emulated_device()), verbose=False, context_shift="keep",
              draft_model=Speculation(PromptLookup(), adaptive=False))
