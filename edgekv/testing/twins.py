"""Twins of the models edge users run (0.5B-8B): each model's real shapes, with random weights.

What lives here: `SHAPES` (the hyperparameters of Qwen2.5 0.5B/1.5B/7B, Llama 3.2 1B/3B, Llama
3.1 8B, Gemma 3 1B and Phi-3.5-mini, from their config.json: widths, layers, heads, vocabulary
size, tied output, RoPE), `twin_header` (a GGUF header for one of them in a file type: its
metadata, a tokenizer of the real vocabulary size, and a tensor directory whose types are the
ones llama-quantize gives that file type, quantize/plan.py's rules, which the published Q4_K_M
and Q8_0 files were made by) and `make_twin` (that header, then random weights in those types:
tools/model_twin.py's fill, streamed a tensor at a time, so an 8B twin needs no 8B in memory).

Why: the speed, start-up and memory of these sizes are measured on twins (benchmarks/sizes.py),
which llama.cpp loads too, so every comparison runs on the same file. A twin's text is noise;
its work per token is its model's. Generated on demand (an 8B Q4_K_M twin is ~4.6 GiB): never
committed.

The tokenizer: the family's tiny vocabulary (testing/tiny_vocab.py) grown to the real size
with tokens that are concatenations of existing ones (BPE: each with its merge; SentencePiece:
each with a lower score), so the vocabulary is valid and every token id reachable by a
tokenizer that reads it, and the embedding and output matrices have the real row count.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from gguf import GGMLQuantizationType as T

from ..gguf.reader import tensor_nbytes
from .tiny_model import GGUF_ARCH, add_hparams, tensor_specs
from .twin_weights import fill_weights
from .tiny_vocab import BYTE, CONTROL, NORMAL, UNKNOWN, USER_DEFINED, add_tokenizer, vocab_for

_QWEN = dict(arch="qwen2", rope_theta=1e6, norm_eps=1e-6, n_ctx=32768)
_LLAMA3 = dict(arch="llama", rope_theta=500000.0, norm_eps=1e-5, n_ctx=131072, n_vocab=128256,
               llama3_rope=True)  # Llama 3.1+'s scaling: a rope_freqs tensor
SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": dict(_QWEN, dim=896, n_layers=24, n_heads=14, n_kv_heads=2, head_dim=64, ff=4864,
                         n_vocab=151936, tied=True),
    "llama-3.2-1b": dict(_LLAMA3, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, head_dim=64, ff=8192, tied=True),
    "qwen2.5-1.5b": dict(_QWEN, dim=1536, n_layers=28, n_heads=12, n_kv_heads=2, head_dim=128, ff=8960,
                         n_vocab=151936, tied=True),
    "gemma-3-1b": dict(arch="gemma3", dim=1152, n_layers=26, n_heads=4, n_kv_heads=1, head_dim=256, ff=6912,
                       n_vocab=262144, tied=True, rope_theta=1e6, norm_eps=1e-6, sliding_window=512, n_ctx=32768),
    "llama-3.2-3b": dict(_LLAMA3, dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, head_dim=128, ff=8192, tied=True),
    "phi-3.5-mini": dict(arch="phi3", dim=3072, n_layers=32, n_heads=32, n_kv_heads=32, head_dim=96, ff=8192,
                         n_vocab=32064, tied=False, rope_theta=10000.0, norm_eps=1e-5, n_ctx=131072, longrope=4096),
    "qwen2.5-7b": dict(_QWEN, dim=3584, n_layers=28, n_heads=28, n_kv_heads=4, head_dim=128, ff=18944,
                       n_vocab=152064, tied=False),
    "llama-3.1-8b": dict(_LLAMA3, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, ff=14336,
                         tied=False),
}
FILE_TYPES = ("Q4_K_M", "Q8_0")  # the published files' types twins are made in (Q8_0 for the small ones)


@dataclass(frozen=True)
class _Tensor:  # what quantize/plan.py reads of a tensor
    shape: tuple[int, ...]  # ggml order: (ne0, ne1)
    ggml_type: int


class _Directory:
    """A GGUFFile's face for plan_quantization: metadata and a tensor directory, no file."""

    def __init__(self, path: str, metadata: dict, tensors: dict[str, _Tensor]):
        self.path, self._metadata, self.tensors = path, metadata, tensors

    def get(self, key: str, default=None):
        return self._metadata.get(key, default)


