"""Next-token sampling for a batch of requests: the NumPy reference of every sampling kernel.

This module turns one decode step's logits, ``[batch, width]`` (float32 expected; the row
may be wider than the tokenizer's vocabulary, the padded columns are never chosen), into
the next token of every request, each request with its own :class:`SamplingParams`. It is
the host sampler of the runtime (:func:`sample`, :class:`Sampler`) and the oracle of the GPU
sampler (:func:`sample_rows`, matched token for token by
:class:`trtcore.runtime.sampling_gpu.GpuSampler`).

Pipeline for one row, all arithmetic in float64, in vLLM v1's order
(``vllm/v1/sample/sampler.py``, ``Sampler.forward`` docstring: "5. Apply logit processors
which are not argmax-invariant: a) Min tokens processor ... 6. Apply penalties a) Repetition
penalty b) Frequency penalty c) Presence penalty 7. ... a) greedy ... b) Apply temperature.
c) Apply logit processors which are argmax-invariant, by default the min_p processor.
d) Apply top_k and/or top_p. e) Sample"):

0. **Columns**: only ``[0, vocab_size)`` are read (``vocab_size`` defaults to the row
   width); a token id is always in that range.
1. **Sanitize.** NaN becomes ``-inf`` (never chosen). A row that contains ``+inf`` or has
   no finite logit is *unusable*: its token is the argmax of its finite logits, or id 0 if
   it has none, and :attr:`SampleResult.fallback` is set for that row (an error result for
   that request only: the runtime ends it with ``finish_reason="error"``). A row whose
   every token is removed by step 2 (e.g. ``min_tokens`` masks the only finite one) is
   unusable too.
2. **min_tokens**: while fewer than ``min_tokens`` tokens were generated, the EOS ids and
   ``stop_token_ids`` are set to ``-inf`` (vLLM ``MinTokensLogitsProcessor``).
3. **Penalties** (vLLM ``apply_penalties``, in this order): repetition, over the prompt and
   output tokens, ``l / r`` where ``l > 0`` else ``l * r`` (transformers'
   ``RepetitionPenaltyLogitsProcessor``); then ``l - (frequency_penalty * count +
   presence_penalty * (count > 0))`` with ``count`` the token's occurrences among the
   *output* tokens only (OpenAI's definition). A finite logit stays finite: results beyond
   float64's range are clamped to ``+-DBL_MAX`` (an extreme penalty ranks, it never makes
   a row unusable).
4. **Greedy** when ``temperature == 0``: ``argmax`` of the penalized logits, ties to the
   lowest id; min-p / top-k / top-p cannot change it and are skipped; no draw.
5. **Temperature**: ``z = l / temperature`` (``TemperatureLogitsWarper``), clamped to
   ``+-DBL_MAX`` like the penalties (a tiny temperature never overflows to ``+inf``). Every
   later step ranks tokens on ``z`` and weighs them by ``w = exp(z - max z)``.
6. **min-p**: remove tokens with ``w < min_p`` (probability below ``min_p`` times the
   largest; ``MinPLogitsWarper`` / vLLM ``apply_min_p``); ``0`` disables it.
7. **top-k**: keep the tokens whose ``z`` is ``>=`` the k-th largest remaining ``z`` (ties
   with the k-th are kept; ``TopKLogitsWarper``, vLLM ``apply_top_k_top_p``); ``0``/``-1``
   or ``>= vocab_size`` disable it. min-p and top-k both keep an upper set of values, so
   their order does not matter.
8. **top-p** over what is left, renormalized: keep the most likely tokens (descending
   ``z``, ties by lower id) while the probability mass strictly before a token is
   ``< top_p``, computed as the weight before it over the total weight (one rounded
   division); always at least one token (the descending form of ``TopPLogitsWarper``,
   which removes a token when the ascending cumulative sum is ``<= 1 - top_p``; where the
   mass before a token equals ``top_p`` up to rounding, as in runs of exactly tied tokens,
   the implementations' roundings can keep one token more or less: ten equal tokens at
   ``top_p=0.1`` keep 1 here, 2 in transformers' float32).
9. **Draw** by inverse CDF over the kept tokens in id order with one uniform ``u`` in
   ``[0, 1)``: the first token whose inclusive cumulative weight exceeds ``u`` times the
   total. Tokens of zero weight (``exp`` underflow) are never returned.

Where ``u`` comes from: :func:`sample` / :class:`Sampler` (the host path) take one
``numpy.random.Generator.random()`` per sampled row per step from the request's own
generator (:func:`make_generator`). :func:`sample_rows` (the GPU oracle) takes it from
:func:`philox_uniform` keyed by ``(seed, step)``: a counter-based generator, so a seeded
request's draws depend on its seed and its own step count only, never on the batch.

Log-probabilities (``SamplingParams.logprobs``) are those of the **raw** model distribution,
``log_softmax`` of the sanitized, unpenalized logits over ``[0, vocab_size)`` in float64, as
vLLM's default ``logprobs_mode="raw_logprobs"``; ranks follow vLLM: the sampled token's rank
is the number of tokens whose logprob is ``>=`` its own (1 = most likely), the top-k
entries carry ranks ``1..k`` (ties: lower id first).
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trtcore.errors import InvalidRequestError

__all__ = [
    "NON_FINITE_HINT",
    "Logprob",
    "SampleResult",
    "Sampler",
    "SamplingParams",
    "SamplingRow",
    "TokenLogprobs",
    "log_softmax",
    "make_generator",
    "philox4x32",
    "philox_uniform",
    "sample",
    "sample_rows",
]

#: Largest finite float64: where penalties and temperature clamp a finite logit.
DBL_MAX = sys.float_info.max


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
    exc = InvalidRequestError(f"SamplingParams.{field_name} must be {allowed}, got {value!r}")
    exc.field = field_name  # type: ignore[attr-defined]  # the field it names (the server's ``param``)
    return exc


def _real_in(obj: Any, name: str, lo: float, hi: float, allowed: str, *, lo_open: bool = False) -> None:
    """Validate ``obj.name`` as a real number in ``[lo, hi]`` (``(lo, hi]`` when lo_open) and store it as float."""
    v = getattr(obj, name)
    ok = _is_real(v) and math.isfinite(float(v)) and (lo < float(v) if lo_open else lo <= float(v)) and float(v) <= hi
    if not ok:
        raise _bad(name, v, allowed)
    object.__setattr__(obj, name, float(v))


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters, named, defaulted and validated as vLLM's ``SamplingParams``
    (``vllm/sampling_params.py``, ``_verify_args``).

    Attributes:
        temperature: float >= 0 and finite. ``0`` means greedy (argmax). Default 1.0.
        top_k: int >= -1. Keep the ``top_k`` most likely tokens (ties with the k-th are
            kept); ``0`` or ``-1`` disables it. Default 0.
        top_p: float in ``(0, 1]``. Nucleus sampling; ``1`` disables it. Default 1.0.
        min_p: float in ``[0, 1]``. Remove tokens less likely than ``min_p`` times the most
            likely one (after temperature); ``0`` disables it. Default 0.0.
        repetition_penalty: float > 0 (finite). Tokens of the prompt or the output get
            ``l / r`` where ``l > 0`` else ``l * r`` (transformers' semantics); ``1``
            disables it. Default 1.0.
        presence_penalty: float in ``[-2, 2]``. Subtracted once from every token that
            occurs in the output so far (OpenAI / vLLM). Default 0.0.
        frequency_penalty: float in ``[-2, 2]``. Subtracted per occurrence in the output.
            Default 0.0.
        seed: ``None`` or int >= 0. The request's own random stream (the host sampler's
            ``numpy.random.Generator``, the GPU sampler's Philox key); the same seed gives
            the same tokens whatever else is in the batch. Default None (fresh OS entropy).
        max_tokens: int >= 1, the most tokens to generate. Default 16.
        min_tokens: int in ``[0, max_tokens]``: EOS and ``stop_token_ids`` cannot be sampled
            (and stop strings do not match) before this many tokens. Default 0.
        logprobs: ``None`` or int >= 0. Number of top log-probabilities to return per
            generated token, besides the sampled token's own (vLLM semantics: ``0``
            returns only the sampled token's logprob). Clipped to the vocabulary size.
        ignore_eos: bool; keep generating after EOS. Default False.
        stop: ``None``, a string or a list of non-empty strings; generation stops when the
            text contains one, which is not included in the output (vLLM's
            ``include_stop_str_in_output=False``). Normalized to a ``list[str]`` (None -> []).
        stop_token_ids: ``None`` or a list of ints >= 0 that end generation.
        include_stop_str_in_output: bool; the matched stop string ends the output text
            instead of being cut off (vLLM's flag). Default False.

    Values are normalized on construction: NumPy scalars become Python ``int`` /
    ``float``, ``stop`` and ``stop_token_ids`` new lists. The instance is frozen; use
    ``dataclasses.replace`` to derive a changed copy (it is validated again).

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
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: str | list[str] | None = None
    min_tokens: int = 0
    include_stop_str_in_output: bool = False

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

        _real_in(self, "min_p", 0.0, 1.0, "a number in [0, 1] (0 disables min-p)")
        _real_in(self, "repetition_penalty", 0.0, math.inf, "a finite number > 0 (1 disables it)", lo_open=True)
        _real_in(self, "presence_penalty", -2.0, 2.0, "a number in [-2, 2]")
        _real_in(self, "frequency_penalty", -2.0, 2.0, "a number in [-2, 2]")

        s = self.seed
        if s is not None:
            if not _is_int(s) or int(s) < 0:
                raise _bad("seed", s, "None or an integer >= 0")
            set_(self, "seed", int(s))

        m = self.max_tokens
        if not _is_int(m) or int(m) < 1:
            raise _bad("max_tokens", m, "an integer >= 1")
        set_(self, "max_tokens", int(m))

        mt = self.min_tokens
        if not _is_int(mt) or not 0 <= int(mt) <= self.max_tokens:
            raise _bad("min_tokens", mt, f"an integer in [0, max_tokens={self.max_tokens}]")
        set_(self, "min_tokens", int(mt))

        lp = self.logprobs
        if lp is not None:
            if not _is_int(lp) or int(lp) < 0:
                raise _bad("logprobs", lp, "None or an integer >= 0")
            set_(self, "logprobs", int(lp))

        for flag in ("ignore_eos", "include_stop_str_in_output"):
            v = getattr(self, flag)
            if not isinstance(v, (bool, np.bool_)):
                raise _bad(flag, v, "a bool")
            set_(self, flag, bool(v))

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

        stop = self.stop
        allowed = "None, a string or a list of non-empty strings"
        if stop is None:
            stops: list[str] = []
        elif isinstance(stop, str):
            stops = [stop]
        elif isinstance(stop, Sequence) and not isinstance(stop, bytes) and all(isinstance(x, str) for x in stop):
            stops = list(stop)
        else:
            raise _bad("stop", stop, allowed)
        if any(not x for x in stops):
            raise _bad("stop", stop, allowed + " (an empty stop string would match everywhere)")
        set_(self, "stop", stops)

    @property
    def greedy(self) -> bool:
        """True when ``temperature == 0``: the token is the argmax and no random draw is made."""
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        """True when a repetition, presence or frequency penalty is active."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def make_generator(params: SamplingParams) -> np.random.Generator:
    """Return the request's own random generator: ``numpy.random.default_rng(params.seed)``.

    Create it once per request and pass it to every :func:`sample` call of that
    request. With ``seed=None`` it is seeded from OS entropy.
    """
    return np.random.default_rng(params.seed)


