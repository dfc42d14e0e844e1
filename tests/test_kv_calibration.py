"""iq4_cal, the calibrated 4-bit cache type: its key map against a float64 NumPy estimate of
the same statistics, its sink rows read exactly by both attention paths, its disk cache,
its place in state files, and its quality on SmolLM2 against q4_0 and iq4_nl (KLD from the
f16 cache). Ring wraps, shifts and every other cache-type test run it too (test_families,
test_cache_types, test_state, test_numerics)."""

from __future__ import annotations

import numpy as np
import pytest

from edgekv.kv import calibration as kc
from edgekv.backends import get_backend
from edgekv.kv.cache import SINKS, KeyMap, KVCache
from edgekv.kernels.rows import hadamard
from edgekv.lab.kv_report import CachePair, measure_quality
from edgekv.loader import load
from edgekv.kv.types import kv_cache_type
from conftest import REFERENCE_DIR
from numpy_reference import ReferenceModel, _ggml_gelu

DIMS = dict(dim=128, n_heads=4, n_kv_heads=2, head_dim=64, ff=256)  # head 64: rotated, two GQA groups


def _reference_map(path, tokens, offsets=(0,)) -> tuple[np.ndarray, np.ndarray]:
    """mean and scale from the float64 reference's roped Q and K (positions >= SINKS), each
    also counted at the positions + offsets (RoPE turned further)."""
    ref = ReferenceModel(path)
    hp = ref.hp
    pos = np.arange(len(tokens), dtype=np.float64)
    x = ref.embed(tokens)
    means, scales = [], []
    for i in range(hp.n_layers):
        q, k, v = ref.qkv(i, x, pos)
        qs, ks = q[SINKS:], k[SINKS:]
        shifted = [(ref._rope(qs, np.full(len(qs), float(d)), ref.theta(i)),
                    ref._rope(ks, np.full(len(ks), float(d)), ref.theta(i))) for d in offsets]
        qs, ks = np.concatenate([a for a, _ in shifted]), np.concatenate([b for _, b in shifted])
        mean = ks.mean(0)
        var_k = ks.var(0)
        ms_q = (qs.reshape(len(qs), hp.n_kv_heads, -1, hp.head_dim) ** 2).mean((0, 2))
        s = (ms_q / var_k) ** 0.25
        means.append(mean)
        scales.append(s / np.exp(np.log(s).mean(-1, keepdims=True)))
        x = ref.finish(i, x, ref._attention(q, k, v, pos, hp.window if hp.local_layers[i] else 0), gelu=_ggml_gelu)
    return np.array(means), np.array(scales)


@pytest.mark.parametrize("arch, n_ctx", [("llama", 48), ("gemma3", 48), ("llama", 48 + 300)])
def test_key_map_matches_a_float64_estimate(tiny_model, arch, n_ctx):
    # n_ctx beyond the text: its Q and K also counted at offsets up to n_ctx - 48
    path = tiny_model(arch, weight_type="F32", **DIMS)
    model = load(path)
    tokens = list(np.random.default_rng(1).integers(0, model.hp.n_vocab, 48))
    ours = kc.measure(model.network, tokens, n_ctx, model.observed_pass)
    offsets = sorted({int(d) for d in np.linspace(0, n_ctx - 48, kc.OFFSETS)}) if n_ctx > 48 else [0]
    mean, scale = _reference_map(path, tokens, offsets)
    np.testing.assert_allclose(ours.mean, mean, rtol=0, atol=1e-4 * np.abs(mean).max())
    np.testing.assert_allclose(ours.scale, scale, rtol=1e-3)
    assert np.ptp(np.log(ours.scale)) > 0.1  # a map that does something: channels differ


@pytest.mark.parametrize("n", [40, 70])  # the per-query kernel and the BLAS prefill path (64 and up)
def test_attention_reads_the_sink_row_unrounded(n):
    # an outlier row at position 0 that 4-bit blocks cannot hold: attention must see it exactly
    rng = np.random.default_rng(5)
    hd, n_kv, n_heads = 64, 1, 2
    key_map = KeyMap(rng.standard_normal((1, n_kv, hd)).astype(np.float32),
                     np.exp(rng.uniform(-1, 1, (1, n_kv, hd))).astype(np.float32))
    cache = KVCache(n_layers=1, n_kv_heads=n_kv, head_dim_k=hd, head_dim_v=hd, capacity=128, backend=get_backend("cpu"),
                    type_k="iq4_cal", type_v="f32", key_map=key_map)
    k = rng.standard_normal((n, n_kv, hd)).astype(np.float32)
    k[0, 0, 3] = 40.0
    v = rng.standard_normal((n, n_kv, hd)).astype(np.float32)
    q = rng.standard_normal((n, n_heads, hd)).astype(np.float32)
    res = cache.reserve(n)
    out = np.zeros((n, n_heads, hd), np.float32)
    scratch = _Scratch(cache.backend.n_workers, hd)
    cache.backend.attend(cache.layer_view(0), res.slots[0], res.positions, q.copy(), k.copy(), v.copy(), out,
                         0.125, scratch)
    # the reference: stored rows dequantized, un-rotated and un-mapped, except position 0's, exact
    h = hadamard(hd)
    stored = cache.backend.load_kv(cache.k[0], cache.kind_k.quant.ggml_type, hd, res.slots[0])[0]  # [n, hd]
    kk = (stored.astype(np.float64) @ h) / key_map.scale[0, 0] + key_map.mean[0, 0]
    kk[0] = k[0, 0]
    for t in range(n):
        for head in range(n_heads):
            s = kk[: t + 1] @ q[t, head] * 0.125
            p = np.exp(s - s.max())
            want = p @ v[: t + 1, 0] / p.sum()
            np.testing.assert_allclose(out[t, head], want, rtol=0, atol=2e-5 * np.abs(want).max())


