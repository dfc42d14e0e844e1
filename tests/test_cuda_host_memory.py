"""What the CUDA backend does with host memory, from what the device says it can do.

Asked when the backend is made (driver.DeviceInfo: HOST_REGISTER_SUPPORTED,
READ_ONLY_HOST_REGISTER_SUPPORTED), never assumed: a device that cannot register host memory
runs the model with its inputs and the cache's arrays copied (decode without graphs), one
that cannot register read-only memory gets its weights copied, each saying so in one line;
and a discrete GPU keeps the cache's slot positions, `keep` tallies and sink rows in device
memory, refreshed by copies a captured step replays, instead of reading them over PCIe.
Each test runs on the kernels' twins and on the real kernels (conftest.py's emulated_kernels).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from helpers.emulated_cuda import WIDE, cuda_model, rng

pytestmark = pytest.mark.usefixtures("emulated_kernels")

KEEP = dict(n_ctx=32, n_batch=8, context_shift="keep", n_keep=4, cache_type_k="iq4_cal", cache_type_v="q8_0")


def _run(model, tokens, **options):
    """A prompt of 12, then one-token steps past the context (`keep` evicts): the logits of each."""
    s = model.session(**options)
    out = [s.eval(tokens[:12], all_logits=True)[-1]]
    for t in tokens[12:]:
        s.eval([t])
        out.append(s.logits.copy())
    return s, np.array(out)


@pytest.fixture(scope="module")
def tokens():
    return [int(t) for t in rng.integers(1, 200, 40)]


@pytest.mark.parametrize("integrated", [True, False])
def test_a_gpu_that_cannot_register_host_memory_runs_the_model_by_copies_saying_so(tiny_model, tokens, integrated,
                                                                                 capfd):
    path = tiny_model("llama", **WIDE, n_ctx=1024)
    _, want = _run(cuda_model(path, integrated), tokens, **KEEP)
    capfd.readouterr()
    model = cuda_model(path, integrated, host_register=False, read_only_register=False)
    assert capfd.readouterr().err.strip().splitlines() == [
        "edgekv: Emulated GPU cannot register host memory: each step's inputs are copied to it and decode runs "
        "without CUDA graphs"]
    s, got = _run(model, tokens, **KEEP)
    driver = model.backend.device.driver
    assert driver.registered == [] and driver.graph_launches == 0
    assert s.n_tokens <= 32 < len(tokens)  # `keep` evicted: tallies and sink rows went both ways by copies
    np.testing.assert_array_equal(got, want)


def test_an_integrated_gpu_without_read_only_registration_copies_the_weights_and_maps_the_rest(tiny_model, tokens,
                                                                                               caplog):
    path = tiny_model("llama", **WIDE, n_ctx=1024)
    _, want = _run(cuda_model(path), tokens, **KEEP)
    with caplog.at_level(logging.WARNING, logger="edgekv"):
        model = cuda_model(path, read_only_register=False)
    said = [r.getMessage() for r in caplog.records if "weights" in r.getMessage()]
    assert said == ["cannot map the weights where they lie (this GPU cannot register read-only host memory): "
                    "copying them to the GPU"]
    device = model.backend.device
    weights = sum(buf.nbytes for buf in device._owned.values())
    s, got = _run(model, tokens, **KEEP)
    assert weights > 0 and device.driver.graph_launches > 0  # uploaded; the step inputs mapped, decode replayed
    assert device.driver.registered  # the rings and inputs: mapped, not copied
    np.testing.assert_array_equal(got, want)


def test_a_discrete_gpu_keeps_slot_positions_tallies_and_sinks_in_device_memory(tiny_model, tokens):
    path = tiny_model("llama", **WIDE, n_ctx=1024)
    _, want = _run(cuda_model(path, integrated=True), tokens, **KEEP)  # all of them mapped
    model = cuda_model(path, integrated=False)
    s, got = _run(model, tokens, **KEEP)
    driver = model.backend.device.driver
    assert s.n_tokens <= 32 < len(tokens) and driver.graph_launches > 0  # evictions, and replayed steps

    def device_memory(ptr: int) -> bool:
        return any(base <= ptr < base + buf.nbytes for base, buf in driver._memory.items())

    args = driver.last_args
    assert device_memory(args["ek_attention"][4])  # slot_pos
    assert device_memory(args["ek_attention_tally"][-2])  # the layer's tallies
    assert device_memory(args["ek_keep_sinks"][2])  # the sink rows
    assert relative_error_max(got, want) < 1e-5
    np.testing.assert_allclose(s.cache.attention_by_position()[0], _run(cuda_model(path), tokens, **KEEP)[0]
                               .cache.attention_by_position()[0], rtol=1e-5)


def relative_error_max(got, want) -> float:
    return float((np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)).max())
