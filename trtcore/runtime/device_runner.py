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
  the host side and copies the used bytes with one kernel (:meth:`GpuSampler.stage_inputs
  <trtcore.runtime.sampling_gpu.GpuSampler.stage_inputs>`, which reads the pinned buffer itself
  and writes the tokens still in flight on the way: no copy-engine node in a step's graph);
* **logits**: ``float32 [max_rows, vocab_size]`` on the device (the engine's output,
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
their own (shapes set per step), padded too (:func:`padded_step_shape`): their tokens to a
power of two (:func:`token_buckets`), their sequences to a batch bucket, the padding tokens
in padding rows that read and write only the scratch block (:func:`fill_step`; a step of
``max_batch_size`` sequences takes the engine profile's spare row for its padding,
:data:`~trtcore.kv_modes.SPARE_ROWS`), so that the eager context meets a few shape
combinations only (the cuda engine prepares the launch list of each new one on the host,
milliseconds; ``warm_eager`` prepares them all at start-up).
Where the context allows it (``eager_graphs``), every padded shape is captured at start-up
into a graph per host side, like a decode bucket's (``capture_eager_shapes``; else a shape is
captured right after its second eager run); the steps of that shape that sample a token replay
it: the host launches one graph instead of every kernel, GEMM and plugin call (an eager run of
SmolLM2-135M's prefill is 8-15 ms of host Python, ``bench/results/cpu-2026-12-02-eager-steps``).
``enforce_eager=True`` runs every step eagerly, decode steps still padded to their bucket.

**Sampling** on the device (:class:`~trtcore.runtime.request_sampler.RequestSampler` over the
batched sampling kernel, :class:`~trtcore.runtime.sampling_gpu.GpuSampler`): right behind the
engine, the kernel samples the logits rows of the sequences that produce a token and their ids
(16 bytes a row, plus the top-k logprobs) are written into pinned memory by the kernel itself;
:meth:`~DeviceRunner.sample` waits for that step's event only. The logits stay on the device (:meth:`~DeviceRunner.logits_rows`
copies them for tests and debugging).

**One graph per decode step and host side.** Each bucket has two graphs, one per host side
(pinned staging buffer and pinned sampler buffers; steps alternate sides, so a step is staged
while the step before may still be in flight, asynchronous scheduling): the copy of that side's
staging to the device by ``sampling_stage_inputs`` (a token still in flight, staged as
``-(row + 1)``, becomes what the step before sampled for that row), the engine, and the sampling
of that side's records (read from and written to its pinned buffers) with its done event: kernel
nodes and one event record. A decode step writes its inputs and its sampling
records into the side's pinned buffers and launches that side's graph: one CUDA call.

**Host work per step**: no Python per layer -- a decode step is the staging of its inputs and
sampling records and one graph launch; an eager step (prefill, mixed) copies its staging, sets
the shapes that changed, binds the inputs, makes one ``execute_async_v3`` call (the cuda engine
replays its prepared launch list) and enqueues the sampling.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict, deque
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
    SPARE_ROWS,
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
    "padded_step_shape",
    "padding_row_tokens",
    "token_buckets",
]

_log = logging.getLogger("trtcore.runtime")

#: block-table entry of the columns a sequence does not use (never read, never written)
PAD_BLOCK_ID = -1
#: most eager step layouts kept (host views; LRU): the padded shapes and some unpadded ones
MAX_EAGER_LAYOUTS = 128
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


def token_buckets(max_num_tokens: int, smallest: int = 16) -> tuple[int, ...]:
    """The token counts prefill and mixed steps are padded to: powers of two from
    ``smallest`` below ``max_num_tokens``, then ``max_num_tokens`` itself (``2048 -> (16, 32,
    ..., 1024, 2048)``, ``100 -> (16, 32, 64, 100)``), as TensorRT-LLM's and vLLM's token
    buckets: a server then meets a few input-shape combinations only.

    Raises:
        InvalidArgumentError: ``max_num_tokens`` or ``smallest`` below 1.
    """
    if max_num_tokens < 1 or smallest < 1:
        raise InvalidArgumentError(f"max_num_tokens and smallest must be >= 1, got {max_num_tokens}, {smallest}")
    out = []
    t = int(smallest)
    while t < max_num_tokens:
        out.append(t)
        t *= 2
    out.append(int(max_num_tokens))
    return tuple(out)


