"""Requests to `edgekv serve`: checking an OpenAI request's JSON and the errors it answers.

What lives here: `ApiError` (an HTTP status plus OpenAI's error shape), and turning the
fields of /v1/chat/completions and /v1/completions requests into the `Llama` facade's
keywords (types and ranges checked, n=1 only, unknown fields ignored as OpenAI-compatible
servers do). What does not: the app, its routes and the generation queue (server/app.py, server/queue.py).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from starlette.responses import JSONResponse

from ..api.reasoning import FORMATS as REASONING_FORMATS


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code", ...}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, **extra: Any):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.extra = param, code, extra

    def response(self) -> JSONResponse:
        body = dict(message=self.message, type=self.type, param=self.param, code=self.code, **self.extra)
        return JSONResponse({"error": body}, status_code=self.status)


_NUMBER = (int, float)


def field(body: dict, name: str, types: type | tuple, expected: str,
          ok: Callable[[Any], bool] = lambda v: True) -> Any:
    """body[name] if present and not null, checked; ApiError 400 naming the field otherwise."""
    value = body.get(name)
    if value is None:
        return None
    types = types if isinstance(types, tuple) else (types,)
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types) or not ok(value):
        raise ApiError(400, f"'{name}' must be {expected}, got {_shown(value)}", param=name)
    if types == _NUMBER:  # JSON's integers are unbounded: a float for the sampler, and finite
        value = float(value) if abs(value) < 1e300 else math.inf
        if not math.isfinite(value):
            raise ApiError(400, f"'{name}' must be {expected}, got {_shown(body.get(name))}", param=name)
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _token_id(value: Any, n_vocab: int, param: str) -> int:
    try:
        token = int(value)
    except (TypeError, ValueError):
        raise ApiError(400, f"'{param}': {value!r} is not a token id", param=param) from None
    if not 0 <= token < n_vocab:
        raise ApiError(400, f"'{param}': token id {token} is out of range [0, {n_vocab})", param=param)
    return token


def _logit_bias(body: dict, n_vocab: int) -> dict[int, float] | None:
    bias = field(body, "logit_bias", dict, "an object mapping token ids to numbers")
    if bias is None:
        return None
    for value in bias.values():
        if isinstance(value, bool) or not isinstance(value, _NUMBER):
            raise ApiError(400, f"'logit_bias' values must be numbers, got {value!r}", param="logit_bias")
    return {_token_id(k, n_vocab, "logit_bias"): float(v) for k, v in bias.items()}


def sampling_options(body: dict, n_vocab: int) -> dict[str, Any]:
    """The OpenAI request fields both endpoints share -> create_*completion keywords (only
    those present, so the facade's defaults hold). n must be 1; unknown fields are ignored."""
    if field(body, "n", int, "an integer") not in (None, 1):
        raise ApiError(400, f"'n' must be 1 (one choice per request), got {body['n']!r}", param="n")
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or
                                 (isinstance(stop, list) and all(isinstance(s, str) for s in stop))):
        raise ApiError(400, f"'stop' must be a string or a list of strings, got {stop!r}", param="stop")
    max_tokens = field(body, "max_completion_tokens", int, "a positive integer", lambda v: v > 0)
    if max_tokens is None:
        max_tokens = field(body, "max_tokens", int, "a positive integer", lambda v: v > 0)
    options = dict(
        max_tokens=max_tokens, stop=stop, seed=field(body, "seed", int, "an integer"),
        temperature=field(body, "temperature", _NUMBER, "a number >= 0", lambda v: v >= 0),
        top_p=field(body, "top_p", _NUMBER, "a number in [0, 1]", lambda v: 0 <= v <= 1),
        min_p=field(body, "min_p", _NUMBER, "a number in [0, 1]", lambda v: 0 <= v <= 1),
        top_k=field(body, "top_k", int, "an integer"),
        presence_penalty=field(body, "presence_penalty", _NUMBER, "a number"),
        frequency_penalty=field(body, "frequency_penalty", _NUMBER, "a number"),
        repeat_penalty=field(body, "repeat_penalty", _NUMBER, "a number > 0", lambda v: v > 0),
        logit_bias=_logit_bias(body, n_vocab),
        ignore_eos=field(body, "ignore_eos", bool, "true or false"),  # llama.cpp server's extension
        # the facade decides whether it can honour these (an EdgeKVError -> 400 otherwise)
        logprobs=body.get("logprobs"), top_logprobs=body.get("top_logprobs"), tools=body.get("tools") or None,
        tool_choice=body.get("tool_choice"), parallel_tool_calls=body.get("parallel_tool_calls"),
        grammar=_grammar(body),
    )
    return {k: v for k, v in options.items() if v is not None}


