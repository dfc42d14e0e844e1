"""`edgekv inspect FILE [--json] [--check-tensors]`: what a GGUF file holds and what is wrong
with it, without loading its weights.

What lives here: the command's options and its text layout. Exit status 0 when the file
would load, 1 when the report lists problems. What does not: the report itself
(gguf/inspection.py).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

TEMPLATE_LINES = 40  # a longer chat template is cut in the text output (--json has it whole)


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("inspect", parents=[common], help="show a GGUF file's metadata, tensors and problems",
                       description="Show a GGUF file's metadata (long arrays elided), its tensors with type, "
                                   "shape, size and bits per weight, totals per type, the chat template, and "
                                   "every problem that would stop edgekv from loading it. Weights are not "
                                   "loaded. Exit status 1 when problems are found.")
    p.add_argument("file", help="the GGUF file")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--check-tensors", action="store_true",
                   help="also read every tensor and report NaN or inf in values or block scales")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..gguf.inspection import inspect_gguf

    report = inspect_gguf(args.file, check_tensors=args.check_tensors)
    if args.json:
        print(json.dumps(report, indent=1, ensure_ascii=False))
    else:
        print("\n".join(text_lines(report)))
    return 1 if report["problems"] else 0


def _value(v: Any) -> str:
    if isinstance(v, dict) and "array_length" in v:
        head = ", ".join(_value(x) for x in v["first"])
        return f"[{head}, ...] ({v['array_length']} items)"
    if isinstance(v, str):
        return json.dumps(v if len(v) <= 120 else v[:117] + "...", ensure_ascii=False)
    if isinstance(v, float):
        return f"{v:.7g}"  # float32 keys read as doubles: 1e-05, not 9.999999747378752e-06
    return json.dumps(v, ensure_ascii=False) if isinstance(v, list) else str(v)


def text_lines(r: dict[str, Any]) -> list[str]:
    """The report as a person reads it."""
    size = r["file_bytes"]
    lines = [f"file: {r['file']} ({size:,} bytes)" if size is not None else f"file: {r['file']}"]
    if "metadata" in r:
        lines.append(f"GGUF version {r['version']}, architecture {r['architecture']}, {len(r['metadata'])} "
                     f"metadata keys, {len(r['tensors'])} tensors, {r['values']:,} parameters, "
                     f"{r['tensor_bytes']:,} bytes of tensor data")
        lines += ["", "metadata:"] + [f"  {k} = {_value(v)}{_file_type_name(k, v)}" for k, v in r["metadata"].items()]
        width = max((len(t["name"]) for t in r["tensors"]), default=4)
        lines += ["", f"tensors:\n  {'name'.ljust(width)}  {'type':<6} {'shape':<20} {'bytes':>14}  bits/weight"]
        lines += [f"  {t['name'].ljust(width)}  {t['type']:<6} {str(t['shape']):<20} {t['bytes']:>14,}  "
                  f"{t['bits_per_weight']:.2f}" for t in r["tensors"]]
        lines += ["", "totals per type:"]
        lines += [f"  {name:<6} {t['tensors']:>5} tensors {t['values']:>15,} values {t['bytes']:>15,} bytes "
                  f"({8 * t['bytes'] / max(t['values'], 1):.2f} bits/weight)" for name, t in r["totals"].items()]
        template = r["chat_template"]
        if template is None:
            lines += ["", "chat template: none (edgekv falls back to ChatML or Gemma's format)"]
        else:
            shown = template.splitlines()
            cut = len(shown) > TEMPLATE_LINES
            lines += ["", f"chat template ({len(template):,} characters):"]
            lines += ["  " + s for s in shown[:TEMPLATE_LINES]] + (["  ... (--json shows it whole)"] if cut else [])
    problems = r["problems"]
    lines += ["", f"problems: {len(problems)}" if problems else "problems: none (edgekv can load this file)"]
    lines += [f"  - {p}" for p in problems]
    return lines


def _file_type_name(key: str, value: Any) -> str:
    # general.file_type is a number; say which (" (MOSTLY_Q4_K_M)")
    if key != "general.file_type" or not isinstance(value, int):
        return ""
    from gguf import LlamaFileType

    try:
        return f" ({LlamaFileType(value).name})"
    except ValueError:
        return " (unknown file type)"
