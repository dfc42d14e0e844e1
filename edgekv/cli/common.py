"""Options the edgekv commands share (model, context, threads, sampling) and small output helpers.

What lives here: adding those options to a subparser with llama.cpp's flag names, building a
`Llama` from them, and formatting generation statistics. What does not: any command.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..api.facade import Llama
    from ..api.responses import GenerationStats


def ctx_size(text: str) -> int | str:
    """-c: a positive integer or 'auto'."""
    return text if text == "auto" else _positive_int(text, "a positive integer or 'auto'")


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def layer_window_spec(text: str) -> str:
    """--layer-window: checked for syntax here (exit 2); layer numbers once the model is known."""
    from ..kv.plan import parse_layer_windows
    from ..errors import EdgeKVError

    try:
        parse_layer_windows(text)
    except EdgeKVError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def mem_size(text: str) -> int:
    from ..kv.memory import parse_size
    from ..errors import EdgeKVError

    try:
        return parse_size(text)
    except EdgeKVError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def json_object(text: str) -> dict:
    """A JSON object on the command line, e.g. --chat-template-kwargs '{"enable_thinking": false}'."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({exc.msg}); expected an object like "
                                         "'{\"enable_thinking\": false}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is JSON but not an object {{...}}")
    return value


def read_text_file(path: str) -> bytes:
    """The bytes of a text file a command scores, or EdgeKVError saying why it cannot be read."""
    from ..errors import EdgeKVError

    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise EdgeKVError(f"cannot read {path}: {exc.strerror or exc}") from exc


def positive_int(text: str) -> int:
    return _positive_int(text, "a positive integer")


