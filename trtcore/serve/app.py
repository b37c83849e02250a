"""The HTTP routes of ``trtcore serve`` (FastAPI): the OpenAI API over :class:`~trtcore.serve.engine.AsyncEngine`.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream=true``: server-sent
events, ``data: {chunk}`` lines ending in ``data: [DONE]``), ``GET /v1/models``,
``GET /v1/models/{model}`` (OpenAI's retrieve: the served model's card; 404 ``model_not_found``
for another id), ``GET`` / ``HEAD /health`` (200 once the model is loaded, 503 while loading or
draining, or once the engine process died; no body),
``GET /metrics`` (Prometheus text format, :mod:`trtcore.serve.metrics`),
``GET /version`` (``{"version": trtcore.__version__}``).

With an API key (``build_app(api_key=...)``, ``trtcore serve --api-key``), the ``/v1`` routes
need ``Authorization: Bearer KEY``, else 401 ``invalid_api_key``
(:mod:`trtcore.serve.auth`); ``/health``, ``/metrics`` and ``/version`` stay open. CORS:
:class:`CorsPolicy` (vLLM's options and defaults: any origin).

Errors are OpenAI's JSON object ``{"error": {"message", "type", "param", "code"}}``:

* 400 ``invalid_request_error``: malformed JSON, a field of the wrong type or out of range
  (``param`` names it), a prompt that does not fit the context (``param`` ``prompt`` /
  ``messages``), ``max_tokens`` beyond the context, ``n`` > 1, ``echo`` / ``suffix``,
  ``logprobs`` / ``top_logprobs`` above 20 (:data:`~trtcore.serve.protocol.MAX_LOGPROBS`, on
  every backend); an empty, mixed or empty-item ``prompt`` list; a lone UTF-16 surrogate in
  any string (``param`` its path); more prompts in a list than could ever be queued together;
* 404 ``invalid_request_error`` / ``model_not_found``: another ``model`` than the served one
  (none, or ``""``, is the served one, as in vLLM);
* 429 ``rate_limit_error`` with ``Retry-After``: ``--max-waiting`` requests wait already (a
  list of K prompts counts K: one that does not fit whole is refused whole);
* 503 ``service_unavailable`` with ``Retry-After``: loading or shutting down, or the engine
  process died (a request it ends mid-stream gets a ``service_unavailable`` error event);
* 500 ``server_error`` (OpenAI's type): a failure of the server itself, with the exception's
  type and message.

A request that fails after its stream started gets one ``data: {"error": ...}`` event, then
``data: [DONE]``. A client that disconnects mid-stream aborts its request.

A list of prompts (``/v1/completions``, OpenAI's and vLLM's semantics): every prompt is
checked first (a bad one is a 400 and submits nothing), then each is one request of the
engine, all submitted at once and run concurrently (each counts as a request in the metrics).
The answer has one choice per prompt, ``index`` its position, and ``usage`` summed over the
prompts; streamed, the chunks of all prompts interleave as they come (each choice with its
``index``), then one usage chunk (``include_usage``) and one ``[DONE]`` after all finished.
A request that fails aborts the others (the error as for one prompt); a client that
disconnects aborts them all.

Streaming: the chunks of a response share one ``created`` (as OpenAI's and vLLM's); one event
per token, written from a per-request JSON template (:class:`_ChunkTemplate`; pydantic models
only for chunks with logprobs; one template per prompt of a list, its ``index`` in it); the
events of the tokens that arrived together go out in one write.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..errors import InvalidRequestError, TrtcoreError
from ..token_bytes import token_bytes, token_text
from .auth import ApiKeyMiddleware
from .core import ServedModel
from .engine import AsyncEngine, EngineDrainingError, EngineNotReadyError, QueueFullError, RequestStream
from .metrics import CONTENT_TYPE_LATEST
from .protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprob,
    ChatLogprobs,
    ChatResponseMessage,
    ChatStreamChoice,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    TopLogprob,
    UsageInfo,
    random_id,
)

__all__ = ["ApiError", "build_app"]

#: the lowest log-probability sent (JSON has no -inf); vLLM's clamp
MIN_LOGPROB = -9999.0
#: seconds between checks that a non-streamed request's client is still connected
DISCONNECT_POLL_S = 0.05


class ApiError(Exception):
    """An HTTP error with OpenAI's body (see the module docstring for the statuses)."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ):
        super().__init__(message)
        self.status, self.info, self.retry_after = status, ErrorInfo(message=message, type=type, param=param, code=code), retry_after

    def response(self) -> JSONResponse:
        """The JSON response (with ``Retry-After`` where set)."""
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return JSONResponse(ErrorResponse(error=self.info).model_dump(), status_code=self.status, headers=headers)


