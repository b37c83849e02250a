"""The fused RoPE plugin (:class:`trtcore.plugins.rope.RopePlugin`).

CPU (CI):

* the NumPy reference in float64 mode against Hugging Face transformers evaluated in
  float64 (its RoPE modules run under :func:`hf_float64`, which makes ``torch.float`` and
  the default dtype float64 for the duration), for default, ``linear`` 4, ``llama3`` 8,
  ``yarn`` 4, ``dynamic`` 2 (at a sequence longer than ``max_position_embeddings`` and at
  one shorter), partial rotary 0.25 and 0.5 (transformers' GPT-NeoX classes, which rotate
  the first ``rotary_dim`` features) and GPT-J's interleaved pairing (full and partial):
  within 1e-6 of ``max|hf|``. The frequencies the plugin is given come from transformers'
  module; separately, ``trtcore.rope.rope_spec``'s float64 frequencies must match
  transformers' (within 2e-7 relative: transformers computes YaRN's ramp in float32);
* the float32 contract against transformers' own float32 forward (same float32 angles,
  cos/sin within an ulp);
* field serialization through ``trtcore.reference``'s and ``tensorrt_rtx``'s
  ``PluginFieldCollection`` and registries; the plugin inside a ``trtcore.reference``
  network equals calling ``reference`` directly; input/field validation.

GPU (marker ``gpu``; skipped with the reason when CuPy or a GPU is missing): the CUDA
kernel against the float32 reference with :func:`trtcore.testing.check_plugin` for every
declared kernel variant (head_dim 64/128 x neox/gptj x dynamic x float32/float16/bfloat16)
plus partial rotary, odd token counts, GQA/MQA head counts, attention scaling and large
positions. Tolerances: float32 1e-5 relative to ``max|ref|``; float16 2^-10 and bfloat16
2^-7 (one ulp of the output format at the largest magnitude: the kernel follows the
reference's float32 operations, so at most the final rounding can differ). A benchmark
(marker ``bench``) times the kernel at 8192 tokens x 32 + 32 heads x 128, bfloat16.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import trtcore.reference as ref
from trtcore.config import ModelConfig
from trtcore.plugins import base
from trtcore.plugins.base import Dim, PluginError
from trtcore.plugins.rope import RopePlugin
from trtcore.reference.evaluator import evaluate
from trtcore.rope import default_inv_freq, rope_spec
from trtcore.testing import gpu_status

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import GPTNeoXConfig, LlamaConfig  # noqa: E402
from transformers.models.gpt_neox import modeling_gpt_neox as hf_neox  # noqa: E402
from transformers.models.gptj import modeling_gptj as hf_gptj  # noqa: E402
from transformers.models.llama import modeling_llama as hf_llama  # noqa: E402

try:
    import tensorrt_rtx as rtx
except ImportError:  # pragma: no cover - a test dependency
    rtx = None

BF16 = np.dtype(ml_dtypes.bfloat16)
TRANSFORMERS_V5 = int(transformers.__version__.split(".")[0]) >= 5

# --------------------------------------------------------------------------------------------
# configurations: trtcore's config.json dict and transformers' config
# --------------------------------------------------------------------------------------------

HEAD_DIM = 128

#: name -> (rope_theta, rope_scaling or None, partial_rotary_factor, max_position_embeddings)
CASES: dict[str, tuple[float, dict[str, Any] | None, float, int]] = {
    "default": (10000.0, None, 1.0, 4096),
    "linear4": (10000.0, {"rope_type": "linear", "factor": 4.0}, 1.0, 4096),
    "llama3_8": (
        500000.0,
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
        1.0,
        8192,
    ),
    "yarn4": (10000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}, 1.0, 4096),
    "dynamic2": (10000.0, {"rope_type": "dynamic", "factor": 2.0}, 1.0, 1024),
    "partial0.25": (10000.0, None, 0.25, 4096),
    "partial0.5": (500000.0, None, 0.5, 4096),
    "partial0.5_llama3": (
        500000.0,
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
        0.5,
        8192,
    ),
}


def trtcore_config(theta: float, scaling: dict[str, Any] | None, partial: float, max_pos: int) -> ModelConfig:
    d: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 64,
        "hidden_size": 2 * HEAD_DIM,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-6,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "partial_rotary_factor": partial,
    }
    return ModelConfig.from_dict(d)


def hf_rotary(theta: float, scaling: dict[str, Any] | None, partial: float, max_pos: int) -> tuple[Any, Any]:
    """transformers' rotary module and ``apply_rotary_pos_emb`` for a case: Llama's for full
    rotary, GPT-NeoX's (which rotates the first ``rotary_dim`` features) for partial."""
    common = dict(hidden_size=2 * HEAD_DIM, num_attention_heads=2, max_position_embeddings=max_pos)
    if partial == 1.0:
        cfg = LlamaConfig(head_dim=HEAD_DIM, num_key_value_heads=1, rope_theta=theta, rope_scaling=scaling, **common)
        return hf_llama.LlamaRotaryEmbedding(cfg), hf_llama.apply_rotary_pos_emb
    if TRANSFORMERS_V5:
        params = {"rope_type": "default", **(scaling or {}), "rope_theta": theta, "partial_rotary_factor": partial}
        cfg = GPTNeoXConfig(rope_parameters=params, **common)
    else:  # pragma: no cover - transformers 4.x
        cfg = GPTNeoXConfig(rotary_pct=partial, rotary_emb_base=theta, rope_scaling=scaling, **common)
    return hf_neox.GPTNeoXRotaryEmbedding(cfg), hf_neox.apply_rotary_pos_emb


