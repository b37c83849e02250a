"""Conformance and numerics of :mod:`trtcore.reference`, trtcore's NumPy TensorRT.

Four parts (see DESIGN.md, "Backends"):

a. numerics: every layer type, the relevant enum members and dtypes, evaluated on fresh
   random inputs and compared with an independent float64 NumPy computation;
b. TensorRT semantics: shape rules (shuffle placeholders / -1 / transposes, matmul transpose
   and batch broadcast, reduce / softmax bitmasks, gather, concat, broadcasting), BOOL
   comparisons, casts, strongly typed errors;
c. conformance with ``tensorrt_rtx``: the same small networks built with both modules
   (every builder takes the module as a parameter) must agree on output shapes (-1 for
   dynamic dims) and dtypes, valid networks must build with both modules (``tensorrt_rtx``
   for SM89, CPU only), and invalid networks the reference rejects must be rejected by
   TensorRT too;
d. builder / optimization-profile validation, the serialize / deserialize round trip and
   the :class:`ReferenceExecutor`'s input checks and ``capture=``.

Tolerances. The evaluator's contract is: float16/bfloat16 layers compute in float32 and
round once to the output type. With inputs that are exact in their dtype and an exact
float64 result ``r`` the error of one layer is bounded by

    |y - r| <= 2 * u_out * |r|  +  kc * u32 * scale  +  smallest subnormal of the output

* ``u_out`` is the unit roundoff of the output type (float32 2^-24, float16 2^-11,
  bfloat16 2^-8): the single rounding of the result (x2 absorbs the double rounding
  float32 -> float16/bfloat16);
* ``kc * u32 * scale`` is the float32 compute error: ``kc`` ~ 16 ulps for libm-style
  functions of O(1) arguments (``scale = |r| + 1``), ``kc`` = n for a float32 sum / dot
  product of n terms (``scale = sum |terms|``, the classical gamma_n bound);
* the subnormal term covers results that underflow the output type.

For float32 this gives ~1e-6 relative, for float16 ~2^-10 and for bfloat16 ~2^-7.
Layers that only move data (shuffle, gather, concat, select, identity, max/min, abs,
neg, ceil/floor/round/sign, comparisons, integer arithmetic) must be bit exact.

Errors are deferred, as in TensorRT: adding a layer or setting an attribute never raises a
shape/type error; the layer remembers it and :class:`NetworkError` (naming the layer) is
raised when the shape or dtype of an affected tensor is read, when the network is validated
for a build, and when it is evaluated. An invalid network must fail at all three points.

Disagreements with TensorRT and library bugs are marked ``xfail(strict=True)``; the
reason names the file and the rule.
"""

from __future__ import annotations

import ctypes
import math
import os
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trtcore.reference as ref
from trtcore.errors import NetworkError
from trtcore.reference.evaluator import evaluate
from trtcore.runtime.reference_executor import ReferenceExecutor

try:
    import tensorrt_rtx as rtx
except ImportError:  # pragma: no cover - tensorrt-rtx is a test dependency
    rtx = None

needs_rtx = pytest.mark.skipif(rtx is None, reason="tensorrt_rtx is not installed")

HYPOTHESIS = settings(
    max_examples=int(os.environ.get("TRTCORE_HYPOTHESIS_EXAMPLES", "40")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# --- dtypes and tolerances ---------------------------------------------------------------

NP = {
    "FLOAT": np.dtype(np.float32),
    "HALF": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "BOOL": np.dtype(np.bool_),
}
FLOATS = ("FLOAT", "HALF", "BF16")
U = {"FLOAT": 2.0**-24, "HALF": 2.0**-11, "BF16": 2.0**-8}  # unit roundoff
U32 = 2.0**-24


@pytest.fixture
def rng() -> np.random.Generator:
    """Fresh random inputs on every run; the seed is printed (shown when a test fails)."""
    seed = int(os.environ.get("TRTCORE_TEST_SEED", np.random.SeedSequence().entropy % 2**32))
    print(f"TRTCORE_TEST_SEED={seed}")
    return np.random.default_rng(seed)


def rand(rng: np.random.Generator, dt: str, shape: Sequence[int], lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    """Uniform values in [lo, hi) rounded to ``dt`` (so they are exact in that type)."""
    if dt in FLOATS:
        return rng.uniform(lo, hi, size=tuple(shape)).astype(NP[dt])
    if dt == "BOOL":
        return rng.integers(0, 2, size=tuple(shape)).astype(bool)
    return rng.integers(int(lo), int(hi) + 1, size=tuple(shape)).astype(NP[dt])


def f64(a: Any) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def assert_close(actual: np.ndarray, exact: Any, dt: str, *, scale: Any = None, kc: float = 16.0) -> None:
    """``actual`` (of dtype ``dt``) against the float64 result ``exact`` (module docstring)."""
    actual = np.asarray(actual)
    assert actual.dtype == NP[dt], f"dtype {actual.dtype}, expected {NP[dt]}"
    exact = np.asarray(exact, dtype=np.float64)
    assert actual.shape == exact.shape, f"shape {actual.shape}, expected {exact.shape}"
    got = f64(actual)
    if scale is None:
        scale = np.abs(exact) + 1.0
    tiny = float(ml_dtypes.finfo(NP[dt]).smallest_subnormal)
    bound = 2.0 * U[dt] * np.abs(exact) + kc * U32 * np.asarray(scale, dtype=np.float64) + tiny
    same_special = (np.isnan(got) & np.isnan(exact)) | (np.isinf(exact) & (got == exact))
    err = np.where(same_special, 0.0, np.abs(got - exact))
    bad = ~(err <= bound)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        raise AssertionError(
            f"{int(bad.sum())}/{bad.size} elements off, first at {i}: got {got[i]!r}, exact {exact[i]!r}, "
            f"error {err[i]:.3g} > bound {bound[i]:.3g} ({dt})"
        )


def assert_exact(actual: np.ndarray, expected: Any, dt: str) -> None:
    actual = np.asarray(actual)
    assert actual.dtype == NP[dt], f"dtype {actual.dtype}, expected {NP[dt]}"
    expected = np.asarray(expected).astype(NP[dt])
    assert actual.shape == expected.shape, f"shape {actual.shape}, expected {expected.shape}"
    np.testing.assert_array_equal(f64(actual) if dt in FLOATS else actual, f64(expected) if dt in FLOATS else expected)


# --- building networks with either module ------------------------------------------------

Build = Callable[[Any, Any], Any]  # (trt module, network) -> output tensor(s)


def strongly_typed(m: Any) -> int:
    return 1 << int(m.NetworkDefinitionCreationFlag.STRONGLY_TYPED)


def dt_of(m: Any, name: str) -> Any:
    return getattr(m.DataType, name)


def as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def ref_network(build: Build) -> tuple[Any, Any, list[Any]]:
    builder = ref.Builder(ref.Logger(ref.Logger.ERROR))
    net = builder.create_network(strongly_typed(ref))
    outs = as_list(build(ref, net))
    for o in outs:
        net.mark_output(o)
    return builder, net, outs


def run_ref(build: Build, feeds: dict[str, np.ndarray]) -> Any:
    """Build with the reference module, evaluate, return the output array(s)."""
    _, net, outs = ref_network(build)
    result = evaluate(net, feeds)
    arrays = [result[o.name] for o in outs]
    return arrays if len(arrays) > 1 else arrays[0]


if rtx is not None:

    class _Log(rtx.ILogger):
        """Collects TensorRT's error messages instead of printing them."""

        def __init__(self) -> None:
            rtx.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity <= rtx.ILogger.Severity.ERROR:
                self.errors.append(msg)

    # One logger for the whole process: TensorRT keeps the first logger it is given as its
    # global logger, so a per-builder Python logger that is garbage-collected later leaves
    # TensorRT calling a dead object (seen as a hang in rtx.Builder() after a few hundred builders).
    RTX_LOG = _Log()


def rtx_log() -> Any:
    """The process-wide tensorrt_rtx logger, its error list emptied."""
    RTX_LOG.errors.clear()
    return RTX_LOG


def _profile_for(m: Any, builder: Any, net: Any) -> Any:
    """min 1 / opt 2 / max 4 for every -1 dimension of every network input."""
    profile = builder.create_optimization_profile()
    dynamic = False
    for i in range(net.num_inputs):
        t = net.get_input(i)
        shape = tuple(t.shape)
        if -1 in shape:
            dynamic = True
        lo, opt, hi = ([v if d == -1 else d for d in shape] for v in (1, 2, 4))
        profile.set_shape(t.name, lo, opt, hi)
    return profile if dynamic else None


class RtxResult:
    """What ``tensorrt_rtx`` made of a network: output shapes/dtypes, or the rejection."""

    def __init__(self, build: Build, *, do_build: bool = True):
        self.log = rtx_log()
        builder = rtx.Builder(self.log)
        net = builder.create_network(strongly_typed(rtx))
        self.shapes: list[tuple[int, ...]] | None = None
        self.dtypes: list[str] | None = None
        self.built: bool | None = None
        self.rejected_by = ""
        try:
            outs = as_list(build(rtx, net))
        except Exception as exc:  # the Python binding raises for some bad arguments
            self.rejected_by = f"add_*/setter raised {type(exc).__name__}: {exc}"
            return
        if any(o is None for o in outs):
            self.rejected_by = "add_* returned None"
            return
        try:
            self.shapes = [tuple(o.shape) for o in outs]
            self.dtypes = [o.dtype.name for o in outs]
        except RuntimeError as exc:
            self.shapes = self.dtypes = None
            self.rejected_by = f"tensor.shape raised: {self.log.errors[:1] or exc}"
        for o in outs:
            net.mark_output(o)
        if not do_build and not self.rejected_by:
            return
        cfg = builder.create_builder_config()
        cfg.num_compute_capabilities = 1
        cfg.set_compute_capability(rtx.ComputeCapability.SM89, 0)
        if not self.rejected_by:
            profile = _profile_for(rtx, builder, net)
            if profile is not None:
                cfg.add_optimization_profile(profile)
        self.built = builder.build_serialized_network(net, cfg) is not None
        if not self.built and not self.rejected_by:
            self.rejected_by = f"build_serialized_network returned None: {self.log.errors[:1]}"

    @property
    def rejected(self) -> bool:
        return bool(self.rejected_by)


def ref_build(builder: Any, net: Any) -> Any:
    """``build_serialized_network`` with the reference (a profile when an input is dynamic)."""
    cfg = builder.create_builder_config()
    profile = _profile_for(ref, builder, net)
    if profile is not None:
        cfg.add_optimization_profile(profile)
    return builder.build_serialized_network(net, cfg)


def zero_feeds(net: Any) -> dict[str, np.ndarray]:
    """Zeros for every network input (dynamic dims 2)."""
    feeds = {}
    for i in range(net.num_inputs):
        t = net.get_input(i)
        feeds[t.name] = np.zeros([2 if d == -1 else d for d in t.shape], ref.nptype(t.dtype))
    return feeds


def ref_outcome(build: Build, *, do_build: bool = True) -> tuple[list[tuple[int, ...]], list[str]] | NetworkError:
    """Output shapes and dtypes, or the NetworkError raised on reading them.

    Adding layers and setting attributes must not raise (errors are deferred); when the
    shapes can be read, the network must also pass the builder's validation."""
    builder, net, outs = ref_network(build)
    try:
        shapes, dtypes = [tuple(o.shape) for o in outs], [o.dtype.name for o in outs]
    except NetworkError as exc:
        return exc
    if do_build:
        blob = ref_build(builder, net)
        assert isinstance(blob, bytes) and len(blob) > 0
    return shapes, dtypes


def assert_conforms(build: Build) -> None:
    """Reference and tensorrt_rtx agree on output shapes and dtypes; both build it."""
    got = ref_outcome(build)
    assert not isinstance(got, NetworkError), f"reference rejects a valid network: {got}"
    r = RtxResult(build)
    assert not r.rejected, f"tensorrt_rtx rejects it: {r.rejected_by}"
    assert (got[0], got[1]) == (r.shapes, r.dtypes), f"reference {got}, tensorrt_rtx {(r.shapes, r.dtypes)}"
    assert r.built


def assert_both_reject(build: Build) -> str:
    """The reference defers the error and raises the same NetworkError, naming the failing
    (last added) layer, on reading the outputs' shapes, on building and on evaluating; and
    tensorrt_rtx rejects the network too."""
    builder, net, outs = ref_network(build)  # adding layers / setting attributes: no error yet
    with pytest.raises(NetworkError) as info:
        [(o.shape, o.dtype) for o in outs]
    message = str(info.value)
    assert repr(net.get_layer(net.num_layers - 1).name) in message, message
    with pytest.raises(NetworkError) as at_build:
        ref_build(builder, net)
    assert str(at_build.value) == message
    with pytest.raises(NetworkError) as at_evaluate:
        evaluate(net, zero_feeds(net))
    assert str(at_evaluate.value) == message
    if rtx is not None:
        r = RtxResult(build)
        assert r.rejected, f"tensorrt_rtx accepts what the reference rejects ({message}): shapes {r.shapes}"
    return message


# =========================================================================================
# a. numerics, layer by layer
# =========================================================================================

# op -> (float64 function, input range); the range keeps every op in its domain and away
# from overflow in float16/bfloat16.
UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], tuple[float, float]]] = {
    "EXP": (np.exp, (-4, 4)),
    "LOG": (np.log, (0.05, 8)),
    "SQRT": (np.sqrt, (0.0, 8)),
    "RECIP": (lambda x: 1.0 / x, (0.125, 8)),
    "ABS": (np.abs, (-4, 4)),
    "NEG": (np.negative, (-4, 4)),
    "SIN": (np.sin, (-3, 3)),
    "COS": (np.cos, (-3, 3)),
    "TAN": (np.tan, (-1.3, 1.3)),
    "SINH": (np.sinh, (-3, 3)),
    "COSH": (np.cosh, (-3, 3)),
    "ASIN": (np.arcsin, (-0.95, 0.95)),
    "ACOS": (np.arccos, (-0.95, 0.95)),
    "ATAN": (np.arctan, (-4, 4)),
    "ASINH": (np.arcsinh, (-4, 4)),
    "ACOSH": (np.arccosh, (1.05, 6)),
    "ATANH": (np.arctanh, (-0.9, 0.9)),
    "CEIL": (np.ceil, (-4, 4)),
    "FLOOR": (np.floor, (-4, 4)),
    "ERF": (np.vectorize(math.erf, otypes=[np.float64]), (-3, 3)),
    "SIGN": (np.sign, (-4, 4)),
    "ROUND": (np.round, (-4, 4)),  # TensorRT: round half to even, as NumPy
}
EXACT_UNARY = {"ABS", "NEG", "CEIL", "FLOOR", "SIGN", "ROUND"}


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_float(op: str, dt: str, rng: np.random.Generator) -> None:
    fn, (lo, hi) = UNARY[op]
    x = rand(rng, dt, (3, 17), lo, hi)
    if op in ("ROUND", "CEIL", "FLOOR", "SIGN"):
        x.flat[:8] = np.array([-2.5, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, 3.0]).astype(NP[dt])  # ties and zero
    y = run_ref(lambda m, n: n.add_unary(n.add_input("x", dt_of(m, dt), x.shape), m.UnaryOperation.__members__[op]).get_output(0), {"x": x})
    exact = fn(f64(x))
    if op in EXACT_UNARY:
        assert_exact(y, exact, dt)
    else:
        assert_close(y, exact, dt)


