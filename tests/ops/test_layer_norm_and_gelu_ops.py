"""layer_norm, gelu and gelu_mlp against float64 NumPy formulas and PyTorch
(``torch.nn.LayerNorm``, ``torch.nn.functional.gelu``, transformers' ``GPTNeoXMLP``).

Tolerances (float64 references on the inputs' values):

* layer_norm ``(x - mean) / sqrt(var + eps) * w + b`` computes in float32 with the weight and
  bias as float32 constants and rounds once, at the output: 1 rounding of the dtype;
* gelu is one activation layer: 1 rounding;
* gelu_mlp ``down(gelu(up(x)))`` (weights rounded to the graph dtype, as the ops store them):
  up + bias (2 roundings), gelu (1), down + bias (2), the down projection summing terms whose
  errors need not cancel: 6 roundings, measured against ``max|out|``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from trtcore import ops
from trtcore.errors import InvalidArgumentError, NetworkError

from .conftest import DTYPES, NP_DTYPES, OneOp, as_float64, assert_close, builds_rtx, randn, torch_module_reference

_erf = np.vectorize(math.erf)


def _layer_norm64(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)  # biased, as torch.nn.LayerNorm
    y = (x - mean) / np.sqrt(var + eps) * w
    return y if b is None else y + b


LN_CASES = [
    # (x shape, eps, bias)
    ((2, 3, 16), 1e-5, True),
    ((5, 64), 1e-3, True),  # packed tokens
    ((1, 1, 8), 1e-5, False),
    ((2, 4, 32), 0.5, True),  # a large eps matters
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", LN_CASES, ids=lambda c: f"{c[0]}-eps{c[1]}-bias{c[2]}")
def test_layer_norm(case: tuple, dtype: str, rng: np.random.Generator) -> None:
    import torch

    shape, eps, has_bias = case
    x = randn(rng, shape, dtype, scale=3.0) + 2.0 * rng.standard_normal(shape[-1]).astype(NP_DTYPES[dtype])  # a non-zero mean
    weight = 1 + 0.5 * rng.standard_normal(shape[-1])
    bias = 0.5 * rng.standard_normal(shape[-1]) if has_bias else None
    x64 = as_float64(x)
    want = _layer_norm64(x64, weight, bias, eps)

    net = OneOp(lambda g, i: ops.layer_norm(g, i["x"], weight, bias, eps, "input_layernorm"), {"x": x}, dtype=dtype,
                dynamic={"x": range(len(shape) - 1)})
    got = net.run()["out"]
    assert got.dtype == NP_DTYPES[dtype]
    assert_close(got, want, dtype, 1)

    norm = torch.nn.LayerNorm(shape[-1], eps=eps, bias=has_bias, dtype=torch.float64)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(weight))
        if bias is not None:
            norm.bias.copy_(torch.from_numpy(bias))
        hf = norm(torch.from_numpy(x64)).numpy()
    assert_close(got, hf, dtype, 1)

    if builds_rtx(dtype, case == LN_CASES[0]):
        [(_, out_shape, _)] = net.check_rtx()
        assert out_shape == (-1,) * (len(shape) - 1) + (shape[-1],)


def test_layer_norm_rejects_a_misshaped_weight() -> None:
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(NetworkError, match=r"weight \(4,\).*expected \[8\]"):
        OneOp(lambda g, i: ops.layer_norm(g, i["x"], np.ones(4), None, 1e-5, "ln"), {"x": x}).run()
    with pytest.raises(NetworkError, match="bias"):
        OneOp(lambda g, i: ops.layer_norm(g, i["x"], np.ones(8), np.ones((8, 1)), 1e-5, "ln"), {"x": x}).run()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(2, 3, 16), (7, 5), (1, 1, 1)])
def test_gelu(shape: tuple, approximate: str, dtype: str, rng: np.random.Generator) -> None:
    import torch

    x = randn(rng, shape, dtype, scale=4.0)
    x64 = as_float64(x)
    if approximate == "none":
        want = 0.5 * x64 * (1 + _erf(x64 / math.sqrt(2)))
    else:
        want = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    net = OneOp(lambda g, i: ops.gelu(g, i["x"], approximate, "act"), {"x": x}, dtype=dtype, dynamic={"x": (0,)})
    got = net.run()["out"]
    assert_close(got, want, dtype, 1)
    assert_close(got, torch.nn.functional.gelu(torch.from_numpy(x64), approximate=approximate).numpy(), dtype, 1)
    if builds_rtx(dtype, shape == (2, 3, 16)):
        net.check_rtx()


def test_gelu_variants_differ_and_bad_approximate_is_refused(rng: np.random.Generator) -> None:
    x = randn(rng, (4, 16), "float32", scale=3.0)
    erf, tanh = (OneOp(lambda g, i, a=a: ops.gelu(g, i["x"], a), {"x": x}).run()["out"] for a in ("none", "tanh"))
    assert np.abs(erf - tanh).max() > 1e-4  # the two forms are told apart at this tolerance
    with pytest.raises(InvalidArgumentError, match="approximate='fast'"):
        OneOp(lambda g, i: ops.gelu(g, i["x"], "fast"), {"x": x}).run()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_pytorch_tanh"])
@pytest.mark.parametrize("case", [((2, 3, 16), 40), ((5, 8), 24)], ids=lambda c: f"{c[0]}-I{c[1]}")
def test_gelu_mlp_matches_gpt_neox_mlp(case: tuple, hidden_act: str, dtype: str, rng: np.random.Generator) -> None:
    import torch
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXMLP

    shape, inter = case
    hidden = shape[-1]
    config = GPTNeoXConfig(hidden_size=hidden, intermediate_size=inter, num_attention_heads=1, hidden_act=hidden_act)
    mlp = GPTNeoXMLP(config).to(torch.float64)
    params, x, want = torch_module_reference(rng, mlp, shape, dtype)

    up = (params["dense_h_to_4h.weight"], params["dense_h_to_4h.bias"])
    down = (params["dense_4h_to_h.weight"], params["dense_4h_to_h.bias"])
    net = OneOp(lambda g, i: ops.gelu_mlp(g, i["x"], up, down, hidden_act), {"x": x}, dtype=dtype, dynamic={"x": (0,)})
    assert_close(net.run()["out"], want, dtype, 6, atol_scale=float(np.abs(want).max()))
    if builds_rtx(dtype, case[0] == (2, 3, 16) and hidden_act == "gelu"):
        net.check_rtx()


def test_gelu_mlp_refuses_other_activations() -> None:
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(InvalidArgumentError, match="hidden_act 'silu'"):
        OneOp(lambda g, i: ops.gelu_mlp(g, i["x"], (np.ones((3, 4)), None), (np.ones((4, 3)), None), "silu"), {"x": x}).run()
