// Reference data for edgekv's tool call reader: what llama.cpp's own chat parser (common_chat_parse,
// as llama-server runs it) makes of scripted model outputs, per chat template.
//
// Built against the llama.cpp vendored in llama-cpp-python 0.3.36 (its `llama-common` library and
// nlohmann's json.hpp); tools/make_tool_call_reference.py builds and runs it. Reads one JSON
// document on stdin:
//   {"cases": [{"template": "<jinja source>", "bos": "...", "eos": "...", "tools": [OpenAI tools],
//               "tool_choice": "auto", "parallel": true,
//               "outputs": [{"text": "...", "partial": false}, ...]}, ...]}
// and writes, per case, the format llama.cpp chose, its lazy grammar's triggers, the tokens it
// preserves, the prompt it rendered, and per output the parsed message (content, reasoning_content, tool_calls) or the
// parser's error.
#include "chat.h"

#include <nlohmann/json.hpp>

#include <iostream>
#include <iterator>
#include <string>

using json = nlohmann::ordered_json;

static const char * trigger_type(common_grammar_trigger_type t) {
    switch (t) {
        case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN: return "token";
        case COMMON_GRAMMAR_TRIGGER_TYPE_WORD: return "word";
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN: return "pattern";
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: return "pattern_full";
    }
    return "?";
}

static common_chat_tool_choice tool_choice(const std::string & s) {
    if (s == "required") {
        return COMMON_CHAT_TOOL_CHOICE_REQUIRED;
    }
    return s == "none" ? COMMON_CHAT_TOOL_CHOICE_NONE : COMMON_CHAT_TOOL_CHOICE_AUTO;
}

static json message_json(const common_chat_msg & msg) {
    json calls = json::array();
    for (const auto & c : msg.tool_calls) {
        calls.push_back({{"name", c.name}, {"arguments", c.arguments}, {"id", c.id}});
    }
    return {{"content", msg.content}, {"reasoning_content", msg.reasoning_content}, {"tool_calls", calls}};
}

static json run_case(const json & c) {
    auto tmpls = common_chat_templates_init(nullptr, c.at("template").get<std::string>(),
                                            c.value("bos", ""), c.value("eos", ""));
    common_chat_templates_inputs inputs;
    common_chat_msg user;
    user.role = "user";
    user.content = c.value("prompt", "What's the weather in Lyon?");
    inputs.messages = {user};
    for (const auto & t : c.at("tools")) {
        const auto & f = t.at("function");
        inputs.tools.push_back({f.at("name").get<std::string>(), f.value("description", ""),
                                f.value("parameters", json::object()).dump()});
    }
    inputs.tool_choice = tool_choice(c.value("tool_choice", "auto"));
    inputs.parallel_tool_calls = c.value("parallel", true);
    inputs.reasoning_format = COMMON_REASONING_FORMAT_AUTO;  // llama-server's default
    const auto params = common_chat_templates_apply(tmpls.get(), inputs);

    json out = {{"format", common_chat_format_name(params.format)}, {"grammar_lazy", params.grammar_lazy},
                {"generation_prompt", params.generation_prompt}, {"prompt", params.prompt}};
    json triggers = json::array();
    for (const auto & t : params.grammar_triggers) {
        triggers.push_back({{"type", trigger_type(t.type)}, {"value", t.value}});
    }
    out["triggers"] = triggers;
    out["preserved_tokens"] = params.preserved_tokens;

    common_chat_parser_params pp(params);
    pp.reasoning_format = COMMON_REASONING_FORMAT_AUTO;
    pp.parser.load(params.parser);
    json results = json::array();
    for (const auto & o : c.at("outputs")) {
        try {
            results.push_back(message_json(common_chat_parse(o.at("text").get<std::string>(), o.value("partial", false), pp)));
        } catch (const std::exception & e) {
            results.push_back({{"error", e.what()}});
        }
    }
    out["results"] = results;
    return out;
}

int main() {
    const json in = json::parse(std::string(std::istreambuf_iterator<char>(std::cin), {}));
    json out = json::array();
    for (const auto & c : in.at("cases")) {
        try {
            out.push_back(run_case(c));
        } catch (const std::exception & e) {
            out.push_back({{"error", e.what()}});
        }
    }
    std::cout << out.dump(1) << std::endl;
    return 0;
}
