"""How model families write a tool call: the written forms the reader (tool_reader.py) finds.

A `Form` is a call's head, from its first character to where its arguments' JSON object
starts (the function's name in group "name", a JSON string when `quoted`; the model's own call
id, where it writes one first, in group "id"), and its close: what follows the arguments'
object up to the call's end (group "more" when another call of the same block follows, whose
head is then `then`'s). A form without a close is a marker: text that is neither content nor
a call (Command R's <|START_RESPONSE|>, gpt-oss's final channel header), dropped.

The forms, as the families' templates and llama.cpp's parsers (common/chat*.cpp, its
models/templates) spell them:
  - JSON objects `{"name": ..., "arguments"|"parameters": {...}}` inside `<tool_call>` tags
    (Hermes 2 Pro, Qwen 2.5 and 3), a Markdown fence (what small models write freely), a JSON
    array (Mistral's, after [TOOL_CALLS], which the text may not show; an "id" may come last),
    after Llama 3.1's `<|python_tag|>`, or bare (Llama 3.x);
  - DeepSeek R1's `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n
    ```json\\n{...}\\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`;
  - Command R7B's `<|START_ACTION|>[{"tool_call_id": "0", "tool_name": NAME, "parameters":
    {...}}, ...]<|END_ACTION|>` (the model's ids kept, as llama.cpp keeps them);
  - gpt-oss's `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>`;
  - Functionary v3.2's `>>>NAME\\n{...}` (its generation prompt ends with `>>>`; `>>>all\\n`
    starts text);
  - the newer Mistral models' `[TOOL_CALLS]NAME[ARGS]{...}` (Ministral 3, Devstral; Mistral
    Small 3.2 writes `[CALL_ID]ID` before `[ARGS]`).
Qwen3-Coder's XML calls have parameters, not a JSON object: the reader reads them itself.
Which forms a reader looks for is its format's `forms(format)`: the distinctive ones always
(models do not always write their template's form), a family's markers and ambiguous forms
only for that family.
"""

from __future__ import annotations

from dataclasses import dataclass

import regex

_Q = r'"(?:[^"\\]|\\.)*"'  # a JSON string
# an object with the name first and the arguments next (the arguments must be an object)
_OBJ = rf'\{{\s*"name"\s*:\s*(?P<name>{_Q})\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{{)'
_END = rf'\s*(?:,\s*"id"\s*:\s*{_Q}\s*)?\}}'  # the object's end after its arguments (Mistral's "id" last)
_CR_OBJ = rf'\{{\s*"tool_call_id"\s*:\s*(?P<id>{_Q})\s*,\s*"tool_name"\s*:\s*(?P<name>{_Q})\s*,\s*"parameters"\s*:\s*(?=\{{)'


@dataclass(frozen=True)
class Form:
    head: regex.Pattern
    close: regex.Pattern | None = None  # None: a marker
    fallback: regex.Pattern | None = None  # the call's end when the close is not there (the object's end)
    then: Form | None = None
    quoted: bool = True
    starts: str = "{"  # the characters a head may start with


def _form(head: str, close: str | None = None, fallback: str | None = None, starts: str = "{",
          then: Form | None = None, quoted: bool = True) -> Form:
    return Form(regex.compile(head), None if close is None else regex.compile(close),
                None if fallback is None else regex.compile(fallback), then, quoted, starts)


_ARRAY_CLOSE = _END + r"\s*(?:(?P<more>,)|\])"
_CR_CLOSE = r"\s*\}\s*(?:(?P<more>,)|\]\s*(?:<\|END_ACTION\|>)?)"
TAGGED = _form(r"<tool_call>\s*" + _OBJ, _END + r"\s*</tool_call>", _END, "<")
FENCED = _form(r"```(?:json)?[ \t]*\n\s*" + _OBJ, _END + r"\s*```", _END, "`")
ARRAY = _form(r"(?:\[TOOL_CALLS\]\s*)?\[\s*" + _OBJ, _ARRAY_CLOSE, _END, "[", then=_form(_OBJ, _ARRAY_CLOSE, _END))
PYTHON_TAG = _form(r"<\|python_tag\|>\s*" + _OBJ, _END, _END, "<")
BARE = _form(_OBJ, _END, _END)
DEEPSEEK = _form(r"(?:<｜tool▁calls▁begin｜>\s*)?<｜tool▁call▁begin｜>\s*(?:function)?\s*<｜tool▁sep｜>\s*"
                 r"(?P<name>[^\s`<]+)\s*```(?:json)?\s*(?=\{)",
                 r"\s*```\s*<｜tool▁call▁end｜>(?:\s*<｜tool▁calls▁end｜>)?", starts="<", quoted=False)
