"""Regenerate tests/reference/ from llama.cpp: token ids, greedy runs and perplexities.

The data files are llama.cpp's figures; this script is how they are made, so that anyone
can check or renew them. It needs llama-cpp-python 0.3.36 built from source with the
flags in tests/reference/README.md (it is not an edgekv dependency: build it in its own
virtualenv), and, for `perplexity`, llama.cpp's llama-perplexity built from the same
source (`vendor/llama.cpp` of that sdist). Run it with that virtualenv's interpreter:

    /tmp/lcpp/bin/python tools/make_reference.py greedy tests/reference/llama_cpp_reference.json
    /tmp/lcpp/bin/python tools/make_reference.py perplexity tests/reference/perplexity.json \\
        --llama-perplexity /path/to/llama.cpp/build/bin/llama-perplexity

Models are found in edgekv's model cache ($EDGEKV_HOME/models, default ~/.cache/edgekv/
models; `edgekv pull NAME` puts them there) or given with --models-dir.

What `greedy` computes, per model (the inputs are the constants below):
- tokenize: each text's ids without BOS, with special tokens read as text and parsed;
- greedy: the prompt (BOS as the model's add_bos says) evaluated as one batch with all
  logits, then N_GREEDY steps of argmax, one token at a time; at every prompt position and
  step the TOP most likely ids and their log-probs (log-softmax of the logits in float64,
  rounded to 5 decimals);
- chat (SmolLM2): the messages rendered by the GGUF's own chat template, then the same
  greedy steps until an end-of-generation token (kept) or N_CHAT steps.
Flash attention is off for these runs; llama-perplexity runs with it on (its default).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

MODELS = {  # key in the JSON -> GGUF file name in the model cache
    "smollm2-135m-instruct-q4_1": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3-270m-q4_k_m": "gemma-3-270m-q4_k_m.gguf",
}
TOKENIZE_TEXTS = [
    "Hello world", " Hello world", "Hello  world   with   spaces", "tabs\tand\nnew\n\nlines",
    "The KV cache stores keys and values.", "KV Cache 是大模型推理的核心", "显存字节数 = 2 * batch_size * num_layers",
    "emoji 👍🏽 and ✨ sparkle", "numbers 1234567890 and 3.14159", "it's don't we'll I'M",
    "def f(x):\n    return x * 2\n", "ÀÉÎÕÜ àéîõü ß", "   leading and trailing   ", "<|im_start|>user\nhi<|im_end|>",
]
GREEDY_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
                  "A KV cache stores"]
CHATS = {"smollm2-135m-instruct-q4_1": [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a concise assistant."}, {"role": "user", "content": "Name three fruits."}],
]}
N_GREEDY, N_CHAT, TOP = 48, 64, 32
SOURCE = "llama.cpp (vendored in llama-cpp-python 0.3.36, CPU build), greedy = argmax of logits"
PERPLEXITY_RUNS = [(512, "f16"), (512, "q8_0"), (512, "q4_0"), (2048, "f16")]  # (n_ctx, K and V cache type)
FA_OFF_RUNS = [(512, "f16"), (2048, "f16")]  # with flash attention off: V summed in f32, as edgekv's batch path
PERPLEXITY_METHOD = (
    "llama.cpp llama-perplexity: tokenize the whole file (BOS added when the model's add_bos is true); split "
    "into consecutive chunks of n_ctx tokens (remainder dropped); in each chunk replace the first token by BOS "
    "when add_bos; evaluate each chunk from an empty cache; score the tokens at positions n_ctx/2+1 .. n_ctx-1 "
    "(the prediction at position p scores token p+1, for p = n_ctx/2 .. n_ctx-2), i.e. n_ctx/2-1 tokens per "
    "chunk; PPL = exp(mean NLL over all scored tokens). Threads 2, flash attention as each row's "
    "flash_attn (on where absent), cache types as given (same type for K and V); cpu: where the row was measured.")
REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "reference"


def models_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    return Path(os.environ.get("EDGEKV_HOME", Path.home() / ".cache" / "edgekv")) / "models"


def top_logprobs(logits) -> dict:
    import numpy as np

    z = np.asarray(logits, np.float64)
    lp = z - z.max() - np.log(np.exp(z - z.max()).sum())
    ids = np.argsort(-lp, kind="stable")[:TOP]
    return {"ids": [int(i) for i in ids], "logprobs": [round(float(lp[i]), 5) for i in ids]}


def greedy_run(llm, prompt_ids: list[int], n_steps: int, stop_at_eog: bool) -> dict:
    """The prompt as one batch, then argmax steps one token at a time."""
    import numpy as np
    import llama_cpp

    llm.reset()
    llm.eval(prompt_ids)
    prompt_top = [top_logprobs(llm.scores[i]) for i in range(len(prompt_ids))]
    ids, steps = [], []
    for _ in range(n_steps):
        logits = llm.scores[llm.n_tokens - 1]
        steps.append(top_logprobs(logits))
        ids.append(int(np.argmax(logits)))
        if stop_at_eog and llama_cpp.llama_vocab_is_eog(llm._model.vocab, ids[-1]):
            break
        llm.eval(ids[-1:])
    return dict(prompt_ids=list(prompt_ids), greedy_ids=ids, greedy_text=llm.detokenize(ids).decode("utf-8", "replace"),
                prompt_logprobs_top=prompt_top, steps_top=steps)


def chat_prompt(llm, messages: list[dict]) -> str:
    """The messages rendered by the GGUF's own template, as llama-cpp-python renders it."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = llm.metadata["tokenizer.chat_template"]
    eos = llm.detokenize([llm.token_eos()], special=True).decode()
    bos = llm.detokenize([llm.token_bos()], special=True).decode() if llm.token_bos() >= 0 else ""
    return Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)(messages=messages).prompt


