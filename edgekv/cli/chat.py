"""`edgekv chat`: an interactive, streaming, multi-turn conversation on stdin/stdout.

What lives here: the read-answer loop. Each turn re-renders the whole conversation with
the model's chat template; the session keeps the tokens of the earlier turns, so only the
new ones are evaluated (prefix reuse). stdin may be a terminal (a `> ` prompt, line
editing and history with the arrow keys through `readline`, kept in
$EDGEKV_HOME/chat_history, default ~/.cache/edgekv/chat_history, when that is writable)
or a pipe (no prompt; the chat ends at end of input). A line ending in a backslash
continues on the next; a line starting with \"\"\" opens a block that a line ending in
\"\"\" closes. Answers go to stdout; everything else (statistics after each answer,
command output, errors) to stderr, dimmed on a terminal unless NO_COLOR is set.
Ctrl-C during an answer stops it after the current token and keeps the partial answer in
the conversation (a second Ctrl-C stops at once, even during a long prompt); Ctrl-C at the
prompt ends the chat with status 130, Ctrl-D (end of input) or /exit with status 0.
What does not: the slash commands, the conversation's bookkeeping and chat files
(chat_commands.py); generation and templates (api/facade.py, text/chat_format.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ContextFullError, EdgeKVError
from .chat_commands import MULTILINE_HELP, Conversation, run_command, stats_line
from .speculative import add_speculative_options, speculation_from
from .common import (add_kv_options, add_model_options, add_sampling_options, json_object, make_llama,
                     sampling_kwargs)

if TYPE_CHECKING:
    from ..api.facade import Llama

BLOCK = '"""'


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("chat", parents=[common], help="chat with a model",
                       description="Chat with a model, streaming its answers. Reads one message per line "
                                   f"from stdin. {MULTILINE_HELP} Commands: /help, /reset, /system TEXT, "
                                   "/undo, /save FILE, /load FILE, /stats, /exit (type /help in the chat). "
                                   "Ctrl-C stops an answer; at the prompt it quits (status 130), as does "
                                   "Ctrl-D or the end of input (status 0). Statistics after each answer go "
                                   "to stderr.")
    add_model_options(p, model_required=False)
    add_speculative_options(p)
    add_kv_options(p, shift_default="shift")
    p.add_argument("-sys", "--system-prompt", default=None, help="system message that opens the conversation")
    p.add_argument("--chat-template-kwargs", type=json_object, default=None, metavar="JSON",
                   help="more variables for the chat template, e.g. '{\"enable_thinking\": false}' (Qwen3)")
    add_sampling_options(p)
    p.set_defaults(handler=run)


class Style:
    """ANSI colours on a terminal (unless NO_COLOR is set); plain text otherwise."""

    def __init__(self) -> None:
        wanted = not os.environ.get("NO_COLOR")
        self.out = wanted and sys.stdout.isatty()
        self.err = wanted and sys.stderr.isatty()

    def prompt(self, text: str) -> str:
        # \001 and \002 tell readline that the escapes take no room on the line
        return f"\001\033[1;32m\002{text}\001\033[0m\002" if self.out else text

    def note(self, text: str) -> str:
        return f"\033[2m{text}\033[0m" if self.err else text


def read_line(interactive: bool, prompt: str = "> ") -> str | None:
    """The next line without its line break, or None at end of input (Ctrl-D). Ctrl-C
    raises KeyboardInterrupt."""
    if interactive:
        try:
            return input(prompt)
        except EOFError:
            print(file=sys.stderr)
            return None
    line = sys.stdin.readline()
    return line.rstrip("\r\n") if line else None


def read_message(interactive: bool, style: Style) -> str | None:
    """The next message, with backslash continuations and \"\"\" blocks joined by line breaks;
    None at end of input. Ctrl-C on the first line raises KeyboardInterrupt; on a
    continuation line it drops the message ("")."""
    line = read_line(interactive, style.prompt("> "))
    if line is None:
        return None
    block = line.lstrip().startswith(BLOCK)
    if block:
        line = line.lstrip()[len(BLOCK):]
        if line.rstrip().endswith(BLOCK) and line.strip():
            return line.rstrip()[: -len(BLOCK)]
    elif not line.endswith("\\"):
        return line
    parts = [] if block and not line else [line if block else line[:-1]]
    try:
        while True:
            more = read_line(interactive, style.prompt(". "))
            if more is None:
                return "\n".join(parts)
            if block and more.rstrip().endswith(BLOCK):
                parts.append(more.rstrip()[: -len(BLOCK)])
                return "\n".join(parts).rstrip("\n")
            if not block and not more.endswith("\\"):
                parts.append(more)
                return "\n".join(parts)
            parts.append(more if block else more[:-1])
    except KeyboardInterrupt:
        print("\n[message dropped]", file=sys.stderr, flush=True)
        return ""


