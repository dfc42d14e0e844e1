"""Tests for `edgekv chat` as a person uses it: the real command in a pseudo-terminal
(pexpect), the default model (SmolLM2 135M), greedy sampling and short answers.

Answers are compared between runs (after /undo, after /save + /load in a new process), so
every comparison is of the same model's greedy output; statistics lines give the counts of
evaluated tokens. No test measures time."""

from __future__ import annotations

import io
import os
import re
import signal
import sys
from pathlib import Path

import pexpect
import pytest

pytestmark = pytest.mark.slow  # every test here needs a real model

REPO = Path(__file__).resolve().parents[1]
STATS = r"\[prompt: (\d+) new tokens \((\d+) in all\), [\d.]+ tokens/s; generation: (\d+) tokens, [\d.]+ tokens/s; " \
        r"KV (\d+)/(\d+), ring start (-?\d+) cur -?\d+; cache f16/f16\]"
TIMEOUT_S = 180  # generous: a cold start compiles or loads the kernels
N_LONG = 4000


def _default_sigint() -> None:
    # a terminal's Ctrl-C, whatever ran the tests: a shell's background job (`make test &`,
    # nohup) starts with SIGINT ignored, which a child inherits, and Python then leaves it
    # ignored, so Ctrl-C at the chat's prompt would do nothing
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Chat:
    """One `edgekv chat` process on a pseudo-terminal."""

    def __init__(self, model: Path, home: Path, *extra: str, n_predict: int = 16, n_ctx: int = 512,
                 color: bool = False):
        env = dict(os.environ, TERM="dumb", EDGEKV_HOME=str(home))
        env.pop("NO_COLOR", None)
        if not color:
            env["NO_COLOR"] = "1"
        self.log = io.StringIO()
        self.child = pexpect.spawn(sys.executable, ["-m", "edgekv", "chat", "-m", str(model), "-c", str(n_ctx), "--temp",
                                                    "0", "-n", str(n_predict), *extra],
                                   env=env, cwd=str(REPO), encoding="utf-8", timeout=TIMEOUT_S, dimensions=(50, 200),
                                   preexec_fn=_default_sigint)
        self.child.logfile_read = self.log
        self.child.expect_exact("Type /help for the commands.")
        self.prompt()

    def prompt(self) -> None:
        self.child.expect_exact("> ")

    def ask(self, text: str) -> tuple[str, dict[str, int]]:
        """Send a message; its answer (the text between the echoed line and the statistics) and
        the statistics' counts."""
        self.child.sendline(text)
        self.child.expect_exact(text.splitlines()[-1] + "\r\n")
        self.child.expect(STATS)
        answer = self.child.before.replace("\r\n", "\n").replace("[answer interrupted]", "").strip()
        counts = self._counts()
        self.prompt()
        return answer, counts

    def _counts(self) -> dict[str, int]:
        """The counts of the statistics line just matched."""
        return dict(zip(("new", "total", "gen", "kv", "n_ctx", "start"), (int(g) for g in self.child.match.groups())))

    def interrupted(self, text: str) -> dict[str, int]:
        """Send a message, interrupt the answer once it has started; the statistics' counts."""
        self.child.sendline(text)
        self.child.expect_exact(text + "\r\n")
        self.child.expect(r"\w")  # the answer has started
        self.child.sendintr()
        self.child.expect_exact("[answer interrupted]")
        self.child.expect(STATS)
        counts = self._counts()
        self.prompt()
        return counts

    def command(self, text: str) -> str:
        """Run a command; what it printed before the next prompt."""
        self.child.sendline(text)
        self.child.expect_exact(text + "\r\n")
        self.prompt()
        return self.child.before.replace("\r\n", "\n")

    def finish(self) -> int:
        """Wait for the end; the exit status. No output may hold a traceback."""
        self.child.expect(pexpect.EOF)
        self.child.close()
        assert "Traceback" not in self.log.getvalue()
        return self.child.exitstatus


@pytest.fixture
def chat(smollm2_path, tmp_path):
    started: list[Chat] = []

    def start(*extra: str, home: Path | None = None, **kw) -> Chat:
        started.append(Chat(smollm2_path, home or tmp_path / "home", *extra, **kw))
        return started[-1]

    yield start
    for c in started:
        c.child.terminate(force=True)


