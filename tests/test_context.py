"""Tests for edgekv/kv/plan.py and `edgekv mem`: the "auto" context (input length, trained
context and memory budget caps, each with its reason), per-layer capacities of
sliding-window and --layer-window layers, the --layer-window and size syntax, SmolLM2's
bytes per token per cache type, and the report of both real models against the bytes a
KVCache of the same geometry allocates."""

from __future__ import annotations

import logging
import re

import pytest

from edgekv.kv import plan as context
from edgekv.backends import get_backend
from edgekv.kv.cache import KVCache
from edgekv.kv.memory import parse_size
from edgekv.cli import main
from edgekv.kv.plan import (GLOBAL, REASON_BUDGET, REASON_INPUT, REASON_REQUESTED, REASON_TRAINED, SLIDING,
                            WINDOWED, parse_layer_windows, plan_context)
from edgekv.errors import EdgeKVError
from edgekv.gguf.reader import GGUFFile
from edgekv.models import read_hparams
from edgekv.models.base import HParams

CPU = get_backend("cpu")  # the backend a cache is handed

KV_RTOL = 0.01  # the report's KV total vs KVCache.nbytes (the brief's bound; today they are equal)


def smollm2_hparams(**kw) -> HParams:
    """SmolLM2-135M's geometry: 30 layers, 9 heads, 3 KV heads of 64."""
    base = dict(arch="llama", n_vocab=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64,
                head_dim_v=64, ff=1536, n_ctx_train=8192, norm_eps=1e-5, rope_mode=0, rope_theta=1e5, rope_dims=64)
    return HParams(**{**base, **kw})


# ---- the plan --------------------------------------------------------------------------------

@pytest.mark.parametrize("n_prompt, n_predict, n_ctx", [(0, 0, 256), (10, 20, 256), (200, 56, 256), (200, 57, 512),
                                                       (3000, 128, 3328)])
def test_auto_follows_the_input_length(n_prompt, n_predict, n_ctx):
    plan = plan_context(smollm2_hparams(), n_prompt, n_predict)
    assert (plan.n_ctx, plan.reason) == (n_ctx, REASON_INPUT)
    assert plan.capacities == (n_ctx,) * 30 and plan.uniform
    assert plan.kv_bytes == n_ctx * 23_040


def test_auto_is_capped_by_the_trained_context():
    plan = plan_context(smollm2_hparams(n_ctx_train=2048), 5000, 100)
    assert (plan.n_ctx, plan.reason) == (2048, REASON_TRAINED)
    assert "2048" in plan.detail
    until_full = plan_context(smollm2_hparams(), 10, -1)  # -n -1: generate until the context is full
    assert (until_full.n_ctx, until_full.reason) == (8192, REASON_TRAINED)


def test_auto_is_capped_by_the_memory_budget():
    hp = smollm2_hparams()
    budget = 1100 * 23_040  # room for 1100 tokens: the largest multiple of 256 is 1024
    plan = plan_context(hp, 4000, 0, mem_budget=budget)
    assert (plan.n_ctx, plan.reason) == (1024, REASON_BUDGET)
    assert plan.kv_bytes <= budget < plan_context(hp, 1280, 0).kv_bytes
    assert plan_context(hp, 1000, 0, mem_budget=budget).reason == REASON_INPUT  # 1024 fits: the input decides
    q4 = plan_context(hp, 4000, 0, cache_type_k="q4_0", cache_type_v="q4_0", mem_budget=budget)
    assert (q4.n_ctx, q4.reason) == (3840, REASON_BUDGET)  # 4-bit rows: 3.5x the tokens in the same bytes
    with pytest.raises(EdgeKVError, match=r"cannot hold even 256 tokens.*--mem-budget"):
        plan_context(hp, 4000, 0, mem_budget=255 * 23_040)


def test_requested_context_is_taken_as_is(caplog):
    hp = smollm2_hparams()
    plan = plan_context(hp, 10_000, 0, n_ctx=300)
    assert (plan.n_ctx, plan.reason, plan.kv_bytes) == (300, REASON_REQUESTED, 300 * 23_040)
    with caplog.at_level(logging.WARNING, logger="edgekv"):
        assert plan_context(hp, 0, 0, n_ctx=10_000).n_ctx == 10_000
    assert "trained context of 8192" in caplog.text
    for bad in (0, -5):
        with pytest.raises(EdgeKVError, match="n_ctx must be at least 1"):
            plan_context(hp, 0, 0, n_ctx=bad)
    with pytest.raises(EdgeKVError, match="cache_type_k='q9_9'"):
        plan_context(hp, 0, 0, cache_type_k="q9_9")


