"""Decode steps captured as CUDA graphs and replayed (as llama.cpp's CUDA backend does): a
one-token step launches a few hundred small kernels, whose launch cost, from Python above
all, would otherwise be most of the step.

How: the first one-token step of a session (per cache, scratch and logit row count) runs
eagerly (kernels are loaded and vectors uploaded on first use), the second runs its
forward pass under stream capture; the backend's operations record, beside the
launches, how each input is rewritten from the next step (cuda_inputs.Recording). Later
steps only rewrite the inputs in their mapped host memory, launch the graph, and copy the
logits out. Every value that changes from step to step is read by the kernels from memory
(ids, positions, slots, the slot count of each layer: ek_attention's `n_slots`), so the
captured launches stay right as the ring fills, wraps or shifts.

Not captured (run eagerly): every step on a device that cannot map host memory (its inputs
are copied from pageable memory, which a capture refuses), chunks of several tokens, sessions decoding together
(kv/batch.py), a cache being observed (kv/calibration.py), and any step whose inputs the capture
could not learn to rewrite (Recording.broken). A graph is dropped when what it points at
goes: its cache, its scratch, or a staging buffer that grew. EDGEKV_CUDA_GRAPHS=0 turns
capture off (for comparing against it; GGML_CUDA_DISABLE_GRAPHS is llama.cpp's).
"""

from __future__ import annotations

import gc
import os
import sys
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cuda.driver import CudaError
from .cuda_inputs import HostInputs, Recording, Step, step_bytes


@dataclass
class Graph:
    exe: Any  # the instantiated graph
    recording: Recording
    inputs: HostInputs  # the graph's own inputs: their addresses are in its launches


def graphs_enabled() -> bool:
    return os.environ.get("EDGEKV_CUDA_GRAPHS", "1").strip() not in ("0", "off", "false", "no")


class DecodeGraphs:
    def __init__(self, backend):  # the CUDABackend (cuda.py) it serves
        self.backend = backend
        self.graphs: dict[tuple, Graph] = {}
        self.refused: set[tuple] = set()  # keys whose capture broke: run eagerly
        self.warm: set[tuple] = set()  # keys that ran once eagerly: the next such step is captured
        self.captured = self.replayed = 0  # for tests and `edgekv bench`'s notes
        self.failed: str | None = None  # why capture broke in the driver: every step then runs eagerly

    def run(self, model, tokens: np.ndarray, cache, res, scratch, rows: np.ndarray, logits: np.ndarray) -> None:
        be = self.backend
        step = Step(tokens, cache, res, rows, logits)
        cache_key = cache.graph_key()  # None: a batched or observed step
        if (tokens.shape[0] != 1 or cache_key is None or self.failed is not None or not graphs_enabled()
                or not be.device.info.maps_host_memory):  # inputs copied from pageable memory: not capturable
            be.eager(model, step, scratch)
            return
        key = (id(model), cache_key[0], id(scratch), len(rows), cache_key[1])
        graph = self.graphs.get(key)
        if graph is None:
            if key in self.warm and key not in self.refused:
                graph = self.capture(model, step, scratch, key)
            if graph is None:
                self.warm.add(key)  # the first such step runs eagerly: it loads kernels, uploads vectors
                be.eager(model, step, scratch)
                return
        else:
            graph.recording.write(step)
            self.replayed += 1
        driver, stream = be.device.driver, be.device.stream
        driver.launch_graph(graph.exe, stream)
        for (ptr, nbytes), out in zip(graph.recording.outputs, (logits,)):
            driver.to_host(out, ptr, nbytes, stream)
        be.synchronize()

    def capture(self, model, step: Step, scratch, key: tuple) -> Graph | None:
        """The step's forward pass captured as a graph (launched by the caller), or None: the
        step must run eagerly, because the capture could not learn to rewrite an input, or
        the driver failed to capture or instantiate it (then no step is captured again: one
        line on stderr says why, as llama.cpp disables its graphs)."""
        be = self.backend
        driver, stream = be.device.driver, be.device.stream
        be.synchronize()
        inputs, recording = HostInputs(be.device, reserve=step_bytes(len(step.cache.k))), Recording(step)
        be.begin_recording(recording, inputs)
        collecting = gc.isenabled()
        gc.disable()  # a finalizer run by a collection (a ring unregistered, a graph destroyed) would break the capture
        try:
            driver.begin_capture(stream)
            try:
                model.forward(step.tokens, step.cache, step.res, scratch, step.rows, step.logits)
            except BaseException:
                self._end_quietly(driver, stream)  # the stream must leave capture mode; the first error wins
                raise
            exe = driver.end_capture(stream)
        except CudaError as exc:
            self._give_up(exc)
            return None
        finally:  # whatever happened: eager steps record nothing and collections run again
            be.end_recording()
            if collecting:
                gc.enable()
        if recording.broken is not None or len(recording.outputs) != 1:
            driver.destroy_graph(exe)
            self.refused.add(key)
            return None
        recording.step = None  # the graph must not keep the session's cache alive
        graph = self.graphs[key] = Graph(exe, recording, inputs)
        for owner in (step.cache, scratch):  # its pointers die with them
            weakref.finalize(owner, self.forget, key)
        self.captured += 1
        return graph

    def _give_up(self, exc: CudaError) -> None:
        self.failed = str(exc)
        print(f"edgekv: CUDA graph capture failed ({exc}); decode steps run without graphs", file=sys.stderr)

    @staticmethod
    def _end_quietly(driver, stream) -> None:
        try:
            driver.destroy_graph(driver.end_capture(stream))
        except CudaError:
            pass

    def forget_cache(self, cache) -> None:
        """Drop every graph of `cache` (it took new ring arrays, or the host rewrote its rows)."""
        for key in {k for k in (*self.graphs, *self.refused, *self.warm) if k[1] == id(cache)}:
            self.forget(key)

    def forget(self, key: tuple) -> None:
        graph = self.graphs.pop(key, None)
        self.refused.discard(key)
        self.warm.discard(key)
        if graph is not None:
            self.backend.device.driver.destroy_graph(graph.exe)

    def clear(self) -> None:
        """Drop every graph (a buffer their launches point at was replaced)."""
        for key in list(self.graphs):
            self.forget(key)
        self.refused.clear()
        self.warm.clear()
