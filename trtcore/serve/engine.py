"""The engine loop of the server: one per process, fed by the HTTP handlers through an
asyncio queue, driving :class:`trtcore.llm.LLM`'s online API (``add_request`` / ``step`` /
``abort_request``).

Threads: every call into the LLM (its construction, admissions, aborts, steps, ``close``)
runs in one dedicated engine thread (a one-thread pool), so HTTP handling never waits for a
step and the LLM (with its GPU context, where it has one) only ever sees one thread. The
engine thread steps continuously while requests are live, as vLLM's engine core does: between
two steps it admits the queued requests and applies the aborts of disconnected clients (their
KV blocks are freed before the next step), and it hands each step's outputs to the event loop
and goes on without waiting for them: the results queue up, and one ``loop.call_soon_threadsafe``
wakes the loop for all the results that arrive before it runs; on the loop's thread
:meth:`AsyncEngine._dispatch` routes them to their :class:`RequestStream` s and updates the
metrics. A stream whose reader falls behind collects its outputs, and the reader takes them
all at its next wake-up (:meth:`RequestStream.drain`; vLLM's ``RequestOutputCollector``).

Batching window (``max_queue_delay_s``, Triton's ``max_queue_delay``): queued requests are
held until the oldest has waited that long, or until they fill the free batch slots
(``max_batch_size`` minus the running requests); 0 (the default) admits them at the next
step (continuous batching needs no window).

A failing request (refused by the scheduler, non-finite logits) ends only its own stream;
an exception out of a step fails the requests then live and the loop goes on.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgumentError, TrtcoreError
from ..runtime.sampling import SamplingParams
from .metrics import ServerMetrics

__all__ = ["AsyncEngine", "EngineDrainingError", "EngineNotReadyError", "QueueFullError", "RequestStream"]


class EngineNotReadyError(TrtcoreError, RuntimeError):
    """The model is still loading (HTTP 503)."""


class EngineDrainingError(TrtcoreError, RuntimeError):
    """The server is shutting down and takes no new requests (HTTP 503)."""


class QueueFullError(TrtcoreError, RuntimeError):
    """``max_waiting`` requests already wait (HTTP 429 with ``Retry-After``)."""


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


@dataclass
class _StepResult:
    outputs: list[Any]
    errors: list[tuple[RequestStream, Exception]]
    start: float
    scheduled: list[int]
    running: int
    kv_usage: float
    preemptions: int


class AsyncEngine:
    """The server's engine loop (see the module docstring).

    Args:
        make_llm: builds the :class:`~trtcore.llm.LLM` (run in the engine thread by :meth:`start`;
            it must use the paged KV cache).
        metrics: where the request metrics go.
        max_waiting: most requests waiting (submitted, not yet scheduled) before
            :meth:`submit` refuses with :class:`QueueFullError`; at least 1 (every new
            request waits until the scheduler takes it).
        max_queue_delay_s: the batching window, seconds (0: none).

    Attributes:
        llm: the model, once :attr:`ready`.
        draining: set on shutdown: :meth:`submit` refuses, running requests finish.

    Raises:
        InvalidArgumentError: ``max_waiting`` below 1.
    """

    def __init__(self, make_llm: Callable[[], Any], metrics: ServerMetrics, max_waiting: int = 1024, max_queue_delay_s: float = 0.0) -> None:
        if int(max_waiting) < 1:
            raise InvalidArgumentError(f"max_waiting must be >= 1 (a new request waits until the scheduler takes it), got {max_waiting}")
        self._make_llm = make_llm
        self.metrics = metrics
        self.max_waiting = int(max_waiting)
        self.max_queue_delay_s = float(max_queue_delay_s)
        self.llm: Any = None
        self.load_error: BaseException | None = None
        self.draining = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trtcore-engine")
        # shared by the loop's thread and the engine thread, under _lock
        self._lock = threading.Lock()
        self._pending: list[RequestStream] = []
        self._aborts: list[RequestStream] = []
        self._stopping = False
        self._wakeup = threading.Event()
        self._results: list[tuple[list[RequestStream], _StepResult]] = []  # for the loop, in step order
        # the loop's thread only
        self._live: dict[int, RequestStream] = {}
        self._waiting: set[RequestStream] = set()
        self._task: asyncio.Future[None] | None = None
        self._preemptions = 0

    @property
    def ready(self) -> bool:
        """True once the model is loaded and the loop runs."""
        return self.llm is not None and self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Load the model in the engine thread and start the loop; a load failure is kept
        in :attr:`load_error` (the server stays not ready) and raised."""
        loop = asyncio.get_running_loop()
        try:
            self.llm = await loop.run_in_executor(self._executor, self._make_llm)
        except BaseException as exc:
            self.load_error = exc
            raise
        self._task = loop.run_in_executor(self._executor, self._run, loop)

    async def shutdown(self) -> None:
        """Stop the loop (after the requests still live, which drain first) and close the LLM."""
        self.draining = True
        while self._task is not None and (self._live or self._pending) and not self._task.done():
            await asyncio.sleep(0.05)
        with self._lock:
            self._stopping = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        if self.llm is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self.llm.close)
        self._executor.shutdown(wait=True)

    # requests ------------------------------------------------------------------------------
    def submit(self, prompt_token_ids: list[int], params: SamplingParams) -> RequestStream:
        """Queue a request (on the event loop's thread); iterate the returned stream.

        Raises:
            EngineNotReadyError: the model is still loading.
            EngineDrainingError: the server is shutting down.
            QueueFullError: ``max_waiting`` requests already wait.
        """
        if self.draining:
            raise EngineDrainingError("the server is shutting down")
        if not self.ready:
            raise EngineNotReadyError("the model is still loading")
        if len(self._waiting) >= self.max_waiting:
            raise QueueFullError(f"{len(self._waiting)} requests wait already (--max-waiting {self.max_waiting}); retry later")
        stream = RequestStream(self, list(prompt_token_ids), params)
        with self._lock:
            self._pending.append(stream)
        self._waiting.add(stream)
        self.metrics.num_requests_waiting.set(len(self._waiting))
        self._wakeup.set()
        return stream

    def _abort(self, stream: RequestStream) -> None:
        if stream.finished:
            return
        stream.aborted = True
        with self._lock:
            if stream in self._pending:
                self._pending.remove(stream)
            else:
                self._aborts.append(stream)  # the engine thread frees its blocks before the next step
        self._finish(stream, "abort")
        self._wakeup.set()

    def _finish(self, stream: RequestStream, reason: str | None, now: float | None = None) -> None:
        """Book-keeping of a finished request: metrics (``reason`` None: a failure)."""
        stream.finished = True
        self._waiting.discard(stream)
        if stream.request_id is not None:
            self._live.pop(stream.request_id, None)
        m = self.metrics
        if reason is None:
            m.request_failure.inc()
        else:
            m.request_success(reason)
            m.e2e_request_latency.observe((now or time.perf_counter()) - stream.arrival_time)
        m.num_requests_waiting.set(len(self._waiting))

    # the engine thread -------------------------------------------------------------------
    def _admissions(self, now: float) -> tuple[list[RequestStream], float | None]:
        """Under the lock: the queued requests to admit now, and how long to wait for the
        window otherwise."""
        if not self._pending:
            return [], None
        if self.max_queue_delay_s > 0:
            free = max(self.llm.build_config.max_batch_size - self.llm.engine.scheduler.num_running, 0)
            waited = now - self._pending[0].arrival_time
            if waited < self.max_queue_delay_s and (free == 0 or len(self._pending) < free):
                return [], self.max_queue_delay_s - waited
        admit, self._pending = self._pending, []
        return admit, None

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        """The engine thread's loop: admit, abort, step, hand the result to ``loop``; sleep
        while idle; return once stopping and idle."""
        live: dict[int, RequestStream] = {}  # admitted and not finished, as this thread knows
        while True:
            with self._lock:
                admit, hold = self._admissions(time.perf_counter())
                aborts, self._aborts = self._aborts, []
                idle = not admit and not aborts and not self.llm.has_unfinished_requests()
                if idle:
                    if self._stopping:
                        return
                    self._wakeup.clear()  # under the lock: a submit after it sets it again
            if idle:  # (or holding the window): sleep until a request or the window's end
                self._wakeup.wait(hold)
                continue
            result = self._step(admit, aborts, live)
            with self._lock:
                self._results.append((admit, result))
                wake = len(self._results) == 1  # else a wake-up is on its way and takes this one too
            if wake:
                loop.call_soon_threadsafe(self._dispatch_results)

    def _step(self, admit: list[RequestStream], aborts: list[RequestStream], live: dict[int, RequestStream]) -> _StepResult:
        """In the engine thread: admissions, aborts, one step, the scheduler's state
        (``live``: the requests admitted and not finished, failed too if the step raises)."""
        llm = self.llm
        errors: list[tuple[RequestStream, Exception]] = []
        for s in admit:
            try:
                s.request_id = llm.add_request(s.prompt_token_ids, s.params)
                live[s.request_id] = s
            except Exception as exc:  # refused (e.g. never fits the KV pool): only this one
                errors.append((s, exc))
        for s in aborts:
            if s.request_id is not None:
                llm.abort_request(s.request_id)
                live.pop(s.request_id, None)
        start = time.perf_counter()
        outputs: list[Any] = []
        if llm.has_unfinished_requests():
            try:
                outputs = llm.step()
            except Exception as exc:  # a bug or a device error: fail what is live, keep serving
                for s in live.values():
                    errors.append((s, exc))
                    llm.abort_request(s.request_id)
                live.clear()
        for out in outputs:
            if out.finish_reason is not None:
                live.pop(out.index, None)
        sched = llm.engine.scheduler
        blocks = sched.block_manager
        used = blocks.num_used_blocks
        return _StepResult(
            outputs,
            errors,
            start,
            [r.request_id for r in sched.running],
            sched.num_running,
            used / max(used + blocks.num_free_blocks, 1),
            sched.num_preemptions,
        )

    # the loop's thread ---------------------------------------------------------------------
    def _scheduled(self, s: RequestStream, at: float) -> None:
        if s.scheduled_time is None:
            s.scheduled_time = at
            self.metrics.request_queue_time.observe(at - s.arrival_time)
            self._waiting.discard(s)

    def _dispatch_results(self) -> None:
        with self._lock:
            results, self._results = self._results, []
        for admit, r in results:
            self._dispatch(admit, r)

    def _dispatch(self, admit: list[RequestStream], r: _StepResult) -> None:
        """On the loop's thread: route the step's outputs to their streams, update metrics
        (a token's time is now, when its stream gets it, as vLLM's frontend stamps it)."""
        m = self.metrics
        now = time.perf_counter()
        failed = {id(s) for s, _ in r.errors}
        for s in admit:
            if s.request_id is not None and id(s) not in failed:
                m.prompt_tokens.inc(len(s.prompt_token_ids))
                if not s.aborted:  # (one that went away while being admitted is aborted already)
                    self._live[s.request_id] = s
        for s, exc in r.errors:
            if not s.finished:
                self._finish(s, None)
                s._put(exc)
        for rid in r.scheduled:
            if rid in self._live:
                self._scheduled(self._live[rid], r.start)
        tokens = 0
        ttft, itl = m.time_to_first_token.observe, m.inter_token_latency.observe
        for out in r.outputs:
            s = self._live.get(out.index)
            if s is None:
                continue  # aborted meanwhile
            if out.error is not None:
                self._finish(s, None)
                s._put(out.error)
                continue
            if s.scheduled_time is None:
                self._scheduled(s, r.start)
            s.num_output_tokens += 1
            tokens += 1
            if s.last_token_time is None:
                ttft(now - s.arrival_time)
            else:
                itl(now - s.last_token_time)
            s.last_token_time = now
            if out.finish_reason is not None:
                self._finish(s, out.finish_reason, now)
            s._put(out)
        if tokens:
            m.generation_tokens.inc(tokens)
        if r.preemptions > self._preemptions:
            m.num_preemptions.inc(r.preemptions - self._preemptions)
        self._preemptions = r.preemptions
        m.num_requests_running.set(r.running)
        m.num_requests_waiting.set(len(self._waiting))
        m.kv_cache_usage.set(r.kv_usage)