@contextlib.contextmanager
def hf_float64() -> Iterator[None]:
    """Run transformers' RoPE code in float64: its modules compute ``inv_freq`` and the
    angles with ``dtype=torch.float`` / ``.to(torch.float)`` and default-dtype arithmetic,
    so for the duration ``torch.float`` is float64 and so is the default dtype."""
    old_default, old_float = torch.get_default_dtype(), torch.float
    torch.set_default_dtype(torch.float64)
    torch.float = torch.float64
    try:
        yield
    finally:
        torch.float = old_float
        torch.set_default_dtype(old_default)


def random_qk(rng: np.random.Generator, seq: int, nq: int = 4, nk: int = 2, head_dim: int = HEAD_DIM) -> tuple[np.ndarray, np.ndarray]:
    return rng.standard_normal((seq, nq, head_dim)), rng.standard_normal((seq, nk, head_dim))


def hf_apply(rotary: Any, apply: Any, q: np.ndarray, k: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """transformers' forward (cos/sin) + apply_rotary_pos_emb on ``[seq, heads, dim]``
    arrays (batch 1, heads on axis 2: ``unsqueeze_dim=2``), in q's dtype."""
    tq, tk = torch.from_numpy(q)[None], torch.from_numpy(k)[None]
    cos, sin = rotary(tq, torch.from_numpy(pos.astype(np.int64))[None])
    oq, ok = apply(tq, tk, cos, sin, unsqueeze_dim=2)
    return oq[0].numpy(), ok[0].numpy()


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


# --------------------------------------------------------------------------------------------
# CPU: the reference against transformers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_frequencies_match_transformers(case: str) -> None:
    """``rope_spec``'s float64 frequencies and attention factor vs transformers' (float64)."""
    theta, scaling, partial, max_pos = CASES[case]
    spec = rope_spec(trtcore_config(*CASES[case]))
    with hf_float64():
        rotary, _ = hf_rotary(theta, scaling, partial, max_pos)
    hf_inv = rotary.inv_freq.numpy()
    assert spec.rotary_dim == int(HEAD_DIM * partial) == 2 * hf_inv.size
    np.testing.assert_allclose(spec.inv_freq, hf_inv, rtol=2e-7, atol=0)
    assert spec.attention_scaling == pytest.approx(rotary.attention_scaling, rel=1e-12)
    plugin = RopePlugin.from_spec(spec)
    assert plugin.attention_scaling == float(np.float32(rotary.attention_scaling))


@pytest.mark.parametrize("case", list(CASES))
def test_reference_float64_matches_transformers(case: str) -> None:
    """The plugin's formula (float64 mode) == transformers' RoPE in float64, given the same
    frequencies; dynamic at a sequence longer than max_position_embeddings."""
    theta, scaling, partial, max_pos = CASES[case]
    spec = rope_spec(trtcore_config(*CASES[case]))
    plugin = RopePlugin.from_spec(spec)
    rng = np.random.default_rng()
    seq = 2 * max_pos + 37 if spec.rope_type == "dynamic" else 3000
    q, k = random_qk(rng, seq)
    pos = np.arange(seq, dtype=np.int32)
    with hf_float64():
        rotary, apply = hf_rotary(theta, scaling, partial, max_pos)
        inv_freq = rotary.inv_freq.numpy().copy()  # before a dynamic update
        hq, hk = hf_apply(rotary, apply, q, k, pos)
    extra = [np.full(seq, seq, np.int32)] if plugin.dynamic else []
    oq, ok = plugin.reference(q, k, pos, inv_freq, *extra)
    assert oq.dtype == np.float64 and oq.shape == q.shape
    assert rel_err(oq, hq) <= 1e-6 and rel_err(ok, hk) <= 1e-6, (rel_err(oq, hq), rel_err(ok, hk))
    if partial < 1.0:  # features past rotary_dim pass through
        np.testing.assert_array_equal(oq[..., spec.rotary_dim :], q[..., spec.rotary_dim :])


def test_dynamic_short_sequence_uses_original_frequencies() -> None:
    """Dynamic scaling changes nothing up to max_position_embeddings (transformers resets to
    its original inv_freq); tokens of a long and a short sequence in one call each get their own."""
    theta, scaling, partial, max_pos = CASES["dynamic2"]
    plugin = RopePlugin.from_spec(rope_spec(trtcore_config(*CASES["dynamic2"])))
    rng = np.random.default_rng()
    with hf_float64():
        rotary, apply = hf_rotary(theta, scaling, partial, max_pos)
        inv_freq = rotary.inv_freq.numpy().copy()
    short, long = max_pos - 5, max_pos + 300
    q, k = random_qk(rng, short + long)
    pos = np.concatenate([np.arange(short), np.arange(long)]).astype(np.int32)
    seq_lens = np.concatenate([np.full(short, short), np.full(long, long)]).astype(np.int32)
    oq, ok = plugin.reference(q, k, pos, inv_freq, seq_lens)
    for sl in (slice(0, short), slice(short, None)):
        with hf_float64():
            rotary, apply = hf_rotary(theta, scaling, partial, max_pos)  # fresh: no cached state
            hq, hk = hf_apply(rotary, apply, q[sl], k[sl], pos[sl])
        assert rel_err(oq[sl], hq) <= 1e-6 and rel_err(ok[sl], hk) <= 1e-6
    # the short sequence's frequencies are inv_freq itself
    freq = plugin.frequencies(inv_freq, seq_lens, np.float64)
    np.testing.assert_array_equal(freq[0], inv_freq)
    assert not np.array_equal(freq[-1], inv_freq)


def test_dynamic_frequencies_match_transformers() -> None:
    """The per-token dynamic NTK frequencies (float64 mode and float32 contract) vs
    transformers' ``_compute_dynamic_ntk_parameters`` at the same length."""
    theta, scaling, partial, max_pos = CASES["dynamic2"]
    plugin = RopePlugin.from_spec(rope_spec(trtcore_config(*CASES["dynamic2"])))
    inv = default_inv_freq(theta, HEAD_DIM)
    for seq_len in (max_pos + 1, 3 * max_pos + 17, 40000):
        with hf_float64():
            rotary, apply = hf_rotary(theta, scaling, partial, max_pos)
            rotary(torch.zeros(1), torch.arange(seq_len)[None])
            hf64 = rotary.inv_freq.numpy().copy()
        ours = plugin.frequencies(inv, np.array([seq_len], np.int32), np.float64)[0]
        np.testing.assert_allclose(ours, hf64, rtol=1e-13)
        ours32 = plugin.frequencies(inv.astype(np.float32), np.array([seq_len], np.int32), np.float32)[0]
        np.testing.assert_array_equal(ours32, hf64.astype(np.float32))  # float64, rounded once
        rotary32, _ = hf_rotary(theta, scaling, partial, max_pos)  # transformers in float32
        rotary32(torch.zeros(1), torch.arange(seq_len)[None])
        np.testing.assert_allclose(ours32, rotary32.inv_freq.numpy(), rtol=2e-6)


@pytest.mark.parametrize("case", [c for c in CASES if c != "dynamic2"])
def test_reference_float32_matches_transformers_float32(case: str) -> None:
    """The float32 contract: transformers' own float32 forward (float32 angle products,
    float32 cos/sin) on the same inputs agrees to an ulp of cos/sin."""
    theta, scaling, partial, max_pos = CASES[case]
    plugin = RopePlugin.from_spec(rope_spec(trtcore_config(*CASES[case])))
    rotary, apply = hf_rotary(theta, scaling, partial, max_pos)
    inv_freq = rotary.inv_freq.numpy()
    assert inv_freq.dtype == np.float32
    rng = np.random.default_rng()
    seq = 5000
    q, k = (a.astype(np.float32) for a in random_qk(rng, seq))
    pos = np.arange(seq, dtype=np.int32)
    hq, hk = hf_apply(rotary, apply, q, k, pos)
    oq, ok = plugin.reference(q, k, pos, inv_freq)
    assert oq.dtype == np.float32
    assert rel_err(oq, hq) <= 2e-6 and rel_err(ok, hk) <= 2e-6, (rel_err(oq, hq), rel_err(ok, hk))
    # and the contract is float32 arithmetic: far from the float64 evaluation at large positions
    with hf_float64():
        rotary64, apply64 = hf_rotary(theta, scaling, partial, max_pos)
        h64, _ = hf_apply(rotary64, apply64, q.astype(np.float64), k.astype(np.float64), pos)
    assert rel_err(oq, h64) > 1e-5


@pytest.mark.parametrize("rotary_dim", [64, 256])
def test_gptj_interleaved_matches_transformers(rotary_dim: int) -> None:
    """Interleaved pairing == GPT-J's create_sinusoidal_positions + apply_rotary_pos_emb on
    the first rotary_dim features (GPT-J 6B: rotary_dim 64 of head_dim 256), float64."""
    head_dim, seq = 256, 2500
    plugin = RopePlugin(head_dim=head_dim, rotary_dim=rotary_dim, is_neox=False, base=10000.0)
    rng = np.random.default_rng()
    q, k = random_qk(rng, seq, 3, 1, head_dim)
    pos = np.arange(seq, dtype=np.int32)
    with hf_float64():
        table = hf_gptj.create_sinusoidal_positions(seq, rotary_dim)
        sincos = table[torch.from_numpy(pos.astype(np.int64))][None]
        sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)
        outs = []
        for x in (q, k):
            t = torch.from_numpy(x)[None]
            rot = hf_gptj.apply_rotary_pos_emb(t[..., :rotary_dim], sin, cos)
            outs.append(torch.cat([rot, t[..., rotary_dim:]], dim=-1)[0].numpy())
    assert table.dtype == torch.float64
    oq, ok = plugin.reference(q, k, pos, default_inv_freq(10000.0, rotary_dim))
    assert rel_err(oq, outs[0]) <= 1e-6 and rel_err(ok, outs[1]) <= 1e-6


