"""Test and benchmark harness for trtcore plugins: the CUDA ``enqueue`` against the NumPy
``reference`` on fresh random inputs, in one call.

::

    from trtcore.testing import check_plugin, benchmark_plugin

    report = check_plugin(
        RopePlugin(head_dim=128, rotary_dim=128),
        [((77, 32, 128), ml_dtypes.bfloat16),              # q: standard normal
         ((77, 8, 128), ml_dtypes.bfloat16),               # k
         ((77,), np.int32, (0, 8192)),                     # position_ids in [0, 8192)
         ((64,), np.float32, inv_freq)],                   # a fixed array
    )
    print(report)            # max abs / rel error per output

    def test_bench(benchmark):                             # pytest-benchmark
        benchmark_plugin(benchmark, plugin, specs)

An input spec is ``(shape, dtype)`` or ``(shape, dtype, gen)`` where ``gen`` is

* omitted / None: floats standard normal (drawn in float64, rounded to ``dtype``), integers
  uniform in ``[0, 1024)``, bool uniform;
* ``(lo, hi)``: integers uniform in ``[lo, hi)``, floats uniform in ``[lo, hi)``;
* a callable ``gen(rng, shape, dtype) -> array`` (``rng`` a ``numpy.random.Generator``);
* an array: used as it is (a constant, e.g. a weight); its shape must be ``shape``.

Every call draws new inputs (``seed=None`` takes a fresh seed from the OS and reports it, so a
failure can be replayed with ``seed=report.seed``). The plugin's outputs are poisoned before
``enqueue`` (NaN for floats, a sentinel for integers) so an element the kernel never
writes fails the check; the workspace is filled with garbage; the inputs must come back
unchanged; ``enqueue`` runs twice (re-poisoned) and must give bit-identical results both
times (a result that moves between runs is a race).

The GPU side uses CuPy, imported only when a GPU function runs: without CuPy or a GPU,
:func:`check_plugin` and :func:`benchmark_plugin` raise :class:`GPUUnavailableError`
saying why (tests call :func:`gpu_status` first and skip with that reason). bfloat16
travels to the device as its uint16 bit pattern (CuPy has no bfloat16) and the plugin sees
``ml_dtypes.bfloat16`` in its :class:`~trtcore.plugins.base.DeviceTensor` descriptors,
as in :mod:`trtcore.reference`'s evaluator.

Tolerances (:func:`default_tolerance`) are relative to the largest magnitude of the
expected output, ``|got - expected| <= atol + rtol * max|expected|`` per output:

* float32 ``rtol = 1e-5``: a kernel that follows the reference's float32 operation order
  differs by a few float32 ulps (2^-24 ~ 6e-8 relative each) from libm-style functions or
  reordered sums; 1e-5 leaves room for ~100 ulps and still catches any wrong index, sign
  or missing term, which gives O(1) relative errors.
* float16 ``rtol = 2^-10`` and bfloat16 ``rtol = 2^-7``: the output is rounded once to a
  format with 11 (float16) or 8 (bfloat16) significand bits; when the kernel's float32
  intermediate differs from the reference's by a few float32 ulps, the final rounding can go
  the other way, i.e. differ by one ulp of the output format, which is at most 2^-10
  (float16) / 2^-7 (bfloat16) of the element's magnitude, hence of ``max|expected|``.
  Anything beyond one output ulp at the largest magnitude is a real error.
* float64: ``rtol = 1e-12``; integer and bool outputs must be equal.

``atol`` defaults to 0 (the scale is already ``max|expected|``; pass ``atol`` when the
expected output may be all zeros).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from trtcore.dtypes import host_view, storage_dtype
from trtcore.errors import TrtcoreError
from trtcore.gpu import gpu_status as _gpu_status

__all__ = [
    "GPUUnavailableError",
    "InputSpec",
    "OutputCheck",
    "PluginCheckReport",
    "benchmark_plugin",
    "check_plugin",
    "default_tolerance",
    "gpu_status",
    "make_inputs",
    "require_gpu",
]

_BF16 = np.dtype(ml_dtypes.bfloat16)

#: ``(shape, dtype)`` or ``(shape, dtype, gen)``; see the module docstring
InputSpec = tuple

_DEFAULT_INT_RANGE = (0, 1024)


class GPUUnavailableError(TrtcoreError, RuntimeError):
    """The GPU side of the harness cannot run here: CuPy is not installed or sees no GPU."""


# ---------------------------------------------------------------------------------------
# GPU access (lazy CuPy)
# ---------------------------------------------------------------------------------------


def gpu_status() -> tuple[bool, str]:
    """``(usable, why)``: whether CuPy imports and sees a CUDA device (nothing is raised;
    :func:`trtcore.gpu.gpu_status` with ``cupy=True``)."""
    return _gpu_status(cupy=True)


def require_gpu() -> Any:
    """The ``cupy`` module, or :class:`GPUUnavailableError` saying why there is none."""
    ok, why = gpu_status()
    if not ok:
        raise GPUUnavailableError(f"the plugin harness needs a CUDA GPU: {why}")
    import cupy

    return cupy


def _to_device(cp: Any, a: np.ndarray) -> Any:
    """``a`` on the device in its storage form (bfloat16: its uint16 bits, :mod:`trtcore.dtypes`)."""
    a = np.ascontiguousarray(a)
    return cp.asarray(a.view(storage_dtype(a.dtype, cp)))


def _to_host(cp: Any, d: Any, dtype: np.dtype) -> np.ndarray:
    return host_view(cp.asnumpy(d), dtype)


def _poison(cp: Any, d: Any, dtype: np.dtype) -> None:
    if dtype == _BF16:
        d.fill(0x7FC1)  # a bfloat16 NaN
    elif dtype.kind == "f":
        d.fill(np.nan)
    elif dtype.kind in "iu":
        d.fill(np.iinfo(dtype).min if dtype.kind == "i" else np.iinfo(dtype).max)
    elif dtype.kind == "b":
        d.fill(True)
    else:
        d.view(np.uint8).fill(0xA5)


# ---------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------


def _draw(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype, gen: Any) -> np.ndarray:
    if isinstance(gen, np.ndarray) or (gen is not None and not callable(gen) and not isinstance(gen, tuple) and hasattr(gen, "__array__")):
        a = np.asarray(gen)
        if tuple(a.shape) != shape:
            raise ValueError(f"fixed input has shape {a.shape}, the spec says {shape}")
        return np.ascontiguousarray(a.astype(dtype, copy=False))
    if callable(gen):
        a = np.asarray(gen(rng, shape, dtype))
        if tuple(a.shape) != shape:
            raise ValueError(f"generator {gen!r} returned shape {a.shape}, the spec says {shape}")
        return np.ascontiguousarray(a.astype(dtype, copy=False))
    if gen is not None and not (isinstance(gen, tuple) and len(gen) == 2):
        raise ValueError(f"bad input generator {gen!r}: expected None, (lo, hi), a callable or an array")
    if dtype.kind in "iu":
        lo, hi = gen if gen is not None else _DEFAULT_INT_RANGE
        return rng.integers(int(lo), int(hi), size=shape, dtype=np.int64).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind == "f" or dtype == _BF16:
        if gen is None:
            x = rng.standard_normal(shape)
        else:
            x = rng.uniform(float(gen[0]), float(gen[1]), size=shape)
        return np.ascontiguousarray(x.astype(dtype))
    raise ValueError(f"cannot draw random inputs of dtype {dtype}")


def make_inputs(input_specs: Sequence[InputSpec], rng: np.random.Generator | int | None = None) -> list[np.ndarray]:
    """Host arrays for ``input_specs`` (see the module docstring), drawn from ``rng``."""
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    out = []
    for i, spec in enumerate(input_specs):
        if not isinstance(spec, tuple) or len(spec) not in (2, 3):
            raise ValueError(f"input spec {i} is {spec!r}; expected (shape, dtype) or (shape, dtype, gen)")
        shape = tuple(int(s) for s in spec[0])
        dtype = np.dtype(spec[1])
        gen = spec[2] if len(spec) == 3 else None
        try:
            out.append(_draw(rng, shape, dtype, gen))
        except ValueError as exc:
            raise ValueError(f"input spec {i}: {exc}") from None
    return out


# ---------------------------------------------------------------------------------------
# tolerances and comparison
# ---------------------------------------------------------------------------------------


def default_tolerance(dtype: Any) -> tuple[float, float]:
    """``(rtol, atol)`` for an output of ``dtype``, relative to ``max|expected|`` (see the
    module docstring for the reasoning): float32 1e-5, float16 2^-10, bfloat16 2^-7,
    float64 1e-12, exact for integers and bool."""
    dtype = np.dtype(dtype)
    if dtype == _BF16:
        return 2.0**-7, 0.0
    if dtype == np.float16:
        return 2.0**-10, 0.0
    if dtype == np.float32:
        return 1e-5, 0.0
    if dtype == np.float64:
        return 1e-12, 0.0
    return 0.0, 0.0


@dataclass
class OutputCheck:
    """How one output compared.

    Attributes:
        output: the output's position.
        shape, dtype: the output's.
        max_abs_error: ``max |got - expected|`` (inf when a NaN appears on one side only).
        max_rel_error: ``max_abs_error / max|expected|``.
        scale: ``max|expected|``.
        rtol, atol: the tolerance used: ``|err| <= atol + rtol * scale``.
        worst_index: where ``|err| / bound`` is largest.
        got, expected: the values there.
        num_bad: elements out of tolerance.
    """

    output: int
    shape: tuple[int, ...]
    dtype: np.dtype
    max_abs_error: float
    max_rel_error: float
    scale: float
    rtol: float
    atol: float
    worst_index: tuple[int, ...]
    got: float
    expected: float
    num_bad: int

    @property
    def ok(self) -> bool:
        return self.num_bad == 0

    @property
    def bound(self) -> float:
        return self.atol + self.rtol * self.scale


@dataclass
class PluginCheckReport:
    """What :func:`check_plugin` found: one :class:`OutputCheck` per output.

    Attributes:
        plugin: the plugin's repr.
        seed: the seed the inputs were drawn with (replay with ``check_plugin(..., seed=seed)``).
        input_shapes, input_dtypes: the inputs'.
        outputs: per output.
        elapsed_s: host time of the whole check.
    """

    plugin: str
    seed: int
    input_shapes: list[tuple[int, ...]]
    input_dtypes: list[np.dtype]
    outputs: list[OutputCheck] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    @property
    def max_abs_error(self) -> list[float]:
        return [o.max_abs_error for o in self.outputs]

    @property
    def max_rel_error(self) -> list[float]:
        return [o.max_rel_error for o in self.outputs]

    def __str__(self) -> str:
        lines = [f"{self.plugin} (seed {self.seed}): inputs {', '.join(f'{s}:{d}' for s, d in zip(self.input_shapes, self.input_dtypes))}"]
        for o in self.outputs:
            lines.append(
                f"  output {o.output} {o.shape} {o.dtype}: max abs err {o.max_abs_error:.3g}, "
                f"max rel err {o.max_rel_error:.3g} (of max|ref| {o.scale:.3g}; tolerance rtol {o.rtol:.3g}, atol {o.atol:.3g})"
                + ("" if o.ok else f"  FAILED: {o.num_bad} elements")
            )
        return "\n".join(lines)


def _compare(i: int, got: np.ndarray, exp: np.ndarray, rtol: float, atol: float) -> OutputCheck:
    g = got.astype(np.float64)
    e = exp.astype(np.float64)
    finite = np.isfinite(e)
    scale = float(np.max(np.abs(e[finite]))) if finite.any() else 0.0
    bound = atol + rtol * scale
    with np.errstate(invalid="ignore"):
        err = np.abs(g - e)
    same_special = (np.isnan(g) & np.isnan(e)) | ((g == e) & ~finite)  # NaN/inf where expected
    err = np.where(same_special, 0.0, err)
    err = np.where(np.isnan(err), np.inf, err)
    bad = err > bound
    if g.size:
        ratio = err / bound if bound > 0 else np.where(err > 0, np.inf, 0.0)
        worst = np.unravel_index(int(np.argmax(ratio)), g.shape) if g.ndim else ()
        max_abs = float(err.max())
    else:
        worst, max_abs = (), 0.0
    gv = float(g[worst]) if g.size else math.nan
    ev = float(e[worst]) if g.size else math.nan
    return OutputCheck(
        output=i,
        shape=tuple(got.shape),
        dtype=got.dtype,
        max_abs_error=max_abs,
        max_rel_error=max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf),
        scale=scale,
        rtol=rtol,
        atol=atol,
        worst_index=tuple(int(x) for x in worst),
        got=gv,
        expected=ev,
        num_bad=int(bad.sum()),
    )


def _per_output(value: float | Sequence[float] | None, n: int, what: str) -> list[float | None]:
    if value is None or isinstance(value, (int, float)):
        return [None if value is None else float(value)] * n
    vals: list[float | None] = [float(v) for v in value]
    if len(vals) != n:
        raise ValueError(f"{what} has {len(vals)} values for {n} outputs")
    return vals


# ---------------------------------------------------------------------------------------
# running a plugin on the device
# ---------------------------------------------------------------------------------------


class _DeviceRun:
    """A plugin's inputs, outputs and workspace on the device, ready to ``enqueue``."""

    def __init__(self, cp: Any, plugin: Any, inputs: Sequence[np.ndarray], stream: Any):
        from trtcore.plugins.base import DeviceTensor, Dim

        self.cp, self.plugin, self.stream = cp, plugin, stream
        self.in_dtypes = [np.dtype(a.dtype) for a in inputs]
        shapes = plugin.output_shapes([[Dim(int(s)) for s in a.shape] for a in inputs])
        self.out_shapes = [tuple(int(d) for d in s) for s in shapes]
        self.out_dtypes = [np.dtype(d) for d in plugin.output_dtypes(self.in_dtypes)]
        with stream:
            self.d_in = [_to_device(cp, a) for a in inputs]
            self.d_out = [cp.empty(s, dtype=storage_dtype(d, cp)) for s, d in zip(self.out_shapes, self.out_dtypes)]
            ws = int(
                plugin.workspace_size([(tuple(a.shape), d) for a, d in zip(inputs, self.in_dtypes)], list(zip(self.out_shapes, self.out_dtypes)))
            )
            self.workspace = cp.empty(max(ws, 1), dtype=np.uint8)
            self.workspace.fill(0xA5)
        self.ws_ptr = int(self.workspace.data.ptr) if ws else 0
        self.in_desc = [DeviceTensor(int(d.data.ptr), tuple(int(x) for x in d.shape), dt) for d, dt in zip(self.d_in, self.in_dtypes)]
        self.out_desc = [DeviceTensor(int(d.data.ptr), tuple(int(x) for x in d.shape), dt) for d, dt in zip(self.d_out, self.out_dtypes)]
        self.stream_ptr = int(stream.ptr)

    def poison(self) -> None:
        with self.stream:
            for d, dt in zip(self.d_out, self.out_dtypes):
                _poison(self.cp, d, dt)

    def enqueue(self) -> None:
        self.plugin.enqueue(self.in_desc, self.out_desc, self.ws_ptr, self.stream_ptr)

    def outputs(self) -> list[np.ndarray]:
        self.stream.synchronize()
        return [_to_host(self.cp, d, dt) for d, dt in zip(self.d_out, self.out_dtypes)]

    def inputs(self) -> list[np.ndarray]:
        self.stream.synchronize()
        return [_to_host(self.cp, d, dt) for d, dt in zip(self.d_in, self.in_dtypes)]


