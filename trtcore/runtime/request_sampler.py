"""Sampling on the device for the device executor: the running requests' sampling state over
one batched sampling kernel.

:class:`RequestSampler` keeps, per request, its :class:`~trtcore.runtime.sampling.SamplingRow`
(the seed drawn once: ``params.seed``, else 64 random bits) and its ``RowParams`` record packed
once (:meth:`GpuSampler.pack_row <trtcore.runtime.sampling_gpu.GpuSampler.pack_row>`); a step
gathers the records of its rows, sets each one's Philox counter (``step`` = tokens it generated
so far, so a seeded request draws the same tokens alone or beside any others), repacks only
the rows whose ``min_tokens`` mask is still changing, and enqueues the kernel on the logits
the engine left on the device. Only the sampled ids (and requested logprobs) come back to the
host: ``16`` bytes per row instead of the ``4 * vocab_size`` of the logits.

Penalty slots: a request with repetition / frequency / presence penalties needs one of the
kernel's ``num_slots`` rows of prompt mask and output counts. It takes a free slot the first
time it is sampled (filled from its prompt and the outputs it has so far); when none is free,
it takes the slot of a request not in this step (that one refills its slot when it is sampled
again, e.g. after a preemption), so any number of waiting requests with penalties can be live.

The kernel: :class:`~trtcore.runtime.sampling_gpu.GpuSampler` on a CUDA device, or
:class:`HostSamplerKernel` on the stand-in :class:`~trtcore.runtime.device_memory.HostDevice`,
which runs the NumPy reference (:func:`trtcore.runtime.sampling.sample_rows`, the GPU kernel's
contract) on the records the step staged, so the CPU tests check this module's packing.

A request the kernel cannot serve -- more logprobs than it returns (``max_logprobs``, 20),
more EOS / stop ids than ``min_tokens`` masks there (``max_banned``, 32) -- is sampled on the
host instead: its row of the logits is copied back and sampled by the NumPy reference with
the same seed and step (the same tokens the kernel would draw), so every request the host
sampler serves is served, only slower.

A row whose logits hold a NaN or an infinity, or that has no token left to sample, gets an
error instead of a token (as the host sampler's caller, :func:`trtcore.runtime.generate.sample_rows`).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..errors import TrtcoreError
from .request import Request
from .sampling import NON_FINITE_HINT, SampleResult, SamplingRow, _banned, sample_rows
from .sampling_gpu import STATUS_FALLBACK, STATUS_INACTIVE, STATUS_NONFINITE_BIT, STATUS_OK, GpuSampler, row_params_dtype

__all__ = ["HostSamplerKernel", "RequestSampler", "SamplingStep", "make_sampler_kernel"]


def make_sampler_kernel(device: Any, max_batch_size: int, vocab_size: int, max_model_len: int) -> Any:
    """The batched sampling kernel for ``device``: :class:`GpuSampler` (float32 logits, on the
    device's stream) on a CUDA device, :class:`HostSamplerKernel` on a host stand-in."""
    from .device_memory import HostDevice

    if isinstance(device, HostDevice):
        return HostSamplerKernel(device, max_batch_size, vocab_size)
    sampler = GpuSampler(max_batch_size, vocab_size, "float32", stream=device.stream, max_model_len=max(int(max_model_len), 64), host_sides=2)
    device.at_close(sampler.close)  # before the device destroys the stream the sampler syncs on
    device.pools["sampler"] += sampler.device_bytes  # for the start-up report (its own cudaMallocs)
    device.host_pools["sampler"] += sampler.pinned_bytes
    return sampler


class HostSamplerKernel:
    """:class:`GpuSampler`'s interface on a :class:`HostDevice`: :meth:`sample` enqueues the
    NumPy reference on the rows staged by :meth:`set_packed`, reading each row's seed, step
    and ``min_tokens`` count from its staged record and a penalty row's tokens from its slot
    (what the kernel reads: the slot's prompt and the outputs counted so far, kept up to date
    by the sampling itself), and the logits from device memory. Work runs in the device's
    stream order, so on a deferred :class:`HostDevice` two steps can be in flight."""

    max_logprobs = 20
    max_banned = 32
    pack_row = GpuSampler.pack_row

    def __init__(self, device: Any, max_batch_size: int, vocab_size: int) -> None:
        self.device = device
        self.max_batch_size, self.vocab_size = int(max_batch_size), int(vocab_size)
        self.num_slots = self.max_batch_size
        self.params_dtype = row_params_dtype(self.max_banned)
        # the two host sides' "pinned memory": (records, rows, ticket) staged last on each
        self._sides: list[tuple[np.ndarray, list[SamplingRow | None], int] | None] = [None, None]
        self._turn = 0
        self._next_ticket = 0
        self._results: dict[int, SampleResult] = {}  # by ticket, once the device ran it
        # "device" state: each slot's prompt and counted outputs; the last step's tokens
        self._slots: list[tuple[list[int], list[int]]] = [([], []) for _ in range(self.num_slots)]
        self._last_tokens = np.zeros(0, np.int64)
        self.num_slot_fills = 0

    @property
    def _staged(self) -> np.ndarray:
        """The records staged last (tests)."""
        staged = self._sides[self._turn]
        return np.zeros(0, self.params_dtype) if staged is None else staged[0]

    def add_request(self, slot: int, prompt_token_ids: Sequence[int], output_token_ids: Sequence[int] = ()) -> None:
        """Enqueue the reset of penalty slot ``slot`` to this prompt and these outputs."""
        self.num_slot_fills += 1
        filled = ([int(t) for t in prompt_token_ids], [int(t) for t in output_token_ids])

        def fill() -> None:
            self._slots[int(slot)] = filled

        self.device.enqueue(fill)

    def set_packed(self, staged: np.ndarray, rows: Sequence[SamplingRow | None], side: int | None = None) -> int:
        """Stage the records of the next step on ``side`` (default: the next in turn; copied:
        the caller reuses its array); returns the step's ticket."""
        self._turn = 1 - self._turn if side is None else int(side)
        ticket = self._next_ticket
        self._next_ticket += 1
        self._sides[self._turn] = (staged.copy(), list(rows), ticket)
        return ticket

    def stage(
        self,
        table: np.ndarray,
        index: Sequence[int],
        steps: Sequence[int],
        rows: Sequence[SamplingRow | None],
        side: int | None = None,
        version: int | None = None,
    ) -> int:
        """:meth:`GpuSampler.stage`: :meth:`set_packed` of ``table[index]`` with each
        record's ``step`` set to ``steps[i]`` (``version`` is not used: it copies anyway)."""
        staged = table[list(index)]
        staged["step"] = steps
        return self.set_packed(staged, rows, side)

    def sample(self, logits: int, row_stride: int | None = None) -> int:
        """Enqueue the reference on ``[rows, row_stride]`` float32 logits at ``logits`` for
        the records staged last; returns their ticket for :meth:`result`."""
        staged = self._sides[self._turn]
        assert staged is not None, "set_packed() first"
        self.enqueue_step(self._turn, len(staged[1]), logits, row_stride)
        return staged[2]

    def enqueue_step(self, side: int, rows: int, logits: int, row_stride: int | None = None) -> None:
        """Enqueue the reference on what ``side`` holds when it runs (capturable: a graph
        replay samples the records staged on that side before it)."""
        stride = self.vocab_size if row_stride is None else int(row_stride)

        def run() -> None:
            staged_side = self._sides[side]
            assert staged_side is not None
            staged, all_rows, ticket = staged_side
            n = min(int(rows), len(all_rows))
            staged, live_rows = staged[:n], all_rows[:n]
            x = self.device.view(int(logits), (n, stride), np.float32)[:, : self.vocab_size].astype(np.float32)
            live = [i for i, r in enumerate(live_rows) if r is not None]
            tokens = np.full(n, -1, np.int64)
            fallback = np.zeros(n, bool)
            logprobs: list[Any] = [None] * n
            nonfinite = ~np.isfinite(x).all(axis=1)
            if live:
                keyed = []
                for i in live:
                    r, rec = live_rows[i], staged[i]
                    assert r is not None
                    step = int(rec["step"])
                    prompt: Sequence[int]
                    if r.params.has_penalties:
                        prompt, outputs = self._slots[int(rec["slot"])]
                    else:  # only its length matters (min_tokens)
                        prompt, outputs = r.prompt_token_ids, [0] * step
                    keyed.append(SamplingRow(r.params, prompt, list(outputs), r.eos_token_ids, seed=int(rec["seed"]), step=step))
                res = sample_rows(x[live], keyed)
                tokens[live], fallback[live] = res.token_ids, res.fallback
                for j, i in enumerate(live):
                    logprobs[i] = res.logprobs[j]
                    r = live_rows[i]
                    assert r is not None
                    if r.params.has_penalties and not res.fallback[j]:  # the kernel counts the token in its slot
                        self._slots[int(staged[i]["slot"])][1].append(int(res.token_ids[j]))
            self._last_tokens = tokens
            self._results[ticket] = SampleResult(tokens, logprobs, fallback, nonfinite)

        self.device.enqueue(run)

    def stage_inputs(self, dst: int, src: int, nbytes: int, input_ids: int, num_tokens: int) -> None:
        """Enqueue :meth:`GpuSampler.stage_inputs`: the copy of ``nbytes`` of staged inputs
        from ``src`` to ``dst``, then the write of the tokens in flight: an id ``-(row + 1)``
        in the int32 ``input_ids [num_tokens]`` becomes the token the last sampling drew for
        ``row``."""
        self.device.copy_async(int(dst), int(src), int(nbytes))
        if not num_tokens:
            return

        def run() -> None:
            ids = self.device.view(int(input_ids), (int(num_tokens),), np.int32)
            fed = np.flatnonzero(ids < 0)
            if len(fed):
                rows, last = -(ids[fed].astype(np.int64) + 1), self._last_tokens
                got = np.full(len(fed), -1, np.int64)
                known = rows < len(last)
                got[known] = last[rows[known]]
                ids[fed] = np.where((got >= 0) & (got < self.vocab_size), got, 0)

        self.device.enqueue(run)

    def result(self, ticket: int | None = None) -> SampleResult:
        """The results of step ``ticket`` (default the last staged), after the device ran it
        (on a deferred device: running its queue until they exist)."""
        ticket = self._next_ticket - 1 if ticket is None else ticket
        run_while = getattr(self.device, "run_while", None)
        if run_while is not None:
            run_while(lambda: ticket not in self._results)
        res = self._results.pop(ticket, None)
        assert res is not None, f"the device produced no results for step {ticket} (its side was restaged before it ran?)"
        return res

    def result_status(self, ticket: int | None = None) -> list[list[int]]:
        """:meth:`GpuSampler.result_status`: ``[token, status]`` per row of :meth:`result`
        (the kernel's status codes: inactive rows, fallbacks, the non-finite bit)."""
        res = self.result(ticket)
        nonfinite = res.nonfinite if res.nonfinite is not None else np.zeros(len(res.token_ids), bool)
        return [
            [t, (STATUS_FALLBACK if fb else STATUS_INACTIVE if t < 0 else STATUS_OK) | (STATUS_NONFINITE_BIT if nf else 0)]
            for t, fb, nf in zip(res.token_ids.tolist(), res.fallback.tolist(), nonfinite.tolist())
        ]

    def close(self) -> None:
        """Nothing to free."""


class SamplingStep(NamedTuple):
    """One enqueued sampling (:meth:`RequestSampler.enqueue`): its rows' request ids (None:
    inactive), the rows sampled on the host ``(row, request id)``, the kernel's ticket, and
    whether a row asks for logprobs. Immutable (a ``NamedTuple``: one per step)."""

    request_ids: list[Hashable | None]
    host_rows: list[tuple[int, Hashable]]
    ticket: Any
    logprobs: bool = True


_NO_TOKEN = "no token can be sampled: every logit is masked or non-finite"


@dataclass
class _State:
    """A live request's sampling state."""

    request: Request
    row: SamplingRow
    index: int  # its record's row of the records table
    masking: bool  # min_tokens still bans EOS / stop ids: repack each step
    penalties: bool  # it needs a penalty slot (params.has_penalties, asked once)
    logprobs: bool  # it asks for logprobs
    slot: int | None = None  # penalty slot, when it holds one
    host: bool = False  # sampled on the host (parameters beyond the kernel's limits)


class RequestSampler:
    """The sampling state of the live requests over one batched kernel (module docstring).

    Args:
        kernel: :class:`GpuSampler` or :class:`HostSamplerKernel` (:func:`make_sampler_kernel`).
        read_logits: ``rows -> float32 [rows, vocab_size]``, the first rows of this step's
            logits on the host (waits for them), for requests sampled on the host.

    Attributes:
        num_slot_fills: penalty slots filled so far (a request's first sampling, or after its
            slot was taken by another).
        wait_seconds: time :meth:`collect` spent blocked on the device so far (the wait for
            the sampled ids: the GPU's share of a step, for host-time measurements).
        cpu_clock: None, or a clock of the calling thread's CPU time in seconds (such as
            :func:`time.thread_time`): then :meth:`collect` also adds its waits' CPU time (a
            spinning wait is busy) to ``wait_cpu_seconds``, for host-time measurements.
    """

    def __init__(self, kernel: Any, read_logits: Callable[[int], np.ndarray] | None = None) -> None:
        self.kernel = kernel
        self.read_logits = read_logits
        self._states: dict[Hashable, _State] = {}
        self._num_host = 0  # live requests sampled on the host
        self._slot_owner: list[Hashable | None] = [None] * int(kernel.num_slots)
        # every live request's packed record, one row each (row 0: zeros, for inactive rows);
        # a step gathers its rows with one fancy index
        self._table = np.zeros(64, kernel.params_dtype)
        self._version = 0  # changes to _table and the live requests so far (what a staged side's records depend on)
        # per kernel side, what enqueue staged there last when it can be restaged by its steps
        # alone (a steady decode: the same requests on the same rows, nothing repacked since):
        # (version, rows, request ids, [(row, request)] of the kernel's rows, steps, host rows, logprobs)
        self._steady: dict[int, tuple[Any, ...]] = {}
        self._restage = getattr(kernel, "restage_steps", None)
        self._free_rows = list(range(63, 0, -1))
        self.num_slot_fills = 0
        self.wait_seconds = 0.0
        self.cpu_clock: Callable[[], float] | None = None
        self.wait_cpu_seconds = 0.0

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._states

    @property
    def has_host_requests(self) -> bool:
        """Whether a live request is sampled on the host (its token never reaches the
        device's results, so a step cannot be staged before it is known)."""
        return self._num_host > 0

    def add_request(self, request: Request) -> None:
        """Register ``request``: draw its seed and pack its record (or mark it for the host
        when the kernel cannot serve its parameters and ``read_logits`` was given).

        Raises:
            InvalidRequestError: parameters the kernel cannot serve, without ``read_logits``.
        """
        p = request.params
        seed = p.seed if p.seed is not None else (0 if p.greedy else secrets.randbits(64))
        row = SamplingRow(p, request.prompt_token_ids, request.output_token_ids, sorted(request.eos_token_ids), seed=seed)
        host = False
        try:
            record = self.kernel.pack_row(row, 0 if p.has_penalties else -1, what=f"request {request.request_id}")
        except TrtcoreError:
            if self.read_logits is None:
                raise
            host, record = True, np.zeros(1, self._table.dtype)
        masking = not host and bool(_banned(p, 0, row.eos_token_ids))
        if not self._free_rows:  # grow the table (doubling)
            n = len(self._table)
            self._table = np.concatenate([self._table, np.zeros(n, self._table.dtype)])
            self._version += 1
            self._free_rows = list(range(2 * n - 1, n - 1, -1))
        index = self._free_rows.pop()
        self._table[index] = record[0]
        self._version += 1
        self._states[request.request_id] = _State(request, row, index, masking, p.has_penalties, p.logprobs is not None, host=host)
        self._num_host += host

    def remove_request(self, request_id: Hashable) -> None:
        """Forget a finished request and free its penalty slot (no error if unknown)."""
        st = self._states.pop(request_id, None)
        if st is None:
            return
        self._version += 1
        if st.slot is not None:
            self._slot_owner[st.slot] = None
        self._free_rows.append(st.index)
        self._num_host -= st.host

    def _take_slot(self, st: _State, request_ids: Sequence[Hashable | None]) -> int:
        """A penalty slot for ``st`` (free, else one whose owner is not in this step's ``request_ids``)."""
        owners = self._slot_owner
        try:
            slot = owners.index(None)
        except ValueError:
            in_step = set(request_ids)
            slot = next(i for i, o in enumerate(owners) if o not in in_step)  # num_slots >= rows of a step
            self._states[owners[slot]].slot = None  # type: ignore[index]
        owners[slot] = st.request.request_id
        st.slot = slot
        self._table[st.index]["slot"] = slot
        self._version += 1
        self.kernel.add_request(slot, st.request.prompt_token_ids, st.request.output_token_ids)
        self.num_slot_fills += 1
        return slot

    def enqueue(
        self, request_ids: Sequence[Hashable | None], logits_ptr: int, row_stride: int, *, side: int | None = None, rows: int | None = None
    ) -> SamplingStep:
        """Enqueue the sampling of one step behind it on the device: row ``i`` of the float32
        logits ``[len(request_ids), row_stride]`` at ``logits_ptr`` is sampled for
        ``request_ids[i]`` (None: a row that produces no token, left inactive). Returns the
        step for :meth:`collect`; two steps may be in flight (asynchronous scheduling).

        ``side``: the kernel's host side to stage on (default: the next in turn). ``rows``:
        stage that many rows (the ones past ``request_ids`` inactive) and launch nothing: a
        graph captured with the kernel's ``enqueue_step`` on that side samples them when it
        is replayed next.

        A request's Philox step (and what ``min_tokens`` bans) is the count of tokens it
        generated before this one: its outputs plus the ones still in flight
        (``Request.num_output_placeholders`` counts those and this one).

        Steady decode (vLLM v1's persistent batch: apply what changed, rebuild nothing): when
        this side's last staging had the same ``request_ids`` and ``rows`` and nothing changed
        since (no request added or removed, no record repacked, no penalty slot moved: the
        table's version), only each row's step is written (:meth:`GpuSampler.restage_steps`)."""
        if side is not None:
            hit = self._steady.get(side)
            if hit is not None and hit[0] == self._version and hit[1] == rows and hit[2] == request_ids:
                kept_steps = hit[4]
                for row, kept in hit[3]:  # the steps as the loop below computes them
                    in_flight = kept.num_output_placeholders
                    kept_steps[row] = len(kept.output_token_ids) + (in_flight - 1 if in_flight > 1 else 0)
                ticket = self._restage(side, kept_steps, self._version)  # type: ignore[misc]
                if ticket is not None:
                    ids = request_ids if type(request_ids) is list else list(request_ids)
                    return tuple.__new__(SamplingStep, (ids, list(hit[5]), ticket, hit[6]))  # SamplingStep(...) without its Python __new__
        states, table = self._states, self._table
        steady = self._restage is not None and side is not None and rows is not None
        active: list[tuple[int, Request]] = []
        index = []
        sampling_rows: list[SamplingRow | None] = []
        steps = []
        host_rows: list[tuple[int, Hashable]] = []
        logprobs = False
        i = 0
        for rid in request_ids:
            st = None if rid is None else states[rid]
            if st is None or st.host:  # inactive in the kernel
                if st is not None:
                    host_rows.append((i, rid))
                index.append(0)
                sampling_rows.append(None)
                steps.append(0)
                i += 1
                continue
            i += 1
            req = st.request
            in_flight = req.num_output_placeholders
            n_out = len(req.output_token_ids) + (in_flight - 1 if in_flight > 1 else 0)
            if st.masking:
                table[st.index] = self.kernel.pack_row(st.row, int(table[st.index]["slot"]), what=f"request {rid}", num_generated=n_out)[0]
                self._version += 1
                st.masking = n_out < st.row.params.min_tokens
            if st.penalties and st.slot is None:
                self._take_slot(st, request_ids)
            if st.masking:
                steady = False
            active.append((i - 1, req))
            index.append(st.index)
            sampling_rows.append(st.row)
            steps.append(n_out)
            if st.logprobs:
                logprobs = True
        if rows is not None and rows > i:  # padding rows of a captured step: inactive
            pad = rows - i
            index += [0] * pad
            sampling_rows += [None] * pad
            steps += [0] * pad
        ticket = self.kernel.stage(self._table, index, steps, sampling_rows, side, self._version)
        if rows is None:
            self.kernel.sample(logits_ptr, row_stride)
        if steady:
            self._steady[side] = (self._version, rows, list(request_ids), active, list(steps), host_rows, logprobs)  # type: ignore[index]
        elif side is not None:
            self._steady.pop(side, None)
        ids = request_ids if type(request_ids) is list else list(request_ids)
        return tuple.__new__(SamplingStep, (ids, host_rows, ticket, logprobs))  # SamplingStep(...) without its Python __new__

    def stage_inputs(self, dst: int, src: int, nbytes: int, input_ids: int, num_tokens: int) -> None:
        """Enqueue the copy of a step's staged inputs (pinned host ``src`` -> device ``dst``,
        ``nbytes``) with the write of the last step's sampled tokens into its ``input_ids``
        (``-(row + 1)`` placeholders among ``num_tokens``; :meth:`GpuSampler.stage_inputs`)."""
        self.kernel.stage_inputs(dst, src, nbytes, input_ids, num_tokens)

    def collect(self, step: SamplingStep) -> tuple[dict[Hashable, int], dict[Hashable, Any], dict[Hashable, str]]:
        """Wait for ``step`` (an :meth:`enqueue`'s) and return ``(tokens, logprobs, errors)``
        by request id: a row with a NaN / infinity, or with no token to sample, gets an error."""
        ids = step.request_ids
        sampled: dict[Hashable, int] = {}
        logprobs: dict[Hashable, Any] = {}
        errors: dict[Hashable, str] = {}
        clock = self.cpu_clock
        c0 = clock() if clock is not None else 0.0
        if not step.logprobs and not step.host_rows:  # tokens and statuses only: no arrays
            t0 = time.perf_counter()
            status = self.kernel.result_status(step.ticket)
            self.wait_seconds += time.perf_counter() - t0
            if clock is not None:
                self.wait_cpu_seconds += clock() - c0
            for i, rid in enumerate(ids):
                if rid is None:
                    continue
                token, code = status[i]
                if code:
                    if code & STATUS_NONFINITE_BIT:
                        errors[rid] = f"the model produced non-finite logits (NaN or inf); {NON_FINITE_HINT}"
                        continue
                    if code == STATUS_FALLBACK:
                        errors[rid] = _NO_TOKEN
                        continue
                    if code == STATUS_INACTIVE:
                        token = -1
                sampled[rid] = token
                logprobs[rid] = None
            return sampled, logprobs, errors
        t0 = time.perf_counter()
        res = self.kernel.result(step.ticket)
        self.wait_seconds += time.perf_counter() - t0
        if clock is not None:
            self.wait_cpu_seconds += clock() - c0
        nonfinite = res.nonfinite if res.nonfinite is not None else np.zeros(len(ids), bool)
        if step.host_rows:  # the requests beyond the kernel's limits: the reference on their rows
            assert self.read_logits is not None
            host = step.host_rows
            nonfinite = nonfinite.copy()
            logits = self.read_logits(host[-1][0] + 1)
            keyed = []
            for _, rid in host:
                r = self._states[rid].row
                keyed.append(SamplingRow(r.params, r.prompt_token_ids, list(r.output_token_ids), r.eos_token_ids, seed=r.seed))
            rows = logits[[i for i, _ in host]]
            ref = sample_rows(rows, keyed)
            res = SampleResult(res.token_ids.copy(), list(res.logprobs), res.fallback.copy(), nonfinite)
            for j, (i, _) in enumerate(host):
                res.token_ids[i], res.fallback[i], res.logprobs[i] = ref.token_ids[j], ref.fallback[j], ref.logprobs[j]
                nonfinite[i] = not np.isfinite(rows[j]).all()
        tokens, lps = res.token_ids.tolist(), res.logprobs
        bad = (nonfinite[: len(ids)] | res.fallback[: len(ids)]).tolist() if (nonfinite.any() or res.fallback.any()) else None
        for i, rid in enumerate(ids):
            if rid is None:
                continue
            if bad is not None and bad[i]:
                if nonfinite[i]:
                    errors[rid] = f"the model produced non-finite logits (NaN or inf); {NON_FINITE_HINT}"
                else:
                    errors[rid] = _NO_TOKEN
                continue
            sampled[rid] = tokens[i]
            logprobs[rid] = lps[i]
        return sampled, logprobs, errors

    def close(self) -> None:
        """Free the kernel's buffers."""
        self.kernel.close()
