"""Tokenizers built from GGUF metadata, matching llama.cpp id for id; a streaming detokenizer.

What lives here: `Tokenizer` (the entry point: `Tokenizer.from_gguf(metadata)`), the
special-token partition that runs before either algorithm (llama.cpp's
tokenizer_st_partition), BOS/EOS placement, decoding, and `StreamingDetokenizer`.
What does not: the vocabulary and its special-token rules (vocab.py), byte-level
BPE (bpe.py), SentencePiece merges (spm.py), chat templates
(chat_format.py).

Partition: every control, user-defined and unknown token is cut out of the raw text,
longest token text first, before the text pieces between them are tokenized. User-defined
tokens (GGUF token type 4) are always cut out, so Gemma's `"\\n\\n"` or three-space tokens
win over the SPM merges; control tokens only when `special=True`.
"""

from __future__ import annotations

import codecs
from typing import Any, Iterable, Union

from ..errors import TokenizerError
from .bpe import BPEModel
from .spm import SPACE_ESCAPE, SPMModel
from .vocab import ATTR_CONTROL, ATTR_LSTRIP, ATTR_RSTRIP, ATTR_UNKNOWN, Vocab, all_of

C_SPACE = b" \t\n\v\f\r"  # what C's isspace() accepts in the "C" locale: llama.cpp's strip

# A partitioned text: a special token id, or a (start, end) byte range of raw text.
Fragment = Union[int, tuple[int, int]]


class Tokenizer:
    """Text <-> token ids for one GGUF model (SPM or GPT-2-style BPE)."""

    def __init__(self, vocab: Vocab, merges: list[str] | None = None):
        self.vocab = vocab
        if vocab.is_spm:
            self._spm = SPMModel(vocab.token_to_id, vocab.scores)
            self._bpe = None
        else:
            if merges is None:
                raise TokenizerError("tokenizer metadata key 'tokenizer.ggml.merges' is missing from the GGUF")
            if not isinstance(merges, list) or not all_of(merges, (str,)):
                raise TokenizerError("tokenizer.ggml.merges must be an array of strings")
            self._spm = None
            self._bpe = BPEModel(vocab.token_to_id, merges, vocab.pre)

    @classmethod
    def from_gguf(cls, metadata: dict[str, Any]) -> "Tokenizer":
        """Build from `GGUFFile(path).metadata` (the `tokenizer.ggml.*` keys)."""
        return cls(Vocab(metadata), metadata.get("tokenizer.ggml.merges"))

    # -- properties ------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    @property
    def bos_id(self) -> int | None:
        return self.vocab.special["bos"]

    @property
    def eos_id(self) -> int | None:
        return self.vocab.special["eos"]

    @property
    def eot_id(self) -> int | None:
        return self.vocab.special["eot"]

    @property
    def add_bos(self) -> bool:
        return self.vocab.add_bos

    @property
    def add_eos(self) -> bool:
        return self.vocab.add_eos

    @property
    def eog_ids(self) -> frozenset[int]:
        return self.vocab.eog_ids

    def is_eog(self, token: int) -> bool:
        """End of generation: EOS, EOT and the turn/text end tokens llama.cpp stops on."""
        return self.vocab.check_id(token) in self.vocab.eog_ids

    def token_id(self, text: str) -> int | None:
        """The id of the token whose text is exactly `text`, if any."""
        return self.vocab.token_to_id.get(text)

    # -- encoding --------------------------------------------------------------------

    def encode(self, text: str | bytes, add_bos: bool | None = None, special: bool = False,
               add_eos: bool | None = None) -> list[int]:
        """Text -> ids, like llama_tokenize.

        add_bos/add_eos: None = the model's default (`tokenizer.ggml.add_bos_token`), True/False
        force it. special=True parses control tokens written in the text (parse_special).
        """
        raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
        add_bos = self.vocab.add_bos if add_bos is None else add_bos
        add_eos = self.vocab.add_eos if add_eos is None else add_eos
        ids: list[int] = []
        if add_bos:
            ids.append(self._required_special("bos"))
        fragments = self._partition(raw, special) if raw else []
        if self._spm is not None:
            self._encode_spm(raw, fragments, ids)
        else:
            for fragment in fragments:
                if isinstance(fragment, int):
                    ids.append(fragment)
                else:
                    ids.extend(self._bpe.encode(decode_utf8_like_llama(raw[fragment[0] : fragment[1]])))
        if add_eos:
            ids.append(self._required_special("eos"))
        return ids

    def _required_special(self, name: str) -> int:
        token = self.vocab.special[name]
        if token is None:
            raise TokenizerError(f"the model has no {name} token (tokenizer.ggml.{name}_token_id)")
        return token

    def _encode_spm(self, raw: bytes, fragments: list[Fragment], ids: list[int]) -> None:
        prev_special = True  # llama.cpp prefixes the first fragment too
        for fragment in fragments:
            if isinstance(fragment, int):
                ids.append(fragment)
                prev_special = True
                continue
            piece = raw[fragment[0] : fragment[1]]
            if self.vocab.add_space_prefix and prev_special:
                piece = b" " + piece
            ids.extend(self._spm.encode(piece.replace(b" ", SPACE_ESCAPE)))
            prev_special = False

    def _partition(self, raw: bytes, parse_special: bool) -> list[Fragment]:
        """llama.cpp's tokenizer_st_partition: cut special tokens out of the raw text."""
        fragments: list[Fragment] = [(0, len(raw))]
        vocab = self.vocab
        for token in vocab.special_ids:
            if not parse_special and vocab.attrs[token] & (ATTR_CONTROL | ATTR_UNKNOWN):
                continue
            needle = vocab.token_bytes(token)
            if needle not in raw:  # cheap filter: fragments are pieces of raw
                continue
            fragments = _split_on(raw, fragments, needle, token, vocab.attrs[token])
        return fragments

    # -- decoding --------------------------------------------------------------------

    def token_to_piece(self, token: int) -> bytes:
        """The bytes one token stands for (special tokens as their text)."""
        return self.vocab.piece(self.vocab.check_id(token))

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        """Ids -> bytes: the pieces joined; skip_special drops control/unknown tokens' text.

        When the model adds a space prefix (SPM with add_space_prefix), the one space it
        put before the first word is removed again, so decode(encode(x)) == x.
        """
        vocab = self.vocab
        out = bytearray()
        strip_space = vocab.add_space_prefix
        for position, token in enumerate(ids):
            token = vocab.check_id(token)
            if position == 0 and token == vocab.special["bos"]:
                if not skip_special:
                    out += vocab.piece(token)
                continue
            if skip_special and vocab.is_special(token):
                continue
            piece = vocab.piece(token)
            if strip_space and not vocab.is_special(token):
                if piece.startswith(b" "):
                    piece = piece[1:]
                strip_space = False
            out += piece
        return bytes(out)

    def detokenizer(self, skip_special: bool = False, keep: frozenset[int] = frozenset()) -> "StreamingDetokenizer":
        return StreamingDetokenizer(self, skip_special=skip_special, keep=keep)

    def ids_of(self, texts: Iterable[str]) -> frozenset[int]:
        """The ids of the tokens whose text is one of `texts` (a chat format's markers, which
        a model may write as single, often special, tokens)."""
        to_id = self.vocab.token_to_id
        return frozenset(to_id[t] for t in texts if t in to_id)


