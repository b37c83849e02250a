"""The cuda backend's compile passes on the graph level (CPU): what fuses and what must not.

Each test builds a small network with the reference network API, compiles it, and reads
the compiled graph: which nodes exist, which layers each kernel came from, which values are
kept in memory. Numerics of the same patterns are checked on the GPU (test_engine_gpu.py).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from netutil import ACTIVATIONS, compile_net, decode_shapes, host_steps, llama_plan, network, prepared_steps, rms_norm_net

import trtcore.cuda as tc
from trtcore.cuda import ir
from trtcore.cuda.fold_constants import evaluate_node
from trtcore.cuda.runtime import ICudaEngine

E, U, A = tc.ElementWiseOperation, tc.UnaryOperation, tc.ActivationType
F32 = tc.DataType.FLOAT


def kernel_nodes(plan):
    return [n for n in plan.graph.nodes if n.op != "view"]


def test_rms_norm_and_residual_add_are_one_row_kernel() -> None:
    net, _ = rms_norm_net()
    plan = compile_net(net, {"a": ((1, 64), (4, 64), (16, 64)), "b": ((1, 64), (4, 64), (16, 64))})
    [node] = kernel_nodes(plan)
    assert node.op == "row_group"
    # both the residual stream h (read by a later layer in a model) and y are written by it
    assert set(node.outputs) == {"residual", "y"}
    layers = set(node.layers)
    assert {"residual", "norm", "norm.variance", "norm.to_float", "norm.to_dtype"} <= layers
    assert plan.build_log[0].startswith("fused ") and "into 1 kernels" in plan.build_log[0]


def test_pointwise_chain_is_one_kernel_with_broadcast_and_scalar_inlined() -> None:
    net = network()
    x = net.add_input("x", F32, (-1, 8))
    bias = net.add_constant((1, 8), tc.Weights(np.arange(8, dtype=np.float32))).get_output(0)
    two = net.add_constant((1, 1), tc.Weights(np.full((1, 1), 2.0, np.float32))).get_output(0)
    t = net.add_elementwise(x, bias, E.SUM).get_output(0)
    t = net.add_activation(t, A.SIGMOID).get_output(0)
    t = net.add_elementwise(t, two, E.PROD).get_output(0)
    t = net.add_unary(t, U.EXP).get_output(0)
    t.name = "out"
    net.mark_output(t)
    plan = compile_net(net, {"x": ((1, 8), (2, 8), (4, 8))})
    [node] = kernel_nodes(plan)
    assert node.op == "pointwise_group" and len(node.attrs["members"]) == 4
    assert node.inputs == ["x", bias.name]  # the scalar 2 is a literal in the source
    assert two.name in node.attrs["scalars"]
    assert "__int_as_float(0x40000000)" in plan.sources[node.name].source


def test_value_read_by_a_non_pointwise_layer_is_not_fused_away() -> None:
    net = network()
    x = net.add_input("x", F32, (4, 8))
    w = net.add_input("w", F32, (8, 8))
    t = net.add_unary(x, U.EXP).get_output(0)  # read by the matmul and by the add
    m = net.add_matrix_multiply(t, tc.MatrixOperation.NONE, w, tc.MatrixOperation.NONE).get_output(0)
    y = net.add_elementwise(t, m, E.SUM).get_output(0)
    y.name = "y"
    net.mark_output(y)
    plan = compile_net(net)
    ops = [n.op for n in kernel_nodes(plan)]
    assert ops == ["pointwise_group", "matmul", "pointwise_group"]
    first = kernel_nodes(plan)[0]
    assert first.outputs == [t.name]  # materialized for the matmul


def test_network_output_ends_a_group() -> None:
    net = network()
    x = net.add_input("x", F32, (4, 8))
    t = net.add_unary(x, U.EXP).get_output(0)
    t.name = "t"
    net.mark_output(t)
    y = net.add_unary(t, U.LOG).get_output(0)
    y.name = "y"
    net.mark_output(y)
    plan = compile_net(net)
    nodes = kernel_nodes(plan)
    assert [n.outputs for n in nodes] == [["t"], ["y"]]


def test_two_consumers_in_different_groups_keep_the_value_in_memory() -> None:
    net = network()
    x = net.add_input("x", F32, (4, 8))
    t = net.add_unary(x, U.EXP).get_output(0)
    for i, op in enumerate((U.LOG, U.SQRT)):
        y = net.add_unary(t, op).get_output(0)
        y.name = f"y{i}"
        net.mark_output(y)
    plan = compile_net(net)
    nodes = kernel_nodes(plan)
    assert len(nodes) == 3 and nodes[0].outputs == [t.name]


def test_dtype_boundary_after_a_gemm_is_not_folded_into_it() -> None:
    """bf16 matmul then cast to float32: the GEMM writes bf16 (rounded), the cast is a kernel."""
    net = network()
    x = net.add_input("x", tc.DataType.BF16, (-1, 16))
    w = net.add_constant((8, 16), tc.Weights(np.ones((8, 16), dtype=tc.nptype(tc.DataType.BF16)))).get_output(0)
    m = net.add_matrix_multiply(x, tc.MatrixOperation.NONE, w, tc.MatrixOperation.TRANSPOSE).get_output(0)
    y = net.add_cast(m, F32).get_output(0)
    y.name = "y"
    net.mark_output(y)
    plan = compile_net(net, {"x": ((1, 16), (2, 16), (8, 16))})
    nodes = kernel_nodes(plan)
    assert [n.op for n in nodes] == ["matmul", "pointwise_group"]
    assert plan.graph.values[nodes[0].outputs[0]].dtype == tc.DataType.BF16


def test_horizontal_fusion_of_products_sharing_an_input() -> None:
    net = network()
    x = net.add_input("x", F32, (-1, 16))
    other = net.add_input("z", F32, (-1, 16))
    rng = np.random.default_rng(0)
    outs = []
    for i, (src, n) in enumerate(((x, 8), (x, 4), (x, 4), (other, 4))):
        w = net.add_constant((n, 16), tc.Weights(rng.standard_normal((n, 16)).astype(np.float32))).get_output(0)
        y = net.add_matrix_multiply(src, tc.MatrixOperation.NONE, w, tc.MatrixOperation.TRANSPOSE).get_output(0)
        y.name = f"p{i}"
        outs.append(y)
    for i, y in enumerate(outs):  # consumers read the slices
        r = net.add_unary(y, U.NEG).get_output(0)
        r.name = f"r{i}"
        net.mark_output(r)
    plan = compile_net(net, {"x": ((1, 16), (2, 16), (8, 16)), "z": ((1, 16), (2, 16), (8, 16))})
    gemms = [n for n in plan.graph.nodes if n.op == "matmul"]
    assert len(gemms) == 2
    fused = next(n for n in gemms if n.inputs[0] == "x")
    assert plan.graph.constants[fused.inputs[1]].shape == (16, 16)
    slices = [n for n in plan.graph.nodes if n.op == "view" and n.inputs == fused.outputs]
    assert [s.attrs["stages"] for s in slices] == [[("slice", (1, 0, 8))], [("slice", (1, 8, 4))], [("slice", (1, 12, 4))]]
    assert plan.stats["horizontal_fused_matmuls"] == 3


def test_horizontal_fusion_of_products_whose_input_is_named_plugin() -> None:
    """A network input named "plugin" (any name) is an input like any other: the products reading
    it fuse into one GEMM over the stacked weights (the pass once took such a bucket for one of
    plugins and failed with KeyError 'plugin')."""
    net = network()
    x = net.add_input("plugin", F32, (-1, 16))
    rng = np.random.default_rng(1)
    weights = [rng.standard_normal((n, 16)).astype(np.float32) for n in (8, 4)]
    for i, wv in enumerate(weights):
        w = net.add_constant(wv.shape, tc.Weights(wv)).get_output(0)
        y = net.add_matrix_multiply(x, tc.MatrixOperation.NONE, w, tc.MatrixOperation.TRANSPOSE).get_output(0)
        r = net.add_unary(y, U.NEG).get_output(0)
        r.name = f"r{i}"
        net.mark_output(r)
    plan = compile_net(net, {"plugin": ((1, 16), (2, 16), (8, 16))})
    [gemm] = [n for n in plan.graph.nodes if n.op == "matmul"]
    assert gemm.inputs[0] == "plugin" and plan.stats["horizontal_fused_matmuls"] == 2
    np.testing.assert_array_equal(plan.graph.constants[gemm.inputs[1]], np.concatenate(weights))


def test_constant_folding_equals_the_reference() -> None:
    net = network()
    rng = np.random.default_rng(1)
    c = rng.standard_normal((2, 3)).astype(np.float32)
    k = net.add_constant((2, 3), tc.Weights(c)).get_output(0)
    e = net.add_unary(k, U.EXP).get_output(0)
    s = net.add_reduce(e, tc.ReduceOperation.SUM, 0b10, True).get_output(0)
    x = net.add_input("x", F32, (2, 3))
    y = net.add_elementwise(x, s, E.PROD).get_output(0)
    y.name = "y"
    net.mark_output(y)
    plan = compile_net(net)
    assert plan.stats["folded_layers"] == 2
    [node] = kernel_nodes(plan)
    folded = plan.graph.constants[node.inputs[1]]
    np.testing.assert_allclose(folded, np.exp(c.astype(np.float64)).sum(axis=1, keepdims=True), rtol=1e-6)


def test_views_transpose_and_slice_need_no_copy_but_reshape_of_a_transpose_does() -> None:
    net = network()
    x = net.add_input("x", F32, (-1, 4, 6))
    t = net.add_shuffle(x)
    t.first_transpose = (0, 2, 1)  # a view
    flat = net.add_shuffle(t.get_output(0))
    flat.reshape_dims = (0, -1)  # merges dims that the transpose made non-adjacent: a copy
    y = net.add_unary(flat.get_output(0), U.NEG).get_output(0)
    y.name = "y"
    net.mark_output(y)
    plan = compile_net(net, {"x": ((1, 4, 6), (2, 4, 6), (3, 4, 6))})
    assert [n.op for n in plan.graph.nodes] == ["view", "copy", "view", "pointwise_group"]
    assert plan.stats["view_copies"] == 1


def test_evaluate_node_matches_numpy() -> None:
    g = ir.Graph({"a": ir.Value("a", F32, (2, 2)), "b": ir.Value("b", F32, (2, 2))}, [], [], [])
    node = ir.Node("n", "elementwise", ["a", "b"], ["c"], {"op": int(E.POW)})
    a, b = np.array([[2, 3], [4, 5]], np.float32), np.array([[1, 2], [0.5, 2]], np.float32)
    [out] = evaluate_node(g, node, [a, b])
    np.testing.assert_allclose(out, a**b, rtol=1e-6)


def test_kernels_are_listed_with_their_layers() -> None:
    plan, _ = llama_plan(layers=2, rope="plugin")  # separate q/k/v projections: horizontally fused
    engine = ICudaEngine(plan)
    names = [k.name for k in engine.kernels]
    assert len(names) == len(set(names))
    qkv = next(k for k in engine.kernels if k.kind == "gemm" and "q_proj" in k.name)
    assert qkv.layers == ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj"]
    gate_up = next(k for k in engine.kernels if k.kind == "gemm" and "gate_proj" in k.name)
    assert gate_up.layers == ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"]
    assert engine.build_log[0] == f"fused {plan.stats['layers']} layers into {len(engine.kernels)} kernels"


def test_llama_decoder_layer_at_decode_is_at_most_12_launches() -> None:
    """One decode token: the launches of layer 1 (GEMMs, generated kernels, plugins), counted
    from the prepared steps; the two plugins add their own kernels (RoPE 1, paged attention
    at most 3: cache write, attention, split reduction), counted too."""
    plan, _ = llama_plan(layers=3, rope="plugin")  # the RoPE plugin beside the attention plugin
    engine = ICudaEngine(plan)
    ctx = engine.create_execution_context_without_device_memory()
    ctx.set_device_memory(1 << 40, engine.device_memory_size_v2)
    for name, shape in decode_shapes(plan).items():
        assert ctx.set_input_shape(name, shape)
        ctx.set_tensor_address(name, 1 << 36)
    ctx.set_tensor_address("logits", 1 << 37)
    steps = ctx.prepare({c: 1 << 38 for c in plan.graph.constants})
    by_name = {n.name: n for n in plan.graph.nodes}
    layer1 = [s for s in steps if any(layer.startswith("model.layers.1.") for layer in by_name[s.name].layers)]
    plugin_kernels = {"rotary_emb": 1, "attention": 3}
    count = 0
    for s in layer1:
        if s.kind == "plugin":
            count += next(v for k, v in plugin_kernels.items() if k in s.name)
        elif s.kind == "gemm":
            count += len(s.calls)
        else:
            count += 1
    kinds = [s.kind for s in layer1]
    assert kinds.count("gemm") == 4 and kinds.count("plugin") == 2, kinds
    assert count <= 12, [(s.kind, s.name) for s in layer1]


def test_llama_decoder_layer_with_rope_in_attention_is_8_launches() -> None:
    """The paged plan with ``rope="attention"``: one qkv GEMM whose output is the packed
    input of the one attention plugin (RoPE inside it), so a decode layer is rmsnorm, qkv,
    attention (decode kernel + split reduction at most: a decode batch writes the cache from
    the decode kernel), o_proj, residual + rmsnorm, gate/up, silu * mul, down: no RoPE
    plugin, no q/k/v copies, at most 9 launches, 8 steps."""
    plan, d = llama_plan(layers=3, rope="attention")
    assert d.plan.rope == "attention"
    engine = ICudaEngine(plan)
    ctx = engine.create_execution_context_without_device_memory()
    ctx.set_device_memory(1 << 40, engine.device_memory_size_v2)
    for name, shape in decode_shapes(plan, batch=4).items():
        assert ctx.set_input_shape(name, shape)
        ctx.set_tensor_address(name, 1 << 36)
    ctx.set_tensor_address("logits", 1 << 37)
    steps = ctx.prepare({c: 1 << 38 for c in plan.graph.constants})
    by_name = {n.name: n for n in plan.graph.nodes}
    # the steps of layer 1: their last layer is layer 1's (the next norm also adds layer 1's residual)
    layer1 = [s for s in steps if by_name[s.name].layers[-1].startswith("model.layers.1.")]
    kinds = [s.kind for s in layer1]
    assert kinds.count("gemm") == 4 and kinds.count("plugin") == 1 and "copy" not in kinds, [(s.kind, s.name) for s in layer1]
    assert len(layer1) == 8, [(s.kind, s.name) for s in layer1]
    count = sum(2 if s.kind == "plugin" else len(s.calls) if s.kind == "gemm" else 1 for s in layer1)
    assert count <= 9, [(s.kind, s.name) for s in layer1]
    plugin = next(n for n in plan.graph.nodes if n.op == "plugin" and n.name.startswith("model.layers.1."))
    assert plugin.inputs[0].endswith("self_attn.qkv_proj")  # the GEMM's output, read in place


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_every_layer_type_lowers(dtype: str) -> None:
    from test_device_select import layer_network

    name = {"float32": "FLOAT", "float16": "HALF", "bfloat16": "BF16"}[dtype]
    net, kinds = layer_network(name)
    plan = compile_net(net, arch=None)
    assert set(plan.graph.outputs) == set(kinds)
    assert all(
        n.op
        in {
            "view",
            "matmul",
            "plugin",
            "pointwise_group",
            "row_group",
            "copy",
            "softmax",
            "reduce",
            "gather",
            "concat",
            "kv_cache_update",
            "attention",
        }
        for n in plan.graph.nodes
    )


def _norm_linear_net(extra_reader: bool = False, norm_is_output: bool = False) -> Any:
    """``y = rms_norm(a + b) * w; out = y @ W^T`` (bfloat16), optionally with a second reader
    of ``y`` or ``y`` marked as a network output."""
    from netutil import network

    from trtcore import ops

    rng = np.random.default_rng(0)
    net = network()
    g = ops.Graph(tc, net, "bfloat16")
    a = net.add_input("a", tc.DataType.BF16, (-1, 64))
    b = net.add_input("b", tc.DataType.BF16, (-1, 64))
    h = ops.add(g, a, b, "residual")
    y = ops.rms_norm(g, h, 1 + 0.1 * rng.standard_normal(64), 1e-5, "norm")
    out = ops.linear(g, y, rng.standard_normal((32, 64)) * 0.1, name="proj")
    g.output(out, "out")
    if extra_reader:  # a reader of its own kernel (a second GEMM would fuse horizontally into one)
        g.output(ops.softmax(g, y, -1, "other_reader"), "out2")
    if norm_is_output:
        net.mark_output(y)
    net.mark_output(h)
    return net


@pytest.mark.parametrize(
    "case, fused",
    [({}, True), ({"extra_reader": True}, False), ({"norm_is_output": True}, False)],
    ids=["fuses", "two-readers", "network-output"],
)
def test_gemv_prologue_fuses_a_norm_only_into_its_sole_reader(case: dict[str, Any], fused: bool) -> None:
    """The norm before a GEMM becomes the GEMV kernel's prologue only where its output has no
    other reader and is no network output."""
    from netutil import compile_net

    plan = compile_net(_norm_linear_net(**case), {"a": ((1, 64), (1, 64), (8, 64)), "b": ((1, 64), (1, 64), (8, 64))})
    (proj,) = [n for n in plan.graph.nodes if n.op == "matmul"]
    assert (f"{proj.name}#gemv_prologue" in plan.sources) == fused
    assert ("prologue" in proj.attrs) == fused


def test_llama_decode_layer_is_five_launches_with_gemv_prologues(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the GEMV tactic at decode, the norm before q/k/v and gate/up and the SwiGLU product
    before down run inside their GEMV: attention (RoPE inside it) and four GEMV kernels per layer."""
    from netutil import host_steps, llama_plan

    monkeypatch.setenv("TRTCORE_CUDA_GEMV", "1")
    plan, _ = llama_plan(layers=3, arch=None, rope="attention")
    steps = host_steps(plan, batch=2)
    layer1 = [s.name.replace("model.layers.1.", "") for s in steps if "model.layers.1." in s.name]
    assert layer1 == [
        "self_attn.qkv_proj#gemv_prologue",
        "self_attn.attention",
        "self_attn.o_proj#gemv",
        "gemm:mlp.gate_proj+mlp.up_proj#gemv_prologue",
        "mlp.down_proj#gemv_prologue",
    ], layer1
    fused = [s for s in steps if s.name.endswith("#gemv_prologue")]
    assert fused and all(s.shared_mem == 2 * int(s.args[-4][0]) * 2 for s in fused)  # M = 2 rows of K bfloat16 values


