"""Grammars for tool call answers, in each template family's own syntax (tool_forms.py).

What lives here: `required_grammar` (tool_choice "required" or a named function: the answer
is calls, one or several) and `lazy_grammar` ("auto": free text unless the answer starts a
call, as llama.cpp's lazy grammars, then calls). Arguments follow the function's `parameters`
schema (additionalProperties false unless it says otherwise), through llguidance's %json.
Two kinds of family:
  - the JSON-object families (hermes, mistral, llama3, json): a call is one object with the
    name and the arguments; under auto the answer may start one in any of the forms the
    reader knows (tags, a fence, an array, bare);
  - the arguments-only families (deepseek_r1, command_r, gpt_oss, functionary, ministral): a head names
    the function, then its arguments object, then a tail (`_SYNTAX`); their markers are
    written as text (a model whose vocabulary has them as control tokens spells them out).
Qwen3-Coder's XML calls have rules of their own (`_xml_rules`).
What does not live here: reading the calls back (tool_reader.py), the prompt (tools.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import regex

from ..grammar import Grammar, LazyGrammar
from .tool_forms import MARKERS, THINKING


@dataclass(frozen=True)
class _Syntax:
    """How an arguments-only family writes a block of calls, as Lark fragments: the block's
    opening, the text between two calls, its closing, a call's head (by function name) and
    tail ("" where there is none); `trigger`: the regex (its group 1 where the grammar starts) of a block's start."""
    open: str
    sep: str
    close: str
    head: str  # with {name}: the function's name as a Lark string's content
    tail: str
    trigger: str | None  # searched for anywhere in the answer


_SYNTAX = {
    "deepseek_r1": _Syntax('"<｜tool▁calls▁begin｜>"', '"\\n"', '"<｜tool▁calls▁end｜>"',
                           '"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\\n```json\\n"',
                           '"\\n```<｜tool▁call▁end｜>"', r"\s*(<｜tool▁calls▁begin｜>)"),
    "command_r": _Syntax('"<|START_ACTION|>[\\n    "', '",\\n    "', '"\\n]<|END_ACTION|>"',
                         '"{{\\"tool_call_id\\": \\"" /[0-9]{{1,4}}/ "\\", \\"tool_name\\": \\"{name}\\", \\"parameters\\": "',
                         '"}"', r"\s*(<\|START_ACTION\|>)"),
    "gpt_oss": _Syntax("", '"<|start|>assistant"', "",
                       '"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"', '"<|call|>"',
                       r"(?:<\|start\|>assistant)?(<\|channel\|>commentary to=functions\.)"),
    "functionary": _Syntax("", '">>>"', "", '"{name}\\n"', "", None),
    "ministral": _Syntax("", "", "", '"[TOOL_CALLS]{name}[ARGS]"', "", r"\s*(\[TOOL_CALLS\])"),
}


def required_grammar(functions: list[dict], family: str, parallel: bool) -> Grammar:
    """The answer is calls to `functions` (one unless parallel), in the family's syntax."""
    if family == "qwen3_coder":
        calls = 'xcall ("\\n" xcall)*' if parallel else "xcall"
        return Grammar.from_lark(f"start: {calls}\n{_xml_rules(functions, strict=True)}")
    if family in _SYNTAX:
        syntax = _SYNTAX[family]
        return Grammar.from_lark(_args_grammar(functions, syntax, parallel, flexible=False))
    call = _call_schema(functions, arguments_key(family), flexible=False)
    if family == "hermes":  # one call per line
        rules = f'call: "<tool_call>\\n" %json {call} "\\n</tool_call>"'
        calls = 'call ("\\n" call)*' if parallel else "call"
    elif family == "mistral":  # a JSON array of calls (the template's [TOOL_CALLS] form)
        rules = f"call: %json {call}"
        calls = '"[" call (", " call)* "]"' if parallel else '"[" call "]"'
    else:  # bare objects (Llama 3.x: several separated by "; ", as the reader reads them)
        rules = f"call: %json {call}"
        calls = 'call ("; " call)*' if parallel and family == "llama3" else "call"
    return Grammar.from_lark(f"start: {calls}\n{rules}")


