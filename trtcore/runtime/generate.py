"""The generate loop over a contiguous KV cache: prefill, then decode, for a batch of prompts.

Contiguous mode (DESIGN.md, "KV cache modes"): the engine takes each layer's cache
``past_key_values.{i}.key`` ``[batch, num_key_value_heads, P, head_dim]`` and returns
``present.{i}.key`` with the step's tokens appended (``P + S``). Prompts of different
lengths are right-padded; every cache slot remembers its token's position (``-1`` for
padding), and the attention mask given to the engine allows query ``q`` to see slot ``k``
exactly when the slot is real, ``pos(k) <= pos(q)`` (causal) and, with a sliding window
``W``, ``pos(q) - pos(k) < W`` (transformers' sliding-window mask). So each sequence
computes what it would compute alone.

Finished sequences leave the batch at once; cache columns no live sequence uses are
dropped, so the cache never grows past the longest live sequence.

With ``attention="native"`` (inputs ``kv_cache.{i}.*``, TensorRT's ``IKVCacheUpdateLayer`` +
``IAttention``) the cache instead has a fixed ``max_seq_len`` slots, slot ``j`` holding the
token at position ``j``: the engine writes each step's tokens at ``cache_write_positions``
in place, and the bool mask covers every slot (see :class:`ContiguousGenerator`).

Device executors (the reference executor on CuPy) return device arrays: the KV cache
(``present.*`` fed back as ``past_key_values.*``) then stays on the device, dropping rows
and columns is a device-side ``take`` with index arrays computed on the host (no boolean
mask indexing, which would read its count back), and only the logits come to the host for
sampling: one device->host copy per step, through the executor's ``to_host``. The small
per-step inputs (token ids, positions, masks) are built on the host and copied to the
device by the executor.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..dtypes import storage_dtype
from .executor import Executor
from .sampling import Sampler, SamplingParams, TokenLogprobs

#: additive mask value for disallowed (query, key) pairs; finite, so no NaN even if a row
#: were fully masked, and exp() of it underflows to exactly 0 in float32.
MASK_VALUE = np.float32(-1e30)


@dataclass
class Request:
    """One prompt to complete.

    Attributes:
        request_id: caller's id, echoed in every :class:`TokenEvent`.
        prompt_token_ids: the prompt, at least one token id.
        params: sampling parameters.
        eos_token_ids: ids that end generation unless ``params.ignore_eos``.
    """

    request_id: Any
    prompt_token_ids: list[int]
    params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()


@dataclass
class TokenEvent:
    """One generated token of one request.

    Attributes:
        request_id: the request.
        token_id: the new token.
        logprobs: its log-probabilities when the request asked for them.
        finish_reason: None while running, else ``"stop"`` (EOS or a stop token) or
            ``"length"`` (``max_tokens`` or the engine's ``max_seq_len`` reached).
        stop_reason: the stop token id when a ``stop_token_ids`` entry ended it.
        error: why the request was refused (then ``finish_reason == "error"`` and
            ``token_id == -1``), e.g. it needs more KV blocks than the whole pool.
    """

    request_id: Any
    token_id: int
    logprobs: TokenLogprobs | None
    finish_reason: str | None = None
    stop_reason: int | None = None
    error: str | None = None


def allowed_slots(key_pos: np.ndarray, query_pos: np.ndarray, sliding_window: int | None) -> np.ndarray:
    """bool ``[B, S, T]``: query ``s`` may read cache slot ``t``.

    Args:
        key_pos: int ``[B, T]``, each cache slot's position, -1 for padding (or unwritten).
        query_pos: int ``[B, S]``, each query's position (padding queries: 0).
        sliding_window: ``W`` or None.
    """
    k = key_pos[:, None, :]
    q = query_pos[:, :, None]
    allowed = (k >= 0) & (k <= q)
    if sliding_window:
        allowed &= (q - k) < sliding_window
    return allowed


def attention_mask(key_pos: np.ndarray, query_pos: np.ndarray, sliding_window: int | None) -> np.ndarray:
    """Additive float32 mask ``[B, 1, 1, S, T]`` from slot positions (see :func:`allowed_slots`)."""
    mask = np.where(allowed_slots(key_pos, query_pos, sliding_window), np.float32(0), MASK_VALUE).astype(np.float32)
    return mask[:, None, None, :, :]


def mask_feeds(
    config: ModelConfig, input_names: Sequence[str], key_pos: np.ndarray, query_pos: np.ndarray, native: bool = False
) -> dict[str, np.ndarray]:
    """The mask inputs of one step that the network has: ``attention_mask`` (causal, for
    full-attention layers) and ``sliding_attention_mask`` (with ``config.sliding_window``).

    ``native=False``: additive float32 ``[B, 1, 1, S, T]`` (composed-layers attention);
    ``native=True``: bool ``[B, 1, S, T]``, True where allowed (``IAttention``'s mask over
    all ``T = max_seq_len`` cache slots)."""
    feeds = {}
    for name, window in (("attention_mask", None), ("sliding_attention_mask", config.sliding_window)):
        if name in input_names:
            if native:
                feeds[name] = allowed_slots(key_pos, query_pos, window)[:, None, :, :]
            else:
                feeds[name] = attention_mask(key_pos, query_pos, window)
    return feeds


class ContiguousGenerator:
    """Runs batches of :class:`Request` through an executor with a contiguous KV cache.

    Two network variants (:func:`trtcore.models.llama.io_spec`), told apart by the executor's
    input names:

    * ``attention="layers"``: ``past_key_values.{i}.*`` in, ``present.{i}.*`` out, the cache
      growing by each step's tokens (columns no live sequence uses are dropped);
    * ``attention="native"`` (inputs ``kv_cache.{i}.*``): a fixed cache of ``max_seq_len``
      slots per sequence, slot ``j`` holding the token at position ``j``; each step's tokens
      are written at ``cache_write_positions`` (their first position) by the engine, in place,
      and a bool mask over all slots selects what each query reads. Prompt padding writes
      junk into slots past a prompt's end; they stay masked until that sequence's own tokens
      overwrite them.

    Args:
        executor: runs the model network (:func:`trtcore.models.llama.io_spec` I/O).
        config: the model config (layers, KV heads, head_dim, sliding_window).
        kv_dtype: NumPy dtype of the cache (the engine dtype).
        max_batch_size: sequences per engine call (the profile's max batch).
        max_seq_len: most tokens (prompt + generated) per sequence; for the native variant
            also the cache's slots, which must equal the engine's ``max_seq_len``.
    """

    def __init__(self, executor: Executor, config: ModelConfig, kv_dtype: Any, max_batch_size: int, max_seq_len: int):
        self.executor = executor
        self.config = config
        self.kv_dtype = np.dtype(kv_dtype)
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        #: the ``attention="native"`` network (fixed-size cache written by the engine)
        self.native = any(name.startswith("kv_cache.") for name in executor.input_names)
        prefix = "kv_cache" if self.native else "past_key_values"
        self._kv_names = [
            (f"{prefix}.{i}.{kind}", f"present.{i}.{kind}")
            for i in range(config.num_hidden_layers)
            for kind in ("key", "value")
        ]

    def generate(self, requests: Sequence[Request]) -> Iterator[TokenEvent]:
        """Yield one :class:`TokenEvent` per generated token, request by request per step.

        Requests run in batches of ``max_batch_size`` in the given order. The caller
        validates them (non-empty prompt shorter than ``max_seq_len``).
        """
        for start in range(0, len(requests), self.max_batch_size):
            yield from self._run_batch(list(requests[start : start + self.max_batch_size]))

    def _run(self, feeds: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
        """One engine call: the logits on the host, and the cache outputs keyed by input name."""
        out = self.executor.run(feeds)
        return np.asarray(self.executor.to_host(out["logits"], "logits"), dtype=np.float32), {p: out[o] for p, o in self._kv_names}

    def _select(self, past: dict[str, Any], rows: list[int], used: np.ndarray | None = None) -> dict[str, Any]:
        """Keep batch rows ``rows`` and (when given) the cache columns where ``used``, of every cache tensor."""
        cols = None if used is None or used.all() else np.flatnonzero(used)
        xp = self.executor.xp
        index: tuple[Any, Any] | None = None  # device index arrays, copied once per compaction
        out = {}
        for k, v in past.items():
            if isinstance(v, np.ndarray):
                out[k] = v[rows][:, :, used] if cols is not None else v[rows]
                continue
            if index is None:
                index = (xp.asarray(np.asarray(rows, np.int64)), None if cols is None else xp.asarray(cols.astype(np.int64)))
            v = xp.take(v, index[0], axis=0)
            out[k] = v if index[1] is None else xp.take(v, index[1], axis=2)
        return out

    def _new_cache(self, n: int) -> _GrowingCache | _FixedCache:
        return _FixedCache(self, n) if self.native else _GrowingCache(self, n)

    def _run_batch(self, batch: list[Request]) -> Iterator[TokenEvent]:
        n = len(batch)
        lens = np.array([len(r.prompt_token_ids) for r in batch])
        S = int(lens.max())
        ids = np.zeros((n, S), np.int64)
        valid = np.arange(S)[None, :] < lens[:, None]
        for b, r in enumerate(batch):
            ids[b, : lens[b]] = r.prompt_token_ids
        qpos = np.where(valid, np.arange(S)[None, :], 0)
        cache = self._new_cache(n)
        last = np.arange(n) * S + lens - 1

        sampler = Sampler()
        for b, r in enumerate(batch):
            sampler.add_request(b, r.params)
        alive = list(range(n))  # batch rows -> index into `batch`
        generated = [0] * n
        seq_len = lens.copy()

        logits = cache.step(ids, qpos, np.where(valid, qpos, -1), last)
        while True:
            result = sampler.sample(logits, alive)
            keep: list[int] = []
            for row, b in enumerate(alive):
                r = batch[b]
                tok = int(result.token_ids[row])
                generated[b] += 1
                seq_len[b] += 1
                reason, stop = None, None
                if r.params.stop_token_ids and tok in r.params.stop_token_ids:
                    reason, stop = "stop", tok
                elif not r.params.ignore_eos and tok in r.eos_token_ids:
                    reason = "stop"
                elif generated[b] >= r.params.max_tokens or seq_len[b] >= self.max_seq_len:
                    reason = "length"
                yield TokenEvent(r.request_id, tok, result.logprobs[row], reason, stop)
                if reason is None:
                    keep.append(row)
            if not keep:
                return
            next_ids = result.token_ids[keep].reshape(-1, 1)
            if len(keep) < len(alive):
                alive = [alive[i] for i in keep]
                cache.keep(keep)
            new_pos = np.array([[seq_len[b] - 1] for b in alive])
            logits = cache.step(next_ids, new_pos, new_pos, np.arange(len(alive)))


class _GrowingCache:
    """``attention="layers"``: ``past_key_values.{i}.*`` grow by each step's tokens
    (``present`` = past then new); every column remembers its token's position."""

    def __init__(self, gen: ContiguousGenerator, n: int):
        c = gen.config
        self.gen = gen
        empty = np.zeros((n, c.num_key_value_heads, 0, c.head_dim), gen.kv_dtype)
        self.past: dict[str, Any] = {p: empty for p, _ in gen._kv_names}
        self.key_pos = np.zeros((n, 0), np.int64)

    def step(self, ids: np.ndarray, qpos: np.ndarray, new_key_pos: np.ndarray, last: np.ndarray) -> np.ndarray:
        """Run the step's tokens ``ids`` ``[n, S]`` at positions ``qpos``; their cache
        columns get positions ``new_key_pos`` (-1: padding). Returns the logits."""
        g = self.gen
        self.key_pos = np.concatenate([self.key_pos, new_key_pos], axis=1)
        feeds = {
            "input_ids": ids.astype(np.int32),
            "position_ids": qpos.astype(np.int32),
            **mask_feeds(g.config, g.executor.input_names, self.key_pos, qpos),
            "last_token_ids": last.astype(np.int32),
            **self.past,
        }
        logits, self.past = g._run(feeds)
        return logits

    def keep(self, rows: list[int]) -> None:
        """Keep batch rows ``rows``; drop the columns no kept sequence uses."""
        key_pos = self.key_pos[rows]
        used = (key_pos >= 0).any(axis=0)
        self.past = self.gen._select(self.past, rows, np.asarray(used))
        self.key_pos = key_pos[:, used]


class _FixedCache:
    """``attention="native"``: ``kv_cache.{i}.*`` of ``max_seq_len`` slots, slot ``j`` for
    position ``j``; the engine writes each step's tokens in place (the outputs ``present.*``
    are the same memory, fed back as the next step's inputs)."""

    def __init__(self, gen: ContiguousGenerator, n: int):
        c = gen.config
        self.gen = gen
        xp = gen.executor.xp
        dtype = storage_dtype(gen.kv_dtype, xp)  # bfloat16 bit patterns on the device (0 is 0.0)
        shape = (n, c.num_key_value_heads, gen.max_seq_len, c.head_dim)
        self.cache: dict[str, Any] = {p: xp.zeros(shape, dtype) for p, _ in gen._kv_names}
        self.key_pos = np.full((n, gen.max_seq_len), -1, np.int64)

    def step(self, ids: np.ndarray, qpos: np.ndarray, new_key_pos: np.ndarray, last: np.ndarray) -> np.ndarray:
        """As :meth:`_GrowingCache.step`; the tokens go to slots ``qpos[:, 0] + s``."""
        g = self.gen
        write = qpos[:, 0]
        n, S = ids.shape
        self.key_pos[np.arange(n)[:, None], write[:, None] + np.arange(S)[None, :]] = new_key_pos
        feeds = {
            "input_ids": ids.astype(np.int32),
            "position_ids": qpos.astype(np.int32),
            **mask_feeds(g.config, g.executor.input_names, self.key_pos, qpos, native=True),
            "last_token_ids": last.astype(np.int32),
            "cache_write_positions": write.astype(np.int32),
            **self.cache,
        }
        logits, self.cache = g._run(feeds)
        return logits

    def keep(self, rows: list[int]) -> None:
        """Keep batch rows ``rows`` (the slots stay)."""
        self.key_pos = self.key_pos[rows]
        self.cache = self.gen._select(self.cache, rows)