def test_one_token_row_runs_the_one_row_gemv_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """At decode with batch 1 every GEMV (fused or not) is the kernel specialized for one row
    (``max_m=1``: fewer registers), with shared memory for the staged ``1 x K`` input."""
    from netutil import host_steps, llama_plan

    monkeypatch.setenv("TRTCORE_CUDA_GEMV", "1")
    plan, _ = llama_plan(layers=2, arch=None)
    steps = host_steps(plan, batch=1)
    gemvs = [s for s in steps if "#gemv" in s.name]
    assert len(gemvs) == 2 * 4 + 1, [s.name for s in steps]  # q/k/v, o, gate/up, down per layer; the LM head
    assert all(s.name.endswith(("#gemv1", "#gemv1_prologue")) for s in gemvs), [s.name for s in gemvs]
    assert all("float acc[1];" in plan.sources[s.name].source for s in gemvs)  # one accumulator: compiled for one row
    assert all(s.shared_mem == int(s.args[-4][0]) * 2 for s in gemvs)  # one row of K bfloat16 values


def test_a_fused_gemv_never_writes_over_its_producers_inputs() -> None:
    """The fused prologue kernel reads the producer's inputs in every block while some blocks
    already write the GEMM's output: the memory plan keeps those inputs alive until the GEMM,
    so no output byte range of a fused GEMM meets an input range of its producer."""
    from netutil import llama_plan

    plan, _ = llama_plan(layers=3, arch=None)
    g = plan.graph
    nodes = {n.name: n for n in g.nodes}
    root = __import__("trtcore.cuda.views", fromlist=["view_root"]).view_root(g)
    fused = [n for n in g.nodes if n.op == "matmul" and n.attrs.get("prologue")]
    assert fused
    for mm in fused:
        out = root.get(mm.outputs[0], mm.outputs[0])
        lo, hi = plan.offsets[out], plan.offsets[out] + plan.sizes[out]
        for v in nodes[mm.attrs["prologue"]].inputs:
            r = root.get(v, v)
            if r in plan.offsets:
                assert plan.offsets[r] + plan.sizes[r] <= lo or hi <= plan.offsets[r], (mm.name, v)