def _seed(seed: int | None) -> int:
    if seed is not None:
        return int(seed)
    entropy = np.random.SeedSequence().entropy
    return int(entropy) % (2**63) if isinstance(entropy, int) else 0  # fresh, and reported


def check_plugin(
    plugin: Any,
    input_specs: Sequence[InputSpec],
    *,
    rtol: float | Sequence[float] | None = None,
    atol: float | Sequence[float] | None = None,
    seed: int | None = None,
) -> PluginCheckReport:
    """Run ``plugin.enqueue`` on the GPU and ``plugin.reference`` on the same random inputs,
    and compare every output.

    Args:
        plugin: a :class:`trtcore.plugins.base.Plugin`.
        input_specs: one spec per input (module docstring).
        rtol, atol: per output or one for all; default :func:`default_tolerance` of each
            output's dtype, relative to ``max|expected|``.
        seed: seeds the inputs; None draws a fresh one (reported in the result).

    Returns:
        A :class:`PluginCheckReport` (max abs/rel error per output).

    Raises:
        AssertionError: an output is out of tolerance (the message names the worst element:
            index, got, expected, error, tolerance, and the seed), has the wrong shape or
            dtype, differs between two runs, or an input was modified.
        GPUUnavailableError: no CuPy or no GPU.
    """
    t0 = time.perf_counter()
    cp = require_gpu()
    seed = _seed(seed)
    host_in = make_inputs(input_specs, np.random.default_rng(seed))
    name = f"{type(plugin).__name__} {plugin.plugin_name!r}"
    report = PluginCheckReport(repr(plugin), seed, [tuple(a.shape) for a in host_in], [a.dtype for a in host_in])
    where = f"{name}, seed {seed}"

    stream = cp.cuda.Stream(non_blocking=True)
    run = _DeviceRun(cp, plugin, host_in, stream)
    runs = []
    for _ in range(2):
        run.poison()
        run.enqueue()
        runs.append(run.outputs())
    after = run.inputs()
    for i, (a, b) in enumerate(zip(host_in, after)):
        if not np.array_equal(a.view(np.uint8), np.ascontiguousarray(b).view(np.uint8)):
            raise AssertionError(f"{where}: enqueue modified its input {i}")
    got = runs[0]
    for i, (a, b) in enumerate(zip(runs[0], runs[1])):
        if not np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8)):
            diff = np.argwhere(
                np.ascontiguousarray(a).view(np.uint8).reshape(a.shape + (-1,)) != np.ascontiguousarray(b).view(np.uint8).reshape(b.shape + (-1,))
            )
            raise AssertionError(
                f"{where}: output {i} differs between two identical runs (a race or an unwritten element?), first at index {tuple(int(x) for x in diff[0][:-1])}"
            )

    expected = [np.asarray(e) for e in plugin.reference(*host_in)]
    if len(expected) != len(got):
        raise AssertionError(f"{where}: reference gave {len(expected)} outputs, enqueue {len(got)}")
    rtols = _per_output(rtol, len(got), "rtol")
    atols = _per_output(atol, len(got), "atol")
    failures = []
    for i, (g, e) in enumerate(zip(got, expected)):
        if g.shape != e.shape or g.dtype != e.dtype:
            raise AssertionError(f"{where}: output {i} is {g.shape} {g.dtype} from enqueue but {e.shape} {e.dtype} from reference")
        d_rtol, d_atol = default_tolerance(g.dtype)
        r_i, a_i = rtols[i], atols[i]
        r = d_rtol if r_i is None else float(r_i)
        a_tol = d_atol if a_i is None else float(a_i)
        oc = _compare(i, g, e, r, a_tol)
        report.outputs.append(oc)
        if not oc.ok:
            failures.append(
                f"output {i} {oc.shape} {oc.dtype}: {oc.num_bad} of {g.size} elements out of tolerance; worst at index "
                f"{oc.worst_index}: got {oc.got!r}, expected {oc.expected!r}, error {abs(oc.got - oc.expected):.6g} > "
                f"tolerance {oc.bound:.6g} (atol {a_tol:.3g} + rtol {r:.3g} * max|expected| {oc.scale:.6g})"
            )
    report.elapsed_s = time.perf_counter() - t0
    if failures:
        raise AssertionError(f"{where}: enqueue does not match reference:\n  " + "\n  ".join(failures) + f"\n{report}")
    return report


