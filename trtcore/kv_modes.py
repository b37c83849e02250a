"""The KV cache contract, in one place for every KV cache mode.

Per mode (``paged``; ``contiguous`` with composed-layers attention; ``contiguous`` with
TensorRT's native ``IAttention`` + ``IKVCacheUpdateLayer`` over a fixed-size cache) this
module owns: the network's cache inputs and outputs, their optimization-profile shapes,
the per-step feeds the runtime gives the engine, and the cache buffers it allocates.
Model files never name a KV mode; the runtime never reads tensor names to find one.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from .config import ModelConfig

# ---------------------------------------------------------------------------------------
# network side: cache inputs / outputs and profile shapes (used by ops and the builder)
# ---------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------
# runtime side: per-step feeds and cache buffers (used by trtcore.runtime)
# ---------------------------------------------------------------------------------------

#: additive mask value for disallowed (query, key) pairs; finite, so no NaN even if a row
#: were fully masked, and exp() of it underflows to exactly 0 in float32.
MASK_VALUE = np.float32(-1e30)


def allowed_slots(key_pos: np.ndarray, query_pos: np.ndarray, sliding_window: int | None) -> np.ndarray:
    """bool ``[B, S, T]``: query ``s`` may read cache slot ``t``.

    Query ``q`` sees slot ``k`` exactly when the slot is real, ``pos(k) <= pos(q)``
    (causal) and, with a sliding window ``W``, ``pos(q) - pos(k) < W`` (transformers'
    sliding-window mask).

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


def mask_feeds(config: ModelConfig, key_pos: np.ndarray, query_pos: np.ndarray, native: bool = False) -> dict[str, np.ndarray]:
    """The mask inputs of one contiguous step: ``attention_mask`` (causal) when some layer
    is ``full_attention``, ``sliding_attention_mask`` (``config.sliding_window``) when some
    layer is ``sliding_attention`` (``config.layer_types``, as the network defines them).

    ``native=False``: additive float32 ``[B, 1, 1, S, T]`` (composed-layers attention);
    ``native=True``: bool ``[B, 1, S, T]``, True where allowed (``IAttention``'s mask over
    all ``T = max_seq_len`` cache slots)."""
    feeds = {}
    for name, kind, window in (
        ("attention_mask", "full_attention", None),
        ("sliding_attention_mask", "sliding_attention", config.sliding_window),
    ):
        if kind in config.layer_types:
            if native:
                feeds[name] = allowed_slots(key_pos, query_pos, window)[:, None, :, :]
            else:
                feeds[name] = attention_mask(key_pos, query_pos, window)
    return feeds


def storage_dtype(dtype: Any, xp: Any) -> np.dtype:
    """The array dtype a cache of ``dtype`` has in the array module ``xp``: bfloat16 is
    kept as its uint16 bit patterns outside NumPy (CuPy has no bfloat16; 0 is 0.0)."""
    dtype = np.dtype(dtype)
    return np.dtype(np.uint16) if xp is not np and dtype.name == "bfloat16" else dtype


class StepSequence(Protocol):
    """One scheduled sequence, as the KV modes read it
    (:class:`trtcore.runtime.scheduler.ScheduledSequence`)."""

    request_id: Hashable
    token_ids: list[int]
    positions: list[int]
    num_cached_tokens: int

    @property
    def num_new_tokens(self) -> int: ...


class StepBatch(Protocol):
    """One step's work, as the KV modes read it (:class:`trtcore.runtime.scheduler.SchedulerOutput`)."""

    @property
    def seqs(self) -> Sequence[StepSequence]: ...

    def input_ids(self) -> np.ndarray: ...
    def positions(self) -> np.ndarray: ...
    def block_tables(self) -> np.ndarray: ...
    def seq_lens(self) -> np.ndarray: ...
    def query_start_loc(self) -> np.ndarray: ...
    def last_token_indices(self) -> np.ndarray: ...


