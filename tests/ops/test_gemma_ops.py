"""The ops Gemma adds, against float64 NumPy formulas written from the papers and against
transformers' own modules in float64:

* ``soft_cap`` ``cap * tanh(x / cap)`` (Gemma 2, arXiv:2408.00118, section 2): computed in
  float32 (3 layers) and rounded once to the dtype: 1 rounding;
* ``rms_norm(offset=1)`` ``x / sqrt(mean(x^2) + eps) * (1 + w)`` (``Gemma2RMSNorm``): float32
  throughout, the one rounding at the output: 1 rounding;
* ``embedding(scale=)`` the row times ``sqrt(hidden_size)`` rounded to the dtype (as
  ``Gemma2TextScaledWordEmbedding``): the product rounded once: 1 rounding against the
  reference on the rounded factor;
* ``swiglu_mlp(hidden_act="gelu_pytorch_tanh")`` GeGLU ``down(gelu_tanh(gate(x)) * up(x))``
  (Shazeer, arXiv:2002.05202; ``Gemma2MLP``): as SwiGLU's 6 roundings (the GELU is one
  layer, one rounding fewer than SiLU's two).
"""

from __future__ import annotations

import numpy as np
import pytest

from trtcore import ops
from trtcore.errors import InvalidArgumentError

from .conftest import DTYPES, NP_DTYPES, OneOp, as_float64, assert_close, builds_rtx, randn, torch_module_reference


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [((2, 3, 16), 5.0), ((4, 7), 0.5), ((1, 160), 30.0)], ids=lambda c: f"{c[0]}-cap{c[1]}")
def test_soft_cap(case: tuple, dtype: str, rng: np.random.Generator) -> None:
    shape, cap = case
    x = randn(rng, shape, dtype, scale=3 * cap)  # well into tanh's saturation
    want = cap * np.tanh(as_float64(x) / cap)
    net = OneOp(lambda g, i: ops.soft_cap(g, i["x"], cap, "final_logit_softcapping"), {"x": x}, dtype=dtype, dynamic={"x": (0,)})
    got = net.run()["out"]
    assert got.dtype == NP_DTYPES[dtype] and np.abs(as_float64(got)).max() <= cap
    assert_close(got, want, dtype, 1)
    if builds_rtx(dtype, case == ((2, 3, 16), 5.0)):
        [(_, out_shape, _)] = net.check_rtx()
        assert out_shape == (-1,) + shape[1:]


@pytest.mark.parametrize("cap", [0.0, -1.0, float("inf")])
def test_soft_cap_rejects_a_bad_cap(cap: float) -> None:
    with pytest.raises(InvalidArgumentError, match="soft-cap"):
        OneOp(lambda g, i: ops.soft_cap(g, i["x"], cap), {"x": np.zeros((2, 3), np.float32)}).run()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [((2, 3, 16), 1e-6), ((5, 4, 8), 1e-2), ((1, 64), 0.5)], ids=lambda c: f"{c[0]}-eps{c[1]}")
def test_rms_norm_with_offset_matches_gemma_rms_norm(case: tuple, dtype: str, rng: np.random.Generator) -> None:
    import torch
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm

    shape, eps = case
    x = randn(rng, shape, dtype, scale=3.0)
    weight = 0.5 * rng.standard_normal(shape[-1])  # Gemma stores the offset-free weight (init 0)
    x64 = as_float64(x)
    want = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + eps) * (1.0 + weight)
    net = OneOp(lambda g, i: ops.rms_norm(g, i["x"], weight, eps, "input_layernorm", offset=1.0), {"x": x}, dtype=dtype,
                dynamic={"x": range(len(shape) - 1)})
    got = net.run()["out"]
    assert got.dtype == NP_DTYPES[dtype]
    assert_close(got, want, dtype, 1)
    norm = Gemma2RMSNorm(shape[-1], eps=eps).to(torch.float64)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(weight))
        assert_close(got, norm(torch.from_numpy(x64)).numpy(), dtype, 1)
    # the offset matters: without it this is Llama's norm
    assert np.abs(want - x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + eps) * weight).max() > 0.5
    if builds_rtx(dtype, case == ((2, 3, 16), 1e-6)):
        [(_, out_shape, _)] = net.check_rtx()
        assert out_shape == (-1,) * (len(shape) - 1) + (shape[-1],)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 3072])
