"""How many tokens to draft next, from measured acceptance and measured costs.

On a CPU a verify pass is not free: each extra row costs a share of a decode step (2 Zen 3
cores, SmolLM2-135M: 2 rows 1.7x one step, 8 rows 4.1x, 16 rows 7.2x; gemma3-270m, whose
262k-token output matrix is most of a row: 16 rows 6.2x), and a draft model's tokens cost its
own steps. A draft of k tokens pays off only when the expected output, 1 + a + a^2 + ... + a^k
tokens for a per-token acceptance a, outweighs its time T(k + 1) + k t_draft against one token
per T(1). `DraftLength` keeps:

- the acceptance: accepted drafts over tries (a try ends at a rejection), both decayed by
  DECAY per pass so the estimate follows the text (a quote, then free prose), starting from
  PRIOR_WEIGHT tries at the drafter's prior rate;
- the costs: T(n) = a + b n fitted by least squares to the loop's own clocks, plain steps
  (n = 1) and verify passes (n = k + 1) alike, each size's old timings decayed (`PassCost`);
  and the drafter's seconds per drafted token (a draft model's own steps, not its catch-up);
- the choice: the k in [max(1, n_min), room] with the best expected tokens per second.

When no k beats a plain step, the loop decodes plainly for `backoff` steps (1, 2, 4, ... up
to MAX_BACKOFF) and then probes with a draft of at most PROBE tokens, so a text that never
matches wastes at most PROBE rows every MAX_BACKOFF steps (benchmarks/speculative.py
measures it); a probe whose drafts were all kept ends the back-off. A drafter that costs
nothing (prompt lookup) is asked at every plain step too, and its first guess is scored
against the token that comes (`observed`): the acceptance follows the text without a pass, and
the back-off ends as soon as guessing would pay. Each generation call starts from the prior
acceptance again (`restart`), with the costs measured so far.
"""

from __future__ import annotations

DECAY = 0.7  # weight of the past acceptance per verify pass
SHADOW_DECAY = 0.85  # and per unverified guess of a free drafter (`observed`)
PRIOR_WEIGHT = 2.0  # tries the prior counts for
MAX_BACKOFF = 64  # plain steps between probes at most
PROBE = 2  # drafted tokens of a probe at most
COST_DECAY = 0.9  # weight of the past timings per new one
FIRST = 4  # drafted tokens of the passes that measure what a row costs


class PassCost:
    """T(n) = a + b n, seconds of a forward pass of n rows, fitted by weighted least squares to
    each size's decayed mean time. Decaying per size keeps what a verify pass costs through a
    long run of plain steps (one decay over all timings once let 64 plain steps erase the
    slope, and a verify pass looked free)."""

    def __init__(self):
        self.sizes: dict[int, tuple[float, float]] = {}  # n -> (weight, mean seconds)
        self.seen: set[int] = set()
        self.a = self.b = 0.0  # the line, fitted when a timing comes (the loop asks T(n) ~30 times a step)

    def add(self, n: int, seconds: float) -> None:
        if n not in self.seen:  # the first pass of a size pays for warming up (caches, first calls)
            self.seen.add(n)
            return
        w, mean = self.sizes.get(n, (0.0, 0.0))
        w = COST_DECAY * w + 1
        self.sizes[n] = (w, mean + (seconds - mean) / w)
        self._fit()

    def _fit(self) -> None:
        w = sum(v[0] for v in self.sizes.values())
        sn = sum(v[0] * k for k, v in self.sizes.items())
        snn = sum(v[0] * k * k for k, v in self.sizes.items())
        st = sum(v[0] * v[1] for v in self.sizes.values())
        snt = sum(v[0] * k * v[1] for k, v in self.sizes.items())
        var = snn * w - sn * sn
        self.b = max((snt * w - sn * st) / var, 0.0) if var > 1e-12 else 0.0
        self.a = (st - self.b * sn) / w

    @property
    def known(self) -> bool:
        """Both a plain step and a verify pass were timed."""
        return 1 in self.sizes and len(self.sizes) >= 2

    def __call__(self, n: int) -> float:
        return max(self.a + self.b * n, 1e-9)