class _Scratch:
    """The two buffers of models/base.Scratch that attention uses."""

    def __init__(self, n_workers: int, hd: int):
        self.kv_rows = np.zeros((n_workers, 2, hd), np.float32)

    @staticmethod
    def attn_scratch(rows: int, slots: int):
        return np.zeros((rows, slots), np.float32), np.zeros((rows, slots), np.float32)


def test_the_map_is_kept_on_disk_and_a_damaged_file_is_measured_again(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKV_KERNEL_CACHE", str(tmp_path / "kernels"))
    path = tiny_model("llama", weight_type="F32", **DIMS)
    first = kc.key_map(load(path), 64)
    files = list((tmp_path / "calibration").glob("*.npz"))
    assert len(files) == 1
    monkeypatch.setattr(kc, "measure", lambda *a, **k: pytest.fail("measured again despite the disk cache"))
    assert first.same(kc.key_map(load(path), 64))
    files[0].write_bytes(b"not an npz")
    monkeypatch.undo()
    monkeypatch.setenv("EDGEKV_KERNEL_CACHE", str(tmp_path / "kernels"))
    assert first.same(kc.key_map(load(path), 64))  # measured again, the same deterministic map


def test_a_state_keeps_the_map_its_rows_were_stored_through(tiny_model, tmp_path):
    model = load(tiny_model("llama", weight_type="F32", **DIMS))
    tokens = list(range(3, 23))
    s = model.session(n_ctx=64, n_batch=8, cache_type_k="iq4_cal", cache_type_v="iq4_cal")
    s.eval(tokens)
    state = tmp_path / "s.state"
    from edgekv.state_file import load_session, model_fingerprint, save_session

    save_session(s, model_fingerprint(model), state)
    want = s.eval([7, 9], all_logits=True).copy()
    other = model.session(n_ctx=64, n_batch=8, cache_type_k="iq4_cal", cache_type_v="iq4_cal")
    m = other.cache.key_map
    other.cache.key_map = KeyMap(m.mean + 1, m.scale * 2)  # as if the calibration had changed since
    load_session(other, model_fingerprint(model), state)
    assert other.cache.key_map.same(s.cache.key_map)
    np.testing.assert_array_equal(other.cache.sink_k, s.cache.sink_k)
    np.testing.assert_allclose(other.eval([7, 9], all_logits=True), want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_a_growing_cache_recodes_its_keys_for_the_larger_contexts_map(tiny_model):
    model = load(tiny_model("llama", weight_type="F32", **DIMS))
    small = model.session(n_ctx=32, n_batch=8, cache_type_k="iq4_cal", cache_type_v="iq4_cal")
    small.eval(list(range(3, 23)))
    big_map = kc.key_map(model, 3000)  # beyond the calibration text: a map with offsets
    assert not big_map.same(small.cache.key_map)
    big = small.grown(3000, key_map=big_map)
    assert big.cache.key_map is big_map

    def keys(cache):  # every live K row as K (un-rotated, un-mapped), sink rows from sink_k
        slots = np.flatnonzero(cache.pos[0] >= 0)
        k = cache.backend.load_kv(cache.k[0], cache.kind_k.quant.ggml_type, cache.head_dim_k, slots)
        k = np.ascontiguousarray(k.transpose(1, 0, 2))
        k[cache.pos[0][slots] < SINKS] = cache.sink_k[0].transpose(1, 0, 2)
        k = k @ hadamard(64)
        cache.key_map.unkeys(0, k)
        return k[np.argsort(cache.pos[0][slots])]

    before, after = keys(small.cache), keys(big.cache)
    np.testing.assert_allclose(after[:SINKS], before[:SINKS], rtol=1e-5, atol=1e-5)  # kept in f32
    err = np.abs(after - before).max() / np.abs(before).max()
    assert 0 < err < 0.15  # recoded: one more 4-bit rounding, not another map's garbage
    ref = model.session(n_ctx=3000, cache_type_k="f32", cache_type_v="f32")
    ref.eval(list(range(3, 23)) + [5])
    big.eval([5])
    got, ref = big.logits, ref.logits
    assert np.abs(got - ref).max() / np.abs(ref).max() < 0.1


def test_storage_is_four_and_a_half_bits_a_value():
    t = kv_cache_type("iq4_cal")
    assert t.row_nbytes(64) * 8 / 64 == 4.5 and t.calibrated and not kv_cache_type("iq4_nl").calibrated


@pytest.mark.slow
def test_iq4_cal_keeps_smollm2_closer_to_f16_than_q4_0_and_iq4_nl(smollm2_path):
    # the first 2 chunks of gpl3.txt at -c 512 (510 scored tokens); the whole text's figures
    # are in benchmarks/README.md (q4_0 0.076, iq4_cal about a third of it)
    model = load(smollm2_path)
    tokens = model.tokenizer.encode((REFERENCE_DIR / "gpl3.txt").read_bytes())
    pairs = [CachePair(t, t) for t in ("q4_0", "iq4_nl", "iq4_cal")]
    q = measure_quality(model, tokens, 512, [CachePair("f16", "f16"), *pairs], 2)
    kld = {p.type_k: q[p].kld for p in pairs}
    assert kld["iq4_cal"] < 0.5 * kld["q4_0"] and kld["iq4_cal"] < 0.6 * kld["iq4_nl"], kld
    assert kld["iq4_cal"] < 0.035, kld
