"""A tokenizer vocabulary read from GGUF metadata, with llama.cpp's special-token rules.

What lives here: tokens, scores and per-token attributes (from `tokenizer.ggml.token_type`),
the special ids (BOS, EOS, EOT, FIM ...) with llama.cpp's defaults and text-based
auto-detection, the end-of-generation set, the add_bos/add_eos/add_space_prefix flags,
and each token's piece (its bytes when detokenized). What does not: turning text into
ids (tokenizer.py, bpe.py, spm.py).

Everything here follows `llama_vocab::impl::load` in llama.cpp's `src/llama-vocab.cpp`.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import TokenizerError, UnsupportedModelError
from .bpe import PreTokenizer, byte_decode, pre_tokenizer_for

log = logging.getLogger("edgekv")

# llama_token_attr bits.
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_LSTRIP = 1 << 7  # whitespace before the token is dropped when it is cut out of a text
ATTR_RSTRIP = 1 << 8  # ... and after it

# GGUF token_type (llama_token_type) -> attribute; anything else is UNDEFINED (0).
_TYPE_TO_ATTR = {1: ATTR_NORMAL, 2: ATTR_UNKNOWN, 3: ATTR_CONTROL, 4: ATTR_USER_DEFINED, 5: ATTR_UNUSED, 6: ATTR_BYTE}

# Texts llama.cpp recognises when the GGUF does not name the token by id (first match wins
# here; llama.cpp walks a hash map, so with several candidates its pick is arbitrary).
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              "<｜end▁of▁sentence｜>", "[e~[")
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss

KEY = "tokenizer.ggml."


def all_of(values: list, kinds: tuple[type, ...]) -> bool:
    """Whether every value is an instance of kinds (a bool never counts as a number): the
    check runs over the set of the values' types, at C speed for a 262k-token vocabulary."""
    return all(issubclass(t, kinds) and not issubclass(t, bool) for t in set(map(type, values)))


def _require(metadata: dict[str, Any], key: str) -> Any:
    if key not in metadata:
        raise TokenizerError(f"tokenizer metadata key {key!r} is missing from the GGUF")
    return metadata[key]


