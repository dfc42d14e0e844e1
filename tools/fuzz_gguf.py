"""Mutation fuzzing of edgekv's GGUF loading: seeded mutants of a tiny model, each loaded and,
when it loads, run for one token. The only outcomes allowed are those two, or an
EdgeKVError (GGUFError, UnsupportedModelError, TokenizerError) naming the problem.

    python tools/fuzz_gguf.py --n 1000000 --seed 7        # a long run; prints what broke
    python tools/fuzz_gguf.py --n 20000 --arch gemma3

Mutations (tools/fuzz_gguf.py `mutate`): bit flips, byte replacements, splices (a run of
bytes copied over another place), and integer fields (u32/u64 at a random offset) set to
0, 1, -1, 2^31, 2^63 or 2^64-1. Three quarters of them land in the header, metadata and
tensor directory (where the parser works), the rest in the tensor data. tests/test_gguf_fuzz.py
runs 20,000 per `make test`; every input that broke something is kept there as a regression.
"""

from __future__ import annotations

import argparse
import logging
import random
import struct
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SPECIAL_INTS = (0, 1, 2**32 - 1, 2**31, 2**63, 2**64 - 1)


def mutate(blob: bytes, rng: random.Random, data_start: int) -> bytes:
    """One mutant of blob; data_start: where the tensor data begins."""
    out = bytearray(blob)
    at = rng.randrange(data_start) if rng.random() < 0.75 else rng.randrange(data_start, len(out))
    kind = rng.randrange(4)
    if kind == 0:
        out[at] ^= 1 << rng.randrange(8)
    elif kind == 1:
        out[at] = rng.randrange(256)
    elif kind == 2:
        n = rng.randrange(1, 16)
        src = rng.randrange(len(out) - n)
        out[at : at + n] = out[src : src + n]
    else:
        value = rng.choice(SPECIAL_INTS)
        if rng.random() < 0.5 and at + 8 <= len(out):
            struct.pack_into("<Q", out, at, value % 2**64)
        elif at + 4 <= len(out):
            struct.pack_into("<I", out, at, value % 2**32)
    return bytes(out)


def try_load(path: Path) -> str:
    """'ok' (loaded and generated a token) or the EdgeKVError class name; anything else raises."""
    from edgekv.errors import EdgeKVError
    from edgekv.loader import load

    try:
        model = load(path)
        session = model.session(n_ctx=16, n_batch=4)
        session.eval([min(1, model.hp.n_vocab - 1)])
    except EdgeKVError as exc:
        return type(exc).__name__
    return "ok"


def data_offset(blob: bytes, path: Path) -> int:
    import numpy as np

    from edgekv.gguf.reader import GGUFFile

    path.write_bytes(blob)
    g = GGUFFile(path)
    base = min(int(t.data.ctypes.data) for t in g.tensors.values())
    start = base - int(np.frombuffer(g._map, "u1", count=1).ctypes.data)
    del g
    return start


def fuzz(blob: bytes, n: int, seed: int, folder: Path, time_limit_s: float = 10.0) -> tuple[dict, list]:
    """Run n mutants; returns (outcome counts, failures as (index, exception text, mutant)).
    A mutant that takes more than time_limit_s of this process's CPU time (not wall time: a
    run sharing its cores with others must not flag mutants that were only kept waiting) fails."""
    rng = random.Random(seed)
    start = data_offset(blob, folder / "base.gguf")
    counts: dict[str, int] = {}
    failures = []
    path = folder / "mutant.gguf"
    for i in range(n):
        mutant = mutate(blob, rng, start)
        path.write_bytes(mutant)
        t0 = time.process_time()
        try:
            outcome = try_load(path)
        except Exception as exc:  # noqa: BLE001 - what the fuzzer is for
            outcome = "FAIL"
            failures.append((i, "".join(traceback.format_exception_only(type(exc), exc)).strip(), mutant))
        spent = time.process_time() - t0
        if spent > time_limit_s:
            failures.append((i, f"took {spent:.1f} s of CPU time", mutant))
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts, failures


def truncations(blob: bytes, folder: Path, cuts) -> list[tuple[int, str]]:
    """The cuts of blob that do not raise a GGUFError when opened: (cut, what happened)."""
    from edgekv.errors import GGUFError
    from edgekv.gguf.reader import GGUFFile

    path, bad = folder / "cut.gguf", []
    for cut in cuts:
        path.write_bytes(blob[:cut])
        try:
            GGUFFile(path)
            bad.append((cut, "opened"))
        except GGUFError:
            pass
        except Exception as exc:  # noqa: BLE001
            bad.append((cut, f"{type(exc).__name__}: {exc}"))
    return bad


def tiny_blob(arch: str, folder: Path) -> bytes:
    from edgekv.testing.tiny_model import make_tiny_model

    path = make_tiny_model(folder / "tiny.gguf", arch=arch, weight_type="Q8_0", n_layers=1, dim=32, n_heads=2,
                           n_kv_heads=1, head_dim=16, ff=64, n_ctx=64)
    return path.read_bytes()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--arch", default="llama")
    p.add_argument("--keep", type=Path, help="folder to write the mutants that broke something into")
    p.add_argument("--truncate", action="store_true", help="instead: cut the tiny model at every byte")
    args = p.parse_args(argv)
    logging.getLogger("edgekv").setLevel(logging.CRITICAL)  # a mutant's tokenizer warnings are expected
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        if args.truncate:
            blob = tiny_blob(args.arch, folder)
            bad = truncations(blob, folder, range(len(blob)))
            print(f"{len(blob)} cuts in {time.perf_counter() - t0:.0f} s: {len(bad)} not refused {bad[:5]}")
            return 1 if bad else 0
        counts, failures = fuzz(tiny_blob(args.arch, folder), args.n, args.seed, folder)
        print(f"{args.n} mutants in {time.perf_counter() - t0:.0f} s: {counts}")
        for i, what, mutant in failures[:20]:
            print(f"mutant {i}: {what}")
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                (args.keep / f"{args.arch}-{args.seed}-{i}.gguf").write_bytes(mutant)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
