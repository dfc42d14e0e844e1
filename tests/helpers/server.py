"""A real server for the tests of edgekv/server.py (test_server.py, test_server_sessions.py,
test_server_load.py, test_tools.py): uvicorn on a free port of 127.0.0.1 in a thread, and
the official `openai` client pointed at it.

    serving(app)               a context manager: the app served, yields its port
    openai_client(url, key)    an OpenAI client that never retries and waits at most WAIT_S
    WAIT_S                     the longest any request, thread or process of these tests may take
    KEY                        the API key test_server.py's server requires
"""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager

import openai
import uvicorn

KEY = "test-key"
WAIT_S = 120  # the longest any request, thread or process in these tests may take: then it fails


@contextmanager
def serving(app):
    """Run `app` with uvicorn on a free port (the socket listens before the thread starts,
    so requests made at once wait in its backlog); yields the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(WAIT_S)
        sock.close()
        assert not thread.is_alive(), f"the server did not stop within {WAIT_S} s"


def openai_client(url: str, api_key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=WAIT_S)
