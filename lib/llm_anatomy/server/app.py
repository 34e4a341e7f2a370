"""The web server: OpenAI's routes on Starlette, run by uvicorn, every request served by one EngineLoop.

    POST /v1/chat/completions   messages in, an answer out: whole, or streamed as server-sent events (stream: true)
    POST /v1/completions        the older API: a prompt (text or token ids) in, its continuation out
    GET  /v1/models             the one model served here
    GET  /health                200 when the server is up (no key needed: a load balancer asks it)
    GET  /metrics               Prometheus text: latencies, the queue, KV blocks, the prefix cache (metrics.py)
    GET  /debug/requests        the engine's own times of recent requests (engine clock, seconds), for notebook 11
    GET  /debug/calls           the scheduler's recent model calls: when each ran (engine clock) and what it took,
                                and torch's thread count in this process
    PUT  /debug/max-waiting     {"max_waiting": 4}, "auto" or null: change the queue's limit (notebook 11, bench api)

A request is refused before the engine sees it when it is bad (400: not JSON, an unknown field, a value out of range,
too long for the context; 404: an unknown model or route; 413: a body over `max_body_bytes`; 401: a wrong or missing
key), and when the queue is full (429, with Retry-After). A stream whose client goes away is cancelled: Starlette
stops the response, and the `finally` below tells the engine, whose next round frees the request's blocks.
A chat request's `response_format` ({"type": "json_object"} or {"type": "json_schema", "json_schema": {...}})
constrains its answer to JSON by the course's token mask (structured.py); a schema outside the course's subset is a
400 that names the feature.
A stream sends its usage as OpenAI does: only with `stream_options: {"include_usage": true}`, in one more chunk after
the finish reason's, with `"choices": []`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import random
import threading
import sys
import time
import uuid

import torch
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import CourseError
from ..generate.chat import chat_prompt_ids
from ..generate.sampling import SamplingParams
from . import schemas
from ..constrained import UnsupportedSchema
from .sizing import check_max_waiting
from .schemas import APIError, ChatRequest, CompletionRequest
from .structured import Formats


def _error(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), err.status, headers=err.headers)


async def read_body(request, limit: int) -> bytes:
    """The request's body, or APIError 413 as soon as it passes `limit` bytes (a stated Content-Length first)."""
    stated = request.headers.get("content-length")
    if stated is not None and stated.isdigit() and int(stated) > limit:
        raise APIError(413, f"The request body is {int(stated):,} bytes; this server takes at most {limit:,}.",
                       code="request_too_large")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise APIError(413, f"The request body is over {limit:,} bytes, the most this server takes.",
                           code="request_too_large")
    return bytes(body)


