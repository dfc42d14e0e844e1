"""llama.cpp's side of compare_llama_cpp.py: llama-bench's timing through llama-cpp-python's
low-level API, in whichever interpreter has `llama_cpp` (it need not have edgekv or NumPy).

What lives here: loading a model, making a context as llama-bench does for one test
(n_ctx = depth + prompt + generation, n_batch = n_ubatch, threads, K/V cache types, flash
attention, a ggml threadpool attached), its warm-up, and timing one repetition at a time:
clear the memory, restore the depth prefix (evaluated once, then kept as sequence state),
then evaluate n_prompt random ids in n_batch chunks (pp) or decode n_gen ids one by one
(tg). The ids are drawn before the clock starts. What does not: statistics and output
(the caller's, through edgekv/lab/bench.py).

Protocol: one JSON request per line on stdin, one JSON reply per line on stdout:
  {"op": "load", "model": PATH}          -> {"ok": true, "model_type", "model_size", "model_n_params", "version"}
  {"op": "open", "n_prompt", "n_gen", "n_depth", "n_batch", "n_threads", "type_k", "type_v", "flash_attn"}
                                         -> {"ok": true}   (context made, warm-up done)
  {"op": "sample"}                       -> {"ok": true, "ns": NANOSECONDS}
  {"op": "close"}                        -> {"ok": true}
A failure answers {"ok": false, "error": MESSAGE}; end of input ends the worker. llama.cpp's
own messages are silenced; anything printed at the C level goes to stderr.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import sys
import time

GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type; llama-bench's default is auto
THREADPOOL_PARAMS_BYTES = 4096  # > sizeof(struct ggml_threadpool_params) (528 in ggml 0.9): filled by ggml


class WorkerError(Exception):
    pass


class Bench:
    def __init__(self, llama_cpp):
        self.L = llama_cpp
        self.model = self.ctx = self.threadpool = None
        self.test: dict = {}
        self._pool_api = _threadpool_api(llama_cpp)

    def load(self, model: str) -> dict:
        L = self.L
        self.close()
        if self.model is not None:
            L.llama_model_free(self.model)
        self.model = L.llama_model_load_from_file(model.encode(), L.llama_model_default_params())
        if not self.model:
            raise WorkerError(f"llama.cpp could not load {model}")
        vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(vocab)
        self.bos = L.llama_vocab_bos(vocab) if L.llama_vocab_get_add_bos(vocab) else None
        desc = ctypes.create_string_buffer(256)
        L.llama_model_desc(self.model, desc, len(desc))
        return {"model_type": desc.value.decode(errors="replace"), "model_size": int(L.llama_model_size(self.model)),
                "model_n_params": int(L.llama_model_n_params(self.model)), "version": L.__version__}

    def open(self, n_prompt: int, n_gen: int, n_depth: int, n_batch: int, n_threads: int, type_k: str,
             type_v: str, flash_attn: str = "auto") -> dict:
        L = self.L
        if self.model is None:
            raise WorkerError("no model loaded")
        self.close()
        p = L.llama_context_default_params()
        p.n_ctx = n_depth + n_prompt + n_gen
        p.n_batch = p.n_ubatch = n_batch
        p.n_threads = p.n_threads_batch = n_threads
        p.type_k, p.type_v = _ggml_type(type_k), _ggml_type(type_v)
        p.flash_attn_type = FLASH_ATTN[flash_attn]
        p.swa_full = False  # as llama-bench
        self.ctx = L.llama_init_from_model(self.model, p)
        if not self.ctx:
            raise WorkerError(f"llama.cpp could not make a context for {type_k}/{type_v}, flash_attn {flash_attn}")
        self._attach_threadpool(n_threads)
        self.test = dict(n_prompt=n_prompt, n_gen=n_gen, n_depth=n_depth, n_batch=n_batch)
        self.rng = random.Random(0)
        self.depth_state = None
        L.llama_memory_clear(L.llama_get_memory(self.ctx), False)
        if n_prompt:  # llama-bench's warm-up: the whole prompt, or one generated token
            self._run_prompt(self._prompt_chunks(n_prompt))
        if n_gen:
            self._run_gen(self._gen_tokens(1))
        return {}

    def _attach_threadpool(self, n_threads: int) -> None:
        """llama-bench attaches a threadpool (ggml's defaults: poll 50); without one, ggml
        makes a new pool for every graph it computes."""
        if self._pool_api is None:
            return
        params_init, pool_new, _, attach = self._pool_api
        params = ctypes.create_string_buffer(THREADPOOL_PARAMS_BYTES)
        params_init(params, n_threads)
        self.threadpool = pool_new(params)
        if self.threadpool:
            attach(self.ctx, self.threadpool, None)

    def _prompt_chunks(self, n: int) -> list:
        ids = [self.rng.randrange(self.n_vocab) for _ in range(n)]
        if ids and self.bos is not None:
            ids[0] = self.bos
        step = self.test["n_batch"]
        return [(ctypes.c_int32 * len(chunk))(*chunk) for chunk in (ids[i:i + step] for i in range(0, n, step))]

    def _gen_tokens(self, n: int) -> list:
        ids = [self.rng.randrange(self.n_vocab) for _ in range(n)]
        if ids and self.bos is not None:
            ids[0] = self.bos
        return [(ctypes.c_int32 * 1)(t) for t in ids]

    def _decode(self, tokens) -> None:
        rc = self.L.llama_decode(self.ctx, self.L.llama_batch_get_one(tokens, len(tokens)))
        if rc != 0:
            raise WorkerError(f"llama_decode failed with {rc}")

    def _run_prompt(self, chunks: list) -> None:
        for chunk in chunks:
            self._decode(chunk)
        self.L.llama_synchronize(self.ctx)

    def _run_gen(self, tokens: list) -> None:
        for token in tokens:
            self._decode(token)
            self.L.llama_synchronize(self.ctx)

    def _start(self) -> None:
        """An empty memory, or the depth prefix: evaluated the first time, restored after."""
        L, t = self.L, self.test
        L.llama_memory_clear(L.llama_get_memory(self.ctx), False)
        if not t["n_depth"]:
            return
        if self.depth_state is not None:
            buf = self.depth_state
            if L.llama_state_seq_set_data(self.ctx, buf, len(buf), 0):
                return
            L.llama_memory_clear(L.llama_get_memory(self.ctx), False)
        self._run_prompt(self._prompt_chunks(t["n_depth"]))
        size = L.llama_state_seq_get_size(self.ctx, 0)
        self.depth_state = (ctypes.c_uint8 * size)()
        L.llama_state_seq_get_data(self.ctx, self.depth_state, size, 0)

    def sample(self) -> dict:
        if self.ctx is None:
            raise WorkerError("no test open")
        t = self.test
        self._start()
        chunks = self._prompt_chunks(t["n_prompt"]) if t["n_prompt"] else []
        tokens = self._gen_tokens(t["n_gen"])
        t0 = time.perf_counter_ns()
        if chunks:
            self._run_prompt(chunks)
        self._run_gen(tokens)
        return {"ns": time.perf_counter_ns() - t0}

    def close(self) -> dict:
        if self.ctx is not None:
            self.L.llama_free(self.ctx)
            self.ctx = None
        if self.threadpool:
            self._pool_api[2](self.threadpool)
            self.threadpool = None
        return {}


def _ggml_type(name: str) -> int:
    if name not in GGML_TYPES:
        raise WorkerError(f"cache type {name!r} is not one of {', '.join(GGML_TYPES)}")
    return GGML_TYPES[name]


def _threadpool_api(llama_cpp):
    """(params_init, threadpool_new, threadpool_free, attach) from the libraries llama_cpp
    loaded, or None where they are not found (the context then makes its own pools)."""
    lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    try:
        base = ctypes.CDLL(os.path.join(lib, "libggml-base.so"))
        cpu = ctypes.CDLL(os.path.join(lib, "libggml-cpu.so"))
        llama = ctypes.CDLL(os.path.join(lib, "libllama.so"))
        params_init, pool_new = base.ggml_threadpool_params_init, cpu.ggml_threadpool_new
        pool_free, attach = cpu.ggml_threadpool_free, llama.llama_attach_threadpool
    except (OSError, AttributeError) as exc:
        print(f"llama_cpp_worker: no threadpool control ({exc}); llama.cpp makes its own", file=sys.stderr)
        return None
    params_init.argtypes, params_init.restype = [ctypes.c_void_p, ctypes.c_int], None
    pool_new.argtypes, pool_new.restype = [ctypes.c_void_p], ctypes.c_void_p
    pool_free.argtypes, pool_free.restype = [ctypes.c_void_p], None
    attach.argtypes, attach.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p], None
    return params_init, pool_new, pool_free, attach


def serve(bench: Bench, requests, replies) -> None:
    ops = {"load": bench.load, "open": bench.open, "sample": bench.sample, "close": bench.close}
    for line in requests:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            op = request.pop("op", None)
            if op not in ops:
                raise WorkerError(f"unknown op {op!r} (expected one of {', '.join(ops)})")
            reply = {"ok": True, **ops[op](**request)}
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller as a message
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    bench.close()


def main() -> int:
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray C-level output must not reach the protocol
    try:
        import llama_cpp
    except ImportError as exc:
        replies.write(json.dumps({"ok": False, "error": f"cannot import llama_cpp in {sys.executable}: {exc}"}) + "\n")
        return 1

    @llama_cpp.llama_log_callback
    def quiet(level, text, user_data):
        pass

    llama_cpp.llama_log_set(quiet, ctypes.c_void_p())
    llama_cpp.llama_backend_init()
    replies.write(json.dumps({"ok": True, "version": llama_cpp.__version__}) + "\n")
    replies.flush()
    serve(Bench(llama_cpp), sys.stdin, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