@pytest.mark.parametrize("dt", FLOATS)
def test_unary_isinf_isnan_give_bool(dt: str, rng: np.random.Generator) -> None:
    x = rand(rng, dt, (2, 6))
    x[0, :3] = np.array([np.inf, -np.inf, np.nan]).astype(NP[dt])
    y_inf, y_nan = run_ref(
        lambda m, n: [n.add_unary(t := n.add_input("x", dt_of(m, dt), x.shape), m.UnaryOperation.ISINF).get_output(0),
                      n.add_unary(t, m.UnaryOperation.ISNAN).get_output(0)],
        {"x": x},
    )
    assert_exact(y_inf, np.isinf(f64(x)), "BOOL")
    assert_exact(y_nan, np.isnan(f64(x)), "BOOL")


def test_unary_not(rng: np.random.Generator) -> None:
    x = rand(rng, "BOOL", (4, 5))
    y = run_ref(lambda m, n: n.add_unary(n.add_input("x", m.DataType.BOOL, x.shape), m.UnaryOperation.NOT).get_output(0), {"x": x})
    assert_exact(y, ~x, "BOOL")


@pytest.mark.parametrize("dt", ["INT32", "INT64"])
@pytest.mark.parametrize("op", ["ABS", "NEG", "SIGN"])
def test_unary_int(op: str, dt: str, rng: np.random.Generator) -> None:
    x = rand(rng, dt, (3, 7), -50, 50)
    y = run_ref(lambda m, n: n.add_unary(n.add_input("x", dt_of(m, dt), x.shape), m.UnaryOperation.__members__[op]).get_output(0), {"x": x})
    assert_exact(y, UNARY[op][0](x.astype(np.int64)), dt)


# op -> (float64 function, range of a, range of b, float32 compute error kc, exact?)
ELEMENTWISE: dict[str, tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], tuple[float, float], tuple[float, float], float, bool]] = {
    "SUM": (np.add, (-4, 4), (-4, 4), 2, False),
    "SUB": (np.subtract, (-4, 4), (-4, 4), 2, False),
    "PROD": (np.multiply, (-4, 4), (-4, 4), 2, False),
    "DIV": (np.divide, (-4, 4), (0.25, 4), 2, False),
    "POW": (np.power, (0.25, 4), (-2, 2), 16, False),
    "FLOOR_DIV": (lambda a, b: np.floor(a / b), (-8, 8), (0.5, 3), 0, True),
    "MAX": (np.maximum, (-4, 4), (-4, 4), 0, True),
    "MIN": (np.minimum, (-4, 4), (-4, 4), 0, True),
}


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("op", sorted(ELEMENTWISE))
def test_elementwise_float(op: str, dt: str, rng: np.random.Generator) -> None:
    fn, ra, rb, kc, exact_op = ELEMENTWISE[op]
    a = rand(rng, dt, (3, 1, 5), *ra)
    b = rand(rng, dt, (1, 4, 5), *rb)  # broadcasting on both sides
    y = run_ref(
        lambda m, n: n.add_elementwise(n.add_input("a", dt_of(m, dt), a.shape), n.add_input("b", dt_of(m, dt), b.shape),
                                       m.ElementWiseOperation.__members__[op]).get_output(0),
        {"a": a, "b": b},
    )
    exact = fn(f64(a), f64(b))
    if exact_op:
        assert_exact(y, exact, dt)
    else:
        assert_close(y, exact, dt, scale=np.abs(exact), kc=kc)


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.trunc(a.astype(np.float64) / b).astype(np.int64)


INT_ELEMENTWISE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "SUM": np.add,
    "SUB": np.subtract,
    "PROD": np.multiply,
    "MAX": np.maximum,
    "MIN": np.minimum,
    "DIV": _trunc_div,  # TensorRT integer DIV truncates toward zero
    "FLOOR_DIV": lambda a, b: np.floor(a.astype(np.float64) / b).astype(np.int64),
    "POW": lambda a, b: a.astype(np.int64) ** np.abs(b),
}


@pytest.mark.parametrize("dt", ["INT32", "INT64"])
@pytest.mark.parametrize("op", sorted(INT_ELEMENTWISE))
def test_elementwise_int(op: str, dt: str, rng: np.random.Generator) -> None:
    a = rand(rng, dt, (4, 6), -40, 40)
    b = rand(rng, dt, (4, 6), -9, 9)
    b[b == 0] = 3
    if op == "POW":
        a, b = rand(rng, dt, (4, 6), -5, 5), np.abs(rand(rng, dt, (4, 6), 0, 4))
    y = run_ref(
        lambda m, n: n.add_elementwise(n.add_input("a", dt_of(m, dt), a.shape), n.add_input("b", dt_of(m, dt), b.shape),
                                       m.ElementWiseOperation.__members__[op]).get_output(0),
        {"a": a, "b": b},
    )
    assert_exact(y, INT_ELEMENTWISE[op](a.astype(np.int64), b.astype(np.int64)), dt)


@pytest.mark.parametrize("dt", [*FLOATS, "INT32", "INT64"])
@pytest.mark.parametrize("op", ["EQUAL", "GREATER", "LESS"])
def test_comparisons_give_bool(op: str, dt: str, rng: np.random.Generator) -> None:
    # few distinct values so EQUAL is true sometimes
    a = (rng.integers(-3, 4, size=(5, 6)) / 2).astype(NP[dt]) if dt in FLOATS else rand(rng, dt, (5, 6), -3, 3)
    b = (rng.integers(-3, 4, size=(1, 6)) / 2).astype(NP[dt]) if dt in FLOATS else rand(rng, dt, (1, 6), -3, 3)
    y = run_ref(
        lambda m, n: n.add_elementwise(n.add_input("a", dt_of(m, dt), a.shape), n.add_input("b", dt_of(m, dt), b.shape),
                                       m.ElementWiseOperation.__members__[op]).get_output(0),
        {"a": a, "b": b},
    )
    fn = {"EQUAL": np.equal, "GREATER": np.greater, "LESS": np.less}[op]
    assert_exact(y, fn(f64(a), f64(b)), "BOOL")


@pytest.mark.parametrize("op", ["AND", "OR", "XOR", "EQUAL"])
def test_elementwise_bool(op: str, rng: np.random.Generator) -> None:
    a, b = rand(rng, "BOOL", (4, 5)), rand(rng, "BOOL", (4, 1))
    y = run_ref(
        lambda m, n: n.add_elementwise(n.add_input("a", m.DataType.BOOL, a.shape), n.add_input("b", m.DataType.BOOL, b.shape),
                                       m.ElementWiseOperation.__members__[op]).get_output(0),
        {"a": a, "b": b},
    )
    fn = {"AND": np.logical_and, "OR": np.logical_or, "XOR": np.logical_xor, "EQUAL": np.equal}[op]
    assert_exact(y, fn(a, b), "BOOL")