def lazy_grammar(functions: list[dict], family: str, parallel: bool, opened: bool = False) -> LazyGrammar:
    """auto, as llama.cpp's lazy grammars do it: the answer is free until it starts a call to
    one of the functions, then it is calls whose arguments follow the parameters. A call in
    the family's own markup (`<tool_call>`, [TOOL_CALLS], DeepSeek's and Command R's blocks, ...)
    triggers wherever it starts, as llama.cpp's trigger words do; the forms that could also be
    text (a Markdown fence, an array, bare JSON) only at the answer's start. Both after a
    reasoning block (`opened`: the prompt already opened one). The JSON-object families'
    triggers end at the function's name."""
    block = (None if opened else "<think>", "</think>")
    if family in THINKING:
        block = (None if opened else THINKING[family][0], THINKING[family][1])
    markers = MARKERS.get(family, ())
    names = [regex.escape(f["name"]) for f in functions]
    if family in _SYNTAX:
        syntax = _SYNTAX[family]
        grammar = Grammar.from_lark(_args_grammar(functions, syntax, parallel, flexible=True))
        if family == "functionary":  # a call at the start, or after >>> (llama.cpp's trigger)
            called = "|".join(names)
            return LazyGrammar(grammar, rf"((?:{called})\n)", markers, block, rf">>>((?:{called})\n)")
        return LazyGrammar(grammar, None, markers, block, syntax.trigger)
    ws = r"[ \t\r\n]*"  # JSON's whitespace, the grammar's WS (not \s: no other space may start a call)
    head = rf'\{{{ws}"name"{ws}:{ws}(?:{"|".join(regex.escape(json.dumps(f["name"])) for f in functions)})'
    xml = rf'(?:<tool_call>\s*)?<function=(?:{"|".join(names)})>'  # Qwen3-Coder's (the tag may be left out)
    start = rf"\s*((?:<tool_call>{ws}|<\|python_tag\|>{ws}|```(?:json)?[ \t]*\n{ws}|\[{ws})?{head}|{xml})"
    anywhere = rf"(<tool_call>{ws}{head}|<\|python_tag\|>{ws}{head}|{xml})|\[TOOL_CALLS\]{ws}(\[{ws}{head})"
    calls, array = ("(WS? call)+ WS?", '(WS? "," WS? body)*') if parallel else ("call WS?", "")
    return LazyGrammar(Grammar.from_lark(
        f"start: {calls}\n"
        'call: "<tool_call>" WS? body WS? "</tool_call>" | FENCE WS? body WS? "```" | body\n'
        f'    | "[" WS? body {array} WS? "]" | "<|python_tag|>" WS? body | xcall\n'
        f"{_xml_rules(functions, strict=False)}\n"
        f"body: %json {_call_schema(functions, arguments_key(family), flexible=True)}\n"
        "FENCE: /```(json)?[ \\t]*\\n/\n"
        "WS: /[ \\t\\r\\n]+/"), start, markers, block, anywhere)


def arguments_key(family: str) -> str:
    """The key of a call's arguments in the model's JSON object."""
    return "parameters" if family == "llama3" else "arguments"


def _args_grammar(functions: list[dict], syntax: _Syntax, parallel: bool, flexible: bool) -> str:
    """A Lark grammar for an arguments-only family's block of calls: each a head naming one of
    `functions`, that function's arguments, the tail; flexible: any JSON whitespace in the
    arguments (what a model writes freely), else none beyond json.dumps's."""
    alternatives = []
    for f in functions:
        name = json.dumps(f["name"])[1:-1]  # the name's text as a Lark string's content
        schema = json.dumps({**_closed(f.get("parameters") or {"type": "object"}),
                             "x-guidance": {"whitespace_flexible": flexible}})
        alternatives.append(f"{syntax.head.format(name=name)} %json {schema}")
    calls = f"call ({syntax.sep} call)*" if parallel else "call"
    start = " ".join(part for part in (syntax.open, calls, syntax.close) if part)
    return f"start: {start}\ncall: ({' | '.join(alternatives)}) {syntax.tail}"


