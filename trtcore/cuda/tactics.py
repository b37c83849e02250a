"""GEMM tactics chosen at build time by timing, kept in a timing cache on disk.

TensorRT times the candidate kernels ("tactics") of every layer at build and keeps the
results in a timing cache so that a second build times nothing (TensorRT developer guide,
"Timing Cache"). The cuda backend does the same for its GEMMs, the only layers with a choice:

1. the GEMM calls of the engine are derived on the host (:meth:`IExecutionContext.prepare`
   with placeholder addresses) at each point of the optimization profile (min, opt, max);
2. for each distinct call shape (:func:`trtcore.cuda.cublaslt.signature`) the candidates are
   ``cublasGemmEx`` with ``CUBLAS_GEMM_DEFAULT`` (cuBLAS's own choice), cuBLASLt's best
   heuristic algorithms, split-K variants of its first two when the call has at most 16
   token rows (decode: ``n`` in cuBLAS's column-major terms), and the generated GEMV kernel
   where it applies (:func:`trtcore.cuda.gemm.gemv_applies`);
3. each candidate runs on scratch operands of the call's extents (random values: the time of
   a tensor-core GEMM depends a little on the bits it multiplies), 10 launches captured in a
   CUDA graph, median of 7 replays after 2 warm-ups; the fastest wins;
4. choices are stored in the plan (``Plan.tactics``: signature -> tactic) and in
   ``<cache_dir>/cuda-timing-cache.json`` under ``"<GPU>|cublasLt <version>|<signature>"``.

A tactic is a dict: ``{"kind": "cublas" | "lt" | "gemv", "algo": bytes (lt only),
"workspace": int, "label": str, "us": float, "timed": {label: us}}``. Shapes that were not
timed (a build without a GPU, a shape outside the profile points) run ``cublasGemmEx``.
``TRTCORE_CUDA_TIMING=0`` turns timing off.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..cache_dir import cache_dir
from ..fileio import write_atomic
from ..reference.types import DataType
from .cublaslt import Lt, signature
from .gemm import GemmCall, gemv_applies, gemv_launch
from .plan import Plan

_log = logging.getLogger(__name__)

#: the tactic of every shape that was not timed: cublasGemmEx, CUBLAS_GEMM_DEFAULT
CUBLAS: dict[str, Any] = {"kind": "cublas", "label": "cublasGemmEx"}
CACHE_FILE = "cuda-timing-cache.json"


def timing_enabled() -> bool:
    """Whether builds time GEMM tactics: a usable GPU with CuPy and nvmath-python, and
    ``TRTCORE_CUDA_TIMING`` not ``0``."""
    if os.environ.get("TRTCORE_CUDA_TIMING", "1") == "0":
        return False
    try:
        import cupy
        import nvmath.bindings.cublasLt  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no GPU stack: build without timing
        return False


class TimingCache:
    """The on-disk timing cache (JSON; written atomically), one entry per GPU, cuBLASLt
    version and call signature."""

    def __init__(self, path: Path | None = None):
        self.path = path or cache_dir() / CACHE_FILE
        self.entries: dict[str, dict[str, Any]] = {}
        self.dirty = False
        try:
            raw = json.loads(self.path.read_text())
            if isinstance(raw, dict):
                self.entries = raw
        except (OSError, ValueError):  # missing or unreadable: start empty
            pass

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored tactic (``algo`` back to bytes), or None."""
        e = self.entries.get(key)
        if e is None:
            return None
        e = dict(e)
        if "algo" in e:
            e["algo"] = bytes.fromhex(e["algo"])
        return e

    def put(self, key: str, tactic: dict[str, Any]) -> None:
        """Store ``tactic`` under ``key`` (``algo`` as hex)."""
        e = dict(tactic)
        if "algo" in e:
            e["algo"] = e["algo"].hex()
        self.entries[key] = e
        self.dirty = True

    def save(self) -> None:
        """Write the cache if it changed (a failure is logged, never fatal: timing is an optimization)."""
        if not self.dirty:
            return
        try:
            write_atomic(self.path, json.dumps(self.entries, indent=0, sort_keys=True).encode())
            self.dirty = False
        except Exception as exc:  # noqa: BLE001
            _log.warning("cannot write the timing cache %s: %s", self.path, exc)