def test_gptj_is_not_neox() -> None:
    """The two pairings give different results (guards against a test that cannot fail)."""
    rng = np.random.default_rng()
    q, k = random_qk(rng, 16)
    pos = np.arange(16, dtype=np.int32) + 3
    inv = default_inv_freq(10000.0, HEAD_DIM)
    a = RopePlugin(HEAD_DIM, HEAD_DIM, is_neox=True).reference(q, k, pos, inv)[0]
    b = RopePlugin(HEAD_DIM, HEAD_DIM, is_neox=False).reference(q, k, pos, inv)[0]
    assert rel_err(a, b) > 0.1


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
def test_reference_rounds_once_to_io_dtype(dtype: Any) -> None:
    """float16/bfloat16: computed in float32, rounded once (== float32 run, then cast)."""
    plugin = RopePlugin(64, 32, is_neox=True, attention_scaling=1.25)
    rng = np.random.default_rng()
    q = rng.standard_normal((9, 3, 64)).astype(dtype)
    k = rng.standard_normal((9, 1, 64)).astype(dtype)
    pos = rng.integers(0, 100000, 9).astype(np.int32)
    inv = default_inv_freq(10000.0, 32).astype(np.float32)
    oq, ok = plugin.reference(q, k, pos, inv)
    fq, fk = plugin.reference(q.astype(np.float32), k.astype(np.float32), pos, inv)
    assert oq.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(oq.view(np.uint8), fq.astype(dtype).view(np.uint8))
    np.testing.assert_array_equal(ok.view(np.uint8), fk.astype(dtype).view(np.uint8))
    np.testing.assert_array_equal(oq[..., 32:].view(np.uint8), q[..., 32:].view(np.uint8))


