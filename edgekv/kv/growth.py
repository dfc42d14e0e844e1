"""A cache copied into a larger one: the `n_ctx="auto"` growth of a conversation (session.py
Session.grown), done once per growth, never behind the user's back on a full ring.

What does not live here: the rings themselves (kv/cache.py), when to grow (api/context_growth.py).
"""

from __future__ import annotations

import numpy as np

from .cache import KVCache
from .key_map import recode_keys


def copy_into(dst: KVCache, src: KVCache) -> None:
    """Hold src's positions and rows in dst, a cache as large or larger. A layer whose
    ring keeps its size is copied slot for slot (ring pointer included); a layer whose
    ring is larger receives its live slots in position order at the front, so a
    windowed ring's next write still overwrites its oldest slot."""
    src.backend.rings_to_host(src)
    if dst.sink_k is not None and src.sink_k is not None:  # in place: where the backend reads them
        dst.sink_k[...] = src.sink_k
    for layer, pos in enumerate(src.pos):
        if dst.caps[layer] == src.caps[layer]:
            dst.k[layer][...] = src.k[layer]
            dst.v[layer][...] = src.v[layer]
            dst.pos[layer][...] = pos
            dst.used[layer], dst.cur[layer] = src.used[layer], src.cur[layer]
            continue
        live = np.flatnonzero(pos >= 0)
        order = live[np.argsort(pos[live], kind="stable")]
        m = order.size
        dst.k[layer][:, :m] = src.k[layer][:, order]
        dst.v[layer][:, :m] = src.v[layer][:, order]
        dst.pos[layer][:m] = pos[order]
        dst.used[layer], dst.cur[layer] = m, m % dst.caps[layer]
    dst.n_tokens = src.n_tokens
    if dst.tallies is not None:
        dst.set_attention_by_position(*src.attention_by_position())
    if dst.key_map is not None and not dst.key_map.same(src.key_map):
        recode_keys(dst, src.key_map)
    dst.backend.rings_from_host(dst)
