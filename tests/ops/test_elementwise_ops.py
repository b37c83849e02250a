"""Arithmetic ops of trtcore.ops: add, sub, mul, div, maximum, power (with broadcasting),
unary, reduce, softmax; against float64 NumPy on the inputs' values.

Tolerance: each op is one layer, which computes in float32 from the (exact) input values and
rounds its output once to the tensor's type, so it is within one unit roundoff ``u`` of the
dtype (float16 2^-11, bfloat16 2^-8) plus float32 noise (64 float32 ulps, which also bounds
a float32 run: 3.8e-6 relative); see ``assert_close`` in conftest.py. Reductions and softmax
add float32 summation error, far inside the 64 ulps at these sizes. Each network also builds
with ``tensorrt_rtx`` and infers the reference's output shape and type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from trtcore import ops

from .conftest import DTYPES, NP_DTYPES, OneOp, as_float64, assert_close, builds_rtx, randn

Draw = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


def normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape)


def away_from_zero(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """|x| in [0.25, 4]: divisors and reciprocals stay finite and well conditioned."""
    return rng.uniform(0.25, 4, shape) * rng.choice([-1, 1], shape)


def uniform(lo: float, hi: float) -> Draw:
    return lambda rng, shape: rng.uniform(lo, hi, shape)


#: op -> (trtcore.ops function, float64 formula, draw of a, draw of b); power: positive
#: bases, exponents in [-2, 2], results within [4^-2, 4^2]
BINARY: dict[str, tuple[Callable[..., Any], Callable[[np.ndarray, np.ndarray], np.ndarray], Draw, Draw]] = {
    "add": (ops.add, np.add, normal, normal),
    "sub": (ops.sub, np.subtract, normal, normal),
    "mul": (ops.mul, np.multiply, normal, normal),
    "div": (ops.div, np.divide, normal, away_from_zero),
    "maximum": (ops.maximum, np.maximum, normal, normal),
    "power": (ops.power, np.power, uniform(0.25, 4), uniform(-2, 2)),
}

BROADCASTS = [
    ((2, 3, 4), (2, 3, 4)),
    ((2, 3, 4), (1, 1, 4)),  # a bias / weight row
    ((2, 1, 4), (1, 5, 1)),  # both sides broadcast
    ((1,), (1,)),
    ((3, 1, 2, 7), (1, 1, 1, 1)),  # a scalar of rank 4 (ops.scalar)
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", BROADCASTS, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary(op: str, shapes: tuple, dtype: str, rng: np.random.Generator) -> None:
    fn, formula, draw_a, draw_b = BINARY[op]
    a, b = draw_a(rng, shapes[0]).astype(NP_DTYPES[dtype]), draw_b(rng, shapes[1]).astype(NP_DTYPES[dtype])
    net = OneOp(lambda g, i: fn(g, i["a"], i["b"]), {"a": a, "b": b}, dtype=dtype, dynamic={"a": (0,)} if shapes[0][0] > 1 else {})
    got = net.run()["out"]
    assert got.dtype == a.dtype
    assert_close(got, formula(as_float64(a), as_float64(b)), dtype, 1)
    if builds_rtx(dtype, shapes == BROADCASTS[0]):
        net.check_rtx()


#: UnaryOperation name -> (float64 formula, draw of the input)
UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], Draw]] = {
    "EXP": (np.exp, uniform(-4, 4)),
    "LOG": (np.log, uniform(0.05, 20)),
    "SQRT": (np.sqrt, uniform(0, 50)),
    "RECIP": (np.reciprocal, away_from_zero),
    "ABS": (np.abs, normal),
    "NEG": (np.negative, normal),
    "SIN": (np.sin, uniform(-10, 10)),
    "COS": (np.cos, uniform(-10, 10)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op: str, dtype: str, rng: np.random.Generator) -> None:
    formula, draw = UNARY[op]
    x = draw(rng, (3, 1, 17)).astype(NP_DTYPES[dtype])
    net = OneOp(lambda g, i: ops.unary(g, i["x"], op, op.lower()), {"x": x}, dtype=dtype, dynamic={"x": (0,)})
    assert_close(net.run()["out"], formula(as_float64(x)), dtype, 1)
    net.check_rtx()


REDUCES = [
    # (shape, axes, keep_dims)
    ((2, 3, 16), [-1], True),  # RMSNorm's variance
    ((2, 3, 16), [1], False),
    ((4, 5, 6), [0, 2], True),
    ((1, 1, 7), [-1], False),
    ((3, 1), [0, 1], False),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", REDUCES, ids=lambda c: f"{c[0]}-{c[1]}-{'keep' if c[2] else 'drop'}")
@pytest.mark.parametrize("op", ["SUM", "AVG", "MAX", "MIN"])
def test_reduce(op: str, case: tuple, dtype: str, rng: np.random.Generator) -> None:
    """Negative axes count from the end; ``keep_dims`` keeps reduced axes as size 1."""
    shape, axes, keep = case
    x = randn(rng, shape, dtype)
    formula = {"SUM": np.sum, "AVG": np.mean, "MAX": np.max, "MIN": np.min}[op]
    want = formula(as_float64(x), axis=tuple(axes), keepdims=keep)
    net = OneOp(lambda g, i: ops.reduce(g, i["x"], op, axes, keep), {"x": x}, dtype=dtype)
    assert_close(net.run()["out"], want, dtype, 1)
    if builds_rtx(dtype, case == REDUCES[0]):
        [(_, shape_rtx, _)] = net.check_rtx()
        assert shape_rtx == want.shape


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [((2, 3, 9), -1), ((2, 5, 3), 1), ((4, 6), 0), ((1, 1, 1), -1), ((2, 2, 1, 4, 33), -1)],
                         ids=lambda c: f"{c[0]}@{c[1]}")
def test_softmax(case: tuple, dtype: str, rng: np.random.Generator) -> None:
    """exp(x - max) / sum along ``axis``; some entries carry the attention mask's large
    negative (-1e4 after the scores), which must give probability 0."""
    shape, axis = case
    x = rng.standard_normal(shape) * 3
    x = np.where(rng.random(shape) < 0.2, -1e4, x)
    # entry 0 of each row is never masked
    x = np.where(np.arange(shape[axis]).reshape([-1 if a == axis % len(shape) else 1 for a in range(len(shape))]) == 0, 0.5, x)
    x = x.astype(NP_DTYPES[dtype])
    x64 = as_float64(x)
    e = np.exp(x64 - x64.max(axis=axis, keepdims=True))
    net = OneOp(lambda g, i: ops.softmax(g, i["x"], axis), {"x": x}, dtype=dtype, dynamic={"x": (0,)})
    got = net.run()["out"]
    assert_close(got, e / e.sum(axis=axis, keepdims=True), dtype, 1, atol_scale=1.0)
    if builds_rtx(dtype, case[1] == -1 and case[0] == (2, 3, 9)):
        net.check_rtx()
