"""Host memory the GPU maps is registered in whole pages of the OS (issue 42, finding 4's page size).

A registration must own every page it touches (two must never share one), and what a page
is depends on the kernel: 4 KiB on x86 and stock Jetson kernels, 64 KiB on some aarch64
kernels. A fixed 4 KiB would make two arrays share a 64 KiB page there, and the second
registration would fail at session creation.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from edgekv.cuda import arrays, runtime


def test_the_page_is_the_operating_systems():
    assert arrays.PAGE == os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("page", [4096, 16384, 65536])
def test_arrays_and_their_registrations_own_whole_pages_of_any_size(monkeypatch, page):
    monkeypatch.setattr(arrays, "PAGE", page)
    held = [arrays.page_aligned((n,), np.float32, 7) for n in (1, 100, page // 4 + 1)]
    for a in held:
        assert a.ctypes.data % page == 0 and (a == 7).all()
        start, nbytes, owner = runtime._region(a[2:])  # a view (one layer's row) registers its array's pages
        assert start == a.ctypes.data and nbytes % page == 0 and nbytes >= a.nbytes
    spans = sorted((a.ctypes.data, a.ctypes.data + -(-a.nbytes // page) * page) for a in held)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))  # no page shared


def test_an_array_that_does_not_own_its_pages_is_refused(monkeypatch):
    monkeypatch.setattr(arrays, "PAGE", 65536)
    plain = np.zeros(1000, np.float32)
    offset = plain[1:] if plain.ctypes.data % 65536 == 0 else plain
    with pytest.raises(ValueError, match="must own its pages"):
        runtime._region(offset)