class StreamingDetokenizer:
    """Turns ids into text one at a time, never splitting a UTF-8 character.

    `push(id)` returns the characters completed by that token ("" while a character's
    bytes are still arriving, e.g. an emoji spread over byte-fallback tokens); `flush()`
    returns what is left (an unfinished character comes out as U+FFFD). skip_special: control
    tokens give no text, except those in `keep` (what llama-server's preserved tokens are: a
    tool call format's markers, such as Command R's <|START_ACTION|>).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False, keep: frozenset[int] = frozenset()):
        self.tokenizer = tokenizer
        self.skip_special, self.keep = skip_special, keep
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        vocab = self.tokenizer.vocab
        token = vocab.check_id(token)
        if self.skip_special and vocab.is_special(token) and token not in self.keep:
            return ""
        return self._decoder.decode(vocab.piece(token))

    def flush(self) -> str:
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text


def _split_on(raw: bytes, fragments: list[Fragment], needle: bytes, token: int, attr: int) -> list[Fragment]:
    """Replace each occurrence of `needle` in the text fragments by the token, left to right;
    a token with ATTR_LSTRIP / ATTR_RSTRIP takes the whitespace before / after it along."""
    out: list[Fragment] = []
    for fragment in fragments:
        if isinstance(fragment, int):
            out.append(fragment)
            continue
        start, end = fragment
        match = raw.find(needle, start, end)
        while match >= 0:
            left = match
            if attr & ATTR_LSTRIP:
                while left > start and raw[left - 1] in C_SPACE:
                    left -= 1
            if left > start:
                out.append((start, left))
            out.append(token)
            start = match + len(needle)
            if attr & ATTR_RSTRIP:
                while start < end and raw[start] in C_SPACE:
                    start += 1
            match = raw.find(needle, start, end)
        if start < end:
            out.append((start, end))
    return out


def decode_utf8_like_llama(data: bytes) -> str:
    """UTF-8 -> str as llama.cpp's unicode_cpts_from_utf8 reads it.

    Valid text decodes as usual. Otherwise each byte that does not start a complete
    sequence becomes U+FFFD on its own (Python's decoder would merge some of them), and
    overlong forms and surrogates are decoded rather than rejected, as llama.cpp does.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    out: list[str] = []
    i, n = 0, len(data)
    while i < n:
        b0 = data[i]
        if b0 < 0x80:
            out.append(chr(b0))
            i += 1
            continue
        if not b0 & 0x40:
            extra = -1
        elif not b0 & 0x20:
            extra, cpt = 1, b0 & 0x1F
        elif not b0 & 0x10:
            extra, cpt = 2, b0 & 0x0F
        elif not b0 & 0x08:
            extra, cpt = 3, b0 & 0x07
        else:
            extra = -1
        if extra < 0 or i + extra >= n or any(data[i + k] & 0xC0 != 0x80 for k in range(1, extra + 1)):
            out.append("\ufffd")
            i += 1
            continue
        for k in range(1, extra + 1):
            cpt = (cpt << 6) | (data[i + k] & 0x3F)
        out.append(chr(cpt) if cpt <= 0x10FFFF else "\ufffd")
        i += extra + 1
    return "".join(out)