class DraftLength:
    """adaptive=False: always draft as many as allowed (llama.cpp's fixed --draft-max)."""

    def __init__(self, n_max: int, n_min: int = 0, prior: float = 0.7, adaptive: bool = True):
        self.n_max, self.n_min, self.adaptive, self.prior = max(1, n_max), max(0, n_min), adaptive, prior
        self.cost = PassCost()
        self.t_draft = 0.0  # seconds per drafted token
        self.restart()

    def restart(self) -> None:
        """A new text (a generation call): acceptance from the prior again; the costs stay."""
        self.hits, self.tries = PRIOR_WEIGHT * self.prior, PRIOR_WEIGHT
        self.skip, self.backoff = 0, 1

    @property
    def acceptance(self) -> float:
        return self.hits / self.tries

    def gain(self, k: int) -> float:
        """Expected tokens per second of drafting k, relative to plain decoding (1.0: even)."""
        if k == 0 or not self.cost.known:
            return 1.0
        a = min(self.acceptance, 0.999)
        tokens = (1.0 - a ** (k + 1)) / (1.0 - a)
        return tokens * self.cost(1) / (self.cost(k + 1) + k * self.t_draft)

    def next(self, room: int) -> int:
        """How many tokens to draft now (0: a plain step); room: the most rows a pass may have."""
        lo, limit = max(1, self.n_min), min(self.n_max, room - 1)
        if limit < lo:
            return 0
        if not self.adaptive:
            return limit
        if self.skip:
            self.skip -= 1
            return 0
        if 1 not in self.cost.sizes:
            return 0  # plain steps first: the cost everything is measured against
        if not self.cost.known:
            return min(limit, max(lo, FIRST))  # then passes of a middling size, to measure a row
        best = max(range(lo, limit + 1), key=self.gain)
        if self.gain(best) > 1.0:
            self.backoff = 1
            return best
        probe = self.backoff > 1  # the skipped steps are over: look again, cheaply
        self.skip, self.backoff = self.backoff, min(2 * self.backoff, MAX_BACKOFF)
        return max(lo, min(PROBE, limit)) if probe else 0

    def observed(self, right: bool) -> None:
        """A free drafter's first guess, not verified, against the token that came: the
        acceptance follows the text while no pass runs, and a text that turns to copying ends
        the back-off at once."""
        self.hits = SHADOW_DECAY * self.hits + right
        self.tries = SHADOW_DECAY * self.tries + 1
        if self.skip and self.cost.known and self.gain(max(1, self.n_min)) > 1.0:
            self.skip, self.backoff = 0, 1

    def declined(self) -> None:
        """The drafter was asked and gave nothing (a draft model whose first guess fell below
        p_min): scored as a guess that failed, so that a text where the draft model is never sure
        backs off from asking it (each ask costs its catch-up and a step of its own)."""
        self.hits = DECAY * self.hits
        self.tries = DECAY * self.tries + 1

    def stepped(self, seconds: float) -> None:
        """A plain decode step took `seconds`."""
        self.cost.add(1, seconds)

    def drafted(self, n: int, seconds: float) -> None:
        """The drafter gave n tokens in `seconds`."""
        if n:
            self.t_draft = COST_DECAY * self.t_draft + (1 - COST_DECAY) * seconds / n if self.t_draft else seconds / n

    def verified(self, k: int, accepted: int, seconds: float) -> None:
        """A pass verified k drafts (k + 1 rows) in `seconds`; the first `accepted` were kept."""
        self.hits = DECAY * self.hits + accepted
        self.tries = DECAY * self.tries + accepted + (1 if accepted < k else 0)
        self.cost.add(k + 1, seconds)
        if accepted == k:  # a probe that came true: the text may have turned to copying, look at once
            self.skip, self.backoff = 0, 1