def test_a_gemv_too_wide_for_its_prologue_keeps_the_producers_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block of a fused GEMV recomputes the producer: where blocks x M x K exceeds
    ``PROLOGUE_MAX_WORK`` the producer keeps its own launch (the plain GEMV follows it)."""
    from netutil import host_steps, llama_plan

    from trtcore.cuda import codegen

    monkeypatch.setenv("TRTCORE_CUDA_GEMV", "1")
    plan, _ = llama_plan(layers=2, arch=None)

    gate_up = next(s for s in host_steps(plan) if "gate_proj" in s.name)
    assert gate_up.name.endswith("#gemv1_prologue")
    work = gate_up.grid[0] * 1 * int(gate_up.args[-4][0])  # blocks x M x K
    monkeypatch.setattr(codegen, "PROLOGUE_MAX_WORK", work - 1)
    names = [s.name for s in host_steps(plan)]
    assert any(n.endswith("gate_proj+model.layers.0.mlp.up_proj#gemv1") for n in names), names
    assert "model.layers.0.post_attention_layernorm" in "".join(names)  # the norm's own row kernel runs


def _random_qw(rng: np.random.Generator, n: int, k: int, group: int, zeros: bool = False, perm: np.ndarray | None = None) -> Any:
    from trtcore.quantization import QuantizedWeight

    z = rng.integers(0, 16, (n, k // group)).astype(np.float32) if zeros else None
    return QuantizedWeight(
        rng.integers(0, 16, (n, k)).astype(np.uint8), rng.uniform(0.01, 0.02, (n, k // group)).astype(np.float32), z, 4, group, perm
    )


@pytest.mark.parametrize("aligned", [True, False], ids=["n16", "n_odd"])
def test_weight_only_plugins_sharing_an_input_fuse_and_their_concat_is_a_view(aligned: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """q/k/v-like weight-only plugins on one x become one plugin whose output is sliced (the
    concat of the three is an empty view), gate/up-like ones too; a plugin of another group
    size stays alone. The fused plugin's reference equals the parts' side by side exactly
    (also with zero points and an act-order permutation, and N not a multiple of 16: repacked).
    The SwiGLU pass, which would take the gate/up plugin further, is off here."""
    from trtcore import ops

    monkeypatch.setenv("TRTCORE_SWIGLU_FUSION", "0")

    k = 256
    rng = np.random.default_rng(5)
    perm = rng.permutation(k).astype(np.int32)
    widths = (64, 32, 16) if aligned else (40, 24, 8)
    net = network()
    g = ops.Graph(tc, net, "bfloat16")
    x = net.add_input("x", tc.DataType.BF16, (-1, k))
    qkv_w = [_random_qw(rng, n, k, 64) for n in widths]
    parts = [ops.linear(g, x, w, None, f"{r}_proj") for r, w in zip("qkv", qkv_w)]
    g.output(ops.concat(g, parts, 1, "qkv_proj"), "qkv")
    gu_w = [_random_qw(rng, n, k, 128, zeros=True, perm=perm) for n in (widths[0], widths[0])]
    gate, up = (ops.linear(g, x, w, None, f"{r}_proj") for r, w in zip(("gate", "up"), gu_w))
    g.output(ops.mul(g, ops.silu(g, gate, "act"), up, "gated"), "h")
    g.output(ops.linear(g, x, _random_qw(rng, 16, k, 32), None, "other_proj"), "o")
    plan = compile_net(net, {"x": ((1, k), (2, k), (8, k))})
    plugins = [n for n in plan.graph.nodes if n.op == "plugin"]
    assert len(plugins) == 3 and plan.stats["horizontal_fused_plugins"] == 5
    assert not [n for n in plan.graph.nodes if n.op == "concat"]
    by_n = {n.attrs["plugin"].out_features: n for n in plugins}
    assert set(by_n) == {sum(widths), 2 * widths[0], 16}
    qkv_node = by_n[sum(widths)]
    # the concat is the fused output itself (the parts' slices are read by nothing else)
    assert [n.attrs["stages"] for n in plan.graph.nodes if n.op == "view" and n.inputs == qkv_node.outputs] == [[]]
    gu_node = by_n[2 * widths[0]]
    gu_views = [n.attrs["stages"] for n in plan.graph.nodes if n.op == "view" and n.inputs == gu_node.outputs]
    assert gu_views == [[("slice", (1, 0, widths[0]))], [("slice", (1, widths[0], widths[0]))]]

    xv = rng.standard_normal((3, k)).astype(np.float32)
    from trtcore.plugins.weight_only_gemm import WeightOnlyGemmPlugin

    for node, weights in ((qkv_node, qkv_w), (gu_node, gu_w)):
        fused = node.attrs["plugin"].reference(xv, *[plan.graph.constants[c] for c in node.inputs[1:]])[0]
        want = []
        for w in weights:
            p, packed = WeightOnlyGemmPlugin.from_quantized(w)
            want.append(p.reference(xv, *packed.arrays())[0])
        np.testing.assert_array_equal(fused, np.concatenate(want, axis=1))


def _swiglu_mlp_net(rng: np.random.Generator, inter: int, k: int = 128, zeros: bool = False, act_order: bool = False, hidden_act: str = "silu") -> Any:
    """x -> quantized gate / up -> act(gate) * up (``mlp.gated``) -> quantized down (output ``o``)."""
    from trtcore import ops

    perm = rng.permutation(k).astype(np.int32) if act_order else None
    net = network()
    g = ops.Graph(tc, net, "bfloat16")
    x = net.add_input("x", tc.DataType.BF16, (-1, k))
    gate, up = (_random_qw(rng, inter, k, 64, zeros, perm) for _ in range(2))
    g.output(ops.swiglu_mlp(g, x, gate, up, _random_qw(rng, k, inter, 8), name="mlp", hidden_act=hidden_act), "o")
    return net


@pytest.mark.parametrize(("inter", "zeros", "act_order"), [(64, False, False), (40, True, False), (48, True, True)], ids=["i64", "i40_zeros", "i48_act_order"])
def test_swiglu_after_a_gate_up_plugin_becomes_its_epilogue(inter: int, zeros: bool, act_order: bool) -> None:
    """A SwiGLU MLP of weight-only linears compiles to two plugins: gate/up with SwiGLU in its
    epilogue (its output the gated product, no sigmoid or product node left) and down. Its
    reference equals the reference backend running the unfused network, bit for bit (gate and
    up rows interleaved by half tiles where I is a multiple of 16, repacked where not)."""
    from trtcore.reference.evaluator import evaluate

    rng = np.random.default_rng(inter)
    net = _swiglu_mlp_net(rng, inter, zeros=zeros, act_order=act_order)
    plan = compile_net(net, {"x": ((1, 128), (2, 128), (8, 128))})
    assert plan.stats["swiglu_fused"] == 1
    nodes = kernel_nodes(plan)
    assert [n.op for n in nodes] == ["plugin", "plugin"], [(n.op, n.name) for n in nodes]
    gate_up, down = nodes
    plugin = gate_up.attrs["plugin"]
    assert plugin.swiglu and plugin.out_features == 2 * inter and plugin.output_features == inter
    assert down.inputs[0] == gate_up.outputs[0] and plan.graph.values[gate_up.outputs[0]].shape == (-1, inter)
    assert {"mlp.act_fn.sigmoid", "mlp.act_fn", "mlp.gated"} <= set(gate_up.layers)

    xv = (rng.standard_normal((5, 128)) * 2).astype(ml_dtypes.bfloat16)
    want = evaluate(net, {"x": xv}, capture=["mlp.gated"])["mlp.gated"]
    got = plugin.reference(xv, *[plan.graph.constants[c] for c in gate_up.inputs[1:]])[0]
    assert got.dtype == want.dtype and got.shape == want.shape == (5, inter)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("case", ["gate_captured", "act_captured", "gelu", "off"])
def test_swiglu_stays_unfused_where_its_values_are_needed_or_it_is_not_silu(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate GEMM's output or silu(gate) kept as an engine output, a GeGLU MLP, and
    ``TRTCORE_SWIGLU_FUSION=0`` leave the gate/up plugin plain; keeping the gated product itself
    (which the fused plugin writes) does not."""
    if case == "off":
        monkeypatch.setenv("TRTCORE_SWIGLU_FUSION", "0")
    net = _swiglu_mlp_net(np.random.default_rng(1), 64, hidden_act="gelu_pytorch_tanh" if case == "gelu" else "silu")
    capture = {"gate_captured": ["mlp.gate_proj"], "act_captured": ["mlp.act_fn"]}.get(case, [])
    plan = compile_net(net, {"x": ((1, 128), (2, 128), (8, 128))}, capture=capture)
    assert plan.stats["swiglu_fused"] == 0
    assert not any(n.attrs["plugin"].swiglu for n in plan.graph.nodes if n.op == "plugin")
    kept = compile_net(_swiglu_mlp_net(np.random.default_rng(1), 64), {"x": ((1, 128), (2, 128), (8, 128))}, capture=["mlp.gated"])
    assert kept.stats["swiglu_fused"] == (0 if case == "off" else 1)


