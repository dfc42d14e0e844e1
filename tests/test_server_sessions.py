"""Many conversations in one server (edgekv/server/sessions.py, scheduler.py): per-conversation
KV sessions within --slots and --kv-budget, spilling idle ones to disk and restoring them,
batched decode of --parallel streams, /slots and /metrics. The reference for every answer is
the same conversation run alone, greedy, on a fresh `Llama` of the same model and context
(turns in order, each reusing the previous turn's cache as the facade does)."""

from __future__ import annotations

import glob
import os
import threading

import httpx
import pytest

from edgekv import Llama
from edgekv.server import create_app
from helpers.server import WAIT_S, openai_client, serving

pytestmark = pytest.mark.slow  # every test here needs a real model

N_CTX = 256
MAX_TOKENS = 10
QUESTIONS = ["Name a red fruit.", "What is 2 + 3?", "Say hello in French.", "Name a planet.",
             "What colour is the sky?", "Name a large animal.", "What is ice made of?", "Name a month."]
FOLLOW_UP = "Tell me one more."


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return Llama(str(smollm2_path), n_ctx=N_CTX)


@pytest.fixture(scope="module")
def solo(smollm2_path):
    """answers(question, turns) -> the conversation's greedy answers, run alone."""
    alone = Llama(str(smollm2_path), n_ctx=N_CTX)
    memo: dict = {}

    def answers(question: str, turns: int, max_tokens: int = MAX_TOKENS) -> list[str]:
        if (question, turns, max_tokens) not in memo:
            alone.reset()
            history, out = [{"role": "user", "content": question}], []
            for _ in range(turns):
                r = alone.create_chat_completion(history, max_tokens=max_tokens, temperature=0)
                out.append(r["choices"][0]["message"]["content"])
                history += [{"role": "assistant", "content": out[-1]}, {"role": "user", "content": FOLLOW_UP}]
            memo[question, turns, max_tokens] = out
        return memo[question, turns, max_tokens]

    return answers


def _metrics(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S).text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if not line.startswith("#")}


def _ask(client, history: list[dict], **extra):
    r = client.chat.completions.create(model="m", messages=history, max_tokens=MAX_TOKENS, temperature=0,
                                       extra_body=extra or None)
    return r.choices[0].message.content, r.usage, r.model_extra["timings"]


def test_eight_conversations_in_three_slots_spill_and_restore(llm, solo, tmp_path):
    one = llm._session.cache.nbytes
    app = create_app(llm, slots=3, kv_budget=3 * one, spill_dir=str(tmp_path))
    histories = [[{"role": "user", "content": q}] for q in QUESTIONS]
    answers: list[list[str]] = [[] for _ in QUESTIONS]
    with serving(app) as port:
        client = openai_client(f"http://127.0.0.1:{port}/v1", api_key="none")
        last_prompt = [0] * len(QUESTIONS)
        for turn in range(2):
            for i in range(len(QUESTIONS)):  # the conversations take turns
                text, usage, timings = _ask(client, histories[i])
                answers[i].append(text)
                if turn:  # restored from disk (or still live): only the new turn was evaluated
                    assert timings["cache_n"] >= last_prompt[i], (i, timings)
                    assert timings["prompt_n"] <= usage.prompt_tokens - last_prompt[i], (i, timings)
                last_prompt[i] = usage.prompt_tokens
                histories[i] += [{"role": "assistant", "content": text}, {"role": "user", "content": FOLLOW_UP}]
                live = [s for s in httpx.get(f"http://127.0.0.1:{port}/slots").json()["sessions"]
                        if s["state"] != "spilled"]
                assert len(live) <= 3 and sum(s["bytes"] for s in live) <= 3 * one
        m = _metrics(port)
        slots = httpx.get(f"http://127.0.0.1:{port}/slots").json()
    assert len(slots["sessions"]) == 8 and slots["totals"]["live"] == 3 and slots["totals"]["spilled"] == 5
    # turn 1: conversations 3..7 each spill the least recently used; turn 2: all 8 come back from disk
    assert m["edgekv_spills_total"] == 5 + 8 and m["edgekv_restores_total"] == 8
    assert m["edgekv_spill_errors_total"] == 0 and m["edgekv_sessions_dropped_total"] == 0
    for i, q in enumerate(QUESTIONS):
        assert answers[i] == solo(q, 2), f"conversation {i} differs from its solo run"
    assert not os.listdir(tmp_path) or all(f.endswith(".state") for f in os.listdir(tmp_path))


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_a_bad_spill_file_means_a_clean_reevaluation(llm, solo, tmp_path, damage):
    app = create_app(llm, slots=1, spill_dir=str(tmp_path))
    a, b = [{"role": "user", "content": QUESTIONS[0]}], [{"role": "user", "content": QUESTIONS[1]}]
    with serving(app) as port:
        client = openai_client(f"http://127.0.0.1:{port}/v1", api_key="none")
        first_a = _ask(client, a)[0]
        first_b = _ask(client, b)[0]  # a is spilled
        (path,) = glob.glob(str(tmp_path / "*.state"))
        if damage == "missing":
            os.remove(path)
        else:
            with open(path, "r+b") as f:
                f.seek(os.path.getsize(path) // 2)
                f.write(b"\xff" * 64)
        a += [{"role": "assistant", "content": first_a}, {"role": "user", "content": FOLLOW_UP}]
        text, usage, timings = _ask(client, a)  # b is spilled, a re-evaluated from its text
        assert timings["cache_n"] == 0 and timings["prompt_n"] == usage.prompt_tokens
        b += [{"role": "assistant", "content": first_b}, {"role": "user", "content": FOLLOW_UP}]
        text_b, _, timings_b = _ask(client, b)  # the other conversation is not disturbed
        assert timings_b["cache_n"] > 0
        m = _metrics(port)
    assert [first_a, text] == solo(QUESTIONS[0], 2) and [first_b, text_b] == solo(QUESTIONS[1], 2)
    assert m["edgekv_spill_errors_total"] == 1 and m["edgekv_restores_total"] == 1


def test_session_id_and_user_keep_conversations_apart(llm):
    app = create_app(llm, slots=2)
    history = [{"role": "user", "content": QUESTIONS[2]}]
    with serving(app) as port:
        client = openai_client(f"http://127.0.0.1:{port}/v1", api_key="none")
        alice = _ask(client, history, user="alice")
        bob = _ask(client, history, user="bob")  # the same prompt, another conversation: nothing shared
        again = _ask(client, history, session_id="alice")  # session_id names the same conversation as user
        slots = httpx.get(f"http://127.0.0.1:{port}/slots").json()["sessions"]
    assert bob[2]["cache_n"] == 0 and alice[0] == bob[0] == again[0]
    assert again[2]["prompt_n"] <= 1  # alice's prompt again: its cache held it
    assert sorted(s["session_id"] for s in slots) == ["alice", "bob"]


def _stream(client, question: str, out: dict, key: str, started: threading.Event | None = None,
            disconnect_after: int = 0) -> None:
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": question}],
                                            max_tokens=24, temperature=0, stream=True)
    pieces = []
    for n, chunk in enumerate(stream, 1):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if started is not None and n == 3:
            started.set()
        if disconnect_after and n >= disconnect_after:
            stream.close()
            break
    out[key] = "".join(pieces)


