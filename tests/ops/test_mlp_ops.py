"""silu and swiglu_mlp against PyTorch (``torch.nn.functional.silu``, transformers' ``LlamaMLP``)
in float64.

Tolerances (float64 references on the inputs' values and on the weights rounded to the graph
dtype, as the ops store them):

* silu ``x * sigmoid(x)`` is two layers: 2 roundings of the dtype;
* swiglu_mlp ``down(silu(gate(x)) * up(x))``: gate (1 rounding, 2 with a bias), silu (2), the
  gating product (1), then the down projection (1, 2 with a bias) sums ``intermediate_size``
  terms whose relative errors (<= 4 roundings each) do not cancel in the worst case: 6
  roundings, measured against ``max|out|``.
"""

from __future__ import annotations

import numpy as np
import pytest

from trtcore import ops

from .conftest import DTYPES, OneOp, as_float64, assert_close, builds_rtx, randn, torch_module_reference


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 16), (1, 1, 1), (7, 5)])
def test_silu(shape: tuple, dtype: str, rng: np.random.Generator) -> None:
    import torch

    x = randn(rng, shape, dtype, scale=4.0)
    want = torch.nn.functional.silu(torch.from_numpy(as_float64(x))).numpy()
    net = OneOp(lambda g, i: ops.silu(g, i["x"], "act_fn"), {"x": x}, dtype=dtype, dynamic={"x": (0,)})
    assert_close(net.run()["out"], want, dtype, 2)
    if builds_rtx(dtype, shape == (2, 3, 16)):
        net.check_rtx()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "mlp_bias"])
@pytest.mark.parametrize("case", [((2, 3, 16), 40), ((5, 8), 24), ((1, 1, 4), 1)], ids=lambda c: f"{c[0]}-I{c[1]}")
def test_swiglu_mlp_matches_llama_mlp(case: tuple, bias: bool, dtype: str, rng: np.random.Generator) -> None:
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    shape, inter = case
    hidden = shape[-1]
    config = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_attention_heads=1, num_key_value_heads=1, mlp_bias=bias)
    mlp = LlamaMLP(config).to(torch.float64)
    assert config.hidden_act == "silu"
    params, x, want = torch_module_reference(rng, mlp, shape, dtype)

    biases = tuple(params.get(f"{p}.bias") for p in ("gate_proj", "up_proj", "down_proj"))
    net = OneOp(lambda g, i: ops.swiglu_mlp(g, i["x"], params["gate_proj.weight"], params["up_proj.weight"],
                                            params["down_proj.weight"], biases, "mlp"),
                {"x": x}, dtype=dtype, dynamic={"x": range(len(shape) - 1)})
    out = net.run(capture=["mlp.gated"])
    assert out["mlp.gated"].shape == shape[:-1] + (inter,)
    assert_close(out["out"], want, dtype, 6, atol_scale=float(np.abs(want).max()))
    if builds_rtx(dtype, case[1] == 40):
        [(_, out_shape, _)] = net.check_rtx()
        assert out_shape == (-1,) * (len(shape) - 1) + (hidden,)
