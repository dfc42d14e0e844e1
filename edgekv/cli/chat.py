"""`edgekv chat`: an interactive, streaming, multi-turn conversation on stdin/stdout.

What lives here: the read-answer loop. Each turn re-renders the whole conversation with
the model's chat template; the session keeps the tokens of the earlier turns, so only the
new ones are evaluated (prefix reuse). stdin may be a terminal (a `> ` prompt, line
editing) or a pipe (no prompt; the chat ends at end of input). Ctrl-C during an answer
stops that answer and keeps the conversation; Ctrl-C or Ctrl-D at the prompt ends the
chat. Lines `/reset` (forget the conversation) and `/exit` are commands.
What does not: generation and templates (llama.py, chat_format.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..errors import ContextFullError
from .common import add_kv_options, add_model_options, add_sampling_options, make_llama, print_stats, sampling_kwargs

if TYPE_CHECKING:
    from ..llama import Llama


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("chat", parents=[common], help="chat with a model",
                       description="Chat with a model. Reads one message per line from stdin "
                                   "(/reset forgets the conversation, /exit or end of input quits).")
    add_model_options(p, model_required=False)
    add_kv_options(p, shift_default="shift")
    p.add_argument("-sys", "--system-prompt", default=None, help="system message that opens the conversation")
    add_sampling_options(p)
    p.set_defaults(handler=run)


def read_line(interactive: bool) -> str | None:
    """The next message, or None at end of input (Ctrl-D) or Ctrl-C at the prompt."""
    try:
        if interactive:
            return input("> ")
        line = sys.stdin.readline()
        return line if line else None
    except (EOFError, KeyboardInterrupt):
        if interactive:
            print(file=sys.stderr)
        return None


def run(args: argparse.Namespace) -> int:
    from ..catalog import default_model_name

    llm = make_llama(args, model=args.model or default_model_name())
    print(f"context: {llm.plan_line()}", file=sys.stderr, flush=True)
    interactive = sys.stdin.isatty()
    start = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
    messages = list(start)
    while True:
        line = read_line(interactive)
        if line is None:
            return 0
        text = line.strip()
        if not text:
            continue
        if text == "/exit":
            return 0
        if text == "/reset":
            messages = list(start)
            llm.reset()
            continue
        messages.append({"role": "user", "content": line.rstrip("\r\n")})
        answer = answer_turn(llm, messages, args)
        if answer is None:  # the conversation no longer fits: the message is dropped
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": answer})


def answer_turn(llm: "Llama", messages: list[dict], args: argparse.Namespace) -> str | None:
    """Stream one answer to stdout; returns its text (partial after Ctrl-C), None when the
    conversation does not fit in the context."""
    parts: list[str] = []
    interrupted = False
    try:
        for chunk in llm.create_chat_completion(messages, stream=True, **sampling_kwargs(args)):
            piece = chunk["choices"][0]["delta"].get("content")
            if piece:
                parts.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
    except ContextFullError as exc:
        print(f"edgekv: {exc}. Type /reset to start a new conversation.", file=sys.stderr, flush=True)
        return None
    except KeyboardInterrupt:
        interrupted = True
    sys.stdout.write("\n")
    sys.stdout.flush()
    if interrupted:
        print("[answer interrupted]", file=sys.stderr)
    print_stats(llm.last_stats, llm, compact=True)
    return "".join(parts)
