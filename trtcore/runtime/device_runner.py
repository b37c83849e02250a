"""The device executor: one paged-KV engine on device buffers, for every backend with TensorRT's
runtime API (``tensorrt``, ``cuda``; the reference backend through a stand-in device for tests).

:class:`DeviceRunner` owns, from start-up to close (:meth:`DeviceRunner.memory_report` lists
them, and start-up logs them):

* **weights**: inside the engine (uploaded when it is deserialized / first loaded);
* **activations**: one block of ``engine.device_memory_size_v2`` bytes, given to every
  execution context with ``set_device_memory`` (the contexts never run at the same time: one
  stream);
* **kv_cache**: the paged pool ``[num_layers, num_blocks, 2, num_kv_heads, block_size,
  head_dim]``, bound once (``set_tensor_address``) and written in place by the attention
  plugin; sized from ``gpu_memory_utilization`` (like vLLM's: the fraction of the device's
  memory this process may use; the pool gets what is left of it after the rest, at most the
  blocks ``max_batch_size`` sequences of ``max_seq_len`` tokens can hold at once) unless
  ``kv_cache_memory`` (bytes) or ``num_blocks`` is given. Its last block is a **scratch block** no sequence owns: padding
  rows read and write only it (below);
* **staging**: a pinned host buffer and a device buffer of the same size holding every int32
  input of a step (token ids, positions, block tables, ``seq_lens``, ``query_start_loc``,
  ``last_token_ids``, ``rope_seq_lens``) at the offsets of :class:`StepLayout`; each step writes
  the host side and copies the used bytes with one ``cudaMemcpyAsync``;
* **logits**: ``float32 [max_batch_size, vocab_size]`` on the device (the engine's output,
  bound once) and pinned on the host (the rows sampled this step are copied back).

Nothing is allocated after start-up: a step writes into these buffers only.

**Shape buckets and CUDA graphs.** A decode step (every sequence feeds its one last token) of
``n`` sequences is padded to the smallest bucket ``>= n`` of :func:`batch_buckets` (1, 2, 4, 8,
..., ``max_batch_size``). Each bucket has its own execution context whose input shapes and
tensor addresses are set once, warmed up once eagerly, then captured into CUDA graphs (TensorRT's
rules for ``enqueueV3`` capture: a warm-up after the shapes are set, a non-default stream, one
execution context per bucket, whose graphs never run at the same time: one stream); a step
replays one after writing its inputs into the pinned buffers the graph copies from. Padding rows (:func:`fill_step`) have one token (id 0 at position 0), ``seq_lens`` 1,
and the block table ``[scratch, -1, -1, ...]``: the attention kernel writes their key/value
into the scratch block's slot 0 and reads only that slot (entries past a sequence's last block
are never read; entries ``< 0`` are never written and read as zeros in the kernel, and the
NumPy reference refuses them among the blocks a sequence uses, hence the scratch block), so
they touch nothing of the real sequences. Prefill and mixed steps run eagerly on a context of
their own (shapes set per step). ``enforce_eager=True`` runs decode steps eagerly too, still
padded to their bucket.

**Sampling** on the device (:class:`~trtcore.runtime.request_sampler.RequestSampler` over the
batched sampling kernel, :class:`~trtcore.runtime.sampling_gpu.GpuSampler`): right behind the
engine, the kernel samples the logits rows of the sequences that produce a token and their ids
(16 bytes a row, plus the top-k logprobs) are copied to pinned memory; :meth:`~DeviceRunner.sample`
waits for that copy only. The logits stay on the device (:meth:`~DeviceRunner.logits_rows`
copies them for tests and debugging).

**One graph per decode step and host side.** Each bucket has two graphs, one per host side
(pinned staging buffer and pinned sampler buffers; steps alternate sides, so a step is staged
while the step before may still be in flight, asynchronous scheduling): the copy of that side's
staging to the device, ``sampling_feed_tokens`` (a token still in flight, staged as ``-(row + 1)``,
becomes what the step before sampled for that row), the engine, and the sampling of that side's
records with its copies back and done event. A decode step writes its inputs and its sampling
records into the side's pinned buffers and launches that side's graph: one CUDA call.

**Host work per step**: no Python per layer -- a decode step is the staging of its inputs and
sampling records and one graph launch; an eager step (prefill, mixed) copies its staging, sets
the shapes that changed, binds the inputs, makes one ``execute_async_v3`` call (the cuda engine
replays its prepared launch list) and enqueues the sampling.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import numpy as np

from ..dtypes import storage_dtype
from ..errors import InvalidArgumentError, TrtcoreError
from ..kv_modes import (
    BLOCK_TABLES,
    INPUT_IDS,
    KV_CACHE_POOL,
    LAST_TOKEN_IDS,
    LOGITS,
    POSITION_IDS,
    QUERY_START_LOC,
    ROPE_SEQ_LENS,
    SEQ_LENS,
    PagedKV,
    StepBatch,
)
from .device_memory import ALIGNMENT, DeviceAPI, format_bytes
from .request import Request
from .request_sampler import RequestSampler, SamplingStep, make_sampler_kernel

__all__ = [
    "PAD_BLOCK_ID",
    "PAD_ROW",
    "DeviceRunner",
    "DeviceRunnerError",
    "StepLayout",
    "batch_buckets",
    "bucket_for",
    "fill_decode",
    "fill_step",
    "kv_pool_blocks",
]

_log = logging.getLogger("trtcore.runtime")

#: block-table entry of the columns a sequence does not use (never read, never written)
PAD_BLOCK_ID = -1
_I32 = np.dtype(np.int32)


class DeviceRunnerError(TrtcoreError, RuntimeError):
    """The engine cannot be driven as a paged-KV engine on device buffers (missing inputs,
    failed binding, not enough memory for the KV pool)."""


def batch_buckets(max_batch_size: int) -> tuple[int, ...]:
    """The batch sizes decode steps are padded to: powers of two below ``max_batch_size``,
    then ``max_batch_size`` itself (``8 -> (1, 2, 4, 8)``, ``12 -> (1, 2, 4, 8, 12)``).

    Raises:
        InvalidArgumentError: ``max_batch_size < 1``.
    """
    if max_batch_size < 1:
        raise InvalidArgumentError(f"max_batch_size must be >= 1, got {max_batch_size}")
    out = []
    b = 1
    while b < max_batch_size:
        out.append(b)
        b *= 2
    out.append(int(max_batch_size))
    return tuple(out)


def bucket_for(num_seqs: int, buckets: Sequence[int]) -> int:
    """The smallest bucket ``>= num_seqs``.

    Raises:
        InvalidArgumentError: ``num_seqs`` is above the largest bucket or below 1.
    """
    for b in buckets:
        if b >= num_seqs >= 1:
            return b
    raise InvalidArgumentError(f"{num_seqs} sequences fit no batch bucket of {tuple(buckets)}")


@dataclass(frozen=True)
class StepLayout:
    """Where each int32 input of a step of ``num_tokens`` packed tokens and ``num_seqs``
    sequences lies in the staging buffers: ``fields[name] = (byte offset, shape)``, each field
    aligned to 64 bytes; ``nbytes`` the bytes to copy."""

    num_tokens: int
    num_seqs: int
    max_blocks: int
    fields: dict[str, tuple[int, tuple[int, ...]]]
    nbytes: int

    @classmethod
    def make(cls, num_tokens: int, num_seqs: int, max_blocks: int, rope_seq_lens: bool) -> StepLayout:
        """The layout for these sizes (inputs in the paged mode's order)."""
        T, B = int(num_tokens), int(num_seqs)
        shapes: list[tuple[str, tuple[int, ...]]] = [
            (INPUT_IDS, (T,)),
            (POSITION_IDS, (T,)),
            (BLOCK_TABLES, (B, int(max_blocks))),
            (SEQ_LENS, (B,)),
            (QUERY_START_LOC, (B + 1,)),
            (LAST_TOKEN_IDS, (B,)),
        ]
        if rope_seq_lens:
            shapes.append((ROPE_SEQ_LENS, (T,)))
        fields = {}
        offset = 0
        for name, shape in shapes:
            fields[name] = (offset, shape)
            offset += -(-int(np.prod(shape)) * 4 // ALIGNMENT) * ALIGNMENT
        return cls(T, B, int(max_blocks), fields, offset)

    def views(self, buffer: np.ndarray) -> dict[str, np.ndarray]:
        """int32 views of ``buffer`` (uint8, at least :attr:`nbytes`) for every field."""
        out = {}
        for name, (offset, shape) in self.fields.items():
            n = int(np.prod(shape))
            out[name] = buffer[offset : offset + 4 * n].view(_I32).reshape(shape)
        return out


def fill_step(views: dict[str, np.ndarray], batch: StepBatch, scratch_block: int, fed_rows: dict[Hashable, int] | None = None) -> None:
    """Write the inputs of ``batch`` into the int32 ``views`` of a :class:`StepLayout` whose
    sizes may exceed the batch's: the extra sequences are **padding rows** (one token, id 0 at
    position 0, ``seq_lens`` 1, block table ``[scratch_block, -1, ...]``), the extra tokens
    belong to them; a real sequence's unused block-table columns are :data:`PAD_BLOCK_ID`.

    A token still in flight (:data:`~trtcore.runtime.scheduler.PLACEHOLDER_TOKEN_ID`, negative)
    is staged as ``-(row + 1)``, ``row = fed_rows[request_id]`` its request's row in the
    previous step's sampling, for the device to replace (:meth:`GpuSampler.feed_tokens
    <trtcore.runtime.sampling_gpu.GpuSampler.feed_tokens>`).

    Raises:
        InvalidArgumentError: the batch has more tokens or sequences than the layout, or the
            layout's padding sequences have no token each (``T - tokens < B - seqs``).
        KeyError: a placeholder for a request not in ``fed_rows``.
    """
    seqs = batch.seqs
    ids, pos, bt = views[INPUT_IDS], views[POSITION_IDS], views[BLOCK_TABLES]
    sl, qsl, last = views[SEQ_LENS], views[QUERY_START_LOC], views[LAST_TOKEN_IDS]
    T, B = ids.shape[0], sl.shape[0]
    n = len(seqs)
    lens = [len(s.token_ids) for s in seqs]
    t = sum(lens)
    if n > B or t > T or T - t != B - n:
        raise InvalidArgumentError(
            f"a step of {n} sequences / {t} tokens does not pad to a layout of {B} sequences / {T} tokens (one token per padding row)"
        )
    # whole-array writes from flat lists: one conversion per field, not one per sequence
    qsl[0] = 0
    if n:
        np.cumsum(lens, out=qsl[1 : n + 1])
        if fed_rows:
            ids[:t] = [tok if tok >= 0 else ~fed_rows[s.request_id] for s in seqs for tok in s.token_ids]  # type: ignore[attr-defined]
        else:
            ids[:t] = [tok for s in seqs for tok in s.token_ids]
        pos[:t] = [p for s in seqs for p in s.positions]
        sl[:n] = [s.num_cached_tokens + k for s, k in zip(seqs, lens)]
    qsl[n + 1 :] = t + np.arange(1, B - n + 1, dtype=np.int32)
    bt.fill(PAD_BLOCK_ID)
    bt[n:, 0] = scratch_block
    for i, s in enumerate(seqs):
        table = s.block_table  # type: ignore[attr-defined]
        bt[i, : len(table)] = table
    ids[t:] = 0
    pos[t:] = 0
    sl[n:] = 1
    np.subtract(qsl[1:], 1, out=last)
    if ROPE_SEQ_LENS in views:  # each token's sequence length (dynamic RoPE)
        views[ROPE_SEQ_LENS][:] = np.repeat(sl, np.diff(qsl))


#: a block-table row that holds a padding row (:func:`fill_decode`'s ``rows``)
PAD_ROW = ("padding",)


def fill_decode(
    views: dict[str, np.ndarray],
    seqs: Sequence[Any],
    scratch_block: int,
    fed_rows: dict[Hashable, int] | None = None,
    rows: list[Any] | None = None,
) -> None:
    """:func:`fill_step` for a decode step (every sequence feeds one token) on a decode layout
    (one token per row, ``T == B``) that :func:`fill_step` filled last in this staging buffer:
    there ``query_start_loc`` is ``0..B`` and ``last_token_ids`` ``0..B-1`` whatever the
    batch, so only the per-row fields are written (the host's share of a graphed step).

    ``rows``: what each block-table row of this buffer holds, ``(request_id, blocks)`` or
    :data:`PAD_ROW` (None: unknown, every row is written); a row that already holds its
    sequence's table is not written again (a table only grows, by appending, while its
    request runs; the caller forgets ``rows`` when a request may have been re-admitted, i.e.
    after any step that is not a decode), and ``rows`` is updated.

    Raises:
        InvalidArgumentError: more sequences than the layout's rows.
    """
    ids, pos, bt, sl = views[INPUT_IDS], views[POSITION_IDS], views[BLOCK_TABLES], views[SEQ_LENS]
    n, B = len(seqs), sl.shape[0]
    if n > B:
        raise InvalidArgumentError(f"a decode step of {n} sequences does not fit a layout of {B} rows")
    if n <= 8:  # a few rows: scalar writes (a list into a NumPy slice costs a microsecond a field)
        for i, s in enumerate(seqs):
            t = s.token_ids[0]
            if t < 0 and fed_rows:
                t = ~fed_rows[s.request_id]
            ids[i] = t
            c = s.num_cached_tokens
            pos[i] = c
            sl[i] = c + 1
    else:
        if fed_rows:
            ids[:n] = [t if (t := s.token_ids[0]) >= 0 else ~fed_rows[s.request_id] for s in seqs]
        else:
            ids[:n] = [s.token_ids[0] for s in seqs]
        cached = [s.num_cached_tokens for s in seqs]
        pos[:n] = cached
        sl[:n] = cached
        sl[:n] += 1
    if n < B:  # padding rows
        ids[n:] = 0
        pos[n:] = 0
        sl[n:] = 1
    if rows is None:
        bt.fill(PAD_BLOCK_ID)
        bt[n:, 0] = scratch_block
        for i, s in enumerate(seqs):
            table = s.block_table
            bt[i, : len(table)] = table
    else:
        for i, s in enumerate(seqs):
            table = s.block_table
            key = (s.request_id, len(table))
            if rows[i] != key:
                bt[i, : len(table)] = table
                bt[i, len(table) :] = PAD_BLOCK_ID
                rows[i] = key
        for i in range(n, B):
            if rows[i] is not PAD_ROW:
                bt[i] = PAD_BLOCK_ID
                bt[i, 0] = scratch_block
                rows[i] = PAD_ROW
    if ROPE_SEQ_LENS in views:  # each token's sequence length (dynamic RoPE): one token per row
        views[ROPE_SEQ_LENS][:] = sl


def kv_pool_blocks(block_bytes: int, free: int, total: int, gpu_memory_utilization: float, kv_cache_memory: int | None, cap: int) -> int:
    """Blocks of the KV pool (the scratch block included): ``kv_cache_memory`` bytes when
    given, else what ``gpu_memory_utilization`` of ``total`` leaves once ``total - free`` is
    used: ``free - (1 - gpu_memory_utilization) * total`` (vLLM's rule); at most ``cap``
    (the engine profile's ``max_num_blocks``).

    Raises:
        DeviceRunnerError: fewer than 2 blocks fit (the message gives the numbers).
        InvalidArgumentError: ``gpu_memory_utilization`` outside (0, 1].
    """
    if not 0 < gpu_memory_utilization <= 1:
        raise InvalidArgumentError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    budget = int(kv_cache_memory) if kv_cache_memory is not None else int(free - (1 - gpu_memory_utilization) * total)
    blocks = min(max(budget, 0) // int(block_bytes), int(cap))
    if blocks < 2:
        where = (
            f"kv_cache_memory={kv_cache_memory}"
            if kv_cache_memory is not None
            else (f"gpu_memory_utilization={gpu_memory_utilization} of {format_bytes(total)} with {format_bytes(free)} free")
        )
        raise DeviceRunnerError(
            f"the KV pool gets {format_bytes(max(budget, 0))} ({where}): fewer than 2 blocks of {format_bytes(block_bytes)}; raise it"
        )
    return blocks


@dataclass
class _Graph:
    """One decode bucket: its context, its layout and the views of each host staging buffer,
    its graphs, one per host side (empty: eager)."""

    size: int
    context: Any
    layout: StepLayout
    views: list[dict[str, np.ndarray]]
    graphs: list[Any] = field(default_factory=list)


class _InFlight(NamedTuple):
    """A step enqueued and not yet sampled: the batch, its sampling (None: no row produces
    a token)."""

    batch: Any
    sampling: SamplingStep | None


class DeviceRunner:
    """Runs the steps of a paged-KV engine on device buffers (see the module docstring).

    Args:
        engine: a deserialized ``ICudaEngine`` (``tensorrt``'s, the cuda backend's, or
            :class:`trtcore.runtime.host_engine.HostEngine` over the reference backend).
        device: the device its memory and stream live on (:class:`CudaDevice`, or
            :class:`HostDevice` with a ``HostEngine``).
        mode: the network's paged KV contract (plan bounds, pool layout, dtype).
        num_blocks: blocks of the pool, the scratch block included (None: sized from memory).
        gpu_memory_utilization: fraction of the device memory the process may use (0, 1].
        kv_cache_memory: bytes for the pool instead (overrides ``gpu_memory_utilization``).
        enforce_eager: no CUDA graphs.
        weights_bytes: device bytes the engine's weights took (for the report; measured by
            the caller around deserialization).

    Attributes:
        num_blocks: blocks the scheduler may hand out (the pool has one more, the scratch block).
        buckets: the decode batch buckets.
        num_steps / num_graph_replays: steps run, of them replayed from a graph.

    Raises:
        DeviceRunnerError: the engine lacks a paged-mode input, a binding fails, or the pool
            does not fit.
    """

    def __init__(
        self,
        engine: Any,
        device: DeviceAPI,
        mode: PagedKV,
        *,
        num_blocks: int | None = None,
        gpu_memory_utilization: float = 0.9,
        kv_cache_memory: int | None = None,
        enforce_eager: bool = False,
        weights_bytes: int = 0,
    ) -> None:
        self.engine = engine
        self.device = device
        self.mode = mode
        #: the TensorRT runtime that deserialized ``engine`` (kept alive with it), if given
        self.runtime: Any = None
        plan, config = mode.plan, mode.config
        self.vocab_size = int(config.vocab_size)
        self.max_batch_size = int(plan.max_batch_size)
        self.max_num_tokens = int(plan.max_num_tokens)
        self.max_blocks = -(-int(plan.max_seq_len) // int(plan.block_size))
        self.enforce_eager = bool(enforce_eager)
        self.buckets = batch_buckets(self.max_batch_size)
        self.num_steps = 0
        self.num_graph_replays = 0
        self._in_flight: deque[_InFlight] = deque()  # enqueued by execute(), oldest first
        self._fed_rows: dict[Hashable, int] = {}  # request id -> its row in the last sampling
        names = {engine.get_tensor_name(i) for i in range(engine.num_io_tensors)}
        wanted = {spec.name for spec in mode.inputs} | {LOGITS}
        if wanted - names:
            raise DeviceRunnerError(f"the engine lacks the paged KV mode's tensors {sorted(wanted - names)}; it has {sorted(names)}")
        self.rope_seq_lens = mode.takes_rope_seq_lens
        if device.pools.get("weights") is None and weights_bytes:
            device.pools["weights"] += int(weights_bytes)

        # activations: one block for every context (they run one after another on one stream)
        self.activation_bytes = int(getattr(engine, "device_memory_size_v2", 0))
        self.activations = device.malloc(self.activation_bytes, "activations")
        # logits, device and pinned host
        logits_bytes = self.max_batch_size * self.vocab_size * 4
        self.logits_ptr = device.malloc(logits_bytes, "logits")
        self.host_logits = device.host_alloc(logits_bytes, "logits")[:logits_bytes].view(np.float32).reshape(self.max_batch_size, self.vocab_size)
        # staging: the largest step layout, on the device and twice in pinned host memory (a
        # step is staged while the copy of the one before may still be pending)
        big = StepLayout.make(self.max_num_tokens, self.max_batch_size, self.max_blocks, self.rope_seq_lens)
        self.staging_bytes = big.nbytes
        self.host_staging = [device.host_alloc(big.nbytes, "staging") for _ in range(2)]
        self._side = 0  # the host staging buffer of the last step
        self._filled: list[Any] = [None, None]  # per side: the decode bucket filled there last (None: another layout)
        self._rows: list[list[Any]] = [[], []]  # per side: what its block-table rows hold (fill_decode)
        self.staging_ptr = device.malloc(big.nbytes, "staging")
        # the sampler's buffers (penalty counts: 5 bytes per token and slot), before the pool takes what is left
        #: the live requests' sampling state over the batched sampling kernel
        self.sampler = RequestSampler(make_sampler_kernel(device, self.max_batch_size, self.vocab_size, int(plan.max_seq_len)), self.logits_rows)
        # the KV pool: what is left
        layers, _, *rest = mode.pool_shape
        pool_dtype = storage_dtype(mode.dtype)
        block_bytes = int(layers * np.prod(rest)) * pool_dtype.itemsize
        if num_blocks is None:
            free, total = device.mem_get_info()
            # more blocks than max_batch_size full-length sequences hold are never in use at once
            cap = min(int(plan.max_num_blocks), self.max_batch_size * self.max_blocks + 1)
            num_blocks = kv_pool_blocks(block_bytes, free, total, gpu_memory_utilization, kv_cache_memory, cap)
        if not 2 <= num_blocks <= plan.max_num_blocks:
            raise DeviceRunnerError(f"num_blocks={num_blocks} must be in [2, max_num_blocks={plan.max_num_blocks}] (one is the scratch block)")
        self.pool_blocks = int(num_blocks)
        self.num_blocks = self.pool_blocks - 1
        self.scratch_block = self.pool_blocks - 1
        self.pool_shape = (layers, self.pool_blocks, *rest)
        self.pool_dtype = pool_dtype
        self.pool_ptr = device.malloc(self.pool_blocks * block_bytes, "kv_cache")
        self._zero(self.pool_ptr, self.pool_blocks * block_bytes)

        # execution contexts: one for eager steps, one per decode bucket (one per graph)
        self.eager = self._context("eager")
        self._eager_shapes: dict[str, tuple[int, ...]] = {}
        self._eager_layouts: dict[tuple[int, int], tuple[StepLayout, list[dict[str, np.ndarray]]]] = {}
        self.graphs: dict[int, _Graph] = {}
        for size in self.buckets:
            layout = StepLayout.make(size, size, self.max_blocks, self.rope_seq_lens)
            ctx = self._context(f"decode[{size}]")
            self._set_shapes(ctx, layout)
            self._bind_inputs(ctx, layout)
            self.graphs[size] = _Graph(size, ctx, layout, [layout.views(h) for h in self.host_staging])
        #: the bucket's graph of a decode of ``n`` sequences, by ``n`` (1..max_batch_size)
        self._decode_graphs = [None, *(self.graphs[bucket_for(k, self.buckets)] for k in range(1, self.max_batch_size + 1))]
        self._capture_all()
        self.device.synchronize()
        for line in self.memory_report():
            _log.info("%s", line)

    # start-up -------------------------------------------------------------------------------
    def _zero(self, ptr: int, nbytes: int) -> None:
        zeros = getattr(self.device, "memset", None)
        if zeros is not None:
            zeros(ptr, nbytes)

    def _context(self, name: str) -> Any:
        e = self.engine
        ctx = e.create_execution_context_without_device_memory()
        if ctx is None:
            raise DeviceRunnerError(f"create_execution_context_without_device_memory() failed for the {name} context")
        ctx.set_device_memory(self.activations, max(self.activation_bytes, ALIGNMENT))
        self._bind(ctx, KV_CACHE_POOL, self.pool_ptr)
        self._bind(ctx, LOGITS, self.logits_ptr)
        if not ctx.set_input_shape(KV_CACHE_POOL, self.pool_shape):
            raise DeviceRunnerError(
                f"the engine refuses a KV pool of shape {self.pool_shape} (profile max_num_blocks {self.mode.plan.max_num_blocks})"
            )
        return ctx

    @staticmethod
    def _bind(ctx: Any, name: str, ptr: int) -> None:
        if not ctx.set_tensor_address(name, int(ptr)):
            raise DeviceRunnerError(f"set_tensor_address({name!r}) failed")

    def _set_shapes(self, ctx: Any, layout: StepLayout) -> None:
        for name, (_, shape) in layout.fields.items():
            if not ctx.set_input_shape(name, shape):
                raise DeviceRunnerError(f"the engine refuses input {name!r} of shape {shape} (outside its optimization profile)")

    def _bind_inputs(self, ctx: Any, layout: StepLayout) -> None:
        for name, (offset, _) in layout.fields.items():
            self._bind(ctx, name, self.staging_ptr + offset)

    def _capture_all(self) -> None:
        """Warm up every bucket's context on padding rows only (they touch only the scratch
        block), then capture, per host side, the whole decode step -- the staging copy from
        that side, the feed of tokens in flight, the engine (TensorRT: capture after a warm-up
        for these shapes), the sampling of that side's records with its copies back -- and
        replay each graph once on padding rows, so that its first upload to the device
        happens here, not in a step."""
        empty = cast(StepBatch, _Empty())
        for g in self.graphs.values():
            for views in g.views:
                fill_step(views, empty, self.scratch_block)
            self._copy_inputs(g.layout)
            self._run(g.context, g.layout)  # warm-up: the launches are prepared for these shapes
            self.device.synchronize()
            if self.enforce_eager:
                continue
            for side in range(len(self.host_staging)):
                self.device.begin_capture()
                try:
                    self.device.copy_async(self.staging_ptr, int(self.host_staging[side].ctypes.data), g.layout.nbytes)
                    self._run(g.context, g.layout)
                    self.sampler.kernel.enqueue_step(side, g.size, self.logits_ptr, self.vocab_size)
                finally:
                    graph = self.device.end_capture()
                g.graphs.append(graph)
                padding = self.sampler.enqueue([], self.logits_ptr, self.vocab_size, side=side, rows=g.size)
                self.device.launch_graph(graph)
                self.sampler.kernel.result(padding.ticket)  # waits; nothing to read

    # steps ---------------------------------------------------------------------------------
    def _copy_inputs(self, layout: StepLayout) -> None:
        self.device.copy_async(self.staging_ptr, int(self.host_staging[self._side].ctypes.data), layout.nbytes)

    def _run(self, ctx: Any, layout: StepLayout, feed: bool = True) -> None:
        """Enqueue one step on staged inputs: the write of the tokens still in flight into
        ``input_ids`` (``feed``), then the engine."""
        if feed:
            self.sampler.feed_tokens(self.staging_ptr + layout.fields[INPUT_IDS][0], layout.num_tokens)
        if not ctx.execute_async_v3(self.device.stream):
            raise DeviceRunnerError("execute_async_v3 failed")

    @staticmethod
    def is_decode(batch: StepBatch) -> bool:
        """Every sequence feeds one token after its cached ones (a graph-able step)."""
        for s in batch.seqs:
            if s.is_prefill:  # type: ignore[attr-defined]
                return False
        return True

    def execute(self, batch: StepBatch) -> int:
        """Enqueue one step of ``batch`` (no host wait): inputs into staging, one copy, then the
        bucket's graph (a decode) or an eager execution (prefill / mixed), then the sampling
        of the sequences that produce a token (:class:`RequestSampler`), so that
        :meth:`sample` only waits. Returns the rows of the logits buffer the step fills (the
        bucket size, or the batch's sequences).

        Two steps may be in flight (asynchronous scheduling, :meth:`can_run_ahead`): a token
        of the step before that the host does not know yet (a placeholder) is written into
        this step's inputs on the device; :meth:`sample` takes the steps in order.

        Raises:
            InvalidArgumentError: more sequences than ``max_batch_size`` or tokens than
                ``max_num_tokens``.
            DeviceRunnerError: a third step while two are in flight.
        """
        if len(self._in_flight) >= 2:
            raise DeviceRunnerError("execute() with two steps in flight; sample() the oldest first")
        n = len(batch.seqs)
        if n > self.max_batch_size:
            raise InvalidArgumentError(f"a step of {n} sequences; the engine takes at most max_batch_size={self.max_batch_size}")
        ids = [s.request_id if s.produces_token else None for s in batch.seqs]  # type: ignore[attr-defined]
        while ids and ids[-1] is None:  # rows past the last sampled one are not read
            ids.pop()
        rows, sampling = self._launch(batch, ids)
        self._fed_rows = {rid: i for i, rid in enumerate(ids) if rid is not None}
        self._in_flight.append(_InFlight(batch, sampling))
        return rows

    def can_run_ahead(self) -> bool:
        """Whether the next step may be enqueued before the last one's tokens are read: one
        step in flight, and no live request sampled on the host (its token is not on the
        device to feed the next step, and its logits would be overwritten)."""
        return len(self._in_flight) == 1 and not self.sampler.has_host_requests

    def add_request(self, request: Request) -> None:
        """Register a request for sampling (its seed, its packed parameters).

        Raises:
            InvalidRequestError: parameters the sampling kernel cannot serve (more logprobs
                than it returns, more ``min_tokens`` ids than it masks).
        """
        self.sampler.add_request(request)

    def remove_request(self, request_id: Hashable) -> None:
        """Forget a finished request's sampling state."""
        self.sampler.remove_request(request_id)

    def _sample(self, ids: list[Hashable | None], rows: int | None = None) -> SamplingStep | None:
        """Stage (and, without ``rows``, enqueue) the sampling of ``ids`` on this step's side."""
        if not ids:
            return None
        return self.sampler.enqueue(ids, self.logits_ptr, self.vocab_size, side=self._side, rows=rows)

    def _launch(self, batch: StepBatch, ids: list[Hashable | None]) -> tuple[int, SamplingStep | None]:
        n = len(batch.seqs)
        self.num_steps += 1
        self._side ^= 1  # the other host side: its last step was collected before this one
        fed = self._fed_rows if self._in_flight else None  # placeholders name rows of the step in flight
        if self.is_decode(batch):
            g = self._decode_graphs[n] if n else self.graphs[bucket_for(n, self.buckets)]
            side = self._side
            if self._filled[side] is g:  # its constant fields are still in place
                fill_decode(g.views[side], batch.seqs, self.scratch_block, fed, self._rows[side])
            else:
                fill_step(g.views[side], batch, self.scratch_block, fed)
                self._filled[side] = g
                self._rows[side] = [(s.request_id, len(s.block_table)) for s in batch.seqs] + [PAD_ROW] * (g.size - n)  # type: ignore[attr-defined]
            if g.graphs:  # the whole step: staging copy, feed, engine, sampling, copies back
                sampling = self.sampler.enqueue(ids, self.logits_ptr, self.vocab_size, side=side, rows=g.size) if ids else None
                self.device.launch_graph(g.graphs[side])
                self.num_graph_replays += 1
            else:
                self._copy_inputs(g.layout)
                self._run(g.context, g.layout)
                sampling = self._sample(ids)
            return g.size, sampling
        tokens = sum(s.num_new_tokens for s in batch.seqs)
        if tokens > self.max_num_tokens:
            raise InvalidArgumentError(f"a step of {tokens} tokens; the engine takes at most max_num_tokens={self.max_num_tokens}")
        key = (tokens, n)
        cached = self._eager_layouts.get(key)
        if cached is None:  # host-side only: a layout and its views, no device memory
            layout = StepLayout.make(tokens, n, self.max_blocks, self.rope_seq_lens)
            cached = self._eager_layouts[key] = (layout, [layout.views(h) for h in self.host_staging])
        layout, views = cached
        fill_step(views[self._side], batch, self.scratch_block, fed)
        # this side's staging now holds another layout, and a request may have been (re-)admitted
        # with new blocks: the next decode on either side writes its whole layout (fill_step)
        self._filled = [None, None]
        self._copy_inputs(layout)
        ctx = self.eager
        for name, (_, shape) in layout.fields.items():
            if self._eager_shapes.get(name) != shape:
                if not ctx.set_input_shape(name, shape):
                    raise DeviceRunnerError(f"the engine refuses input {name!r} of shape {shape} (outside its optimization profile)")
                self._eager_shapes[name] = shape
        self._bind_inputs(ctx, layout)
        self._run(ctx, layout, feed=bool(fed))
        return n, self._sample(ids)

    def logits_rows(self, rows: int) -> np.ndarray:
        """Copy the first ``rows`` logits rows to the pinned host buffer and wait; float32
        ``[rows, vocab_size]`` (a view of the pinned buffer, valid until the next step)."""
        nbytes = int(rows) * self.vocab_size * 4
        self.device.copy_async(int(self.host_logits.ctypes.data), self.logits_ptr, nbytes)
        self.device.record()
        self.device.wait()
        return self.host_logits[:rows]

    def sample(self, batch: Any) -> tuple[dict[Hashable, int], dict[Hashable, Any], dict[Hashable, str]]:
        """The tokens of the sequences of ``batch`` (the oldest step in flight) that produce
        one: ``(tokens, logprobs, errors)`` by request id; waits for the sampled ids only.

        Raises:
            DeviceRunnerError: ``batch`` is not the oldest step :meth:`execute` enqueued.
        """
        if not self._in_flight or self._in_flight[0].batch is not batch:
            raise DeviceRunnerError("sample() for a batch that is not the oldest step execute() enqueued")
        step = self._in_flight.popleft()
        if step.sampling is None:
            return {}, {}, {}
        return self.sampler.collect(step.sampling)

    def replay_seconds(self, size: int = 1, steps: int = 100) -> float:
        """Device time of one decode step of bucket ``size``, seconds: the bucket's graph and
        the sampling replayed ``steps`` times back to back on the inputs staged last (host
        work between them is only the launches, so the device never waits for the host).
        For profiling: it rewrites the logits and the KV slots that staged step writes, so
        call it with no request running.

        Raises:
            DeviceRunnerError: the bucket has no graph (``enforce_eager``), a step is in
                flight, or nothing was sampled yet.
        """
        g = self.graphs.get(size)
        if g is None or not g.graphs:
            raise DeviceRunnerError(f"no graph for bucket {size} (buckets {list(self.buckets)}, enforce_eager={self.enforce_eager})")
        if self._in_flight:
            raise DeviceRunnerError("replay_seconds() with a step in flight; sample it first")
        graph = g.graphs[self._side]  # that side holds the last step's inputs and records
        self.device.synchronize()
        t0 = time.perf_counter()
        for _ in range(int(steps)):
            self.device.launch_graph(graph)
        self.device.synchronize()
        return (time.perf_counter() - t0) / max(int(steps), 1)

    # reports / cleanup -----------------------------------------------------------------------
    def memory_report(self) -> list[str]:
        """What went where at start-up, one line per pool, then the pool's shape and buckets."""
        lines = [f"device memory ({self.device.name}): " + ", ".join(self.device.memory_report())]
        lines.append(
            f"KV pool: {self.pool_blocks} blocks of {self.mode.plan.block_size} tokens ({self.num_blocks} usable, 1 scratch), "
            f"shape {self.pool_shape} {self.pool_dtype}"
        )
        graphs = "off (enforce_eager)" if self.enforce_eager else f"decode buckets {list(self.buckets)}"
        lines.append(f"CUDA graphs: {graphs}; staging {format_bytes(self.staging_bytes)} per step at most")
        return lines

    def close(self) -> None:
        """Release the contexts and the device's memory. Safe to call twice."""
        self.graphs = {}
        self.eager = None
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None  # type: ignore[assignment]
        self.device.close()


class _Empty:
    """A batch of no sequences: :func:`fill_step` pads it whole (warm-up of a bucket)."""

    seqs: list[Any] = []
