"""The one step loop, for every KV cache mode: schedule -> feeds -> run -> sample -> update.

:class:`EngineCore` runs :class:`~trtcore.runtime.request.Request` s through an executor.
Each :meth:`EngineCore.step`:

1. the scheduling policy picks the step's sequences (:mod:`trtcore.runtime.scheduler`:
   continuous batching over the paged pool, or padded static batches over a contiguous
   cache);
2. the KV mode's runtime object (:mod:`trtcore.kv_modes`, runtime side) turns them into the
   network's inputs, its cache buffers included;
3. the executor runs the network once; the KV mode keeps the cache outputs;
4. the logits of the sequences that produce a token come to the host (one device->host
   copy, through the executor's ``to_host``) and are sampled; a row with a non-finite
   logit (NaN, or an overflow to inf) ends its request with ``finish_reason="error"``
   instead of a made-up token;
5. the scheduler appends the tokens to the request records (their one finish rule) and
   returns one :class:`~trtcore.runtime.request.RequestEvent` per request.

The two modes differ only in the scheduler and the KV mode object given to the loop
(:func:`make_engine` picks them from the build's KV cache mode and attention).

**Asynchronous scheduling** (the device executor, :func:`make_device_engine`; vLLM's
``async_scheduling``): while step n runs on the device, the loop schedules and enqueues step
n+1 (its decodes feed the tokens step n is sampling: the runner writes them on the device),
then waits for step n's tokens and applies them. The host's share of a step (scheduling,
staging, the scheduler's update, the caller's detokenization between two :meth:`EngineCore.step`
calls) then runs while the device computes, instead of between two steps. A request that
finishes on a token of step n has had step n+1 computed for nothing (dropped). The runner
says when it cannot run ahead (:meth:`DeviceRunner.can_run_ahead
<trtcore.runtime.device_runner.DeviceRunner.can_run_ahead>`: a request sampled on the host);
the loop then runs that step alone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from ..errors import InvalidArgumentError, InvalidRequestError
from ..kv_modes import ContiguousKV, ContiguousKVCache, KVMode, NativeKV, PagedKV, PagedKVCache
from .executor import Executor
from .kv_cache import BlockManager
from .request import Request, RequestEvent, RequestStatus
from .sampling import NON_FINITE_HINT, Sampler
from .scheduler import Scheduler, SchedulerError, SchedulerOutput, StaticBatchScheduler

__all__ = ["EngineCore", "HostRunner", "ModelRunner", "make_device_engine", "make_engine", "non_finite_message", "sample_rows"]


def non_finite_message(row: np.ndarray) -> str:
    """Why a logits row is refused: its count of NaN / inf values."""
    nan, inf = int(np.isnan(row).sum()), int(np.isinf(row).sum())
    return f"the model produced non-finite logits ({nan} NaN, {inf} inf of {row.shape[-1]}); {NON_FINITE_HINT}"


def sample_rows(
    logits: np.ndarray, ids: Sequence[Hashable], sampler: Sampler
) -> tuple[dict[Hashable, int], dict[Hashable, Any], dict[Hashable, str]]:
    """Sample one token per row of ``logits`` (float32 ``[len(ids), vocab]``, row ``i`` of
    request ``ids[i]``): ``(tokens, logprobs, errors)`` by request id; a row with a
    non-finite logit gets an error (:func:`non_finite_message`) instead of a token."""
    logits = np.asarray(logits, dtype=np.float32)
    sampled: dict[Hashable, int] = {}
    logprobs: dict[Hashable, Any] = {}
    errors: dict[Hashable, str] = {}
    finite = np.isfinite(logits).all(axis=1)
    for row in np.flatnonzero(~finite).tolist():
        errors[ids[row]] = non_finite_message(logits[row])
    good = [ids[row] for row in np.flatnonzero(finite).tolist()]
    if good:
        result = sampler.sample(logits[finite], good)
        for i, rid in enumerate(good):
            sampled[rid] = int(result.token_ids[i])
            logprobs[rid] = result.logprobs[i]
    return sampled, logprobs, errors


class ModelRunner(Protocol):
    """Runs one scheduled step and samples it: :class:`HostRunner` (an executor on host
    arrays) or :class:`trtcore.runtime.device_runner.DeviceRunner` (device buffers)."""

    def add_request(self, request: Request) -> None:
        """Register a request's sampling state (raises ``InvalidRequestError`` for parameters
        the runner's sampler cannot serve)."""

    def remove_request(self, request_id: Hashable) -> None:
        """Forget a finished request's sampling state."""

    def execute(self, batch: SchedulerOutput) -> Any:
        """Run the network on ``batch`` (the device runner only enqueues)."""

    def sample(self, batch: SchedulerOutput) -> tuple[dict[Hashable, int], dict[Hashable, Any], dict[Hashable, str]]:
        """``(tokens, logprobs, errors)`` of the sequences of ``batch`` that produce a token."""

    def can_run_ahead(self) -> bool:
        """Whether the next step may be executed before this one is sampled (asynchronous
        scheduling; a runner without it always answers False)."""


