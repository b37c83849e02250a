"""Continuous batching over a paged KV cache (vLLM-style scheduler), independent of any model.

Each step, :meth:`Scheduler.schedule` picks the sequences to run and, for each, the
tokens to feed, under two limits: at most ``max_num_batched_tokens`` tokens in the step
(the token budget) and at most ``max_num_seqs`` running sequences. A model runner
(any callable) takes the :class:`SchedulerOutput`, runs the paged network on the packed
tokens, and returns one sampled token per sequence that produces one; the caller passes
those to :meth:`Scheduler.update`, which appends them, finishes requests and frees their
blocks. :meth:`Scheduler.step` does the three calls at once.

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

Streaming: every :class:`RequestState` records its generated tokens;
:meth:`RequestState.take_new_token_ids` returns those not yet taken, and :meth:`Scheduler.update`
returns a :class:`RequestOutput` per request that got a token or finished.

Sources: vLLM (``vllm/v1/core/sched/scheduler.py``: token budget, ``max_num_seqs``,
chunked prefill, recompute preemption of the last running request; ``query_start_loc``,
``slot_mapping``, ``seq_lens`` names), Orca's iteration-level scheduling.
"""

from __future__ import annotations

import enum
import numbers
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trtcore.errors import InvalidArgumentError, InvalidRequestError, TrtcoreError

from .kv_cache import BlockManager, check_int

__all__ = [
    "FinishPredicate",
    "ModelRunner",
    "RequestOutput",
    "RequestState",
    "RequestStatus",
    "ScheduledSequence",
    "Scheduler",
    "SchedulerError",
    "SchedulerOutput",
]


class SchedulerError(TrtcoreError, RuntimeError):
    """The scheduler was driven out of order (``update`` without ``schedule``, a second
    ``schedule`` before ``update``) or given outputs that do not match the step."""


class RequestStatus(enum.Enum):
    """Life cycle of a request.

    ``WAITING`` (queued, no blocks) -> ``RUNNING`` (admitted, owns blocks) ->
    ``FINISHED``; ``RUNNING`` -> ``PREEMPTED`` (back in the waiting queue, blocks freed,
    generated tokens kept) -> ``RUNNING``; ``REJECTED``: could never run (set at
    :meth:`Scheduler.add_request`, see ``RequestState.error``).
    """

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    REJECTED = "rejected"


#: ``finish_predicate(state, token_id) -> finish reason or None``, called after each new token.
FinishPredicate = Callable[["RequestState", int], "str | None"]
#: ``model_runner(scheduler_output) -> next token ids``: a mapping ``request_id -> token``
#: or a sequence aligned with :attr:`SchedulerOutput.sampling_request_ids`.
ModelRunner = Callable[["SchedulerOutput"], "Mapping[Hashable, int] | Sequence[int] | np.ndarray"]