def test_reference_leading_dims() -> None:
    """Any leading token dimensions ([batch, seq] as trtcore.ops passes) == flattened."""
    plugin = RopePlugin(64, 64, dynamic=True, base=10000.0, dynamic_factor=2.0, max_position_embeddings=16)
    rng = np.random.default_rng()
    q, k = rng.standard_normal((2, 20, 4, 64)).astype(np.float32), rng.standard_normal((2, 20, 2, 64)).astype(np.float32)
    pos = np.stack([np.arange(20), np.arange(20) + 5]).astype(np.int32)
    seq_lens = np.stack([np.full(20, 20), np.full(20, 25)]).astype(np.int32)
    inv = default_inv_freq(10000.0, 64).astype(np.float32)
    oq, ok = plugin.reference(q, k, pos, inv, seq_lens)
    fq, fk = plugin.reference(q.reshape(40, 4, 64), k.reshape(40, 2, 64), pos.reshape(40), inv, seq_lens.reshape(40))
    np.testing.assert_array_equal(oq.reshape(40, 4, 64), fq)
    np.testing.assert_array_equal(ok.reshape(40, 2, 64), fk)


# --------------------------------------------------------------------------------------------
# CPU: fields, registries, networks, validation
# --------------------------------------------------------------------------------------------

PLUGINS = [
    RopePlugin(128, 128),
    RopePlugin(128, 64, is_neox=False, dynamic=True, base=500000.0, dynamic_factor=2.0, max_position_embeddings=2048, attention_scaling=1.1386294361),
    RopePlugin.from_spec(rope_spec(trtcore_config(*CASES["yarn4"]))),
    RopePlugin.from_spec(rope_spec(trtcore_config(*CASES["dynamic2"])), is_neox=False),
    RopePlugin(96, 96, longrope=True, original_max_position_embeddings=4096, attention_scaling=1.1902380714),
]


def test_fields_are_float32_values() -> None:
    p = PLUGINS[1]
    assert p.attention_scaling == float(np.float32(1.1386294361)) != 1.1386294361
    assert [s[:2] for s in RopePlugin.field_specs()] == [
        ("head_dim", "INT32"), ("rotary_dim", "INT32"), ("is_neox", "INT8"), ("dynamic", "INT8"),
        ("base", "FLOAT32"), ("dynamic_factor", "FLOAT32"), ("max_position_embeddings", "INT32"), ("attention_scaling", "FLOAT32"),
        ("longrope", "INT8"), ("original_max_position_embeddings", "INT32"),
    ]
    assert RopePlugin.plugin_name == "trtcore_rope" and RopePlugin.plugin_version == "1" and RopePlugin.num_outputs == 2


@pytest.mark.parametrize("plugin", PLUGINS, ids=range(len(PLUGINS)))
def test_fields_round_trip_reference(plugin: RopePlugin) -> None:
    fc = plugin.field_collection(ref)
    # the longrope fields are serialized only when set (engines from before them still load)
    assert isinstance(fc, ref.PluginFieldCollection) and len(fc) == (10 if plugin.longrope else 8)
    assert RopePlugin.from_field_collection(fc) == plugin
    made = base.create(plugin, ref)  # through the reference registry's creator
    assert made == plugin and made is not plugin
    assert ref.get_plugin_registry().get_creator("trtcore_rope", "1", "trtcore") is not None


def _rtx_collection(plugin: RopePlugin) -> tuple[Any, list[Any]]:
    """tensorrt_rtx's collection of the plugin's fields, with the PluginField objects kept
    alive (tensorrt's PluginFieldCollection does not reference them; see the xfail below)."""
    fields = [rtx.PluginField(name, data, getattr(rtx.PluginFieldType, kind)) for name, kind, data in plugin.field_values()]
    return rtx.PluginFieldCollection(fields), fields


