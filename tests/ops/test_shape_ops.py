"""Shape ops of trtcore.ops: constant, scalar, reshape (0 and -1), transpose, concat, gather,
gather_const, cast.

They move data without arithmetic, so on the reference backend the outputs must equal
NumPy's (``reshape``, ``transpose``, ``concatenate``, ``take``, ``astype``) bit for bit in
every dtype; cast rounds as NumPy/ml_dtypes do (to nearest, ties to even). Each network also
builds with ``tensorrt_rtx`` (ahead of time, sm89) and infers the same output shapes.
"""

from __future__ import annotations

import numpy as np
import pytest

from trtcore import ops

from .conftest import DTYPES, NP_DTYPES, OneOp, builds_rtx, randn


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    np.testing.assert_array_equal(np.ascontiguousarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5), (1, 1, 1), (2, 4, 6)])
def test_constant(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> None:
    """A constant of any float array, converted to the requested dtype."""
    array = rng.standard_normal(shape)  # float64: the op converts
    net = OneOp(lambda g, _: ops.constant(g, array, "c", NP_DTYPES[dtype]), {}, dtype=dtype)
    assert_same_bits(net.run()["out"], array.astype(NP_DTYPES[dtype]))
    if builds_rtx(dtype, shape == (3, 5)):
        net.check_rtx()


def test_constant_of_a_0d_array_has_shape_1() -> None:
    net = OneOp(lambda g, _: ops.constant(g, np.array(7, np.int32), "c"), {})
    assert_same_bits(net.run()["out"], np.array([7], np.int32))
    assert net.check_rtx() == [("out", (1,), "INT32")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rank", [1, 3, 5])
def test_scalar_broadcasts_against_its_rank(dtype: str, rank: int, rng: np.random.Generator) -> None:
    """``scalar`` has shape ``[1] * rank`` and broadcasts in an elementwise op of that rank."""
    value = float(rng.standard_normal())
    x = randn(rng, (2, 3, 1, 4, 2)[:rank], dtype)

    def body(g: ops.Graph, i: dict) -> tuple:
        return ops.scalar(g, value, rank, NP_DTYPES[dtype], "s"), ops.add(g, i["x"], ops.scalar(g, value, rank, NP_DTYPES[dtype], "t"))

    net = OneOp(body, {"x": x}, dtype=dtype)
    out = net.run()
    assert_same_bits(out["out0"], np.full((1,) * rank, value).astype(NP_DTYPES[dtype]))
    # one rounding of the float32 sum of the two stored values
    want = (x.astype(np.float32) + np.float32(out["out0"].astype(np.float32).item())).astype(NP_DTYPES[dtype])
    assert_same_bits(out["out1"], want.reshape(x.shape))
    if builds_rtx(dtype, rank == 1):
        net.check_rtx()


RESHAPES = [
    # (input shape, dims, dynamic axes of the input)
    ((2, 3, 12), (0, 0, 3, 4), (0, 1)),  # split the last axis; 0 copies batch and seq
    ((2, 3, 3, 4), (0, 0, -1), (0,)),  # merge heads; -1 inferred
    ((2, 3, 4), (-1, 4), (0, 1)),  # flatten tokens
    ((1, 1, 8), (0, 0, 1, 8), (0, 1)),  # edge: every leading size 1
    ((4, 1, 6), (0, -1), ()),  # a size-1 axis merged away, static shape
    ((5, 6), (5, 0, 1), (1,)),  # 0 copies a dynamic input axis (1: 6); an added size-1 axis
    ((1, 4), (-1,), (0,)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", RESHAPES, ids=lambda c: f"{c[0]}->{c[1]}")
def test_reshape(dtype: str, case: tuple, rng: np.random.Generator) -> None:
    """``0`` copies the input dimension at that index, one ``-1`` is inferred (TensorRT's
    ``IShuffleLayer.reshape_dims`` with zero-is-placeholder)."""
    shape, dims, dynamic = case
    x = randn(rng, shape, dtype)
    target = tuple(x.shape[i] if d == 0 else d for i, d in enumerate(dims))  # resolve 0s here, -1 by NumPy
    net = OneOp(lambda g, i: ops.reshape(g, i["x"], dims), {"x": x}, dtype=dtype, dynamic={"x": dynamic})
    assert_same_bits(net.run()["out"], x.reshape(target))
    if builds_rtx(dtype, case == RESHAPES[0]):
        [(_, declared, _)] = net.check_rtx()
        assert len(declared) == len(dims)
        assert all(declared[a] == d for a, d in enumerate(dims) if d > 0)  # given sizes stay static


PERMS = [((2, 3, 4), (0, 2, 1)), ((2, 3, 4, 5), (0, 2, 1, 3)), ((1, 3, 1, 2), (3, 2, 1, 0)), ((2, 3, 4, 1, 5), (0, 3, 1, 2, 4)), ((7,), (0,))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", PERMS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_transpose(dtype: str, case: tuple, rng: np.random.Generator) -> None:
    """Output dim ``i`` is input dim ``perm[i]`` (``numpy.transpose``)."""
    shape, perm = case
    x = randn(rng, shape, dtype)
    net = OneOp(lambda g, i: ops.transpose(g, i["x"], perm), {"x": x}, dtype=dtype, dynamic={"x": (0,)})
    assert_same_bits(net.run()["out"], np.transpose(x, perm))
    if builds_rtx(dtype, case == PERMS[0]):
        [(_, declared, _)] = net.check_rtx()
        assert declared == tuple(-1 if p == 0 else shape[p] for p in perm)


CONCATS = [
    # (input shapes, axis)
    ([(2, 3, 4), (2, 5, 4)], 1),
    ([(2, 3, 4), (2, 3, 1), (2, 3, 6)], 2),
    ([(1, 4), (1, 4)], 0),
    ([(3, 1, 2), (3, 1, 2), (3, 1, 2)], -1),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONCATS, ids=lambda c: f"{len(c[0])}x-axis{c[1]}")
def test_concat(dtype: str, case: tuple, rng: np.random.Generator) -> None:
    shapes, axis = case
    xs = {f"x{i}": randn(rng, s, dtype) for i, s in enumerate(shapes)}
    rank = len(shapes[0])
    net = OneOp(lambda g, i: ops.concat(g, [i[k] for k in xs], axis % rank), xs, dtype=dtype)
    assert_same_bits(net.run()["out"], np.concatenate(list(xs.values()), axis=axis))
    if builds_rtx(dtype, case == CONCATS[0]):
        net.check_rtx()


GATHERS = [
    # (data shape, indices shape, axis)
    ((10, 4), (2, 3), 0),  # embedding-style: [batch, seq] ids
    ((10, 4), (1,), 0),
    ((2, 7, 3), (5,), 1),
    ((2, 3, 6), (2, 2), 2),
    ((1, 1), (1, 1), 1),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", GATHERS, ids=lambda c: f"{c[0]}[{c[1]}]@{c[2]}")
def test_gather(dtype: str, case: tuple, rng: np.random.Generator) -> None:
    """``numpy.take(data, indices, axis)``; indices int32, repeats allowed."""
    data_shape, idx_shape, axis = case
    data = randn(rng, data_shape, dtype)
    idx = rng.integers(0, data_shape[axis], idx_shape).astype(np.int32)
    net = OneOp(lambda g, i: ops.gather(g, i["data"], i["idx"], axis), {"data": data, "idx": idx}, dtype=dtype,
                dynamic={"idx": range(len(idx_shape))})
    assert_same_bits(net.run()["out"], np.take(data, idx, axis=axis))
    if builds_rtx(dtype, case == GATHERS[0]):
        [(_, declared, _)] = net.check_rtx()
        assert declared == data_shape[:axis] + (-1,) * len(idx_shape) + data_shape[axis + 1 :]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_gather_const(dtype: str, axis: int, rng: np.random.Generator) -> None:
    """Constant indices: a slice, a permutation with repeats, a single index."""
    x = randn(rng, (3, 5, 4), dtype)
    n = x.shape[axis]
    picks = {"slice": list(range(1, n)), "perm": [int(i) for i in rng.integers(0, n, n + 2)], "one": [n - 1]}
    net = OneOp(lambda g, i: tuple(ops.gather_const(g, i["x"], p, axis, k) for k, p in picks.items()), {"x": x}, dtype=dtype)
    out = net.run()
    for j, p in enumerate(picks.values()):
        assert_same_bits(out[f"out{j}"], np.take(x, np.asarray(p), axis=axis))
    if builds_rtx(dtype, axis == 0):
        net.check_rtx()


CASTS = [("float32", "float16"), ("float32", "bfloat16"), ("float16", "float32"), ("bfloat16", "float32"),
         ("float16", "bfloat16"), ("int32", "float32")]


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("src, dst", CASTS)
def test_cast(src: str, dst: str, rng: np.random.Generator) -> None:
    """Rounds to nearest, ties to even, as NumPy / ml_dtypes' ``astype``; values span the
    formats' ranges (float16 overflows to inf beyond 65504, as the cast must)."""
    src_dt = np.dtype(np.int32) if src == "int32" else NP_DTYPES[src]
    if src == "int32":
        x = rng.integers(-(2**24), 2**24, (4, 33)).astype(np.int32)
    else:
        top = 20 if src == "float32" else 14  # float32 sources overflow float16 (-> inf); others stay finite
        x = (rng.standard_normal((4, 33)) * np.exp2(rng.integers(-top, top, (4, 33)))).astype(src_dt)
    dst_dt = NP_DTYPES[dst]
    # to float16 through float32, as the layer does (a double rounding bfloat16 -> float16 is exact in float32)
    want = x.astype(np.float32).astype(dst_dt) if src != "int32" else x.astype(dst_dt)
    net = OneOp(lambda g, i: ops.cast(g, i["x"], dst_dt), {"x": x}, dynamic={"x": (0,)})
    assert_same_bits(net.run()["out"], want)
    net.check_rtx()


def test_cast_to_its_own_type_adds_no_layer() -> None:
    import trtcore.reference as ref

    network = ref.Builder().create_network(1 << int(ref.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    g = ops.Graph(ref, network, "float16")
    x = g.input("x", np.float16, (2, 3))
    assert ops.cast(g, x, np.float16) is x
    assert network.num_layers == 0
