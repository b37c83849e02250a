"""Mixture-of-experts ops: :func:`trtcore.ops.topk_routing` and :func:`trtcore.ops.moe_experts`
(both implementations), and the experts plugin's NumPy contract
(:class:`trtcore.plugins.moe_experts.MoeExpertsPlugin`), against float64 NumPy written from
transformers' ``MixtralTopKRouter`` / ``MixtralExperts``:

* routing: ``p = softmax(logits)``, the ``k`` largest (stable: ties to the lower index),
  optionally divided by their sum; ids must be equal, weights within 3 float32 roundings
  (softmax, sum, divide);
* experts: ``sum_r w_r down_e(silu(gate_e x) up_e x)``; the plugin's reference is float64
  rounded once; the dense layers path rounds gate/up (1), silu (2), the product (1), the
  routing weight (1) and the down GEMM (1): 6 roundings relative to ``max|out|``;
* ``tensorrt_rtx`` builds the routing and the dense experts in float16; the cuda backend
  compiles a network with the routing and the plugin (host only, no GPU).
"""

from __future__ import annotations

import numpy as np
import pytest

from trtcore import ops
from trtcore.errors import InvalidArgumentError
from trtcore.plugins.base import PluginError
from trtcore.plugins.moe_experts import MoeExpertsPlugin

from .conftest import NP_DTYPES, OneOp, as_float64, assert_close, randn


