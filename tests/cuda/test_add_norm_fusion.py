"""The cuda backend's residual-add + RMSNorm pass (trtcore/cuda/add_norm_fusion.py) and the
weight-only plugin's ``add_norm`` form, on the CPU: what fuses, what must not, and the fused
plugin's reference against the reference backend running the unfused network, bit for bit. The
kernels (the decode kernel's last-block tail and ``trtcore_wq_add_norm``) are checked on the GPU
in tests/cuda/test_weight_only_gemm_gpu.py."""

from __future__ import annotations

import zlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from netutil import compile_net, network

import trtcore.cuda as tc
from trtcore.plugins.base import DeviceTensor, PluginError
from trtcore.plugins.weight_only_gemm import WeightOnlyGemmPlugin, add_norm_reference
from trtcore.quantization import QuantizedWeight

BF16 = np.dtype(ml_dtypes.bfloat16)
SHAPES = {"x": ((1, 128), (2, 128), (8, 128)), "r": ((1, 64), (2, 64), (8, 64))}


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """Seeded by the test's id: fresh inputs per case, the same on every run."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def _qw(rng: np.random.Generator, n: int, k: int, group: int = 64) -> QuantizedWeight:
    return QuantizedWeight(rng.integers(0, 16, (n, k)).astype(np.uint8), rng.uniform(0.01, 0.02, (n, k // group)).astype(np.float32), None, 4, group)


def _block_net(rng: np.random.Generator, n: int = 64, k: int = 128, eps: float = 1e-5, offset: float | None = None, dtype: str = "bfloat16") -> Any:
    """x -> quantized o_proj (``o``), ``h = r + o`` (``residual``), ``rms_norm(h)`` (``norm``) ->
    quantized ``next_proj``; outputs ``h`` and ``y`` (next_proj's)."""
    from trtcore import ops

    net = network()
    g = ops.Graph(tc, net, dtype)
    t = tc.DataType.BF16 if dtype == "bfloat16" else tc.DataType.FLOAT
    x = net.add_input("x", t, (-1, k))
    r = net.add_input("r", t, (-1, n))
    o = ops.linear(g, x, _qw(rng, n, k), None, "o_proj")
    h = ops.add(g, r, o, "residual")
    normed = ops.rms_norm(g, h, rng.uniform(0.5, 1.5, n).astype(np.float32), eps, "norm", offset)
    g.output(h, "h")
    g.output(ops.linear(g, normed, _qw(rng, 32, n), None, "next_proj"), "y")
    return net


@pytest.fixture(autouse=True)
def _fusion_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass is opt-in (``TRTCORE_ADD_NORM_FUSION=1``): on for these tests unless one turns it off."""
    monkeypatch.setenv("TRTCORE_ADD_NORM_FUSION", "1")


@pytest.mark.parametrize("eps", [1e-5, 1e-6])
def test_residual_add_and_rms_norm_after_a_plugin_become_its_outputs(eps: float, rng: np.random.Generator) -> None:
    """With ``TRTCORE_ADD_NORM_FUSION=1`` o_proj's plugin takes the residual add and the RMSNorm: no elementwise, reduce or cast node
    is left, the plugin has two outputs (h, the network output, and the norm next_proj reads),
    reads the residual, the norm weight and a zero counter of its own; its reference equals the
    reference backend's unfused graph bit for bit."""
    from trtcore.reference.evaluator import evaluate

    net = _block_net(rng, eps=eps)
    plan = compile_net(net, SHAPES)
    assert plan.stats["add_norm_fused"] == 1
    nodes = [n for n in plan.graph.nodes if n.op != "view"]
    assert [n.op for n in nodes] == ["plugin", "plugin"], [(n.op, n.name) for n in nodes]
    o_proj, nxt = nodes
    plugin = o_proj.attrs["plugin"]
    assert plugin.add_norm and plugin.norm_eps == np.float32(eps) and len(o_proj.outputs) == 2
    assert o_proj.inputs[-3] == "r" and nxt.inputs[0] == o_proj.outputs[1] and "h" in plan.graph.outputs
    counter = plan.graph.constants[o_proj.inputs[-1]]
    assert counter.dtype == np.int32 and counter.shape == (1,) and counter[0] == 0
    assert {"residual", "norm.variance", "norm.rsqrt", "norm"} <= set(o_proj.layers)

    t = 5
    xv = rng.standard_normal((t, 128)).astype(BF16)
    rv = (rng.standard_normal((t, 64)) * 4).astype(BF16)
    want = evaluate(net, {"x": xv, "r": rv}, capture=["norm"])
    consts = [plan.graph.constants[c] for c in o_proj.inputs[1:-3]]
    h, normed = plugin.reference(xv, *consts, rv, plan.graph.constants[o_proj.inputs[-2]], counter)
    assert h.dtype == normed.dtype == BF16 and h.shape == normed.shape == (t, 64)
    np.testing.assert_array_equal(h.view(np.uint16), want["h"].view(np.uint16))
    np.testing.assert_array_equal(normed.view(np.uint16), want["norm"].view(np.uint16))


def test_add_norm_reference_is_the_rms_norm_formula(rng: np.random.Generator) -> None:
    """add_norm_reference against RMSNorm written out in float64 (Zhang & Sennrich, eq. 4):
    within the roundings the unfused graph makes (h and the normalized value to bfloat16)."""
    y = rng.standard_normal((3, 96)).astype(BF16)
    r = rng.standard_normal((3, 96)).astype(BF16)
    w = rng.uniform(0.5, 1.5, 96).astype(BF16)
    h, normed = add_norm_reference(y, r, w, 1e-6)
    h64 = y.astype(np.float64) + r.astype(np.float64)
    np.testing.assert_allclose(h.astype(np.float64), h64, rtol=2**-8)
    want = h.astype(np.float64) / np.sqrt(np.mean(h.astype(np.float64) ** 2, axis=-1, keepdims=True) + 1e-6) * w.astype(np.float64)
    np.testing.assert_allclose(normed.astype(np.float64), want, rtol=2**-7, atol=1e-6)


@pytest.mark.parametrize("case", ["off", "h_read_as_norm_input_only", "norm_captured", "gemma_offset", "y_captured"])
def test_add_norm_stays_unfused_where_it_cannot_be_the_plugins(case: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Off by default (``TRTCORE_ADD_NORM_FUSION`` unset), an intermediate value of the norm kept as an engine output,
    Gemma's ``1 + weight`` RMSNorm, and the GEMM's own output kept: the plugin stays plain and the
    row kernel stays. Keeping ``h`` (which the fused plugin writes) does not stop it (the
    first test)."""
    if case == "off":
        monkeypatch.delenv("TRTCORE_ADD_NORM_FUSION")
    net = _block_net(rng, offset=1.0 if case == "gemma_offset" else None)
    capture = {"norm_captured": ["norm.variance"], "y_captured": ["o_proj"]}.get(case, [])
    plan = compile_net(net, SHAPES, capture=capture)
    want = 1 if case == "h_read_as_norm_input_only" else 0
    assert plan.stats["add_norm_fused"] == want
    assert sum(getattr(n.attrs["plugin"], "add_norm", False) for n in plan.graph.nodes if n.op == "plugin") == want


def test_add_norm_plugin_launches_the_tail_or_the_row_kernel(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The v2 decode kernel (M <= 8) gets ``ADD_NORM`` and the tail's arguments (residual, norm
    weight, the second output, the counter, epsilon); the 16-row kernel, the cuBLAS prefill and the
    tiled kernel write y into h and ``trtcore_wq_add_norm`` follows (one block per row). A plain
    plugin passes nulls. A residual of the wrong size is refused before any launch."""
    import trtcore.plugins.weight_only_gemm as wog

    events: list[tuple[dict[str, Any], str, tuple[int, ...], list[Any]]] = []
    monkeypatch.setattr(wog, "_launch", lambda d, name, grid, block, args, stream, **kw: events.append((dict(d), name, grid, args)))

    class FakeLt:
        def matmul(self, m: int, r: int, k: int, w: int, x: int, out: int, *a: Any, ldd: int = 0) -> None:
            events.append(({}, "matmul", (), [(out, "ptr")]))

    import trtcore.cuda.cublaslt as lt

    monkeypatch.setattr(lt, "thread_linear", lambda cuda_type: FakeLt())
    n, k = 64, 128
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(_qw(rng, n, k))
    fused, arrays = plugin.with_add_norm(packed.arrays(), 1e-6)  # type: ignore[misc]
    assert fused.num_inputs == plugin.num_inputs + 3 and fused.with_add_norm(arrays, 1e-6) is None
    assert plugin.with_add_norm(packed.arrays(), -1e-6) is None and plugin.with_add_norm(packed.arrays(), float("inf")) is None
    ins = [DeviceTensor(0x10000 * (i + 2), a.shape, a.dtype) for i, a in enumerate(arrays)]
    x_ptr, h_ptr, n_ptr, r_ptr, w_ptr, c_ptr, ws = (0x1000000 * i for i in range(1, 8))
    for m, want in (
        (1, ["trtcore_wq_gemv"]),
        (12, ["trtcore_wq_gemv16", "trtcore_wq_add_norm"]),
        (64, ["trtcore_wq_dequantize", "matmul", "trtcore_wq_add_norm"]),
    ):
        events.clear()
        extra = [DeviceTensor(r_ptr, (m, n), BF16), DeviceTensor(w_ptr, (n,), BF16), DeviceTensor(c_ptr, (1,), np.dtype(np.int32))]
        outs = [DeviceTensor(h_ptr, (m, n), BF16), DeviceTensor(n_ptr, (m, n), BF16)]
        fused.enqueue([DeviceTensor(x_ptr, (m, k), BF16), *ins, *extra], outs, ws, 0)
        assert [e[1] for e in events] == want, m
        gemm = events[0]
        if m == 1:
            assert gemm[0]["ADD_NORM"] == 1 and gemm[0]["WQ_DECODE"] == 2
            assert [a[0] for a in gemm[3][-5:]] == [r_ptr, w_ptr, n_ptr, c_ptr, np.float32(1e-6)] and gemm[3][5][0] == h_ptr
        else:
            assert "ADD_NORM" not in gemm[0]
            (_, _, grid, args) = events[-1]
            assert grid == (m,) and [a[0] for a in args] == [h_ptr, r_ptr, w_ptr, n_ptr, n, np.float32(1e-6)]
    events.clear()
    plugin.enqueue([DeviceTensor(x_ptr, (1, k), BF16), *ins], [DeviceTensor(h_ptr, (1, n), BF16)], 0, 0)
    assert [a[0] for a in events[0][3][-5:]] == [0, 0, 0, 0, 0.0] and "ADD_NORM" not in events[0][0]
    events.clear()
    for m, shape in ((1, (2, n)), (64, (64 * n,)), (64, (1, n))):  # the tail and the add + norm kernel: refused before the GEMM
        bad = [DeviceTensor(r_ptr, shape, BF16), DeviceTensor(w_ptr, (n,), BF16), DeviceTensor(c_ptr, (1,), np.dtype(np.int32))]
        outs = [DeviceTensor(h_ptr, (m, n), BF16), DeviceTensor(n_ptr, (m, n), BF16)]
        with pytest.raises(PluginError, match="residual"):
            fused.enqueue([DeviceTensor(x_ptr, (m, k), BF16), *ins, *bad], outs, ws, 0)
        assert events == []


def test_add_norm_plugin_fields_are_checked_and_serialize() -> None:
    """add_norm excludes SwiGLU and RoPE; norm_eps only with it, finite and >= 0; the fused
    plugin round-trips through its fields (engines before it load with add_norm False)."""
    base = WeightOnlyGemmPlugin(128, 64, 4, 64)
    with pytest.raises(PluginError, match="add_norm"):
        WeightOnlyGemmPlugin(128, 64, 4, 64, swiglu=True, add_norm=True)
    with pytest.raises(PluginError, match="norm_eps"):
        WeightOnlyGemmPlugin(128, 64, 4, 64, norm_eps=1e-5)
    with pytest.raises(PluginError, match="norm_eps"):
        WeightOnlyGemmPlugin(128, 64, 4, 64, add_norm=True, norm_eps=float("nan"))
    fused = WeightOnlyGemmPlugin(128, 64, 4, 64, add_norm=True, norm_eps=float(np.float32(1e-5)))  # a float32 field, as with_add_norm makes it
    data = {name: value for name, _, value in fused.field_values()}
    assert WeightOnlyGemmPlugin.from_field_data(data) == fused
    old = {name: value for name, _, value in base.field_values() if name not in ("add_norm", "norm_eps")}
    assert not WeightOnlyGemmPlugin.from_field_data(old).add_norm
