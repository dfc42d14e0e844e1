"""The conversation behind `edgekv chat` and its slash commands (/help, /reset, /system,
/undo, /save, /load, /stats, /exit).

What lives here: `Conversation` (the messages, the system message, and per exchange the
number of cache tokens that came before it, so /undo can trim the cache back exactly),
the commands, the statistics line, and the chat file that /save writes and /load reads.
What does not: reading input, streaming answers, Ctrl-C, colours (chat.py); the state
file format inside a chat file (state_file.py).

Chat file (version 1): one line of UTF-8 JSON ending in "\\n" -- {"format": "edgekv-chat",
"version": 1, "system": str|null, "messages": [{"role", "content"}...], "exchanges":
[[n_before, sha256 of those token ids]...], "n_ctx", "cache_type_k", "cache_type_v",
"state_nbytes": N} -- followed by exactly N
bytes: an edgekv state file (state_file.py: KV cache, tokens, logits, with its own checksum).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..errors import EdgeKVError

if TYPE_CHECKING:
    from ..api.facade import Llama
    from ..api.responses import GenerationStats

CHAT_FORMAT, CHAT_VERSION = "edgekv-chat", 1
_GEOMETRY = ("cache_type_k", "cache_type_v")  # what a chat file's KV state needs of the session (and n_ctx:
# with -c auto the context takes the file's size, see Llama.load_state_file)
MULTILINE_HELP = ('Multi-line input: end a line with \\ to continue on the next, or open and close a block '
                  'with """.')
HELP = f"""Commands:
  /help          this list
  /reset         forget the conversation (the system message stays)
  /system TEXT   start a new conversation with TEXT as its system message (/system alone: none)
  /undo          drop the last exchange (your message and its answer) and trim the cache to match
  /save FILE     save the conversation with its KV cache to FILE
  /load FILE     continue a conversation saved with /save (same model, -c and cache types)
  /stats         the statistics of the last answer and the KV cache
  /exit          quit (so do Ctrl-D and Ctrl-C at an empty prompt)
{MULTILINE_HELP}
Ctrl-C during an answer stops it after the current token (a second Ctrl-C at once); the
partial answer stays in the conversation."""


class ChatFileError(EdgeKVError):
    """A chat file (/load) is missing, damaged, or not from edgekv chat."""


def _ids_digest(ids) -> str:
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()


@dataclass
class Conversation:
    """The messages of one chat and what /undo needs to trim the cache to an earlier turn."""

    llm: "Llama"
    system: str | None = None
    messages: list[dict] = field(default_factory=list)  # user/assistant turns, without the system message
    # per exchange: (cache tokens kept from before it, sha256 of those ids); see record_exchange
    exchanges: list[tuple[int, str]] = field(default_factory=list)

    def prompt(self) -> list[dict]:
        """The messages the model sees: the system message (if any), then the turns."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages

    def record_exchange(self, user: str, answer: str) -> None:
        """Add a finished (or interrupted) exchange. Its first cache tokens were reused from
        before it: /undo trims the cache back to them, so the next turn is evaluated from
        the same point as this one was, and gives the same answer."""
        stats = self.llm.last_stats
        before = max(0, min(stats.prompt_tokens - stats.prompt_eval_tokens, self.llm.n_tokens))
        if stats.prompt_eval_tokens == 0:  # the prompt was interrupted: unknown, so /undo starts over
            before = 0
        self.messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        self.exchanges.append((before, _ids_digest(self.llm.input_ids[:before])))

    def clear(self, system: str | None) -> None:
        self.system, self.messages, self.exchanges = system, [], []
        self.llm.reset()

    def undo(self) -> bool:
        """Drop the last exchange; False when there is none."""
        if not self.exchanges:
            return False
        before, digest = self.exchanges.pop()
        del self.messages[-2:]
        ids = self.llm.input_ids
        if before == 0:
            self.llm.reset()
        elif before <= len(ids) and _ids_digest(ids[:before]) == digest:
            # hold exactly ids[:before]: the facade keeps the common prefix (the last token is
            # replayed for its logits, as the decode step that made it did)
            tokens = self.llm.generate(list(ids[:before]), temp=0.0)
            next(tokens)
            tokens.close()
        # otherwise a context shift has moved the tokens since: the next turn's prefix reuse
        # re-evaluates whatever differs
        return True


def stats_line(llm: "Llama") -> str:
    """The statistics of the last answer and the KV cache, in one line."""
    s: GenerationStats = llm.last_stats
    kv = llm.kv_status()
    return (f"[prompt: {s.prompt_eval_tokens} new tokens ({s.prompt_tokens} in all), "
            f"{s.prompt_tokens_per_s:.1f} tokens/s; generation: {s.gen_tokens} tokens, "
            f"{s.gen_tokens_per_s:.1f} tokens/s{s.draft_summary('; ')}; KV {kv['n_tokens']}/{kv['n_ctx']}, "
            f"ring start {kv['start']} cur {kv['cur']}; cache {kv['cache_type_k']}/{kv['cache_type_v']}]")


def save_chat(conv: Conversation, path: str) -> None:
    """Write the chat file atomically (temp file beside it, then rename)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, state_path = tempfile.mkstemp(suffix=".state", dir=folder)
    os.close(fd)
    try:
        conv.llm.save_state_file(state_path)
        with open(state_path, "rb") as f:
            state = f.read()
        kv = conv.llm.kv_status()
        head = dict(format=CHAT_FORMAT, version=CHAT_VERSION, system=conv.system, messages=conv.messages,
                    exchanges=conv.exchanges, **{k: kv[k] for k in _GEOMETRY}, state_nbytes=len(state))
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(json.dumps(head, ensure_ascii=True).encode() + b"\n")
            f.write(state)
        os.replace(tmp, path)
    finally:
        for leftover in (state_path, path + ".tmp"):
            if os.path.exists(leftover):
                os.remove(leftover)


