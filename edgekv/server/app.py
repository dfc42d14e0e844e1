"""`edgekv serve`'s web application: an OpenAI-compatible HTTP API over one loaded model.

What lives here: `create_app(llm, ...)` (a Starlette app with /v1/chat/completions,
/v1/completions, /v1/models, /health, /slots and /metrics; the API key and body-size
checks), server-sent events for streams, mapping edgekv's exceptions to HTTP errors, and
wiring a request to its conversation: the request's prompt ids pick a conversation from the
SessionPool (sessions.py; or its `session_id` / `user` field does), the generation runs on a
GenerationQueue worker (queue.py) through that conversation's `Llama` fork, and its forward
passes run on the StepScheduler's thread (scheduler.py), which decodes the generating
requests together. A client that goes away stops its generation.
What does not: checking a request's fields and the error shape (requests.py), HTTP
itself (Starlette and uvicorn), the command line and the listening socket (cli/serve.py),
generation and the response dicts (api/facade.py, api/responses.py), /metrics' text (metrics.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Any, AsyncIterator, Callable, Iterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..api.responses import usage
from ..board.power import PowerMeter, PowerMonitor
from ..errors import ContextFullError, EdgeKVError
from .limits import DEFAULT_MAX_BODY, DEFAULT_MAX_QUEUE, DEFAULT_SLOTS, DEFAULT_SPILL_MAX
from .metrics import CONTENT_TYPE, ServerStats, prometheus_text
from .queue import END as _END
from .queue import GenerationQueue, _Job
from .requests import (ApiError, chat_messages, chat_template_options, completion_prompt, field, sampling_options,
                       session_key, stream_flags)
from .scheduler import StepScheduler
from .sessions import Conversation, SessionPool

log = logging.getLogger("edgekv")

# -- the application ------------------------------------------------------------------------------

class _EventStream(StreamingResponse):
    """Server-sent events that cancel their job however the response ends."""

    def __init__(self, events: AsyncIterator[str], job: _Job):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


class _Api:
    """The endpoints, bound to one model (`llm`, whose forks hold the conversations), its
    GenerationQueue, SessionPool and StepScheduler."""

    def __init__(self, llm: Any, model_id: str, api_key: str | None, max_body: int, queue: GenerationQueue,
                 pool: SessionPool, scheduler: StepScheduler, reasoning_format: str = "auto",
                 chat_template_kwargs: dict | None = None, power: Any = None):
        self.llm, self.model_id, self.api_key, self.max_body, self.queue = llm, model_id, api_key, max_body, queue
        self.power = power  # a board/power.PowerMonitor, where the machine has a power source
        self.pool, self.scheduler, self.stats = pool, scheduler, ServerStats()
        self.reasoning_format, self.chat_template_kwargs = reasoning_format, chat_template_kwargs
        self.created = int(time.time())

    def _check_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            raise ApiError(401, "invalid or missing API key (expected the header 'Authorization: Bearer KEY')",
                           type="authentication_error", code="invalid_api_key")

    async def _read_json(self, request: Request) -> dict:
        self._check_key(request)
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body:
            raise self._too_large(int(length))
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > self.max_body:
                raise self._too_large(len(body))
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
        except RecursionError:
            raise ApiError(400, "the request body nests JSON arrays/objects too deeply") from None
        if not isinstance(data, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return data

    def _too_large(self, size: int) -> ApiError:
        return ApiError(413, f"the request body has {size}+ bytes; the limit is {self.max_body} (--max-body)",
                        code="request_too_large")

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse(dict(status="ok", pending=self.queue.pending))

    async def models(self, request: Request) -> JSONResponse:
        self._check_key(request)
        model = dict(id=self.model_id, object="model", created=self.created, owned_by="edgekv")
        return JSONResponse(dict(object="list", data=[model]))

    async def slots(self, request: Request) -> JSONResponse:
        self._check_key(request)
        return JSONResponse(dict(sessions=self.pool.describe(), totals=self.pool.totals(), slots=self.pool.slots,
                                 kv_budget=self.pool.kv_budget, parallel=self.queue.parallel))

    async def metrics(self, request: Request) -> Response:
        self._check_key(request)
        return Response(prometheus_text(self.stats, self.queue, self.scheduler, self.pool, self.power),
                        media_type=CONTENT_TYPE)

    async def chat_completions(self, request: Request):
        body = await self._read_json(request)
        messages, options = chat_messages(body), sampling_options(body, self.llm.n_vocab())
        options.update(chat_template_options(body, self.reasoning_format, self.chat_template_kwargs))

        def prompt_ids() -> list[int]:
            return self.llm.chat_prompt_tokens(messages, tools=options.get("tools"),
                                               tool_choice=options.get("tool_choice"),
                                               chat_template_kwargs=options.get("chat_template_kwargs"))

        return await self._generate(request, body, prompt_ids,
                                    lambda llm, **kw: llm.create_chat_completion(messages, **kw), options)

    async def completions(self, request: Request):
        body = await self._read_json(request)
        prompt, options = completion_prompt(body, self.llm.n_vocab()), sampling_options(body, self.llm.n_vocab())
        options.update({k: body[k] for k in ("echo", "suffix") if body.get(k) is not None})

        def prompt_ids() -> list[int]:
            return self.llm.tokenize(prompt, special=True) if isinstance(prompt, str) else list(prompt)

        return await self._generate(request, body, prompt_ids,
                                    lambda llm, **kw: llm.create_completion(prompt, **kw), options)

    async def _generate(self, request: Request, body: dict, prompt_ids: Callable[[], list[int]],
                        call: Callable[..., Any], options: dict):
        stream, include_usage = stream_flags(body)
        model = field(body, "model", str, "a string") or self.model_id
        key = session_key(body)

        def work(job: _Job) -> Any:  # on a worker thread
            conv = self.pool.checkout(prompt_ids(), key)
            try:
                with self.scheduler.member():
                    result = call(conv.llm, model=model, stream=stream, stopping_criteria=job.should_stop, **options)
                    if not stream:
                        self._finished(conv, True)
                        return dict(result, timings=timings(conv.llm.last_stats))
            except BaseException:
                self._finished(conv, False)
                raise
            return self._streamed(conv, result, include_usage)

        job = self.queue.submit(work)
        first = await _first_or_disconnect(job, request)
        if first is _END:  # the client left before the answer
            return JSONResponse({}, status_code=499)
        if not stream:
            return JSONResponse(first)
        return _EventStream(_events(first, job, request), job)

    def _streamed(self, conv: Conversation, chunks: Iterator[dict], include_usage: bool) -> Iterator[dict]:
        """A stream's chunks, generated as the worker thread asks for them (the conversation
        stays checked out until it ends); stream_options.include_usage: a last chunk with no
        choices and the usage."""
        last, ok = None, False
        try:
            with self.scheduler.member():
                for last in chunks:
                    yield last
            ok = True
        except GeneratorExit:  # the client went away: a finished request, not a failed one
            ok = True
            raise
        finally:
            chunks.close()
            self._finished(conv, ok)
        if include_usage and last is not None:
            head = {k: last[k] for k in ("id", "object", "created", "model")}
            yield dict(head, choices=[], usage=usage(conv.llm.last_stats), timings=timings(conv.llm.last_stats))

    def _finished(self, conv: Conversation, ok: bool) -> None:
        if ok:
            self.stats.record(conv.llm.last_stats)
        else:
            self.stats.record_failure()
        self.pool.checkin(conv)


def timings(stats: Any) -> dict[str, Any]:
    """llama-server's `timings` of a response: prompt tokens evaluated (prompt_n) and found in
    the conversation's cache (cache_n), generated tokens (predicted_n), and their times."""
    out = dict(cache_n=stats.prompt_cached, prompt_n=stats.prompt_eval_tokens,
               prompt_ms=round(stats.prompt_eval_s * 1e3, 3), predicted_n=stats.gen_tokens,
               predicted_ms=round(stats.gen_s * 1e3, 3), prompt_per_second=round(stats.prompt_tokens_per_s, 3),
               predicted_per_second=round(stats.gen_tokens_per_s, 3))
    if stats.draft_n is not None:  # speculative decoding: llama-server's fields
        out.update(draft_n=stats.draft_n, draft_n_accepted=stats.draft_n_accepted)
    return out