def np_routing(logits: np.ndarray, k: int, normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``(weights, ids)`` ``[..., k]`` (MixtralTopKRouter / Qwen2MoeTopKRouter)."""
    z = as_float64(logits)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ids = np.argsort(-p, axis=-1, kind="stable")[..., :k]
    w = np.take_along_axis(p, ids, -1)
    if normalize:
        w = w / w.sum(-1, keepdims=True)
    return w, ids


def np_experts(x: np.ndarray, w: np.ndarray, ids: np.ndarray, gate_up: np.ndarray, down: np.ndarray) -> np.ndarray:
    """float64 routed experts, token by token (MixtralExperts)."""
    inter = down.shape[-1]
    xs, ws, es = as_float64(x).reshape(-1, x.shape[-1]), w.reshape(-1, w.shape[-1]), ids.reshape(-1, ids.shape[-1])
    gu, dn = as_float64(gate_up), as_float64(down)
    out = np.zeros_like(xs)
    for t in range(xs.shape[0]):
        for r in range(es.shape[1]):
            e = es[t, r]
            if not 0 <= e < gu.shape[0]:
                continue
            g, u = gu[e, :inter] @ xs[t], gu[e, inter:] @ xs[t]
            out[t] += ws[t, r] * (dn[e] @ (g / (1 + np.exp(-g)) * u))
    return out.reshape(x.shape)


ROUTING_CASES = [((7, 8), 2, True), ((2, 3, 4), 1, False), ((5, 6), 3, False), ((1, 1, 8), 2, True)]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("case", ROUTING_CASES, ids=str)
def test_topk_routing(case: tuple, dtype: str, rng: np.random.Generator) -> None:
    shape, k, normalize = case
    logits = randn(rng, shape, dtype, scale=2.0)
    want_w, want_ids = np_routing(logits, k, normalize)

    def body(g: ops.Graph, i: dict) -> tuple:
        r = ops.topk_routing(g, i["logits"], k, normalize)
        return r.weights, r.ids

    net = OneOp(body, {"logits": logits}, dtype=dtype, dynamic={"logits": (0,)})
    out = net.run()
    assert out["out1"].dtype == np.int32 and out["out0"].dtype == np.float32
    np.testing.assert_array_equal(out["out1"], want_ids)
    assert_close(out["out0"], want_w, "float32", 3, atol_scale=0.0)
    if dtype == "float16":
        sig = net.check_rtx()
        assert [s[1][-1] for s in sig] == [k, k]


def test_topk_routing_ties_go_to_the_lower_index() -> None:
    logits = np.array([[1.0, 3.0, 3.0, 0.5, 3.0]], np.float32)
    net = OneOp(lambda g, i: ops.topk_routing(g, i["logits"], 3, False).ids, {"logits": logits})
    np.testing.assert_array_equal(net.run()["out"], [[1, 2, 4]])


def test_topk_routing_refuses_a_bad_k() -> None:
    for k in (0, 5):
        net = OneOp(lambda g, i, k=k: ops.topk_routing(g, i["logits"], k, False).ids, {"logits": np.zeros((2, 4), np.float32)})
        with pytest.raises(InvalidArgumentError, match="top_k"):
            net.run()


def _weights(rng: np.random.Generator, experts: int, hidden: int, inter: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    return randn(rng, (experts, 2 * inter, hidden), dtype, hidden**-0.5), randn(rng, (experts, hidden, inter), dtype, inter**-0.5)


EXPERT_CASES = [
    # (x shape, experts, intermediate, top_k, normalize)
    ((9, 16), 4, 24, 2, True),
    ((2, 3, 32), 8, 16, 1, False),
    ((1, 1, 8), 3, 8, 3, False),
]


@pytest.mark.parametrize("impl", ["plugin", "layers"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", EXPERT_CASES, ids=str)
def test_moe_experts(case: tuple, dtype: str, impl: str, rng: np.random.Generator) -> None:
    shape, experts, inter, k, normalize = case
    hidden = shape[-1]
    x = randn(rng, shape, dtype)
    logits = randn(rng, shape[:-1] + (experts,), "float32", scale=2.0)
    gate_up, down = _weights(rng, experts, hidden, inter, dtype)
    w, ids = np_routing(logits, k, normalize)
    want = np_experts(x, w, ids, gate_up, down)

    def body(g: ops.Graph, i: dict) -> object:
        return ops.moe_experts(g, i["x"], ops.topk_routing(g, i["logits"], k, normalize), gate_up, down, "experts", impl=impl)

    net = OneOp(body, {"x": x, "logits": logits}, dtype=dtype, dynamic={"x": (0,), "logits": (0,)})
    got = net.run()["out"]
    assert got.dtype == NP_DTYPES[dtype] and got.shape == x.shape
    assert_close(got, want, dtype, 1 if impl == "plugin" else 6, atol_scale=float(np.abs(want).max()))
    if impl == "layers" and dtype == "float16":
        assert net.check_rtx() == [("out", (-1,) + shape[1:], "HALF")]


def test_moe_experts_refuses_bad_inputs(rng: np.random.Generator) -> None:
    gate_up, down = _weights(rng, 4, 16, 8, "float32")
    feeds = {"x": np.zeros((2, 16), np.float32), "logits": np.zeros((2, 4), np.float32)}
    for args, match in [((gate_up, down[:, :, :4]), "do not fit"), ((gate_up[:, :15], down), "must be"), ((gate_up, down), "'marlin'")]:
        impl = "marlin" if match == "'marlin'" else None

        def body(g: ops.Graph, i: dict, args: tuple = args, impl: str | None = impl) -> object:
            return ops.moe_experts(g, i["x"], ops.topk_routing(g, i["logits"], 2, True), *args, impl=impl)

        with pytest.raises(Exception, match=match):
            OneOp(body, feeds).run()


# ---------------------------------------------------------------------------------------
# the plugin's contract


def test_plugin_reference_is_float64_and_skips_bad_ids(rng: np.random.Generator) -> None:
    plugin = MoeExpertsPlugin(num_experts=5, top_k=2, hidden_size=16, intermediate_size=12)
    x = randn(rng, (3, 4, 16), "bfloat16")
    ids = rng.integers(0, 5, (3, 4, 2)).astype(np.int32)
    ids[0, 0, 1] = 7  # out of range: adds nothing
    ids[1, 2, 0] = -1
    w = rng.uniform(0.1, 1.0, (3, 4, 2)).astype(np.float32)
    gate_up, down = _weights(rng, 5, 16, 12, "bfloat16")
    [got] = plugin.reference(x, ids, w, gate_up, down)
    want = np_experts(x, w.astype(np.float64), ids, gate_up, down)
    assert got.dtype == x.dtype and got.shape == x.shape
    np.testing.assert_array_equal(got, want.astype(x.dtype))


def test_plugin_fields_and_shapes() -> None:
    import trtcore.reference as ref
    from trtcore.plugins import base, builtin_plugins

    plugin = MoeExpertsPlugin(num_experts=8, top_k=2, hidden_size=64, intermediate_size=32)
    assert base.create(plugin, ref) == plugin and MoeExpertsPlugin in builtin_plugins()
    assert plugin.weight_shapes() == [(8, 64, 64), (8, 64, 32)]
    # offsets 9 ints, perm 20, h 20 x 32 floats, y 20 x 64 floats, each rounded up to 256 bytes
    assert plugin.workspace_size([((10, 64), np.float16)] * 5, [((10, 64), np.float16)]) == 256 + 256 + 2560 + 5120
    assert plugin.vec(np.float16) == 8 and plugin.vec(np.float32) == 4 and plugin.vec(np.float16, [8]) == 1
    assert MoeExpertsPlugin(num_experts=8, top_k=2, hidden_size=60, intermediate_size=32).vec(np.float16) == 1
    for bad in ({"num_experts": 0}, {"top_k": -1}, {"hidden_size": 2.0}, {"num_experts": 1025}):
        with pytest.raises(PluginError):
            MoeExpertsPlugin(**{"num_experts": 8, "top_k": 2, "hidden_size": 64, "intermediate_size": 32, **bad})
    with pytest.raises(PluginError, match="5 inputs"):
        plugin.reference(np.zeros((1, 64), np.float32))


def test_routing_and_plugin_compile_on_the_cuda_backend(rng: np.random.Generator) -> None:
    """Host only: the cuda backend compiles the routing's comparisons and selects, and plans the
    plugin with its workspace."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "cuda"))
    from netutil import compile_net, network

    import trtcore.cuda as tc

    net = network()
    g = ops.Graph(tc, net, "bfloat16")
    x = net.add_input("x", tc.DataType.BF16, (-1, 64))
    gate_up, down = _weights(rng, 8, 64, 32, "bfloat16")
    logits = ops.linear(g, x, randn(rng, (8, 64), "float32"), None, "gate")
    g.output(ops.moe_experts(g, x, ops.topk_routing(g, logits, 2, True), gate_up, down), "y")
    plan = compile_net(net, {"x": ((1, 64), (4, 64), (64, 64))})
    assert [n.attrs["plugin"].plugin_name for n in plan.graph.nodes if n.op == "plugin"] == ["trtcore_moe_experts"]


def test_kernel_variants_are_those_the_plugin_launches() -> None:
    """moe_experts.cu lists (for tests/test_kernels.py's NVRTC builds on sm_80/89/90) every
    (DTYPE, VEC) that :meth:`MoeExpertsPlugin.vec` can pick: 16-byte loads or scalar ones."""
    from trtcore import kernels
    from trtcore.dtypes import KERNEL_DTYPE_CODES

    plugin = MoeExpertsPlugin(num_experts=2, top_k=1, hidden_size=64, intermediate_size=64)
    picked = {(KERNEL_DTYPE_CODES[np.dtype(d)], plugin.vec(d, p)) for d in NP_DTYPES.values() for p in ([], [4])}
    assert {(v["DTYPE"], v["VEC"]) for v in kernels.variants("moe_experts")} == picked