@pytest.mark.skipif(rtx is None, reason="tensorrt_rtx is not installed")
@pytest.mark.parametrize("plugin", PLUGINS, ids=range(len(PLUGINS)))
def test_fields_round_trip_tensorrt_rtx(plugin: RopePlugin) -> None:
    fc, keep = _rtx_collection(plugin)
    _churn()
    assert [f.type for f in fc] == [getattr(rtx.PluginFieldType, k) for _, k, _ in plugin.field_values()]
    assert RopePlugin.from_field_collection(fc) == plugin
    # the generated creator, registered in tensorrt_rtx's own plugin registry
    registry = rtx.get_plugin_registry()
    creator = base._trt_creator(rtx, RopePlugin)
    assert registry.register_creator(creator, "trtcore")
    try:
        found = registry.get_creator("trtcore_rope", "1", "trtcore")
        assert [f.name for f in found.field_names] == [s[0] for s in RopePlugin.field_specs()]
        made = found.create_plugin("rope", fc, rtx.TensorRTPhase.BUILD)
        assert made.plugin == plugin and made.num_outputs == 2
        assert made.clone().plugin == plugin
        bf16, i32, f32 = rtx.DataType.BF16, rtx.DataType.INT32, rtx.DataType.FLOAT
        ins = [bf16, bf16, i32, f32] + ([i32] if plugin.per_sequence else [])
        assert made.get_output_data_types(ins) == [bf16, bf16]
    finally:
        registry.deregister_creator(creator)
    del keep


def _churn() -> None:
    """Allocate and free many small arrays so that freed field buffers get reused."""
    gc.collect()
    junk = [np.full(2, -7, np.int32) for _ in range(2000)]
    del junk


