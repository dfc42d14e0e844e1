"""Issue 14 item 1, the study: which 4-bit K/V codec could keep a cache near f16 quality.

Each codec is tried by fake quantization: the session keeps an f32 cache, and every K and V
row the backend stores is first encoded and decoded by the codec in NumPy (so a codec is
judged before any kernel is written). Quality is the mean KL divergence of the next-token
distributions from an f16 cache's and the same-top %, over the first --chunks chunks of the
text at -c 512 with the perplexity method's cuts (edgekv/lab/perplexity.py). Calibrated codecs
take their statistics (per layer and KV head: the mean of K, the second moments of K, Q and V)
from one pass over --calib, a different text (default: the README).

Codecs (every one stores 4-bit values in blocks of 32 with one f16 scale: 4.5 bits a value):
  q4_0          rotated q4_0, as edgekv's q4_0 cache stores it (Walsh-Hadamard, then q4_0)
  nl            rotated, IQ4_NL's non-uniform 16 levels (llama.cpp's iq4_nl table) in place
                of q4_0's uniform ones, the block scale refitted by least squares
  +sinks        the first 4 positions kept in f16 (attention sinks; 4 rows whatever n_ctx)
  center        K minus its calibrated mean (free: q.(k - m) differs from q.k by one
                constant per query, which softmax ignores), K channels scaled to unit
                variance (the query multiplied back), then as nl
  diag          K minus its mean, channel c scaled by (E q_c^2 / E k_c^2)^(1/4), which
                minimizes E (q . dk)^2 for white rounding noise among diagonal scalings
  matrix        K minus its mean, times A with A^T A the matrix geometric mean of Ck^-1 and
                Cq (the same optimum among all linear maps), then rotated, then nl
  K only / V only: the other one kept in f16, to see which costs what
  +window 32    the newest 32 positions kept in f16 until newer ones push them out (KIVI's
                residual; measured with the method's batches, so a batch's early queries see
                some keys already coded: a slight underestimate of the window's benefit)
The results and what they decided: benchmarks/README.md (2026-12-01, issue 14).

    python benchmarks/kv4_study.py [-m smollm2-135m-instruct] [--chunks 4] [--calib README.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgekv.kernels.rows import hadamard  # noqa: E402
from edgekv.catalog import resolve_model  # noqa: E402
from edgekv.lab.kv_report import kl_divergence, log_softmax  # noqa: E402
from edgekv.loader import load  # noqa: E402
from edgekv.system_info import machine_summary  # noqa: E402
from edgekv.lab.perplexity import chunk_logits  # noqa: E402

IQ4_NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
SINKS = 4


def f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def rotated(x: np.ndarray, codec, n: int) -> np.ndarray:
    """codec applied to x's runs of n values after a Walsh-Hadamard rotation, rotated back."""
    h = hadamard(n)
    y = codec((x.reshape(-1, n) @ h).reshape(-1, 32))
    return (y.reshape(-1, n) @ h).reshape(x.shape)


def q4_0(b: np.ndarray) -> np.ndarray:
    mx = b[np.arange(len(b)), np.abs(b).argmax(1)]
    d = f16(mx / -8)
    inv = np.divide(1, d, out=np.zeros_like(d), where=d != 0)
    return (np.clip(np.floor(b * inv[:, None] + 8.5), 0, 15) - 8) * d[:, None]


def iq4_nl(b: np.ndarray) -> np.ndarray:
    """The nearest of the 16 levels at scale max/-127, then the least-squares scale for them."""
    mx = b[np.arange(len(b)), np.abs(b).argmax(1)]
    d = mx / -127
    safe = np.where(d == 0, 1, d)
    levels = IQ4_NL[np.abs(b[..., None] / safe[:, None, None] - IQ4_NL).argmin(-1)]
    d = f16((b * levels).sum(1) / (levels * levels).sum(1))
    return levels * d[:, None]


def k_block(hd: int) -> int:
    n = 64
    while hd % (2 * n) == 0:
        n *= 2
    return n