def load_chat(conv: Conversation, path: str) -> None:
    """Replace the conversation with the one in `path`; on any error (ChatFileError,
    StateFileError) the conversation stays as it was."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ChatFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    head, state = _parse_chat(data, path)
    kv = conv.llm.kv_status()
    if any(head.get(k) != kv[k] for k in _GEOMETRY):
        raise ChatFileError(f"{path} was saved with -c {head.get('n_ctx')} -ctk {head.get('cache_type_k')} -ctv "
                            f"{head.get('cache_type_v')}; this chat has -c {kv['n_ctx']} -ctk {kv['cache_type_k']} "
                            f"-ctv {kv['cache_type_v']}: start edgekv chat with the same options to load it")
    fd, state_path = tempfile.mkstemp(suffix=".state")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(state)
        conv.llm.load_state_file(state_path)  # validated completely before anything changes
    except EdgeKVError as exc:  # name the chat file, not the temporary one
        if getattr(exc, "field", "") == "n_ctx":
            raise ChatFileError(f"{path} was saved with -c {head.get('n_ctx')}; this chat has -c {kv['n_ctx']}: "
                                f"start edgekv chat with -c {head.get('n_ctx')} (or -c auto) to load it") from None
        raise ChatFileError(str(exc).replace(state_path, path)) from None
    finally:
        os.remove(state_path)
    conv.system, conv.messages = head["system"], head["messages"]
    conv.exchanges = [(int(n), str(d)) for n, d in head["exchanges"]]


def _parse_chat(data: bytes, path: str) -> tuple[dict, bytes]:
    line, newline, state = data.partition(b"\n")
    try:
        head = json.loads(line) if newline else None
    except (ValueError, UnicodeDecodeError):
        head = None
    if not isinstance(head, dict) or head.get("format") != CHAT_FORMAT:
        raise ChatFileError(f"{path} is not a chat saved by edgekv chat /save")
    if head.get("version") != CHAT_VERSION:
        raise ChatFileError(f"{path}: chat file version {head.get('version')!r}, expected {CHAT_VERSION}")
    messages, exchanges, system = head.get("messages"), head.get("exchanges"), head.get("system")
    ok = (isinstance(messages, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                             and isinstance(m.get("content"), str) for m in messages)
          and isinstance(exchanges, list) and all(isinstance(e, list) and len(e) == 2 for e in exchanges)
          and (system is None or isinstance(system, str)))
    if not ok:
        raise ChatFileError(f"{path}: the messages are damaged")
    if head.get("state_nbytes") != len(state):
        raise ChatFileError(f"{path}: truncated or damaged: the cache state has {len(state)} bytes, "
                            f"expected {head.get('state_nbytes')}")
    return head, state


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _cmd_help(conv: Conversation, arg: str) -> None:
    _say(HELP)


def _cmd_reset(conv: Conversation, arg: str) -> None:
    conv.clear(conv.system)
    _say("[conversation reset]")


def _cmd_system(conv: Conversation, arg: str) -> None:
    conv.clear(arg or None)
    _say(f"[new conversation with the system message: {arg}]" if arg else "[new conversation without a system message]")


def _cmd_undo(conv: Conversation, arg: str) -> None:
    _say("[last exchange dropped]" if conv.undo() else "[nothing to undo]")


def _cmd_save(conv: Conversation, arg: str) -> None:
    if not arg:
        _say("usage: /save FILE")
        return
    try:
        save_chat(conv, arg)
    except (OSError, EdgeKVError) as exc:
        _say(f"edgekv: cannot save to {arg}: {getattr(exc, 'strerror', None) or exc}")
        return
    _say(f"[saved {len(conv.messages) // 2} exchanges, {conv.llm.n_tokens} cache tokens to {arg}]")


def _cmd_load(conv: Conversation, arg: str) -> None:
    if not arg:
        _say("usage: /load FILE")
        return
    try:
        load_chat(conv, arg)
    except EdgeKVError as exc:
        _say(f"edgekv: /load: {exc}")
        return
    _say(f"[loaded {len(conv.messages) // 2} exchanges, {conv.llm.n_tokens} cache tokens from {arg}]")


def _cmd_stats(conv: Conversation, arg: str) -> None:
    _say(stats_line(conv.llm))


COMMANDS: dict[str, Callable[[Conversation, str], None]] = {
    "/help": _cmd_help, "/reset": _cmd_reset, "/system": _cmd_system, "/undo": _cmd_undo,
    "/save": _cmd_save, "/load": _cmd_load, "/stats": _cmd_stats,
}


def run_command(conv: Conversation, text: str) -> bool:
    """Run the slash command in `text`; False for /exit (the chat ends)."""
    name, _, arg = text.strip().partition(" ")
    if name in ("/exit", "/quit"):
        return False
    command = COMMANDS.get(name)
    if command is None:
        _say(f"unknown command {name}; type /help for the list")
    else:
        command(conv, arg.strip())
    return True