def model_reference(path: Path, key: str) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=512, n_batch=512, n_threads=2, logits_all=True, flash_attn=False,
                          verbose=False)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llm._model.vocab))
    out = dict(file=path.name, add_bos=add_bos, tokenize=[], greedy=[], chat=[])
    for text in TOKENIZE_TEXTS:
        out["tokenize"].append(dict(text=text, ids_no_special=llm.tokenize(text.encode(), add_bos=False, special=False),
                                    ids_parse_special=llm.tokenize(text.encode(), add_bos=False, special=True)))
    for prompt in GREEDY_PROMPTS:
        ids = llm.tokenize(prompt.encode(), add_bos=add_bos, special=False)
        out["greedy"].append(dict(prompt=prompt, **greedy_run(llm, ids, N_GREEDY, stop_at_eog=False)))
    for messages in CHATS.get(key, []):
        rendered = chat_prompt(llm, messages)
        ids = llm.tokenize(rendered.encode(), add_bos=add_bos, special=True)
        run = greedy_run(llm, ids, N_CHAT, stop_at_eog=True)
        out["chat"].append(dict(messages=messages, rendered_prompt=rendered, prompt_ids=run["prompt_ids"],
                                greedy_ids=run["greedy_ids"], steps_top=run["steps_top"],
                                greedy_text=run["greedy_text"]))
    return out


def make_greedy(out: Path, folder: Path) -> None:
    data = {"source": SOURCE, "models": {key: model_reference(folder / name, key) for key, name in MODELS.items()}}
    out.write_text(json.dumps(data, indent=1, ensure_ascii=False))
    print(f"wrote {out}")


def _cpu() -> str:
    # the CPU's model and the flags that choose llama.cpp's x86 kernels (its figures depend on them)
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = set((re.search(r"^flags\s*:\s*(.+)$", info, re.M) or re.search("()", "")).group(1).split())
    chosen = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512vnni", "avx512_bf16") if f in flags]
    return f"{name.group(1) if name else 'unknown CPU'} ({' '.join(chosen)})"


def make_perplexity(out: Path, folder: Path, binary: str, text: Path, flash_attn: str) -> None:
    """Run llama-perplexity for every PERPLEXITY_RUNS row (flash attention on) or FA_OFF_RUNS
    row (off) and write them into `out`, keeping the rows of the other setting already there
    (a row without "flash_attn" is an "on" row). Each row records the CPU it was measured on:
    llama.cpp's own figures differ by ~0.15% between its AVX2 and AVX-512 kernels."""
    results = []
    for name in MODELS.values():
        for n_ctx, cache in PERPLEXITY_RUNS if flash_attn == "on" else FA_OFF_RUNS:
            cmd = [binary, "-m", str(folder / name), "-f", str(text), "-c", str(n_ctx), "-b", str(n_ctx), "-t", "2",
                   "-ctk", cache, "-ctv", cache, "-fa", flash_attn]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            log = done.stdout + done.stderr
            ppl = float(re.search(r"Final estimate: PPL = ([0-9.]+)", log).group(1))
            chunks = int(re.search(r"calculating perplexity over (\d+) chunks", log).group(1))
            results.append(dict(model=name, n_ctx=n_ctx, chunks=chunks, cache=cache, flash_attn=flash_attn,
                                cpu=_cpu(), ppl=ppl))
            print(results[-1], flush=True)
    kept = []
    if out.exists():
        kept = [r for r in json.loads(out.read_text())["results"] if r.get("flash_attn", "on") != flash_attn]
    engine = "llama.cpp build 0c1e570 (vendored in llama-cpp-python 0.3.36), CPU"
    data = dict(method=PERPLEXITY_METHOD, engine=engine, file=text.name, results=kept + results)
    out.write_text(json.dumps(data, indent=1))
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["greedy", "perplexity"])
    parser.add_argument("out", type=Path, help="the JSON file to write")
    parser.add_argument("--models-dir", help="folder with the GGUF files (default: edgekv's model cache)")
    parser.add_argument("--llama-perplexity", help="path of llama.cpp's llama-perplexity (for `perplexity`)")
    parser.add_argument("--text", type=Path, default=REFERENCE / "gpl3.txt", help="evaluation text for `perplexity`")
    parser.add_argument("--flash-attn", choices=["on", "off"], default="on",
                        help="`perplexity`: llama-perplexity's -fa; rows of the other setting in OUT are kept")
    args = parser.parse_args(argv)
    folder = models_dir(args.models_dir)
    if args.what == "greedy":
        make_greedy(args.out, folder)
    elif not args.llama_perplexity:
        parser.error("perplexity needs --llama-perplexity PATH")
    else:
        make_perplexity(args.out, folder, args.llama_perplexity, args.text, args.flash_attn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