def geometric_mean_map(c: np.ndarray, d: np.ndarray) -> np.ndarray:
    """A (symmetric) with A^T A = C^-1 # D, the matrix geometric mean: it minimizes
    tr(A^-T D A^-1) * tr(A C A^T)."""
    n = c.shape[0]
    c = c + 1e-6 * np.trace(c) / n * np.eye(n)
    d = d + 1e-6 * np.trace(d) / n * np.eye(n)

    def power(m, p):
        w, u = np.linalg.eigh((m + m.T) / 2)
        return u @ np.diag(np.maximum(w, 1e-30) ** p) @ u.T

    ch, cih = power(c, 0.5), power(c, -0.5)
    return power(cih @ power(ch @ d @ ch, 0.5) @ cih, 0.5)


def calibrate(model, path: Path, n: int = 512) -> dict[int, dict]:
    """Per layer: K's mean, and the K transforms the calibrated codecs use."""
    tokens = model.tokenizer.encode(path.read_bytes(), add_bos=None)[:n]
    session = model.session(len(tokens) + 8, 512, "f16", "f16")
    backend, layers = session.cache.backend, session.cache.k
    sums: dict[int, list] = {}

    def attend(layer, slots, positions, q, k, v, *rest):
        i = next(j for j, a in enumerate(layers) if a is layer.k)
        g = q.shape[1] // k.shape[1]
        q64 = q.reshape(q.shape[0], k.shape[1], g, -1).astype(np.float64)
        k64 = k.astype(np.float64)
        s = sums.setdefault(i, [0, 0.0, 0.0, 0.0])
        s[0] += len(k)
        s[1] = s[1] + k64.sum(0)
        s[2] = s[2] + np.einsum("nhi,nhj->hij", k64, k64)
        s[3] = s[3] + np.einsum("nhgi,nhgj->hij", q64, q64) / g
        return type(backend).attend(backend, layer, slots, positions, q, k, v, *rest)

    backend.attend = attend
    try:
        session.eval(tokens)
    finally:
        del backend.attend
    out = {}
    for i, (count, sk, skk, sqq) in sums.items():
        mean = sk / count
        ck = skk / count - np.einsum("hi,hj->hij", mean, mean)
        cq = sqq / count
        var_k, var_q = np.einsum("hii->hi", ck), np.einsum("hii->hi", cq)
        out[i] = dict(mean=mean.astype(np.float32),
                      center=(1 / np.sqrt(var_k + 1e-12)).astype(np.float32),
                      diag=((var_q + 1e-12) / (var_k + 1e-12)) ** 0.25,
                      matrix=np.stack([geometric_mean_map(ck[h], cq[h]) for h in range(len(ck))]))
    return out


def transformed_k(k: np.ndarray, cal: dict, how: str) -> np.ndarray:
    """K through the calibrated map `how`, coded by rotated iq4_nl, mapped back."""
    x = k - cal["mean"]
    if how == "matrix":
        a = cal["matrix"]
        y = rotated(np.ascontiguousarray(np.einsum("hij,nhj->nhi", a, x), np.float32), iq4_nl, k_block(k.shape[-1]))
        return np.einsum("hij,nhj->nhi", np.linalg.inv(a), y).astype(np.float32) + cal["mean"]
    s = cal[how].astype(np.float32)
    return rotated(np.ascontiguousarray(x * s), iq4_nl, k_block(k.shape[-1])) / s + cal["mean"]


CODECS = {  # name -> (K codec, V codec, sinks[, f16 window]); a codec: (rows f32[n, n_kv, hd], layer calibration) -> rows
    "q8_0 (reference)": ("q8_0", "q8_0", False),
    "q4_0": ("q4_0", "q4_0", False),
    "nl": ("nl", "nl", False),
    "nl +sinks": ("nl", "nl", True),
    "center +sinks": ("center", "nl", True),
    "diag +sinks": ("diag", "nl", True),
    "matrix +sinks": ("matrix", "nl", True),
    "matrix +sinks, K only": ("matrix", "f16", True),
    "nl +sinks, V only": ("f16", "nl", True),
    "diag +sinks +window 32": ("diag", "nl", True, 32),
    "nl +sinks +window 32, V only": ("f16", "nl", True, 32),
}


