"""Tensor-parallel ops: ``linear(parallel=...)``, the vocabulary-parallel ``embedding``,
``all_reduce`` / ``all_gather`` (:mod:`trtcore.ops`, :class:`trtcore.parallel.Mapping`).

Each case defines the same one-op network for every rank (``Graph(mapping=Mapping(N, r))``),
builds each on the reference backend, and runs them together through
:class:`~trtcore.runtime.tensor_parallel.TensorParallelExecutor` (one thread per rank, the
collective plugin's ranks meeting in a :class:`~trtcore.plugins.collective.SimulatedGroup`).
The expected values are the whole op in float64 NumPy (``x @ W.T + b``, ``table[ids]``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import trtcore.reference as ref
from trtcore import ops
from trtcore.errors import ConfigError, InvalidArgumentError
from trtcore.parallel import Mapping
from trtcore.runtime.reference_executor import ReferenceExecutor
from trtcore.runtime.tensor_parallel import TensorParallelExecutor, new_group_name

from .conftest import OneOp, assert_close, randn

RankBody = Callable[[ops.Graph, dict[str, Any], int], Any]


def run_ranks(body: RankBody, feeds: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
    """Rank 0's outputs of the ``n`` rank networks of ``body(g, inputs, rank)`` run together."""
    group = new_group_name()
    executors = []
    for r in range(n):
        op = OneOp(lambda g, x, r=r: body(g, x, r), feeds, graph_kwargs={"mapping": Mapping(n, r, group)})
        builder, network, g = op.define(ref)
        blob = builder.build_serialized_network(network, op._config(builder))
        executors.append(ReferenceExecutor(ref.Runtime(ref.Logger()).deserialize_cuda_engine(blob)))
    with TensorParallelExecutor(executors, group) as tp:
        return {k: np.asarray(v) for k, v in tp.run(feeds).items()}


@pytest.mark.parametrize("n", [2, 4])
def test_row_parallel_linear_sums_the_ranks_partial_products(n: int) -> None:
    rng = np.random.default_rng([n, 1])
    x, w, b = randn(rng, (3, 16), "float32"), randn(rng, (12, 16), "float32"), randn(rng, (12,), "float32")

    def body(g: ops.Graph, i: dict[str, Any], r: int) -> Any:
        # the rank's share of the input features, as a column-parallel op would leave it
        share = ops.gather_const(g, i["x"], range(r * 16 // n, (r + 1) * 16 // n), 1, "x_share")
        return ops.linear(g, share, w, b, "o_proj", parallel="row")

    got = run_ranks(body, {"x": x}, n)["out"]
    assert_close(got, x.astype(np.float64) @ w.astype(np.float64).T + b, "float32", roundings=n + 2)


@pytest.mark.parametrize("n", [2, 4])
def test_column_then_row_parallel_mlp_equals_the_whole(n: int) -> None:
    rng = np.random.default_rng([n, 2])
    x = randn(rng, (5, 8), "float32")
    gate, up, down = randn(rng, (12, 8), "float32"), randn(rng, (12, 8), "float32"), randn(rng, (8, 12), "float32")
    got = run_ranks(lambda g, i, r: ops.swiglu_mlp(g, i["x"], gate, up, down), {"x": x}, n)["out"]
    x64 = x.astype(np.float64)
    a, u = x64 @ gate.T.astype(np.float64), x64 @ up.T.astype(np.float64)
    want = (a / (1 + np.exp(-a)) * u) @ down.T.astype(np.float64)
    assert_close(got, want, "float32", roundings=16)


@pytest.mark.parametrize(("n", "vocab"), [(2, 14), (4, 13), (4, 3)])
def test_vocab_parallel_embedding_and_lm_head(n: int, vocab: int) -> None:
    """13 rows over 4 ranks: 4 rows each, the last rank 1 real row and 3 zero rows; 3 rows
    over 4 ranks: the last rank holds none."""
    rng = np.random.default_rng([n, vocab])
    table = randn(rng, (vocab, 6), "float32")
    ids = rng.integers(0, vocab, size=(2, 5)).astype(np.int32)

    def body(g: ops.Graph, i: dict[str, Any], r: int) -> Any:
        h = ops.embedding(g, i["ids"], table)
        return h, ops.linear(g, ops.reshape(g, h, (-1, 6), "flat"), table, None, "lm_head", parallel="vocab")

    out = run_ranks(body, {"ids": ids}, n)
    np.testing.assert_array_equal(out["out0"], table[ids])  # one rank holds each row; the others add zeros
    assert_close(out["out1"], table[ids].reshape(-1, 6).astype(np.float64) @ table.T.astype(np.float64), "float32", roundings=4)


@pytest.mark.parametrize("n", [2, 3])
def test_all_reduce_and_all_gather_combine_every_rank(n: int) -> None:
    rng = np.random.default_rng(n)
    x = randn(rng, (2, 3), "float32")

    def body(g: ops.Graph, i: dict[str, Any], r: int) -> Any:
        mine = ops.mul(g, i["x"], ops.scalar(g, float(r + 1), 2, np.float32, "factor"), "mine")
        return ops.all_reduce(g, mine), ops.all_gather(g, mine)

    out = run_ranks(body, {"x": x}, n)
    np.testing.assert_array_equal(out["out0"], sum((r + 1) * x for r in range(n)))  # small integers times x: exact
    np.testing.assert_array_equal(out["out1"], np.concatenate([(r + 1) * x for r in range(n)]))


def test_one_rank_has_no_collectives() -> None:
    op = OneOp(lambda g, i: ops.all_reduce(g, i["x"]), {"x": np.ones((2, 2), np.float32)})
    _, network, _ = op.define(ref)
    assert network.num_layers == 0  # the input itself is the output


def test_bad_parallel_style_and_split_are_refused() -> None:
    w = np.ones((6, 4), np.float32)
    with pytest.raises(InvalidArgumentError, match="parallel='diagonal'"):
        OneOp(lambda g, i: ops.linear(g, i["x"], w, parallel="diagonal"), {"x": np.ones((1, 4), np.float32)}).define(ref)
    with pytest.raises(ConfigError, match="does not divide proj out_features 6"):
        OneOp(
            lambda g, i: ops.linear(g, i["x"], w, name="proj", parallel="column"),
            {"x": np.ones((1, 4), np.float32)},
            graph_kwargs={"mapping": Mapping(4, 1)},
        ).define(ref)


def test_tensorrt_rtx_hosts_the_collectives_as_dist_collective_layers() -> None:
    """tensorrt_rtx has no plugins, so the ops take TensorRT's IDistCollectiveLayer; it builds
    ahead of time with the same output shapes as the reference network's (the plugin)."""
    rng = np.random.default_rng(7)
    w = randn(rng, (8, 4), "float32")
    op = OneOp(
        lambda g, i: (ops.linear(g, i["x"], w, None, "o_proj", parallel="row"), ops.all_gather(g, i["x"])),
        {"x": randn(rng, (3, 2), "float32")},
        graph_kwargs={"mapping": Mapping(2, 0)},
    )
    got = op.check_rtx()
    assert [shape for _, shape, _ in got] == [(3, 8), (6, 2)]
