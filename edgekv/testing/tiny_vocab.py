"""The tokenizers of the tiny test models (edgekv/testing/tiny_model.py): small but real vocabularies.

What lives here: a GPT-2 byte-level BPE trained on a short corpus (SmolLM2's layout for
llama, Qwen's for qwen2/qwen3) and SentencePiece vocabularies with byte fallback (Gemma 3's
layout, and Llama 2's for Mistral and Phi-3), each with its family's special tokens and a
chat template in its family's turn format; `add_tokenizer` writes one as GGUF keys. What
does not: the weights and hyperparameters (testing/tiny_model.py) and reading tokenizers
(edgekv/text/).
"""

from __future__ import annotations

import re
from collections import Counter

from gguf import GGUFWriter

N_MERGES = 48
CORPUS = (
    "Hello world! The quick brown fox jumps over the lazy dog. "
    "A small model on the edge keeps its cache in a ring; the ring holds the keys and the values "
    "of the tokens that came before, and the oldest tokens leave when the ring is full. "
    "Is it there? Yes, it is there, and then it is not. 1 2 3 4 5 10 100 2024."
)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
GEMMA_TEMPLATE = (  # a system message is folded into the first user turn, as Gemma does
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}{% set prefix = messages[0]['content'] + '\\n\\n' %}"
    "{% set turns = messages[1:] %}{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
    "{% for message in turns %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
