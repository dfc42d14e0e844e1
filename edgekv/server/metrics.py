"""What `edgekv serve` counts, and `/metrics` in Prometheus' text format.

What lives here: `ServerStats` (requests and tokens, summed over finished generations) and
`prometheus_text`, which writes every counter and gauge of the server (its stats, the
generation queue, the step scheduler, the session pool) in the text exposition format
0.0.4, names prefixed `edgekv_`. A handful of lines needs no client library.
What does not: the counting done elsewhere (queue.py, scheduler.py, sessions.py).
"""

from __future__ import annotations

import threading
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerStats:
    """Sums over finished generations (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests = self.failed = 0
        self.prompt_tokens_evaluated = self.prompt_tokens_cached = self.tokens_predicted = 0
        self.prompt_seconds = self.predicted_seconds = 0.0

    def record(self, stats: Any) -> None:
        """One generation's GenerationStats (api/responses.py)."""
        with self._lock:
            self.requests += 1
            self.prompt_tokens_evaluated += stats.prompt_eval_tokens
            self.prompt_tokens_cached += stats.prompt_cached
            self.tokens_predicted += stats.gen_tokens
            self.prompt_seconds += stats.prompt_eval_s
            self.predicted_seconds += stats.gen_s

    def record_failure(self) -> None:
        with self._lock:
            self.failed += 1


# name -> (type, help); the values come from `prometheus_text`'s arguments
_METRICS = {
    "requests_total": ("counter", "generations finished"),
    "requests_failed_total": ("counter", "generations that ended in an error"),
    "requests_processing": ("gauge", "generations running now"),
    "requests_deferred": ("gauge", "requests waiting for a worker"),
    "prompt_tokens_total": ("counter", "prompt tokens run through the model"),
    "prompt_tokens_cached_total": ("counter", "prompt tokens a session's cache already held"),
    "tokens_predicted_total": ("counter", "tokens generated"),
    "prompt_seconds_total": ("counter", "seconds spent on prompts, summed over requests"),
    "tokens_predicted_seconds_total": ("counter", "seconds spent generating, summed over requests"),
    "prompt_tokens_seconds": ("gauge", "average prompt throughput of a request, tokens/s"),
    "predicted_tokens_seconds": ("gauge", "average generation throughput of a request, tokens/s"),
    "decode_steps_total": ("counter", "batched decode passes run"),
    "decode_step_tokens_total": ("counter", "tokens decoded in those passes"),
    "decode_batch_max": ("gauge", "the most sessions decoded in one pass so far"),
    "prefill_chunks_total": ("counter", "prompt chunks run"),
    "sessions_live": ("gauge", "conversations whose KV cache is in memory"),
    "sessions_spilled": ("gauge", "conversations whose KV cache waits on disk"),
    "kv_cache_bytes": ("gauge", "bytes of the live conversations' KV caches"),
    "kv_budget_bytes": ("gauge", "bytes the live KV caches may take (--kv-budget)"),
    "spill_bytes": ("gauge", "bytes of spill files on disk"),
    "spills_total": ("counter", "conversations written to disk to make room"),
    "restores_total": ("counter", "conversations read back from disk"),
    "spill_errors_total": ("counter", "spill files that could not be written or read (re-evaluated instead)"),
    "sessions_dropped_total": ("counter", "conversations forgotten (spill space full, or no spill dir)"),
}


def prometheus_text(stats: ServerStats, queue: Any, scheduler: Any, pool: Any, power: Any = None) -> str:
    """The exposition text of every metric above; with a power monitor (board/power.py), the
    power now and the energy since the server started, labelled with their source."""
    totals = pool.totals()
    with stats._lock:
        values = {
            "requests_total": stats.requests, "requests_failed_total": stats.failed,
            "prompt_tokens_total": stats.prompt_tokens_evaluated,
            "prompt_tokens_cached_total": stats.prompt_tokens_cached,
            "tokens_predicted_total": stats.tokens_predicted, "prompt_seconds_total": stats.prompt_seconds,
            "tokens_predicted_seconds_total": stats.predicted_seconds,
            "prompt_tokens_seconds": _rate(stats.prompt_tokens_evaluated, stats.prompt_seconds),
            "predicted_tokens_seconds": _rate(stats.tokens_predicted, stats.predicted_seconds),
        }
    values.update({
        "requests_processing": queue.running, "requests_deferred": queue.waiting,
        "decode_steps_total": scheduler.steps, "decode_step_tokens_total": scheduler.step_tokens,
        "decode_batch_max": scheduler.max_rows, "prefill_chunks_total": scheduler.prefill_chunks,
        "sessions_live": totals["live"], "sessions_spilled": totals["spilled"], "kv_cache_bytes": totals["kv_bytes"],
        "kv_budget_bytes": pool.kv_budget, "spill_bytes": totals["spill_bytes"], "spills_total": totals["spills"],
        "restores_total": totals["restores"], "spill_errors_total": totals["spill_errors"],
        "sessions_dropped_total": totals["dropped"],
    })
    lines = []
    for name, (kind, text) in _METRICS.items():
        lines += [f"# HELP edgekv_{name} {text}", f"# TYPE edgekv_{name} {kind}", f"edgekv_{name} {values[name]}"]
    if power is not None:
        label = '{source="' + power.source.replace("\\", "\\\\").replace('"', '\\"') + '"}'
        lines += ["# HELP edgekv_power_watts the machine's power at the last reading, watts",
                  "# TYPE edgekv_power_watts gauge", f"edgekv_power_watts{label} {round(power.watts, 3)}",
                  "# HELP edgekv_energy_joules_total energy used since the server started, joules",
                  "# TYPE edgekv_energy_joules_total counter", f"edgekv_energy_joules_total{label} {round(power.joules, 3)}"]
    return "\n".join(lines) + "\n"


def _rate(n: int, seconds: float) -> float:
    return round(n / seconds, 3) if seconds > 0 else 0.0
