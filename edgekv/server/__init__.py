"""`edgekv serve`: an OpenAI-compatible HTTP server on Starlette + uvicorn.

What lives here: the application, its generation queue and streaming (app.py) and the
parsing and checking of request bodies (requests.py). The command-line entry is
cli/serve.py.
"""

from .app import DEFAULT_MAX_BODY, DEFAULT_MAX_QUEUE, create_app

__all__ = ["DEFAULT_MAX_BODY", "DEFAULT_MAX_QUEUE", "create_app"]