# ---------------------------------------------------------------------------
# Philox4x32-10: the counter-based generator of the GPU sampler
# ---------------------------------------------------------------------------

# Salmon, Moraes, Dror, Shaw: "Parallel Random Numbers: As Easy as 1, 2, 3", SC11 (2011),
# section 4 (Philox): multipliers, Weyl key increments, 10 rounds. Known-answer vectors:
# Random123's kat_vectors (tests/test_sampling_philox.py).
_PHILOX_M0, _PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
_PHILOX_W0, _PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = 0xFFFFFFFF


def philox4x32(counter: Any, key: Any, rounds: int = 10) -> np.ndarray:
    """Philox4x32-R of ``counter`` under ``key`` (Salmon et al. 2011), vectorized.

    Args:
        counter: uint32-valued array ``[..., 4]`` (any integer dtype; values < 2**32).
        key: uint32-valued array ``[..., 2]``, broadcast against ``counter[..., :2]``.
        rounds: number of rounds (10 is the standard Philox4x32-10).

    Returns:
        uint32 ``[..., 4]``: the four output words.

    Each round: ``(hi0, lo0) = mulhilo(M0, c0)``, ``(hi1, lo1) = mulhilo(M1, c2)``,
    ``c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)``; the key is bumped by the Weyl constants
    ``(W0, W1)`` before every round but the first.
    """
    c = np.asarray(counter, dtype=np.uint64) & _MASK32
    k = np.asarray(key, dtype=np.uint64) & _MASK32
    c0, c1, c2, c3 = c[..., 0], c[..., 1], c[..., 2], c[..., 3]
    k0, k1 = np.broadcast_to(k[..., 0], c0.shape), np.broadcast_to(k[..., 1], c0.shape)
    m0, m1, mask = np.uint64(_PHILOX_M0), np.uint64(_PHILOX_M1), np.uint64(_MASK32)
    for r in range(rounds):
        if r:
            k0 = (k0 + np.uint64(_PHILOX_W0)) & mask
            k1 = (k1 + np.uint64(_PHILOX_W1)) & mask
        p0, p1 = m0 * c0, m1 * c2  # < 2**64: no wrap-around
        hi0, lo0, hi1, lo1 = p0 >> np.uint64(32), p0 & mask, p1 >> np.uint64(32), p1 & mask
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def philox_uniform(seed: Any, step: Any) -> np.ndarray:
    """The uniform draw of request ``seed`` at its output step ``step``: float64 in ``[0, 1)``.

    Philox4x32-10 with key ``(seed & 0xffffffff, seed >> 32)`` and counter ``(step &
    0xffffffff, step >> 32, 0, 0)``; the first two output words ``r0, r1`` form
    ``x = r1 * 2**32 + r0`` and ``u = (x >> 11) * 2**-53`` (53 random bits, as NumPy's
    ``random()``). The GPU kernel (kernels/sampling.cu) computes the same bits.

    Args:
        seed, step: integers in ``[0, 2**64)`` (scalars or arrays, broadcast together).

    Returns:
        float64 array of the broadcast shape (0-d for scalars).
    """
    s = np.asarray(seed, dtype=np.uint64)
    t = np.asarray(step, dtype=np.uint64)
    s, t = np.broadcast_arrays(s, t)
    m, sh = np.uint64(_MASK32), np.uint64(32)
    zero = np.zeros_like(t)
    out = philox4x32(np.stack([t & m, t >> sh, zero, zero], axis=-1), np.stack([s & m, s >> sh], axis=-1))
    x = (out[..., 1].astype(np.uint64) << sh) | out[..., 0].astype(np.uint64)
    return (x >> np.uint64(11)).astype(np.float64) * 2.0**-53


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
        decoded_token: the token's text (:func:`trtcore.token_bytes.token_text`: ``" in"`` for
            the byte-level piece ``"Ġin"``; ``"bytes:\\xNN"`` for part of a UTF-8 character),
            filled in by :meth:`LLM.generate <trtcore.llm.LLM.generate>` (None here).
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


