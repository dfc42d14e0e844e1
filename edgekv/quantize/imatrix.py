"""Importance matrices for `edgekv quantize --imatrix`: reading llama-imatrix's files and
handing each tensor its column weights as llama-quantize does.

What lives here: `load_imatrix` (the GGUF format llama-imatrix writes, with `<tensor>.in_sum2`
and `<tensor>.counts` pairs and its `imatrix.*` keys, and the older `.dat` format), the
`--include-weights` / `--exclude-weights` filters, the check against a model's tensors, the
metadata llama-quantize records in the output (`quantize.imatrix.*`), and `Imatrix.weights`,
one tensor's vector. What does not: computing a matrix (`edgekv imatrix`), the quantizers that
use it (kernels/quantize_*.py).

The values llama-quantize passes on are the mean squared activation of each input column:
in_sum2 / counts per expert (a count of 0 gives 1.0 for that expert), or for a `.dat` file the
stored values / ncall; both as float32 divisions, as llama.cpp does them.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import QuantizeError
from ..gguf.writer import kv_string, kv_u32

_SUMS, _COUNTS = ".in_sum2", ".counts"


@dataclass
class Imatrix:
    path: str  # as the user typed it: llama-quantize records it so
    entries: dict[str, np.ndarray]  # tensor name -> float32 weights, ne0 per expert
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0

    def filtered(self, include: list[str], exclude: list[str]) -> Imatrix:
        """llama-quantize's --exclude-weights, then --include-weights: substrings of names."""
        kept = {n: v for n, v in self.entries.items() if not any(s in n for s in exclude)}
        if include:
            kept = {n: v for n, v in kept.items() if any(s in n for s in include)}
        return Imatrix(self.path, kept, self.datasets, self.chunk_count)

    def weights(self, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        """The vector for tensor `name` of this shape; None when the matrix has no entry (or,
        for the token embedding, one of another size, as llama-quantize lets pass)."""
        w = self.entries.get(name)
        if w is None:
            return None
        experts = shape[2] if len(shape) > 2 else 1
        if w.size != shape[0] * experts:
            if name in ("token_embd.weight", "per_layer_token_embd.weight"):
                return None
            raise QuantizeError(
                f"{self.path}: the importance matrix has {w.size} values for {name!r}, whose rows have "
                f"{shape[0]} columns{f' x {experts} experts' if experts > 1 else ''}: it was made for "
                f"another model; make one for this model with llama-imatrix")
        return w

    def check_model(self, names, model_path) -> None:
        """Refuse a matrix none of whose entries names a tensor of the model."""
        if self.entries and not any(n in self.entries for n in names):
            first = next(iter(self.entries))
            raise QuantizeError(
                f"{self.path}: none of its {len(self.entries)} entries names a tensor of {model_path} "
                f"(its first is {first!r}): it was made for another model")

    def metadata(self) -> list[bytes]:
        """The keys llama-quantize appends to the output, in its order (strings cut to 127 bytes)."""
        kvs = [kv_string("quantize.imatrix.file", _cut(self.path))]
        if self.datasets:
            kvs.append(kv_string("quantize.imatrix.dataset", _cut(self.datasets[0])))
        kvs.append(kv_u32("quantize.imatrix.entries_count", len(self.entries)))
        if self.chunk_count > 0:
            kvs.append(kv_u32("quantize.imatrix.chunks_count", self.chunk_count))
        return kvs


METADATA_KEYS = ("quantize.imatrix.file", "quantize.imatrix.dataset", "quantize.imatrix.entries_count",
                 "quantize.imatrix.chunks_count")


def _cut(s: str) -> str:
    b = s.encode()[:127]
    return b.decode("utf-8", errors="ignore")


def load_imatrix(path: str | os.PathLike) -> Imatrix:
    """Read an importance matrix: llama-imatrix's GGUF, or its older .dat format."""
    shown = os.fspath(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise QuantizeError(f"{shown}: cannot read the importance matrix: {e.strerror}") from None
    im = _load_gguf(shown) if magic == b"GGUF" else _load_dat(shown)
    bad = next((n for n, v in im.entries.items() if not np.isfinite(v).all()), None)
    if bad is not None:
        raise QuantizeError(f"{shown}: the importance matrix has a value that is not finite for {bad!r}")
    return im


def _load_gguf(path: str) -> Imatrix:
    from gguf import GGMLQuantizationType as T

    from ..gguf.reader import GGUFFile

    try:
        g = GGUFFile(path)
    except Exception as e:  # the reader's own message says what is wrong with the file
        raise QuantizeError(f"{path}: not a readable importance matrix: {e}") from None
    if not all(k in g.metadata for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")):
        raise QuantizeError(f"{path}: missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, "
                            f"imatrix.chunk_size): not a file llama-imatrix wrote")
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for name, t in g.tensors.items():
        for suffix in (_SUMS, _COUNTS):
            if name.endswith(suffix):
                if t.ggml_type != T.F32:
                    raise QuantizeError(f"{path}: {name} must be F32, not {T(t.ggml_type).name}")
                pairs.setdefault(name[: -len(suffix)], {})[suffix] = np.frombuffer(t.data, np.float32)
    if not pairs:
        raise QuantizeError(f"{path}: no data (no <tensor>.in_sum2 / .counts pairs)")
    entries = {}
    for name in sorted(pairs):
        p = pairs[name]
        if len(p) != 2:
            raise QuantizeError(f"{path}: mismatched sums and counts for {name!r}")
        entries[name] = _normalized(path, name, p[_SUMS], p[_COUNTS])
    datasets = g.get("imatrix.datasets")
    return Imatrix(path, entries, [str(d) for d in datasets] if isinstance(datasets, list) else [],
                   int(g.get("imatrix.chunk_count")))


def _normalized(path: str, name: str, sums: np.ndarray, counts_f: np.ndarray) -> np.ndarray:
    n = counts_f.size
    if n == 0 or sums.size % n:
        raise QuantizeError(f"{path}: {name!r} has {sums.size} sums for {n} counts")
    counts = np.array([_lround(c) for c in counts_f], np.float32)
    e = sums.reshape(n, -1).copy()
    for j in range(n):
        if counts[j] > 0:
            e[j] = e[j] / counts[j]
        else:
            e[j] = np.float32(1.0)
    return e.reshape(-1)


def _lround(v: float) -> int:
    # C's lround: halfway cases away from zero
    return int(math.copysign(math.floor(abs(v) + 0.5), v)) if math.isfinite(v) else 0


def _load_dat(path: str) -> Imatrix:
    with open(path, "rb") as f:
        data = f.read()
    pos = 0

    def take(fmt: str):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise QuantizeError(f"{path}: truncated importance matrix (.dat) at byte {pos}")
        v = struct.unpack_from(fmt, data, pos)
        pos += size
        return v

    (n_entries,) = take("<i")
    if n_entries < 1:
        raise QuantizeError(f"{path}: neither a GGUF nor a .dat importance matrix (no entries)")
    entries = {}
    for _ in range(n_entries):
        (length,) = take("<i")
        if length < 0:
            raise QuantizeError(f"{path}: corrupt importance matrix (.dat): negative name length")
        name = bytes(take(f"<{length}s")[0]).split(b"\0")[0].decode("utf-8", errors="replace")
        ncall, nval = take("<ii")
        if nval < 1:
            raise QuantizeError(f"{path}: corrupt importance matrix (.dat): {name!r} has {nval} values")
        if pos + 4 * nval > len(data):
            raise QuantizeError(f"{path}: truncated importance matrix (.dat) in {name!r}")
        sums = np.frombuffer(data, np.float32, nval, pos)
        pos += 4 * nval
        entries[name] = (sums / np.float32(ncall)).astype(np.float32) if ncall > 0 else sums.copy()
    chunk_count, datasets = 0, []
    if pos + 4 <= len(data):
        (chunk_count,) = take("<i")
        if pos + 4 <= len(data):
            (length,) = take("<i")
            if 0 < length <= len(data) - pos:
                datasets.append(data[pos:pos + length].split(b"\0")[0].decode("utf-8", errors="replace"))
    return Imatrix(path, entries, datasets, chunk_count)


def write_imatrix(path: str | os.PathLike, stats: dict[str, tuple[np.ndarray, np.ndarray]],
                  datasets: list[str], chunk_count: int, chunk_size: int) -> None:
    """Write an importance matrix as llama-imatrix does: stats[name] = (in_sum2 f32[n_mat, ne0],
    counts[n_mat]) per weight tensor; names sorted; `general.type` = imatrix and the imatrix.* keys."""
    import gguf

    w = gguf.GGUFWriter(os.fspath(path), arch="", endianess=gguf.GGUFEndian.LITTLE)
    w.kv_data[0].pop("general.architecture", None)  # llama-imatrix writes none
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", list(datasets))
    w.add_uint32("imatrix.chunk_count", chunk_count)
    w.add_uint32("imatrix.chunk_size", chunk_size)
    for name in sorted(stats):
        sums, counts = stats[name]
        n_mat = len(counts)  # ggml drops trailing dimensions of 1: one matrix's are 1-D
        sums = np.asarray(sums, np.float32).reshape((n_mat, -1) if n_mat > 1 else (-1,))
        w.add_tensor(name + _SUMS, sums)
        w.add_tensor(name + _COUNTS, np.asarray(counts, np.float32).reshape((n_mat, 1) if n_mat > 1 else (1,)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_imatrix_dat(path: str | os.PathLike, values: dict[str, np.ndarray], ncall: dict[str, int],
                      chunk_count: int, dataset: str) -> None:
    """The older format: per entry its name, ncall and the values times ncall; then the chunk
    count and the dataset's name."""
    with open(path, "wb") as f:
        f.write(struct.pack("<i", len(values)))
        for name in sorted(values):
            v = np.asarray(values[name], np.float32)
            raw = name.encode()
            f.write(struct.pack("<i", len(raw)) + raw + struct.pack("<ii", ncall[name], v.size))
            f.write(v.tobytes())
        raw = dataset.encode()
        f.write(struct.pack("<ii", chunk_count, len(raw)) + raw)