def test_smollm2_bytes_per_token_per_cache_type():
    hp = smollm2_hparams()
    for cache_type, per_token in (("f16", 23_040), ("q8_0", 12_240), ("q4_0", 6_480)):
        plan = plan_context(hp, 0, 0, cache_type_k=cache_type, cache_type_v=cache_type)
        assert plan.bytes_per_token_k + plan.bytes_per_token_v == per_token
        assert plan.bytes_per_token_k == plan.bytes_per_token_v == per_token // 2
    mixed = plan_context(hp, 0, 0, cache_type_k="q8_0", cache_type_v="q4_0")
    assert (mixed.bytes_per_token_k, mixed.bytes_per_token_v) == (6_120, 3_240)


def test_sliding_window_layers_of_a_tiny_gemma3(tiny_model):
    g = GGUFFile(tiny_model("gemma3"))  # 7 layers, window 8, trained context 256
    hp = read_hparams(g)
    assert hp.window == 8 and hp.local_layers == (True,) * 5 + (False, True)
    plan = plan_context(hp, 20, 10, n_batch=16)
    assert plan.n_ctx == 256
    assert plan.capacities == (24,) * 5 + (256, 24)  # window + n_batch for local layers
    assert plan.layer_kinds == (SLIDING,) * 5 + (GLOBAL, SLIDING)
    kinds = plan.kinds()
    assert (kinds[GLOBAL].n_layers, kinds[SLIDING].n_layers) == (1, 6)
    assert plan.kv_bytes == kinds[GLOBAL].kv_bytes + kinds[SLIDING].kv_bytes == (256 + 6 * 24) * plan.row_bytes_k[0] * 2
    small = plan_context(hp, 0, 0, n_ctx=20, n_batch=16)  # the ring never exceeds n_ctx
    assert small.capacities == (20,) * 7 and small.uniform
    windowed = plan_context(hp, 0, 0, n_batch=16, layer_windows={5: 100, 0: 4})
    assert windowed.capacities == (20, 24, 24, 24, 24, 116, 24)  # the smaller of the two windows counts
    assert windowed.layer_kinds[0] == windowed.layer_kinds[5] == WINDOWED


def test_layer_windows_cap_chosen_layers():
    hp = smollm2_hparams()
    plan = plan_context(hp, 4000, 0, layer_windows=parse_layer_windows("0-9:512", 30), n_batch=256)
    assert plan.capacities == (768,) * 10 + (4096,) * 20
    assert plan.kinds()[WINDOWED].kv_bytes == 10 * 768 * 768
    with pytest.raises(EdgeKVError, match="layers 0..29"):
        plan_context(hp, 0, 0, layer_windows={30: 5})


def test_parse_layer_windows():
    assert parse_layer_windows("0-2:512,12:256") == {0: 512, 1: 512, 2: 512, 12: 256}
    assert parse_layer_windows(" 3 - 4 : 8 ") == {3: 8, 4: 8}
    for spec, message in (("0-9", "expected LAYER:WINDOW"), ("a:5", "expected LAYER:WINDOW"), ("", "expected"),
                          ("9-3:5", "runs backwards"), ("0:0", "at least 1 token"),
                          ("0-3:5,2:6", "layer 2 is given a window twice"), ("28-30:5", "layer 30 does not exist")):
        with pytest.raises(EdgeKVError, match=message):
            parse_layer_windows(spec, n_layers=30)


def test_parse_size():
    assert parse_size("512M") == 512 << 20
    assert parse_size("2G") == parse_size("2GiB") == parse_size("2gb") == 2 << 30
    assert parse_size("1.5k") == 1536 and parse_size("4096") == 4096
    for bad in ("", "2X", "-1G", "G"):
        with pytest.raises(EdgeKVError, match="512M, 2G"):
            parse_size(bad)


def test_default_mem_budget(monkeypatch):
    monkeypatch.setattr(context, "available_memory", lambda: 8 << 30)
    runtime = 200 << 20  # kv/fit.py RUNTIME_BYTES
    assert context.default_mem_budget(1 << 30) == ((7 << 30) - runtime) // 2
    assert context.default_mem_budget(8 << 30) == 0  # no room at all: plan_context then says so
    monkeypatch.setattr(context, "available_memory", lambda: None)
    assert context.default_mem_budget(1 << 30) is None


def test_available_memory_is_read_on_linux():
    assert context.available_memory() > 0  # /proc/meminfo here; sysconf elsewhere


# ---- edgekv mem --------------------------------------------------------------------------------

