"""Chat templates from GGUF metadata, rendered in a sandboxed Jinja2 environment.

What lives here: `ChatFormatter`, which renders `tokenizer.chat_template` (untrusted input:
it runs in template_sandbox.py's bounded ImmutableSandboxedEnvironment) with the variables Hugging Face and
llama-cpp-python provide (`messages`, `add_generation_prompt`, `bos_token`, `eos_token`,
`raise_exception`, `strftime_now`, `tools`, ...), the built-in fallbacks for GGUFs that
carry no template, and which strings and token ids end an assistant turn. What does not:
tokenization (tokenizer.py) and generation or stop handling (generate.py / api/facade.py).

Fallback when the GGUF has no template: ChatML, as llama.cpp does, except for vocabularies
that have Gemma's turn tokens (`<start_of_turn>`, `<end_of_turn>`) and no ChatML tokens,
which get a Gemma-style template (ChatML's markers would be plain text to such a model).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2.exceptions import SecurityError

from ..errors import ChatTemplateError
from .template_sandbox import StrictSandbox, make_environment, start_render
from .tokenizer import Tokenizer

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Gemma's turn format: roles user/model, a system message folded into the first user turn.
GEMMA_TEMPLATE = (
    "{% set ns = namespace(prefix='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.prefix = message['content'] + '\n\n' %}"
    "{% else %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' }}"
    "{% if message['role'] == 'user' %}{{ ns.prefix }}{% set ns.prefix = '' %}{% endif %}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# Markers that close an assistant turn in the template families we know.
_TURN_END_MARKERS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|endoftext|>",
                     "<|end_of_text|>", "</s>", "<eos>")


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template raised: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False,
            ensure_ascii: bool = False) -> str:
    # Hugging Face's tojson: plain JSON, no HTML escaping (Jinja2's own escapes <, >, &, ').
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


def _make_environment() -> StrictSandbox:
    env = make_environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    """A template compiled in a fresh sandbox; cached, since compiling takes milliseconds and
    every Llama, server and chat session of one model has the same template (a compiled
    template keeps no state between renders)."""
    return _make_environment().from_string(template)


class ChatFormatter:
    """Messages -> prompt text with one model's chat template."""

    def __init__(self, template: str, bos_token: str = "", eos_token: str = "",
                 tokenizer: Tokenizer | None = None, source: str = "gguf"):
        self.template = template
        self.source = source  # "gguf", "chatml" or "gemma"
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.tokenizer = tokenizer
        try:
            self._compiled = _compile(template)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template ({source}) does not compile: {exc}") from exc
        except RecursionError:
            raise ChatTemplateError(f"chat template ({source}) nests too deeply to compile") from None
        self.stop_strings = self._find_turn_end_strings()
        self.stop_token_ids = self._find_turn_end_ids()

    @classmethod
    def from_gguf(cls, metadata: dict[str, Any], tokenizer: Tokenizer) -> "ChatFormatter":
        """The template in `tokenizer.chat_template`, or a built-in fallback when there is none."""
        template = metadata.get("tokenizer.chat_template")
        source = "gguf"
        if not template:
            source = fallback_template_name(tokenizer)
            template = GEMMA_TEMPLATE if source == "gemma" else CHATML_TEMPLATE
        return cls(str(template), _token_text(tokenizer, tokenizer.bos_id),
                   _token_text(tokenizer, tokenizer.eos_id), tokenizer, source)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any) -> str:
        """The prompt text for `messages` ([{"role": ..., "content": ...}, ...])."""
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ChatTemplateError("messages must be a list of dicts like {'role': 'user', 'content': 'hi'}")
        variables = {"tools": None, "functions": None, "function_call": None, "tool_choice": None,
                     "documents": None, **extra}
        variables.update(messages=messages, add_generation_prompt=add_generation_prompt,
                         bos_token=self.bos_token, eos_token=self.eos_token)
        start_render()
        try:
            return self._compiled.render(**variables)
        except ChatTemplateError:
            raise
        except SecurityError as exc:
            raise ChatTemplateError(f"chat template ({self.source}) tried something the sandbox forbids: {exc}") from exc
        except Exception as exc:  # jinja2 errors and whatever the template's own code raises
            raise ChatTemplateError(f"chat template ({self.source}) failed: {type(exc).__name__}: {exc}") from exc

    def encode(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any) -> list[int]:
        """render() (extra: more template variables) then tokenize_prompt()."""
        return self.tokenize_prompt(self.render(messages, add_generation_prompt, **extra))

    def tokenize_prompt(self, text: str) -> list[int]:
        """A rendered prompt -> ids, special tokens parsed; no second BOS if the text has one."""
        if self.tokenizer is None:
            raise ChatTemplateError("ChatFormatter.encode needs a tokenizer (use ChatFormatter.from_gguf)")
        add_bos = None
        if self.bos_token and text.startswith(self.bos_token) and self.tokenizer.add_bos:
            add_bos = False  # the template wrote BOS itself
        return self.tokenizer.encode(text, add_bos=add_bos, special=True)

    def _find_turn_end_strings(self) -> list[str]:
        found = [m for m in _TURN_END_MARKERS if m in self.template]
        if self.eos_token and self.eos_token not in found and self.eos_token in self.template:
            found.append(self.eos_token)
        return found

    def _find_turn_end_ids(self) -> list[int]:
        if self.tokenizer is None:
            return []
        ids = [self.tokenizer.token_id(s) for s in self.stop_strings]
        ids = [i for i in ids if i is not None]
        for token in (self.tokenizer.eot_id, self.tokenizer.eos_id):
            if token is not None and token not in ids:
                ids.append(token)
        return ids


def fallback_template_name(tokenizer: Tokenizer) -> str:
    """'gemma' for a vocab with Gemma's turn tokens and no ChatML tokens, else 'chatml'."""
    has_gemma_turns = tokenizer.token_id("<start_of_turn>") is not None and tokenizer.token_id("<end_of_turn>") is not None
    return "gemma" if has_gemma_turns and tokenizer.token_id("<|im_start|>") is None else "chatml"


def _token_text(tokenizer: Tokenizer, token: int | None) -> str:
    if token is None:
        return ""
    return tokenizer.token_to_piece(token).decode("utf-8", errors="replace")
