"""`edgekv convert IN.gguf --to-hf DIR`: a GGUF model back as a Hugging Face checkpoint.

What lives here: `to_hf`, which writes DIR/model.safetensors (every tensor dequantized, under
its transformers name, Llama's Q/K permutation and Gemma's +1 undone), config.json,
generation_config.json and the tokenizer files. The folder appears only when complete: it is
built beside DIR under a temporary name and renamed. What does not: names and transforms
(families.py), the config (hf_config.py), the tokenizer (tokenizer_files.py).

`edgekv convert DIR` (or llama.cpp's convert_hf_to_gguf.py) turns the result back into a GGUF
with the same tensors (bit-exact from an F32/F16/BF16 file; a quantized file's dequantized
values) and the same vocabulary.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

from ..gguf import quants
from ..errors import ConvertError
from ..gguf.reader import GGUFFile
from ..quantize.model import progress_bar
from .families import family_for_gguf, transform
from .hf_config import generation_config, hf_config, model_card
from .json_files import json_bytes
from .safetensors import write_safetensors
from .tokenizer_files import tokenizer_files

_DTYPES = {"f32": ("F32", "float32", np.dtype("<f4")), "f16": ("F16", "float16", np.dtype("<f2")),
           "bf16": ("BF16", "bfloat16", np.dtype("<u2"))}
_GENERATED = ("rope_freqs.weight",)  # llama.cpp computes it from config.json's rope_scaling


@dataclass(frozen=True)
class ToHFResult:
    path: str
    dtype: str
    n_tensors: int
    nbytes: int
    seconds: float


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, as ggml's and PyTorch's float -> bfloat16 do (NaN kept quiet)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u.astype(np.uint64) + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)


def default_dtype(g: GGUFFile) -> str:
    """The matrices' own float type when they share one, float32 for anything quantized."""
    kinds = {T(t.ggml_type) for t in g.tensors.values() if len(t.shape) >= 2}
    return {frozenset({T.F16}): "f16", frozenset({T.BF16}): "bf16"}.get(frozenset(kinds), "f32")


def _values(fam, g: GGUFFile, name: str, n_head: int, n_kv: int) -> np.ndarray:
    t = g.tensors[name]
    w = quants.dequantize(t.data, t.ggml_type, t.shape).reshape(tuple(reversed(t.shape)))
    g.release_pages(t.data)
    return transform(fam, name, w, n_head, n_kv, to_hf=True)


def to_hf(src: str, out_dir: str, dtype: str = "auto", progress: bool | None = None) -> ToHFResult:
    t0 = time.perf_counter()
    g = GGUFFile(src)
    fam = family_for_gguf(g.architecture)
    kind = default_dtype(g) if dtype == "auto" else dtype.lower()
    if kind not in _DTYPES:
        raise ConvertError(f"--outtype {dtype}: --to-hf writes auto, f32, f16 or bf16 safetensors")
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise ConvertError(f"{out_dir}: already exists and is not an empty folder; choose a new folder")
    st_dtype, torch_dtype, np_dtype = _DTYPES[kind]
    for name, t in g.tensors.items():
        if int(t.ggml_type) not in quants.QUANT_TYPES:
            raise ConvertError(f"{src}: tensor {name!r} has type {T(t.ggml_type).name}, which edgekv cannot read")
    names = sorted(n for n in g.tensors if n not in _GENERATED)
    hf_names = {n: fam.hf_name(n) for n in names}
    order = sorted(names, key=hf_names.get)
    specs = [(hf_names[n], st_dtype, tuple(reversed(g.tensors[n].shape))) for n in order]
    config = hf_config(fam, g, torch_dtype)
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    files = {"config.json": json_bytes(config), "generation_config.json": json_bytes(generation_config(g)),
             **tokenizer_files(g), "README.md": model_card(g).encode("utf-8")}
    nbytes = sum(int(np.prod(s)) * np_dtype.itemsize for _, _, s in specs)
    bar = progress_bar(nbytes, progress)

    def chunks():
        for n in order:
            w = _values(fam, g, n, n_head, n_kv)
            bar.update(w.size * np_dtype.itemsize)
            yield _f32_to_bf16(w) if kind == "bf16" else w.astype(np_dtype, copy=False)

    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix="." + os.path.basename(os.path.abspath(out_dir)) + ".")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would outlive the rename
    try:
        write_safetensors(os.path.join(tmp, "model.safetensors"), specs, chunks(), {"format": "pt"})
        for fname, data in files.items():
            with open(os.path.join(tmp, fname), "wb") as f:
                f.write(data)
        if os.path.isdir(out_dir):
            os.rmdir(out_dir)  # empty, checked above
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        bar.close()
    return ToHFResult(out_dir, kind, len(specs), nbytes, time.perf_counter() - t0)