def test_four_parallel_streams_equal_their_solo_runs(llm, solo):
    app = create_app(llm, parallel=4)
    out: dict = {}
    with serving(app) as port:
        client = openai_client(f"http://127.0.0.1:{port}/v1", api_key="none")
        started = threading.Event()
        early = [threading.Thread(target=_stream, args=(client, QUESTIONS[i], out, i, started if i == 0 else None))
                 for i in range(2)]
        for t in early:
            t.start()
        assert started.wait(WAIT_S)
        # two more join while the first two are generating; one client leaves early
        late = [threading.Thread(target=_stream, args=(client, QUESTIONS[i], out, i)) for i in (2, 3)]
        gone = threading.Thread(target=_stream, args=(client, QUESTIONS[4], out, 4, None, 2))
        for t in late + [gone]:
            t.start()
        for t in early + late + [gone]:
            t.join(WAIT_S)
            assert not t.is_alive()
        scheduler = app.state.scheduler
        m = _metrics(port)
    for i in range(4):
        assert out[i] == solo(QUESTIONS[i], 1, 24)[0], f"stream {i} differs from its solo run"
    assert scheduler.max_rows >= 2 and m["edgekv_decode_batch_max"] == scheduler.max_rows
    assert m["edgekv_requests_failed_total"] == 0 and m["edgekv_requests_processing"] == 0


def test_bad_request_beside_a_stream_disturbs_nothing(llm, solo):
    app = create_app(llm, parallel=2)
    out: dict = {}
    with serving(app) as port:
        client = openai_client(f"http://127.0.0.1:{port}/v1", api_key="none")
        started = threading.Event()
        t = threading.Thread(target=_stream, args=(client, QUESTIONS[5], out, 0, started))
        t.start()
        assert started.wait(WAIT_S)
        too_long = [{"role": "user", "content": "word " * (2 * N_CTX)}]
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=WAIT_S,
                       json=dict(model="m", messages=too_long, max_tokens=4))
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        t.join(WAIT_S)
    assert out[0] == solo(QUESTIONS[5], 1, 24)[0]


def test_slots_and_metrics_need_the_key_and_describe_the_server(llm):
    app = create_app(llm, api_key="k", parallel=2, slots=3)
    with serving(app) as port:
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(base + "/slots").status_code == 401 and httpx.get(base + "/metrics").status_code == 401
        auth = {"Authorization": "Bearer k"}
        openai_client(base + "/v1", api_key="k").completions.create(model="m", prompt="Hi", max_tokens=3)
        slots = httpx.get(base + "/slots", headers=auth).json()
        metrics = httpx.get(base + "/metrics", headers=auth)
    assert slots["slots"] == 3 and slots["parallel"] == 2 and slots["totals"]["live"] == 1
    (session,) = slots["sessions"]
    assert session["state"] == "live" and session["n_tokens"] >= 3 and session["bytes"] == llm._session.cache.nbytes
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    lines = metrics.text.splitlines()
    for line in lines:  # the exposition format: HELP, TYPE, then `name value`
        assert line.startswith(("# HELP edgekv_", "# TYPE edgekv_")) or (
            line.startswith("edgekv_") and len(line.split()) == 2 and float(line.split()[1]) >= 0)
    values = {line.split()[0]: float(line.split()[1]) for line in lines if not line.startswith("#")}
    assert values["edgekv_requests_total"] == 1 and values["edgekv_tokens_predicted_total"] == 3
    assert values["edgekv_kv_cache_bytes"] == session["bytes"] and values["edgekv_sessions_live"] == 1


def test_impossible_pool_settings_are_refused(llm):
    from edgekv.errors import EdgeKVError

    with pytest.raises(EdgeKVError, match="fewer than --parallel"):
        create_app(llm, parallel=3, slots=2)
    with pytest.raises(EdgeKVError, match="cannot hold --parallel 2 sessions"):
        create_app(llm, parallel=2, kv_budget=llm._session.cache.nbytes)
