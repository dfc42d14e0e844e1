"""Limits of the CUDA kernels that a model or a session must not cross (issue 42, finding 7).

- A prefill chunk's tokens are a grid's y or z dimension (CUDA allows 65,535): the CUDA
  backend's sessions cap n_batch there, and a launch shape past it is refused on the host.
- A head wider than 256 values would be read short by attention and overrun ek_kv_shift's
  registers: such a model is refused on CUDA when it loads, before any weight is read, with
  an error that says to run it on the CPU (where the backend was left to auto, it does).
"""

from __future__ import annotations

import pytest

from cuda_emulator import EmulatedDevice
from edgekv.backends import cuda_launch as shape
from edgekv.backends.cuda import CUDABackend
from edgekv.errors import GpuCannotRun
from edgekv.loader import load
from helpers.emulated_cuda import cuda_model


def test_a_cuda_session_cuts_prompts_into_chunks_a_grid_can_hold(tiny_model):
    model = cuda_model(tiny_model("llama", dim=32, n_heads=2, n_kv_heads=1, head_dim=16, ff=32, n_ctx=70_000))
    s = model.session(n_ctx=70_000, n_batch=70_000)
    assert s.n_batch == shape.MAX_GRID_YZ == 65_535
    assert load(model.path, backend="cpu").session(n_ctx=70_000, n_batch=70_000).n_batch == 70_000  # CPU: no cap


@pytest.mark.parametrize("launch", [lambda n: shape.rope(32, 4, n), lambda n: shape.attention(4, n),
                                    lambda n: shape.get_rows(n, 64), lambda n: shape.matvec(64, n)])
def test_a_launch_shape_past_the_grid_limit_is_refused(launch):
    assert launch(shape.MAX_GRID_YZ).grid[1:]  # the largest chunk is a valid grid
    with pytest.raises(ValueError, match="at most 65535"):
        launch(shape.MAX_GRID_YZ + 1)


@pytest.mark.parametrize("head_dim", [288, 512])
def test_a_head_wider_than_the_kernels_hold_is_refused_at_load(tiny_model, head_dim, monkeypatch):
    path = tiny_model("llama", dim=64, n_heads=2, n_kv_heads=1, head_dim=head_dim, ff=64)
    loaded = []
    monkeypatch.setattr(CUDABackend, "weight", lambda *a, **k: loaded.append(a) or pytest.fail("a weight was read"))
    with pytest.raises(GpuCannotRun, match=f"head size is {head_dim}, more than the 256.*--backend cpu"):
        load(path, backend=CUDABackend(EmulatedDevice()))
    assert loaded == []


def test_a_head_of_256_still_runs_on_cuda(tiny_model):
    path = tiny_model("llama", dim=64, n_heads=2, n_kv_heads=1, head_dim=256, ff=64)
    s = cuda_model(path).session(n_ctx=16)
    s.eval([1, 2, 3])
    assert s.n_tokens == 3
