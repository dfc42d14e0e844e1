"""Tool calls in the syntax of the families whose calls are not one JSON object: DeepSeek R1,
Command R7B, gpt-oss and Functionary v3.2, each with its real chat template (tests/reference/
chat_templates, from llama.cpp's models/templates) on a tiny random model; and what every
family shares: a reasoning block before the calls, markers the answer must show, a lazy
grammar that skips a long reasoning block in one pass.

How llama.cpp's parser reads these families' answers is tests/test_tool_call_reference.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgekv import Llama
from edgekv.api import reasoning
from edgekv.api.responses import tool_chat_chunks
from edgekv.api.tools import ToolCalling
from edgekv.grammar import LazyConstraint
from helpers.lazy_grammar import feed

TEMPLATES = Path(__file__).parent / "reference" / "chat_templates"
ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 999}}, "required": ["a", "b"]}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is 2 + 3?"}]
FAMILIES = {  # family -> (template, the architecture of the tiny model that carries it)
    "deepseek_r1": ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "qwen2"),
    "command_r": ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "llama"),
    "gpt_oss": ("openai-gpt-oss-120b.jinja", "llama"),
    "functionary": ("meetkai-functionary-medium-v3.2.jinja", "llama"),
    "ministral": ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", "llama"),
}
ARGS = '{"a": 2, "b": 3}'


def _template(family: str) -> str:
    return (TEMPLATES / FAMILIES[family][0]).read_text()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_required_call_in_the_familys_own_syntax(tiny_model, family):
    """Under tool_choice required a tiny random model writes the family's call (the grammar's
    doing), the reader gives it back with arguments valid for the schema, a stream carries the
    same, and the call and its result go back through the template."""
    template, arch = FAMILIES[family]
    path = tiny_model(arch, metadata={"tokenizer.chat_template": (TEMPLATES / template).read_text()})
    llm = Llama(str(path), n_ctx=8192)  # Command R's system prompt is 5k tokens of a tiny vocabulary
    kwargs = dict(tools=[ADD, WEATHER], tool_choice={"type": "function", "function": {"name": "add"}},
                  max_tokens=200, temperature=0.5, seed=3)
    r = llm.create_chat_completion(ASK, **kwargs)
    calls = r["choices"][0]["message"]["tool_calls"]
    assert calls and r["choices"][0]["finish_reason"] == "tool_calls"
    for call in calls:
        args = json.loads(call["function"]["arguments"])
        assert call["function"]["name"] == "add" and set(args) == {"a", "b"}
        assert all(isinstance(v, int) for v in args.values())
    chunks = list(llm.create_chat_completion(ASK, stream=True, **kwargs))
    streamed = "".join(d["function"].get("arguments", "") for c in chunks
                       for d in c["choices"][0]["delta"].get("tool_calls", ()) if d["index"] == 0)
    assert streamed == calls[0]["function"]["arguments"]
    follow = ASK + [r["choices"][0]["message"], {"role": "tool", "tool_call_id": calls[0]["id"], "content": "5"}]
    calling = ToolCalling([ADD, WEATHER], None, llm.chat_formatter.template)
    rendered = llm.chat_formatter.render(calling.messages(follow), add_generation_prompt=True,
                                         **calling.template_kwargs())
    assert "add" in rendered[rendered.index(ASK[0]["content"]):] and "5" in rendered


CALLS = {  # family -> an answer holding two calls to add, as the family writes it
    "deepseek_r1": ("Adding.</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n"
                    f"{ARGS}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{ARGS}\n"
                    "```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "command_r": ('<|START_THINKING|>Adding.<|END_THINKING|><|START_ACTION|>[\n    {"tool_call_id": "0", '
                  f'"tool_name": "add", "parameters": {ARGS}}},\n    {{"tool_call_id": "1", "tool_name": "add", '
                  f'"parameters": {ARGS}}}\n]<|END_ACTION|>'),
    "gpt_oss": ("<|channel|>analysis<|message|>Adding.<|end|><|start|>assistant<|channel|>commentary to=functions.add "
                f"<|constrain|>json<|message|>{ARGS}<|call|><|start|>assistant<|channel|>commentary to=functions.add "
                f"<|constrain|>json<|message|>{ARGS}<|call|>"),
    "functionary": f"add\n{ARGS}>>>add\n{ARGS}",
    "ministral": f"[THINK]Adding.[/THINK][TOOL_CALLS]add[ARGS]{ARGS}[TOOL_CALLS]add[ARGS]{ARGS}",
}


@pytest.mark.parametrize("family", sorted(CALLS))
def test_the_familys_answer_reads_as_reasoning_and_calls_streamed_or_whole(family):
    """The family's reasoning block goes to reasoning_content, its calls to tool_calls (the
    model's ids where it writes them), the same whole and streamed in pieces of 3 characters."""
    calling = ToolCalling([ADD], "auto", _template(family))
    text, opened = CALLS[family], family == "deepseek_r1"  # DeepSeek's prompt opens <think>
    thought, rest = reasoning.ReasoningSplitter(opened, calling.thinking).whole(text)
    content, calls, finish = calling.answer(rest, "stop")
    assert (thought.strip(), content, finish) == (("Adding." if family != "functionary" else ""), "", "tool_calls")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("add", {"a": 2, "b": 3})] * 2
    if family == "command_r":
        assert [c["id"] for c in calls] == ["0", "1"]
    if family == "ministral":  # Mistral's ids: 9 letters and digits (its templates refuse others)
        assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in calls)
    pieces = [(text[i:i + 3], "stop" if i + 3 >= len(text) else None, None) for i in range(0, len(text), 3)]
    chunks = list(tool_chat_chunks({}, iter(pieces), calling.reader(), reasoning.ReasoningSplitter(opened, calling.thinking)))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas).strip() == thought.strip()
    assert not "".join(d.get("content", "") for d in deltas)
    for index, call in enumerate(calls):
        assert "".join(t["function"].get("arguments", "") for d in deltas for t in d.get("tool_calls", ())
                       if t["index"] == index) == call["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("family, text, triggered, valid", [
    *((f, CALLS[f], True, True) for f in sorted(CALLS)),
    ("deepseek_r1", "Adding.</think>\n\nIt is 5.", False, True),
    ("deepseek_r1", "Adding.</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n"
     '{"a": "two"', True, False),  # not an integer
    ("command_r", "<|START_RESPONSE|>It is 5.<|END_RESPONSE|>", False, True),
    ("command_r", '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "sub"', True, False),  # no such function
    ("gpt_oss", "<|channel|>final<|message|>It is 5.", False, True),
    ("gpt_oss", '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2, "c": 3}', True, False),
    ("functionary", "all\nIt is 5.", False, True),
    ("functionary", 'add\n{"a": 2.5', True, False),
    ("ministral", "[THINK]Adding.[/THINK]It is 5.", False, True),
    # a call after text: triggered by the family's markers, as llama.cpp's trigger words
    ("deepseek_r1", "Adding.</think>\n\nLet me add." + CALLS["deepseek_r1"][len("Adding.</think>\n\n"):], True, True),
    ("command_r", "<|START_RESPONSE|>Adding.<|END_RESPONSE|>" + CALLS["command_r"][CALLS["command_r"].index("<|START_A"):],
     True, True),
    ("functionary", f"all\nLet me add.>>>add\n{ARGS}", True, True),
    ("ministral", f"Let me add.[TOOL_CALLS]add[ARGS]{ARGS}", True, True),
    ("ministral", '[TOOL_CALLS]add[ARGS]{"b": 3}', True, False),  # a is required
])
def test_auto_is_free_until_the_familys_call_starts(tiny_model, family, text, triggered, valid):
    """llama.cpp's lazy grammar in each family's syntax: free text until the answer (after its
    reasoning block) starts a call, then every token must keep the call valid."""
    path = tiny_model("qwen2")
    tokenizer = Llama(str(path), n_ctx=256).tokenizer_
    grammar = ToolCalling([ADD], "auto", _template(family)).grammar(opened=family == "deepseek_r1")
    constraint = LazyConstraint(grammar, tokenizer)
    allowed = feed(constraint, tokenizer, text)
    assert (constraint.inner is not None, allowed) == (triggered, valid)
    if triggered and valid:
        assert constraint.inner.matcher.is_accepting()