def profile_calls(plan: Plan) -> list[tuple[str, GemmCall, DataType, bool]]:
    """The distinct GEMM calls of ``plan`` at its profile's min, opt and max shapes:
    ``(node name, call, dtype, has a GEMV kernel)``, found on the host with placeholder
    addresses."""
    from .runtime import ICudaEngine

    engine = ICudaEngine(plan)
    ctx = engine.create_execution_context_without_device_memory()
    fake = 1 << 40
    ctx.set_device_memory(fake, max(engine.device_memory_size_v2, 1))
    io = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    for i, name in enumerate(io):
        ctx.set_tensor_address(name, fake * (i + 2))
    const_ptr = {name: fake * (len(io) + 2 + i) for i, name in enumerate(plan.graph.constants)}
    seen: dict[str, tuple[str, GemmCall, DataType, bool]] = {}
    for point in range(3):
        for name, shapes in plan.profile.items():
            ctx.set_input_shape(name, shapes[point])
        for step in ctx.prepare(const_ptr, tuned=False):
            if step.kind != "gemm":
                continue
            for call in step.calls:
                if call.m and call.n:
                    seen.setdefault(signature(call, step.dtype), (step.name, call, step.dtype, f"{step.name}#gemv" in plan.sources))
    return list(seen.values())


def gemv_version() -> str:
    """A short hash of the generated GEMV kernels' sources (part of the timing cache's key)."""
    import hashlib

    from . import codegen

    text = "".join(codegen.gemv(dt, m).source for dt in codegen.CUDA_GEMV_TYPES for m in (1, 4))
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _extent(rows: int, cols: int, ld: int, batch: int, stride: int) -> int:
    return (batch - 1) * stride + (cols - 1) * ld + rows if rows and cols else 0


def _scratch(cp: Any, n: int, dtype: DataType) -> Any:
    x = cp.random.standard_normal(max(n, 1), dtype=cp.float32) * 0.1
    if dtype == DataType.BF16:
        return (x.view(cp.uint32) >> 16).astype(cp.uint16)
    return x.astype(cp.float16) if dtype == DataType.HALF else x


#: bytes of weight copies a timing cycles through, so that no launch finds its weight in L2
#: (in a decode step every layer has its own weights)
COLD_WEIGHT_BYTES = 256 << 20


def _time_us(cp: Any, stream: Any, launch: Callable[[int], None], copies: int) -> float:
    """Median time of one ``launch(i)`` in microseconds: ``max(10, copies)`` launches (``i``
    cycles over the ``copies`` weight copies) captured in a graph, 7 replays."""
    n = max(10, copies)
    with stream:
        for i in range(2):
            launch(i % copies)
        stream.begin_capture()
        for i in range(n):
            launch(i % copies)
        graph = stream.end_capture()
        a, b = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for i in range(9):
            a.record(stream)
            graph.launch(stream)
            b.record(stream)
            b.synchronize()
            if i >= 2:
                times.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / n)  # ms per n launches -> us per launch
    return statistics.median(times)


