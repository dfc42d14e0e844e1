"""`edgekv serve`'s web application: an OpenAI-compatible HTTP API over one `Llama`.

What lives here: `create_app(llm, ...)` (a Starlette app with /v1/chat/completions,
/v1/completions, /v1/models and /health; the API key and body-size checks), server-sent
events for streams, mapping edgekv's exceptions to HTTP errors, and `GenerationQueue`: one
generation at a time on a worker thread (the model is not thread-safe), at most
`max_queue` requests waiting (429 beyond), and a client that goes away stops its
generation. Requests share the one `Llama`, so a conversation whose next request extends
it reuses the evaluated prefix (api/facade.py does that).
What does not: checking a request's fields and the error shape (requests.py), HTTP
itself (Starlette and uvicorn), the command line and the listening socket (cli/serve.py),
generation and the response dicts (api/facade.py, api/responses.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Callable, Iterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from ..api.responses import usage
from ..errors import ContextFullError, EdgeKVError
from .limits import DEFAULT_MAX_BODY, DEFAULT_MAX_QUEUE
from .requests import (ApiError, chat_messages, chat_template_options, completion_prompt, field, sampling_options,
                       stream_flags)

log = logging.getLogger("edgekv")

_END = object()  # a job's last item


# -- the generation queue -----------------------------------------------------------------------

class _Job:
    """One request's generation: `work()` runs on the worker thread and returns a response
    dict or an iterator of chunk dicts; the items reach the event loop through `next()`."""

    def __init__(self, work: Callable[["_Job"], Any]):
        self.work = work
        self.loop = asyncio.get_running_loop()
        self.items: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()  # set from the event loop when the client is gone
        self.stopped_early = False

    def cancel(self) -> None:
        self.cancelled.set()

    def should_stop(self, *_: Any) -> bool:
        """A stopping criterion for the facade: stop at the next token once cancelled."""
        return self.cancelled.is_set()

    def run(self) -> None:  # on the worker thread
        try:
            if self.cancelled.is_set():  # the client left while waiting
                self.stopped_early = True
                return
            result = self.work(self)
            if isinstance(result, dict):
                self._put(result)
            else:
                self._drain(result)
            self.stopped_early = self.stopped_early or self.cancelled.is_set()
        except Exception as exc:  # handed to the request, which answers it
            self._put(exc)
        finally:
            self._put(_END)

    def _drain(self, chunks: Iterator[dict]) -> None:
        try:
            for chunk in chunks:
                if self.cancelled.is_set():
                    self.stopped_early = True
                    return
                self._put(chunk)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def _put(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancelled.set()

    async def next(self) -> Any:
        item = await self.items.get()
        if isinstance(item, BaseException):
            raise item
        return item


class GenerationQueue:
    """Runs jobs one at a time on one worker thread; admits at most 1 + max_queue at once.

    Counters (read them for monitoring and tests): `pending` (running + waiting),
    `finished`, `stopped_early` (generations cut short because the client went away)."""

    def __init__(self, max_queue: int = DEFAULT_MAX_QUEUE):
        assert max_queue >= 0
        self.max_queue = max_queue
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgekv-generate")
        self._lock = threading.Lock()
        self.pending = self.finished = self.stopped_early = 0

    def _admit(self) -> None:
        with self._lock:
            if self.pending >= 1 + self.max_queue:
                raise ApiError(429, f"the server is busy: {self.pending - 1} requests are already waiting "
                                    f"(--queue {self.max_queue}); retry later", type="rate_limit_error",
                               code="queue_full")
            self.pending += 1

    def _done(self, stopped_early: bool) -> None:
        with self._lock:
            self.pending -= 1
            self.finished += 1
            self.stopped_early += bool(stopped_early)

    def submit(self, work: Callable[[_Job], Any]) -> _Job:
        """Queue `work` (ApiError 429 when the queue is full); call from the event loop."""
        self._admit()
        job = _Job(work)

        def run() -> None:
            try:
                job.run()
            finally:
                self._done(job.stopped_early)

        self._executor.submit(run)
        return job

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Occupy the model outside any request until the block ends, as a request would
        (maintenance work on the Llama; tests of a full queue). Callable from any thread."""
        self._admit()
        started, release = threading.Event(), threading.Event()

        def occupy() -> None:
            started.set()
            release.wait()

        future = self._executor.submit(occupy)
        started.wait()
        try:
            yield
        finally:
            release.set()
            future.result()
            self._done(False)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


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
    """The endpoints, bound to one Llama and one GenerationQueue."""

    def __init__(self, llm: Any, model_id: str, api_key: str | None, max_body: int, queue: GenerationQueue,
                 reasoning_format: str = "auto", chat_template_kwargs: dict | None = None):
        self.llm, self.model_id, self.api_key, self.max_body, self.queue = llm, model_id, api_key, max_body, queue
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

    async def chat_completions(self, request: Request):
        body = await self._read_json(request)
        messages, options = chat_messages(body), sampling_options(body, self.llm.n_vocab())
        options.update(chat_template_options(body, self.reasoning_format, self.chat_template_kwargs))
        return await self._generate(request, body, lambda **kw: self.llm.create_chat_completion(messages, **kw),
                                    options)

    async def completions(self, request: Request):
        body = await self._read_json(request)
        prompt, options = completion_prompt(body, self.llm.n_vocab()), sampling_options(body, self.llm.n_vocab())
        options.update({k: body[k] for k in ("echo", "suffix") if body.get(k) is not None})
        return await self._generate(request, body, lambda **kw: self.llm.create_completion(prompt, **kw), options)

    async def _generate(self, request: Request, body: dict, call: Callable[..., Any], options: dict):
        stream, include_usage = stream_flags(body)
        model = field(body, "model", str, "a string") or self.model_id

        def work(job: _Job) -> Any:
            result = call(model=model, stream=stream, stopping_criteria=job.should_stop, **options)
            return self._with_usage(result) if stream and include_usage else result

        job = self.queue.submit(work)
        first = await _first_or_disconnect(job, request)
        if first is _END:  # the client left before the answer
            return JSONResponse({}, status_code=499)
        if not stream:
            return JSONResponse(first)
        return _EventStream(_events(first, job, request), job)

    def _with_usage(self, chunks: Iterator[dict]) -> Iterator[dict]:
        """stream_options.include_usage: a last chunk with no choices and the usage."""
        last = None
        try:
            for last in chunks:
                yield last
        finally:
            chunks.close()
        if last is not None:
            head = {k: last[k] for k in ("id", "object", "created", "model")}
            yield dict(head, choices=[], usage=usage(self.llm.last_stats))


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
               reasoning_format: str = "auto", chat_template_kwargs: dict | None = None) -> Starlette:
    """The OpenAI-compatible app over `llm` (an edgekv Llama). api_key: required as
    `Authorization: Bearer KEY` on /v1/* (not /health). max_queue: requests that may wait
    while one generates (0: answer 429 whenever the model is busy). max_body: bytes.
    reasoning_format / chat_template_kwargs: the defaults of those chat request fields
    (llama-server's: a <think> block comes back as reasoning_content). app.state.queue is
    the GenerationQueue (its counters, `hold()`)."""
    queue = GenerationQueue(max_queue)
    api = _Api(llm, model_id or os.path.basename(llm.model_path), api_key, max_body, queue, reasoning_format,
               chat_template_kwargs)
    routes = [
        Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        queue.shutdown()

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={ApiError: _api_error_response, HTTPException: _http_error_response})
    app.state.queue = queue
    app.state.llm = llm
    return app