def _erf64(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


# TensorRT's formulas (IActivationLayer docs); alpha/beta are exact in float32.
ACTIVATIONS: dict[str, tuple[Callable[[np.ndarray, float, float], np.ndarray], float, float]] = {
    "RELU": (lambda x, a, b: np.maximum(x, 0), 0.0, 0.0),
    "SIGMOID": (lambda x, a, b: 1 / (1 + np.exp(-x)), 0.0, 0.0),
    "TANH": (lambda x, a, b: np.tanh(x), 0.0, 0.0),
    "LEAKY_RELU": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.125, 0.0),
    "ELU": (lambda x, a, b: np.where(x >= 0, x, a * (np.exp(x) - 1)), 1.25, 0.0),
    "SELU": (lambda x, a, b: b * np.where(x > 0, x, a * (np.exp(x) - 1)), 1.625, 1.0625),
    "SOFTSIGN": (lambda x, a, b: x / (1 + np.abs(x)), 0.0, 0.0),
    "SOFTPLUS": (lambda x, a, b: a * np.log(np.exp(b * x) + 1), 1.5, 0.75),
    "CLIP": (lambda x, a, b: np.clip(x, a, b), -1.0, 1.5),
    "HARD_SIGMOID": (lambda x, a, b: np.clip(a * x + b, 0, 1), 0.25, 0.5),
    "SCALED_TANH": (lambda x, a, b: a * np.tanh(b * x), 1.75, 0.625),
    "THRESHOLDED_RELU": (lambda x, a, b: np.where(x > a, x, 0.0), 0.5, 0.0),
    "GELU_ERF": (lambda x, a, b: 0.5 * x * (1 + _erf64(x / math.sqrt(2))), 0.0, 0.0),
    "GELU_TANH": (lambda x, a, b: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))), 0.0, 0.0),
}
EXACT_ACTIVATIONS = {"RELU", "CLIP", "THRESHOLDED_RELU"}


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("op", list(ACTIVATIONS))
def test_activation(op: str, dt: str, rng: np.random.Generator) -> None:
    fn, alpha, beta = ACTIVATIONS[op]
    x = rand(rng, dt, (4, 9), -4, 4)

    def build(m: Any, n: Any) -> Any:
        layer = n.add_activation(n.add_input("x", dt_of(m, dt), x.shape), m.ActivationType.__members__[op])
        layer.alpha, layer.beta = alpha, beta
        return layer.get_output(0)

    y = run_ref(build, {"x": x})
    exact = fn(f64(x), alpha, beta)
    if op in EXACT_ACTIVATIONS:
        assert_exact(y, exact, dt)
    else:
        # composite formulas: a few float32 operations, each a few ulps of O(1) values
        assert_close(y, exact, dt, scale=np.abs(exact) + np.abs(f64(x)) + 1, kc=32)


# TensorRT's default alpha / beta (IActivationLayer docs; test_activation_default_parameters_like_tensorrt
# checks them against tensorrt_rtx)
TRT_ACTIVATION_DEFAULTS = {
    "LEAKY_RELU": (0.01, 0.0), "ELU": (1.0, 0.0), "SELU": (1.6732632423543772, 1.0507009873554805),
    "SOFTPLUS": (1.0, 1.0), "CLIP": (-3.4028234663852886e38, 3.4028234663852886e38), "HARD_SIGMOID": (0.2, 0.5),
    "SCALED_TANH": (1.0, 1.0), "THRESHOLDED_RELU": (1.0, 0.0),
}


@pytest.mark.parametrize("op", list(ACTIVATIONS))
def test_activation_default_parameters_numerics(op: str, rng: np.random.Generator) -> None:
    """alpha / beta left at their defaults: the output is TensorRT's formula with TensorRT's
    defaults (float32 values of them), in float64."""
    fn, _, _ = ACTIVATIONS[op]
    alpha, beta = (float(np.float32(v)) for v in TRT_ACTIVATION_DEFAULTS.get(op, (0.0, 0.0)))
    x = rand(rng, "FLOAT", (4, 9), -4, 4)
    x.flat[:4] = [-1.0, 0.0, 1.0, 2.0]  # THRESHOLDED_RELU's default threshold 1 is not passed
    y = run_ref(lambda m, n: n.add_activation(n.add_input("x", m.DataType.FLOAT, x.shape), m.ActivationType.__members__[op]).get_output(0),
                {"x": x})
    exact = fn(f64(x), alpha, beta)
    if op in EXACT_ACTIVATIONS:
        assert_exact(y, exact, "FLOAT")
    else:
        assert_close(y, exact, "FLOAT", scale=np.abs(exact) + np.abs(f64(x)) + 1, kc=32)


@pytest.mark.parametrize("dt", [*FLOATS, "INT32"])
@pytest.mark.parametrize("op", ["SUM", "PROD", "MAX", "MIN", "AVG"])
def test_reduce_all_masks(op: str, dt: str, rng: np.random.Generator) -> None:
    if dt == "INT32" and op == "AVG":
        pytest.skip("integer AVG rounding is not specified by TensorRT")
    shape = (3, 4, 5)
    if op == "PROD":  # stay away from float16/bfloat16 under/overflow and int32 overflow over 60 factors
        if dt in FLOATS:
            x = rand(rng, dt, shape, 0.8, 1.25)
        else:
            x = rng.choice([-1, 1], size=shape).astype(np.int32)
            x[0, 0, 0], x[1, 1, 1] = 2, -3
    else:
        x = rand(rng, dt, shape, -4, 4) if dt in FLOATS else rand(rng, dt, shape, -100, 100)
    xd = f64(x)
    for mask in range(1, 8):
        axes = tuple(i for i in range(3) if mask >> i & 1)
        n_terms = int(np.prod([shape[i] for i in axes]))
        for keep in (False, True):
            y = run_ref(
                lambda m, n: n.add_reduce(n.add_input("x", dt_of(m, dt), shape), m.ReduceOperation.__members__[op], mask, keep).get_output(0),
                {"x": x},
            )
            fn = {"SUM": np.sum, "PROD": np.prod, "MAX": np.max, "MIN": np.min, "AVG": np.mean}[op]
            exact = fn(xd, axis=axes, keepdims=keep)
            msg = f"mask {mask:#05b} keep_dims={keep}"
            assert y.shape == exact.shape, msg
            if dt == "INT32" or op in ("MAX", "MIN"):
                assert_exact(y, exact, dt)
            elif op == "PROD":
                assert_close(y, exact, dt, scale=np.abs(exact), kc=2 * n_terms)
            else:
                terms = np.sum(np.abs(xd), axis=axes, keepdims=keep) / (n_terms if op == "AVG" else 1)
                assert_close(y, exact, dt, scale=terms, kc=n_terms + 2)


@pytest.mark.parametrize("dt", FLOATS)
def test_softmax_each_axis(dt: str, rng: np.random.Generator) -> None:
    shape = (3, 4, 6)
    x = rand(rng, dt, shape, -6, 6)
    x[0, 0, 0] = -np.inf  # exp(-inf) = 0
    for axis in range(3):
        def build(m: Any, n: Any) -> Any:
            layer = n.add_softmax(n.add_input("x", dt_of(m, dt), shape))
            layer.axes = 1 << axis
            return layer.get_output(0)

        y = run_ref(build, {"x": x})
        e = np.exp(f64(x) - np.max(f64(x), axis=axis, keepdims=True))
        exact = e / e.sum(axis=axis, keepdims=True)
        assert_close(y, exact, dt, scale=np.abs(exact), kc=16 + shape[axis])


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("op0", ["NONE", "TRANSPOSE"])
@pytest.mark.parametrize("op1", ["NONE", "TRANSPOSE"])
def test_matmul(op0: str, op1: str, dt: str, rng: np.random.Generator) -> None:
    m_, k, n_ = 3, 33, 5
    a = rand(rng, dt, (2, k, m_) if op0 == "TRANSPOSE" else (2, m_, k))
    b = rand(rng, dt, (1, n_, k) if op1 == "TRANSPOSE" else (1, k, n_))  # batch 1 broadcasts
    y = run_ref(
        lambda m, n: n.add_matrix_multiply(n.add_input("a", dt_of(m, dt), a.shape), m.MatrixOperation.__members__[op0],
                                           n.add_input("b", dt_of(m, dt), b.shape), m.MatrixOperation.__members__[op1]).get_output(0),
        {"a": a, "b": b},
    )
    A = np.swapaxes(f64(a), -1, -2) if op0 == "TRANSPOSE" else f64(a)
    B = np.swapaxes(f64(b), -1, -2) if op1 == "TRANSPOSE" else f64(b)
    exact = A @ B
    assert_close(y, exact, dt, scale=np.abs(A) @ np.abs(B), kc=k + 2)


@pytest.mark.parametrize("dt", [*FLOATS, "INT32", "INT64", "BOOL"])
@pytest.mark.parametrize("idt", ["INT32", "INT64"])
def test_gather(dt: str, idt: str, rng: np.random.Generator) -> None:
    data = rand(rng, dt, (5, 6, 7), -9, 9)
    for axis in range(3):
        for ishape in [(), (4,), (2, 3)]:
            idx = rng.integers(0, data.shape[axis], size=ishape).astype(NP[idt])
            y = run_ref(lambda m, n: n.add_gather(n.add_input("d", dt_of(m, dt), data.shape), n.add_input("i", dt_of(m, idt), idx.shape), axis).get_output(0),
                        {"d": data, "i": idx})
            expected = np.take(data, idx, axis=axis)
            assert y.shape == data.shape[:axis] + idx.shape + data.shape[axis + 1:]
            assert_exact(y, expected, dt)


@pytest.mark.parametrize("dt", [*FLOATS, "INT32", "BOOL"])
def test_concatenation_each_axis(dt: str, rng: np.random.Generator) -> None:
    for axis in range(3):
        shapes = [tuple(s if i != axis else s + j for i, s in enumerate((2, 3, 4))) for j in range(3)]
        xs = [rand(rng, dt, s, -9, 9) for s in shapes]
        expected = np.concatenate(xs, axis=axis)
        # static shapes that only fit on `axis` (not on the default axis 0 for rank 3, except axis 0),
        # and the concat axis declared -1
        for declared in (shapes, [tuple(-1 if i == axis else d for i, d in enumerate(s)) for s in shapes]):
            def build(m: Any, n: Any, declared: Any = declared) -> Any:
                layer = n.add_concatenation([n.add_input(f"x{j}", dt_of(m, dt), s) for j, s in enumerate(declared)])
                layer.axis = axis
                return layer.get_output(0)

            got = ref_outcome(build)
            want = tuple(-1 if any(t[i] == -1 for t in declared) else d for i, d in enumerate(expected.shape))
            assert got == ([want], [dt]), got
            y = run_ref(build, {f"x{j}": x for j, x in enumerate(xs)})
            assert_exact(y, expected, dt)


def test_concat_set_axis_after_add(rng: np.random.Generator) -> None:
    """``add_concatenation`` (default axis 0 for rank 3, where the inputs do not fit) then
    ``.axis = 1``: TensorRT checks the final state only (trtcore/ops.py concat() does this)."""
    build = _concat([(2, 3, 4), (2, 5, 4)], 1)
    if rtx is not None:
        r = RtxResult(build)
        assert r.built and r.shapes == [(2, 8, 4)], r.rejected_by
    assert ref_outcome(build) == ([(2, 8, 4)], ["FLOAT"])
    a, b = rand(rng, "FLOAT", (2, 3, 4)), rand(rng, "FLOAT", (2, 5, 4))
    assert_exact(run_ref(build, {"x0": a, "x1": b}), np.concatenate([a, b], axis=1), "FLOAT")


def test_shuffle_attribute_order_does_not_matter(rng: np.random.Generator) -> None:
    """second_transpose (rank 4) before reshape_dims (rank 3 -> 4): only the final state counts."""
    def build(m: Any, n: Any) -> Any:
        layer = n.add_shuffle(n.add_input("x", m.DataType.FLOAT, (2, 3, 4)))
        layer.second_transpose = (0, 2, 1, 3)
        layer.reshape_dims = (0, 0, 2, 2)
        return layer.get_output(0)

    if rtx is not None:
        r = RtxResult(build)
        assert r.built and r.shapes == [(2, 2, 3, 2)]
    assert ref_outcome(build) == ([(2, 2, 3, 2)], ["FLOAT"])
    x = rand(rng, "FLOAT", (2, 3, 4))
    assert_exact(run_ref(build, {"x": x}), x.reshape(2, 3, 2, 2).transpose(0, 2, 1, 3), "FLOAT")


