"""Scheduling policies of the step loop: continuous batching over the paged KV cache
(vLLM-style :class:`Scheduler`) and padded static batches over a contiguous KV cache
(:class:`StaticBatchScheduler`), both over the one request record
(:class:`~trtcore.runtime.request.Request`) and independent of any model.

Each step, :meth:`Scheduler.schedule` picks the sequences to run and, for each, the
tokens to feed, under two limits: at most ``max_num_batched_tokens`` tokens in the step
(the token budget) and at most ``max_num_seqs`` running sequences. The step loop
(:class:`trtcore.runtime.generate.EngineCore`) runs the network on the
:class:`SchedulerOutput`, samples one token per sequence that produces one, and passes
those to :meth:`Scheduler.update`, which appends them (the record's finish rule,
:meth:`Request.append_token`), finishes requests and frees their KV cache.

Bookkeeping follows vLLM v1's unified scheduler: a request has ``all_token_ids`` (prompt
followed by generated tokens) and ``num_computed_tokens`` (how many of them already have
keys/values in the pool, i.e. the step's ``num_cached_tokens``). A step feeds it the next
``num_new_tokens`` of ``all_token_ids`` at positions ``num_computed_tokens ..``; for a
decode that is the single last generated token, for a prefill a chunk of the prompt. A
sequence produces a token only in a step whose chunk reaches the end of
``all_token_ids``; a chunk that stops inside the prompt produces none.

Order within a step:

1. **Running requests first**, oldest admission first: each gets
   ``min(remaining tokens, budget left)`` (a decode: 1; a running chunked prefill: its
   next chunk). When the KV pool has no block for one of them, the **most recently
   admitted** running request that is not yet scheduled this step is **preempted**
   (vLLM's ``RECOMPUTE``): its blocks are freed, its generated tokens kept, and it goes
   back to the **front** of the waiting queue; it is later re-prefilled with prompt +
   generated tokens. If the request needing blocks is itself the most recent one, it is
   preempted. Requests already scheduled this step are never touched, so another
   sequence's blocks are never taken while in use.
2. **Then waiting requests**, first come first served, while budget, ``max_num_seqs`` and
   free blocks allow, and only if nothing was preempted this step (vLLM v1). With
   ``chunked_prefill`` a prompt larger than the budget left is prefilled in chunks over
   several steps; without it a prompt is admitted only when it fits whole.

Progress is guaranteed: a request is admitted only if it fits in the whole pool alone
(prompt + ``max_tokens - 1`` tokens of keys/values; the last sampled token is never fed),
otherwise it is **rejected** at :meth:`Scheduler.add_request` (status ``REJECTED``, with
the reason), without any effect on other requests. The oldest running request is then
always scheduled and never preempted unless alone, when the pool is all its own.

Streaming: every :class:`Request` records its generated tokens;
:meth:`Request.take_new_token_ids` returns those not yet taken, and :meth:`Scheduler.update`
returns a :class:`~trtcore.runtime.request.RequestEvent` per request that got a token or finished.

Asynchronous scheduling (``Scheduler(async_scheduling=True)``, vLLM's ``async_scheduling``):
step n+1 may be scheduled before step n's tokens are known, so that the host prepares it
while the device runs step n. A request then counts the tokens in flight
(:attr:`Request.num_output_placeholders`); a decode whose input is one of them feeds
:data:`PLACEHOLDER_TOKEN_ID`, which the executor replaces on the device with the token step n
sampled. A request whose last allowed token (``max_tokens``) is in flight is not scheduled
again; one that finishes on a token in flight (EOS, a stop id or string) has computed one
step for nothing, whose result is dropped (its KV writes go to blocks it held when the step
was enqueued; a later owner of those blocks writes them again, in stream order, before it
reads them). A preempted request with a token in flight is re-admitted once that token is
known. :meth:`Scheduler.update` takes the steps in the order they were scheduled.

Static batches (:class:`StaticBatchScheduler`, the contiguous KV cache): when no batch
runs, up to ``max_num_seqs`` waiting requests start together (their prompts prefilled
whole, right-padded by the KV mode); each later step decodes the batch's live requests;
finished requests leave the batch at once, and the next batch starts when all are done.

Sources: vLLM (``vllm/v1/core/sched/scheduler.py``: token budget, ``max_num_seqs``,
chunked prefill, recompute preemption of the last running request; ``query_start_loc``,
``seq_lens`` names), Orca's iteration-level scheduling.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping
from typing import NamedTuple

import numpy as np

from trtcore.errors import InvalidArgumentError, InvalidRequestError, TrtcoreError

from .kv_cache import BlockManager, check_int
from .request import Request, RequestEvent, RequestStatus
from .sampling import TokenLogprobs

__all__ = [
    "PLACEHOLDER_TOKEN_ID",
    "FinishPredicate",
    "RequestStatus",
    "ScheduledSequence",
    "Scheduler",
    "SchedulerError",
    "SchedulerOutput",
    "StaticBatchScheduler",
]


#: the id a scheduled step gives a token that is still in flight (asynchronous scheduling:
#: sampled by the step before, not yet on the host; the device executor feeds it on the device)
PLACEHOLDER_TOKEN_ID = -1


#: ``_new(NamedTupleClass, (field, ...))`` builds a NamedTuple without its Python-level
#: ``__new__`` (every field given, in order): the per-step records, at half the cost
_new = tuple.__new__


class SchedulerError(TrtcoreError, RuntimeError):
    """The scheduler was driven out of order (``update`` without ``schedule``, a second
    ``schedule`` before ``update``) or given outputs that do not match the step."""


#: ``finish_predicate(request, token_id) -> finish reason or None``, asked after each new
#: token the record's own finish rule did not end (e.g. a stop string found by the caller).
FinishPredicate = Callable[[Request, int], "str | None"]


class ScheduledSequence(NamedTuple):
    """One sequence in a step (immutable; a ``NamedTuple``, built per sequence and step).

    Attributes:
        request_id: its request.
        token_ids: tokens to feed this step: a prefill chunk, or the last generated token
            for a decode.
        positions: their positions, ``num_cached_tokens .. seq_len - 1``.
        num_cached_tokens: tokens already in the KV pool before this step (attention
            reads them through ``block_table``).
        block_table: its block ids, with slots for ``seq_len`` tokens allocated (paged;
            empty for a static batch).
        produces_token: whether the step samples a token for it (its chunk reaches the end
            of its tokens); a prefill chunk that ends inside the prompt produces none.
        is_prefill: False only for a decode: one token, the last generated one, with all
            earlier tokens cached.
    """

    request_id: Hashable
    token_ids: list[int]
    positions: list[int]
    num_cached_tokens: int
    block_table: list[int]
    produces_token: bool
    is_prefill: bool

    @property
    def num_new_tokens(self) -> int:
        """Tokens fed this step."""
        return len(self.token_ids)

    @property
    def seq_len(self) -> int:
        """Tokens attention sees after this step's writes: ``num_cached_tokens + num_new_tokens``."""
        return self.num_cached_tokens + len(self.token_ids)


