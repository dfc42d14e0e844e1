"""Dump llama.cpp's intermediate tensors for a token sequence, to compare op by op.

This is how edgekv was made bit-identical to llama.cpp: run the same tokens through
both, then find the first tensor that differs (`ffn_inp-3`, `kq-0`, ...). It needs
llama-cpp-python, which is not an edgekv dependency; build it as
tests/reference/README.md describes (CPU flags for these machines), e.g. in its own
virtualenv, and run this script with that interpreter:

    /tmp/lcpp/bin/python tools/llama_cpp_dump.py MODEL.gguf 504,3575,282 out.npz [--batch]

Every float32 tensor llama.cpp computes is stored in out.npz as "<step>:<name>" (names
as llama.cpp's graph callbacks give them, e.g. "0:attn_norm-0", "2:kqv_out-5"), shaped
like NumPy arrays of the tensor's ne[3], ne[2], ne[1], ne[0]. Without --batch the tokens
are decoded one at a time (steps 0..n-1, llama.cpp's single-token kernels); with --batch
they are one batch (step 0, its batched kernels, which sum in other orders); with --prompt N
the first N are (step 0) and the rest follow one at a time, as a chat's reply does. Flash
attention is off, as in the reference data.
"""

from __future__ import annotations

import argparse
import ctypes
import os

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("tokens", help="comma-separated token ids")
    ap.add_argument("out", help=".npz file to write")
    ap.add_argument("--batch", action="store_true", help="evaluate the tokens as one batch")
    ap.add_argument("--prompt", type=int, default=0, metavar="N",
                    help="the first N tokens as one batch (step 0), then the rest one at a time")
    ap.add_argument("-c", "--ctx-size", type=int, default=256)
    args = ap.parse_args()
    import llama_cpp as L  # noqa: the script runs with llama-cpp-python's interpreter

    base = ctypes.CDLL(os.path.join(os.path.dirname(L.__file__), "lib", "libggml-base.so"))
    base.ggml_get_name.restype = ctypes.c_char_p
    base.ggml_get_name.argtypes = [ctypes.c_void_p]
    base.ggml_nbytes.restype = ctypes.c_size_t
    base.ggml_nbytes.argtypes = [ctypes.c_void_p]
    base.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    dumps: dict[str, np.ndarray] = {}
    step = [0]

    @L.ggml_backend_sched_eval_callback
    def on_tensor(t, ask, _user):
        if ask:
            return True  # yes, show us every tensor
        if ctypes.c_int32.from_address(t).value == 0:  # struct ggml_tensor starts with its type; 0 = F32
            ne = (ctypes.c_int64 * 4).from_address(t + 16)  # then a buffer pointer, then ne[4], nb[4]
            nb = (ctypes.c_size_t * 4).from_address(t + 48)
            buf = np.empty(base.ggml_nbytes(t) // 4, np.float32)  # a view's span, strides and all
            base.ggml_backend_tensor_get(t, buf.ctypes.data, 0, buf.nbytes)
            name = base.ggml_get_name(t).decode()
            view = np.lib.stride_tricks.as_strided(buf, (ne[3], ne[2], ne[1], ne[0]), (nb[3], nb[2], nb[1], nb[0]))
            dumps[f"{step[0]}:{name}"] = view.squeeze().copy()
        return True

    ids = [int(x) for x in args.tokens.split(",")]
    L.llama_backend_init()
    model = L.llama_model_load_from_file(args.model.encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch = args.ctx_size, 2, 2
    cp.cb_eval, cp.flash_attn_type = on_tensor, 0
    ctx = L.llama_init_from_model(model, cp)
    chunks = [ids] if args.batch else [[t] for t in ids]
    if args.prompt:
        chunks = [ids[: args.prompt]] + [[t] for t in ids[args.prompt:]]
    for i, chunk in enumerate(chunks):
        step[0] = i
        arr = (L.llama_token * len(chunk))(*chunk)  # kept alive while llama_decode reads it
        rc = L.llama_decode(ctx, L.llama_batch_get_one(arr, len(chunk)))
        if rc != 0:
            raise SystemExit(f"llama_decode failed with {rc}")
    np.savez(args.out, **dumps)
    print(f"{len(dumps)} tensors -> {args.out}")


if __name__ == "__main__":
    main()
