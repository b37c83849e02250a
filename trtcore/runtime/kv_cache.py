"""Paged KV cache: the pool layout and the block manager (host-side bookkeeping).

Paged mode (DESIGN.md, "KV cache modes"): the keys and values of every sequence live in
one pool of fixed-size **blocks** of ``block_size`` token slots; each sequence owns a
**block table**, the list of its block ids in token order, so token ``pos`` of a sequence
lives in block ``block_table[pos // block_size]`` at offset ``pos % block_size``. Its
**slot** is ``block_id * block_size + offset`` (vLLM's ``slot_mapping``); an attention
kernel reads a sequence's first ``seq_len`` tokens through its block table, and the
step's new keys/values are written to the slots of its ``slot_mapping``.

Pool layout (:meth:`KVCacheSpec.pool_shape`), one array for all layers::

    [num_layers, num_blocks, 2, num_kv_heads, block_size, head_dim]
                             ^ 0 = K, 1 = V

- **layer-major**: ``pool[layer]`` is one contiguous slab, so a layer's attention gets a
  plain pointer, and one block table (and one slot mapping) serves every layer: block
  ``b`` of a sequence is block ``b`` in each layer's slab.
- **HND within a block** (FlashInfer's ``HND`` page layout): ``pool[l, b, kv, h]`` is a
  contiguous ``[block_size, head_dim]`` tile, so a decode kernel that handles one KV head
  reads whole blocks as coalesced runs of ``block_size * head_dim`` elements, and K and
  V of one block sit next to each other (vLLM's kernels use the same per-block split).

The pool is sized once, from a memory budget (:meth:`KVCacheSpec.num_blocks_for_budget`);
it is allocated by the paged KV mode (:class:`trtcore.kv_modes.PagedKVCache`); no block is allocated on the device
afterwards. :class:`BlockManager` hands blocks to sequences on the host: a free list,
one block table per sequence, and the invariant that a block belongs to at most one live
sequence, that freed blocks return to the free list exactly once, and that nothing
leaks (``num_free_blocks + num_used_blocks == num_blocks``; :meth:`BlockManager.check_invariants`).
A failed operation raises :class:`NoFreeBlocksError` and changes nothing.

Sources: vLLM (PagedAttention; ``BlockSpaceManager`` / ``KVCacheManager``, ``slot_mapping``,
``PAD_SLOT_ID``), FlashInfer (paged KV cache, ``HND`` layout, ``kv_indices``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtcore.dtypes import NAMES
from trtcore.errors import InvalidArgumentError, TrtcoreError
from trtcore.plan import check_int

__all__ = [
    "PAD_SLOT_ID",
    "BlockManager",
    "KVCacheSpec",
    "NoFreeBlocksError",
    "UnknownSequenceError",
    "kv_cache_dtype",
]

#: Slot id of a padding token (e.g. in a CUDA-Graph batch bucket): a kernel that writes
#: the step's keys/values must skip slots ``< 0`` (vLLM's ``PAD_SLOT_ID``).
PAD_SLOT_ID = -1

#: The cache element types (names of :mod:`trtcore.dtypes`, which also resolves their aliases).
_KV_DTYPES = ("float32", "float16", "bfloat16", "float8_e4m3fn")


def kv_cache_dtype(dtype: Any) -> np.dtype:
    """The NumPy dtype of a KV cache element.

    Args:
        dtype: a name (``"float32"``, ``"float16"``/``"fp16"``, ``"bfloat16"``/``"bf16"``,
            ``"float8_e4m3fn"``/``"fp8"``) or anything :class:`numpy.dtype` accepts
            (``np.float16``, ``ml_dtypes.bfloat16``).

    Returns:
        The dtype (``bfloat16`` and FP8 as ``ml_dtypes`` types).

    Raises:
        InvalidArgumentError: unknown name, or not a floating-point type of 1, 2 or 4 bytes.
    """
    if isinstance(dtype, str):
        dt = NAMES.get(dtype.lower())
        if dt is None or dt.name not in _KV_DTYPES:
            raise InvalidArgumentError(f"KV cache dtype {dtype!r} is not supported; expected one of {', '.join(sorted(_KV_DTYPES))}")
        return dt
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise InvalidArgumentError(f"KV cache dtype {dtype!r} is not a dtype: {e}") from None
    if dt.name not in _KV_DTYPES:
        raise InvalidArgumentError(f"KV cache dtype {dt} is not supported; expected one of {', '.join(sorted(_KV_DTYPES))}")
    return dt


@dataclass(frozen=True)
class KVCacheSpec:
    """What one KV cache block holds, and the pool layout.

    Attributes:
        num_layers: decoder layers (``num_hidden_layers``); all share one pool.
        num_kv_heads: key/value heads per layer (``num_key_value_heads``).
        head_dim: elements per head.
        block_size: token slots per block (vLLM's default 16; FlashInfer's ``page_size``).
        dtype: cache element type: a name or NumPy dtype (see :func:`kv_cache_dtype`),
            stored normalised as a :class:`numpy.dtype`.

    Raises:
        InvalidArgumentError: a field is not a positive integer, or the dtype is unknown.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int = 16
    dtype: Any = "float16"

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), 1))
        object.__setattr__(self, "dtype", kv_cache_dtype(self.dtype))

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token occupies over all layers, K and V:
        ``num_layers * 2 * num_kv_heads * head_dim * itemsize``."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block over all layers, K and V: ``bytes_per_token * block_size``."""
        return self.bytes_per_token * self.block_size

    def pool_shape(self, num_blocks: int) -> tuple[int, int, int, int, int, int]:
        """Shape of the pool: ``(num_layers, num_blocks, 2, num_kv_heads, block_size, head_dim)``.

        Raises:
            InvalidArgumentError: ``num_blocks < 1``.
        """
        n = check_int("num_blocks", num_blocks, 1)
        return (self.num_layers, n, 2, self.num_kv_heads, self.block_size, self.head_dim)

    def pool_nbytes(self, num_blocks: int) -> int:
        """Bytes of a pool of ``num_blocks`` blocks (``num_blocks * bytes_per_block``)."""
        return check_int("num_blocks", num_blocks, 1) * self.bytes_per_block

    def pool_strides(self, num_blocks: int) -> tuple[int, int, int, int, int, int]:
        """Strides of the C-contiguous pool, **in elements** (not bytes), one per axis of
        :meth:`pool_shape`; a kernel's address of ``pool[l, b, kv, h, o, d]`` is the dot
        product of these with the indices."""
        shape = self.pool_shape(num_blocks)
        strides = [1] * 6
        for i in range(4, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        return tuple(strides)  # type: ignore[return-value]

    def num_blocks_for_budget(self, budget_bytes: int) -> int:
        """The number of whole blocks that fit in ``budget_bytes`` (``budget // bytes_per_block``).

        Raises:
            InvalidArgumentError: the budget is negative, not an integer, or holds no block
                (the message gives both numbers).
        """
        budget = check_int("KV cache budget (bytes)", budget_bytes, 0)
        n = budget // self.bytes_per_block
        if n < 1:
            raise InvalidArgumentError(
                f"KV cache budget of {budget} bytes holds no block: one block of {self.block_size} tokens takes "
                f"{self.bytes_per_block} bytes ({self.num_layers} layers x 2 x {self.num_kv_heads} kv heads x "
                f"{self.head_dim} x {self.dtype.itemsize} bytes x {self.block_size})"
            )
        return n


class NoFreeBlocksError(TrtcoreError, RuntimeError):
    """The KV pool has too few free blocks for an allocation; nothing was changed.

    Attributes:
        seq_id: the sequence that asked (None for a plain capacity question).
        num_needed: blocks the operation needed.
        num_free: blocks that were free.
    """

    def __init__(self, message: str, seq_id: Hashable | None = None, num_needed: int = 0, num_free: int = 0):
        super().__init__(message)
        self.seq_id = seq_id
        self.num_needed = num_needed
        self.num_free = num_free


class UnknownSequenceError(TrtcoreError, KeyError):
    """The block manager has no live sequence with that id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


_FREE = object()  # owner marker of a free block (seq ids may be any hashable, even None)


class BlockManager:
    """Hands out the blocks of one KV pool to sequences (host-side; no device memory).

    Each live sequence has ``num_tokens`` token slots reserved in a block table of exactly
    ``ceil(num_tokens / block_size)`` blocks. Blocks come from a FIFO free list (block ids
    ``0 .. num_blocks - 1``); a freed block goes to the back of the list.

    Invariants (checked by :meth:`check_invariants`): no block belongs to two live
    sequences or to a sequence and the free list; a freed block returns exactly once;
    ``num_free_blocks + num_used_blocks == num_blocks``. Every method that raises leaves
    the state as it was.

    Args:
        num_blocks: blocks in the pool, ``>= 1``.
        block_size: token slots per block, ``>= 1``.

    Raises:
        InvalidArgumentError: a non-positive or non-integer argument.
    """

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = check_int("num_blocks", num_blocks, 1)
        self.block_size = check_int("block_size", block_size, 1)
        self._free: deque[int] = deque(range(self.num_blocks))
        self._owner: list[Any] = [_FREE] * self.num_blocks
        self._tables: dict[Hashable, list[int]] = {}
        self._num_tokens: dict[Hashable, int] = {}

    # ---- capacity -------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the free list."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks owned by live sequences."""
        return self.num_blocks - len(self._free)

    @property
    def num_slots(self) -> int:
        """Token slots in the pool (``num_blocks * block_size``)."""
        return self.num_blocks * self.block_size

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``."""
        return -(-check_int("num_tokens", num_tokens, 0) // self.block_size)

    def can_allocate(self, num_tokens: int) -> bool:
        """Whether a new sequence of ``num_tokens`` tokens fits in the free blocks now."""
        return self.blocks_needed(num_tokens) <= len(self._free)

    def can_append(self, seq_id: Hashable, n: int = 1) -> bool:
        """Whether sequence ``seq_id`` can grow by ``n`` tokens with the free blocks now.

        Raises:
            UnknownSequenceError: no live sequence ``seq_id``.
        """
        return self._new_blocks_for(seq_id, n) <= len(self._free)

    # ---- sequences ------------------------------------------------------------------

    @property
    def seq_ids(self) -> list[Hashable]:
        """Ids of the live sequences, in allocation order."""
        return list(self._tables)

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._tables

    def __len__(self) -> int:
        """Number of live sequences."""
        return len(self._tables)

    def allocate(self, seq_id: Hashable, num_tokens: int) -> list[int]:
        """Admit sequence ``seq_id`` with slots for its first ``num_tokens`` tokens.

        Args:
            seq_id: a new id (any hashable).
            num_tokens: tokens to reserve slots for, ``>= 0``.

        Returns:
            Its block table (a copy), ``ceil(num_tokens / block_size)`` block ids.

        Raises:
            InvalidArgumentError: ``seq_id`` is already live, or ``num_tokens < 0``.
            NoFreeBlocksError: fewer free blocks than needed (nothing allocated).
        """
        n = check_int("num_tokens", num_tokens, 0)
        if seq_id in self._tables:
            raise InvalidArgumentError(
                f"sequence {seq_id!r} is already allocated ({self._num_tokens[seq_id]} tokens in "
                f"{len(self._tables[seq_id])} blocks); free it first or use append()"
            )
        need = self.blocks_needed(n)
        if need > len(self._free):
            raise NoFreeBlocksError(
                f"sequence {seq_id!r} needs {need} blocks for {n} tokens (block_size {self.block_size}) "
                f"but only {len(self._free)} of {self.num_blocks} blocks are free",
                seq_id,
                need,
                len(self._free),
            )
        table = self._take(seq_id, need)
        self._tables[seq_id] = table
        self._num_tokens[seq_id] = n
        return list(table)

    def append(self, seq_id: Hashable, n: int = 1) -> list[int]:
        """Grow sequence ``seq_id`` by ``n`` tokens, taking a new block whenever the
        sequence crosses a block boundary.

        Returns:
            The block ids newly added to its table (often empty).

        Raises:
            UnknownSequenceError: no live sequence ``seq_id``.
            InvalidArgumentError: ``n < 0``.
            NoFreeBlocksError: fewer free blocks than needed (nothing changed).
        """
        need = self._new_blocks_for(seq_id, n)
        if need > len(self._free):
            cur = self._num_tokens[seq_id]
            raise NoFreeBlocksError(
                f"sequence {seq_id!r} needs {need} more blocks to grow from {cur} to {cur + n} tokens "
                f"(block_size {self.block_size}) but only {len(self._free)} of {self.num_blocks} blocks are free",
                seq_id,
                need,
                len(self._free),
            )
        new = self._take(seq_id, need)
        self._tables[seq_id].extend(new)
        self._num_tokens[seq_id] += n
        return new

    def try_append(self, seq_id: Hashable, n: int = 1) -> bool:
        """:meth:`append` when the free blocks allow it, else nothing (the scheduler's
        ``can_append`` + ``append`` in one look-up).

        Returns:
            Whether the sequence grew.

        Raises:
            UnknownSequenceError: no live sequence ``seq_id``.
            InvalidArgumentError: ``n < 0``.
        """
        try:  # _table, inline (the per-step call)
            table = self._tables[seq_id]
        except (KeyError, TypeError):
            table = self._table(seq_id)  # raises
        total = self._num_tokens[seq_id] + (n if type(n) is int and n >= 0 else check_int("n", n, 0))
        need = -(-total // self.block_size) - len(table)
        if need > len(self._free):
            return False
        if need > 0:
            table.extend(self._take(seq_id, need))
        self._num_tokens[seq_id] = total
        return True

    def free(self, seq_id: Hashable) -> int:
        """Release all blocks of sequence ``seq_id`` (it finished or was preempted); the id
        is forgotten and may be allocated again.

        Returns:
            The number of blocks returned to the free list.

        Raises:
            UnknownSequenceError: no live sequence ``seq_id`` (e.g. freed twice).
        """
        table = self._table(seq_id)
        for b in table:
            if self._owner[b] is _FREE:  # pragma: no cover - would be an internal bug
                raise AssertionError(f"block {b} of sequence {seq_id!r} is already free")
            self._owner[b] = _FREE
        self._free.extend(table)
        del self._tables[seq_id]
        del self._num_tokens[seq_id]
        return len(table)

    def block_table(self, seq_id: Hashable) -> list[int]:
        """Block ids of sequence ``seq_id`` in token order (a copy).

        Raises:
            UnknownSequenceError: no live sequence ``seq_id``.
        """
        try:  # _table, inline (the per-step call)
            return list(self._tables[seq_id])
        except (KeyError, TypeError):
            return list(self._table(seq_id))  # raises

    def num_tokens(self, seq_id: Hashable) -> int:
        """Tokens with reserved slots in sequence ``seq_id``.

        Raises:
            UnknownSequenceError: no live sequence ``seq_id``.
        """
        self._table(seq_id)
        return self._num_tokens[seq_id]

    def slot_mapping(self, seq_id: Hashable, start: int, count: int) -> list[int]:
        """Slots of tokens ``start .. start + count - 1`` of sequence ``seq_id``:
        ``block_table[pos // block_size] * block_size + pos % block_size``.

        Raises:
            UnknownSequenceError: no live sequence ``seq_id``.
            InvalidArgumentError: the range is negative or beyond the sequence's
                ``num_tokens``.
        """
        table = self._table(seq_id)
        start = check_int("start", start, 0)
        count = check_int("count", count, 0)
        if start + count > self._num_tokens[seq_id]:
            raise InvalidArgumentError(
                f"tokens {start}..{start + count - 1} of sequence {seq_id!r} are beyond its {self._num_tokens[seq_id]} allocated tokens"
            )
        bs = self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, start + count)]

    def seq_lens(self, seq_ids: Iterable[Hashable]) -> np.ndarray:
        """int32 ``[len(seq_ids)]``: each sequence's ``num_tokens``.

        Raises:
            UnknownSequenceError: an id is not live.
        """
        return np.array([self.num_tokens(s) for s in seq_ids], dtype=np.int32)

    def check_invariants(self) -> None:
        """Verify the bookkeeping; cheap enough for tests and debug builds (O(num_blocks)).

        Raises:
            AssertionError: a block is shared, leaked, free twice or mis-owned, or a table
                has the wrong length for its ``num_tokens``.
        """
        seen: dict[int, Hashable] = {}
        for sid, table in self._tables.items():
            if len(table) != self.blocks_needed(self._num_tokens[sid]):
                raise AssertionError(f"sequence {sid!r} has {len(table)} blocks for {self._num_tokens[sid]} tokens (block_size {self.block_size})")
            for b in table:
                if b in seen:
                    raise AssertionError(f"block {b} belongs to sequences {seen[b]!r} and {sid!r}")
                seen[b] = sid
                if self._owner[b] is _FREE or self._owner[b] != sid:
                    raise AssertionError(f"block {b} of sequence {sid!r} is recorded as owned by {self._owner[b]!r}")
        free = set(self._free)
        if len(free) != len(self._free):
            raise AssertionError("a block is on the free list twice")
        if free & seen.keys():
            raise AssertionError(f"blocks {sorted(free & seen.keys())} are both free and owned")
        if len(free) + len(seen) != self.num_blocks:
            raise AssertionError(f"{len(free)} free + {len(seen)} used != {self.num_blocks} blocks (leak)")
        for b in free:
            if self._owner[b] is not _FREE:
                raise AssertionError(f"free block {b} is recorded as owned by {self._owner[b]!r}")

    def __repr__(self) -> str:
        return f"BlockManager(num_blocks={self.num_blocks}, block_size={self.block_size}, free={self.num_free_blocks}, sequences={len(self._tables)})"

    # ---- internals ------------------------------------------------------------------

    def _table(self, seq_id: Hashable) -> list[int]:
        try:
            return self._tables[seq_id]
        except (KeyError, TypeError):
            raise UnknownSequenceError(f"no live sequence {seq_id!r} in the KV cache block manager") from None

    def _new_blocks_for(self, seq_id: Hashable, n: int) -> int:
        table = self._table(seq_id)
        n = check_int("n", n, 0)
        return self.blocks_needed(self._num_tokens[seq_id] + n) - len(table)

    def _take(self, seq_id: Hashable, count: int) -> list[int]:
        blocks = [self._free.popleft() for _ in range(count)]
        for b in blocks:
            self._owner[b] = seq_id
        return blocks
