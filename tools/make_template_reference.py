"""Regenerate tests/reference/chat_templates.json: the prompts llama-cpp-python 0.3.36's
Jinja2ChatFormatter renders from the real chat templates of the model families edgekv runs.

The templates (tests/reference/chat_templates/*.jinja) are the model publishers' own, as
llama.cpp keeps copies of them in models/templates (commit 0c1e570, vendored in that
sdist). Each case renders a conversation with the keyword arguments a caller would pass
(tools, enable_thinking; date_string fixed, for templates that print today's date); the tests render
the same through edgekv's sandboxed ChatFormatter and compare the text. Run with the
virtualenv that has llama-cpp-python (tests/reference/README.md):

    /tmp/lcpp/bin/python tools/make_template_reference.py tests/reference/chat_templates.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[1] / "tests" / "reference" / "chat_templates"
# template file -> (bos, eos) as the family's GGUF spells them
TOKENS = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("", "<|im_end|>"),
    "Qwen-Qwen3-0.6B.jinja": ("", "<|im_end|>"),
    "microsoft-Phi-3.5-mini-instruct.jinja": ("<s>", "<|endoftext|>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("<s>", "</s>"),
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CASES = [
    dict(name="system+user", messages=[{"role": "system", "content": "You are terse."},
                                       {"role": "user", "content": "Name a colour."}]),
    dict(name="multi-turn", messages=[{"role": "user", "content": "Hi!"},
                                      {"role": "assistant", "content": "Hello. How can I help?"},
                                      {"role": "user", "content": "Count to 3."}]),
    dict(name="history-with-think", messages=[
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\n4"},
        {"role": "user", "content": "And 3+3?"}]),
    dict(name="no-thinking", kwargs={"enable_thinking": False},
         messages=[{"role": "user", "content": "Quick: capital of Italy?"}]),
    dict(name="tools", kwargs={"tools": [WEATHER]},
         messages=[{"role": "user", "content": "Weather in Oslo?"}]),
]


def render(template: str, bos: str, eos: str, case: dict) -> str:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    kwargs = dict(case.get("kwargs", {}))
    kwargs.setdefault("date_string", "26 Jul 2024")  # Llama 3.x templates print today's date otherwise
    return Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)(messages=case["messages"], **kwargs).prompt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    out = {"source": "llama-cpp-python 0.3.36 Jinja2ChatFormatter", "templates": {}}
    for name, (bos, eos) in TOKENS.items():
        template = (TEMPLATES / name).read_text()
        rendered = []
        for case in CASES:
            try:
                rendered.append(dict(case, prompt=render(template, bos, eos, case)))
            except Exception as exc:  # a template that refuses a case: recorded as such
                rendered.append(dict(case, error=f"{type(exc).__name__}: {exc}"))
        out["templates"][name] = dict(bos_token=bos, eos_token=eos, cases=rendered)
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
