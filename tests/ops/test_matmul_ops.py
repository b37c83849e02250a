"""matmul (batched, broadcast, ``transpose_b``) and linear (``torch.nn.Linear``: with and without
bias, weights in the Hugging Face ``[out, in]`` layout) against float64 NumPy / PyTorch.

Tolerance: a matrix product is one layer: float32 accumulation (K <= 64 terms: a few float32
ulps of ``max|out|``) and one rounding to the output type; linear with a bias adds a second
layer (the bias add), so 2 roundings. The weight is stored in the graph dtype (the op's
documented contract), so the float64 reference uses the weight rounded to that dtype.
Errors are measured against ``max|out|`` (``atol_scale``), the scale of the accumulation.
"""

from __future__ import annotations

import numpy as np
import pytest

from trtcore import ops
from trtcore.errors import NetworkError

from .conftest import DTYPES, NP_DTYPES, OneOp, as_float64, assert_close, builds_rtx, randn

MATMULS = [
    # (a shape, b shape as given to the op, transpose_b)
    ((2, 3, 8), (2, 8, 5), False),
    ((2, 3, 8), (2, 5, 8), True),
    ((4, 1, 16), (1, 16, 7), False),  # decode: one query row, b broadcast over the batch
    ((2, 2, 5, 64), (2, 1, 3, 64), True),  # attention's q @ k^T with a broadcast head axis
    ((1, 1), (1, 1), False),
    ((3, 1), (3, 1), True),  # an outer product
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", MATMULS, ids=lambda c: f"{c[0]}@{c[1]}{'^T' if c[2] else ''}")
def test_matmul(case: tuple, dtype: str, rng: np.random.Generator) -> None:
    a_shape, b_shape, transpose_b = case
    a, b = randn(rng, a_shape, dtype), randn(rng, b_shape, dtype)
    b64 = np.swapaxes(as_float64(b), -1, -2) if transpose_b else as_float64(b)
    want = np.matmul(as_float64(a), b64)
    net = OneOp(lambda g, i: ops.matmul(g, i["a"], i["b"], transpose_b), {"a": a, "b": b}, dtype=dtype,
                dynamic={"a": (0,)} if a_shape[0] > 1 and len(a_shape) > 2 else {})
    assert_close(net.run()["out"], want, dtype, 1, atol_scale=float(np.abs(want).max()))
    if builds_rtx(dtype, case == MATMULS[0]):
        [(_, shape, _)] = net.check_rtx()
        assert shape[1:] == want.shape[1:]


LINEARS = [
    # (x shape, out_features)
    ((2, 3, 16), 24),  # [batch, seq, hidden]
    ((5, 16), 8),  # packed tokens
    ((1, 1, 1, 4), 1),  # edge: size 1 everywhere, rank 4
    ((3, 1, 32), 64),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("case", LINEARS, ids=lambda c: f"{c[0]}->{c[1]}")
def test_linear_matches_torch(case: tuple, bias: bool, dtype: str, rng: np.random.Generator) -> None:
    import torch

    x_shape, out_features = case
    x = randn(rng, x_shape, dtype)
    weight = rng.standard_normal((out_features, x_shape[-1])) / np.sqrt(x_shape[-1])  # float64; the op converts
    b = rng.standard_normal(out_features) if bias else None
    # torch.nn.Linear in float64 with the parameters rounded to the graph dtype, as the op stores them
    layer = torch.nn.Linear(x_shape[-1], out_features, bias=bias, dtype=torch.float64)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(as_float64(weight.astype(NP_DTYPES[dtype]))))
        if b is not None:
            layer.bias.copy_(torch.from_numpy(as_float64(b.astype(NP_DTYPES[dtype]))))
        want = layer(torch.from_numpy(as_float64(x))).numpy()
    net = OneOp(lambda g, i: ops.linear(g, i["x"], weight, b, "proj"), {"x": x}, dtype=dtype, dynamic={"x": range(len(x_shape) - 1)})
    out = net.run(capture=["proj.weight"])
    assert out["out"].dtype == NP_DTYPES[dtype]
    assert out["proj.weight"].dtype == NP_DTYPES[dtype]  # stored in the graph dtype
    assert_close(out["out"], want, dtype, 2 if bias else 1, atol_scale=float(np.abs(want).max()))
    if builds_rtx(dtype, case == LINEARS[0]):
        [(_, shape, _)] = net.check_rtx()
        assert shape == (-1,) * (len(x_shape) - 1) + (out_features,)


def test_linear_rejects_a_weight_that_does_not_fit() -> None:
    """The error names the layer and both shapes."""
    x = np.zeros((2, 3, 16), np.float32)
    with pytest.raises(NetworkError, match=r"q_proj: weight \(8, 12\) does not fit input \(2, 3, 16\)"):
        OneOp(lambda g, i: ops.linear(g, i["x"], np.zeros((8, 12)), None, "q_proj"), {"x": x}).run()
    with pytest.raises(NetworkError, match=r"weight \(16,\)"):
        OneOp(lambda g, i: ops.linear(g, i["x"], np.zeros(16), None, "q_proj"), {"x": x}).run()