def hparams(name: str) -> dict:
    if name not in SHAPES:
        raise ValueError(f"no twin {name!r}; twins: {', '.join(SHAPES)}")
    hp = dict(SHAPES[name])
    hp.setdefault("rope_dims", hp["head_dim"])
    return hp


def tensor_types(name: str, file_type: str) -> list[tuple[str, tuple[int, ...], T]]:
    """Each tensor of the twin (name, ggml shape, type) in file order, as llama-quantize types
    the model's F16 conversion for file_type (norms, biases and factors stay F32)."""
    from ..quantize.plan import plan_quantization

    hp = hparams(name)
    arch = GGUF_ARCH.get(hp["arch"], hp["arch"])
    specs = [(n, shape) for n, shape, _ in tensor_specs(hp["arch"], hp, hp["n_vocab"])]
    if "llama3_rope" in hp:  # Llama 3.1+'s RoPE scaling, as the converter writes it: per-dimension factors
        specs.insert(2, ("rope_freqs.weight", (hp["rope_dims"] // 2,)))  # (a twin's are 1: the work is the same)
    directory = _Directory(f"twin {name}", {"general.architecture": arch, f"{arch}.block_count": hp["n_layers"],
                                            f"{arch}.attention.head_count": hp["n_heads"],
                                            f"{arch}.attention.head_count_kv": hp["n_kv_heads"]},
                           {n: _Tensor(s, int(T.F16 if len(s) == 2 else T.F32)) for n, s in specs})
    return [(t.name, t.shape, t.dst_type) for t in plan_quantization(directory, file_type).tensors]


def twin_header(name: str, file_type: str, path: Path) -> Path:
    """The GGUF header of the twin of `name` in `file_type` (metadata, tokenizer, tensor directory)."""
    hp = hparams(name)
    arch = hp["arch"]
    gguf_arch = GGUF_ARCH.get(arch, arch)
    w = GGUFWriter(str(path), gguf_arch)
    add_hparams(w, arch, dict(hp, weight_type=file_type), hp["n_vocab"], name=f"{name} twin")
    add_tokenizer(w, grown_vocab(arch, hp["n_vocab"]))
    for tensor, shape, ggml_type in tensor_types(name, file_type):
        w.add_tensor_info(tensor, tuple(reversed(shape)), np.dtype(np.float32), tensor_nbytes(shape, ggml_type),
                          raw_dtype=ggml_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


def grown_vocab(arch: str, n_vocab: int) -> dict:
    """The family's tiny vocabulary grown to n_vocab tokens (see the module's docstring)."""
    vocab = vocab_for(arch)
    tokens, types = list(vocab["tokens"]), list(vocab["types"])
    scores = None if vocab["scores"] is None else list(vocab["scores"])
    merges = None if vocab["merges"] is None else list(vocab["merges"])
    if len(tokens) > n_vocab:
        raise ValueError(f"{arch}'s vocabulary has {len(tokens)} tokens already, more than {n_vocab}")
    special = {CONTROL, UNKNOWN, USER_DEFINED, BYTE}
    pieces = [t for t, k in zip(tokens, types) if k not in special]  # what new tokens are made of
    base = [t for t in pieces if len(t) == 1]
    seen = set(tokens)
    at = 0
    while len(tokens) < n_vocab:
        head = pieces[at]
        at += 1
        for ch in base:
            new = head + ch
            if new in seen:
                continue
            seen.add(new)
            pieces.append(new)
            tokens.append(new)
            types.append(NORMAL)
            if merges is not None:
                merges.append(f"{head} {ch}")
            if scores is not None:
                scores.append(-1e4 - len(tokens))  # below every tiny merge: they keep their order
            if len(tokens) == n_vocab:
                break
    return dict(vocab, tokens=tokens, types=types, scores=scores, merges=merges)


def make_twin(name: str, file_type: str, path: Path, seed: int = 0) -> Path:
    """The twin of `name` in `file_type` at path: its header, then random weights (tensor by
    tensor into the file: tools/model_twin.py's values)."""
    header, partial = Path(f"{path}.header"), Path(f"{path}.partial")
    twin_header(name, file_type, header)
    try:
        fill_weights(header, partial, seed)
        partial.replace(path)  # whole or not at all: an interrupted twin leaves no file that looks made
    finally:
        header.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
    return Path(path)
