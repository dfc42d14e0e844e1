"""500 malformed requests to the OpenAI server (issue 16, item 4): every request field given
junk of every JSON kind, on both endpoints. Each must be answered 2xx or 4xx in OpenAI's
error shape, never 5xx, and the server keeps answering."""

from __future__ import annotations

import itertools
import json

import pytest
from starlette.testclient import TestClient

from edgekv import Llama
from edgekv.server import create_app

FIELDS = ["messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "min_p", "top_k",
          "presence_penalty", "frequency_penalty", "repeat_penalty", "seed", "stop", "logit_bias", "logprobs",
          "top_logprobs", "n", "stream", "stream_options", "ignore_eos", "model", "tools", "response_format",
          "chat_template_kwargs", "reasoning_format", "echo", "suffix"]
JUNK = [None, True, -1, 0, 2**63, -(2**64), 1e308, "NaN", "x" * 300, [], [None], {}, {"a": {"b": [1]}},
        [{"role": 1}], [{"role": "user", "content": {"x": 1}}], {"1": "x"}, ["\ud800"], [[[[]]]]]


@pytest.fixture(scope="module")
def client(tiny_model):
    llm = Llama(str(tiny_model()), n_ctx=64)
    return TestClient(create_app(llm, max_body=64 * 1024), raise_server_exceptions=False)


def test_five_hundred_malformed_requests_get_4xx_not_5xx(client):
    base = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            "/v1/completions": {"prompt": "hi", "max_tokens": 2}}
    cases = list(itertools.product(base, FIELDS, JUNK))[:480]
    raw = [b"", b"null", b"[]", b'"x"', b"{", b"{}", b'{"messages": 1}', b"\xff\xfe", b"[" * 3000,
           b'{"prompt": "' + b"a" * 70_000 + b'"}', b'{"max_tokens": 1e999}', b'{"a": NaN}', b"0" * 100,
           b'{"messages": [], "messages": [1]}', b'{"\\ud800": 1}', b"true", b'{"prompt": [1, -5]}',
           b'{"prompt": [[1, 2], [3]]}', b'{"prompt": ["a", "b"]}', b'{"stream": true, "prompt": 5}']
    statuses = []
    for path, field, value in cases:
        body = dict(base[path], **{field: value})
        r = client.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
        statuses.append((r.status_code, path, field, value))
    for i, body in enumerate(raw):
        r = client.post(list(base)[i % 2], content=body, headers={"content-type": "application/json"})
        statuses.append((r.status_code, "raw", i, body[:30]))
    assert len(statuses) == 500
    server_errors = [s for s in statuses if s[0] >= 500]
    assert not server_errors, f"{len(server_errors)} answered 5xx, e.g. {server_errors[:5]}"
    assert client.get("/health").status_code == 200
    ok = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] is not None
