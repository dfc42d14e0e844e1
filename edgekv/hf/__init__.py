"""Hugging Face checkpoints in and out: `edgekv convert` and `edgekv convert --to-hf`.

safetensors.py reads and writes the weights; families.py names tensors on both sides;
gguf_params.py and vocab.py make the GGUF metadata as llama.cpp's converter does;
convert.py streams HF -> GGUF; hf_config.py, tokenizer_files.py, spm_model.py and to_hf.py
go GGUF -> HF.
"""
