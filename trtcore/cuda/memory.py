"""Memory planner: tensor lifetimes -> offsets in one activation block.

Each buffer (an activation with memory of its own, a plugin's workspace, the GEMM workspace)
is live from the step that writes it first to the step that reads it last (a view's readers
count as readers of the buffer it views, and the readers of a copy the runtime may skip --
materialize's copy-if-needed -- as readers of its source too: trtcore.cuda.builder). Buffers
are placed greedily by size, largest first, each at the lowest aligned offset where it overlaps
no already placed buffer whose lifetime intersects its own (the "greedy by size" strategy of
TensorFlow Lite's and TensorRT's planners). Sizes are those at the optimization profile's
largest shapes, so one block serves every shape of the profile;
``ICudaEngine.device_memory_size_v2`` is the block's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InvalidArgumentError

#: byte alignment of every buffer (cuBLAS and vectorized kernels want 16; 256 matches cudaMalloc)
ALIGNMENT = 256


@dataclass(frozen=True)
class Buffer:
    """A buffer to place: ``name``, ``size`` in bytes, live over steps ``[first, last]``."""

    name: str
    size: int
    first: int
    last: int

    def overlaps_in_time(self, other: Buffer) -> bool:
        """Whether the two lifetimes share a step."""
        return self.first <= other.last and other.first <= self.last


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def plan(buffers: Sequence[Buffer]) -> tuple[dict[str, int], int]:
    """Offsets (bytes, multiples of :data:`ALIGNMENT`) for ``buffers`` and the block size.

    Raises:
        InvalidArgumentError: a buffer with a negative size, ``first > last`` or a repeated name.
    """
    seen: set[str] = set()
    for b in buffers:
        if b.size < 0 or b.first > b.last or b.name in seen:
            raise InvalidArgumentError(f"bad buffer {b!r}: need size >= 0, first <= last and a unique name")
        seen.add(b.name)
    order = sorted(buffers, key=lambda b: (-b.size, b.first, b.name))
    placed: list[tuple[Buffer, int]] = []
    offsets: dict[str, int] = {}
    total = 0
    for b in order:
        size = _align(max(b.size, 1))
        busy = sorted((off, off + _align(max(o.size, 1))) for o, off in placed if o.overlaps_in_time(b))
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append((b, offset))
        offsets[b.name] = offset
        total = max(total, offset + size)
    return offsets, total
