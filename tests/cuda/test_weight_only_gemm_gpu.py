"""The weight-only GEMM kernels (kernels/wq_gemm.cu) against the plugin's float64 reference on
the GPU (marker ``gpu``; skipped with the reason without CuPy or a GPU).

Every variant (int4 group 32/64/128 and int8 per channel / group 64 / group 8, symmetric,
integer and fractional zero points, act-order permutation; float16 and bfloat16) at M in
{1, 4, 9, 16, 17, 64} (up to 16: the tensor-core decode kernels, 8 and 16 columns, except group
8, which runs the tiled kernel; 17 and 64: the tiled kernel),
through :func:`trtcore.testing.check_plugin`, which poisons the output with NaN before each of
two runs and requires bit-identical results. Tolerance: the reference is float64 rounded once;
the kernels accumulate in float32 over K terms, so one output ulp at ``max|y|`` (the default)
plus float32 accumulation noise ``sqrt(K) * 2^-24`` relative.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

from trtcore.plugins.weight_only_gemm import WeightOnlyGemmPlugin
from trtcore.quantization import QuantizedWeight
from trtcore.testing import check_plugin, default_tolerance, gpu_status

pytestmark = pytest.mark.gpu

OK, WHY = gpu_status()
if not OK:
    pytest.skip(WHY, allow_module_level=True)

DTYPES = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
CASES = [
    # (N, K, bits, group_size (0: per channel), zeros, perm)
    (256, 4096, 4, 128, "none", False),
    (300, 1536, 4, 64, "int", False),
    (96, 2080, 4, 32, "frac", True),  # 65 groups of 32: an odd group count
    (512, 1024, 8, 0, "none", False),
    (200, 2048, 8, 64, "int", True),
    (64, 520, 8, 8, "frac", False),
]


def _qw(rng: np.random.Generator, n: int, k: int, bits: int, gs: int, zeros: str, perm: bool) -> QuantizedWeight:
    gs = gs or k
    g = k // gs
    z = (
        None
        if zeros == "none"
        else (rng.integers(0, 1 << bits, (n, g)) if zeros == "int" else rng.uniform(0, (1 << bits) - 1, (n, g))).astype(np.float32)
    )
    return QuantizedWeight(
        rng.integers(0, 1 << bits, (n, k)).astype(np.uint8),
        rng.uniform(0.002, 0.05, (n, g)).astype(np.float32),
        z,
        bits,
        gs,
        rng.permutation(k).astype(np.int32) if perm else None,
    )


@pytest.mark.parametrize("m", [1, 4, 9, 16, 17, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel_matches_reference(case: tuple, dtype: np.dtype, m: int) -> None:
    rng = np.random.default_rng(zlib.crc32(repr((case, str(dtype), m)).encode()))
    qw = _qw(rng, *case)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    k = qw.shape[1]
    specs = [((m, k), dtype)] + [(a.shape, a.dtype, a) for a in packed.arrays()]
    rtol = default_tolerance(dtype)[0] + np.sqrt(k) * 2.0**-24
    check_plugin(plugin, specs, rtol=rtol)


@pytest.mark.parametrize("warps", [1, 3, 16])
def test_decode_warps_share_a_tile(warps: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any number of warps per tile gives the same sums (the warps' partials added in shared
    memory); K = 4128 leaves the last chunk half outside K."""
    rng = np.random.default_rng(5 + warps)
    qw = _qw(rng, 48, 4128, 4, 96, "frac", False)  # group 96: segments end inside chunks
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    monkeypatch.setattr(WeightOnlyGemmPlugin, "decode_warps", lambda self: warps)
    dtype = np.dtype(ml_dtypes.bfloat16)
    assert plugin.uses_tensor_cores(dtype, 2)
    specs = [((2, 4128), dtype)] + [(a.shape, a.dtype, a) for a in packed.arrays()]
    check_plugin(plugin, specs, rtol=2.0**-7 + 1e-5)