@pytest.mark.parametrize("case", ["channel", "tensor_equal", "tensor_differ", "input_differ"])
def test_fp8_plugins_fuse_where_each_row_is_unchanged(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """FP8 linears on one x fuse where every output row's product stays the same: per-channel
    weight scales (any values) or one equal per-tensor scale, with the same static input scale;
    per-tensor weight scales that differ, or input scales that differ, are left as they are.
    The fused plugin's reference equals the parts' side by side exactly (the input quantization
    left in the plugins: that pass is tested below)."""
    from trtcore import ops

    monkeypatch.setenv("TRTCORE_FP8_INPUT_FUSION", "0")
    from trtcore.fp8 import quantize_weight
    from trtcore.plugins.fp8_gemm import Fp8GemmPlugin

    k = 64
    rng = np.random.default_rng(9)
    raw = [rng.standard_normal((n, k)) * (1 + i) for i, n in enumerate((32, 16, 16))]
    strategy = "channel" if case == "channel" else "tensor"
    fws = [quantize_weight(w, strategy, input_scale=0.02 if case != "input_differ" else 0.02 * (1 + i)) for i, w in enumerate(raw)]
    if case == "tensor_equal":  # one weight scale for all three
        fws = [quantize_weight(w / np.abs(w).max() * np.abs(raw[0]).max(), "tensor", input_scale=0.02) for w in raw]
    net = network()
    g = ops.Graph(tc, net, "bfloat16")
    g.implementations["fp8_gemm"] = "plugin"
    x = net.add_input("x", tc.DataType.BF16, (-1, k))
    parts = [ops.linear(g, x, w, None, f"{r}_proj") for r, w in zip("qkv", fws)]
    g.output(ops.concat(g, parts, 1, "qkv_proj"), "qkv")
    plan = compile_net(net, {"x": ((1, k), (2, k), (8, k))})
    plugins = [n for n in plan.graph.nodes if n.op == "plugin"]
    fuses = case in ("channel", "tensor_equal")
    assert len(plugins) == (1 if fuses else 3)
    assert bool([n for n in plan.graph.nodes if n.op == "concat"]) == (not fuses)
    if not fuses:
        return
    [node] = plugins
    xv = (rng.standard_normal((3, k)) * 0.5).astype(np.float32)
    fused = node.attrs["plugin"].reference(xv, *[plan.graph.constants[c] for c in node.inputs[1:]])[0]
    want = []
    for fw in fws:
        p, consts = Fp8GemmPlugin.from_fp8(fw)
        want.append(p.reference(xv, *consts)[0])
    np.testing.assert_array_equal(fused, np.concatenate(want, axis=1))


def test_per_tensor_fp8_gate_up_get_one_scale_and_one_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ops.swiglu_mlp`` gives per-tensor FP8 gate/up with different scales the larger one
    (vLLM's requantization with the max scale), so the cuda engine runs them as one GEMM whose
    weight holds both parts' codes requantized; down stays alone."""
    from trtcore import ops
    from trtcore.fp8 import from_e4m3, quantize_weight, to_e4m3

    monkeypatch.setenv("TRTCORE_FP8_INPUT_FUSION", "0")
    k, inter = 64, 48
    rng = np.random.default_rng(21)
    gate, up = (quantize_weight(rng.standard_normal((inter, k)) * sd, "tensor", input_scale=0.02) for sd in (1.0, 3.0))
    down = quantize_weight(rng.standard_normal((k, inter)), "tensor", input_scale=0.05)
    net = network()
    g = ops.Graph(tc, net, "bfloat16")
    g.implementations["fp8_gemm"] = "plugin"
    x = net.add_input("x", tc.DataType.BF16, (-1, k))
    g.output(ops.swiglu_mlp(g, x, gate, up, down), "y")
    plan = compile_net(net, {"x": ((1, k), (2, k), (8, k))})
    plugins = [n for n in plan.graph.nodes if n.op == "plugin"]
    assert sorted(n.attrs["plugin"].out_features for n in plugins) == [k, 2 * inter]
    [fused] = [n for n in plugins if n.attrs["plugin"].out_features == 2 * inter]
    s = max(float(gate.weight_scale[0]), float(up.weight_scale[0]))
    assert plan.graph.constants[fused.inputs[2]].reshape(-1).tolist() == [np.float32(s)]
    want = [to_e4m3(from_e4m3(w.weight) * float(w.weight_scale[0]) / np.float32(s)) for w in (gate, up)]  # requantized, float32 division
    np.testing.assert_array_equal(plan.graph.constants[fused.inputs[1]], np.concatenate(want))


def _fp8_mlp_net(input_scales: tuple[float, float] = (0.02, 0.05)) -> Any:
    """``h = a + b; y = rms_norm(h)``; q / k / v FP8 linears of y (per-tensor weight scales that
    differ, so they stay three plugins; one static input scale); ``down(silu(q) * k)`` with its
    own static input scale; outputs h (the residual stream), v and the down projection."""
    from trtcore import ops
    from trtcore.fp8 import quantize_weight

    k = 64
    rng = np.random.default_rng(5)
    net = network()
    g = ops.Graph(tc, net, "bfloat16")
    g.implementations["fp8_gemm"] = "plugin"
    a = net.add_input("a", tc.DataType.BF16, (-1, k))
    b = net.add_input("b", tc.DataType.BF16, (-1, k))
    h = ops.add(g, a, b, "residual")
    y = ops.rms_norm(g, h, 1 + 0.1 * rng.standard_normal(k), 1e-5, "norm")
    q, kk, v = (
        ops.linear(g, y, quantize_weight(rng.standard_normal((32, k)) * (1 + i), "tensor", input_scale=input_scales[0]), None, f"{r}_proj")
        for i, r in enumerate("qkv")
    )
    act = ops.mul(g, ops.silu(g, q, "act"), kk, "glu")
    down = ops.linear(g, act, quantize_weight(rng.standard_normal((k, 32)), "tensor", input_scale=input_scales[1]), None, "down_proj")
    net.mark_output(h)
    g.output(v, "v")
    g.output(down, "out")
    return net


def test_fp8_input_quantization_fuses_into_the_producing_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """A static-scale FP8 linear's x quantization becomes graph nodes that pointwise fusion folds
    into the kernel computing x: q / k / v share one chain inside the RMSNorm row kernel, down's
    is inside the SiLU * mul kernel; every FP8 plugin then reads E4M3 codes (prequantized, with
    its [alpha, 0] constant) and writes what it wrote before. Opt-in: without
    TRTCORE_FP8_INPUT_FUSION=1 the plugins quantize x themselves."""
    monkeypatch.setenv("TRTCORE_FP8_INPUT_FUSION", "1")
    shapes = {"a": ((1, 64), (4, 64), (16, 64)), "b": ((1, 64), (4, 64), (16, 64))}
    plan = compile_net(_fp8_mlp_net(), shapes, arch=None)
    g = plan.graph
    plugins = [n for n in g.nodes if n.op == "plugin"]
    assert len(plugins) == 4 and all(n.attrs["plugin"].prequantized for n in plugins)
    assert plan.stats["fp8_input_chains"] == 2 and plan.stats["fp8_prequantized"] == 4
    codes = {n.inputs[0] for n in plugins}
    assert len(codes) == 2 and all(g.values[c].dtype == tc.DataType.FP8 for c in codes)
    producers = g.producers()
    row = g.nodes[producers[plugins[0].inputs[0]]]
    assert row.op == "row_group" and {"norm", "q_proj.plugin"} <= set(row.layers)
    # the row kernel writes the residual stream and the codes, not the bfloat16 y
    assert set(row.outputs) == {"residual", plugins[0].inputs[0]}
    down = next(n for n in plugins if "down_proj.plugin" in n.layers)
    glu = g.nodes[producers[down.inputs[0]]]
    assert glu.op == "pointwise_group" and {"glu", "down_proj.plugin"} <= set(glu.layers)
    for n in plugins:  # alpha = float32(s_x * s_w) per tensor, beta 0
        s_w, s_x, ab = (np.asarray(g.constants[c], np.float32).reshape(-1) for c in n.inputs[2:5])
        np.testing.assert_array_equal(ab, np.array([np.float32(s_x[0] * s_w[0]), 0.0], np.float32))
    assert not [n for n in g.nodes if n.op == "pointwise_group" and n is not glu]  # no kernel of its own

    for flag in ("0", None):  # off, and the default
        if flag is None:
            monkeypatch.delenv("TRTCORE_FP8_INPUT_FUSION")
        else:
            monkeypatch.setenv("TRTCORE_FP8_INPUT_FUSION", flag)
        plain = compile_net(_fp8_mlp_net(), shapes, arch=None)
        assert not any(n.attrs["plugin"].prequantized for n in plain.graph.nodes if n.op == "plugin")
        assert "fp8_prequantized" not in plain.stats


def test_fp8_input_chains_are_shared_only_by_one_input_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linears reading one x with different input scales get a chain each."""
    from trtcore import ops
    from trtcore.fp8 import quantize_weight

    monkeypatch.setenv("TRTCORE_FP8_INPUT_FUSION", "1")

    rng = np.random.default_rng(6)
    net = network()
    g = ops.Graph(tc, net, "bfloat16")
    g.implementations["fp8_gemm"] = "plugin"
    x = net.add_input("x", tc.DataType.BF16, (-1, 64))
    for i in range(3):
        g.output(
            ops.linear(g, x, quantize_weight(rng.standard_normal((16, 64)), "channel", input_scale=0.02 * (1 + (i > 0))), None, f"l{i}"), f"y{i}"
        )
    plan = compile_net(net, {"x": ((1, 64), (2, 64), (8, 64))}, arch=None)
    assert plan.stats["fp8_input_chains"] == 2
    # x is a network input: each chain is a pointwise kernel of its own, in place of the plugins' quantize kernels
    assert len([n for n in plan.graph.nodes if n.op == "pointwise_group"]) == 2


def _plugin_overlaps(plan: Any, steps: list[Any]) -> list[tuple[str, int]]:
    """(plugin step, input index) for every activation input of a plugin launch
    (:func:`netutil.prepared_steps`) whose bytes meet the launch's outputs or workspace."""
    base, size = ACTIVATIONS, plan.device_memory_size
    bad = []
    for step in steps:
        if step.kind != "plugin":
            continue
        ins, outs, ws = step.tensors
        ws_size = plan.sizes.get(f"workspace:{step.name}", 0)
        taken = [(o.ptr, o.ptr + o.size * o.dtype.itemsize) for o in outs] + ([(ws, ws + ws_size)] if ws else [])
        for i, t in enumerate(ins):
            lo, hi = t.ptr, t.ptr + t.size * t.dtype.itemsize
            if base <= lo < base + size and any(lo < b and a < hi for a, b in taken):
                bad.append((step.name, i))
    return bad


@pytest.mark.parametrize("prefill", ["cublas", "tensor_cores"])
def test_a_plugin_reading_a_skipped_copy_never_shares_its_input_bytes(prefill: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin whose input is a view (a reshape of a dense intermediate, like attention's
    output before o_proj) reads it through materialize's copy-if-needed, which the runtime
    skips where the view is dense: the plugin then reads the intermediate's own bytes. The
    memory plan keeps them alive until the plugin ran, so neither its output nor its workspace
    (the weight-only "cublas" prefill's dequantized W) lands on them. Before the fix both did
    (a 4-bit engine's o_proj read weights as activations: bench/results/h200-2026-12-04-session19,
    section 5). Checked on the prepared launches (no GPU), at every profile point."""
    from trtcore import ops
    from trtcore.plugins import weight_only_gemm as wog

    monkeypatch.setattr(wog, "PREFILL_KERNEL", prefill)
    rng = np.random.default_rng(11)
    net = network()
    g = ops.Graph(tc, net, "bfloat16")
    x = net.add_input("x", tc.DataType.BF16, (-1, 4, 16))
    h = ops.silu(g, x, "act")  # a dense intermediate of its own
    y = ops.linear(g, ops.reshape(g, h, (-1, 64), "flat"), _random_qw(rng, 64, 64, 32, zeros=True), None, "proj")
    g.output(ops.silu(g, y, "act2"), "out")
    points = ((1, 4, 16), (40, 4, 16), (64, 4, 16))
    plan = compile_net(net, {"x": points})
    [node] = [n for n in plan.graph.nodes if n.op == "plugin"]
    assert any(n.op == "copy" and n.attrs.get("if_needed") and n.outputs[0] == node.inputs[0] for n in plan.graph.nodes)
    assert (plan.sizes.get(f"workspace:{node.name}", 0) > 0) == (prefill == "cublas")
    for shape in points:
        steps = prepared_steps(plan, {"x": shape})
        [step] = [s for s in steps if s.kind == "plugin"]
        assert ACTIVATIONS <= step.tensors[0][0].ptr < ACTIVATIONS + plan.device_memory_size, "x is the intermediate's own bytes (the copy skipped)"
        assert _plugin_overlaps(plan, steps) == [], shape


def test_no_plugin_input_shares_bytes_in_a_quantized_contiguous_cache_engine(tmp_path: Any) -> None:
    """The plan the H200 ran wrong (session 19, call 6): a tiny checkpoint quantized to 4-bit
    RTN group 32 by trtcore quantize, bfloat16, contiguous KV cache with attention as layers
    (o_proj reads attention's output through a reshape), three prompts of 80 tokens: no
    plugin's activation input meets its outputs or workspace (before the fix, both o_proj
    launches had their workspace on their input)."""
    from hf_models import VARIANTS, ModelStore

    from trtcore.builder import _builder_config, define_network
    from trtcore.checkpoint import Checkpoint
    from trtcore.config import load_config
    from trtcore.cuda.builder import compile_network
    from trtcore.plan import BuildConfig, resolve_plan
    from trtcore.quant_formats import resolve_quantization
    from trtcore.quantizer import quantize_checkpoint
    from trtcore.trt import load_trt

    name = next(iter(VARIANTS))
    q = quantize_checkpoint(ModelStore(tmp_path / "models").dir(name), tmp_path / "q", method="rtn", bits=4, group_size=32)
    config, _ = resolve_quantization(q, load_config(q), None)
    options = BuildConfig(
        dtype="bfloat16", max_batch_size=8, max_seq_len=None, rope=None, kv_cache="contiguous", block_size=16,
        max_num_tokens=2048, attention="layers", kv_cache_dtype="auto",
    )  # fmt: skip
    plan_choice = resolve_plan(config, options, "cuda")
    with Checkpoint(q) as weights:
        defined = define_network(load_trt("cuda"), config, weights, plan_choice)
        plan = compile_network(defined.network, _builder_config(defined, None), None, arch=None)
    b, s = 3, 80
    shapes = {"input_ids": (b, s), "position_ids": (b, s), "last_token_ids": (b,), "attention_mask": (b, 1, 1, s, s)}
    for i in range(config.num_hidden_layers):
        for kv in ("key", "value"):
            shapes[f"past_key_values.{i}.{kv}"] = (b, config.num_key_value_heads, 0, config.head_dim)
    steps = prepared_steps(plan, shapes)
    assert [st for st in steps if st.kind == "plugin" and "o_proj" in st.name], "o_proj runs the weight-only plugin"
    assert _plugin_overlaps(plan, steps) == []


def test_a_4bit_decode_step_runs_no_swiglu_kernel() -> None:
    """A SmolLM2-shaped 4-bit engine (group 64, paged cache), one decode step as the runtime
    would enqueue it (no GPU): each layer's MLP is two plugin launches, gate/up with SwiGLU
    (its output, I wide, read by down) and down, with no kernel between them; before the pass
    a pointwise SwiGLU kernel ran there."""
    from trtcore.builder import BuildConfig, _builder_config, define_network
    from trtcore.cuda import synthetic
    from trtcore.cuda.builder import compile_network

    cfg = synthetic.config("SmolLM2-135M", num_hidden_layers=2, vocab_size=512)
    bc = BuildConfig(dtype="bfloat16", max_batch_size=4, max_seq_len=128, max_num_tokens=128, max_num_blocks=64, kv_cache="paged")
    d = define_network(tc, cfg, synthetic.RandomQuantizedWeights(cfg, 4, 64, seed=1), bc)
    plan = compile_network(d.network, _builder_config(d, None), None, arch=None)
    assert plan.stats["swiglu_fused"] == cfg.num_hidden_layers
    steps = host_steps(plan)
    for layer in range(cfg.num_hidden_layers):
        i = next(i for i, s in enumerate(steps) if s.name.startswith(f"plugin:model.layers.{layer}.mlp.gate_proj"))
        gate_up, down = steps[i], steps[i + 1]
        assert gate_up.plugin.swiglu and gate_up.plugin.output_features == cfg.intermediate_size
        assert down.name == f"model.layers.{layer}.mlp.down_proj.plugin", [s.name for s in steps[i : i + 3]]
        (_, outs, _), (down_ins, _, _) = gate_up.tensors, down.tensors
        assert outs[0].shape == (1, cfg.intermediate_size) and down_ins[0].ptr == outs[0].ptr, "down reads the SwiGLU output"
