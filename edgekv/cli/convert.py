"""`edgekv convert`: a Hugging Face checkpoint to GGUF, or (--to-hf) a GGUF back to one.

What lives here: the command's options and messages. What does not: the work (hf/convert.py,
hf/to_hf.py).
"""

from __future__ import annotations

import argparse
import sys

from ..gguf.file_types import FILE_TYPE_NAMES


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "convert", parents=[common], help="convert a Hugging Face checkpoint to GGUF (or a GGUF back, --to-hf)",
        description="Convert the Hugging Face checkpoint in HF_DIR (config.json, safetensors, tokenizer files) "
                    "to a GGUF model, as llama.cpp's convert_hf_to_gguf.py does, without torch: families "
                    "llama (Llama 2/3, SmolLM, Mistral), qwen2, qwen3, gemma3. With --to-hf, turn the GGUF "
                    "file IN into a Hugging Face checkpoint folder instead.")
    p.add_argument("input", metavar="HF_DIR|IN.gguf", help="the checkpoint folder (or, with --to-hf, a GGUF file)")
    p.add_argument("-o", "--outfile", metavar="OUT.gguf",
                   help="the GGUF file to write (default: HF_DIR/<folder name>-<TYPE>.gguf)")
    p.add_argument("--outtype", default="auto", metavar="TYPE",
                   help="auto (the checkpoint's own bf16/f16; f16 for f32 weights, as llama.cpp), f32, f16, "
                        "bf16, q8_0, or a quantized file type (" + ", ".join(t for t in FILE_TYPE_NAMES
                                                                             if t.startswith("Q")) + "), "
                        "which converts losslessly and then quantizes. With --to-hf: auto, f32, f16, bf16")
    p.add_argument("--pre", metavar="NAME",
                   help="the BPE pre-tokenizer (tokenizer.ggml.pre) when tokenizer.json's is not recognised")
    p.add_argument("--to-hf", metavar="DIR", help="write IN.gguf as a Hugging Face checkpoint into DIR (new or empty)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import ConvertError

    try:
        if args.to_hf:
            from ..hf.to_hf import to_hf

            r = to_hf(args.input, args.to_hf, args.outtype)
            print(f"{r.path}: {r.n_tensors} tensors in {r.dtype}, {r.nbytes / 2**20:.1f} MiB, {r.seconds:.1f} s",
                  file=sys.stderr)
            return 0
        from ..hf.convert import convert

        r = convert(args.input, args.outfile, args.outtype, pre=args.pre)
    except OSError as exc:
        raise ConvertError(f"{exc.filename or args.input}: {exc.strerror or exc}; nothing was written") from None
    print(f"{r.path}: {r.n_tensors} tensors, {r.n_params / 1e6:.1f}M parameters, {r.outtype}, "
          f"{r.nbytes / 2**20:.1f} MiB, {r.seconds:.1f} s", file=sys.stderr)
    return 0