@dataclass(eq=False)
class RequestState:
    """One request as the scheduler tracks it; also the per-request streaming record.

    Attributes:
        request_id: caller's id (any hashable), unique among live requests.
        prompt_token_ids: the prompt.
        max_tokens: most tokens to generate (``>= 1``); reaching it finishes with ``"length"``.
        eos_token_ids: tokens that finish the request with ``"stop"`` (the token is kept).
        output_token_ids: tokens generated so far (kept across preemptions).
        status: see :class:`RequestStatus`.
        finish_reason: once finished: ``"stop"``, ``"length"``, ``"abort"``, the finish
            predicate's or :meth:`Scheduler.finish`'s reason, or ``"rejected"``.
        error: why a ``REJECTED`` request can never run; None otherwise.
        num_computed_tokens: tokens of :attr:`all_token_ids` whose keys/values are in the
            pool (0 while waiting).
        num_preemptions: times this request was preempted.
        arrival_time / first_token_time / finished_time: ``time.monotonic()`` seconds
            (for TTFT / latency metrics); None until it happens.
    """

    request_id: Hashable
    prompt_token_ids: list[int]
    max_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    error: str | None = None
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finished_time: float | None = None
    _num_taken: int = field(default=0, repr=False)

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt length."""
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt + generated tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt followed by the generated tokens (a new list)."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        """True once ``FINISHED`` or ``REJECTED``."""
        return self.status in (RequestStatus.FINISHED, RequestStatus.REJECTED)

    @property
    def max_kv_tokens(self) -> int:
        """Most tokens this request ever holds in the KV pool: prompt + ``max_tokens - 1``."""
        return len(self.prompt_token_ids) + self.max_tokens - 1

    def take_new_token_ids(self) -> list[int]:
        """Generated tokens not returned by an earlier call (streaming: call after each step)."""
        new = self.output_token_ids[self._num_taken :]
        self._num_taken = len(self.output_token_ids)
        return new

    def _tokens(self, start: int, stop: int) -> list[int]:
        p = len(self.prompt_token_ids)
        if stop <= p:
            return self.prompt_token_ids[start:stop]
        if start >= p:
            return self.output_token_ids[start - p : stop - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[: stop - p]


@dataclass(frozen=True)
class RequestOutput:
    """What changed for one request in a step (or since the last :meth:`Scheduler.update`).

    Attributes:
        request_id: the request.
        new_token_ids: the token generated in this step (empty for a finish or rejection
            outside a step). Independent of :meth:`RequestState.take_new_token_ids`,
            so push (these outputs) and pull (the state) consumers do not interfere.
        finished: whether the request is done (finished, aborted or rejected).
        finish_reason: see :attr:`RequestState.finish_reason`.
        error: for a rejected request, why.
    """

    request_id: Hashable
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class ScheduledSequence:
    """One sequence in a step.

    Attributes:
        request_id: its request.
        token_ids: tokens to feed this step: a prefill chunk, or the last generated token
            for a decode.
        positions: their positions, ``num_cached_tokens .. seq_len - 1``.
        num_cached_tokens: tokens already in the KV pool before this step (attention
            reads them through ``block_table``).
        block_table: its block ids, with slots for ``seq_len`` tokens allocated.
        slot_mapping: pool slot of each fed token (``block_id * block_size + offset``),
            where the step writes its keys/values.
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
    slot_mapping: list[int]
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


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's work. Sequences are in batch order: running requests (oldest admission
    first), then newly admitted ones. Array helpers give the packed (ragged) inputs of a
    paged network, all int32.

    Attributes:
        step: index of this step (0, 1, ...).
        seqs: the scheduled sequences.
        num_batched_tokens: total tokens fed (``<= max_num_batched_tokens``).
        preempted_request_ids: requests preempted while building this step.
        block_size: the pool's block size.
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

    def slot_mapping(self) -> np.ndarray:
        """int32 ``[num_batched_tokens]``: pool slot of each fed token."""
        return np.array([x for s in self.seqs for x in s.slot_mapping], dtype=np.int32)

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


