"""Agent loops against the server (`edgekv serve`'s app) in the Qwen 2.5 and Llama 3.2 call
formats, through the two clients agents use: the openai package and LangChain's bind_tools.
Two tools are offered; the first answer is a parallel call (two calls in one answer, streamed
with their indexes), each result goes back in the family's own format, and the loop ends with
a text answer.

The Qwen format runs on the real SmolLM2 (the same ChatML tokens, the Qwen 2.5 template: it
writes several <tool_call> blocks); the Llama format on a tiny random llama whose greedy answer
under the grammar is two calls (make_tiny_model seed 15; the smallest margin between its top
two tokens along that answer is 0.19 nats).
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest

from edgekv import Llama
from edgekv.api.tools import ToolCalling
from edgekv.server import create_app
from edgekv.text.chat_format import ChatFormatter
from helpers.server import WAIT_S, serving

TEMPLATES = Path(__file__).parent / "reference" / "chat_templates"
ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 999}}, "required": ["a", "b"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone", "parameters": {
    "type": "object", "properties": {"timezone": {"type": "string", "enum": ["CET", "UTC", "JST"]}},
    "required": ["timezone"]}}}
TOOLS = [ADD, TIME]
ASK = "Add 2 and 3, and tell me the time in Tokyo."


@pytest.fixture(scope="module", params=["hermes", "llama3"])
def agent_llm(request, smollm2_path, tmp_path_factory):
    if request.param == "hermes":  # Qwen 2.5
        llm = Llama(str(smollm2_path), n_ctx=4096)
        own = llm.chat_formatter
        template = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
        llm.chat_formatter = ChatFormatter(template, own.bos_token, own.eos_token, llm.tokenizer_, "qwen2.5")
    else:
        from edgekv.testing.tiny_model import make_tiny_model

        template = (TEMPLATES / "meta-llama-Llama-3.2-3B-Instruct.jinja").read_text()
        path = make_tiny_model(tmp_path_factory.mktemp("agent") / "llama.gguf", arch="llama", seed=15,
                               metadata={"tokenizer.chat_template": template})
        llm = Llama(str(path), n_ctx=4096)
    assert ToolCalling(TOOLS, "auto", llm.chat_formatter.template).format == request.param
    return llm


def _result(name: str, args: dict) -> str:
    jsonschema.validate(args, next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name))
    return str(args["a"] + args["b"]) if name == "add" else "14:05"


@pytest.mark.slow
def test_an_agent_loop_through_the_openai_client(agent_llm):
    with serving(create_app(agent_llm)) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=WAIT_S)
        messages = [{"role": "user", "content": ASK}]
        first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="required",
                                               temperature=0, max_tokens=120)
        calls = first.choices[0].message.tool_calls
        assert first.choices[0].finish_reason == "tool_calls" and len(calls) >= 2  # a parallel call
        assert len({c.id for c in calls}) == len(calls)
        streamed = list(client.chat.completions.create(model="m", messages=messages, tools=TOOLS,
                                                       tool_choice="required", temperature=0, max_tokens=120,
                                                       stream=True))
        deltas = [d for c in streamed if c.choices for d in c.choices[0].delta.tool_calls or ()]
        for index, call in enumerate(calls):
            mine = [d for d in deltas if d.index == index]
            assert mine[0].function.name == call.function.name and mine[0].id
            assert "".join(d.function.arguments or "" for d in mine) == call.function.arguments
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": c.id, "content": _result(c.function.name, json.loads(
            c.function.arguments))} for c in calls]
        for _ in range(3):  # the agent goes on while the model calls (auto)
            answer = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, temperature=0,
                                                    max_tokens=40)
            message = answer.choices[0].message
            if not message.tool_calls:
                break
            messages.append(message.model_dump(exclude_none=True))
            messages += [{"role": "tool", "tool_call_id": c.id, "content": _result(c.function.name, json.loads(
                c.function.arguments))} for c in message.tool_calls]
        assert message.content and not message.tool_calls
    # every result went back in the family's own format
    calling = ToolCalling(TOOLS, None, agent_llm.chat_formatter.template)
    rendered = agent_llm.chat_formatter.render(calling.messages(messages[:2 + len(calls)]), add_generation_prompt=True,
                                               **calling.template_kwargs())
    results = [m["content"] for m in messages[2:2 + len(calls)]]
    if calling.format == "hermes":
        assert all(f"<tool_response>\n{r}\n</tool_response>" in rendered for r in results)
    else:  # one call per assistant turn, each result in an ipython turn
        assert rendered.count("<|start_header_id|>ipython<|end_header_id|>") == len(calls)


@pytest.mark.slow
def test_an_agent_loop_through_langchain(agent_llm):
    """LangChain's ChatOpenAI with bind_tools (tool_choice "any" is LangChain's "required"):
    a parallel call, ToolMessages with the results, then the answer."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    with serving(create_app(agent_llm)) as port:
        chat = ChatOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", model="m", temperature=0,
                          max_tokens=120, max_retries=0, timeout=WAIT_S)
        messages = [HumanMessage(ASK)]
        called = chat.bind_tools(TOOLS, tool_choice="any", parallel_tool_calls=True).invoke(messages)
        assert len(called.tool_calls) >= 2
        messages.append(called)
        messages += [ToolMessage(_result(c["name"], c["args"]), tool_call_id=c["id"]) for c in called.tool_calls]
        answer = chat.bind_tools(TOOLS, tool_choice="none").invoke(messages)
        assert answer.content and not answer.tool_calls
