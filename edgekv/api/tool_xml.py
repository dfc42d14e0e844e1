"""Qwen3-Coder's XML tool calls, read into JSON arguments as they are generated.

`<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>`:
`XmlCall` builds the call's JSON arguments one parameter at a time, a value typed by the
function's schema (a string where the parameter's schema says string, else the value read as
JSON if it is, as llama.cpp's parser types them). A string value is streamed as it comes (as
llama.cpp's partial parses show it); other values once complete; the object closes at
`</function>`. What does not live here: finding the call's head (tool_reader.py).
"""

from __future__ import annotations

import json
from typing import Any

import regex

from .reasoning import partial_suffix

HEAD = regex.compile(r"(<tool_call>\s*)?<function=([^>\n]*)>")
_CLOSE = {"<": regex.compile(r"\s*</function>\s*</tool_call>"), "": regex.compile(r"\s*</function>")}
_VALUE_END = "\n</parameter>"


class XmlCall:
    def __init__(self, index: int, name: str, opening: str, pos: int, call_id: str, types: dict[str, Any]):
        """opening: "<" when the call opened with <tool_call>; pos: where its parameters start;
        types: each parameter's schema type."""
        self.index, self.name, self.opening, self.id, self.pos = index, name, opening, call_id, pos
        self.types, self.built, self.arguments = types, "", None
        self._streaming: str | None = None  # the string parameter whose value is going out
        self._value_sent = 0

    def read(self, text: str, final: bool) -> tuple[list[str], int | None]:
        """The arguments' pieces that `text` (the whole answer so far) adds, and where the call
        ends once it is complete (None while it is open; final: the text is all there is)."""
        pieces: list[str] = []
        while True:
            start = len(text) - len(text[self.pos:].lstrip())
            rest = text[start:]
            if rest.startswith("<parameter="):
                key_end = rest.find(">")
                if key_end < 0:
                    return pieces, None
                key, body = rest[len("<parameter="):key_end].strip(), rest[key_end + 1:]
                close = body.find("</parameter>")
                if close < 0:  # not complete yet (cut short when final: what was sent stays)
                    if self.types.get(key) == "string" and body and not final:
                        pieces += self._stream(key, body)
                    return pieces, None
                value = body[:close]
                value = value[1:] if value.startswith("\n") else value
                pieces.append(self._parameter(key, value[:-1] if value.endswith("\n") else value))
                self.pos = start + key_end + 1 + close + len("</parameter>")
                continue
            if self.arguments is None and (rest.startswith("</function>") or final):
                pieces.append(self._close())
            m = _CLOSE[self.opening].match(text, self.pos, partial=not final)
            if m is not None and m.partial or (m is None and not final and ("<parameter=".startswith(rest)
                                                                            or "</function>".startswith(rest))):
                return pieces, None
            if m is None:  # no closing tag: the function's end alone, or not XML any more
                m = _CLOSE[""].match(text, self.pos)
            if self.arguments is None:
                pieces.append(self._close())
            return pieces, (m.end() if m is not None else self.pos)

    def _stream(self, key: str, body: str) -> list[str]:
        """The pieces of a string value not complete yet: the key first, then the value's text
        so far, but for an end that may be the start of its closing tag."""
        value = body[1:] if body.startswith("\n") else body
        held = partial_suffix(value, _VALUE_END)
        ready, pieces = value[:len(value) - held], []
        if self._streaming != key:
            self._streaming, self._value_sent = key, 0
            pieces.append(self._out(f"{self._comma()}{json.dumps(key)}: \""))
        if len(ready) > self._value_sent:
            pieces.append(self._out(json.dumps(ready[self._value_sent:], ensure_ascii=False)[1:-1]))
            self._value_sent = len(ready)
        return pieces

    def _parameter(self, key: str, value: str) -> str:
        if self._streaming == key:  # the rest of a streamed string
            self._streaming = None
            return self._out(json.dumps(value[self._value_sent:], ensure_ascii=False)[1:-1] + '"')
        if self.types.get(key) != "string":
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        return self._out(f"{self._comma()}{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")

    def _close(self) -> str:
        piece = self._out("}" if self.built else "{}")
        self.arguments = self.built
        return piece

    def _comma(self) -> str:
        return "{" if not self.built else ", "

    def _out(self, piece: str) -> str:
        self.built += piece
        return piece