def _time_candidates(cp: Any, stream: Any, lt: Lt, blas: Any, call: GemmCall, dtype: DataType, gemv_fn: Any) -> dict[str, Any] | None:
    """Time every candidate for ``call`` on scratch operands, the weight (operand X) in enough
    copies (:data:`COLD_WEIGHT_BYTES`, at most 64) that it streams from DRAM as in a real
    step; the fastest as a tactic dict (with every candidate's time under ``timed``), or None
    when none ran."""
    x_elems = _extent(*((call.m, call.k) if call.op_x == 0 else (call.k, call.m)), call.ldx, call.batch, call.stride_x)
    copies = max(1, min(64, -(-COLD_WEIGHT_BYTES // max(1, x_elems * dtype.itemsize))))
    xs = [_scratch(cp, x_elems, dtype) for _ in range(copies)]
    ys = _scratch(cp, _extent(*((call.k, call.n) if call.op_y == 0 else (call.n, call.k)), call.ldy, call.batch, call.stride_y), dtype)
    cs = cp.empty(max(_extent(call.m, call.n, call.ldc, call.batch, call.stride_c), 1) * dtype.itemsize, cp.uint8)
    xp, y, c = [int(x.data.ptr) for x in xs], int(ys.data.ptr), int(cs.data.ptr)
    zero = GemmCall(**{**call.__dict__, "x_off": 0, "y_off": 0, "c_off": 0})
    options: list[tuple[dict[str, Any], Callable[[int], None]]] = [(CUBLAS, lambda i: blas.run(zero, dtype, xp[i], y, c, stream.ptr))]
    try:
        heur = lt.heuristics(zero, dtype)
        extra = [v for h in heur[:2] for v in lt.split_k(zero, dtype, h)] if call.n <= 16 else []
    except Exception as exc:  # noqa: BLE001 - cuBLASLt has nothing for this shape: cuBLAS and GEMV only
        _log.warning("cuBLASLt heuristics for %s failed: %r", signature(call, dtype), exc)
        heur, extra = [], []
    for cand in heur + extra:
        tac = {"kind": "lt", "algo": cand.algo, "workspace": cand.workspace, "label": cand.label}
        options.append((tac, lambda i, a=cand.algo: lt.run(zero, dtype, a, xp[i], y, c, stream.ptr)))
    if gemv_fn and gemv_applies(zero, dtype.itemsize):
        fn = gemv_fn(dtype, 1 if call.n == 1 else 4)  # the kernel the runtime runs for this many rows
        grid, block, smem, _ = gemv_launch(zero, dtype.itemsize, c, 0, y)
        args = [gemv_launch(zero, dtype.itemsize, c, x, y)[3] for x in xp]
        options.append(({"kind": "gemv", "label": "gemv"}, lambda i: fn.launch(grid, block, args[i], shared_mem=smem, stream=stream.ptr)))
    results: dict[str, float] = {}
    best: tuple[float, dict[str, Any]] | None = None
    for tac, launch in options:
        try:
            us = _time_us(cp, stream, launch, copies)
        except Exception as exc:  # noqa: BLE001 - this candidate cannot run: skip it
            _log.warning("tactic %s for %s failed: %r", tac["label"], signature(call, dtype), exc)
            continue
        results[tac["label"]] = round(us, 3)
        if best is None or us < best[0]:
            best = (us, tac)
    if best is None:
        return None
    return {**best[1], "us": round(best[0], 3), "timed": results}


def tune(plan: Plan, cache: TimingCache | None = None) -> list[str]:
    """Time the GEMM candidates of ``plan`` on this GPU and store the winners in
    ``plan.tactics``; returns build-log lines. Needs a GPU (see :func:`timing_enabled`).

    Raises:
        Exception from CuPy / cuBLAS(Lt) / NVRTC when the GPU fails; a candidate that fails
        alone is skipped.
    """
    import cupy as cp

    from ..gpu import describe_device
    from ..kernels import current_arch
    from . import codegen
    from .gemm import WORKSPACE_BYTES, Cublas

    cache = cache if cache is not None else TimingCache()
    device = describe_device(int(cp.cuda.runtime.getDevice()))
    calls = profile_calls(plan)
    workspace = cp.cuda.alloc(WORKSPACE_BYTES)
    lt = Lt(int(workspace.ptr), WORKSPACE_BYTES)
    blas = Cublas(int(workspace.ptr), WORKSPACE_BYTES)
    stream = cp.cuda.Stream(non_blocking=True)
    # a new GEMV kernel invalidates the cached choices: its source is part of the key
    prefix = f"{device}|cublasLt {lt.version()}|gemv {gemv_version()}|cold|"
    timed = cached = 0
    arch = current_arch()
    gemv_fns: dict[tuple[DataType, int], Any] = {}

    def gemv_fn(dtype: DataType, max_m: int) -> Any:
        if (dtype, max_m) not in gemv_fns:
            ks = codegen.gemv(dtype, max_m)
            gemv_fns[dtype, max_m] = codegen.compile_source(ks, arch).function(ks.function)
        return gemv_fns[dtype, max_m]

    try:
        for _name, call, dtype, has_gemv in calls:
            sig = signature(call, dtype)
            hit = cache.get(prefix + sig)
            if hit is not None and (hit["kind"] != "gemv" or has_gemv):
                plan.tactics[sig] = hit
                cached += 1
                continue
            choice = _time_candidates(cp, stream, lt, blas, call, dtype, has_gemv and gemv_fn)
            if choice is None:
                continue
            plan.tactics[sig] = choice
            cache.put(prefix + sig, choice)
            timed += 1
    finally:
        stream.synchronize()
        lt.close()
        blas.close()
        cache.save()
    plan.stats["tactics_device"] = device
    chosen: dict[str, int] = {}
    for t in plan.tactics.values():
        chosen[t["kind"]] = chosen.get(t["kind"], 0) + 1
    return [f"GEMM tactics on {device}: {len(calls)} shapes, {timed} timed, {cached} from the timing cache {cache.path}; chosen {chosen}"]


__all__ = ["CACHE_FILE", "CUBLAS", "TimingCache", "profile_calls", "timing_enabled", "tune"]
