"""Tool calls read as llama.cpp's own chat parser reads them, per model family.

tests/reference/tool_calls.json holds scripted model outputs (each family's written forms, text
before a call, two calls, a call to an unknown function, streams cut short) and what
`common_chat_parse` of the llama.cpp in llama-cpp-python 0.3.36 made of each, with the
family's real chat template (tools/make_tool_call_reference.py says how). edgekv reads the same
text as create_chat_completion does (reasoning_format auto: a leading reasoning block split
off, then the calls read out of the rest) and must give the same calls, arguments, ids,
content and reasoning; whitespace at the ends of content and reasoning aside (llama.cpp keeps
some, edgekv drops it). Where edgekv reads on purpose what llama.cpp refuses or leaves as
text, `DIFFERENT` says what edgekv gives and why.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgekv.api import reasoning
from edgekv.api.tools import ToolCalling

REFERENCE = json.loads((Path(__file__).parent / "reference" / "tool_calls.json").read_text())
WEATHER = ("get_weather", {"city": "Lyon"})
TWO = [WEATHER, ("get_time", {"timezone": "CET"})]
GREETING = "Hello! How can I help you today?"
AFTER = "I will wait for the result."
UNKNOWN = "a call to a function the request does not offer stays text (llama.cpp fails the answer)"
# (template, output index) -> (content, [(name, arguments)]) where edgekv differs, and why
DIFFERENT = {
    **{(t, 4): (None, []) for t in (  # content: the output's text, below
        "Qwen-Qwen2.5-7B-Instruct.jinja", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
        "Qwen-Qwen3-0.6B.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
        "mistralai-Mistral-Nemo-Instruct-2407.jinja", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "meetkai-functionary-medium-v3.2.jinja",
        "openai-gpt-oss-120b.jinja", "Qwen3-Coder.jinja", "mistralai-Ministral-3-14B-Reasoning-2512.jinja")},
    # (llama.cpp drops Qwen3-Coder's and Ministral's, where it does not fail)
    # Qwen 2.5 Coder answers with fenced or bare JSON calls (issue 50): llama.cpp leaves them as text
    **{(t, i): ("", [WEATHER]) for t in ("Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja",
                                         "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja") for i in (8, 9)},
    # two Llama 3 calls separated by "; " (llama.cpp: an error); <|python_tag|> is a control
    # token real models write, which the answer never shows (llama.cpp keeps its text as content)
    **{(t, i): r for t in ("meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja")
       for i, r in ((2, ("", TWO)), (8, ("", [WEATHER])))},
    # Mistral writes a call's id after its arguments: a stream sends the id first, so edgekv
    # gives its own (9 letters and digits, as the templates want), in streams and messages alike
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", 1): ("", [WEATHER]),
    # Mistral: two calls in the array, text before [TOOL_CALLS] (llama.cpp: errors)
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", 2): ("", TWO),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", 3): ("Let me check.", [WEATHER]),
    # text without the family's response markers is text (llama.cpp: an error)
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", 0): (GREETING, []),
    ("meetkai-functionary-medium-v3.2.jinja", 0): (GREETING, []),
    ("openai-gpt-oss-120b.jinja", 0): (GREETING, []),
    # Functionary's >>> between two calls, and a call after text (llama.cpp: an error; the call left in the text)
    ("meetkai-functionary-medium-v3.2.jinja", 2): ("", TWO),
    ("meetkai-functionary-medium-v3.2.jinja", 3): ("Let me check.", [WEATHER]),
    # gpt-oss: a second call after <|start|>assistant (llama.cpp keeps the first only)
    ("openai-gpt-oss-120b.jinja", 2): ("", TWO),
    # text after a call is content, as OpenAI's messages carry both (llama.cpp: an error, or dropped)
    **{(t, i): (AFTER, [WEATHER]) for t, i in (
        ("Qwen-Qwen2.5-7B-Instruct.jinja", 10), ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", 10),
        ("Qwen-Qwen3-0.6B.jinja", 10), ("meta-llama-Llama-3.1-8B-Instruct.jinja", 9),
        ("meta-llama-Llama-3.2-3B-Instruct.jinja", 9), ("mistralai-Mistral-Nemo-Instruct-2407.jinja", 8),
        ("Qwen3-Coder.jinja", 8), ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", 9))},
    # Mistral Small 3.2's calls carry [CALL_ID] before [ARGS], as its template writes them (llama.cpp: an error)
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", 0): ("", [WEATHER]),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", 1): ("", TWO),
}


def _outputs():
    for case in REFERENCE["cases"]:
        for i, (output, result) in enumerate(zip(case["outputs"], case["llama_cpp"]["results"])):
            yield pytest.param(case, i, output, result, id=f"{case['template'].removesuffix('.jinja')}-{i}")


def read(case: dict, text: str, partial: bool, piece: int = 0) -> tuple[str, str, list[tuple[str, str, str]]]:
    """(reasoning, content, [(name, arguments, id)]) as create_chat_completion reads `text`
    (streamed and cut short where partial: the calls begun so far, with their arguments so far;
    piece: streamed in pieces of that many characters, else at once)."""
    template = (Path(__file__).parent / "reference" / "chat_templates" / case["template"]).read_text()
    calling = ToolCalling(case["tools"], "auto", template, case["parallel"])
    splitter = reasoning.ReasoningSplitter(reasoning.opened_by(case["llama_cpp"]["prompt"], calling.thinking[0]),
                                           calling.thinking)
    reader, thought, deltas = calling.reader(), "", []
    pieces = [text[i:i + piece] for i in range(0, len(text), piece)] if piece else [text]
    for i, chunk in enumerate(pieces):
        r, rest = splitter.whole(chunk) if i == len(pieces) - 1 and not partial else splitter.push(chunk)
        thought += r
        deltas += reader.push(rest)
    deltas += [] if partial else reader.finish("stop")[0]
    content, calls = "", {}
    for delta in deltas:
        content += delta.get("content", "")
        for d in delta.get("tool_calls", ()):
            call = calls.setdefault(d["index"], [d.get("function", {}).get("name"), "", d.get("id")])
            call[1] += d["function"].get("arguments", "")
    return thought, content, [tuple(c) for c in calls.values()]


def _same_arguments(ours: str, theirs: str, partial: bool) -> bool:
    if partial:  # text so far: compare without the spaces between tokens (llama.cpp's XML arguments are compact)
        return ours.replace(" ", "") == theirs.replace(" ", "")
    return json.loads(ours) == json.loads(theirs)


@pytest.mark.parametrize("case, i, output, result", list(_outputs()))
def test_calls_read_as_llama_cpp_reads_them(case, i, output, result):
    partial = output.get("partial", False)
    thought, content, calls = read(case, output["text"], partial)
    key = (case["template"], i)
    if key in DIFFERENT:
        want_content, want_calls = DIFFERENT[key]
        assert [(n, json.loads(a)) for n, a, _ in calls] == [(n, a) for n, a in want_calls], (UNKNOWN, calls)
        if want_content is not None:
            assert content.strip() == want_content
        else:  # the unknown call's text is content (its markers aside)
            assert "say_hi" in content
        return
    assert "error" not in result, f"llama.cpp refused this output ({result}): say in DIFFERENT what edgekv does"
    assert thought.strip() == result["reasoning_content"].strip()
    assert content.strip() == result["content"].strip()
    assert [n for n, _, _ in calls] == [c["name"] for c in result["tool_calls"]]
    for (name, arguments, call_id), theirs in zip(calls, result["tool_calls"]):
        assert _same_arguments(arguments, theirs["arguments"], partial), (name, arguments, theirs)
        if theirs["id"]:  # the model's own id (Command R), which llama.cpp keeps
            assert call_id == theirs["id"]


def test_the_families_as_llama_cpp_tells_them_apart():
    """The family each template is read as, beside the format name llama.cpp's parser chose."""
    families = {c["template"]: ToolCalling(c["tools"], "auto", (Path(__file__).parent / "reference" / "chat_templates"
                                                                / c["template"]).read_text()).format
                for c in REFERENCE["cases"]}
    assert families == {c["template"]: c["family"] for c in REFERENCE["cases"]}


