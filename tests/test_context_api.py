"""n_ctx="auto" and the KV-cache options through `Llama` and the CLI (DESIGN.md sections 3-5):
the plan from the first call's input, geometric growth that copies the conversation once
and changes no output, the cap (trained context, memory budget) where the overflow policy
takes over, prefix reuse across growth, and the CLI flags reaching the session."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest

from edgekv import Llama
from edgekv.cli import chat as chat_cli
from edgekv.cli import main
from edgekv.cli import run as run_cli_module
from edgekv.errors import ContextFullError

BYTES_PER_TOKEN = 256  # tiny llama: 2 layers x 2 KV heads x 16 values x f16, K + V


@pytest.fixture(scope="module")
def paths(tiny_model):
    return {arch: str(tiny_model(arch, n_ctx=2048)) for arch in ("llama", "gemma3")}


def no_end(llm: Llama) -> dict[int, float]:
    """logit_bias that keeps a random tiny model from ending its answer early."""
    ends = set(llm.tokenizer_.eog_ids) | set(llm.chat_formatter.stop_token_ids)
    return {t: -1e9 for t in ends if t >= 0}


def prompt_ids(llm: Llama, n: int) -> list[int]:
    ids = llm.tokenize("The quick brown fox jumps over the lazy dog. " * (n // 8 + 1))
    return ids[:n]


def test_auto_plans_from_the_first_call(paths):
    llm = Llama(paths["llama"])  # n_ctx="auto" is the default
    llm("Hello", max_tokens=10, temperature=0.0)
    assert llm.n_ctx() == 256
    assert "n_ctx=256 because input length" in llm.plan_line() and "K/V bytes per token 128/128" in llm.plan_line()
    big = Llama(paths["llama"])
    big(prompt_ids(big, 100), max_tokens=300, temperature=0.0, logit_bias=no_end(big))
    assert big.n_ctx() == 512  # 400 tokens, rounded up to 256
    assert Llama(paths["llama"], n_ctx=64).n_ctx() == 64  # an explicit int is taken as is


def test_a_growing_chat_gives_the_tokens_of_a_big_context(paths, arch="llama"):
    auto, big = Llama(paths[arch]), Llama(paths[arch], n_ctx=2048)
    sizes, messages = [], []
    for turn in range(3):
        messages.append({"role": "user", "content": f"message {turn}: tell me a long story about foxes"})
        answers = [llm.create_chat_completion(messages, max_tokens=120, temperature=0.0, logit_bias=no_end(llm))
                   ["choices"][0]["message"]["content"] for llm in (auto, big)]
        assert answers[0] == answers[1]
        messages.append({"role": "assistant", "content": answers[0]})
        sizes.append(auto.n_ctx())
    assert sizes[0] == 256 and sizes[-1] > sizes[0] and sizes == sorted(sizes) and big.n_ctx() == 2048
    assert all(s % 256 == 0 for s in sizes)


def test_growth_keeps_sliding_window_rings_consistent(paths):
    """gemma3's sliding-window layers: a ring that grows gets its live slots in position order.
    Logits are compared with a tolerance: chunk sizes and slot order change float sums, and a
    random tiny model's greedy text is too tie-prone to compare exactly."""
    auto, big = Llama(paths["gemma3"]), Llama(paths["gemma3"], n_ctx=2048)
    for n in (200, 200, 400, 3):
        ids = prompt_ids(auto, n)
        for llm in (auto, big):
            llm.eval(ids)
        np.testing.assert_allclose(auto.scores[-1], big.scores[-1], rtol=1e-3, atol=1e-3)
    assert auto.n_ctx() == 1024 and auto.n_tokens == big.n_tokens == 803