# ---------------------------------------------------------------------------------------
# benchmarking
# ---------------------------------------------------------------------------------------


def _l2_bytes(cp: Any) -> int:
    try:
        return int(cp.cuda.Device().attributes.get("L2CacheSize", 0))
    except Exception:
        return 0


def benchmark_plugin(
    benchmark: Any,
    plugin: Any,
    input_specs: Sequence[InputSpec],
    *,
    seed: int | None = None,
    warmup: int = 5,
    rounds: int = 30,
    launches: int = 10,
    buffers: int | None = None,
    bytes_moved: int | None = None,
) -> dict[str, Any]:
    """Time ``plugin.enqueue`` on the GPU (with pytest-benchmark when ``benchmark`` is given).

    Each timed call enqueues the plugin ``launches`` times between two CUDA events on its
    stream and synchronizes; its device time per launch is the events' elapsed time over
    ``launches`` (so host launch overhead overlaps the kernels, as in a real stream). The
    input and output sets rotate among ``buffers`` copies (default: enough to exceed 4x the
    L2 cache, at most 8) so repeated launches do not run out of the cache. ``warmup`` calls
    (kernel compilation and module load included) come first and are not counted.

    Args:
        benchmark: pytest-benchmark's fixture, or None to time without it.
        bytes_moved: bytes one launch must move (default: all inputs read once plus all
            outputs written once), for the effective bandwidth.

    Returns:
        ``{"device_time_us": median, "device_time_us_all": [...], "bytes": ...,
        "bandwidth_GBps": ..., "host_time_us": median wall time per launch}``; with
        ``benchmark`` the same goes into ``benchmark.extra_info``.

    Raises:
        GPUUnavailableError: no CuPy or no GPU.
    """
    cp = require_gpu()
    seed = _seed(seed)
    host_in = make_inputs(input_specs, np.random.default_rng(seed))
    stream = cp.cuda.Stream(non_blocking=True)
    first = _DeviceRun(cp, plugin, host_in, stream)
    set_bytes = sum(a.nbytes for a in host_in) + sum(int(np.prod(s)) * d.itemsize for s, d in zip(first.out_shapes, first.out_dtypes))
    if buffers is None:
        l2 = _l2_bytes(cp)
        buffers = max(1, min(8, math.ceil(4 * l2 / set_bytes))) if l2 and set_bytes else 1
    runs = [first] + [_DeviceRun(cp, plugin, host_in, stream) for _ in range(buffers - 1)]
    for r in runs:
        r.poison()
    nbytes = set_bytes if bytes_moved is None else int(bytes_moved)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    device_ms: list[float] = []
    host_s: list[float] = []
    counter = [0]

    def once() -> None:
        t = time.perf_counter()
        start.record(stream)
        for _ in range(launches):
            runs[counter[0] % len(runs)].enqueue()
            counter[0] += 1
        end.record(stream)
        end.synchronize()
        host_s.append((time.perf_counter() - t) / launches)
        device_ms.append(cp.cuda.get_elapsed_time(start, end) / launches)

    for _ in range(warmup):
        once()
    device_ms.clear()
    host_s.clear()
    if benchmark is not None:
        benchmark.pedantic(once, rounds=rounds, iterations=1, warmup_rounds=0)
    else:
        for _ in range(rounds):
            once()
    med_ms = statistics.median(device_ms)
    stats = {
        "device_time_us": med_ms * 1e3,
        "device_time_us_all": [t * 1e3 for t in device_ms],
        "host_time_us": statistics.median(host_s) * 1e6,
        "bytes": nbytes,
        "bandwidth_GBps": nbytes / (med_ms * 1e-3) / 1e9,
        "launches_per_round": launches,
        "buffers": buffers,
        "seed": seed,
        "device": _device_name(cp),
    }
    if benchmark is not None:
        benchmark.extra_info.update({k: v for k, v in stats.items() if k != "device_time_us_all"})
    return stats


def _device_name(cp: Any) -> str:
    try:
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return "unknown"
