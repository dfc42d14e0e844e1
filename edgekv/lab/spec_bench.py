"""`edgekv bench` with speculative decoding: greedy decode, plain and speculative, side by side.

llama-bench times random ids, which no drafter can guess: a speculative figure needs text. The
test renders a prompt (a file's text, default `DEFAULT_PROMPT`: an edit of a code snippet,
which a model answers by copying) as one user turn with the model's chat template, then
decodes n tokens greedily (end tokens ignored) without and with the drafter, alternating, r
times; the two texts must be equal (SpecBenchError otherwise: speculation that changed the text
is a bug, not a speed). benchmarks/speculative.py is the fuller comparison, llama.cpp beside it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ..errors import EdgeKVError

DEFAULT_PROMPT = """Rename the function `area` to `rectangle_area` and give back the whole code:

```python
def area(width, height):
    \"\"\"The area of a width x height rectangle.\"\"\"
    if width < 0 or height < 0:
        raise ValueError("sides must not be negative")
    return width * height


def total_area(rectangles):
    \"\"\"The summed area of (width, height) pairs.\"\"\"
    return sum(area(w, h) for w, h in rectangles)
```"""


@dataclass
class SpecResult:
    model: str
    drafter: str
    n_gen: int
    plain_ts: list[float] = field(default_factory=list)
    spec_ts: list[float] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0

    @property
    def speedup(self) -> float:
        return statistics.mean(self.spec_ts) / statistics.mean(self.plain_ts)

    def record(self) -> dict[str, Any]:
        return dict(model=self.model, drafter=self.drafter, n_gen=self.n_gen,
                    plain_avg_ts=statistics.mean(self.plain_ts), spec_avg_ts=statistics.mean(self.spec_ts),
                    plain_samples_ts=self.plain_ts, spec_samples_ts=self.spec_ts, speedup=self.speedup,
                    draft_n=self.drafted, draft_n_accepted=self.accepted)

    def md_row(self) -> str:
        share = f" ({100 * self.accepted / self.drafted:.0f}%)" if self.drafted else ""
        return (f"| {self.model} | {self.drafter} | tg{self.n_gen} | {statistics.mean(self.plain_ts):.2f} | "
                f"{statistics.mean(self.spec_ts):.2f} | {self.speedup:.2f}x | {self.accepted}/{self.drafted}{share} |")


MD_HEAD = ("| model | drafter | test | plain t/s | speculative t/s | speed-up | accepted |\n"
           "|---|---|---|---:|---:|---:|---:|")


def run_spec_bench(plain, spec, prompt: str, n_gen: int, repetitions: int) -> SpecResult:
    """plain, spec: Llamas of the same model, spec with a draft_model (a speculative.Speculation)."""
    text = plain.chat_formatter.render([{"role": "user", "content": prompt}])
    speculation = spec._speculation
    result = SpecResult(plain._model.name, speculation.describe(), n_gen)
    first = None
    for _ in range(repetitions):
        for llm, into in ((plain, result.plain_ts), (spec, result.spec_ts)):
            out = llm.create_completion(text, max_tokens=n_gen, temperature=0.0, ignore_eos=True)
            got = out["choices"][0]["text"]
            if first is None:
                first = got
            elif got != first:
                raise EdgeKVError("speculative decoding changed the greedy text: please report this as a bug")
            into.append(llm.last_stats.gen_tokens_per_s)
            if llm is spec:
                result.drafted += llm.last_stats.draft_n or 0
                result.accepted += llm.last_stats.draft_n_accepted or 0
    return result
