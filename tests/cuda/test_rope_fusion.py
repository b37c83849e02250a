"""The cuda backend's RoPE-into-the-q/k/v-GEMM pass (trtcore/cuda/rope_fusion.py) and the weight-only
plugin's RoPE form (``rope_rows``), on the CPU: the pass's matches and refusals, and the fused
plugin's reference against the reference backend running the unfused network, bit for bit.
The kernels' epilogue is checked on the GPU in tests/cuda/test_weight_only_gemm_gpu.py."""

from __future__ import annotations

import zlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from netutil import compile_net, network

import trtcore.cuda as tc
from trtcore.plugins import weight_only_gemm as wog
from trtcore.plugins.weight_only_gemm import WeightOnlyGemmPlugin
from trtcore.quantization import QuantizedWeight
from trtcore.rope import RopeSpec

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """Seeded by the test's id: fresh inputs per case, the same on every run."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def _qw(rng: np.random.Generator, n: int, k: int, group: int = 64, zeros: bool = False) -> QuantizedWeight:
    z = rng.integers(0, 16, (n, k // group)).astype(np.float32) if zeros else None
    return QuantizedWeight(rng.integers(0, 16, (n, k)).astype(np.uint8), rng.uniform(0.01, 0.02, (n, k // group)).astype(np.float32), z, 4, group)


def _spec(d: int, rope_type: str = "default", scaling: float = 1.0) -> RopeSpec:
    inv = 1.0 / (10000.0 ** (np.arange(0, d, 2, dtype=np.float64) / d))
    extra: dict[str, Any] = {"dynamic_factor": 2.0, "max_position_embeddings": 64} if rope_type == "dynamic" else {}
    return RopeSpec(d, d, 10000.0, rope_type, inv, attention_scaling=scaling, **extra)


def _attention_net(
    rng: np.random.Generator, d: int, hq: int = 4, hkv: int = 2, k: int = 128, zeros: bool = False, spec: RopeSpec | None = None
) -> Any:
    """x, position_ids -> quantized q / k / v -> heads -> RoPE plugin -> outputs ``qk`` (q and k
    rotated, side by side) and ``v``."""
    from trtcore import ops

    net = network()
    g = ops.Graph(tc, net, "bfloat16")
    x = net.add_input("x", tc.DataType.BF16, (-1, k))
    pos = net.add_input("position_ids", tc.DataType.INT32, (-1,))
    q, kk, v = (ops.linear(g, x, _qw(rng, h * d, k, zeros=zeros), None, f"{r}_proj") for r, h in zip("qkv", (hq, hkv, hkv)))
    qh, kh = ops.reshape(g, q, (0, hq, d), "q_heads"), ops.reshape(g, kk, (0, hkv, d), "k_heads")
    qr, kr = ops.rope_plugin(g, qh, kh, pos, spec or _spec(d))
    g.output(ops.concat(g, [qr, kr], 1, "qk"), "qk")
    g.output(v, "v")
    return net


SHAPES = {"x": ((1, 128), (2, 128), (8, 128)), "position_ids": ((1,), (2,), (8,))}


@pytest.mark.parametrize(("d", "zeros", "scaling"), [(64, False, 1.0), (16, True, 1.0), (32, False, 0.75)], ids=["d64", "d16_zeros", "d32_scaled"])
def test_rope_after_a_qkv_plugin_becomes_its_epilogue(d: int, zeros: bool, scaling: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``TRTCORE_ROPE_FUSION=1`` the q/k/v plugin takes the RoPE: no RoPE node is left, the
    plugin rotates the q and k rows (``rope_rows``) and reads the positions and ``inv_freq``;
    its reference equals the reference backend's unfused q/k/v + RoPE, bit for bit (head_dim 64
    and 32 move half tiles, 16 repacks; an attention scaling multiplies cos and sin)."""
    from trtcore.reference.evaluator import evaluate

    monkeypatch.setenv("TRTCORE_ROPE_FUSION", "1")
    rng = np.random.default_rng(d)
    hq, hkv = 4, 2
    net = _attention_net(rng, d, hq, hkv, zeros=zeros, spec=_spec(d, scaling=scaling))
    plan = compile_net(net, SHAPES)
    assert plan.stats["rope_fused"] == 1
    plugins = [n for n in plan.graph.nodes if n.op == "plugin"]
    assert len(plugins) == 1, [n.name for n in plugins]
    (node,) = plugins
    plugin = node.attrs["plugin"]
    assert (plugin.rope_rows, plugin.rope_head_dim, plugin.out_features) == ((hq + hkv) * d, d, (hq + 2 * hkv) * d)
    assert plugin.rope_scaling == np.float32(scaling)
    assert node.inputs[-2] == "position_ids" and node.inputs[-1] in plan.graph.constants
    assert any("rotary_emb" in layer for layer in node.layers)

    t = 5
    xv = rng.standard_normal((t, 128)).astype(BF16)
    pos = rng.integers(0, 4000, t).astype(np.int32)
    names = [n for n in _rope_output_names(net)]
    want = evaluate(net, {"x": xv, "position_ids": pos}, capture=[*names, "v"])
    consts = [plan.graph.constants[c] for c in node.inputs[1:-2]]
    got = plugin.reference(xv, *consts, pos, plan.graph.constants[node.inputs[-1]])[0]
    expect = np.concatenate([want[names[0]].reshape(t, -1), want[names[1]].reshape(t, -1), want["v"]], axis=1)
    assert got.dtype == expect.dtype == BF16
    np.testing.assert_array_equal(got.view(np.uint16), expect.view(np.uint16))


