"""`edgekv convert HF_DIR -o OUT.gguf`: a Hugging Face checkpoint as a GGUF model.

What lives here: `convert`, which reads config.json and the safetensors weights (memory-mapped,
no torch), plans every output tensor (name, shape, type) and the metadata, then streams the
tensors one at a time into a file that appears only when complete (gguf/writer.py). A
quantized `--outtype` (Q4_K_M, ...) converts losslessly to a temporary file first and then
runs `edgekv quantize` on it, as llama.cpp users run convert_hf_to_gguf.py then llama-quantize.
What does not: the per-family names and transforms (families.py), the metadata keys
(gguf_params.py), tokenizers (vocab.py).

The output is what llama.cpp's convert_hf_to_gguf.py writes for the same directory and
outtype (f32, f16, bf16, q8_0): the same keys and values, tensor names, order, types and bytes
(tests/test_convert.py; the reference is made by tools/make_convert_reference.py).
"""

from __future__ import annotations

import logging
import math
import os
import re
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

from ..errors import ConvertError
from ..gguf.writer import GGUFOutput, TensorEntry, kv_entry
from ..quantize.model import progress_bar, quantizers_compiled
from .families import Family, checkpoint_name, family_for_hf, is_multimodal_part, transform
from .gguf_params import embedding_rows, find, llama3_rope_factors, with_defaults, write_params, write_vocab
from .json_files import json_file
from .safetensors import SafetensorsDir, as_float32

log = logging.getLogger("edgekv")
OUTTYPES = {"f32": (T.F32, gguf.LlamaFileType.ALL_F32), "f16": (T.F16, gguf.LlamaFileType.MOSTLY_F16),
            "bf16": (T.BF16, gguf.LlamaFileType.MOSTLY_BF16), "q8_0": (T.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0)}
SLAB_BYTES = 64 << 20  # float32 bytes of source rows converted at once
_SKIPPED = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")


@dataclass
class PlannedTensor:
    name: str  # GGUF name
    source: str | None  # checkpoint name (None: generated)
    shape: tuple[int, ...]  # NumPy order
    ggml_type: T
    data: np.ndarray | None = None  # generated tensors only

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))


@dataclass(frozen=True)
class ConvertResult:
    path: str
    outtype: str
    n_tensors: int
    n_params: int
    nbytes: int
    seconds: float


def read_config(directory: str) -> dict:
    if not os.path.isdir(directory):
        raise ConvertError(f"{directory}: no such directory (give the folder of a Hugging Face checkpoint)")
    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise ConvertError(f"{directory}: no config.json; is this a Hugging Face checkpoint folder?")
    return json_file(directory, "config.json")


def hparams_of(config: dict) -> dict:
    config = with_defaults(config)
    return {**config, **with_defaults(config["text_config"])} if "text_config" in config else config


def guess_outtype(weights: SafetensorsDir) -> str:
    """llama.cpp's 'auto': the dtype of the first matrix, bf16 or f16; f16 otherwise."""
    for t in weights.tensors.values():
        if len(t.shape) >= 2:
            return {"BF16": "bf16", "F16": "f16"}.get(t.dtype, "f16")
    return "f16"


def lossless_outtype(weights: SafetensorsDir) -> str:
    dtypes = {t.dtype for t in weights.tensors.values() if len(t.shape) >= 2}
    return {frozenset({"BF16"}): "bf16", frozenset({"F16"}): "f16"}.get(frozenset(dtypes), "f32")


def tensor_type(name: str, shape: tuple[int, ...], outtype: str) -> T:
    """prepare_tensors' choice: 1-D tensors, norms and anything not a .weight stay F32;
    a row that is not whole Q8_0 blocks falls back to F16."""
    if len(shape) <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return T.F32
    qtype = OUTTYPES[outtype][0]
    if qtype == T.Q8_0 and shape[-1] % 32:
        return T.F16
    return qtype


