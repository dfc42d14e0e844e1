"""Tests for edgekv/state_file.py (state files), `Llama.save_state_file` / `load_state_file` and
`edgekv run --prompt-cache`, on tiny random models.

A loaded state must continue exactly as the session that saved it (same greedy tokens, same
logits bit for bit), in this process and in a fresh one; every kind of bad file is refused
with a StateFileError naming the field, and the session it was loaded into is untouched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from edgekv import Llama
from edgekv.cli import main
from edgekv.kv.cache import CACHE_TYPES
from edgekv.errors import StateFileError
from edgekv.loader import load
from edgekv import state_file as state_mod
from edgekv.state_file import MAGIC, load_session, model_fingerprint, save_session

PROMPT = [1, 17, 42, 5, 99, 23, 8, 61, 4, 30, 12, 77, 3, 50, 19, 2, 44, 9, 71, 6]
N_CONTINUE = 64
Q8_MODEL = dict(dim=128, n_heads=4, n_kv_heads=2, head_dim=32, ff=256)  # q8_0 blocks need head_dim % 32 == 0
REPO = Path(__file__).resolve().parents[1]


def greedy(session, n: int = 8) -> tuple[list[int], np.ndarray]:
    """n greedy tokens after the session's last logits, and the logits after each: f32[n, n_vocab]."""
    tokens, logits = [], []
    for _ in range(n):
        t = int(np.argmax(session.logits))
        session.eval([t])
        tokens.append(t)
        logits.append(session.logits.copy())
    return tokens, np.stack(logits)