def _call_schema(functions: list[dict], key: str, flexible: bool) -> str:
    """The JSON schema of a call to one of `functions`: {"name": ..., key: arguments}."""
    return json.dumps({"x-guidance": {"whitespace_flexible": flexible}, "anyOf": [{
        "type": "object", "properties": {"name": {"const": f["name"]},
                                         key: _closed(f.get("parameters") or {"type": "object"})},
        "required": ["name", key], "additionalProperties": False} for f in functions]})


def _closed(schema: dict) -> dict:
    """The parameters schema with additionalProperties false unless it says otherwise: a
    call holds only the declared arguments (OpenAI's strict mode requires the same), and a
    small model cannot wander off into invented ones until max_tokens."""
    if schema.get("type") == "object" and "additionalProperties" not in schema:
        return dict(schema, additionalProperties=False)
    return schema


# a Qwen3-Coder parameter's value and closing tag by its schema type; text (strings, and what the
# grammar does not type) is anything up to the first closing tag, in one lexeme with it (llguidance's
# lexemes are greedy: text alone would swallow the tag's start)
_XML_VALUES = {"integer": 'XINT "\\n</parameter>\\n"', "number": 'XNUM "\\n</parameter>\\n"',
               "boolean": '("true" | "false") "\\n</parameter>\\n"'}
_XML_TERMINALS = ("XTEXT: /(.|\\n)*\\n<\\/parameter>\\n/ & ~/(.|\\n)*<\\/parameter>(.|\\n)*<\\/parameter>(.|\\n)*/\n"
                  "XINT: /-?(0|[1-9][0-9]{0,18})/\n"  # what fits in 64 bits (a value must end)
                  "XNUM: /-?(0|[1-9][0-9]{0,18})(\\.[0-9]{1,17})?([eE][+-]?[0-9]{1,3})?/")


def _xml_rules(functions: list[dict], strict: bool) -> str:
    """Lark rules `xcall` for Qwen3-Coder's XML calls to `functions`: each parameter's key is
    one of the function's, its value typed as above; the required parameters come first, in
    the schema's order, each once, then any of the others; strict: one newline between the
    tags, as the template writes them (else any whitespace, and the <tool_call> tags optional)."""
    calls, rules = [], []
    for i, f in enumerate(functions):
        parameters = f.get("parameters") or {}
        props = {k: v for k, v in (parameters.get("properties") or {}).items() if isinstance(v, dict)}
        required = [k for k in parameters.get("required") or [] if k in props]
        param = {key: f'{json.dumps(f"<parameter={key}>")} "\\n" {_XML_VALUES.get(spec.get("type"), "XTEXT")}'
                 for key, spec in props.items()}
        optional = [param[k] for k in props if k not in required]
        body = " ".join([*(param[k] for k in required), *([f"xp{i}*"] if optional else [])])
        head = json.dumps(f"<function={f['name']}>")
        calls.append(f'{head} "\\n" {body} "</function>"')
        if optional:
            rules.append(f"xp{i}: " + " | ".join(optional))
    # the tags as lexemes of their own, as the JSON forms' grammar has them (<tool_call> starts both)
    ws = '"\\n"' if strict else "XWS"
    untagged = "" if strict else f' | ({" | ".join(calls)})'  # a function without the tag, as llama.cpp takes it
    return "\n".join([f'xcall: "<tool_call>" {ws} ({" | ".join(calls)}) {ws} "</tool_call>"{untagged}', *rules,
                      _XML_TERMINALS, "XWS: /[ \\t\\r\\n]+/"])
