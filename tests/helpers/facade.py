"""Shared inputs for the tests of the llama-cpp-python-compatible facade (edgekv/api/facade.py):
test_llama_api.py and test_logprobs.py, on tiny random models.

    TEXT                 a prompt of a few dozen tokens
    BAN                  a logit bias that removes a token; no_eog(llm) bans every end token
    CHUNKING_ATOL        how far logits of one position may differ between chunkings
    spanning_stop(...)   a stop string that starts inside one token and ends in the next
"""

from __future__ import annotations

import pytest

from edgekv import Llama

TEXT = "Hello world! The quick brown fox jumps over the lazy dog."
BAN = -1e9  # a logit bias that removes a token
# logits of one position evaluated in chunks of different sizes: prefill and decode take
# different kernel paths, which agree to float rounding (logits here are O(1))
CHUNKING_ATOL = 2e-3


def no_eog(llm: Llama) -> dict[int, float]:
    """A logit bias that keeps generation going until max_tokens."""
    return {t: BAN for t in llm.tokenizer_.eog_ids | set(llm.chat_formatter.stop_token_ids)}


def spanning_stop(llm: Llama, tokens: list[int]) -> str:
    """A stop string that starts inside one token's text and ends in the next one's (inside
    it when that token has two characters or more)."""
    pieces = [llm.detokenize([t]).decode("utf-8", errors="replace") for t in tokens]
    text = "".join(pieces)
    for i in range(1, len(pieces) - 1):
        a, b = pieces[i], pieces[i + 1]
        if len(a) >= 2 and b and (a + b).isprintable() and "\ufffd" not in a + b:
            stop = a[1:] + b[: max(1, len(b) - 1)]
            if text.find(stop) == len("".join(pieces[:i])) + 1:
                return stop
    pytest.fail(f"no token pair to build a spanning stop string from in {pieces}")
