"""When the driver cannot capture or instantiate a decode step's graph (issue 42, finding 3).

On the emulated driver (cuda_emulator.py): the step whose capture fails runs eagerly with
the right logits, the backend stops capturing and says so in one line on stderr, and no
state of the capture is left behind (recording on, collections off), so later steps neither
skip their logits nor return stale ones.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from edgekv.cuda.driver import CudaError
from helpers.decode_steps import decode
from helpers.emulated_cuda import WIDE, cuda_model, rng

OPTIONS = dict(n_ctx=32, n_batch=1, cache_type_k="q8_0", cache_type_v="f16")


def _plain_logits(path, tokens, monkeypatch) -> np.ndarray:
    with monkeypatch.context() as m:
        m.setenv("EDGEKV_CUDA_GRAPHS", "0")
        return decode(cuda_model(path), tokens, **OPTIONS)[1]


@pytest.mark.parametrize("where", ["instantiate", "forward"])
def test_a_failed_capture_runs_the_step_eagerly_and_stops_capturing(tiny_model, monkeypatch, capfd, where):
    path = tiny_model("llama", **WIDE)
    tokens = rng.integers(0, 200, 10)
    model = cuda_model(path)
    backend, driver = model.backend, model.backend.device.driver
    if where == "instantiate":  # the stream leaves capture mode, then cuGraphInstantiate fails
        def end_capture(stream, end=driver.end_capture):
            end(stream)
            raise CudaError("cuGraphInstantiate failed: CUDA_ERROR_NOT_SUPPORTED", 801)

        monkeypatch.setattr(driver, "end_capture", end_capture)
    else:  # a launch inside the captured forward pass fails (and ending the capture then fails too)
        real_launch = driver.launch

        def launch(*args, **kw):
            if driver.capture is not None:
                raise CudaError("cuLaunchKernel failed: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", 901)
            return real_launch(*args, **kw)

        def end_capture(stream, end=driver.end_capture):
            end(stream)
            raise CudaError("cuStreamEndCapture failed: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", 901)

        monkeypatch.setattr(driver, "launch", launch)
        monkeypatch.setattr(driver, "end_capture", end_capture)
    _, logits = decode(model, tokens, **OPTIONS)
    assert gc.isenabled() and backend.recording is None  # nothing of the capture is left on
    graphs = backend.graphs
    assert graphs.failed is not None and graphs.captured == 0 and driver.graph_launches == 0
    err = [line for line in capfd.readouterr().err.splitlines() if "graph" in line]
    assert len(err) == 1 and "decode steps run without graphs" in err[0]
    np.testing.assert_array_equal(logits, _plain_logits(path, tokens, monkeypatch))


def test_an_error_that_is_not_the_drivers_still_reaches_the_caller(tiny_model, monkeypatch):
    """A Ctrl-C inside a captured step is the user's: it propagates (the stream leaves
    capture mode first), and the next steps capture as usual."""
    path = tiny_model("llama", **WIDE)
    model = cuda_model(path)
    driver = model.backend.device.driver
    s = model.session(**OPTIONS)
    s.eval([1])  # eager: the next one-token step is captured
    interrupted, real_launch = [], driver.launch

    def launch(*args, **kw):
        if driver.capture is not None and not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
        return real_launch(*args, **kw)

    monkeypatch.setattr(driver, "launch", launch)
    with pytest.raises(KeyboardInterrupt):
        s.eval([2])
    assert driver.capture is None and gc.isenabled() and model.backend.recording is None
    assert model.backend.graphs.failed is None and s.n_tokens == 1
    s.eval([2])
    s.eval([3])
    assert model.backend.graphs.captured == 1
