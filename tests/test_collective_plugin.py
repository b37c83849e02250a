"""The collective plugin (plugins/collective.py) on the CPU: its fields, the simulated
group's arithmetic against float64 NumPy, and how a failing rank releases the others.

Whole models over simulated ranks are in tests/test_tensor_parallel.py, the ops in
tests/ops/test_parallel_ops.py; NCCL on the GPU in tests/cuda/test_collective_gpu.py.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import trtcore.reference as ref
from trtcore.plugins import builtin_plugins
from trtcore.plugins.base import PluginError, create
from trtcore.plugins.collective import CollectivePlugin, NcclGroup, SimulatedGroup, communicator, register_group, unregister_group
from trtcore.runtime.executor import Executor
from trtcore.runtime.tensor_parallel import TensorParallelExecutor, new_group_name


def test_fields_survive_the_creator_and_bad_ones_are_refused() -> None:
    p = CollectivePlugin(collective="all_gather", group="tp-x", rank=2, world_size=4)
    assert create(p, ref) == p and CollectivePlugin in builtin_plugins()
    with pytest.raises(PluginError, match="collective 'broadcast'"):
        CollectivePlugin(collective="broadcast")
    with pytest.raises(PluginError, match="rank 4 must lie in"):
        CollectivePlugin(rank=4, world_size=4)


def _ranks(group: SimulatedGroup, collective: str, xs: list[np.ndarray]) -> list[np.ndarray]:
    """Every rank's result, each rank in its own thread as the executor runs them."""
    out: list[Any] = [None] * len(xs)

    def rank(r: int) -> None:
        out[r] = group.reference(collective, r, xs[r])

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("n", [2, 4])
def test_simulated_all_reduce_is_the_sum_rounded_once_on_every_rank(n: int, dtype: Any) -> None:
    rng = np.random.default_rng(n)
    # magnitudes in [0.5, 2): the float32 sum of up to 4 bfloat16 values is exact, so the
    # contract "float32 sum, one rounding" equals the float64 sum rounded once
    xs = [(rng.uniform(0.5, 2.0, (3, 5)) * rng.choice([-1, 1], (3, 5))).astype(dtype) for _ in range(n)]
    want = sum(x.astype(np.float64) for x in xs)
    got = _ranks(SimulatedGroup(n), "all_reduce", xs)
    if dtype is np.float32:
        np.testing.assert_allclose(got[0].astype(np.float64), want, rtol=n * 2.0**-24)
    else:
        np.testing.assert_array_equal(got[0], want.astype(dtype))
    for g in got[1:]:
        np.testing.assert_array_equal(g, got[0])  # bit-identical on every rank


def test_simulated_all_gather_concatenates_rank_major() -> None:
    xs = [np.full((2, 3), r, np.float32) for r in range(3)]
    got = _ranks(SimulatedGroup(3), "all_gather", xs)
    for g in got:
        np.testing.assert_array_equal(g, np.concatenate(xs))


def test_mismatched_ranks_and_missing_groups_are_named() -> None:
    group = SimulatedGroup(2)
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            group.reference("all_reduce", r, np.zeros(2 + r, np.float32))
        except PluginError as e:
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 2 and all("different tensors" in str(e) for e in errors)
    with pytest.raises(PluginError, match="'nowhere'"):
        communicator("nowhere")
    assert CollectivePlugin(world_size=1).reference(np.ones(3, np.float32))[0].tolist() == [1.0, 1.0, 1.0]


class _Rank(Executor):
    """A rank that all-reduces its input through the group (or fails before, when told)."""

    input_names = ["x"]
    output_names = ["y"]

    def __init__(self, group: str, rank: int, n: int):
        self.plugin = CollectivePlugin("all_reduce", group, rank, n)
        self.fail = False

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.fail:
            raise ValueError(f"rank {self.plugin.rank} failed")
        return {"y": self.plugin.reference(np.asarray(feeds["x"]) * (self.plugin.rank + 1))[0]}


def test_a_failing_rank_releases_the_others_and_the_group_recovers() -> None:
    name = new_group_name()
    ranks = [_Rank(name, r, 3) for r in range(3)]
    x = np.arange(4, dtype=np.float32)
    with TensorParallelExecutor(ranks, name) as tp:
        ranks[1].fail = True
        with pytest.raises(ValueError, match="rank 1 failed"):
            tp.run({"x": x})
        ranks[1].fail = False
        np.testing.assert_array_equal(tp.run({"x": x})["y"], 6 * x)
    with pytest.raises(PluginError):
        communicator(name)  # unregistered on close


def test_nccl_group_without_cupy_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setitem(sys.modules, "cupy.cuda", None)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    with pytest.raises(PluginError, match="nvidia-nccl-cu13"):
        NcclGroup.unique_id()
    import os

    assert os.environ["NCCL_NVLS_ENABLE"] == "0"  # NVLink multicast off before NCCL is touched


def test_register_group_replaces_and_unregisters() -> None:
    a, b = SimulatedGroup(1), SimulatedGroup(1)
    register_group("tp-test-replace", a)
    register_group("tp-test-replace", b)
    assert communicator("tp-test-replace") is b
    unregister_group("tp-test-replace")
    unregister_group("tp-test-replace")  # twice: nothing
