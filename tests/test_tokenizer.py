"""Tokenizers: tiny hand-built vocabs (no model needed), then the two real models against
llama.cpp's own token ids in tests/reference/llama_cpp_reference.json."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgekv.errors import TokenizerError, UnsupportedModelError
from edgekv.gguf.reader import GGUFFile
from edgekv.text.tokenizer import StreamingDetokenizer, Tokenizer, decode_utf8_like_llama
from edgekv.text.bpe import BYTE_TO_UNICODE, PRE_TOKENIZERS, BPEModel, byte_encode
from edgekv.text.vocab import ATTR_BYTE

REFERENCE_GPL3 = Path(__file__).resolve().parent / "reference" / "gpl3.txt"

# --- tiny vocabularies ---------------------------------------------------------------------

NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6


def tiny_bpe_metadata(pre: str = "smollm", **extra) -> dict:
    """Byte-level BPE: all 256 byte characters, a few merges, two special tokens."""
    tokens = ["<|end|>", "<|begin|>", "<sep>"] + BYTE_TO_UNICODE
    merges = ["a b", "b c", "Ġ a", "ab c", "Ġa b", "1 2"]
    tokens += [m.replace(" ", "") for m in merges]
    types = [CONTROL, CONTROL, USER_DEFINED] + [NORMAL] * (len(tokens) - 3)
    meta = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 0,
    }
    meta.update(extra)
    return meta


def tiny_spm_metadata(**extra) -> dict:
    """SentencePiece vocab: specials, 256 byte tokens, pieces with scores, a user-defined run of spaces."""
    tokens = ["<unk>", "<s>", "</s>", "<end_of_turn>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, CONTROL, CONTROL, CONTROL] + [BYTE] * 256
    scores = [0.0] * len(tokens)
    pieces = {"▁": -1.0, "a": -2.0, "b": -2.0, "c": -2.0, "ab": -3.0, "bc": -1.5, "▁a": -2.5, "▁ab": -1.0}
    for piece, score in pieces.items():
        tokens.append(piece)
        types.append(NORMAL)
        scores.append(score)
    tokens.append("  ")
    types.append(USER_DEFINED)
    scores.append(0.0)
    meta = {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_space_prefix": False,
    }
    meta.update(extra)
    return meta


def pieces(tok: Tokenizer, ids: list[int]) -> list[str]:
    return [tok.vocab.tokens[i] for i in ids]


def test_bpe_merges_lowest_rank_first():
    tok = Tokenizer.from_gguf(tiny_bpe_metadata())
    # "a b" (rank 0) beats "b c" (rank 1); then "ab c" joins the rest.
    assert pieces(tok, tok.encode("abc")) == ["abc"]
    assert pieces(tok, tok.encode("bca")) == ["bc", "a"]
    assert pieces(tok, tok.encode(" ab")) == ["Ġ", "ab"]  # "a b" (rank 0) before "Ġ a" (rank 2)
    assert tok.decode(tok.encode(" abc cab")) == b" abc cab"


def test_bpe_smollm_splits_every_digit():
    tok = Tokenizer.from_gguf(tiny_bpe_metadata("smollm"))
    assert pieces(tok, tok.encode("12")) == ["1", "2"]  # the "1 2" merge never sees both digits
    tok = Tokenizer.from_gguf(tiny_bpe_metadata("gpt-2"))
    assert pieces(tok, tok.encode("12")) == ["12"]


@pytest.mark.parametrize("pre, text, words", [
    ("smollm", "numbers 123 x", ["numbers", " ", "1", "2", "3", " x"]),
    ("gpt-2", "it's  a\t\tb  ", ["it", "'s", " ", " a", "\t", "\t", "b", "  "]),
    ("llama-bpe", "I'M 12345 ok!\n\n x", ["I", "'M", " ", "123", "45", " ok", "!\n\n", " x"]),
    ("qwen2", "ab 123\r\n  c", ["ab", " ", "1", "2", "3", "\r\n", " ", " c"]),
    ("default", "a+b=12345", ["a", "+", "b", "=", "123", "45"]),
])
def test_pre_tokenizer_regex_lists(pre, text, words):
    model = BPEModel({}, [], PRE_TOKENIZERS[pre])
    assert model.split_words(text) == words


def test_bpe_unknown_pre_tokenizer_lists_supported():
    with pytest.raises(UnsupportedModelError, match="smollm") as err:
        Tokenizer.from_gguf(tiny_bpe_metadata("no-such-pre"))
    assert "no-such-pre" in str(err.value) and "llama-bpe" in str(err.value)


def test_bpe_special_tokens():
    tok = Tokenizer.from_gguf(tiny_bpe_metadata())
    # control tokens only with special=True; user-defined ones always.
    assert tok.encode("<|begin|>a", special=True) == [1] + tok.encode("a")
    assert 1 not in tok.encode("<|begin|>a")
    assert tok.encode("a<sep>b") == tok.encode("a") + [2] + tok.encode("b")
    assert tok.decode([1, *tok.encode("ab")]) == b"<|begin|>ab"
    assert tok.decode([1, *tok.encode("ab")], skip_special=True) == b"ab"
    assert tok.is_eog(0) and not tok.is_eog(1)  # "<|end|>" is one of llama.cpp's EOG texts
    assert tok.add_bos is False and tok.encode("a", add_bos=True)[0] == 1


def test_bpe_byte_encoding_round_trips_every_byte():
    tok = Tokenizer.from_gguf(tiny_bpe_metadata())
    text = bytes(range(1, 256)).decode("latin-1")
    assert byte_encode(text) == "".join(BYTE_TO_UNICODE[b] for b in text.encode())
    assert tok.decode(tok.encode(text)) == text.encode()


def test_invalid_utf8_read_like_llama_cpp():
    # each byte that does not start a complete sequence is one U+FFFD
    assert decode_utf8_like_llama(b"a\xe4\xb8b\xff") == "a\ufffd\ufffdb\ufffd"
    assert decode_utf8_like_llama(b"\xc0\x80") == "\x00"  # overlong forms are decoded
    assert decode_utf8_like_llama("héllo".encode()) == "héllo"


def test_spm_merges_by_score_with_byte_fallback():
    tok = Tokenizer.from_gguf(tiny_spm_metadata())
    assert tok.add_bos is True and tok.bos_id == 1
    # "bc" (-1.5) outscores "ab" (-3.0): a + bc, not ab + c
    assert pieces(tok, tok.encode("abc", add_bos=False)) == ["a", "bc"]
    assert pieces(tok, tok.encode(" ab", add_bos=False)) == ["▁ab"]
    # 'é' is not in the vocab: its two UTF-8 bytes become byte tokens
    assert pieces(tok, tok.encode("é", add_bos=False)) == ["<0xC3>", "<0xA9>"]
    assert tok.decode(tok.encode("é a  b")) == b"<s>" + "é a  b".encode()
    assert tok.decode(tok.encode("é a  b"), skip_special=True) == "é a  b".encode()


def test_spm_partition_user_defined_and_control():
    tok = Tokenizer.from_gguf(tiny_spm_metadata())
    two_spaces = tok.token_id("  ")
    assert tok.encode("a  b", add_bos=False) == [tok.token_id("a"), two_spaces, tok.token_id("b")]
    assert tok.encode("<end_of_turn>", add_bos=False, special=True) == [3]
    assert 3 not in tok.encode("<end_of_turn>", add_bos=False)
    assert tok.is_eog(3) and tok.eot_id == 3 and tok.is_eog(2)


def test_spm_space_prefix_from_metadata():
    tok = Tokenizer.from_gguf(tiny_spm_metadata(**{"tokenizer.ggml.add_space_prefix": True}))
    assert pieces(tok, tok.encode("ab", add_bos=False)) == ["▁ab"]
    assert tok.decode(tok.encode("ab")) == b"<s>ab"
    assert tok.decode(tok.encode("ab"), skip_special=True) == b"ab"


def test_spm_invalid_utf8_falls_back_to_bytes():
    tok = Tokenizer.from_gguf(tiny_spm_metadata())
    ids = tok.encode(b"a\xe4\xb8", add_bos=False)
    assert pieces(tok, ids) == ["a", "<0xE4>", "<0xB8>"]
    assert tok.decode(ids) == b"a\xe4\xb8"


def test_streaming_detokenizer_waits_for_whole_characters():
    tok = Tokenizer.from_gguf(tiny_spm_metadata())
    ids = tok.encode("a🦩", add_bos=False)  # 'a' + four byte tokens
    stream = StreamingDetokenizer(tok)
    out = [stream.push(i) for i in ids]
    assert out == ["a", "", "", "", "🦩"]
    assert stream.flush() == ""
    stream.push(ids[1])
    assert stream.flush() == "\ufffd"  # an unfinished character is not silently dropped


def test_bad_ids_and_missing_metadata():
    tok = Tokenizer.from_gguf(tiny_spm_metadata())
    n = tok.n_vocab
    for call in (lambda: tok.decode([1, n]), lambda: tok.token_to_piece(-1), lambda: tok.is_eog(n + 5),
                 lambda: StreamingDetokenizer(tok).push(n)):
        with pytest.raises(TokenizerError, match=f"n_vocab={n}"):
            call()
    with pytest.raises(TokenizerError, match="tokenizer.ggml.model"):
        Tokenizer.from_gguf({})
    meta = tiny_spm_metadata()
    del meta["tokenizer.ggml.tokens"]
    with pytest.raises(TokenizerError, match="tokenizer.ggml.tokens"):
        Tokenizer.from_gguf(meta)
    meta = tiny_bpe_metadata()
    del meta["tokenizer.ggml.merges"]
    with pytest.raises(TokenizerError, match="tokenizer.ggml.merges"):
        Tokenizer.from_gguf(meta)
    with pytest.raises(UnsupportedModelError, match="'gpt2'"):
        Tokenizer.from_gguf({**tiny_spm_metadata(), "tokenizer.ggml.model": "bert"})


# --- the real models against llama.cpp -----------------------------------------------------

REFERENCE_KEYS = {"smollm2": "smollm2-135m-instruct-q4_1", "gemma3": "gemma3-270m-q4_k_m"}


@pytest.fixture(scope="module")
def real_tokenizers(smollm2_path, gemma3_path) -> dict[str, Tokenizer]:
    return {
        "smollm2": Tokenizer.from_gguf(GGUFFile(smollm2_path).metadata),
        "gemma3": Tokenizer.from_gguf(GGUFFile(gemma3_path).metadata),
    }


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_reference_token_ids(real_tokenizers, reference, model):
    tok, ref = real_tokenizers[model], reference["models"][REFERENCE_KEYS[model]]
    assert len(ref["tokenize"]) >= 10
    for case in ref["tokenize"]:
        text = case["text"]
        assert tok.encode(text, add_bos=False, special=False) == case["ids_no_special"], text
        assert tok.encode(text, add_bos=False, special=True) == case["ids_parse_special"], text


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_reference_add_bos(real_tokenizers, reference, model):
    tok, ref = real_tokenizers[model], reference["models"][REFERENCE_KEYS[model]]
    assert tok.add_bos is ref["add_bos"]
    for case in ref["greedy"]:
        assert tok.encode(case["prompt"]) == case["prompt_ids"], case["prompt"]
        assert (case["prompt_ids"][0] == tok.bos_id) is ref["add_bos"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_round_trips(real_tokenizers, reference, model):
    tok, ref = real_tokenizers[model], reference["models"][REFERENCE_KEYS[model]]
    texts = [case["text"] for case in ref["tokenize"]] + [REFERENCE_GPL3.read_text()]
    for text in texts:
        assert tok.decode(tok.encode(text, add_bos=False)) == text.encode(), text[:40]
        assert tok.decode(tok.encode(text), skip_special=True) == text.encode(), text[:40]


@pytest.mark.slow
def test_real_end_of_generation_tokens(real_tokenizers):
    smol, gemma = real_tokenizers["smollm2"], real_tokenizers["gemma3"]
    assert smol.eos_id == 2 and smol.eot_id == 2  # <|im_end|>
    assert smol.is_eog(smol.token_id("<|endoftext|>")) and not smol.is_eog(smol.token_id("<|im_start|>"))
    assert gemma.eos_id == 1 and gemma.eot_id == gemma.token_id("<end_of_turn>") == 106
    assert gemma.is_eog(1) and gemma.is_eog(106) and not gemma.is_eog(gemma.bos_id)
    assert not smol.is_eog(smol.encode("Hello")[0])


@pytest.mark.slow
@pytest.mark.parametrize("model, text", [("smollm2", "emoji 👍🏽 and ✨ sparkle"), ("gemma3", "flamingo 🦩 ꙮ!")])
def test_real_streaming_never_splits_characters(real_tokenizers, model, text):
    tok = real_tokenizers[model]
    ids = tok.encode(text, add_bos=False)
    stream = tok.detokenizer()
    chunks = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(chunks) == text
    assert "" in chunks[:-1]  # some token ended mid-character and was held back
    assert all("\ufffd" not in c for c in chunks)
    if model == "gemma3":
        assert any(tok.vocab.attrs[i] & ATTR_BYTE for i in ids)  # the emoji went through byte fallback


def _random_text(rng, n: int) -> str:
    """Text from every script a user might paste: ASCII, Latin-1, CJK, emoji with modifiers
    and joiners, combining marks, RTL, whitespace runs, control characters, special-token
    look-alikes."""
    pools = ["abc XYZ 0123456789 .,;:!?'\"-_()[]{}<>/\\|@#$%^&*+=~`", "àéîõüßÆØÅñç", "大模型推理的核心显存字节",
             "👍🏽✨🦩👨‍👩‍👧‍👦🏳️‍🌈", "e\u0301a\u0308n\u0303", "שלום مرحبا", " \t\n\r\u00a0\u2003\u200b",
             "\x00\x01\x1b\x7f", "<|im_start|><end_of_turn><bos>"]
    out = []
    for _ in range(n):
        pool = pools[int(rng.integers(len(pools)))]
        out.append(pool[int(rng.integers(len(pool)))])
    return "".join(out)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_random_unicode_and_invalid_utf8(real_tokenizers, model):
    """300 random texts round-trip exactly and stream without a broken character; 300 random
    byte strings (mostly invalid UTF-8) tokenize without error, and every id decodes."""
    tok, rng = real_tokenizers[model], np.random.default_rng(16)
    for _ in range(300):
        text = _random_text(rng, int(rng.integers(1, 60)))
        ids = tok.encode(text, add_bos=False)
        assert tok.decode(ids) == text.encode("utf-8"), repr(text)
        stream = tok.detokenizer()
        chunks = [stream.push(i) for i in ids] + [stream.flush()]
        assert "".join(chunks) == text and all("\ufffd" not in c for c in chunks), repr(text)
    for _ in range(300):
        raw = bytes(rng.integers(0, 256, int(rng.integers(1, 40)), dtype=np.uint8))
        ids = tok.encode(raw, add_bos=False)
        assert ids and all(0 <= i < tok.vocab.n_vocab for i in ids)
        stream = tok.detokenizer()
        streamed = "".join(stream.push(i) for i in ids) + stream.flush()
        assert streamed == tok.decode(ids).decode("utf-8", errors="replace")
