"""Fuzzing the GGUF loader: every metadata key of a tiny model given every wrong kind of
value, and 20,000 seeded byte-level mutants (tools/fuzz_gguf.py). The only outcomes
allowed: the file loads and generates a token, or an EdgeKVError (GGUFError,
UnsupportedModelError, TokenizerError, ChatTemplateError, a NaN-logits refusal) naming
the problem. Inputs that once broke something are kept in test_gguf_hostile.py."""

from __future__ import annotations

import math
import multiprocessing
import resource
from pathlib import Path

import pytest

from gguf_craft import ARRAY, BOOL, FLOAT32, INT32, STRING, UINT32, UINT64, rewrite
from helpers.hostile_gguf import fuzz_tool

pytestmark = pytest.mark.long  # fuzz loops: thousands of mutants

WRONG_VALUES = {
    "zero": (UINT32, 0, None), "u32 max": (UINT32, 2**32 - 1, None), "minus one": (INT32, -1, None),
    "2^63": (UINT64, 2**63, None), "NaN": (FLOAT32, math.nan, None), "huge float": (FLOAT32, 3e38, None),
    "string": (STRING, "x" * 3, None), "bool": (BOOL, True, None), "int array": (ARRAY, [1, 2], INT32),
    "string array": (ARRAY, ["a"], STRING), "nested array": (ARRAY, [[1]], ARRAY), "removed": None,
}
SMALL = dict(n_layers=1, dim=32, n_heads=2, n_kv_heads=1, head_dim=16, ff=64, n_ctx=64)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # BPE and SPM vocabularies, all of base.py's keys
def test_every_metadata_key_with_every_wrong_value(tiny_model, tmp_path, arch):
    from gguf import GGUFReader

    src = tiny_model(arch, "Q8_0", **SMALL)
    keys = [f.name for f in GGUFReader(src).fields.values() if not f.name.startswith("GGUF.")]
    try_load = fuzz_tool().try_load
    outcomes: dict[str, int] = {}
    for key in keys:
        for name, new in WRONG_VALUES.items():
            path = tmp_path / "wrong.gguf"
            rewrite(src, path, key, new)
            try:
                outcome = try_load(path)
            except Exception as exc:  # the failure this test exists to find
                pytest.fail(f"{key} = {name}: {type(exc).__name__}: {exc}")
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert sum(outcomes.values()) == len(keys) * len(WRONG_VALUES) and outcomes.get("ok", 0) > 0


def _run_share(args: tuple) -> tuple[dict, list]:
    import logging
    import tempfile

    logging.getLogger("edgekv").setLevel(logging.CRITICAL)
    blob, n, seed = args
    tool = fuzz_tool()
    with tempfile.TemporaryDirectory() as folder:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        clean = Path(folder) / "clean.gguf"
        clean.write_bytes(blob)
        assert tool.try_load(clean) == "ok"
        warm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB, after one clean load
        counts, failures = tool.fuzz(blob, n, seed, Path(folder))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return counts, [(i, what) for i, what, _ in failures], (before, warm, peak)


def test_twenty_thousand_mutants_load_or_fail_cleanly(tmp_path):
    """Two processes of 10,000 seeded mutants each; peak memory stays that of a tiny model."""
    tool = fuzz_tool()
    blob = tool.tiny_blob("llama", tmp_path)
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        results = pool.map(_run_share, [(blob, 10_000, 1), (blob, 10_000, 2)])
    counts: dict[str, int] = {}
    for share, _, _ in results:
        for k, v in share.items():
            counts[k] = counts.get(k, 0) + v
    failures = [f for _, share, _ in results for f in share]
    assert not failures, f"{len(failures)} mutants broke the loader, e.g. {failures[:3]}"
    assert sum(counts.values()) == 20_000 and counts["ok"] > 1000 and counts["GGUFError"] > 1000, counts
    # no mutant made a process allocate more than a few times the file (38 KB): the peak
    # after 10,000 mutants is the peak after one clean load, within 2 x the file + 50 MB of
    # interpreter noise (measured growth: see tests/README.md)
    for _, _, (before, warm, peak) in results:
        assert peak - warm < (2 * len(blob)) // 1024 + 50_000, f"grew from {warm} to {peak} KiB"
