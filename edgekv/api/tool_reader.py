"""Reading a tool call out of a tools answer while it is being generated.

What lives here: `CallReader`, fed the answer's text piece by piece, which tells as early as
the text allows whether the answer is plain text or a call, and hands out OpenAI's stream
deltas: the content as it comes, or for a call first {"index", "id", "type", "function":
{"name", "arguments": ""}} and then the arguments' JSON text in the pieces the model wrote
it (`tool_calls` deltas, as OpenAI streams them). The same reader, fed a whole answer, gives
the non-streamed `message["tool_calls"]`, so both carry the model's own arguments text.

The answer's shape is fixed by ToolCalling's grammar: a call starts with `{` (the generic
format) or `<tool_call>` (hermes), anything else is text; a call is
`{"name":"...","arguments":{...}}` (Llama 3: "parameters") with the name first; one call
per answer. An answer that
does not read that way (a grammar this reader does not know) is still handled: nothing of a
call is sent until its name is read, and whatever never became a call goes out as content.
What does not live here: the grammar and the prompt (tools.py), the response shapes
(responses.py).
"""

from __future__ import annotations

import json
import re
import uuid

_HEAD = r'\s*(?:<tool_call>\s*)?\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"%s"\s*:\s*'


class CallReader:
    def __init__(self, names: set[str], call_opens: str, call_only: bool, arguments_key: str = "arguments"):
        """names: the functions the answer may call; call_opens: the first character of a
        call ("{" or "<"); call_only: the answer must be a call (tool_choice required or named);
        arguments_key: "arguments", or "parameters" in Llama 3's calls."""
        self.names, self.call_opens = names, call_opens
        self._head = re.compile(_HEAD % re.escape(arguments_key))
        self.kind = "call" if call_only else None  # None until the first character decides
        self.text = ""
        self.call_id = f"call_{uuid.uuid4().hex[:24]}"
        self.name: str | None = None
        self._args = _ValueEnd()
        self._args_start = self._sent = 0

    def push(self, piece: str) -> list[dict]:
        """The stream deltas the answer's next piece of text adds (maybe none yet)."""
        self.text += piece
        if self.kind is None and self.text:
            self.kind = "call" if self.text[0] == self.call_opens else "text"
        if self.kind == "text":
            return [dict(content=piece)] if piece else []
        deltas = []
        if self.kind == "call" and self.name is None and self._read_head():
            deltas.append(dict(tool_calls=[dict(index=0, id=self.call_id, type="function",
                                                 function=dict(name=self.name, arguments=""))]))
        if self.name is None:  # the name is not read yet, or the answer is held
            return deltas
        end = self._args.scan(self.text, self._args_start)
        if end > self._sent:
            deltas.append(dict(tool_calls=[dict(index=0, function=dict(arguments=self.text[self._sent:end]))]))
            self._sent = end
        return deltas

    def _read_head(self) -> bool:
        m = self._head.match(self.text)
        if m is None:
            return False
        name = json.loads(m.group(1))
        if name not in self.names:
            self.kind = "held"  # not a call after all: it goes out as content at the end
            return False
        self.name, self._args_start = name, m.end()
        self._sent = self._args_start
        return True

    def finish(self, reason: str) -> tuple[list[dict], str]:
        """The last deltas and the finish reason once generation stopped for `reason`: a
        complete call finishes as "tool_calls"; a call cut short (max_tokens) as `reason`,
        with the arguments sent so far; text that never became a call goes out as content."""
        if self.calls() is not None:
            return [], "tool_calls"
        if self.kind == "held" or (self.kind == "call" and self.name is None and self.text):
            return [dict(content=self.text)], reason
        return [], reason

    def calls(self) -> list[dict] | None:
        """The answer's call as OpenAI's message["tool_calls"], or None when it holds no
        complete call."""
        if self.name is None or self._args.end is None:
            return None
        arguments = self.text[self._args_start:self._args.end]
        try:
            if not isinstance(json.loads(arguments), dict):
                return None
        except json.JSONDecodeError:
            return None
        return [dict(id=self.call_id, type="function", function=dict(name=self.name, arguments=arguments))]


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
