"""Chat templates: SmolLM2's own template against llama.cpp's rendered prompts and ids, the
built-in fallbacks, and the sandbox refusing what a hostile template tries."""

from __future__ import annotations

import pytest

from edgekv.text.chat_format import ChatFormatter, fallback_template_name
from edgekv.errors import ChatTemplateError
from edgekv.gguf.reader import GGUFFile
from edgekv.text.tokenizer import Tokenizer

SMOLLM2_KEY = "smollm2-135m-instruct-q4_1"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "},
            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]


def tiny_metadata(specials: list[str], template: str | None = None) -> dict:
    """A tiny SPM vocab: the given control tokens, 256 byte tokens, 'a' and 'b'."""
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)] + ["a", "b"]
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3] * len(specials) + [6] * 256 + [1, 1],
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.add_space_prefix": False}
    if template is not None:
        meta["tokenizer.chat_template"] = template
    return meta


def formatter_for(specials: list[str], template: str | None = None) -> ChatFormatter:
    meta = tiny_metadata(specials, template)
    return ChatFormatter.from_gguf(meta, Tokenizer.from_gguf(meta))


@pytest.fixture(scope="module")
def smollm2(smollm2_path) -> tuple[dict, Tokenizer]:
    metadata = GGUFFile(smollm2_path).metadata
    return metadata, Tokenizer.from_gguf(metadata)


@pytest.mark.slow
def test_smollm2_template_matches_llama_cpp(smollm2, reference):
    metadata, tok = smollm2
    chat = ChatFormatter.from_gguf(metadata, tok)
    assert chat.source == "gguf"
    cases = reference["models"][SMOLLM2_KEY]["chat"]
    assert cases
    for case in cases:
        prompt = chat.render(case["messages"], add_generation_prompt=True)
        assert prompt == case["rendered_prompt"]
        assert tok.encode(prompt, special=True) == case["prompt_ids"]  # add_bos: the model's (False)
        assert chat.encode(case["messages"]) == case["prompt_ids"]


@pytest.mark.slow
def test_smollm2_turn_end(smollm2):
    metadata, tok = smollm2
    chat = ChatFormatter.from_gguf(metadata, tok)
    assert chat.stop_strings == ["<|im_end|>"]
    assert chat.stop_token_ids == [tok.token_id("<|im_end|>")]
    assert chat.bos_token == "<|im_start|>" and chat.eos_token == "<|im_end|>"
    no_prompt = chat.render([{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert no_prompt.endswith("hi<|im_end|>\n")


@pytest.mark.slow
def test_chatml_fallback_without_template(smollm2):
    metadata, tok = smollm2
    bare = {k: v for k, v in metadata.items() if k != "tokenizer.chat_template"}
    chat = ChatFormatter.from_gguf(bare, tok)
    assert chat.source == "chatml"
    assert chat.render([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert chat.encode([{"role": "user", "content": "hi"}])[:3] == [1, 4093, 198]  # <|im_start|> user \n


def test_gemma_style_fallback_for_gemma_vocab():
    chat = formatter_for(["<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"])
    assert fallback_template_name(chat.tokenizer) == "gemma" and chat.source == "gemma"
    assert chat.render(MESSAGES) == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )
    assert chat.stop_strings == ["<end_of_turn>"]
    assert chat.stop_token_ids == [4, 2]  # <end_of_turn> (also the EOT), then EOS
    ids = chat.encode([{"role": "user", "content": "ab"}])
    assert ids[:2] == [1, 3] and ids.count(4) == 1  # BOS, <start_of_turn> ... one <end_of_turn>
    assert chat.tokenizer.decode(ids) == b"<bos>" + chat.render([{"role": "user", "content": "ab"}]).encode()


def test_template_variables_like_hugging_face():
    template = ("{{ bos_token }}{% for m in messages %}{{ m['role'] | upper }}:{{ m['content'] }}"
                "{% if loop.last %}{% break %}{% endif %}{% endfor %}{{ eos_token }}"
                "|{{ {'k': '<&>'} | tojson }}|{{ strftime_now('%Y') | length }}")
    chat = formatter_for(["<unk>", "<s>", "</s>"], template)
    assert chat.render([{"role": "user", "content": "x"}]) == '<s>USER:x</s>|{"k": "<&>"}|4'
    # the template wrote BOS itself, so encode() does not add a second one
    assert chat.encode([{"role": "user", "content": "x"}]).count(1) == 1


@pytest.mark.parametrize("template", [
    "{{ ''.__class__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__base__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{% set l = [] %}{{ l.append(1) }}",
    "{{ messages[0].update({'role': 'x'}) }}",
])
def test_sandbox_refuses_hostile_templates(template):
    chat = formatter_for(["<unk>", "<s>", "</s>"], template)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(ChatTemplateError, match="sandbox forbids"):
        chat.render(messages)
    assert messages == [{"role": "user", "content": "hi"}]


def test_template_errors_become_chat_template_errors():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        formatter_for(["<unk>", "<s>", "</s>"], "{% for m in messages %}")
    chat = formatter_for(["<unk>", "<s>", "</s>"], "{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        chat.render([{"role": "user", "content": "hi"}])
    chat = formatter_for(["<unk>", "<s>", "</s>"], "{{ nothing.here }}")
    with pytest.raises(ChatTemplateError, match="UndefinedError"):
        chat.render([{"role": "user", "content": "hi"}])
    with pytest.raises(ChatTemplateError, match="list of dicts"):
        chat.render("hi")  # type: ignore[arg-type]
