"""Tests for edgekv/cli/: each command through `main([...])` (and `python -m edgekv` for the
piped chat) on tiny random models; exit codes and one-line errors for user mistakes; the
perplexity method against an independent computation from `Llama(logits_all=True)`."""

from __future__ import annotations

import io
import math
import re
import subprocess
import sys

import numpy as np
import pytest

from edgekv import Llama, catalog
from edgekv.cli import main
from edgekv.cli.run import process_escapes

from edgekv.testing import tiny_model as mtm  # noqa: E402
TEXT = "Hello world! The quick brown fox jumps over the lazy dog. Is it there? Yes, it is there. "
PPL_RTOL = 1e-3  # chunked prefill vs one batch: logits agree to float rounding


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(mtm.make_tiny_model(tmp_path_factory.mktemp("cli") / "tiny.gguf"))


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory) -> str:
    return str(mtm.make_tiny_model(tmp_path_factory.mktemp("cli") / "tiny-gemma.gguf", arch="gemma3"))


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_run_streams_the_completion_and_prints_timings(capsys, tiny):
    rc, out, err = run_cli(capsys, "run", "-m", tiny, "-p", "The quick", "-n", "6", "--temp", "0", "-c", "64")
    assert rc == 0
    expected = Llama(tiny, n_ctx=64)("The quick", max_tokens=6, temperature=0.0)["choices"][0]["text"]
    assert out == expected + "\n"
    assert re.search(r"prompt eval: \d+ tokens, [\d.]+ s, [\d.]+ tokens/s", err)
    assert re.search(r"generation: +\d+ tokens, [\d.]+ s, [\d.]+ tokens/s", err)


