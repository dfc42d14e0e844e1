"""A step's inputs on the CUDA path: written by the host into mapped memory the kernels read.

Token ids, positions, each layer's slots and slot count, the rows whose logits are wanted:
small arrays the host makes per step. They go into page-aligned host memory registered
with the device (`HostInputs`), which the kernels read through the mapping: no copy in, on
Jetson's unified memory not even a transfer, and a captured step (cuda_graphs.py) keeps its
kernels' addresses while the host rewrites what lies there (a device that cannot map host
memory gets each input by a copy: Device.push). `Recording` is what a capture
keeps beside the graph: for each input, how to write it again from the next step (`Step`),
and where the logits come out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..cuda.runtime import Device

CHUNK = 64 << 10  # bytes of inputs registered at a time
ALIGN = 256  # each input starts on a 256-byte boundary (coalesced reads)


def step_bytes(n_layers: int) -> int:
    """What a one-token step's inputs take at most: ids and logit rows, then per layer its
    slots, positions and slot count (cuda_attention.py), each ALIGN bytes."""
    return (3 * n_layers + 8) * ALIGN


@dataclass
class Step:
    """One forward pass's arguments (Decoder.forward's), which a replayed graph's inputs are
    written from."""

    tokens: np.ndarray
    cache: Any
    res: Any
    rows: np.ndarray
    logits: np.ndarray


@dataclass
class Recording:
    """What a capture learns besides its launches: writers(step) put each input in place for
    a replay; outputs are (device address, bytes) copied into step.logits after it. broken:
    why the step cannot be replayed (an input the next step could not recompute)."""

    step: Step | None  # the step being captured (None once it has been)
    writers: list[Callable[[Step], None]] = field(default_factory=list)
    outputs: list[tuple[int, int]] = field(default_factory=list)
    broken: str | None = None

    def write(self, step: Step) -> None:
        for writer in self.writers:
            writer(step)


class HostInputs:
    """An arena of mapped host memory: put() places an array and returns its device address.
    reset() starts over (the device must be done reading: after a synchronize)."""

    def __init__(self, device: Device, reserve: int = 0):
        """reserve: bytes registered now (a capture may not register memory while it runs)."""
        self.device = device
        self.chunks: list[tuple[np.ndarray, int]] = []  # (host bytes, device address)
        self.index, self.used = 0, 0
        if reserve:
            self._add(reserve)

    def _add(self, nbytes: int) -> None:
        host = self.device.mapped_array((max(CHUNK, nbytes),), np.uint8)
        self.chunks.append((host.host, host.ptr))

    def put(self, values: np.ndarray) -> tuple[int, np.ndarray]:
        """values copied into the arena: (device address, the host view to rewrite)."""
        values = np.ascontiguousarray(values)
        size = -(-max(values.nbytes, 1) // ALIGN) * ALIGN
        while self.index < len(self.chunks) and self.used + size > self.chunks[self.index][0].nbytes:
            self.index, self.used = self.index + 1, 0
        if self.index == len(self.chunks):
            self._add(size)
        host, dptr = self.chunks[self.index]
        view = host[self.used : self.used + values.nbytes].view(values.dtype).reshape(values.shape)
        view[...] = values
        address = dptr + self.used
        self.device.push(address, view)  # a device that cannot map host memory: copied there
        self.used += size
        return address, view

    def reset(self) -> None:
        self.index, self.used = 0, 0
