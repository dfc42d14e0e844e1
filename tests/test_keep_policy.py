"""The `keep` overflow policy (kv/heavy_hitters.py): its choice, its attention tallies against
the float64 reference on every attention path, and what a session keeps across state files,
growth and the CLI. Its evictions against the reference over long runs: test_ring_cache.py."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest

from edgekv.kv import heavy_hitters
from edgekv.backends.kernel_map import BATCH_MIN_TOKENS
from edgekv.cli import main
from edgekv.errors import StateFileError
from edgekv.loader import load
from edgekv.state_file import load_session, model_fingerprint, save_session
from numpy_reference import ReferenceModel, ReferenceSession

rng = np.random.default_rng(11)


def test_choose_spares_the_sinks_and_the_recent_window():
    scores = np.array([0.0, 0.0, 5.0, 1.0, 3.0, 0.5, 2.0, 0.1, 0.0, 0.0])
    # candidates are positions 2..7 (2 sinks, 2 recent): the lowest three of them
    np.testing.assert_array_equal(heavy_hitters.choose(scores, 2, 2, 3), [3, 5, 7])
    # more than the candidates: the recent window gives up its oldest first
    np.testing.assert_array_equal(heavy_hitters.choose(scores, 2, 4, 5), [2, 3, 4, 5, 6])
    # ties go to the older token
    np.testing.assert_array_equal(heavy_hitters.choose(np.zeros(8), 1, 2, 2), [1, 2])


def test_score_is_the_largest_mean_per_query_over_layers_and_heads():
    mass = np.array([[[4.0, 1.0, 0.5]], [[2.0, 3.0, 0.5]]], np.float32)  # [2 layers, 1 head, 3 tokens]
    seen = np.array([4.0, 2.0, 1.0], np.float32)
    np.testing.assert_allclose(heavy_hitters.score(mass, seen), [1.0, 1.5, 0.5])


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("chunks", [[BATCH_MIN_TOKENS + 6], [5, 1, 9], [1] * 12])
def test_tallies_match_the_reference_on_every_attention_path(tiny_model, arch, chunks):
    # a chunk of BATCH_MIN_TOKENS or more takes the BLAS path, a shorter one the multi-query
    # kernel, a single token the decode kernel: all three must add the same softmax weights
    path = tiny_model(arch)
    model = load(path)
    s = model.session(n_ctx=128, n_batch=128, cache_type_k="f32", cache_type_v="f32", context_shift="keep")
    ref = ReferenceSession(ReferenceModel(path))
    tokens = rng.integers(0, model.hp.n_vocab, sum(chunks))
    at = 0
    for n in chunks:
        s.eval(tokens[at : at + n])
        at += n
    for t in tokens:
        ref.step(int(t))
    mass, seen = s.cache.attention_by_position()
    np.testing.assert_array_equal(seen, ref.seen)
    # gemma3: ggml's GELU rounds its input to f16 (the reference too), which a last-bit
    # difference can land on either side of (test_ring_cache.py): a looser bound
    np.testing.assert_allclose(mass, ref.mass, rtol=1e-4 if arch == "llama" else 1e-3, atol=1e-5)
    local = np.asarray(model.hp.local_layers)
    assert (mass[local] == 0).all() and (mass[~local] > 0).all()  # only full-context layers vote


def _keep_session(model, **kw):
    return model.session(n_ctx=24, n_batch=4, cache_type_k="f32", cache_type_v="f32", context_shift="keep", **kw)


def _continue(session, tokens):
    out = []
    for t in tokens:
        session.eval([int(t)])
        out.append(session.logits.copy())
    return np.stack(out)


def test_a_state_file_carries_the_tallies_so_evictions_continue_alike(tiny_model, tmp_path):
    model = load(tiny_model())
    fp = model_fingerprint(model)
    tokens = rng.integers(0, model.hp.n_vocab, 120)
    saved = _keep_session(model)
    saved.eval(tokens[:40])
    assert saved.n_discarded > 0
    file = tmp_path / "keep.ekvs"
    save_session(saved, fp, file)
    expected = _continue(saved, tokens[40:])
    loaded = _keep_session(model)
    load_session(loaded, fp, file)
    np.testing.assert_array_equal(_continue(loaded, tokens[40:]), expected)
    # without the tallies the same state evicts other tokens and the logits part ways
    blind = _keep_session(model)
    load_session(blind, fp, file)
    blind.cache.set_attention_by_position(None, None)
    assert not np.array_equal(_continue(blind, tokens[40:]), expected)


def test_negative_tallies_in_a_state_file_are_refused(tiny_model, tmp_path):
    model = load(tiny_model())
    fp = model_fingerprint(model)
    s = _keep_session(model)
    s.eval(rng.integers(0, model.hp.n_vocab, 30))
    file = tmp_path / "keep.ekvs"
    save_session(s, fp, file)
    blob = file.read_bytes()
    _, _, nh, nd = struct.unpack_from("<4sIQQ", blob)
    header, data = json.loads(blob[24 : 24 + nh]), bytearray(blob[24 + nh : 24 + nh + nd])
    entry = next(d for d in header["arrays"] if d["name"] == "attention")
    data[entry["offset"] : entry["offset"] + 4] = np.float32(-1.0).tobytes()
    head = json.dumps(header, separators=(",", ":")).encode()
    body = struct.pack("<4sIQQ", b"EKVS", 1, len(head), len(data)) + head + bytes(data)
    file.write_bytes(body + hashlib.sha256(body).digest())
    target = _keep_session(model)
    target.eval([3, 4, 5])
    with pytest.raises(StateFileError) as info:
        load_session(target, fp, file)
    assert info.value.field == "attention" and target.tokens == [3, 4, 5]


def test_growth_keeps_the_tallies_by_position(tiny_model):
    model = load(tiny_model())
    s = _keep_session(model)
    s.eval(rng.integers(0, model.hp.n_vocab, 40))
    grown = s.grown(64)
    for ours, theirs in zip(grown.cache.attention_by_position(), s.cache.attention_by_position()):
        np.testing.assert_array_equal(ours, theirs)
    assert grown.context_shift == "keep" and grown.tokens == s.tokens


def test_the_cli_generates_past_a_full_context_with_keep(tiny_model, capsys):
    rc = main(["run", "-m", str(tiny_model()), "-p", "hello there", "-n", "48", "-c", "24", "--temp", "0",
               "--context-shift", "keep", "--ignore-eos"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.strip()
