"""The sampling step on the GPU: kernels/sampling.cu (NVRTC) behind a preallocating object.

:class:`GpuSampler` samples a ``[batch, row_stride]`` logits buffer that is already on the
device and writes only the sampled ids (and the requested logprobs) into pinned host memory,
asynchronously.
It is the GPU twin of :func:`trtcore.runtime.sampling.sample_rows`: for the same logits,
:class:`~trtcore.runtime.sampling.SamplingRow` s and seeds, both give the same tokens
(Philox4x32-10 draws keyed by ``(seed, step)``; see kernels/sampling.cu for the numerics).

One step::

    sampler = GpuSampler(max_batch_size=32, vocab_size=49152, dtype="bfloat16", stream=s)
    sampler.add_request(slot, prompt_ids)        # once per request with penalties
    sampler.set_params(rows, slots)              # host: fills pinned staging memory
    sampler.sample(logits_ptr, row_stride=width) # enqueued on s: one kernel
    res = sampler.result()                       # waits for this step's event only

``sample`` allocates nothing and never synchronizes with the host, so it can be captured in
a CUDA graph (``cudaStreamBeginCapture`` on ``stream`` around it); a replay then reads the
pinned parameters written by the last ``set_params`` and writes the pinned results that
``result()`` reads. The kernel reads the parameters from and writes the results into pinned
host memory itself (mapped, ``cudaHostGetDevicePointer``): a step is one kernel node, no
copy-engine nodes, which cost a captured step microseconds of idle device between nodes
(``bench/results/h200-2026-12-05-session23``: the step's three copies back, the parameters'
copy and the staging copy, with the gaps after them, about 30 us of a 2 ms step). Capture
with the row count the replays will use.

Asynchronous scheduling (the device executor): with ``host_sides=2`` the pinned parameter
and result buffers alternate, so step n+1 is staged and enqueued before step n's results are
read (``ticket = sample(...)``, later ``result(ticket)``), and :meth:`GpuSampler.stage_inputs`
copies step n+1's staged inputs from pinned host memory to the device, writing step n's
sampled ids into its ``input_ids`` on the way. The executor's
per-step host work uses the lean twins: :meth:`GpuSampler.stage` (records gathered from a
table of packed requests straight into the pinned buffer) and :meth:`GpuSampler.result_status`
(tokens and status codes, no arrays, when no row asks for logprobs); a side's done event is
waited for before restaging it only while its step's results are unread.

Memory (allocated once, in the constructor): device results ``[max_batch_size]`` (16 bytes
each: what the next step's input staging reads), penalty data ``int32 + uint8 [num_slots,
vocab_size]`` (5 bytes per token and slot) and a ``int32 [max_model_len]`` staging buffer
for :meth:`GpuSampler.add_request`; per host side, pinned: ``RowParams [max_batch_size]``
(216 bytes each), results and the top-k logprob ids and values ``[max_batch_size,
max_logprobs]``.

Not thread-safe: one owner per instance (the step loop).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trtcore.errors import InvalidArgumentError, InvalidRequestError
from trtcore.gpu import call, check, cuda_bindings

from .sampling import Logprob, SampleResult, SamplingRow, TokenLogprobs, _banned

__all__ = ["FLAG_ACTIVE", "GpuSampler", "ROW_PARAMS_DTYPE", "ROW_RESULT_DTYPE", "row_params_dtype", "stage_records"]

FLAG_ACTIVE, FLAG_RANDOM, FLAG_PENALTIES, FLAG_BAN, FLAG_LOGPROBS = 1, 2, 4, 8, 16
STATUS_OK, STATUS_FALLBACK, STATUS_INACTIVE = 0, 1, 2
#: or-ed into a status: the row held a NaN or an infinity
STATUS_NONFINITE_BIT = 4
#: Threads per block of ``sampling_step`` (one block per row).
BLOCK = 1024
_DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}


def row_params_dtype(max_banned: int = 32) -> np.dtype:
    """NumPy twin of ``struct RowParams`` in kernels/sampling.cu (aligned: the C layout)."""
    return np.dtype(
        [
            ("temperature", "<f8"),
            ("top_p", "<f8"),
            ("min_p", "<f8"),
            ("repetition_penalty", "<f8"),
            ("presence_penalty", "<f8"),
            ("frequency_penalty", "<f8"),
            ("seed", "<u8"),
            ("step", "<u8"),
            ("top_k", "<i4"),
            ("slot", "<i4"),
            ("flags", "<i4"),
            ("num_logprobs", "<i4"),
            ("num_banned", "<i4"),
            ("reserved", "<i4"),
            ("banned", "<i4", (max_banned,)),
        ],
        align=True,
    )


#: ``struct RowParams`` with the kernel's default ``MAX_BANNED`` (32).
ROW_PARAMS_DTYPE = row_params_dtype()
#: ``struct RowResult``: the sampled token, its status (0 ok, 1 fallback, 2 inactive row),
#: its raw logprob (float32) and vLLM rank.
ROW_RESULT_DTYPE = np.dtype([("token", "<i4"), ("status", "<i4"), ("logprob", "<f4"), ("rank", "<i4")], align=True)


_RUNTIME: Any = None


def _rt() -> Any:
    global _RUNTIME
    if _RUNTIME is None:  # once: the sampler's per-step calls would pay the import machinery each time
        _RUNTIME = cuda_bindings("runtime")
    return _RUNTIME


def _call(what: str, fn: Any, *args: Any) -> Any:
    return call(what, fn, *args)


def _wait(event: Any) -> None:
    """``cudaEventSynchronize(event)``, its status checked (:func:`trtcore.gpu.check`) only
    when it is an error: the per-step wait, without the wrapper calls."""
    result = _rt().cudaEventSynchronize(event)
    if result[0]:
        check(result, "cudaEventSynchronize")


def _stream_int(stream: Any) -> int:
    if stream is None:
        return 0
    if hasattr(stream, "ptr"):
        return int(stream.ptr)
    return int(stream)


def _pointer(value: Any, what: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if hasattr(value, "__cuda_array_interface__"):
        return int(value.__cuda_array_interface__["data"][0])
    if hasattr(value, "ptr"):
        return int(value.ptr)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{what} must be a device pointer (int, __cuda_array_interface__ or .ptr), got {type(value).__name__}") from None


class _Pinned:
    """Page-locked host memory (``cudaMallocHost``) seen as a NumPy array; kernels read and
    write it at ``dptr``."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.nbytes = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        self.ptr = int(_call(f"cudaMallocHost({self.nbytes})", _rt().cudaMallocHost, self.nbytes))
        #: the address kernels use (the same as ``ptr`` with unified addressing)
        self.dptr = int(_call("cudaHostGetDevicePointer", _rt().cudaHostGetDevicePointer, self.ptr, 0))
        raw = (ctypes.c_byte * self.nbytes).from_address(self.ptr)
        self.array = np.ctypeslib.as_array(raw).view(np.uint8)[: int(np.prod(shape)) * np.dtype(dtype).itemsize].view(dtype).reshape(shape)

    def free(self) -> None:
        if self.ptr:
            _rt().cudaFreeHost(self.ptr)
            self.ptr = 0


