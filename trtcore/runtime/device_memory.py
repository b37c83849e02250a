"""Device memory, streams and CUDA graphs behind one small interface, with two implementations:

* :class:`CudaDevice`: a CUDA GPU through ``cuda.bindings.runtime`` (``cudaMalloc``, pinned
  ``cudaMallocHost`` buffers, ``cudaMemcpyAsync`` on one non-blocking stream, stream capture
  into a ``cudaGraphExec_t``);
* :class:`HostDevice`: the same calls on host memory (NumPy buffers whose addresses stand for
  device pointers, copies with ``ctypes.memmove``, a "graph" that records the calls enqueued
  while capturing and runs them again at replay). It lets the device executor
  (:mod:`trtcore.runtime.device_runner`) run against the reference backend on the CPU, with
  CUDA's semantics where they matter: captured work does not run while it is captured, and a
  replay reads its inputs from the same addresses at replay time.

Every allocation goes through :meth:`DeviceAPI.malloc` / :meth:`DeviceAPI.host_alloc`, which
count them (:attr:`DeviceAPI.num_allocations`) and record them in :attr:`DeviceAPI.pools` under
the pool they belong to ("activations", "kv_cache", "staging", ...), so start-up can say what
went where (:meth:`DeviceAPI.memory_report`) and a test can count that the decode loop
allocates nothing.
"""

from __future__ import annotations

import ctypes
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

import numpy as np

from ..gpu import check as cuda_check

__all__ = ["ALIGNMENT", "CudaDevice", "DeviceAPI", "HostDevice", "align", "format_bytes"]

#: bytes; every buffer starts at a multiple of this (cudaMalloc gives at least 256)
ALIGNMENT = 256