# (model kwargs, session kwargs): every cache type, saved after the ring has wrapped (a
# 20-token prompt into 16 slots under the shift policy, which keeps shifting during the
# 64 tokens generated after loading); gemma3's sliding-window rings wrapped by a small
# n_batch (the ring pointers must survive the file too)
CASES = {
    **{f"{t}-wrapped": (Q8_MODEL, dict(n_ctx=16, cache_type_k=t, cache_type_v=t, context_shift="shift", n_keep=2))
       for t in CACHE_TYPES},
    "f16": (dict(), dict(n_ctx=128)),
    "gemma3-window": (dict(arch="gemma3"), dict(n_ctx=128, n_batch=4)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_loaded_state_continues_exactly_here_and_in_a_new_process(tiny_model, tmp_path, case):
    model_kw, session_kw = CASES[case]
    path = tiny_model(**model_kw)
    model = load(path)
    fp = model_fingerprint(model)
    saved = model.session(**session_kw)
    saved.eval(PROMPT)
    at_save = list(saved.tokens)
    file = tmp_path / "state.ekvs"
    save_session(saved, fp, file)
    assert not Path(f"{file}.tmp").exists()
    expected_tokens, expected_logits = greedy(saved, N_CONTINUE)

    fresh = model.session(**session_kw)
    fresh.eval([2, 3])  # something to replace
    load_session(fresh, fp, file)
    assert fresh.tokens == at_save
    tokens, logits = greedy(fresh, N_CONTINUE)
    assert tokens == expected_tokens
    np.testing.assert_array_equal(logits, expected_logits)

    script = textwrap.dedent("""
        import json, sys
        import numpy as np
        from edgekv.loader import load
        from edgekv.state_file import load_session, model_fingerprint
        path, file, out, kw = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
        model = load(path)
        s = model.session(**kw)
        load_session(s, model_fingerprint(model), file)
        loaded = list(s.tokens)
        tokens, logits = [], []
        for _ in range(%d):
            t = int(np.argmax(s.logits))
            s.eval([t])
            tokens.append(t)
            logits.append(s.logits.copy())
        np.save(out, np.stack(logits))
        print(json.dumps(dict(loaded=loaded, tokens=tokens)))
    """ % N_CONTINUE)
    out = tmp_path / "logits.npy"
    done = subprocess.run([sys.executable, "-c", script, str(path), str(file), str(out), json.dumps(session_kw)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == dict(loaded=at_save, tokens=expected_tokens)
    np.testing.assert_array_equal(np.load(out, allow_pickle=False), expected_logits)


def test_only_live_slots_are_stored(tiny_model, tmp_path):
    model = load(tiny_model())
    fp = model_fingerprint(model)
    small, large = model.session(n_ctx=32), model.session(n_ctx=256)
    for s in (small, large):
        s.eval(PROMPT[:4])
    save_session(small, fp, tmp_path / "small")
    save_session(large, fp, tmp_path / "large")
    # the two differ only in the header's n_ctx and layer_capacities, not in array bytes
    assert abs(os.path.getsize(tmp_path / "small") - os.path.getsize(tmp_path / "large")) < 64


def test_an_empty_session_saves_and_loads(tiny_model, tmp_path):
    # found by test_interrupts.py: a session holding no tokens (every array empty) made
    # save_session raise TypeError from memoryview.cast
    model = load(tiny_model())
    fp = model_fingerprint(model)
    full, empty = model.session(n_ctx=32), model.session(n_ctx=32)
    save_session(empty, fp, tmp_path / "empty")
    full.eval(PROMPT[:4])
    load_session(full, fp, tmp_path / "empty")
    assert full.tokens == [] and full.cache.n_tokens == 0
    full.eval(PROMPT[:4])
    empty.eval(PROMPT[:4])
    np.testing.assert_array_equal(full.logits, empty.logits)


# -- refusals ------------------------------------------------------------------------------


def test_full_layers_that_disagree_on_slots_are_refused(tiny_model, tmp_path):
    # a session never writes such a file; a hand-made one would let the next reservation
    # overwrite live slots of the layers that differ
    model = load(tiny_model())
    fp = model_fingerprint(model)
    s = model.session(n_ctx=64)
    s.eval(PROMPT[:6])
    s.cache.pos[1][[0, 1]] = s.cache.pos[1][[1, 0]]  # layer 1: two positions swapped
    save_session(s, fp, tmp_path / "bad")
    fresh = model.session(n_ctx=64)
    with pytest.raises(StateFileError) as err:
        load_session(fresh, fp, tmp_path / "bad")
    assert err.value.field == "positions.1" and fresh.n_tokens == 0


@pytest.fixture(scope="module")
def saved_state(tiny_model, tmp_path_factory):
    """A state file of the default tiny model, n_ctx=64, f16 cache, holding PROMPT."""
    model = load(tiny_model())
    s = model.session(n_ctx=64)
    s.eval(PROMPT)
    file = tmp_path_factory.mktemp("state") / "good.ekvs"
    save_session(s, model_fingerprint(model), file)
    return file


def _damage(data: bytes, how: str) -> bytes:
    if how == "truncated":
        return data[: len(data) - 100]
    if how == "flipped":  # one byte in the middle of the array data
        header_nbytes = int.from_bytes(data[8:16], "little")
        at = 24 + header_nbytes + (len(data) - 24 - header_nbytes - 32) // 2
        return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]
    if how == "magic":
        return b"GGUF" + data[4:]
    if how == "version":
        return data[:4] + (2).to_bytes(4, "little") + data[8:]
    return data


# name -> (which model, session kwargs, damage, the field the error must name)
REFUSALS = {
    "other model": (dict(seed=1), dict(n_ctx=64), None, "model_fingerprint"),
    "other n_ctx": (dict(), dict(n_ctx=32), None, "n_ctx"),
    "other cache type": (dict(), dict(n_ctx=64, cache_type_k="bf16"), None, "cache_type_k"),  # same row bytes as f16
    "truncated file": (dict(), dict(n_ctx=64), "truncated", "size"),
    "flipped byte": (dict(), dict(n_ctx=64), "flipped", "checksum"),
    "bad magic": (dict(), dict(n_ctx=64), "magic", "magic"),
    "other version": (dict(), dict(n_ctx=64), "version", "version"),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_a_bad_state_is_refused_and_the_session_is_untouched(tiny_model, saved_state, tmp_path, name):
    model_kw, session_kw, damage, field = REFUSALS[name]
    model = load(tiny_model(**model_kw))
    file = tmp_path / "state.ekvs"
    file.write_bytes(_damage(saved_state.read_bytes(), damage))
    target, control = model.session(**session_kw), model.session(**session_kw)
    for s in (target, control):
        s.eval([5, 6, 7])
    with pytest.raises(StateFileError) as info:
        load_session(target, model_fingerprint(model), file)
    assert info.value.field == field
    assert field in str(info.value)
    assert target.tokens == control.tokens == [5, 6, 7]
    tokens, logits = greedy(target)
    control_tokens, control_logits = greedy(control)
    assert tokens == control_tokens
    np.testing.assert_array_equal(logits, control_logits)


def test_the_error_names_both_values(tiny_model, saved_state):
    model = load(tiny_model())
    with pytest.raises(StateFileError, match=r"n_ctx=64.*n_ctx=32"):
        load_session(model.session(n_ctx=32), model_fingerprint(model), saved_state)


def test_the_fingerprint_tells_models_apart(tiny_model):
    a, a_again, b = load(tiny_model()), load(tiny_model()), load(tiny_model(seed=1))
    assert model_fingerprint(a) == model_fingerprint(a_again) != model_fingerprint(b)


# -- atomic writes -------------------------------------------------------------------------


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tiny_model, tmp_path, monkeypatch):
    model = load(tiny_model())
    fp = model_fingerprint(model)
    s = model.session(n_ctx=64)
    s.eval(PROMPT[:3])
    file = tmp_path / "state.ekvs"
    save_session(s, fp, file)
    old = file.read_bytes()
    s.eval(PROMPT[3:])

    def broken_fsync(fd):  # the disk fails after part of the new file was written
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(state_mod.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space"):
        save_session(s, fp, file)
    assert file.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.ekvs"]


def test_writing_into_a_missing_directory_raises_and_leaves_nothing(tiny_model, tmp_path):
    model = load(tiny_model())
    s = model.session(n_ctx=64)
    s.eval(PROMPT[:3])
    with pytest.raises(OSError):
        save_session(s, model_fingerprint(model), tmp_path / "missing" / "state.ekvs")
    assert list(tmp_path.iterdir()) == []


def test_writing_where_no_file_can_be_made_raises_and_leaves_nothing(tiny_model, tmp_path):
    # a path under a regular file can be created by no user, root included (ENOTDIR)
    model = load(tiny_model())
    s = model.session(n_ctx=64)
    s.eval(PROMPT[:3])
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a folder")
    with pytest.raises(OSError):
        save_session(s, model_fingerprint(model), blocker / "state.ekvs")
    assert list(tmp_path.iterdir()) == [blocker] and blocker.read_bytes() == b"not a folder"


def test_the_file_starts_with_the_magic_and_holds_no_pickle(saved_state):
    data = saved_state.read_bytes()
    assert data[:4] == MAGIC
    header = json.loads(data[24 : 24 + int.from_bytes(data[8:16], "little")])
    assert header["tokens"] == PROMPT and header["n_tokens"] == len(PROMPT)
    assert {d["dtype"] for d in header["arrays"]} <= {"<i4", "<i8", "|u1", "<f4"}


# -- the facade and the command line ------------------------------------------------------


def test_llama_state_files(tiny_model, tmp_path):
    path = tiny_model()
    llm = Llama(path, n_ctx=64)
    llm.eval(PROMPT)
    llm.save_state_file(tmp_path / "s.ekvs")
    expected = llm.create_completion(PROMPT + [7], max_tokens=6, temperature=0.0)["choices"][0]["text"]
    other = Llama(path, n_ctx=64)
    other.load_state_file(tmp_path / "s.ekvs")
    assert other.input_ids.tolist() == PROMPT
    out = other.create_completion(PROMPT + [7], max_tokens=6, temperature=0.0)
    assert out["choices"][0]["text"] == expected
    assert out["usage"]["prompt_tokens"] == len(PROMPT) + 1
    with pytest.raises(StateFileError, match="n_ctx"):
        Llama(path, n_ctx=32).load_state_file(tmp_path / "s.ekvs")


def test_auto_context_takes_the_state_files_size(tiny_model, tmp_path):
    # a conversation that grew under n_ctx="auto" loads into a fresh "auto" Llama, which
    # starts smaller: the context takes the file's size instead of refusing it
    path = tiny_model(n_ctx=2048)
    long_prompt = (PROMPT * 20)[:300]
    llm = Llama(path)
    llm.create_completion(long_prompt, max_tokens=1, temperature=0.0)  # plans a context for 300+ tokens
    assert llm.n_ctx() > 256
    llm.save_state_file(tmp_path / "grown.ekvs")
    expected = llm.create_completion(long_prompt + [7], max_tokens=6, temperature=0.0)["choices"][0]["text"]
    fresh = Llama(path)
    fresh.create_completion(PROMPT[:3], max_tokens=1, temperature=0.0)
    assert fresh.n_ctx() < llm.n_ctx()
    fresh.load_state_file(tmp_path / "grown.ekvs")
    assert fresh.n_ctx() == llm.n_ctx() and fresh.input_ids.tolist()[:len(long_prompt)] == long_prompt
    out = fresh.create_completion(long_prompt + [7], max_tokens=6, temperature=0.0)
    assert out["choices"][0]["text"] == expected and out["usage"]["prompt_tokens"] == len(long_prompt) + 1
    other = Llama(path)
    other.create_completion(PROMPT[:3], max_tokens=1, temperature=0.0)
    kept = other.input_ids.tolist()
    with pytest.raises(StateFileError):  # a damaged file: refused, the conversation kept
        (tmp_path / "bad.ekvs").write_bytes((tmp_path / "grown.ekvs").read_bytes()[:-9])
        other.load_state_file(tmp_path / "bad.ekvs")
    assert other.input_ids.tolist() == kept


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_run_prompt_cache(tiny_model, tmp_path, capsys):
    model = str(tiny_model())
    cache = tmp_path / "prompt.ekvs"
    base = ["run", "-m", model, "-n", "6", "--temp", "0", "-c", "64"]
    short, long = "The quick brown", "The quick brown fox jumps over the lazy dog"

    rc, first, err = _run(capsys, *base, "-p", short, "--prompt-cache", str(cache))
    assert rc == 0 and cache.is_file() and "does not exist" in err
    assert first == _run(capsys, *base, "-p", short)[1]

    rc, out, err = _run(capsys, *base, "-p", long, "--prompt-cache", str(cache))
    n_short = len(Llama(model, n_ctx=64).tokenize(short.encode(), special=True))
    assert rc == 0 and f"{n_short} of " in err and "reused" in err
    assert out == _run(capsys, *base, "-p", long)[1]

    # the cache now holds the long prompt: an equal prompt evaluates nothing
    rc, again, err = _run(capsys, *base, "-p", long, "--prompt-cache", str(cache))
    assert rc == 0 and again == out and "prompt eval: 0 tokens" in err


def test_run_prompt_cache_from_another_model_warns_and_evaluates(tiny_model, tmp_path, capsys):
    model, other = str(tiny_model()), str(tiny_model(seed=1))
    cache = tmp_path / "prompt.ekvs"
    base = ["-n", "4", "--temp", "0", "-c", "64", "-p", "The quick brown fox"]
    assert _run(capsys, "run", "-m", other, *base, "--prompt-cache", str(cache))[0] == 0
    rc, out, err = _run(capsys, "run", "-m", model, *base, "--prompt-cache", str(cache))
    assert rc == 0
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "model_fingerprint" in warnings[0]
    assert out == _run(capsys, "run", "-m", model, *base)[1]
    Llama(model, n_ctx=64).load_state_file(cache)  # replaced by this model's state
