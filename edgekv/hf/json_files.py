"""The JSON files of a Hugging Face checkpoint folder, read and written one way.

What lives here: `json_file` (a folder's config.json, tokenizer.json, ...: its object, {} when
the file is absent, a ConvertError naming the file when it is not JSON) and `json_bytes` (what
`--to-hf` writes: indented UTF-8 with a final newline). What does not: what the keys mean
(gguf_params.py, special_vocab.py, vocab.py, hf_config.py).
"""

from __future__ import annotations

import json
import os

from ..errors import ConvertError


def json_file(directory: str, name: str) -> dict:
    path = os.path.join(directory, name)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as e:
        raise ConvertError(f"{path}: not valid JSON ({e}); the checkpoint file is damaged") from None


def json_bytes(obj) -> bytes:
    return json.dumps(obj, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"
