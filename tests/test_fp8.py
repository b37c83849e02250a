"""FP8 (E4M3) quantization (:mod:`trtcore.fp8`) against a float64 implementation written from
the OCP 8-bit floating point specification (OFP8 rev. 1.0): bit patterns decoded from the
field layout, rounding by nearest search over every finite value with ties to the even
mantissa, saturation at 448; and the FP8 linear in the network (``ops.fp8_linear``: the
plugin's NumPy reference and the Q/DQ layers on the reference backend; ``tensorrt_rtx`` builds
the Q/DQ variant)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from trtcore import fp8
from trtcore.errors import InvalidArgumentError


def spec_decode(bits: int) -> float:
    """E4M3 value of an 8-bit pattern (OCP OFP8: S.EEEE.MMM, bias 7, subnormals at E = 0,
    S.1111.111 is NaN, no infinities)."""
    s, e, m = bits >> 7, (bits >> 3) & 0xF, bits & 7
    if e == 0xF and m == 7:
        return float("nan")
    mag = (m / 8) * 2.0 ** (1 - 7) if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -mag if s else mag


SPEC_VALUES = np.array([spec_decode(b) for b in range(256)])
FINITE = [b for b in range(256) if not np.isnan(SPEC_VALUES[b])]


def spec_encode(x: float) -> int:
    """The E4M3 pattern nearest to ``x`` (saturated to +-448), ties to the even mantissa."""
    x = min(max(x, -448.0), 448.0)
    dist = [abs(SPEC_VALUES[b] - x) for b in FINITE]
    best = min(dist)
    ties = [b for b, d in zip(FINITE, dist) if d == best]
    if len(ties) > 1:  # a tie between two neighbours (or +0 / -0): the even mantissa, then the sign of x
        even = [b for b in ties if b & 1 == 0]
        ties = even if len(even) == 1 else [b for b in even if (b >> 7) == (x < 0 or (x == 0 and np.signbit(x)))] or even
    return ties[0]


def test_decoding_matches_the_spec() -> None:
    ours = fp8.from_e4m3(np.arange(256, dtype=np.uint8))
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(SPEC_VALUES))
    finite = ~np.isnan(SPEC_VALUES)
    np.testing.assert_array_equal(ours[finite], SPEC_VALUES[finite])
    assert SPEC_VALUES[0x7E] == fp8.E4M3_MAX == 448.0 and SPEC_VALUES[1] == 2.0**-9


def test_rounding_matches_the_spec_including_ties_and_saturation() -> None:
    rng = np.random.default_rng(0)
    pos = SPEC_VALUES[[b for b in FINITE if b < 0x80]]
    mids = (pos[:-1] + pos[1:]) / 2  # every tie between neighbours, exactly representable in float32
    x = np.concatenate([rng.normal(0, 30, 400), rng.normal(0, 0.01, 200), mids, -mids, [460.0, 500, -1e6, 464.0, 448, 0.0]]).astype(np.float32)
    got = fp8.to_e4m3(x)
    want = np.array([spec_encode(float(v)) for v in x], np.uint8)
    mismatch = np.flatnonzero(got != want)
    assert mismatch.size == 0, [(float(x[i]), int(got[i]), int(want[i])) for i in mismatch[:5]]


def test_quantize_weight_per_channel_and_per_tensor() -> None:
    rng = np.random.default_rng(1)
    w = rng.normal(0, 0.05, (24, 32)) * rng.uniform(0.1, 10, (24, 1))
    w[3] = 0.0  # an all-zero row gets scale 1
    for strategy in ("channel", "tensor"):
        fw = fp8.quantize_weight(w, strategy)
        amax = np.abs(w).max(axis=1) if strategy == "channel" else np.full(1, np.abs(w).max())
        scale = np.where(amax > 0, amax / 448, 1.0).astype(np.float32)
        np.testing.assert_array_equal(fw.weight_scale, scale)
        s = scale.astype(np.float64)[:, None]
        codes = np.array(
            [[spec_encode(float(np.float32(v) / np.float32(si))) for v in row] for row, si in zip(w, np.broadcast_to(s, (24, 1)).ravel())]
        )
        np.testing.assert_array_equal(fw.weight, codes)
        np.testing.assert_array_equal(fw.dequantize(), SPEC_VALUES[codes] * s)
        assert np.abs(fw.dequantize() - w).max() <= np.abs(w).max() / 16  # 3 mantissa bits


def test_quantize_weight_with_a_larger_amax() -> None:
    """A packed module's shared per-tensor scale: amax / 448 of the given amax, the codes the
    spec's rounding of w / that scale."""
    rng = np.random.default_rng(11)
    w = rng.normal(0, 0.05, (8, 16))
    big = float(np.abs(w).max()) * 3.7
    fw = fp8.quantize_weight(w, "tensor", amax=big)
    s = np.float32(big / 448)
    assert fw.weight_scale.tolist() == [s]
    want = np.array([[spec_encode(float(np.float32(v) / s)) for v in row] for row in w])
    np.testing.assert_array_equal(fw.weight, want)
    with pytest.raises(InvalidArgumentError, match="amax"):
        fp8.quantize_weight(w, "channel", amax=big)
    with pytest.raises(InvalidArgumentError, match="amax"):
        fp8.quantize_weight(w, "tensor", amax=big / 10)