# Qwen3's turn format (ChatML): earlier assistant turns lose their <think> block, and
# enable_thinking=False (a chat_template_kwargs) opens the answer with an empty one
QWEN3_TEMPLATE = (
    "{% for message in messages %}"
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{% endif %}"
)
PHI3_TEMPLATE = (  # Phi-3.5-mini-instruct's
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)
MISTRAL_TEMPLATE = (  # Mistral-7B-Instruct's [INST] turns; a system message joins the first one
    "{{ bos_token }}"
    "{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = message['content'] + '\\n\\n' %}"
    "{% elif message['role'] == 'user' %}{{ '[INST] ' + ns.system + message['content'] + ' [/INST]' }}"
    "{% set ns.system = '' %}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)
WHITESPACE_RUNS = ["\n", "\n\n", "\n\n\n", "  ", "   ", "\t\t"]
# llama.cpp's token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6


# --- tokenizers -----------------------------------------------------------------------------


def gpt2_byte_chars() -> list[tuple[int, str]]:
    """GPT-2's byte -> printable character map, in its vocabulary order: the bytes that are
    printable Latin-1 map to themselves, the rest to U+0100 onwards."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in keep]
    return [(b, chr(b)) for b in keep] + [(b, chr(0x100 + i)) for i, b in enumerate(shifted)]


def train_merges(words: list[str], n_merges: int) -> list[tuple[str, str]]:
    """Plain BPE training: repeatedly merge the most frequent adjacent pair (ties: largest pair)."""
    seqs = [list(w) for w in words]
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        counts = Counter(pair for seq in seqs for pair in zip(seq, seq[1:]))
        if not counts:
            break
        best = max(counts, key=lambda pair: (counts[pair], pair))
        merges.append(best)
        for seq in seqs:
            i = 0
            while i < len(seq) - 1:
                if (seq[i], seq[i + 1]) == best:
                    seq[i : i + 2] = [seq[i] + seq[i + 1]]
                i += 1
    return merges


def bpe_vocab(family: str = "llama") -> dict:
    """GPT-2 byte-level BPE: control tokens, 256 byte tokens, merged tokens. llama: like
    SmolLM2's (pre 'smollm', ChatML); qwen2 / qwen3: like Qwen's (pre 'qwen2', ChatML, and
    for qwen3 the user-defined <think> tokens and a template that honours enable_thinking)."""
    to_char = dict(gpt2_byte_chars())
    pieces = re.findall(r"'s|'t| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+", CORPUS)
    words = ["".join(to_char[b] for b in p.encode("utf-8")) for p in pieces]
    merges = train_merges(words, N_MERGES)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [c for _, c in gpt2_byte_chars()]
    tokens += list(dict.fromkeys(a + b for a, b in merges if a + b not in tokens))
    types = [CONTROL] * 3 + [NORMAL] * (len(tokens) - 3)
    vocab = dict(model="gpt2", pre="smollm", tokens=tokens, types=types, scores=None,
                 merges=[f"{a} {b}" for a, b in merges], bos=1, eos=2, unk=0, pad=2,
                 add_bos=False, add_space_prefix=False, template=CHATML_TEMPLATE)
    if family in ("qwen2", "qwen3"):
        vocab.update(pre="qwen2", bos=0, pad=0)
    if family == "qwen3":
        tokens += ["<think>", "</think>"]
        types += [USER_DEFINED] * 2
        vocab["template"] = QWEN3_TEMPLATE
    return vocab


SPM_FAMILIES = {
    # specials (type), bos, eos, unk, pad, add_bos, add_space_prefix, whitespace runs, template
    "gemma3": dict(specials=[("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", UNKNOWN),
                             ("<start_of_turn>", CONTROL), ("<end_of_turn>", CONTROL)],
                   bos=2, eos=1, unk=3, pad=0, add_bos=True, add_space_prefix=False, runs=True,
                   template=GEMMA_TEMPLATE),
    # Llama 2's SentencePiece (Mistral, Phi-3): <unk> <s> </s>, a space prefix, no whitespace runs
    "mistral": dict(specials=[("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL)],
                    bos=1, eos=2, unk=0, pad=0, add_bos=True, add_space_prefix=True, runs=False,
                    template=MISTRAL_TEMPLATE),
    "phi3": dict(specials=[("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL), ("<|endoftext|>", CONTROL),
                           ("<|assistant|>", CONTROL), ("<|end|>", CONTROL), ("<|user|>", CONTROL),
                           ("<|system|>", CONTROL)],
                 bos=1, eos=3, unk=0, pad=3, add_bos=False, add_space_prefix=True, runs=False,
                 template=PHI3_TEMPLATE),
}


def spm_vocab(family: str = "gemma3") -> dict:
    """SentencePiece with byte fallback (SPM_FAMILIES: Gemma 3's, or Llama 2's as Mistral
    and Phi-3 have it): controls, <0xNN> bytes, user-defined whitespace runs (Gemma), then
    ▁-pieces scored so that earlier merges win."""
    spec = SPM_FAMILIES[family]
    tokens = [t for t, _ in spec["specials"]]
    types = [k for _, k in spec["specials"]]
    scores = [-1000.0] * len(tokens)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    scores += [0.0] * 256
    if spec["runs"]:  # Gemma 3's user-defined tokens are raw whitespace runs (matched before spaces become ▁)
        tokens += WHITESPACE_RUNS
        types += [USER_DEFINED] * len(WHITESPACE_RUNS)
        scores += [-1000.0] * len(WHITESPACE_RUNS)
    text = CORPUS.replace(" ", "▁")
    merges = train_merges(re.findall(r"▁?[^▁]+", text), N_MERGES)
    merged = list(dict.fromkeys(a + b for a, b in merges))
    chars = sorted(set(text))
    tokens += merged + chars
    types += [NORMAL] * (len(merged) + len(chars))
    scores += [-float(i) for i in range(len(merged))] + [-1000.0 - i for i in range(len(chars))]
    return dict(model="llama", pre="default", tokens=tokens, types=types, scores=scores, merges=None,
                **{k: spec[k] for k in ("bos", "eos", "unk", "pad", "add_bos", "add_space_prefix", "template")})


def vocab_for(arch: str) -> dict:
    """The tiny vocabulary of an architecture family (tiny_model.ARCH_DEFAULTS' names)."""
    return spm_vocab(arch) if arch in SPM_FAMILIES else bpe_vocab(arch)


def add_tokenizer(w: GGUFWriter, vocab: dict) -> None:
    w.add_tokenizer_model(vocab["model"])
    w.add_tokenizer_pre(vocab["pre"])
    w.add_token_list(vocab["tokens"])
    if vocab["scores"] is not None:
        w.add_token_scores(vocab["scores"])
    w.add_token_types(vocab["types"])
    if vocab["merges"] is not None:
        w.add_token_merges(vocab["merges"])
    w.add_bos_token_id(vocab["bos"])
    w.add_eos_token_id(vocab["eos"])
    w.add_unk_token_id(vocab["unk"])
    w.add_pad_token_id(vocab["pad"])
    w.add_add_bos_token(vocab["add_bos"])
    w.add_add_eos_token(False)
    w.add_bool("tokenizer.ggml.add_space_prefix", vocab["add_space_prefix"])
    w.add_chat_template(vocab["template"])
