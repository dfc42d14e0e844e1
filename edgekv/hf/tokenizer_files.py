"""A GGUF vocabulary as Hugging Face tokenizer files.

What lives here: `tokenizer_files`, which returns the files `--to-hf` writes for the GGUF's
tokenizer: for a byte-level BPE vocabulary (`tokenizer.ggml.model` gpt2) a tokenizer.json
(vocab, merges, added tokens, the pre-tokenizer of `tokenizer.ggml.pre` as
transformers spells it); for a SentencePiece vocabulary (llama) a tokenizer.model
(spm_model.py); for both a tokenizer_config.json (special tokens, add_bos/add_eos, the chat
template, added_tokens_decoder) and special_tokens_map.json. What does not: reading them
back (vocab.py) and the model config (hf_config.py).

Token texts are GGUF's: llama.cpp's converter turned user-defined SentencePiece tokens'
"\u2581" into spaces, so they are turned back here, and `[PADn]` fillers are not tokens.
"""

from __future__ import annotations

import re

from ..errors import ConvertError
from ..gguf.reader import GGUFFile
from ..text.bpe import _GPT2, PRE_TOKENIZERS
from .hf_config import special_ids
from .json_files import json_bytes
from .spm_model import spm_model_bytes
from .vocab import CONTROL, UNUSED, USER_DEFINED

_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def pre_tokenizer_json(pre: str) -> dict:
    """tokenizer.json's pre_tokenizer for a `tokenizer.ggml.pre` name, in the form the models
    that define it ship (a Split per regex otherwise)."""
    if pre not in PRE_TOKENIZERS:
        raise ConvertError(f"tokenizer.ggml.pre {pre!r}: --to-hf writes {', '.join(sorted(PRE_TOKENIZERS))}")
    patterns = PRE_TOKENIZERS[pre].patterns
    if patterns == (_GPT2,):
        return dict(_BYTE_LEVEL)
    if patterns == (r"\p{N}", _GPT2):
        return {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                      dict(_BYTE_LEVEL)]}
    splits = [{"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": False} for p in patterns]
    return {"type": "Sequence", "pretokenizers": splits + [dict(_BYTE_LEVEL, use_regex=False)]}


def _added(i: int, text: str, kind: int) -> dict:
    return {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": kind != CONTROL, "special": kind == CONTROL}


def _is_filler(text: str, kind: int) -> bool:
    return kind == UNUSED and re.fullmatch(r"\[PAD\d+\]", text) is not None


def _texts(g: GGUFFile) -> tuple[list[str], list[int]]:
    tokens = [t if isinstance(t, str) else bytes(t).decode("utf-8", "replace") for t in g.require("tokenizer.ggml.tokens")]
    types = [int(t) for t in g.get("tokenizer.ggml.token_type", [1] * len(tokens))]
    return tokens, types


def bpe_tokenizer_json(g: GGUFFile, tokens: list[str], types: list[int]) -> dict:
    pre = g.get("tokenizer.ggml.pre") or "default"
    vocab, added = {}, []
    for i, (text, kind) in enumerate(zip(tokens, types)):
        if _is_filler(text, kind):
            continue
        if text in vocab:
            raise ConvertError(f"{g.path}: token {text!r} appears twice (ids {vocab[text]} and {i}); "
                               f"a tokenizer.json vocabulary cannot hold that")
        vocab[text] = i
        if kind in (CONTROL, USER_DEFINED):
            added.append(_added(i, text, kind))
    merges = [m.split(" ", 1) for m in g.get("tokenizer.ggml.merges", [])]
    ids = special_ids(g)
    if g.get("tokenizer.ggml.add_bos_token") and "bos" in ids:
        bos = tokens[ids["bos"]]
        post = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos: {"id": bos, "ids": [ids["bos"]], "tokens": [bos]}}}
    else:
        post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": pre_tokenizer_json(pre), "post_processor": post,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": PRE_TOKENIZERS[pre].ignore_merges, "vocab": vocab, "merges": merges}}


def _spm_text(text: str, kind: int) -> str:
    return text.replace(" ", "\u2581") if kind == USER_DEFINED else text


def spm_tokenizer_model(g: GGUFFile, tokens: list[str], types: list[int]) -> bytes:
    scores = g.get("tokenizer.ggml.scores", [0.0] * len(tokens))
    ids = special_ids(g)
    pieces = [(_spm_text(t, k).encode("utf-8"), float(s), k) for t, k, s in zip(tokens, types, scores)]
    return spm_model_bytes(pieces, bos=ids.get("bos", -1), eos=ids.get("eos", -1), unk=ids.get("unk", 0),
                           pad=ids.get("pad", -1), add_dummy_prefix=bool(g.get("tokenizer.ggml.add_space_prefix", True)))


def tokenizer_config(g: GGUFFile, tokens: list[str], types: list[int], spm: bool) -> dict:
    ids = special_ids(g)
    out: dict = {}
    for typ in ("bos", "eos", "unk", "sep", "pad", "cls", "mask"):
        if (flag := g.get(f"tokenizer.ggml.add_{typ}_token")) is not None:
            out[f"add_{typ}_token"] = bool(flag)
    for typ, i in ids.items():
        out[f"{typ}_token"] = tokens[i]
    if (space := g.get("tokenizer.ggml.add_space_prefix")) is not None:
        out["add_prefix_space"] = bool(space)
    if (template := g.get("tokenizer.chat_template")) is not None:
        out["chat_template"] = template
    out["model_max_length"] = int(g.get(f"{g.architecture}.context_length", 2048))
    out["clean_up_tokenization_spaces"] = False
    out["tokenizer_class"] = ("GemmaTokenizer" if g.architecture == "gemma3" else "LlamaTokenizer") if spm \
        else "PreTrainedTokenizerFast"
    out["added_tokens_decoder"] = {
        str(i): {k: v for k, v in _added(i, _spm_text(t, k) if spm else t, k).items() if k != "id"}
        for i, (t, k) in enumerate(zip(tokens, types)) if k in (CONTROL, USER_DEFINED)}
    return out


def tokenizer_files(g: GGUFFile) -> dict[str, bytes]:
    """File name -> contents."""
    model = g.get("tokenizer.ggml.model")
    tokens, types = _texts(g)
    files: dict[str, bytes] = {}
    if model == "gpt2":
        files["tokenizer.json"] = json_bytes(bpe_tokenizer_json(g, tokens, types))
    elif model == "llama":
        files["tokenizer.model"] = spm_tokenizer_model(g, tokens, types)
    else:
        raise ConvertError(f"{g.path}: tokenizer.ggml.model {model!r}: --to-hf writes gpt2 (BPE) and llama "
                           f"(SentencePiece) vocabularies")
    config = tokenizer_config(g, tokens, types, model == "llama")
    files["tokenizer_config.json"] = json_bytes(config)
    files["special_tokens_map.json"] = json_bytes({f"{t}_token": tokens[i] for t, i in special_ids(g).items()})
    return files

