"""trtcore.quantization.QuantizedWeight: the canonical weight-only form every format becomes."""

from __future__ import annotations

import numpy as np
import pytest

from trtcore.errors import InvalidArgumentError
from trtcore.quantization import QuantizedWeight


def _random(rng: np.random.Generator, n: int, k: int, bits: int, group: int, zeros: bool, perm: bool) -> QuantizedWeight:
    g = k // group
    return QuantizedWeight(
        codes=rng.integers(0, 1 << bits, (n, k), dtype=np.uint8),
        scales=rng.uniform(0.001, 0.1, (n, g)).astype(np.float32),
        zeros=rng.uniform(0, (1 << bits) - 1, (n, g)).astype(np.float32) if zeros else None,
        bits=bits,
        group_size=group,
        perm=rng.permutation(k).astype(np.int32) if perm else None,
    )


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [16, 32, 128])
@pytest.mark.parametrize("zeros", [False, True])
@pytest.mark.parametrize("perm", [False, True])
def test_dequantize_is_the_documented_formula(bits: int, group: int, zeros: bool, perm: bool) -> None:
    """Element by element, in float64: w[n, perm[j]] = (q[n, j] - z[n, j // G]) * s[n, j // G]."""
    rng = np.random.default_rng([bits, group, zeros, perm])
    n, k = 5, 256
    qw = _random(rng, n, k, bits, group, zeros, perm)
    want = np.empty((n, k))
    for r in range(n):
        for j in range(k):
            z = float(qw.zeros[r, j // group]) if qw.zeros is not None else 2.0 ** (bits - 1)
            col = int(qw.perm[j]) if qw.perm is not None else j
            want[r, col] = (float(qw.codes[r, j]) - z) * float(qw.scales[r, j // group])
    np.testing.assert_array_equal(qw.dequantize(), want)
    assert qw.shape == (n, k)


def test_a_product_with_the_permuted_weight_is_the_product_with_the_original() -> None:
    rng = np.random.default_rng(7)
    qw = _random(rng, 8, 64, 4, 32, True, True)
    x = rng.standard_normal(64)
    stored = QuantizedWeight(qw.codes, qw.scales, qw.zeros, qw.bits, qw.group_size)  # same codes, no perm
    np.testing.assert_allclose(qw.dequantize() @ x, stored.dequantize() @ x[qw.perm], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"bits": 3}, "bits"),
        ({"codes": np.zeros((4, 64), np.int8)}, "codes"),
        ({"group_size": 48}, "group_size"),
        ({"scales": np.ones((4, 3), np.float32)}, "scales"),
        ({"scales": np.ones((4, 2), np.float64)}, "scales"),
        ({"zeros": np.ones((4, 1), np.float32)}, "zeros"),
        ({"codes": np.full((4, 64), 16, np.uint8)}, "codes"),
        ({"perm": np.zeros(64, np.int32)}, "perm"),
    ],
)
def test_inconsistent_fields_are_refused_by_name(change: dict, field: str) -> None:
    base = dict(codes=np.zeros((4, 64), np.uint8), scales=np.ones((4, 2), np.float32), zeros=None, bits=4, group_size=32, perm=None)
    with pytest.raises(InvalidArgumentError, match=f"QuantizedWeight.{field}"):
        QuantizedWeight(**{**base, **change})