def test_scaled_embedding_matches_gemma(hidden: int, dtype: str, rng: np.random.Generator) -> None:
    """Rows times sqrt(hidden) rounded to the dtype first (bfloat16: sqrt(3072) = 55.43 -> 55.5,
    as transformers' comment in modeling_gemma2 says)."""
    import torch
    from transformers.models.gemma2.modeling_gemma2 import Gemma2TextScaledWordEmbedding

    vocab = 11
    table = rng.standard_normal((vocab, hidden))
    ids = rng.integers(0, vocab, (2, 5)).astype(np.int32)
    scale = hidden**0.5
    factor = float(np.float64(scale).astype(NP_DTYPES[dtype]))
    want = as_float64(table.astype(NP_DTYPES[dtype]))[ids] * factor
    net = OneOp(lambda g, i: ops.embedding(g, i["ids"], table, "embed_tokens", scale=scale), {"ids": ids}, dtype=dtype,
                dynamic={"ids": (0, 1)})
    got = net.run()["out"]
    assert got.dtype == NP_DTYPES[dtype] and got.shape == (2, 5, hidden)
    assert_close(got, want, dtype, 1)
    torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    emb = Gemma2TextScaledWordEmbedding(vocab, hidden, 0, embed_scale=scale).to(torch_dtype)
    emb.embed_scale = torch.tensor(scale)  # the float32 buffer, as Gemma2PreTrainedModel._init_weights sets it
    with torch.no_grad():
        emb.weight.copy_(torch.from_numpy(table))
        hf = emb(torch.from_numpy(ids.astype(np.int64))).float().numpy()
    assert_close(got, hf.astype(np.float64), dtype, 1)  # torch's bfloat16 product may break a tie the other way
    if builds_rtx(dtype, hidden == 64):
        [(_, out_shape, _)] = net.check_rtx()
        assert out_shape == (-1, -1, hidden)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["gelu_pytorch_tanh", "gelu"])
def test_geglu_mlp_matches_gemma_mlp(act: str, dtype: str, rng: np.random.Generator) -> None:
    import torch
    from transformers import Gemma2Config
    from transformers.models.gemma2.modeling_gemma2 import Gemma2MLP

    shape, inter = (2, 3, 16), 40
    mlp = Gemma2MLP(Gemma2Config(hidden_size=16, intermediate_size=inter, hidden_activation=act)).to(torch.float64)
    params, x, want = torch_module_reference(rng, mlp, shape, dtype)
    net = OneOp(lambda g, i: ops.swiglu_mlp(g, i["x"], params["gate_proj.weight"], params["up_proj.weight"],
                                            params["down_proj.weight"], name="mlp", hidden_act=act),
                {"x": x}, dtype=dtype, dynamic={"x": (0, 1)})
    assert_close(net.run()["out"], want, dtype, 6, atol_scale=float(np.abs(want).max()))
    if builds_rtx(dtype, act == "gelu_pytorch_tanh"):
        [(_, out_shape, _)] = net.check_rtx()
        assert out_shape == (-1, -1, 16)


def test_gated_mlp_rejects_an_unknown_activation() -> None:
    w = np.zeros((4, 4))
    with pytest.raises(InvalidArgumentError, match="hidden_act 'relu'"):
        OneOp(lambda g, i: ops.swiglu_mlp(g, i["x"], w, w, w, hidden_act="relu"), {"x": np.zeros((1, 4), np.float32)}).run()