class PagedKVCache:
    """The paged mode's buffers and feeds: one pool of KV blocks for every layer, written
    in place by the attention plugins; each step gets the packed tokens and block tables.

    Args:
        config: the model config.
        block_size: tokens per block.
        num_blocks: blocks in the pool (sized once by the caller).
        dtype: the cache dtype (the engine dtype).
        xp: the executor's array module (``numpy`` or ``cupy``); the pool lives there for
            the whole run.
        dynamic_rope: the network takes ``rope_seq_lens`` (transformers' dynamic RoPE
            needs each token's sequence length).

    Attributes:
        pool: ``[num_hidden_layers, num_blocks, 2, num_key_value_heads, block_size, head_dim]``.
    """

    kind = "paged"

    def __init__(self, config: ModelConfig, block_size: int, num_blocks: int, dtype: Any, xp: Any = np, dynamic_rope: bool = False):
        self.config = config
        self.block_size = int(block_size)
        self.num_blocks = int(num_blocks)
        self.dtype = np.dtype(dtype)
        self.dynamic_rope = dynamic_rope
        c = config
        shape = (c.num_hidden_layers, self.num_blocks, 2, c.num_key_value_heads, self.block_size, c.head_dim)
        self.pool = xp.zeros(shape, dtype=storage_dtype(self.dtype, xp))
        if xp is np:
            # touch every page once now: the block manager hands out all free blocks in
            # turn, so a lazily zeroed pool would page-fault through the first generate calls
            self.pool.fill(0)

    def feeds(self, batch: StepBatch) -> dict[str, Any]:
        """The network inputs of one step of ``batch``."""
        feeds: dict[str, Any] = {
            "input_ids": batch.input_ids(),
            "position_ids": batch.positions(),
            "kv_cache_pool": self.pool,
            "block_tables": batch.block_tables(),
            "seq_lens": batch.seq_lens(),
            "query_start_loc": batch.query_start_loc(),
            "last_token_ids": batch.last_token_indices(),
        }
        if self.dynamic_rope:
            # each token's sequence length in this call: transformers' dynamic RoPE input
            feeds["rope_seq_lens"] = np.repeat(batch.seq_lens(), [s.num_new_tokens for s in batch.seqs]).astype(np.int32)
        return feeds

    def update(self, outputs: Mapping[str, Any]) -> None:
        """After a step: nothing (the plugins wrote the pool in place)."""


