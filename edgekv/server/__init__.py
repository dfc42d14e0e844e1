"""`edgekv serve`: an OpenAI-compatible HTTP server on Starlette + uvicorn.

What lives here: the application, its generation queue and streaming (app.py) and the
parsing and checking of request bodies (requests.py), the default limits (limits.py). The command-line entry is
cli/serve.py.
"""

from .limits import DEFAULT_MAX_BODY, DEFAULT_MAX_QUEUE

__all__ = ["DEFAULT_MAX_BODY", "DEFAULT_MAX_QUEUE", "create_app"]


def __getattr__(name: str):
    # the application (Starlette, the model code) is imported when it is used, not when the
    # command line reads the defaults above
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