class SchedulerOutput(NamedTuple):
    """One step's work. Sequences are in batch order: running requests (oldest admission
    first), then newly admitted ones. Array helpers give the packed (ragged) inputs of a
    paged network, all int32. Immutable (a ``NamedTuple``: one is made per step).

    Attributes:
        step: index of this step (0, 1, ...).
        seqs: the scheduled sequences.
        num_batched_tokens: total tokens fed (``<= max_num_batched_tokens``).
        preempted_request_ids: requests preempted while building this step.
        block_size: the pool's block size (0 for a static batch).
    """

    step: int
    seqs: list[ScheduledSequence]
    num_batched_tokens: int
    preempted_request_ids: list[Hashable]
    block_size: int

    @property
    def is_empty(self) -> bool:
        """Nothing to run this step."""
        return not self.seqs

    @property
    def request_ids(self) -> list[Hashable]:
        """Request ids in batch order."""
        return [s.request_id for s in self.seqs]

    @property
    def sampling_request_ids(self) -> list[Hashable]:
        """Request ids that produce a token this step, in batch order."""
        return [s.request_id for s in self.seqs if s.produces_token]

    def sampling_indices(self) -> np.ndarray:
        """int32 ``[num_sampling]``: batch indices of the sequences that produce a token."""
        return np.array([i for i, s in enumerate(self.seqs) if s.produces_token], dtype=np.int32)

    def input_ids(self) -> np.ndarray:
        """int32 ``[num_batched_tokens]``: all fed tokens, sequence after sequence."""
        return np.array([t for s in self.seqs for t in s.token_ids], dtype=np.int32)

    def positions(self) -> np.ndarray:
        """int32 ``[num_batched_tokens]``: position of each fed token."""
        return np.array([p for s in self.seqs for p in s.positions], dtype=np.int32)

    def seq_lens(self) -> np.ndarray:
        """int32 ``[num_seqs]``: tokens each sequence attends to (cached + new)."""
        return np.array([s.seq_len for s in self.seqs], dtype=np.int32)

    def num_cached_tokens(self) -> np.ndarray:
        """int32 ``[num_seqs]``: tokens already cached per sequence (vLLM's ``num_computed_tokens``)."""
        return np.array([s.num_cached_tokens for s in self.seqs], dtype=np.int32)

    def query_start_loc(self) -> np.ndarray:
        """int32 ``[num_seqs + 1]``: offsets of each sequence's tokens in the packed batch
        (``cu_seqlens_q``; the last entry is ``num_batched_tokens``)."""
        out = np.zeros(len(self.seqs) + 1, dtype=np.int32)
        np.cumsum([s.num_new_tokens for s in self.seqs], out=out[1:])
        return out

    def last_token_indices(self) -> np.ndarray:
        """int32 ``[num_seqs]``: packed index of each sequence's last fed token (where the
        network computes logits)."""
        return self.query_start_loc()[1:] - 1

    def block_tables(self, max_blocks: int | None = None, pad_value: int = 0) -> np.ndarray:
        """int32 ``[num_seqs, max_blocks]``: block tables padded with ``pad_value`` (0 is a
        valid block, so a stray read stays in the pool; kernels stop at ``seq_lens``).

        Raises:
            InvalidArgumentError: a table is longer than ``max_blocks``.
        """
        longest = max((len(s.block_table) for s in self.seqs), default=0)
        width = max(longest, 1) if max_blocks is None else int(max_blocks)
        if longest > width:
            raise InvalidArgumentError(f"a block table has {longest} blocks, more than max_blocks={width}")
        out = np.full((len(self.seqs), width), pad_value, dtype=np.int32)
        for i, s in enumerate(self.seqs):
            out[i, : len(s.block_table)] = s.block_table
        return out


