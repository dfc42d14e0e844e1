"""The server's default limits, apart from the application so that `edgekv --help` and every
other command can show them without importing the server (Starlette, the model code)."""

DEFAULT_MAX_QUEUE = 16  # requests that may wait while one generates
DEFAULT_MAX_BODY = 1 << 20  # bytes of request JSON
DEFAULT_SLOTS = 4  # conversations whose KV cache stays in memory (at least --parallel)
DEFAULT_SPILL_MAX = 1 << 30  # bytes of spilled conversations on disk
