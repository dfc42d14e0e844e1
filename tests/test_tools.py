"""Tool calls (edgekv/api/tools.py; issue 18): OpenAI's tools / tool_choice on SmolLM2 (whose
template knows no tools: the generic JSON format) and on a Qwen2.5 template (the model's own
<tool_call> format), through the Python API and through `edgekv serve` with the official
`openai` client: the model calls a function, the result goes back, the model answers.
Arguments are checked with the `jsonschema` package against the function's parameters."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest

from edgekv import Llama
from edgekv.api.tools import ToolCalling
from edgekv.errors import EdgeKVError
from edgekv.server import create_app
from helpers.lazy_grammar import feed
from helpers.server import WAIT_S, serving

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 20},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
             "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                              "b": {"type": "integer", "minimum": 0, "maximum": 999}},
             "required": ["a", "b"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
TEMPLATES = Path(__file__).parent / "reference" / "chat_templates"
QWEN_TEMPLATE = TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"
LLAMA3_TEMPLATE = TEMPLATES / "meta-llama-Llama-3.2-3B-Instruct.jinja"
MISTRAL_TEMPLATE = TEMPLATES / "mistralai-Mistral-Nemo-Instruct-2407.jinja"
QWEN3_CODER_TEMPLATE = TEMPLATES / "Qwen3-Coder.jinja"


def check_call(call: dict, name: str | None = None) -> dict:
    """A tool call's shape; its arguments parsed and validated against the function's schema."""
    assert call["type"] == "function"
    assert call["id"].startswith("call_") or (len(call["id"]) == 9 and call["id"].isalnum())  # OpenAI's, Mistral's
    function = next(t["function"] for t in TOOLS if t["function"]["name"] == call["function"]["name"])
    assert name is None or function["name"] == name
    args = json.loads(call["function"]["arguments"])
    jsonschema.validate(args, function["parameters"])
    return args


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return Llama(str(smollm2_path), n_ctx=1024)


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_a_required_or_named_call(llm, choice):
    for seed in (None, 1, 2):
        r = llm.create_chat_completion(ASK, tools=TOOLS, tool_choice=choice, max_tokens=80, seed=seed,
                                       temperature=0 if seed is None else 0.9)
        choice0 = r["choices"][0]
        assert choice0["finish_reason"] == "tool_calls" and choice0["message"]["content"] is None
        [call] = choice0["message"]["tool_calls"]
        check_call(call, None if choice == "required" else "add")


@pytest.mark.slow
def test_auto_answers_text_or_a_valid_call_and_none_answers_text(llm):
    r = llm.create_chat_completion(ASK, tools=TOOLS, max_tokens=40, temperature=0)  # tool_choice auto
    message = r["choices"][0]["message"]
    if message.get("tool_calls"):
        for call in message["tool_calls"]:
            check_call(call)
    else:  # text, in which no call to an offered function was read
        assert message["content"] and '"name": "get_weather"' not in message["content"].replace('":"', '": "')
    r = llm.create_chat_completion(ASK, tools=TOOLS, tool_choice="none", max_tokens=20, temperature=0)
    assert "tool_calls" not in r["choices"][0]["message"] and r["choices"][0]["message"]["content"]


def streamed_call(chunks: list[dict]) -> dict:
    """The call a stream of chunks carries, put together as an OpenAI client does: the first
    tool_calls delta gives id and name, the next ones pieces of the arguments."""
    deltas = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if "tool_calls" in c["choices"][0]["delta"]]
    head, rest = deltas[0], [d for d in deltas[1:] if d["index"] == 0]  # the first call's
    assert head["index"] == 0 and head["function"]["arguments"] == "" and head["type"] == "function"
    assert rest and all(set(d) == {"index", "function"} and set(d["function"]) == {"arguments"} for d in rest)
    return dict(head, function=dict(head["function"], arguments="".join(d["function"]["arguments"] for d in rest)))


@pytest.mark.slow
def test_a_streamed_call_comes_piece_by_piece(llm):
    for seed in (None, 1):
        kwargs = dict(tools=TOOLS, tool_choice="required", max_tokens=80, seed=seed, temperature=0 if seed is None else 0.9)
        whole = llm.create_chat_completion(ASK, **kwargs)["choices"][0]["message"]["tool_calls"][0]
        chunks = list(llm.create_chat_completion(ASK, stream=True, **kwargs))
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
        call = streamed_call(chunks)
        pieces = sum("tool_calls" in c["choices"][0]["delta"] for c in chunks) - 1
        assert pieces >= 4, "the arguments come as they are generated, not whole"
        assert check_call(call) == json.loads(whole["function"]["arguments"])
        assert call["function"]["arguments"] == whole["function"]["arguments"]
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.slow
def test_a_streamed_text_answer_with_tools_comes_piece_by_piece(llm):
    kwargs = dict(tools=TOOLS, max_tokens=20, temperature=0)  # auto: SmolLM2 answers this one in text
    whole = llm.create_chat_completion(ASK, **kwargs)["choices"][0]
    chunks = list(llm.create_chat_completion(ASK, stream=True, **kwargs))
    texts = [c["choices"][0]["delta"].get("content") for c in chunks[1:-1]]
    assert whole["message"]["content"] and len(texts) > 5 and "".join(texts) == whole["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["finish_reason"] == "length"


@pytest.mark.slow
def test_a_call_cut_by_max_tokens_streams_what_it_has(llm):
    chunks = list(llm.create_chat_completion(ASK, tools=TOOLS, tool_choice="required", max_tokens=9,
                                             temperature=0, stream=True))
    call = streamed_call(chunks)
    assert call["function"]["arguments"].startswith("{") and chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.slow
@pytest.mark.parametrize("kwargs, message", [
    (dict(tools={"x": 1}), "tools must be a list"),
    (dict(tools=[{"type": "function", "function": {"description": "no name"}}]), r"tools\[0\]"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "names no function"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": "get_weather"}), "names no function"),
    (dict(tool_choice="required"), "needs tools"),
    (dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), "cannot be combined"),
])
def test_bad_tool_requests_are_refused(llm, kwargs, message):
    with pytest.raises(EdgeKVError, match=message):
        llm.create_chat_completion(ASK, max_tokens=4, **kwargs)


def as_the_api_renders(llm, messages: list[dict]) -> str:
    """The prompt create_chat_completion(messages, tools=TOOLS) evaluates."""
    calling = ToolCalling(TOOLS, None, llm.chat_formatter.template)
    return llm.chat_formatter.render(calling.messages(messages), add_generation_prompt=True, **calling.template_kwargs())


def test_the_models_own_format_on_a_qwen_template(tiny_model):
    """Qwen2.5's template lists the tools itself and expects <tool_call> JSON </tool_call>;
    a tiny random model under the grammar writes exactly that, and the call is read back."""
    path = tiny_model("qwen2", metadata={"tokenizer.chat_template": QWEN_TEMPLATE.read_text()})
    llm = Llama(str(path), n_ctx=2048)
    prompt = llm.chat_formatter.render(ASK, tools=TOOLS)
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt
    one = dict(tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    r = llm.create_chat_completion(ASK, **one, max_tokens=120, temperature=0.5, seed=3)
    [call] = r["choices"][0]["message"]["tool_calls"]
    check_call(call)
    chunks = list(llm.create_chat_completion(ASK, **one, max_tokens=120, temperature=0.5, seed=3, stream=True))
    assert streamed_call(chunks)["function"]["arguments"] == call["function"]["arguments"]
    # the call and its result go back through the template as Hugging Face passes them
    follow = ASK + [r["choices"][0]["message"], {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    rendered = as_the_api_renders(llm, follow)
    assert "<tool_response>\nsunny\n</tool_response>" in rendered
    assert f'<tool_call>\n{{"name": "{call["function"]["name"]}", "arguments": ' in rendered


def test_the_qwen_grammar_allows_several_calls_unless_parallel_tool_calls_is_false(tiny_model):
    """OpenAI's parallel tool calls in the template's form: one <tool_call> block per line,
    as the grammar checks them token by token (llguidance on the model's own tokens)."""
    import llguidance

    from edgekv.grammar import _llg_tokenizer

    path = tiny_model("qwen2", metadata={"tokenizer.chat_template": QWEN_TEMPLATE.read_text()})
    llm = Llama(str(path), n_ctx=256)
    one = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Lyon"}}\n</tool_call>'
    two = one + '\n<tool_call>\n{"name":"add","arguments":{"a":1,"b":2}}\n</tool_call>'

    def accepts(grammar, text: str) -> bool:
        matcher = llguidance.LLMatcher(_llg_tokenizer(llm.tokenizer_), grammar.spec, log_level=0)
        return matcher.consume_tokens(llm.tokenize(text.encode(), add_bos=False, special=True)) and \
            not matcher.is_error() and matcher.is_accepting()

    for choice in ("required", "auto"):  # auto's grammar once a call started (the lazy grammar's)
        several, single = (ToolCalling(TOOLS, choice, QWEN_TEMPLATE.read_text(), parallel).grammar()
                           for parallel in (True, False))
        if choice == "auto":
            several, single = several.grammar, single.grammar
        assert accepts(several, one) and accepts(several, two) and accepts(single, one)
        assert not accepts(single, two) and not accepts(several, "It is sunny.")
    with pytest.raises(EdgeKVError, match="parallel_tool_calls must be true or false"):
        ToolCalling(TOOLS, "auto", QWEN_TEMPLATE.read_text(), "yes")


LYON = '{"name": "get_weather", "arguments": {"city": "Lyon"}}'


@pytest.mark.parametrize("text, triggered, valid", [
    (f"<tool_call>\n{LYON}\n</tool_call>", True, True),
    (f"```json\n{LYON}\n```", True, True),  # Qwen2.5-Coder's free form (issue 50)
    (f"{LYON}\n{LYON}", True, True),
    (f"[{LYON}, {LYON}]", True, True),  # Mistral's array
    (f"  <tool_call>\n{LYON}\n</tool_call>\n<tool_call>{LYON}</tool_call>\n", True, True),
    (f"<think>the weather, so</think>\n{LYON}", True, True),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"town": "Lyon"}}', True, False),  # not its parameters
    ('```json\n{"name": "get_weather", "arguments": {"city": "Lyon", "x": 1}}', True, False),
    ("It is sunny in Lyon. {\"name\": \"get_weather\"}", False, True),  # bare JSON after text: free
    (f"Let me check.\n<tool_call>\n{LYON}\n</tool_call>", True, True),  # the family's tag: anywhere
    ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"town": "Lyon"}}', True, False),
    ('```json\n{"name": "say_hi", "arguments": {}}\n```', False, True),  # not an offered function: free
])
def test_auto_is_free_until_the_answer_starts_a_call_then_the_call_is_constrained(tiny_model, text, triggered, valid):
    """llama.cpp's lazy grammar: the mask stays off until the text, as generated so far, is
    the start of a call to an offered function; from there every token must keep the call
    valid (the arguments their parameters), and the answer may end once the calls are whole."""
    from edgekv.grammar import LazyConstraint

    path = tiny_model("qwen2", metadata={"tokenizer.chat_template": QWEN_TEMPLATE.read_text()})
    tokenizer = Llama(str(path), n_ctx=256).tokenizer_
    constraint = LazyConstraint(ToolCalling(TOOLS, "auto", QWEN_TEMPLATE.read_text()).grammar(), tokenizer)
    allowed = feed(constraint, tokenizer, text)
    assert (constraint.inner is not None) == triggered and allowed == valid
    if triggered and valid:
        assert constraint.inner.matcher.is_accepting()


