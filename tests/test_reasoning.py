"""Reasoning text (edgekv/api/reasoning.py): a thinking model's <think> block split from its
answer as llama-server's reasoning_format=deepseek does, whatever pieces the text streams in;
through create_chat_completion, the server, and chat_template_kwargs (Qwen3's
enable_thinking) on a tiny qwen3 model."""

from __future__ import annotations

import re

import pytest

from edgekv import Llama
from edgekv.api.reasoning import ReasoningSplitter, split
from edgekv.errors import EdgeKVError

TEXTS = [
    ("<think>\nLet me see: 2+2.\n</think>\n\nIt is 4.", False),
    ("  <think>short</think>answer <think> stays", False),
    ("Plain answer, <think> not at the start", False),
    ("\n\nno tag at all\n", False),
    ("<think>never closed, all reasoning", False),
    ("<thi", False),
    ("already inside\n</think>\n\nthe answer", True),
    ("", False),
]


def expected(text: str, inside: bool) -> tuple[str, str]:
    """The split written as one regular expression, independently of the streaming splitter."""
    m = re.fullmatch(r"(?s)(\s*<think>)?(.*?)(</think>(.*))?", text)
    if not inside and m.group(1) is None:
        return "", text
    body, after = (m.group(2), m.group(4)) if m.group(3) else (text if inside else m.group(2), None)
    if inside and m.group(1) is None and m.group(3) is None:
        body = text
    return body.strip(), "" if after is None else after.lstrip()


@pytest.mark.parametrize("text,inside", TEXTS)
@pytest.mark.parametrize("piece", [1, 2, 3, 7, 1000])
def test_streamed_split_equals_the_whole_split(text, inside, piece):
    splitter, reasoning, content = ReasoningSplitter(inside), "", ""
    for i in range(0, len(text), piece):
        r, c = splitter.push(text[i : i + piece])
        reasoning, content = reasoning + r, content + c
    r, c = splitter.finish()
    assert ((reasoning + r).strip(), content + c) == expected(text, inside) == split(text, inside)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    from edgekv.testing.tiny_model import make_tiny_model

    path = make_tiny_model(tmp_path_factory.mktemp("q3") / "qwen3.gguf", arch="qwen3", weight_type="Q8_0",
                           dim=64, n_heads=4, n_kv_heads=2, head_dim=32, ff=128)
    return Llama(str(path), n_ctx=128)


def test_enable_thinking_reaches_the_template(qwen3):
    messages = [{"role": "user", "content": "hi"}]
    plain = qwen3.create_chat_completion(messages, max_tokens=1, temperature=0)
    off = qwen3.create_chat_completion(messages, max_tokens=1, temperature=0,
                                       chat_template_kwargs={"enable_thinking": False})
    think = qwen3.tokenize(b"<think>\n\n</think>\n\n", add_bos=False, special=True)
    assert off["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] + len(think)
    with pytest.raises(EdgeKVError, match="chat_template_kwargs must be a dict"):
        qwen3.create_chat_completion(messages, max_tokens=1, chat_template_kwargs=["enable_thinking"])


def test_reasoning_content_from_a_think_block(qwen3):
    # a logit bias makes the tiny model open a think block and stay in it
    think = qwen3.tokenize(b"<think>", add_bos=False, special=True)[0]
    messages = [{"role": "user", "content": "hi"}]
    options = dict(max_tokens=3, temperature=0, logit_bias={think: 100.0})
    raw = qwen3.create_chat_completion(messages, **options)["choices"][0]["message"]
    assert raw["content"] == "<think>" * 3 and "reasoning_content" not in raw
    split_msg = qwen3.create_chat_completion(messages, reasoning_format="auto", **options)["choices"][0]["message"]
    assert split_msg["content"] == "" and split_msg["reasoning_content"] == "<think>" * 2
    chunks = list(qwen3.create_chat_completion(messages, reasoning_format="deepseek", stream=True, **options))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "<think>" * 2
    assert "".join(d.get("content", "") for d in deltas) == ""
    with pytest.raises(EdgeKVError, match="reasoning_format 'r1' is not one of none, deepseek, auto"):
        qwen3.create_chat_completion(messages, reasoning_format="r1", **options)


def test_server_fields(qwen3):
    from starlette.testclient import TestClient

    from edgekv.server import create_app

    think = qwen3.tokenize(b"<think>", add_bos=False, special=True)[0]
    client = TestClient(create_app(qwen3, chat_template_kwargs={"enable_thinking": False}))
    body = dict(messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0,
                logit_bias={str(think): 100})
    message = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert message["content"] == "" and message["reasoning_content"] == "<think>"  # the server's default: auto
    raw = client.post("/v1/chat/completions", json=dict(body, reasoning_format="none")).json()
    assert raw["choices"][0]["message"]["content"] == "<think><think>"
    with_kwargs = client.post("/v1/chat/completions", json=dict(body, chat_template_kwargs={"x": 1})).json()
    without = TestClient(create_app(qwen3)).post("/v1/chat/completions", json=body).json()
    # the server's enable_thinking=False stays under a request's own kwargs: the empty block's tokens more
    empty_block = qwen3.tokenize(b"<think>\n\n</think>\n\n", add_bos=False, special=True)
    assert with_kwargs["usage"]["prompt_tokens"] == without["usage"]["prompt_tokens"] + len(empty_block)
    for bad in (dict(reasoning_format="r1"), dict(chat_template_kwargs="enable_thinking")):
        reply = client.post("/v1/chat/completions", json=dict(body, **bad))
        assert reply.status_code == 400 and list(bad)[0] in reply.json()["error"]["message"]