def padded_step_shape(num_tokens: int, num_seqs: int, tokens: Sequence[int], seqs: Sequence[int], max_row_tokens: int) -> tuple[int, int]:
    """``(T, B)``: the tokens and sequences an eager step of ``num_tokens`` tokens of
    ``num_seqs`` sequences is padded to: ``B`` the smallest of the sequence buckets ``seqs``
    ``>= num_seqs`` (one more when the tokens need padding and ``num_seqs`` is a bucket: the
    padding tokens need a padding row), ``T`` the smallest of the token buckets ``tokens``
    ``>= num_tokens + B - num_seqs`` (a token per padding row); the step itself, unpadded,
    where that does not fit (``num_seqs`` already the largest bucket, more tokens than the
    largest, or more padding than ``B - num_seqs`` rows of ``max_row_tokens`` hold).

    Raises:
        InvalidArgumentError: ``num_seqs < 1`` or ``num_tokens < num_seqs``.
    """
    t, n = int(num_tokens), int(num_seqs)
    if n < 1 or t < n:
        raise InvalidArgumentError(f"a step of {t} tokens and {n} sequences (every sequence has a token at least)")
    if n > seqs[-1]:
        return t, n
    b = bucket_for(n, seqs)
    if b == n and t in tokens:
        return t, n
    if b == n:
        if n >= seqs[-1]:
            return t, n
        b = bucket_for(n + 1, seqs)
    T = next((x for x in tokens if x >= t + b - n), None)
    if T is None or T - t > (b - n) * int(max_row_tokens):
        return t, n
    return T, b


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


def padding_row_tokens(pad_tokens: int, pad_rows: int, max_row_tokens: int | None = None) -> list[int]:
    """How :func:`fill_step` spreads ``pad_tokens`` padding tokens over ``pad_rows`` padding
    rows: one each, the surplus on the first rows, at most ``max_row_tokens`` a row (None: no
    limit), e.g. ``(10, 3, None) -> [8, 1, 1]``, ``(10, 3, 4) -> [4, 4, 2]``.

    Raises:
        InvalidArgumentError: fewer tokens than rows, or more than the rows hold.
    """
    cap = pad_tokens if max_row_tokens is None else int(max_row_tokens)
    if pad_tokens < pad_rows or pad_tokens > pad_rows * cap or (pad_rows == 0 and pad_tokens):
        raise InvalidArgumentError(
            f"{pad_tokens} padding tokens do not fit {pad_rows} padding rows (one token each at least, {max_row_tokens} at most)"
        )
    out = []
    left = pad_tokens
    for r in range(pad_rows, 0, -1):
        k = min(cap, left - (r - 1))
        out.append(k)
        left -= k
    return out