#: pydantic's location tags of union members that are plain identifiers (the others hold brackets)
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _validation_error(exc: RequestValidationError) -> ApiError:
    """400 for the first problem pydantic found; ``param`` is the field's dotted path."""
    err = exc.errors()[0]
    if err.get("type") == "json_invalid":
        return ApiError(400, f"malformed JSON body: {err.get('ctx', {}).get('error', err.get('msg'))}")
    loc = []
    for x in err.get("loc", ())[1:]:  # without "body"
        if isinstance(x, str) and not x.isidentifier():
            break  # pydantic's name of a union member ("list[int]", "function-after[...]"), not a field
        if x in _TYPE_TAGS:
            break
        loc.append(str(x))
    param = ".".join(loc) or None
    cause = err.get("ctx", {}).get("error")
    if param is None and getattr(cause, "field", None):  # a refused extra field (protocol._Refused)
        return ApiError(400, str(cause), param=cause.field)
    got = repr(err.get("input"))
    if len(got) > 200:  # never echo a huge body back
        got = got[:200] + f"... ({len(got)} characters)"
    if param is None and isinstance(err.get("input"), (bytes, str)):
        return ApiError(400, f"the body must be a JSON object sent with Content-Type: application/json; got {got}")
    return ApiError(400, f"{param or 'body'}: {err.get('msg')} (got {got})", param=param)


#: a text prompt longer than this many times (context x the longest token's characters) is
#: refused without tokenizing it (a normalizer may drop characters: the margin keeps the
#: bound safe for every prompt that could fit)
PROMPT_CHARS_MARGIN = 4