class Server:
    """The routes, over one EngineLoop. model_name: the id clients ask for; api_key: None for an open server."""

    def __init__(self, engine, model_name: str, metrics, *, api_key: str | None = None,
                 max_body_bytes: int = 1 << 20, default_max_tokens: int = 256):
        self.engine, self.name, self.metrics, self.api_key = engine, model_name, metrics, api_key
        self.max_body_bytes, self.default_max_tokens = max_body_bytes, default_max_tokens
        self.created = int(time.time())
        self.formats = Formats(engine.tokenizer)  # response_format's maskers, one per pattern, shared by requests

    def app(self) -> Starlette:
        routes = [Route("/v1/chat/completions", self._guard(self.chat), methods=["POST"]),
                  Route("/v1/completions", self._guard(self.completion), methods=["POST"]),
                  Route("/v1/models", self._guard(self.models), methods=["GET"]),
                  Route("/health", self.health, methods=["GET"]),
                  Route("/metrics", self._guard(self.prometheus), methods=["GET"]),
                  Route("/debug/requests", self._guard(self.records), methods=["GET"]),
                  Route("/debug/calls", self._guard(self.calls), methods=["GET"]),
                  Route("/debug/max-waiting", self._guard(self.queue_limit), methods=["PUT"])]

        async def http_error(request, exc: HTTPException):
            return _error(APIError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}",
                                   code="not_found" if exc.status_code == 404 else None))

        @contextlib.asynccontextmanager
        async def lifespan(app):
            self.engine.flush = self._flusher(asyncio.get_running_loop())
            if not self.engine.thread.is_alive():
                self.engine.start()
            yield
            self.engine.flush = None
            self.engine.stop()

        return Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)

    @staticmethod
    def _flusher(loop):
        """flush(timeout_s) for the engine thread: returns once the event loop has run what was already handed to it
        (the handlers woken by this step's events write their chunks first), or after timeout_s."""
        def flush(timeout_s: float) -> None:
            sent = threading.Event()
            try:  # the events' callbacks wake the handlers; a callback queued behind them runs after the handlers
                loop.call_soon_threadsafe(loop.call_soon, sent.set)
            except RuntimeError:  # the event loop has closed
                return
            sent.wait(timeout_s)
        return flush

    def _guard(self, handler):
        """The handler behind the API key (when there is one), its refusals answered with the API's error body."""
        async def guarded(request):
            try:
                if self.api_key is not None:
                    given = request.headers.get("authorization", "")
                    if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                        raise APIError(401, "Incorrect API key provided: send the header 'Authorization: Bearer "
                                            "<key>' with the key this server was started with.",
                                       code="invalid_api_key")
                return await handler(request)
            except APIError as err:
                return _error(err)
            except CourseError as err:
                return _error(APIError(400, str(err)))
        return guarded

    # ---- the small routes ---------------------------------------------------------------------------------------
    async def health(self, request):
        return JSONResponse({"status": "ok"})

    async def models(self, request):
        return JSONResponse({"object": "list", "data": [{"id": self.name, "object": "model", "created": self.created,
                                                         "owned_by": "llm-anatomy"}]})

    async def prometheus(self, request):
        return Response(self.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def records(self, request):
        return JSONResponse({"clock": self.engine.clock(), "queue_limit": self.engine.queue_limit(),
                             "requests": list(self.engine.records)})

    async def calls(self, request):
        """The last `last` (default 200) model calls, so that a step's time can be split into its model call and the
        rest (scheduling, sampling, the hand-over). deque.copy runs in C under the interpreter lock: the engine thread
        cannot append halfway through it."""
        last = request.query_params.get("last", "200")
        if not last.isdigit():
            raise APIError(400, f"last must be a whole number of calls, not {last!r}.", param="last")
        copied = list(self.engine.scheduler.calls.copy())
        calls = copied[max(0, len(copied) - int(last)):]
        return JSONResponse({"clock": self.engine.clock(), "calls": [c._asdict() for c in calls],
                             "torch_threads": torch.get_num_threads(),  # this process's, for a kernel to compare
                             "switch_interval_s": sys.getswitchinterval()})  # how long a thread may keep the GIL

    async def queue_limit(self, request):
        body = schemas.parse_json(await read_body(request, self.max_body_bytes))
        limit = body.get("max_waiting", "missing")
        try:
            check_max_waiting(limit)
        except CourseError:
            raise APIError(400, f"max_waiting must be null (no limit), a whole number >= 0 or \"auto\", not "
                                f"{limit!r}.", param="max_waiting") from None
        self.engine.max_waiting = limit
        return JSONResponse({"max_waiting": limit})

    # ---- the completions ----------------------------------------------------------------------------------------
    async def chat(self, request):
        body = await read_body(request, self.max_body_bytes)  # the client may send it after the headers: its time
        received = self.engine.clock()  # the server's own work starts with the whole request in hand
        req = schemas.parse_request(schemas.parse_json(body), ChatRequest)
        self._check_model(req)
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        ids = chat_prompt_ids(self.engine.tokenizer, messages)[0].tolist()  # the model's own chat template
        top = (req.top_logprobs or 0) if req.logprobs else None
        constraint = None
        if req.response_format is not None and req.response_format.type != "text":
            try:  # compiling a new schema takes a fraction of a second: on a worker thread, not the event loop
                constraint = await asyncio.to_thread(self.formats.row_mask, req.response_format)
            except UnsupportedSchema as err:
                raise APIError(400, str(err), param="response_format", code="unsupported_schema") from None
        return await self._serve(request, req, ids, top, "chat",
                                 req.max_completion_tokens or req.max_tokens, received, constraint)

    async def completion(self, request):
        body = await read_body(request, self.max_body_bytes)
        received = self.engine.clock()
        req = schemas.parse_request(schemas.parse_json(body), CompletionRequest)
        self._check_model(req)
        ids = req.prompt if isinstance(req.prompt, list) else self.engine.tokenizer(req.prompt)["input_ids"]
        if max(ids) >= self.engine.model.cfg.vocab_size:
            raise APIError(400, f"Token ids must be below the vocabulary size {self.engine.model.cfg.vocab_size}.",
                           param="prompt")
        return await self._serve(request, req, list(ids), req.logprobs, "text", req.max_tokens or 16, received)

    def _check_model(self, req) -> None:
        if req.model != self.name:
            raise APIError(404, f"The model '{req.model}' does not exist: this server serves '{self.name}' "
                                "(GET /v1/models).", param="model", code="model_not_found")

    def _limits(self, prompt: int, max_tokens: int | None) -> int:
        """max_tokens checked against the context and the KV pool (None: what is left, at most the default)."""
        room = min(self.engine.context, self.engine.capacity) - prompt
        if prompt >= self.engine.context:
            raise APIError(400, f"This model's maximum context length is {self.engine.context} tokens. However, your "
                                f"prompt is {prompt} tokens.", param="messages", code="context_length_exceeded")
        if room < 1:
            raise APIError(400, f"The prompt's {prompt} tokens fill this server's KV pool of {self.engine.capacity} "
                                "positions.", param="messages", code="context_length_exceeded")
        if max_tokens is None:
            return min(room, self.default_max_tokens)
        if max_tokens > room:
            raise APIError(400, f"max_tokens is too large: {max_tokens}. The prompt has {prompt} tokens, and this "
                                f"server holds {prompt + room} positions for a request (the context is "
                                f"{self.engine.context}).", param="max_tokens", code="context_length_exceeded")
        return max_tokens

    async def _serve(self, request, req, ids: list[int], top_logprobs, kind: str, max_tokens, received: float,
                     constraint=None):
        # the one SamplingParams of this request (vLLM's names): how to choose, how many, where to stop; checked, and
        # a CourseError is a 400. The engine adds the model's end-of-turn ids to its stop_token_ids.
        params = SamplingParams(
            req.temperature, None if req.top_k in (None, 0, -1) else req.top_k, req.top_p, req.min_p,
            req.repetition_penalty, req.presence_penalty, req.frequency_penalty,
            seed=req.seed if req.seed is not None else random.getrandbits(63), top_logprobs=top_logprobs,
            max_tokens=self._limits(len(ids), max_tokens), stop=tuple(req.stops()))
        loop, events = asyncio.get_running_loop(), asyncio.Queue()

        def put(event):  # from the engine thread
            with contextlib.suppress(RuntimeError):  # the event loop has closed: nobody is listening
                loop.call_soon_threadsafe(events.put_nowait, event)

        name = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        live = self.engine.submit(ids, params, put, name=name, received_s=received, constraint=constraint)
        reply = schemas.Reply(name, int(time.time()), self.name, kind)
        reply.usage_asked = bool(req.stream and req.stream_options and req.stream_options.include_usage)
        if req.stream:
            return StreamingResponse(self._stream(live, events, reply), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await self._whole(request, live, events, reply)

    @staticmethod
    def _usage(live, record: dict) -> dict:
        return schemas.usage(len(live.request.prompt), record["completion_tokens"], record["cached_tokens"])

    async def _stream(self, live, events, reply):
        try:
            if reply.kind == "chat":
                yield schemas.sse(reply.chunk({"role": "assistant", "content": ""}))
            while True:
                event = await events.get()
                if event[0] == "text":
                    entries = schemas.logprob_entries(event[2], self.engine.tokenizer.decode)
                    data = schemas.sse(reply.chunk(event[1], logprobs=entries or None))
                    if live.first_sent_s is None and event[1]:
                        live.first_sent_s = self.engine.clock()
                    yield data
                elif event[0] == "finish":
                    event[2]["first_sent_s"] = live.first_sent_s  # the record was made before, on the engine thread
                    yield schemas.sse(reply.chunk("" if reply.kind == "text" else {}, finish=event[1]))
                    if reply.usage_asked:  # OpenAI's rule: a chunk of its own, "choices": [], only when asked for
                        yield schemas.sse(reply.usage_chunk(self._usage(live, event[2])))
                    break
                else:  # the engine failed: the status is sent already, so the error is an event (as OpenAI does)
                    yield schemas.sse(APIError(500, event[1], "server_error").body())
                    break
            yield schemas.DONE
        finally:  # the client went away (or the stream ended): make sure the engine lets go of it
            if live.finish is None:
                self.engine.cancel(live)

    async def _whole(self, request, live, events, reply):
        text, entries = [], []
        try:
            while True:
                try:
                    event = await asyncio.wait_for(events.get(), 0.5)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return Response(status_code=499)
                    continue
                if event[0] == "text":
                    text.append(event[1])
                    entries += schemas.logprob_entries(event[2], self.engine.tokenizer.decode)
                elif event[0] == "finish":
                    asked = live.request.params.top_logprobs is not None
                    return JSONResponse(reply.whole("".join(text), event[1], entries if asked else None,
                                                    self._usage(live, event[2])))
                else:
                    return _error(APIError(500, event[1], "server_error"))
        finally:
            if live.finish is None:
                self.engine.cancel(live)
