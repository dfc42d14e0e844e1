"""`edgekv serve`: an OpenAI-compatible HTTP server for one model.

What lives here: the command's options (llama.cpp server's --host, --port, --api-key; the
queue and body limits), the listening socket and running uvicorn. What does not: the
application, its routes, request checks, the generation queue, conversations and batching (server/).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys

from ..errors import EdgeKVError
from .speculative import add_speculative_options, speculation_from
from .common import add_kv_options, add_model_options, json_object, make_llama, mem_size, non_negative_int, positive_int


def add_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from ..server.limits import DEFAULT_MAX_BODY, DEFAULT_MAX_QUEUE, DEFAULT_SLOTS, DEFAULT_SPILL_MAX

    p = sub.add_parser("serve", parents=[common], help="serve a model over an OpenAI-compatible HTTP API",
                       description="Serve one model over HTTP: POST /v1/chat/completions, /v1/completions, "
                                   "GET /v1/models, /health, /slots, /metrics. Each conversation keeps its own KV "
                                   "cache; --parallel generations run at once, decoded together; idle "
                                   "conversations are spilled to disk when --slots or --kv-budget is full.")
    add_model_options(p)
    add_speculative_options(p)
    add_kv_options(p, shift_default="none")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=non_negative_int, default=8080, help="port, 0 = any free port (default: 8080)")
    p.add_argument("--api-key", metavar="KEY", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: no key)")
    p.add_argument("--queue", type=non_negative_int, default=DEFAULT_MAX_QUEUE, metavar="N",
                   help=f"requests that may wait while --parallel generate; more get 429 (default: {DEFAULT_MAX_QUEUE})")
    p.add_argument("-np", "--parallel", type=positive_int, default=1, metavar="N",
                   help="generations at once; their decode steps run as one batch (default: 1)")
    p.add_argument("--slots", type=positive_int, default=None, metavar="N",
                   help=f"conversations whose KV cache stays in memory, at least --parallel "
                        f"(default: max(--parallel, {DEFAULT_SLOTS}))")
    p.add_argument("--kv-budget", type=mem_size, default=None, metavar="SIZE",
                   help="bytes the live conversations' KV caches may take together, e.g. 512M "
                        "(default: the memory plan's budget)")
    p.add_argument("--spill-dir", default=None, metavar="DIR",
                   help="where idle conversations are written when memory is full (default: a temporary "
                        "directory, removed at exit)")
    p.add_argument("--spill-max", type=mem_size, default=DEFAULT_SPILL_MAX, metavar="SIZE",
                   help="bytes of spilled conversations kept on disk; the oldest beyond it are forgotten "
                        "and evaluated again if they return (default: 1G)")
    p.add_argument("--max-body", type=mem_size, default=DEFAULT_MAX_BODY, metavar="SIZE",
                   help="largest request body, e.g. 1M; larger get 413 (default: 1M)")
    p.add_argument("--reasoning-format", choices=["auto", "deepseek", "none"], default="auto",
                   help="a reply's leading <think> block: auto/deepseek = returned as reasoning_content apart "
                        "from content (llama-server's default), none = left in content (default: auto)")
    p.add_argument("--chat-template-kwargs", type=json_object, default=None, metavar="JSON",
                   help="template variables for every chat request, e.g. '{\"enable_thinking\": false}'; a "
                        "request's chat_template_kwargs adds to them")
    p.add_argument("--seed", type=int, default=-1,
                   help="sampling seed for requests without one, -1 = random (default: -1)")
    p.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ..server import create_app

    if args.port > 65535:
        raise EdgeKVError(f"--port {args.port}: expected 0-65535")
    sock = _listen(args.host, args.port)  # before loading the model: a taken port fails fast
    llm = make_llama(args, draft_model=speculation_from(args))
    app = create_app(llm, model_id=os.path.basename(args.model), api_key=args.api_key, max_queue=args.queue, max_body=args.max_body,
                     reasoning_format=args.reasoning_format, chat_template_kwargs=args.chat_template_kwargs,
                     parallel=args.parallel, slots=args.slots, kv_budget=args.kv_budget, spill_dir=args.spill_dir,
                     spill_max=args.spill_max)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    if args.api_key is None and not _is_loopback(host):
        print(f"edgekv: warning: listening on {host} without --api-key: anyone who can reach it can use it",
              file=sys.stderr)
    print(f"edgekv: serving {args.model} at http://{shown}:{port}/v1 (OpenAI-compatible; Ctrl-C stops)",
          file=sys.stderr, flush=True)
    verbose = getattr(args, "verbose", 0)
    config = uvicorn.Config(app, log_level="info" if verbose else "warning", access_log=bool(verbose),
                            timeout_graceful_shutdown=5)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def _listen(host: str, port: int) -> socket.socket:
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        raise EdgeKVError(f"cannot listen on {host}:{port}: {exc}") from exc
    sock.set_inheritable(True)
    return sock


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
