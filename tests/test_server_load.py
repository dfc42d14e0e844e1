"""The server under load (issue 16, item 4), on a real uvicorn server on 127.0.0.1 over a
tiny model: 8 concurrent clients x 25 requests each must get exactly the answers the same
requests get one at a time (no cross-talk through the shared Llama and its prefix reuse, no
deadlock), and a soak of 1,000 short requests must leave the process's memory within 5% of
what it was after warm-up, with no thread or file descriptor left behind."""

from __future__ import annotations

import pytest
import gc
import http.client
import json
import os
import threading

from edgekv import Llama
from edgekv.server import create_app
from helpers.server import WAIT_S, serving

pytestmark = pytest.mark.long  # load: hundreds of requests, a soak

N_CLIENTS, N_EACH, N_SOAK, N_WARM = 8, 25, 1000, 100


def request(i: int, c: int = 0) -> tuple[str, dict]:
    """Request number i of client c: chat or completion, streamed or not, greedy or seeded."""
    body: dict = dict(max_tokens=6, temperature=0 if i % 3 else 0.9, seed=1000 * c + i, stream=i % 4 == 1)
    if i % 2:
        body["messages"] = [{"role": "user", "content": f"client {c} says {i}"}]
        if i % 5 == 1:  # a conversation that extends an earlier one: the prefix-reuse path
            body["messages"] = [{"role": "user", "content": f"client {c} says {i - 1}"},
                                {"role": "assistant", "content": "ok"}] + body["messages"]
        return "/v1/chat/completions", body
    body["prompt"] = f"client {c} writes {i} and"
    return "/v1/completions", body


def ask(port: int, path: str, body: dict) -> str:
    """The generated text of one request (streams joined), on a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        assert r.status == 200, (r.status, data[:200])
    finally:
        conn.close()
    if not body["stream"]:
        choice = json.loads(data)["choices"][0]
        return choice["message"]["content"] if "message" in choice else choice["text"]
    text = []
    for line in data.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            choice = json.loads(line[6:])["choices"][0]
            text.append(choice["delta"].get("content") or "" if "delta" in choice else choice["text"])
    return "".join(text)


def test_eight_clients_get_their_solo_answers(tiny_model):
    llm = Llama(str(tiny_model()), n_ctx=128)
    with serving(create_app(llm, max_queue=N_CLIENTS)) as port:
        solo = {(c, i): ask(port, *request(i, c)) for c in range(N_CLIENTS) for i in range(N_EACH)}
        got: dict = {}
        errors: list = []

        def client(c: int) -> None:
            try:
                for i in range(N_EACH):
                    got[(c, i)] = ask(port, *request(i, c))
            except Exception as exc:  # noqa: BLE001 - collected, asserted below
                errors.append((c, repr(exc)))

        threads = [threading.Thread(target=client, args=(c,)) for c in range(N_CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S)
        assert not any(t.is_alive() for t in threads), f"a client did not finish within {WAIT_S} s"
    assert not errors, errors[:3]
    differ = [k for k in solo if got[k] != solo[k]]
    assert len(got) == N_CLIENTS * N_EACH and not differ, f"{len(differ)} answers differ from their solo runs"
    assert len(set(solo.values())) > N_CLIENTS  # the answers are not all alike: a mix-up would show


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_a_thousand_requests_leak_no_memory_threads_or_files(tiny_model):
    llm = Llama(str(tiny_model()), n_ctx=128)
    with serving(create_app(llm)) as port:
        for i in range(N_WARM):
            ask(port, *request(i))
        gc.collect()
        rss, threads, fds = _rss_kb(), threading.active_count(), len(os.listdir("/proc/self/fd"))
        for i in range(N_WARM, N_SOAK):
            ask(port, *request(i))
        gc.collect()
        grown = (_rss_kb() - rss) / rss
        print(f"soak: RSS {rss} kB after {N_WARM} requests, {grown:+.2%} after {N_SOAK}; "
              f"threads {threads} -> {threading.active_count()}; fds {fds} -> {len(os.listdir('/proc/self/fd'))}")
        assert grown < 0.05
        assert threading.active_count() <= threads
        assert len(os.listdir("/proc/self/fd")) <= fds


def test_huge_headers_and_slow_bodies_do_not_stop_the_server(tiny_model):
    """A 100 KB header is refused with a 4xx; 8 clients trickling their bodies a byte at a
    time (slowloris) hold no generation: other requests are answered meanwhile."""
    import socket

    llm = Llama(str(tiny_model()), n_ctx=128)
    with serving(create_app(llm)) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
        conn.request("POST", "/v1/completions", body=b"{}", headers={"X-Junk": "x" * 100_000})
        r = conn.getresponse()
        assert 400 <= r.status < 500
        conn.close()
        slow = []
        for _ in range(8):
            s = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{")
            slow.append(s)
        answers = []
        for i in range(10):
            for s in slow:
                s.sendall(b" ")  # still under the announced length: the body never completes
            answers.append(ask(port, *request(2 * i)))
        assert len(answers) == 10
        for s in slow:
            s.close()
        assert ask(port, *request(0)) == answers[0]