def _check_token(step: int, request_id: Hashable, token: object) -> int:
    """``token`` as an int (a NumPy integer converted).

    Raises:
        SchedulerError: it is not an integer ``>= 0`` (a bool is not one).
    """
    if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or token < 0:
        raise SchedulerError(f"step {step}: token {token!r} for request {request_id!r} is not an integer >= 0")
    return int(token)


class _BaseScheduler:
    """What both policies share: the queues, admission, finishing, and :meth:`update`.

    Subclasses implement :meth:`schedule` and may add rejection reasons and KV cache release.
    Every :meth:`schedule` must be followed by one :meth:`update` (even for an empty step).
    """

    #: steps :meth:`schedule` may have pending before an :meth:`update` (2: one step in
    #: flight while the next is scheduled, asynchronous scheduling)
    max_pending = 1

    def __init__(self, max_num_seqs: int, finish_predicate: FinishPredicate | None = None):
        self.max_num_seqs = check_int("max_num_seqs", max_num_seqs, 1)
        self.finish_predicate = finish_predicate
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._live: dict[Hashable, Request] = {}
        self._pending: deque[SchedulerOutput] = deque()
        self._events: list[RequestEvent] = []
        self.num_steps = 0
        self.num_preemptions = 0

    # ---- requests -------------------------------------------------------------------

    def add_request(self, request: Request) -> Request:
        """Queue ``request`` (it may join while others decode).

        A request that can never run is not queued: it is returned with status
        ``REJECTED``, ``finish_reason="rejected"`` and :attr:`Request.error` saying why
        (e.g. its KV need, prompt + ``max_tokens - 1`` tokens, exceeds the whole pool);
        other requests are unaffected, and the next :meth:`update` reports it too.

        Returns:
            ``request`` (keep it to stream tokens).

        Raises:
            InvalidRequestError: ``request`` is not a :class:`Request`, or a live request
                has its id.
        """
        if not isinstance(request, Request):
            raise InvalidRequestError(f"add_request() takes a Request, got {type(request).__name__}")
        rid = request.request_id
        if rid in self._live:
            raise InvalidRequestError(f"request {rid!r} is already queued or running")
        error = self._rejection_reason(request)
        if error is not None:
            request.finish("rejected", error, RequestStatus.REJECTED)
            self._events.append(RequestEvent(rid, finish_reason="rejected", error=error))
            return request
        self._live[rid] = request
        self.waiting.append(request)
        return request

    def finish(self, request_id: Hashable, reason: str = "abort", error: str | None = None) -> bool:
        """Finish a live request now (client abort, stop string found by the caller, ...):
        it leaves the queues and its KV cache is freed. Allowed between :meth:`schedule`
        and :meth:`update`; a token for it in that update is then ignored.

        Returns:
            True if a live request was finished; False if none has that id (already
            finished, rejected, or unknown).
        """
        req = self._live.get(request_id)
        if req is None:
            return False
        self._leave_queue(req)
        self._finish(req, reason, error)
        self._events.append(RequestEvent(request_id, finish_reason=reason, error=error))
        return True

    def get_request(self, request_id: Hashable) -> Request | None:
        """The live (waiting, preempted or running) request with that id, or None."""
        return self._live.get(request_id)

    def has_unfinished_requests(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self._live)

    @property
    def num_waiting(self) -> int:
        """Requests in the waiting queue (including preempted ones)."""
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        """Admitted requests (they own KV cache)."""
        return len(self.running)

    # ---- steps ----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Choose this step's sequences (see the module doc).

        Raises:
            SchedulerError: the previous step was not passed to :meth:`update`.
        """
        if len(self._pending) >= self.max_pending:
            raise SchedulerError(f"schedule() called again before update() for step {self._pending[0].step}")
        scheduled, preempted = self._schedule()
        seqs = []
        block_table = self._block_table  # request id -> its block ids (a copy)
        num_tokens = 0
        for req, n in scheduled:
            num_tokens += n
            start = req.num_computed_tokens
            end = start + n
            outputs = req.output_token_ids
            known = len(req.prompt_token_ids) + len(outputs)
            in_flight = req.num_output_placeholders
            if n == 1 and end == known + in_flight and (outputs or in_flight):  # a decode: its last token
                tokens = [outputs[-1]] if end == known else [PLACEHOLDER_TOKEN_ID]
                seqs.append(_new(ScheduledSequence, (req.request_id, tokens, [start], start, block_table(req.request_id), True, False)))
                req.num_computed_tokens = end
                req.num_output_placeholders = in_flight + 1
                continue
            tokens = req.tokens(start, min(end, known))
            if end > known:  # tokens still in flight: the device feeds them (asynchronous scheduling)
                tokens += [PLACEHOLDER_TOKEN_ID] * (end - known)
            produces = end == known + in_flight
            seqs.append(
                ScheduledSequence(
                    request_id=req.request_id,
                    token_ids=tokens,
                    positions=list(range(start, end)),
                    num_cached_tokens=start,
                    block_table=block_table(req.request_id),
                    produces_token=produces,
                    is_prefill=True,  # n > 1, or a chunk that produces nothing, or the first token
                )
            )
            req.num_computed_tokens = end
            if produces:
                req.num_output_placeholders += 1
        out = _new(SchedulerOutput, (self.num_steps, seqs, num_tokens, preempted, self._block_size))
        self.num_steps += 1
        self._pending.append(out)
        return out

    def update(
        self,
        sampled: Mapping[Hashable, int],
        logprobs: Mapping[Hashable, TokenLogprobs | None] | None = None,
        errors: Mapping[Hashable, str] | None = None,
    ) -> list[RequestEvent]:
        """Apply the step's sampled tokens: append them (:meth:`Request.append_token`, the
        finish rule; then the finish predicate), finish requests and free their KV cache.

        Args:
            sampled: ``request_id -> token id`` for every sequence of the last
                :meth:`schedule` that produces a token (requests finished meanwhile by
                :meth:`finish`, or listed in ``errors``, may be left out).
            logprobs: ``request_id -> TokenLogprobs`` of the sampled tokens, when asked for.
            errors: ``request_id -> message`` for producing sequences whose step failed
                (e.g. non-finite logits): they finish with ``finish_reason="error"``.

        Returns:
            One :class:`RequestEvent` per request that got a token or finished this step,
            plus those finished or rejected outside a step since the last update.

        Raises:
            SchedulerError: no step is pending; a producing sequence has no token; a token
                is given for a request that produces none this step; a token is not an
                integer ``>= 0``. Nothing changes then, and the step stays pending.
        """
        if not self._pending:
            raise SchedulerError("update() called without a pending schedule()")
        out = self._pending[0]  # the oldest pending step
        errors = errors or {}
        logprobs = logprobs or {}
        seqs = out.seqs
        # the common case: an int token >= 0 for every sequence, checked in one pass
        exact = not errors and len(sampled) == len(seqs)
        if exact:
            for s in seqs:
                t = sampled.get(s.request_id) if s.produces_token else None
                if type(t) is not int or t < 0:
                    exact = False
                    break
        tokens: Mapping[Hashable, int] = sampled
        if not exact:
            self._check_sampled(out, sampled, errors)
            for t in sampled.values():
                if type(t) is not int or t < 0:  # else check and convert
                    tokens = {r: _check_token(out.step, r, t) for r, t in sampled.items()}
                    break
        self._pending.popleft()

        events, self._events = self._events, []
        now = time.perf_counter()
        live = self._live
        for s in seqs:
            if not s.produces_token:
                continue
            req = live.get(s.request_id)
            if req is None:
                continue  # finished by finish() after schedule()
            # running, or preempted by a later schedule() while this step was in flight: the
            # token was sampled all the same
            req.num_output_placeholders -= 1
            rid = req.request_id
            if rid in errors:
                self._leave_queue(req)
                self._finish(req, "error", errors[rid])
                events.append(RequestEvent(rid, finish_reason="error", error=errors[rid]))
                continue
            tok, lp = tokens[rid], logprobs.get(rid)
            reason = req.append_token(tok, lp, now)
            if reason is None and self.finish_predicate is not None:
                reason = self.finish_predicate(req, tok)
            if reason is not None:
                self._leave_queue(req)
                self._finish(req, reason)
            events.append(_new(RequestEvent, (rid, tok, lp, reason, req.stop_reason if reason else None, None)))
        return events

    def _check_sampled(self, out: SchedulerOutput, sampled: Mapping[Hashable, int], errors: Mapping[Hashable, str]) -> None:
        """:meth:`update`'s check that ``sampled`` and ``errors`` name exactly the producing
        sequences of ``out`` (those finished since may be left out); raises SchedulerError."""
        producing = {s.request_id for s in out.seqs if s.produces_token}
        if not (producing.issuperset(sampled) and producing.issuperset(errors)):
            extra = [r for r in [*sampled, *errors] if r not in producing]
            raise SchedulerError(f"step {out.step}: tokens given for requests that produce none this step: {extra!r}")
        if (len(sampled) if not errors else len(sampled.keys() | errors.keys())) < len(producing):
            missing = [r for r in producing if r not in sampled and r not in errors and r in self._live]
            if missing:
                raise SchedulerError(f"step {out.step}: no sampled token for requests {missing!r}")

    @property
    def num_pending(self) -> int:
        """Steps scheduled and not yet updated (1 while a step runs; 2 when the next one was
        scheduled before it ended)."""
        return len(self._pending)

    def _leave_queue(self, req: Request) -> None:
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)

    # ---- policy hooks -----------------------------------------------------------------

    _block_size = 0

    def _schedule(self) -> tuple[list[tuple[Request, int]], list[Hashable]]:
        """``([(request, tokens to feed)], preempted ids)`` of this step, in batch order."""
        raise NotImplementedError

    def _block_table(self, request_id: Hashable) -> list[int]:
        return []

    def _rejection_reason(self, req: Request) -> str | None:
        if req.max_seq_len is not None and req.num_prompt_tokens >= req.max_seq_len:
            return (
                f"request {req.request_id!r}: the prompt has {req.num_prompt_tokens} tokens; at most "
                f"{req.max_seq_len - 1} fit (max_seq_len={req.max_seq_len})"
            )
        return None

    def _release(self, req: Request) -> None:
        """Free what ``req`` holds in the KV cache."""

    def _finish(self, req: Request, reason: str, error: str | None = None) -> None:
        self._release(req)
        req.finish(reason, error)
        del self._live[req.request_id]


def _capped(req: Request) -> str:
    """``", max_tokens=N being capped by max_seq_len=M"`` where ``max_seq_len`` capped the
    caller's ``max_tokens`` (:attr:`Request.max_tokens`), else ``""``: a message shows the
    value the caller gave and the limit that applies, not only the capped value."""
    asked = req.params.max_tokens
    return "" if asked == req.max_tokens else f", max_tokens={asked} being capped by max_seq_len={req.max_seq_len}"


class StaticBatchScheduler(_BaseScheduler):
    """Padded static batches (the contiguous KV cache): see the module doc.

    Usage::

        sched = StaticBatchScheduler(max_num_seqs=8)
        sched.add_request(Request("a", prompt_ids, SamplingParams(max_tokens=16), max_seq_len=2048))
        out = sched.schedule()          # the batch's prompts, then one token per live request
        events = sched.update({"a": token})

    Args:
        max_num_seqs: most requests in one batch (the profile's max batch), ``>= 1``.
        finish_predicate: see :class:`Scheduler`.

    Raises:
        InvalidArgumentError: ``max_num_seqs`` is not a positive integer.
    """

    def _schedule(self) -> tuple[list[tuple[Request, int]], list[Hashable]]:
        if not self.running:  # the batch is done: start the next one
            while self.waiting and len(self.running) < self.max_num_seqs:
                req = self.waiting.popleft()
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = 0
                self.running.append(req)
        return [(r, r.num_tokens - r.num_computed_tokens) for r in self.running], []


class Scheduler(_BaseScheduler):
    """Continuous batching (iteration-level scheduling) over a :class:`BlockManager`.

    Usage::

        sched = Scheduler(BlockManager(num_blocks, block_size), max_num_batched_tokens=512, max_num_seqs=64)
        sched.add_request(Request("a", prompt_ids, SamplingParams(max_tokens=128), eos_token_ids={2}))
        while sched.has_unfinished_requests():
            out = sched.schedule()
            events = sched.update(run_and_sample(out))   # {request_id: token}
            ...                                           # ev.new_token_ids, ev.finished

    Args:
        block_manager: the KV pool's block manager; the scheduler owns its sequences (the
            sequence id of a request is its ``request_id``).
        max_num_batched_tokens: token budget per step, ``>= 1``.
        max_num_seqs: most running (admitted) requests, ``>= 1``.
        chunked_prefill: split prompts over steps when the budget left is smaller; if
            False a prompt (or a recompute) is prefilled whole, so requests whose
            prompt + ``max_tokens - 1`` exceeds the budget are rejected.
        max_model_len: if given, requests with prompt + ``max_tokens`` above it are rejected
            (the engine's longest sequence).
        finish_predicate: ``(request, token_id) -> reason | None``, asked after every new
            token the record's finish rule did not end; a reason finishes the request.
        async_scheduling: allow the next :meth:`schedule` before the last step's
            :meth:`update` (module doc, "Asynchronous scheduling").

    Raises:
        InvalidArgumentError: a limit is not a positive integer.
    """

    def __init__(
        self,
        block_manager: BlockManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        chunked_prefill: bool = True,
        max_model_len: int | None = None,
        finish_predicate: FinishPredicate | None = None,
        async_scheduling: bool = False,
    ):
        super().__init__(max_num_seqs, finish_predicate)
        self.max_pending = 2 if async_scheduling else 1
        self.block_manager = block_manager
        self.max_num_batched_tokens = check_int("max_num_batched_tokens", max_num_batched_tokens, 1)
        self.chunked_prefill = bool(chunked_prefill)
        self.max_model_len = None if max_model_len is None else check_int("max_model_len", max_model_len, 1)
        self._block_size = block_manager.block_size

    def _schedule(self) -> tuple[list[tuple[Request, int]], list[Hashable]]:
        """Reserve the step's KV slots: running requests first, then waiting ones (module doc)."""
        bm = self.block_manager
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted: list[Hashable] = []

        # 1. running requests, oldest admission first
        i = 0
        running = self.running
        while i < len(running) and budget > 0:
            req = running[i]
            i += 1
            in_flight, num_out = req.num_output_placeholders, len(req.output_token_ids)
            if in_flight and num_out + in_flight >= req.max_tokens:
                continue  # its last token is in flight: nothing more to run
            remaining = len(req.prompt_token_ids) + num_out + in_flight - req.num_computed_tokens
            n = remaining if remaining <= budget else budget
            if n < remaining and not self.chunked_prefill:  # cannot happen: unchunked prefills finish at admission
                break
            if not bm.try_append(req.request_id, n):
                while True:
                    victim = running.pop()
                    self._preempt(victim)
                    preempted.append(victim.request_id)
                    if victim is req or bm.try_append(req.request_id, n):
                        break
                if req.status is not RequestStatus.RUNNING:  # preempted itself: nothing else can run
                    break
            scheduled.append((req, n))
            budget -= n

        # 2. waiting requests, first come first served
        while self.waiting and budget > 0 and not preempted and len(running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.num_output_placeholders:  # preempted with a token in flight: wait for it
                break
            remaining = req.num_tokens  # nothing cached after waiting
            n = min(remaining, budget) if self.chunked_prefill else remaining
            if n > budget or not bm.can_allocate(n):
                break
            self.waiting.popleft()
            bm.allocate(req.request_id, n)
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = 0
            self.running.append(req)
            scheduled.append((req, n))
            budget -= n
        return scheduled, preempted

    def _block_table(self, request_id: Hashable) -> list[int]:
        return self.block_manager.block_table(request_id)

    def check_invariants(self) -> None:
        """Cross-check the queues against the block manager (tests, debugging).

        Raises:
            AssertionError: a running request has no blocks or the wrong number of reserved
                slots, a waiting request owns blocks, or the block manager is inconsistent.
        """
        bm = self.block_manager
        bm.check_invariants()
        if set(bm.seq_ids) != {r.request_id for r in self.running}:
            raise AssertionError(f"block manager sequences {bm.seq_ids!r} != running {[r.request_id for r in self.running]!r}")
        for r in self.running:
            if r.status is not RequestStatus.RUNNING or bm.num_tokens(r.request_id) != r.num_computed_tokens:
                raise AssertionError(
                    f"running request {r.request_id!r}: status {r.status}, {bm.num_tokens(r.request_id)} slots, "
                    f"{r.num_computed_tokens} computed tokens"
                )
        for r in self.waiting:
            if r.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED) or r.num_computed_tokens:
                raise AssertionError(f"waiting request {r.request_id!r}: status {r.status}, {r.num_computed_tokens} computed")
        if len(self.running) + len(self.waiting) != len(self._live):
            raise AssertionError("live requests are not exactly the waiting + running ones")

    def _rejection_reason(self, req: Request) -> str | None:
        bm = self.block_manager
        need_tokens = req.max_kv_tokens
        need_blocks = bm.blocks_needed(need_tokens)
        if need_blocks > bm.num_blocks:
            return (
                f"request {req.request_id!r} needs up to {need_tokens} KV tokens ({req.num_prompt_tokens}-token prompt + "
                f"max_tokens {req.max_tokens} - 1{_capped(req)}) = {need_blocks} blocks of {bm.block_size}, but the whole KV pool "
                f"has {bm.num_blocks} blocks ({bm.num_slots} tokens); lower max_tokens or give the pool more "
                f"memory (kv_cache_memory / gpu_memory_utilization)"
            )
        if not self.chunked_prefill and need_tokens > self.max_num_batched_tokens:
            return (
                f"request {req.request_id!r} may need a prefill of {need_tokens} tokens ({req.num_prompt_tokens}-token prompt + "
                f"max_tokens {req.max_tokens} - 1{_capped(req)}, after a preemption), more than max_num_batched_tokens="
                f"{self.max_num_batched_tokens} without chunked prefill"
            )
        if self.max_model_len is not None and req.num_prompt_tokens + req.max_tokens > self.max_model_len:
            return f"request {req.request_id!r}: prompt {req.num_prompt_tokens} + max_tokens {req.max_tokens} exceeds max_model_len {self.max_model_len}{_capped(req)}"
        return super()._rejection_reason(req)

    def _preempt(self, req: Request) -> None:
        self.block_manager.free(req.request_id)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _release(self, req: Request) -> None:
        if req.request_id in self.block_manager:
            self.block_manager.free(req.request_id)
