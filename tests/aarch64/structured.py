"""SmolLM2's greedy answers under a JSON schema and as a streamed tool call, printed as one
JSON line: {"json": the answer's text, "call": [function name, arguments text]}.

tools/test_aarch64.sh runs it on the x86 host (`python -m tests.aarch64.structured`) and
test_on_arm.py runs the same function in the emulated arm64 root: llguidance's aarch64 wheel
masks the tokens there, and both machines' answers must be valid and the same.
"""

from __future__ import annotations

import json

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "rain", "days"],
          "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12}, "rain": {"type": "boolean"},
                         "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
ASK = [{"role": "user", "content": "Will it rain in Paris this week?"}]
TOOLS = [{"type": "function", "function": {"name": "forecast", "description": "The forecast for a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}]


def answers() -> dict:
    """The JSON answer and the streamed call's name and arguments, both greedy."""
    from edgekv import Llama
    from edgekv.catalog import ensure_model

    llm = Llama(str(ensure_model("smollm2-135m-instruct")), n_ctx=512, verbose=False)
    r = llm.create_chat_completion(ASK, response_format={"type": "json_object", "schema": SCHEMA},
                                   temperature=0, max_tokens=48)
    chunks = llm.create_chat_completion(ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=40,
                                        stream=True)
    deltas = [c["choices"][0]["delta"]["tool_calls"][0]["function"] for c in chunks
              if "tool_calls" in c["choices"][0]["delta"]]
    return {"json": r["choices"][0]["message"]["content"],
            "call": [deltas[0]["name"], "".join(d["arguments"] for d in deltas)]}


def check(found: dict) -> None:
    """Both answers valid: the JSON against SCHEMA (by hand: no jsonschema in the arm64 root),
    the call's arguments against the function's parameters."""
    value = json.loads(found["json"])
    assert set(value) == {"city", "rain", "days"} and isinstance(value["rain"], bool)
    assert isinstance(value["city"], str) and 1 <= len(value["city"]) <= 12
    assert isinstance(value["days"], int) and 1 <= value["days"] <= 7
    name, arguments = found["call"]
    args = json.loads(arguments)
    assert name == "forecast" and set(args) == {"city"} and len(args["city"]) <= 12


if __name__ == "__main__":
    print(json.dumps(answers()))