def test_growth_stops_at_the_cap_then_the_policy_applies(paths):
    budget = 512 * BYTES_PER_TOKEN
    shifting = Llama(paths["llama"], mem_budget=budget, context_shift="shift", n_keep=4)
    shifting.eval(prompt_ids(shifting, 300))
    assert shifting.n_ctx() == 512
    shifting.eval(prompt_ids(shifting, 300))  # past the cap: llama.cpp's context shift
    assert shifting.n_ctx() == 512 and shifting.n_tokens <= 512
    out = shifting(prompt_ids(shifting, 300), max_tokens=400, temperature=0.0, logit_bias=no_end(shifting))
    assert out["usage"]["completion_tokens"] == 400 and shifting.n_ctx() == 512

    strict = Llama(paths["llama"], mem_budget=budget)  # context_shift="none"
    strict.eval(prompt_ids(strict, 300))
    with pytest.raises(ContextFullError):
        strict.eval(prompt_ids(strict, 300))
    assert strict.n_ctx() == 512 and strict.n_tokens == 300  # nothing of the failed call was kept
    out = strict(prompt_ids(strict, 300), max_tokens=400, temperature=0.0, logit_bias=no_end(strict))
    assert out["choices"][0]["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 212
    with pytest.raises(ContextFullError):
        strict(prompt_ids(strict, 600), max_tokens=4)
    assert strict("Hello", max_tokens=2, temperature=0.0)["usage"]["completion_tokens"] == 2  # still usable


def test_no_room_beside_the_weights_keeps_the_smallest_context(paths, monkeypatch, caplog):
    # the loader read room for the weights and nothing more (budget 0): the auto context
    # stays at 256 tokens, says so, and refuses to grow instead of planning without a budget
    from edgekv import loader
    from edgekv.kv.plan import weight_bytes

    monkeypatch.setattr(loader, "check_host_memory", lambda g, hp, device, enforce=True: weight_bytes(g))
    with caplog.at_level("WARNING", logger="edgekv"):
        llm = Llama(paths["llama"])
        llm.eval(prompt_ids(llm, 200))
    assert "stays at 256 tokens" in caplog.text and llm.n_ctx() == 256
    with pytest.raises(ContextFullError):
        llm.eval(prompt_ids(llm, 100))  # 300 tokens: no growth past the smallest context
    assert llm.n_ctx() == 256 and llm.n_tokens == 200
    assert llm("Hello", max_tokens=2, temperature=0.0)["usage"]["completion_tokens"] == 2  # still usable


def test_an_explicit_context_beyond_the_budget_is_warned_about_and_kept(paths, caplog):
    # as llama.cpp: -c is the user's word (swap, a budget set too low); the plan says what it costs
    with caplog.at_level("WARNING", logger="edgekv"):
        llm = Llama(paths["llama"], n_ctx=1024, mem_budget=512 * BYTES_PER_TOKEN)
    assert "n_ctx = 1024 needs 256.00 KiB of KV cache, more than the memory budget of 128.00 KiB" in caplog.text
    llm.eval(prompt_ids(llm, 700))
    assert llm.n_ctx() == 1024 and llm.n_tokens == 700


def test_an_extended_prompt_evaluates_only_the_new_tokens(paths):
    llm = Llama(paths["llama"])
    first = prompt_ids(llm, 200)
    llm(first, max_tokens=8, temperature=0.0, logit_bias=no_end(llm))
    assert llm.n_ctx() == 256
    extra = prompt_ids(llm, 120)
    second = list(llm.input_ids) + extra
    before = llm._session.n_evaluated
    text = llm(second, max_tokens=8, temperature=0.0, logit_bias=no_end(llm))["choices"][0]["text"]
    assert llm.n_ctx() == 512  # grown, the first call's cache copied over
    assert llm.last_stats.prompt_eval_tokens == len(extra)
    assert llm._session.n_evaluated - before == len(extra) + 7  # + the generated tokens but the last
    fresh = Llama(paths["llama"])
    assert fresh(second, max_tokens=8, temperature=0.0, logit_bias=no_end(fresh))["choices"][0]["text"] == text


def test_save_and_load_state_across_growth(paths):
    llm = Llama(paths["llama"])
    llm.eval(prompt_ids(llm, 100))
    state = llm.save_state()
    llm.eval(prompt_ids(llm, 300))
    assert llm.n_ctx() == 512
    llm.load_state(state)
    assert llm.n_tokens == 100


# ---- the command line -------------------------------------------------------------------------

@pytest.fixture
def made(monkeypatch):
    """The Llama objects the CLI commands build."""
    built = []
    for module in (run_cli_module, chat_cli):
        original = module.make_llama

        def wrapper(*a, _original=original, **kw):
            built.append(_original(*a, **kw))
            return built[-1]

        monkeypatch.setattr(module, "make_llama", wrapper)
    return built


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_flags_reach_the_session(capsys, paths, made):
    rc, _, err = cli(capsys, "-v", "run", "-m", paths["llama"], "-p", "hi", "-n", "2", "--context-shift", "stream",
                     "--keep", "4", "--layer-window", "0:8", "--mem-budget", "1M")
    assert rc == 0, err
    session = made[-1]._session
    assert (session.context_shift, session.n_keep, session.cache.windows[0], session.cache.windows[1]) == \
        ("stream", 4, 8, 0)
    assert "n_ctx=256 because" in err  # -v prints the plan
    rc, _, err = cli(capsys, "run", "-m", paths["llama"], "-p", "hi", "-n", "2", "-c", "100")
    assert rc == 0 and made[-1].n_ctx() == 100 and made[-1]._session.context_shift == "none"


def test_chat_shifts_by_default_and_prints_the_plan(capsys, monkeypatch, paths, made):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    rc, _, err = cli(capsys, "chat", "-m", paths["llama"], "-n", "2", "--temp", "0")
    assert rc == 0, err
    assert made[-1]._session.context_shift == "shift"
    assert "context: n_ctx=" in err and "KV cache" in err


@pytest.mark.parametrize("flags, fragment", [
    (["--context-shift", "sideways"], "invalid choice"),
    (["--keep", "-1"], "non-negative"),
    (["--layer-window", "0-x"], "LAYER:WINDOW"),
    (["--mem-budget", "lots"], "memory size"),
    (["-c", "0"], "positive integer"),
])
def test_bad_kv_flags_exit_2(capsys, paths, flags, fragment):
    rc, _, err = cli(capsys, "run", "-m", paths["llama"], "-p", "hi", *flags)
    assert rc == 2 and fragment in err, err


def test_kv_values_the_model_refuses_exit_1(capsys, paths):
    rc, _, err = cli(capsys, "run", "-m", paths["llama"], "-p", "hi", "--layer-window", "7:8")
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 1 and len(lines) == 1 and lines[0].startswith("edgekv: error: ") and "layer 7" in lines[0], err
    rc, _, err = cli(capsys, "run", "-m", paths["llama"], "-p", "hi", "--mem-budget", "1K")
    assert rc == 1 and "memory budget" in err, err


def test_a_prompt_longer_than_the_context_is_shifted_through_under_shift(tiny_model):
    llm = Llama(str(tiny_model("llama")), n_ctx=64, context_shift="shift", n_keep=4, seed=0)
    prompt = [int(t) for t in np.random.default_rng(3).integers(3, 200, 150)]
    out = llm.create_completion(prompt, max_tokens=8, temperature=0.0)
    assert out["usage"]["prompt_tokens"] == 150 and out["usage"]["completion_tokens"] == 8
    assert llm.n_tokens <= 64 and llm.input_ids[:4].tolist() == prompt[:4]
    strict = Llama(str(tiny_model("llama")), n_ctx=64, seed=0)
    with pytest.raises(ContextFullError):
        strict.create_completion(prompt, max_tokens=8)
