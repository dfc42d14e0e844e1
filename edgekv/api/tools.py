"""Tool calls (OpenAI's `tools` / `tool_choice`) for create_chat_completion.

What lives here: `ToolCalling`, which checks the request's tools and tool_choice, prepares
the conversation for the model's template, gives the grammar that makes the model's answer
valid calls (for "auto": once the answer starts one, a lazy grammar), and reads the calls
back out of the generated text. Five formats, chosen from the chat template:
  - "hermes": the template renders `tools` itself and expects
    `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (Qwen 2.5/3, Hermes);
    earlier calls and tool results go to the template as Hugging Face passes them;
  - "llama3": likewise, for Llama 3.1-3.3's custom tools: a bare
    `{"name": ..., "parameters": {...}}`, results in the template's ipython turns;
  - "qwen3_coder": likewise, for Qwen3-Coder's XML calls (`<tool_call>\n<function=NAME>\n
    <parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>`; values typed by the
    schema: integers, numbers and booleans by the grammar, the rest text);
  - "mistral": likewise, for Mistral's `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`
    (call ids of 9 letters and digits, which its templates require);
  - "json" (any other template): a system message lists the functions and asks for a bare
    `{"name": ..., "arguments": {...}}`; earlier calls become assistant text and tool results
    user messages ("Function NAME returned: ...").
A call the grammar shapes has arguments that match the function's `parameters` schema (with
additionalProperties false unless it says otherwise). Under "hermes" and "mistral" an answer
may hold several calls (OpenAI's parallel tool calls; parallel_tool_calls=false allows one);
under "auto" the answer is free text until it starts a call to an offered function, in any of
the forms the reader knows (tags, a fence, bare, an array), and the reader finds the calls
models write after text too (tool_reader.py). What does not live here:
reading the calls out of the text as it comes (tool_reader.py), generation and the response
shapes (completions.py, responses.py).
"""

from __future__ import annotations

import json
import secrets
import string
from typing import Any

import regex

from ..errors import EdgeKVError
from ..grammar import Grammar, LazyGrammar
from .tool_reader import CallReader, openai_id