class _Served:
    """What the routes need: the engine, the served name, and token helpers of its model
    (:class:`~trtcore.serve.core.ServedModel`: the LLM itself is in the engine process)."""

    def __init__(self, engine: AsyncEngine, served_model_name: str):
        self.engine = engine
        self.name = served_model_name

    @property
    def model(self) -> ServedModel:
        """The model's description; 503 while the engine is not ready."""
        if not self.engine.ready or self.engine.model is None:
            why = "the server is loading the model" if self.engine.model is None else "the engine is not running"
            raise ApiError(503, why, "service_unavailable", retry_after=1)
        return self.engine.model

    def check_model(self, model: str | None) -> None:
        if model and model != self.name:  # none or "": the served one (vLLM's _is_model_supported)
            raise ApiError(404, f"The model `{model}` does not exist; this server serves `{self.name}`", param="model", code="model_not_found")

    def prompt_ids(self, prompt: str | list[int], param: str, what: str | None = None, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a prompt, checked against the vocabulary and the context.

        Args:
            prompt: text, or token ids.
            param: the field the errors name (``param``).
            what: the prompt's name in the messages (``prompt[2]`` in a list), default ``param``.
            add_special_tokens: what the tokenizer's post-processor adds (a BOS): False for a
                rendered chat template, which holds its own (vLLM's chat default).

        Raises:
            ApiError: 400 naming ``param``: no tokenizer, no token, a token id outside the
                vocabulary, a prompt that leaves no room in the context.
        """
        model = self.model
        what = what or param
        context = model.max_seq_len
        if isinstance(prompt, str) and len(prompt) > PROMPT_CHARS_MARGIN * context * model.max_token_chars():
            # so many characters need more tokens than the context holds: refused before the
            # tokenizer, which would hold the event loop (every stream) for seconds
            raise ApiError(
                400,
                f"This model's maximum context length is {context} tokens; the {what} has {len(prompt)} characters, "
                f"more than {context} tokens of at most {model.max_token_chars()} characters each",
                param=param,
            )
        try:
            ids = model.encode(prompt, add_special_tokens) if isinstance(prompt, str) else list(prompt)
        except TrtcoreError as exc:
            raise ApiError(400, f"{what}: {exc}" if what != param else str(exc), param=param) from None
        if not ids:
            raise ApiError(400, f"{what} is empty; give at least one token", param=param)
        vocab = model.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ApiError(400, f"{what} has token ids outside [0, {vocab}): {bad[:5]}", param=param)
        if len(ids) >= context:
            raise ApiError(400, f"This model's maximum context length is {context} tokens; the {what} has {len(ids)} tokens", param=param)
        return ids

    def max_tokens(self, requested: int | None, default: int | None, num_prompt: int, param: str) -> int:
        """``max_tokens`` of a request: what it asked, else ``default``, else what fits the
        context and the KV cache (a request needs up to ``prompt + max_tokens - 1`` KV tokens:
        one that can never fit is refused here, before a stream starts)."""
        model = self.model
        room = model.max_seq_len - num_prompt
        kv = model.kv_cache_tokens
        kv_room = room if kv is None else kv + 1 - num_prompt
        n = requested if requested is not None else (default if default is not None else min(room, kv_room))
        if n > room:
            raise ApiError(
                400,
                f"This model's maximum context length is {room + num_prompt} tokens; {param}={n} and the prompt's {num_prompt} tokens exceed it",
                param=param,
            )
        if n > kv_room:
            raise ApiError(
                400,
                f"{param}={n} and the prompt's {num_prompt} tokens need up to {num_prompt + n - 1} KV cache tokens; this server's "
                f"KV cache holds {kv} (lower {param}, or start the server with more --kv-cache-memory / --gpu-memory-utilization)",
                param=param,
            )
        return n

    def token_text(self, token_id: int) -> str:
        """The token's text in logprobs: never lossy (``"bytes:\\xNN"`` for part of a UTF-8
        character, :func:`trtcore.token_bytes.token_text`); the id without a tokenizer."""
        tok = self.model.tokenizer
        return token_text(tok, token_id) if tok is not None else str(token_id)

    def token_bytes(self, token_id: int) -> list[int] | None:
        """The token's raw bytes (chat logprobs' ``bytes``); None without a tokenizer."""
        tok = self.model.tokenizer
        return list(token_bytes(tok, token_id)) if tok is not None else None

    def params(self, body: Any, max_tokens: int, logprobs: int | None) -> Any:
        """The request's :class:`~trtcore.runtime.sampling.SamplingParams`; 400 for ``n`` > 1
        or a value SamplingParams refuses."""
        if body.n != 1:
            raise ApiError(400, f"n={body.n} is not supported; only n=1", param="n")
        vocab = self.model.vocab_size
        bad = [t for t in body.stop_token_ids or [] if t >= vocab]
        if bad:  # an id the model cannot sample never stops it; one past int64 broke the sampler
            raise ApiError(400, f"stop_token_ids has ids outside the vocabulary [0, {vocab}): {bad[:5]}", param="stop_token_ids")
        try:
            return body.sampling_params(max_tokens, logprobs)
        except TrtcoreError as exc:  # SamplingParams names its field (the API's name)
            raise ApiError(400, str(exc), param=getattr(exc, "field", None)) from None

    def submit(self, ids: list[int], body: Any, max_tokens: int, logprobs: int | None) -> RequestStream:
        """One request to the engine: 400 (:meth:`params`), 429 (the waiting queue is full),
        503 (loading, draining, the engine died)."""
        return self.submit_batch([(ids, self.params(body, max_tokens, logprobs))])[0]

    def submit_batch(self, requests: list[tuple[list[int], Any]]) -> list[RequestStream]:
        """``[(prompt ids, SamplingParams)]`` to the engine, all or none: 429 when they do not
        all fit the waiting queue, 503 while loading, draining or once the engine died."""
        try:
            return self.engine.submit_batch(requests)
        except QueueFullError as exc:
            raise ApiError(429, str(exc), "rate_limit_error", code="rate_limit_exceeded", retry_after=1) from None
        except (EngineDrainingError, EngineNotReadyError) as exc:
            raise ApiError(503, str(exc), "service_unavailable", retry_after=1) from None
        except InvalidRequestError as exc:  # a list of prompts that can never be queued (not a retry)
            raise ApiError(400, str(exc), param="prompt") from None


def _sse(obj: Any) -> str:
    data = obj.model_dump_json() if hasattr(obj, "model_dump_json") else json.dumps(obj)
    return f"data: {data}\n\n"


class _ChunkTemplate:
    """The SSE event of a streamed chunk whose only changing fields are a few JSON leaves:
    the chunk's JSON text is made once with marker strings in those leaves, and each event
    fills them in (``json.dumps`` of each value), the bytes :func:`_sse` of
    :func:`_chunk_dict` would give for the same values, without building pydantic models per
    token.

    Args:
        chunk: the chunk's dict (:func:`_chunk_dict`) with the changing leaves set to
            ``_ChunkTemplate.mark(i)``, ``i`` = 0, 1, ... in the order :meth:`fill` takes them.
    """

    @staticmethod
    def mark(i: int) -> str:
        """The marker of leaf ``i`` (private-use characters around it: no served name or id holds it)."""
        return f"\ue000trtcore-leaf-{i}\ue001"

    def __init__(self, chunk: dict[str, Any]) -> None:
        text = f"data: {json.dumps(chunk)}\n\n"
        marks = []  # (where, which)
        while (at := text.find(json.dumps(self.mark(len(marks))))) >= 0:
            marks.append((at, len(marks)))
        marks.sort()
        self._order = [i for _, i in marks]
        self._parts, pos = [], 0
        for at, i in marks:
            self._parts.append(text[pos:at])
            pos = at + len(json.dumps(self.mark(i)))
        self._parts.append(text[pos:])

    def fill(self, *values: Any) -> str:
        """The event with ``values`` in the marked leaves."""
        parts, dumps = self._parts, json.dumps
        out = [parts[0]]
        for k, i in enumerate(self._order):
            out.append(dumps(values[i]))
            out.append(parts[k + 1])
        return "".join(out)


def _lp(x: float) -> float:
    return max(float(x), MIN_LOGPROB) if not math.isnan(x) else MIN_LOGPROB


def _error_body(exc: Exception) -> dict[str, Any]:
    if isinstance(exc, EngineNotReadyError):  # the engine process died under the request
        kind = "service_unavailable"
    else:
        kind = "invalid_request_error" if isinstance(exc, TrtcoreError) else "server_error"
    return ErrorResponse(error=ErrorInfo(message=str(exc), type=kind)).model_dump()


class _ClientGone(Exception):
    """The client of a non-streamed request disconnected (its request was aborted)."""


async def _collect(streams: list[RequestStream], on_output: Callable[[int, Any], None], request: Request) -> list[Any]:
    """Run non-streamed requests (a completion's prompts) to their end, concurrently;
    ``on_output(i, output)`` per output of ``streams[i]``; the last output of each (its finish
    reason). The client is watched meanwhile (every :data:`DISCONNECT_POLL_S`): when it
    disconnects, every request is aborted at once, so their KV blocks are freed, and
    :class:`_ClientGone` ends the handler. A request that fails aborts the others and raises
    its error (503 for an engine that died, else 400)."""
    last: list[Any] = [None] * len(streams)

    async def consume(i: int, stream: RequestStream) -> None:
        async for out in stream:
            on_output(i, out)
            last[i] = out

    tasks = [asyncio.ensure_future(consume(i, s)) for i, s in enumerate(streams)]
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, timeout=DISCONNECT_POLL_S, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                t.result()  # a failure: raised here, the others are aborted below
            if pending and await request.is_disconnected():
                raise _ClientGone
    except EngineNotReadyError as exc:  # the engine process died under the request
        raise ApiError(503, str(exc), "service_unavailable", retry_after=1) from None
    except TrtcoreError as exc:
        raise ApiError(400, str(exc)) from None
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t  # finished here, not collected later as a pending task
        for s in streams:
            if not s.finished:
                s.abort()  # the client is gone, another request failed, or the handler was cancelled
    return last


async def _events(stream: RequestStream, chunks: Callable[[Any], str], tail: Callable[[], list[Any]]) -> AsyncIterator[str]:
    """The SSE body: ``chunks(output)`` (its events' text) per output, then ``tail()``'s
    chunks, then ``[DONE]``; the outputs that arrived together go out in one write; an error
    becomes one error event; a disconnect (the generator closed early) aborts the request."""
    try:
        while outs := await stream.drain():
            yield "".join([chunks(out) for out in outs])
        for c in tail():
            yield _sse(c)
    except Exception as exc:  # the request failed after the stream began
        yield _sse(_error_body(exc))
    finally:
        if not stream.finished:
            stream.abort()
    yield "data: [DONE]\n\n"


async def _events_batch(streams: list[RequestStream], chunks: list[Callable[[Any], str]], tail: Callable[[], list[Any]]) -> AsyncIterator[str]:
    """:func:`_events` of several requests (a completion's prompts) in one SSE body: their
    events interleaved as their outputs arrive (``chunks[i](output)`` for ``streams[i]``;
    the outputs that arrived together go out in one write, by index), ``tail()``'s chunks
    once all finished, then one ``[DONE]``. A request that fails aborts the others (one error
    event); a disconnect aborts them all."""
    waits = {asyncio.ensure_future(s.drain()): i for i, s in enumerate(streams)}
    try:
        while waits:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            parts, error = [], None
            for t in sorted(done, key=waits.__getitem__):
                i = waits.pop(t)
                try:
                    outs = t.result()
                except Exception as exc:
                    error = error or exc
                    continue
                if outs:
                    parts.extend([chunks[i](out) for out in outs])
                    waits[asyncio.ensure_future(streams[i].drain())] = i
            if parts:
                yield "".join(parts)
            if error is not None:
                raise error
        for c in tail():
            yield _sse(c)
    except Exception as exc:  # a request failed after the stream began
        yield _sse(_error_body(exc))
    finally:
        for t in waits:
            t.cancel()
        for s in streams:
            if not s.finished:
                s.abort()
    yield "data: [DONE]\n\n"


@dataclass(frozen=True)
class CorsPolicy:
    """The server's CORS answers (Starlette's ``CORSMiddleware``), vLLM's options and defaults
    (``--allowed-origins``, ``--allow-credentials``, ``--allowed-methods``,
    ``--allowed-headers``): any origin, method and header, no credentials, so that browser
    clients (Open WebUI's direct connections, chat front ends) can call the API; a preflight
    ``OPTIONS`` is answered before the API key is asked for, and every answer, a 401 too,
    carries the allow headers -- but a 500 from an unexpected failure: Starlette answers those
    outside every middleware."""

    allowed_origins: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)


def build_app(
    engine: AsyncEngine,
    served_model_name: str,
    on_load_error: Callable[[BaseException], None] | None = None,
    on_ready: Callable[[], None] | None = None,
    api_key: str | None = None,
    cors: CorsPolicy | None = None,
) -> FastAPI:
    """The FastAPI application serving ``engine`` as ``served_model_name``.

    The lifespan starts the engine and its model loading in the background (``/health``
    answers 503 until it is ready); ``on_ready`` is called once it is, ``on_load_error`` if
    that fails. On shutdown the engine drains. ``api_key`` (None or empty: none): the ``/v1``
    routes need it as a bearer token (:class:`~trtcore.serve.auth.ApiKeyMiddleware`). ``cors``:
    the CORS answers (None: :class:`CorsPolicy`'s defaults, vLLM's).
    """
    served = _Served(engine, served_model_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def load() -> None:
            try:
                await engine.start()
            except BaseException as exc:
                if on_load_error is not None:
                    on_load_error(exc)
                return
            if on_ready is not None:
                on_ready()

        task = asyncio.create_task(load())
        yield
        await task
        await engine.shutdown()

    app = FastAPI(title="trtcore", lifespan=lifespan)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    cors = cors or CorsPolicy()
    app.add_middleware(  # added last, so outermost: a 401 carries the allow headers too
        CORSMiddleware,
        allow_origins=list(cors.allowed_origins),
        allow_credentials=cors.allow_credentials,
        allow_methods=list(cors.allowed_methods),
        allow_headers=list(cors.allowed_headers),
    )

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return ApiError(exc.status_code, str(exc.detail), "not_found_error" if exc.status_code == 404 else "invalid_request_error").response()

    @app.exception_handler(_ClientGone)
    async def client_gone(request: Request, exc: _ClientGone) -> Response:
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        return ApiError(500, f"{type(exc).__name__}: {exc}", "server_error").response()

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Response:
        ok = engine.ready and not engine.draining
        return Response(status_code=200 if ok else 503)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[_model_card(served)])

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> ModelCard:
        if not model:  # "/v1/models/" names no model: not the served one (as "model": "" is in a request)
            raise ApiError(404, f"GET /v1/models/ names no model; this server serves `{served.name}`", param="model", code="model_not_found")
        served.check_model(model)
        return _model_card(served)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Any:
        served.check_model(body.model)
        sent = [f"{name}={value!r}" for name, value in (("echo", body.echo), ("suffix", body.suffix)) if value]
        if sent:  # named as sent: the message said "echo and suffix" whichever it was
            raise ApiError(
                400,
                f"{' and '.join(sent)}: not supported by this server; leave {'them' if len(sent) > 1 else 'it'} out",
                param="echo" if body.echo else "suffix",
            )
        # every prompt is checked before any is submitted: a bad one in a list submits nothing
        listed = isinstance(body.prompt, list) and isinstance(body.prompt[0], str | list)  # a list of prompts
        prompts = body.prompts()
        try:  # before tokenizing: 100,000 prompts held the event loop (every stream) for seconds
            served.engine.check_batch(len(prompts))
        except InvalidRequestError as exc:
            raise ApiError(400, str(exc), param="prompt") from None
        requests: list[tuple[list[int], Any]] = []
        for i, prompt in enumerate(prompts):
            ids = served.prompt_ids(prompt, "prompt", f"prompt[{i}]" if listed else None, body.add_special_tokens)
            requests.append((ids, served.params(body, served.max_tokens(body.max_tokens, 16, len(ids), "max_tokens"), body.logprobs)))
        streams = served.submit_batch(requests)
        rid, usage_opt = random_id("cmpl"), body.stream_options is not None and body.stream_options.include_usage
        k, with_logprobs = len(streams), body.logprobs is not None

        def logprobs_of(out: Any, into: CompletionLogprobs | None, offset: list[Any]) -> CompletionLogprobs | None:
            if into is None or out.logprobs is None:
                return into
            text = served.token_text(out.token_id)
            into.tokens.append(text)
            into.token_logprobs.append(_lp(out.logprobs[out.token_id].logprob))
            into.top_logprobs.append({served.token_text(t): _lp(lp.logprob) for t, lp in out.logprobs.items()})
            # each token starts where the characters begun by the tokens before it end (vLLM
            # sums the token texts' lengths), not where the text shown so far ends: a stream
            # holds text back (stop strings, characters split over tokens). offset = [characters
            # decoded, an incremental UTF-8 decoder]; bytes it holds begin one more character
            # (completed or replaced by U+FFFD later, it begins before this token)
            raw = served.token_bytes(out.token_id)
            if raw is None:
                into.text_offset.append(offset[0])
                offset[0] += len(text)
                return into
            into.text_offset.append(offset[0] + (1 if offset[1].getstate()[0] else 0))
            offset[0] += len(offset[1].decode(bytes(raw)))
            return into

        if body.stream:
            created, m = int(time.time()), _ChunkTemplate.mark

            def chunks_of(index: int) -> Callable[[Any], str]:
                """The events of prompt ``index``'s outputs (one template per index)."""
                choice = CompletionChoice(index=index, text=m(0), finish_reason=m(1), stop_reason=m(2))
                plain = _ChunkTemplate(_chunk_dict(CompletionResponse(id=rid, created=created, model=served.name, choices=[choice]), usage_opt))
                offset: list[Any] = [0, _utf8_decoder()]

                def chunks(out: Any) -> str:
                    if not with_logprobs:
                        return plain.fill(out.text, out.finish_reason, out.stop_reason)
                    lp = logprobs_of(out, CompletionLogprobs(), offset)
                    choice = CompletionChoice(index=index, text=out.text, logprobs=lp, finish_reason=out.finish_reason, stop_reason=out.stop_reason)
                    return _sse(_chunk_dict(CompletionResponse(id=rid, created=created, model=served.name, choices=[choice]), usage_opt))

                return chunks

            def tail() -> list[Any]:
                return [CompletionResponse(id=rid, created=created, model=served.name, choices=[], usage=_usage(streams))] if usage_opt else []

            if k == 1:
                return StreamingResponse(_events(streams[0], chunks_of(0), tail), media_type="text/event-stream")
            return StreamingResponse(_events_batch(streams, [chunks_of(i) for i in range(k)], tail), media_type="text/event-stream")

        pieces: list[list[str]] = [[] for _ in range(k)]
        lps = [CompletionLogprobs() if with_logprobs else None for _ in range(k)]
        offsets: list[list[Any]] = [[0, _utf8_decoder()] for _ in range(k)]

        def add(i: int, out: Any) -> None:
            pieces[i].append(out.text)
            logprobs_of(out, lps[i], offsets[i])

        lasts = await _collect(streams, add, request)
        choices = [
            CompletionChoice(index=i, text="".join(pieces[i]), logprobs=lps[i], finish_reason=last.finish_reason, stop_reason=last.stop_reason)
            for i, last in enumerate(lasts)
        ]
        return CompletionResponse(id=rid, model=served.name, choices=choices, usage=_usage(streams))

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        served.check_model(body.model)
        messages = [m.template_message() for m in body.messages]
        try:
            prompt = served.model.apply_chat_template(messages, add_generation_prompt=body.add_generation_prompt)
        except TrtcoreError as exc:
            raise ApiError(400, str(exc), param="messages") from None
        if body.continue_final_message:
            prompt = _continued(prompt, messages[-1]["content"])
        ids = served.prompt_ids(prompt, "messages", add_special_tokens=body.add_special_tokens)  # default False: the template wrote its BOS
        asked, param = (
            (body.max_completion_tokens, "max_completion_tokens") if body.max_completion_tokens is not None else (body.max_tokens, "max_tokens")
        )
        k = (body.top_logprobs or 0) if body.logprobs else None
        stream = served.submit(ids, body, served.max_tokens(asked, None, len(ids), param), k)
        rid, usage_opt = random_id("chatcmpl"), body.stream_options is not None and body.stream_options.include_usage

        def logprobs_of(out: Any) -> list[ChatLogprob]:
            if k is None or out.logprobs is None:
                return []
            tops = sorted(((t, lp) for t, lp in out.logprobs.items() if lp.rank is not None and lp.rank <= k), key=lambda e: e[1].rank)[:k]
            return [
                ChatLogprob(
                    token=served.token_text(out.token_id),
                    logprob=_lp(out.logprobs[out.token_id].logprob),
                    bytes=served.token_bytes(out.token_id),
                    top_logprobs=[TopLogprob(token=served.token_text(t), logprob=_lp(lp.logprob), bytes=served.token_bytes(t)) for t, lp in tops],
                )
            ]

        if body.stream:
            first = [True]
            created, m = int(time.time()), _ChunkTemplate.mark
            delta = ChatStreamChoice(delta=ChatResponseMessage(content=m(0)), finish_reason=m(1), stop_reason=m(2))
            plain = _ChunkTemplate(_chunk_dict(ChatCompletionChunk(id=rid, created=created, model=served.name, choices=[delta]), usage_opt))

            def chunks(out: Any) -> str:
                head = ""
                if first[0]:  # OpenAI's first chunk: the role
                    first[0] = False
                    role = ChatStreamChoice(delta=ChatResponseMessage(role="assistant", content=""))
                    head = _sse(_chunk_dict(ChatCompletionChunk(id=rid, created=created, model=served.name, choices=[role]), usage_opt))
                if k is None:
                    return head + plain.fill(out.text, out.finish_reason, out.stop_reason)
                choice = ChatStreamChoice(
                    delta=ChatResponseMessage(content=out.text),
                    logprobs=ChatLogprobs(content=logprobs_of(out)),
                    finish_reason=out.finish_reason,
                    stop_reason=out.stop_reason,
                )
                return head + _sse(_chunk_dict(ChatCompletionChunk(id=rid, created=created, model=served.name, choices=[choice]), usage_opt))

            def tail() -> list[Any]:
                return [ChatCompletionChunk(id=rid, created=created, model=served.name, choices=[], usage=_usage([stream]))] if usage_opt else []

            return StreamingResponse(_events(stream, chunks, tail), media_type="text/event-stream")

        pieces: list[str] = []
        content: list[ChatLogprob] = []

        def add(out: Any) -> None:
            pieces.append(out.text)
            content.extend(logprobs_of(out))

        [last] = await _collect([stream], lambda _, out: add(out), request)
        choice = ChatChoice(
            message=ChatResponseMessage(role="assistant", content="".join(pieces)),
            logprobs=ChatLogprobs(content=content) if k is not None else None,
            finish_reason=last.finish_reason,
            stop_reason=last.stop_reason,
        )
        return ChatCompletionResponse(id=rid, model=served.name, choices=[choice], usage=_usage([stream]))

    return app


def _utf8_decoder() -> Any:
    """An incremental UTF-8 decoder (a character split over tokens counts once it completes)."""
    return codecs.getincrementaldecoder("utf-8")("replace")


def _continued(rendered: str, final: str) -> str:
    """The rendered chat cut right after the last message's content, so the model continues
    that message (transformers' ``continue_final_message``: the template's end-of-turn text
    after it is dropped; the content is found stripped, and kept with its trailing whitespace
    where the template kept it).

    Raises:
        ApiError: 400 naming ``messages``: the content is empty or the template does not
            show it.
    """
    core = final.strip()
    at = rendered.rfind(core) if core else -1
    if at < 0:
        raise ApiError(400, "continue_final_message: the last message's content does not appear in the rendered chat template", param="messages")
    whole = final.lstrip()
    end = at + (len(whole) if rendered[at : at + len(whole)] == whole else len(core))
    return rendered[:end]


def _model_card(served: _Served) -> ModelCard:
    """The served model's card (``GET /v1/models``, ``GET /v1/models/{model}``); 503 while loading."""
    model = served.model
    return ModelCard(id=served.name, root=model.model_dir, max_model_len=model.max_seq_len, version=model.version)


def _usage(streams: list[RequestStream]) -> UsageInfo:
    """The token counts so far of a response's requests (summed over a completion's prompts)."""
    p = sum(len(s.prompt_token_ids) for s in streams)
    n = sum(s.num_output_tokens for s in streams)
    return UsageInfo(prompt_tokens=p, completion_tokens=n, total_tokens=p + n)


def _chunk_dict(chunk: Any, include_usage: bool) -> dict[str, Any]:
    """A streamed chunk as JSON data: ``"usage": null`` with ``include_usage``, else no ``usage``."""
    d: dict[str, Any] = chunk.model_dump()
    if not include_usage:
        d.pop("usage", None)
    for choice in d.get("choices", ()):  # a delta leaves its unset role out (OpenAI's chunks)
        delta = choice.get("delta")
        if delta is not None and delta.get("role") is None:
            delta.pop("role", None)
    return d
