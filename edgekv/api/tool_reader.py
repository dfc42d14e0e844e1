"""Reading tool calls out of a tools answer while it is being generated.

What lives here: `CallReader`, fed the answer's text piece by piece, which finds the calls in
it in the forms models write them and hands out OpenAI's stream deltas: the text around the
calls as content, and for each call first {"index", "id", "type", "function": {"name",
"arguments": ""}} and then the arguments' JSON text in the pieces the model wrote it
(`tool_calls` deltas, as OpenAI streams them). The same reader, fed a whole answer, gives the
non-streamed message (`content` and `tool_calls`), so both carry the model's own arguments text.

A call is a JSON object with the name first and the arguments next, `{"name": "f",
"arguments": {...}}` ("parameters" in Llama 3's calls), written
  - inside `<tool_call>` ... `</tool_call>` (Hermes 2 Pro, Qwen 2.5 and 3: the templates' own form),
  - inside a Markdown fence, ```` ```json ```` or ```` ``` ```` (what Qwen 2.5 Coder and other small
    models write when they answer freely),
  - as Qwen3-Coder's XML, `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>...
    </function>\n</tool_call>`, whose parameters become JSON arguments (typed by the schema);
  - in a JSON array of calls (Mistral's, after its [TOOL_CALLS] control token, which the text
    does not show), each object maybe with an "id" last,
  - or bare.
Several calls in one answer are read in order (OpenAI's parallel tool calls) unless the
request allows only one (parallel_tool_calls false: the text after the first call is content).
A call to a function the request does not offer is not a call: its text is content. The
arguments are the model's text, valid JSON or not (as OpenAI's are: a grammar makes them valid
where one applies). Text that
may still become a call (`<tool_c`, a fence, `{"name": "get_`) is held until it is known, so a
streamed answer sends exactly what the whole answer's message holds; whitespace between and
after calls is not content. What does not live here: the grammar and the prompt (tools.py),
the response shapes (responses.py).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Callable

import regex

# a call's head: an optional opening (the tag, a fence, a JSON array's bracket), the object's
# name and its arguments' key; the arguments must be an object. `regex` (not `re`) for partial
# matches: whether text cut short may still become a head.
_HEAD = regex.compile(r'(<tool_call>\s*|```(?:json)?[ \t]*\n\s*|\[\s*)?'
                      r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)')
# after the arguments: the object's end (an "id" may come last, as Mistral's calls carry one),
# and the opening's closing; in an array, a comma (another call follows) or the bracket
_END = r'\s*(?:,\s*"id"\s*:\s*"(?:[^"\\]|\\.)*"\s*)?\}'
_CLOSE = {"<": regex.compile(_END + r"\s*</tool_call>"), "`": regex.compile(_END + r"\s*```"),
          "[": regex.compile(_END + r"\s*([,\]])"), "": regex.compile(_END)}
_OPENINGS = "<`[{"
# Qwen3-Coder's XML: <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>
_XML_HEAD = regex.compile(r"(<tool_call>\s*)?<function=([^>\n]*)>")
_XML_CLOSE = {"<": regex.compile(r"\s*</function>\s*</tool_call>"), "": regex.compile(r"\s*</function>")}


def openai_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class _Call:
    def __init__(self, index: int, name: str, opening: str, args_start: int, call_id: str):
        self.index, self.name, self.opening, self.id = index, name, opening, call_id
        self.args_start = self.sent = args_start
        self.value = _ValueEnd()
        self.arguments: str | None = None  # the arguments' JSON text once complete


class _XmlCall:
    """A call in Qwen3-Coder's XML: its arguments are built as JSON, one parameter at a time
    (a string where the parameter's schema says string, else the value read as JSON if it
    is, as llama.cpp's parser types them)."""

    def __init__(self, index: int, name: str, opening: str, pos: int, call_id: str, types: dict[str, Any]):
        self.index, self.name, self.opening, self.id, self.pos = index, name, opening, call_id, pos
        self.types, self.built, self.arguments = types, "", None

    def add(self, key: str, value: str) -> str:
        if self.types.get(key) != "string":
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        piece = ("{" if not self.built else ", ") + f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}"
        self.built += piece
        return piece

    def close(self) -> str:
        piece = "}" if self.built else "{}"
        self.built += piece
        self.arguments = self.built
        return piece