def test_share_tensor_scale_requantizes_to_the_largest() -> None:
    """vLLM's requantize-with-max-scale: each part dequantized (spec values x its scale) and
    rounded again with the largest scale; the part that has it keeps its codes; the static
    input scale becomes the largest."""
    rng = np.random.default_rng(12)
    parts = [fp8.quantize_weight(rng.normal(0, sd, (n, 16)), "tensor", x) for sd, n, x in ((0.1, 8, 0.02), (0.4, 4, 0.03), (0.05, 4, 0.02))]
    got = fp8.share_tensor_scale(parts)
    s = max(float(p.weight_scale[0]) for p in parts)
    assert s == float(parts[1].weight_scale[0])
    for p, q in zip(parts, got):
        assert q.weight_scale.tolist() == [np.float32(s)] and q.input_scale.tolist() == [np.float32(0.03)]
        values = SPEC_VALUES[p.weight] * float(p.weight_scale[0])
        want = np.array([[spec_encode(float(np.float32(v) / np.float32(s))) for v in row] for row in values])
        np.testing.assert_array_equal(q.weight, want)
    np.testing.assert_array_equal(got[1].weight, parts[1].weight)
    assert np.abs(got[0].dequantize() - parts[0].dequantize()).max() <= s * 448 / 16


def test_an_all_zero_part_does_not_set_the_shared_scale() -> None:
    """An all-zero linear's scale is 1 (amax_scale of 0); the others keep theirs (largest of
    the non-zero parts) and the zero part's codes stay zero, -0 included."""
    rng = np.random.default_rng(14)
    q, k = (fp8.quantize_weight(rng.normal(0, sd, (8, 16)), "tensor") for sd in (0.002, 0.001))
    zero = fp8.quantize_weight(np.zeros((8, 16)), "tensor")
    zero.weight[0, :4] = 0x80  # negative zeros
    assert zero.weight_scale.tolist() == [1.0]
    got = fp8.share_tensor_scale([q, k, zero])
    assert [g.weight_scale.tolist() for g in got] == [q.weight_scale.tolist()] * 3
    np.testing.assert_array_equal(got[0].weight, q.weight)
    np.testing.assert_array_equal(got[2].weight, zero.weight)
    assert all(a is b for a, b in zip(fp8.share_tensor_scale([zero, zero]), [zero, zero]))


def test_share_tensor_scale_leaves_what_cannot_or_need_not_share() -> None:
    rng = np.random.default_rng(13)
    w = [rng.normal(0, sd, (16, 16)) for sd in (0.1, 0.3)]
    cases = [
        [fp8.quantize_weight(a, "channel", 0.02) for a in w],  # per channel: fuses as it is
        [fp8.quantize_weight(w[0], "tensor", 0.02), fp8.quantize_weight(w[1], "tensor", None)],  # static and dynamic
        [fp8.quantize_weight(w[0], "tensor", per_token=True), fp8.quantize_weight(w[1], "tensor")],  # per token and not
        [fp8.quantize_weight(a, "tensor", 0.02, amax=9.0) for a in w],  # one scale already
        [fp8.quantize_weight(w[0], "tensor", 0.02)],
    ]
    for parts in cases:
        assert all(a is b for a, b in zip(fp8.share_tensor_scale(parts), parts, strict=True))


def test_synthetic_per_tensor_fp8_weights_share_a_scale_per_packed_module() -> None:
    """The bench's random FP8 weights, per tensor: q/k/v one scale, gate/up one, each layer and
    o / down their own (so the build requantizes nothing and the engine fuses them)."""
    from trtcore.config import ModelConfig
    from trtcore.cuda.synthetic import RandomFp8Weights

    c = ModelConfig.from_dict(
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128}
    )  # fmt: skip
    w = RandomFp8Weights(c, "tensor")
    scale = {f"{i}.{m}.{p}": float(w.quantized(f"model.layers.{i}.{m}.{p}_proj.weight").weight_scale[0])
             for i in range(2) for m, ps in (("self_attn", "qkvo"), ("mlp", ("gate", "up", "down"))) for p in ps}  # fmt: skip
    for i in range(2):
        assert scale[f"{i}.self_attn.q"] == scale[f"{i}.self_attn.k"] == scale[f"{i}.self_attn.v"]
        assert scale[f"{i}.mlp.gate"] == scale[f"{i}.mlp.up"]
    assert len({scale[f"{i}.{m}"] for i in range(2) for m in ("self_attn.q", "self_attn.o", "mlp.gate", "mlp.down")}) == 8


