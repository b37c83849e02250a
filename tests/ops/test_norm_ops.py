"""rms_norm against transformers' ``LlamaRMSNorm`` and a float64 formula.

``ops.rms_norm`` computes ``weight * (x32 / sqrt(mean(x32**2) + eps)).to(dtype)``, as
``LlamaRMSNorm``. Tolerances: against the float64 formula ``w * x / sqrt(mean(x^2) + eps)``
(weight rounded to the graph dtype, as the op stores it) 2 roundings of the dtype (the
normalized value cast to the dtype, then the product with the weight) plus float32 noise;
against ``LlamaRMSNorm`` run by PyTorch in the same dtype (which rounds at the same two
points) 1 rounding: only the float32 summation order differs, which can flip a rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from trtcore import ops

from .conftest import DTYPES, NP_DTYPES, OneOp, as_float64, assert_close, builds_rtx, randn

CASES = [
    # (x shape, eps)
    ((2, 3, 16), 1e-6),
    ((5, 64), 1e-5),  # packed tokens
    ((1, 1, 8), 1e-6),
    ((3, 1), 1e-6),  # hidden size 1: x / sqrt(x^2 + eps)
    ((2, 4, 32), 0.5),  # a large eps matters
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-eps{c[1]}")
def test_rms_norm(case: tuple, dtype: str, rng: np.random.Generator) -> None:
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    shape, eps = case
    x = randn(rng, shape, dtype, scale=3.0)
    weight = 1 + 0.5 * rng.standard_normal(shape[-1])
    w = as_float64(weight.astype(NP_DTYPES[dtype]))
    x64 = as_float64(x)
    want = w * x64 / np.sqrt(np.mean(x64**2, axis=-1, keepdims=True) + eps)

    net = OneOp(lambda g, i: ops.rms_norm(g, i["x"], weight, eps, "input_layernorm"), {"x": x}, dtype=dtype,
                dynamic={"x": range(len(shape) - 1)})
    got = net.run()["out"]
    assert got.dtype == NP_DTYPES[dtype]
    assert_close(got, want, dtype, 2)

    torch_dtype = getattr(torch, dtype)
    norm = LlamaRMSNorm(shape[-1], eps=eps).to(torch_dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(w))
        hf = norm(torch.from_numpy(x64).to(torch_dtype)).to(torch.float64).numpy()
    assert_close(got, hf, dtype, 1)

    if builds_rtx(dtype, case == CASES[0]):
        [(_, out_shape, _)] = net.check_rtx()
        assert out_shape == (-1,) * (len(shape) - 1) + (shape[-1],)