def _grammar(body: dict):
    """response_format (OpenAI: json_object, json_schema), or llama-server's `json_schema`
    (a schema) or `grammar` (GBNF) fields, as a Grammar; None when none is asked for."""
    from ..grammar import Grammar, GrammarError, response_format_grammar

    given = [k for k in ("response_format", "json_schema", "grammar") if body.get(k) is not None]
    if len(given) > 1:
        raise ApiError(400, f"give one of {', '.join(given)}, not several", param=given[1])
    try:
        if body.get("json_schema") is not None:
            return Grammar.from_json_schema(body["json_schema"])
        if body.get("grammar") is not None:
            if not isinstance(body["grammar"], str):
                raise GrammarError("'grammar' must be GBNF text")
            return Grammar.from_string(body["grammar"])
        return response_format_grammar(body.get("response_format"))
    except GrammarError as exc:
        raise ApiError(400, str(exc), param=given[0] if given else None) from None


def stream_flags(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = bool(field(body, "stream", bool, "true or false"))
    stream_options = field(body, "stream_options", dict, "an object") or {}
    return stream, bool(stream_options.get("include_usage"))


def chat_messages(body: dict) -> list[dict[str, str]]:
    """'messages' -> [{"role", "content"}] with text content (parts of type "text" joined)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' is required: a non-empty list of {role, content}", param="messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a string 'role'", param="messages")
        content = message.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ApiError(400, f"messages[{i}].content: only text parts are supported", param="messages")
            content = "".join(p["text"] for p in content)
        if content is not None and not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string or a list of text parts", param="messages")
        entry = dict(role=message["role"], content=content or "")
        if isinstance(message.get("reasoning_content"), str):  # an earlier answer's reasoning (templates may use it)
            entry["reasoning_content"] = message["reasoning_content"]
        entry.update(_tool_fields(message, i))
        out.append(entry)
    return out


def _tool_fields(message: dict, i: int) -> dict[str, Any]:
    """An assistant message's tool_calls, a tool message's tool_call_id and name (checked)."""
    out: dict[str, Any] = {}
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list) or not all(
                isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)
                for c in calls):
            raise ApiError(400, f"messages[{i}].tool_calls must be a list of {{id, type, function: {{name, arguments}}}}",
                           param="messages")
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    return out


def chat_template_options(body: dict, reasoning_default: str, kwargs_default: dict | None) -> dict[str, Any]:
    """`chat_template_kwargs` (llama-server's field: template variables, over the server's
    --chat-template-kwargs) and `reasoning_format` (none, deepseek, auto; default the
    server's --reasoning-format) -> create_chat_completion keywords."""
    kwargs = field(body, "chat_template_kwargs", dict, "an object of template variables")
    reasoning = field(body, "reasoning_format", str, f"one of {', '.join(REASONING_FORMATS)}",
                      lambda v: v in REASONING_FORMATS) or reasoning_default
    return dict(chat_template_kwargs={**(kwargs_default or {}), **(kwargs or {})} or None, reasoning_format=reasoning)


def completion_prompt(body: dict, n_vocab: int) -> str | list[int]:
    """'prompt': a string, a list of token ids, or a list holding one of those."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [_token_id(t, n_vocab, "prompt") for t in prompt]
    if isinstance(prompt, list) and len(prompt) > 1:
        raise ApiError(400, "'prompt': one prompt per request is supported", param="prompt")
    raise ApiError(400, "'prompt' is required: a string or a list of token ids", param="prompt")


def session_key(body: dict) -> str | None:
    """The conversation a request names: edgekv's `session_id`, else OpenAI's `user`; None:
    matched by its prompt (server/sessions.py)."""
    key = field(body, "session_id", (str, int), "a string")
    if key is None:
        key = field(body, "user", str, "a string")
    return None if key is None else str(key)
