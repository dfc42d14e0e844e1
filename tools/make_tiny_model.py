"""Write a tiny random-weight GGUF model (llama, mistral, gemma3, qwen2, qwen3, phi3) for tests: edgekv.testing.tiny_model's CLI.

    python tools/make_tiny_model.py tiny.gguf --arch gemma3 --type Q8_0
"""

import sys

from edgekv.testing.tiny_model import main

if __name__ == "__main__":
    sys.exit(main())