def _positive_int(text: str, expected: str) -> int:
    """int(text) if >= 1; otherwise an argparse error saying `expected` and what was given."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def add_model_options(p: argparse.ArgumentParser, model_required: bool = True, ctx_default: int | str = "auto",
                      ctx_auto: bool = True) -> None:
    """-m, -c, -b, -t, -ctk, -ctv; ctx_auto=False: -c must be a number."""
    p.add_argument("-m", "--model", required=model_required,
                   help="GGUF file or catalog name (see `edgekv list`)" +
                   ("" if model_required else "; default: the catalog's default model"))
    auto = ", or 'auto'" if ctx_auto else ""
    p.add_argument("-c", "--ctx-size", type=ctx_size if ctx_auto else positive_int, default=ctx_default,
                   help=f"context size in tokens{auto} (default: {ctx_default})")
    p.add_argument("-b", "--batch-size", type=positive_int, default=512, help="prompt chunk size (default: 512)")
    p.add_argument("-t", "--threads", type=int, default=None, help="threads (default: all cores)")
    p.add_argument("-ctk", "--cache-type-k", default="f16",
                   help="KV cache type for K, or a per-layer mix such as q8_0:2+q4_0+q8_0:2 (default: f16)")
    p.add_argument("-ctv", "--cache-type-v", default="f16",
                   help="KV cache type for V, or a per-layer mix (default: f16)")
    add_backend_option(p)


def add_backend_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default=None, metavar="NAME",
                   help="where the arithmetic runs: auto, cpu, cpu-portable, cuda (default: $EDGEKV_BACKEND or auto)")


CONTEXT_SHIFTS = ("none", "shift", "stream", "keep")


def add_kv_options(p: argparse.ArgumentParser, shift_default: str | None = "none", budget: bool = True) -> None:
    """--context-shift, --keep (when shift_default is not None), --layer-window, --mem-budget."""
    if shift_default is not None:
        why = {"shift": "; chat shifts by default, as llama-cli in interactive mode",
               "none": "; run stops at a full context by default"}.get(shift_default, "")
        p.add_argument("--context-shift", choices=CONTEXT_SHIFTS, default=shift_default, metavar="POLICY",
                       help="what a full context does: none (stop with a context-full error), shift (llama.cpp: "
                            "keep --keep tokens, drop half of the others), stream (StreamingLLM: --keep sinks "
                            "(default 4) + a sliding window), keep (--keep sinks (default 4) + the tokens "
                            f"attention uses most + a recent window) (default: {shift_default}{why})")
        p.add_argument("--keep", type=non_negative_int, default=0, metavar="N",
                       help="tokens at the start a context shift keeps (default: 0)")
    p.add_argument("--layer-window", metavar="SPEC", type=layer_window_spec, default=None,
                   help="layers that keep only a window of tokens, e.g. 0-9:512,12:256 (default: none)")
    if budget:
        p.add_argument("--mem-budget", metavar="SIZE", type=mem_size, default=None,
                       help="memory the KV cache may take with -c auto, e.g. 512M, 2G "
                            "(default: half of what the available memory leaves beside the weights and the runtime)")


def add_sampling_options(p: argparse.ArgumentParser, n_predict_default: int = -1) -> None:
    """-n, --temp, --top-k, --top-p, --min-p, penalties, --seed (llama.cpp's defaults)."""
    p.add_argument("-n", "--n-predict", type=int, default=n_predict_default,
                   help=f"tokens to generate, -1 = until the end of the text or a full context "
                        f"(default: {n_predict_default})")
    p.add_argument("--temp", type=float, default=0.8, help="temperature, <= 0 is greedy (default: 0.8)")
    p.add_argument("--top-k", type=int, default=40, help="top-k sampling, <= 0 = off (default: 40)")
    p.add_argument("--top-p", type=float, default=0.95, help="top-p sampling, 1.0 = off (default: 0.95)")
    p.add_argument("--min-p", type=float, default=0.05, help="min-p sampling, 0.0 = off (default: 0.05)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="repetition penalty, 1.0 = off (default: 1.0)")
    p.add_argument("--repeat-last-n", type=int, default=64,
                   help="tokens the penalties look back over, -1 = all (default: 64)")
    p.add_argument("--presence-penalty", type=float, default=0.0, help="(default: 0.0)")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="(default: 0.0)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed, -1 = random (default: 0, runs repeat)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="never end the text with an end-of-generation token: only -n, a stop string or a "
                        "full context ends it (for long benchmark and test runs)")


def make_llama(args: argparse.Namespace, model: str | None = None, draft_model: Any = None) -> "Llama":
    """The Llama the options describe; draft_model: speculative decoding (cli/speculative.py)."""
    from ..api.facade import Llama

    return Llama(model or args.model, n_ctx=args.ctx_size, n_batch=args.batch_size, n_threads=args.threads,
                 seed=args.seed if hasattr(args, "seed") else 0, cache_type_k=args.cache_type_k,
                 cache_type_v=args.cache_type_v, context_shift=getattr(args, "context_shift", "none"),
                 n_keep=getattr(args, "keep", 0), layer_windows=getattr(args, "layer_window", None),
                 mem_budget=getattr(args, "mem_budget", None), backend=args.backend,
                 draft_model=draft_model)


def sampling_kwargs(args: argparse.Namespace) -> dict:
    """create_completion / create_chat_completion keywords from the sampling options."""
    return dict(max_tokens=args.n_predict if args.n_predict > 0 else None, temperature=args.temp,
                top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, repeat_penalty=args.repeat_penalty,
                presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                seed=args.seed, ignore_eos=args.ignore_eos)


def print_stats(stats: "GenerationStats", llm: "Llama") -> None:
    """Prompt and generation speed (and KV fill) on stderr, for `run` (chat's one-line form:
    chat_commands.stats_line)."""
    fill = f"KV {llm.n_tokens}/{llm.n_ctx()}"
    prompt = f"{stats.prompt_eval_tokens} tokens, {stats.prompt_eval_s:.2f} s, {stats.prompt_tokens_per_s:.1f} tokens/s"
    gen = f"{stats.gen_tokens} tokens, {stats.gen_s:.2f} s, {stats.gen_tokens_per_s:.1f} tokens/s"
    reused = stats.prompt_tokens - stats.prompt_eval_tokens
    print(f"\nprompt eval: {prompt}" + (f" ({reused} reused)" if reused > 0 else ""), file=sys.stderr)
    print(f"generation:  {gen}", file=sys.stderr)
    if stats.draft_n is not None:
        print(f"speculative: {stats.draft_summary()}", file=sys.stderr)
    print(f"context:     {fill}", file=sys.stderr, flush=True)
