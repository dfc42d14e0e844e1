"""The child process of test_interrupts.py: work that a SIGINT from the parent cuts at random
moments, and the checks that follow each cut.

    python tests/interrupt_driver.py rounds MODEL N_ROUNDS CACHE_K CACHE_V STATE_PATH
        Each round prints `go ROUND PHASE`, then repeats PHASE's work until a SIGINT arrives
        (the parent sends one after a random delay), checks the session and prints one JSON
        line: {"round", "phase", "landed" (where the signal arrived), "failures": [...]}.
        Phases: prefill (chunks of 9..30 tokens, n_batch 8), decode (one token at a time),
        both overflowing the context once full; shift (decode in a full context: every token
        makes a context shift, n_discard 1; the child sends itself the SIGINT from inside a
        shift, after a random layer, and prints `go ROUND shift self`); save (save_session
        over the same file).
    python tests/interrupt_driver.py saves MODEL STATE_PATH
        Saves two different sessions over STATE_PATH in turn, forever (the parent kills it
        with SIGKILL); prints `saving` when the first save is done.

The checks after a cut: cache.n_tokens == len(tokens); every layer's positions unique, a
full layer's exactly 0..n_tokens-1; and a control session that did the same completed
work without interruption (the chunks the interrupted one recorded before each call,
replayed from the token stream until its n_evaluated matches, and the context shift made
for a chunk that was then cut: a shift is whole work, kept) holds the same tokens, slot positions, ring
pointers, K/V rows of every live slot (of a ring: every slot a later query can see) and
logits, bit for bit. After a cut save: the file is whole (it loads into a third session,
holding the session's tokens or, if no save finished this round, the last round's) and no
temporary is left.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import numpy as np

from edgekv.loader import load
from edgekv.state_file import load_session, model_fingerprint, save_session

N_CTX, N_BATCH, N_KEEP, N_DISCARD = 256, 8, 4, 1
PHASES = ("prefill", "decode", "shift", "save")


def where(frame) -> str:
    """Which part of the work a signal arrived in, from the frame it arrived in."""
    names = set()
    while frame is not None:
        names.add(frame.f_code.co_name)
        frame = frame.f_back
    for part, marks in (("context shift", {"_make_room", "discard"}), ("state save", {"save_session"}),
                        ("forward pass", {"forward"}), ("bookkeeping", {"_eval_chunk", "reserve", "commit"})):
        if names & marks:
            return part
    return "between calls"


class Rounds:
    def __init__(self, model_path: str, cache_k: str, cache_v: str, state_path: str):
        self.model = load(model_path)
        self.fingerprint = model_fingerprint(self.model)
        self.path = state_path
        make = lambda: self.model.session(n_ctx=N_CTX, n_batch=N_BATCH, cache_type_k=cache_k, cache_type_v=cache_v,
                                          context_shift="shift", n_keep=N_KEEP, n_discard=N_DISCARD)
        self.s, self.control, self.check = make(), make(), make()
        self.stream = np.random.default_rng(1).integers(1, self.model.hp.n_vocab, 1_000_000).tolist()
        # the chunks the interrupted session was asked to evaluate, by where they start in the
        # stream (a later request from the same place replaces one that never ran)
        self.chunks: dict[int, int] = {}
        self.rng = np.random.default_rng(2)
        self.landed = ""
        self.saved: list[int] | None = None  # the tokens in the state file at the last check
        signal.signal(signal.SIGINT, self._interrupt)

    def _interrupt(self, signum, frame) -> None:
        self.landed = where(frame)
        raise KeyboardInterrupt

    def work(self, phase: str) -> None:
        """PHASE's work, forever (until a KeyboardInterrupt)."""
        s = self.s
        if phase == "shift":
            self.interrupt_inside_a_shift()
        while True:
            if phase == "save":
                save_session(s, self.fingerprint, self.path)
                continue
            self.evaluate(1 if phase in ("decode", "shift") else int(self.rng.integers(9, 31)))

    def interrupt_inside_a_shift(self) -> None:
        """Have the SIGINT sent from inside a context shift, after a random layer of one of
        the next three shifts: a signal from the parent lands there only by chance (a shift
        is ~30% of a token's time), this one always does."""
        net = self.model.network
        shift_keys, fire_at, calls = type(net).shift_keys, int(self.rng.integers(3 * net.hp.n_layers)), [0]

        def shift_then_maybe_interrupt(layer, k, delta, n_ctx=0):
            shift_keys(net, layer, k, delta, n_ctx)
            calls[0] += 1
            if calls[0] == fire_at + 1:
                del net.shift_keys  # the class's again; the signal is handled after this returns
                os.kill(os.getpid(), signal.SIGINT)

        net.shift_keys = shift_then_maybe_interrupt

    def evaluate(self, n: int) -> None:
        """The next n tokens of the stream, its chunks recorded first (for the control)."""
        p = self.s.n_evaluated
        self.chunks.update((p + i, min(N_BATCH, n - i)) for i in range(0, n, N_BATCH))
        self.s.eval(self.stream[p : p + n])

    def verify(self, phase: str) -> list[str]:
        s, c, failures = self.s, self.control, []
        if s.cache.n_tokens != len(s.tokens):
            failures.append(f"cache.n_tokens {s.cache.n_tokens} != len(tokens) {len(s.tokens)}")
        for layer, pos in enumerate(s.cache.pos):
            live = pos[pos >= 0]
            if np.unique(live).size != live.size:
                failures.append(f"layer {layer}: a position in two slots")
            if not s.cache.windows[layer] and not np.array_equal(np.sort(live), np.arange(s.n_tokens)):
                failures.append(f"layer {layer}: positions are not 0..{s.n_tokens - 1}")
        while c.n_evaluated < s.n_evaluated:
            q = c.n_evaluated
            c.eval(self.stream[q : q + self.chunks[q]])
        if s.n_discarded > c.n_discarded:  # the cut chunk's context shift was done, and is kept
            c._make_room(self.chunks[c.n_evaluated])
        if c.n_evaluated != s.n_evaluated:
            return failures + [f"the control evaluated {c.n_evaluated} tokens, the session {s.n_evaluated}"]
        failures += self._compare(s, c)
        if phase == "save":
            failures += self._check_file()
        return failures

    @staticmethod
    def _compare(s, c) -> list[str]:
        failures = []
        if s.tokens != c.tokens:
            failures.append("tokens differ from the control's")
        if not (np.array_equal(s.cache.cur, c.cache.cur) and s.cache.n_tokens == c.cache.n_tokens):
            failures.append("ring pointers differ from the control's")
        for layer, (pos, cpos) in enumerate(zip(s.cache.pos, c.cache.pos)):
            window = s.cache.windows[layer]
            if window:  # a ring: a cut chunk's slots are freed, and the old positions they overwrote
                # are gone; they were out of every later query's window, so compare what is in it
                first = max(0, s.n_tokens - window)
                seen = (pos >= first) | ((pos >= 0) & (pos < s.cache.n_keep))
                same = np.array_equal(seen, (cpos >= first) | ((cpos >= 0) & (cpos < s.cache.n_keep)))
                same = same and np.array_equal(pos[seen], cpos[seen])
            else:
                seen = pos >= 0
                same = np.array_equal(pos, cpos)
            if not same:
                failures.append(f"layer {layer}: slot positions differ from the control's")
                continue
            for name, a, b in (("K", s.cache.k[layer], c.cache.k[layer]), ("V", s.cache.v[layer], c.cache.v[layer])):
                if not np.array_equal(a[:, seen], b[:, seen]):
                    failures.append(f"layer {layer}: {name} rows differ from the control's")
        if s._has_logits != c._has_logits or (s._has_logits and not np.array_equal(s.logits, c.logits)):
            failures.append("logits differ from the control's")
        return failures

    def _check_file(self) -> list[str]:
        failures = []
        if os.path.exists(self.path + ".tmp"):
            failures.append("the temporary file was left behind")
        if os.path.exists(self.path):
            try:
                load_session(self.check, self.fingerprint, self.path)
            except Exception as exc:  # noqa: BLE001 - reported, not raised: the parent counts it
                return failures + [f"the state file does not load: {exc}"]
            if self.check.tokens not in (self.s.tokens, self.saved):  # this round's save, or the last round's
                failures.append("the state file holds neither the session's tokens nor the last save's")
            self.saved = list(self.check.tokens)
        return failures

    def run(self, n_rounds: int) -> None:
        for r in range(n_rounds):
            phase = PHASES[r % len(PHASES)]
            self.landed = ""
            while phase == "shift" and self.s.n_tokens < N_CTX:  # every token of the phase shifts
                self.evaluate(N_BATCH)
            try:
                print(f"go {r} {phase}" + (" self" if phase == "shift" else ""), flush=True)
                self.work(phase)
            except KeyboardInterrupt:
                pass
            try:
                failures = self.verify(phase)
            except Exception as exc:  # noqa: BLE001 - an exception here is a finding, reported
                failures = [f"{type(exc).__name__}: {exc}"]
            print(json.dumps(dict(round=r, phase=phase, landed=self.landed, failures=failures)), flush=True)


def saves(model_path: str, path: str) -> None:
    model = load(model_path)
    fingerprint = model_fingerprint(model)
    a, b = model.session(n_ctx=N_CTX), model.session(n_ctx=N_CTX)
    a.eval([1, 2, 3])
    b.eval(list(range(10, 40)))
    save_session(a, fingerprint, path)
    print("saving", flush=True)
    while True:
        save_session(b, fingerprint, path)
        save_session(a, fingerprint, path)


if __name__ == "__main__":
    if sys.argv[1] == "rounds":
        Rounds(sys.argv[2], sys.argv[4], sys.argv[5], sys.argv[6]).run(int(sys.argv[3]))
    else:
        saves(sys.argv[2], sys.argv[3])
