"""Interrupted work (issue 16, item 5): 100 SIGINTs (what Ctrl-C sends) at random moments of
prefill, decode, context shifts and state saves, and SIGKILLs during state saves. After each
SIGINT the session must equal, bit for bit, a control session that did the same completed
work without interruption (interrupt_driver.py says what is compared); after each SIGKILL
the state file must be a whole earlier save."""

from __future__ import annotations

import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgekv.loader import load
from edgekv.state_file import load_session, model_fingerprint
from interrupt_driver import N_CTX

pytestmark = pytest.mark.long  # SIGINTs and SIGKILLs at random moments in child processes

DRIVER = str(Path(__file__).with_name("interrupt_driver.py"))
WAIT_S = 120  # the longest the child may take to answer: then the test fails
MAX_DELAY_S = {"prefill": 0.03, "decode": 0.03, "save": 0.01}
N_KILLS = 6


class Child:
    """A driver process whose stdout lines arrive through a queue (a read that waits at most WAIT_S)."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, DRIVER, *args], stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def line(self) -> str:
        try:
            line = self.lines.get(timeout=WAIT_S)
        except queue.Empty:
            pytest.fail(f"the driver said nothing for {WAIT_S} s")
        assert line is not None, f"the driver exited (status {self.proc.wait()})"
        return line

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.mark.parametrize("arch, cache_k, cache_v, seed", [("llama", "f16", "f16", 1), ("gemma3", "q8_0", "q4_0", 2)])
def test_fifty_sigints_at_random_moments_leave_the_session_whole(tiny_model, tmp_path, arch, cache_k, cache_v, seed):
    # gemma3: sliding-window layers (rings) beside full ones; quantized caches re-rotate K on a shift
    model = str(tiny_model(arch, head_dim=32, dim=64, n_heads=2, n_kv_heads=1))
    rng = np.random.default_rng(seed)
    child = Child("rounds", model, "50", cache_k, cache_v, str(tmp_path / "state.ekv"))
    results = []
    try:
        for r in range(50):
            go = child.line().split()
            assert go[:2] == ["go", str(r)]
            if go[-1] != "self":  # the shift phase interrupts itself, from inside a shift
                time.sleep(rng.uniform(0, MAX_DELAY_S[go[2]]))
                os.kill(child.proc.pid, signal.SIGINT)
            results.append(json.loads(child.line()))
        assert child.proc.wait(WAIT_S) == 0
    finally:
        child.close()
    failed = [r for r in results if r["failures"]]
    landed = collections.Counter(r["landed"] for r in results)
    print(f"{arch}: 50 interrupts landed in {dict(landed)}")
    assert not failed, f"{len(failed)} of 50 interrupts broke the session, e.g. {failed[:3]}"
    assert landed["forward pass"] > 0 and landed["state save"] > 0 and landed["context shift"] > 0


def test_sigkill_during_state_saves_leaves_a_whole_earlier_save(tiny_model, tmp_path):
    path = str(tmp_path / "state.ekv")
    model_path = str(tiny_model())
    model = load(model_path)
    check = model.session(n_ctx=N_CTX)
    rng = np.random.default_rng(3)
    found = collections.Counter()
    for _ in range(N_KILLS):
        child = Child("saves", model_path, path)
        try:
            assert child.line() == "saving"
            time.sleep(rng.uniform(0, 0.05))
            child.proc.send_signal(signal.SIGKILL)
            child.proc.wait(WAIT_S)
        finally:
            child.close()
        load_session(check, model_fingerprint(model), path)  # raises StateFileError if not whole
        assert check.tokens in ([1, 2, 3], list(range(10, 40)))
        found[len(check.tokens)] += 1
    assert sum(found.values()) == N_KILLS
