"""The speculative decoding options of `run`, `chat` and `serve`, as llama.cpp spells them.

Prompt lookup: `--spec-type ngram-simple [--spec-ngram-simple-size-n N] [--spec-ngram-simple-size-m M]`
(llama.cpp's defaults: a 12-token n-gram, 48 tokens after it), or the short form
`--lookup-ngram N`. A draft model: `-md/--model-draft FILE` with `-ctkd/-ctvd` for its cache.
Both: `--spec-draft-n-max K` (`--draft-max`), `--spec-draft-n-min`, `--spec-draft-p-min`.
edgekv chooses how many of the K to draft from measured acceptance (speculative/draft_length.py).
"""

from __future__ import annotations

import argparse

from ..errors import EdgeKVError
from .common import non_negative_int, positive_int

SPEC_TYPES = ("none", "ngram-simple", "draft-simple")
NGRAM_SIMPLE_SIZE_N, NGRAM_SIMPLE_SIZE_M = 12, 48  # llama.cpp's defaults


def probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1), got {text!r}")
    return value


def add_speculative_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding (the same text, several tokens verified per pass)")
    g.add_argument("--spec-type", choices=SPEC_TYPES, default=None,
                   help="ngram-simple: drafts copied from the context (prompt lookup); draft-simple: a draft "
                        "model (-md); none (default: draft-simple with -md, else none)")
    g.add_argument("--spec-ngram-simple-size-n", type=positive_int, default=None, metavar="N",
                   help=f"ngram-simple: tokens matched in the context (default: {NGRAM_SIMPLE_SIZE_N})")
    g.add_argument("--spec-ngram-simple-size-m", type=positive_int, default=None, metavar="M",
                   help=f"ngram-simple: tokens drafted after a match (default: {NGRAM_SIMPLE_SIZE_M})")
    g.add_argument("--lookup-ngram", type=positive_int, default=None, metavar="N",
                   help="short for --spec-type ngram-simple --spec-ngram-simple-size-n N")
    g.add_argument("-md", "--model-draft", "--spec-draft-model", dest="model_draft", default=None, metavar="FILE",
                   help="a smaller model of the same vocabulary drafting for this one (GGUF or catalog name)")
    g.add_argument("--spec-draft-n-max", "--draft-max", dest="draft_n_max", type=positive_int, default=16,
                   metavar="N", help="the most tokens drafted at once (default: 16; edgekv drafts fewer where "
                                     "acceptance and costs say so)")
    g.add_argument("--spec-draft-n-min", "--draft-min", dest="draft_n_min", type=non_negative_int, default=0,
                   metavar="N", help="fewer drafted tokens are not verified (default: 0)")
    g.add_argument("--spec-draft-p-min", "--draft-p-min", dest="draft_p_min", type=probability, default=0.0,
                   metavar="P", help="a draft model stops drafting below this probability (default: 0.0, the pinned llama.cpp's)")
    g.add_argument("-ctkd", "--cache-type-k-draft", "--spec-draft-type-k", dest="cache_type_k_draft", default="f16",
                   metavar="TYPE", help="the draft model's KV cache type for K (default: f16)")
    g.add_argument("-ctvd", "--cache-type-v-draft", "--spec-draft-type-v", dest="cache_type_v_draft", default="f16",
                   metavar="TYPE", help="the draft model's KV cache type for V (default: f16)")


def speculation_from(args: argparse.Namespace):
    """The Speculation the options ask for, or None."""
    kind = args.spec_type
    if kind is None:
        kind = "draft-simple" if args.model_draft else "ngram-simple" if args.lookup_ngram else "none"
    if kind == "none":
        return None
    from ..speculative import DraftModel, PromptLookup, Speculation

    if kind == "draft-simple":
        if not args.model_draft:
            raise EdgeKVError("--spec-type draft-simple needs a draft model: -md FILE")
        drafter = DraftModel(args.model_draft, n_draft=args.draft_n_max, p_min=args.draft_p_min,
                             cache_type_k=args.cache_type_k_draft, cache_type_v=args.cache_type_v_draft,
                             backend=getattr(args, "backend", None))
        return Speculation(drafter, args.draft_n_max, args.draft_n_min)
    size_n = args.lookup_ngram or args.spec_ngram_simple_size_n or NGRAM_SIMPLE_SIZE_N
    size_m = args.spec_ngram_simple_size_m or NGRAM_SIMPLE_SIZE_M
    drafter = PromptLookup(max_ngram_size=size_n, num_pred_tokens=size_m, min_ngram_size=size_n)
    return Speculation(drafter, min(args.draft_n_max, size_m), args.draft_n_min)
