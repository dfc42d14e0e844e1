"""Device arrays as a forward pass sees them, and host arrays the GPU can address.

What lives here: `DeviceArray`, a typed view of device memory with the few NumPy habits the
architectures' graphs use on their Scratch (`a[:n]`, `a[i : i + 1]`, `a.reshape(n, h, d)`,
`a.shape`), so models/*.py run unchanged on the CUDA backend; `page_aligned`, host arrays
that own whole pages (what `Device.host_pointer` registers: two registrations must never
share a page). What does not: allocation and copies (runtime.Device).
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass, field

import numpy as np

# registration works on whole pages of the OS (4 KiB on x86 and stock Jetson kernels; 64 KiB on some
# aarch64 kernels): two registrations must never share one
PAGE = mmap.PAGESIZE


@dataclass(frozen=True)
class DeviceArray:
    """C-contiguous device memory: ptr, shape and dtype (float32 unless said); host: for
    mapped host memory, the host's view of the same bytes (None: device memory)."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype = np.dtype(np.float32)
    host: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __int__(self) -> int:
        return self.ptr

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key) -> "DeviceArray":
        """Rows start:stop of the first axis (a contiguous view); nothing else."""
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError(f"a DeviceArray takes only a slice of its first axis, not {key!r}")
        start, stop, _ = key.indices(self.shape[0])
        stop = max(start, stop)
        row = math.prod(self.shape[1:]) * self.dtype.itemsize
        host = None if self.host is None else self.host[start:stop]
        return DeviceArray(self.ptr + start * row, (stop - start,) + self.shape[1:], self.dtype, host)

    def reshape(self, *shape) -> "DeviceArray":
        if len(shape) == 1 and isinstance(shape[0], tuple):
            shape = shape[0]
        shape = tuple(int(s) for s in shape)
        if shape.count(-1) == 1:
            known = math.prod(s for s in shape if s != -1)
            shape = tuple(self.size // known if s == -1 else s for s in shape)
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape a device array of shape {self.shape} into {shape}")
        return DeviceArray(self.ptr, shape, self.dtype, None if self.host is None else self.host.reshape(shape))


def page_aligned(shape, dtype, fill=0) -> np.ndarray:
    """A host array filled with `fill` that starts on a page and owns every page it touches."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    whole = -(-max(nbytes, 1) // PAGE) * PAGE
    raw = np.empty(whole + PAGE, np.uint8)
    start = -raw.ctypes.data % PAGE
    out = raw[start : start + nbytes].view(dtype).reshape(shape)
    out[...] = fill
    return out


def viewed_array(a: np.ndarray) -> np.ndarray:
    """The array whose memory a view (of a view ...) of it is: a itself when it is no view."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def is_page_aligned(a: np.ndarray) -> bool:
    return a.ctypes.data % PAGE == 0
