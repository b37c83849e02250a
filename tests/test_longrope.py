"""LongRoPE scaling (``rope_type: longrope``; Phi-3 / Phi-3.5): :func:`trtcore.rope.rope_spec`,
the RoPE plugin's reference and (marker ``gpu``) its CUDA kernel.

* the frequencies and the attention factor against transformers' ``_compute_longrope_parameters``
  (``factor`` from ``max_position_embeddings / original_max_position_embeddings`` or given,
  ``attention_factor`` given or derived, partial rotary), and the choice of the short or long set
  against ``Phi3RotaryEmbedding``'s own forward (``dynamic_rope_update``) at lengths on both sides
  of ``original_max_position_embeddings``;
* the plugin's float64 reference against the formula written here in float64 NumPy
  (``inv_freq[i] = 1 / (ext[i] * base ** (2i / d))``, ``ext`` the long factors for a token whose
  sequence is longer than ``original_max_position_embeddings``, cos/sin times the attention
  factor, ``rotate_half``), on packed tokens of sequences on both sides;
* the plugin's fields (serialized, and an engine's field collection from before the longrope
  fields still loads), its validation, and LongRoPE fused into the paged attention plugin by
  the ops (dynamic NTK is not);
* GPU: the kernel against the float32 reference (``trtcore.testing.check_plugin``).
"""

from __future__ import annotations

import math
import os
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from trtcore import reference as ref
from trtcore.config import ModelConfig
from trtcore.errors import ConfigError
from trtcore.plugins import base
from trtcore.plugins.base import PluginError
from trtcore.plugins.rope import RopePlugin
from trtcore.rope import longrope_uses_long, rope_spec
from trtcore.testing import gpu_status

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.phi3 import modeling_phi3  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
HIDDEN, HEADS = 192, 2  # head_dim 96, Phi-3 mini's


def factors(rng: np.random.Generator, n: int, lo: float, hi: float) -> list[float]:
    return sorted(float(x) for x in rng.uniform(lo, hi, n))


def phi3_dict(rope: dict[str, Any] | None, *, max_pos: int = 4096, original: int = 512, partial: float = 1.0, theta: float = 10000.0) -> dict[str, Any]:
    """A Phi-3 config.json dict with the RoPE fields under test."""
    return {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 64, "hidden_size": HIDDEN, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": HEADS, "num_key_value_heads": 1, "max_position_embeddings": max_pos,
        "original_max_position_embeddings": original, "rope_theta": theta, "partial_rotary_factor": partial, "rope_scaling": rope,
    }


def hf_config(d: dict[str, Any]) -> Any:
    kwargs = {k: v for k, v in d.items() if k not in ("architectures", "model_type")}
    return transformers.Phi3Config(**kwargs)


RNG = np.random.default_rng(2024)
#: name -> config.json dict
CASES: dict[str, dict[str, Any]] = {
    # factor = 4096 / 512 = 8 -> attention factor sqrt(1 + ln 8 / ln 512)
    "ratio": phi3_dict({"type": "longrope", "short_factor": factors(RNG, 48, 1.0, 1.2), "long_factor": factors(RNG, 48, 1.0, 12.0)}),
    "factor_given": phi3_dict({"rope_type": "longrope", "factor": 2.5, "short_factor": factors(RNG, 48, 1.0, 1.1),
                               "long_factor": factors(RNG, 48, 1.0, 4.0)}, theta=500000.0),
    "attention_factor_given": phi3_dict({"rope_type": "longrope", "attention_factor": 1.17, "short_factor": factors(RNG, 48, 1.0, 1.1),
                                         "long_factor": factors(RNG, 48, 1.0, 4.0)}),
    "partial0.5": phi3_dict({"type": "longrope", "short_factor": factors(RNG, 24, 1.0, 1.3), "long_factor": factors(RNG, 24, 2.0, 6.0)},
                            partial=0.5),
    "yarn_alias": phi3_dict({"type": "yarn", "short_factor": factors(RNG, 48, 1.0, 1.2), "long_factor": factors(RNG, 48, 1.0, 8.0)}),
    "no_extension": phi3_dict({"type": "longrope", "short_factor": factors(RNG, 48, 1.0, 1.2), "long_factor": factors(RNG, 48, 1.0, 8.0)},
                              max_pos=512),  # factor 1: attention factor 1
}


def spec_of(case: str) -> Any:
    return rope_spec(ModelConfig.from_dict(CASES[case]))


# --------------------------------------------------------------------------------------------
# the frequencies and the attention factor against transformers