@pytest.mark.skipif(rtx is None, reason="tensorrt_rtx is not installed")
def test_field_collection_of_base_survives_tensorrt_rtx() -> None:
    plugin = PLUGINS[1]
    fc = plugin.field_collection(rtx)
    _churn()
    assert RopePlugin.from_field_collection(fc) == plugin


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_plugin_in_reference_network(dynamic: bool, dtype: Any) -> None:
    """add_plugin_v3 through base.create in a trtcore.reference network == reference()."""
    plugin = PLUGINS[1] if dynamic else PLUGINS[2]
    rng = np.random.default_rng()
    T, nq, nk, hd = 37, 4, 2, plugin.head_dim
    specs = plugin.input_specs(T, nq, nk, dtype, inv_freq=None, max_position=5000)
    from trtcore.testing import make_inputs

    arrays = make_inputs(specs, rng)
    builder = ref.Builder(ref.Logger(ref.Logger.ERROR))
    net = builder.create_network(1 << int(ref.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    dt = base.trt_dtype(ref, dtype)
    q = net.add_input("q", dt, (-1, nq, hd))
    k = net.add_input("k", dt, (-1, nk, hd))
    pos = net.add_input("position_ids", ref.DataType.INT32, (-1,))
    inv = net.add_constant((plugin.rotary_dim // 2,), arrays[3]).get_output(0)
    seq = net.add_input("seq_lens", ref.DataType.INT32, (-1,)) if dynamic else None
    layer = net.add_plugin_v3(plugin.inputs(q, k, pos, inv, seq), [], base.create(plugin, ref))
    assert layer.num_outputs == 2
    qo, ko = layer.get_output(0), layer.get_output(1)
    qo.name, ko.name = "q_out", "k_out"
    net.mark_output(qo)
    net.mark_output(ko)
    assert qo.dtype == dt and tuple(qo.shape) == (-1, nq, hd) and tuple(ko.shape) == (-1, nk, hd)
    feeds = {"q": arrays[0], "k": arrays[1], "position_ids": arrays[2]}
    if dynamic:
        feeds["seq_lens"] = arrays[4]
    out = evaluate(net, feeds)
    eq, ek = plugin.reference(*arrays)
    np.testing.assert_array_equal(np.asarray(out["q_out"]).view(np.uint8), eq.view(np.uint8))
    np.testing.assert_array_equal(np.asarray(out["k_out"]).view(np.uint8), ek.view(np.uint8))


def test_validation() -> None:
    with pytest.raises(PluginError, match="rotary_dim"):
        RopePlugin(128, 130)
    with pytest.raises(PluginError, match="rotary_dim"):
        RopePlugin(128, 63)
    with pytest.raises(PluginError, match="dynamic_factor"):
        RopePlugin(128, 128, dynamic=True, max_position_embeddings=10)
    with pytest.raises(PluginError, match="max_position_embeddings"):
        RopePlugin(128, 128, dynamic=True, dynamic_factor=2.0)
    p = RopePlugin(64, 64)
    with pytest.raises(PluginError, match="seq_lens"):
        p.inputs(1, 2, 3, 4, seq_lens=5)
    with pytest.raises(PluginError, match="takes 4 inputs"):
        p.output_dtypes([np.dtype(np.float32)] * 5)
    with pytest.raises(PluginError, match="dtype of q"):
        p.output_dtypes([np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32), np.dtype(np.float32)])
    with pytest.raises(PluginError, match="head_dim=64"):
        p.output_shapes([[Dim(3), Dim(2), Dim(128)], [Dim(3), Dim(2), Dim(64)], [Dim(3)], [Dim(32)]])
    rng = np.random.default_rng()
    with pytest.raises(PluginError, match="leading token dimensions"):
        p.reference(rng.standard_normal((3, 2, 64)), rng.standard_normal((3, 2, 64)), np.zeros(4, np.int32), np.ones(32, np.float32))
    d = RopePlugin(64, 64, dynamic=True, dynamic_factor=2.0, max_position_embeddings=8)
    assert d.input_names() == ["q", "k", "position_ids", "inv_freq", "seq_lens"]
    with pytest.raises(PluginError, match="needs seq_lens"):
        d.inputs(1, 2, 3, 4)


def test_supports() -> None:
    p = RopePlugin(64, 64)
    f32, f16, i32 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32)
    ok = [BF16, BF16, i32, f32, BF16, BF16]
    assert all(p.supports(i, ok, 4) for i in range(6))
    assert not p.supports(0, [i32], 4)
    assert not p.supports(1, [f16, BF16], 4)
    assert not p.supports(2, [f16, f16, f32], 4)
    assert not p.supports(3, [f16, f16, i32, f16], 4)
    assert not p.supports(4, [f16, f16, i32, f32, f32], 4)
    assert not p.supports(0, [f16], 5)  # the dynamic input count for a non-dynamic plugin
    d = RopePlugin(64, 64, dynamic=True, dynamic_factor=2.0, max_position_embeddings=8)
    assert d.supports(4, [f16, f16, i32, f32, i32], 5) and not d.supports(4, [f16, f16, i32, f32, f32], 5)


def test_vector_width_and_block() -> None:
    p = RopePlugin(128, 128)
    assert p.vector_width(BF16) == 8 and p.vector_width(np.float32) == 4
    assert p.vector_width(BF16, [256, 264]) == 4  # an 8-byte aligned pointer
    assert RopePlugin(96, 24).vector_width(BF16) == 4  # rotary half 12
    assert RopePlugin(80, 20, is_neox=False).vector_width(np.float32) == 4
    assert RopePlugin(80, 20, is_neox=True).vector_width(np.float32) == 2
    assert p.block_size(32, 32, 8) == 128 and p.block_size(1, 1, 8) == 32 and p.block_size(128, 128, 8) == 256


def test_every_declared_variant_is_a_define_set() -> None:
    """The variants rope.cu declares are what the plugin asks for (head_dim 64/128 x 3 dtypes
    x neox/gptj x dynamic, full rotary, 16-byte vectors; longrope neox with head_dim 96/128)."""
    kernels = pytest.importorskip("trtcore.kernels")
    declared = {tuple(sorted(v.items())) for v in kernels.variants("rope")}
    wanted = set()
    for hd in (64, 128):
        for dtype in (np.float32, np.float16, BF16):
            for neox in (True, False):
                for dyn in (False, True):
                    p = RopePlugin(hd, hd, is_neox=neox, dynamic=dyn, dynamic_factor=2.0, max_position_embeddings=8)
                    wanted.add(tuple(sorted(p.defines(dtype, p.vector_width(dtype)).items())))
    for dtype in (np.float32, np.float16, BF16):  # longrope: Phi-3 mini's head_dim 96, and 128
        for hd in (96, 128):
            p = RopePlugin(hd, hd, longrope=True, original_max_position_embeddings=8)
            wanted.add(tuple(sorted(p.defines(dtype, p.vector_width(dtype)).items())))
    assert declared == wanted


# --------------------------------------------------------------------------------------------
# CPU: the harness (trtcore.testing) with host memory standing in for CuPy
# --------------------------------------------------------------------------------------------


class _HostArray(np.ndarray):
    """A NumPy array that looks like a CuPy one to the harness (``.data.ptr``)."""

    @property
    def data(self) -> Any:  # type: ignore[override]
        return types.SimpleNamespace(ptr=self.ctypes.data)


class _HostStream:
    ptr = 0

    def __init__(self, non_blocking: bool = False) -> None:
        pass

    def __enter__(self) -> _HostStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _HostEvent:
    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass


def _host_cupy() -> types.ModuleType:
    m = types.ModuleType("cupy")
    m.asarray = lambda a: np.array(a).view(_HostArray)  # type: ignore[attr-defined]
    m.empty = lambda shape, dtype: np.empty(shape, dtype).view(_HostArray)  # type: ignore[attr-defined]
    m.asnumpy = lambda a: np.array(a)  # type: ignore[attr-defined]
    m.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        Stream=_HostStream,
        Event=_HostEvent,
        get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3,
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, getDeviceProperties=lambda i: {"name": b"host"}),
        Device=lambda: types.SimpleNamespace(id=0, attributes={"L2CacheSize": 1 << 20}),
    )
    return m


def _host_view(t: Any) -> np.ndarray:
    n = int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize
    return np.frombuffer((ctypes.c_char * n).from_address(t.ptr), dtype=t.dtype).reshape(t.shape)


@dataclass
class _HostRope(RopePlugin):
    """enqueue = reference on the host buffers; ``flaw`` plants a bug."""

    flaw: str = ""

    def enqueue(self, inputs: Any, outputs: Any, workspace: int, stream: int) -> None:
        ins = [_host_view(t).copy() for t in inputs]
        for t, o in zip(outputs, self.reference(*ins)):
            view = _host_view(t)
            if self.flaw == "unwritten":
                view.reshape(-1)[1:] = o.reshape(-1)[1:]
            elif self.flaw == "off":
                o = o.copy()
                o.reshape(-1)[5] = o.reshape(-1)[5] + np.asarray(0.5, o.dtype)
                view[...] = o
            else:
                view[...] = o
        if self.flaw == "clobber":
            _host_view(inputs[0]).reshape(-1)[0] = 0