CASTABLE = [*FLOATS, "INT32", "INT64", "BOOL"]


@pytest.mark.parametrize("src", CASTABLE)
@pytest.mark.parametrize("dst", CASTABLE)
def test_cast(src: str, dst: str, rng: np.random.Generator) -> None:
    x = rand(rng, src, (4, 8), -100, 100)
    if src in FLOATS:
        x.flat[:4] = np.array([-2.75, -0.5, 0.0, 3.5]).astype(NP[src])
    y = run_ref(lambda m, n: n.add_cast(n.add_input("x", dt_of(m, src), x.shape), dt_of(m, dst)).get_output(0), {"x": x})
    xd = f64(x)
    if dst == "BOOL":
        expected = xd != 0
    elif dst in FLOATS:
        expected = xd.astype(NP[dst])  # one rounding of the exact value
    else:
        expected = np.trunc(xd)  # TensorRT's Cast operator doc: 8.9 -> 8 (truncation)
    assert_exact(y, expected, dst)


@pytest.mark.parametrize("dt", CASTABLE)
def test_identity_and_constant(dt: str, rng: np.random.Generator) -> None:
    x = rand(rng, dt, (3, 4), -9, 9)
    w = rand(rng, dt, (3, 4), -9, 9)
    keep = np.ascontiguousarray(w)

    def build(m: Any, n: Any) -> Any:
        c1 = n.add_constant(w.shape, m.Weights(w)).get_output(0)
        c2 = n.add_constant((12,), m.Weights(dt_of(m, dt), keep.ctypes.data, keep.size)).get_output(0)  # pointer form
        return [n.add_identity(n.add_input("x", dt_of(m, dt), x.shape)).get_output(0), n.add_identity(c1).get_output(0), c2]

    y, c1, c2 = run_ref(build, {"x": x})
    assert_exact(y, x, dt)
    assert_exact(c1, w, dt)
    assert_exact(c2, w.reshape(12), dt)


@pytest.mark.parametrize("dt", [*FLOATS, "INT32", "BOOL"])
def test_select_broadcasts(dt: str, rng: np.random.Generator) -> None:
    c = rand(rng, "BOOL", (3, 1, 5))
    a = rand(rng, dt, (1, 4, 5), -9, 9)
    b = rand(rng, dt, (3, 4, 1), -9, 9)
    y = run_ref(lambda m, n: n.add_select(n.add_input("c", m.DataType.BOOL, c.shape), n.add_input("a", dt_of(m, dt), a.shape),
                                          n.add_input("b", dt_of(m, dt), b.shape)).get_output(0),
                {"c": c, "a": a, "b": b})
    assert_exact(y, np.where(c, a, b), dt)


def test_half_layers_round_once_per_layer(rng: np.random.Generator) -> None:
    """float16 (a*b)+c as two layers rounds twice (after each layer), never in between."""
    a, b, c = (rand(rng, "HALF", (64,), -4, 4) for _ in range(3))

    def build(m: Any, n: Any) -> Any:
        H = m.DataType.HALF
        p = n.add_elementwise(n.add_input("a", H, (64,)), n.add_input("b", H, (64,)), m.ElementWiseOperation.PROD).get_output(0)
        return n.add_elementwise(p, n.add_input("c", H, (64,)), m.ElementWiseOperation.SUM).get_output(0)

    y = run_ref(build, {"a": a, "b": b, "c": c})
    prod = (f64(a) * f64(b)).astype(np.float16)  # float32 product of two halves is exact
    expected = (f64(prod) + f64(c)).astype(np.float32).astype(np.float16)
    assert_exact(y, expected, "HALF")


# =========================================================================================
# b. TensorRT semantics: shape rules and errors
# =========================================================================================


@pytest.mark.parametrize(
    "in_shape, first, reshape, second, expected",
    [
        ((2, 3, 4), None, (0, -1), None, (2, 12)),
        ((2, 3, 4), None, (0, 0, 2, 2), None, (2, 3, 2, 2)),
        ((2, 3, 4), None, (-1,), None, (24,)),
        ((2, 3, 4), (2, 0, 1), (0, -1), None, (4, 6)),  # 0 copies the dim after first_transpose
        ((2, 3, 4), None, (0, 3, 2, 2), (0, 2, 1, 3), (2, 2, 3, 2)),
        ((2, 3, 4), (1, 0, 2), None, None, (3, 2, 4)),
        ((6,), None, (2, 3), (1, 0), (3, 2)),
        ((1, 4), None, (), None, None),  # () is a valid reshape only for one element
        ((1,), None, (), None, ()),
    ],
)
def test_shuffle_shapes_and_values(in_shape: tuple[int, ...], first: Any, reshape: Any, second: Any, expected: Any, rng: np.random.Generator) -> None:
    x = rand(rng, "FLOAT", in_shape)

    def build(m: Any, n: Any) -> Any:
        layer = n.add_shuffle(n.add_input("x", m.DataType.FLOAT, in_shape))
        if first is not None:
            layer.first_transpose = first
        if reshape is not None:
            layer.reshape_dims = reshape
        if second is not None:
            layer.second_transpose = second
        return layer.get_output(0)

    if expected is None:
        assert_both_reject(build)
        return
    y = run_ref(build, {"x": x})
    v = x.transpose(first) if first is not None else x
    if reshape is not None:
        dims = [v.shape[i] if d == 0 else d for i, d in enumerate(reshape)]
        v = v.reshape(dims)
    if second is not None:
        v = v.transpose(second)
    assert y.shape == expected
    assert_exact(y, v, "FLOAT")
    if rtx is not None:
        assert_conforms(build)


def test_shuffle_zero_is_placeholder_false() -> None:
    def build(m: Any, n: Any) -> Any:
        layer = n.add_shuffle(n.add_input("x", m.DataType.FLOAT, (2, 3)))
        layer.zero_is_placeholder = False
        layer.reshape_dims = (2, 0)  # a literal 0: non-empty -> empty is an error
        return layer.get_output(0)

    assert_both_reject(build)


@st.composite
def shuffle_specs(draw: Any) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...] | None, tuple[int, ...]]:
    """(input shape, first_transpose, reshape_dims with 0/-1, concrete target, second_transpose, out shape)."""
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    perm1 = tuple(draw(st.permutations(range(rank))))
    t = tuple(shape[p] for p in perm1)
    factors = [f for d in t for f in _factorize(d)]
    factors = draw(st.permutations(factors)) if factors else []
    k = draw(st.integers(1, 5))
    cuts = sorted(draw(st.lists(st.integers(0, len(factors)), min_size=k - 1, max_size=k - 1)))
    bounds = [0, *cuts, len(factors)]
    target = tuple(int(np.prod(factors[bounds[i]:bounds[i + 1]])) for i in range(k))
    dims = list(target)
    for i in range(min(k, rank)):
        if target[i] == t[i] and draw(st.booleans()):
            dims[i] = 0
    free = [i for i, d in enumerate(dims) if d != 0]
    if free and draw(st.booleans()):
        dims[draw(st.sampled_from(free))] = -1
    perm2 = tuple(draw(st.permutations(range(k)))) if draw(st.booleans()) else None
    out = tuple(target[p] for p in perm2) if perm2 is not None else target
    return shape, perm1, tuple(dims), target, perm2, out


def _factorize(d: int) -> list[int]:
    out, p = [], 2
    while d > 1:
        while d % p == 0:
            out.append(p)
            d //= p
        p += 1
    return out


def _shuffle_build(declared: tuple[int, ...], perm1: Any, dims: Any, perm2: Any) -> Build:
    def build(m: Any, n: Any) -> Any:
        layer = n.add_shuffle(n.add_input("x", m.DataType.FLOAT, declared))
        layer.first_transpose = perm1
        layer.reshape_dims = dims
        if perm2 is not None:
            layer.second_transpose = perm2
        return layer.get_output(0)

    return build


@HYPOTHESIS
@given(spec=shuffle_specs(), data=st.data())
def test_shuffle_hypothesis(spec: Any, data: Any) -> None:
    """Random transpose / reshape (0 and -1) / transpose: values against NumPy, static shapes
    equal to tensorrt_rtx's; with some input dims declared -1 the reference's shape must
    still equal TensorRT's (an explicit -1 is resolved where every unknown input dim is
    copied by a 0 placeholder, -1 stays where the dimension is only known at run time)."""
    shape, perm1, dims, target, perm2, out = spec
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    build = _shuffle_build(shape, perm1, dims, perm2)
    y = run_ref(build, {"x": x})
    v = x.transpose(perm1).reshape(target)
    v = v.transpose(perm2) if perm2 is not None else v
    assert y.shape == out
    np.testing.assert_array_equal(y, v)
    if rtx is None:
        return
    assert_conforms(build)
    dyn = tuple(-1 if data.draw(st.booleans()) else d for d in shape)
    build_dyn = _shuffle_build(dyn, perm1, dims, perm2)
    got = ref_outcome(build_dyn)
    assert not isinstance(got, NetworkError), got
    r = RtxResult(build_dyn, do_build=False)
    assert not r.rejected, r.rejected_by
    assert got[0] == r.shapes, f"{dyn} {perm1} {dims} {perm2}: reference {got[0]}, tensorrt_rtx {r.shapes}"
    _, net, outs = ref_network(build_dyn)
    np.testing.assert_array_equal(evaluate(net, {"x": x})[outs[0].name], v)


@pytest.mark.parametrize("declared, dims, expected", [
    ((-1, 4, 8), (0, -1), (-1, 32)),
    ((-1, 4, 8), (0, 0, -1), (-1, 4, 8)),
    ((-1, 4, 8), (0, 2, -1), (-1, 2, 16)),
    ((-1, -1, 8), (0, 0, 2, -1), (-1, -1, 2, 4)),
    ((2, -1, 8), (0, 0, -1, 2), (2, -1, 4, 2)),
    ((-1, 4, 8), (-1, 8), (-1, 8)),  # the unknown dim is not copied: stays -1
    ((4, -1, 8), (0, -1), (4, -1)),
])
def test_shuffle_dynamic_reshape_infers_like_tensorrt(declared: tuple[int, ...], dims: tuple[int, ...], expected: tuple[int, ...],
                                                      rng: np.random.Generator) -> None:
    build = _shuffle_build(declared, tuple(range(len(declared))), dims, None)
    if rtx is not None:
        assert RtxResult(build, do_build=False).shapes == [expected]
    assert ref_outcome(build) == ([expected], ["FLOAT"])
    x = rand(rng, "FLOAT", [3 if d == -1 else d for d in declared])
    target = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    assert_exact(run_ref(build, {"x": x}), x.reshape(target), "FLOAT")


@st.composite
def broadcast_pairs(draw: Any) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    rank = draw(st.integers(1, 4))
    out = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    a = tuple(d if draw(st.booleans()) else 1 for d in out)
    b = tuple(d if (draw(st.booleans()) or a[i] != d) else 1 for i, d in enumerate(out))
    return a, b, out


