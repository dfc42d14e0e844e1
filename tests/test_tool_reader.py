"""Reading tool calls out of answers as models write them (edgekv/api/tool_reader.py; issue 50):
scripted answers, no model. Each answer is fed whole and cut into pieces of every size the
loop below tries: the stream's content and calls, put together as an OpenAI client does, must
equal the whole answer's message, and both the expected ones.

The expectations are written here from the forms' definitions (the Hermes 2 Pro / Qwen 2.5
templates' `<tool_call>`, and the fenced and bare JSON the issue saw Qwen2.5-Coder-1.5B write);
reference data from llama.cpp's own parser (common_chat_parse, built from the vendored tree) is
owed (issue 50's checks)."""

from __future__ import annotations

import json

import pytest

from edgekv.api.tool_reader import CallReader

NAMES = {"get_weather", "add"}
LYON = '{"name": "get_weather", "arguments": {"city": "Lyon"}}'
PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def read(text: str, size: int, parallel: bool = True, reason: str = "stop") -> tuple[str | None, list, str, list]:
    """(content, [(index, name, arguments)], finish reason, deltas) of `text` streamed in
    pieces of `size` characters, checked against the same text read whole."""
    reader = CallReader(NAMES, parallel=parallel)
    deltas = [d for i in range(0, len(text), size) for d in reader.push(text[i:i + size])]
    last, finish = reader.finish(reason)
    deltas += last
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict] = {}
    for d in deltas:
        for part in d.get("tool_calls", []):
            if "id" in part:
                assert part["index"] not in calls and part["function"]["arguments"] == ""
                calls[part["index"]] = dict(name=part["function"]["name"], id=part["id"], arguments="")
            else:
                calls[part["index"]]["arguments"] += part["function"]["arguments"]
    streamed = [(i, c["name"], c["arguments"]) for i, c in sorted(calls.items())]
    whole = [(i, c["function"]["name"], c["function"]["arguments"]) for i, c in enumerate(reader.calls() or [])]
    cut = finish != "tool_calls" and len(streamed) == len(whole) + 1  # the last call, cut short, is no call
    assert streamed[:len(whole)] == whole and (len(streamed) == len(whole) or cut), (streamed, whole)
    assert content == reader.content
    return content or None, whole, finish, deltas


def expect(text: str, content: str | None, calls: list[tuple[str, dict]], finish: str, **kwargs) -> None:
    for size in (1, 2, 3, 5, 8, 13, len(text)):
        got_content, got_calls, got_finish, _ = read(text, size, **kwargs)
        assert got_content == content, (size, got_content)
        assert [(name, json.loads(args)) for _, name, args in got_calls] == calls, size
        assert got_finish == finish


@pytest.mark.parametrize("text", [
    f"<tool_call>\n{LYON}\n</tool_call>",  # the template's own form
    f"```json\n{LYON}\n```",  # what Qwen2.5-Coder-1.5B wrote under "auto" (issue 50)
    f"```\n{LYON}\n```",
    LYON,  # bare
    f"[{LYON}]",  # Mistral's array
    f"\n\n<tool_call>\n{LYON}\n</tool_call>\n",
    '{"name":"get_weather","parameters":{"city":"Lyon"}}',  # Llama 3.x's key
])
def test_one_call_in_each_written_form(text):
    expect(text, None, [("get_weather", {"city": "Lyon"})], "tool_calls")


@pytest.mark.parametrize("text", [
    f"<tool_call>\n{LYON}\n</tool_call>\n<tool_call>\n{PARIS}\n</tool_call>",
    f"```json\n{LYON}\n```\n\n```json\n{PARIS}\n```",
    f"{LYON}\n{PARIS}",
    f"[{LYON}, {PARIS}]",  # Mistral's array (its [TOOL_CALLS] token writes no text)
    f'[{LYON[:-1]}, "id": "a1B2c3D4e"}},\n {PARIS[:-1]}, "id": "Z9y8X7w6v"}}]',  # with the ids its template writes
])
def test_two_calls_in_one_answer(text):
    expect(text, None, [("get_weather", {"city": "Lyon"}), ("get_weather", {"city": "Paris"})], "tool_calls")
    _, _, _, deltas = read(text, 4)
    heads = [part for d in deltas for part in d.get("tool_calls", []) if "id" in part]
    assert [h["index"] for h in heads] == [0, 1] and heads[0]["id"] != heads[1]["id"]


def test_parallel_tool_calls_false_keeps_the_first_call_and_the_rest_is_content():
    text = f"<tool_call>\n{LYON}\n</tool_call>\n<tool_call>\n{PARIS}\n</tool_call>"
    expect(text, f"<tool_call>\n{PARIS}\n</tool_call>", [("get_weather", {"city": "Lyon"})], "tool_calls",
           parallel=False)


def test_text_before_and_after_a_call_is_content():
    text = f"Let me look that up.\n<tool_call>\n{LYON}\n</tool_call>\nOne moment."
    expect(text, "Let me look that up.\nOne moment.", [("get_weather", {"city": "Lyon"})], "tool_calls")