def test_a_long_reasoning_block_is_skipped_in_one_pass(tiny_model):
    """The lazy grammar looks for the trigger only once the reasoning block has closed (not at
    every token over the whole text so far), then triggers on the call after it."""
    path = tiny_model("qwen2")
    tokenizer = Llama(str(path), n_ctx=256).tokenizer_
    grammar = ToolCalling([ADD], "auto", (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()).grammar()
    matches, trigger = [], grammar.trigger

    class Counting:  # the trigger, counting where it is matched from
        groups = trigger.groups

        def match(self, text, pos=0, **kwargs):
            matches.append(pos)
            return trigger.match(text, pos, **kwargs)

    grammar.trigger = Counting()
    constraint = LazyConstraint(grammar, tokenizer)
    text = "<think>" + "Let me think about adding two numbers. " * 200 + "</think>\n\n<tool_call>\n" + \
        json.dumps({"name": "add", "arguments": {"a": 2, "b": 3}})
    history = [1]
    for token in tokenizer.encode(text, add_bos=False):
        constraint.apply(np.zeros(tokenizer.n_vocab, np.float32), history)
        history.append(token)
    constraint.apply(np.zeros(tokenizer.n_vocab, np.float32), history)
    grammar.trigger = trigger
    assert constraint.inner is not None
    assert 0 < len(matches) < 30 and min(matches) > len("<think>") + 200 * 39  # only after the block


def test_a_familys_markers_are_shown_even_when_they_are_control_tokens(tiny_model):
    """A marker the vocabulary has as a control token (skipped in answers) is shown where the
    answer's family needs it (llama-server's preserved tokens)."""
    tokenizer = Llama(str(tiny_model("qwen2")), n_ctx=256).tokenizer_
    special = next(t for t in ("<|im_start|>", "<|endoftext|>") if t in tokenizer.vocab.token_to_id)
    token = tokenizer.vocab.token_to_id[special]
    assert tokenizer.vocab.is_special(token)
    skipping = tokenizer.detokenizer(skip_special=True)
    keeping = tokenizer.detokenizer(skip_special=True, keep=tokenizer.ids_of([special, "<|no such token|>"]))
    assert skipping.push(token) == "" and keeping.push(token) == special


@pytest.mark.parametrize("template, arch", [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "qwen2"), ("meta-llama-Llama-3.2-3B-Instruct.jinja", "llama"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "llama"), ("Qwen3-Coder.jinja", "qwen2"),
    *(FAMILIES[f] for f in sorted(FAMILIES))])
