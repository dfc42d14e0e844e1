"""Speculative decoding through the API (edgekv/speculative/): with prompt lookup or a draft
model, greedy output is plain decoding's token for token, on both real models, in several cache
types, a wrapped ring and a context that overflows; seeded sampling is plain sampling's draw
for draw, with penalties, logit bias, grammars, stop strings and log-probs; the sampled
distribution passes a chi-square test against plain sampling (other seeds) with a drafter that
is mostly wrong; llama-cpp-python's own draft-model interface works; a draft model of another
vocabulary is refused naming the token. The reference is always the same Llama without
draft_model."""

from __future__ import annotations

import functools
import json
import math
import shutil
import subprocess
import sys
from collections import Counter

import gguf
import numpy as np
import pytest

from edgekv import DraftModel, EdgeKVError, Llama, PromptLookupDecoding, load
from edgekv.kv.types import KV_CACHE_TYPES
from edgekv.speculative import Speculation
from edgekv.speculative.draft_length import MAX_BACKOFF, PROBE, DraftLength

PASSAGE = ("The ring buffer keeps the most recent tokens of the conversation in a fixed block of memory. "
           "When it is full, the oldest tokens are dropped, unless they are pinned at the start. ")
QUOTE = f"Text: {PASSAGE}\nThe same text, copied exactly: The ring buffer"


@functools.lru_cache(maxsize=None)
def _llm(path, draft=None, **kw) -> Llama:
    return Llama(str(path), n_ctx=kw.pop("n_ctx", 512), seed=0, draft_model=draft() if draft else None, **kw)


def _lookup():
    return PromptLookupDecoding(max_ngram_size=2, num_pred_tokens=10)


def _pair(path, **kw) -> tuple[Llama, Llama]:
    kw = tuple(sorted(kw.items()))
    return _llm(path, None, **dict(kw)), _llm(path, _lookup, **dict(kw))


