"""Extract llama.cpp's BPE pre-tokenizer hash table into edgekv/data/bpe_pre_hashes.json.

llama.cpp's converter names a BPE tokenizer's pre-tokenizer (`tokenizer.ggml.pre`) by
encoding a fixed check text and looking the sha256 of the ids up in a table generated into
`get_vocab_base_pre` (conversion/base.py, or convert_hf_to_gguf.py in older trees).
`edgekv convert` uses the same table as a cross-check of what it reads from tokenizer.json.

    python tools/make_pre_hashes.py /path/to/llama.cpp
"""

import json
import os
import re
import sys

root = sys.argv[1]
src = os.path.join(root, "conversion", "base.py")
if not os.path.isfile(src):
    src = os.path.join(root, "convert_hf_to_gguf.py")
text = open(src, encoding="utf-8").read()
body = text[text.index("def get_vocab_base_pre"):text.index("# Marker: End get_vocab_base_pre")]
chktxt = re.search(r"chktxt = (.+)\n", body)[1]
pairs = re.findall(r'if chkhsh == "([0-9a-f]{64})":\n\s+# ref: \S+\n\s+res = "([^"]+)"', body)
if len(pairs) != body.count("if chkhsh =="):
    sys.exit(f"{src}: parsed {len(pairs)} of {body.count('if chkhsh ==')} entries; the layout changed")
table = {"source": "llama.cpp " + os.path.relpath(src, root), "chktxt": eval(chktxt),  # a Python string literal
         "hashes": dict(pairs)}  # a later entry wins, as in the if-chain
out = os.path.join(os.path.dirname(__file__), "..", "edgekv", "data", "bpe_pre_hashes.json")
with open(out, "w", encoding="utf-8") as f:
    json.dump(table, f, indent=0, ensure_ascii=False)
print(f"{out}: {len(table['hashes'])} hashes")
