"""A Hugging Face tokenizer as GGUF vocabulary keys, the way llama.cpp's converter writes them.

What lives here: `BpeVocab` (tokenizer.json, read with the `tokenizers` library that
transformers itself uses: tokens, token types, the pre-tokenizer name) and `spm_vocab`
(tokenizer.model, read with sentencepiece: tokens, scores, types, overridden by
added_tokens.json and tokenizer_config.json's added_tokens_decoder). Special token ids,
add_bos/add_eos, merges and the chat template come from gguf's `SpecialVocab`, the code
llama.cpp's converter runs. What does not: which family uses which (convert.py).

The pre-tokenizer: llama.cpp names it by the sha256 of the ids of a check text
(edgekv/data/bpe_pre_hashes.json, extracted by tools/make_pre_hashes.py). A tokenizer that
is not in that table (a new vocabulary over a known pre-tokenizer) is named by the structure
of its `pre_tokenizer` JSON instead, matched against the regex lists edgekv's own BPE
tokenizer runs (text/bpe.py), and `--pre NAME` overrides both.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from functools import cache
from importlib import resources

import regex

from ..errors import ConvertError
from .json_files import json_file
from ..text.bpe import _GPT2, PRE_TOKENIZERS

log = logging.getLogger("edgekv")
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # GGUF = sentencepiece token types
_LOOKS_SPECIAL = ("<pad>", "<mask>", "<2mass>", "[@BOS@]")


def looks_special(text: str) -> bool:
    """llama.cpp's does_token_look_special: added tokens some models forget to mark special."""
    return (text in _LOOKS_SPECIAL or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>"))
            or (text.startswith("<unused") and text.endswith(">")))


@cache
def pre_hash_table() -> dict:
    with resources.files("edgekv").joinpath("data/bpe_pre_hashes.json").open(encoding="utf-8") as f:
        return json.load(f)


def _split_regex(p: dict) -> str | None:
    pattern = p.get("pattern") or {}
    return pattern.get("Regex") or (None if "String" not in pattern else regex.escape(pattern["String"]))


def pre_regexes(pre_tokenizer: dict | None) -> tuple[str, ...] | None:
    """The regex list a tokenizer.json pre_tokenizer runs, in edgekv's (llama.cpp's) terms;
    None when it holds a step that is not a regex split (then only the hash can name it)."""
    if not pre_tokenizer:
        return ()
    steps = pre_tokenizer.get("pretokenizers") if pre_tokenizer.get("type") == "Sequence" else [pre_tokenizer]
    out: list[str] = []
    for p in steps:
        kind = p.get("type")
        if kind == "Digits":
            out.append(r"\p{N}" if p.get("individual_digits") else r"\p{N}+")
        elif kind == "ByteLevel":
            if p.get("use_regex", True):
                out.append(_GPT2)
        elif kind == "Split" and p.get("behavior") == "Isolated" and not p.get("invert"):
            regex = _split_regex(p)
            if regex is None:
                return None
            out.append(regex)
        else:
            return None
    return tuple(out)


def pre_by_structure(pre_tokenizer: dict | None) -> str | None:
    regexes = pre_regexes(pre_tokenizer)
    if regexes is None:
        return None
    for name, pre in PRE_TOKENIZERS.items():
        if pre.patterns == regexes and pre.name == name:
            return name
    return None


@dataclass
class BpeVocab:
    tokens: list[str]
    types: list[int]
    pre: str


def bpe_vocab(directory: str, vocab_size: int | None, pre_override: str | None = None) -> BpeVocab:
    """llama.cpp's get_vocab_base + get_vocab_base_pre, from tokenizer.json."""
    from tokenizers import Tokenizer

    path = os.path.join(directory, "tokenizer.json")
    if not os.path.isfile(path):
        raise ConvertError(f"{directory}: no tokenizer.json or tokenizer.model; copy the tokenizer files of the "
                           f"checkpoint into the directory")
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # the Rust library raises its own exception type
        raise ConvertError(f"{path}: the tokenizers library cannot read it ({e})") from None
    vocab = tok.get_vocab(with_added_tokens=True)
    size = vocab_size or len(vocab)
    if max(vocab.values()) >= size:
        raise ConvertError(f"{path}: token id {max(vocab.values())} >= config.json's vocab_size {size}")
    added = tok.get_added_tokens_decoder()
    reverse = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        text = reverse[i]
        if i in added:
            if not added[i].normalized:
                text = tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False)
            if added[i].special or looks_special(text):
                types.append(CONTROL)
            else:
                text = text.replace("\u2581", " ")
                types.append(USER_DEFINED)
        else:
            types.append(NORMAL)
        tokens.append(text)
    pre_json = json_file(directory, "tokenizer.json").get("pre_tokenizer")
    return BpeVocab(tokens, types, _pre_name(tok, pre_json, pre_override, path))


