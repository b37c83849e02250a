"""Next-token sampling for a batch of requests: NumPy reference implementation.

This module turns one decode step's logits, ``float32 [batch, vocab]``, into the next
token of every request in the batch, each request with its own :class:`SamplingParams`
and its own :class:`numpy.random.Generator`. A generate loop calls :func:`sample` (or
:meth:`Sampler.sample`) once per step for the whole batch.

Pipeline for one row (all arithmetic in float64), in the order vLLM's v1 ``Sampler``
and Hugging Face ``transformers``' ``generate()`` apply them:

1. **Sanitize.** NaN logits become ``-inf`` (never chosen). A row that contains
   ``+inf`` or has no finite logit at all is *unusable* (its softmax is undefined):
   its token is the argmax of its finite logits, or id 0 if it has none, and
   :attr:`SampleResult.fallback` is set for that row. Other rows are not affected and
   nothing is raised.
2. **Greedy** when ``temperature == 0``: ``argmax``, ties broken towards the lowest id
   (``numpy.argmax``/``torch.argmax`` order). top-k / top-p cannot change the argmax and
   are ignored; no random number is drawn.
3. **Temperature**: ``logits / temperature`` (``TemperatureLogitsWarper``; vLLM
   ``logits.div_(temp)``). The row maximum is subtracted first, which leaves the
   softmax unchanged and keeps tiny temperatures from overflowing to ``+inf``.
4. **top-k**: keep every token whose logit is ``>=`` the k-th largest logit, so ties
   with the k-th value are all kept (HF ``TopKLogitsWarper``: ``scores <
   topk(scores, k)[..., -1]`` is removed; vLLM ``apply_top_k_top_p`` does the same).
   ``top_k`` of 0 or -1, or ``>= vocab``, disables it.
5. **top-p** (nucleus): on the distribution left by top-k, keep the smallest set of
   most likely tokens whose cumulative probability is ``>= top_p``; always at least
   one token (HF ``TopPLogitsWarper`` and vLLM ``apply_top_k_top_p`` remove a token
   when the ascending cumulative sum is ``<= 1 - top_p`` and never the last one; this
   module uses the equivalent descending form: keep a token while the probability
   mass strictly before it is ``< top_p``). Ties are ordered by id, lower first.
6. **Sample** by inverse CDF with exactly one ``generator.random()`` draw per row per
   step (for every row with ``temperature > 0``, fallback rows included), so a seeded
   request's stream depends only on its own seed and step count, never on the rest of
   the batch. Tokens of zero probability are never returned.

Log-probabilities (when ``SamplingParams.logprobs`` is set) are those of the **raw**
model distribution, ``log_softmax`` of the unmodified logits in float64, as vLLM's
default ``logprobs_mode="raw_logprobs"``; ranks follow vLLM: the sampled token's rank is
the number of tokens whose logprob is ``>=`` its own (1 = most likely,
``batched_count_greater_than``), and the top-k entries carry ranks ``1..k``.

NumPy only; GPU kernels are meant to match this file.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trtcore.errors import InvalidRequestError

__all__ = [
    "Logprob",
    "SampleResult",
    "Sampler",
    "SamplingParams",
    "TokenLogprobs",
    "log_softmax",
    "make_generator",
    "sample",
]


# ---------------------------------------------------------------------------
# parameters
# ---------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    """True for Python / NumPy integers, False for bools (which are ints in Python)."""
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value: Any) -> bool:
    """True for Python / NumPy ints and floats, False for bools."""
    return isinstance(value, (numbers.Real, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _bad(field_name: str, value: Any, allowed: str) -> InvalidRequestError:
    return InvalidRequestError(f"SamplingParams.{field_name} must be {allowed}, got {value!r}")


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters, named and defaulted as in vLLM's ``SamplingParams``.

    Attributes:
        temperature: float >= 0 and finite. ``0`` means greedy (argmax). Default 1.0.
        top_k: int >= -1. Keep the ``top_k`` most likely tokens (ties with the k-th are
            kept); ``0`` or ``-1`` disables it. Default 0.
        top_p: float in ``(0, 1]``. Nucleus sampling; ``1`` disables it. Default 1.0.
        seed: ``None`` or int >= 0. Seeds the request's own ``numpy.random.Generator``
            (:func:`make_generator`); the same seed gives the same tokens whatever else
            is in the batch. Default None (fresh OS entropy).
        max_tokens: int >= 1, the most tokens to generate. Default 16.
        logprobs: ``None`` or int >= 0. Number of top log-probabilities to return per
            generated token, besides the sampled token's own (vLLM semantics: ``0``
            returns only the sampled token's logprob). Clipped to the vocabulary size.
        ignore_eos: bool; keep generating after EOS. Default False.
        stop_token_ids: ``None`` or a list of ints >= 0 that end generation.

    Values are normalized on construction: NumPy scalars become Python ``int`` /
    ``float``, ``stop_token_ids`` becomes a new ``list[int]``. The instance is frozen;
    use ``dataclasses.replace`` to derive a changed copy (it is validated again).

    Raises:
        InvalidRequestError: for any value outside the ranges above; the message names
            the field, the value and the allowed range.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 16
    logprobs: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None

    def __post_init__(self) -> None:
        """Validate and normalize every field (see the class docstring for the ranges)."""
        set_ = object.__setattr__

        t = self.temperature
        if not _is_real(t) or not math.isfinite(float(t)) or float(t) < 0.0:
            raise _bad("temperature", t, "a finite number >= 0 (0 means greedy)")
        set_(self, "temperature", float(t))

        k = self.top_k
        if not _is_int(k) or int(k) < -1:
            raise _bad("top_k", k, "an integer >= -1 (0 or -1 disables top-k)")
        set_(self, "top_k", int(k))

        p = self.top_p
        if not _is_real(p) or not (0.0 < float(p) <= 1.0):
            raise _bad("top_p", p, "a number in (0, 1] (1 disables top-p)")
        set_(self, "top_p", float(p))

        s = self.seed
        if s is not None:
            if not _is_int(s) or int(s) < 0:
                raise _bad("seed", s, "None or an integer >= 0")
            set_(self, "seed", int(s))

        m = self.max_tokens
        if not _is_int(m) or int(m) < 1:
            raise _bad("max_tokens", m, "an integer >= 1")
        set_(self, "max_tokens", int(m))

        lp = self.logprobs
        if lp is not None:
            if not _is_int(lp) or int(lp) < 0:
                raise _bad("logprobs", lp, "None or an integer >= 0")
            set_(self, "logprobs", int(lp))

        ie = self.ignore_eos
        if not isinstance(ie, (bool, np.bool_)):
            raise _bad("ignore_eos", ie, "a bool")
        set_(self, "ignore_eos", bool(ie))

        st = self.stop_token_ids
        if st is not None:
            allowed = "None or a list of integers >= 0"
            if isinstance(st, (str, bytes)) or not isinstance(st, (Sequence, np.ndarray)):
                raise _bad("stop_token_ids", st, allowed)
            ids = list(st)
            for tok in ids:
                if not _is_int(tok) or int(tok) < 0:
                    raise InvalidRequestError(f"SamplingParams.stop_token_ids must be {allowed}, got {st!r} (bad element {tok!r})")
            set_(self, "stop_token_ids", [int(tok) for tok in ids])

    @property
    def greedy(self) -> bool:
        """True when ``temperature == 0``: the token is the argmax and no random draw is made."""
        return self.temperature == 0.0


def make_generator(params: SamplingParams) -> np.random.Generator:
    """Return the request's own random generator: ``numpy.random.default_rng(params.seed)``.

    Create it once per request and pass it to every :func:`sample` call of that
    request. With ``seed=None`` it is seeded from OS entropy.
    """
    return np.random.default_rng(params.seed)


# ---------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------


@dataclass
class Logprob:
    """One token's log-probability, as vLLM's ``vllm.logprobs.Logprob``.

    Attributes:
        logprob: natural-log probability under the raw model distribution (float;
            ``-inf`` for impossible tokens).
        rank: 1-based rank in that distribution (1 = most likely), or None.
        decoded_token: the token's text, filled in by the detokenizer (None here).
    """

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class TokenLogprobs:
    """Log-probabilities returned for one generated token of one request.

    Attributes:
        token_id: the sampled token.
        logprob: its raw log-probability (``log_softmax`` of the unmodified logits).
        rank: its vLLM rank, the number of tokens whose logprob is ``>=`` its own.
        top: the ``logprobs=k`` most likely tokens as ``(token_id, Logprob)`` pairs,
            most likely first, ranks ``1..k``; ties ordered by lower id first.
    """

    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, Logprob]] = field(default_factory=list)

    @property
    def top_token_ids(self) -> list[int]:
        """Ids of :attr:`top`, most likely first."""
        return [tok for tok, _ in self.top]

    def as_dict(self) -> dict[int, Logprob]:
        """vLLM's per-position dict ``{token_id: Logprob}``: the top-k plus the sampled token.

        Has ``k`` entries when the sampled token is among the top-k, else ``k + 1``.
        """
        out = {tok: lp for tok, lp in self.top}
        if self.token_id not in out:
            out[self.token_id] = Logprob(self.logprob, self.rank)
        return out


@dataclass
class SampleResult:
    """What one :func:`sample` call returns for a batch.

    Attributes:
        token_ids: ``int64 [batch]``, the next token of each row.
        logprobs: one entry per row: :class:`TokenLogprobs` when that request's
            ``logprobs`` is set, else None.
        fallback: ``bool [batch]``; True where the row's logits were unusable
            (contained ``+inf`` or no finite value) and the token is the argmax of its
            finite logits, or id 0 when it has none. A caller may abort such requests.
    """

    token_ids: np.ndarray
    logprobs: list[TokenLogprobs | None]
    fallback: np.ndarray


# ---------------------------------------------------------------------------
# per-row kernels (float64, 1-D)
# ---------------------------------------------------------------------------


def _sanitize(row: np.ndarray) -> tuple[np.ndarray, bool]:
    """Copy ``row`` to float64 with NaN -> -inf; return it and whether the row is usable.

    Unusable (``False``): the row contains ``+inf`` or has no finite value. An unusable
    row is returned with every non-finite entry set to ``-inf``.
    """
    x = np.array(row, dtype=np.float64, copy=True)
    x[np.isnan(x)] = -np.inf
    has_posinf = bool(np.any(x == np.inf))
    if has_posinf:
        x[x == np.inf] = -np.inf
    usable = not has_posinf and bool(np.any(np.isfinite(x)))
    return x, usable


def _fallback_token(x: np.ndarray) -> int:
    """Argmax of the finite entries of ``x`` (lowest id on ties), or 0 when there is none."""
    if not np.any(np.isfinite(x)):
        return 0
    return int(np.argmax(x))  # non-finite entries were set to -inf by _sanitize


def _process_row(x: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Temperature, then top-k, then top-p on a sanitized, usable float64 row.

    Returns new float64 logits, max 0, with removed tokens at ``-inf``.
    """
    # Rank on the scaled logits z (as HF's warpers do), not on the max-shifted y: the shift
    # can round two distinct logits to one value (e.g. -1.9e-16 and 0 next to 8.0).
    z = x / temperature  # -inf stays -inf
    y = z - z.max()  # softmax-invariant shift for the probabilities
    vocab = y.shape[0]
    if 0 < top_k < vocab:
        kth = np.partition(z, vocab - top_k)[vocab - top_k]  # k-th largest value
        y[z < kth] = -np.inf  # ties with the k-th are kept (HF / vLLM)
    if top_p < 1.0:
        kept = np.flatnonzero(y > -np.inf)  # ascending ids
        order = kept[np.argsort(-z[kept], kind="stable")]  # descending, ties by id
        probs = np.exp(y[order])  # max is 0: no overflow
        probs /= probs.sum()
        mass_before = np.empty_like(probs)
        mass_before[0] = 0.0
        np.cumsum(probs[:-1], out=mass_before[1:])
        y[order[mass_before >= top_p]] = -np.inf  # first token always kept: top_p > 0
    return y