@HYPOTHESIS
@given(pair=broadcast_pairs(), op=st.sampled_from(["SUM", "SUB", "PROD", "MAX"]), dt=st.sampled_from(FLOATS), data=st.data())
def test_broadcast_hypothesis(pair: Any, op: str, dt: str, data: Any) -> None:
    """Equal-rank broadcasting (1s stretch): values against NumPy, shapes against tensorrt_rtx
    with random dims declared -1."""
    a_shape, b_shape, out = pair
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    a, b = rand(rng, dt, a_shape, -4, 4), rand(rng, dt, b_shape, -4, 4)

    def make(sa: Any, sb: Any) -> Build:
        return lambda m, n: n.add_elementwise(n.add_input("a", dt_of(m, dt), sa), n.add_input("b", dt_of(m, dt), sb),
                                              m.ElementWiseOperation.__members__[op]).get_output(0)

    y = run_ref(make(a_shape, b_shape), {"a": a, "b": b})
    fn, _, _, kc, exact_op = ELEMENTWISE[op]
    exact = fn(f64(a), f64(b))
    assert y.shape == out
    if exact_op:
        assert_exact(y, exact, dt)
    else:
        assert_close(y, exact, dt, scale=np.abs(exact), kc=kc)
    if rtx is None:
        return
    da = tuple(-1 if data.draw(st.booleans()) else d for d in a_shape)
    db = tuple(-1 if data.draw(st.booleans()) else d for d in b_shape)
    for sa, sb in [(a_shape, b_shape), (da, db)]:
        got = ref_outcome(make(sa, sb))
        r = RtxResult(make(sa, sb), do_build=False)
        assert not isinstance(got, NetworkError) and not r.rejected, (got, r.rejected_by)
        assert got == (r.shapes, r.dtypes), f"{sa} {op} {sb}: reference {got}, tensorrt_rtx {r.shapes}"


@HYPOTHESIS
@given(rank=st.integers(1, 4), data=st.data())
def test_broadcast_mismatch_rejected(rank: int, data: Any) -> None:
    """Two known dims that differ and are not 1 never broadcast (also when others are -1 or 1)."""
    a = data.draw(st.lists(st.sampled_from([-1, 1, 2, 3]), min_size=rank, max_size=rank))
    b = [d if data.draw(st.booleans()) else 1 for d in a]
    i = data.draw(st.integers(0, rank - 1))
    a[i], b[i] = data.draw(st.sampled_from([(2, 3), (3, 2), (2, 5), (5, 3)]))
    a, b = tuple(a), tuple(b)
    assert_both_reject(lambda m, n: n.add_elementwise(n.add_input("a", m.DataType.FLOAT, a), n.add_input("b", m.DataType.FLOAT, b),
                                                      m.ElementWiseOperation.SUM).get_output(0))


def _attention_scores(m: Any, n: Any) -> Any:
    """[B,H,G,S,D] x [B,H,1,T,D]^T -> [B,H,G,S,T] (grouped-query attention scores)."""
    q = n.add_input("q", m.DataType.HALF, (2, 3, 4, -1, 8))
    k = n.add_input("k", m.DataType.HALF, (2, 3, 1, -1, 8))
    return n.add_matrix_multiply(q, m.MatrixOperation.NONE, k, m.MatrixOperation.TRANSPOSE).get_output(0)


def test_matmul_transpose_batch_broadcast(rng: np.random.Generator) -> None:
    q, k = rand(rng, "HALF", (2, 3, 4, 5, 8)), rand(rng, "HALF", (2, 3, 1, 7, 8))
    _, net, outs = ref_network(_attention_scores)
    assert outs[0].shape == (2, 3, 4, -1, -1)
    y = evaluate(net, {"q": q, "k": k})[outs[0].name]
    exact = f64(q) @ np.swapaxes(f64(k), -1, -2)
    assert_close(y, exact, "HALF", scale=np.abs(f64(q)) @ np.swapaxes(np.abs(f64(k)), -1, -2), kc=10)
    if rtx is not None:
        assert_conforms(_attention_scores)


@pytest.mark.parametrize("mask, keep, expected", [(0b0001, False, (3, 4, 5)), (0b0101, True, (1, 3, 1, 5)), (0b1111, False, ()),
                                                   (0b1010, False, (2, 4)), (0b1111, True, (1, 1, 1, 1))])
def test_reduce_bitmask_shapes(mask: int, keep: bool, expected: tuple[int, ...]) -> None:
    def build(m: Any, n: Any) -> Any:
        return n.add_reduce(n.add_input("x", m.DataType.FLOAT, (2, 3, 4, 5)), m.ReduceOperation.SUM, mask, keep).get_output(0)

    assert ref_network(build)[2][0].shape == expected
    if rtx is not None:
        assert_conforms(build)


def test_gather_default_mode_shapes() -> None:
    for data_shape, idx_shape, axis in [((10, 4), (2, 3), 0), ((5, 6, 7), (), 1), ((5, 6, 7), (2, 3), 2), ((-1, 6), (-1,), 0)]:
        def build(m: Any, n: Any) -> Any:
            return n.add_gather(n.add_input("d", m.DataType.HALF, data_shape), n.add_input("i", m.DataType.INT32, idx_shape), axis).get_output(0)

        assert ref_network(build)[2][0].shape == data_shape[:axis] + idx_shape + data_shape[axis + 1:]
        if rtx is not None:
            assert_conforms(build)


def test_gather_index_out_of_range_is_an_error(rng: np.random.Generator) -> None:
    _, net, outs = ref_network(lambda m, n: n.add_gather(n.add_input("d", m.DataType.FLOAT, (4, 3)), n.add_input("i", m.DataType.INT32, (2,)), 0).get_output(0))
    data = rand(rng, "FLOAT", (4, 3))
    with pytest.raises(NetworkError, match=r"GatherLayer.*out of range"):
        evaluate(net, {"d": data, "i": np.array([1, 4], np.int32)})


@pytest.mark.parametrize("bad", [-1, -4])
def test_gather_negative_index_is_an_error(bad: int, rng: np.random.Generator) -> None:
    """TensorRT's Gather operator requires 0 <= index < dims[axis]: no NumPy-style wrapping."""
    _, net, _ = ref_network(lambda m, n: n.add_gather(n.add_input("d", m.DataType.FLOAT, (4, 3)), n.add_input("i", m.DataType.INT32, (2,)), 0).get_output(0))
    with pytest.raises(NetworkError, match=r"GatherLayer.*out of range.*min " + str(bad)):
        evaluate(net, {"d": rand(rng, "FLOAT", (4, 3)), "i": np.array([1, bad], np.int32)})


def test_mixed_types_error_names_layer() -> None:
    builder = ref.Builder()
    net = builder.create_network(strongly_typed(ref))
    a = net.add_input("a", ref.DataType.HALF, (2, 3))
    b = net.add_input("b", ref.DataType.FLOAT, (2, 3))
    net.add_identity(a)
    bad = net.add_elementwise(a, b, ref.ElementWiseOperation.SUM)  # deferred: no error yet
    assert net.num_layers == 2
    with pytest.raises(NetworkError, match=r"ELEMENTWISE layer '\(ElementWiseLayer 1\)'.*a: HALF, b: FLOAT.*cast"):
        _ = bad.get_output(0).shape
    bad.set_input(1, a)  # replacing the input clears the error
    assert bad.get_output(0).shape == (2, 3) and bad.get_output(0).dtype == ref.DataType.HALF
    # a named layer whose input is replaced later: the error names it
    layer = net.add_elementwise(a, a, ref.ElementWiseOperation.SUM)
    layer.name = "residual_add"
    layer.set_input(1, b)  # no error yet
    with pytest.raises(NetworkError, match="residual_add.*a: HALF, b: FLOAT"):
        _ = layer.get_output(0).dtype
    net.mark_output(layer.get_output(0))
    with pytest.raises(NetworkError, match="residual_add"):
        builder.build_serialized_network(net, builder.create_builder_config())


# --- deferred errors: where they surface -----------------------------------------------------

DEFERRED_POINTS = ["shape", "dtype", "downstream_shape", "downstream_dtype", "validate", "build_serialized_network",
                   "build_engine", "evaluate"]


def _deferred_net(rename: str | None) -> tuple[Any, Any, Any, Any]:
    """x (2,3) + y (2,4) does not broadcast; an EXP layer consumes the bad sum."""
    builder = ref.Builder(ref.Logger(ref.Logger.ERROR))
    net = builder.create_network(strongly_typed(ref))
    x = net.add_input("x", ref.DataType.FLOAT, (2, 3))
    y = net.add_input("y", ref.DataType.FLOAT, (2, 4))
    bad = net.add_elementwise(x, y, ref.ElementWiseOperation.SUM)  # no error here
    if rename is not None:
        bad.name = rename
    out = net.add_unary(bad.get_output(0), ref.UnaryOperation.EXP).get_output(0)
    net.mark_output(out)
    return builder, net, bad, out


def _surface(point: str, builder: Any, net: Any, bad: Any, out: Any) -> None:
    if point == "shape":
        _ = bad.get_output(0).shape
    elif point == "dtype":
        _ = bad.get_output(0).dtype
    elif point == "downstream_shape":
        _ = out.shape
    elif point == "downstream_dtype":
        _ = out.dtype
    elif point == "validate":
        from trtcore.reference.builder import validate

        validate(net, [])
    elif point == "build_serialized_network":
        builder.build_serialized_network(net, builder.create_builder_config())
    elif point == "build_engine":
        builder.build_engine(net, builder.create_builder_config())
    elif point == "evaluate":
        evaluate(net, {"x": np.zeros((2, 3), np.float32), "y": np.zeros((2, 4), np.float32)})
    else:  # pragma: no cover
        raise AssertionError(point)


@pytest.mark.parametrize("point", DEFERRED_POINTS)
def test_deferred_error_surfaces(point: str) -> None:
    """Adding the bad layer does not raise; reading a shape/dtype (also downstream), validating
    for a build and evaluating raise NetworkError naming the layer and the cause."""
    builder, net, bad, out = _deferred_net(None)
    assert net.num_layers == 2
    with pytest.raises(NetworkError, match=r"^ELEMENTWISE layer '\(ElementWiseLayer 0\)': shapes \[\(2, 3\), \(2, 4\)\] do not broadcast"):
        _surface(point, builder, net, bad, out)
    if rtx is not None:  # TensorRT rejects the same network (on reading the shape, and at build time)
        r = RtxResult(lambda m, n: n.add_unary(n.add_elementwise(n.add_input("x", m.DataType.FLOAT, (2, 3)), n.add_input("y", m.DataType.FLOAT, (2, 4)),
                                                                 m.ElementWiseOperation.SUM).get_output(0), m.UnaryOperation.EXP).get_output(0))
        assert r.rejected and not r.built, r.rejected_by



@pytest.mark.parametrize("point", DEFERRED_POINTS)
def test_deferred_error_names_layer_renamed_after_add(point: str) -> None:
    builder, net, bad, out = _deferred_net("blocks.0.residual")
    with pytest.raises(NetworkError) as info:
        _surface(point, builder, net, bad, out)
    assert "ELEMENTWISE layer 'blocks.0.residual'" in str(info.value), str(info.value)


STALE_CONSUMER = (
    "BUG trtcore/reference/network.py ILayer._update() (~line 167) / ITensor._check() (~line 79): re-inference after "
    "an attribute change or set_input() updates only that layer's outputs, not the layers already consuming them, "
    "and evaluate() (evaluator.py ~line 425) trusts the stored `_error`s without re-inferring; so a consumer added "
    "before its producer was changed keeps a stale shape or error (validate() re-infers every layer, so only "
    "building sees the current state). ")