def test_reference_linear_static_and_dynamic() -> None:
    rng = np.random.default_rng(2)
    w = rng.normal(0, 0.1, (16, 32))
    x = rng.normal(0, 2, (3, 5, 32)).astype(np.float32)
    for input_scale in (0.02, None):
        fw = fp8.quantize_weight(w, "channel", input_scale)
        s_x = np.float32(input_scale) if input_scale is not None else np.float32(np.abs(x).max() / 448)
        xq = np.array([spec_encode(float(v / s_x)) for v in x.ravel()]).reshape(x.shape)
        want = (SPEC_VALUES[xq] * float(s_x)) @ fw.dequantize().T
        np.testing.assert_allclose(fw.reference_linear(x), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weight": np.zeros((2, 4), np.float32), "weight_scale": np.ones(1, np.float32)}, "uint8"),
        ({"weight": np.zeros((2, 4), np.uint8), "weight_scale": np.ones(3, np.float32)}, r"\[1\] or \[2\]"),
        ({"weight": np.zeros((2, 4), np.uint8), "weight_scale": np.zeros(1, np.float32)}, "positive"),
        ({"weight": np.full((2, 4), 0x7F, np.uint8), "weight_scale": np.ones(1, np.float32)}, "NaN"),
        ({"weight": np.zeros((2, 4), np.uint8), "weight_scale": np.ones(1, np.float32), "input_scale": np.ones(2, np.float32)}, "input_scale"),
    ],
)
def test_bad_fp8_weight_is_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        fp8.Fp8Weight(**kwargs)


def test_bad_strategy_and_amax() -> None:
    with pytest.raises(InvalidArgumentError, match="strategy 'group'"):
        fp8.quantize_weight(np.ones((2, 2)), "group")
    with pytest.raises(InvalidArgumentError, match="amax"):
        fp8.amax_scale(-1.0)


# --- the FP8 linear in networks -----------------------------------------------------------------


def _run_linear(trt_name: str, fw: fp8.Fp8Weight, x: np.ndarray, impl: str, dtype: str = "float32") -> np.ndarray:
    from trtcore import ops
    from trtcore.dtypes import numpy_dtype
    from trtcore.reference.evaluator import evaluate
    from trtcore.trt import load_trt

    trt = load_trt(trt_name)
    network = trt.Builder(trt.Logger()).create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    g = ops.Graph(trt, network, dtype)
    xi = g.input("x", numpy_dtype(dtype), x.shape)
    y = ops.linear(g, xi, fw, None, "proj") if impl == "auto" else ops.fp8_linear(g, xi, fw, None, "proj", impl=impl)
    g.output(y, "y")
    return evaluate(network, {"x": x.astype(numpy_dtype(dtype))})["y"]


@pytest.mark.parametrize("impl", ["plugin", "qdq"])
@pytest.mark.parametrize(("strategy", "input_scale"), [("channel", 0.03), ("tensor", None), ("channel", None)])
def test_fp8_linear_on_the_reference_backend(impl: str, strategy: str, input_scale: float | None) -> None:
    rng = np.random.default_rng([3, len(impl), len(strategy)])
    w = rng.normal(0, 0.1, (32, 48)) * rng.uniform(0.2, 3, (32, 1))
    fw = fp8.quantize_weight(w, strategy, input_scale)
    x = rng.normal(0, 1.5, (2, 3, 48)).astype(np.float32)
    s_x = input_scale if input_scale is not None else float(np.float32(np.abs(x).max() / 448))
    xq = np.array([spec_encode(float(np.float32(v) / np.float32(s_x))) for v in x.ravel()]).reshape(x.shape)
    want = (SPEC_VALUES[xq] * np.float64(np.float32(s_x))) @ (SPEC_VALUES[fw.weight] * fw.weight_scale.astype(np.float64)[:, None]).T
    got = _run_linear("reference", fw, x, impl)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * np.abs(want).max())


def test_fp8_linear_bfloat16_rounds_once() -> None:
    rng = np.random.default_rng(4)
    fw = fp8.quantize_weight(rng.normal(0, 0.1, (16, 32)), "tensor", 0.01)
    x = rng.normal(0, 1, (4, 32)).astype(np.float32)
    import ml_dtypes

    xb = x.astype(ml_dtypes.bfloat16)
    got = _run_linear("reference", fw, x, "plugin", "bfloat16")
    want = fw.reference_linear(xb.astype(np.float32))
    np.testing.assert_array_equal(got, want.astype(ml_dtypes.bfloat16))
    qdq = _run_linear("reference", fw, x, "qdq", "bfloat16").astype(np.float64)
    np.testing.assert_allclose(qdq, want, rtol=2**-7, atol=2**-7 * np.abs(want).max())


@pytest.mark.parametrize("input_scale", [0.05, None])
@pytest.mark.parametrize("strategy", ["tensor", "channel"])
def test_tensorrt_rtx_builds_the_qdq_linear(strategy: str, input_scale: float | None) -> None:
    trt = pytest.importorskip("tensorrt_rtx")
    from trtcore import ops

    rng = np.random.default_rng(5)
    fw = fp8.quantize_weight(rng.normal(0, 0.1, (32, 64)), strategy, input_scale)
    network = trt.Builder(trt.Logger(trt.Logger.ERROR)).create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    g = ops.Graph(trt, network, "bfloat16")
    import ml_dtypes

    x = g.input("x", ml_dtypes.bfloat16, (-1, 64))
    g.output(ops.linear(g, x, fw, rng.normal(0, 1, 32).astype(np.float32), "proj"), "y")
    kinds = [str(network.get_layer(i).type).rsplit(".", 1)[-1] for i in range(network.num_layers)]
    assert kinds.count("QUANTIZE") == 1 and kinds.count("DEQUANTIZE") == 2
    builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
    cfg = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("x", (1, 64), (8, 64), (16, 64))
    cfg.add_optimization_profile(profile)
    cfg.num_compute_capabilities = 1
    cfg.set_compute_capability(trt.ComputeCapability.SM89, 0)
    plan = builder.build_serialized_network(network, cfg)
    assert plan is not None and plan.nbytes > 1000