class HostRunner:
    """An :class:`Executor` on host arrays with the KV mode's runtime object: feeds from the
    cache object, outputs back to it, the sampled rows of the logits through ``to_host``,
    sampled by the host :class:`~trtcore.runtime.sampling.Sampler`."""

    def __init__(self, executor: Executor, kv_cache: Any) -> None:
        self.executor = executor
        self.kv_cache = kv_cache
        self.sampler = Sampler()
        self._logits: Any = None

    def add_request(self, request: Request) -> None:
        """Register the request with the host sampler (its generator, prompt, EOS ids)."""
        self.sampler.add_request(request.request_id, request.params, request.prompt_token_ids, request.eos_token_ids)

    def remove_request(self, request_id: Hashable) -> None:
        """Forget a finished request (no error if unknown)."""
        if request_id in self.sampler:
            self.sampler.remove_request(request_id)

    def can_run_ahead(self) -> bool:
        """Never: a step needs the tokens the host sampled after the step before."""
        return False

    def execute(self, batch: SchedulerOutput) -> Any:
        """Run the network once on ``batch``; keep the cache outputs and the logits."""
        outputs = self.executor.run(self.kv_cache.feeds(batch))
        self.kv_cache.update(outputs)
        self._logits = outputs["logits"]
        return self._logits

    def sample(self, batch: SchedulerOutput) -> tuple[dict[Hashable, int], dict[Hashable, Any], dict[Hashable, str]]:
        """Sample the rows of the last :meth:`execute` that produce a token (:func:`sample_rows`)."""
        ids = batch.sampling_request_ids
        if not ids:  # a prefill chunk that ends inside its prompt samples nothing
            return {}, {}, {}
        logits = np.asarray(self.executor.to_host(self._logits, "logits"), dtype=np.float32)[batch.sampling_indices()]
        return sample_rows(logits, ids, self.sampler)


class EngineCore:
    """The step loop over one executor, one scheduling policy and one KV mode object.

    Args:
        executor: runs the network on host arrays (None with a ``runner``).
        scheduler: :class:`Scheduler` (paged) or :class:`StaticBatchScheduler` (contiguous).
        kv_cache: the KV mode's runtime object (:class:`~trtcore.kv_modes.PagedKVCache` or
            :class:`~trtcore.kv_modes.ContiguousKVCache`): ``feeds(batch)`` and ``update(outputs)``.
        max_seq_len: most tokens (prompt + generated) per sequence.
        runner: what runs and samples a step (:class:`ModelRunner`); default a
            :class:`HostRunner` over ``executor`` and ``kv_cache``.
    """

    def __init__(
        self,
        executor: Executor | None,
        scheduler: Scheduler | StaticBatchScheduler,
        kv_cache: Any,
        max_seq_len: int,
        runner: ModelRunner | None = None,
    ):
        self.executor = executor
        self.scheduler = scheduler
        self.kv_cache = kv_cache
        self.max_seq_len = int(max_seq_len)
        if runner is None:
            if executor is None:
                raise InvalidArgumentError("EngineCore needs an executor or a runner")
            runner = HostRunner(executor, kv_cache)
        #: runs a step and samples it (:class:`HostRunner`, or the device executor)
        self.runner = runner
        #: steps enqueued and not yet sampled, oldest first (two with asynchronous scheduling)
        self._in_flight: deque[SchedulerOutput] = deque()

    def add_request(self, request: Request) -> Request:
        """Queue ``request``; it joins at the next :meth:`step` with room.

        Returns:
            The record, its ``max_seq_len`` capped at the engine's; status ``REJECTED``
            (with ``error``) for a request that can never run: its event comes with the
            next :meth:`step`.
        """
        if request.max_seq_len is None or request.max_seq_len > self.max_seq_len:
            request.max_seq_len = self.max_seq_len
        self.scheduler.add_request(request)
        if request.status is not RequestStatus.REJECTED:
            try:
                self.runner.add_request(request)
            except InvalidRequestError as exc:  # this request only: the others run on
                self.scheduler.finish(request.request_id, "rejected", str(exc))
        return request

    def abort(self, request_id: Hashable) -> bool:
        """Finish a live request now (``finish_reason="abort"``); False if none has that id."""
        return self.scheduler.finish(request_id, "abort")

    @property
    def async_scheduling(self) -> bool:
        """Whether steps are scheduled one ahead (the scheduler allows two pending steps).
        Settable between steps (e.g. to time the same engine both ways).

        Raises:
            SchedulerError: set while a step is in flight.
        """
        return self.scheduler.max_pending > 1

    @async_scheduling.setter
    def async_scheduling(self, on: bool) -> None:
        if self._in_flight:
            raise SchedulerError("async_scheduling changed while a step is in flight; step() until has_unfinished_requests() is False")
        self.scheduler.max_pending = 2 if on else 1

    def has_unfinished_requests(self) -> bool:
        """Whether some request still waits or runs, or a step is still in flight."""
        return bool(self._in_flight) or self.scheduler.has_unfinished_requests()

    def _enqueue(self) -> None:
        out = self.scheduler.schedule()
        if out.seqs:  # not out.is_empty
            self.runner.execute(out)
        self._in_flight.append(out)

    def step(self) -> list[RequestEvent]:
        """Run one step (see the module docstring) and return its events: enqueue a step if
        none is in flight, enqueue the next one behind it when running ahead (asynchronous
        scheduling), then wait for the oldest one's tokens and apply them."""
        in_flight = self._in_flight
        if not in_flight:
            self._enqueue()
        out = in_flight[0]
        if self.scheduler.max_pending > 1 and out.seqs:  # asynchronous scheduling, a step to run behind
            run_ahead = getattr(self.runner, "can_run_ahead", None)  # runners without it run one step at a time
            if run_ahead is not None and run_ahead():
                self._enqueue()
        if out.seqs:
            events = self.scheduler.update(*self.runner.sample(out))
        else:
            events = self.scheduler.update({}, {}, {})
        in_flight.popleft()
        if in_flight and not in_flight[0].seqs:  # scheduled behind it with nothing to run
            events += self.scheduler.update({})
            in_flight.popleft()
        for ev in events:
            if ev.finish_reason is not None:
                self.runner.remove_request(ev.request_id)
        return events

    def generate(self, requests: Sequence[Request]) -> Iterator[RequestEvent]:
        """Add ``requests`` and step until all are done, yielding the events as the steps
        produce them (a rejected request: one event with ``finish_reason="rejected"``).

        Raises:
            SchedulerError: requests added with :meth:`add_request` are still unfinished.
        """
        if self.has_unfinished_requests():
            raise SchedulerError("generate() while requests added with add_request() are unfinished; step() them first")
        for r in requests:
            self.add_request(r)
        while True:
            yield from self.step()  # the first step also reports rejections
            if not self.has_unfinished_requests():
                yield from self.step()  # finishes between steps (a caller's stop string, an abort)
                return


