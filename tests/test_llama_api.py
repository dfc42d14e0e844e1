"""Tests for edgekv/api/facade.py, the llama-cpp-python-compatible facade, on tiny random models
written by edgekv/testing/tiny_model.py (llama: GPT-2 BPE + ChatML; gemma3: SPM + Gemma turns)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import edgekv.api.completions as completions_module
from edgekv import ContextFullError, EdgeKVError, Llama

from edgekv.testing import tiny_model as mtm  # noqa: E402
from helpers.facade import CHUNKING_ATOL, TEXT, no_eog, spanning_stop


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {arch: str(mtm.make_tiny_model(root / f"{arch}.gguf", arch=arch)) for arch in ("llama", "gemma3")}


@pytest.fixture(params=["llama", "gemma3"])
def arch(request):
    return request.param


@pytest.fixture
def llm(tiny_paths, arch):
    return Llama(tiny_paths[arch], n_ctx=128)


def test_ignore_eos_generates_through_the_end_tokens(llm):
    """ignore_eos: an end token that would be chosen first is never sampled; the text is the
    one generated with every end token banned by logit_bias, and runs to max_tokens."""
    first = {t: 100.0 for t in llm.tokenizer_.eog_ids | set(llm.chat_formatter.stop_token_ids)}
    ended = llm(TEXT, max_tokens=12, temperature=0.0, logit_bias=first)
    assert ended["choices"][0]["finish_reason"] == "stop" and ended["usage"]["completion_tokens"] == 0
    long = llm(TEXT, max_tokens=12, temperature=0.0, logit_bias=first, ignore_eos=True)
    banned = llm(TEXT, max_tokens=12, temperature=0.0, logit_bias=no_eog(llm))
    assert long["choices"][0]["finish_reason"] == "length" and long["usage"]["completion_tokens"] == 12
    assert long["choices"][0]["text"] == banned["choices"][0]["text"]
    chat = [{"role": "user", "content": TEXT}]
    long = llm.create_chat_completion(chat, max_tokens=12, temperature=0.0, logit_bias=first, ignore_eos=True)
    banned = llm.create_chat_completion(chat, max_tokens=12, temperature=0.0, logit_bias=no_eog(llm))
    assert long["usage"]["completion_tokens"] == 12
    assert long["choices"][0]["message"]["content"] == banned["choices"][0]["message"]["content"]


def test_construction_and_model_facts(tiny_paths, arch):
    llm = Llama(tiny_paths[arch], n_ctx=64, n_threads=1, n_gpu_layers=0, verbose=False)
    assert llm.n_ctx() == 64 and llm.n_tokens == 0
    assert llm.n_vocab() == llm.tokenizer_.n_vocab
    assert llm.token_bos() == llm.tokenizer_.bos_id and llm.token_eos() == llm.tokenizer_.eos_id
    assert llm.metadata["general.architecture"] == arch
    assert Llama(tiny_paths[arch]).n_ctx() == 256  # "auto": the trained context (below 4096)
    assert llm.scores.shape == (0, llm.n_vocab())
    with pytest.raises(TypeError, match="flux_capacitor"):
        Llama(tiny_paths[arch], flux_capacitor=1)
    with pytest.raises(EdgeKVError, match="n_ctx"):
        Llama(tiny_paths[arch], n_ctx=-5)
    with pytest.raises(EdgeKVError, match="chat_format"):
        Llama(tiny_paths[arch], chat_format="alpaca")


def test_tokenize_detokenize_round_trip(llm):
    ids = llm.tokenize(TEXT.encode())
    assert isinstance(ids, list) and all(type(t) is int for t in ids)
    assert isinstance(llm.detokenize(ids), bytes)
    marker = llm.chat_formatter.stop_token_ids[0]  # a control token; its text is parsed only when special
    marker_text = llm.detokenize([marker], special=True)
    assert llm.tokenize(marker_text, add_bos=False, special=True) == [marker]
    assert marker not in llm.tokenize(marker_text, add_bos=False)
    assert ids == llm.tokenize(TEXT)
    assert llm.detokenize(ids) == TEXT.encode()
    bos = llm.token_bos()
    assert (ids[0] == bos) == llm.tokenizer_.add_bos
    assert llm.tokenize(TEXT, add_bos=False) == [t for t in ids if t != bos or not llm.tokenizer_.add_bos]
    head, tail = ids[:5], ids[5:]
    assert llm.detokenize(head) + llm.detokenize(tail, prev_tokens=head) == TEXT.encode()


def test_generate_is_deterministic_for_a_seed(tiny_paths, arch):
    def run(seed, n=12):
        llm = Llama(tiny_paths[arch], n_ctx=64, seed=seed)
        out = []
        for token in llm.generate(llm.tokenize(TEXT), temp=1.0, top_k=0, top_p=1.0, min_p=0.0):
            out.append(token)
            if len(out) == n:
                return out, llm

    a, llm = run(7)
    assert run(7)[0] == a and run(8)[0] != a
    assert llm.n_tokens == len(llm.tokenize(TEXT)) + len(a) - 1  # the last token was never evaluated


def test_greedy_generate_follows_argmax(llm):
    ids = llm.tokenize(TEXT)
    gen = llm.generate(ids, temp=0.0)
    tokens = [next(gen) for _ in range(4)]
    gen.close()
    probe = Llama(llm.model_path, n_ctx=128)
    expected = []
    for token in tokens:
        probe.eval(ids + expected if not expected else [expected[-1]])
        expected.append(int(np.argmax(probe.scores[-1])))
    assert tokens == expected


def test_completion_dict_and_usage(llm):
    out = llm("The quick", max_tokens=6, temperature=0.0, logit_bias=no_eog(llm))
    assert set(out) == {"id", "object", "created", "model", "choices", "usage"}
    assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")
    (choice,) = out["choices"]
    assert choice["finish_reason"] == "length" and choice["index"] == 0
    n_prompt = len(llm.tokenize("The quick", special=True))
    assert out["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 6, "total_tokens": n_prompt + 6}
    generated = llm.input_ids[n_prompt:].tolist()  # 5 evaluated + the last one sampled
    gen = llm.generate(llm.tokenize("The quick", special=True), temp=0.0, logit_bias=no_eog(llm))
    tokens = [next(gen) for _ in range(6)]
    gen.close()
    assert tokens[:5] == generated
    assert choice["text"] == llm.detokenize(tokens).decode("utf-8", errors="replace")
    echoed = llm("The quick", max_tokens=2, temperature=0.0, echo=True)
    assert echoed["choices"][0]["text"].startswith("The quick")


def test_prefix_reuse_evaluates_only_new_tokens(llm):
    llm("The quick brown fox", max_tokens=3, temperature=0.0)
    llm("The quick brown fox", max_tokens=3, temperature=0.0)
    assert llm.last_stats.prompt_eval_tokens == 0  # its logits are kept from its first evaluation
    llm("The quick brown fox jumps", max_tokens=1, temperature=0.0)
    n_new = len(llm.tokenize("The quick brown fox jumps", special=True)) - len(
        llm.tokenize("The quick brown fox", special=True))
    assert 1 <= llm.last_stats.prompt_eval_tokens <= n_new + 1


def test_stop_string_spanning_tokens(llm):
    kwargs = dict(max_tokens=40, temperature=0.0, logit_bias=no_eog(llm))
    full = llm(TEXT, **kwargs)["choices"][0]["text"]
    gen = llm.generate(llm.tokenize(TEXT, special=True), temp=0.0, logit_bias=no_eog(llm))
    tokens = [next(gen) for _ in range(40)]
    gen.close()
    stop = spanning_stop(llm, tokens)
    out = llm(TEXT, stop=["never-there", stop], **kwargs)
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["choices"][0]["text"] == full[: full.find(stop)]
    streamed = "".join(c["choices"][0]["text"] for c in llm(TEXT, stop=stop, stream=True, **kwargs))
    assert streamed == full[: full.find(stop)]


def test_streaming_concatenates_to_the_non_streaming_text(llm):
    kwargs = dict(max_tokens=20, temperature=0.9, seed=3)
    whole = llm(TEXT, **kwargs)
    chunks = list(llm(TEXT, stream=True, **kwargs))
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks][:-1] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]


def test_streaming_never_splits_a_utf8_character(llm):
    # every byte token may come out; each chunk must still be whole characters
    kwargs = dict(max_tokens=60, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=1)
    for chunk in llm(TEXT, stream=True, **kwargs):
        text = chunk["choices"][0]["text"]
        assert text.encode("utf-8").decode("utf-8") == text


def test_chat_completion(llm):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    out = llm.create_chat_completion(messages, max_tokens=8, temperature=0.0)
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    message = out["choices"][0]["message"]
    assert message["role"] == "assistant" and isinstance(message["content"], str)
    assert out["usage"]["prompt_tokens"] == len(llm.chat_formatter.encode(messages))
    chunks = list(llm.create_chat_completion(messages, max_tokens=8, temperature=0.0, stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-1]["choices"][0]["finish_reason"] == out["choices"][0]["finish_reason"]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == message["content"]


def test_chat_stops_at_the_turn_end_token(llm):
    turn_end = llm.chat_formatter.stop_token_ids[0]
    out = llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0.0,
                                     logit_bias={turn_end: 1e9})
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["choices"][0]["message"]["content"] == "" and out["usage"]["completion_tokens"] == 0


@pytest.mark.parametrize("max_tokens", [None, 0, -1])
def test_max_tokens_none_or_below_one_fills_the_context(tiny_paths, arch, max_tokens):
    llm = Llama(tiny_paths[arch], n_ctx=24)
    out = llm("The quick", max_tokens=max_tokens, temperature=0.0, logit_bias=no_eog(llm))
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["total_tokens"] == 24


def test_context_full_error_leaves_the_object_usable(tiny_paths, arch):
    llm = Llama(tiny_paths[arch], n_ctx=16)
    llm("Hello", max_tokens=2, temperature=0.0)
    before = llm.input_ids.copy()
    with pytest.raises(ContextFullError) as info:
        llm(TEXT * 3, max_tokens=2)
    assert info.value.n_ctx == 16 and info.value.n_tokens == len(llm.tokenize(TEXT * 3, special=True))
    np.testing.assert_array_equal(llm.input_ids, before)
    with pytest.raises(ContextFullError):
        llm.create_chat_completion([{"role": "user", "content": TEXT * 3}])
    out = llm("Hello", max_tokens=3, temperature=0.0)
    assert out["usage"]["prompt_tokens"] == len(llm.tokenize("Hello"))


def test_logits_all_scores(tiny_paths, arch):
    ids = Llama(tiny_paths[arch], n_ctx=64).tokenize(TEXT)
    full = Llama(tiny_paths[arch], n_ctx=64, n_batch=4, logits_all=True)  # several chunks
    full.eval(ids[:7])
    full.eval(ids[7:])
    assert full.scores.shape == (len(ids), full.n_vocab())
    last = Llama(tiny_paths[arch], n_ctx=64)
    for n in (1, 5, len(ids)):
        last.reset()
        last.eval(ids[:n])
        assert last.scores.shape == (1, last.n_vocab())
        np.testing.assert_allclose(full.scores[n - 1], last.scores[0], rtol=0, atol=CHUNKING_ATOL)
    full.reset()
    assert full.scores.shape == (0, full.n_vocab())


def test_save_and_load_state(llm):
    ids = llm.tokenize(TEXT)
    llm.eval(ids)
    state = llm.save_state()

    def greedy_continuation():
        gen = llm.generate([], temp=0.0, reset=False)
        tokens = [next(gen) for _ in range(5)]
        gen.close()
        return tokens

    first = greedy_continuation()
    llm("Something else entirely", max_tokens=4)
    llm.load_state(state)
    assert llm.n_tokens == len(ids) and llm.input_ids.tolist() == ids
    assert greedy_continuation() == first
    llm.reset()
    with pytest.raises(EdgeKVError, match="context"):
        Llama(llm.model_path, n_ctx=32).load_state(state)


def test_unsupported_options_raise(llm):
    with pytest.raises(EdgeKVError, match="suffix"):
        llm("Hi", suffix="!")
    with pytest.raises(EdgeKVError, match="mirostat"):
        llm("Hi", mirostat_mode=2)
    with pytest.raises(EdgeKVError, match="tools"):
        llm.create_chat_completion([{"role": "user", "content": "Hi"}], tools=[{"type": "function"}])


def test_stopping_criteria_and_sent_tokens(llm):
    calls = []

    def after_three(input_ids, logits):
        calls.append((len(input_ids), logits.shape))
        return len(calls) > 3

    out = llm("The quick", max_tokens=10, temperature=0.0, stopping_criteria=after_three, logit_bias=no_eog(llm))
    assert out["choices"][0]["finish_reason"] == "stop" and out["usage"]["completion_tokens"] == 3
    assert calls[0][1] == (llm.n_vocab(),)
    ids = llm.tokenize("The quick")
    gen = llm.generate(ids, temp=0.0)
    first = next(gen)
    gen.send([5, 6])  # evaluated after `first`
    gen.close()
    assert llm.input_ids.tolist() == ids + [first, 5, 6]


CHAT = [{"role": "user", "content": "Hi there"}]


def test_response_fields(llm):
    before = int(time.time())
    for out in (llm("Hi", max_tokens=2), llm.create_chat_completion(CHAT, max_tokens=2, model="my-model")):
        assert before <= out["created"] <= time.time() and isinstance(out["id"], str)
        usage = out["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] and usage["prompt_tokens"] > 0
    assert out["model"] == "my-model" and llm("Hi", max_tokens=1)["model"] == llm.model_path
    chunks = list(llm.create_chat_completion(CHAT, max_tokens=2, stream=True))
    assert all(c["object"] == "chat.completion.chunk" and "usage" not in c for c in chunks)


def test_sampling_options_reach_the_sampler(llm, monkeypatch):
    seen = []
    real = completions_module.sampler_for
    monkeypatch.setattr(completions_module, "sampler_for", lambda **kw: seen.append(kw) or real(**kw))
    options = dict(top_p=0.9, min_p=0.1, top_k=7, repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.4,
                   logit_bias={3: 1.0})
    llm("Hi", max_tokens=1, temperature=0.7, seed=11, repeat_last_n=5, **options)
    llm.create_chat_completion(CHAT, max_tokens=1, temperature=0.7, seed=11, repeat_last_n=5, **options)
    expected = dict(options, temp=0.7, seed=11, repeat_last_n=5)
    assert [{k: kw[k] for k in expected} for kw in seen] == [expected, expected]


def test_completion_seed(llm):
    kwargs = dict(max_tokens=8, temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, logit_bias=no_eog(llm))
    first = llm(TEXT, seed=1, **kwargs)["choices"][0]["text"]
    assert llm(TEXT, seed=1, **kwargs)["choices"][0]["text"] == first
    assert any(llm(TEXT, seed=s, **kwargs)["choices"][0]["text"] != first for s in (2, 3, 4))
    chat = [llm.create_chat_completion(CHAT, seed=5, **kwargs)["choices"][0]["message"]["content"] for _ in range(2)]
    assert chat[0] == chat[1]


@pytest.mark.parametrize("key", [int, str])  # OpenAI clients send the ids as strings
def test_logit_bias_forces_a_token(llm, key):
    prompt = llm.tokenize(TEXT, special=True)
    token = llm.tokenize("fox", add_bos=False)[0]
    out = llm(TEXT, max_tokens=4, temperature=1.0, seed=2, logit_bias={key(token): 1e9})
    assert out["usage"]["completion_tokens"] == 4 and llm.input_ids[len(prompt):].tolist() == [token] * 3
    assert out["choices"][0]["text"] == llm.detokenize([token] * 4, prev_tokens=prompt).decode()


@pytest.mark.parametrize("option", [dict(top_k=1), dict(top_p=0.0), dict(min_p=1.0)])
def test_keeping_one_candidate_is_greedy(llm, option):
    kwargs = dict(max_tokens=8, logit_bias=no_eog(llm))
    greedy = llm(TEXT, temperature=0.0, **kwargs)["choices"][0]["text"]
    sampled = llm(TEXT, temperature=1.5, seed=9, **dict(dict(top_k=0, top_p=1.0, min_p=0.0), **option), **kwargs)
    assert sampled["choices"][0]["text"] == greedy


@pytest.mark.parametrize("option", [dict(presence_penalty=1e4), dict(frequency_penalty=1e4),
                                    dict(repeat_penalty=1e4)])
def test_big_penalties_forbid_repeats(llm, option):
    prompt = llm.tokenize(TEXT, special=True)
    llm(TEXT, max_tokens=10, temperature=0.0, repeat_last_n=-1, logit_bias=no_eog(llm), **option)
    generated = llm.input_ids[len(prompt):].tolist()  # all but the last token
    assert len(generated) == 9 and len(set(generated)) == 9 and not set(generated) & set(prompt)


def test_stop_list_in_chat_streaming(llm):
    kwargs = dict(max_tokens=12, temperature=0.0, logit_bias=no_eog(llm))
    full = llm.create_chat_completion(CHAT, **kwargs)["choices"][0]["message"]["content"]
    stop = full[3:5]
    chunks = list(llm.create_chat_completion(CHAT, stop=["zzz-never", stop], stream=True, **kwargs))
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == full[: full.find(stop)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


NEAR_TIE = 0.05  # the reference README's rule: a divergence after a top-2 gap this small is not a bug


@pytest.mark.slow
def test_chat_matches_llama_cpp_on_smollm2(smollm2_path, reference):
    """The facade end to end on a real model: the chat prompt's ids and llama.cpp's greedy
    answer, token for token, up to where llama.cpp itself was at a near-tie (or to its end)."""
    llm = Llama(str(smollm2_path), n_ctx=256)
    for case in reference["models"]["smollm2-135m-instruct-q4_1"]["chat"]:
        expected = case["greedy_ids"]
        out = llm.create_chat_completion(case["messages"], max_tokens=len(expected), temperature=0.0)
        assert llm.input_ids[: len(case["prompt_ids"])].tolist() == case["prompt_ids"]
        assert out["usage"]["prompt_tokens"] == len(case["prompt_ids"])
        # every generated id but the last is evaluated (the last ends the answer: max_tokens or the turn end)
        generated = llm.input_ids[len(case["prompt_ids"]):].tolist()
        step = next((i for i, (a, b) in enumerate(zip(generated, expected)) if a != b), None)
        if step is None:  # the same answer, to the same end
            assert len(generated) == len(expected) - 1, (generated, expected)
        else:
            top = case["steps_top"][step]["logprobs"]
            assert top[0] - top[1] < NEAR_TIE, f"step {step}: ours {generated[step]}, llama.cpp {expected[step]}"


@pytest.mark.slow
def test_chat_after_a_context_shift_evaluates_only_the_new_turn(smollm2_path):
    # once the shift policy dropped tokens, the re-rendered conversation no longer starts
    # like the cache; the new turn is appended to the cache instead of re-evaluating it all
    llm = Llama(str(smollm2_path), n_ctx=256, context_shift="shift", verbose=False)
    messages, checked = [], 0
    for topic in ["the sea", "mountains", "rivers", "deserts", "forests", "the sky", "cities", "islands",
                  "volcanoes", "lakes", "glaciers", "caves"]:
        shifted = llm._session.n_discarded
        question = f"Tell me about {topic}."
        messages.append({"role": "user", "content": question})
        turn = llm.tokenize(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n".encode(),
                            add_bos=False, special=True)
        reply = llm.create_chat_completion(messages, max_tokens=40, temperature=0.0)
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
        if shifted:  # only the new turn (+ the end of the last answer) is evaluated
            assert llm.last_stats.prompt_eval_tokens <= len(turn) + 4
            checked += 1
        if checked == 2:
            return
    pytest.fail("the conversation was meant to outgrow the context")
