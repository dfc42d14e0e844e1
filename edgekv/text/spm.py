"""SentencePiece-style tokenization, as llama.cpp's llm_tokenizer_spm does it.

What lives here: the bigram merge over one text fragment (highest score first, leftmost
on ties) and byte fallback to `<0xNN>` tokens. It works on UTF-8 bytes, as llama.cpp
does, so invalid UTF-8 falls back to byte tokens the same way. What does not: the
space prefix and `▁` escaping of a fragment and the special-token partition that
produces the fragments (tokenizer.py), the vocabulary (vocab.py).
"""

from __future__ import annotations

import heapq

from ..errors import TokenizerError

SPACE_ESCAPE = "\u2581".encode()  # '▁', what SentencePiece writes for a space

# llama.cpp's unicode_len_utf8: the sequence length announced by a lead byte's top nibble.
_UTF8_LEN = [1] * 12 + [2, 2, 3, 4]


class SPMModel:
    """Score-ordered bigram merges over a vocab, looked up by UTF-8 bytes."""

    def __init__(self, token_to_id: dict[str, int], scores: list[float]):
        # The vocabulary's own str -> id map serves the byte pieces: a token's UTF-8 bytes
        # (surrogatepass) decode back to exactly that token, and bytes that do not decode
        # are no token's. A bytes-keyed copy cost 28 MiB for gemma3's 262k tokens.
        self.token_to_id = token_to_id
        self.scores = scores
        self._byte_tokens: list[int | None] = [self._find_byte_token(b) for b in range(256)]

    def token_of(self, piece: bytes) -> int | None:
        """The id of the token whose UTF-8 bytes are `piece`, None if there is none."""
        try:
            return self.token_to_id.get(piece.decode("utf-8", "surrogatepass"))
        except UnicodeDecodeError:
            return None

    def _find_byte_token(self, b: int) -> int | None:
        token = self.token_to_id.get("<0x%02X>" % b)
        return token if token is not None else self.token_of(bytes([b]))

    def byte_token(self, b: int) -> int:
        token = self._byte_tokens[b]
        if token is None:
            raise TokenizerError(f"SPM vocab has no byte-fallback token <0x{b:02X}> for byte 0x{b:02X}")
        return token

    def encode(self, text: bytes) -> list[int]:
        """Tokenize one already-escaped fragment (spaces are '▁')."""
        if not text:
            return []
        starts: list[int] = []
        pos = 0
        while pos < len(text):
            starts.append(pos)
            pos += _UTF8_LEN[text[pos] >> 4]
        n = len(starts)
        sizes = [min(end, len(text)) - start for start, end in zip(starts, starts[1:] + [len(text)])]
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []
        rev_merge: dict[bytes, tuple[int, int]] = {}
        lookup, scores = self.token_of, self.scores

        def try_add_bigram(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            size = sizes[left] + sizes[right]
            piece = text[starts[left] : starts[left] + size]
            token = lookup(piece)
            if token is None:
                return
            heapq.heappush(heap, (-scores[token], left, right, size))
            rev_merge[piece] = (left, right)

        for i in range(1, n):
            try_add_bigram(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if sizes[left] == 0 or sizes[right] == 0 or sizes[left] + sizes[right] != size:
                continue  # one side was merged elsewhere since
            sizes[left], sizes[right] = size, 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            try_add_bigram(prv[left], left)
            try_add_bigram(left, nxt[left])

        output: list[int] = []
        i = 0
        while i != -1:
            self._resegment(text, starts, sizes, i, rev_merge, output)
            i = nxt[i]
        return output

    def _resegment(self, text: bytes, starts: list[int], sizes: list[int], i: int,
                   rev_merge: dict[bytes, tuple[int, int]], output: list[int]) -> None:
        piece = text[starts[i] : starts[i] + sizes[i]]
        token = self.token_of(piece)
        if token is not None:
            output.append(token)
            return
        split = rev_merge.get(piece)
        if split is None:
            output.extend(self.byte_token(b) for b in piece)
            return
        self._resegment(text, starts, sizes, split[0], rev_merge, output)
        self._resegment(text, starts, sizes, split[1], rev_merge, output)