@pytest.mark.parametrize("text", [
    'Sure!\n```json\n{"name": "say_hi", "arguments": {"language": "French"}}\n```',  # not an offered function
    "```python\nprint({'name': 1})\n```",  # a fence that is no call
    'Use {"name": "x"} or {"city": "Lyon"} {',  # braces in prose, one left open at the end
    "Bonjour ! Comment puis-je vous aider ?",
    "  two spaces first, a newline last\n",
])
def test_what_is_not_a_call_is_content_as_written(text):
    expect(text, text, [], "stop")


def test_a_held_opening_is_sent_once_it_is_known():
    reader = CallReader(NAMES)
    assert reader.push("Here:\n```js") == [{"content": "Here:"}]  # the fence may still open a call
    assert reader.push("on\n{\"name\": \"get_") == []
    head, arguments = reader.push('weather", "arguments": {')
    [call] = head["tool_calls"]
    assert call["index"] == 0 and call["function"] == {"name": "get_weather", "arguments": ""}
    assert arguments == {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}
    reader = CallReader(NAMES)
    assert reader.push("```js") == [] and reader.push("x = 1") == [{"content": "```jsx = 1"}]


def test_a_call_cut_by_max_tokens_finishes_with_its_reason_and_what_it_has():
    text = f'Checking.\n<tool_call>\n{LYON}\n</tool_call>\n<tool_call>\n{{"name": "add", "arguments": {{"a": 1'
    content, calls, finish, deltas = read(text, 3, reason="length")
    assert content == "Checking." and [c[1] for c in calls] == ["get_weather"] and finish == "length"
    sent = "".join(p["function"]["arguments"] for d in deltas for p in d.get("tool_calls", []) if p["index"] == 1)
    assert sent == '{"a": 1'


def test_arguments_that_are_not_json_stay_the_models_text():
    # OpenAI's arguments are the model's text too ("does not always generate valid JSON")
    _, calls, finish, _ = read('<tool_call>\n{"name": "get_weather", "arguments": {"city": Lyon}}\n</tool_call>', 2)
    assert calls == [(0, "get_weather", '{"city": Lyon}')] and finish == "tool_calls"


@pytest.mark.parametrize("text", [
    '{"name":"get_weather","arguments":{"city":"a}\\"{[","unit":"celsius"}}',
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2, "s": "}}</tool_call>"}}\n</tool_call>',
])
def test_braces_and_quotes_inside_strings_do_not_end_the_arguments(text):
    arguments = json.loads(text[text.index('"arguments"') + 12:].split("\n</tool_call>")[0][:-1])
    name = json.loads(text[text.index("{"):].split("\n</tool_call>")[0])["name"]
    expect(text, None, [(name, arguments)], "tool_calls")


SCHEMAS = {"get_weather": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                                           "zip": {"type": "string"}}},
           "add": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}
XML_LYON = "<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n</function>\n</tool_call>"


@pytest.mark.parametrize("text, content, calls", [
    (XML_LYON, None, [("get_weather", {"city": "Lyon"})]),
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nSaint-\u00c9tienne <Loire>\n</parameter>\n"
     "<parameter=days>\n3\n</parameter>\n<parameter=zip>\n042\n</parameter>\n</function>\n</tool_call>",
     None, [("get_weather", {"city": "Saint-\u00c9tienne <Loire>", "days": 3, "zip": "042"})]),  # typed by the schema
    (f"I will check both.\n{XML_LYON}\n<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n"
     "<parameter=b>\n2\n</parameter>\n</function>\n</tool_call>",
     "I will check both.", [("get_weather", {"city": "Lyon"}), ("add", {"a": 1, "b": 2})]),
    ("<tool_call>\n<function=get_weather>\n</function>\n</tool_call>", None, [("get_weather", {})]),
    ("<tool_call>\n<function=say_hi>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
     "<tool_call>\n<function=say_hi>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>", []),
])
def test_qwen3_coder_xml_calls(text, content, calls):
    for size in (1, 3, 7, len(text)):
        reader = CallReader(NAMES, schemas=SCHEMAS)
        deltas = [d for i in range(0, len(text), size) for d in reader.push(text[i:i + size])]
        last, finish = reader.finish("stop")
        deltas += last
        assert "".join(d.get("content", "") for d in deltas) == (content or "") == reader.content
        got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reader.calls() or []]
        assert got == calls and finish == ("tool_calls" if calls else "stop")
        for index, call in enumerate(reader.calls() or []):  # the stream's pieces are the arguments' text
            pieces = [p["function"]["arguments"] for d in deltas for p in d.get("tool_calls", []) if p["index"] == index]
            assert "".join(pieces) == call["function"]["arguments"]


def test_a_qwen3_coder_call_cut_short_is_no_call():
    reader = CallReader(NAMES, schemas=SCHEMAS)
    reader.push("<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2")
    assert reader.finish("length")[1] == "length" and reader.calls() is None


def test_call_ids_come_from_the_readers_maker():
    reader = CallReader(NAMES, new_id=lambda: "a1B2c3D4e")
    reader.push(f"[{LYON}]")
    assert reader.finish("stop")[1] == "tool_calls" and reader.calls()[0]["id"] == "a1B2c3D4e"