class ToolCalling:
    def __init__(self, tools: Any, tool_choice: Any, template: str, parallel: Any = True):
        self.functions = _functions(tools)
        self.choice = _choice(tool_choice, self.functions)
        self.format = _format(template)
        if not isinstance(parallel, bool):
            raise EdgeKVError(f"parallel_tool_calls must be true or false, got {parallel!r}")
        self.parallel = parallel

    @property
    def active(self) -> bool:
        """Whether the model may call a function in this answer."""
        return self.choice != "none"

    # -- the prompt ------------------------------------------------------------------------

    def messages(self, messages: list[dict]) -> list[dict]:
        """The conversation as the template should see it."""
        if self.format != "json":
            return [_hf_message(m) for m in messages]
        out, names = [], {}
        for m in messages:
            if m.get("role") == "assistant" and m.get("tool_calls"):
                calls = [_call_dict(c) for c in m["tool_calls"]]
                names.update((c.get("id"), c["function"]["name"]) for c in m["tool_calls"] if isinstance(c, dict))
                text = "\n".join(json.dumps({"name": c["name"], "arguments": c["arguments"]}) for c in calls)
                out.append({"role": "assistant", "content": text})
            elif m.get("role") == "tool":
                name = m.get("name") or names.get(m.get("tool_call_id"), "the function")
                out.append({"role": "user", "content": f"Function {name} returned: {m.get('content')}"})
            else:
                out.append(m)
        if self.functions:
            out = self._with_instructions(out)
        return out

    def _with_instructions(self, messages: list[dict]) -> list[dict]:
        listing = json.dumps([{"name": f["name"], "description": f.get("description", ""),
                               "parameters": f.get("parameters", {})} for f in self.functions])
        must = {"none": "Do not call a function now; answer in plain text.",
                "auto": "Otherwise answer in plain text.",
                "required": "You must call one of them now."}.get(self.choice, f"You must call {self.choice} now.")
        text = (f"You can call these functions: {listing}\nTo call one, answer with only a JSON object "
                f'{{"name": <function name>, "arguments": <its arguments>}}. {must}')
        if messages and messages[0].get("role") == "system":
            return [dict(messages[0], content=f"{messages[0].get('content') or ''}\n\n{text}")] + messages[1:]
        return [{"role": "system", "content": text}] + messages

    def template_kwargs(self) -> dict[str, Any]:
        if self.format != "json" and self.functions:
            return {"tools": [{"type": "function", "function": f} for f in self.functions]}
        return {}

    # -- the answer ------------------------------------------------------------------------

    def grammar(self) -> Grammar | LazyGrammar | None:
        """What the answer may be: calls (required, a named function), free text in which a
        call, once the answer starts with one, must be valid (auto: a lazy grammar), or
        anything (none)."""
        if not self.active:
            return None
        if self.choice == "auto":
            return self._lazy_grammar()
        wanted = self.functions if self.choice == "required" else [f for f in self.functions if f["name"] == self.choice]
        if self.format == "qwen3_coder":
            calls = 'xcall ("\\n" xcall)*' if self.parallel else "xcall"
            return Grammar.from_lark(f"start: {calls}\n{_xml_rules(wanted, strict=True)}")
        call = self._call_schema(wanted, flexible=False)
        if self.format == "hermes":  # several calls, one per line, unless parallel_tool_calls is false
            rules = f'call: "<tool_call>\\n" %json {call} "\\n</tool_call>"'
            calls = 'call ("\\n" call)*' if self.parallel else "call"
        elif self.format == "mistral":  # a JSON array of calls (the template's [TOOL_CALLS] form)
            rules = f"call: %json {call}"
            calls = '"[" call (", " call)* "]"' if self.parallel else '"[" call "]"'
        else:
            rules, calls = f"call: %json {call}", "call"
        return Grammar.from_lark(f"start: {calls}\n{rules}")

    def _lazy_grammar(self) -> LazyGrammar:
        """auto, as llama.cpp's lazy grammars do it: the answer is free unless it starts (after
        whitespace, or a <think> block) with a call to one of the functions, in the template's
        tags, a Markdown fence or bare (the trigger ends at the function's name); from there on
        the answer is calls, one or several, whose arguments follow the parameters."""
        names = "|".join(regex.escape(json.dumps(f["name"])) for f in self.functions)
        ws = r"[ \t\r\n]*"  # JSON's whitespace, the grammar's WS (not \s: no other space may start a call)
        xml = "|".join(regex.escape(f["name"]) for f in self.functions)
        trigger = (rf'(?:<think>[\s\S]*?</think>)?\s*((?:<tool_call>{ws}|```(?:json)?[ \t]*\n{ws}|\[{ws})?'
                   rf'\{{{ws}"name"{ws}:{ws}(?:{names})|<tool_call>\n<function=(?:{xml})>)')
        calls, array = ("(WS? call)+ WS?", '(WS? "," WS? body)*') if self.parallel else ("call WS?", "")
        return LazyGrammar(Grammar.from_lark(
            f"start: {calls}\n"
            'call: "<tool_call>" WS? body WS? "</tool_call>" | FENCE WS? body WS? "```" | body\n'
            f'    | "[" WS? body {array} WS? "]" | xcall\n'
            f"{_xml_rules(self.functions, strict=False)}\n"
            f"body: %json {self._call_schema(self.functions, flexible=True)}\n"
            "FENCE: /```(json)?[ \\t]*\\n/\n"
            "WS: /[ \\t\\r\\n]+/"), trigger)

    def _call_schema(self, wanted: list[dict], flexible: bool) -> str:
        """The JSON schema of a call to one of `wanted`: {"name": ..., key: arguments}."""
        key = self.arguments_key
        return json.dumps({"x-guidance": {"whitespace_flexible": flexible}, "anyOf": [{
            "type": "object", "properties": {"name": {"const": f["name"]},
                                             key: _closed(f.get("parameters") or {"type": "object"})},
            "required": ["name", key], "additionalProperties": False} for f in wanted]})

    @property
    def arguments_key(self) -> str:
        """The key of a call's arguments in the model's text."""
        return "parameters" if self.format == "llama3" else "arguments"

    def reader(self) -> CallReader:
        """A reader for this answer's text: its content and calls, as they come (tool_reader.py)."""
        return CallReader({f["name"] for f in self.functions}, parallel=self.parallel,
                          new_id=_mistral_id if self.format == "mistral" else openai_id,
                          schemas={f["name"]: f.get("parameters") or {} for f in self.functions})

    def answer(self, text: str, reason: str) -> tuple[str, list[dict] | None, str]:
        """A whole generated answer as (content, OpenAI's message["tool_calls"] or None,
        finish reason): what a stream of it carries."""
        reader = self.reader()
        reader.push(text)
        _, reason = reader.finish(reason)
        return reader.content, reader.calls(), reason


def _format(template: str) -> str:
    if "<function=" in template and "<parameter=" in template:  # Qwen3-Coder's XML calls
        return "qwen3_coder"
    if "<tool_call>" in template and "tools" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template and "[AVAILABLE_TOOLS]" in template:  # Mistral 7B v0.3, Nemo, Small
        return "mistral"
    if '"parameters": dictionary of argument name' in template:  # Llama 3.1, 3.2, 3.3
        return "llama3"
    return "json"


