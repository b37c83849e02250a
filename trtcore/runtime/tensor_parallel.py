"""Tensor parallelism simulated in one process: ``tensor_parallel_size`` rank networks run
side by side on the reference backend, their collectives exchanged in memory.

:class:`TensorParallelExecutor` looks like one executor to the step loop: it takes the feeds
of the whole model, whose KV cache holds every rank's KV heads side by side on the head axis
(rank ``r``'s ``num_kv_heads / tp_size`` heads, or its one replicated head, at
``[r * local, (r + 1) * local)``), hands each rank its view of the cache, runs the ranks in one
thread each, and returns rank 0's logits (every rank's logits are the same, all-gathered) and
the ranks' updated caches joined again. The collectives of the rank networks
(:class:`trtcore.plugins.collective.CollectivePlugin`) meet in a
:class:`~trtcore.plugins.collective.SimulatedGroup`, which makes them exact and
deterministic: each rank sums the same tensors in rank order.

On GPUs each rank is a process with its own GPU and an NCCL communicator
(:class:`~trtcore.plugins.collective.NcclGroup`); that launcher is not written yet.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .. import kv_modes
from ..errors import InvalidArgumentError
from ..kv_modes import KVMode
from ..plugins.collective import SimulatedGroup, register_group, unregister_group
from .executor import Executor

__all__ = ["TensorParallelExecutor", "new_group_name"]

_COUNTER = itertools.count()


def new_group_name() -> str:
    """A group name not used before in this process (``"tp-sim-<n>"``)."""
    return f"tp-sim-{next(_COUNTER)}"


class TensorParallelExecutor(Executor):
    """Runs the rank networks of one model as one executor (see the module docstring).

    Args:
        ranks: one executor per rank, rank order, each built from a rank network whose
            collectives name ``group``.
        group: the collective plugin's group name of those networks; a
            :class:`~trtcore.plugins.collective.SimulatedGroup` is registered under it until
            :meth:`close`.
        mode: the whole model's KV cache contract (all ranks' KV heads); its cache inputs
            are split on the head axis (paged pool: axis 3; per-layer caches: axis 1). None:
            a network without a KV cache (every rank gets the same feeds).
        local_kv_heads: KV heads per rank.

    Raises:
        InvalidArgumentError: no ranks, or a mode whose cache cannot be split that way.
    """

    def __init__(self, ranks: Sequence[Executor], group: str, mode: KVMode | None = None, local_kv_heads: int = 1):
        if not ranks:
            raise InvalidArgumentError("TensorParallelExecutor needs at least one rank executor")
        if mode is not None and mode.num_kv_heads != local_kv_heads * len(ranks):
            raise InvalidArgumentError(f"the KV cache holds {mode.num_kv_heads} heads, expected {len(ranks)} ranks x {local_kv_heads}")
        self.ranks = list(ranks)
        self.group_name = group
        self.group = SimulatedGroup(len(self.ranks))
        register_group(group, self.group)
        self.local = int(local_kv_heads)
        self.input_names = list(self.ranks[0].input_names)
        self.output_names = list(self.ranks[0].output_names)
        # the head axis of every cache input / output
        self._split: dict[str, int] = {}
        self._join: dict[str, int] = {}
        if mode is not None:
            self._split = {kv_modes.KV_CACHE_POOL: 3} if mode.kv_cache == "paged" else {s.name: 1 for s in mode.cache_inputs}
            self._join = {s.name: 1 for s in mode.cache_outputs}
        self._pool = ThreadPoolExecutor(max_workers=len(self.ranks), thread_name_prefix="tp-rank")
        self._lock = threading.Lock()

    @property
    def tp_size(self) -> int:
        """Ranks."""
        return len(self.ranks)

    def _rank_feeds(self, feeds: Mapping[str, Any], rank: int) -> dict[str, Any]:
        out = dict(feeds)
        for name, axis in self._split.items():
            if name in feeds:
                a = feeds[name]
                index = [slice(None)] * a.ndim
                index[axis] = slice(rank * self.local, (rank + 1) * self.local)
                out[name] = a[tuple(index)]  # a view: a paged pool is written in place through it
        return out

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """One step of every rank; rank 0's outputs, the caches joined on the head axis.

        Raises:
            whatever a rank raised (the first, in rank order); the other ranks are released
            from their collectives first.
        """
        with self._lock:  # one step at a time: the group's slots are shared
            futures = [self._pool.submit(self._run_rank, r, feeds) for r in range(self.tp_size)]
            results, errors = [], []
            for f in futures:
                try:
                    results.append(f.result())
                except BaseException as e:  # noqa: BLE001 - re-raised below
                    errors.append(e)
            if errors:
                self.group.reset()
                real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
                raise (real or errors)[0]
        out = dict(results[0])
        for name, axis in self._join.items():
            out[name] = np.concatenate([np.asarray(r[name]) for r in results], axis=axis)
        return out

    def _run_rank(self, rank: int, feeds: Mapping[str, Any]) -> dict[str, Any]:
        try:
            return self.ranks[rank].run(self._rank_feeds(feeds, rank))
        except BaseException:
            self.group.abort()  # the other ranks stop waiting in their collectives
            raise

    def to_host(self, value: Any, name: str | None = None) -> Any:
        return self.ranks[0].to_host(value, name)

    def close(self) -> None:
        """Close the ranks' executors, stop the threads, unregister the group (safe twice)."""
        for r in self.ranks:
            r.close()
        self._pool.shutdown(wait=True)
        unregister_group(self.group_name)