@pytest.mark.parametrize("case", list(CASES))
def test_spec_matches_transformers(case: str) -> None:
    cfg = hf_config(CASES[case])
    assert cfg.rope_parameters["rope_type"] == "longrope"
    short, att = ROPE_INIT_FUNCTIONS["longrope"](cfg, "cpu")
    long, att_long = ROPE_INIT_FUNCTIONS["longrope"](cfg, "cpu", seq_len=cfg.rope_parameters["original_max_position_embeddings"] + 1)
    spec = spec_of(case)
    assert spec.rope_type == "longrope" and spec.per_sequence
    assert spec.original_max_position_embeddings == cfg.rope_parameters["original_max_position_embeddings"] == 512
    assert spec.rotary_dim == int(96 * CASES[case]["partial_rotary_factor"])
    # transformers computes in float32 (base ** x, a product, a quotient): within a few float32
    # ulps of the float64 values
    np.testing.assert_allclose(spec.inv_freq, short.numpy(), rtol=1e-6)
    np.testing.assert_allclose(spec.long_inv_freq, long.numpy(), rtol=1e-6)
    assert spec.attention_scaling == pytest.approx(att, rel=1e-12) and att == att_long
    assert np.abs(spec.long_inv_freq - spec.inv_freq).max() > 0  # the two sets differ


def test_attention_factor_formula() -> None:
    """LongRoPE's attention factor, from the paper's formula: sqrt(1 + ln s / ln L)."""
    assert spec_of("ratio").attention_scaling == pytest.approx(math.sqrt(1 + math.log(8) / math.log(512)), rel=1e-15)
    assert spec_of("factor_given").attention_scaling == pytest.approx(math.sqrt(1 + math.log(2.5) / math.log(512)), rel=1e-15)
    assert spec_of("attention_factor_given").attention_scaling == 1.17
    assert spec_of("no_extension").attention_scaling == 1.0


@pytest.mark.parametrize("case", ["ratio", "partial0.5"])
def test_short_or_long_as_phi3_rotary_embedding_chooses(case: str) -> None:
    """One forward of ``Phi3RotaryEmbedding`` over positions ``0..n-1`` (transformers'
    ``dynamic_rope_update``) uses the short factors for ``n <= 512`` and the long ones beyond;
    the plugin's per-token frequencies (``seq_lens = n``) and cos/sin are the same."""
    cfg = hf_config(CASES[case])
    rotary = modeling_phi3.Phi3RotaryEmbedding(cfg)
    spec = spec_of(case)
    plugin = RopePlugin.from_spec(spec)
    inv = RopePlugin.inv_freq_of(spec)
    for n, is_long in ((1, False), (511, False), (512, False), (513, True), (700, True), (300, False)):
        pos = torch.arange(n)[None]
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), pos)
        assert bool(longrope_uses_long(n, 512)) == is_long
        want = (spec.long_inv_freq if is_long else spec.inv_freq).astype(np.float32)
        seq = np.full(n, n, np.int32)
        got = plugin.frequencies(inv, seq)
        np.testing.assert_array_equal(got, np.broadcast_to(want, got.shape))
        np.testing.assert_allclose(rotary.inv_freq.numpy(), want, rtol=1e-6)
        ours_cos, ours_sin = plugin.cos_sin(pos[0].numpy().astype(np.int32), inv, seq)
        half = spec.rotary_dim // 2
        # transformers' float32 inv_freq is within 1e-6 relative of ours (rounded once from
        # float64): angles within position * 1e-6; the other set would be O(1) off
        atol = (2e-6 + n * 1e-6) * spec.attention_scaling
        np.testing.assert_allclose(ours_cos, cos[0, :, :half].numpy(), rtol=0, atol=atol)
        np.testing.assert_allclose(ours_sin, sin[0, :, :half].numpy(), rtol=0, atol=atol)


# --------------------------------------------------------------------------------------------
# the plugin's reference against the formula in float64


