"""Tool calls (OpenAI's `tools` / `tool_choice`) for create_chat_completion.

What lives here: `ToolCalling`, which checks the request's tools and tool_choice, prepares
the conversation for the model's template, gives the grammar that makes the model's answer
valid calls (for "auto": once the answer starts one, a lazy grammar), and reads the calls
back out of the generated text. The format is the template's family (tool_forms.family):
  - the families whose templates render `tools` themselves and read earlier calls and tool
    results as Hugging Face passes them: "hermes" (`<tool_call>` JSON: Qwen 2.5/3, Hermes),
    "llama3" (a bare `{"name": ..., "parameters": {...}}`, results in ipython turns),
    "qwen3_coder" (XML calls typed by the schema), "mistral" (`[TOOL_CALLS][...]`, call ids of 9
    letters and digits, which its templates require), "ministral" (the newer Mistral models'
    `[TOOL_CALLS]NAME[ARGS]{...}`), "command_r" (`<|START_ACTION|>`),
    "gpt_oss" (the commentary channel), "functionary" (`>>>NAME`);
  - "deepseek_r1", whose templates render calls but not the tools: a system message lists
    the functions and shows the call syntax;
  - "json" (any other template): a system message lists the functions and asks for a bare
    `{"name": ..., "arguments": {...}}`; earlier calls become assistant text and tool results
    user messages ("Function NAME returned: ...").
The grammars (tool_grammar.py) make calls whose arguments match the function's `parameters`
schema; an answer may hold several calls (OpenAI's parallel tool calls; parallel_tool_calls=
false allows one); under "auto" the answer is free text until it starts a call, and the reader
finds the calls models write after text too (tool_reader.py). What does not live here: the
written forms (tool_forms.py), the grammars (tool_grammar.py), reading the calls out of the
text as it comes (tool_reader.py), generation and the response shapes (completions.py,
responses.py).
"""

from __future__ import annotations

import json
import secrets
import string
from typing import Any

from ..errors import EdgeKVError
from ..grammar import Grammar, LazyGrammar
from .reasoning import CLOSE, OPEN
from .tool_forms import LEADS, MARKERS, THINKING, family
from .tool_grammar import arguments_key, lazy_grammar, required_grammar
from .tool_reader import CallReader, openai_id


