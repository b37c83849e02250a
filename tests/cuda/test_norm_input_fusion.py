"""The cuda backend's norm-into-the-readers pass (trtcore/cuda/norm_input_fusion.py) and the
weight-only plugin's ``norm_input`` / ``add_residual`` forms, on the CPU: what fuses, what must
not, the fused plugins' references against the reference backend running the unfused network
(bit for bit), and which kernels each path launches. The kernels themselves are checked on the
GPU in tests/cuda/test_weight_only_gemm_gpu.py."""

from __future__ import annotations

import zlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from netutil import compile_net, network

import trtcore.cuda as tc
from trtcore.plugins.base import DeviceTensor, PluginError
from trtcore.plugins.weight_only_gemm import WeightOnlyGemmPlugin, rms_norm_reference
from trtcore.quantization import QuantizedWeight

BF16 = np.dtype(ml_dtypes.bfloat16)
SHAPES = {"x": ((1, 128), (2, 128), (8, 128)), "r": ((1, 64), (2, 64), (8, 64))}


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """Seeded by the test's id: fresh inputs per case, the same on every run."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def _fusion_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass is opt-in (``TRTCORE_NORM_INPUT_FUSION=1``): on for these tests unless one turns it off."""
    monkeypatch.setenv("TRTCORE_NORM_INPUT_FUSION", "1")


