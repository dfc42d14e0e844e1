"""A small program written for llama-cpp-python runs unchanged with `from edgekv import Llama`
on the default model, and the README's Python examples run as written (model path substituted)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here needs a real model

# Written against llama-cpp-python's documented API; only the import differs.
PROGRAM = '''
from edgekv import Llama

llm = Llama(model_path=MODEL_PATH, n_ctx=512, verbose=False)

output = llm("Q: Name the planets in the solar system? A: ", max_tokens=12, stop=["Q:", "\\n"], echo=False)
answer = output["choices"][0]["text"]
assert isinstance(answer, str) and "\\n" not in answer
assert output["choices"][0]["finish_reason"] in ("stop", "length")
usage = output["usage"]
assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

streamed = ""
for chunk in llm("Q: What is the capital of France? A: ", max_tokens=8, stop=["\\n"], stream=True):
    streamed += chunk["choices"][0]["text"]

messages = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Say hello in one word."},
]
reply = llm.create_chat_completion(messages=messages, max_tokens=8, temperature=0.0)
content = reply["choices"][0]["message"]["content"]
assert reply["choices"][0]["message"]["role"] == "assistant" and isinstance(content, str)
assert reply["usage"]["completion_tokens"] <= 8

pieces = []
for chunk in llm.create_chat_completion(messages=messages, max_tokens=8, temperature=0.0, stream=True):
    delta = chunk["choices"][0]["delta"]
    if "content" in delta:
        pieces.append(delta["content"])
assert "".join(pieces) == content

tokens = llm.tokenize(b"Hello, world!")
assert llm.detokenize(tokens) == b"Hello, world!"
RESULT = (answer, streamed, content)
'''


def run(source: str, model_path: str) -> dict:
    scope = {"MODEL_PATH": model_path, "__name__": "__main__"}
    exec(compile(source, "<program>", "exec"), scope)
    return scope


@pytest.mark.parametrize("how", ["path", "catalog name"])
def test_llama_cpp_python_program_runs_unchanged(smollm2_path, how):
    model_path = str(smollm2_path) if how == "path" else "smollm2-135m-instruct"
    answer, streamed, content = run(PROGRAM, model_path)["RESULT"]
    assert content.strip()  # an instruct model says something


README = Path(__file__).resolve().parents[1] / "README.md"


def readme_python_blocks() -> list[str]:
    section = README.read_text().split("## Python API", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def bounded(source: str, call: str) -> str:
    """Every `call` without a max_tokens gets max_tokens=8 (a model that never writes its end token
    would otherwise fill its whole context: CI once spent 600 s on one such example), except those
    whose output a grammar ends (a JSON schema, tool calls: the examples parse their replies)."""
    pieces, at = [], 0
    while (start := source.find(call, at)) >= 0:
        depth, end = 0, start + len(call) - 1
        for end in range(end, len(source)):
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            if depth == 0:
                break
        head = source[at:start + len(call)]
        free = any(word in source[start:end] for word in ("max_tokens", "json_schema", "tools="))
        pieces.append(head if free else head + "max_tokens=8, ")
        at = start + len(call)
    return "".join(pieces) + source[at:]


def test_readme_python_examples_run(smollm2_path, capsys):
    """The blocks run one after the other in one namespace, as a reader would type them."""
    blocks = readme_python_blocks()
    assert len(blocks) >= 3, "the README's Python API section lost its examples"
    # the examples name the catalog model; point them at the fetched file, and keep them short
    source = "\n".join(blocks).replace('"smollm2-135m-instruct"', "MODEL_PATH")
    source = bounded(re.sub(r"max_tokens=\d+", "max_tokens=8", source), "create_chat_completion(")
    assert source.count("MODEL_PATH") == 2  # Llama(...) and edgekv.load(...)
    scope = run(source, str(smollm2_path))
    assert scope["sessions"]["alice"].n_tokens > scope["sessions"]["bob"].n_tokens > 0
    assert [m["role"] for m in scope["histories"]["alice"]] == ["user", "assistant"] * 2
    assert capsys.readouterr().out.strip()