class ToolCalling:
    def __init__(self, tools: Any, tool_choice: Any, template: str, parallel: Any = True):
        self.functions = _functions(tools)
        self.choice = _choice(tool_choice, self.functions)
        self.format = family(template)
        if not isinstance(parallel, bool):
            raise EdgeKVError(f"parallel_tool_calls must be true or false, got {parallel!r}")
        self.parallel = parallel

    @property
    def active(self) -> bool:
        """Whether the model may call a function in this answer."""
        return self.choice != "none"

    # -- the prompt ------------------------------------------------------------------------

    @property
    def markers(self) -> tuple[str, ...]:
        """The texts the family's models write as single (often control) tokens that the answer
        must show for its calls and reasoning to be read."""
        return MARKERS.get(self.format, ()) + THINKING.get(self.format, ())

    @property
    def thinking(self) -> tuple[str, str]:
        """The family's reasoning block's opening and closing tags."""
        return THINKING.get(self.format, (OPEN, CLOSE))

    def messages(self, messages: list[dict]) -> list[dict]:
        """The conversation as the template should see it."""
        if self.format == "deepseek_r1":
            hf = [_hf_message(m) for m in messages]
            return self._with_instructions(hf) if self.functions else hf
        if self.format == "llama3":  # its templates take one call per assistant turn
            messages = _one_call_per_turn(messages)
        if self.format != "json":
            return [_hf_message(m, text_arguments=self.format == "functionary") for m in messages]
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
        if self.format == "deepseek_r1":
            form = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜><function name>\n```json\n"
                    "<its arguments as a JSON object>\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
            text = f"You can call these functions: {listing}\nTo call one, answer with {form}. {must}"
        else:
            text = (f"You can call these functions: {listing}\nTo call one, answer with only a JSON object "
                    f'{{"name": <function name>, "arguments": <its arguments>}}. {must}')
        if messages and messages[0].get("role") == "system":
            return [dict(messages[0], content=f"{messages[0].get('content') or ''}\n\n{text}")] + messages[1:]
        return [{"role": "system", "content": text}] + messages

    def template_kwargs(self) -> dict[str, Any]:
        if self.format not in ("json", "deepseek_r1") and self.functions:
            return {"tools": [{"type": "function", "function": f} for f in self.functions]}
        return {}

    # -- the answer ------------------------------------------------------------------------

    def grammar(self, opened: bool = False) -> Grammar | LazyGrammar | None:
        """What the answer may be: calls (required, a named function), free text in which a
        call, once the answer starts with one, must be valid (auto: a lazy grammar; opened:
        the prompt left the model inside a reasoning block), or anything (none)."""
        if not self.active:
            return None
        if self.choice == "auto":
            return lazy_grammar(self.functions, self.format, self.parallel, opened)
        wanted = self.functions if self.choice == "required" else [f for f in self.functions if f["name"] == self.choice]
        return required_grammar(wanted, self.format, self.parallel)

    @property
    def arguments_key(self) -> str:
        """The key of a call's arguments in the model's text."""
        return arguments_key(self.format)

    def reader(self) -> CallReader:
        """A reader for this answer's text: its content and calls, as they come (tool_reader.py)."""
        return CallReader({f["name"] for f in self.functions}, parallel=self.parallel,
                          new_id=_mistral_id if self.format in ("mistral", "ministral") else openai_id,
                          schemas={f["name"]: f.get("parameters") or {} for f in self.functions},
                          family=self.format, lead=LEADS.get(self.format, ""))

    def answer(self, text: str, reason: str) -> tuple[str, list[dict] | None, str]:
        """A whole generated answer as (content, OpenAI's message["tool_calls"] or None,
        finish reason): what a stream of it carries."""
        reader = self.reader()
        reader.push(text)
        _, reason = reader.finish(reason)
        return reader.content, reader.calls(), reason


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


def _one_call_per_turn(messages: list[dict]) -> list[dict]:
    """An assistant turn with several calls as one turn per call, each followed by its result
    (matched by tool_call_id; in order where there are no ids): Llama 3.x's templates refuse
    a turn with several calls, and read call, result, call, result the same way."""
    out, i = [], 0
    while i < len(messages):
        m = messages[i]
        calls = m.get("tool_calls") if m.get("role") == "assistant" else None
        if not calls or len(calls) < 2:
            out.append(m)
            i += 1
            continue
        j = i + 1
        while j < len(messages) and messages[j].get("role") == "tool":
            j += 1
        results = messages[i + 1:j]
        by_id = {r.get("tool_call_id"): r for r in results if r.get("tool_call_id") is not None}
        for n, call in enumerate(calls):
            result = by_id.get(call.get("id")) if isinstance(call, dict) else None
            if result is None and n < len(results) and not by_id:
                result = results[n]
            out.append(dict(m, content=m.get("content") if n == 0 else "", tool_calls=[call]))
            out.extend([result] if result is not None else [])
        out.extend(r for r in results if r not in out)
        i = j
    return out


def _hf_message(m: dict, text_arguments: bool = False) -> dict:
    """An OpenAI message as Hugging Face templates read it (tool call arguments as objects, or
    as JSON text for templates that write them as strings: Functionary's)."""
    if m.get("role") == "assistant" and m.get("tool_calls"):
        calls = [_hf_call(c) for c in m["tool_calls"]]
        if text_arguments:
            calls = [dict(c, function=dict(c["function"], arguments=json.dumps(c["function"]["arguments"])))
                     for c in calls]
        return dict(m, content=m.get("content") or "", tool_calls=calls)
    return m


def _hf_call(call: Any) -> dict:
    """A call of an assistant message as Hugging Face templates read it (its id kept: Mistral's
    templates write it back)."""
    out = {"type": "function", "function": _call_dict(call)}
    if isinstance(call, dict) and call.get("id") is not None:
        out["id"] = call["id"]
    return out