def _qw(rng: np.random.Generator, n: int, k: int, group: int = 64) -> QuantizedWeight:
    return QuantizedWeight(rng.integers(0, 16, (n, k)).astype(np.uint8), rng.uniform(0.01, 0.02, (n, k // group)).astype(np.float32), None, 4, group)


def _block_net(rng: np.random.Generator, eps: float = 1e-5, offset: float | None = None, readers: int = 2, add: bool = True) -> Any:
    """x -> quantized o_proj, ``h = r + o`` (``residual``; without ``add``, h is the input r),
    ``rms_norm(h)`` (``norm``) -> ``readers`` quantized linears ``proj{i}`` (outputs ``y{i}``, group
    size ``64 >> i``); output ``h`` too."""
    from trtcore import ops

    net = network()
    g = ops.Graph(tc, net, "bfloat16")
    x = net.add_input("x", tc.DataType.BF16, (-1, 128))
    r = net.add_input("r", tc.DataType.BF16, (-1, 64))
    h = ops.add(g, r, ops.linear(g, x, _qw(rng, 64, 128), None, "o_proj"), "residual") if add else r
    normed = ops.rms_norm(g, h, rng.uniform(0.5, 1.5, 64).astype(np.float32), eps, "norm", offset)
    if add:
        g.output(h, "h")
    for i in range(readers):
        # group sizes differ: the readers stay two plugins (horizontal fusion would stack them)
        g.output(ops.linear(g, normed, _qw(rng, 32 + 16 * i, 64, 64 >> i), None, f"proj{i}"), f"y{i}")
    return net


@pytest.mark.parametrize("eps", [1e-5, 1e-6])
def test_norm_moves_into_its_readers_and_the_add_into_the_gemm_before_it(eps: float, rng: np.random.Generator) -> None:
    """o_proj's plugin writes h (``add_residual``, reading r); both readers of the norm read h
    and the norm's weight (``norm_input``); no elementwise, reduce or cast node is left. Each
    plugin's reference equals the reference backend's unfused graph bit for bit at 12 rows; at 5
    (decode) the reader whose groups are whole chunks folds the norm (``norm_folds``): its output
    is the folded formula written out here, within two bfloat16 ulps of the unfused graph's."""
    from trtcore.reference.evaluator import evaluate

    net = _block_net(rng, eps=eps)
    plan = compile_net(net, SHAPES)
    assert plan.stats["norm_input_fused"] == 1 and plan.stats["residual_fused"] == 1
    nodes = [n for n in plan.graph.nodes if n.op != "view"]
    assert [n.op for n in nodes] == ["plugin"] * 3, [(n.op, n.name) for n in nodes]
    o_proj, *readers = nodes
    p = o_proj.attrs["plugin"]
    assert p.add_residual and not p.norm_input and o_proj.inputs[-1] == "r" and o_proj.outputs == ["h"]
    assert {"residual"} <= set(o_proj.layers)
    for node in readers:
        q = node.attrs["plugin"]
        assert q.norm_input and not q.add_residual and q.norm_eps == np.float32(eps) and node.inputs[0] == "h"
    assert {"norm.variance", "norm.rsqrt", "norm"} <= set(readers[0].layers)

    for t in (12, 5):
        xv = rng.standard_normal((t, 128)).astype(BF16)
        rv = (rng.standard_normal((t, 64)) * 4).astype(BF16)
        want = evaluate(net, {"x": xv, "r": rv})
        consts = [plan.graph.constants[c] for c in o_proj.inputs[1:-1]]
        (h,) = p.reference(xv, *consts, rv)
        np.testing.assert_array_equal(h.view(np.uint16), want["h"].view(np.uint16))
        folds = [node.attrs["plugin"].norm_folds(BF16, t) for node in readers]
        assert folds == ([True, False] if t == 5 else [False, False])  # proj1's group 32 is half a chunk
        for i, node in enumerate(readers):
            q = node.attrs["plugin"]
            consts = [plan.graph.constants[c] for c in node.inputs[1:]]
            (y,) = q.reference(h, *consts)
            assert y.dtype == BF16 and y.shape == want[f"y{i}"].shape
            if not folds[i]:
                np.testing.assert_array_equal(y.view(np.uint16), want[f"y{i}"].view(np.uint16))
                continue
            # RMSNorm's scale out of the sum: inv * (round(h * w) @ W^T), rounded once
            norm_w = consts[-1].astype(np.float64)
            h64 = h.astype(np.float64)
            h32 = h.astype(np.float32)  # inv in float32, as the kernel computes it
            inv = (np.float32(1) / np.sqrt((h32 * h32).mean(axis=-1, keepdims=True) + np.float32(eps))).astype(np.float64)
            w64 = q.quantized_weight(*consts[:-1]).dequantize().astype(np.float64)
            folded = (inv * ((h64 * norm_w).astype(BF16).astype(np.float64) @ w64.T)).astype(BF16)
            np.testing.assert_array_equal(y.view(np.uint16), folded.view(np.uint16))
            ulp = 2.0 ** (np.floor(np.log2(np.abs(want[f"y{i}"].astype(np.float64)).max())) - 7)
            np.testing.assert_allclose(y.astype(np.float64), want[f"y{i}"].astype(np.float64), rtol=0, atol=2 * ulp)


def test_a_norm_without_an_add_before_it_moves_alone(rng: np.random.Generator) -> None:
    """The first layer's norm (of the embeddings: here a network input) has no add before it:
    its reader takes it, and nothing else changes."""
    plan = compile_net(_block_net(rng, readers=1, add=False), SHAPES)
    assert plan.stats["norm_input_fused"] == 1 and plan.stats["residual_fused"] == 0
    (node,) = [n for n in plan.graph.nodes if n.op == "plugin"]
    assert node.attrs["plugin"].norm_input and node.inputs[0] == "r"


@pytest.mark.parametrize("case", ["off", "norm_captured", "variance_captured", "gemma_offset", "o_proj_captured"])
def test_norm_stays_where_it_cannot_move(case: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Off by default; the norm's output or an intermediate value kept as an engine output, and
    Gemma's ``1 + weight`` RMSNorm keep the norm; o_proj's own output kept keeps the add out of
    its GEMM but lets the norm move."""
    if case == "off":
        monkeypatch.delenv("TRTCORE_NORM_INPUT_FUSION")
    capture = {"norm_captured": ["norm"], "variance_captured": ["norm.variance"], "o_proj_captured": ["o_proj"]}.get(case, [])
    plan = compile_net(_block_net(rng, offset=1.0 if case == "gemma_offset" else None), SHAPES, capture=capture)
    moved = case == "o_proj_captured"
    assert plan.stats["norm_input_fused"] == int(moved) and plan.stats["residual_fused"] == 0
    plugins = [n.attrs["plugin"] for n in plan.graph.nodes if n.op == "plugin"]
    assert sum(p.norm_input for p in plugins) == 2 * int(moved) and not any(p.add_residual for p in plugins)


def test_rms_norm_reference_is_the_formula(rng: np.random.Generator) -> None:
    """rms_norm_reference against RMSNorm written out in float64 (Zhang & Sennrich, eq. 4): within
    the two bfloat16 roundings the unfused graph makes."""
    h = (rng.standard_normal((3, 96)) * 3).astype(BF16)
    w = rng.uniform(0.5, 1.5, 96).astype(BF16)
    got = rms_norm_reference(h, w, 1e-6)
    h64 = h.astype(np.float64)
    want = h64 / np.sqrt(np.mean(h64**2, axis=-1, keepdims=True) + 1e-6) * w.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2**-7, atol=1e-6)


def _record(monkeypatch: pytest.MonkeyPatch) -> list[tuple[dict[str, Any], str, tuple[int, ...], list[Any], int]]:
    """The plugin's launches (defines, kernel, grid, args, dynamic shared memory) instead of
    running them; cuBLASLt's matmul recorded as ``"matmul"`` with its x and output pointers."""
    import trtcore.cuda.cublaslt as lt
    import trtcore.plugins.weight_only_gemm as wog

    events: list[tuple[dict[str, Any], str, tuple[int, ...], list[Any], int]] = []
    monkeypatch.setattr(
        wog, "_launch", lambda d, name, grid, block, args, stream, shared_mem=0: events.append((dict(d), name, grid, args, shared_mem))
    )

    class FakeLt:
        def matmul(self, m: int, r: int, k: int, w: int, x: int, out: int, *a: Any, ldd: int = 0) -> None:
            events.append(({}, "matmul", (), [(x, "ptr"), (out, "ptr")], 0))

    monkeypatch.setattr(lt, "thread_linear", lambda cuda_type: FakeLt())
    return events


def test_norm_input_plugin_folds_the_norm_in_the_decode_kernel_or_normalizes_before_the_gemm(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Up to 8 rows on the v2 decode kernel the norm is folded in (``NORM_X``: the norm weight and
    epsilon in its ``an_*`` arguments, no shared memory, any grid); h or the weight off 16-byte
    alignment is copied into the workspace first (``trtcore_wq_copy``) and the kernel reads the
    copies; every other path runs ``trtcore_wq_rms_norm`` into the workspace and then the GEMM on
    it. Without a workspace where one is needed, or with one off 16-byte alignment for the
    copies: refused before any launch."""

    events = _record(monkeypatch)
    n, k = 64, 4096
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(_qw(rng, n, k, 128))
    fused, arrays = plugin.with_norm_input(packed.arrays(), 1e-6)  # type: ignore[misc]
    assert fused.num_inputs == plugin.num_inputs + 1 and fused.with_norm_input(arrays, 1e-6) is None
    assert plugin.with_norm_input(arrays, -1.0) is None and plugin.with_norm_input(arrays, float("nan")) is None
    ins = [DeviceTensor(0x10000 * (i + 2), a.shape, a.dtype) for i, a in enumerate(arrays)]
    x_ptr, y_ptr, w_ptr, ws = (0x1000000 * i for i in range(1, 5))
    ws_size = fused.workspace_size([((64, k), BF16)], [((64, n), BF16)])
    assert ws_size >= 65 * k * 2 + plugin.workspace_size([((64, k), BF16)], [((64, n), BF16)])
    for m, xp, wp, want in (
        (1, x_ptr, w_ptr, ["trtcore_wq_gemv"]),
        (8, x_ptr, w_ptr, ["trtcore_wq_gemv"]),  # 8 x 4096 x 2 bytes: no shared-memory bound any more
        (1, x_ptr + 8, w_ptr, ["trtcore_wq_copy", "trtcore_wq_gemv"]),  # h not 16-byte aligned: copied
        (3, x_ptr, w_ptr + 8, ["trtcore_wq_copy", "trtcore_wq_copy", "trtcore_wq_gemv"]),  # the weight: both copied
        (12, x_ptr, w_ptr, ["trtcore_wq_rms_norm", "trtcore_wq_gemv16"]),
        (64, x_ptr, w_ptr, ["trtcore_wq_rms_norm", "trtcore_wq_dequantize", "matmul"]),
    ):
        events.clear()
        fused.enqueue([DeviceTensor(xp, (m, k), BF16), *ins, DeviceTensor(wp, (k,), BF16)], [DeviceTensor(y_ptr, (m, n), BF16)], ws, 0)
        assert [e[1] for e in events] == want, (m, xp, wp)
        assert fused.norm_folds(BF16, m) == (m <= 8)
        gemm = events[-1]
        if m <= 8:
            copied = want[0] == "trtcore_wq_copy"
            wgot = ws + m * k * 2 if wp % 16 else wp
            assert gemm[0]["NORM_X"] == 1 and gemm[0]["WQ_DECODE"] == 2 and gemm[3][0][0] == (ws if copied else xp)
            assert [a[0] for a in gemm[3][-5:]] == [0, wgot, 0, 0, np.float32(1e-6)]
            assert gemm[4] == 0  # nothing staged in shared memory
            if copied:
                assert [a[0] for a in events[0][3]] == [xp, ws, m * k]
            if wp % 16:
                assert [a[0] for a in events[1][3]] == [wp, wgot, k]
        else:
            norm = events[0]
            assert norm[2] == (m,) and [a[0] for a in norm[3]] == [xp, wp, ws, k, np.float32(1e-6)]
            assert "NORM_X" not in gemm[0] and gemm[3][0][0] == ws  # the GEMM reads the normalized x
            assert all(a[0] == 0 for a in gemm[3][-5:-1]) if gemm[1] != "matmul" else True
    for m, xp, wsp in ((12, x_ptr, 0), (1, x_ptr + 8, 0), (1, x_ptr + 8, ws + 8)):
        events.clear()
        with pytest.raises(PluginError, match="workspace"):
            fused.enqueue([DeviceTensor(xp, (m, k), BF16), *ins, DeviceTensor(w_ptr, (k,), BF16)], [DeviceTensor(y_ptr, (m, n), BF16)], wsp, 0)
        assert events == []
    # an aligned decode step needs no workspace at all
    events.clear()
    fused.enqueue([DeviceTensor(x_ptr, (1, k), BF16), *ins, DeviceTensor(w_ptr, (k,), BF16)], [DeviceTensor(y_ptr, (1, n), BF16)], 0, 0)
    assert [e[1] for e in events] == ["trtcore_wq_gemv"]


def test_add_residual_plugin_adds_in_the_epilogue_or_after_the_gemm(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tensor-core kernels take the residual as their ``an_residual`` argument (their
    epilogue adds it); the cuBLAS prefill and the tiled kernel are followed by
    ``trtcore_wq_add_residual`` on the output. A residual of the wrong size is refused before any
    launch."""
    import trtcore.plugins.weight_only_gemm as wog

    events = _record(monkeypatch)
    n, k = 64, 128
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(_qw(rng, n, k))
    fused, arrays = plugin.with_residual(packed.arrays())  # type: ignore[misc]
    assert fused.with_residual(arrays) is None and fused.with_add_norm(arrays, 1e-5) is None
    ins = [DeviceTensor(0x10000 * (i + 2), a.shape, a.dtype) for i, a in enumerate(arrays)]
    x_ptr, y_ptr, r_ptr, ws = (0x1000000 * i for i in range(1, 5))
    for m, prefill, want in (
        (1, "cublas", ["trtcore_wq_gemv"]),
        (12, "cublas", ["trtcore_wq_gemv16"]),
        (64, "cublas", ["trtcore_wq_dequantize", "matmul", "trtcore_wq_add_residual"]),
        (64, "tiled", ["trtcore_wq_gemm", "trtcore_wq_add_residual"]),
    ):
        monkeypatch.setattr(wog, "PREFILL_KERNEL", prefill)
        events.clear()
        fused.enqueue([DeviceTensor(x_ptr, (m, k), BF16), *ins, DeviceTensor(r_ptr, (m, n), BF16)], [DeviceTensor(y_ptr, (m, n), BF16)], ws, 0)
        assert [e[1] for e in events] == want, m
        if len(want) == 1:
            assert [a[0] for a in events[0][3][-5:]] == [r_ptr, 0, 0, 0, 0.0] and "NORM_X" not in events[0][0]
        else:
            assert [a[0] for a in events[-1][3]] == [y_ptr, r_ptr, m * n]
    events.clear()
    for m, shape in ((1, (2, n)), (64, (64 * n,))):
        with pytest.raises(PluginError, match="residual"):
            fused.enqueue([DeviceTensor(x_ptr, (m, k), BF16), *ins, DeviceTensor(r_ptr, shape, BF16)], [DeviceTensor(y_ptr, (m, n), BF16)], ws, 0)
    assert events == []


def test_norm_input_and_add_residual_fields_are_checked_and_serialize() -> None:
    """norm_input excludes RoPE and add_norm, add_residual excludes SwiGLU, RoPE and add_norm;
    norm_eps only with add_norm or norm_input; both round-trip through their fields (engines
    before them load with both False); the inputs' order is the docstring's."""
    with pytest.raises(PluginError, match="add_residual"):
        WeightOnlyGemmPlugin(128, 64, 4, 64, swiglu=True, add_residual=True)
    with pytest.raises(PluginError, match="norm_input"):
        WeightOnlyGemmPlugin(128, 64, 4, 64, rope_rows=32, rope_head_dim=32, norm_input=True)
    with pytest.raises(PluginError, match="add_norm"):
        WeightOnlyGemmPlugin(128, 64, 4, 64, add_norm=True, norm_input=True, norm_eps=1e-5)
    with pytest.raises(PluginError, match="norm_eps"):
        WeightOnlyGemmPlugin(128, 64, 4, 64, add_residual=True, norm_eps=1e-5)
    both = WeightOnlyGemmPlugin(128, 64, 4, 64, swiglu=False, add_residual=True, norm_input=True, norm_eps=float(np.float32(1e-5)))
    data = {name: value for name, _, value in both.field_values()}
    assert WeightOnlyGemmPlugin.from_field_data(data) == both
    old = {name: value for name, _, value in WeightOnlyGemmPlugin(128, 64, 4, 64).field_values() if name not in ("add_residual", "norm_input")}
    loaded = WeightOnlyGemmPlugin.from_field_data(old)
    assert not loaded.add_residual and not loaded.norm_input
    gated = WeightOnlyGemmPlugin(128, 64, 4, 64, swiglu=True, norm_input=True, norm_eps=1e-5)
    assert gated.output_features == 32 and gated.num_inputs == 4
    with pytest.raises(PluginError, match=r"\(x, codes, scales, resid, norm_w\)"):
        both.reference(np.zeros((1, 128), BF16))


@pytest.mark.parametrize("lm_head", [False, True], ids=["lm_head_bf16", "lm_head_4bit"])
def test_every_norm_of_a_quantized_llama_moves(lm_head: bool) -> None:
    """A 2-layer quantized Llama-shaped network (paged cache): both norms of every layer move
    into q/k/v's and gate/up's plugins, and every add but the last into o_proj's or down_proj's
    (the first layer's norm reads the embeddings); the final norm moves into a 4-bit lm_head (it
    reads the rows gathered for the logits, so the last add stays) and stays before a bfloat16
    one. The engine compiles."""
    from trtcore.builder import BuildConfig, _builder_config, define_network
    from trtcore.cuda import synthetic
    from trtcore.cuda.builder import compile_network

    cfg = synthetic.config(
        "SmolLM2-135M", num_hidden_layers=2, vocab_size=640, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        tie_word_embeddings=False,
    )
    bc = BuildConfig(dtype="bfloat16", max_batch_size=4, max_seq_len=128, max_num_tokens=128, max_num_blocks=64, kv_cache="paged")
    d = define_network(tc, cfg, synthetic.RandomQuantizedWeights(cfg, 4, 64, seed=1, lm_head=lm_head), bc)
    plan = compile_network(d.network, _builder_config(d, None), None, arch=None)
    layers = cfg.num_hidden_layers
    assert plan.stats["norm_input_fused"] == 2 * layers + int(lm_head)
    assert plan.stats["residual_fused"] == 2 * layers - 1
    made = {o: n for n in plan.graph.nodes for o in n.outputs}
    (head,) = [n for n in plan.graph.nodes if n.op == "plugin" and getattr(n.attrs["plugin"], "out_features", 0) == cfg.vocab_size] or [None]
    assert (head is not None and head.attrs["plugin"].norm_input and made[head.inputs[0]].op == "gather") == lm_head
    plugins = [n.attrs["plugin"] for n in plan.graph.nodes if n.op == "plugin" and n.attrs["plugin"].plugin_name == "trtcore_weight_only_gemm"]
    assert sum(p.norm_input for p in plugins) == 2 * layers + int(lm_head)
    assert all(p.swiglu for p in plugins if p.norm_input and p.out_features == 2 * cfg.intermediate_size)


def test_fused_forms_stay_out_of_horizontal_fusion_and_say_their_input_dtypes() -> None:
    """A plugin with inputs after the weight's has no row-fusion key (stacking would drop them);
    TensorRT's format query answers for every input: int32 positions and counter, float32
    inv_freq, x's dtype for the residual and the norm weight."""
    bf, i32, f32 = BF16, np.dtype(np.int32), np.dtype(np.float32)
    both = WeightOnlyGemmPlugin(128, 64, 4, 64, add_residual=True, norm_input=True, norm_eps=float(np.float32(1e-5)))
    assert both.row_fusion_key([]) is None and WeightOnlyGemmPlugin(128, 64, 4, 64).row_fusion_key([]) is not None
    assert [both.supports(i, [bf, i32, f32, bf, bf, bf], 5) for i in range(6)] == [True] * 6
    assert not both.supports(3, [bf, i32, f32, f32, bf], 5) and not both.supports(4, [bf, i32, f32, bf, f32], 5)
    rope = WeightOnlyGemmPlugin(128, 64, 4, 64, rope_rows=32, rope_head_dim=32)
    assert [rope.supports(i, [bf, i32, f32, i32, f32, bf], 5) for i in range(6)] == [True] * 6
    assert not rope.supports(3, [bf, i32, f32, f32, f32], 5)
    tail = WeightOnlyGemmPlugin(128, 64, 4, 64, add_norm=True, norm_eps=1e-5)
    assert [tail.supports(i, [bf, i32, f32, bf, bf, i32], 6) for i in range(6)] == [True] * 6


def test_norm_weight_of_the_wrong_shape_or_dtype_is_refused(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The norm weight must be ``[K]`` of x's dtype: another shape of K elements or another dtype
    is refused by the reference and before any launch (the kernels read it as x's dtype)."""
    events = _record(monkeypatch)
    n, k = 64, 128
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(_qw(rng, n, k))
    fused, arrays = plugin.with_norm_input(packed.arrays(), 1e-5)  # type: ignore[misc]
    ins = [DeviceTensor(0x10000 * (i + 2), a.shape, a.dtype) for i, a in enumerate(arrays)]
    for shape, dtype in (((2, 64), BF16), ((k,), np.dtype(np.float32)), ((k + 8,), BF16)):
        with pytest.raises(PluginError, match="norm weight"):
            fused.enqueue([DeviceTensor(0x1000000, (1, k), BF16), *ins, DeviceTensor(0x2000000, shape, dtype)], [DeviceTensor(0x3000000, (1, n), BF16)], 0x4000000, 0)
        with pytest.raises(PluginError, match="norm weight"):
            fused.reference(np.zeros((1, k), BF16), *arrays, np.ones(shape, dtype))
    assert events == []