class CallReader:
    def __init__(self, names: set[str], parallel: bool = True, new_id: Callable[[], str] = openai_id,
                 schemas: dict[str, dict] | None = None):
        """names: the functions the answer may call; parallel: whether it may call several;
        new_id: a new call's id (OpenAI's "call_..." unless the template wants others);
        schemas: each function's parameters schema (how XML parameters are typed)."""
        self.names, self.parallel, self.new_id, self.schemas = names, parallel, new_id, schemas or {}
        self._array = False  # inside a JSON array of calls, after a comma
        self.text = ""
        self.content = ""  # the content sent so far
        self._pos = 0  # the text before this is content sent or calls read
        self._calls: list[_Call | _XmlCall] = []
        self._open: _Call | _XmlCall | None = None

    def push(self, piece: str) -> list[dict]:
        """The stream deltas the answer's next piece of text adds (maybe none yet)."""
        self.text += piece
        deltas: list[dict] = []
        self._read(deltas, final=False)
        return deltas

    def finish(self, reason: str) -> tuple[list[dict], str]:
        """The last deltas and the finish reason once generation stopped for `reason`:
        "tool_calls" when the answer holds complete calls; a call cut short (max_tokens)
        finishes as `reason`, with the arguments sent so far; text held because it might have
        become a call goes out as content."""
        deltas: list[dict] = []
        self._read(deltas, final=True)
        if self._open is None:
            rest = self.text[self._pos:]
            if rest.strip() or (rest and not self._calls):
                self._send(deltas, rest)
            self._pos = len(self.text)
        return deltas, reason if self._open is not None or not self._calls else "tool_calls"

    def calls(self) -> list[dict] | None:
        """The answer's complete calls as OpenAI's message["tool_calls"], or None when it holds none."""
        calls = [dict(id=c.id, type="function", function=dict(name=c.name, arguments=c.arguments))
                 for c in self._calls]
        return calls or None

    # -- reading ---------------------------------------------------------------------------

    def _read(self, deltas: list[dict], final: bool) -> None:
        while self._read_call(deltas, final) if self._open is not None else self._read_text(deltas, final):
            pass

    def _read_text(self, deltas: list[dict], final: bool) -> bool:
        """Sends the content up to the next call (or up to text that may become one) and opens
        that call; whether a call was opened."""
        if self._calls and not self.content:  # whitespace after a call is not content (unless text came first)
            self._pos = len(self.text) - len(self.text[self._pos:].lstrip())
        held, i = len(self.text), self._pos
        while (self.parallel or not self._calls) and (i := _next_opening(self.text, i)) >= 0:
            m, xml = _HEAD.match(self.text, i, partial=not final), _XML_HEAD.match(self.text, i, partial=not final)
            if (m is not None and m.partial) or (xml is not None and xml.partial):
                held = i
                break
            name = _name(m.group(2)) if m is not None else xml.group(2).strip() if xml is not None else None
            if name not in self.names:
                i += 1
                continue
            self._send(deltas, self.text[self._pos:i].rstrip())
            if m is not None:
                opening = (m.group(1) or ("[" if self._array else ""))[:1]
                self._open = _Call(len(self._calls), name, opening, m.end(), self.new_id())
            else:
                types = {k: v.get("type") for k, v in (self.schemas.get(name, {}).get("properties") or {}).items()
                         if isinstance(v, dict)}
                self._open = _XmlCall(len(self._calls), name, (xml.group(1) or "")[:1], xml.end(), self.new_id(), types)
            deltas.append(dict(tool_calls=[dict(index=self._open.index, id=self._open.id, type="function",
                                                function=dict(name=name, arguments=""))]))
            self._pos = (m or xml).end()
            return True
        sendable = self.text[self._pos:held].rstrip()  # trailing whitespace waits for what follows it
        self._send(deltas, sendable)
        self._pos += len(sendable)
        return False

    def _read_call(self, deltas: list[dict], final: bool) -> bool:
        """Sends the open call's arguments as far as they go; whether the call is complete."""
        call = self._open
        if isinstance(call, _XmlCall):
            return self._read_xml_call(call, deltas, final)
        end = call.value.scan(self.text, call.args_start)
        if end > call.sent:
            deltas.append(dict(tool_calls=[dict(index=call.index, function=dict(arguments=self.text[call.sent:end]))]))
            call.sent = end
        if call.value.end is None:
            return False
        m = _CLOSE[call.opening].match(self.text, end, partial=not final)
        if m is not None and m.partial:
            return False
        if m is None:  # no closing tag or fence: the call ends with its object (or its arguments)
            m = _CLOSE[""].match(self.text, end)
        self._array = call.opening == "[" and m is not None and m.re is _CLOSE["["] and m.group(1) == ","
        self._pos, self._open = (m.end() if m is not None else end), None
        call.arguments = self.text[call.args_start:end]  # as written, JSON or not (OpenAI's too)
        self._calls.append(call)
        return True

    def _read_xml_call(self, call: _XmlCall, deltas: list[dict], final: bool) -> bool:
        """Reads the open XML call's complete parameters (each sent as a piece of the JSON
        arguments) and its closing; whether the call is complete."""
        def send(piece: str) -> None:
            deltas.append(dict(tool_calls=[dict(index=call.index, function=dict(arguments=piece))]))

        while True:
            start = len(self.text) - len(self.text[call.pos:].lstrip())
            rest = self.text[start:]
            if rest.startswith("<parameter="):
                key_end, close = rest.find(">"), rest.find("</parameter>")
                if key_end < 0 or close < 0:  # not complete yet
                    break
                value = rest[key_end + 1:close]
                value = value[1:] if value.startswith("\n") else value
                send(call.add(rest[len("<parameter="):key_end].strip(), value[:-1] if value.endswith("\n") else value))
                call.pos = start + close + len("</parameter>")
                continue
            m = _XML_CLOSE[call.opening].match(self.text, call.pos, partial=not final)
            if m is not None and m.partial or (m is None and not final and ("<parameter=".startswith(rest)
                                                                             or "</function>".startswith(rest))):
                break
            if m is None:  # no closing tag: the function's end alone
                m = _XML_CLOSE[""].match(self.text, call.pos)
            send(call.close())  # closed, or not XML any more: the call ends with its last parameter
            self._pos, self._open = (m.end() if m is not None else call.pos), None
            self._calls.append(call)
            return True
        return False  # waiting for more (or cut short: what was sent stays, the call is not complete)

    def _send(self, deltas: list[dict], text: str) -> None:
        if text:
            deltas.append(dict(content=text))
            self.content += text


def _next_opening(text: str, start: int) -> int:
    found = [j for j in (text.find(c, start) for c in _OPENINGS) if j >= 0]
    return min(found) if found else -1


def _name(quoted: str) -> str | None:
    try:
        return json.loads(quoted)
    except json.JSONDecodeError:
        return None


class _ValueEnd:
    """Finds where a JSON object or array that starts at a given offset ends, reading only
    the characters it has not read before (strings and escapes respected)."""

    def __init__(self):
        self.pos: int | None = None
        self.depth, self.in_string, self.escaped = 0, False, False
        self.end: int | None = None

    def scan(self, text: str, start: int) -> int:
        """How far the value reaches into `text` so far (its end once it is complete)."""
        if self.end is not None:
            return self.end
        pos = start if self.pos is None else self.pos
        for pos in range(pos, len(text)):
            c = text[pos]
            if self.in_string:
                self.escaped, self.in_string = (False, True) if self.escaped else (c == "\\", c != '"')
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.end = pos + 1
                    return self.end
        self.pos = len(text)
        return self.pos
