"""GPT-2-style byte-level BPE, as llama.cpp's llm_tokenizer_bpe does it.

What lives here: the pre-tokenizer regex lists keyed by `tokenizer.ggml.pre` (copied
in meaning from llama.cpp's `llama-vocab.cpp`), the GPT-2 byte <-> unicode table, and
merging by rank inside one pre-tokenized word. What does not: the vocabulary, special
tokens and BOS/EOS handling (vocab.py, tokenizer.py).

llama.cpp runs each regex of a list over the fragments left by the previous one and
keeps the text between matches as fragments of its own; a regex never sees past the
end of its fragment (so `\\s+(?!\\S)` treats a fragment end as the end of the text).
Python's `regex` module has the same backtracking semantics and Unicode classes as
llama.cpp's custom splitters, so the patterns are used as they are.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import regex

from ..errors import UnsupportedModelError

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizer:
    """One llama.cpp pre-tokenizer type: its regex list and the vocab flags it implies."""

    name: str
    patterns: tuple[str, ...]
    ignore_merges: bool = False  # a word that is itself a token is emitted whole
    add_bos: bool = False  # default before `tokenizer.ggml.add_bos_token` overrides it


_DEFAULT = PreTokenizer("default", (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))
_GPT2_PRE = PreTokenizer("gpt-2", (_GPT2,))
_LLAMA3_PRE = PreTokenizer("llama3", (_LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2_PRE = PreTokenizer("qwen2", (_QWEN2,))
# smollm, starcoder, ...: every digit is its own word before the GPT-2 pattern runs.
_STARCODER_PRE = PreTokenizer("smollm", (r"\p{N}", _GPT2))

# `tokenizer.ggml.pre` value -> pre-tokenizer, with llama.cpp's aliases.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": _DEFAULT,
    "gpt-2": _GPT2_PRE, "gpt2": _GPT2_PRE, "phi-2": _GPT2_PRE, "mpt": _GPT2_PRE, "olmo": _GPT2_PRE,
    "llama3": _LLAMA3_PRE, "llama-v3": _LLAMA3_PRE, "llama-bpe": _LLAMA3_PRE,
    "falcon3": _LLAMA3_PRE, "pixtral": _LLAMA3_PRE,
    "dbrx": PreTokenizer("dbrx", (_LLAMA3,)), "smaug-bpe": PreTokenizer("smaug-bpe", (_LLAMA3,)),
    "qwen2": _QWEN2_PRE, "deepseek-r1-qwen": _QWEN2_PRE, "stablelm2": _QWEN2_PRE, "megrez": _QWEN2_PRE,
    "smollm": _STARCODER_PRE, "starcoder": _STARCODER_PRE, "refact": _STARCODER_PRE,
    "command-r": _STARCODER_PRE, "codeshell": _STARCODER_PRE, "exaone": _STARCODER_PRE,
    "minerva-7b": _STARCODER_PRE,
}


def pre_tokenizer_for(pre: str | None) -> PreTokenizer:
    """The pre-tokenizer for a `tokenizer.ggml.pre` value (missing -> llama.cpp's 'default')."""
    if not isinstance(pre, (str, type(None))):
        raise UnsupportedModelError(f"tokenizer.ggml.pre must be a string, got {type(pre).__name__}")
    if pre is None or pre == "":
        return _DEFAULT
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedModelError(
            f"BPE pre-tokenizer tokenizer.ggml.pre={pre!r} is not supported; "
            f"supported: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    return PRE_TOKENIZERS[pre]


def _bytes_to_unicode() -> list[str]:
    """GPT-2's table: byte b -> the printable character that stands for it in the vocab."""
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = [""] * 256
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_UNICODE: list[str] = _bytes_to_unicode()
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_UNICODE)}
# latin-1 decoding turns byte b into chr(b); this table then maps it to GPT-2's character.
_LATIN1_TO_GPT2 = {b: c for b, c in enumerate(BYTE_TO_UNICODE)}


def byte_encode(word: str) -> str:
    """A word's UTF-8 bytes spelled with GPT-2's byte characters (llama.cpp: unicode_byte_encoding_process)."""
    return word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_LATIN1_TO_GPT2)