@pytest.fixture()
def host_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", _host_cupy())


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
def test_harness_passes_a_correct_plugin(host_cupy: None, dtype: Any) -> None:
    from trtcore.testing import check_plugin

    plugin = _HostRope(64, 32, dynamic=True, dynamic_factor=2.0, max_position_embeddings=100)
    rep = check_plugin(plugin, plugin.input_specs(7, 3, 1, dtype, max_position=300))
    assert rep.ok and len(rep.outputs) == 2 and rep.max_abs_error == [0.0, 0.0]
    assert rep.outputs[0].dtype == np.dtype(dtype) and rep.outputs[0].shape == (7, 3, 64)
    assert f"seed {rep.seed}" in str(rep)
    again = check_plugin(plugin, plugin.input_specs(7, 3, 1, dtype, max_position=300), seed=rep.seed)
    assert again.seed == rep.seed and again.outputs[0].scale == rep.outputs[0].scale


@pytest.mark.parametrize("flaw,match", [
    ("unwritten", r"output 0 .* worst at index \(0, 0, 0\): got nan"),
    ("off", r"worst at index \(0, 0, 5\): got .*expected .*error .*> tolerance"),
    ("clobber", "modified its input 0"),
])
def test_harness_catches_bugs(host_cupy: None, flaw: str, match: str) -> None:
    from trtcore.testing import check_plugin

    plugin = _HostRope(64, 64, flaw=flaw)
    with pytest.raises(AssertionError, match=match):
        check_plugin(plugin, plugin.input_specs(4, 2, 2, np.float32))


def test_harness_input_specs_and_tolerances() -> None:
    from trtcore.testing import default_tolerance, make_inputs

    fixed = np.arange(6, dtype=np.float32).reshape(2, 3)
    a, b, c, d = make_inputs(
        [((1000,), np.int32, (5, 9)), ((2, 3), np.float32, fixed), ((50,), BF16), ((4,), np.float64, lambda rng, s, dt: np.full(s, 2.5))],
        np.random.default_rng(0),
    )
    assert a.dtype == np.int32 and a.min() == 5 and a.max() == 8
    np.testing.assert_array_equal(b, fixed)
    assert c.dtype == BF16 and np.std(c.astype(np.float32)) > 0.5
    np.testing.assert_array_equal(d, 2.5)
    assert default_tolerance(np.float32) == (1e-5, 0.0)
    assert default_tolerance(np.float16) == (2.0**-10, 0.0) and default_tolerance(BF16) == (2.0**-7, 0.0)
    assert default_tolerance(np.int32) == (0.0, 0.0)


def test_harness_benchmark(host_cupy: None) -> None:
    from trtcore.testing import benchmark_plugin

    plugin = _HostRope(64, 64)
    stats = benchmark_plugin(None, plugin, plugin.input_specs(8, 2, 2, np.float16), rounds=3, launches=2, warmup=1)
    assert stats["bytes"] == 2 * (8 * 4 * 64 * 2) + 8 * 4 + 32 * 4 and stats["device_time_us"] > 0
    assert len(stats["device_time_us_all"]) == 3


def test_harness_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from trtcore.testing import GPUUnavailableError, check_plugin

    monkeypatch.setitem(sys.modules, "cupy", None)
    ok, why = gpu_status()
    assert not ok and "CuPy is not installed" in why
    with pytest.raises(GPUUnavailableError, match="needs a CUDA GPU: CuPy is not installed"):
        check_plugin(RopePlugin(64, 64), RopePlugin(64, 64).input_specs(2, 1, 1, np.float32))


# --------------------------------------------------------------------------------------------
# GPU: the CUDA kernel against the reference
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu() -> None:
    """Skip without CuPy or a GPU, saying why; fail instead under ``TRTCORE_REQUIRE_GPU=1``
    (``scripts/gpu-check`` sets it), so a broken GPU stack cannot pass as skipped."""
    ok, why = gpu_status()
    if not ok:
        if os.environ.get("TRTCORE_REQUIRE_GPU") == "1":
            pytest.fail(f"TRTCORE_REQUIRE_GPU=1 but {why}")
        pytest.skip(f"no GPU for the kernel tests: {why}")


DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": BF16}
#: (num_tokens, num_q_heads, num_k_heads): odd counts, GQA 4:1, MQA, one token, q == k heads
SHAPES = [(1, 4, 4), (77, 32, 8), (333, 12, 1), (1024, 8, 2)]