def plan_tensors(fam: Family, hp: dict, weights: SafetensorsDir, directory: str, outtype: str) -> list[PlannedTensor]:
    plan = []
    if fam.gguf_arch == "llama" and (factors := llama3_rope_factors(hp)) is not None:
        plan.append(PlannedTensor("rope_freqs.weight", None, factors.shape, T.F32, factors))
    vocab_rows = embedding_rows(fam, directory, hp)
    unknown = []
    for f in weights.files:  # shards in name order, tensors by name, as the reference converter reads them
        for src in sorted(f.tensors):
            name = checkpoint_name(src)
            if name.endswith(_SKIPPED) or is_multimodal_part(name):
                continue
            gname = fam.gguf_name(name)
            if gname is None:
                unknown.append(src)
                continue
            shape = f.tensors[src].shape
            if gname == "token_embd.weight" and vocab_rows is not None:
                shape = (min(vocab_rows, shape[0]),) + shape[1:]
            plan.append(PlannedTensor(gname, src, shape, tensor_type(gname, shape, outtype)))
    if unknown:
        raise ConvertError(f"{directory}: {len(unknown)} tensor(s) that a {fam.hf_archs[0]} does not have: "
                           f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}")
    return plan


def metadata(fam: Family, hp: dict, directory: str, plan: list[PlannedTensor], outtype: str,
             pre: str | None) -> list[bytes]:
    """prepare_metadata's keys, in its order, through gguf's writer."""
    logging.getLogger("gguf.gguf_writer").setLevel(logging.ERROR)  # a key set twice is the reference's way too
    w = gguf.GGUFWriter(path=None, arch=fam.gguf_arch)
    n_params = sum(t.n_elements for t in plan)
    w.add_type(gguf.GGUFType.MODEL)
    meta = gguf.Metadata.load(None, Path(directory), None, n_params)
    if meta.sampling_penalty_repeat is None:  # the reference's gguf-py also reads transformers' name for it
        meta.sampling_penalty_repeat = json_file(directory, "generation_config.json").get("repetition_penalty")
    if meta.name is None:
        meta.name = os.path.basename(os.path.normpath(directory))
    if meta.size_label is None and n_params > 0:
        meta.size_label = gguf.size_label(n_params, n_params, 0, 0)
    meta.set_gguf_meta_model(w)
    write_params(w, fam, hp, find(hp, ("n_layers", "num_hidden_layers", "n_layer", "num_layers"), False),
                 OUTTYPES[outtype][1])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_vocab(w, fam, directory, hp, pre)
    out = []
    for key, v in w.kv_data[0].items():
        sub = v.sub_type
        if v.type == gguf.GGUFValueType.ARRAY and sub is None:
            sub = gguf.GGUFValueType.get_type(v.value[0])
        out.append(kv_entry(key, v.value, int(v.type), None if sub is None else int(sub)))
    return out


def encode(w: np.ndarray, ggml_type: T) -> np.ndarray:
    """float32 values -> the bytes of a GGUF tensor of `ggml_type`."""
    if ggml_type == T.F32:
        return np.ascontiguousarray(w, dtype="<f4")
    if ggml_type == T.F16:
        return np.ascontiguousarray(w, dtype="<f2")  # IEEE round-to-nearest-even, as ggml and NumPy do
    from ..kernels.quantize_weights import NO_WEIGHTS, quantize_weight_rows
    from ..gguf.quants import row_nbytes

    rows = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, w.shape[-1])
    out = np.empty((rows.shape[0], row_nbytes(ggml_type, rows.shape[1])), np.uint8)
    quantize_weight_rows(rows, int(ggml_type), out, NO_WEIGHTS)
    return out