def _draw(y: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from ``softmax(y)`` with one uniform ``u`` in [0, 1)."""
    kept = np.flatnonzero(y > -np.inf)
    weights = np.exp(y[kept] - y[kept].max())
    positive = weights > 0.0  # exp underflow: never return a zero-probability token
    kept, weights = kept[positive], weights[positive]
    cdf = np.cumsum(weights)
    j = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return int(kept[min(j, kept.shape[0] - 1)])


def _log_softmax_row(x: np.ndarray) -> np.ndarray:
    """float64 log_softmax of a sanitized row (no NaN, no +inf); all -inf if no finite value."""
    m = x.max()
    if not np.isfinite(m):
        return np.full_like(x, -np.inf)
    s = x - m
    return s - np.log(np.exp(s).sum())


def _token_logprobs(lp: np.ndarray, token: int, k: int) -> TokenLogprobs:
    """Build the :class:`TokenLogprobs` of ``token`` with the ``k`` best entries of ``lp``."""
    chosen = float(lp[token])
    rank = int(np.count_nonzero(lp >= lp[token]))
    k = min(k, lp.shape[0])
    top: list[tuple[int, Logprob]] = []
    if k > 0:
        kth = np.partition(lp, lp.shape[0] - k)[lp.shape[0] - k]
        cand = np.flatnonzero(lp >= kth)  # ascending ids, includes all ties
        best = cand[np.argsort(-lp[cand], kind="stable")[:k]]
        top = [(int(t), Logprob(float(lp[t]), r)) for r, t in enumerate(best, start=1)]
    return TokenLogprobs(token_id=int(token), logprob=chosen, rank=rank, top=top)


# ---------------------------------------------------------------------------
# batch API
# ---------------------------------------------------------------------------


def _as_logits(logits: Any, batch: int) -> np.ndarray:
    arr = np.asarray(logits)
    if arr.ndim != 2:
        raise ValueError(f"logits must be 2-D [batch, vocab], got shape {arr.shape}")
    if arr.shape[0] != batch:
        raise ValueError(f"logits has {arr.shape[0]} rows but {batch} SamplingParams were given")
    if arr.shape[1] < 1:
        raise ValueError("logits must have a vocabulary of at least one token")
    return arr


def _check_params(params: Sequence[SamplingParams]) -> None:
    for i, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise TypeError(f"params[{i}] must be a SamplingParams, got {type(p).__name__}")


def log_softmax(logits: Any) -> np.ndarray:
    """Raw log-probabilities used for ``logprobs``: float64 ``log_softmax`` along the last axis.

    Args:
        logits: array-like ``[batch, vocab]`` (any real float dtype; float32 expected).

    Returns:
        float64 ``[batch, vocab]``. NaN counts as ``-inf``; a row that contains
        ``+inf`` is taken over its finite entries only; a row without a finite entry is
        all ``-inf``. Never raises on non-finite values.
    """
    arr = np.asarray(logits)
    if arr.ndim != 2:
        raise ValueError(f"logits must be 2-D [batch, vocab], got shape {arr.shape}")
    out = np.empty(arr.shape, dtype=np.float64)
    for i in range(arr.shape[0]):
        out[i] = _log_softmax_row(_sanitize(arr[i])[0])
    return out


def sample(
    logits: Any,
    params: Sequence[SamplingParams],
    generators: Sequence[np.random.Generator | None] | None = None,
) -> SampleResult:
    """Choose the next token of every row of one decode step.

    Args:
        logits: array-like ``[batch, vocab]`` (float32 expected; any real dtype is cast
            to float64). Not modified.
        params: one :class:`SamplingParams` per row.
        generators: one ``numpy.random.Generator`` per row, made once per request with
            :func:`make_generator` and reused every step. An entry may be None only for
            greedy rows; ``generators`` itself may be None when every row is greedy.
            Each row with ``temperature > 0`` draws exactly one ``random()`` per call.

    Returns:
        :class:`SampleResult` with ``token_ids`` ``int64 [batch]``, per-row
        :class:`TokenLogprobs` (or None) and the ``fallback`` mask.

    Raises:
        ValueError: ``logits`` is not 2-D, has no columns, or its row count differs
            from ``len(params)`` / ``len(generators)``; a sampled row has no generator.
        TypeError: an entry of ``params`` is not a :class:`SamplingParams` or a
            generator is not a ``numpy.random.Generator``.

    Non-finite logits never raise: see the module docstring (NaN -> -inf, unusable rows
    fall back to the argmax of their finite values or id 0).
    """
    batch = len(params)
    arr = _as_logits(logits, batch)
    _check_params(params)
    if generators is not None and len(generators) != batch:
        raise ValueError(f"{len(generators)} generators were given for a batch of {batch}")
    for i, p in enumerate(params):
        if p.greedy:
            continue
        g = None if generators is None else generators[i]
        if g is None:
            raise ValueError(
                f"row {i} samples (temperature={p.temperature}) but has no generator; create one per request with make_generator(params)"
            )
        if not isinstance(g, np.random.Generator):
            raise TypeError(f"generators[{i}] must be a numpy.random.Generator, got {type(g).__name__}")

    token_ids = np.empty(batch, dtype=np.int64)
    fallback = np.zeros(batch, dtype=bool)
    out_logprobs: list[TokenLogprobs | None] = []
    for i, p in enumerate(params):
        x, usable = _sanitize(arr[i])
        u = None if p.greedy else float(generators[i].random())  # type: ignore[index,union-attr]
        if not usable:
            fallback[i] = True
            tok = _fallback_token(x)
        elif u is None:
            tok = int(np.argmax(x))
        else:
            tok = _draw(_process_row(x, p.temperature, p.top_k, p.top_p), u)
        token_ids[i] = tok
        if p.logprobs is None:
            out_logprobs.append(None)
        else:
            out_logprobs.append(_token_logprobs(_log_softmax_row(x), tok, p.logprobs))
    return SampleResult(token_ids=token_ids, logprobs=out_logprobs, fallback=fallback)


class Sampler:
    """Keeps each running request's params and generator; samples a batch by request id.

    A generate loop calls :meth:`add_request` when a request enters, :meth:`sample`
    once per step with the ids in the order of the logits rows (the batch may change
    from step to step), and :meth:`remove_request` when it finishes.
    """

    def __init__(self) -> None:
        """Create an empty sampler."""
        self._params: dict[Hashable, SamplingParams] = {}
        self._generators: dict[Hashable, np.random.Generator] = {}

    def add_request(self, request_id: Hashable, params: SamplingParams) -> None:
        """Register a request and create its generator (:func:`make_generator`).

        Raises:
            ValueError: ``request_id`` is already registered.
            TypeError: ``params`` is not a :class:`SamplingParams`.
        """
        if request_id in self._params:
            raise ValueError(f"request {request_id!r} is already registered")
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        self._params[request_id] = params
        self._generators[request_id] = make_generator(params)

    def remove_request(self, request_id: Hashable) -> None:
        """Forget a finished request. Raises ``KeyError`` when it is unknown."""
        del self._params[request_id]
        del self._generators[request_id]

    def __contains__(self, request_id: object) -> bool:
        """Whether ``request_id`` is registered."""
        return request_id in self._params

    def __len__(self) -> int:
        """Number of registered requests."""
        return len(self._params)

    def sample(self, logits: Any, request_ids: Sequence[Hashable]) -> SampleResult:
        """:func:`sample` for ``logits[i]`` belonging to ``request_ids[i]``.

        Raises:
            KeyError: a request id is not registered.
            ValueError: see :func:`sample`, or a request id appears twice.
        """
        if len(set(request_ids)) != len(request_ids):
            raise ValueError("request_ids must be distinct")
        params = [self._params[r] for r in request_ids]
        gens = [self._generators[r] for r in request_ids]
        return sample(logits, params, gens)