def byte_decode(text: str) -> bytes:
    """Inverse of byte_encode for one token's text (llama.cpp: llama_decode_text)."""
    out = bytearray()
    for ch in text:
        b = UNICODE_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:  # llama.cpp's marker for a character outside the byte table
            utf8 = ch.encode("utf-8", "surrogatepass")
            out += b"[UNK_BYTE_0x" + utf8.hex().encode() + text.encode("utf-8", "surrogatepass") + b"]"
    return bytes(out)


def parse_merges(merges: list[str]) -> dict[str, int]:
    """`tokenizer.ggml.merges` -> {merge text: rank}; the first of duplicate merges wins.

    llama.cpp splits a merge at its first space after the first character into (left,
    right); a pair is looked up here as `left + " " + right`, which is that merge's text
    again. A word's symbols are byte-encoded (a space is 'Ġ'), so no left symbol holds a
    space and no pair can spell another merge. Keyed by the text, the table is built
    without splitting 150k merges at every load (0.14 -> 0.01 s for Qwen's)."""
    # from the last merge to the first, so the first of duplicates is what stays
    return dict(zip(reversed(merges), range(len(merges) - 1, -1, -1)))


class BPEModel:
    """Pre-tokenization + rank-ordered merges over a byte-level vocab."""

    _CACHE_LIMIT = 200_000

    def __init__(self, token_to_id: dict[str, int], merges: list[str], pre: PreTokenizer):
        self.token_to_id = token_to_id
        self.ranks = parse_merges(merges)
        self.pre = pre
        self._patterns = [regex.compile(p) for p in pre.patterns]
        self._cache: dict[str, tuple[int, ...]] = {}

    def split_words(self, text: str) -> list[str]:
        """llama.cpp's unicode_regex_split without the byte encoding."""
        pieces = [text]
        for pattern in self._patterns:
            out: list[str] = []
            for piece in pieces:
                last = 0
                for m in pattern.finditer(piece):
                    start, end = m.span()
                    if start > last:
                        out.append(piece[last:start])
                    if end > start:
                        out.append(piece[start:end])
                    last = end
                if last < len(piece):
                    out.append(piece[last:])
            pieces = out
        return pieces

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        cache = self._cache
        for word in self.split_words(text):
            encoded = byte_encode(word)
            word_ids = cache.get(encoded)
            if word_ids is None:
                word_ids = tuple(self._merge_word(encoded))
                if len(cache) >= self._CACHE_LIMIT:
                    cache.clear()
                cache[encoded] = word_ids
            ids.extend(word_ids)
        return ids

    def _merge_word(self, word: str) -> list[int]:
        """llm_tokenizer_bpe_session::tokenize for one word: lowest rank first, then leftmost."""
        if self.pre.ignore_merges and word in self.token_to_id:
            return [self.token_to_id[word]]
        texts = list(word)  # one symbol per character; "" once merged away
        nxt = list(range(1, len(texts))) + [-1]
        prv = list(range(-1, len(texts) - 1))
        heap: list[tuple[int, int, int, str]] = []
        ranks = self.ranks

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            rank = ranks.get(texts[left] + " " + texts[right])
            if rank is not None:
                heapq.heappush(heap, (rank, left, right, texts[left] + texts[right]))

        for i in range(len(texts) - 1):
            push(i, i + 1)
        while heap:
            _, left, right, merged = heapq.heappop(heap)
            if not texts[left] or not texts[right] or texts[left] + texts[right] != merged:
                continue  # outdated bigram
            texts[left], texts[right] = merged, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])
        return self._symbols_to_ids(texts, nxt)

    def _symbols_to_ids(self, texts: list[str], nxt: list[int]) -> list[int]:
        ids: list[int] = []
        i = 0 if texts else -1
        while i != -1:
            token = self.token_to_id.get(texts[i])
            if token is not None:
                ids.append(token)
            else:
                # llama.cpp looks each UTF-8 byte of the symbol up as a one-byte string;
                # only ASCII bytes can be such a string here, the rest are dropped.
                for b in texts[i].encode("utf-8"):
                    byte_token = self.token_to_id.get(chr(b)) if b < 0x80 else None
                    if byte_token is not None:
                        ids.append(byte_token)
            i = nxt[i]
        return ids