async def _first_or_disconnect(job: _Job, request: Request) -> Any:
    """The job's first item (a generation error raised as ApiError), or _END when the
    client disconnects first (the job is then cancelled)."""
    first = asyncio.ensure_future(job.next())
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((first, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not first.done():
            first.cancel()
            job.cancel()
    if not first.done():
        return _END
    exc = first.exception()
    if exc is not None:
        job.cancel()
        raise _api_error(exc)
    return first.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _events(first: dict, job: _Job, request: Request) -> AsyncIterator[str]:
    item = first
    try:
        while item is not _END:
            yield f"data: {json.dumps(item)}\n\n"
            if await request.is_disconnected():
                return
            item = await job.next()
    except Exception as exc:  # the status line is sent: report the error as an event, as llama.cpp does
        error = _api_error(exc)
        yield f"data: {json.dumps({'error': dict(message=error.message, type=error.type, code=error.code)})}\n\n"
    yield "data: [DONE]\n\n"


def _api_error(exc: BaseException) -> ApiError:
    """An exception from the facade -> the HTTP error to answer."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextFullError):
        return ApiError(400, str(exc), type="exceed_context_size_error", code="context_length_exceeded",
                        n_prompt_tokens=exc.n_tokens, n_ctx=exc.n_ctx)
    if isinstance(exc, EdgeKVError):
        return ApiError(400, str(exc))
    log.error("generation failed", exc_info=exc)
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error")


async def _api_error_response(request: Request, exc: Exception) -> JSONResponse:
    return exc.response() if isinstance(exc, ApiError) else _api_error(exc).response()


async def _http_error_response(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own errors (404 unknown route, 405 wrong method) in OpenAI's shape."""
    what = {404: f"no such route: {request.method} {request.url.path}",
            405: f"method {request.method} is not allowed on {request.url.path}"}.get(exc.status_code, exc.detail)
    return ApiError(exc.status_code, what, code="not_found" if exc.status_code == 404 else None).response()


def create_app(llm: Any, *, model_id: str | None = None, api_key: str | None = None,
               max_queue: int = DEFAULT_MAX_QUEUE, max_body: int = DEFAULT_MAX_BODY,
               reasoning_format: str = "auto", chat_template_kwargs: dict | None = None, parallel: int = 1,
               slots: int | None = None, kv_budget: int | None = None, spill_dir: str | None = None,
               spill_max: int = DEFAULT_SPILL_MAX) -> Starlette:
    """The OpenAI-compatible app over `llm` (an edgekv Llama; each conversation gets a fork of
    it). api_key: required as `Authorization: Bearer KEY` on /v1/*, /slots and /metrics (not
    /health). parallel: generations at once (their decode steps run batched); max_queue:
    requests that may wait beyond them (0: answer 429 whenever all are busy). max_body: bytes.
    slots: most conversations whose KV cache stays in memory (default max(parallel, 4));
    kv_budget: bytes those caches may take together (default: the memory plan's budget, at
    least `parallel` sessions); spill_dir / spill_max: where idle conversations are written to
    make room, and how many bytes of them may wait there (default: a temporary directory,
    removed when the app stops). reasoning_format / chat_template_kwargs: the defaults of those
    chat request fields (llama-server's: a <think> block comes back as reasoning_content).
    app.state.queue / .pool / .scheduler: the GenerationQueue (its counters, `hold()`), the
    SessionPool and the StepScheduler."""
    slots = max(parallel, DEFAULT_SLOTS) if slots is None else slots
    if slots < parallel:
        raise EdgeKVError(f"--slots {slots} is fewer than --parallel {parallel}: each generation needs its own session")
    if kv_budget is None:
        kv_budget = max(llm.kv_plan.mem_budget or 0, parallel * llm._session.cache.nbytes)
    own_spill_dir = spill_dir is None
    spill_dir = tempfile.mkdtemp(prefix="edgekv-spill-") if own_spill_dir else spill_dir
    queue = GenerationQueue(max_queue, parallel)
    scheduler = StepScheduler(llm._model.network, parallel)
    pool = SessionPool(llm, slots, kv_budget, spill_dir, spill_max, runner=scheduler, parallel=parallel)
    meter = PowerMeter.find()
    power = None if meter is None else PowerMonitor(meter).start()  # /metrics' power and energy
    api = _Api(llm, model_id or os.path.basename(llm.model_path), api_key, max_body, queue, pool, scheduler,
               reasoning_format, chat_template_kwargs, power)
    routes = [
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/slots", api.slots, methods=["GET"]),
        Route("/metrics", api.metrics, methods=["GET"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        queue.shutdown()
        scheduler.stop()
        pool.close()
        if power is not None:
            power.close()
        if own_spill_dir:
            shutil.rmtree(spill_dir, ignore_errors=True)

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={ApiError: _api_error_response, HTTPException: _http_error_response})
    app.state.queue, app.state.pool, app.state.scheduler, app.state.stats = queue, pool, scheduler, api.stats
    app.state.llm = llm
    return app