class Vocab:
    """Token texts, scores, attributes and special ids of one model."""

    def __init__(self, metadata: dict[str, Any]):
        self.model = str(_require(metadata, KEY + "model"))
        if self.model not in ("gpt2", "llama"):
            raise UnsupportedModelError(
                f"tokenizer.ggml.model={self.model!r} is not supported; supported: 'gpt2' (BPE), 'llama' (SPM)"
            )
        self.is_spm = self.model == "llama"
        self.pre: PreTokenizer | None = None if self.is_spm else pre_tokenizer_for(metadata.get(KEY + "pre"))
        if not self.is_spm and not metadata.get(KEY + "pre"):
            log.warning("tokenizer: %spre is missing; using llama.cpp's 'default' pre-tokenizer "
                        "(generation quality may suffer; reconvert the model)", KEY)
        self._load_tokens(metadata)
        self._load_flags(metadata)
        self._load_special_ids(metadata)
        self._detect_special_tokens()
        self.eog_ids = self._end_of_generation_ids()
        # llama.cpp's cache_special_tokens: longest text first (stable on ties here).
        specials = [i for i, a in enumerate(self.attrs) if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)]
        self.special_ids = sorted(specials, key=lambda i: -len(self.token_bytes(i)))
        self._set_strip_attrs(str(metadata.get("general.name", "")).lower())
        self._pieces: dict[int, bytes] = {}

    # -- loading -------------------------------------------------------------------

    def _load_tokens(self, metadata: dict[str, Any]) -> None:
        tokens = _require(metadata, KEY + "tokens")
        if not isinstance(tokens, list) or not all_of(tokens, (str,)):
            raise TokenizerError(f"{KEY}tokens must be an array of strings")
        tokens = list(tokens)
        if "" in tokens:
            tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        self.tokens = tokens
        self.n_vocab = len(tokens)
        self.token_to_id = dict(zip(tokens, range(self.n_vocab)))
        if len(self.token_to_id) != self.n_vocab:
            dup = next(t for i, t in enumerate(tokens) if self.token_to_id[t] != i)
            raise TokenizerError(f"duplicate token {dup!r} in tokenizer.ggml.tokens")
        scores = metadata.get(KEY + "scores")
        types = metadata.get(KEY + "token_type")
        for key, values, kind in ((KEY + "scores", scores, (int, float)), (KEY + "token_type", types, (int,))):
            if values is None:
                continue
            if not isinstance(values, list) or not all_of(values, kind):
                raise TokenizerError(f"{key} must be an array of numbers")
            if len(values) < self.n_vocab:
                raise TokenizerError(f"{key} has {len(values)} entries but the vocab has {self.n_vocab} tokens")
        n = self.n_vocab
        self.scores = [0.0] * n if scores is None else list(map(float, scores[:n]))
        self.attrs = [ATTR_NORMAL] * n if types is None else [_TYPE_TO_ATTR.get(int(t), 0) for t in types[:n]]

    def _load_flags(self, metadata: dict[str, Any]) -> None:
        if self.is_spm:
            self.add_space_prefix, self.add_bos, self.add_eos = True, True, False
        else:
            self.add_space_prefix, self.add_bos, self.add_eos = False, self.pre.add_bos, False
        self.add_space_prefix = bool(metadata.get(KEY + "add_space_prefix", self.add_space_prefix))
        self.add_bos = bool(metadata.get(KEY + "add_bos_token", self.add_bos))
        self.add_eos = bool(metadata.get(KEY + "add_eos_token", self.add_eos))

    def _load_special_ids(self, metadata: dict[str, Any]) -> None:
        bos, eos, unk = (1, 2, 0) if self.is_spm else (11, 11, None)
        defaults = {"bos": bos, "eos": eos, "unknown": unk}
        self.special: dict[str, int | None] = {}
        for name in ("bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask",
                     "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep"):
            value = defaults.get(name)
            if value is not None and value >= self.n_vocab:
                value = None
            given = metadata.get(f"{KEY}{name}_token_id")
            if given is not None and (isinstance(given, bool) or not isinstance(given, int)):
                raise TokenizerError(f"{KEY}{name}_token_id must be an integer, got {str(given)[:40]}")
            if given is not None:
                if 0 <= int(given) < self.n_vocab:
                    value = int(given)
                else:
                    log.warning("tokenizer: %s_token_id=%s is out of range (n_vocab %d), ignored",
                                name, given, self.n_vocab)
            self.special[name] = value
        if self.add_bos and self.special["bos"] is None:
            raise TokenizerError(f"{KEY}add_bos_token is true, but {KEY}bos_token_id is not set")
        if self.add_eos and self.special["eos"] is None:
            raise TokenizerError(f"{KEY}add_eos_token is true, but {KEY}eos_token_id is not set")

    def _detect_special_tokens(self) -> None:
        for name, texts in (("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS), ("fim_pad", _FIM_PAD_TEXTS),
                            ("fim_rep", _FIM_REP_TEXTS), ("fim_sep", _FIM_SEP_TEXTS)):
            if self.special[name] is None:
                found = next((self.token_to_id[t] for t in texts if t in self.token_to_id), None)
                if found is not None:
                    self.special[name] = found
                    self.attrs[found] |= ATTR_CONTROL
        for i, attr in enumerate(self.attrs):  # control tokens named "unused" are unused
            if attr & ATTR_CONTROL and not attr & ATTR_UNUSED and "unused" in self.tokens[i]:
                self.attrs[i] = attr | ATTR_UNUSED
        for text in _ALWAYS_RENDERED:
            if text in self.token_to_id:
                self.attrs[self.token_to_id[text]] = ATTR_USER_DEFINED

    def _end_of_generation_ids(self) -> frozenset[int]:
        eog = {self.special[k] for k in ("fim_pad", "fim_rep", "fim_sep") if self.special[k] is not None}
        for text in _EOG_TEXTS:
            token = self.token_to_id.get(text)
            if token is not None:
                eog.add(token)
                self.attrs[token] |= ATTR_CONTROL
        eog |= {self.special[k] for k in ("eos", "eot", "eom") if self.special[k] is not None}
        texts = {self.tokens[i]: i for i in eog}
        # o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
        has_call = "<|call|>" in texts or "<|calls|>" in texts
        if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
            eog.discard(texts["<|end|>"])
            self.attrs[texts["<|end|>"]] = ATTR_USER_DEFINED
        if "<|tool_response>" in texts and "</s>" in texts:  # gemma4 / paddleocr
            eog.discard(texts["</s>"])
            self.attrs[texts["</s>"]] = ATTR_NORMAL
        return frozenset(eog)

    def _set_strip_attrs(self, model_name: str) -> None:
        """llama.cpp's attributes by model name (llama_vocab::impl::load): Phi-3's special
        tokens swallow the whitespace after them (its tokenizer.json says rstrip), except
        <unk>, <s> and <|endoftext|>; </s> does too."""
        if "phi-3" not in model_name and "phi3" not in model_name:
            return
        for token in self.special_ids:
            self.attrs[token] |= ATTR_RSTRIP
        for text, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
            if text in self.token_to_id:
                token = self.token_to_id[text]
                self.attrs[token] = self.attrs[token] | ATTR_RSTRIP if on else self.attrs[token] & ~ATTR_RSTRIP

    # -- per-token views -------------------------------------------------------------

    def check_id(self, token: int) -> int:
        if not isinstance(token, int) or isinstance(token, bool):
            try:
                token = int(token)  # numpy integers
            except (TypeError, ValueError):
                raise TokenizerError(f"token id {token!r} is not an integer") from None
        if not 0 <= token < self.n_vocab:
            raise TokenizerError(f"token id {token} is out of range: the vocab has n_vocab={self.n_vocab} tokens")
        return token

    def token_bytes(self, token: int) -> bytes:
        return self.tokens[token].encode("utf-8", "surrogatepass")

    def is_special(self, token: int) -> bool:
        """Control or unknown: the tokens llama.cpp renders only when asked for special text."""
        return bool(self.attrs[token] & (ATTR_CONTROL | ATTR_UNKNOWN))

    def piece(self, token: int) -> bytes:
        """llama.cpp's token_to_piece(special=True): the bytes this token stands for."""
        cached = self._pieces.get(token)
        if cached is None:
            cached = self._pieces[token] = self._make_piece(token)
        return cached

    def _make_piece(self, token: int) -> bytes:
        attr, text = self.attrs[token], self.tokens[token]
        if attr & (ATTR_CONTROL | ATTR_UNKNOWN | ATTR_USER_DEFINED):
            return text.encode("utf-8", "surrogatepass")
        if attr & ATTR_NORMAL:
            if self.is_spm:
                return text.replace("\u2581", " ").encode("utf-8", "surrogatepass")
            return byte_decode(text)
        if attr & ATTR_BYTE:
            return bytes([int(text[3:5], 16)])
        return b""  # unused / undefined tokens render as nothing