def mem_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["mem", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def kv_total(out: str) -> int:
    return int(re.search(r"KV cache total:\s+([\d,]+) bytes", out).group(1).replace(",", ""))


@pytest.mark.slow
@pytest.mark.parametrize("argv, n_ctx, reason, types", [
    (["-p", "300", "-n", "100"], 512, "input length", ("f16", "f16")),
    (["-c", "1000", "-ctk", "q8_0", "-ctv", "q4_0"], 1000, "requested", ("q8_0", "q4_0")),
])
def test_mem_on_smollm2_matches_the_cache(capsys, smollm2_path, argv, n_ctx, reason, types):
    rc, out, err = mem_cli(capsys, "-m", str(smollm2_path), *argv)
    assert rc == 0, err
    assert f"n_ctx:           {n_ctx} ({reason}" in out
    per_token = {"f16": 11_520, "q8_0": 6_120, "q4_0": 3_240}
    assert f"KV per token:    K {per_token[types[0]]:,} + V {per_token[types[1]]:,}" in out
    assert "f16 23,040" in out and "q8_0 12,240" in out and "q4_0 6,480" in out
    g = GGUFFile(smollm2_path)
    hp = read_hparams(g)
    cache = KVCache(n_layers=hp.n_layers, n_kv_heads=hp.n_kv_heads, head_dim_k=hp.head_dim, head_dim_v=hp.head_dim_v,
                    capacity=n_ctx, backend=CPU, type_k=types[0], type_v=types[1])
    assert kv_total(out) == pytest.approx(cache.nbytes, rel=KV_RTOL)
    assert sum(cache.bytes_per_token()) == per_token[types[0]] + per_token[types[1]]
    weights = int(re.search(r"weights:\s+([\d,]+) bytes", out).group(1).replace(",", ""))
    file_size = smollm2_path.stat().st_size
    assert weights == context.weight_bytes(g) and 0.9 * file_size < weights < file_size


@pytest.mark.slow
def test_mem_on_gemma3(capsys, gemma3_path):
    g = GGUFFile(gemma3_path)
    hp = read_hparams(g)
    assert hp.window == 512 and sum(hp.local_layers) == 15
    # n_ctx <= window + n_batch: every ring has n_ctx slots, as the KVCache of today
    rc, out, err = mem_cli(capsys, "-m", str(gemma3_path), "-c", "1024")
    assert rc == 0, err
    cache = KVCache(n_layers=hp.n_layers, n_kv_heads=hp.n_kv_heads, head_dim_k=hp.head_dim, head_dim_v=hp.head_dim_v,
                    capacity=1024, backend=CPU)
    assert kv_total(out) == pytest.approx(cache.nbytes, rel=KV_RTOL)
    assert re.search(r"global\s+3 layers x\s+1024 slots", out)
    assert re.search(r"sliding-window\s+15 layers x\s+1024 slots", out)
    # a long input: local layers keep 512 + 512 slots, global ones the whole context
    rc, out, err = mem_cli(capsys, "-m", str(gemma3_path), "-p", "8000", "-n", "100", "--mem-budget", "2G")
    assert rc == 0, err
    assert "n_ctx:           8192 (input length" in out
    assert kv_total(out) == (3 * 8192 + 15 * 1024) * 1024  # f16 K + V of one 256-wide head: 1024 bytes
    assert re.search(r"sliding-window\s+15 layers x\s+1024 slots", out)


def test_plan_windows_make_a_cache_of_the_planned_size(tiny_model):
    """The per-layer case: KVCache(windows=plan.windows, n_batch=plan.n_batch) allocates
    exactly the planned capacities (kv/cache.py's windowed rings)."""
    hp = read_hparams(GGUFFile(tiny_model("gemma3")))
    plan = plan_context(hp, 100, 20, n_batch=16, layer_windows={5: 40}, cache_type_v="bf16")
    assert not plan.uniform and plan.windows == (8,) * 5 + (40, 8)
    cache = KVCache(n_layers=hp.n_layers, n_kv_heads=hp.n_kv_heads, head_dim_k=hp.head_dim, head_dim_v=hp.head_dim_v,
                    capacity=plan.n_ctx, backend=CPU, type_k=plan.cache_type_k, type_v=plan.cache_type_v,
                    windows=plan.windows, n_batch=plan.n_batch)
    assert [k.shape[1] for k in cache.k] == list(plan.capacities)
    assert cache.nbytes == plan.kv_bytes


@pytest.mark.slow
def test_mem_user_errors(capsys, smollm2_path):
    rc, _, err = mem_cli(capsys, "-m", str(smollm2_path), "--layer-window", "0-40:64")
    assert rc == 1 and "layer 40 does not exist" in err
    rc, _, err = mem_cli(capsys, "-m", str(smollm2_path), "--mem-budget", "1M", "-p", "4000")
    assert rc == 1 and "cannot hold even 256 tokens" in err and "Traceback" not in err
    rc, out, err = mem_cli(capsys, "-m", str(smollm2_path), "--mem-budget", "30M", "-p", "4000")
    assert rc == 0 and "(memory budget" in out and kv_total(out) <= 30 << 20
    rc, _, err = mem_cli(capsys, "-m", str(smollm2_path), "--mem-budget", "lots")
    assert rc == 1 and "512M, 2G" in err
