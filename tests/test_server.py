"""Tests for edgekv/server.py and `edgekv serve`: a real uvicorn server on a free port of
127.0.0.1 over the real default model (n_ctx 512), spoken to with the official `openai`
client (and http.client where the client cannot send what is tested)."""

from __future__ import annotations

import http.client
import json
import queue
import subprocess
import sys
import threading

import openai
import pytest

from edgekv import Llama
from edgekv.server import create_app
from helpers.server import KEY, WAIT_S, openai_client, serving

pytestmark = pytest.mark.slow  # every test here needs a real model

N_CTX = 512
HELLO = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return Llama(str(smollm2_path), n_ctx=N_CTX)


@pytest.fixture(scope="module")
def server(llm):
    app = create_app(llm, model_id="smollm2", api_key=KEY, max_queue=4, max_body=64 * 1024)
    with serving(app) as port:
        yield app, port


@pytest.fixture
def client(server):
    return openai_client(f"http://127.0.0.1:{server[1]}/v1")


def post(port: int, path: str, body: bytes, headers: dict | None = None, chunked: bool = False):
    """(status, parsed JSON body) of a raw POST."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", **(headers or {})}
    if chunked:
        conn.request("POST", path, body=iter([body[i : i + 4096] for i in range(0, len(body), 4096)]),
                     headers=headers, encode_chunked=True)
    else:
        conn.request("POST", path, body=body, headers=headers)
    response = conn.getresponse()
    data = json.loads(response.read())
    conn.close()
    return response.status, data


def test_chat_completion(client):
    reply = client.chat.completions.create(model="anything", messages=HELLO, max_tokens=16, temperature=0)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.model == "anything"
    assert choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens > 0 and reply.usage.prompt_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_chat_stream_matches_greedy_answer(client):
    whole = client.chat.completions.create(model="m", messages=HELLO, max_tokens=24, temperature=0)
    chunks = list(client.chat.completions.create(model="m", messages=HELLO, max_tokens=24, temperature=0,
                                                  stream=True))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 2
    assert "".join(pieces) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_stream_include_usage(client):
    chunks = list(client.chat.completions.create(model="m", messages=HELLO, max_tokens=8, temperature=0,
                                                  stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


def test_completion_streamed_and_not(client):
    kw = dict(model="m", prompt="The capital of France is", max_tokens=12, temperature=0)
    whole = client.completions.create(**kw)
    assert whole.object == "text_completion" and whole.choices[0].text
    assert whole.usage.completion_tokens <= 12 and whole.choices[0].finish_reason in ("stop", "length")
    chunks = list(client.completions.create(stream=True, **kw))
    assert len(chunks) > 2
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_completion_of_token_ids_and_stop(client, llm):
    ids = llm.tokenize("One, two, three, four, five,")
    text = client.completions.create(model="m", prompt="One, two, three, four, five,", max_tokens=12,
                                     temperature=0).choices[0].text
    assert client.completions.create(model="m", prompt=ids, max_tokens=12, temperature=0).choices[0].text == text
    cut = client.completions.create(model="m", prompt=ids, max_tokens=12, temperature=0, stop=[text[2:4]])
    assert cut.choices[0].text == text[: text.index(text[2:4])] and cut.choices[0].finish_reason == "stop"


def test_logit_bias_bans_a_token(client, llm):
    kw = dict(model="m", prompt="The capital of France is", max_tokens=1, temperature=0)
    first = client.completions.create(**kw).choices[0].text
    banned = llm.tokenize(first, add_bos=False)[0]
    other = client.completions.create(logit_bias={str(banned): -100}, **kw).choices[0].text
    assert other != first


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    conn = http.client.HTTPConnection("127.0.0.1", server[1], timeout=WAIT_S)
    conn.request("GET", "/health")  # no key needed
    response = conn.getresponse()
    assert response.status == 200 and json.loads(response.read())["status"] == "ok"


@pytest.mark.parametrize("bad", [dict(n=2), dict(max_tokens=-1), dict(temperature="hot"), dict(top_p=2),
                                 dict(stop=3), dict(logit_bias={"x": 1}), dict(logit_bias={"99999999": 1}),
                                 dict(messages=[]), dict(messages=[{"content": "no role"}]),
                                 dict(extra_body={"ignore_eos": "yes"})])
def test_bad_request(client, bad):
    kw = dict(model="m", messages=HELLO, max_tokens=4)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**{**kw, **bad})
    error = err.value.response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]


def test_unsupported_option_is_400(client):
    with pytest.raises(openai.BadRequestError, match="not supported"):
        client.completions.create(model="m", prompt="Hi", max_tokens=4, suffix="end")


def test_invalid_json_and_unknown_route(server):
    status, body = post(server[1], "/v1/chat/completions", b"{not json")
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    # the two 500s a malformed-request sweep found (issue 16): 5,000 nested '[' and a 2^63 penalty
    status, body = post(server[1], "/v1/chat/completions", b"[" * 5000)
    assert status == 400 and "too deeply" in body["error"]["message"]
    request = dict(messages=HELLO, max_tokens=2, temperature=0)
    for field, value in (("frequency_penalty", 2**63), ("presence_penalty", -(2**64)), ("repeat_penalty", 1e400)):
        status, body = post(server[1], "/v1/chat/completions", json.dumps({**request, field: value}).encode())
        assert status in (200, 400), (field, status, body)
    status, body = post(server[1], "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], '
                                                            b'"max_tokens": 2, "top_p": NaN}')
    assert status == 400 and "top_p" in body["error"]["message"]
    status, body = post(server[1], "/v1/nowhere", b"{}")
    assert status == 404 and body["error"]["code"] == "not_found"


def test_prompt_longer_than_context(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="m", prompt="word " * (2 * N_CTX), max_tokens=4)
    error = err.value.response.json()["error"]
    assert error["n_ctx"] == N_CTX and error["n_prompt_tokens"] > N_CTX
    assert client.completions.create(model="m", prompt="Hi", max_tokens=2).choices[0].text is not None


def test_wrong_api_key(server):
    wrong = openai_client(f"http://127.0.0.1:{server[1]}/v1", api_key="nope")
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model="m", messages=HELLO, max_tokens=4)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


@pytest.mark.parametrize("chunked", [False, True])  # Content-Length, then the bytes actually sent
def test_oversized_body(server, client, chunked):
    body = json.dumps(dict(model="m", prompt="x" * (100 * 1024), max_tokens=1)).encode()
    status, data = post(server[1], "/v1/completions", body, chunked=chunked)
    assert status == 413 and data["error"]["code"] == "request_too_large"
    assert client.completions.create(model="m", prompt="Hi", max_tokens=2).choices


def test_conversation_reuses_its_prefix(client, llm):
    first = client.chat.completions.create(model="m", messages=HELLO, max_tokens=8, temperature=0)
    follow = HELLO + [{"role": "assistant", "content": first.choices[0].message.content},
                      {"role": "user", "content": "And three animals?"}]
    second = client.chat.completions.create(model="m", messages=follow, max_tokens=8, temperature=0)
    timings = second.model_extra["timings"]  # llama-server's: cache_n prompt tokens came from the cache
    assert timings["cache_n"] + timings["prompt_n"] == second.usage.prompt_tokens
    assert timings["cache_n"] >= first.usage.prompt_tokens


def test_disconnect_stops_generation(client, server, llm):
    jobs = server[0].state.queue
    before = jobs.stopped_early
    # no end token, and room for the whole context: only the disconnect can stop it early,
    # however fast the model is (a stopped generation is counted before the next one runs)
    stream = client.completions.create(model="m", prompt="Once upon a time", max_tokens=N_CTX, temperature=0,
                                       extra_body={"ignore_eos": True}, stream=True)
    for _, _ in zip(range(2), stream):
        pass
    stream.close()
    after = client.completions.create(model="m", prompt="Hi", max_tokens=2)  # runs after the stopped one
    assert after.choices and jobs.stopped_early == before + 1
    with jobs.hold():  # the worker thread is past `after`'s bookkeeping once it runs this
        pass
    assert jobs.pending == 0


def test_full_queue_is_429(llm):
    app = create_app(llm, max_queue=1)
    results, answered = [], threading.Event()
    with serving(app) as port:
        client = openai_client(f"http://127.0.0.1:{port}/v1", api_key="none")

        def ask() -> None:
            try:
                results.append(client.completions.create(model="m", prompt="Hi", max_tokens=2))
            except openai.RateLimitError as exc:
                results.append(exc)
            answered.set()

        with app.state.queue.hold():  # the model is busy: one request may wait, the next is refused
            threads = [threading.Thread(target=ask) for _ in range(2)]
            for t in threads:
                t.start()
            assert answered.wait(WAIT_S)  # only the refused one can be answered while the model is held
            assert len(results) == 1 and isinstance(results[0], openai.RateLimitError)
            assert results[0].response.json()["error"]["code"] == "queue_full"
        for t in threads:
            t.join(WAIT_S)
            assert not t.is_alive(), f"a request was not answered within {WAIT_S} s"
        assert results[1].choices  # the waiting one is answered once the model is free
        assert client.completions.create(model="m", prompt="Hi", max_tokens=2).choices


def test_zero_queue_refuses_while_busy(llm):
    app = create_app(llm, max_queue=0)
    with serving(app) as port:
        client = openai_client(f"http://127.0.0.1:{port}/v1", api_key="none")
        with app.state.queue.hold():
            with pytest.raises(openai.RateLimitError):
                client.completions.create(model="m", prompt="Hi", max_tokens=2)
        assert client.completions.create(model="m", prompt="Hi", max_tokens=2).choices


def test_serve_command(smollm2_path):
    """`python -m edgekv serve` prints its URL, requires its key and answers."""
    cmd = [sys.executable, "-m", "edgekv", "serve", "-m", str(smollm2_path), "-c", "256", "--port", "0",
           "--api-key", KEY]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr] + [lines.put("")], daemon=True).start()
    try:
        line = ""
        while "serving" not in line:
            try:
                line = lines.get(timeout=WAIT_S)
            except queue.Empty:
                pytest.fail(f"the server printed no 'serving' line within {WAIT_S} s")
            assert line, "the server exited before listening"
        url = line.split(" at ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        client = openai_client(url)
        assert client.chat.completions.create(model="m", messages=HELLO, max_tokens=4).choices[0].message.content
        with pytest.raises(openai.AuthenticationError):
            openai_client(url, api_key="wrong").models.list()
    finally:
        proc.terminate()
        try:
            proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