class Scheduler:
    """Continuous batching (iteration-level scheduling) over a :class:`BlockManager`.

    Usage::

        sched = Scheduler(BlockManager(num_blocks, block_size), max_num_batched_tokens=512, max_num_seqs=64)
        sched.add_request("a", prompt_ids, max_tokens=128, eos_token_ids={2})
        while sched.has_unfinished_requests():
            for out in sched.step(model_runner):   # schedule -> model_runner -> update
                ...                                # out.new_token_ids, out.finished

    Every :meth:`schedule` must be followed by one :meth:`update` (even for an empty step).

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
        finish_predicate: ``(state, token_id) -> reason | None``, asked after every new
            token (after the EOS check, before the ``max_tokens`` check); a reason
            finishes the request.

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
    ):
        self.block_manager = block_manager
        self.max_num_batched_tokens = check_int("max_num_batched_tokens", max_num_batched_tokens, 1)
        self.max_num_seqs = check_int("max_num_seqs", max_num_seqs, 1)
        self.chunked_prefill = bool(chunked_prefill)
        self.max_model_len = None if max_model_len is None else check_int("max_model_len", max_model_len, 1)
        self.finish_predicate = finish_predicate
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self._live: dict[Hashable, RequestState] = {}
        self._pending: SchedulerOutput | None = None
        self._events: list[RequestOutput] = []
        self.num_steps = 0
        self.num_preemptions = 0

    # ---- requests -------------------------------------------------------------------

    def add_request(
        self,
        request_id: Hashable,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Iterable[int] = (),
        arrival_time: float | None = None,
    ) -> RequestState:
        """Queue a request (it may join while others decode).

        A request that can never run is not queued: it is returned with status
        ``REJECTED``, ``finish_reason="rejected"`` and :attr:`RequestState.error` saying
        why (its KV need, prompt + ``max_tokens - 1`` tokens, exceeds the whole pool; or
        the unchunked token budget; or ``max_model_len``); other requests are unaffected,
        and the next :meth:`update` reports it too.

        Args:
            request_id: unique among live requests (hashable).
            prompt_token_ids: at least one token id ``>= 0``.
            max_tokens: tokens to generate at most, ``>= 1``.
            eos_token_ids: tokens that finish it with ``"stop"``.
            arrival_time: ``time.monotonic()`` seconds; now if None.

        Returns:
            Its :class:`RequestState` (keep it to stream tokens).

        Raises:
            InvalidRequestError: duplicate live id, empty prompt, a negative or non-integer
                token, ``max_tokens < 1``.
        """
        try:
            hash(request_id)
        except TypeError:
            raise InvalidRequestError(f"request_id {request_id!r} is not hashable") from None
        if request_id in self._live:
            raise InvalidRequestError(f"request {request_id!r} is already queued or running")
        prompt = [int(t) for t in prompt_token_ids] if _all_ints(prompt_token_ids) else None
        if prompt is None or any(t < 0 for t in prompt):
            raise InvalidRequestError(f"request {request_id!r}: prompt token ids must be integers >= 0")
        if not prompt:
            raise InvalidRequestError(f"request {request_id!r}: the prompt is empty")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, numbers.Integral) or max_tokens < 1:
            raise InvalidRequestError(f"request {request_id!r}: max_tokens must be an integer >= 1, got {max_tokens!r}")
        state = RequestState(
            request_id=request_id,
            prompt_token_ids=prompt,
            max_tokens=int(max_tokens),
            eos_token_ids=frozenset(int(t) for t in eos_token_ids),
            arrival_time=time.monotonic() if arrival_time is None else float(arrival_time),
        )
        error = self._rejection_reason(state)
        if error is not None:
            state.status = RequestStatus.REJECTED
            state.finish_reason = "rejected"
            state.error = error
            state.finished_time = time.monotonic()
            self._events.append(RequestOutput(request_id, [], True, "rejected", error))
            return state
        self._live[request_id] = state
        self.waiting.append(state)
        return state

    def finish(self, request_id: Hashable, reason: str = "abort") -> bool:
        """Finish a live request now (client abort, stop string found by the caller, ...):
        it leaves the queues and its blocks are freed. Allowed between :meth:`schedule`
        and :meth:`update`; a token for it in that update is then ignored.

        Returns:
            True if a live request was finished; False if none has that id (already
            finished, rejected, or unknown).
        """
        state = self._live.get(request_id)
        if state is None:
            return False
        if state.status is RequestStatus.RUNNING:
            self.running.remove(state)
        else:
            self.waiting.remove(state)
        self._finish(state, reason)
        self._events.append(RequestOutput(request_id, [], True, reason))
        return True

    def get_request(self, request_id: Hashable) -> RequestState | None:
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
        """Admitted requests (they own blocks)."""
        return len(self.running)

    # ---- steps ----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Choose this step's sequences and reserve their KV slots (see the module doc).

        Returns:
            The step's :class:`SchedulerOutput`; each sequence's ``num_computed_tokens``
            already counts the tokens fed this step.

        Raises:
            SchedulerError: the previous step was not passed to :meth:`update`.
        """
        if self._pending is not None:
            raise SchedulerError(f"schedule() called again before update() for step {self._pending.step}")
        bm = self.block_manager
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[RequestState, int]] = []
        preempted: list[Hashable] = []

        # 1. running requests, oldest admission first
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            remaining = req.num_tokens - req.num_computed_tokens
            n = min(remaining, budget)
            if n < remaining and not self.chunked_prefill:  # cannot happen: unchunked prefills finish at admission
                break
            while not bm.can_append(req.request_id, n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            if req.status is not RequestStatus.RUNNING:  # preempted itself: nothing else can run
                break
            bm.append(req.request_id, n)
            scheduled.append((req, n))
            budget -= n
            i += 1

        # 2. waiting requests, first come first served
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
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

        seqs = []
        for req, n in scheduled:
            start = req.num_computed_tokens
            end = start + n
            seqs.append(
                ScheduledSequence(
                    request_id=req.request_id,
                    token_ids=req._tokens(start, end),
                    positions=list(range(start, end)),
                    num_cached_tokens=start,
                    block_table=bm.block_table(req.request_id),
                    slot_mapping=bm.slot_mapping(req.request_id, start, n),
                    produces_token=end == req.num_tokens,
                    is_prefill=not (n == 1 and end == req.num_tokens and req.output_token_ids),
                )
            )
            req.num_computed_tokens = end
        out = SchedulerOutput(
            step=self.num_steps,
            seqs=seqs,
            num_batched_tokens=self.max_num_batched_tokens - budget,
            preempted_request_ids=preempted,
            block_size=bm.block_size,
        )
        self.num_steps += 1
        self._pending = out
        return out

    def update(self, sampled: Mapping[Hashable, int]) -> list[RequestOutput]:
        """Apply the step's sampled tokens: append them, finish requests (EOS -> ``"stop"``,
        finish predicate, ``max_tokens`` -> ``"length"``) and free finished requests' blocks.

        Args:
            sampled: ``request_id -> token id`` for every sequence of the last
                :meth:`schedule` that produces a token (requests finished meanwhile by
                :meth:`finish` may be left out; their tokens are ignored).

        Returns:
            One :class:`RequestOutput` per request that got a token or finished this step,
            plus those finished or rejected outside a step since the last update.

        Raises:
            SchedulerError: no step is pending; a producing sequence has no token; a token
                is given for a request that produces none this step; a token is not an
                integer ``>= 0``. Nothing changes then, and the step stays pending.
        """
        out = self._pending
        if out is None:
            raise SchedulerError("update() called without a pending schedule()")
        producing = {s.request_id for s in out.seqs if s.produces_token}
        extra = [r for r in sampled if r not in producing]
        if extra:
            raise SchedulerError(f"step {out.step}: tokens given for requests that produce none this step: {extra!r}")
        missing = [
            r for r in producing if r not in sampled and r in self._live and self._live[r].status is RequestStatus.RUNNING
        ]
        if missing:
            raise SchedulerError(f"step {out.step}: no sampled token for requests {missing!r}")
        tokens: dict[Hashable, int] = {}
        for r, t in sampled.items():
            if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
                raise SchedulerError(f"step {out.step}: token {t!r} for request {r!r} is not an integer >= 0")
            tokens[r] = int(t)
        self._pending = None

        events, self._events = self._events, []
        now = time.monotonic()
        for s in out.seqs:
            if not s.produces_token:
                continue
            req = self._live.get(s.request_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue  # finished by finish() after schedule()
            tok = tokens[s.request_id]
            req.output_token_ids.append(tok)
            if req.first_token_time is None:
                req.first_token_time = now
            reason = None
            if tok in req.eos_token_ids:
                reason = "stop"
            elif self.finish_predicate is not None and (r := self.finish_predicate(req, tok)) is not None:
                reason = r
            elif req.num_output_tokens >= req.max_tokens:
                reason = "length"
            if reason is not None:
                self.running.remove(req)
                self._finish(req, reason)
            events.append(RequestOutput(req.request_id, [tok], reason is not None, reason))
        return events

    def step(self, model_runner: ModelRunner) -> list[RequestOutput]:
        """:meth:`schedule`, then ``model_runner(output)`` (skipped for an empty step),
        then :meth:`update`.

        Args:
            model_runner: returns the next token for every sequence that produces one:
                a mapping ``request_id -> token`` or a sequence aligned with
                :attr:`SchedulerOutput.sampling_request_ids`.

        Returns:
            :meth:`update`'s outputs.

        Raises:
            SchedulerError: the runner returned a sequence of the wrong length (the step
                is still pending then), or what :meth:`update` raises.
        """
        out = self.schedule()
        ids = out.sampling_request_ids
        if not ids:
            return self.update({})
        result = model_runner(out)
        if isinstance(result, Mapping):
            return self.update(result)
        values = list(np.asarray(result).reshape(-1).tolist())
        if len(values) != len(ids):
            raise SchedulerError(f"step {out.step}: model runner returned {len(values)} tokens for {len(ids)} sequences")
        return self.update(dict(zip(ids, values, strict=True)))

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

    # ---- internals ------------------------------------------------------------------

    def _rejection_reason(self, req: RequestState) -> str | None:
        bm = self.block_manager
        need_tokens = req.max_kv_tokens
        need_blocks = bm.blocks_needed(need_tokens)
        if need_blocks > bm.num_blocks:
            return (
                f"request {req.request_id!r} needs up to {need_tokens} KV tokens (prompt {req.num_prompt_tokens} + "
                f"max_tokens {req.max_tokens} - 1) = {need_blocks} blocks of {bm.block_size}, but the whole KV pool "
                f"has {bm.num_blocks} blocks ({bm.num_slots} tokens); lower max_tokens or enlarge the pool"
            )
        if not self.chunked_prefill and need_tokens > self.max_num_batched_tokens:
            return (
                f"request {req.request_id!r} may need a prefill of {need_tokens} tokens (prompt {req.num_prompt_tokens} + "
                f"max_tokens {req.max_tokens} - 1, after a preemption), more than max_num_batched_tokens="
                f"{self.max_num_batched_tokens} without chunked prefill"
            )
        if self.max_model_len is not None and req.num_prompt_tokens + req.max_tokens > self.max_model_len:
            return (
                f"request {req.request_id!r}: prompt {req.num_prompt_tokens} + max_tokens {req.max_tokens} "
                f"exceeds max_model_len {self.max_model_len}"
            )
        return None

    def _preempt(self, req: RequestState) -> None:
        self.block_manager.free(req.request_id)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _finish(self, req: RequestState, reason: str) -> None:
        if req.request_id in self.block_manager:
            self.block_manager.free(req.request_id)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        req.num_computed_tokens = 0
        req.finished_time = time.monotonic()
        del self._live[req.request_id]


def _all_ints(tokens: Any) -> bool:
    try:
        return all(not isinstance(t, bool) and isinstance(t, numbers.Integral) for t in tokens)
    except TypeError:
        return False