def history_file() -> Path:
    home = os.environ.get("EDGEKV_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".cache" / "edgekv") / "chat_history"


def start_history() -> Path | None:
    """Arrow-key history through readline on a terminal; the file it is kept in, or None
    (no readline, or the file cannot be used: history then lasts for this chat only)."""
    try:
        import readline
    except ImportError:
        return None
    path = history_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            readline.read_history_file(str(path))
        readline.set_history_length(1000)
    except OSError:
        return None
    return path


def save_history(path: Path | None) -> None:
    if path is None:
        return
    try:
        import readline

        readline.write_history_file(str(path))
    except (ImportError, OSError):
        pass


def run(args: argparse.Namespace) -> int:
    from ..catalog import default_model_name

    llm = make_llama(args, model=args.model or default_model_name(), draft_model=speculation_from(args))
    style = Style()
    print(style.note(f"context: {llm.plan_line()}"), file=sys.stderr, flush=True)
    interactive = sys.stdin.isatty()
    history = start_history() if interactive else None
    if interactive:
        print(style.note("Type /help for the commands."), file=sys.stderr, flush=True)
    conv = Conversation(llm, system=args.system_prompt)
    try:
        while True:
            text = read_message(interactive, style)
            if text is None:
                return 0
            if not text.strip():
                continue
            if text.startswith("/") and "\n" not in text:
                if not run_command(conv, text):
                    return 0
                continue
            answer = answer_turn(llm, conv.prompt() + [{"role": "user", "content": text}], args, style)
            if answer is not None:  # None: the conversation no longer fits, the message is dropped
                conv.record_exchange(text, answer)
    finally:
        save_history(history)


class StopOnInterrupt:
    """While an answer streams: the first Ctrl-C asks generation to stop after the current
    token (as a stopping criterion, so the session stays consistent); a second one raises
    KeyboardInterrupt at once. Outside the main thread signals cannot be caught: a no-op."""

    def __init__(self) -> None:
        self.hit = False
        self._old = None
        self._active = threading.current_thread() is threading.main_thread()

    def __enter__(self) -> "StopOnInterrupt":
        if self._active:
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._active:
            signal.signal(signal.SIGINT, self._old)

    def _handle(self, signum, frame) -> None:
        if self.hit:
            raise KeyboardInterrupt
        self.hit = True

    def __call__(self, input_ids, logits) -> bool:  # llama-cpp-python's stopping_criteria
        return self.hit


def answer_turn(llm: "Llama", messages: list[dict], args: argparse.Namespace, style: Style | None = None) -> str | None:
    """Stream one answer to stdout, then the statistics line to stderr; returns its text
    (partial after Ctrl-C), None when it could not be produced (context full, model error)."""
    style = style or Style()
    parts: list[str] = []
    stop = StopOnInterrupt()
    interrupted = False
    try:
        with stop:
            for chunk in llm.create_chat_completion(messages, stream=True, stopping_criteria=stop,
                                                    chat_template_kwargs=getattr(args, "chat_template_kwargs", None),
                                                    **sampling_kwargs(args)):
                piece = chunk["choices"][0]["delta"].get("content")
                if piece:
                    parts.append(piece)
                    sys.stdout.write(piece)
                    sys.stdout.flush()
    except ContextFullError as exc:
        print(f"edgekv: {exc}. Type /reset to start a new conversation.", file=sys.stderr, flush=True)
        return None
    except EdgeKVError as exc:
        print(f"edgekv: error: {exc}", file=sys.stderr, flush=True)
        return None
    except KeyboardInterrupt:
        interrupted = True
    sys.stdout.write("\n")
    sys.stdout.flush()
    if interrupted or stop.hit:
        print(style.note("[answer interrupted]"), file=sys.stderr)
    print(style.note(stats_line(llm)), file=sys.stderr, flush=True)
    return "".join(parts)
