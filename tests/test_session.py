"""Tests for edgekv/session.py's snapshots (`Session.snapshot` / `Session.restore`) on tiny
random models: a restored session is bit-identical to the one snapshotted, and a state that
does not fit is refused without touching the session."""

from __future__ import annotations

import numpy as np
import pytest

from edgekv.errors import EdgeKVError
from edgekv.loader import load

PROMPT = [5, 17, 42, 3, 99, 7, 64, 12, 8, 30]
OTHER = [2, 77, 51, 9, 14, 33]


def greedy(session, n: int) -> tuple[list[int], list[np.ndarray]]:
    """n greedy tokens after the session's last logits, and the logits that chose each."""
    tokens, logits = [], []
    for _ in range(n):
        logits.append(session.logits.copy())
        tokens.append(int(np.argmax(logits[-1])))
        session.eval(tokens[-1:])
    return tokens, logits


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_restore_gives_identical_logits_and_continuation(tiny_model, arch):
    s = load(tiny_model(arch)).session(n_ctx=64, n_batch=4)
    s.eval(PROMPT)
    state = s.snapshot()
    assert state.tokens == tuple(PROMPT) and state.n_tokens == len(PROMPT) and state.n_ctx == 64
    assert not state.k[0].flags.writeable and not state.logits.flags.writeable
    first_tokens, first_logits = greedy(s, 6)

    s.reset()
    s.eval(OTHER)  # overwrites the slots the snapshot's tokens used
    for _ in range(2):  # restoring must not let the session write into the state
        s.restore(state)
        assert s.tokens == PROMPT and s.n_tokens == s.cache.n_tokens == len(PROMPT)
        tokens, logits = greedy(s, 6)
        assert tokens == first_tokens
        for ours, theirs in zip(logits, first_logits):
            np.testing.assert_array_equal(ours, theirs)


def test_state_before_any_evaluation_has_no_logits(tiny_model):
    model = load(tiny_model("llama"))
    empty = model.session(n_ctx=32).snapshot()
    assert empty.logits is None and empty.tokens == () and empty.n_tokens == 0
    s = model.session(n_ctx=32)
    s.eval(PROMPT)
    s.restore(empty)
    assert s.n_tokens == s.cache.n_tokens == 0
    with pytest.raises(EdgeKVError, match="no logits"):
        s.logits  # noqa: B018


def test_state_of_another_n_ctx_is_refused_and_the_session_still_works(tiny_model):
    model = load(tiny_model("llama"))
    big = model.session(n_ctx=64, n_batch=4)
    big.eval(OTHER)
    s, twin = model.session(n_ctx=32, n_batch=4), model.session(n_ctx=32, n_batch=4)
    s.eval(PROMPT[:6])
    twin.eval(PROMPT[:6])
    before = s.logits.copy()

    with pytest.raises(EdgeKVError, match="n_ctx=64.*n_ctx=32"):
        s.restore(big.snapshot())
    assert s.tokens == PROMPT[:6] and s.cache.n_tokens == 6
    np.testing.assert_array_equal(s.logits, before)
    s.eval(PROMPT[6:])  # continues exactly like a session that never saw the foreign state
    twin.eval(PROMPT[6:])
    np.testing.assert_array_equal(s.logits, twin.logits)


def test_state_of_another_model_names_the_mismatch(tiny_model):
    llama = load(tiny_model("llama")).session(n_ctx=32)
    llama.eval(PROMPT)
    gemma = load(tiny_model("gemma3")).session(n_ctx=32)
    with pytest.raises(EdgeKVError, match="n_layers=2 into a session with n_layers=7"):
        gemma.restore(llama.snapshot())
    assert gemma.n_tokens == 0


def test_asking_the_same_prompt_again_gives_its_first_logits(tiny_model):
    # the prompt (a 70-token chunk: the batch kernels) is followed by generated tokens; asked
    # again, the session drops those and gives back the prompt's logits as computed the first
    # time, bit for bit, without replaying its last token through the one-token kernels (whose
    # last bits differ on CPUs without int8 dot products); a fresh session agrees
    prompt = (PROMPT * 7)[:70]
    s = load(tiny_model(weight_type="Q4_0")).session(n_ctx=128)
    s.prefill(prompt)
    first = s.logits.copy()
    greedy(s, 5)
    evaluated = s.n_evaluated
    s.prefill(prompt)
    assert s.n_evaluated == evaluated and s.tokens == prompt
    np.testing.assert_array_equal(s.logits, first)
    fresh = load(tiny_model(weight_type="Q4_0")).session(n_ctx=128)
    fresh.prefill(prompt)
    np.testing.assert_array_equal(fresh.logits, first)
    s.truncate(40)  # below the remembered end: the next ask evaluates again
    s.prefill(prompt)
    assert s.n_evaluated == evaluated + 30