def longrope_formula(q: np.ndarray, pos: np.ndarray, seq_lens: np.ndarray, d: dict[str, Any], head_dim: int) -> np.ndarray:
    """LongRoPE by the formula, float64, neox pairing, on ``q [T, heads, head_dim]``."""
    p, prf = d["rope_scaling"], d["partial_rotary_factor"]
    dim = int(head_dim * prf)
    original = d["original_max_position_embeddings"]
    factor = p.get("factor", d["max_position_embeddings"] / original)
    att = p.get("attention_factor", math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0)
    out = q.astype(np.float64).copy()
    for t in range(q.shape[0]):
        ext = np.asarray(p["long_factor"] if seq_lens[t] > original else p["short_factor"], np.float64)
        inv = 1.0 / (ext * d["rope_theta"] ** (np.arange(0, dim, 2) / dim))
        ang = np.concatenate([pos[t] * inv, pos[t] * inv])
        x = q[t, :, :dim].astype(np.float64)
        rot_half = np.concatenate([-x[:, dim // 2 :], x[:, : dim // 2]], axis=-1)
        out[t, :, :dim] = x * np.cos(ang) * att + rot_half * np.sin(ang) * att
    return out


@pytest.mark.parametrize("case", ["ratio", "partial0.5", "attention_factor_given"])
def test_reference_float64_matches_formula(case: str) -> None:
    rng = np.random.default_rng()
    spec = spec_of(case)
    plugin = RopePlugin.from_spec(spec)
    lengths = [300, 700, 512, 513]  # packed sequences, both sides of 512 and its edges
    pos = np.concatenate([np.arange(n - 5, n) for n in lengths]).astype(np.int32)  # each sequence's last 5 tokens
    seq = np.repeat(lengths, 5).astype(np.int32)
    q, k = rng.standard_normal((pos.size, 3, 96)), rng.standard_normal((pos.size, 1, 96))
    oq, ok = plugin.reference(q, k, pos, RopePlugin.inv_freq_of(spec).astype(np.float64), seq)
    # the frequencies travel as float32 (the plugin's input): float64 mode evaluates the
    # float32 inv_freq, so compare at the float32 rounding of inv_freq times the angle
    tol = 4 * 2.0**-24 * float(pos.max())
    np.testing.assert_allclose(oq, longrope_formula(q, pos, seq, CASES[case], 96), rtol=0, atol=tol)
    np.testing.assert_allclose(ok, longrope_formula(k, pos, seq, CASES[case], 96), rtol=0, atol=tol)


def test_the_threshold_matters() -> None:
    """Tokens of a 512-token and a 513-token sequence at the same position rotate differently."""
    spec = spec_of("ratio")
    plugin = RopePlugin.from_spec(spec)
    q = np.random.default_rng(3).standard_normal((2, 1, 96)).repeat(1, 0)
    q[1] = q[0]
    oq, _ = plugin.reference(q, q, np.array([400, 400], np.int32), RopePlugin.inv_freq_of(spec), np.array([512, 513], np.int32))
    assert np.abs(oq[0] - oq[1]).max() > 0.1


# --------------------------------------------------------------------------------------------
# fields, validation, the ops' rules


def test_fields_round_trip_and_old_collections_load() -> None:
    plugin = RopePlugin.from_spec(spec_of("ratio"))
    assert plugin.longrope and plugin.original_max_position_embeddings == 512 and plugin.num_inputs == 5
    fc = plugin.field_collection(ref)
    assert RopePlugin.from_field_collection(fc) == plugin
    plain = RopePlugin(128, 128, attention_scaling=1.5)
    names = [f.name for f in plain.field_collection(ref)]
    assert "longrope" not in names and "original_max_position_embeddings" not in names  # serialized as before longrope
    assert RopePlugin.from_field_data({n: d for n, _, d in plain.field_values()}) == plain


def test_plugin_in_reference_network() -> None:
    """add_plugin_v3 in a trtcore.reference network == reference(), bit for bit."""
    from trtcore.reference.evaluator import evaluate
    from trtcore.testing import make_inputs

    spec = spec_of("partial0.5")
    plugin = RopePlugin.from_spec(spec)
    specs = plugin.input_specs(29, 4, 2, BF16, inv_freq=RopePlugin.inv_freq_of(spec), max_position=2000)
    arrays = make_inputs(specs, np.random.default_rng())
    assert arrays[4].min() <= 512 < arrays[4].max()  # both sides
    net = ref.Builder(ref.Logger(ref.Logger.ERROR)).create_network(1 << int(ref.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    dt = base.trt_dtype(ref, BF16)
    q, k = net.add_input("q", dt, (-1, 4, 96)), net.add_input("k", dt, (-1, 2, 96))
    pos, seq = net.add_input("position_ids", ref.DataType.INT32, (-1,)), net.add_input("seq_lens", ref.DataType.INT32, (-1,))
    inv = net.add_constant((spec.rotary_dim,), arrays[3]).get_output(0)
    layer = net.add_plugin_v3(plugin.inputs(q, k, pos, inv, seq), [], base.create(plugin, ref))
    layer.get_output(0).name = "q_out"
    net.mark_output(layer.get_output(0))
    out = evaluate(net, {"q": arrays[0], "k": arrays[1], "position_ids": arrays[2], "seq_lens": arrays[4]})
    np.testing.assert_array_equal(np.asarray(out["q_out"]).view(np.uint16), plugin.reference(*arrays)[0].view(np.uint16))


def test_validation() -> None:
    with pytest.raises(PluginError, match="original_max_position_embeddings"):
        RopePlugin(96, 96, longrope=True)
    with pytest.raises(PluginError, match="exclusive"):
        RopePlugin(96, 96, longrope=True, original_max_position_embeddings=8, dynamic=True, dynamic_factor=2.0, max_position_embeddings=8)
    p = RopePlugin(96, 96, longrope=True, original_max_position_embeddings=8)
    with pytest.raises(PluginError, match="needs seq_lens"):
        p.inputs(1, 2, 3, 4)
    with pytest.raises(PluginError, match=r"inv_freq must have shape \(96,\)"):
        p.frequencies(np.ones(48, np.float32), np.ones(2, np.int32))


@pytest.mark.parametrize(
    "rope, match",
    [
        ({"type": "longrope", "short_factor": [1.0] * 48}, "lacks \\['long_factor'\\]"),
        ({"type": "longrope", "short_factor": [1.0] * 47, "long_factor": [1.0] * 48}, "'short_factor'.*expected 48 positive numbers"),
        ({"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [0.0] * 48}, "'long_factor'.*expected 48 positive numbers"),
    ],
)
def test_bad_longrope_parameters_are_refused(rope: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        rope_spec(ModelConfig.from_dict(phi3_dict(rope)))


def test_paged_attention_fuses_longrope_not_dynamic() -> None:
    """LongRoPE's two frequency sets go into the paged attention plugin (one ``inv_freq`` of
    ``rotary_dim`` values; the plugin picks by each sequence's ``seq_lens``); dynamic NTK's
    per-sequence base does not, and asking for it fused is refused."""
    from trtcore import ops
    from trtcore.errors import InvalidArgumentError
    from trtcore.plugins.paged_attention import PagedAttentionPlugin

    network = ref.Builder().create_network(1 << int(ref.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    g = ops.Graph(ref, network, "float32", implementations={"rope": "attention"})
    g.kv_mode = type("Paged", (), {"kv_cache": "paged"})()
    assert ops.fuses_rope(g, spec_of("ratio"))
    dyn = rope_spec(ModelConfig.from_dict(phi3_dict(None) | {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                             "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}))
    assert not ops.fuses_rope(g, dyn)
    x = g.input("x", np.float32, (-1, 96))
    with pytest.raises(InvalidArgumentError, match="without dynamic NTK scaling, got 'dynamic'"):
        ops.paged_attention(g, x, x, x, x, x, x, x, layer_idx=0, num_kv_heads=1, head_dim=96, block_size=16, sliding_window=0, scale=1.0,
                            rope=dyn, position_ids=x)
    # the plugin the ops make for longrope
    spec = spec_of("partial0.5")
    pos = g.input("position_ids", np.int32, (-1,))
    out = ops.paged_attention(g, x, None, None, x, x, x, x, layer_idx=0, num_kv_heads=1, head_dim=96, block_size=16, sliding_window=0,
                              scale=1.0, rope=spec, position_ids=pos)
    layer = network.get_layer(network.num_layers - 1)
    plugin = layer.plugin
    assert isinstance(plugin, PagedAttentionPlugin) and out is not None
    assert plugin.original_max_position_embeddings == 512 and plugin.rotary_dim == 48
    rp, want = plugin.rope(), RopePlugin.from_spec(spec)
    assert rp.longrope and (rp.rotary_dim, rp.original_max_position_embeddings, rp.attention_scaling) == (
        want.rotary_dim, want.original_max_position_embeddings, want.attention_scaling)  # fmt: skip


# --------------------------------------------------------------------------------------------
# GPU: the CUDA kernel against the reference


@pytest.fixture(scope="module")
def gpu() -> None:
    """Skip without CuPy or a GPU, saying why; fail instead under ``TRTCORE_REQUIRE_GPU=1``."""
    ok, why = gpu_status()
    if not ok:
        if os.environ.get("TRTCORE_REQUIRE_GPU") == "1":
            pytest.fail(f"TRTCORE_REQUIRE_GPU=1 but {why}")
        pytest.skip(f"no GPU for the kernel tests: {why}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", ["ratio", "partial0.5"])
def test_kernel_matches_reference(gpu: None, case: str, dtype: Any) -> None:
    """Phi-3's real shapes (head_dim 96, 32 query / 32 or 8 key heads) and frequencies, packed
    tokens with sequence lengths on both sides of original_max_position_embeddings, and
    ``[batch, seq]`` leading dimensions."""
    from trtcore.testing import check_plugin

    spec = spec_of(case)
    plugin = RopePlugin.from_spec(spec)
    inv = RopePlugin.inv_freq_of(spec)
    for tokens, nq, nk in ((1, 32, 32), (77, 32, 8), (1024, 8, 2)):
        specs = plugin.input_specs(tokens, nq, nk, dtype, inv_freq=inv, max_position=131072)
        rep = check_plugin(plugin, specs)
        if np.dtype(dtype) == np.float32:
            assert max(rep.max_rel_error) <= 1e-5, str(rep)
    lead = [((2, 333, 8, 96), dtype), ((2, 333, 2, 96), dtype), ((2, 333), np.int32, (0, 4096)), ((spec.rotary_dim,), np.float32, inv),
            ((2, 333), np.int32, (1, 1025))]
    check_plugin(plugin, lead)