@dataclass
class _HostSide:
    """One step's pinned host buffers (parameters in, results out) and its done event."""

    params: _Pinned
    results: _Pinned
    top_ids: _Pinned
    top_lp: _Pinned
    done: Any
    rows: list[SamplingRow | None] = field(default_factory=list)
    #: a step was staged or enqueued on this side since its results were last read
    pending: bool = False
    #: what :meth:`GpuSampler.stage` last wrote here, ``(table, version, index)``; None after
    #: any other write (its records are still in place when the next stage names the same)
    staged: Any = None

    def __post_init__(self) -> None:
        # raw views for the per-step host work: records as bytes rows and 8-byte words, results as int32
        params = self.params.array
        self.params_u8 = params.view(np.uint8).reshape(len(params), params.dtype.itemsize)
        self.params_u64 = params.view(np.uint64).reshape(len(params), params.dtype.itemsize // 8)
        results = self.results.array
        self.results_i32 = results.view(np.int32).reshape(len(results), results.dtype.itemsize // 4)
        #: ``[token, status]`` of the first ``n`` rows, by ``n`` (result_status's view, made once)
        self.status_views = [self.results_i32[:n, :2] for n in range(len(results) + 1)]


def stage_records(dst_u8: np.ndarray, dst_u64: np.ndarray, table_u8: np.ndarray, index: Sequence[int], steps: Sequence[int], step_col: int) -> None:
    """Write records ``table[index]`` into the first ``len(index)`` rows of a ``RowParams``
    buffer and set each one's ``step`` to ``steps[i]``: ``dst_u8`` / ``dst_u64`` are the
    buffer's ``uint8 [rows, itemsize]`` / ``uint64 [rows, itemsize // 8]`` views, ``table_u8``
    the table's ``uint8`` view, ``step_col`` the ``step`` field's offset in 8-byte words. The
    same bytes as ``staged = table[index]; staged["step"] = steps``, without the temporary
    arrays (a row at a time for a few rows: NumPy's fancy indexing costs microseconds)."""
    n = len(index)
    if n <= 8:
        for i in range(n):
            dst_u8[i] = table_u8[index[i]]
            dst_u64[i, step_col] = steps[i]
    else:
        np.take(table_u8, index, axis=0, out=dst_u8[:n])
        dst_u64[:n, step_col] = steps


class GpuSampler:
    """Batched sampling on the GPU with preallocated buffers (see the module docstring).

    Args:
        max_batch_size: most rows of one :meth:`sample` (the padded batch of a graph
            bucket included).
        vocab_size: the tokenizer's vocabulary: ids are always in ``[0, vocab_size)``,
            columns beyond it (embedding padding) are never read.
        dtype: the logits' dtype, ``"float32"``, ``"float16"`` or ``"bfloat16"``.
        stream: the CUDA stream (int handle, ``cuda.bindings`` stream or an object with
            ``.ptr``) every copy and kernel is enqueued on; not the legacy default stream
            if the step is to be captured in a graph.
        max_logprobs: the most top-k logprobs a row may ask for (vLLM's ``max_logprobs``,
            default 20); a compile-time constant of the kernel.
        max_banned: the most EOS + stop ids ``min_tokens`` can mask per row.
        num_slots: penalty-data slots (one per running request with penalties); default
            ``max_batch_size``.
        max_model_len: the most prompt + output ids :meth:`add_request` takes.
        host_sides: sets of pinned parameter / result buffers used in turn, 1 or 2. With 1 a
            captured :meth:`sample` replays on the buffers the next :meth:`set_params` fills;
            with 2 (the device executor's asynchronous scheduling) a step's parameters can be
            staged while the previous step's results are still to be read.
        arch: NVRTC target (default: the current GPU).

    Raises:
        InvalidArgumentError: a size < 1 or an unknown dtype.
        NoGPUError, CUDAError, NVRTCError: no GPU, a failed allocation, a failed compile.
    """

    def __init__(
        self,
        max_batch_size: int,
        vocab_size: int,
        dtype: str = "float32",
        stream: Any = 0,
        *,
        max_logprobs: int = 20,
        max_banned: int = 32,
        num_slots: int | None = None,
        max_model_len: int = 8192,
        host_sides: int = 1,
        arch: str | None = None,
    ) -> None:
        from trtcore import kernels

        for name, v in (
            ("max_batch_size", max_batch_size),
            ("vocab_size", vocab_size),
            ("max_logprobs", max_logprobs),
            ("max_banned", max_banned),
            ("max_model_len", max_model_len),
            ("host_sides", host_sides),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidArgumentError(f"GpuSampler {name} must be an integer >= 1, got {v!r}")
        if host_sides > 2:
            raise InvalidArgumentError(f"GpuSampler host_sides must be 1 or 2, got {host_sides}")
        if dtype not in _DTYPES:
            raise InvalidArgumentError(f"GpuSampler dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
        self.max_batch_size, self.vocab_size, self.dtype = max_batch_size, vocab_size, dtype
        self.max_logprobs, self.max_banned, self.max_model_len = max_logprobs, max_banned, max_model_len
        self.num_slots = max_batch_size if num_slots is None else int(num_slots)
        self.stream = _stream_int(stream)
        self._closed = True
        self.params_dtype = row_params_dtype(max_banned)
        ck = kernels.compile_kernel(
            "sampling", defines={"DTYPE": _DTYPES[dtype], "MAX_LOGPROBS": max_logprobs, "MAX_BANNED": max_banned, "BLOCK": BLOCK}, arch=arch
        )
        self._step_fn = ck.function("sampling_step")
        self._clear_fn = ck.function("sampling_clear_slot")
        self._fill_fn = ck.function("sampling_fill_slot")
        self._layout_fn = ck.function("sampling_layout")
        self._stage_fn = ck.function("sampling_stage_inputs")
        self._mapped: dict[int, int] = {}  # pinned host pointer -> its device pointer (stage_inputs)

        rt = _rt()
        self._device: list[int] = []

        #: bytes of device / pinned host memory the sampler holds (for the memory report)
        self.device_bytes = self.pinned_bytes = 0

        def dmalloc(nbytes: int, what: str) -> int:
            ptr = int(_call(f"cudaMalloc({nbytes}) for the sampler's {what}", rt.cudaMalloc, max(1, nbytes)))
            self._device.append(ptr)
            self.device_bytes += max(1, nbytes)
            return ptr

        self._pinned: list[_Pinned] = []

        def pinned(shape: tuple[int, ...], dt: Any) -> _Pinned:
            buf = _Pinned(shape, np.dtype(dt))
            self._pinned.append(buf)
            self.pinned_bytes += buf.nbytes
            return buf

        B, ML, V = max_batch_size, max_logprobs, vocab_size
        self._results_d = dmalloc(B * ROW_RESULT_DTYPE.itemsize, "results")
        self._counts_d = dmalloc(self.num_slots * V * 4, "output-token counts")
        self._mask_d = dmalloc(self.num_slots * V, "prompt masks")
        self._ids_d = dmalloc(max(max_model_len, 64) * 4, "add_request staging")
        self._ids_h = pinned((max_model_len,), np.int32)
        flags = rt.cudaEventDisableTiming

        def event() -> Any:
            ev = _call("cudaEventCreateWithFlags", rt.cudaEventCreateWithFlags, flags)
            self._events.append(ev)
            return ev

        self._events: list[Any] = []
        # host sides used in turn: with two, the host fills one step's parameters and reads the
        # step before's results while the device may still copy the other's (asynchronous scheduling)
        self._sides = [
            _HostSide(
                pinned((B,), self.params_dtype), pinned((B,), ROW_RESULT_DTYPE), pinned((B, ML), np.int32), pinned((B, ML), np.float32), event()
            )
            for _ in range(host_sides)
        ]
        self._turn = 0  # the side of the last set_packed (sample and result use it)
        self._table: Any = None  # the records table of the last stage() and its byte view
        self._table_u8: Any = None
        fields = self.params_dtype.fields
        assert fields is not None  # a structured dtype
        self._step_col = int(fields["step"][1]) // 8
        self._ev_ids = event()
        self._closed = False
        _call("cudaMemsetAsync(counts)", rt.cudaMemsetAsync, self._counts_d, 0, self.num_slots * V * 4, self.stream)
        _call("cudaMemsetAsync(prompt masks)", rt.cudaMemsetAsync, self._mask_d, 0, self.num_slots * V, self.stream)
        _call("cudaStreamSynchronize", rt.cudaStreamSynchronize, self.stream)

    # ---- set-up ----------------------------------------------------------------------------

    def layout(self) -> list[int]:
        """The kernel's ``sizeof``/``offsetof`` of ``RowParams`` and ``RowResult`` (synchronous;
        for tests): ``[sizeof(RowParams), offsets..., sizeof(RowResult), offsets...]``."""
        rt = _rt()
        self._layout_fn.launch(1, 1, [(self._ids_d, "ptr")], stream=self.stream)
        _call("cudaStreamSynchronize", rt.cudaStreamSynchronize, self.stream)
        out = np.zeros(21, np.int32)
        _call("cudaMemcpy", rt.cudaMemcpy, out.ctypes.data, self._ids_d, out.nbytes, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        return [int(v) for v in out]

    def add_request(self, slot: int, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int] = ()) -> None:
        """Reset penalty slot ``slot`` for a request: its prompt mask and output counts.

        Call it when a request with penalties is admitted (or re-admitted after preemption,
        with its outputs so far); :meth:`sample` keeps the counts up to date afterwards.
        Enqueued on the stream (one small host-to-device copy and two kernels).

        Raises:
            InvalidArgumentError: ``slot`` outside ``[0, num_slots)`` or more than
                ``max_model_len`` ids.
        """
        self._check_open()
        if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) or not 0 <= int(slot) < self.num_slots:
            raise InvalidArgumentError(f"slot must be an integer in [0, {self.num_slots}), got {slot!r}")
        ids = [int(t) for t in prompt_token_ids] + [int(t) for t in output_token_ids]
        if len(ids) > self.max_model_len:
            raise InvalidArgumentError(f"{len(ids)} prompt + output ids exceed the sampler's max_model_len={self.max_model_len}")
        rt = _rt()
        _call("cudaEventSynchronize", rt.cudaEventSynchronize, self._ev_ids)  # the last reset's copy is done
        self._ids_h.array[: len(ids)] = ids
        if ids:
            h2d = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
            _call("cudaMemcpyAsync(add_request ids)", rt.cudaMemcpyAsync, self._ids_d, self._ids_h.ptr, 4 * len(ids), h2d, self.stream)
        _call("cudaEventRecord", rt.cudaEventRecord, self._ev_ids, self.stream)
        V, slot = self.vocab_size, int(slot)
        self._clear_fn.launch(
            min(1024, -(-V // 256)), 256, [(self._counts_d, "ptr"), (self._mask_d, "ptr"), (V, "i32"), (slot, "i32")], stream=self.stream
        )
        if ids:
            args = [
                (self._counts_d, "ptr"),
                (self._mask_d, "ptr"),
                (V, "i32"),
                (slot, "i32"),
                (self._ids_d, "ptr"),
                (len(prompt_token_ids), "i32"),
                (len(ids), "i32"),
            ]
            self._fill_fn.launch(min(1024, -(-len(ids) // 256)), 256, args, stream=self.stream)

    def set_params(self, rows: Sequence[SamplingRow | None], slots: Sequence[int] | None = None) -> None:
        """Write the next step's per-row parameters into the pinned staging buffer (host only).

        Args:
            rows: one :class:`~trtcore.runtime.sampling.SamplingRow` per logits row; None
                marks a padding row (it reads nothing and its result is ignored).
            slots: per row, its penalty slot (:meth:`add_request`); needed for rows with
                penalties, -1 or None otherwise. Default: row ``i`` uses slot ``i``.

        Raises:
            InvalidArgumentError: more rows than ``max_batch_size``, a bad slot.
            InvalidRequestError: a sampled row without a seed, more logprobs than
                ``max_logprobs``, more EOS + stop ids than ``max_banned``.
        """
        self._check_open()
        n = len(rows)
        if not 1 <= n <= self.max_batch_size:
            raise InvalidArgumentError(f"set_params takes 1 to max_batch_size={self.max_batch_size} rows, got {n}")
        if slots is not None and len(slots) != n:
            raise InvalidArgumentError(f"{len(slots)} slots were given for {n} rows")
        staged = np.zeros(n, self.params_dtype)
        for i, row in enumerate(rows):
            if row is None:
                continue
            if not isinstance(row, SamplingRow):
                raise InvalidArgumentError(f"rows[{i}] must be a SamplingRow or None, got {type(row).__name__}")
            staged[i] = self.pack_row(row, i if slots is None else (-1 if slots[i] is None else int(slots[i])), what=f"row {i}")[0]
        self.set_packed(staged, rows)

    def pack_row(self, row: SamplingRow, slot: int = -1, *, what: str = "the row", num_generated: int | None = None) -> np.ndarray:
        """``row`` as one ``RowParams`` record (host only): ``params_dtype [1]``;
        ``num_generated`` (default ``len(row.output_token_ids)``) the tokens generated before
        this one, which decides what ``min_tokens`` still bans.

        The device executor packs a request once and updates ``step`` (and ``num_banned``
        while ``min_tokens`` masks) per step, instead of packing every row every step.

        Raises:
            InvalidArgumentError: penalties without a slot in ``[0, num_slots)``.
            InvalidRequestError: a sampled row without a seed, more logprobs than
                ``max_logprobs``, more EOS + stop ids than ``max_banned``.
        """
        p = row.params
        seed, step = row.key()
        flags = FLAG_ACTIVE | (0 if p.greedy else FLAG_RANDOM)
        if p.has_penalties:
            if not 0 <= slot < self.num_slots:
                raise InvalidArgumentError(f"{what} has penalties but slot {slot} is not in [0, {self.num_slots})")
            flags |= FLAG_PENALTIES
        banned = _banned(p, len(row.output_token_ids) if num_generated is None else int(num_generated), row.eos_token_ids)
        if len(banned) > self.max_banned:
            raise InvalidRequestError(f"{what}: min_tokens masks {len(banned)} EOS / stop ids, more than max_banned={self.max_banned}")
        if banned:
            flags |= FLAG_BAN
        if p.logprobs is not None:
            if p.logprobs > self.max_logprobs:
                raise InvalidRequestError(f"{what}: logprobs={p.logprobs} exceeds the sampler's max_logprobs={self.max_logprobs}")
            flags |= FLAG_LOGPROBS
        out = np.zeros(1, self.params_dtype)
        e = out[0]
        e["temperature"] = p.temperature if not p.greedy else 1.0
        e["top_p"], e["min_p"], e["top_k"] = p.top_p, p.min_p, p.top_k
        e["repetition_penalty"], e["presence_penalty"], e["frequency_penalty"] = p.repetition_penalty, p.presence_penalty, p.frequency_penalty
        e["seed"], e["step"], e["slot"], e["flags"] = seed, step, slot, flags
        e["num_logprobs"] = p.logprobs or 0
        e["num_banned"] = len(banned)
        e["banned"][: len(banned)] = banned
        return out

    def set_packed(self, staged: np.ndarray, rows: Sequence[SamplingRow | None], side: int | None = None) -> int:
        """Stage records made by :meth:`pack_row` (``params_dtype [n]``, zeros for a padding
        row) for the next :meth:`sample` (or a replay of a graph captured with
        :meth:`enqueue_step` on that side); ``rows`` are their rows (None: padding), which
        :meth:`result` reads for the logprobs requested. ``side``: the host side to stage
        on (default: the next in turn); it waits for that side's last step first (unless its :meth:`result` was read since). Returns
        the step's ticket for :meth:`result`.

        Raises:
            InvalidArgumentError: ``staged`` and ``rows`` differ in length, more than
                ``max_batch_size`` rows, or no such side.
        """
        self._check_open()
        n = len(rows)
        if len(staged) != n or not 1 <= n <= self.max_batch_size:
            raise InvalidArgumentError(
                f"set_packed takes 1 to max_batch_size={self.max_batch_size} records, one per row; got {len(staged)} for {n} rows"
            )
        if side is not None and not 0 <= side < len(self._sides):
            raise InvalidArgumentError(f"side {side} is not in [0, {len(self._sides)})")
        host = self._next_side(side)
        host.params.array[:n] = staged
        host.staged = None
        host.rows = list(rows)
        return self._turn

    def _next_side(self, side: int | None) -> _HostSide:
        """Turn to ``side`` (default the next), wait for its last step unless its results
        were read since (:meth:`result` waited for it then), and mark it pending."""
        self._turn = (self._turn + 1) % len(self._sides) if side is None else int(side)
        host = self._sides[self._turn]
        if host.pending:
            _wait(host.done)  # that side's last step is done
        host.pending = True
        return host

    def stage(
        self,
        table: np.ndarray,
        index: Sequence[int],
        steps: Sequence[int],
        rows: Sequence[SamplingRow | None],
        side: int | None = None,
        version: int | None = None,
    ) -> int:
        """:meth:`set_packed` of ``staged = table[index]`` with ``staged["step"] = steps``
        (``table``: ``params_dtype`` records, e.g. one per live request packed once), written
        straight into the side's pinned buffer (:func:`stage_records`): the device
        executor's per-step staging. Returns the step's ticket.

        ``version``: the caller's count of writes into ``table`` (None: unknown). When the
        side's last :meth:`stage` had the same ``table``, ``version`` and ``index``, its
        records are still in place and only the ``step`` fields are written (a steady
        decode: the same requests on the same rows, vLLM's persistent batch).

        Raises:
            InvalidArgumentError: ``index``, ``steps`` and ``rows`` differ in length, more
                than ``max_batch_size`` rows, ``table`` of another dtype, or no such side.
        """
        if self._closed:
            self._check_open()
        n = len(rows)
        if len(index) != n or len(steps) != n or not 1 <= n <= self.max_batch_size:
            raise InvalidArgumentError(
                f"stage takes 1 to max_batch_size={self.max_batch_size} rows, one index and step each; got {len(index)} / {len(steps)} for {n} rows"
            )
        if side is not None and not 0 <= side < len(self._sides):
            raise InvalidArgumentError(f"side {side} is not in [0, {len(self._sides)})")
        if table is not self._table:  # a new table (the caller grew it): its byte view, once
            if table.dtype != self.params_dtype:
                raise InvalidArgumentError(f"stage needs a table of params_dtype records, got dtype {table.dtype}")
            self._table, self._table_u8 = table, table.view(np.uint8).reshape(len(table), table.dtype.itemsize)
        # _next_side, inline (the per-step path)
        self._turn = turn = (self._turn + 1) % len(self._sides) if side is None else int(side)
        host = self._sides[turn]
        if host.pending:
            _wait(host.done)  # that side's last step is done
        host.pending = True
        staged = host.staged
        if version is not None and staged is not None and staged[1] == version and staged[0] is table and staged[2] == index:
            u64, col = host.params_u64, self._step_col  # the records are in place: the steps only
            for i in range(n):
                u64[i, col] = steps[i]
        else:
            stage_records(host.params_u8, host.params_u64, self._table_u8, index, steps, self._step_col)
            host.staged = None if version is None else (table, version, list(index))
        host.rows = list(rows)
        return self._turn

    def restage_steps(self, side: int, steps: Sequence[int], version: int) -> int | None:
        """:meth:`stage` again on ``side`` of what its last :meth:`stage` (with ``version``)
        wrote there, only each row's ``step`` set to ``steps[i]`` (the records, rows and
        index as they were): the steady decode's staging. Returns the ticket, or None (and
        does nothing) when the side holds something else since or ``version`` differs."""
        host = self._sides[side]
        staged = host.staged
        if staged is None or staged[1] != version or staged[0] is not self._table or self._closed:
            return None
        self._turn = side
        if host.pending:
            _wait(host.done)  # that side's last step is done
        host.pending = True
        u64, col = host.params_u64, self._step_col
        for i in range(len(steps)):
            u64[i, col] = steps[i]
        return side

    # ---- the step --------------------------------------------------------------------------

    def sample(self, logits: Any, row_stride: int | None = None) -> int:
        """Enqueue one step on the stream (the kernel, then the step's done event). Returns
        the step's ticket for :meth:`result` (with ``host_sides=2`` two steps may be in
        flight: the host sides alternate at each :meth:`set_packed`).

        Args:
            logits: device pointer to ``[batch, row_stride]`` logits of the constructor's
                dtype, ``batch`` = the rows of the last :meth:`set_params`.
            row_stride: elements between rows (default ``vocab_size``; larger for a padded
                embedding); must be ``>= vocab_size``.

        Raises:
            InvalidArgumentError: no :meth:`set_params` yet, a bad ``row_stride``.
        """
        self._check_open()
        ticket = self._turn
        n = len(self._sides[ticket].rows)
        if n == 0:
            raise InvalidArgumentError("call set_params() before sample()")
        self.enqueue_step(ticket, n, logits, row_stride)
        return ticket

    def enqueue_step(self, side: int, rows: int, logits: Any, row_stride: int | None = None) -> None:
        """Enqueue the step of host side ``side`` on ``rows`` rows, whatever is staged there
        when it runs: the kernel (it reads the side's pinned parameters and writes its pinned
        results and top-k logprobs) and the side's done event. :meth:`sample` calls it; the
        device executor captures it into each decode graph (one graph per side;
        :meth:`set_packed` with that side before each replay), so a replayed step samples
        inside the graph.

        Raises:
            InvalidArgumentError: no such side, ``rows`` outside ``[1, max_batch_size]``, a
                bad ``row_stride``.
        """
        self._check_open()
        if not 0 <= side < len(self._sides):
            raise InvalidArgumentError(f"side {side} is not in [0, {len(self._sides)})")
        n = int(rows)
        if not 1 <= n <= self.max_batch_size:
            raise InvalidArgumentError(f"rows={rows} is not in [1, max_batch_size={self.max_batch_size}]")
        host = self._sides[side]
        host.pending = True
        stride = self.vocab_size if row_stride is None else int(row_stride)
        if stride < self.vocab_size:
            raise InvalidArgumentError(f"row_stride={stride} is below vocab_size={self.vocab_size}")
        ptr = _pointer(logits, "logits")
        args = [
            (ptr, "ptr"), (stride, "i64"), (self.vocab_size, "i32"), (host.params.dptr, "ptr"), (self._counts_d, "ptr"),
            (self._mask_d, "ptr"), (self._results_d, "ptr"), (host.results.dptr, "ptr"), (host.top_ids.dptr, "ptr"),
            (host.top_lp.dptr, "ptr"),
        ]  # fmt: skip
        self._step_fn.launch(n, BLOCK, args, shared_mem=4 * (-(-self.vocab_size // 32)), stream=self.stream)
        self._record(host.done)

    def stage_inputs(self, dst: int, src: int, nbytes: int, input_ids: int, num_tokens: int) -> None:
        """Enqueue the copy of a step's staged int32 inputs, ``nbytes`` from pinned host
        memory ``src`` (``cudaMallocHost``) to the device at ``dst``, by a kernel (no
        copy-engine node in a captured step) that also writes the last sampled tokens into
        the step's ``input_ids`` on the way: in the int32 ``[num_tokens]`` at device address
        ``input_ids`` (inside ``dst``), an id ``-(row + 1)`` becomes the token that the last
        step drew for ``row`` (0 for a row that drew none); other ids stay. ``num_tokens`` 0:
        a plain copy. Runs between the last step's sampling and the next step's engine
        (asynchronous scheduling: the next step was staged before the host knew those
        tokens). Capturable.

        Raises:
            InvalidArgumentError: ``nbytes`` not a multiple of 4, or ``input_ids`` /
                ``num_tokens`` outside ``[dst, dst + nbytes)``.
            CUDAError: ``src`` is not pinned host memory.
        """
        self._check_open()
        dst, nbytes, input_ids, num_tokens = int(dst), int(nbytes), int(input_ids), int(num_tokens)
        words, off = nbytes // 4, input_ids - dst
        if nbytes < 0 or nbytes % 4:
            raise InvalidArgumentError(f"stage_inputs copies int32 words: nbytes={nbytes} is not a multiple of 4")
        if num_tokens < 0 or (num_tokens and (off < 0 or off % 4 or off // 4 + num_tokens > words)):
            raise InvalidArgumentError(f"input_ids (byte offset {off}, {num_tokens} tokens) is not int32 words inside the {nbytes} bytes staged")
        if not words:
            return
        mapped = self._mapped.get(int(src))
        if mapped is None:
            mapped = self._mapped[int(src)] = int(_call("cudaHostGetDevicePointer(staging)", _rt().cudaHostGetDevicePointer, int(src), 0))
        args = [
            (dst, "ptr"),
            (mapped, "ptr"),
            (words, "i32"),
            (off // 4, "i32"),
            (num_tokens, "i32"),
            (self._results_d, "ptr"),
            (self.vocab_size, "i32"),
        ]
        self._stage_fn.launch(max(1, min(1024, -(-words // 1024))), 256, args, stream=self.stream)

    def result(self, ticket: int | None = None) -> SampleResult:
        """Wait for a :meth:`sample` (its event only; default the last) and return its results.

        Returns:
            :class:`~trtcore.runtime.sampling.SampleResult` over the rows of the last
            :meth:`set_params`: ``token_ids`` int64 (``-1`` for padding rows), ``fallback``
            (unusable rows, as the host sampler's), ``nonfinite`` (rows with a NaN or an
            infinity), ``logprobs`` per row (float32 values widened to float).
        """
        self._check_open()
        side = self._sides[self._turn if ticket is None else ticket]
        _call("cudaEventSynchronize", _rt().cudaEventSynchronize, side.done)
        side.pending = False
        n = len(side.rows)
        res = side.results.array[:n].copy()
        tokens = res["token"].astype(np.int64)
        status = res["status"] & ~STATUS_NONFINITE_BIT
        tokens[status == STATUS_INACTIVE] = -1
        out: list[TokenLogprobs | None] = []
        for i, row in enumerate(side.rows):
            if row is None or row.params.logprobs is None:
                out.append(None)
                continue
            k = min(row.params.logprobs, self.vocab_size)
            top = []
            if k:
                ids, lps = side.top_ids.array[i, :k], side.top_lp.array[i, :k]
                top = [(int(t), Logprob(float(v), r)) for r, (t, v) in enumerate(zip(ids, lps), start=1)]
            out.append(TokenLogprobs(token_id=int(tokens[i]), logprob=float(res["logprob"][i]), rank=int(res["rank"][i]), top=top))
        return SampleResult(token_ids=tokens, logprobs=out, fallback=status == STATUS_FALLBACK, nonfinite=(res["status"] & STATUS_NONFINITE_BIT) != 0)

    def result_status(self, ticket: int | None = None) -> list[list[int]]:
        """:meth:`result` without the arrays: waits the same way, then ``[token, status]``
        per row as the kernel wrote them (``status``: ``STATUS_OK`` / ``STATUS_FALLBACK`` /
        ``STATUS_INACTIVE``, or-ed with ``STATUS_NONFINITE_BIT``), no logprobs: the step
        loop's path when no row asks for logprobs."""
        if self._closed:
            self._check_open()
        side = self._sides[self._turn if ticket is None else ticket]
        result = _RUNTIME.cudaEventSynchronize(side.done)  # _wait, inline (the per-step call; _RUNTIME is set once a sampler exists)
        if result[0]:
            check(result, "cudaEventSynchronize")
        side.pending = False
        return side.status_views[len(side.rows)].tolist()  # type: ignore[no-any-return]

    def _record(self, event: Any) -> None:
        """Record ``event`` on the stream; under stream capture as an event-record node of the
        graph (``cudaEventRecordExternal``), so that every replay records it."""
        rt = _rt()
        status = _call("cudaStreamIsCapturing", rt.cudaStreamIsCapturing, self.stream)
        if status == rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusActive:
            _call("cudaEventRecordWithFlags", rt.cudaEventRecordWithFlags, event, self.stream, rt.cudaEventRecordExternal)
        else:
            _call("cudaEventRecord", rt.cudaEventRecord, event, self.stream)

    # ---- life cycle ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgumentError("the GpuSampler is closed")

    def close(self) -> None:
        """Free every buffer and event (after the stream's pending work). Idempotent."""
        if self._closed:
            return
        self._closed = True
        rt = _rt()
        rt.cudaStreamSynchronize(self.stream)
        for ev in self._events:
            rt.cudaEventDestroy(ev)
        for ptr in self._device:
            rt.cudaFree(ptr)
        for buf in self._pinned:
            buf.free()
        self._device, self._pinned = [], []

    def __enter__(self) -> GpuSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: CUDA may be gone already
            pass