def _rope_output_names(net: Any) -> list[str]:
    """The RoPE plugin layer's two output names (q, k)."""
    for i in range(net.num_layers):
        layer = net.get_layer(i)
        if "rotary_emb" in layer.name and layer.num_outputs == 2:
            return [layer.get_output(0).name, layer.get_output(1).name]
    raise AssertionError("no RoPE plugin layer")


@pytest.mark.parametrize("case", ["off", "q_captured", "dynamic", "odd_head"])
def test_rope_stays_unfused_where_it_cannot_be_the_epilogue(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Off by default; unrotated q kept as an engine output; dynamic NTK frequencies (per
    sequence length); head_dim 24 (not whole tiles): the RoPE node stays. Keeping the RoPE's
    own output (rotated q, which the fused plugin's q view holds) does not stop it."""
    if case != "off":
        monkeypatch.setenv("TRTCORE_ROPE_FUSION", "1")
    rng = np.random.default_rng(3)
    d = 24 if case == "odd_head" else 32
    net = _attention_net(rng, d, spec=_spec(d, "dynamic") if case == "dynamic" else None)
    capture = {"q_captured": ["q_heads"]}.get(case, [])
    plan = compile_net(net, SHAPES, capture=capture)
    assert plan.stats["rope_fused"] == 0
    assert not any(getattr(n.attrs["plugin"], "rope_rows", 0) for n in plan.graph.nodes if n.op == "plugin")
    assert any(n.attrs["plugin"].plugin_name == "trtcore_rope" for n in plan.graph.nodes if n.op == "plugin")
    if case == "off":
        monkeypatch.setenv("TRTCORE_ROPE_FUSION", "1")
        rotated = _rope_output_names(net)[0]
        kept = compile_net(net, SHAPES, capture=[rotated])
        assert kept.stats["rope_fused"] == 1 and rotated in kept.graph.outputs


@pytest.mark.parametrize(("d", "bits"), [(64, 4), (32, 8), (16, 4)])
def test_rope_order_moves_half_tiles_as_packing_the_permuted_rows_does(d: int, bits: int, rng: np.random.Generator) -> None:
    """``with_rope``'s constants equal packing the weight's rows permuted into
    :func:`rope_order` (q and k heads reordered per head, v rows as they were), and its order
    puts each rotation pair (i, i + d / 2) of a head at rows gid and gid + 8 of one tile."""
    hq, hkv, k = 3, 1, 256
    n = (hq + 2 * hkv) * d
    rows = (hq + hkv) * d
    qw = QuantizedWeight(rng.integers(0, 1 << bits, (n, k)).astype(np.uint8), rng.uniform(0.01, 0.02, (n, 4)).astype(np.float32), None, bits, 64)
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    made = plugin.with_rope(packed.arrays(), rows, d)
    assert made is not None
    fused, arrays = made
    order = wog.rope_order(n, rows, d)
    want = WeightOnlyGemmPlugin.from_quantized(QuantizedWeight(qw.codes[order], qw.scales[order], None, bits, 64))[1].arrays()
    for a, b in zip(arrays, want):
        np.testing.assert_array_equal(a, b)
    # the formula: stored row 16 t + r (r < 8) of head h is feature 8 t + r, row 16 t + 8 + r its partner
    for r in range(rows):
        h, s = divmod(r, d)
        t, p = divmod(s, 16)
        assert order[r] == h * d + (8 * t + p if p < 8 else d // 2 + 8 * t + p - 8)
    np.testing.assert_array_equal(order[rows:], np.arange(rows, n))
    assert plugin.with_rope(packed.arrays(), rows + 8, d) is None and fused.with_rope(arrays, rows, d) is None
    assert fused.with_swiglu(arrays) is None and fused.row_fusion_key(arrays) is None


def test_rope_fields_round_trip_and_bad_ones_are_refused() -> None:
    """The RoPE fields survive the field collection (optional: a plain plugin leaves them out),
    and rope_rows that are not whole heads, or with swiglu, are refused with the values named."""
    from trtcore.plugins.base import PluginError

    p = WeightOnlyGemmPlugin(128, 192, 4, 64, rope_rows=128, rope_head_dim=64, rope_scaling=0.5)
    data = {name: d for name, _, d in p.field_values()}
    assert WeightOnlyGemmPlugin.from_field_data(data) == p
    assert "rope_rows" not in {name for name, _, _ in WeightOnlyGemmPlugin(128, 192, 4, 64).field_values()}
    assert p.num_inputs == 5 and p.num_weight_inputs == 2
    with pytest.raises(PluginError, match="rope_rows=96 must be whole heads of rope_head_dim=64"):
        WeightOnlyGemmPlugin(128, 192, 4, 64, rope_rows=96, rope_head_dim=64)
    with pytest.raises(PluginError, match="not with swiglu"):
        WeightOnlyGemmPlugin(128, 192, 4, 64, swiglu=True, rope_rows=64, rope_head_dim=64)


def test_rope_plugin_launches_the_epilogue_or_stages_its_output(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    """Launch arguments, recorded without a GPU: the decode kernels get the positions, inv_freq,
    rope_rows and the scaling (and ROPE / ROTARY_DIM defines); a plain plugin passes nulls; the
    cuBLAS prefill stages the GEMM output in the workspace and ``trtcore_wq_rope`` writes the
    output from it."""
    from trtcore.plugins.base import DeviceTensor

    events: list[tuple[Any, ...]] = []
    monkeypatch.setattr(
        wog, "_launch", lambda defines, name, grid, block, args, stream, shared_mem=0: events.append((dict(defines), name, grid, args))
    )

    class FakeLt:
        def matmul(self, m: int, r: int, k: int, w: int, x: int, out: int, *a: Any, ldd: int = 0) -> None:
            events.append(({}, "matmul", (), [(out, "ptr"), (ldd, "i32")]))

    import trtcore.cuda.cublaslt as lt

    monkeypatch.setattr(lt, "thread_linear", lambda cuda_type: FakeLt())
    d, k, n = 64, 128, 256
    plugin, packed = WeightOnlyGemmPlugin.from_quantized(_qw(rng, n, k))
    fused, arrays = plugin.with_rope(packed.arrays(), 192, d)  # type: ignore[misc]
    ins = [DeviceTensor(0x10000 * (i + 2), a.shape, a.dtype) for i, a in enumerate(arrays)]
    x_ptr, out_ptr, pos_ptr, freq_ptr, ws = 0x1000000, 0x2000000, 0x3000000, 0x4000000, 0x5000000
    for m in (1, 12):
        events.clear()
        rope_ins = [DeviceTensor(pos_ptr, (m,), np.dtype(np.int32)), DeviceTensor(freq_ptr, (d // 2,), np.dtype(np.float32))]
        fused.enqueue([DeviceTensor(x_ptr, (m, k), BF16), *ins, *rope_ins], [DeviceTensor(out_ptr, (m, n), BF16)], ws, 0)
        [(defines, name, _, args)] = events
        assert name == ("trtcore_wq_gemv" if m == 1 else "trtcore_wq_gemv16") and defines["ROPE"] == 1 and defines["ROTARY_DIM"] == d
        assert [a[0] for a in args[-9:-5]] == [pos_ptr, freq_ptr, 192, np.float32(1.0)] and args[5][0] == out_ptr
    events.clear()
    plugin.enqueue(
        [DeviceTensor(x_ptr, (1, k), BF16), *[DeviceTensor(t.ptr, t.shape, t.dtype) for t in ins]], [DeviceTensor(out_ptr, (1, n), BF16)], 0, 0
    )
    assert [a[0] for a in events[0][3][-9:-5]] == [0, 0, 0, 1.0] and "ROPE" not in events[0][0]
    m = 64
    events.clear()
    staged = fused.staging_bytes(BF16, m)
    assert staged == m * n * 2 and fused.workspace_size([((m, k), BF16)], [((m, n), BF16)]) >= staged
    rope_ins = [DeviceTensor(pos_ptr, (m,), np.dtype(np.int32)), DeviceTensor(freq_ptr, (d // 2,), np.dtype(np.float32))]
    fused.enqueue([DeviceTensor(x_ptr, (m, k), BF16), *ins, *rope_ins], [DeviceTensor(out_ptr, (m, n), BF16)], ws, 0)
    assert [e[1] for e in events] == ["trtcore_wq_dequantize", "matmul", "trtcore_wq_rope"]
    assert events[1][3] == [(ws, "ptr"), (n, "i32")], "the GEMM writes the staging"
    assert [a[0] for a in events[2][3]] == [ws, out_ptr, pos_ptr, freq_ptr, m, n, 192, np.float32(1.0)]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_rope_epilogue_compiles_in_every_decode_kernel(arch: str) -> None:
    """ROPE with v1 (gemv / gemv16), the default v2, two row tiles, and the cp.async rings, for
    both 16-bit dtypes and head_dim 64 / 128 (no GPU needed)."""
    from trtcore import kernels

    variants = [{}, wog.DEFAULT_DECODE[4], {"WQ_DECODE": 2, "ROW_TILES": 2, "WQ_FOLD": 1, "SEG": 2}]
    variants += [{"WQ_DECODE": 2, "WQ_FOLD": 1, "SEG": 2, "ASYNC": 4, "XPF": 1, "ASLOT": wog.async_slot_bytes(2, 1, True)}]
    for d, v in zip((1, 2, 1, 2), variants):
        defines = {"DTYPE": d, "BITS": 4, "HAS_ZEROS": 1, "HAS_PERM": 0, "CONTIG_X": 1, "ROPE": 1, "ROTARY_DIM": 64 * d, **v}
        c = kernels.compile_kernel("wq_gemm", defines=defines, arch=arch)
        assert {"trtcore_wq_gemv", "trtcore_wq_gemv16", "trtcore_wq_rope"} <= set(c.symbols)


def test_a_4bit_paged_decode_step_runs_no_rope_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Llama-shaped 4-bit engine with head_dim 32 (as tests/cuda/test_llm_gpu.py's quantized
    paged test), paged cache, fusion on: every layer's q/k/v plugin takes the RoPE, one decode
    step as the runtime would enqueue it (no GPU) launches no RoPE plugin, and the attention
    reads q and k from the q/k/v plugin's output."""
    from netutil import host_steps

    from trtcore.builder import BuildConfig, _builder_config, define_network
    from trtcore.cuda import synthetic
    from trtcore.cuda.builder import compile_network

    monkeypatch.setenv("TRTCORE_ROPE_FUSION", "1")
    cfg = synthetic.config(
        "SmolLM2-135M",
        num_hidden_layers=2,
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    )
    bc = BuildConfig(dtype="bfloat16", max_batch_size=4, max_seq_len=128, max_num_tokens=128, max_num_blocks=64, kv_cache="paged")
    d = define_network(tc, cfg, synthetic.RandomQuantizedWeights(cfg, 4, 64, seed=1), bc)
    plan = compile_network(d.network, _builder_config(d, None), None, arch=None)
    assert plan.stats["rope_fused"] == cfg.num_hidden_layers
    steps = host_steps(plan)
    assert not [s for s in steps if s.kind == "plugin" and s.plugin.plugin_name == "trtcore_rope"]
    qkv = [s for s in steps if s.kind == "plugin" and getattr(s.plugin, "rope_rows", 0)]
    attn = [s for s in steps if s.kind == "plugin" and s.plugin.plugin_name == "trtcore_paged_attention"]
    assert len(qkv) == len(attn) == cfg.num_hidden_layers
    for q, a in zip(qkv, attn):
        assert q.plugin.rope_rows == (4 + 2) * 32 and q.plugin.rope_head_dim == 32
        (_, outs, _), (ins, _, _) = q.tensors, a.tensors
        base, size = outs[0].ptr, outs[0].size * outs[0].dtype.itemsize
        assert base <= ins[0].ptr < base + size and base <= ins[1].ptr < base + size, "attention reads the rotated q and k in place"


@pytest.mark.parametrize("case", ["qkv_output", "positions_after"])
def test_rope_stays_unfused_where_the_gemm_output_is_kept_or_the_positions_come_later(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The q/k/v GEMM's own output an engine output (its q and k rows would come out rotated),
    and positions computed after the GEMM (the fused GEMM would read them before they exist):
    no fusion, and the engine compiles; the same networks without that fuse (found by an
    adversarial review)."""
    from trtcore import ops

    monkeypatch.setenv("TRTCORE_ROPE_FUSION", "1")
    d, hq, hkv, k = 32, 4, 2, 128

    def build(odd: bool) -> Any:
        rng = np.random.default_rng(11)
        net = network()
        g = ops.Graph(tc, net, "bfloat16")
        x = net.add_input("x", tc.DataType.BF16, (-1, k))
        position_ids = net.add_input("position_ids", tc.DataType.INT32, (-1,))
        if case == "qkv_output":  # one packed q/k/v linear (Phi-3's qkv_proj), its output kept when odd
            y = ops.linear(g, x, _qw(rng, (hq + 2 * hkv) * d, k), None, "qkv_proj")
            if odd:
                g.output(y, "qkv")
            rows = (("q", 0, hq), ("k", hq, hq + hkv), ("v", hq + hkv, hq + 2 * hkv))
            q, kk, v = (ops.gather_const(g, y, range(a * d, b * d), 1, f"{r}_rows") for r, a, b in rows)
        else:
            q, kk, v = (ops.linear(g, x, _qw(rng, h * d, k), None, f"{r}_proj") for r, h in zip("qkv", (hq, hkv, hkv)))
        pos = position_ids
        if case == "positions_after":  # made after the GEMM (when odd) or before it
            made = ops.add(g, position_ids, ops.constant(g, np.full((1,), 7, np.int32), "seven", np.int32), "pos_shift")
            pos = made if odd else position_ids
        qr, kr = ops.rope_plugin(g, ops.reshape(g, q, (0, hq, d), "q_heads"), ops.reshape(g, kk, (0, hkv, d), "k_heads"), pos, _spec(d))
        g.output(ops.concat(g, [qr, kr], 1, "qk"), "qk")
        g.output(v, "v")
        return net

    assert compile_net(build(True), SHAPES).stats["rope_fused"] == 0
    assert compile_net(build(False), SHAPES).stats["rope_fused"] == 1
