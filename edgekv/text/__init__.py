"""Text: tokenizers built from GGUF metadata and chat templates.

What lives here: the tokenizer front (tokenizer.py: encode, decode, the streaming
detokenizer), its two algorithms (bpe.py with llama.cpp's pre-tokenizers, spm.py), the
vocabulary read from GGUF (vocab.py) and chat templates rendered in a sandboxed Jinja2
environment (chat_format.py). Nothing here imports Numba or the kernels.
"""