COMMAND_R = _form(r"<\|START_ACTION\|>\s*\[\s*" + _CR_OBJ, _CR_CLOSE, r"\s*\}", "<",
                  then=_form(_CR_OBJ, _CR_CLOSE, r"\s*\}"))
GPT_OSS = _form(r"(?:<\|start\|>assistant)?(?:<\|channel\|>(?:commentary|analysis))?\s*to=functions\.(?P<name>[^\s<]+)"
                r"\s*(?:<\|channel\|>\w+\s*)?(?:<\|constrain\|>\s*\w+\s*)?<\|message\|>\s*(?=\{)",
                r"\s*(?:<\|call\|>)?", starts="< t", quoted=False)
MINISTRAL = _form(r"\[TOOL_CALLS\]\s*(?P<name>[^\s\[\]{}]+?)(?:\[CALL_ID\](?P<id>[A-Za-z0-9]+))?\[ARGS\]\s*(?=\{)",
                  r"", starts="[", quoted=False)
FUNCTIONARY = _form(r">>>(?P<name>[^\s>]+)\n(?=\{)", r"", starts=">", quoted=False)

_DISTINCT = (TAGGED, FENCED, ARRAY, MINISTRAL, PYTHON_TAG, DEEPSEEK, COMMAND_R, BARE)
_OWN = {  # a family's markers and its ambiguous forms
    "llama3": (_form(r";\s*(?=\{)", starts=";"),),  # between two calls
    "deepseek_r1": (_form(r"<｜tool▁calls▁end｜>", starts="<"),),  # after a call that did not close its block
    "command_r": (_form(r"<\|(?:START|END)_RESPONSE\|>|<\|END_ACTION\|>", starts="<"),),
    "gpt_oss": (GPT_OSS, _form(r"(?:<\|start\|>assistant)?<\|channel\|>final<\|message\|>", starts="<"),
                _form(r"<\|(?:end|return|call)\|>", starts="<")),
    "functionary": (FUNCTIONARY, _form(r">>>all\n", starts=">")),
}
# text a family's reader sees before the answer (the end of its generation prompt)
LEADS = {"functionary": ">>>"}
# a family's reasoning block, where it has its own (else <think> ... </think>)
THINKING = {"command_r": ("<|START_THINKING|>", "<|END_THINKING|>"), "ministral": ("[THINK]", "[/THINK]"),
            "gpt_oss": ("<|channel|>analysis<|message|>", "<|end|>")}
# the texts a family's models write as single (often control) tokens that its answers must show
MARKERS = {
    "llama3": ("<|python_tag|>",),
    "mistral": ("[TOOL_CALLS]",),
    "ministral": ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
    "deepseek_r1": ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
                    "<｜tool▁calls▁end｜>"),
    "command_r": ("<|START_THINKING|>", "<|END_THINKING|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>",
                  "<|START_ACTION|>", "<|END_ACTION|>"),
    "gpt_oss": ("<|channel|>", "<|message|>", "<|constrain|>", "<|start|>", "<|end|>", "<|call|>"),
}


def family(template: str) -> str:
    """The tool call family of a chat template, by the markup it writes calls with (as
    llama.cpp tells its templates apart): hermes, llama3, mistral, ministral, qwen3_coder,
    deepseek_r1, command_r, gpt_oss, functionary, or json (any other)."""
    if "<function=" in template and "<parameter=" in template:  # Qwen3-Coder's XML calls
        return "qwen3_coder"
    if "<｜tool▁calls▁begin｜>" in template:  # DeepSeek R1 and its distills
        return "deepseek_r1"
    if "<|START_ACTION|>" in template:  # Command R7B
        return "command_r"
    if "<|channel|>" in template and "<|start|>assistant" in template:  # gpt-oss (the harmony format)
        return "gpt_oss"
    if ">>>all" in template:  # Functionary v3.2
        return "functionary"
    if "<tool_call>" in template and "tools" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template and "[ARGS]" in template:  # Ministral 3, Mistral Small 3.2, Devstral
        return "ministral"
    if "[TOOL_CALLS]" in template and "[AVAILABLE_TOOLS]" in template:  # Mistral 7B v0.3, Nemo, Small 3.1
        return "mistral"
    if '"parameters": dictionary of argument name' in template:  # Llama 3.1, 3.2, 3.3
        return "llama3"
    return "json"


def forms(family: str) -> tuple[Form, ...]:
    """The forms a reader for `family`'s answers looks for, in the order it tries them."""
    return _OWN.get(family, ()) + _DISTINCT
