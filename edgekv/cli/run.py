"""`edgekv run`: complete one prompt, streaming the text to stdout and the timings to stderr.

What lives here: the command's options (llama.cpp's `-p`, `-f`, `-e`, `-n`, ...) and its
loop. What does not: generation itself (api/facade.py).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from ..errors import EdgeKVError, StateFileError
from .speculative import add_speculative_options, speculation_from
from .common import add_kv_options, add_model_options, add_sampling_options, make_llama, print_stats, sampling_kwargs

# llama.cpp's string_process_escapes: \n \r \t \' \" \\ and \xNN
_ESCAPE = re.compile(rb"\\(x[0-9A-Fa-f]{2}|.)", re.DOTALL)
_SIMPLE = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"'": b"'", b'"': b'"', b"\\": b"\\"}


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("run", parents=[common], help="complete a prompt",
                       description="Complete a prompt, streaming the text to stdout; timings go to stderr.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("-p", "--prompt", help="the prompt text")
    source.add_argument("-f", "--file", help="read the prompt from this file")
    add_model_options(p)
    add_speculative_options(p)
    add_kv_options(p, shift_default="none")
    add_sampling_options(p)
    p.add_argument("-e", "--escape", action=argparse.BooleanOptionalAction, default=True,
                   help="process escapes (\\n, \\t, \\xNN, ...) in the prompt (default: on, as in llama.cpp)")
    p.add_argument("--echo", action="store_true", help="print the prompt before the completion")
    p.add_argument("--prompt-cache", metavar="FILE",
                   help="reuse the state saved in FILE when its tokens start the prompt; otherwise "
                        "evaluate the prompt and save its state to FILE (as llama.cpp)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--grammar", metavar="GBNF", help="constrain the output to a GBNF grammar (llama.cpp's format)")
    shape.add_argument("--grammar-file", metavar="FILE", help="read the GBNF grammar from FILE")
    shape.add_argument("-j", "--json-schema", metavar="SCHEMA",
                       help="constrain the output to JSON valid against this schema (JSON text, or @FILE)")
    shape.add_argument("--json", action="store_true", help="constrain the output to one JSON object")
    p.set_defaults(handler=run)


def read_grammar(args: argparse.Namespace):
    """The --grammar / --grammar-file / --json-schema / --json option as a Grammar (None: none)."""
    if args.grammar is None and args.grammar_file is None and args.json_schema is None and not args.json:
        return None
    from ..grammar import Grammar

    def text_of(path: str, what: str) -> str:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise EdgeKVError(f"cannot read the {what} file {path}: {exc}") from exc

    if args.grammar is not None:
        return Grammar.from_string(args.grammar)
    if args.grammar_file is not None:
        return Grammar.from_string(text_of(args.grammar_file, "grammar"))
    if args.json_schema is not None:
        schema = args.json_schema
        return Grammar.from_json_schema(text_of(schema[1:], "schema") if schema.startswith("@") else schema)
    return Grammar.json_object()


def process_escapes(text: str) -> str:
    """Replace llama.cpp's escape sequences; an unknown one is kept as written. \\xNN is a
    byte, so \\xC3\\xA9 is 'é' (bytes that are not UTF-8 become U+FFFD)."""
    def one(match: re.Match) -> bytes:
        code = match.group(1)
        if code[:1] == b"x" and len(code) == 3:
            return bytes([int(code[1:], 16)])
        return _SIMPLE.get(code, match.group(0))

    return _ESCAPE.sub(one, text.encode("utf-8", "surrogatepass")).decode("utf-8", errors="replace")


def read_prompt(args: argparse.Namespace) -> str:
    if args.file is not None:
        try:
            with open(args.file, encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise EdgeKVError(f"cannot read the prompt file {args.file}: {exc}") from exc
    return process_escapes(args.prompt) if args.escape else args.prompt


def run(args: argparse.Namespace) -> int:
    prompt = read_prompt(args)
    grammar = read_grammar(args)  # a bad grammar fails before the model loads
    llm = make_llama(args, draft_model=speculation_from(args))
    ids = llm.tokenize(prompt, special=True)
    options = dict(sampling_kwargs(args), grammar=grammar)
    cache = _PromptCache(llm, args.prompt_cache, ids) if args.prompt_cache else None
    if cache is not None:
        options["stopping_criteria"] = cache
    chunks = llm.create_completion(ids, stream=True, echo=args.echo, **options)
    try:
        for chunk in chunks:
            sys.stdout.write(chunk["choices"][0]["text"])
            sys.stdout.flush()
    except KeyboardInterrupt:
        print(file=sys.stderr)
    sys.stdout.write("\n")
    sys.stdout.flush()
    if cache is not None and llm.n_tokens == len(ids):  # the prompt filled the context: nothing was sampled
        cache(None, None)
    print_stats(llm.last_stats, llm)
    return 0


class _PromptCache:
    """--prompt-cache FILE: load FILE before the completion; save the prompt's state once it
    is evaluated (a stopping criterion, called first with exactly the prompt in the session)
    unless FILE already held all of it. A FILE that does not load is reported and replaced."""

    def __init__(self, llm, path: str, ids: list[int]):
        self.llm, self.path = llm, path
        self.save = True
        if not os.path.exists(path):
            print(f"prompt cache {path} does not exist yet; it will be created", file=sys.stderr)
            return
        try:
            llm.load_state_file(path)
        except StateFileError as exc:
            print(f"edgekv: warning: prompt cache not used, evaluating the prompt: {exc}", file=sys.stderr)
            return
        saved = llm.input_ids.tolist()
        common = 0
        for a, b in zip(saved, ids):
            if a != b:
                break
            common += 1
        reused = common if common == len(ids) == len(saved) else min(common, len(ids) - 1)
        self.save = common < len(ids)
        print(f"prompt cache {path}: {reused} of {len(ids)} prompt tokens reused", file=sys.stderr)

    def __call__(self, input_ids, logits) -> bool:
        if self.save:
            self.save = False
            self.llm.save_state_file(self.path)
        return False