def code(kind: str, x: np.ndarray, cal: dict) -> np.ndarray:
    hd = x.shape[-1]
    if kind == "f16":
        return f16(x)
    if kind in ("q4_0", "nl"):
        return rotated(x, q4_0 if kind == "q4_0" else iq4_nl, k_block(hd))
    if kind == "q8_0":
        def q8(b):
            d = f16(np.abs(b).max(1) / 127)
            return np.round(b / np.where(d == 0, 1, d)[:, None]) * d[:, None]
        return rotated(x, q8, k_block(hd))
    return transformed_k(x, cal, kind)


def scored_logp(model, tokens, n_chunks: int, codec: tuple | None, calib: dict) -> list[np.ndarray]:
    """The scored rows' logits of each chunk with the codec on every stored row (None: f16)."""
    session = model.session(512, 512, "f32" if codec else "f16", "f32" if codec else "f16")
    backend, cache = session.cache.backend, session.cache
    pending: dict = {}  # (K?, layer) -> {slot: its coded row}, rows still held in f16 (the window)
    if codec:
        def put(dst, ggml_type, slots, rows, limit):
            type(backend).store_kv(backend, dst, ggml_type, np.asarray(slots, np.int64),
                                   np.ascontiguousarray(rows, np.float32), limit)

        def store(dst, ggml_type, slots, src, limit):
            is_k = any(a is dst for a in cache.k)
            layer = next(i for i, a in enumerate(cache.k if is_k else cache.v) if a is dst)
            x = code(codec[0 if is_k else 1], src, calib.get(layer, {}))
            if codec[2]:
                sink = slots < SINKS
                x[sink] = f16(src[sink])
            window = codec[3] if len(codec) > 3 else 0
            if not window:
                return put(dst, ggml_type, slots, x, limit)
            held = pending.setdefault((is_k, layer), {})
            if slots.min() == 0:  # a new chunk
                held.clear()
            held.update(zip(slots.tolist(), x))
            put(dst, ggml_type, slots, f16(src), limit)
            old = [slot for slot in held if slot <= slots.max() - window]
            if old:
                put(dst, ggml_type, old, np.stack([held.pop(slot) for slot in old]), limit)
        backend.store_kv = store
    bos = model.tokenizer.bos_id if model.tokenizer.add_bos else None
    try:
        return [np.concatenate([rows for rows, _ in chunk_logits(session, tokens[i * 512:(i + 1) * 512], bos)])
                for i in range(n_chunks)]
    finally:
        backend.__dict__.pop("store_kv", None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", default="smollm2-135m-instruct")
    p.add_argument("-f", "--file", default=str(ROOT / "tests" / "reference" / "gpl3.txt"))
    p.add_argument("--calib", default=str(ROOT / "README.md"))
    p.add_argument("--chunks", type=int, default=4)
    args = p.parse_args()
    model = load(str(resolve_model(args.model)))
    tokens = model.tokenizer.encode(Path(args.file).read_bytes(), add_bos=None)
    calib = calibrate(model, Path(args.calib))
    base = [log_softmax(r) for r in scored_logp(model, tokens, args.chunks, None, calib)]
    print(f"Machine: {machine_summary()}\n")
    print(f"{args.model}, {args.file}, -c 512, {args.chunks} chunks, calibrated on {args.calib}\n")
    print("| codec | mean KLD vs f16 | same top | seconds |\n|---|---|---|---|")
    for name, codec in CODECS.items():
        t0 = time.perf_counter()
        rows = scored_logp(model, tokens, args.chunks, codec, calib)
        kld = np.concatenate([kl_divergence(b, r) for b, r in zip(base, rows)])
        same = np.concatenate([b.argmax(1) == r.argmax(1) for b, r in zip(base, rows)])
        print(f"| {name} | {kld.mean():.4f} | {100 * same.mean():.1f}% | {time.perf_counter() - t0:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