class ContiguousKVCache:
    """The contiguous mode's buffers and feeds: one cache row per sequence of a padded batch.

    Prompts of different lengths are right-padded; every cache slot remembers its token's
    position (``-1`` for padding) and the mask (:func:`mask_feeds`) lets each sequence
    compute what it would compute alone. Two variants:

    * ``native=False`` (composed-layers attention): ``past_key_values.{i}.*`` in,
      ``present.{i}.*`` out, the cache growing by each step's tokens; columns no live
      sequence uses are dropped, so it never grows past the longest live sequence;
    * ``native=True`` (TensorRT's ``IKVCacheUpdateLayer`` + ``IAttention``): a fixed cache of
      ``max_seq_len`` slots per sequence (``kv_cache.{i}.*``), slot ``j`` holding the token
      at position ``j``; the engine writes each step's tokens at ``cache_write_positions``
      in place, and a bool mask over all slots selects what each query reads. Prompt
      padding writes junk into slots past a prompt's end; they stay masked until that
      sequence's own tokens overwrite them.

    A batch whose sequences all start at position 0 starts a new cache; otherwise the rows
    of sequences no longer scheduled (finished) are dropped. On a device (``xp`` is CuPy)
    the cache stays there: dropping rows and columns is a device-side ``take`` with index
    arrays computed on the host (no boolean mask indexing, which would read its count back).

    Args:
        config: the model config.
        dtype: the cache dtype (the engine dtype).
        xp: the executor's array module.
        max_seq_len: slots of the native cache (the engine's ``max_seq_len``).
        native: the variant, from the build plan's attention choice.
    """

    kind = "contiguous"

    def __init__(self, config: ModelConfig, dtype: Any, xp: Any, max_seq_len: int, native: bool = False):
        self.config = config
        self.dtype = np.dtype(dtype)
        self.xp = xp
        self.max_seq_len = int(max_seq_len)
        self.native = bool(native)
        prefix = "kv_cache" if self.native else "past_key_values"
        self.names = [
            (f"{prefix}.{i}.{kind}", f"present.{i}.{kind}") for i in range(config.num_hidden_layers) for kind in ("key", "value")
        ]
        self.request_ids: list[Hashable] = []
        self.cache: dict[str, Any] = {}
        self.key_pos = np.zeros((0, 0), np.int64)

    def reset(self, n: int) -> None:
        """Start an empty cache of ``n`` rows."""
        c = self.config
        if self.native:
            shape = (n, c.num_key_value_heads, self.max_seq_len, c.head_dim)
            self.cache = {p: self.xp.zeros(shape, storage_dtype(self.dtype, self.xp)) for p, _ in self.names}
            self.key_pos = np.full((n, self.max_seq_len), -1, np.int64)
        else:
            empty = np.zeros((n, c.num_key_value_heads, 0, c.head_dim), self.dtype)
            self.cache = {p: empty for p, _ in self.names}
            self.key_pos = np.zeros((n, 0), np.int64)

    def keep(self, rows: list[int]) -> None:
        """Keep cache rows ``rows``; for the growing cache also drop the columns no kept row uses."""
        key_pos = self.key_pos[rows]
        used = None if self.native else (key_pos >= 0).any(axis=0)
        cols = None if used is None or used.all() else np.flatnonzero(used)
        index: tuple[Any, Any] | None = None  # device index arrays, copied once per compaction
        for k, v in self.cache.items():
            if isinstance(v, np.ndarray):
                self.cache[k] = v[rows][:, :, cols] if cols is not None else v[rows]
                continue
            if index is None:
                xp = self.xp
                index = (xp.asarray(np.asarray(rows, np.int64)), None if cols is None else xp.asarray(cols.astype(np.int64)))
            v = self.xp.take(v, index[0], axis=0)
            self.cache[k] = v if index[1] is None else self.xp.take(v, index[1], axis=2)
        self.key_pos = key_pos if cols is None else key_pos[:, cols]

    def feeds(self, batch: StepBatch) -> dict[str, Any]:
        """The network inputs of one step of ``batch`` (a new cache, or the live rows of the last)."""
        seqs = batch.seqs
        ids = [s.request_id for s in seqs]
        if all(s.num_cached_tokens == 0 for s in seqs):
            self.reset(len(seqs))
        elif ids != self.request_ids:
            where = {r: i for i, r in enumerate(self.request_ids)}
            self.keep([where[r] for r in ids])
        self.request_ids = ids
        lens = np.array([s.num_new_tokens for s in seqs])
        S = int(lens.max())
        tokens = np.zeros((len(seqs), S), np.int64)
        qpos = np.zeros((len(seqs), S), np.int64)
        key_pos = np.full((len(seqs), S), -1, np.int64)
        for b, s in enumerate(seqs):
            tokens[b, : lens[b]] = s.token_ids
            qpos[b, : lens[b]] = s.positions
            key_pos[b, : lens[b]] = s.positions
        return self.step_feeds(tokens, qpos, key_pos, lens - 1)

    def step_feeds(self, ids: np.ndarray, qpos: np.ndarray, new_key_pos: np.ndarray, last: np.ndarray) -> dict[str, Any]:
        """The inputs of a step that runs tokens ``ids`` ``[n, S]`` at positions ``qpos``
        (padding: 0) over the current cache rows; their slots get positions ``new_key_pos``
        (-1: padding); logits are taken at column ``last`` ``[n]`` of each row.
        Native: the tokens go to slots ``qpos[:, 0] + s``."""
        native_extra: dict[str, Any] = {}
        if self.native:
            write = qpos[:, 0]
            n, S = ids.shape
            self.key_pos[np.arange(n)[:, None], write[:, None] + np.arange(S)[None, :]] = new_key_pos
            native_extra["cache_write_positions"] = write.astype(np.int32)
        else:
            self.key_pos = np.concatenate([self.key_pos, new_key_pos], axis=1)
        return {
            "input_ids": ids.astype(np.int32),
            "position_ids": qpos.astype(np.int32),
            **mask_feeds(self.config, self.key_pos, qpos, native=self.native),
            # the network picks logits rows from the flattened [n * S] tokens
            "last_token_ids": (np.arange(ids.shape[0]) * ids.shape[1] + np.asarray(last)).astype(np.int32),
            **native_extra,
            **self.cache,
        }

    def update(self, outputs: Mapping[str, Any]) -> None:
        """After a step: the ``present.*`` outputs are the next step's cache (native: the
        same memory, written in place)."""
        self.cache = {p: outputs[o] for p, o in self.names}
