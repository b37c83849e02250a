"""The collective plugin's NCCL path (plugins/collective.py, :class:`NcclGroup`) on the GPU.

* one GPU (the lent H200): a one-rank NCCL communicator; all-reduce and all-gather through
  :meth:`CollectivePlugin.enqueue` on a non-default stream return the input, bit for bit, in
  float32, float16 and bfloat16;
* two GPUs (nvidia-h200-x2; skipped, saying so, with fewer): two communicators driven from one
  process (``NcclCommunicator.initAll``), each rank's plugin enqueued inside one NCCL group
  call; the all-reduce equals the float64 sum of the ranks' inputs, the all-gather their
  concatenation.

Needs CuPy with NCCL (the ``nvidia-nccl-cu13`` wheel). Without a GPU or NCCL the tests skip,
saying why; under ``TRTCORE_REQUIRE_GPU=1`` (scripts/gpu-check) they fail instead.
"""

from __future__ import annotations

import os
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from trtcore.plugins.base import DeviceTensor
from trtcore.plugins.collective import CollectivePlugin, NcclGroup, register_group, unregister_group
from trtcore.testing import gpu_status

pytestmark = pytest.mark.gpu

DTYPES = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]


def _unavailable(why: str) -> None:
    if os.environ.get("TRTCORE_REQUIRE_GPU") == "1":
        pytest.fail(f"TRTCORE_REQUIRE_GPU=1 but {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def nccl() -> Any:
    ok, why = gpu_status()
    if not ok:
        _unavailable(f"no GPU for the NCCL tests: {why}")
    try:
        from cupy.cuda import nccl as module
    except ImportError as e:
        _unavailable(f"CuPy has no NCCL bindings here ({e}); pip install nvidia-nccl-cu13")
    if not getattr(module, "available", True):
        _unavailable("CuPy was built without NCCL")
    return module


def _device(cp: Any, a: np.ndarray) -> Any:
    """``a`` on the current device (bfloat16 as its uint16 bits)."""
    return cp.asarray(a.view(np.uint16) if a.dtype == ml_dtypes.bfloat16 else a)


def _tensor(d: Any, dtype: np.dtype) -> DeviceTensor:
    return DeviceTensor(int(d.data.ptr), tuple(d.shape), dtype)


def _host(cp: Any, d: Any, dtype: np.dtype) -> np.ndarray:
    return cp.asnumpy(d).view(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_one_rank_collectives_return_the_input(nccl: Any, dtype: np.dtype) -> None:
    import cupy as cp

    group = NcclGroup(1, 0, NcclGroup.unique_id())
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"
    register_group("gpu-test-1", group)
    try:
        x = np.random.default_rng(0).standard_normal((37, 5)).astype(dtype)
        stream = cp.cuda.Stream(non_blocking=True)
        for collective in ("all_reduce", "all_gather"):
            d_x, d_out = _device(cp, x), cp.zeros(x.shape, np.uint16 if dtype == ml_dtypes.bfloat16 else dtype)
            CollectivePlugin(collective, "gpu-test-1", 0, 1).enqueue([_tensor(d_x, dtype)], [_tensor(d_out, dtype)], 0, stream.ptr)
            stream.synchronize()
            np.testing.assert_array_equal(_host(cp, d_out, dtype).view(np.uint8), x.view(np.uint8))
    finally:
        unregister_group("gpu-test-1")


def test_two_ranks_all_reduce_and_all_gather(nccl: Any) -> None:
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs 2 GPUs (nvidia-h200-x2); this machine has one")
    n = 2
    comms = nccl.NcclCommunicator.initAll(list(range(n)))
    names = [f"gpu-test-2-r{r}" for r in range(n)]
    for r in range(n):
        register_group(names[r], NcclGroup.from_communicator(comms[r], n, r))
    try:
        rng = np.random.default_rng(1)
        xs = [rng.standard_normal((64, 48)).astype(np.float32) for _ in range(n)]
        for collective in ("all_reduce", "all_gather"):
            rows = 64 * (n if collective == "all_gather" else 1)
            bufs, streams = [], []
            for r in range(n):
                with cp.cuda.Device(r):
                    bufs.append((cp.asarray(xs[r]), cp.zeros((rows, 48), np.float32)))
                    streams.append(cp.cuda.Stream(non_blocking=True))
            nccl.groupStart()
            for r in range(n):
                with cp.cuda.Device(r):
                    plugin = CollectivePlugin(collective, names[r], r, n)
                    plugin.enqueue([_tensor(bufs[r][0], np.dtype(np.float32))], [_tensor(bufs[r][1], np.dtype(np.float32))], 0, streams[r].ptr)
            nccl.groupEnd()
            for r in range(n):
                with cp.cuda.Device(r):
                    streams[r].synchronize()
                    got = cp.asnumpy(bufs[r][1])
                if collective == "all_reduce":
                    np.testing.assert_allclose(got, sum(x.astype(np.float64) for x in xs), rtol=2.0**-22, atol=1e-6)
                else:
                    np.testing.assert_array_equal(got, np.concatenate(xs))
    finally:
        for name in names:
            unregister_group(name)