def test_multi_turn_reuses_the_cache_and_exit_ends_with_0(chat, tmp_path):
    c = chat()
    first, s1 = c.ask("My name is Ada. Remember it.")
    second, s2 = c.ask("What is my name?")
    assert first and "Ada" in second  # the second turn sees the first
    assert s1["new"] == s1["total"]
    # only the new turn is evaluated: everything the cache held after the first answer is reused
    # (the last generated token is evaluated with the new ones when -n cut the answer)
    assert s2["new"] <= s2["total"] - (s1["total"] + s1["gen"]) + 1 and s2["new"] < s2["total"] // 2
    assert s2["kv"] == s2["total"] + s2["gen"] - (1 if s2["gen"] == 16 else 0)
    stats = c.command("/stats")
    assert re.search(STATS, stats) and f"KV {s2['kv']}/512" in stats
    c.child.send("\x1b[A\x1b[A")  # arrow up twice: the message before /stats
    c.child.expect_exact("What is my name?")
    c.child.send("\r")
    c.child.expect(STATS)
    total3 = int(c.child.match.group(2))
    assert total3 - (s2["total"] + s2["gen"]) == s2["total"] - (s1["total"] + s1["gen"])  # the same message again
    c.prompt()
    c.child.sendline("/exit")
    assert c.finish() == 0
    history = (tmp_path / "home" / "chat_history").read_text()
    assert "What is my name?" in history and "/stats" in history


def test_help_unknown_command_multi_line_and_ctrl_d(chat):
    c = chat()
    out = c.command("/help")
    for name in ("/help", "/reset", "/system", "/undo", "/save", "/load", "/stats", "/exit", '"""', "\\"):
        assert name in out
    assert "unknown command /frobnicate; type /help" in c.command("/frobnicate now")
    c.child.sendline("Repeat after me:\\")
    c.child.expect_exact(". ")
    joined, s_joined = c.ask("blue sky")
    assert "conversation reset" in c.command("/reset")
    c.child.sendline('"""')
    c.child.sendline("Repeat after me:")
    block, s_block = c.ask('blue sky"""')
    assert (joined, s_joined["new"]) == (block, s_block["new"])  # the same first message, read two ways
    assert "conversation reset" in c.command("/reset")
    one_line, s_one_line = c.ask("Repeat after me: blue sky")
    assert s_one_line["new"] < s_block["new"]  # a line break is a token more than a space
    assert "new conversation with the system message" in c.command("/system Always answer in French.")
    _, s_system = c.ask("Repeat after me: blue sky")
    # started over, with this system message in place of the template's default one
    assert s_system["new"] == s_system["total"] != s_one_line["total"]
    assert "without a system message" in c.command("/system")
    assert c.ask("Repeat after me: blue sky") == (one_line, s_one_line)
    c.child.sendeof()
    assert c.finish() == 0


def test_ctrl_c_stops_an_answer_and_the_chat_goes_on(chat):
    # answers of N_LONG tokens with no end token (minutes on any machine): the interrupt,
    # sent as soon as an answer starts, is what ends it, however fast the model runs
    c = chat("--ignore-eos", n_predict=N_LONG, n_ctx=4096)
    first = c.interrupted("Write a long story about a dragon who learns to cook.")
    second = c.interrupted("What is 2 + 2?")
    assert first["gen"] < N_LONG and second["gen"] < N_LONG
    assert second["new"] < second["total"] // 2  # the interrupted answer stayed in the cache and was reused
    assert second["total"] >= first["total"] + first["gen"]
    assert second["kv"] == second["total"] + second["gen"]  # cache and tokens agree
    c.child.sendintr()  # at the empty prompt: quit
    assert c.finish() == 130