def _qdq_net(trt: object, strategy: str, input_scale: float | None, per_token: bool = False) -> tuple[object, fp8.Fp8Weight]:
    import ml_dtypes

    from trtcore import ops

    fw = fp8.quantize_weight(np.random.default_rng(6).normal(0, 0.1, (40, 64)), strategy, input_scale, per_token)
    network = trt.Builder(trt.Logger()).create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))  # type: ignore[attr-defined]
    g = ops.Graph(trt, network, "bfloat16")
    x = g.input("x", ml_dtypes.bfloat16, (-1, 64))
    g.output(ops.fp8_linear(g, x, fw, None, "proj", impl="qdq"), "y")
    return network, fw


def _qdq_plan(strategy: str, input_scale: float | None, opt: int, most: int) -> object:
    """:func:`_qdq_net` compiled by the cuda backend's builder (no GPU) for 1 .. ``most`` rows of x."""
    import trtcore.cuda as tc
    from trtcore.cuda.builder import compile_network

    net, _ = _qdq_net(tc, strategy, input_scale)
    b = tc.Builder(tc.Logger(tc.Logger.ERROR))
    cfg = b.create_builder_config()
    prof = b.create_optimization_profile()
    prof.set_shape("x", (1, 64), (opt, 64), (most, 64))
    cfg.add_optimization_profile(prof)
    return compile_network(net, cfg, None, arch=None)


def test_cuda_backend_compiles_the_qdq_linear_with_e4m3_rounding() -> None:
    """On the cuda backend the Q/DQ emulation's cast to FP8 rounds to E4M3 inside the fused
    kernel (``rnd_e4m3``: nearest even, NaN past 464 as the reference's cast), and every generated
    kernel compiles with NVRTC for sm_80, sm_89 and sm_90 (no GPU needed)."""
    from trtcore.cuda import codegen

    plan = _qdq_plan("channel", None, opt=4, most=16)
    body = [ks.source.split("float rnd_e4m3(float v)", 1)[1] for ks in plan.sources.values()]
    assert any("rnd_e4m3(" in s for s in body)
    for ks in plan.sources.values():
        for arch in ("sm_80", "sm_89", "sm_90"):
            assert ks.function in codegen.compile_source(ks, arch).symbols