def make_engine(executor: Executor, mode: KVMode, num_blocks: int | None = None) -> EngineCore:
    """The step loop for a network built with ``mode``'s KV contract (:func:`trtcore.kv_modes.kv_mode`
    of the build plan): the mode picks the scheduler and the KV buffers; the plan gives the
    bounds (``max_batch_size``, ``max_seq_len``, ``block_size``, ``max_num_tokens``).

    Args:
        executor: runs the network built with that plan.
        mode: the plan's KV cache mode (paged, contiguous or native).
        num_blocks: blocks in the paged pool (paged only; required there).

    Raises:
        InvalidArgumentError: a paged mode without ``num_blocks``.
    """
    plan, xp = mode.plan, executor.xp
    if isinstance(mode, PagedKV):
        if num_blocks is None:
            raise InvalidArgumentError("the paged KV cache mode needs num_blocks")
        kv: Any = PagedKVCache(mode, num_blocks, xp)
        sched: Scheduler | StaticBatchScheduler = Scheduler(
            BlockManager(num_blocks, plan.block_size), max_num_batched_tokens=plan.max_num_tokens, max_num_seqs=plan.max_batch_size
        )
    else:
        assert isinstance(mode, (ContiguousKV, NativeKV))
        kv = ContiguousKVCache(mode, xp)
        sched = StaticBatchScheduler(plan.max_batch_size)
    return EngineCore(executor, sched, kv, plan.max_seq_len)


def make_device_engine(runner: Any, mode: PagedKV, async_scheduling: bool = True) -> EngineCore:
    """The step loop over the device executor ``runner``
    (:class:`~trtcore.runtime.device_runner.DeviceRunner`, paged KV cache): continuous batching
    over the blocks its pool holds (``runner.num_blocks``, the scratch block excluded), with
    asynchronous scheduling unless ``async_scheduling=False`` (module docstring). The token
    budget is the plan's ``max_num_tokens`` less the runner's ``token_headroom`` (the padding
    rows of a step that fills the budget)."""
    plan = mode.plan
    sched = Scheduler(
        BlockManager(runner.num_blocks, plan.block_size),
        max_num_batched_tokens=plan.max_num_tokens - int(getattr(runner, "token_headroom", 0)),
        max_num_seqs=plan.max_batch_size,
        async_scheduling=async_scheduling,
    )
    return EngineCore(None, sched, None, plan.max_seq_len, runner=runner)
