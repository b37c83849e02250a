"""The server's engine, seen from the event loop: :class:`AsyncEngine` feeds the engine core
(:mod:`trtcore.serve.core`) with the HTTP handlers' requests and routes its outputs back to
their :class:`RequestStream` s.

Processes (vLLM V1's "engine core" design): the server process runs the asyncio event loop
(uvicorn, FastAPI, one SSE write per batch of tokens) and this class; the **engine process**
(:func:`trtcore.serve.core.run_engine_core`, started with ``multiprocessing``'s ``spawn``
method: CUDA does not survive ``fork``) builds the :class:`~trtcore.llm.LLM` and runs the step
loop. The two share no GIL, so a step's host work never waits for HTTP work and the reverse.
``in_process=True`` runs the same engine-core loop in a thread of the server process instead,
over the same socket and messages (debugging, tests with objects that cannot be pickled).

Who owns what: the engine process owns the LLM (its scheduler, KV blocks, detokenizers, the
batching window); the server process owns the streams, the waiting limit (``max_waiting``),
the metrics and the model's description (:class:`~trtcore.serve.core.ServedModel`: vocabulary
size, context, tokenizer, chat template, engine version), which the routes use to tokenize
and check requests before they are sent.

Messages (:mod:`trtcore.serve.core` has the wire format): the server sends ``ADD`` (request
id, prompt token ids, :class:`~trtcore.runtime.sampling.SamplingParams`), ``ABORT`` (a client
that went away: the engine frees its KV blocks before its next step) and ``SHUTDOWN``; what a
loop iteration of the server queued goes out in one write. The engine sends ``READY`` (the
model's description) or ``LOAD_ERROR`` once, then one ``STEP`` message per step with all its
outputs and the scheduler's state the metrics need (running requests, KV cache usage,
preemptions). The event loop reads the socket with ``loop.add_reader``, no thread of its own.
The engine never waits for the server: steps whose messages the socket cannot take yet go out
together later, and a stream whose reader falls behind collects its outputs, which the reader
takes all at its next wake-up (:meth:`RequestStream.drain`; vLLM's ``RequestOutputCollector``).

Errors: a request the engine refuses (e.g. a prompt over the context) or that fails (non-finite
logits) ends only its own stream; an exception out of a step fails the requests then live and
the engine goes on. An engine process that dies fails every live stream with
:class:`EngineDeadError`; :attr:`AsyncEngine.ready` turns False (``/health``: 503), new
requests are refused with it, and :attr:`AsyncEngine.on_dead` is called (``trtcore serve``
then shuts down and exits with status 1). A shutdown (SIGTERM) drains: no new requests, the running ones
finish, then the engine process closes the LLM and exits.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import multiprocessing
import pickle
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgumentError, InvalidRequestError, TrtcoreError
from ..llm import StreamOutput
from ..runtime.sampling import SamplingParams
from .core import ABORT, ADD, HEADER, LOAD_ERROR, READY, SHUTDOWN, STEP, ServedModel, enlarge_buffers, frame, run_engine_core
from .metrics import ServerMetrics

__all__ = ["AsyncEngine", "EngineDeadError", "EngineDrainingError", "EngineNotReadyError", "QueueFullError", "RequestStream"]

#: bytes read from the engine's socket at once
READ_SIZE = 1 << 20
#: seconds to wait for the engine process to exit after ``SHUTDOWN`` (it closes the LLM) before killing it
EXIT_TIMEOUT_S = 60.0


class EngineNotReadyError(TrtcoreError, RuntimeError):
    """The model is still loading (HTTP 503)."""


class EngineDrainingError(TrtcoreError, RuntimeError):
    """The server is shutting down and takes no new requests (HTTP 503)."""


class QueueFullError(TrtcoreError, RuntimeError):
    """``max_waiting`` requests already wait (HTTP 429 with ``Retry-After``)."""


class EngineDeadError(EngineNotReadyError):
    """The engine process exited without being asked to (a crash, a kill): the live requests
    fail with it, new ones are refused with it (HTTP 503); the server needs a restart."""


@dataclass(eq=False)
class RequestStream:
    """One request's side of the loop: its outputs arrive in an asyncio queue.

    Iterate it (``async for out in stream``) for :class:`trtcore.llm.StreamOutput` s until
    the one with a ``finish_reason``, or call :meth:`drain` for all that arrived since the
    last call; a failed request raises its error
    (:class:`~trtcore.errors.InvalidRequestError`, :class:`~trtcore.errors.GenerationError`)
    from the iteration. :meth:`abort` cancels it (a client that went away).

    Attributes:
        prompt_token_ids: the prompt.
        params: its sampling parameters.
        arrival_time: ``time.perf_counter()`` when it was submitted.
        num_output_tokens: tokens delivered so far.
        request_id: its id in the messages to and from the engine (set by :meth:`AsyncEngine.submit`).
    """

    engine: AsyncEngine
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.perf_counter)
    num_output_tokens: int = 0
    request_id: int | None = None
    scheduled_time: float | None = None
    last_token_time: float | None = None
    finished: bool = False
    aborted: bool = False
    _items: list[Any] = field(default_factory=list)
    _ready: asyncio.Event = field(default_factory=asyncio.Event)
    _done: bool = False

    def _put(self, item: Any) -> None:
        """On the loop's thread: one output (or the request's error)."""
        self._items.append(item)
        self._ready.set()

    async def drain(self) -> list[Any]:
        """The outputs that arrived since the last call (waits for at least one; ``[]`` once
        the last one was taken); a failure raises its error after the outputs before it
        were taken."""
        if self._done:
            return []
        if not self._items:
            self._ready.clear()
            await self._ready.wait()
        items, self._items = self._items, []
        if isinstance(items[0], Exception):
            self._done = True
            raise items[0]
        for i, item in enumerate(items):
            if isinstance(item, Exception):  # deliver what came before; the error next time
                self._items = items[i:]
                return items[:i]
            if item.finish_reason is not None:
                self._done = True
                return items[: i + 1]
        return items

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        while True:
            items = await self.drain()
            if not items:
                return
            for item in items:
                yield item

    def abort(self) -> None:
        """Cancel the request (no-op once finished): it leaves the queue or the running
        batch before the next step and its KV blocks are freed."""
        self.engine._abort(self)


class AsyncEngine:
    """The server's side of the engine (see the module docstring).

    Args:
        make_llm: builds the :class:`~trtcore.llm.LLM` (paged KV cache), called in the engine
            process: it must be picklable (a module-level function or class, or a
            :func:`functools.partial` of one; :func:`trtcore.serve.server.make_llm_factory`).
        metrics: where the request metrics go.
        max_waiting: most requests waiting (submitted, not yet scheduled, beyond the batch's
            free slots) before :meth:`submit` refuses with :class:`QueueFullError`; at least 1.
        max_queue_delay_s: the batching window, seconds (0: none; applied by the engine core).
        in_process: run the engine-core loop in a thread of this process instead of an engine
            process (same loop, same messages; ``make_llm`` need not be picklable). For
            debugging and tests: the engine then shares this process's GIL.

    Attributes:
        model: the :class:`~trtcore.serve.core.ServedModel`, once the engine is ready.
        engine_pid: the process the engine core runs in, once ready.
        load_error: why the model failed to load, if it did.
        draining: set on shutdown: :meth:`submit` refuses, running requests finish.
        on_dead: called with the :class:`EngineDeadError` once the engine process (or thread)
            died after its model was ready, after the live streams got the error (None: nothing
            is called). ``trtcore serve`` sets it to shut the server down.

    Raises:
        InvalidArgumentError: ``max_waiting`` below 1, ``max_queue_delay_s`` below 0, or a
            ``make_llm`` that cannot be pickled for the engine process.
    """

    def __init__(
        self,
        make_llm: Callable[[], Any],
        metrics: ServerMetrics,
        max_waiting: int = 1024,
        max_queue_delay_s: float = 0.0,
        in_process: bool = False,
    ) -> None:
        if int(max_waiting) < 1:
            raise InvalidArgumentError(f"max_waiting must be >= 1 (a new request waits until the scheduler takes it), got {max_waiting}")
        if float(max_queue_delay_s) < 0:
            raise InvalidArgumentError(f"max_queue_delay_s must be >= 0, got {max_queue_delay_s}")
        if not in_process:
            try:
                pickle.dumps(make_llm)
            except Exception as exc:
                raise InvalidArgumentError(
                    f"make_llm={make_llm!r} cannot be pickled for the engine process ({exc}); pass a module-level "
                    "function or a functools.partial of one, or in_process=True"
                ) from None
        self._make_llm = make_llm
        self.metrics = metrics
        self.max_waiting = int(max_waiting)
        self.max_queue_delay_s = float(max_queue_delay_s)
        self.in_process = bool(in_process)
        self.model: ServedModel | None = None
        self.engine_pid: int | None = None
        self.load_error: BaseException | None = None
        self.draining = False
        self.on_dead: Callable[[EngineDeadError], None] | None = None
        self._worker: Any = None  # the engine process, or the engine thread (in_process)
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rbuf = bytearray()
        self._chunk = memoryview(bytearray(READ_SIZE))  # recv_into this (a fresh 1 MiB bytes per recv costs an mmap)
        self._wbuf = bytearray()
        self._writing = False  # waiting for the socket to take _wbuf
        self._commands: list[tuple[Any, ...]] = []  # queued this loop iteration, sent in one frame
        self._started: asyncio.Future[None] | None = None
        self._stopping = False  # SHUTDOWN sent: the engine's end of the socket closing is expected
        self._stopped: asyncio.Future[None] | None = None  # done when the engine's end closed
        self._dead: EngineDeadError | None = None
        self._ids = itertools.count()
        self._streams: dict[int, RequestStream] = {}  # submitted and not finished, by request id
        self._waiting: set[RequestStream] = set()  # submitted, not yet scheduled
        self._preemptions = 0

    @property
    def ready(self) -> bool:
        """True once the model is loaded and the engine runs (False again if it died)."""
        return self.model is not None and self._dead is None and not self._stopping

    async def start(self) -> None:
        """Start the engine (process or thread) and wait until its model is loaded.

        Raises:
            Exception: the model failed to load (the engine's exception, kept in
                :attr:`load_error`; the server stays not ready).
            EngineDeadError: the engine process died while loading.
        """
        loop = self._loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        enlarge_buffers(ours)
        if self.in_process:
            self._worker = threading.Thread(
                target=run_engine_core, args=(self._make_llm, theirs, self.max_queue_delay_s, False), name="trtcore-engine", daemon=True
            )
            self._worker.start()
        else:
            # daemon: the engine process ends with this one if it exits without a shutdown
            ctx = multiprocessing.get_context("spawn")
            self._worker = ctx.Process(
                target=run_engine_core, args=(self._make_llm, theirs, self.max_queue_delay_s), name="trtcore-engine", daemon=True
            )
            try:
                self._worker.start()
            finally:
                theirs.close()  # the child has its copy: its exit closes the socket's far end
            atexit.register(self._reap_at_exit)  # runs before multiprocessing's own exit handler
        ours.setblocking(False)
        self._sock = ours
        self._started, self._stopped = loop.create_future(), loop.create_future()
        loop.add_reader(ours.fileno(), self._on_readable)
        try:
            await self._started
        except BaseException as exc:
            self.load_error = exc
            await self._join()
            raise

    async def shutdown(self) -> None:
        """Drain and stop: refuse new requests, let the live ones finish, then the engine
        closes the LLM and exits."""
        self.draining = True
        while self._streams and self._dead is None:
            await asyncio.sleep(0.05)
        if self._sock is not None and self._dead is None and not self._stopping:
            self._stopping = True
            self._send((SHUTDOWN,))
            assert self._stopped is not None
            try:
                await asyncio.wait_for(asyncio.shield(self._stopped), EXIT_TIMEOUT_S)
            except TimeoutError:
                pass
        await self._join()

    def _reap_at_exit(self, timeout: float = 10.0) -> None:
        """At interpreter exit, if the engine process still runs (the server ended without
        :meth:`shutdown`, e.g. on an exception): close this end of the socket, so that its loop
        ends, and kill it if it has not within ``timeout`` seconds. Registered with ``atexit``
        after ``multiprocessing``'s handler, so it runs first: that one sends SIGTERM, which the
        engine process ignores (a signal to the whole process group must not kill it before the
        drain), and then joins it, which would wait for ever."""
        w = self._worker
        if not isinstance(w, multiprocessing.process.BaseProcess) or not w.is_alive():
            return
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None
        w.join(timeout)
        if w.is_alive():
            w.kill()
            w.join()

    async def _join(self) -> None:
        """Wait for the engine's process (or thread) to end (a process that does not within
        :data:`EXIT_TIMEOUT_S` is killed), and close the socket."""
        self._close_socket()
        w = self._worker
        if w is None:
            return
        await asyncio.get_running_loop().run_in_executor(None, w.join, EXIT_TIMEOUT_S)
        if isinstance(w, multiprocessing.process.BaseProcess):
            if w.is_alive():
                w.kill()
                w.join()
            atexit.unregister(self._reap_at_exit)

    def _close_socket(self) -> None:
        if self._sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
                if self._writing:
                    self._loop.remove_writer(self._sock.fileno())
                    self._writing = False
            self._sock.close()
            self._sock = None

    # requests ------------------------------------------------------------------------------
    def submit(self, prompt_token_ids: list[int], params: SamplingParams) -> RequestStream:
        """Queue a request (on the event loop's thread); iterate the returned stream.

        Raises:
            EngineDrainingError: the server is shutting down.
            EngineDeadError: the engine process died.
            EngineNotReadyError: the model is still loading.
            QueueFullError: ``max_waiting`` requests already wait.
        """
        self._check_room(1)
        return self._add(prompt_token_ids, params)

    def submit_batch(self, requests: list[tuple[list[int], SamplingParams]]) -> list[RequestStream]:
        """Queue several requests at once (a list of prompts), all or none: ``len(requests)``
        count against ``max_waiting`` together; one stream per request, in order.

        Raises:
            EngineDrainingError: the server is shutting down.
            EngineDeadError: the engine process died.
            EngineNotReadyError: the model is still loading.
            QueueFullError: they do not all fit under ``max_waiting`` (none was queued).
            InvalidRequestError: more than ``max_waiting`` plus the batch's ``max_batch_size``:
                they could never be queued together, not even on an idle engine.
        """
        self.check_batch(len(requests))
        self._check_room(len(requests))
        return [self._add(ids, params) for ids, params in requests]

    def check_batch(self, k: int) -> None:
        """Refuse ``k`` prompts in one request that could never be queued together (more than
        ``max_waiting`` plus the batch's ``max_batch_size``), before their prompts are tokenized.

        Raises:
            InvalidRequestError: naming the count and the limit.
        """
        if self.model is not None and k > self.max_waiting + self.model.max_batch_size:
            raise InvalidRequestError(
                f"{k} prompts can never be queued together: this server takes at most "
                f"{self.max_waiting + self.model.max_batch_size} at once (--max-waiting {self.max_waiting} + "
                f"--max-batch-size {self.model.max_batch_size}); send fewer per request"
            )

    def _check_room(self, k: int) -> None:
        """Refuse ``k`` new requests unless the engine takes them and they fit under ``max_waiting``."""
        if self.draining:
            raise EngineDrainingError("the server is shutting down")
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        if not self.ready:
            raise EngineNotReadyError("the model is still loading")
        # a request the engine has not scheduled yet waits only beyond the batch's free slots
        # (an idle engine takes max_batch_size requests at its next step)
        free = self.model.max_batch_size - (len(self._streams) - len(self._waiting)) if self.model is not None else 0
        if len(self._waiting) + k - max(free, 0) > self.max_waiting:
            if k == 1:
                raise QueueFullError(f"{self.max_waiting} requests wait already (--max-waiting {self.max_waiting}); retry later")
            raise QueueFullError(
                f"{k} prompts do not fit the waiting queue ({len(self._waiting)} requests wait, --max-waiting {self.max_waiting}, "
                f"{max(free, 0)} free batch slots); none was queued; retry later"
            )

    def _add(self, prompt_token_ids: list[int], params: SamplingParams) -> RequestStream:
        ids = list(prompt_token_ids)
        stream = RequestStream(self, ids, params, request_id=next(self._ids))
        self._streams[stream.request_id] = stream  # type: ignore[index]
        self._waiting.add(stream)
        self.metrics.num_requests_waiting.set(len(self._waiting))
        self._send((ADD, stream.request_id, ids, params))
        return stream

    def _abort(self, stream: RequestStream) -> None:
        if stream.finished:
            return
        stream.aborted = True
        if self._dead is None:
            self._send((ABORT, stream.request_id))  # the engine frees its blocks before its next step
        self._finish(stream, "abort")

    def _finish(self, stream: RequestStream, reason: str | None, now: float | None = None) -> None:
        """Book-keeping of a finished request: metrics (``reason`` None: a failure)."""
        stream.finished = True
        self._waiting.discard(stream)
        self._streams.pop(stream.request_id, None)  # type: ignore[arg-type]
        m = self.metrics
        if reason is None:
            m.request_failure.inc()
        else:
            m.request_success(reason)
            m.e2e_request_latency.observe((now or time.perf_counter()) - stream.arrival_time)
        m.num_requests_waiting.set(len(self._waiting))

    # the socket ----------------------------------------------------------------------------
    def _send(self, msg: tuple[Any, ...]) -> None:
        """Queue ``msg`` for the engine: the messages of one loop iteration go in one frame."""
        if self._sock is None:
            return
        self._commands.append(msg)
        if len(self._commands) == 1:
            assert self._loop is not None
            self._loop.call_soon(self._flush_commands)

    def _flush_commands(self) -> None:
        commands, self._commands = self._commands, []
        if self._sock is None or not commands:
            return
        self._wbuf += frame(commands)
        self._write()

    def _write(self) -> None:
        """Write what the socket takes now; the rest when it becomes writable (never blocks)."""
        sock, loop = self._sock, self._loop
        if sock is None or loop is None:
            return
        try:
            n = sock.send(self._wbuf)
        except BlockingIOError:
            n = 0
        except OSError:
            return  # the engine is gone: the reader sees the end of the stream
        del self._wbuf[:n]
        if self._wbuf and not self._writing:
            loop.add_writer(sock.fileno(), self._write)
            self._writing = True
        elif not self._wbuf and self._writing:
            loop.remove_writer(sock.fileno())
            self._writing = False

    def _on_readable(self) -> None:
        """On the loop's thread, when the engine wrote: handle every complete frame."""
        if self._sock is None:
            return
        try:
            n = self._sock.recv_into(self._chunk)
        except BlockingIOError:
            return
        except OSError:
            n = 0
        if not n:
            self._engine_gone()
            return
        buf = self._rbuf
        buf += self._chunk[:n]
        header = HEADER.size
        while len(buf) >= header:
            (n,) = HEADER.unpack_from(buf)
            if len(buf) < header + n:
                break
            messages = pickle.loads(buf[header : header + n])
            del buf[: header + n]
            for msg in messages:
                self._handle(msg)

    def _handle(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == STEP:
            self._on_step(*msg[1:])
        elif kind == READY:
            self.model, self.engine_pid = msg[1], msg[2]
            if self._started is not None and not self._started.done():
                self._started.set_result(None)
        elif kind == LOAD_ERROR:
            if self._started is not None and not self._started.done():
                self._started.set_exception(msg[1])

    def _engine_gone(self) -> None:
        """The engine's end of the socket closed: expected after ``SHUTDOWN`` or a load error,
        else the engine died (every live stream fails)."""
        self._close_socket()
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)
        if self._stopping:
            return
        w = self._worker
        where = "engine thread"
        if isinstance(w, multiprocessing.process.BaseProcess):
            w.join(0.5)  # its exit status, if it is there yet (a crash only: the loop may wait this once)
            where = f"engine process (pid {w.pid}, exit status {w.exitcode})"
        then = "the server shuts down" if self.on_dead is not None and self.model is not None else "the server needs a restart"
        err = self._dead = EngineDeadError(f"the {where} exited unexpectedly; {then}")
        if self._started is not None and not self._started.done():
            self._started.set_exception(err)
        for s in list(self._streams.values()):
            self._finish(s, None)
            s._put(err)
        self.metrics.num_requests_running.set(0)
        self.metrics.kv_cache_usage.set(0.0)
        if self.model is not None and self.on_dead is not None:  # dying while loading: a load error
            self.on_dead(err)

    # the engine's outputs --------------------------------------------------------------------
    def _scheduled(self, s: RequestStream, at: float) -> None:
        if s.scheduled_time is None:
            s.scheduled_time = at
            self.metrics.request_queue_time.observe(at - s.arrival_time)
            self._waiting.discard(s)

    def _on_step(
        self,
        start: float,
        prompt_tokens: int,
        errors: list[tuple[int, Exception]],
        outputs: list[tuple[Any, ...]],
        scheduled: list[int],
        running: int,
        kv_usage: float,
        preemptions: int,
    ) -> None:
        """On the loop's thread: route one step's outputs to their streams, update the metrics
        (a token's time is now, when its stream gets it, as vLLM's frontend stamps it)."""
        m = self.metrics
        now = time.perf_counter()
        streams = self._streams
        if prompt_tokens:
            m.prompt_tokens.inc(prompt_tokens)
        for rid, exc in errors:
            s = streams.get(rid)
            if s is not None:
                self._finish(s, None)
                s._put(exc)
        for rid in scheduled:
            s = streams.get(rid)
            if s is not None:
                self._scheduled(s, start)
        tokens = 0
        ttft, itl = m.time_to_first_token.observe, m.inter_token_latency.observe
        for rid, token_id, text, logprobs, finish_reason, stop_reason, error in outputs:
            s = streams.get(rid)
            if s is None:
                continue  # aborted meanwhile
            if error is not None:
                self._finish(s, None)
                s._put(error)
                continue
            if s.scheduled_time is None:
                self._scheduled(s, start)
            s.num_output_tokens += 1
            tokens += 1
            if s.last_token_time is None:
                ttft(now - s.arrival_time)
            else:
                itl(now - s.last_token_time)
            s.last_token_time = now
            if finish_reason is not None:
                self._finish(s, finish_reason, now)
            s._put(StreamOutput(rid, token_id, text, logprobs, finish_reason, stop_reason))
        if tokens:
            m.generation_tokens.inc(tokens)
        if preemptions > self._preemptions:
            m.num_preemptions.inc(preemptions - self._preemptions)
        self._preemptions = preemptions
        m.num_requests_running.set(running)
        m.num_requests_waiting.set(len(self._waiting))
        m.kv_cache_usage.set(kv_usage)