def _pre_name(tok, pre_json: dict | None, override: str | None, path: str) -> str:
    table = pre_hash_table()
    ids = tok.encode(table["chktxt"]).ids
    by_hash = table["hashes"].get(hashlib.sha256(str(ids).encode()).hexdigest())
    by_structure = pre_by_structure(pre_json)
    if override:
        if by_hash and by_hash != override:
            log.warning("--pre %s overrides %r, the name llama.cpp's hash table gives this tokenizer", override, by_hash)
        return override
    if by_hash:
        if by_structure and PRE_TOKENIZERS.get(by_hash) != PRE_TOKENIZERS[by_structure]:
            log.warning("%s: llama.cpp's hash table says pre-tokenizer %r, its pre_tokenizer JSON reads as %r; "
                        "using %r as llama.cpp does", path, by_hash, by_structure, by_hash)
        return by_hash
    if by_structure:
        log.warning("%s: this vocabulary is not in llama.cpp's hash table; its pre_tokenizer is %r's "
                    "(same regexes), so the file says %r", path, by_structure, by_structure)
        return by_structure
    raise ConvertError(
        f"{path}: the BPE pre-tokenizer is neither in llama.cpp's hash table nor one edgekv recognises from its "
        f"pre_tokenizer JSON ({json.dumps(pre_json)[:200]}). If you know which it is, pass --pre NAME "
        f"(edgekv runs: {', '.join(sorted(PRE_TOKENIZERS))}); a wrong name tokenizes text differently")


def _load_spm(directory: str):
    from sentencepiece import SentencePieceProcessor

    path = os.path.join(directory, "tokenizer.model")
    sp = SentencePieceProcessor()
    try:
        sp.LoadFromFile(path)
    except (OSError, RuntimeError) as e:
        raise ConvertError(f"{path}: sentencepiece cannot load it ({e}); the file is corrupt") from None
    return sp


def spm_size(directory: str) -> int:
    return _load_spm(directory).vocab_size()


def spm_vocab(directory: str, vocab_size: int | None) -> tuple[list[bytes], list[float], list[int]]:
    """llama.cpp's _create_vocab_sentencepiece."""
    sp = _load_spm(directory)
    n = sp.vocab_size()
    size = vocab_size or n
    tokens = [f"[PAD{i}]".encode() for i in range(size)]
    scores, types = [-10000.0] * size, [UNUSED] * size
    for i in range(min(n, size)):
        tokens[i], scores[i] = sp.IdToPiece(i).encode("utf-8"), sp.GetScore(i)
        types[i] = (UNKNOWN if sp.IsUnknown(i) else CONTROL if sp.IsControl(i) else UNUSED if sp.IsUnused(i)
                    else BYTE if sp.IsByte(i) else NORMAL)
    for token_id, text in _added_tokens_json(directory):
        if token_id < size:
            tokens[token_id], scores[token_id], types[token_id] = text.encode(), -1000.0, USER_DEFINED
    for token_id, data in _added_tokens_decoder(directory):
        if token_id >= size:
            continue
        text = data["content"]
        if data.get("special") or looks_special(text):
            types[token_id] = CONTROL
        else:
            text, types[token_id] = text.replace("\u2581", " "), USER_DEFINED
        scores[token_id], tokens[token_id] = -1000.0, text.encode("utf-8")
    return tokens, scores, types


def _added_tokens_json(directory: str):
    return ((int(i), t) for t, i in json_file(directory, "added_tokens.json").items())


def _added_tokens_decoder(directory: str):
    return ((int(i), d) for i, d in json_file(directory, "tokenizer_config.json").get("added_tokens_decoder", {}).items())
