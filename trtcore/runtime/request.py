"""One record per request, from admission to its last token, and the one event type.

A :class:`Request` is created when a prompt is admitted and carries everything about it
until it finishes: its sampling parameters, prompt and output token ids, EOS ids, status,
the scheduler's bookkeeping (``num_computed_tokens``, preemptions) and its timestamps
(arrival, first token, finish), from which :func:`metrics` derives TTFT and TPOT.

:meth:`Request.append_token` is the one finish rule, used by every scheduling policy:
a ``stop_token_ids`` entry ends with ``"stop"`` (and ``stop_reason`` = that id); an EOS id
ends with ``"stop"`` unless ``ignore_eos``; ``max_tokens`` or the engine's ``max_seq_len``
end with ``"length"``.

:class:`RequestEvent` is the one event type, from the scheduler up to
:class:`trtcore.llm.StreamOutput`: a new token, a finish, or a refusal (``error``).

Sources: vLLM v1 (``vllm/v1/request.py``: ``Request``, ``RequestStatus``,
``num_computed_tokens``; ``vllm/v1/core/sched/utils.py``: ``check_stop``; the metrics'
TTFT / TPOT definitions of ``vllm/v1/metrics/stats.py``).
"""

from __future__ import annotations

import enum
import numbers
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from trtcore.errors import InvalidRequestError

from .sampling import SamplingParams, TokenLogprobs

__all__ = ["Request", "RequestEvent", "RequestStatus", "metrics"]


class RequestStatus(enum.Enum):
    """Life cycle of a request.

    ``WAITING`` (queued, no KV cache) -> ``RUNNING`` (admitted, owns KV cache) ->
    ``FINISHED``; ``RUNNING`` -> ``PREEMPTED`` (back in the waiting queue, KV cache freed,
    generated tokens kept) -> ``RUNNING``; ``REJECTED``: could never run (see
    :attr:`Request.error`).
    """

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    REJECTED = "rejected"


def _all_ints(tokens: Any) -> bool:
    try:
        return all(not isinstance(t, bool) and isinstance(t, numbers.Integral) for t in tokens)
    except TypeError:
        return False