def test_deferred_error_cleared_by_later_attribute() -> None:
    """A layer added while its input's producer is invalid, then the producer fixed: the
    consumer's shape and evaluation see the fixed network (as TensorRT's shape and build)."""
    def build(m: Any, n: Any) -> Any:
        cat = n.add_concatenation([n.add_input("a", m.DataType.FLOAT, (2, 3, 4, 5)), n.add_input("b", m.DataType.FLOAT, (7, 3, 4, 5))])
        out = n.add_unary(cat.get_output(0), m.UnaryOperation.ABS).get_output(0)  # cat is invalid (default axis 1) here
        cat.axis = 0
        return out

    if rtx is not None:
        r = RtxResult(build)
        assert r.shapes == [(9, 3, 4, 5)] and r.built, r.rejected_by
    builder, net, (out,) = ref_network(build)
    a, b = -np.ones((2, 3, 4, 5), np.float32), np.full((7, 3, 4, 5), -2, np.float32)
    assert_exact(evaluate(net, {"a": a, "b": b})[out.name], np.abs(np.concatenate([a, b])), "FLOAT")
    assert out.shape == (9, 3, 4, 5)
    assert ref_build(builder, net)


def _reshape_after_consumer(reshape: tuple[int, ...]) -> Build:
    def build(m: Any, n: Any) -> Any:
        shuffle = n.add_shuffle(n.add_input("x", m.DataType.FLOAT, (2, 3)))
        out = n.add_unary(shuffle.get_output(0), m.UnaryOperation.ABS).get_output(0)
        shuffle.reshape_dims = reshape  # after the consumer was added
        return out

    return build


def test_deferred_error_from_later_attribute_reaches_consumers() -> None:
    """A valid producer made invalid after a consumer was added: reading the consumer's
    shape raises, as TensorRT does, as do building and evaluating."""
    build = _reshape_after_consumer((5,))
    if rtx is not None:
        assert RtxResult(build, do_build=False).rejected
    builder, net, (out,) = ref_network(build)
    # in this order: validation re-infers every layer up to the first error
    with pytest.raises(NetworkError, match=r"ShuffleLayer 0.*\(5,\)"):
        _ = out.shape
    with pytest.raises(NetworkError, match=r"ShuffleLayer 0.*\(5,\)"):
        evaluate(net, {"x": np.zeros((2, 3), np.float32)})
    with pytest.raises(NetworkError, match=r"ShuffleLayer 0.*\(5,\)"):
        ref_build(builder, net)


def test_shape_change_after_consumer_reaches_consumers(rng: np.random.Generator) -> None:
    build = _reshape_after_consumer((6,))
    if rtx is not None:
        assert RtxResult(build).shapes == [(6,)]
    x = rand(rng, "FLOAT", (2, 3))
    assert_exact(run_ref(build, {"x": x}), np.abs(x).reshape(6), "FLOAT")
    assert ref_outcome(build) == ([(6,)], ["FLOAT"])


def test_activation_type_change_reinfers() -> None:
    def build(m: Any, n: Any) -> Any:
        layer = n.add_activation(n.add_input("x", m.DataType.INT32, (2, 3)), m.ActivationType.RELU)  # RELU takes INT32
        layer.type = m.ActivationType.SIGMOID  # SIGMOID does not
        return layer.get_output(0)

    if rtx is not None:
        assert RtxResult(build).rejected
    builder, net, (out,) = ref_network(build)
    # in this order: validation re-infers every layer
    with pytest.raises(NetworkError, match="SIGMOID.*INT32"):
        _ = out.shape
    with pytest.raises(NetworkError, match="SIGMOID.*INT32"):
        evaluate(net, zero_feeds(net))
    with pytest.raises(NetworkError, match="SIGMOID.*INT32"):
        ref_build(builder, net)


def test_rank_mismatch_error() -> None:
    msg = assert_both_reject(lambda m, n: n.add_elementwise(n.add_input("a", m.DataType.FLOAT, (2, 3)), n.add_input("b", m.DataType.FLOAT, (3,)),
                                                            m.ElementWiseOperation.SUM).get_output(0))
    assert "equal rank" in msg and "ElementWiseLayer" in msg


def test_layer_attribute_change_reinfers_shape() -> None:
    _, net, outs = ref_network(lambda m, n: n.add_reduce(n.add_input("x", m.DataType.FLOAT, (2, 3, 4)), m.ReduceOperation.SUM, 1, False).get_output(0))
    layer = net.get_layer(0)
    layer.axes = 0b110
    assert outs[0].shape == (2,)
    layer.keep_dims = True
    assert outs[0].shape == (2, 1, 1)


# =========================================================================================
# c. conformance with tensorrt_rtx
# =========================================================================================


def _ew(op: str, dt: str, sa: Any, sb: Any) -> Build:
    return lambda m, n: n.add_elementwise(n.add_input("a", dt_of(m, dt), sa), n.add_input("b", dt_of(m, dt), sb),
                                          m.ElementWiseOperation.__members__[op]).get_output(0)


def _softmax(shape: Any, axes: int | None, dt: str = "FLOAT") -> Build:
    def build(m: Any, n: Any) -> Any:
        layer = n.add_softmax(n.add_input("x", dt_of(m, dt), shape))
        if axes is not None:
            layer.axes = axes
        return layer.get_output(0)

    return build


def _concat(shapes: Sequence[Any], axis: int | None, dts: Sequence[str] | None = None) -> Build:
    def build(m: Any, n: Any) -> Any:
        layer = n.add_concatenation([n.add_input(f"x{i}", dt_of(m, (dts or ["FLOAT"] * len(shapes))[i]), s) for i, s in enumerate(shapes)])
        if axis is not None:
            layer.axis = axis
        return layer.get_output(0)

    return build


def _mm(sa: Any, op0: str, sb: Any, op1: str, dta: str = "FLOAT", dtb: str = "FLOAT") -> Build:
    return lambda m, n: n.add_matrix_multiply(n.add_input("a", dt_of(m, dta), sa), m.MatrixOperation.__members__[op0],
                                              n.add_input("b", dt_of(m, dtb), sb), m.MatrixOperation.__members__[op1]).get_output(0)


def _llama_block_fragment(m: Any, n: Any) -> list[Any]:
    """Embedding gather -> RMS norm in float32 -> projection -> rotate-half shapes -> softmax."""
    H, F = m.DataType.HALF, m.DataType.FLOAT
    ids = n.add_input("input_ids", m.DataType.INT32, (-1, -1))
    emb = n.add_constant((11, 16), m.Weights(np.linspace(-1, 1, 176).astype(np.float16).reshape(11, 16))).get_output(0)
    x = n.add_gather(emb, ids, 0).get_output(0)  # [B,S,16]
    x32 = n.add_cast(x, F).get_output(0)
    sq = n.add_elementwise(x32, x32, m.ElementWiseOperation.PROD).get_output(0)
    ms = n.add_reduce(sq, m.ReduceOperation.AVG, 1 << 2, True).get_output(0)
    eps = n.add_constant((1, 1, 1), m.Weights(np.full((1, 1, 1), 1e-6, np.float32))).get_output(0)
    rs = n.add_unary(n.add_unary(n.add_elementwise(ms, eps, m.ElementWiseOperation.SUM).get_output(0), m.UnaryOperation.SQRT).get_output(0),
                     m.UnaryOperation.RECIP).get_output(0)
    normed = n.add_cast(n.add_elementwise(x32, rs, m.ElementWiseOperation.PROD).get_output(0), H).get_output(0)
    w = n.add_constant((1, 16, 24), m.Weights(np.ones((1, 16, 24), np.float16))).get_output(0)
    proj = n.add_matrix_multiply(normed, m.MatrixOperation.NONE, w, m.MatrixOperation.NONE).get_output(0)  # [B,S,24]
    heads = n.add_shuffle(proj)
    heads.reshape_dims = (0, 0, 3, 8)
    heads.second_transpose = (0, 2, 1, 3)  # [B,3,S,8]
    hd = heads.get_output(0)
    scores = n.add_matrix_multiply(hd, m.MatrixOperation.NONE, hd, m.MatrixOperation.TRANSPOSE).get_output(0)  # [B,3,S,S]
    sm = n.add_softmax(scores)
    sm.axes = 1 << 3
    gt = n.add_elementwise(proj, proj, m.ElementWiseOperation.GREATER).get_output(0)
    sel = n.add_select(gt, proj, n.add_activation(proj, m.ActivationType.SIGMOID).get_output(0)).get_output(0)
    cat = n.add_concatenation([proj, sel])
    cat.axis = 2
    return [sm.get_output(0), cat.get_output(0), gt]


VALID: dict[str, Build] = {
    "ew_dynamic_broadcast": _ew("SUM", "HALF", (-1, 1, 4), (1, 3, 4)),
    "ew_bf16_dynamic_both": _ew("PROD", "BF16", (-1, 3), (-1, 1)),
    "ew_compare_bool": _ew("LESS", "FLOAT", (-1, 4), (1, 4)),
    "ew_int_floor_div": _ew("FLOOR_DIV", "INT32", (2, -1), (2, 1)),
    "unary_isnan_bool": lambda m, n: n.add_unary(n.add_input("x", m.DataType.HALF, (-1, 3)), m.UnaryOperation.ISNAN).get_output(0),
    "softmax_axis0": _softmax((-1, 3, 4), 0b001),
    "softmax_axis2_bf16": _softmax((2, -1, 4), 0b100, "BF16"),
    "concat_axis0_dynamic": _concat([(-1, 3), (2, 3)], 0),
    "concat_axis1": _concat([(2, 3), (2, 5), (2, 1)], 1),
    "concat_axis2_dynamic": _concat([(2, -1, 4), (-1, 3, -1)], 2),
    "mm_2d": _mm((3, 4), "NONE", (4, 5), "NONE"),
    "mm_transpose_both": _mm((2, 4, 3), "TRANSPOSE", (1, 5, 4), "TRANSPOSE", "HALF", "HALF"),
    "mm_gqa_scores": _attention_scores,
    "mm_dynamic_batch_1": _mm((1, 5, 3), "NONE", (-1, 3, 4), "NONE", "BF16", "BF16"),
    "gather_scalar_index": lambda m, n: n.add_gather(n.add_input("d", m.DataType.FLOAT, (5, 6, 7)), n.add_input("i", m.DataType.INT64, ()), 1).get_output(0),
    "gather_2d_index_axis2": lambda m, n: n.add_gather(n.add_input("d", m.DataType.BF16, (5, 6, 7)), n.add_input("i", m.DataType.INT32, (2, -1)), 2).get_output(0),
    "shuffle_transpose_reshape_transpose": _shuffle_build((2, 3, 4, 5), (0, 2, 1, 3), (0, 0, -1), (2, 0, 1)),
    "shuffle_dynamic_placeholders": _shuffle_build((-1, -1, 16), (0, 1, 2), (0, 0, 2, 8), (0, 2, 1, 3)),
    "reduce_keep": lambda m, n: n.add_reduce(n.add_input("x", m.DataType.HALF, (2, -1, 4)), m.ReduceOperation.MAX, 0b110, True).get_output(0),
    "select_broadcast": lambda m, n: n.add_select(n.add_input("c", m.DataType.BOOL, (-1, 1)), n.add_input("a", m.DataType.HALF, (1, 4)),
                                                  n.add_input("b", m.DataType.HALF, (-1, 4))).get_output(0),
    "cast_chain": lambda m, n: n.add_cast(n.add_cast(n.add_input("x", m.DataType.BF16, (-1,)), m.DataType.FLOAT).get_output(0), m.DataType.INT64).get_output(0),
    "llama_block_fragment": _llama_block_fragment,
}


@needs_rtx
@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_networks_conform(name: str) -> None:
    assert_conforms(VALID[name])


def _reshape(shape: Any, dims: Any) -> Build:
    return _shuffle_build(shape, tuple(range(len(shape))), dims, None)