def fill_step(
    views: dict[str, np.ndarray],
    batch: StepBatch,
    scratch_block: int,
    fed_rows: dict[Hashable, int] | None = None,
    max_row_tokens: int | None = None,
) -> None:
    """Write the inputs of ``batch`` into the int32 ``views`` of a :class:`StepLayout` whose
    sizes may exceed the batch's: the extra sequences are **padding rows**, the extra tokens
    belong to them (:func:`padding_row_tokens`: one each, the surplus on the first ones, at
    most ``max_row_tokens`` a row). A padding row of ``k`` tokens has token ids 0 at positions
    ``0 .. k-1`` and ``seq_lens`` ``k``; its block table is ``[scratch_block, -1, ...]`` for one
    token, and the scratch block in every column for several (its positions pass the first
    block: they all land in the scratch block, columns past its last block are never read), so
    it reads and writes only the scratch block. A real sequence's unused block-table columns
    are :data:`PAD_BLOCK_ID`.

    A token still in flight (:data:`~trtcore.runtime.scheduler.PLACEHOLDER_TOKEN_ID`, negative)
    is staged as ``-(row + 1)``, ``row = fed_rows[request_id]`` its request's row in the
    previous step's sampling, for the device to replace (:meth:`GpuSampler.stage_inputs
    <trtcore.runtime.sampling_gpu.GpuSampler.stage_inputs>`).

    Raises:
        InvalidArgumentError: the batch has more tokens or sequences than the layout, or the
            layout's padding tokens do not fit its padding rows (:func:`padding_row_tokens`).
        KeyError: a placeholder for a request not in ``fed_rows``.
    """
    seqs = batch.seqs
    ids, pos, bt = views[INPUT_IDS], views[POSITION_IDS], views[BLOCK_TABLES]
    sl, qsl, last = views[SEQ_LENS], views[QUERY_START_LOC], views[LAST_TOKEN_IDS]
    T, B = ids.shape[0], sl.shape[0]
    n = len(seqs)
    lens = [len(s.token_ids) for s in seqs]
    t = sum(lens)
    if n > B or t > T:
        raise InvalidArgumentError(f"a step of {n} sequences / {t} tokens does not pad to a layout of {B} sequences / {T} tokens")
    pad = padding_row_tokens(T - t, B - n, max_row_tokens)
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
    bt.fill(PAD_BLOCK_ID)
    bt[n:, 0] = scratch_block
    for i, s in enumerate(seqs):
        table = s.block_table  # type: ignore[attr-defined]
        bt[i, : len(table)] = table
    ids[t:] = 0
    if T - t == B - n:  # one token per padding row (every decode bucket)
        qsl[n + 1 :] = t + np.arange(1, B - n + 1, dtype=np.int32)
        pos[t:] = 0
        sl[n:] = 1
    else:
        np.cumsum(pad, out=qsl[n + 1 :])
        qsl[n + 1 :] += t
        sl[n:] = pad
        pos[t:] = np.concatenate([np.arange(k, dtype=np.int32) for k in pad])
        for i, k in enumerate(pad):
            if k > 1:
                bt[n + i] = scratch_block
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
        pad_eager_steps: pad prefill and mixed steps to :func:`token_buckets` x
            :func:`batch_buckets` (:func:`padded_step_shape`); False runs each with its
            exact sizes.
        warm_eager: prepare the eager context's launches for every padded shape at start-up
            (where the engine's context can, the cuda backend's: ``prepare_launches``).
        eager_graphs: capture padded eager shapes' steps into CUDA graphs (one per host
            side) and replay them for the steps of that shape that sample a token (None: on
            for the cuda engine's contexts, whose prepared launches stay as they are when the
            context meets other shapes, unless ``enforce_eager`` or the environment's
            ``TRTCORE_EAGER_GRAPHS=0``; off for TensorRT's, whose rule is one execution
            context per graph).
        capture_eager_shapes: with ``eager_graphs``, capture every shape of
            :attr:`eager_shapes` at start-up (a warm-up run on padding rows, then the
            capture, as a decode bucket's), so that no step of a server pays an eager run's
            host work (milliseconds: every kernel, GEMM and plugin call launched from Python)
            or a capture; False captures a shape right after its second eager run (its
            warm-up; a shape met once is never captured).
        weights_bytes: device bytes the engine's weights took (for the report; measured by
            the caller around deserialization).

    Attributes:
        num_blocks: blocks the scheduler may hand out (the pool has one more, the scratch block).
        buckets: the decode batch buckets.
        token_buckets: the token counts eager steps are padded to.
        token_headroom: tokens of ``max_num_tokens`` the scheduler leaves for padding rows.
        eager_shapes: the ``(tokens, sequences)`` shapes eager steps are padded to (warmed at
            start-up with ``warm_eager``).
        last_eager_shape: the ``(tokens, sequences)`` the last eager step ran with (None: none yet).
        num_steps / num_graph_replays: steps run, of them replayed from a graph.
        num_eager_graph_replays: of those, eager (prefill / mixed) steps.

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
        pad_eager_steps: bool = True,
        warm_eager: bool = True,
        eager_graphs: bool | None = None,
        capture_eager_shapes: bool = True,
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
        self.pad_eager_steps = bool(pad_eager_steps)
        self.token_buckets = token_buckets(self.max_num_tokens)
        #: most tokens one padding row of an eager step holds (every column the scratch block)
        self.max_row_tokens = self.max_blocks * int(plan.block_size)
        #: most rows of a step: ``max_batch_size``, and the profile's spare padding row
        #: (:data:`~trtcore.kv_modes.SPARE_ROWS`) where the engine has one (engines built
        #: before it have not), so that a prefill or mixed step of ``max_batch_size`` sequences
        #: still pads its tokens
        self.max_rows = self.max_batch_size + _spare_rows(engine, self.max_batch_size)
        #: the sequence buckets eager steps are padded to: the decode buckets, then the spare row
        self.eager_buckets = self.buckets + ((self.max_rows,) if self.max_rows > self.max_batch_size else ())
        # every (token bucket, sequence bucket) pair, each row a token at least; a shape of more
        # tokens than its rows hold (e.g. one sequence of max_num_tokens new tokens beyond
        # max_seq_len) is never a step: left out
        self.eager_shapes = [(T, B) for T in self.token_buckets for B in self.eager_buckets if B <= T <= B * self.max_row_tokens]
        self.last_eager_shape: tuple[int, int] | None = None
        eager_graphs_default = eager_graphs is None
        if eager_graphs is None:
            eager_graphs = os.environ.get("TRTCORE_EAGER_GRAPHS", "1") != "0"
        self.eager_graphs = bool(eager_graphs) and self.pad_eager_steps and not self.enforce_eager
        self._eager_graphs: dict[tuple[int, int], list[Any]] = {}  # padded shape -> a graph per host side
        self._eager_seen: set[tuple[int, int]] = set()  # padded shapes run eagerly once
        self._eager_shape_set = set(self.eager_shapes)
        #: tokens a step's padding rows may need beyond the step's own (one per padding row):
        #: the scheduler's token budget leaves them free, so that a step that fills the budget
        #: still pads to a bucket pair
        self.token_headroom = 0
        if self.pad_eager_steps and self.max_rows > 1:
            eb = self.eager_buckets
            gaps = [bucket_for(n + 1 if bucket_for(n, eb) == n else n, eb) - n for n in range(1, self.max_rows)]
            self.token_headroom = min(max(gaps), self.max_num_tokens // 2)
        self.num_steps = 0
        self.num_graph_replays = 0
        self.num_eager_graph_replays = 0
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
        logits_bytes = self.max_rows * self.vocab_size * 4
        self.logits_ptr = device.malloc(logits_bytes, "logits")
        self.host_logits = device.host_alloc(logits_bytes, "logits")[:logits_bytes].view(np.float32).reshape(self.max_rows, self.vocab_size)
        # staging: the largest step layout, on the device and twice in pinned host memory (a
        # step is staged while the copy of the one before may still be pending)
        big = StepLayout.make(self.max_num_tokens, self.max_rows, self.max_blocks, self.rope_seq_lens)
        self.staging_bytes = big.nbytes
        self.host_staging = [device.host_alloc(big.nbytes, "staging") for _ in range(2)]
        self._side = 0  # the host staging buffer of the last step
        self._filled: list[Any] = [None, None]  # per side: the decode bucket filled there last (None: another layout)
        self._rows: list[list[Any]] = [[], []]  # per side: what its block-table rows hold (fill_decode)
        self.staging_ptr = device.malloc(big.nbytes, "staging")
        # the sampler's buffers (penalty counts: 5 bytes per token and slot), before the pool takes what is left
        #: the live requests' sampling state over the batched sampling kernel
        self.sampler = RequestSampler(make_sampler_kernel(device, self.max_rows, self.vocab_size, int(plan.max_seq_len)), self.logits_rows)
        # the KV pool: what is left
        layers, _, *rest = mode.pool_shape
        pool_dtype = storage_dtype(mode.pool_dtype)  # the engine dtype, or E4M3 bytes (FP8 KV cache)
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
        if eager_graphs_default and not hasattr(self.eager, "prepare_launches"):
            # one context meets every eager shape: TensorRT's rule is one execution context per
            # graph, so graphs of eager steps only where the context's launches, once prepared
            # for a shape, stay as they are (the cuda engine's prepared launch lists)
            self.eager_graphs = False
        self._eager_shapes: dict[str, tuple[int, ...]] = {}
        # host-side layouts of the eager shapes met (LRU: unpadded shapes can be many)
        self._eager_layouts: OrderedDict[tuple[int, int], tuple[StepLayout, list[dict[str, np.ndarray]]]] = OrderedDict()
        self.graphs: dict[int, _Graph] = {}
        for size in self.buckets:
            layout = StepLayout.make(size, size, self.max_blocks, self.rope_seq_lens)
            ctx = self._context(f"decode[{size}]")
            self._set_shapes(ctx, layout)
            self._bind_inputs(ctx, layout)
            self.graphs[size] = _Graph(size, ctx, layout, [layout.views(h) for h in self.host_staging])
        #: the bucket's graph of a decode of ``n`` sequences, by ``n`` (1..max_batch_size)
        self._decode_graphs: list[_Graph] = [
            self.graphs[b] for b in (self.buckets[0], *(bucket_for(k, self.buckets) for k in range(1, self.max_batch_size + 1)))
        ]
        self._capture_all()
        if warm_eager and self.pad_eager_steps:
            self._warm_eager()
        if capture_eager_shapes and self.eager_graphs:
            self._capture_eager_shapes()
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
        block), capture its decode step per host side (:meth:`_capture_step`) and replay each
        graph once on padding rows, so that its first upload to the device happens here, not
        in a step."""
        empty = cast(StepBatch, _Empty())
        for g in self.graphs.values():
            for views in g.views:
                fill_step(views, empty, self.scratch_block)
            self._stage(g.layout)
            self._run(g.context)  # warm-up: the launches are prepared for these shapes
            self.device.synchronize()
            if self.enforce_eager:
                continue
            g.graphs = self._capture_uploaded(g.context, g.layout, g.size)

    def _capture_step(self, ctx: Any, layout: StepLayout, rows: int) -> list[Any]:
        """Per host side, a graph of one whole step on ``ctx`` (TensorRT: captured after a
        warm-up run for these shapes): the staging copy from that side with the feed of tokens
        in flight, the engine, and the sampling of ``rows`` rows of that side's records."""
        graphs = []
        for side in range(len(self.host_staging)):
            self.device.begin_capture()
            try:
                self._stage(layout, side)
                self._run(ctx)
                self.sampler.kernel.enqueue_step(side, rows, self.logits_ptr, self.vocab_size)
            finally:
                graph = self.device.end_capture()
            graphs.append(graph)
        return graphs

    def _capture_uploaded(self, ctx: Any, layout: StepLayout, rows: int) -> list[Any]:
        """:meth:`_capture_step`, then each graph replayed once on the padding rows staged
        (its first upload to the device happens here, not in a step)."""
        graphs = self._capture_step(ctx, layout, rows)
        for side, graph in enumerate(graphs):
            padding = self.sampler.enqueue([], self.logits_ptr, self.vocab_size, side=side, rows=rows)
            self.device.launch_graph(graph)
            self.sampler.kernel.result(padding.ticket)  # waits; nothing to read
        return graphs

    def _warm_eager(self) -> None:
        """Prepare the eager context's launch list for every padded eager shape (host work
        only, nothing runs), so that no step of a server pays it; a no-op for contexts that
        prepare nothing on the host (TensorRT's, the reference backend's)."""
        prepare = getattr(self.eager, "prepare_launches", None)
        if prepare is None:
            return
        limit = getattr(self.eager, "max_prepared", None)
        if limit is not None and limit < len(self.eager_shapes) + MAX_EAGER_LAYOUTS:
            self.eager.max_prepared = len(self.eager_shapes) + MAX_EAGER_LAYOUTS
        t0 = time.perf_counter()
        for T, B in self.eager_shapes:
            layout, _ = self._eager_layout(T, B)
            self._set_eager_shapes(layout)
            self._bind_inputs(self.eager, layout)
            prepare()
        _log.info("prepared %d eager step shapes in %.2f s", len(self.eager_shapes), time.perf_counter() - t0)

    def _capture_eager_shapes(self) -> None:
        """Capture the step of every padded eager shape (``capture_eager_shapes``): staged with
        padding rows only (they touch only the scratch block), run once eagerly (the warm-up
        TensorRT's capture rules ask for, which also prepares the cuda engine's launches), then
        captured per host side and each graph replayed once (its upload), as
        :meth:`_capture_all` does for the decode buckets."""
        empty = cast(StepBatch, _Empty())
        t0 = time.perf_counter()
        for T, B in self.eager_shapes:
            layout, views = self._eager_layout(T, B)
            for v in views:
                fill_step(v, empty, self.scratch_block, None, self.max_row_tokens)
            self._stage(layout)
            self._set_eager_shapes(layout)
            self._bind_inputs(self.eager, layout)
            self._run(self.eager)
            self.device.synchronize()
            self._eager_graphs[(T, B)] = self._capture_uploaded(self.eager, layout, B)
        self._filled = [None, None]  # the staging holds eager layouts now
        _log.info("captured %d eager step shapes in %.2f s", len(self.eager_shapes), time.perf_counter() - t0)

    # steps ---------------------------------------------------------------------------------
    def _eager_layout(self, T: int, B: int) -> tuple[StepLayout, list[dict[str, np.ndarray]]]:
        """The layout of an eager step of ``T`` tokens and ``B`` sequences and its views of
        each host staging buffer (host-side only, no device memory; LRU of
        :data:`MAX_EAGER_LAYOUTS`)."""
        key = (T, B)
        cached = self._eager_layouts.get(key)
        if cached is None:
            layout = StepLayout.make(T, B, self.max_blocks, self.rope_seq_lens)
            cached = self._eager_layouts[key] = (layout, [layout.views(h) for h in self.host_staging])
            if len(self._eager_layouts) > MAX_EAGER_LAYOUTS:
                self._eager_layouts.popitem(last=False)
        else:
            self._eager_layouts.move_to_end(key)
        return cached

    def _set_eager_shapes(self, layout: StepLayout) -> None:
        """Set the eager context's input shapes that differ from ``layout``'s."""
        ctx = self.eager
        for name, (_, shape) in layout.fields.items():
            if self._eager_shapes.get(name) != shape:
                if not ctx.set_input_shape(name, shape):
                    raise DeviceRunnerError(f"the engine refuses input {name!r} of shape {shape} (outside its optimization profile)")
                self._eager_shapes[name] = shape

    def _stage(self, layout: StepLayout, side: int | None = None, feed: bool = True) -> None:
        """Enqueue the copy of host side ``side``'s staging (default the current side) to the
        device, writing the tokens still in flight into ``input_ids`` on the way (``feed``)."""
        host = int(self.host_staging[self._side if side is None else side].ctypes.data)
        tokens = layout.num_tokens if feed else 0
        self.sampler.stage_inputs(self.staging_ptr, host, layout.nbytes, self.staging_ptr + layout.fields[INPUT_IDS][0], tokens)

    def _run(self, ctx: Any) -> None:
        """Enqueue the engine on the staged inputs."""
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
        decode bucket, or the padded sequences of an eager step).

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
        seqs = batch.seqs
        n = len(seqs)
        if n > self.max_batch_size:
            raise InvalidArgumentError(f"a step of {n} sequences; the engine takes at most max_batch_size={self.max_batch_size}")
        ids: list[Hashable | None] = []  # the sampled rows' request ids (None: no token)
        fed_rows = {}  # this step's _fed_rows, for the next one (_launch reads the last one's)
        for s in seqs:
            if s.produces_token:  # type: ignore[attr-defined]
                fed_rows[s.request_id] = len(ids)  # type: ignore[attr-defined]
                ids.append(s.request_id)  # type: ignore[attr-defined]
            else:
                ids.append(None)
        while ids and ids[-1] is None:  # rows past the last sampled one are not read
            ids.pop()
        rows, sampling = self._launch(batch, ids)
        self._fed_rows = fed_rows
        self._in_flight.append(tuple.__new__(_InFlight, (batch, sampling)))  # _InFlight(...) without its Python __new__
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
        for s in batch.seqs:  # is_decode, inline
            if s.is_prefill:  # type: ignore[attr-defined]
                break
        else:
            g = self._decode_graphs[n] if n else self.graphs[bucket_for(n, self.buckets)]
            side = self._side
            if self._filled[side] is g:  # its constant fields are still in place
                fill_decode(g.views[side], batch.seqs, self.scratch_block, fed, self._rows[side])
            else:
                fill_step(g.views[side], batch, self.scratch_block, fed)
                self._filled[side] = g
                self._rows[side] = [(s.request_id, len(s.block_table)) for s in batch.seqs] + [PAD_ROW] * (g.size - n)  # type: ignore[attr-defined, list-item]
            if g.graphs:  # the whole step: staging copy, feed, engine, sampling, copies back
                sampling = self.sampler.enqueue(ids, self.logits_ptr, self.vocab_size, side=side, rows=g.size) if ids else None
                self.device.launch_graph(g.graphs[side])
                self.num_graph_replays += 1
            else:
                self._stage(g.layout)
                self._run(g.context)
                sampling = self._sample(ids)
            return g.size, sampling
        tokens = sum(s.num_new_tokens for s in batch.seqs)
        if tokens > self.max_num_tokens:
            raise InvalidArgumentError(f"a step of {tokens} tokens; the engine takes at most max_num_tokens={self.max_num_tokens}")
        if self.pad_eager_steps:
            T, B = padded_step_shape(tokens, n, self.token_buckets, self.eager_buckets, self.max_row_tokens)
        else:
            T, B = tokens, n
        self.last_eager_shape = (T, B)
        layout, views = self._eager_layout(T, B)
        fill_step(views[self._side], batch, self.scratch_block, fed, self.max_row_tokens)
        # this side's staging now holds another layout, and a request may have been (re-)admitted
        # with new blocks: the next decode on either side writes its whole layout (fill_step)
        self._filled = [None, None]
        # a graph always samples its rows: not for a step that samples none
        graphs = self._eager_graphs.get((T, B)) if ids and self.eager_graphs else None
        if graphs:
            sampling = self._sample(ids, rows=B)
            self.device.launch_graph(graphs[self._side])
            self.num_graph_replays += 1
            self.num_eager_graph_replays += 1
            return B, sampling
        self._stage(layout, feed=bool(fed))
        self._set_eager_shapes(layout)
        self._bind_inputs(self.eager, layout)
        self._run(self.eager)
        sampling = self._sample(ids)
        if self.eager_graphs and (T, B) in self._eager_shape_set and (T, B) not in self._eager_graphs:
            if (T, B) in self._eager_seen:  # it recurs: capture it, the run above was its warm-up
                self._eager_graphs[(T, B)] = self._capture_step(self.eager, layout, B)
            self._eager_seen.add((T, B))
        return B, sampling

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
        if self.eager_graphs:
            graphs += f", eager steps of {len(self.eager_shapes)} padded shapes (captured when they recur)"
        lines.append(f"CUDA graphs: {graphs}; staging {format_bytes(self.staging_bytes)} per step at most")
        return lines

    def close(self) -> None:
        """Release the contexts and the device's memory. Safe to call twice."""
        self.graphs = {}
        self._eager_graphs = {}
        self.eager = None
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None  # type: ignore[assignment]
        self.device.close()


def _spare_rows(engine: Any, max_batch_size: int) -> int:
    """Rows beyond ``max_batch_size`` the engine's profile admits for ``seq_lens`` (0 or
    :data:`~trtcore.kv_modes.SPARE_ROWS`; 0 for an engine that does not say)."""
    try:
        high = engine.get_tensor_profile_shape(SEQ_LENS, 0)[2]
        return max(0, min(int(high[0]) - max_batch_size, SPARE_ROWS))
    except Exception:  # noqa: BLE001 - an engine without profile queries: no spare row
        return 0


class _Empty:
    """A batch of no sequences: :func:`fill_step` pads it whole (warm-up of a bucket)."""

    seqs: list[Any] = []