@dataclass(eq=False)
class Request:
    """One request, from admission to its last token.

    Args / attributes given at admission:
        request_id: caller's id (any hashable), unique among live requests.
        prompt_token_ids: the prompt, at least one token id ``>= 0``.
        params: its sampling parameters (``max_tokens``, ``stop_token_ids``, ``ignore_eos``, ...).
        eos_token_ids: ids that end it with ``"stop"`` unless ``params.ignore_eos``.
        max_seq_len: most tokens (prompt + generated) the engine holds per sequence; None:
            no limit beyond ``max_tokens``.
        arrival_time: ``time.perf_counter()`` seconds; now when not given.

    State attributes (updated by the scheduler and the step loop):
        output_token_ids: tokens generated so far (kept across preemptions).
        logprobs: per generated token, its :class:`TokenLogprobs` (None entries when the
            request did not ask for log-probabilities).
        status: see :class:`RequestStatus`.
        finish_reason: once finished: ``"stop"``, ``"length"``, ``"error"``, ``"rejected"``,
            ``"abort"`` or a caller's reason; None while running.
        stop_reason: the ``stop_token_ids`` entry that ended it, if any.
        error: why it was rejected or ended in error (non-finite logits); None otherwise.
        num_computed_tokens: tokens of :attr:`all_token_ids` whose keys/values are in the
            KV cache (0 while waiting).
        num_output_placeholders: tokens it produces in scheduled steps whose results the
            scheduler has not had yet (the step in flight; asynchronous scheduling runs one
            step ahead of the host, vLLM's ``num_output_placeholders``).
        num_preemptions: times it was preempted.
        first_token_time / finished_time: ``time.perf_counter()`` seconds; None until then.

    Raises:
        InvalidRequestError: an unhashable id, an empty prompt, a token id that is not an
            integer ``>= 0``, ``params`` not a :class:`SamplingParams`.
    """

    request_id: Hashable
    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    eos_token_ids: frozenset[int] = frozenset()
    max_seq_len: int | None = None
    arrival_time: float = field(default_factory=time.perf_counter)
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    stop_reason: int | None = None
    error: str | None = None
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    num_output_placeholders: int = 0
    first_token_time: float | None = None
    finished_time: float | None = None
    _num_taken: int = field(default=0, repr=False)
    _max_tokens: tuple[int | None, int] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            hash(self.request_id)
        except TypeError:
            raise InvalidRequestError(f"request_id {self.request_id!r} is not hashable") from None
        rid = self.request_id
        if not _all_ints(self.prompt_token_ids) or any(int(t) < 0 for t in self.prompt_token_ids):
            raise InvalidRequestError(f"request {rid!r}: prompt token ids must be integers >= 0")
        self.prompt_token_ids = [int(t) for t in self.prompt_token_ids]
        if not self.prompt_token_ids:
            raise InvalidRequestError(f"request {rid!r}: the prompt is empty")
        if not isinstance(self.params, SamplingParams):
            raise InvalidRequestError(f"request {rid!r}: params must be SamplingParams, got {type(self.params).__name__}")
        self.eos_token_ids = frozenset(int(t) for t in self.eos_token_ids)

    # ---- sizes ------------------------------------------------------------------------

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
    def max_tokens(self) -> int:
        """Most tokens it can generate: ``params.max_tokens``, capped by ``max_seq_len``
        minus the prompt (at least 1)."""
        cached = self._max_tokens
        if cached is not None and cached[0] == self.max_seq_len:  # asked twice per token: kept
            return cached[1]
        if self.max_seq_len is None:
            value = self.params.max_tokens
        else:
            value = max(1, min(self.params.max_tokens, self.max_seq_len - len(self.prompt_token_ids)))
        self._max_tokens = (self.max_seq_len, value)
        return value

    @property
    def max_kv_tokens(self) -> int:
        """Most tokens it ever holds in the KV cache: prompt + ``max_tokens - 1`` (the last
        sampled token is never fed)."""
        return self.num_prompt_tokens + self.max_tokens - 1

    @property
    def is_finished(self) -> bool:
        """True once ``FINISHED`` or ``REJECTED``."""
        return self.status in (RequestStatus.FINISHED, RequestStatus.REJECTED)

    # ---- tokens -----------------------------------------------------------------------

    def tokens(self, start: int, stop: int) -> list[int]:
        """``all_token_ids[start:stop]`` without building the whole list."""
        p = len(self.prompt_token_ids)
        if stop <= p:
            return self.prompt_token_ids[start:stop]
        if start >= p:
            return self.output_token_ids[start - p : stop - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[: stop - p]

    def take_new_token_ids(self) -> list[int]:
        """Generated tokens not returned by an earlier call (streaming: call after each step)."""
        new = self.output_token_ids[self._num_taken :]
        self._num_taken = len(self.output_token_ids)
        return new

    def append_token(self, token: int, logprobs: TokenLogprobs | None = None, now: float | None = None) -> str | None:
        """Append a generated token and apply the finish rule (see the module docstring).

        Returns:
            The finish reason (``"stop"`` / ``"length"``; also set as
            :attr:`stop_reason` for a stop token), or None when the request goes on. The
            caller finishes the request (:meth:`finish`) when a reason is returned.
        """
        now = time.perf_counter() if now is None else now
        self.output_token_ids.append(int(token))
        self.logprobs.append(logprobs)
        if self.first_token_time is None:
            self.first_token_time = now
        p = self.params
        if p.stop_token_ids and token in p.stop_token_ids:
            self.stop_reason = int(token)
            return "stop"
        if not p.ignore_eos and token in self.eos_token_ids:
            return "stop"
        n = len(self.output_token_ids)
        cached = self._max_tokens  # the max_tokens property's cache, inline (the per-token call)
        if n >= (cached[1] if cached is not None and cached[0] == self.max_seq_len else self.max_tokens):
            return "length"
        if self.max_seq_len is not None and n + len(self.prompt_token_ids) >= self.max_seq_len:
            return "length"
        return None

    def finish(self, reason: str, error: str | None = None, status: RequestStatus = RequestStatus.FINISHED) -> None:
        """Mark it finished (``status``) with ``reason`` (and ``error``), now."""
        self.status = status
        self.finish_reason = reason
        self.error = error if error is not None else self.error
        self.num_computed_tokens = 0
        self.finished_time = time.perf_counter()


class RequestEvent(NamedTuple):
    """What happened to one request in a step: a new token, a finish, or a refusal.

    The one event type from the scheduler (:meth:`trtcore.runtime.scheduler.Scheduler.update`)
    through the step loop (:class:`trtcore.runtime.generate.EngineCore`) up to
    :class:`trtcore.llm.StreamOutput`.

    Attributes:
        request_id: the request.
        token_id: the new token; ``-1`` when the event carries none (a finish outside a
            step, a rejection, an error).
        logprobs: the token's log-probabilities when the request asked for them.
        finish_reason: None while running, else see :attr:`Request.finish_reason`.
        stop_reason: the stop token id when a ``stop_token_ids`` entry ended it.
        error: why it was refused or ended (then ``finish_reason`` is ``"rejected"`` or
            ``"error"`` and ``token_id == -1``).

    Immutable (a ``NamedTuple``: one is made per token and request, and a frozen dataclass
    costs three times as much to build).
    """

    request_id: Hashable
    token_id: int = -1
    logprobs: TokenLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | None = None
    error: str | None = None

    @property
    def new_token_ids(self) -> list[int]:
        """``[token_id]``, or ``[]`` for an event without a token."""
        return [] if self.token_id < 0 else [self.token_id]

    @property
    def finished(self) -> bool:
        """Whether the request is done (finished, aborted, rejected or in error)."""
        return self.finish_reason is not None


def metrics(request: Request) -> dict[str, float]:
    """TTFT / TPOT of a finished request, from its timestamps (vLLM's definitions).

    Returns:
        ``{"ttft_s": first token - arrival, "e2e_s": finish - arrival, "tpot_s": (finish -
        first token) / (output tokens - 1), 0 for one token}`` in seconds; ``{}`` when it
        produced no token.
    """
    if request.first_token_time is None or request.finished_time is None:
        return {}
    n = request.num_output_tokens
    return {
        "ttft_s": request.first_token_time - request.arrival_time,
        "e2e_s": request.finished_time - request.arrival_time,
        "tpot_s": (request.finished_time - request.first_token_time) / (n - 1) if n > 1 else 0.0,
    }
