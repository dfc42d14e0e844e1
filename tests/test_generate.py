"""Tests for edgekv/generate.py: `stream_generate` against a hand-written greedy loop on a
tiny model (the loop the README used to spell out)."""

from __future__ import annotations

import numpy as np
import pytest

import edgekv
from edgekv.generate import GenerationStep, stream_generate
from edgekv.loader import load
from edgekv.text.tokenizer import decode_utf8_like_llama

PROMPT = [5, 17, 42, 3, 99, 7]


def hand_written(model, prompt, n, bias):
    """Greedy decoding by hand: (ids, log-probs of each chosen id under the biased logits)."""
    s = model.session(n_ctx=64)
    s.eval(prompt)
    ids, logprobs = [], []
    for _ in range(n):
        z = s.logits.astype(np.float64)
        z[list(bias)] += list(bias.values())
        ids.append(int(np.argmax(z)))
        logprobs.append(float(z[ids[-1]] - z.max() - np.log(np.exp(z - z.max()).sum())))
        s.eval(ids[-1:])
    return ids, logprobs


@pytest.fixture(params=["llama", "gemma3"])
def model(request, tiny_model):
    return load(tiny_model(request.param))


def test_steps_follow_the_greedy_loop(model):
    no_end = {t: -1e9 for t in model.tokenizer.eog_ids}
    steps = list(stream_generate(model, model.session(n_ctx=64), PROMPT, max_tokens=10, temperature=0.0,
                                 logit_bias=no_end, logprobs=True))
    ids, logprobs = hand_written(model, PROMPT, 10, no_end)
    assert all(isinstance(step, GenerationStep) for step in steps)
    assert [step.token for step in steps] == ids
    np.testing.assert_allclose([step.logprob for step in steps], logprobs, rtol=0, atol=1e-6)
    assert "".join(step.text for step in steps) == decode_utf8_like_llama(model.tokenizer.decode(ids, skip_special=True))
    assert [step.finish_reason for step in steps] == [None] * 9 + ["length"]
    assert [step.generation_tokens for step in steps] == list(range(1, 11))
    assert {step.prompt_tokens for step in steps} == {len(PROMPT)}
    assert all(step.generation_tps > 0 and step.prompt_tps > 0 for step in steps)


def test_an_end_token_stops_and_ignore_eos_goes_on(model):
    eos = next(iter(model.tokenizer.eog_ids))
    steps = list(stream_generate(model, model.session(n_ctx=64), PROMPT, max_tokens=10, temperature=0.0,
                                 logit_bias={eos: 100.0}))
    assert [(s.token, s.text, s.finish_reason) for s in steps] == [(eos, "", "stop")]
    steps = list(stream_generate(model, model.session(n_ctx=64), PROMPT, max_tokens=10, temperature=0.0,
                                 logit_bias={eos: 100.0}, ignore_eos=True))
    assert len(steps) == 10 and not {s.token for s in steps} & model.tokenizer.eog_ids
    assert steps[-1].finish_reason == "length"


def test_a_session_continues_and_reuses_its_prefix(model):
    s = model.session(n_ctx=64)
    first = list(stream_generate(model, s, PROMPT, max_tokens=4, temperature=0.0))
    assert first[0].prompt_tokens == len(PROMPT) and first[0].logprob is None  # log-probs only on request
    longer = PROMPT + [f.token for f in first] + [11, 12]
    second = list(stream_generate(model, s, longer, max_tokens=2, temperature=0.0))
    assert second[0].prompt_tokens == 3  # the last 3 ids: 2 new + the unevaluated last answer token


def test_exported_at_the_top():
    assert edgekv.stream_generate is stream_generate and edgekv.GenerationStep is GenerationStep