def test_the_cuda_backend_runs_the_fp8_plugin_by_default() -> None:
    """On the cuda backend an FP8 linear is the cuBLASLt plugin when K and N suit it (the
    H200 check of the fixes: tests/cuda/test_fp8_gemm_gpu.py, bench/fp8_probe.py)."""
    import ml_dtypes

    import trtcore.cuda as tc
    from trtcore import ops

    fw = fp8.quantize_weight(np.random.default_rng(7).normal(0, 0.1, (32, 64)), "tensor", None)
    network = tc.Builder(tc.Logger()).create_network(1 << int(tc.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    g = ops.Graph(tc, network, "bfloat16")
    x = g.input("x", ml_dtypes.bfloat16, (-1, 64))
    ops.fp8_linear(g, x, fw, None, "proj")
    kinds = [type(network.get_layer(i)).__name__ for i in range(network.num_layers)]
    assert any("Plugin" in kind for kind in kinds), kinds


def test_plugin_needs_multiples_of_16_and_ops_fall_back_to_qdq() -> None:
    from trtcore import ops
    from trtcore.plugins.base import PluginError
    from trtcore.plugins.fp8_gemm import Fp8GemmPlugin
    from trtcore.trt import load_trt

    with pytest.raises(PluginError, match="in_features must be a positive multiple of 16"):
        Fp8GemmPlugin(40, 32)
    with pytest.raises(PluginError, match="out_features must be a positive multiple of 16"):
        Fp8GemmPlugin(32, 40)
    trt = load_trt("reference")
    for n, kind in ((32, "Fp8GemmPlugin"), (40, None)):
        network = trt.Builder(trt.Logger()).create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        g = ops.Graph(trt, network, "float32")
        fw = fp8.quantize_weight(np.ones((n, 32)), "tensor")
        ops.linear(g, g.input("x", np.float32, (-1, 32)), fw, None, "proj")
        plugins = [type(network.get_layer(i).plugin).__name__ for i in range(network.num_layers) if hasattr(network.get_layer(i), "plugin")]
        assert plugins == ([kind] if kind else [])


def test_the_cuda_backend_warns_once_where_fp8_linears_fall_back_to_qdq(caplog: pytest.LogCaptureFixture) -> None:
    """K or N not a multiple of 16 on the cuda backend: the Q/DQ form (a float32 matmul) runs
    instead of cuBLASLt's FP8 GEMM, and the build says so once per network."""
    import logging

    from trtcore import ops
    from trtcore.trt import load_trt

    trt = load_trt("cuda")
    network = trt.Builder(trt.Logger()).create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    g = ops.Graph(trt, network, "float32")
    x = g.input("x", np.float32, (-1, 40))
    with caplog.at_level(logging.WARNING, logger="trtcore.ops"):
        for name in ("a", "b"):
            ops.linear(g, x, fp8.quantize_weight(np.ones((32, 40)), "tensor"), None, name)
        ops.linear(g, g.input("y", np.float32, (-1, 32)), fp8.quantize_weight(np.ones((32, 32)), "tensor"), None, "c")
    warned = [r.getMessage() for r in caplog.records if "multiples of 16" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("a: FP8 weight [32, 40]"), warned


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90"])
def test_fp8_gemm_kernels_compile(arch: str) -> None:
    """kernels/fp8_gemm.cu (the quantize kernel writes cuBLASLt's device alpha and beta) compiles
    with NVRTC in every variant."""
    from trtcore import kernels

    for v in kernels.variants("fp8_gemm"):
        c = kernels.compile_kernel("fp8_gemm", defines=v, arch=arch)
        assert kernels.cubin_arch(c.cubin) == arch
        assert set(c.symbols) == {
            "trtcore_fp8_zero",
            "trtcore_fp8_amax",
            "trtcore_fp8_quantize",
            "trtcore_fp8_scale_rows",
            "trtcore_fp8_quantize_tokens",
            "trtcore_fp8_scale_tokens",
        }


@pytest.mark.parametrize(("per_channel", "static"), [(False, True), (True, False)])
def test_fp8_plugin_hands_cublaslt_the_kernels_device_alpha(monkeypatch: pytest.MonkeyPatch, per_channel: bool, static: bool) -> None:
    """The enqueue sequence without a GPU: the quantize kernel gets every parameter its source
    declares, with the weight's per-tensor scale (per-channel: null, alpha = s_x) and the
    alpha / beta scratch of the plugin's workspace; cuBLASLt's FP8 matmul gets those same two
    device addresses (no scale pointers), into the output or (per-channel) the float32 buffer."""
    import re
    from pathlib import Path

    from trtcore.plugins import fp8_gemm
    from trtcore.plugins.base import DeviceTensor

    launches, matmuls = [], []
    monkeypatch.setattr(fp8_gemm, "_launch", lambda defines, name, grid, block, args, stream: launches.append((name, args)))
    monkeypatch.setattr(fp8_gemm, "_matmul", lambda: type("Mm", (), {"run": lambda self, *a: matmuls.append(a)})())
    m, n, k = 5, 32, 64
    plugin = fp8_gemm.Fp8GemmPlugin(k, n, per_channel, static)
    f32 = np.dtype(np.float32)
    inputs = [
        DeviceTensor(0x10000, (m, k), f32),
        DeviceTensor(0x20000, (n, k), np.dtype(np.uint8)),
        DeviceTensor(0x30000, (n if per_channel else 1,), f32),
    ]
    inputs += [DeviceTensor(0x40000, (1,), f32)] if static else []
    ws = 0x100000
    plugin.enqueue(inputs, [DeviceTensor(0x50000, (m, n), f32)], ws, 7)

    source = (Path(fp8_gemm.__file__).resolve().parents[1] / "kernels" / "fp8_gemm.cu").read_text()
    [params] = re.findall(r"void trtcore_fp8_quantize\(([^)]*)\)", source)
    names = [p.split()[-1].lstrip("*") for p in params.split(",")]
    [(_, args)] = [a for a in launches if a[0] == "trtcore_fp8_quantize"]
    assert len(args) == len(names), (names, args)
    got = dict(zip(names, (value for value, _ in args)))
    assert got["w_scale"] == (0 if per_channel else 0x30000)
    assert got["static_scale"] == (0x40000 if static else 0)
    [call] = matmuls
    mm_m, mm_n, mm_k, w, xq, alpha, beta, d, out_type = call[:9]
    assert (mm_m, mm_n, mm_k, w, xq) == (m, n, k, 0x20000, got["q"])
    assert alpha == got["alpha_out"] and beta == alpha + 4 and ws <= alpha < ws + 256, "the kernel's alpha and beta, in the plugin's scalars"
    assert alpha % 4 == 0 and got["scale_out"] != alpha
    assert (d == 0x50000) != per_channel and out_type == 0
    assert [a[0] for a in launches][-1] == ("trtcore_fp8_scale_rows" if per_channel else "trtcore_fp8_quantize")


# --- per-token dynamic activations (compressed-tensors strategy "token", dynamic: true) ---------


def per_token_oracle(x: np.ndarray, codes: np.ndarray, w_scale: np.ndarray) -> np.ndarray:
    """float64 ``[..., N]`` written from the per-token formula (vLLM / compressed-tensors): for
    each row ``m`` of x, ``s[m] = float32(max|x[m, :]| / 448)`` (1 for an all-zero row),
    ``q = e4m3(float32(x[m]) / s[m])`` (:func:`spec_encode`), ``y[m, n] = s[m] * s_w[n] *
    sum_k q[m, k] * w[n, k]``."""
    k = x.shape[-1]
    rows = np.asarray(x, np.float32).reshape(-1, k)
    w = SPEC_VALUES[codes] * np.broadcast_to(np.asarray(w_scale, np.float64).reshape(-1, 1), (codes.shape[0], 1))
    out = np.empty((rows.shape[0], codes.shape[0]))
    for m, row in enumerate(rows):
        amax = max(abs(float(v)) for v in row)
        s = np.float32(amax / 448.0) if amax > 0 else np.float32(1.0)
        q = np.array([SPEC_VALUES[spec_encode(float(np.float32(v) / s))] for v in row])
        out[m] = float(s) * (w @ q)
    return out.reshape(*x.shape[:-1], codes.shape[0])


def _rows_of_different_magnitudes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    rows = int(np.prod(shape[:-1]))
    magnitudes = 10.0 ** rng.permutation(np.linspace(-4, 2, rows))  # row sizes 1e-4 .. 1e2
    x = rng.normal(0, 1, shape) * magnitudes.reshape(shape[:-1] + (1,))
    x.reshape(-1, shape[-1])[1] = 0.0  # an all-zero row (scale 1)
    return x.astype(np.float32)


@pytest.mark.parametrize("strategy", ["tensor", "channel"])
def test_per_token_reference_equals_the_formula(strategy: str) -> None:
    rng = np.random.default_rng([12, len(strategy)])
    fw = fp8.quantize_weight(rng.normal(0, 0.1, (24, 40)) * rng.uniform(0.2, 3, (24, 1)), strategy, per_token=True)
    x = _rows_of_different_magnitudes(rng, (2, 3, 40))
    want = per_token_oracle(x, fw.weight, fw.weight_scale)
    got = fw.reference_linear(x)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
    np.testing.assert_array_equal(fw.activation_scale(x)[..., 0] == 1.0, np.abs(x).max(axis=-1) == 0)
    # one scale for the whole x loses the small rows: per tensor differs measurably
    per_tensor = fp8.Fp8Weight(fw.weight, fw.weight_scale).reference_linear(x)
    rows = np.abs(want).max(axis=-1, keepdims=True)
    err = np.abs(per_tensor - want) / np.where(rows > 0, rows, 1)
    assert err.max() > 0.5, err.max()
    # a row's result does not depend on the other rows
    np.testing.assert_allclose(fw.reference_linear(x[:1, :1]), got[:1, :1], rtol=1e-12)


@pytest.mark.parametrize("impl", ["plugin", "qdq"])
@pytest.mark.parametrize("strategy", ["tensor", "channel"])
def test_per_token_fp8_linear_on_the_reference_backend(impl: str, strategy: str) -> None:
    rng = np.random.default_rng([13, len(impl), len(strategy)])
    fw = fp8.quantize_weight(rng.normal(0, 0.1, (32, 48)), strategy, per_token=True)
    x = _rows_of_different_magnitudes(rng, (2, 3, 48))
    want = per_token_oracle(x, fw.weight, fw.weight_scale)
    got = _run_linear("reference", fw, x, impl)
    rows = np.abs(want).max(axis=-1, keepdims=True)
    err = np.abs(got - want) / np.where(rows > 0, rows, 1)  # float32 network: relative to each row's size
    assert err.max() < 2e-6, err.max()


def test_per_token_needs_dynamic_scales() -> None:
    from trtcore.plugins.base import PluginError
    from trtcore.plugins.fp8_gemm import Fp8GemmPlugin

    with pytest.raises(InvalidArgumentError, match="per_token activation scales are dynamic"):
        fp8.quantize_weight(np.ones((2, 2)), "tensor", 0.1, per_token=True)
    with pytest.raises(PluginError, match="per_token activation scales are dynamic"):
        Fp8GemmPlugin(32, 32, False, True, True)
    plugin, consts = Fp8GemmPlugin.from_fp8(fp8.quantize_weight(np.ones((32, 32)), "channel", per_token=True))
    assert plugin.per_token and not plugin.static_input and len(consts) == 2
    assert "per_token" in dict((n, d) for n, _, d in plugin.field_values())
    assert "per_token" not in dict((n, d) for n, _, d in Fp8GemmPlugin(32, 32).field_values())  # older engines' fields unchanged


def test_tensorrt_qdq_refuses_per_token() -> None:
    """TensorRT's quantize layer takes no per-row scale computed in the network: ``impl="qdq"``
    (TensorRT's default) refuses a per-token weight with a clear error."""
    trt = pytest.importorskip("tensorrt_rtx")
    from trtcore import ops

    fw = fp8.quantize_weight(np.random.default_rng(14).normal(0, 0.1, (32, 64)), "channel", per_token=True)
    for impl in ("qdq", None):
        network = trt.Builder(trt.Logger(trt.Logger.ERROR)).create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        g = ops.Graph(trt, network, "float32")
        x = g.input("x", np.float32, (-1, 64))
        with pytest.raises(InvalidArgumentError, match="per-token dynamic activations are not built with TensorRT's quantize"):
            ops.fp8_linear(g, x, fw, None, "proj", impl=impl)
        assert network.num_layers == 0


def test_per_token_plugin_enqueue_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-token enqueue sequence: ``trtcore_fp8_quantize_tokens`` on one block per row gets
    every parameter its source declares; cuBLASLt's FP8 matmul writes float32 (type 0) into
    the workspace with the kernel's alpha / beta; ``trtcore_fp8_scale_tokens`` reads that
    buffer and the row scales; the workspace regions do not overlap and fit its size."""
    import re
    from pathlib import Path

    from trtcore.plugins import fp8_gemm
    from trtcore.plugins.base import DeviceTensor

    source = (Path(fp8_gemm.__file__).resolve().parents[1] / "kernels" / "fp8_gemm.cu").read_text()

    def params(kernel: str) -> list[str]:
        [p] = re.findall(rf"void {kernel}\(([^)]*)\)", source)
        return [a.split()[-1].lstrip("*") for a in p.split(",")]

    for per_channel in (False, True):
        launches, matmuls = [], []
        monkeypatch.setattr(fp8_gemm, "_launch", lambda defines, name, grid, block, args, stream: launches.append((name, grid, args)))
        monkeypatch.setattr(fp8_gemm, "_matmul", lambda: type("Mm", (), {"run": lambda self, *a: matmuls.append(a)})())
        m, n, k = 5, 48, 64
        plugin = fp8_gemm.Fp8GemmPlugin(k, n, per_channel, False, True)
        f32 = np.dtype(np.float32)
        inputs = [
            DeviceTensor(0x10000, (m, k), f32),
            DeviceTensor(0x20000, (n, k), np.dtype(np.uint8)),
            DeviceTensor(0x30000, (n if per_channel else 1,), f32),
        ]
        ws = 0x100000
        size = plugin.workspace_size([((m, k), f32)], [((m, n), f32)])
        plugin.enqueue(inputs, [DeviceTensor(0x50000, (m, n), f32)], ws, 7)
        assert [a[0] for a in launches] == ["trtcore_fp8_quantize_tokens", "trtcore_fp8_scale_tokens"]
        (_, grid, qargs), (_, _, sargs) = launches
        assert grid == (m,)
        q = dict(zip(params("trtcore_fp8_quantize_tokens"), (v for v, _ in qargs), strict=True))
        s = dict(zip(params("trtcore_fp8_scale_tokens"), (v for v, _ in sargs), strict=True))
        assert (q["x"], q["k"]) == (0x10000, k)
        [call] = matmuls
        mm_m, mm_n, mm_k, w, xq, alpha, beta, d, out_type, lt, lt_size = call[:11]
        assert (mm_m, mm_n, mm_k, w, xq, out_type) == (m, n, k, 0x20000, q["q"], 0)
        assert alpha == q["alpha_out"] and beta == alpha + 4 and ws <= alpha < ws + 256
        assert s["d"] == d and s["row_scale"] == q["row_scale"] and s["w_scale"] == 0x30000 and s["per_channel"] == int(per_channel)
        assert (s["total"], s["n"], s["out"]) == (m * n, n, 0x50000)
        regions = sorted([(q["q"], m * k), (d, m * n * 4), (q["row_scale"], m * 4), (lt, lt_size)])
        assert regions[0][0] >= ws + 256 and all(a + sz <= b for (a, sz), (b, _) in zip(regions, regions[1:]))
        assert regions[-1][0] + regions[-1][1] <= ws + size


def test_cuda_backend_compiles_the_per_token_qdq_linear() -> None:
    """The cuda engine's Q/DQ emulation of a per-token linear (max over the last axis): every
    generated kernel compiles with NVRTC for sm_89 and sm_90 (no GPU needed)."""
    import trtcore.cuda as tc
    from trtcore.cuda import codegen
    from trtcore.cuda.builder import compile_network

    net, _ = _qdq_net(tc, "channel", None, per_token=True)
    b = tc.Builder(tc.Logger(tc.Logger.ERROR))
    cfg = b.create_builder_config()
    prof = b.create_optimization_profile()
    prof.set_shape("x", (1, 64), (4, 64), (16, 64))
    cfg.add_optimization_profile(prof)
    plan = compile_network(net, cfg, None, arch=None)
    assert any("rnd_e4m3(" in ks.source for ks in plan.sources.values())
    for ks in plan.sources.values():
        for arch in ("sm_89", "sm_90"):
            assert ks.function in codegen.compile_source(ks, arch).symbols


# --- prequantized x (the cuda engine's trtcore.cuda.fp8_input_fusion) --------------------------


@pytest.mark.parametrize("strategy", ["tensor", "channel"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_prequantized_plugin_reads_the_codes_its_own_quantization_makes(strategy: str, dtype: str) -> None:
    """A prequantized plugin given the E4M3 codes of x (``e4m3(clip(float32(x) / s_x, -448,
    448))``, encoded here by the spec's nearest-even search, :func:`spec_encode`) and its
    ``[alpha, 0]`` returns exactly what the plugin that quantizes x itself returns, in x's
    dtype; alpha is the float32 product ``s_x * s_w`` per tensor and ``s_x`` per channel."""
    from trtcore.dtypes import lookup
    from trtcore.plugins.fp8_gemm import Fp8GemmPlugin

    rng = np.random.default_rng(zlib.crc32(repr((strategy, dtype)).encode()))
    s_x = 0.013
    fw = fp8.quantize_weight(rng.normal(0, 1, (16, 32)), strategy, input_scale=s_x)
    plugin, consts = Fp8GemmPlugin.from_fp8(fw)
    x = (rng.normal(0, 1, (3, 32)) * np.array([[0.1], [1.0], [20.0]])).astype(lookup(dtype).numpy)  # the last row clips at 448
    codes = np.array([spec_encode(float(np.float32(v) / np.float32(s_x))) for v in np.asarray(x, np.float32).ravel()], np.uint8).reshape(x.shape)
    assert (codes & 0x7F == 0x7E).any()  # some saturate
    pq = plugin.prequantized_for(x.dtype)
    ab = pq.alpha_beta(consts)
    s_w = np.asarray(consts[1], np.float32).reshape(-1)
    assert ab.dtype == np.float32 and ab[1] == 0
    assert ab[0] == (np.float32(s_x) if strategy == "channel" else np.float32(np.float32(s_x) * s_w[0]))
    got = pq.reference(codes, *consts, ab)[0]
    want = plugin.reference(x, *consts)[0]
    assert got.dtype == x.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))
    assert pq.output_dtypes([np.dtype(np.uint8)] + [np.dtype(np.uint8)] + [np.dtype(np.float32)] * 3) == [x.dtype]
    assert pq.supports(0, [np.dtype(np.uint8)], 5) and not pq.supports(0, [x.dtype], 5)


def test_prequantized_plugin_fields_and_refusals() -> None:
    """The prequantized form round-trips through its fields (older engines' fields unchanged
    without it), needs a static input scale, and only a static-scale plugin that quantizes x
    itself offers it (the compile pass's hook answers None otherwise)."""
    from trtcore.plugins.base import PluginError
    from trtcore.plugins.fp8_gemm import Fp8GemmPlugin

    plain = Fp8GemmPlugin(32, 16)
    assert not {"prequantized", "out_dtype"} & {n for n, _, _ in plain.field_values()}
    pq = plain.prequantized_for(np.dtype(np.float16))
    assert pq.num_inputs == 5 and pq.out_dtype == 1
    again = Fp8GemmPlugin.from_field_data({n: d for n, _, d in pq.field_values()})
    assert again == pq
    with pytest.raises(PluginError, match="static input scale"):
        Fp8GemmPlugin(32, 16, static_input=False, prequantized=True, out_dtype=2)
    with pytest.raises(PluginError, match="out_dtype"):
        Fp8GemmPlugin(32, 16, prequantized=True, out_dtype=7)
    for p in (Fp8GemmPlugin(32, 16, static_input=False), Fp8GemmPlugin(32, 16, False, False, True), pq):
        assert p.static_fp8_input_scale([np.zeros((16, 32), np.uint8), np.ones(1, np.float32), np.ones(1, np.float32)]) is None
        with pytest.raises(PluginError, match="prequantized_for"):
            p.prequantized_for(np.dtype(np.float16))
    with pytest.raises(PluginError, match="out_dtype"):
        plain.prequantized_for(np.dtype(np.int32))


def test_prequantized_plugin_enqueue_runs_only_the_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a GPU: a prequantized plugin launches no quantize kernel; cuBLASLt's FP8 matmul
    reads x's codes in place and alpha / beta from input 4; per channel the epilogue follows."""
    from trtcore.plugins import fp8_gemm
    from trtcore.plugins.base import DeviceTensor

    for per_channel in (False, True):
        launches, matmuls = [], []
        monkeypatch.setattr(fp8_gemm, "_launch", lambda defines, name, grid, block, args, stream: launches.append((name, defines)))
        monkeypatch.setattr(fp8_gemm, "_matmul", lambda: type("Mm", (), {"run": lambda self, *a: matmuls.append(a)})())
        m, n, k = 5, 32, 64
        plugin = fp8_gemm.Fp8GemmPlugin(k, n, per_channel).prequantized_for(np.dtype(np.float16))
        f32 = np.dtype(np.float32)
        inputs = [
            DeviceTensor(0x10000, (m, k), np.dtype(np.uint8)),
            DeviceTensor(0x20000, (n, k), np.dtype(np.uint8)),
            DeviceTensor(0x30000, (n if per_channel else 1,), f32),
            DeviceTensor(0x40000, (1,), f32),
            DeviceTensor(0x60000, (2,), f32),
        ]
        plugin.enqueue(inputs, [DeviceTensor(0x50000, (m, n), np.dtype(np.float16))], 0x100000, 7)
        [call] = matmuls
        assert call[:8] == (m, n, k, 0x20000, 0x10000, 0x60000, 0x60004, call[7]) and (call[7] == 0x50000) != per_channel
        assert call[8] == (0 if per_channel else 2)  # float32 buffer, or CUDA_R_16F straight into the output
        assert [name for name, _ in launches] == (["trtcore_fp8_scale_rows"] if per_channel else [])
        assert all(dict(d)["DTYPE"] == 1 for _, d in launches)  # the output's dtype