def tensor_chunks(fam: Family, hp: dict, weights: SafetensorsDir, t: PlannedTensor):
    """The output bytes of one tensor in slabs of rows (SLAB_BYTES of float32 at most), each
    slab's source pages released once encoded; Q/K rows that Llama's permutation mixes go
    whole."""
    if t.data is not None:
        yield encode(t.data, t.ggml_type)
        return
    st = weights.tensors[t.source]
    whole = len(t.shape) == 1 or (fam.permute_qk and re.search(r"\.attn_[qk]\.", t.name))
    step = t.shape[0] if whole else max(1, SLAB_BYTES // (4 * math.prod(t.shape[1:])))
    for r in range(0, t.shape[0], step):  # t.shape[0] < stored rows: Gemma 3's cut embedding
        raw = st.raw[r:min(r + step, t.shape[0])]
        w = transform(fam, t.name, as_float32(raw, st.dtype), hp.get("num_attention_heads", 0),
                      hp.get("num_key_value_heads", 0))
        yield encode(w, t.ggml_type)
        st.release(raw)


def convert(directory: str, out: str | None, outtype: str = "auto", *, pre: str | None = None,
            progress: bool | None = None) -> ConvertResult:
    """Convert the checkpoint in `directory` to the GGUF file `out`. outtype: auto (the
    checkpoint's own bf16/f16), f32, f16, bf16, q8_0, or a file type of `edgekv quantize`
    (Q4_K_M, Q5_K_M, Q6_K, ...). out None: DIR/<folder name>-<type>.gguf. pre: the BPE
    pre-tokenizer name, when tokenizer.json's cannot be recognised."""
    t0 = time.perf_counter()
    config = read_config(directory)
    fam, hp = family_for_hf(config), hparams_of(config)
    weights = SafetensorsDir(directory)
    kind = outtype.lower()
    if kind == "auto":
        kind = guess_outtype(weights)
    if out is None:
        out = os.path.join(directory, f"{os.path.basename(os.path.normpath(directory))}-{kind.upper()}.gguf")
    if kind not in OUTTYPES:
        return _convert_then_quantize(directory, out, outtype, weights, pre, progress, t0)
    if os.path.abspath(out).startswith(os.path.abspath(directory) + os.sep) and out.endswith(".safetensors"):
        raise ConvertError(f"{out}: the output would overwrite a checkpoint file; choose another name")
    plan = plan_tensors(fam, hp, weights, directory, kind)
    kvs = metadata(fam, hp, directory, plan, kind, pre)
    entries = [TensorEntry(t.name, tuple(reversed(t.shape)), t.ggml_type) for t in plan]
    bar = progress_bar(sum(e.nbytes for e in entries), progress)
    compiles = quantizers_compiled() if {T.BF16, T.Q8_0} & {t.ggml_type for t in plan} else nullcontext()
    with compiles, GGUFOutput(out, kvs, entries) as gguf_out:
        for i, t in enumerate(plan):
            bar.set_postfix_str(f"tensor {i + 1}/{len(plan)} {t.name}", refresh=False)
            for data in tensor_chunks(fam, hp, weights, t):
                gguf_out.write(data)
                bar.update(data.nbytes)
    bar.close()
    return ConvertResult(out, kind, len(plan), sum(t.n_elements for t in plan), sum(e.nbytes for e in entries),
                         time.perf_counter() - t0)


def _convert_then_quantize(directory, out, outtype, weights, pre, progress, t0) -> ConvertResult:
    from ..gguf.file_types import ALIASES, FILE_TYPE_NAMES
    from ..quantize.model import quantize_model

    if outtype.upper() not in FILE_TYPE_NAMES and outtype.upper() not in ALIASES:
        raise ConvertError(f"--outtype {outtype}: not a type edgekv converts to; use auto, {', '.join(OUTTYPES)} "
                           f"or a file type of edgekv quantize ({', '.join([*FILE_TYPE_NAMES, *ALIASES])})")
    folder = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(out) + ".", suffix=".lossless.gguf")
    os.close(fd)
    try:
        first = convert(directory, tmp, lossless_outtype(weights), pre=pre, progress=progress)
        log.info("converted to %s (%s); quantizing to %s", first.outtype, tmp, outtype.upper())
        q = quantize_model(tmp, out, outtype.upper(), progress=progress)
    finally:
        os.unlink(tmp)
    return ConvertResult(out, outtype.upper(), len(q.plan.tensors), q.n_elements, q.bytes_after,
                         time.perf_counter() - t0)

