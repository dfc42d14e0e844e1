"""Constrained decoding (edgekv/grammar.py; issue 18): 20 JSON schemas and 3 GBNF grammars on
both real models, greedy and sampled; every output parses and validates with the
`jsonschema` package (an independent validator). Also: the options everywhere a user looks
for them (create_completion(grammar=), create_chat_completion(response_format=), `edgekv run
--json-schema`, the server's response_format), and clear errors for bad grammars."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from edgekv import Llama
from edgekv.cli import main
from edgekv.grammar import Grammar, GrammarError, response_format_grammar

NAME = {"type": "string", "minLength": 1, "maxLength": 12}
SCHEMAS = {
    "object with required fields": {"type": "object", "properties": {"name": NAME, "age": {
                                        "type": "integer", "minimum": 0, "maximum": 150}},
                                    "required": ["name", "age"], "additionalProperties": False},
    "integer range": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 9}},
                      "required": ["n"], "additionalProperties": False},
    # a bare number admits endless digits ("1.0000..."), which a small model may write until
    # max_tokens; multipleOf makes the set finite
    "number range": {"type": "object", "properties": {"x": {"type": "number", "minimum": -1.5, "maximum": 2.5,
                                                            "multipleOf": 0.25}},
                     "required": ["x"], "additionalProperties": False},
    "enum": {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"],
             "additionalProperties": False},
    "boolean": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                "additionalProperties": False},
    "array min/max items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                            "minItems": 2, "maxItems": 4},
    "array of enums": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
    "nested object": {"type": "object", "properties": {
        "person": {"type": "object", "properties": {"name": NAME, "city": NAME}, "required": ["name", "city"],
                   "additionalProperties": False}}, "required": ["person"], "additionalProperties": False},
    "array of objects": {"type": "array", "maxItems": 2, "minItems": 1, "items": {
        "type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["id"],
        "additionalProperties": False}},
    "optional field": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                                       "b": NAME}, "required": ["a"], "additionalProperties": False},
    "string pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
                       "required": ["code"], "additionalProperties": False},
    "anyOf": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"enum": ["none"]}]},
    "const": {"type": "object", "properties": {"v": {"const": 7}, "w": {"type": "integer", "maximum": 5,
                                                                      "minimum": 0}},
              "required": ["v", "w"], "additionalProperties": False},
    "string length": {"type": "string", "minLength": 2, "maxLength": 5},
    "null or integer": {"type": "object", "properties": {"n": {"type": ["integer", "null"], "maximum": 9,
                                                               "minimum": 0}},
                        "required": ["n"], "additionalProperties": False},
    "date pattern": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
    "tuple (prefixItems)": {"type": "array", "prefixItems": [{"type": "integer", "minimum": 0, "maximum": 9},
                                                             {"enum": ["x", "y"]}], "items": False},
    "deep nesting": {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {
        "type": "object", "properties": {"c": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
        "required": ["c"], "additionalProperties": False}}, "required": ["b"], "additionalProperties": False}},
        "required": ["a"], "additionalProperties": False},
    "allOf": {"allOf": [{"type": "object", "properties": {"k": {"type": "integer", "minimum": 0, "maximum": 9}},
                         "required": ["k"]}, {"type": "object", "properties": {"k": {"type": "integer"}},
                                              "additionalProperties": False}]},
    "$ref to $defs": {"$defs": {"item": {"type": "object", "properties": {"n": {"enum": [1, 2, 3]}},
                                         "required": ["n"], "additionalProperties": False}},
                      "type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 2},
}
GRAMMARS = {  # GBNF -> what its output must match (the grammar again, as a Python regex)
    "labels": ('root ::= "positive" | "negative" | "neutral"', r"(positive|negative|neutral)"),
    "arithmetic": ('root ::= expr\nexpr ::= term (("+" | "-") term){0,3}\nterm ::= [0-9]{1,3}',
                   r"[0-9]{1,3}([+-][0-9]{1,3}){0,3}"),
    "CSV line": ('root ::= field ("," field){2}\nfield ::= [a-z]{1,8}', r"[a-z]{1,8}(,[a-z]{1,8}){2}"),
}
SEEDS = (1, 2, 3)


def test_twenty_schemas_are_all_valid_schemas():
    assert len(SCHEMAS) == 20
    for schema in SCHEMAS.values():
        jsonschema.Draft202012Validator.check_schema(schema)


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def llm(request, smollm2_path, gemma3_path):
    return Llama(str(smollm2_path if request.param == "smollm2" else gemma3_path), n_ctx=512)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_output_validates_greedy_and_sampled(llm, name):
    schema = SCHEMAS[name]
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    messages = [{"role": "user", "content": f"Answer in JSON: give an example for '{name}'."}]
    for seed in (None,) + SEEDS:  # None: greedy
        r = llm.create_chat_completion(messages, response_format=fmt, max_tokens=120, seed=seed,
                                       temperature=0 if seed is None else 0.9)
        text, finish = r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"]
        assert finish == "stop", f"seed {seed}: ran to max_tokens: {text!r}"
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_gbnf_output_matches(llm, name):
    gbnf, pattern = GRAMMARS[name]
    for seed in (None,) + SEEDS:
        r = llm.create_completion("Here it is:", grammar=Grammar.from_string(gbnf), max_tokens=40, seed=seed,
                                  temperature=0 if seed is None else 0.9)
        text = r["choices"][0]["text"]
        assert r["choices"][0]["finish_reason"] == "stop" and re.fullmatch(pattern, text), (seed, text)


@pytest.mark.slow
def test_json_object_mode_and_gbnf_text_argument(smollm2_path):
    llm = Llama(str(smollm2_path), n_ctx=512)
    r = llm.create_chat_completion([{"role": "user", "content": "Give {\"answer\": ...} for 2+2 as JSON."}],
                                   response_format={"type": "json_object"}, temperature=0, max_tokens=200)
    assert isinstance(json.loads(r["choices"][0]["message"]["content"]), dict)
    r = llm.create_completion("Yes or no?", grammar='root ::= "yes" | "no"', temperature=0, max_tokens=5)
    assert r["choices"][0]["text"] in ("yes", "no")
    streamed = "".join(c["choices"][0]["text"] for c in llm.create_completion(
        "Yes or no?", grammar='root ::= "yes" | "no"', temperature=0, max_tokens=5, stream=True))
    assert streamed == r["choices"][0]["text"]
    with pytest.raises(Exception, match="either grammar or response_format"):
        llm.create_chat_completion([{"role": "user", "content": "x"}], grammar='root ::= "a"',
                                   response_format={"type": "json_object"})


@pytest.mark.parametrize("bad, message", [
    ('root ::= "a" (', r"invalid GBNF grammar: .*line 1"),
    ("root ::= undefined_rule", r"undefined_rule"),
    ("not a grammar", r"invalid GBNF grammar"),
])
def test_a_bad_grammar_names_the_problem(bad, message):
    with pytest.raises(GrammarError, match=message):
        Grammar.from_string(bad)


@pytest.mark.parametrize("fmt, message", [
    ({"type": "json_schema"}, "needs"), ({"type": "xml"}, "not one of"), ([], "must be an object"),
    ({"type": "json_object", "schema": "{not json"}, "not valid JSON"),
    ({"type": "json_object", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}, "invalid JSON schema"),
])
def test_a_bad_response_format_names_the_problem(fmt, message):
    with pytest.raises(GrammarError, match=message):
        response_format_grammar(fmt)


@pytest.mark.slow
def test_run_command_json_schema(smollm2_path, tmp_path, capsys):
    schema = SCHEMAS["array min/max items"]
    (tmp_path / "s.json").write_text(json.dumps(schema))
    assert main(["run", "-m", str(smollm2_path), "-p", "Numbers:", "-n", "60", "--temp", "0",
                 "--json-schema", f"@{tmp_path / 's.json'}"]) == 0
    jsonschema.validate(json.loads(capsys.readouterr().out), schema)
    assert main(["run", "-m", str(smollm2_path), "-p", "x", "--grammar", 'root ::= "a" (']) == 1
    assert "invalid GBNF grammar" in capsys.readouterr().err


@pytest.mark.slow
def test_server_response_format(smollm2_path):
    from starlette.testclient import TestClient

    from edgekv.server import create_app

    client = TestClient(create_app(Llama(str(smollm2_path), n_ctx=512)))
    schema = SCHEMAS["object with required fields"]
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "A person as JSON."}], "temperature": 0, "max_tokens": 100,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema, "strict": True}}})
    assert r.status_code == 200
    jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), schema)
    r = client.post("/v1/completions", json={"prompt": "Answer:", "grammar": 'root ::= "A" | "B"', "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] in ("A", "B")
    bad = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                    "response_format": {"type": "json_schema"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_format"
