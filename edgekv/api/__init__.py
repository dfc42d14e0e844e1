"""The llama-cpp-python-compatible API: `Llama` and what it is made of.

What lives here: the facade (facade.py: class Llama), OpenAI-shaped responses and stop
strings (responses.py), log-prob records (logprobs.py), llama-cpp-python options and
threads (compat.py), the context that grows with a conversation (context_growth.py) and
the facade's state methods (llama_state.py). What does not: the model, sessions and
generation loop it is built on (loader.py, session.py, generate.py).

`from edgekv import Llama` is the import to use; `edgekv.api.Llama` is the same class.
"""

from .facade import Llama
from .llama_state import LlamaState

__all__ = ["Llama", "LlamaState"]