def _variant_plugins() -> list[tuple[str, RopePlugin]]:
    out = []
    for hd in (64, 128):
        for neox in (True, False):
            for dyn in (False, True):
                name = f"hd{hd}-{'neox' if neox else 'gptj'}{'-dynamic' if dyn else ''}"
                out.append((name, RopePlugin(hd, hd, is_neox=neox, dynamic=dyn, base=10000.0, dynamic_factor=2.0 if dyn else 0.0, max_position_embeddings=4096 if dyn else 0)))
    # partial rotary, other head sizes, attention scaling (not precompiled variants)
    out.append(("hd128-rot64-neox-yarnscale", RopePlugin(128, 64, attention_scaling=1.1386294361)))
    out.append(("hd128-rot32-neox", RopePlugin(128, 32)))
    out.append(("hd256-rot64-gptj", RopePlugin(256, 64, is_neox=False)))
    out.append(("hd96-rot24-neox-dynamic", RopePlugin(96, 24, dynamic=True, base=500000.0, dynamic_factor=4.0, max_position_embeddings=2048)))
    out.append(("hd80-rot20-gptj", RopePlugin(80, 20, is_neox=False)))
    # longrope (Phi-3): short / long frequencies chosen per token by seq_lens vs 4096 (input_specs
    # draws seq_lens on both sides); precompiled head_dim 96 and a partial-rotary one
    out.append(("hd96-longrope", RopePlugin(96, 96, longrope=True, original_max_position_embeddings=4096, attention_scaling=1.1902380714)))
    out.append(("hd128-rot64-longrope", RopePlugin(128, 64, longrope=True, original_max_position_embeddings=2048, attention_scaling=1.2)))
    return out


VARIANTS = _variant_plugins()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name,plugin", VARIANTS, ids=[n for n, _ in VARIANTS])
def test_kernel_matches_reference(gpu: None, name: str, plugin: RopePlugin, dtype: str) -> None:
    from trtcore.testing import check_plugin

    dt = DTYPES[dtype]
    for shape in SHAPES:
        rep = check_plugin(plugin, plugin.input_specs(*shape, dt, max_position=131072))
        limit = 1e-5 if dt == np.float32 else None
        if limit is not None:
            assert max(rep.max_rel_error) <= limit, str(rep)


@pytest.mark.gpu
def test_kernel_llama3_frequencies_and_leading_dims(gpu: None) -> None:
    """Real llama3 frequencies, and [batch, seq, heads, dim] inputs (as trtcore.ops passes)."""
    from trtcore.testing import check_plugin

    spec = rope_spec(trtcore_config(*CASES["llama3_8"]))
    plugin = RopePlugin.from_spec(spec)
    inv = RopePlugin.inv_freq_of(spec)
    specs = [((2, 333, 8, 128), BF16), ((2, 333, 2, 128), BF16), ((2, 333), np.int32, (0, 131072)), ((64,), np.float32, inv)]
    check_plugin(plugin, specs)


@pytest.mark.gpu
def test_kernel_in_a_network_on_the_cuda_engine(gpu: None) -> None:
    """The plugin in a network compiled by the cuda engine (enqueue on the engine's stream)
    == the NumPy reference evaluation of the same network, bit for bit."""
    import trtcore.cuda as tc
    from trtcore.gpu import cuda_backend_status
    from trtcore.runtime.trt_executor import TensorRTExecutor
    from trtcore.testing import make_inputs

    ok, why = cuda_backend_status()
    if not ok:
        pytest.skip(f"the cuda engine needs CuPy, nvmath-python and a GPU: {why}")
    plugin = PLUGINS[1]  # gptj, partial rotary (64 of 128), dynamic, attention scaling
    arrays = make_inputs(plugin.input_specs(50, 4, 2, BF16), np.random.default_rng())
    builder = tc.Builder(tc.Logger(tc.Logger.ERROR))
    net = builder.create_network(1 << int(tc.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    dt = tc.DataType.BF16
    hd = plugin.head_dim
    ins = [
        net.add_input("q", dt, (-1, 4, hd)), net.add_input("k", dt, (-1, 2, hd)),
        net.add_input("position_ids", tc.DataType.INT32, (-1,)),
        net.add_constant((plugin.rotary_dim // 2,), arrays[3]).get_output(0),
        net.add_input("seq_lens", tc.DataType.INT32, (-1,)),
    ]
    layer = net.add_plugin_v3(ins, [], base.create(plugin, tc))
    for i, n in enumerate(("q_out", "k_out")):
        layer.get_output(i).name = n
        net.mark_output(layer.get_output(i))
    feeds = {"q": arrays[0], "k": arrays[1], "position_ids": arrays[2], "seq_lens": arrays[4]}
    host = evaluate(net, feeds)
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name, a in feeds.items():
        profile.set_shape(name, a.shape, a.shape, a.shape)
    config.add_optimization_profile(profile)
    with TensorRTExecutor(tc, bytes(builder.build_serialized_network(net, config))) as ex:
        dev = ex.run(feeds)
    for n in ("q_out", "k_out"):
        np.testing.assert_array_equal(np.asarray(dev[n]).view(np.uint16), np.asarray(host[n]).view(np.uint16))


@pytest.mark.gpu
@pytest.mark.bench
def test_bench_rope_bf16(gpu: None, benchmark: Any) -> None:
    """8192 tokens, 32 q + 32 k heads, head_dim 128, bfloat16 (bench/bench_rope.py has the
    comparison with the copy bandwidth and transformers)."""
    from trtcore.testing import benchmark_plugin

    plugin = RopePlugin(128, 128)
    stats = benchmark_plugin(benchmark, plugin, plugin.input_specs(8192, 32, 32, BF16))
    assert stats["bandwidth_GBps"] > 0