def test_a_second_ctrl_c_during_a_long_prompt_keeps_the_chat_whole(chat, tmp_path):
    """The first Ctrl-C asks generation to stop after the current token; during a long prompt
    no token comes for seconds, so a second one raises KeyboardInterrupt inside prompt
    evaluation (a chunk of the forward pass, or its bookkeeping). Three prompts sized to take
    ~2.5 s on this machine (its prompt speed measured first) cut so at random moments: each
    time the statistics' KV equals the tokens kept, the next turn reuses them, and the saved
    chat holds every message."""
    import json
    import random
    import time

    rng = random.Random(6)
    c = chat(n_predict=4, n_ctx=32768)

    def long_text(i: int, n_words: int) -> str:
        return f"Summarise this: {' '.join(f'word{i}x{j}' for j in range(n_words))}"

    c.child.sendline(long_text(0, 300))  # a long line: readline scrolls it, so only its end is echoed as is
    c.child.expect_exact(long_text(0, 300)[-20:] + "\r\n")
    c.child.expect(STATS)
    first = c._counts()
    speed = float(re.search(r"new tokens \(\d+ in all\), ([\d.]+) tokens/s", c.child.after).group(1))
    c.prompt()
    n_words = int(2.5 * speed / (first["new"] / 300))
    questions = [long_text(i, n_words) for i in range(1, 4)]
    kept = first["kv"]
    for text in questions:
        c.child.sendline(text)
        c.child.expect_exact(text[-20:] + "\r\n")
        time.sleep(rng.uniform(0.2, 1.2))
        c.child.sendintr()
        time.sleep(0.05)
        c.child.sendintr()
        c.child.expect_exact("[answer interrupted]")
        c.child.expect(STATS)
        counts = c._counts()
        assert counts["gen"] == 0 and kept <= counts["kv"] < counts["total"]  # cut inside the prompt
        kept = counts["kv"]
        c.prompt()
    answer, counts = c.ask("Name a colour.")
    # -n 4 reached: the 4th token was sampled, not evaluated
    assert counts["new"] < counts["total"] and counts["kv"] == counts["total"] + counts["gen"] - 1
    saved = tmp_path / "cut.chat"
    assert "saved 5 exchanges" in c.command(f"/save {saved}")
    head = json.loads(saved.read_bytes().split(b"\n", 1)[0])
    users = [m["content"] for m in head["messages"] if m["role"] == "user"]
    assert users == [long_text(0, 300)] + questions + ["Name a colour."]
    assert head["messages"][-1] == {"role": "assistant", "content": answer}
    c.child.sendintr()  # at the prompt: quit
    assert c.finish() == 130


def test_undo_gives_the_answer_as_if_the_exchange_never_happened(chat):
    c = chat()
    c.ask("Name a fruit.")
    second, s2 = c.ask("Name a colour.")
    assert "dropped" in c.command("/undo")
    again, s2_again = c.ask("Name a colour.")
    assert again == second and s2_again == s2
    assert "dropped" in c.command("/undo")
    third, _ = c.ask("Name an animal.")
    c.child.sendline("/exit")
    assert c.finish() == 0

    fresh = chat()
    fresh.ask("Name a fruit.")
    assert fresh.ask("Name an animal.")[0] == third
    fresh.child.sendline("/exit")
    assert fresh.finish() == 0


def test_save_then_load_in_a_new_process_continues_identically(chat, tmp_path):
    saved = tmp_path / "talk.chat"
    c = chat("-sys", "You are a terse assistant.")
    c.ask("My favourite number is 7.")
    assert "saved 1 exchanges" in c.command(f"/save {saved}")
    assert "cannot save" in c.command(f"/save {tmp_path / 'missing-dir' / 'x.chat'}")
    expected, s_expected = c.ask("What is my favourite number plus one?")
    c.child.sendline("/exit")
    assert c.finish() == 0

    broken = tmp_path / "broken.chat"
    broken.write_bytes(saved.read_bytes()[:-100])
    d = chat()
    assert "No such file" in d.command(f"/load {tmp_path / 'nothing.chat'}")
    assert "truncated or damaged" in d.command(f"/load {broken}")
    assert "loaded 1 exchanges" in d.command(f"/load {saved}")
    continued, s_continued = d.ask("What is my favourite number plus one?")
    assert continued == expected and s_continued == s_expected
    c2 = d.command("/stats")
    assert f"KV {s_expected['kv']}/512" in c2
    d.child.sendeof()
    assert d.finish() == 0


def test_a_chat_longer_than_the_context_goes_on_by_shifting(chat):
    c = chat(n_predict=32, n_ctx=128)
    starts = []
    for question in ("hello", "What is 2+2?", "Name a fruit.", "Name a colour.", "Name an animal.", "Name a city."):
        _, s = c.ask(question)
        assert s["n_ctx"] == 128 and 0 < s["kv"] <= 128 and s["gen"] > 0
        starts.append(s["start"])
    assert starts[0] == 0 and max(starts) > 0  # the ring's start moved: the context shifted
    c.child.sendline("/exit")
    assert c.finish() == 0


def test_colours_only_on_a_terminal_without_no_color_and_history_is_optional(chat, tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    plain = chat(home=not_a_folder)  # no place for the history file: the chat works without one
    plain.ask("hello")
    plain.child.sendeof()
    assert plain.finish() == 0 and "\x1b[" not in plain.log.getvalue()
    coloured = chat(color=True)
    coloured.child.sendeof()
    assert coloured.finish() == 0 and "\x1b[2mcontext:" in coloured.log.getvalue()