def _with(layer_fn: Callable[[Any, Any], Any], **attrs: Any) -> Build:
    def build(m: Any, n: Any) -> Any:
        layer = layer_fn(m, n)
        for k, v in attrs.items():
            setattr(layer, k, v)
        return layer.get_output(0)

    return build


INVALID: dict[str, Build] = {
    "ew_mixed_dtypes": lambda m, n: n.add_elementwise(n.add_input("a", m.DataType.HALF, (2, 3)), n.add_input("b", m.DataType.FLOAT, (2, 3)),
                                                      m.ElementWiseOperation.SUM).get_output(0),
    "ew_rank_mismatch": _ew("SUM", "FLOAT", (2, 3), (3,)),
    "ew_no_broadcast": _ew("SUM", "FLOAT", (2, 3), (2, 4)),
    "ew_and_on_float": _ew("AND", "FLOAT", (2, 3), (2, 3)),
    "mm_inner_mismatch": _mm((2, 3), "NONE", (4, 5), "NONE"),
    "mm_inner_mismatch_transposed": _mm((2, 3), "TRANSPOSE", (3, 5), "NONE"),
    "mm_rank_mismatch": _mm((2, 2, 3), "NONE", (3, 5), "NONE"),
    "mm_mixed_dtypes": _mm((2, 3), "NONE", (3, 5), "NONE", "FLOAT", "HALF"),
    "mm_batch_mismatch": _mm((2, 4, 3), "NONE", (3, 3, 5), "NONE"),
    "concat_other_dims_differ": _concat([(2, 3), (3, 3)], 1),
    "concat_mixed_dtypes": _concat([(2, 3), (2, 3)], 1, ["FLOAT", "HALF"]),
    "concat_axis_out_of_range": _concat([(2, 3), (2, 3)], 2),
    "reshape_volume": _reshape((2, 3), (4, 2)),
    "reshape_two_wildcards": _reshape((2, 3), (-1, -1)),
    "reshape_not_divisible": _reshape((2, 3), (4, -1)),
    "transpose_not_permutation": _with(lambda m, n: n.add_shuffle(n.add_input("x", m.DataType.FLOAT, (2, 3))), first_transpose=(0, 0)),
    "gather_float_indices": lambda m, n: n.add_gather(n.add_input("d", m.DataType.FLOAT, (4, 3)), n.add_input("i", m.DataType.FLOAT, (2,)), 0).get_output(0),
    "gather_axis_out_of_range": lambda m, n: n.add_gather(n.add_input("d", m.DataType.FLOAT, (4, 3)), n.add_input("i", m.DataType.INT32, (2,)), 2).get_output(0),
    "select_condition_not_bool": lambda m, n: n.add_select(*(n.add_input(c, m.DataType.FLOAT, (2, 3)) for c in "cab")).get_output(0),
    "select_mixed_dtypes": lambda m, n: n.add_select(n.add_input("c", m.DataType.BOOL, (2, 3)), n.add_input("a", m.DataType.FLOAT, (2, 3)),
                                                     n.add_input("b", m.DataType.HALF, (2, 3))).get_output(0),
    "unary_not_on_float": lambda m, n: n.add_unary(n.add_input("x", m.DataType.FLOAT, (2, 3)), m.UnaryOperation.NOT).get_output(0),
    "softmax_on_int": _softmax((2, 3), None, "INT32"),
    "reduce_axes_beyond_rank": lambda m, n: n.add_reduce(n.add_input("x", m.DataType.FLOAT, (2, 3)), m.ReduceOperation.SUM, 0b100, False).get_output(0),
    "reduce_no_axes": lambda m, n: n.add_reduce(n.add_input("x", m.DataType.FLOAT, (2, 3)), m.ReduceOperation.SUM, 0, False).get_output(0),
    "constant_count_mismatch": lambda m, n: n.add_constant((2, 3), m.Weights(np.zeros(5, np.float32))).get_output(0),
}


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_networks_rejected_by_both(name: str) -> None:
    assert_both_reject(INVALID[name])


# --- type rules: every op x dtype, accept/reject and output dtype must match TensorRT ------

TYPES = ["FLOAT", "HALF", "BF16", "INT32", "INT64", "BOOL"]


def _type_cases(family: str, dt: str) -> dict[str, Build]:
    def inp(m: Any, n: Any, name: str, d: str = dt, shape: Any = (2, 3)) -> Any:
        return n.add_input(name, dt_of(m, d), shape)

    cases: dict[str, Build] = {}
    if family == "unary":
        for op in ref.UnaryOperation.__members__:
            cases[op] = lambda m, n, op=op: n.add_unary(inp(m, n, "x"), m.UnaryOperation.__members__[op]).get_output(0)
    elif family == "elementwise":
        for op in ref.ElementWiseOperation.__members__:
            cases[op] = lambda m, n, op=op: n.add_elementwise(inp(m, n, "x"), inp(m, n, "y"), m.ElementWiseOperation.__members__[op]).get_output(0)
    elif family == "activation":
        for op in ref.ActivationType.__members__:
            cases[op] = lambda m, n, op=op: n.add_activation(inp(m, n, "x"), m.ActivationType.__members__[op]).get_output(0)
    elif family == "reduce":
        for op in ref.ReduceOperation.__members__:
            cases[op] = lambda m, n, op=op: n.add_reduce(inp(m, n, "x"), m.ReduceOperation.__members__[op], 0b10, False).get_output(0)
    elif family == "cast":
        for d2 in TYPES:
            cases[d2] = lambda m, n, d2=d2: n.add_cast(inp(m, n, "x"), dt_of(m, d2)).get_output(0)
    elif family == "other":
        cases["softmax"] = lambda m, n: n.add_softmax(inp(m, n, "x")).get_output(0)
        cases["matmul"] = lambda m, n: n.add_matrix_multiply(inp(m, n, "x"), m.MatrixOperation.NONE, inp(m, n, "y", shape=(3, 4)), m.MatrixOperation.NONE).get_output(0)
        cases["gather_data"] = lambda m, n: n.add_gather(inp(m, n, "x"), inp(m, n, "i", "INT32", (5,)), 1).get_output(0)
        cases["gather_indices"] = lambda m, n: n.add_gather(inp(m, n, "x", "FLOAT"), inp(m, n, "i", dt, (5,)), 1).get_output(0)
        cases["concat"] = _with(lambda m, n: n.add_concatenation([inp(m, n, "x"), inp(m, n, "y")]), axis=1)
        cases["select"] = lambda m, n: n.add_select(inp(m, n, "c", "BOOL"), inp(m, n, "x"), inp(m, n, "y")).get_output(0)
        cases["shuffle"] = _with(lambda m, n: n.add_shuffle(inp(m, n, "x")), reshape_dims=(3, 2))
        cases["identity"] = lambda m, n: n.add_identity(inp(m, n, "x")).get_output(0)
    return cases


TYPE_DISAGREEMENTS: dict[tuple[str, str], str] = {}


def _type_param(family: str, dt: str) -> Any:
    reason = TYPE_DISAGREEMENTS.get((family, dt))
    if reason:
        return pytest.param(family, dt, marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"DISAGREEMENT {reason}"))
    return pytest.param(family, dt)


@needs_rtx
@pytest.mark.parametrize("family, dt", [_type_param(f, d) for f in ["unary", "elementwise", "activation", "reduce", "cast", "other"] for d in TYPES])
def test_type_rules_match_tensorrt(family: str, dt: str) -> None:
    """Accept/reject, output shape and dtype of every op of a layer family on one input type,
    reference vs tensorrt_rtx; everything accepted is then built by tensorrt_rtx at once."""
    cases = _type_cases(family, dt)
    differ, accepted = [], []
    for op, build in cases.items():
        got = ref_outcome(build)
        r = RtxResult(build, do_build=False)
        if isinstance(got, NetworkError) != r.rejected:
            differ.append(f"{op}: reference {'rejects' if isinstance(got, NetworkError) else 'accepts'}, tensorrt_rtx {'rejects' if r.rejected else 'accepts'}")
        elif not r.rejected:
            if got != (r.shapes, r.dtypes):
                differ.append(f"{op}: reference {got}, tensorrt_rtx {(r.shapes, r.dtypes)}")
            accepted.append(op)
    assert not differ, f"{family} on {dt}: " + "; ".join(differ)

    def build_all(m: Any, n: Any) -> list[Any]:
        outs = []
        for i, op in enumerate(accepted):
            class Prefixed:  # give each case its own input names
                def __getattr__(self, a: str) -> Any:
                    return getattr(n, a)

                def add_input(self, name: str, d: Any, shape: Any) -> Any:
                    return n.add_input(f"{name}{i}", d, shape)

            outs += as_list(cases[op](m, Prefixed()))
        return outs

    if accepted:
        r = RtxResult(build_all)
        assert r.built, f"tensorrt_rtx cannot build {family} {accepted} on {dt}: {r.rejected_by}"


# --- defaults and enum values ------------------------------------------------------------


@needs_rtx
def test_concat_default_axis_like_tensorrt() -> None:
    for shape in [(2, 3), (2, 3, 4), (2, 3, 4, 5), (2, 3, 4, 5, 6)]:
        build = _concat([shape, shape], None)
        assert ref_outcome(build) == (RtxResult(build, do_build=False).shapes, ["FLOAT"]), shape


@needs_rtx
def test_softmax_default_axes_like_tensorrt() -> None:
    n_ref = ref.Builder().create_network(0)
    n_rtx = rtx.Builder(rtx_log()).create_network(0)
    got = {}
    for rank in range(1, 6):
        x_ref = n_ref.add_input(f"x{rank}", ref.DataType.FLOAT, (2,) * rank)
        x_rtx = n_rtx.add_input(f"x{rank}", rtx.DataType.FLOAT, (2,) * rank)
        got[rank] = (n_ref.add_softmax(x_ref).axes, n_rtx.add_softmax(x_rtx).axes)
    assert all(a == b for a, b in got.values()), f"rank: (reference axes, tensorrt_rtx axes) {got}"


@needs_rtx
def test_activation_default_parameters_like_tensorrt() -> None:
    n_ref = ref.Builder().create_network(0)
    n_rtx = rtx.Builder(rtx_log()).create_network(0)
    x_ref, x_rtx = n_ref.add_input("x", ref.DataType.FLOAT, (2,)), n_rtx.add_input("x", rtx.DataType.FLOAT, (2,))
    differ = []
    for op in ref.ActivationType.__members__:
        a = n_ref.add_activation(x_ref, ref.ActivationType.__members__[op])
        b = n_rtx.add_activation(x_rtx, rtx.ActivationType.__members__[op])
        if not (np.float32(a.alpha) == np.float32(b.alpha) and np.float32(a.beta) == np.float32(b.beta)):
            differ.append(f"{op}: reference ({a.alpha}, {a.beta}), tensorrt_rtx ({b.alpha}, {b.beta})")
    assert not differ, "; ".join(differ)


ENUMS = ["DataType", "ElementWiseOperation", "UnaryOperation", "ActivationType", "ReduceOperation", "MatrixOperation",
         "GatherMode", "TensorIOMode", "MemoryPoolType", "LayerType", "BuilderFlag"]
ENUM_VALUE_DISAGREEMENTS: dict[str, str] = {}


@needs_rtx
@pytest.mark.parametrize("enum", [
    pytest.param(e, marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"DISAGREEMENT {ENUM_VALUE_DISAGREEMENTS[e]}")) if e in ENUM_VALUE_DISAGREEMENTS else e
    for e in ENUMS])