def test_auto_text_is_what_the_model_writes_without_a_grammar(tiny_model):
    """Free text under "auto" is not shaped at all: the same tokens as the same prompt
    completed with no grammar (a tiny random model, sampled with one seed)."""
    path = tiny_model("qwen2", metadata={"tokenizer.chat_template": QWEN_TEMPLATE.read_text()})
    llm = Llama(str(path), n_ctx=2048)
    prompt = llm.chat_prompt_tokens(ASK, tools=TOOLS)
    for seed in (1, 2, 3):
        answer = llm.create_chat_completion(ASK, tools=TOOLS, max_tokens=24, temperature=0.8, seed=seed)
        free = llm.create_completion(prompt, max_tokens=24, temperature=0.8, seed=seed)
        message = answer["choices"][0]["message"]
        assert "tool_calls" not in message and message["content"]
        assert message["content"] == free["choices"][0]["text"][:len(message["content"])]


def test_the_models_own_format_on_a_llama_3_template(tiny_model):
    """Llama 3.2's template puts the functions in the first user turn and expects a bare
    {"name": ..., "parameters": {...}}; results come back in ipython turns."""
    path = tiny_model("llama", metadata={"tokenizer.chat_template": LLAMA3_TEMPLATE.read_text()})
    llm = Llama(str(path), n_ctx=2048)
    prompt = llm.chat_formatter.render(ASK, tools=TOOLS, add_generation_prompt=True)
    assert '"parameters": dictionary of argument name' in prompt and '"name": "get_weather"' in prompt
    kwargs = dict(tools=TOOLS, tool_choice="required", max_tokens=120, temperature=0.5, seed=3)
    r = llm.create_chat_completion(ASK, **kwargs)
    [call] = r["choices"][0]["message"]["tool_calls"]
    check_call(call)
    chunks = list(llm.create_chat_completion(ASK, stream=True, **kwargs))
    assert streamed_call(chunks)["function"]["arguments"] == call["function"]["arguments"]
    follow = ASK + [r["choices"][0]["message"], {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    rendered = as_the_api_renders(llm, follow)
    name = call["function"]["name"]
    assert f'{{"name": "{name}", "parameters": {json.dumps(json.loads(call["function"]["arguments"]))}}}' in rendered
    # the template passes a string result through tojson (a string is iterable to Jinja), as with Hugging Face
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"sunny"<|eot_id|>' in rendered


def test_the_models_own_format_on_a_mistral_template(tiny_model):
    """Mistral Nemo's template lists the functions in [AVAILABLE_TOOLS] and expects
    [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (the control token writes no text: the
    array is what the reader sees); its call ids must be 9 letters and digits, or it refuses
    the conversation that sends the call back."""
    path = tiny_model("llama", metadata={"tokenizer.chat_template": MISTRAL_TEMPLATE.read_text()})
    llm = Llama(str(path), n_ctx=2048)
    prompt = llm.chat_formatter.render(ASK, tools=TOOLS, add_generation_prompt=True)
    assert prompt.count('[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather"') == 1
    kwargs = dict(tools=TOOLS, tool_choice="required", max_tokens=160, temperature=0.5, seed=3)
    r = llm.create_chat_completion(ASK, **kwargs)
    calls = r["choices"][0]["message"]["tool_calls"]
    assert calls and r["choices"][0]["finish_reason"] == "tool_calls"
    for call in calls:
        check_call(call)
        assert len(call["id"]) == 9 and call["id"].isalnum()
    chunks = list(llm.create_chat_completion(ASK, stream=True, **kwargs))
    assert streamed_call(chunks)["function"]["arguments"] == calls[0]["function"]["arguments"]
    follow = ASK + [r["choices"][0]["message"]] + [{"role": "tool", "tool_call_id": c["id"], "content": "sunny"}
                                                   for c in calls]
    rendered = as_the_api_renders(llm, follow)
    first = calls[0]
    assert (f'[TOOL_CALLS][{{"name": "{first["function"]["name"]}", "arguments": '
            f'{json.dumps(json.loads(first["function"]["arguments"]))}, "id": "{first["id"]}"}}') in rendered
    assert f'[TOOL_RESULTS]{{"content": sunny, "call_id": "{first["id"]}"}}[/TOOL_RESULTS]' in rendered
    grammar = ToolCalling(TOOLS, "required", MISTRAL_TEMPLATE.read_text()).grammar()
    assert grammar is not None and ToolCalling(TOOLS, "auto", MISTRAL_TEMPLATE.read_text()).format == "mistral"


def test_the_models_own_format_on_a_qwen3_coder_template(tiny_model):
    """Qwen3-Coder's template lists the functions as XML and expects <tool_call><function=NAME>
    <parameter=KEY>VALUE</parameter>...; under the grammar a tiny random model writes that, the
    values typed by the schema (add's integers), and the call goes back through the template."""
    path = tiny_model("qwen2", metadata={"tokenizer.chat_template": QWEN3_CODER_TEMPLATE.read_text()})
    llm = Llama(str(path), n_ctx=4096)
    prompt = llm.chat_formatter.render(ASK, tools=TOOLS, add_generation_prompt=True)
    assert "<function>\n<name>get_weather</name>" in prompt
    # add's arguments are integers (a random model would not end get_weather's required text city)
    for tools, choice in ((TOOLS[1:], "required"), (TOOLS, {"type": "function", "function": {"name": "add"}})):
        kwargs = dict(tools=tools, tool_choice=choice, parallel_tool_calls=False, max_tokens=200, temperature=0.5,
                      seed=3)
        r = llm.create_chat_completion(ASK, **kwargs)
        [call] = r["choices"][0]["message"]["tool_calls"]
        args = json.loads(call["function"]["arguments"])
        assert call["function"]["name"] == "add" and set(args) == {"a", "b"}  # the required keys, in order
        assert all(isinstance(v, int) for v in args.values()), args
        chunks = list(llm.create_chat_completion(ASK, stream=True, **kwargs))
        assert streamed_call(chunks)["function"]["arguments"] == call["function"]["arguments"]
    follow = ASK + [r["choices"][0]["message"], {"role": "tool", "tool_call_id": call["id"], "content": "3"}]
    rendered = as_the_api_renders(llm, follow)
    assert f'<tool_call>\n<function={call["function"]["name"]}>\n' in rendered
    assert "<tool_response>\n3\n</tool_response>" in rendered


@pytest.mark.parametrize("text, valid", [
    ("<tool_call>\n<function=add>\n<parameter=a>\n12\n</parameter>\n<parameter=b>\n3\n</parameter>\n"
     "</function>\n</tool_call>", True),
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nSaint <Lyon>\n</parameter>\n</function>\n"
     "</tool_call>", True),
    ("<tool_call>\n<function=add>\n<parameter=a>\ntwelve\n</parameter>\n", False),  # not an integer
    ("<tool_call>\n<function=add>\n<parameter=c>\n1\n</parameter>\n", False),  # not a parameter of add
])
def test_qwen3_coder_calls_under_auto_are_held_to_the_parameters(tiny_model, text, valid):
    import numpy as np

    from edgekv.grammar import LazyConstraint

    path = tiny_model("qwen2", metadata={"tokenizer.chat_template": QWEN3_CODER_TEMPLATE.read_text()})
    tokenizer = Llama(str(path), n_ctx=256).tokenizer_
    constraint = LazyConstraint(ToolCalling(TOOLS, "auto", QWEN3_CODER_TEMPLATE.read_text()).grammar(), tokenizer)
    history, allowed = [1, 2], True
    for token in tokenizer.encode(text, add_bos=False):
        logits = np.zeros(tokenizer.n_vocab, np.float32)
        constraint.apply(logits, history)
        if not np.isfinite(logits[token]):
            allowed = False
            break
        history.append(token)
    assert constraint.inner is not None and allowed == valid


@pytest.mark.slow
def test_round_trip_through_the_openai_client(llm):
    with serving(create_app(llm)) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=WAIT_S)
        first = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                               parallel_tool_calls=False, temperature=0, max_tokens=80)
        assert first.choices[0].finish_reason == "tool_calls"
        call = first.choices[0].message.tool_calls[0]
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, next(t["function"]["parameters"] for t in TOOLS
                                       if t["function"]["name"] == call.function.name))
        result = "18 degrees and sunny" if call.function.name == "get_weather" else str(args["a"] + args["b"])
        messages = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": result}]
        final = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="none",
                                               temperature=0, max_tokens=30)
        assert final.choices[0].message.content and not final.choices[0].message.tool_calls
        streamed = list(client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                                       temperature=0, max_tokens=80, stream=True))
        deltas = [c.choices[0].delta.tool_calls for c in streamed if c.choices and c.choices[0].delta.tool_calls]
        assert deltas and deltas[0][0].function.name == call.function.name and deltas[0][0].id
        assert json.loads("".join(d[0].function.arguments for d in deltas)) == args
        bad = client.chat.completions.with_raw_response  # a bad tool_choice is a 400
        with pytest.raises(openai.BadRequestError, match="names no function"):
            bad.create(model="m", messages=ASK, tools=TOOLS, tool_choice={"type": "function",
                                                                         "function": {"name": "nope"}})
        with pytest.raises(openai.BadRequestError, match="parallel_tool_calls must be true or false"):
            bad.create(model="m", messages=ASK, tools=TOOLS, extra_body={"parallel_tool_calls": "yes"})


@pytest.mark.slow
def test_round_trip_through_langchain(llm):
    """LangChain's ChatOpenAI with bind_tools, a second real client: the model calls the
    function (tool_choice "any" is LangChain's "required"), the result goes back as a
    ToolMessage, the model answers."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_openai import ChatOpenAI

    with serving(create_app(llm)) as port:
        chat = ChatOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", model="m", temperature=0,
                          max_tokens=80, max_retries=0, timeout=WAIT_S)
        messages = [HumanMessage("What is the weather in Paris?")]
        called = chat.bind_tools(TOOLS, tool_choice="any").invoke(messages)
        [call] = called.tool_calls
        jsonschema.validate(call["args"], next(t["function"]["parameters"] for t in TOOLS
                                               if t["function"]["name"] == call["name"]))
        messages += [called, ToolMessage("18 degrees and sunny", tool_call_id=call["id"])]
        answer = chat.bind_tools(TOOLS, tool_choice="none").invoke(messages)
        assert answer.content and not answer.tool_calls