def test_auto_text_is_what_the_model_writes_without_a_grammar(tiny_model, template, arch):
    """Free text under "auto" is not shaped in any family: the answer is the same tokens as
    the same prompt completed with no grammar (a tiny random model, two seeds)."""
    path = tiny_model(arch, metadata={"tokenizer.chat_template": (TEMPLATES / template).read_text()})
    llm = Llama(str(path), n_ctx=8192)
    prompt = llm.chat_prompt_tokens(ASK, tools=[ADD, WEATHER])
    for seed in (1, 2):
        answer = llm.create_chat_completion(ASK, tools=[ADD, WEATHER], max_tokens=24, temperature=0.8, seed=seed)
        free = llm.create_completion(prompt, max_tokens=24, temperature=0.8, seed=seed)["choices"][0]["text"]
        message = answer["choices"][0]["message"]
        assert "tool_calls" not in message and message["content"]
        assert message["content"].strip() in free


@pytest.mark.parametrize("family, text", [
    ("gpt_oss", "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>It is 5."),
    ("command_r", "<|START_THINKING|>Think.<|END_THINKING|><|START_RESPONSE|>It is 5.<|END_RESPONSE|>"),
])
def test_without_tools_a_familys_markers_are_not_content(family, text):
    """A family whose answers carry markers (gpt-oss's channels, Command R's response tags)
    answers a request without tools with its reasoning split off and the markers dropped."""
    calling = ToolCalling(None, None, _template(family))
    assert not calling.active and calling.markers
    pieces = [(text[i:i + 4], "stop" if i + 4 >= len(text) else None, None) for i in range(0, len(text), 4)]
    chunks = list(tool_chat_chunks({}, iter(pieces), calling.reader(), reasoning.ReasoningSplitter(False, calling.thinking)))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Think."
    assert "".join(d.get("content", "") for d in deltas) == "It is 5."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_mistral_small_call_ids_are_the_models():
    """Mistral Small 3.2 writes [CALL_ID]ID before [ARGS]: the call keeps that id."""
    calling = ToolCalling([ADD], "auto", (TEMPLATES / "Mistral-Small-3.2-24B-Instruct-2506.jinja").read_text())
    content, calls, finish = calling.answer(f"[TOOL_CALLS]add[CALL_ID]abc123XYZ[ARGS]{ARGS}", "stop")
    assert (calling.format, content, finish) == ("ministral", "", "tool_calls")
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("abc123XYZ", "add", ARGS)]
