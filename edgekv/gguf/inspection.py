"""What a GGUF file holds and what is wrong with it, without loading its weights.

What lives here: `inspect_gguf(path, check_tensors=False) -> dict`: the header, metadata
(long arrays elided), every tensor with type, shape, bytes and bits per weight, totals per
type, the chat template, and `problems`: every reason the loader would refuse the file,
found the way the loader finds them (the validating parser, the architecture's
hyperparameter and shape checks, the tokenizer, the template compiler) but with a backend
that keeps only each matrix's shape, so no weight is read. check_tensors also reads every
tensor once for NaN/inf (values, or block scales). Never raises for a bad file: a problem
is a line in the report. What does not: printing it (cli/inspect.py), loading (loader.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..backends.cpu import CPUBackend
from ..errors import EdgeKVError
from .reader import GGUFFile
from .quants import QUANT_TYPES, non_finite_tensors

SHOWN_ITEMS = 8  # an array longer than this is shown as its length and first items


@dataclass(frozen=True)
class WeightShape:
    """What ShapesOnly keeps of a weight: enough for a model's constructor, no data."""

    ggml_type: int
    n_rows: int
    n_cols: int
    uses_int8dot: bool = False


class ShapesOnly(CPUBackend):
    """A backend that checks and keeps each weight's shape but never reads its bytes."""

    def __init__(self) -> None:
        super().__init__("shapes-only", use_int8dot=False)

    def weight(self, raw: np.ndarray, ggml_type: int, n_rows: int, n_cols: int,
               release: Callable[[np.ndarray], None] | None = None, store=None) -> WeightShape:
        return WeightShape(int(ggml_type), int(n_rows), int(n_cols))

    def share_input(self, ws) -> None:
        pass  # no data to store together

    def tied_output(self, w) -> None:
        pass  # no products to order


def _shown(value: Any) -> Any:
    """A metadata value as a report shows it: long arrays elided to their length and head."""
    if isinstance(value, (list, tuple)) and len(value) > SHOWN_ITEMS:
        return {"array_length": len(value), "first": [_shown(v) for v in value[:SHOWN_ITEMS]]}
    if isinstance(value, (list, tuple)):
        return [_shown(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)  # JSON has no NaN or inf
    return value


def _type_name(ggml_type: int) -> str:
    q = QUANT_TYPES.get(int(ggml_type))
    return q.name if q else f"type {ggml_type} (unsupported)"


def _tensors(g: GGUFFile) -> tuple[list[dict], dict[str, dict]]:
    rows, totals = [], {}
    for t in g.tensors.values():
        n = int(np.prod(t.shape, dtype=np.int64))
        name = _type_name(t.ggml_type)
        rows.append(dict(name=t.name, type=name, shape=list(map(int, t.shape)), values=n, bytes=int(t.data.nbytes),
                         bits_per_weight=round(8 * t.data.nbytes / n, 4) if n else 0.0))
        total = totals.setdefault(name, dict(tensors=0, values=0, bytes=0))
        total["tensors"] += 1
        total["values"] += n
        total["bytes"] += int(t.data.nbytes)
    return rows, totals


def _model_problems(g: GGUFFile) -> list[str]:
    """Why the loader would refuse a well-formed file: architecture, hyperparameters,
    tensor names/shapes/types, tokenizer, chat template (each checked as loading does)."""
    from ..models import build_model
    from ..text.chat_format import ChatFormatter
    from ..text.tokenizer import Tokenizer

    problems = []
    try:
        build_model(g, ShapesOnly())
    except EdgeKVError as exc:
        problems.append(str(exc))
    try:
        tokenizer = Tokenizer.from_gguf(g.metadata)
    except EdgeKVError as exc:
        return problems + [str(exc)]
    try:
        ChatFormatter.from_gguf(g.metadata, tokenizer)
    except EdgeKVError as exc:
        problems.append(str(exc))
    return problems


def inspect_gguf(path: str | os.PathLike, check_tensors: bool = False) -> dict[str, Any]:
    """The report on one GGUF file (see the module docstring); JSON-serializable."""
    path = os.fspath(path)
    report: dict[str, Any] = dict(file=path, file_bytes=os.path.getsize(path) if os.path.isfile(path) else None)
    try:
        g = GGUFFile(path)
    except EdgeKVError as exc:  # the structure itself: nothing past the first fault can be read
        return dict(report, problems=[str(exc)])
    tensors, totals = _tensors(g)
    template = g.metadata.get("tokenizer.chat_template")
    report.update(version=g.version, architecture=g.metadata.get("general.architecture"),
                  metadata={k: _shown(v) for k, v in g.metadata.items() if k != "tokenizer.chat_template"},
                  tensors=tensors, totals=totals, values=sum(t["values"] for t in tensors),
                  tensor_bytes=sum(t["bytes"] for t in tensors),
                  chat_template=template if isinstance(template, str) else None)
    problems = _model_problems(g)
    if check_tensors:
        problems += [f"tensor {name!r} holds {n} NaN or inf (values or block scales)"
                     for name, n in non_finite_tensors(g).items()]
    report["problems"] = problems
    return report