def test_enum_members_like_tensorrt(enum: str) -> None:
    """Every reference member exists in tensorrt_rtx under the same name, with the same value.

    (NetworkDefinitionCreationFlag.STRONGLY_TYPED is 1 as in TensorRT 10; TensorRT-RTX dropped
    EXPLICIT_BATCH and uses 0 -- code must write ``1 << int(flag)``, which works with both.)"""
    ours, theirs = getattr(ref, enum), getattr(rtx, enum)
    missing = [m.name for m in ours if m.name not in theirs.__members__]
    assert not missing, f"{enum}: not in tensorrt_rtx: {missing}"
    differ = {m.name: (int(m), int(theirs.__members__[m.name])) for m in ours if int(m) != int(theirs.__members__[m.name])}
    assert not differ, f"{enum} values (reference, tensorrt_rtx): {differ}"


# =========================================================================================
# d. builder, profiles, engines and the reference executor
# =========================================================================================


def _dyn_net(m: Any = ref) -> tuple[Any, Any]:
    builder = m.Builder(m.Logger(m.Logger.ERROR)) if m is ref else m.Builder(rtx_log())
    net = builder.create_network(strongly_typed(m))
    x = net.add_input("x", m.DataType.HALF, (-1, 4))
    y = net.add_input("y", m.DataType.HALF, (1, 4))
    s = net.add_elementwise(x, y, m.ElementWiseOperation.SUM).get_output(0)
    s.name = "sum"
    out = net.add_unary(s, m.UnaryOperation.EXP).get_output(0)
    out.name = "out"
    net.mark_output(out)
    return builder, net


def _config(builder: Any, m: Any, shapes: dict[str, tuple[Any, Any, Any]] | None) -> Any:
    cfg = builder.create_builder_config()
    if hasattr(m, "ComputeCapability"):  # tensorrt_rtx: build ahead of time, no GPU needed
        cfg.num_compute_capabilities = 1
        cfg.set_compute_capability(m.ComputeCapability.SM89, 0)
    if shapes is not None:
        p = builder.create_optimization_profile()
        for name, (lo, opt, hi) in shapes.items():
            p.set_shape(name, lo, opt, hi)
        cfg.add_optimization_profile(p)
    return cfg


GOOD = {"x": ((1, 4), (2, 4), (8, 4)), "y": ((1, 4), (1, 4), (1, 4))}
BAD_PROFILES = {
    "no_profile": (None, "no optimization profile"),
    "dynamic_input_missing": ({"y": GOOD["y"]}, "no shape for dynamic input 'x'"),
    "static_dim_outside": ({**GOOD, "y": ((2, 4), (2, 4), (2, 4))}, "'y' has static shape"),
    "static_dim_inside_range": ({**GOOD, "y": ((1, 4), (1, 4), (2, 4))}, "'y' has static shape"),  # min 1 <= 1 <= max 2
    "rank_mismatch": ({**GOOD, "x": ((1,), (2,), (8,))}, "'x' has rank 2"),
}


@pytest.mark.parametrize("case", sorted(BAD_PROFILES))
def test_bad_profiles_rejected(case: str) -> None:
    shapes, message = BAD_PROFILES[case]
    builder, net = _dyn_net(ref)
    with pytest.raises(NetworkError, match=message):
        builder.build_serialized_network(net, _config(builder, ref, shapes))
    if rtx is not None:
        b, n = _dyn_net(rtx)
        assert b.build_serialized_network(n, _config(b, rtx, shapes)) is None


def test_profile_min_greater_than_opt() -> None:
    builder, net = _dyn_net(ref)
    p = builder.create_optimization_profile()
    with pytest.raises(NetworkError, match="min <= opt <= max"):
        p.set_shape("x", (4, 4), (2, 4), (8, 4))
    with pytest.raises(NetworkError, match="ranks differ"):
        p.set_shape("x", (1, 4), (2,), (8, 4))
    if rtx is not None:  # TensorRT refuses the profile (the build then has none)
        b, n = _dyn_net(rtx)
        cfg = _config(b, rtx, None)
        p = b.create_optimization_profile()
        p.set_shape("x", (4, 4), (2, 4), (8, 4))
        p.set_shape("y", *GOOD["y"])
        cfg.add_optimization_profile(p)
        assert b.build_serialized_network(n, cfg) is None


def test_no_outputs_rejected() -> None:
    builder = ref.Builder()
    net = builder.create_network(strongly_typed(ref))
    net.add_input("x", ref.DataType.FLOAT, (2,))
    with pytest.raises(NetworkError, match="no outputs"):
        builder.build_serialized_network(net, builder.create_builder_config())


def test_profile_for_unknown_input_is_ignored(rng: np.random.Generator) -> None:
    """A profile shape for a name that is no network input is ignored (TensorRT builds)."""
    shapes = {**GOOD, "typo": ((1,), (1,), (1,)), "sum": ((1, 4), (2, 4), (8, 4))}  # "sum" is an inner tensor
    if rtx is not None:
        b, n = _dyn_net(rtx)
        assert b.build_serialized_network(n, _config(b, rtx, shapes)) is not None
    builder, net = _dyn_net(ref)
    engine = ref.Runtime().deserialize_cuda_engine(builder.build_serialized_network(net, _config(builder, ref, shapes)))
    x, y = rand(rng, "HALF", (3, 4)), rand(rng, "HALF", (1, 4))
    out = ReferenceExecutor(engine).run({"x": x, "y": y})["out"]
    assert_close(out, np.exp(f64((f64(x) + f64(y)).astype(np.float16))), "HALF")


def test_serialize_deserialize_round_trip(rng: np.random.Generator) -> None:
    builder, net = _dyn_net(ref)
    blob = builder.build_serialized_network(net, _config(builder, ref, GOOD))
    assert isinstance(blob, bytes) and blob.nbytes == len(blob) > 0
    engine = ref.Runtime(ref.Logger()).deserialize_cuda_engine(bytes(blob))
    assert engine.num_io_tensors == 3 and engine.num_optimization_profiles == 1
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    assert names == ["x", "y", "out"]
    assert [engine.get_tensor_mode(n).name for n in names] == ["INPUT", "INPUT", "OUTPUT"]
    assert engine.get_tensor_mode("sum") == ref.TensorIOMode.NONE
    assert [engine.get_tensor_dtype(n).name for n in names] == ["HALF"] * 3
    assert engine.get_tensor_shape("x") == (-1, 4) and engine.get_tensor_shape("out") == (-1, 4)
    assert [tuple(s) for s in engine.get_tensor_profile_shape("x", 0)] == [(1, 4), (2, 4), (8, 4)]
    x, y = rand(rng, "HALF", (5, 4)), rand(rng, "HALF", (1, 4))
    out = ReferenceExecutor(engine).run({"x": x, "y": y})["out"]
    expected = evaluate(net, {"x": x, "y": y})["out"]
    np.testing.assert_array_equal(out, expected)
    assert_close(out, np.exp(f64((f64(x) + f64(y)).astype(np.float16))), "HALF")
    with pytest.raises(NetworkError, match="not a trtcore reference engine"):
        ref.Runtime().deserialize_cuda_engine(pickle.dumps({"not": "an engine"}))


def _executor() -> ReferenceExecutor:
    builder, net = _dyn_net(ref)
    return ReferenceExecutor(builder.build_engine(net, _config(builder, ref, GOOD)))


@pytest.mark.parametrize(
    "feeds, message",
    [
        ({"x": np.zeros((2, 4), np.float16)}, r"input 'y' is missing"),
        ({"x": np.zeros((2, 4, 1), np.float16), "y": np.zeros((1, 4), np.float16)}, r"input 'x' has shape \(2, 4, 1\)"),
        ({"x": np.zeros((2, 5), np.float16), "y": np.zeros((1, 4), np.float16)}, r"input 'x' has shape \(2, 5\)"),
        ({"x": np.zeros((2, 4), np.float16), "y": np.zeros((2, 4), np.float16)}, r"input 'y' has shape \(2, 4\)"),
        ({"x": np.zeros((9, 4), np.float16), "y": np.zeros((1, 4), np.float16)}, r"input 'x' .*outside the optimization profile"),
        ({"x": np.zeros((0, 4), np.float16), "y": np.zeros((1, 4), np.float16)}, r"input 'x' .*outside the optimization profile"),
        ({"x": np.zeros((2, 4), np.int32), "y": np.zeros((1, 4), np.float16)}, r"input 'x' has dtype int32"),
    ],
)
def test_executor_input_checks(feeds: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _executor().run(feeds)


def test_executor_dynamic_shapes_capture_and_all(rng: np.random.Generator) -> None:
    ex = _executor()
    assert ex.input_names == ["x", "y"] and ex.output_names == ["out"]
    y = rand(rng, "HALF", (1, 4))
    for batch in (1, 3, 8):
        x = rand(rng, "HALF", (batch, 4))
        res = ex.run({"x": x, "y": y}, capture=["sum"])
        assert set(res) == {"out", "sum"}
        s = (f64(x) + f64(y)).astype(np.float16)
        assert_exact(res["sum"], s, "HALF")
        assert_close(res["out"], np.exp(f64(s)), "HALF")
    x = rand(rng, "HALF", (2, 4)).astype(np.float64)  # float feeds are converted to the input type
    everything = ex.run({"x": x, "y": y}, capture="all")
    names = {t.name for t in ex.network._inputs} | {layer.get_output(i).name for layer in ex.network.layers for i in range(layer.num_outputs)}
    assert set(everything) == names == {"x", "y", "sum", "out"}
    assert everything["x"].dtype == np.float16
    assert ex.run({"x": x, "y": y}, capture="sum").keys() == {"out", "sum"}
    with pytest.raises(KeyError, match="nope"):
        ex.run({"x": x, "y": y}, capture=["nope"])


def test_executor_constants_are_cached_and_stable(rng: np.random.Generator) -> None:
    w = rand(rng, "BF16", (4, 3))

    def build(m: Any, n: Any) -> Any:
        # pointer form: tensorrt's Weights(array) cannot take ml_dtypes.bfloat16 arrays
        c = n.add_constant(w.shape, m.Weights(m.DataType.BF16, w.ctypes.data, w.size)).get_output(0)
        return n.add_matrix_multiply(n.add_input("x", m.DataType.BF16, (-1, 4)), m.MatrixOperation.NONE, c, m.MatrixOperation.NONE).get_output(0)

    builder, net, outs = ref_network(build)
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, 4), (2, 4), (4, 4))
    ex = ReferenceExecutor(net, profile)
    x = rand(rng, "BF16", (2, 4))
    first = ex.run({"x": x})[outs[0].name]
    second = ex.run({"x": x})[outs[0].name]
    np.testing.assert_array_equal(f64(first), f64(second))
    assert_close(first, f64(x) @ f64(w), "BF16", scale=np.abs(f64(x)) @ np.abs(f64(w)), kc=6)
    if rtx is not None:
        assert_conforms(build)


def test_weights_pointer_form_copies(rng: np.random.Generator) -> None:
    a = rand(rng, "HALF", (6,))
    buf = ctypes.create_string_buffer(a.tobytes(), a.nbytes)
    w = ref.Weights(ref.DataType.HALF, ctypes.addressof(buf), a.size)
    ctypes.memset(buf, 0, a.nbytes)  # the reference copied the bytes
    assert w.size == 6 and w.nbytes == 12 and w.dtype == ref.DataType.HALF
    np.testing.assert_array_equal(w.array, a)
    with pytest.raises(TypeError):
        ref.Weights(np.zeros(3, np.float64))  # no TensorRT type, as tensorrt.Weights