def align(nbytes: int, alignment: int = ALIGNMENT) -> int:
    """``nbytes`` rounded up to a multiple of ``alignment`` (at least one ``alignment``)."""
    return max(alignment, -(-int(nbytes) // alignment) * alignment)


def format_bytes(n: int) -> str:
    """``n`` bytes as ``"12.3 MiB"`` (binary units)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover - the loop always returns


class DeviceAPI:
    """What the device executor needs from a device (base class).

    Attributes:
        num_allocations: device and pinned-host allocations made so far.
        pools: ``{pool name: bytes}`` of device memory, by what it holds.
        host_pools: ``{pool name: bytes}`` of pinned host memory.
    """

    name = "device"

    def __init__(self) -> None:
        self.num_allocations = 0
        self.pools: dict[str, int] = defaultdict(int)
        self.host_pools: dict[str, int] = defaultdict(int)
        self._closers: list[Callable[[], Any]] = []

    def at_close(self, close: Callable[[], Any]) -> None:
        """Run ``close`` first when this device closes (an object with its own buffers on the
        device's stream, e.g. the sampler: freed while the stream still exists, whichever of
        the two the garbage collector finalizes first)."""
        self._closers.append(close)

    def _run_closers(self) -> None:
        closers, self._closers = self._closers, []
        for close in closers:
            close()

    # memory -------------------------------------------------------------------------------
    def malloc(self, nbytes: int, pool: str) -> int:
        """A device pointer to ``align(nbytes)`` bytes, counted under ``pool``."""
        size = align(nbytes)
        ptr = self._malloc(size)
        self.num_allocations += 1
        self.pools[pool] += size
        return ptr

    def host_alloc(self, nbytes: int, pool: str) -> np.ndarray:
        """A pinned (page-locked) host buffer of ``align(nbytes)`` bytes as a uint8 array."""
        size = align(nbytes)
        arr = self._host_alloc(size)
        self.num_allocations += 1
        self.host_pools[pool] += size
        return arr

    def memory_report(self) -> list[str]:
        """One line per pool: ``"kv_cache: 1.2 GiB (device)"``."""
        lines = [f"{name}: {format_bytes(n)} (device)" for name, n in self.pools.items()]
        lines += [f"{name}: {format_bytes(n)} (pinned host)" for name, n in self.host_pools.items()]
        return lines

    def _malloc(self, nbytes: int) -> int:
        raise NotImplementedError

    def _host_alloc(self, nbytes: int) -> np.ndarray:
        raise NotImplementedError

    def mem_get_info(self) -> tuple[int, int]:
        """``(free, total)`` device bytes."""
        raise NotImplementedError

    # work ---------------------------------------------------------------------------------
    @property
    def stream(self) -> int:
        """The handle of the executor's (non-default) stream."""
        raise NotImplementedError

    def copy_async(self, dst: int, src: int, nbytes: int) -> None:
        """Enqueue a copy of ``nbytes`` from address ``src`` to ``dst`` (host or device) on the stream."""
        raise NotImplementedError

    def record(self) -> None:
        """Mark the end of the work enqueued so far (an event on the stream)."""
        raise NotImplementedError

    def wait(self) -> None:
        """Block the host until the work up to the last :meth:`record` is done."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Block the host until the stream is idle."""
        raise NotImplementedError

    # graphs -------------------------------------------------------------------------------
    def begin_capture(self) -> None:
        """Start capturing the stream's work into a graph (nothing enqueued runs until replayed)."""
        raise NotImplementedError

    def end_capture(self) -> Any:
        """Stop capturing; the instantiated graph."""
        raise NotImplementedError

    def launch_graph(self, graph: Any) -> None:
        """Enqueue one replay of ``graph`` on the stream."""
        raise NotImplementedError

    def close(self) -> None:
        """Free everything this device object allocated. Safe to call twice."""
        self._run_closers()


class CudaDevice(DeviceAPI):
    """A CUDA device through ``cuda.bindings.runtime``; every call's status is checked
    (:func:`trtcore.gpu.check`, a failure raises :class:`trtcore.gpu.CudaError`).

    Args:
        device: CUDA device ordinal.

    Graphs are captured in ``cudaStreamCaptureModeRelaxed`` (libraries that make a lazy
    runtime call during capture do not invalidate it) and instantiated without flags.
    """

    name = "cuda"

    def __init__(self, device: int = 0) -> None:
        super().__init__()
        from cuda.bindings import runtime as cudart

        self._rt = cudart
        self.device = int(device)
        self._device_ptrs: list[int] = []
        self._host_ptrs: list[int] = []
        self._graphs: list[tuple[Any, Any]] = []
        cuda_check(cudart.cudaSetDevice(self.device), f"cudaSetDevice({self.device})")
        # non-blocking: no implicit synchronisation with the legacy default stream, which
        # CUDA graphs cannot capture (TensorRT: capture enqueueV3 on a non-default stream)
        self._stream = cuda_check(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking), "cudaStreamCreateWithFlags")
        self._event = cuda_check(cudart.cudaEventCreateWithFlags(cudart.cudaEventDisableTiming), "cudaEventCreateWithFlags")
        self._closed = False

    def _malloc(self, nbytes: int) -> int:
        ptr = int(cuda_check(self._rt.cudaMalloc(nbytes), f"cudaMalloc({nbytes})"))
        self._device_ptrs.append(ptr)
        return ptr

    def _host_alloc(self, nbytes: int) -> np.ndarray:
        ptr = int(cuda_check(self._rt.cudaMallocHost(nbytes), f"cudaMallocHost({nbytes})"))
        self._host_ptrs.append(ptr)
        return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr))

    def mem_get_info(self) -> tuple[int, int]:
        free, total = cuda_check(self._rt.cudaMemGetInfo(), "cudaMemGetInfo")
        return int(free), int(total)

    @property
    def stream(self) -> int:
        return int(self._stream)

    def copy_async(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes:
            rt = self._rt
            cuda_check(rt.cudaMemcpyAsync(dst, src, nbytes, rt.cudaMemcpyKind.cudaMemcpyDefault, self._stream), "cudaMemcpyAsync")

    def memset(self, ptr: int, nbytes: int) -> None:
        """Enqueue zeroing ``nbytes`` at ``ptr`` (``cudaMemsetAsync``)."""
        cuda_check(self._rt.cudaMemsetAsync(ptr, 0, nbytes, self._stream), "cudaMemsetAsync")

    def record(self) -> None:
        cuda_check(self._rt.cudaEventRecord(self._event, self._stream), "cudaEventRecord")

    def wait(self) -> None:
        cuda_check(self._rt.cudaEventSynchronize(self._event), "cudaEventSynchronize")

    def synchronize(self) -> None:
        cuda_check(self._rt.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")

    def begin_capture(self) -> None:
        rt = self._rt
        cuda_check(rt.cudaStreamBeginCapture(self._stream, rt.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture")

    def end_capture(self) -> Any:
        graph = cuda_check(self._rt.cudaStreamEndCapture(self._stream), "cudaStreamEndCapture")
        exe = cuda_check(self._rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
        self._graphs.append((graph, exe))
        return exe

    def launch_graph(self, graph: Any) -> None:
        result = self._rt.cudaGraphLaunch(graph, self._stream)
        if result[0]:  # the status checked only when it is an error (the per-step call)
            cuda_check(result, "cudaGraphLaunch")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        rt = self._rt
        rt.cudaSetDevice(self.device)
        rt.cudaStreamSynchronize(self._stream)
        self._run_closers()
        for graph, exe in self._graphs:
            rt.cudaGraphExecDestroy(exe)
            rt.cudaGraphDestroy(graph)
        for ptr in self._device_ptrs:
            rt.cudaFree(ptr)
        for ptr in self._host_ptrs:
            rt.cudaFreeHost(ptr)
        self._graphs, self._device_ptrs, self._host_ptrs = [], [], []
        rt.cudaEventDestroy(self._event)
        rt.cudaStreamDestroy(self._stream)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing sensible to do in a finalizer
            pass


class HostDevice(DeviceAPI):
    """A stand-in device on host memory (see the module docstring): buffers are NumPy arrays
    whose addresses are the "device pointers"; work enqueued on the stream runs at once, except
    while capturing, when it is recorded into the graph and runs only at each replay.

    ``deferred=True`` models a device that lags the host as far as it can: enqueued work runs
    only when the host waits for it (:meth:`run_until` a :meth:`mark`, :meth:`run_while` a
    result is missing, :meth:`wait` for the last :meth:`record`, :meth:`synchronize`), so a host buffer rewritten before the copy that
    reads it has run shows up as wrong inputs in a CPU test.

    Args:
        memory: the bytes :meth:`mem_get_info` reports as the device's total (nothing enforces it).
        deferred: run enqueued work only when waited for (above).
    """

    name = "host"

    def __init__(self, memory: int = 1 << 30, *, deferred: bool = False) -> None:
        super().__init__()
        self._buffers: dict[int, np.ndarray] = {}
        self._capturing: list[Callable[[], Any]] | None = None
        self.total_memory = int(memory)
        self.num_graph_launches = 0
        self.deferred = bool(deferred)
        self._queue: deque[Callable[[], Any]] = deque()
        self._done = 0  # work items run so far (the queue holds those enqueued after them)
        self._recorded = 0

    def _malloc(self, nbytes: int) -> int:
        arr = self._host_alloc(nbytes)
        return int(arr.ctypes.data)

    def _host_alloc(self, nbytes: int) -> np.ndarray:
        raw = np.zeros(nbytes + ALIGNMENT, np.uint8)
        start = (-raw.ctypes.data) % ALIGNMENT
        arr = raw[start : start + nbytes]
        self._buffers[int(arr.ctypes.data)] = raw  # keeps the memory alive
        return arr

    def mem_get_info(self) -> tuple[int, int]:
        used = sum(self.pools.values())
        return max(0, self.total_memory - used), self.total_memory

    @property
    def stream(self) -> int:
        return 1

    def enqueue(self, work: Callable[[], Any]) -> None:
        """Run ``work`` now, or record it while capturing (what an ``execute_async_v3`` on
        this device calls)."""
        if self._capturing is not None:
            self._capturing.append(work)
        elif self.deferred:
            self._queue.append(work)
        else:
            work()
            self._done += 1

    def mark(self) -> int:
        """A position in the stream: everything enqueued so far (for :meth:`run_until`)."""
        return self._done + len(self._queue)

    def run_until(self, mark: int) -> None:
        """Run the deferred work enqueued before ``mark`` (:meth:`mark`), in order."""
        self.run_while(lambda: self._done < mark)

    def run_while(self, pending: Callable[[], bool]) -> None:
        """Run the deferred work in order while ``pending()`` holds (the host waiting for
        something the device produces) and work is queued."""
        while self._queue and pending():
            work = self._queue.popleft()
            self._done += 1
            work()

    def copy_async(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes:
            self.enqueue(lambda: ctypes.memmove(dst, src, nbytes))

    def record(self) -> None:
        self._recorded = self.mark()

    def wait(self) -> None:
        self.run_until(self._recorded)

    def synchronize(self) -> None:
        self.run_until(self.mark())

    def begin_capture(self) -> None:
        if self._capturing is not None:
            raise RuntimeError("HostDevice: begin_capture while already capturing")
        self._capturing = []

    def end_capture(self) -> Any:
        if self._capturing is None:
            raise RuntimeError("HostDevice: end_capture without begin_capture")
        graph, self._capturing = tuple(self._capturing), None
        return graph

    def launch_graph(self, graph: Any) -> None:
        self.num_graph_launches += 1
        for work in graph:
            self.enqueue(work)

    def view(self, ptr: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """The memory at ``ptr`` as an array of ``shape`` and ``dtype`` (writable, no copy)."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        raw = np.ctypeslib.as_array((ctypes.c_uint8 * max(n, 1)).from_address(ptr))[:n]
        return raw.view(dt).reshape(shape)