#: why no token is sampled from a row with a NaN or an infinity (the host and the device
#: executors' errors end with it)
NON_FINITE_HINT = "no token can be sampled (an overflow: e.g. a float16 engine for a checkpoint whose activations exceed 65504)"


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
        nonfinite: ``bool [batch]`` where the row held a NaN or an infinity (the GPU
            sampler reports it; None from the host sampler, whose callers check the logits).
    """

    token_ids: np.ndarray
    logprobs: list[TokenLogprobs | None]
    fallback: np.ndarray
    nonfinite: np.ndarray | None = None


# ---------------------------------------------------------------------------
# per-row pipeline (float64, 1-D)
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


def _clamp_finite(v: np.ndarray, finite: np.ndarray) -> np.ndarray:
    """``v`` with the entries that come from finite inputs clamped to ``[-DBL_MAX, DBL_MAX]``."""
    out = v.copy()
    out[finite] = np.clip(v[finite], -DBL_MAX, DBL_MAX)
    return out


def _penalize(
    x: np.ndarray,
    params: SamplingParams,
    prompt_token_ids: Sequence[int],
    output_token_ids: Sequence[int],
    banned: Sequence[int],
) -> np.ndarray:
    """Steps 2-3 of the module docstring on a sanitized row: min_tokens ban, then penalties."""
    vocab = x.shape[0]
    finite = np.isfinite(x)
    l = x.copy()
    if params.has_penalties:
        out_ids = np.asarray(output_token_ids, dtype=np.int64)
        out_ids = out_ids[(out_ids >= 0) & (out_ids < vocab)]
        counts = np.bincount(out_ids, minlength=vocab).astype(np.float64)
        if params.repetition_penalty != 1.0:
            seen = counts > 0
            pr = np.asarray(prompt_token_ids, dtype=np.int64)
            seen[pr[(pr >= 0) & (pr < vocab)]] = True
            r = params.repetition_penalty
            with np.errstate(over="ignore"):
                l[seen] = np.where(l[seen] > 0, l[seen] / r, l[seen] * r)
        with np.errstate(over="ignore", invalid="ignore"):
            # one rounding per operation, in the kernel's order: l - (f * count + p * present)
            l = l - (params.frequency_penalty * counts + params.presence_penalty * (counts > 0))
        l = _clamp_finite(l, finite)
    if banned:
        b = np.asarray(list(banned), dtype=np.int64)
        l[b[(b >= 0) & (b < vocab)]] = -np.inf
    return l


def _scaled(l: np.ndarray, temperature: float) -> np.ndarray:
    """Step 5: ``l / temperature`` with finite values clamped to ``+-DBL_MAX``."""
    with np.errstate(over="ignore"):
        z = l / temperature  # -inf stays -inf
    return _clamp_finite(z, np.isfinite(l))


def _keep_mask(z: np.ndarray, w: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """Steps 6-8: the tokens min-p, top-k and top-p keep, given ``z`` and ``w = exp(z - max z)``."""
    keep = z > -np.inf
    if min_p > 0.0:
        keep &= w >= min_p
    vocab = z.shape[0]
    if 0 < top_k < vocab:
        y = np.where(keep, z, -np.inf)
        kth = np.partition(y, vocab - top_k)[vocab - top_k]  # k-th largest remaining value
        keep &= y >= kth  # ties with the k-th are kept (HF / vLLM)
    if top_p < 1.0:
        kept = np.flatnonzero(keep)  # ascending ids
        order = kept[np.argsort(-z[kept], kind="stable")]  # descending, ties by id
        ws = w[order]
        # the weight before each token over the total, one rounding each: summing the rounded
        # probabilities instead drifts by many ulps over a long run of ties (a row of n equal
        # tokens kept fl(j/n) >= top_p wrongly), and the GPU sampler divides the sums too
        mass_before = np.empty_like(ws)
        mass_before[0] = 0.0
        np.cumsum(ws[:-1], out=mass_before[1:])
        keep[order[mass_before / ws.sum() >= top_p]] = False  # the first token always stays: top_p > 0
    return keep


def _process_row(x: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float = 0.0) -> np.ndarray:
    """Temperature, min-p, top-k and top-p on a sanitized, usable float64 row.

    Returns new float64 logits ``z - max z`` (max 0), removed tokens at ``-inf``.
    """
    z = _scaled(x, temperature)
    with np.errstate(over="ignore"):  # -DBL_MAX - DBL_MAX: -inf, weight 0
        y = z - z.max()
    w = np.exp(y)
    return np.where(_keep_mask(z, w, top_k, top_p, min_p), y, -np.inf)


def _draw_weights(w: np.ndarray, keep: np.ndarray, u: float) -> int:
    """Step 9: inverse-CDF draw over the kept tokens in id order with one uniform ``u``."""
    kept = np.flatnonzero(keep & (w > 0.0))  # exp underflow: never a zero-probability token
    cdf = np.cumsum(w[kept])
    j = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return int(kept[min(j, kept.shape[0] - 1)])


def _sample_row(
    x: np.ndarray,
    usable: bool,
    params: SamplingParams,
    u: float | None,
    prompt_token_ids: Sequence[int] = (),
    output_token_ids: Sequence[int] = (),
    banned: Sequence[int] = (),
) -> tuple[int, bool]:
    """The whole pipeline for one sanitized row; returns ``(token, fallback)``."""
    if not usable:
        return _fallback_token(x), True
    l = _penalize(x, params, prompt_token_ids, output_token_ids, banned)
    if not np.any(np.isfinite(l)):  # everything finite was banned
        return _fallback_token(x), True
    if u is None:
        return int(np.argmax(l)), False
    z = _scaled(l, params.temperature)
    with np.errstate(over="ignore"):  # -DBL_MAX - DBL_MAX: -inf, weight 0
        w = np.exp(z - z.max())
    return _draw_weights(w, _keep_mask(z, w, params.top_k, params.top_p, params.min_p), u), False


def _banned(params: SamplingParams, num_output_tokens: int, eos_token_ids: Sequence[int]) -> list[int]:
    """Ids step 2 removes: EOS (unless ignore_eos) and stop_token_ids while below min_tokens."""
    if num_output_tokens >= params.min_tokens:
        return []
    ids = [] if params.ignore_eos else list(eos_token_ids)
    return ids + list(params.stop_token_ids or [])


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


def _as_logits(logits: Any, batch: int, vocab_size: int | None = None) -> np.ndarray:
    arr = np.asarray(logits)
    if arr.ndim != 2:
        raise ValueError(f"logits must be 2-D [batch, vocab], got shape {arr.shape}")
    if arr.shape[0] != batch:
        raise ValueError(f"logits has {arr.shape[0]} rows but {batch} SamplingParams were given")
    if arr.shape[1] < 1:
        raise ValueError("logits must have a vocabulary of at least one token")
    if vocab_size is not None:
        if not _is_int(vocab_size) or not 1 <= int(vocab_size) <= arr.shape[1]:
            raise ValueError(f"vocab_size must be an integer in [1, {arr.shape[1]}] (the logits' width), got {vocab_size!r}")
        arr = arr[:, : int(vocab_size)]
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


def _per_row(value: Any, batch: int, name: str) -> list[Sequence[int]]:
    if value is None:
        return [()] * batch
    rows = list(value)
    if len(rows) != batch:
        raise ValueError(f"{name} has {len(rows)} entries for a batch of {batch}")
    return [() if r is None else r for r in rows]


def _finish(
    arr: np.ndarray,
    params: Sequence[SamplingParams],
    uniforms: Sequence[float | None],
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    eos: Sequence[Sequence[int]],
) -> SampleResult:
    """Run the row pipeline over a checked batch and build the :class:`SampleResult`."""
    batch = len(params)
    token_ids = np.empty(batch, dtype=np.int64)
    fallback = np.zeros(batch, dtype=bool)
    out_logprobs: list[TokenLogprobs | None] = []
    for i, p in enumerate(params):
        x, usable = _sanitize(arr[i])
        banned = _banned(p, len(outputs[i]), eos[i])
        token_ids[i], fallback[i] = _sample_row(x, usable, p, uniforms[i], prompts[i], outputs[i], banned)
        if p.logprobs is None:
            out_logprobs.append(None)
        else:
            out_logprobs.append(_token_logprobs(_log_softmax_row(x), int(token_ids[i]), p.logprobs))
    return SampleResult(token_ids=token_ids, logprobs=out_logprobs, fallback=fallback)


def sample(
    logits: Any,
    params: Sequence[SamplingParams],
    generators: Sequence[np.random.Generator | None] | None = None,
    *,
    prompt_token_ids: Sequence[Sequence[int] | None] | None = None,
    output_token_ids: Sequence[Sequence[int] | None] | None = None,
    eos_token_ids: Sequence[Sequence[int] | None] | None = None,
    vocab_size: int | None = None,
) -> SampleResult:
    """Choose the next token of every row of one decode step (the host sampler).

    Args:
        logits: array-like ``[batch, width]`` (float32 expected; any real dtype is cast
            to float64). Not modified.
        params: one :class:`SamplingParams` per row.
        generators: one ``numpy.random.Generator`` per row, made once per request with
            :func:`make_generator` and reused every step. An entry may be None only for
            greedy rows; ``generators`` itself may be None when every row is greedy.
            Each row with ``temperature > 0`` draws exactly one ``random()`` per call.
        prompt_token_ids: per row, the prompt's ids (for ``repetition_penalty``); None: none.
        output_token_ids: per row, the ids generated so far (penalties, ``min_tokens``).
        eos_token_ids: per row, the EOS ids that ``min_tokens`` masks.
        vocab_size: the tokenizer's vocabulary: only columns ``[0, vocab_size)`` are
            sampled and enter the logprobs (default: the whole width).

    Returns:
        :class:`SampleResult` with ``token_ids`` ``int64 [batch]`` (each in
        ``[0, vocab_size)``), per-row :class:`TokenLogprobs` (or None) and the
        ``fallback`` mask.

    Raises:
        ValueError: ``logits`` is not 2-D, has no columns, or its row count differs
            from ``len(params)`` / ``len(generators)`` / a per-row list; ``vocab_size``
            out of range; a sampled row has no generator.
        TypeError: an entry of ``params`` is not a :class:`SamplingParams` or a
            generator is not a ``numpy.random.Generator``.

    Non-finite logits never raise: see the module docstring (NaN -> -inf, unusable rows
    fall back to the argmax of their finite values or id 0 and are flagged).
    """
    batch = len(params)
    arr = _as_logits(logits, batch, vocab_size)
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
    prompts = _per_row(prompt_token_ids, batch, "prompt_token_ids")
    outputs = _per_row(output_token_ids, batch, "output_token_ids")
    eos = _per_row(eos_token_ids, batch, "eos_token_ids")
    uniforms = [None if p.greedy else float(generators[i].random()) for i, p in enumerate(params)]  # type: ignore[index,union-attr]
    return _finish(arr, params, uniforms, prompts, outputs, eos)


@dataclass
class SamplingRow:
    """One row of :func:`sample_rows` (and of :meth:`GpuSampler.set_params
    <trtcore.runtime.sampling_gpu.GpuSampler.set_params>`): a request at one step.

    Attributes:
        params: the request's :class:`SamplingParams`.
        prompt_token_ids: its prompt (``repetition_penalty``).
        output_token_ids: the tokens it generated so far (penalties, ``min_tokens``).
        eos_token_ids: the EOS ids ``min_tokens`` masks.
        seed: the Philox key, ``[0, 2**64)``; default ``params.seed`` (required for a
            sampled row when that is None: draw one per request, e.g. ``secrets.randbits(64)``).
        step: the Philox counter; default ``len(output_token_ids)``, the request's own step.
    """

    params: SamplingParams
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()
    eos_token_ids: Sequence[int] = ()
    seed: int | None = None
    step: int | None = None

    def key(self) -> tuple[int, int]:
        """``(seed, step)`` with the defaults applied.

        Raises:
            InvalidRequestError: a sampled row without a seed, or a seed / step outside ``[0, 2**64)``.
        """
        seed = self.params.seed if self.seed is None else self.seed
        step = len(self.output_token_ids) if self.step is None else self.step
        if seed is None:
            if not self.params.greedy:
                raise InvalidRequestError("a sampled SamplingRow needs a seed (params.seed or SamplingRow.seed)")
            seed = 0
        for name, v in (("seed", seed), ("step", step)):
            if not _is_int(v) or not 0 <= int(v) < 2**64:
                raise InvalidRequestError(f"SamplingRow.{name} must be an integer in [0, 2**64), got {v!r}")
        return int(seed), int(step)


def sample_rows(logits: Any, rows: Sequence[SamplingRow], vocab_size: int | None = None) -> SampleResult:
    """The GPU sampler's reference: :func:`sample` with each row's uniform from
    :func:`philox_uniform` ``(seed, step)`` instead of a ``numpy.random.Generator``.

    Args:
        logits: array-like ``[batch, width]``, one row per entry of ``rows``.
        rows: one :class:`SamplingRow` per logits row.
        vocab_size: as for :func:`sample`.

    Returns:
        :class:`SampleResult`, as :func:`sample`.

    Raises:
        ValueError, TypeError: as :func:`sample`; a row that is not a :class:`SamplingRow`.
        InvalidRequestError: a sampled row without a seed.
    """
    for i, r in enumerate(rows):
        if not isinstance(r, SamplingRow):
            raise TypeError(f"rows[{i}] must be a SamplingRow, got {type(r).__name__}")
    params = [r.params for r in rows]
    arr = _as_logits(logits, len(rows), vocab_size)
    _check_params(params)
    uniforms = [None if r.params.greedy else float(philox_uniform(*r.key())) for r in rows]
    return _finish(arr, params, uniforms, [r.prompt_token_ids for r in rows], [r.output_token_ids for r in rows], [r.eos_token_ids for r in rows])


class Sampler:
    """Keeps each running request's params, generator and tokens; samples a batch by request id.

    A generate loop calls :meth:`add_request` when a request enters, :meth:`sample`
    once per step with the ids in the order of the logits rows (the batch may change
    from step to step), and :meth:`remove_request` when it finishes. The tokens
    :meth:`sample` returns are recorded as the requests' outputs (penalties, ``min_tokens``).
    """

    def __init__(self, vocab_size: int | None = None) -> None:
        """Create an empty sampler; ``vocab_size`` as for :func:`sample` (None: the logits' width)."""
        self.vocab_size = vocab_size
        self._params: dict[Hashable, SamplingParams] = {}
        self._generators: dict[Hashable, np.random.Generator] = {}
        self._prompts: dict[Hashable, list[int]] = {}
        self._outputs: dict[Hashable, list[int]] = {}
        self._eos: dict[Hashable, list[int]] = {}

    def add_request(
        self, request_id: Hashable, params: SamplingParams, prompt_token_ids: Iterable[int] = (), eos_token_ids: Iterable[int] = ()
    ) -> None:
        """Register a request and create its generator (:func:`make_generator`).

        Args:
            request_id: any hashable, unique among registered requests.
            params: its sampling parameters.
            prompt_token_ids: its prompt (for ``repetition_penalty``).
            eos_token_ids: the EOS ids ``min_tokens`` masks.

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
        self._prompts[request_id] = [int(t) for t in prompt_token_ids]
        self._outputs[request_id] = []
        self._eos[request_id] = [int(t) for t in eos_token_ids]

    def remove_request(self, request_id: Hashable) -> None:
        """Forget a finished request. Raises ``KeyError`` when it is unknown."""
        del self._params[request_id]
        del self._generators[request_id]
        del self._prompts[request_id], self._outputs[request_id], self._eos[request_id]

    def __contains__(self, request_id: object) -> bool:
        """Whether ``request_id`` is registered."""
        return request_id in self._params

    def __len__(self) -> int:
        """Number of registered requests."""
        return len(self._params)

    def sample(self, logits: Any, request_ids: Sequence[Hashable]) -> SampleResult:
        """:func:`sample` for ``logits[i]`` belonging to ``request_ids[i]``; records the
        tokens of the usable rows as the requests' outputs.

        Raises:
            KeyError: a request id is not registered.
            ValueError: see :func:`sample`, or a request id appears twice.
        """
        if len(set(request_ids)) != len(request_ids):
            raise ValueError("request_ids must be distinct")
        params = [self._params[r] for r in request_ids]
        gens = [self._generators[r] for r in request_ids]
        res = sample(
            logits,
            params,
            gens,
            prompt_token_ids=[self._prompts[r] for r in request_ids],
            output_token_ids=[self._outputs[r] for r in request_ids],
            eos_token_ids=[self._eos[r] for r in request_ids],
            vocab_size=self.vocab_size,
        )
        for r, tok, bad in zip(request_ids, res.token_ids, res.fallback):
            if not bad:
                self._outputs[r].append(int(tok))
        return res