@pytest.mark.parametrize("case", [c for c in REFERENCE["cases"] if any(t["type"] == "word" for t in c["llama_cpp"]["triggers"])],
                         ids=lambda c: c["template"].removesuffix(".jinja"))
def test_llama_cpps_trigger_words_start_a_call_anywhere(case):
    """Each word that triggers llama.cpp's lazy grammar for the template may start edgekv's
    trigger anywhere in an answer (text before it, then the word, is not yet free text)."""
    calling = ToolCalling(case["tools"], "auto", (Path(__file__).parent / "reference" / "chat_templates"
                                                  / case["template"]).read_text())
    lazy = calling.grammar()
    for trigger in (t["value"] for t in case["llama_cpp"]["triggers"] if t["type"] == "word"):
        text = "Some text first. " + trigger
        m = lazy.anywhere.search(text, partial=True)
        assert m is not None and m.start() <= len("Some text first. "), (trigger, lazy.anywhere.pattern)


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=lambda c: c["template"].removesuffix(".jinja"))
def test_a_stream_cut_anywhere_carries_the_whole_answer(case):
    """Each whole output streamed one character at a time (every cut a stream can see) gives
    the same reasoning, content and calls as the output read whole."""
    for output in (o for o in case["outputs"] if not o.get("partial")):
        (thought, content, calls), whole = read(case, output["text"], False, piece=1), read(case, output["text"], False)
        assert (thought, content) == whole[:2], output["text"]
        assert [c[:2] for c in calls] == [c[:2] for c in whole[2]], output["text"]  # (the ids are new ones)
