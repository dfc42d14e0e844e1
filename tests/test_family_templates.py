"""The real chat templates of the families edgekv runs (Qwen2.5, Qwen3 with its <think>
handling, Phi-3.5, Mistral Nemo; tests/reference/chat_templates/) rendered by
edgekv's sandboxed ChatFormatter give the prompts llama-cpp-python's formatter gives
(tests/reference/chat_templates.json, tools/make_template_reference.py)."""

from __future__ import annotations

import json

import pytest

from conftest import REFERENCE_DIR
from edgekv.text.chat_format import ChatFormatter

DATA = json.loads((REFERENCE_DIR / "chat_templates.json").read_text())
CASES = [(name, i) for name, t in DATA["templates"].items() for i in range(len(t["cases"]))]


@pytest.mark.parametrize("name,index", CASES, ids=[f"{n.split('.jinja')[0]}-{DATA['templates'][n]['cases'][i]['name']}"
                                                    for n, i in CASES])
def test_real_template_renders_as_llama_cpp_python(name, index):
    spec = DATA["templates"][name]
    case = spec["cases"][index]
    assert "error" not in case, case.get("error")
    template = (REFERENCE_DIR / "chat_templates" / name).read_text()
    formatter = ChatFormatter(template, bos_token=spec["bos_token"], eos_token=spec["eos_token"])
    kwargs = dict(case.get("kwargs", {}))
    kwargs.setdefault("date_string", "26 Jul 2024")
    assert formatter.render(case["messages"], add_generation_prompt=True, **kwargs) == case["prompt"]


def test_qwen3_drops_old_reasoning_and_honours_enable_thinking():
    # what the Qwen3 cases above pin down, said plainly
    spec = DATA["templates"]["Qwen-Qwen3-0.6B.jinja"]
    by_name = {c["name"]: c["prompt"] for c in spec["cases"]}
    assert "Simple sum" not in by_name["history-with-think"]
    assert by_name["no-thinking"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not by_name["multi-turn"].endswith("</think>\n\n")
