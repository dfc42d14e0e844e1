"""Constrained decoding: output that must match a grammar, a JSON schema or a regex.

What lives here: `Grammar` (llama-cpp-python's `LlamaGrammar` role: `from_string` takes
GBNF, `from_json_schema` a JSON schema, `json_object()` any JSON object, `from_lark`,
`from_regex`), checked when made (GrammarError names the position); and
`GrammarConstraint`, one generation's matcher: the sampler asks it, after logit bias and
penalties, to set every token that would leave the grammar to -inf, and the end-of-turn
tokens are allowed exactly when the grammar accepts; `LazyGrammar` / `LazyConstraint`, a
grammar that applies only once the output matched a trigger (tool calls under "auto").
The engine is llguidance (MIT; what llama.cpp uses): it computes a token mask in tens of
microseconds from a lazily built lexer, takes GBNF (through its gbnf_to_lark), Lark, regexes
and most of JSON Schema, and ships abi3 wheels for x86-64 and aarch64. Its tokenizer view
is built from the GGUF vocabulary (token bytes; control tokens marked special), once per
tokenizer. What does not: sampling itself (sampling.py), the API options (api/).
"""

from __future__ import annotations

import json
import weakref
from typing import Any, Iterable, Sequence

import numpy as np
import regex

from .errors import EdgeKVError
from .text.tokenizer import Tokenizer
from .text.vocab import ATTR_CONTROL, ATTR_USER_DEFINED


class GrammarError(EdgeKVError):
    """A grammar or schema that cannot be used (the message says where), or generation that
    the grammar left with no allowed token."""


def _llguidance():
    try:
        import llguidance
        import llguidance.gbnf_to_lark
    except ImportError as exc:  # a dependency, but a broken install should say what is missing
        raise GrammarError(f"constrained decoding needs the llguidance package ({exc}); pip install llguidance") from exc
    return llguidance


class Grammar:
    """What generated text must match, in llguidance's grammar form (`self.spec`)."""

    def __init__(self, spec: str, source: str):
        self.spec, self.source = spec, source
        llg = _llguidance()
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(spec, None)
        if is_error:
            raise GrammarError(f"invalid {source}: {'; '.join(messages)}")

    @classmethod
    def from_string(cls, gbnf: str) -> "Grammar":
        """A GBNF grammar (llama.cpp's format; the start rule is `root`)."""
        llg = _llguidance()
        try:
            lark = llg.gbnf_to_lark.gbnf_to_lark(gbnf)
        except Exception as exc:  # noqa: BLE001 - the converter raises plain exceptions on bad input
            raise GrammarError(f"invalid GBNF grammar: {exc}") from None
        return cls(llg.LLMatcher.grammar_from_lark(lark), "GBNF grammar")

    @classmethod
    def from_lark(cls, lark: str) -> "Grammar":
        return cls(_llguidance().LLMatcher.grammar_from_lark(lark), "Lark grammar")

    @classmethod
    def from_regex(cls, regex: str) -> "Grammar":
        return cls(_llguidance().LLMatcher.grammar_from_regex(regex), "regex")

    @classmethod
    def from_json_schema(cls, schema: str | dict) -> "Grammar":
        """Text that is one JSON value valid against `schema` (a dict or its JSON text). A
        schema keyword llguidance cannot enforce is refused, not ignored."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, (dict, bool)):
            raise GrammarError(f"a JSON schema is an object, got {type(schema).__name__}")
        llg = _llguidance()
        try:
            spec = llg.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        except Exception as exc:  # noqa: BLE001 - llguidance raises ValueError/TypeError subclasses
            raise GrammarError(f"invalid JSON schema: {exc}") from None
        return cls(spec, "JSON schema")

    @classmethod
    def json_object(cls) -> "Grammar":
        """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
        return cls.from_json_schema({"type": "object"})

    def __repr__(self) -> str:
        return f"Grammar({self.source})"


_views: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _TokenizerView:
    """What llguidance's TokenizerWrapper reads from a tokenizer: each token's bytes (control
    tokens prefixed with 0xff, as llguidance's llama.cpp binding marks them), the special
    ids, and encoding of bytes."""

    def __init__(self, tokenizer: Tokenizer):
        vocab = tokenizer.vocab
        self._tokenizer = tokenizer
        self.tokens = []
        self.special_token_ids = []
        for i in range(tokenizer.n_vocab):
            piece = tokenizer.token_to_piece(i)
            attr = vocab.attrs[i]
            if attr & ATTR_CONTROL or (attr & ATTR_USER_DEFINED and piece.startswith(b"<") and piece.endswith(b">")):
                piece = b"\xff" + piece
                self.special_token_ids.append(i)
            self.tokens.append(piece)
        self.eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.eog_ids, default=0)
        self.bos_token_id = tokenizer.bos_id

    def __call__(self, text: bytes) -> list[int]:
        return self._tokenizer.encode(bytes(text), add_bos=False, add_eos=False, special=False)