def test_run_reads_a_prompt_file_and_echoes(capsys, tiny, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("The quick")
    rc, out, _ = run_cli(capsys, "run", "-m", tiny, "-f", str(prompt), "-n", "2", "--temp", "0", "--echo")
    assert rc == 0 and out.startswith("The quick")


def test_escapes_like_llama_cpp():
    assert process_escapes(r"a\nb\tc\\d \x41 \xC3\xA9 \q \"") == 'a\nb\tc\\d A é \\q "'


def test_bad_flags_exit_2(capsys, tiny):
    assert run_cli(capsys, "run", "-m", tiny, "-p", "hi", "--bogus")[0] == 2
    assert run_cli(capsys, "frobnicate")[0] == 2
    rc, _, err = run_cli(capsys, "run", "-m", tiny, "-p", "hi", "-c", "zero")
    assert rc == 2 and "-c/--ctx-size" in err
    assert run_cli(capsys, "perplexity", "-m", tiny, "-f", "x.txt", "-c", "auto")[0] == 2
    assert run_cli(capsys, "run", "-m", tiny)[0] == 2  # no prompt
    assert run_cli(capsys, "--help")[0] == 0


def one_line_error(err: str, *fragments: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("edgekv: error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def test_user_mistakes_exit_1_with_one_line(capsys, tiny, tmp_path):
    missing = str(tmp_path / "nope.gguf")
    rc, out, err = run_cli(capsys, "run", "-m", missing, "-p", "hi")
    assert rc == 1 and out == ""
    one_line_error(err, "nope.gguf", "neither an existing file nor a catalog name")
    rc, _, err = run_cli(capsys, "run", "-m", tiny, "-p", TEXT * 4, "-c", "16")
    assert rc == 1
    one_line_error(err, "context")
    rc, _, err = run_cli(capsys, "run", "-m", tiny, "-p", "hi", "-ctk", "q3_weird")
    assert rc == 1
    one_line_error(err, "q3_weird")
    rc, _, err = run_cli(capsys, "perplexity", "-m", tiny, "-f", str(tmp_path / "absent.txt"))
    assert rc == 1
    one_line_error(err, "absent.txt")


def reference_perplexity(model: str, text: str, n_ctx: int) -> tuple[float, int]:
    """llama.cpp's method written out on full-chunk logits: (PPL, number of chunks)."""
    llm = Llama(model, n_ctx=n_ctx, logits_all=True)
    tokens = llm.tokenize(text.encode())
    n_chunks = len(tokens) // n_ctx
    nll = []
    for i in range(n_chunks):
        chunk = tokens[i * n_ctx : (i + 1) * n_ctx]
        inputs = list(chunk)
        if llm.tokenizer_.add_bos:
            inputs[0] = llm.token_bos()
        llm.reset()
        llm.eval(inputs)
        scores = llm.scores.astype(np.float64)
        for p in range(n_ctx // 2, n_ctx - 1):
            row = scores[p]
            log_z = row.max() + math.log(np.exp(row - row.max()).sum())
            nll.append(log_z - row[chunk[p + 1]])
    return math.exp(float(np.mean(nll))), n_chunks


@pytest.mark.parametrize("model", ["tiny", "tiny_gemma"])
def test_perplexity_format_and_value(capsys, request, tmp_path, model):
    path = request.getfixturevalue(model)
    text_file = tmp_path / "text.txt"
    text_file.write_text(TEXT * 5)
    rc, out, err = run_cli(capsys, "perplexity", "-m", path, "-f", str(text_file), "-c", "32", "-b", "8")
    assert rc == 0, err
    progress, final = out.strip().splitlines()
    assert re.fullmatch(r"(\[\d+\]\d+\.\d{4},)+", progress)
    match = re.fullmatch(r"Final estimate: PPL = (\d+\.\d{4}) \+/- (\d+\.\d{5})", final)
    assert match
    ppl, n_chunks = reference_perplexity(path, TEXT * 5, 32)
    assert n_chunks >= 2 and progress.count("[") == n_chunks
    assert math.isfinite(float(match.group(1)))
    assert float(match.group(1)) == pytest.approx(ppl, rel=PPL_RTOL)
    last = float(re.findall(r"\]([\d.]+),", progress)[-1])
    assert last == float(match.group(1))  # the running value after the last chunk is the estimate


def test_perplexity_needs_two_chunks(capsys, tiny, tmp_path):
    text_file = tmp_path / "short.txt"
    text_file.write_text("Hello world")
    rc, _, err = run_cli(capsys, "perplexity", "-m", tiny, "-f", str(text_file), "-c", "32")
    assert rc == 1
    one_line_error(err, "you need at least 64 tokens")


def test_list_shows_catalog_and_cache_state(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path))
    entries = catalog.load_catalog()
    rc, out, _ = run_cli(capsys, "list")
    assert rc == 0
    for name, entry in entries.items():
        (row,) = [line for line in out.splitlines() if line.startswith(name)]
        assert entry.file in row and row.rstrip().endswith("no")
    assert f"{catalog.default_model_name()} (default)" in out
    name, entry = next(iter(entries.items()))
    (tmp_path / "models").mkdir()
    with open(tmp_path / "models" / entry.file, "wb") as f:  # sparse file of the catalog's size
        f.truncate(entry.size)
    out = run_cli(capsys, "list")[1]
    (row,) = [line for line in out.splitlines() if line.startswith(name)]
    assert row.rstrip().endswith("yes")


@pytest.mark.slow
def test_pull_returns_the_cached_model(capsys, smollm2_path):
    rc, out, _ = run_cli(capsys, "pull", "smollm2-135m-instruct")
    assert rc == 0 and out.strip() == str(smollm2_path)
    rc, out, err = run_cli(capsys, "pull", "no-such-model")
    assert rc == 1
    one_line_error(err, "no-such-model")


def test_pull_without_name_fetches_the_default(capsys, monkeypatch, tmp_path):
    asked = []
    monkeypatch.setattr(catalog, "ensure_model", lambda name, progress=None: asked.append(name) or tmp_path)
    rc, out, _ = run_cli(capsys, "pull")
    assert rc == 0 and asked == [catalog.default_model_name()] and out.strip() == str(tmp_path)


def test_chat_reuses_the_conversation(capsys, monkeypatch, tiny):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n\nsecond message here\n"))
    rc, out, err = run_cli(capsys, "chat", "-m", tiny, "-n", "4", "--temp", "0", "-c", "128")
    assert rc == 0 and "> " not in out
    llm = Llama(tiny, n_ctx=128)
    first = [{"role": "user", "content": "hello"}]
    answer = llm.create_chat_completion(first, max_tokens=4, temperature=0.0)["choices"][0]["message"]["content"]
    assert out.startswith(answer + "\n")
    new_tokens = [int(n) for n in re.findall(r"prompt: (\d+) new tokens", err)]
    assert len(new_tokens) == 2 and "KV " in err
    full_first = len(llm.chat_formatter.encode(first))
    second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "second message here"}]
    assert new_tokens[0] == full_first
    assert new_tokens[1] <= len(llm.chat_formatter.encode(second)) - full_first + 1


def test_chat_through_a_pipe(tiny_gemma):
    done = subprocess.run([sys.executable, "-m", "edgekv", "chat", "-m", tiny_gemma, "-n", "6", "-c", "64"],
                          input="hello\n", capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "tokens/s" in done.stderr
    assert not done.stdout.startswith("> ")


def test_ctrl_c_during_an_answer_keeps_the_chat(capsys, monkeypatch, tiny):
    from edgekv.cli import chat

    real = Llama.create_chat_completion
    turns = []

    def interrupted_once(self, messages, **kwargs):
        turns.append([dict(m) for m in messages])
        chunks = real(self, messages, **kwargs)
        if len(turns) > 1:
            return chunks

        def first_turn():
            yield next(chunks)  # the role chunk
            yield {"choices": [{"delta": {"content": "partial"}}]}
            raise KeyboardInterrupt

        return first_turn()

    monkeypatch.setattr(Llama, "create_chat_completion", interrupted_once)
    monkeypatch.setattr(sys, "stdin", io.StringIO("first\nsecond\n"))
    rc, out, err = run_cli(capsys, "chat", "-m", tiny, "-n", "2", "--temp", "0", "-c", "64")
    assert rc == 0 and "[answer interrupted]" in err and out.startswith("partial\n")
    assert turns[1][:2] == [{"role": "user", "content": "first"}, {"role": "assistant", "content": "partial"}]
    assert chat.read_line(interactive=False) is None  # stdin is exhausted: end of input