def _complete(llm: Llama, prompt: str = QUOTE, **kw):
    out = llm.create_completion(prompt, max_tokens=kw.pop("max_tokens", 48), **{"temperature": 0.0, **kw})
    return out["choices"][0]["text"], out["choices"][0]["logprobs"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
@pytest.mark.parametrize("cache_type", sorted(KV_CACHE_TYPES))
def test_prompt_lookup_gives_plain_greedy_text(request, model, cache_type):
    plain, spec = _pair(request.getfixturevalue(f"{model}_path"), cache_type_k=cache_type, cache_type_v=cache_type)
    assert _complete(spec) == _complete(plain)
    assert spec.last_stats.draft_n_accepted > 0  # drafts were verified and kept
    assert plain.last_stats.draft_n is None


@pytest.mark.slow
def test_wrapped_rings_and_a_context_that_overflows(gemma3_path, smollm2_path):
    # gemma3: every layer a 16-token window in rings of 16 + n_batch 8: they wrap all along
    windows = "0-17:16"
    plain, spec = _pair(gemma3_path, layer_windows=windows, n_batch=8)
    assert _complete(spec, max_tokens=40) == _complete(plain, max_tokens=40)
    assert spec.last_stats.draft_n_accepted > 0
    # smollm2 in 96 tokens shifting: the answer runs past the end of the context
    plain, spec = _pair(smollm2_path, n_ctx=96, context_shift="shift")
    text, _ = _complete(plain, max_tokens=80)
    assert plain._session.n_discarded > 0
    assert _complete(spec, max_tokens=80)[0] == text


def _always():  # drafts at every step, whatever the acceptance (the adaptive length backs off)
    return Speculation(_lookup(), adaptive=False)


@pytest.mark.slow
def test_seeded_sampling_is_plain_sampling(smollm2_path):
    plain, spec = _llm(smollm2_path), _llm(smollm2_path, _always)
    for seed in range(3):
        kw = dict(temperature=0.9, seed=seed, logprobs=3, repeat_penalty=1.1, frequency_penalty=0.2,
                  logit_bias={"13": 2.0}, max_tokens=40)
        assert _complete(spec, **kw) == _complete(plain, **kw)
        assert spec.last_stats.draft_n > 0


@pytest.mark.slow
def test_stops_grammars_ignore_eos_and_all_logits(smollm2_path):
    plain, spec = _pair(smollm2_path)
    kw = dict(stop=["pinned"], max_tokens=60)
    assert _complete(spec, **kw) == _complete(plain, **kw)
    assert _complete(spec, ignore_eos=True, max_tokens=30) == _complete(plain, ignore_eos=True, max_tokens=30)
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    msgs = [{"role": "user", "content": f"Put this text in JSON: {PASSAGE}"}]

    def chat(llm):
        out = llm.create_chat_completion(msgs, response_format={"type": "json_object", "schema": schema},
                                         max_tokens=60, temperature=0)
        return out["choices"][0]["message"]["content"]

    assert chat(spec) == chat(plain)
    json.loads(chat(spec) + ('"}' if not chat(spec).endswith("}") else ""))  # well-formed so far
    # logits_all: the scores of every evaluated token, verified ones included
    a, b = _llm(smollm2_path, None, logits_all=True), _llm(smollm2_path, _lookup, logits_all=True)
    assert _complete(a, max_tokens=24) == _complete(b, max_tokens=24)
    assert b.last_stats.draft_n_accepted > 0
    assert a.n_tokens == b.n_tokens and np.array_equal(a.scores[: a.n_tokens], b.scores[: b.n_tokens])


class FirstMatchLookup:
    """llama-cpp-python's LlamaPromptLookupDecoding, as its programs pass it: a LlamaDraftModel
    (called with the ids, returns np.intc ids; the earliest match of the longest n-gram)."""

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10):
        self.max_ngram_size, self.num_pred_tokens = max_ngram_size, num_pred_tokens

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        ids = np.asarray(input_ids, np.intc)
        for size in range(self.max_ngram_size, 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(ids, (size,))
            for idx in np.flatnonzero((windows == ids[-size:]).all(axis=1)):
                start, end = idx + size, min(idx + size + self.num_pred_tokens, ids.size)
                if start < end:
                    return ids[start:end]
        return np.array([], np.intc)


@pytest.mark.slow
def test_a_llama_cpp_python_draft_model_and_a_draft_gguf(smollm2_path, gemma3_path, source):
    plain = _llm(smollm2_path)
    theirs = _llm(smollm2_path, FirstMatchLookup)
    assert _complete(theirs) == _complete(plain)
    assert theirs.last_stats.draft_n_accepted > 0
    # a draft model: SmolLM2 in F16 drafted by its Q4_1 file
    target = source("smollm2-135m-instruct", "F16")
    plain = Llama(str(target), n_ctx=512)
    spec = Llama(str(target), n_ctx=512, draft_model=DraftModel(str(smollm2_path), n_draft=6))
    assert _complete(spec) == _complete(plain)
    assert spec.last_stats.draft_n_accepted > 0
    # the server's conversations: each its own draft session
    other = spec.fork()
    assert other._speculation.drafter.session is None and other._speculation.drafter.model is spec._speculation.drafter.model
    assert _complete(other) == _complete(plain)
    with pytest.raises(EdgeKVError, match="the draft model's vocabulary has 262144 tokens, the target's 49152"):
        Llama(str(smollm2_path), n_ctx=256, draft_model=DraftModel(str(gemma3_path)))


@pytest.mark.slow
def test_a_draft_with_one_other_token_is_refused_naming_it(smollm2_path, tmp_path):
    copy = tmp_path / "other.gguf"
    shutil.copyfile(smollm2_path, copy)
    field = gguf.GGUFReader(copy, "r+").fields["tokenizer.ggml.tokens"]
    text = field.parts[field.data[1000]]  # token 1000's bytes, in the file
    text[-1] = ord("Z") if text[-1] != ord("Z") else ord("Y")
    del field
    with pytest.raises(EdgeKVError, match="the draft model's token 1000 is"):
        Llama(str(smollm2_path), n_ctx=256, draft_model=DraftModel(str(copy)))
    with pytest.raises(EdgeKVError, match="token 1000"):
        load(str(smollm2_path), draft=str(copy))


def _chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-square quantile at 1 - 0.001 (z: the normal one), Wilson-Hilferty."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_sampled_tokens_follow_the_models_distribution(tiny_model):
    # the second and third sampled token of 400 runs, each verified in a pass of 2 drafts that
    # the model's own greedy choices make (at temperature 1.5 often rejected), seeds 0..399,
    # against plain sampling with seeds 1000..1399: a two-sample chi-square test of homogeneity
    # at the 0.1% level, per position
    path = tiny_model("llama", "F32")
    greedy = Speculation(DraftModel(str(path), n_draft=2, p_min=0.0), n_max=2, adaptive=False)
    plain, spec = Llama(str(path), n_ctx=64, seed=0), Llama(str(path), n_ctx=64, seed=0, draft_model=greedy)
    prompt = plain.tokenize(b"hello world", add_bos=True)

    def tokens(llm, seed):
        steps = llm.generate(prompt, temp=1.5, top_k=8, top_p=1.0, min_p=0.0, seed=seed)
        out = [next(steps) for _ in range(3)]
        steps.close()
        return out

    a = [tokens(spec, s) for s in range(400)]
    b = [tokens(plain, 1000 + s) for s in range(400)]
    counts = spec._speculation.counts
    assert counts.drafted >= 2 * 400 and 0 < counts.accepted < counts.drafted
    for position in (1, 2):
        ca, cb = Counter(t[position] for t in a), Counter(t[position] for t in b)
        cells = sorted(set(ca) | set(cb))
        stat = sum((ca[c] - cb[c]) ** 2 / (ca[c] + cb[c]) for c in cells)  # equal sample sizes
        assert len(cells) > 2 and stat < _chi2_critical(len(cells) - 1), (position, stat, len(cells))


def test_the_draft_length_follows_acceptance_and_cost():
    # a pass of n rows costs 1 + 0.4 (n - 1) steps
    def run(accept_all: bool, steps: int = 2000) -> tuple[int, int]:
        length, wasted, drafted = DraftLength(16), 0, 0
        for _ in range(steps):
            k = length.next(room=64)
            if k == 0:
                length.stepped(0.010)
                continue
            drafted += 1
            accepted = k if accept_all else 0
            wasted += k - accepted
            length.verified(k, accepted, 0.010 * (1 + 0.4 * k))
        return wasted, drafted

    wasted, _ = run(accept_all=False)
    assert wasted * 0.4 < 0.03 * 2000  # never matching costs under 3% of decode time
    length = DraftLength(16)
    for _ in range(2):  # the first timing of each pass size is a warm-up's, not counted
        length.stepped(0.010)
    for _ in range(10):
        length.verified(8, 8, 0.010 * (1 + 0.4 * 8))
    assert length.next(room=64) >= 8 and length.next(room=5) == 4  # long drafts, cut to the room
    assert PROBE * 0.4 / MAX_BACKOFF < 0.03


def test_a_draft_model_that_keeps_declining_is_asked_less_and_less():
    # asked for drafts, it gives none (its first guess below p_min): each ask is a miss, so the
    # loop backs off from asking (plain steps between asks grow), and comes back when it drafts again
    length = DraftLength(16)
    for _ in range(2):
        length.stepped(0.010)
    for _ in range(3):
        length.verified(4, 4, 0.010 * (1 + 0.4 * 4))
    asks, plain = [], 0
    for _ in range(400):
        if length.next(room=64):
            asks.append(plain)
            plain = 0
            length.declined()
        else:
            plain += 1
            length.stepped(0.010)
    assert len(asks) < 20 and max(asks) >= MAX_BACKOFF // 2, asks
    length.verified(PROBE, PROBE, 0.010 * (1 + 0.4 * PROBE))  # a probe that came true
    assert length.next(room=64) > 0


@pytest.mark.slow
def test_cli_flags(smollm2_path):
    args = [sys.executable, "-m", "edgekv", "run", "-m", str(smollm2_path), "-p", QUOTE, "-n", "24", "--temp", "0"]
    plain = subprocess.run(args, capture_output=True, text=True, timeout=300)
    for flags in (["--lookup-ngram", "2"], ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2",
                                            "--spec-ngram-simple-size-m", "8"]):
        spec = subprocess.run(args + flags, capture_output=True, text=True, timeout=300)
        assert spec.returncode == 0 and spec.stdout == plain.stdout
        assert "speculative: drafted" in spec.stderr
    bad = subprocess.run(args + ["--spec-type", "draft-simple"], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "-md FILE" in bad.stderr and "Traceback" not in bad.stderr
    # edgekv bench's speculative mode: plain and drafted greedy decoding of the same answer
    bench = subprocess.run([sys.executable, "-m", "edgekv", "bench", "-m", str(smollm2_path), "-n", "24", "-r", "1",
                            "-t", "2", "--lookup-ngram", "2", "-o", "json"], capture_output=True, text=True, timeout=300)
    assert bench.returncode == 0, bench.stderr
    (record,) = json.loads(bench.stdout)
    assert record["n_gen"] == 24 and record["plain_avg_ts"] > 0 and record["spec_avg_ts"] > 0
    assert record["draft_n"] >= record["draft_n_accepted"] > 0 and record["drafter"].startswith("prompt lookup")


@pytest.mark.slow
def test_load_with_a_draft_and_stream_generate(smollm2_path):
    from edgekv import stream_generate

    model = load(str(smollm2_path), draft=str(smollm2_path))  # a model drafting for itself: all accepted
    prompt = model.tokenizer.encode(QUOTE)
    spec = [st.token for st in stream_generate(model, model.session(256), prompt, max_tokens=30, temperature=0)]
    model.draft = None
    plain = [st.token for st in stream_generate(model, model.session(256), prompt, max_tokens=30, temperature=0)]
    assert spec == plain


@pytest.mark.slow
def test_the_server_drafts_per_conversation(smollm2_path):
    # two conversations at once (parallel 2): each verifies its own drafts on the step scheduler,
    # answers as plain greedy decoding does, and reports llama-server's draft counts
    import http.client
    import threading

    from edgekv.server import create_app
    from helpers.server import KEY, WAIT_S, serving

    expected, _ = _complete(_llm(smollm2_path), max_tokens=32)
    llm = Llama(str(smollm2_path), n_ctx=512, draft_model=_always())
    answers: list = []

    def ask(port: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
        body = json.dumps(dict(prompt=QUOTE, max_tokens=32, temperature=0))
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        answers.append(json.loads(conn.getresponse().read()))
        conn.close()

    with serving(create_app(llm, api_key=KEY, parallel=2)) as port:
        threads = [threading.Thread(target=ask, args=(port,)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
    assert len(answers) == 2
    for answer in answers:
        assert answer["choices"][0]["text"] == expected
        assert answer["timings"]["draft_n"] > 0 and answer["timings"]["draft_n_accepted"] > 0