def _llg_tokenizer(tokenizer: Tokenizer):
    """llguidance's tokenizer for ours, made once per tokenizer (about a second for 262k tokens)."""
    made = _views.get(tokenizer)
    if made is None:
        llg = _llguidance()
        from llguidance._tokenizer import TokenizerWrapper

        view = _TokenizerView(tokenizer)
        eos = sorted(tokenizer.eog_ids) or [view.eos_token_id]
        made = _views[tokenizer] = llg.LLTokenizer(TokenizerWrapper(view), n_vocab=tokenizer.n_vocab, eos_token=eos)
    return made


class GrammarConstraint:
    """One generation under a grammar: `apply(logits, history)` sets the logits of every
    token the grammar forbids next to -inf, after consuming the tokens generated since the
    last call (history = prompt + generated; the prompt is what history held at the first
    call). end_ids (the turn's end tokens) are allowed exactly when the grammar accepts."""

    def __init__(self, grammar: Grammar, tokenizer: Tokenizer, end_ids: Iterable[int] = ()):
        llg = _llguidance()
        self.tokenizer = tokenizer
        self.matcher = llg.LLMatcher(_llg_tokenizer(tokenizer), grammar.spec, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"{grammar.source}: {self.matcher.get_error()}")
        self.end_ids = np.array(sorted(set(end_ids) | set(tokenizer.eog_ids)), np.int64)
        self._start: int | None = None
        self._consumed = 0
        n = tokenizer.n_vocab
        self._bits = np.empty((n + 31) // 32, np.int32)

    def start_after(self, written: Sequence[int], at: int) -> None:
        """Start with `written` (tokens already in the output, in any split) consumed, the
        history's tokens from index `at` on still to come (a LazyConstraint's trigger)."""
        self._start = at
        self.matcher.consume_tokens([int(t) for t in written])
        if self.matcher.is_error():
            raise GrammarError(f"the grammar rejected the text that triggered it: {self.matcher.get_error()}")

    def _catch_up(self, history: Sequence[int]) -> None:
        if self._start is None:
            self._start = len(history)
        new = list(history[self._start + self._consumed :])
        if new:
            self.matcher.consume_tokens([int(t) for t in new])
            self._consumed += len(new)
            if self.matcher.is_error():
                raise GrammarError(f"the grammar rejected a generated token: {self.matcher.get_error()}")

    def apply(self, logits: np.ndarray, history: Sequence[int]) -> None:
        """Mask logits f32[n_vocab] in place."""
        self._catch_up(history)
        n = logits.shape[0]
        if self.matcher.is_stopped():
            allowed = np.zeros(n, bool)
        else:
            self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
            allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:n].astype(bool)
        if self.matcher.is_accepting() or self.matcher.is_stopped():
            allowed[self.end_ids[self.end_ids < n]] = True
        if not allowed.any():
            raise GrammarError("the grammar allows no token at this point of the output")
        logits[~allowed] = -np.inf


class LazyGrammar:
    """A grammar that applies from where the output first matches a trigger on (llama.cpp's
    lazy grammars, as its tool calls use them). Two kinds of trigger, regexes whose first
    group that took part (or whole match) is where the grammar starts: `trigger`, matched at the start of the
    output (a call the answer opens with, in a form that could also be text), and `anywhere`,
    searched for anywhere in it (a family's own call markers, llama.cpp's trigger words), both
    after a leading reasoning block (`block`: its opening and closing tags; opening None when
    the prompt already opened it); `regex`'s partial matching says when text cut short may
    still match. Before a trigger matches the text is free. markers: texts that the model
    writes as special tokens and the triggers must see (a tool call format's markers)."""

    def __init__(self, grammar: Grammar, trigger: str | None, markers: tuple[str, ...] = (),
                 block: tuple[str | None, str] | None = None, anywhere: str | None = None):
        self.grammar, self.source = grammar, f"lazy {grammar.source}"
        self.trigger = None if trigger is None else regex.compile(trigger)
        self.anywhere = None if anywhere is None else regex.compile(anywhere)
        self.markers, self.block = markers, block

    def __repr__(self) -> str:
        return f"LazyGrammar({self.grammar.source}, {self.trigger and self.trigger.pattern!r}, " \
               f"anywhere={self.anywhere and self.anywhere.pattern!r})"


