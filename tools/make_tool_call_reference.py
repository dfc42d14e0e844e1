"""Regenerate tests/reference/tool_calls.json: what llama.cpp's own chat parser (the
`common_chat_parse` llama-server runs on a model's answer) makes of scripted model outputs,
per model family, with the family's real chat template.

How: tests/reference/tool_calls/llama_chat_parse.cpp is compiled against the `llama-common`
library of the llama.cpp vendored in the llama-cpp-python 0.3.36 sdist (only that library's
sources are built, about 4 minutes on 2 cores; `libllama` and `libggml` come from the
installed llama-cpp-python of the same sdist) and run once on all the cases below. Each
case: a template, the request's tools, parallel_tool_calls, and model outputs, whole or cut
short (`partial`, as a stream sees them). tests/test_tool_call_reference.py reads the same
outputs with edgekv's reader and compares. Run with the virtualenv that has llama-cpp-python
(tests/reference/README.md):

    /tmp/llvenv/bin/python tools/make_tool_call_reference.py --sdist llama_cpp_python-0.3.36.tar.gz \\
        tests/reference/tool_calls.json
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "tests" / "reference" / "chat_templates"
PROGRAM = ROOT / "tests" / "reference" / "tool_calls" / "llama_chat_parse.cpp"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}
TOOLS = [WEATHER, TIME]
LYON, CET = '{"city": "Lyon"}', '{"timezone": "CET"}'


def _json_call(name: str, args: str, key: str = "arguments") -> str:
    return f'{{"name": "{name}", "{key}": {args}}}'


def _hermes(name: str, args: str) -> str:
    return f"<tool_call>\n{_json_call(name, args)}\n</tool_call>"


def _xml(name: str, params: dict) -> str:
    inner = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{inner}</function>\n</tool_call>"


def _deepseek(name: str, args: str) -> str:
    return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"


def _command_r(calls: list[tuple[str, str]]) -> str:
    items = ",\n    ".join(f'{{"tool_call_id": "{i}", "tool_name": "{n}", "parameters": {a}}}'
                           for i, (n, a) in enumerate(calls))
    return f"<|START_ACTION|>[\n    {items}\n]<|END_ACTION|>"


def _gpt_oss(name: str, args: str) -> str:
    return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{args}<|call|>"


def _cuts(text: str) -> list[dict]:
    """The output cut short (a stream's partial texts): inside the name, inside the arguments,
    and 3 characters before its end."""
    return [dict(text=text[:text.index(m) + len(m)], partial=True) for m in ("get_w", "Ly")] + \
        [dict(text=text[:-3], partial=True)]


def _family_outputs(call, two: str, unknown: str, before: str) -> list[dict]:
    one = call("get_weather", LYON)
    return [dict(text="Hello! How can I help you today?"), dict(text=one), dict(text=two), dict(text=before),
            dict(text=unknown), *_cuts(one)]


def _ministral(name: str, args: str, call_id: str = "") -> str:
    return f"[TOOL_CALLS]{name}" + (f"[CALL_ID]{call_id}" if call_id else "") + f"[ARGS]{args}"


AFTER = "\nI will wait for the result."  # text after a call


def cases() -> list[dict]:
    hermes = _family_outputs(_hermes, _hermes("get_weather", LYON) + "\n" + _hermes("get_time", CET),
                             _hermes("say_hi", "{}"), "Let me check.\n" + _hermes("get_weather", LYON)) + [
        dict(text="```json\n" + _json_call("get_weather", LYON) + "\n```"),
        dict(text=_json_call("get_weather", LYON))]
    qwen3 = [dict(text="<think>\nThe user wants weather.\n</think>\n\n" + o["text"], partial=o.get("partial", False))
             for o in hermes]
    llama = _family_outputs(lambda n, a: _json_call(n, a, "parameters"),
                            _json_call("get_weather", LYON, "parameters") + "; " + _json_call("get_time", CET, "parameters"),
                            _json_call("say_hi", "{}", "parameters"),
                            "Let me check. " + _json_call("get_weather", LYON, "parameters")) + [
        dict(text="<|python_tag|>" + _json_call("get_weather", LYON, "parameters"))]
    mistral = _family_outputs(lambda n, a: f"[TOOL_CALLS][{_json_call(n, a)[:-1]}, \"id\": \"abc123XYZ\"}}]",
                              f"[TOOL_CALLS][{_json_call('get_weather', LYON)}, {_json_call('get_time', CET)}]",
                              f"[TOOL_CALLS][{_json_call('say_hi', '{}')}]",
                              f"Let me check.[TOOL_CALLS][{_json_call('get_weather', LYON)}]")
    coder = _family_outputs(lambda n, a: _xml(n, json.loads(a)),
                            _xml("get_weather", {"city": "Paris", "days": 2}) + "\n" + _xml("get_time", {"timezone": "CET"}),
                            _xml("say_hi", {}), "Let me check.\n" + _xml("get_weather", {"city": "Lyon"}))
    deepseek = [dict(text="I'm thinking.\n</think>\n\n" + o["text"], partial=o.get("partial", False)) for o in _family_outputs(
        lambda n, a: f"<｜tool▁calls▁begin｜>{_deepseek(n, a)}<｜tool▁calls▁end｜>",
        f"<｜tool▁calls▁begin｜>{_deepseek('get_weather', LYON)}\n{_deepseek('get_time', CET)}<｜tool▁calls▁end｜>",
        f"<｜tool▁calls▁begin｜>{_deepseek('say_hi', '{}')}<｜tool▁calls▁end｜>",
        f"Let me check.<｜tool▁calls▁begin｜>{_deepseek('get_weather', LYON)}<｜tool▁calls▁end｜>")]
    command_r = _family_outputs(lambda n, a: _command_r([(n, a)]),
                                _command_r([("get_weather", LYON), ("get_time", CET)]),
                                _command_r([("say_hi", "{}")]),
                                "<|START_THINKING|>I will look it up.<|END_THINKING|>" + _command_r([("get_weather", LYON)])) + [
        dict(text="<|START_RESPONSE|>Hello! How can I help you today?<|END_RESPONSE|>")]
    functionary = _family_outputs(lambda n, a: f"{n}\n{a}", f"get_weather\n{LYON}>>>get_time\n{CET}",
                                  "say_hi\n{}", f"all\nLet me check.>>>get_weather\n{LYON}")
    gpt_oss = _family_outputs(_gpt_oss, _gpt_oss("get_weather", LYON) + "<|start|>assistant" + _gpt_oss("get_time", CET),
                              _gpt_oss("say_hi", "{}"),
                              "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant" + _gpt_oss("get_weather", LYON)) + [
        dict(text="<|channel|>final<|message|>Hello! How can I help you today?")]
    ministral = _family_outputs(_ministral, _ministral("get_weather", LYON) + _ministral("get_time", CET),
                                _ministral("say_hi", "{}"), "Let me check." + _ministral("get_weather", LYON)) + [
        dict(text="[THINK]Need weather.[/THINK]" + _ministral("get_weather", LYON))]
    small = [dict(text=_ministral("get_weather", LYON, "abc123XYZ")),
             dict(text=_ministral("get_weather", LYON, "abc123XYZ") + _ministral("get_time", CET, "def456UVW"))]
    for outputs, call in ((hermes, _hermes("get_weather", LYON)), (qwen3, _hermes("get_weather", LYON)),
                          (llama, _json_call("get_weather", LYON, "parameters")),
                          (mistral, f"[TOOL_CALLS][{_json_call('get_weather', LYON)}]"),
                          (coder, _xml("get_weather", {"city": "Lyon"})), (ministral, _ministral("get_weather", LYON))):
        outputs.append(dict(text=call + AFTER))
    return [
        dict(family="hermes", template="Qwen-Qwen2.5-7B-Instruct.jinja", bos="", eos="<|im_end|>", outputs=hermes),
        dict(family="hermes", template="NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", bos="<|begin_of_text|>",
             eos="<|im_end|>", outputs=hermes),
        dict(family="hermes", template="Qwen-Qwen3-0.6B.jinja", bos="", eos="<|im_end|>", outputs=qwen3),
        dict(family="llama3", template="meta-llama-Llama-3.1-8B-Instruct.jinja", bos="<|begin_of_text|>",
             eos="<|eot_id|>", outputs=llama),
        dict(family="llama3", template="meta-llama-Llama-3.2-3B-Instruct.jinja", bos="<|begin_of_text|>",
             eos="<|eot_id|>", outputs=llama),
        dict(family="mistral", template="mistralai-Mistral-Nemo-Instruct-2407.jinja", bos="<s>", eos="</s>", outputs=mistral),
        dict(family="ministral", template="mistralai-Ministral-3-14B-Reasoning-2512.jinja", bos="<s>", eos="</s>",
             outputs=ministral),
        dict(family="ministral", template="Mistral-Small-3.2-24B-Instruct-2506.jinja", bos="<s>", eos="</s>",
             outputs=small),
        dict(family="qwen3_coder", template="Qwen3-Coder.jinja", bos="", eos="<|im_end|>", outputs=coder),
        dict(family="deepseek_r1", template="deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", bos="<｜begin▁of▁sentence｜>",
             eos="<｜end▁of▁sentence｜>", outputs=deepseek),
        dict(family="command_r", template="CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", bos="<BOS_TOKEN>",
             eos="<|END_OF_TURN_TOKEN|>", outputs=command_r),
        dict(family="functionary", template="meetkai-functionary-medium-v3.2.jinja", bos="<|begin_of_text|>",
             eos="<|eot_id|>", outputs=functionary),
        dict(family="gpt_oss", template="openai-gpt-oss-120b.jinja", bos="<|startoftext|>", eos="<|return|>",
             outputs=gpt_oss),
    ]


def build(sdist: Path, work: Path, libs: Path) -> Path:
    """The reference program, compiled against the sdist's llama-common and the installed libllama."""
    tree = work / sdist.name.removesuffix(".tar.gz") / "vendor" / "llama.cpp"
    if not tree.exists():
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
    out = tree / "build"
    archive = out / "common" / "libllama-common.a"
    if not archive.exists():
        subprocess.run(["cmake", "-S", str(tree), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
                        "-DLLAMA_OPENSSL=OFF", "-DGGML_NATIVE=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
                        "-DLLAMA_BUILD_COMMON=ON"], check=True)
        base = "common/CMakeFiles/llama-common-base.dir"
        subprocess.run(["make", "-f", f"{base}/build.make", f"{base}/build"], cwd=out, check=True)
        # only llama-common's objects (the shared library's link step would build all of libllama first)
        rules = (out / "common" / "CMakeFiles" / "llama-common.dir" / "build.make").read_text()
        objects = sorted(set(re.findall(r"^(common/CMakeFiles/llama-common\.dir/\S+\.o):", rules, re.M)))
        subprocess.run(["make", "-j2", "-f", "common/CMakeFiles/llama-common.dir/build.make", *objects], cwd=out, check=True)
        subprocess.run(["ar", "rcs", str(archive), *objects], cwd=out, check=True)
    exe = work / "llama_chat_parse"
    subprocess.run(["g++", "-std=c++17", "-O1", str(PROGRAM), f"-I{tree / 'common'}", f"-I{tree / 'include'}",
                    f"-I{tree / 'ggml' / 'include'}", f"-I{tree / 'vendor'}", str(out / "common" / "libllama-common.a"),
                    str(out / "common" / "libllama-common-base.a"), f"-L{libs}", "-lllama", "-lggml", "-lggml-base",
                    f"-Wl,-rpath,{libs}", "-o", str(exe)], check=True)
    return exe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--sdist", type=Path, required=True, help="llama_cpp_python-0.3.36.tar.gz")
    parser.add_argument("--work", type=Path, default=Path("/tmp/tool_call_reference"))
    args = parser.parse_args(argv)
    import llama_cpp  # the installed llama-cpp-python: its libllama and libggml

    args.work.mkdir(parents=True, exist_ok=True)
    exe = build(args.sdist.resolve(), args.work, Path(llama_cpp.__file__).parent / "lib")
    all_cases = cases()
    request = {"cases": [dict(template=(TEMPLATES / c["template"]).read_text(), bos=c["bos"], eos=c["eos"],
                              tools=TOOLS, parallel=True, outputs=c["outputs"]) for c in all_cases]}
    done = subprocess.run([str(exe)], input=json.dumps(request), capture_output=True, text=True, check=True)
    results = json.loads(done.stdout)
    for case, result in zip(all_cases, results):
        case.update(tools=TOOLS, parallel=True, llama_cpp=result)
    args.out.write_text(json.dumps({"llama_cpp": f"llama-cpp-python {llama_cpp.__version__} (vendored llama.cpp)",
                                    "cases": all_cases}, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}: {len(all_cases)} templates, {sum(len(c['outputs']) for c in all_cases)} outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