# a Qwen3-Coder parameter's value and closing tag by its schema type; text (strings, and what the
# grammar does not type) is anything up to the first closing tag, in one lexeme with it (llguidance's
# lexemes are greedy: text alone would swallow the tag's start)
_XML_VALUES = {"integer": 'XINT "\\n</parameter>\\n"', "number": 'XNUM "\\n</parameter>\\n"',
               "boolean": '("true" | "false") "\\n</parameter>\\n"'}
_XML_TERMINALS = ("XTEXT: /(.|\\n)*\\n<\\/parameter>\\n/ & ~/(.|\\n)*<\\/parameter>(.|\\n)*<\\/parameter>(.|\\n)*/\n"
                  "XINT: /-?(0|[1-9][0-9]*)/\n"
                  "XNUM: /-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?/")


def _xml_rules(functions: list[dict], strict: bool) -> str:
    """Lark rules `xcall` for Qwen3-Coder's XML calls to `functions`: each parameter's key is
    one of the function's, its value typed as above (which keys are required is not enforced);
    strict: one newline between the tags, as the template writes them (else any whitespace)."""
    calls, rules = [], []
    for i, f in enumerate(functions):
        props = (f.get("parameters") or {}).get("properties") or {}
        params = [f'{json.dumps(f"<parameter={key}>")} "\\n" {_XML_VALUES.get(spec.get("type"), "XTEXT")}'
                  for key, spec in props.items() if isinstance(spec, dict)]
        head = json.dumps(f"<function={f['name']}>")
        calls.append(f'{head} "\\n" {f"xp{i}*" if params else ""} "</function>"')
        if params:
            rules.append(f"xp{i}: " + " | ".join(params))
    # the tags as lexemes of their own, as the JSON forms' grammar has them (<tool_call> starts both)
    ws = '"\\n"' if strict else "XWS"
    return "\n".join([f'xcall: "<tool_call>" {ws} ({" | ".join(calls)}) {ws} "</tool_call>"', *rules,
                      _XML_TERMINALS, "XWS: /[ \\t\\r\\n]+/"])


def _mistral_id() -> str:
    """Mistral's templates refuse call ids that are not 9 letters and digits."""
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


def _functions(tools: Any) -> list[dict]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise EdgeKVError("tools must be a list of {\"type\": \"function\", \"function\": {...}}")
    functions = []
    for i, tool in enumerate(tools):
        f = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise EdgeKVError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                              f"\"parameters\": {{...}}}}}}")
        if not isinstance(f.get("parameters", {}), dict):
            raise EdgeKVError(f"tools[{i}].function.parameters must be a JSON schema object")
        functions.append(f)
    return functions


def _choice(tool_choice: Any, functions: list[dict]) -> str:
    if tool_choice is None:
        return "auto" if functions else "none"
    if tool_choice in ("none", "auto", "required"):
        if tool_choice != "none" and not functions:
            raise EdgeKVError(f"tool_choice={tool_choice!r} needs tools")
        return tool_choice
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if name not in {f["name"] for f in functions}:
        raise EdgeKVError(f"tool_choice {tool_choice!r} names no function in tools (use none, auto, required or "
                          f'{{"type": "function", "function": {{"name": ...}}}})')
    return name


def _closed(schema: dict) -> dict:
    """The parameters schema with additionalProperties false unless it says otherwise: a
    call holds only the declared arguments (OpenAI's strict mode requires the same), and a
    small model cannot wander off into invented ones until max_tokens."""
    if schema.get("type") == "object" and "additionalProperties" not in schema:
        return dict(schema, additionalProperties=False)
    return schema


def _call_dict(call: Any) -> dict:
    """An OpenAI tool call ({"function": {"name", "arguments": JSON text}}) as {"name", "arguments": dict}."""
    f = call.get("function", call) if isinstance(call, dict) else {}
    args = f.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    return {"name": f.get("name"), "arguments": args}


def _hf_message(m: dict) -> dict:
    """An OpenAI message as Hugging Face templates read it (tool call arguments as objects)."""
    if m.get("role") == "assistant" and m.get("tool_calls"):
        calls = [_hf_call(c) for c in m["tool_calls"]]
        return dict(m, content=m.get("content") or "", tool_calls=calls)
    return m


def _hf_call(call: Any) -> dict:
    """A call of an assistant message as Hugging Face templates read it (its id kept: Mistral's
    templates write it back)."""
    out = {"type": "function", "function": _call_dict(call)}
    if isinstance(call, dict) and call.get("id") is not None:
        out["id"] = call["id"]
    return out