class LazyConstraint:
    """One generation under a LazyGrammar: no mask until the generated text (as the stream's
    detokenizer writes it) matches a trigger, then a GrammarConstraint fed the text from the
    trigger on (re-tokenized: llguidance checks bytes, not how they were split into tokens).
    A reasoning block is skipped by looking for its closing tag in the new text only, and the
    anywhere trigger is searched for in the new text only (a long answer costs no more than
    its length)."""

    def __init__(self, lazy: LazyGrammar, tokenizer: Tokenizer, end_ids: Iterable[int] = ()):
        self.lazy, self.tokenizer, self.end_ids = lazy, tokenizer, end_ids
        self.inner: GrammarConstraint | None = None
        self.text = ""
        self._detokenizer = tokenizer.detokenizer(skip_special=True, keep=tokenizer.ids_of(lazy.markers))
        self._start: int | None = None
        self._seen = 0
        self._inside = lazy.block is not None and lazy.block[0] is None  # in the reasoning block
        self._find_from = 0  # where to look for the block's closing tag next
        self._after: int | None = None if lazy.block is not None else 0  # where the answer starts
        self._at_start = lazy.trigger is not None  # whether the start trigger may still match
        self._search_from: int | None = None  # where the anywhere trigger is searched from next

    @property
    def free(self) -> bool:
        """Whether no trigger can match any more: the rest of the text is free."""
        return self.inner is None and not self._at_start and self.lazy.anywhere is None and self._after is not None

    def apply(self, logits: np.ndarray, history: Sequence[int]) -> None:
        """Mask logits f32[n_vocab] in place once triggered (GrammarConstraint.apply)."""
        if self._start is None:
            self._start = len(history)
        if self.inner is None and not self.free:
            for token in history[self._start + self._seen:]:
                self.text += self._detokenizer.push(int(token))
            self._seen = len(history) - self._start
            if self._after is None:
                self._after = self._past_block()
            m = None if self._after is None else self._triggered()
            if m is not None:
                begin = next((m.start(g) for g in range(1, m.re.groups + 1) if m.start(g) >= 0), m.start())
                self.inner = GrammarConstraint(self.lazy.grammar, self.tokenizer, self.end_ids)
                written = self.tokenizer.encode(self.text[begin:], add_bos=False)
                self.inner.start_after(written, len(history))
        if self.inner is not None:
            self.inner.apply(logits, history)

    def _triggered(self) -> regex.Match | None:
        """The trigger's match once the text holds one (the start trigger first)."""
        if self._at_start:
            m = self.lazy.trigger.match(self.text, self._after, partial=True)
            if m is not None and not m.partial:
                return m
            self._at_start = m is not None
        if self.lazy.anywhere is None:
            return None
        m = self.lazy.anywhere.search(self.text, self._after if self._search_from is None else self._search_from,
                                      partial=True)
        self._search_from = len(self.text) if m is None else m.start()  # a partial match: from its start
        return m if m is not None and not m.partial else None

    def _past_block(self) -> int | None:
        """Where the output's answer starts (after its reasoning block, if it opens with one),
        or None while that is not known yet."""
        opening, closing = self.lazy.block
        if not self._inside:
            lead = self.text.lstrip()
            if not lead.startswith(opening):
                return None if opening.startswith(lead) else 0  # maybe an opening still, or no block
            self._inside, self._find_from = True, len(self.text) - len(lead) + len(opening)
        at = self.text.find(closing, self._find_from)
        if at < 0:
            self._find_from = max(self._find_from, len(self.text) - len(closing) + 1)
            return None
        return at + len(closing)


def response_format_grammar(response_format: Any) -> Grammar | None:
    """The grammar an OpenAI / llama-cpp-python `response_format` asks for: {"type": "text"}
    (none), {"type": "json_object"} (optionally with "schema", as llama-cpp-python takes it),
    or {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict) or not isinstance(response_format.get("type"), str):
        raise GrammarError('response_format must be an object like {"type": "json_object"}')
    kind = response_format["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
        return Grammar.json_object() if schema is None else Grammar.from_json_schema(schema)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise GrammarError('response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}')
        return Grammar.from_json_schema(spec["schema"])
    raise GrammarError(f"response_format type {kind!r} is not one of text, json_object, json_schema")


def as_grammar(grammar: Any) -> Grammar | None:
    """A `grammar=` argument: a Grammar, GBNF text, or None."""
    if grammar is None or isinstance(grammar, Grammar):
        return grammar
    if isinstance(grammar, str):
        return Grammar.from_string(grammar)
    raise GrammarError(f"grammar must be a Grammar or GBNF text, got {type(grammar).__name__}")
