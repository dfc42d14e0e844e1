"""Reading tool calls out of a tools answer while it is being generated.

What lives here: `CallReader`, fed the answer's text piece by piece, which finds the calls in
it in the forms models write them and hands out OpenAI's stream deltas: the text around the
calls as content, and for each call first {"index", "id", "type", "function": {"name",
"arguments": ""}} and then the arguments' JSON text in the pieces the model wrote it
(`tool_calls` deltas, as OpenAI streams them). The same reader, fed a whole answer, gives the
non-streamed message (`content` and `tool_calls`), so both carry the model's own arguments text.

A call is written in one of the forms of tool_forms.py (JSON objects in tags, fences, arrays or
bare; DeepSeek R1's, Command R's, gpt-oss's, Functionary's), or as Qwen3-Coder's XML,
`<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>...</function>\n</tool_call>`,
whose parameters become JSON arguments (typed by the schema). Which forms are looked for is
the reader's (its template family's). Several calls in one answer are read in order (OpenAI's
parallel tool calls) unless the request allows only one (parallel_tool_calls false: the text
after the first call is content). A call to a function the request does not offer is not a
call: its text is content. The arguments are the model's text, valid JSON or not (as OpenAI's
are: a grammar makes them valid where one applies). Text that may still become a call
(`<tool_c`, a fence, `{"name": "get_`) is held until it is known, so a streamed answer sends
exactly what the whole answer's message holds; whitespace between and after calls is not
content, nor are a family's markers. What does not live here: the forms (tool_forms.py), the
grammar and the prompt (tools.py), the response shapes (responses.py).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Callable

import regex

from .tool_forms import Form, forms
from .tool_xml import HEAD as _XML_HEAD, XmlCall

_PARTIAL = object()  # what _head_at finds where the text may still become a head


def openai_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class _Call:
    def __init__(self, index: int, name: str, form: Form, args_start: int, call_id: str):
        self.index, self.name, self.form, self.id = index, name, form, call_id
        self.args_start = self.sent = args_start
        self.value = _ValueEnd()
        self.arguments: str | None = None  # the arguments' JSON text once complete


class CallReader:
    def __init__(self, names: set[str], parallel: bool = True, new_id: Callable[[], str] = openai_id,
                 schemas: dict[str, dict] | None = None, family: str = "", lead: str = ""):
        """names: the functions the answer may call; parallel: whether it may call several;
        new_id: a new call's id (OpenAI's "call_..." unless the template wants others);
        schemas: each function's parameters schema (how XML parameters are typed); family:
        the template's family (which forms to look for, tool_forms.py); lead: the end of the
        generation prompt, which the forms may need to see (Functionary's `>>>`)."""
        self.names, self.parallel, self.new_id, self.schemas = names, parallel, new_id, schemas or {}
        self.forms = forms(family)
        self._openings = "".join(sorted({c for f in self.forms for c in f.starts} | {"<"}))
        self._then: Form | None = None  # the head a block's next call has (after an array's comma)
        self.text, self._lead = lead, len(lead)
        self.content = ""  # the content sent so far
        self._pos = 0  # the text before this is content sent or calls read
        self._calls: list[_Call | XmlCall] = []
        self._open: _Call | XmlCall | None = None

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
            rest = self.text[max(self._pos, self._lead):]
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
        that call (or drops a marker); whether it did."""
        if self._calls and not self.content:  # whitespace after a call is not content (unless text came first)
            self._pos = len(self.text) - len(self.text[self._pos:].lstrip())
        held, i = len(self.text), self._pos
        while (self.parallel or not self._calls) and (i := self._next_opening(i)) >= 0:
            found = self._head_at(i, final)
            if found is _PARTIAL:
                held = i
                break
            if found is None:
                if self._then is not None:  # the block ended: look at this text again as any text
                    self._then = None
                else:
                    i += 1
                continue
            form, m = found
            self._send(deltas, self.text[max(self._pos, self._lead):i].rstrip())
            self._pos, self._then = m.end(), None
            if form is not None and form.close is not None:
                self._open = self._new_call(form, m)
            elif form is None:
                self._open = self._new_xml_call(m)
            else:  # a marker
                return True
            deltas.append(dict(tool_calls=[dict(index=self._open.index, id=self._open.id, type="function",
                                                function=dict(name=self._open.name, arguments=""))]))
            return True
        sendable = self.text[max(self._pos, self._lead):held].rstrip()  # trailing whitespace waits for what follows
        if sendable:  # (the lead stays in view until text after it goes out)
            self._send(deltas, sendable)
            self._pos = max(self._pos, self._lead) + len(sendable)
        return False

    def _next_opening(self, start: int) -> int:
        if self._then is not None:
            return start if start < len(self.text) else -1
        found = [j for j in (self.text.find(c, start) for c in self._openings) if j >= 0]
        return min(found) if found else -1

    def _head_at(self, i: int, final: bool) -> Any:
        """(form, match) of the call or marker that starts at i ((None, match) for an XML
        call), _PARTIAL when the text there may still become one, or None."""
        c = self.text[i]
        candidates = [self._then] if self._then is not None else [f for f in self.forms if c in f.starts]
        found = None
        for form in candidates:
            m = form.head.match(self.text, i, partial=not final)
            if m is not None and m.partial:
                return _PARTIAL
            if m is not None and found is None and (form.close is None or _name(m, form) in self.names):
                found = (form, m)
        if found is None and self._then is None and c == "<":
            m = _XML_HEAD.match(self.text, i, partial=not final)
            if m is not None and m.partial:
                return _PARTIAL
            if m is not None and m.group(2).strip() in self.names:
                found = (None, m)
        return found

    def _new_call(self, form: Form, m: regex.Match) -> _Call:
        model_id = m.groupdict().get("id")  # a JSON string, or bare (Mistral's [CALL_ID])
        call_id = (json.loads(model_id) if model_id.startswith('"') else model_id) if model_id else self.new_id()
        return _Call(len(self._calls), _name(m, form), form, m.end(), str(call_id))

    def _new_xml_call(self, m: regex.Match) -> XmlCall:
        name = m.group(2).strip()
        types = {k: v.get("type") for k, v in (self.schemas.get(name, {}).get("properties") or {}).items()
                 if isinstance(v, dict)}
        return XmlCall(len(self._calls), name, (m.group(1) or "")[:1], m.end(), self.new_id(), types)

    def _read_call(self, deltas: list[dict], final: bool) -> bool:
        """Sends the open call's arguments as far as they go; whether the call is complete."""
        call = self._open
        if isinstance(call, XmlCall):
            return self._read_xml_call(call, deltas, final)
        end = call.value.scan(self.text, call.args_start)
        if end > call.sent:
            deltas.append(dict(tool_calls=[dict(index=call.index, function=dict(arguments=self.text[call.sent:end]))]))
            call.sent = end
        if call.value.end is None:
            return False
        m = call.form.close.match(self.text, end, partial=not final)
        if m is not None and m.partial:
            return False
        if m is not None:
            self._then = call.form.then if m.groupdict().get("more") else None
        elif call.form.fallback is not None:  # no closing: the call ends with its object (or its arguments)
            m = call.form.fallback.match(self.text, end)
        self._pos, self._open = (m.end() if m is not None else end), None
        call.arguments = self.text[call.args_start:end]  # as written, JSON or not (OpenAI's too)
        self._calls.append(call)
        return True

    def _read_xml_call(self, call: XmlCall, deltas: list[dict], final: bool) -> bool:
        """Sends the open XML call's arguments as far as they go (tool_xml.py); whether the
        call is complete (cut short: what was sent stays, the call is not complete)."""
        pieces, end = call.read(self.text, final)
        deltas += [dict(tool_calls=[dict(index=call.index, function=dict(arguments=p))]) for p in pieces]
        if end is None:
            return False
        self._pos, self._open = end, None
        self._calls.append(call)
        return True

    def _send(self, deltas: list[dict], text: str) -> None:
        if text:
            deltas.append(dict(content=text))
            self.content += text


def _name(m: regex.Match, form: Form) -> str | None:
    """The function name a head names (None when its JSON string is not valid)."""
    if not form.quoted:
        return m.group("name")
    try:
        return json.loads(m.group("name"))
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
