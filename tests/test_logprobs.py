"""Tests for edgekv/logprobs.py and the `logprobs` options of Llama.create_completion and
create_chat_completion, on a tiny random model (edgekv/testing/tiny_model.py)."""

from __future__ import annotations

import numpy as np
import pytest

from edgekv import EdgeKVError, Llama
from edgekv.api.logprobs import LogprobRecorder, log_softmax
from helpers.facade import BAN, CHUNKING_ATOL, TEXT, no_eog, spanning_stop

from edgekv.testing import tiny_model as mtm  # noqa: E402
CHAT = [{"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = mtm.make_tiny_model(tmp_path_factory.mktemp("tiny") / "llama.gguf", arch="llama")
    return Llama(str(path), n_ctx=128)


def ref_log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - (np.max(x) + np.log(np.sum(np.exp(x - np.max(x)))))


def test_log_softmax_matches_reference():
    x = (5 * np.random.default_rng(0).standard_normal(1000)).astype(np.float32)
    np.testing.assert_allclose(log_softmax(x), ref_log_softmax(x), rtol=0, atol=1e-12)
    assert abs(np.exp(log_softmax(x)).sum() - 1) < 1e-12


def test_recorder_releases_records_as_their_text_is_emitted():
    pieces = {1: b"ab", 2: b"c", 3: b"", 4: b"de"}
    rec = LogprobRecorder(lambda ids, prev: pieces[ids[0]], n_top=2, prev_token=None)  # text: bytes decoded
    for token in (1, 2, 3, 4):
        rec.add(token, np.zeros(5, np.float32))
    assert [r.start for r in rec.records] == [0, 2, 3, 3]
    assert [r.token for r in rec.release(1)] == [1]
    assert rec.release(1) == []
    assert [r.token for r in rec.release(3)] == [2]  # 3 and 4 start at 3: not yet emitted
    assert [r.token for r in rec.release(None)] == [3, 4]
    assert all(len(r.top) == 2 and r.logprob == pytest.approx(-np.log(5)) for r in rec.records)


def test_completion_logprobs_shape_and_values(llm):
    bias = no_eog(llm)
    out = llm(TEXT, max_tokens=6, temperature=0.0, logprobs=3, logit_bias=bias)
    choice = out["choices"][0]
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "text_offset", "token_logprobs", "top_logprobs"}
    assert len(lp["tokens"]) == out["usage"]["completion_tokens"] == 6
    assert "".join(lp["tokens"]) == choice["text"]
    prompt_len = len(llm.detokenize(llm.tokenize(TEXT, special=True)).decode())
    assert lp["text_offset"] == [prompt_len + len("".join(lp["tokens"][:i])) for i in range(6)]
    for token, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert 1 <= len(top) <= 4 and top[token] == logprob  # tokens with equal text share a key
        assert logprob == pytest.approx(max(top.values()))  # greedy takes the most likely
    # the first token's log-probs: log-softmax of the prompt's logits plus the bias
    probe = Llama(llm.model_path, n_ctx=128)
    probe.eval(llm.tokenize(TEXT, special=True))
    logits = probe.scores[-1].copy()
    for token, value in bias.items():
        logits[token] += value
    expected = ref_log_softmax(logits)
    assert lp["token_logprobs"][0] == pytest.approx(expected.max(), abs=CHUNKING_ATOL)
    top3 = np.sort(expected)[::-1][:3]
    assert all(np.min(np.abs(top3 - v)) < CHUNKING_ATOL for v in lp["top_logprobs"][0].values())


def test_logprobs_ignore_temperature(llm):
    kwargs = dict(max_tokens=1, logprobs=True, top_logprobs=5, logit_bias=no_eog(llm), top_k=0, top_p=1.0, min_p=0.0)
    cold = llm.create_chat_completion(CHAT, temperature=0.0, **kwargs)["choices"][0]["logprobs"]["content"][0]
    hot = llm.create_chat_completion(CHAT, temperature=2.0, seed=5, **kwargs)["choices"][0]["logprobs"]["content"][0]
    assert hot["top_logprobs"] == cold["top_logprobs"]
    assert llm(TEXT, max_tokens=1)["choices"][0]["logprobs"] is None


def test_streamed_logprobs_add_up_to_the_whole(llm):
    kwargs = dict(max_tokens=12, temperature=0.9, seed=4, logprobs=2, logit_bias=no_eog(llm))
    whole = llm(TEXT, **kwargs)["choices"][0]["logprobs"]
    chunks = list(llm(TEXT, stream=True, **kwargs))
    joined = {key: [] for key in whole}
    for chunk in chunks:
        for key, values in (chunk["choices"][0]["logprobs"] or {}).items():
            joined[key] += values
    # the second call re-evaluates the prompt's last token alone: logits agree to CHUNKING_ATOL
    assert joined["tokens"] == whole["tokens"] and joined["text_offset"] == whole["text_offset"]
    assert joined["token_logprobs"] == pytest.approx(whole["token_logprobs"], abs=CHUNKING_ATOL)
    assert [list(d) for d in joined["top_logprobs"]] == [list(d) for d in whole["top_logprobs"]]


def test_logprobs_stop_at_a_spanning_stop_string(llm):
    kwargs = dict(max_tokens=40, temperature=0.0, logit_bias=no_eog(llm))
    gen = llm.generate(llm.tokenize(TEXT, special=True), temp=0.0, logit_bias=no_eog(llm))
    tokens = [next(gen) for _ in range(40)]
    gen.close()
    stop = spanning_stop(llm, tokens)
    for stream in (False, True):
        out = llm(TEXT, stop=stop, logprobs=1, stream=stream, **kwargs)
        chunks = list(out) if stream else [out]
        text = "".join(c["choices"][0]["text"] for c in chunks)
        got = [t for c in chunks for t in (c["choices"][0]["logprobs"] or {}).get("tokens", [])]
        # the tokens that make up the text, up to the one the stop string starts in, no more
        assert "".join(got).startswith(text) and len("".join(got[:-1])) < len(text)
        assert stop not in text and len("".join(got)) < len(text) + len(stop)


def test_chat_logprobs(llm):
    kwargs = dict(max_tokens=5, temperature=0.0, logit_bias=no_eog(llm))
    out = llm.create_chat_completion(CHAT, logprobs=True, top_logprobs=2, **kwargs)
    lp = out["choices"][0]["logprobs"]
    content = lp["content"]
    assert len(content) == out["usage"]["completion_tokens"] == 5
    assert "".join(e["token"] for e in content) == out["choices"][0]["message"]["content"]
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        if "\ufffd" not in entry["token"]:  # a whole character (or several)
            assert bytes(entry["bytes"]).decode("utf-8") == entry["token"]
        top = entry["top_logprobs"]
        assert len(top) == 2 and top[0]["logprob"] >= top[1]["logprob"]
        assert entry["logprob"] == pytest.approx(top[0]["logprob"]) and entry["bytes"] == top[0]["bytes"]
        assert all(set(t) == {"token", "logprob", "bytes"} for t in top)
    chunks = list(llm.create_chat_completion(CHAT, logprobs=True, top_logprobs=2, stream=True, **kwargs))
    streamed = [e for c in chunks for e in (c["choices"][0]["logprobs"] or {}).get("content", [])]
    assert [(e["token"], e["bytes"]) for e in streamed] == [(e["token"], e["bytes"]) for e in content]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in content], abs=CHUNKING_ATOL)
    plain = llm.create_chat_completion(CHAT, logprobs=True, **kwargs)["choices"][0]["logprobs"]["content"]
    assert all(e["top_logprobs"] == [] for e in plain) and len(plain) == 5
    assert llm.create_chat_completion(CHAT, **kwargs)["choices"][0]["logprobs"] is None


def test_bad_logprobs_options_raise(llm):
    with pytest.raises(EdgeKVError, match="top_logprobs"):
        llm.create_chat_completion(CHAT, top_logprobs=2)
    with pytest.raises(EdgeKVError, match="logprobs"):
        llm(TEXT, logprobs=-1)
    with pytest.raises(EdgeKVError, match="echo"):
        llm(TEXT, logprobs=1, echo=True)
    banned = llm(TEXT, max_tokens=2, logprobs=0, logit_bias={**no_eog(llm), 7: BAN})
    assert all(top == {tok: lp} for tok, lp, top in zip(*(banned["choices"][0]["logprobs"][k] for k in
                                                          ("tokens", "token_logprobs", "top_logprobs"))))
