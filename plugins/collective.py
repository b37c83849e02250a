"""Collectives of a tensor-parallel group: the ``trtcore_collective`` plugin (all-reduce, all-gather).

One plugin, two operations, as NCCL defines them (NCCL User Guide, "Collective Operations"):

* ``all_reduce``: every rank's output is the elementwise sum of all ranks' inputs (same shape);
* ``all_gather``: every rank's output is the ranks' inputs concatenated along the first axis,
  rank-major (``[world_size * d0, d1, ...]``; as ``ncclAllGather`` and TensorRT's
  ``IDistCollectiveLayer`` ``ALL_GATHER``).

Where it runs:

* on the GPU (:meth:`CollectivePlugin.enqueue`): NCCL through CuPy's bindings
  (``cupy.cuda.nccl``, NCCL from the ``nvidia-nccl-cu13`` wheel), on TensorRT's stream, so it is
  capturable in a CUDA graph; the communicator of the plugin's ``group`` is registered once per
  process with :func:`register_group` (an :class:`NcclGroup`). NVLink multicast (NVLS) is kept
  off: ``NCCL_NVLS_ENABLE=0`` is set before a communicator is made. Nothing here imports CuPy
  or NCCL until a communicator is made, and no kernel is compiled (no NVRTC);
* on the reference backend (:meth:`CollectivePlugin.reference`): a :class:`SimulatedGroup` of
  ``world_size`` ranks in one process, each rank's network run in its own thread (the ranks'
  networks are interpreted layer by layer side by side); a collective waits until every rank
  has handed in its tensor, then each rank computes the same result from the same tensors in
  rank order, so it is exact, deterministic, and equal on every rank.

Numerical contract of ``all_reduce``: the sum is accumulated in float32 in rank order
(``((x0 + x1) + x2) + ...``) and rounded once to the I/O dtype (NCCL's ring sums in the I/O
dtype, in an order that depends on the topology: for float32 both are float32 sums).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import ml_dtypes
import numpy as np

from trtcore.dtypes import NCCL_DTYPE_CODES

from .base import DeviceTensor, Dim, Plugin, PluginError

__all__ = ["COLLECTIVES", "CollectivePlugin", "NcclGroup", "SimulatedGroup", "communicator", "register_group", "unregister_group"]

#: the operations of :class:`CollectivePlugin`
COLLECTIVES = ("all_reduce", "all_gather")

_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))

# ncclDataType_t (trtcore.dtypes' table) and ncclRedOp_t (nccl.h) values; CuPy's bindings take ints
_NCCL_DTYPES = NCCL_DTYPE_CODES
_NCCL_SUM = 0


class Communicator(Protocol):
    """What a group gives the plugin: the reference path calls :meth:`reference`, the GPU
    path :meth:`enqueue`."""

    world_size: int

    def reference(self, collective: str, rank: int, x: np.ndarray) -> np.ndarray: ...

    def enqueue(self, collective: str, rank: int, x: DeviceTensor, out: DeviceTensor, stream: int) -> None: ...


_GROUPS: dict[str, Communicator] = {}
_GROUPS_LOCK = threading.Lock()


def register_group(name: str, group: Communicator) -> None:
    """Make ``group`` the communicator of the plugins whose ``group`` field is ``name`` in
    this process (replacing any before)."""
    with _GROUPS_LOCK:
        _GROUPS[name] = group


def unregister_group(name: str) -> None:
    """Forget the group ``name`` (nothing if unknown)."""
    with _GROUPS_LOCK:
        _GROUPS.pop(name, None)


def communicator(name: str) -> Communicator:
    """The communicator registered as ``name``.

    Raises:
        PluginError: none is registered (the message names the group).
    """
    with _GROUPS_LOCK:
        group = _GROUPS.get(name)
    if group is None:
        raise PluginError(
            f"no communicator is registered for the collective group {name!r} in this process; "
            "register a SimulatedGroup (reference backend) or an NcclGroup (GPU) with register_group"
        )
    return group


class SimulatedGroup:
    """``world_size`` ranks in one process (the reference backend's tensor parallelism).

    Each rank calls :meth:`reference` from its own thread, in the same order of collectives
    (the ranks run the same network). A call waits at a barrier until all ranks have handed
    in their tensor, computes the result from the ranks' tensors in rank order (the same
    arithmetic on every rank), and waits again before the slots are reused.

    Args:
        world_size: ranks, >= 1.
        timeout: seconds a rank waits for the others before the group is broken.

    Raises (from :meth:`reference`):
        threading.BrokenBarrierError: another rank failed (:meth:`abort`) or timed out.
        PluginError: the ranks handed in tensors of different shapes or dtypes.
    """

    def __init__(self, world_size: int, timeout: float = 600.0):
        if world_size < 1:
            raise PluginError(f"SimulatedGroup: world_size must be >= 1, got {world_size}")
        self.world_size = int(world_size)
        self._barrier = threading.Barrier(self.world_size, timeout=timeout)
        self._slots: list[np.ndarray | None] = [None] * self.world_size

    def abort(self) -> None:
        """Break the group: ranks waiting in a collective raise ``BrokenBarrierError``."""
        self._barrier.abort()

    def reset(self) -> None:
        """Make a broken group usable again (after every rank has returned)."""
        self._barrier.reset()
        self._slots = [None] * self.world_size

    def reference(self, collective: str, rank: int, x: np.ndarray) -> np.ndarray:
        """Rank ``rank``'s result of ``collective`` over every rank's ``x``."""
        self._slots[rank] = x
        self._barrier.wait()
        try:
            parts = list(self._slots)
            if any(p is None or p.shape != x.shape or p.dtype != x.dtype for p in parts):
                raise PluginError(
                    f"{collective}: the ranks handed in different tensors: {[None if p is None else (p.shape, str(p.dtype)) for p in parts]}"
                )
            out = _combine(collective, parts)  # type: ignore[arg-type]
        finally:
            self._barrier.wait()  # every rank has read the slots before any rank refills them
        return out

    def enqueue(self, collective: str, rank: int, x: DeviceTensor, out: DeviceTensor, stream: int) -> None:
        raise PluginError("SimulatedGroup runs on the reference backend only; register an NcclGroup for the GPU")


def _combine(collective: str, parts: Sequence[np.ndarray]) -> np.ndarray:
    if collective == "all_gather":
        return np.concatenate(parts, axis=0)
    acc = np.array(parts[0], dtype=np.float32)
    for p in parts[1:]:
        acc += p.astype(np.float32)
    return acc.astype(parts[0].dtype)


class NcclGroup:
    """One rank's NCCL communicator (``cupy.cuda.nccl.NcclCommunicator``) in this process.

    Args:
        world_size: ranks in the group.
        rank: this process's rank.
        unique_id: the group's id from :meth:`unique_id` on rank 0, shared with every rank
            (e.g. through the process launcher).

    ``NCCL_NVLS_ENABLE`` is set to ``0`` first (NVLink multicast stays off). Needs CuPy with
    NCCL (``nvidia-nccl-cu13``) and a GPU; the current CUDA device is the rank's.

    Raises:
        PluginError: CuPy's NCCL bindings are not available.
    """

    def __init__(self, world_size: int, rank: int, unique_id: Any):
        nccl = _nccl()
        self.world_size = int(world_size)
        self.rank = int(rank)
        self.comm = nccl.NcclCommunicator(self.world_size, unique_id, self.rank)

    @classmethod
    def from_communicator(cls, comm: Any, world_size: int, rank: int) -> NcclGroup:
        """Wrap an existing ``NcclCommunicator`` (e.g. one of ``NcclCommunicator.initAll(devices)``,
        several ranks driven from one process)."""
        group = cls.__new__(cls)
        group.world_size, group.rank, group.comm = int(world_size), int(rank), comm
        return group

    @staticmethod
    def unique_id() -> Any:
        """A new group id (``ncclGetUniqueId``), made on rank 0 and handed to every rank."""
        return _nccl().get_unique_id()

    def reference(self, collective: str, rank: int, x: np.ndarray) -> np.ndarray:
        raise PluginError("NcclGroup runs on the GPU only; the reference backend simulates the ranks with a SimulatedGroup")

    def enqueue(self, collective: str, rank: int, x: DeviceTensor, out: DeviceTensor, stream: int) -> None:
        """``ncclAllReduce`` (sum) or ``ncclAllGather`` of ``x`` into ``out`` on ``stream``."""
        dt = _NCCL_DTYPES.get(np.dtype(x.dtype))
        if dt is None:
            raise PluginError(f"{collective}: NCCL dtype for {x.dtype} unknown; expected one of {[str(d) for d in _NCCL_DTYPES]}")
        if collective == "all_reduce":
            self.comm.allReduce(x.ptr, out.ptr, x.size, dt, _NCCL_SUM, stream)
        else:
            self.comm.allGather(x.ptr, out.ptr, x.size, dt, stream)


def _nccl() -> Any:
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off (read by NCCL when a communicator is made)
    try:
        from cupy.cuda import nccl
    except ImportError as e:
        raise PluginError(f"the collective plugin on the GPU needs CuPy with NCCL (pip install cupy-cuda13x nvidia-nccl-cu13): {e}") from None
    if not getattr(nccl, "available", True):
        raise PluginError("CuPy was built without NCCL; install nvidia-nccl-cu13")
    return nccl


@dataclass
class CollectivePlugin(Plugin):
    """All-reduce (sum) or all-gather over a tensor-parallel group (plugin
    ``trtcore_collective``, version 1, namespace ``trtcore``).

    Input: ``x`` of any shape, float32, float16 or bfloat16. Output: ``all_reduce``: the shape
    and dtype of ``x``; ``all_gather``: ``[world_size * x.shape[0], *x.shape[1:]]``, rank-major.

    Fields:
        collective: ``"all_reduce"`` or ``"all_gather"``.
        group: the name of the communicator (:func:`register_group`) in the running process.
        rank: this network's rank in the group.
        world_size: ranks in the group.
    """

    plugin_name: ClassVar[str] = "trtcore_collective"
    plugin_version: ClassVar[str] = "1"
    num_outputs: ClassVar[int] = 1

    collective: str = "all_reduce"
    group: str = "tp"
    rank: int = 0
    world_size: int = 1

    def validate(self) -> None:
        if self.collective not in COLLECTIVES:
            raise PluginError(f"CollectivePlugin: collective {self.collective!r} is not one of {COLLECTIVES}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise PluginError(f"CollectivePlugin: rank {self.rank} must lie in [0, world_size={self.world_size})")
        if not self.group:
            raise PluginError("CollectivePlugin: group must be a non-empty name")

    def output_dtypes(self, input_dtypes: Sequence[np.dtype]) -> list[np.dtype]:
        return [np.dtype(input_dtypes[0])]

    def output_shapes(self, input_shapes: Sequence[Sequence[Dim]]) -> list[list[Dim]]:
        x = list(input_shapes[0])
        if self.collective == "all_gather":
            x[0] = x[0] * self.world_size
        return [x]

    def supports(self, pos: int, dtypes: Sequence[np.dtype], num_inputs: int) -> bool:
        return np.dtype(dtypes[pos]) in _DTYPES and (pos == 0 or dtypes[pos] == dtypes[0])

    def enqueue(self, inputs: Sequence[DeviceTensor], outputs: Sequence[DeviceTensor], workspace: int, stream: int) -> None:
        """The NCCL collective on ``stream`` (the group's :class:`NcclGroup`)."""
        communicator(self.group).enqueue(self.collective, self.rank, inputs[0], outputs[0], stream)

    def reference(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """The collective over the group's ranks (a :class:`SimulatedGroup`); one rank: a copy."""
        x = np.asarray(inputs[0])
        if np.dtype(x.dtype) not in _DTYPES:
            raise PluginError(f"CollectivePlugin: input dtype {x.dtype} is not one of {[str(d) for d in _DTYPES]}")
        if self.world_size == 1:
            return [x.copy()]
        return [communicator(self.group).reference(self.collective, self.rank, x)]
