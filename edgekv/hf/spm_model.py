"""Writing a SentencePiece `tokenizer.model` from a GGUF vocabulary.

What lives here: `spm_model_bytes`, the ModelProto protobuf (sentencepiece_model.proto: pieces
with score and type, a TrainerSpec naming the model type and special ids, a NormalizerSpec)
encoded by hand: eight field kinds do not justify a protobuf dependency. What does not: the
GGUF side (to_hf.py). sentencepiece itself loads the result in tests/test_convert.py.
"""

from __future__ import annotations

import struct

# sentencepiece_model.proto field numbers
_PIECES, _TRAINER, _NORMALIZER = 1, 2, 3
_PIECE, _SCORE, _TYPE = 1, 2, 3
_MODEL_TYPE, _VOCAB_SIZE, _BYTE_FALLBACK = 3, 4, 35
_UNK_ID, _BOS_ID, _EOS_ID, _PAD_ID = 40, 41, 42, 43
_NAME, _ADD_DUMMY_PREFIX, _REMOVE_EXTRA_WS, _ESCAPE_WS = 1, 3, 4, 5
BPE = 2


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int32 values are sign-extended to ten bytes
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _int(field: int, n: int) -> bytes:
    return _varint(field << 3) + _varint(n)


def _bytes(field: int, b: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(b)) + b


def _float(field: int, x: float) -> bytes:
    return _varint(field << 3 | 5) + struct.pack("<f", x)


def spm_model_bytes(pieces: list[tuple[bytes, float, int]], *, bos: int = -1, eos: int = -1, unk: int = 0,
                    pad: int = -1, add_dummy_prefix: bool = True, byte_fallback: bool = True) -> bytes:
    """pieces: (text, score, type) with sentencepiece's type numbers, which GGUF shares."""
    out = bytearray()
    for text, score, kind in pieces:
        out += _bytes(_PIECES, _bytes(_PIECE, text) + _float(_SCORE, score) + _int(_TYPE, kind))
    trainer = (_int(_MODEL_TYPE, BPE) + _int(_VOCAB_SIZE, len(pieces)) + _int(_BYTE_FALLBACK, byte_fallback)
               + _int(_UNK_ID, unk) + _int(_BOS_ID, bos) + _int(_EOS_ID, eos) + _int(_PAD_ID, pad))
    normalizer = (_bytes(_NAME, b"identity") + _int(_ADD_DUMMY_PREFIX, add_dummy_prefix)
                  + _int(_REMOVE_EXTRA_WS, False) + _int(_ESCAPE_WS, True))
    out += _bytes(_TRAINER, trainer) + _bytes(_NORMALIZER, normalizer)
    return bytes(out)
