"""Which type each tensor of a model gets when it is quantized: llama-quantize's rules.

What lives here: the file types `edgekv quantize` offers (`FILE_TYPES`), the per-tensor type
choice of llama.cpp's llama-quant.cpp (`tensor_allows_quantization`, the category rules of
the K-quant mixtures, the fallbacks for rows that are not a whole number of blocks), the
tensor order of its output, and `plan_quantization`, which turns a GGUF file and options into
a `QuantPlan` without reading a weight. What does not: the arithmetic (kernels/quantize*.py)
and writing the file (quantize/model.py).

The rules are llama.cpp's (llama-quant.cpp at the version in llama-cpp-python 0.3.36), kept
to the file types offered here; a change there is a change here. In short: the output matrix
(or the token embedding, when the output is tied to it) gets Q6_K, or Q8_0 when its rows do
not fit the chosen type; Q4_K_M and Q5_K_M give attn_v and ffn_down Q6_K in the first and
last eighth of the layers and every third layer between ("more bits" layers); Q4_K_S gives
the first four attn_v and the first eighth of ffn_down Q5_K; the Q2_K and Q3_K mixtures and
IQ4 raise attn_v (by the number of query heads per KV head), ffn_down and attn_output a type or
two; an importance matrix changes two rules (IQ4's first ffn_down layers, Q4_0/Q5_0's) and is
required by Q2_K_S. A row that is not a whole number of 256-value blocks falls back Q2_K/Q3_K ->
Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS -> IQ4_NL, and to F16 when even that does
not fit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf import LlamaFileType as FT

from ..errors import QuantizeError
from ..gguf.file_types import ALIASES, FILE_TYPE_NAMES
from ..gguf.reader import tensor_nbytes
from .imatrix import Imatrix

QUANTIZED = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS}

# name -> (general.file_type, the type of a tensor no rule touches)
FILE_TYPES: dict[str, tuple[FT, T]] = {name: (FT[ft], T[t]) for name, (ft, t) in FILE_TYPE_NAMES.items()}
TENSOR_TYPES = {t.name: t for t in (T.F32, T.F16, T.BF16, *sorted(QUANTIZED))}
FALLBACK = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0, T.IQ4_XS: T.IQ4_NL}

# 2-D weights llama.cpp never quantizes (substrings of the name); norms are matched apart
_KEEP = ("ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
         "position_embd.weight", "token_types.weight", "ssm_conv1d", "shortconv.conv.weight",
         "indexer.k_proj.weight", "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight",
         "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight",
         "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight",
         "time_mix_g1.weight", "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
         "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
         "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd")
# tensor category by name, first match wins (llama-quant.cpp's tensor_get_category)
_CATEGORIES = (("attn_qkv.weight", "attn_v"), ("attn_kv_b.weight", "attn_v"), ("attn_v.weight", "attn_v"),
               ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"), ("attn_output.weight", "attn_output"),
               ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"), ("ffn_down", "ffn_down"))
_LAYER = re.compile(r"blk\.(-?\d+)\.")


@dataclass(frozen=True)
class Options:
    """What `edgekv quantize` was asked for beyond the file type (llama-quantize's flags)."""

    pure: bool = False
    output_tensor_type: T | None = None
    token_embedding_type: T | None = None
    allow_requantize: bool = False
    leave_output_tensor: bool = False
    imatrix: Imatrix | None = field(default=None, compare=False)  # after --include/--exclude-weights

    @property
    def has_imatrix(self) -> bool:
        # llama.cpp's qs.has_imatrix: a matrix with at least one entry left
        return self.imatrix is not None and bool(self.imatrix.entries)


@dataclass(frozen=True)
class TensorPlan:
    name: str
    shape: tuple[int, ...]
    src_type: T
    dst_type: T
    fallback: bool  # the rules' type did not fit the rows

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    def nbytes(self, ggml_type: T) -> int:
        return tensor_nbytes(self.shape, ggml_type)

    @property
    def converts(self) -> bool:
        return self.src_type != self.dst_type


@dataclass
class QuantPlan:
    file_type: str  # the name asked for, resolved (Q4_K -> Q4_K_M)
    ftype: FT
    tensors: list[TensorPlan] = field(default_factory=list)

    @property
    def n_fallback(self) -> int:
        return sum(t.fallback for t in self.tensors)

    def sizes(self) -> tuple[int, int]:
        """(bytes before, bytes after), tensor data only."""
        return (sum(t.nbytes(t.src_type) for t in self.tensors), sum(t.nbytes(t.dst_type) for t in self.tensors))


def file_type(name: str) -> tuple[str, FT, T]:
    """A file type name (any case; Q4_K and Q5_K are Q4_K_M and Q5_K_M, as in llama-quantize)
    or its general.file_type number -> (name, file type, default tensor type)."""
    key = ALIASES.get(name.upper(), name.upper())
    if key.isdigit():  # llama-quantize also takes the general.file_type number
        key = next((k for k, (ft, _) in FILE_TYPES.items() if int(ft) == int(key)), key)
    if key not in FILE_TYPES:
        raise QuantizeError(f"unknown quantization type {name!r}; choose one of "
                            f"{', '.join(FILE_TYPES)} (Q4_K and Q5_K mean Q4_K_M and Q5_K_M)")
    return (key, *FILE_TYPES[key])


def tensor_type(name: str, flag: str) -> T:
    """A single tensor type for --output-tensor-type / --token-embedding-type."""
    t = TENSOR_TYPES.get(name.upper())
    if t is None:
        raise QuantizeError(f"{flag} {name!r} is not a tensor type edgekv writes; choose one of "
                            f"{', '.join(TENSOR_TYPES)}")
    return t


def tensor_order(names) -> list[str]:
    """llama.cpp's output order: tensors outside the blocks first, then block by block; by name
    within each."""
    def key(name: str):
        m = _LAYER.match(name)
        return (int(m.group(1)) if m else -1, name)
    return sorted(names, key=key)


def allows_quantization(name: str, n_dims: int, opts: Options) -> bool:
    if n_dims < 2 or not name.endswith("weight") or "_norm.weight" in name:
        return False
    if name == "output.weight" and opts.leave_output_tensor:
        return False
    return not any(s in name for s in _KEEP)


def category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    return next((c for s, c in _CATEGORIES if s in name), "other")


def block_size(t: T) -> int:
    return GGML_QUANT_SIZES[t][0]


@dataclass
class _State:
    """llama-quant.cpp's quantize_state_impl: what the rules need of the model, and counters."""

    arch: str
    ftype: FT
    n_layer: int
    n_expert: int
    is_70b: bool
    tied: bool
    n_attention_wv: int
    n_gqa: int  # query heads per KV head (0: no KV heads)
    has_imatrix: bool
    i_attention_wv: int = 0
    i_ffn_down: int = 0

    def more_bits(self, i_layer: int, n_layer: int) -> bool:
        return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2

    def layer(self, counter: int, name: str) -> int:
        if self.n_expert <= 1:
            return counter
        m = _LAYER.match(name)
        if not m or not 0 <= int(m.group(1)) < self.n_layer:
            raise QuantizeError(f"cannot tell the layer of tensor {name!r} ({self.n_layer} layers)")
        return int(m.group(1))


def _output_type(st: _State, new_type: T, ne0: int, opts: Options) -> T:
    # the output matrix, or the token embedding tied to it
    if opts.output_tensor_type is not None:
        return opts.output_tensor_type
    if st.arch == "falcon" or ne0 % block_size(new_type):
        return T.Q8_0
    return new_type if new_type == T.Q8_0 else T.Q6_K


def _mixture_type(st: _State, new_type: T, name: str, cat: str, ne0: int, opts: Options) -> T:
    # llama_tensor_get_type_impl for the file types offered here (the IQ1-IQ3 and MXFP4
    # branches cannot be reached from them)
    if cat == "output" or (st.tied and cat == "token_embd"):
        return _output_type(st, new_type, ne0, opts)
    if cat == "attn_v":
        new_type = _attn_v_type(st, new_type)
        st.i_attention_wv += 1
    elif cat == "attn_k" and st.n_expert == 8:
        new_type = T.Q8_0
    elif cat == "ffn_down":
        new_type = _ffn_down_type(st, new_type, st.layer(st.i_ffn_down, name), st.n_layer)
        st.i_ffn_down += 1
    elif cat == "attn_output":
        new_type = _attn_output_type(st, new_type)
    return new_type


def _attn_v_type(st: _State, new_type: T) -> T:
    ft, i = st.ftype, st.i_attention_wv
    if ft == FT.MOSTLY_Q2_K:
        new_type = T.Q4_K if st.n_gqa >= 4 else T.Q3_K
    elif ft == FT.MOSTLY_Q2_K_S and st.n_gqa >= 4:
        new_type = T.Q4_K
    elif ft == FT.MOSTLY_Q3_K_M:
        new_type = T.Q5_K if i < 2 else T.Q4_K
    elif ft == FT.MOSTLY_Q3_K_L:
        new_type = T.Q5_K
    elif ft in (FT.MOSTLY_IQ4_NL, FT.MOSTLY_IQ4_XS) and st.n_gqa >= 4:
        new_type = T.Q5_K
    elif ft in (FT.MOSTLY_Q4_K_M, FT.MOSTLY_Q5_K_M) and st.more_bits(i, st.n_attention_wv):
        new_type = T.Q6_K
    elif ft == FT.MOSTLY_Q4_K_S and i < 4:
        new_type = T.Q5_K
    if st.is_70b and new_type in (T.Q3_K, T.Q4_K):
        new_type = T.Q5_K
    return T.Q8_0 if st.n_expert == 8 else new_type


def _ffn_down_type(st: _State, new_type: T, i_layer: int, n_layer: int) -> T:
    ft, falcon = st.ftype, st.arch == "falcon"
    if ft == FT.MOSTLY_Q2_K:
        return T.Q3_K
    if ft == FT.MOSTLY_Q2_K_S:
        return T.Q4_K if i_layer < n_layer // 8 else new_type
    if ft == FT.MOSTLY_Q3_K_M:
        if i_layer < n_layer // 16:
            return T.Q5_K
        return T.Q4_K if not falcon or st.more_bits(i_layer, n_layer) else T.Q3_K
    if ft == FT.MOSTLY_Q3_K_L:
        return T.Q4_K if falcon else T.Q5_K
    if ft == FT.MOSTLY_Q4_K_M:
        if falcon:
            return T.Q6_K if i_layer < n_layer // 16 else T.Q5_K if st.more_bits(i_layer, n_layer) else T.Q4_K
        return T.Q6_K if st.more_bits(i_layer, n_layer) else new_type
    if i_layer < n_layer // 8 and ft in (FT.MOSTLY_IQ4_NL, FT.MOSTLY_IQ4_XS) and not st.has_imatrix:
        return T.Q5_K
    if ft == FT.MOSTLY_Q5_K_M:
        return T.Q6_K if st.more_bits(i_layer, n_layer) else new_type
    if ft == FT.MOSTLY_Q4_K_S and not falcon and i_layer < n_layer // 8:
        return T.Q5_K
    if ft in (FT.MOSTLY_Q4_0, FT.MOSTLY_Q5_0) and st.has_imatrix and i_layer < n_layer // 8:
        return T.Q4_1 if ft == FT.MOSTLY_Q4_0 else T.Q5_1
    return new_type


_ATTN_OUTPUT_Q5_K = (FT.MOSTLY_Q2_K, FT.MOSTLY_Q3_K_S, FT.MOSTLY_Q3_K_M, FT.MOSTLY_IQ4_NL, FT.MOSTLY_Q4_K_S,
                     FT.MOSTLY_Q4_K_M, FT.MOSTLY_IQ4_XS)


def _attn_output_type(st: _State, new_type: T) -> T:
    ft = st.ftype
    if st.arch == "falcon":
        return T.Q4_K if ft == FT.MOSTLY_Q3_K_L else new_type
    if st.n_expert == 8:
        return T.Q5_K if ft in _ATTN_OUTPUT_Q5_K else new_type
    return {FT.MOSTLY_Q2_K: T.Q3_K, FT.MOSTLY_Q3_K_M: T.Q4_K, FT.MOSTLY_Q3_K_L: T.Q5_K}.get(ft, new_type)


def _fallback(new_type: T, ne0: int) -> tuple[T, bool]:
    # a type whose blocks do not divide the rows -> its 32-value neighbour, or F16
    if ne0 % block_size(new_type) == 0:
        return new_type, False
    t = FALLBACK.get(new_type, new_type)
    return (t if ne0 % block_size(t) == 0 else T.F16), True


def _tensor_type(st: _State, default: T, name: str, shape: tuple[int, ...], src: T, opts: Options) -> tuple[T, bool]:
    # llama_tensor_get_type: (type, fell back)
    if not allows_quantization(name, len(shape), opts):
        return src, False
    cat = category(name)
    if opts.token_embedding_type is not None and cat == "token_embd":
        return opts.token_embedding_type, False
    if opts.output_tensor_type is not None and cat == "output":
        return opts.output_tensor_type, False
    if default not in QUANTIZED:
        return default, False
    new_type = default if opts.pure else _mixture_type(st, default, name, cat, shape[0], opts)
    return _fallback(new_type, shape[0])


def _is_70b(arch: str, n_layer: int, n_head: int, n_head_kv: int) -> bool:
    # the only model size the rules look at (llama.cpp's per-architecture hparams)
    if arch == "llama":
        return n_layer == 80 and n_head != n_head_kv
    return (arch in ("deci", "olmo", "qwen2") and n_layer == 80) or (arch == "jais2" and n_layer == 68)


def plan_quantization(g, type_name: str, opts: Options = Options()) -> QuantPlan:
    """The type of every tensor of the GGUFFile g quantized to `type_name`, in output order.
    Reads metadata and shapes only."""
    name, ftype, default = file_type(type_name)
    arch = str(g.get("general.architecture", ""))
    if not arch:
        raise QuantizeError(f"{g.path}: general.architecture is missing; not a model file")
    names = tensor_order(g.tensors)
    n_layer = int(g.get(f"{arch}.block_count", 0))
    if n_layer <= 0:
        raise QuantizeError(f"{g.path}: {arch}.block_count is missing; not a model file")
    n_head = g.get(f"{arch}.attention.head_count", 0)
    n_head_kv = g.get(f"{arch}.attention.head_count_kv", n_head)
    st = _State(arch, ftype, n_layer, int(g.get(f"{arch}.expert_count", 0) or 0),
                _is_70b(arch, n_layer, _first(n_head), _first(n_head_kv)),
                tied="output.weight" not in g.tensors,
                n_attention_wv=sum(category(n) == "attn_v" for n in names),
                n_gqa=_first(n_head) // _first(n_head_kv) if _first(n_head_kv) else 0,
                has_imatrix=opts.has_imatrix)
    plan = QuantPlan(name, ftype)
    for n in names:
        t = g.tensors[n]
        src = T(t.ggml_type)
        dst, fell = _tensor_type(st, default, n, t.shape, src, opts)
        plan.tensors.append(TensorPlan(n, t.shape, src, dst, fell))
    return plan


def requires_imatrix(plan: QuantPlan, t: TensorPlan) -> bool:
    """llama.cpp's tensor_requires_imatrix for the types offered here: a Q2_K tensor of a Q2_K_S
    file, the output and token embedding excepted."""
    return (plan.ftype == FT.MOSTLY_Q2_K_S and t.dst_type == T.Q2_K
            and category(t.name) not in ("token_embd", "output"))


def _first(v) -> int:
    # a per-layer hparam array or a scalar -> its first value
    return int(v[0]) if isinstance(v, (list, tuple)) and v else int(v or 0)
