"""Packed qkv and fused RoPE of the paged attention plugin (``packed_qkv``, ``rotary_dim``).

CPU (CI):

* the fused plugin's reference equals the RoPE plugin's reference followed by the unfused
  paged-attention reference -- the pool bit for bit, the output bit for bit -- on random
  mixed batches (prefills, chunked prefills, decodes), GQA/MHA/MQA, a sliding window, neox and
  GPT-J pairing, partial rotary, YaRN-style ``attention_scaling``, LongRoPE (short and long
  frequencies chosen per sequence by ``seq_lens`` against a threshold between the batch's
  sequence lengths), float32/float16/bfloat16,
  packed and separate q/k/v; the pool is also checked slot by slot against keys rotated here
  with the RoPE plugin's reference;
* fields serialize (an unfused plugin keeps the field set it always had), shapes, dtypes,
  input lists and validation;
* the kernels with fused RoPE compile with NVRTC for sm_80, sm_89 and sm_90;
* plan rules of ``rope="attention"`` and the network ops emit (one ``qkv_proj``, one plugin, no
  RoPE layer), and the reference-backend LLM gives the tokens and log-probabilities of
  ``rope="plugin"`` on every tiny model (which tests/test_models_hf.py checks against
  transformers).

GPU (marker ``gpu``): ``enqueue`` of the fused plugin against its reference, with the
structure of tests/test_paged_attention.py's GPU tests (its ``check_gpu``): the pool bit for
bit (the kernels rotate k with the RoPE contract before writing it), the output within the
tolerance stated there, and within the float64 attention of the rotated q/k.
"""

from __future__ import annotations

import numpy as np
import pytest
from hf_models import VARIANTS, hf_models, random_prompt  # noqa: F401  (fixture)
from test_paged_attention import BF16, CASES, F16, F32, Case, bits, check_gpu, mixed_specs, seed_of

from trtcore.plugins.base import PluginError, create
from trtcore.plugins.paged_attention import PagedAttentionPlugin
from trtcore.plugins.rope import RopePlugin

DTYPES = [F32, F16, BF16]

#: fused RoPE variants: name -> (rotary_dim as a fraction of head_dim, is_neox, attention_scaling,
#: longrope)
ROPES = {
    "neox": (1.0, True, 1.0, False),
    "gptj": (1.0, False, 1.0, False),
    "neox_partial": (0.5, True, 1.0, False),
    "gptj_partial_scaled": (0.25, False, 1.1, False),
    "neox_longrope": (1.0, True, 1.19, True),
    "neox_partial_longrope": (0.5, True, 1.3, True),
}


class FusedCase(Case):
    """A :class:`test_paged_attention.Case` whose plugin takes unrotated q/k (packed into one
    qkv input or not) and rotates them itself. ``q``/``k`` become the rotated values (the RoPE
    plugin's reference, rounded to the dtype), so ``expected_pool`` and ``attention_f64`` of
    the base class describe the fused step; ``q_in``/``k_in`` are what the plugin is fed."""

    def __init__(self, specs, *, packed: bool, rope: str, **kw):
        super().__init__(specs, **kw)
        frac, neox, scaling, longrope = ROPES[rope]
        self.packed = packed
        self.unfused = self.plugin
        rd = int(self.d * frac) // 2 * 2
        # LongRoPE: a threshold with sequences on both sides (the median length), the long
        # frequencies the short ones divided by factors in [1, 8]
        original = int(np.median(self.seq_lens)) if longrope else 0
        self.plugin = PagedAttentionPlugin(
            layer_idx=self.layer, num_kv_heads=self.hkv, head_dim=self.d, block_size=self.bs, sliding_window=self.window,
            packed_qkv=packed, rotary_dim=rd, is_neox=neox, attention_scaling=scaling, original_max_position_embeddings=original,
        )  # fmt: skip
        # each token's position (cached + j), offset per case so that angles are large too
        rng = np.random.default_rng(kw.get("seed", 0) + 1)
        offset = int(rng.integers(0, 5000))
        self.position_ids = np.concatenate([np.arange(c, c + n) for c, n in specs]).astype(np.int32) + offset
        inv = 1.0 / 10000.0 ** (np.arange(0, rd, 2, dtype=np.float64) / rd)
        if longrope:
            inv = np.concatenate([inv, inv / rng.uniform(1.0, 8.0, rd // 2)])
        self.inv_freq = inv.astype(np.float32)
        self.rope = RopePlugin(head_dim=self.d, rotary_dim=rd, is_neox=neox, attention_scaling=scaling, longrope=longrope,
                               original_max_position_embeddings=original)  # fmt: skip
        #: RopePlugin's seq_lens input: each token's sequence length (longrope only)
        self.token_seq_lens = [np.repeat(self.seq_lens, np.diff(self.qsl))] if longrope else []
        self.q_in, self.k_in = self.q, self.k
        self.q, self.k = self.rope.reference(self.q_in, self.k_in, self.position_ids, self.inv_freq, *self.token_seq_lens)

    def inputs(self, pool=None):
        pool = self.pool.copy() if pool is None else pool
        if self.packed:
            qkv = np.concatenate([self.q_in, self.k_in, self.v], axis=1).reshape(self.T, -1)
            first = [qkv]
        else:
            first = [self.q_in, self.k_in, self.v]
        return [*first, pool, self.block_tables, self.seq_lens, self.qsl, self.position_ids, self.inv_freq]


def fused_case(name: str, bs: int, dtype, packed: bool, rope: str) -> FusedCase:
    spec_fn, hkv, g, d, window = CASES[name]
    seed = seed_of(name, bs, str(dtype), packed, rope)
    return FusedCase(spec_fn(bs), bs=bs, hkv=hkv, g=g, d=d, dtype=dtype, window=window, seed=seed, packed=packed, rope=rope)


# ---------------------------------------------------------------------------------------
# CPU: the reference is the RoPE plugin followed by the unfused plugin
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
@pytest.mark.parametrize("rope", sorted(ROPES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_equals_rope_plugin_then_unfused(name: str, dtype, rope: str, packed: bool) -> None:
    case = fused_case(name, 16, dtype, packed, rope)
    fused_pool = case.pool.copy()
    (got,) = case.plugin.reference(*case.inputs(fused_pool))
    # the two plugins in a row, each with its own reference
    frac, neox, scaling, longrope = ROPES[rope]
    threshold = case.plugin.original_max_position_embeddings
    assert longrope == (threshold > 0) and (not longrope or case.seq_lens.min() <= threshold < case.seq_lens.max()), case.seq_lens
    q_rot, k_rot = RopePlugin(
        head_dim=case.d, rotary_dim=case.plugin.rotary_dim, is_neox=neox, attention_scaling=scaling, longrope=longrope,
        original_max_position_embeddings=threshold,
    ).reference(case.q_in, case.k_in, case.position_ids, case.inv_freq, *case.token_seq_lens)
    two_pool = case.pool.copy()
    (want,) = case.unfused.reference(q_rot, k_rot, case.v, two_pool, case.block_tables, case.seq_lens, case.qsl)
    np.testing.assert_array_equal(bits(fused_pool), bits(two_pool))
    np.testing.assert_array_equal(bits(got), bits(want))
    # the pool slot by slot: the new slots hold the rotated keys, nothing else changed
    np.testing.assert_array_equal(bits(fused_pool), bits(case.expected_pool()))
    assert got.dtype == dtype and got.shape == (case.T, case.hq * case.d)


def test_rotation_changes_the_result() -> None:
    """Fused RoPE is not a no-op: without it the same inputs give other keys and outputs."""
    case = fused_case("mixed_gqa8", 16, F32, True, "neox")
    pool_a, pool_b = case.pool.copy(), case.pool.copy()
    (a,) = case.plugin.reference(*case.inputs(pool_a))
    (b,) = case.unfused.reference(case.q_in, case.k_in, case.v, pool_b, case.block_tables, case.seq_lens, case.qsl)
    assert not np.allclose(a, b) and not np.array_equal(bits(pool_a), bits(pool_b))


def test_packed_reference_without_rope_equals_separate() -> None:
    case = Case(mixed_specs(16), bs=16, hkv=2, g=4, d=64, dtype=BF16, seed=3)
    packed = PagedAttentionPlugin(layer_idx=case.layer, num_kv_heads=2, head_dim=64, block_size=16, packed_qkv=True)
    qkv = np.concatenate([case.q, case.k, case.v], axis=1).reshape(case.T, -1)
    pa, pb = case.pool.copy(), case.pool.copy()
    (a,) = packed.reference(qkv, pa, case.block_tables, case.seq_lens, case.qsl)
    (b,) = case.plugin.reference(*case.inputs(pb))
    np.testing.assert_array_equal(bits(a), bits(b))
    np.testing.assert_array_equal(bits(pa), bits(pb))


# ---------------------------------------------------------------------------------------
# CPU: fields, shapes, dtypes, validation
# ---------------------------------------------------------------------------------------


def _fused() -> PagedAttentionPlugin:
    return PagedAttentionPlugin(
        layer_idx=2, num_kv_heads=3, head_dim=64, block_size=16, packed_qkv=True, rotary_dim=32, is_neox=False, attention_scaling=1.1
    )


def test_fused_fields_round_trip() -> None:
    import trtcore.reference as ref

    p = _fused()
    fc = p.field_collection(ref)
    assert {"packed_qkv", "rotary_dim", "is_neox", "attention_scaling"} <= {f.name for f in fc}
    back = PagedAttentionPlugin.from_field_collection(fc)
    assert back == p and back.attention_scaling == float(np.float32(1.1))
    assert create(p, ref) == p
    trt = pytest.importorskip("tensorrt_rtx", reason="tensorrt_rtx is not installed")
    assert PagedAttentionPlugin.from_field_collection(p.field_collection(trt)) == p


def test_field_collection_without_the_new_fields_is_the_unfused_plugin() -> None:
    """An engine serialized before packed qkv / fused RoPE existed rebuilds its plugin."""
    data = {"layer_idx": 1, "num_kv_heads": 2, "head_dim": 64, "block_size": 16, "sliding_window": 0, "scale": 0.125}
    p = PagedAttentionPlugin.from_field_data({k: np.asarray([v]) for k, v in data.items()})
    assert not p.packed_qkv and p.rotary_dim == 0 and p.input_names()[:3] == ["q", "k", "v"]


def test_input_names_shapes_and_types() -> None:
    p = _fused()
    assert p.input_names() == ["qkv", "kv_pool", "block_tables", "seq_lens", "query_start_loc", "position_ids", "inv_freq"]
    hq, hkv, d = 9, 3, 64
    shapes = [(-1, (hq + 2 * hkv) * d), (4, 10, 2, hkv, 16, d), (-1, 8), (-1,), (-1,), (-1,), (16,)]
    assert p.output_shapes(shapes) == [[-1, hq * d]]
    assert p.num_q_heads((hq + 2 * hkv) * d) == hq
    with pytest.raises(PluginError, match=r"qkv has 640 features per token"):
        p.output_shapes([(-1, 640), *shapes[1:]])  # 10 heads of 64: Hq = 4 is no multiple of 3
    with pytest.raises(PluginError, match=r"inv_freq has 8 values, expected 16 \(rotary_dim // 2"):
        p.output_shapes([*shapes[:-1], (8,)])
    with pytest.raises(PluginError, match="takes 7 inputs"):
        p.output_shapes(shapes[:5])
    I32 = np.dtype(np.int32)
    dts = [BF16, BF16, I32, I32, I32, I32, F32]
    assert p.output_dtypes(dts) == [BF16]
    with pytest.raises(PluginError, match="inv_freq must be float32"):
        p.output_dtypes([*dts[:-1], BF16])
    with pytest.raises(PluginError, match="position_ids must be int32"):
        p.output_dtypes([*dts[:5], F32, F32])
    assert all(p.supports(i, [*dts, BF16], 7) for i in range(8))
    assert not p.supports(6, [*dts[:6], I32, BF16], 7) and not p.supports(1, [BF16, F16, *dts[2:], BF16], 7)
    sep = PagedAttentionPlugin(layer_idx=0, num_kv_heads=2, head_dim=64, block_size=16, rotary_dim=64)
    assert sep.input_names() == ["q", "k", "v", "kv_pool", "block_tables", "seq_lens", "query_start_loc", "position_ids", "inv_freq"]
    # the workspace of a packed input equals that of the same heads given separately
    io = [((8, (hq + 2 * hkv) * d), BF16), ((4, 10, 2, hkv, 16, d), BF16), ((8, 8), I32), ((8,), I32), ((9,), I32), ((8,), I32), ((16,), F32)]
    plain = PagedAttentionPlugin(layer_idx=2, num_kv_heads=3, head_dim=64, block_size=16)
    io_plain = [((8, hq, d), BF16), ((8, hkv, d), BF16), ((8, hkv, d), BF16), *io[1:5]]
    assert p.workspace_size(io, [((8, hq * d), BF16)]) == plain.workspace_size(io_plain, [((8, hq * d), BF16)])


def test_validation() -> None:
    with pytest.raises(PluginError, match="rotary_dim is 63"):
        PagedAttentionPlugin(layer_idx=0, num_kv_heads=1, head_dim=64, block_size=16, rotary_dim=63)
    with pytest.raises(PluginError, match="rotary_dim is 128"):
        PagedAttentionPlugin(layer_idx=0, num_kv_heads=1, head_dim=64, block_size=16, rotary_dim=128)
    with pytest.raises(PluginError, match="rotary_dim is -2"):
        PagedAttentionPlugin(layer_idx=0, num_kv_heads=1, head_dim=64, block_size=16, rotary_dim=-2)
    with pytest.raises(PluginError, match="attention_scaling is inf"):
        PagedAttentionPlugin(layer_idx=0, num_kv_heads=1, head_dim=64, block_size=16, rotary_dim=64, attention_scaling=float("inf"))
    with pytest.raises(PluginError, match="no fused RoPE"):
        PagedAttentionPlugin(layer_idx=0, num_kv_heads=1, head_dim=64, block_size=16).rope()
    with pytest.raises(PluginError, match="original_max_position_embeddings is 8, expected 0 or, with fused RoPE"):
        PagedAttentionPlugin(layer_idx=0, num_kv_heads=1, head_dim=64, block_size=16, original_max_position_embeddings=8)
    longrope = PagedAttentionPlugin(layer_idx=0, num_kv_heads=1, head_dim=64, block_size=16, rotary_dim=32, original_max_position_embeddings=8)
    assert longrope.rope().longrope and longrope.rope().num_inv_freq == 32 and longrope.defines(BF16)["LONGROPE"] == 1
    assert "LONGROPE" not in _fused().defines(BF16)


# ---------------------------------------------------------------------------------------
# CPU: the kernels compile with fused RoPE
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90"])
def test_fused_kernels_compile(arch: str) -> None:
    from trtcore import kernels

    plugins = [
        (PagedAttentionPlugin(layer_idx=0, num_kv_heads=3, head_dim=64, block_size=16, packed_qkv=True, rotary_dim=64), BF16),
        (PagedAttentionPlugin(layer_idx=0, num_kv_heads=8, head_dim=128, block_size=32, rotary_dim=32, is_neox=False), F16),
        (PagedAttentionPlugin(layer_idx=0, num_kv_heads=2, head_dim=96, block_size=16, packed_qkv=True, rotary_dim=48), F32),
        (PagedAttentionPlugin(layer_idx=0, num_kv_heads=2, head_dim=128, block_size=16, packed_qkv=True, rotary_dim=128,
                              original_max_position_embeddings=4096), BF16),
    ]
    for p, dt in plugins:
        defines = p.defines(dt)
        assert defines["ROTARY_DIM"] == p.rotary_dim and defines["NEOX"] == int(p.is_neox)
        built = kernels.compile_kernel("paged_attention", defines=defines, arch=arch)
        assert kernels.cubin_arch(built.cubin) == arch
        want = {"paged_kv_write", "paged_attn_simple"} | ({"paged_attn_decode", "paged_attn_prefill", "paged_attn_reduce"} if p.uses_tensor_cores(dt) else set())
        assert set(built.symbols) == want, (defines, built.symbols)


# ---------------------------------------------------------------------------------------
# CPU: plan rules and the network
# ---------------------------------------------------------------------------------------


def test_plan_rules() -> None:
    import tensorrt_rtx

    import trtcore.cuda as tc
    import trtcore.reference as ref
    from trtcore.builder import BuildConfig, implementations
    from trtcore.errors import InvalidArgumentError

    assert implementations(tc, BuildConfig(kv_cache="paged")) == {"rope": "plugin", "kv_cache": "paged"}  # fused: opt-in (slower on the H200)
    assert implementations(tc, BuildConfig(kv_cache="paged", rope="attention")) == {"rope": "attention", "kv_cache": "paged"}
    assert implementations(tc, BuildConfig(kv_cache="paged", rope="plugin")) == {"rope": "plugin", "kv_cache": "paged"}
    assert implementations(tc, BuildConfig())["rope"] == "plugin"  # contiguous: no paged plugin to fuse into
    assert implementations(ref, BuildConfig(rope="attention")) == {"rope": "attention", "kv_cache": "paged"}
    assert implementations(ref, BuildConfig())["rope"] == "plugin"
    with pytest.raises(InvalidArgumentError, match="rope='attention'.*needs kv_cache='paged'"):
        BuildConfig(rope="attention", kv_cache="contiguous")
    with pytest.raises(InvalidArgumentError, match="add_plugin_v3.*use rope='layers'"):
        implementations(tensorrt_rtx, BuildConfig(rope="attention", kv_cache="paged"))


@pytest.mark.parametrize("name", ["llama3_rope", "llama_dynamic_v4", "qwen2_bias", "qwen3_qknorm"])
def test_network_has_one_attention_plugin_per_layer(hf_models, name: str) -> None:  # noqa: F811
    from trtcore import LLM

    llm = LLM(hf_models.dir(name), backend="reference", dtype="float32", rope="attention", progress=False)
    assert llm.build_config.rope == "attention"
    names = [layer.name for layer in llm.executor.network.layers]
    dynamic, qknorm = name == "llama_dynamic_v4", name == "qwen3_qknorm"
    # dynamic NTK stays with the RoPE plugin; Qwen3's head norms keep separate projections
    assert any(".rotary_emb.plugin" in n for n in names) == dynamic
    assert any(n.endswith("self_attn.qkv_proj") for n in names) == (not dynamic and not qknorm)
    assert any(n.endswith("self_attn.q_heads") for n in names) == (dynamic or qknorm)


@pytest.mark.parametrize("name", ["llama3_rope", "llama_linear_v4", "llama_dynamic_v4", "mistral_sw8", "qwen2_bias", "qwen3_qknorm",
                                  "qwen2_mixed_swa"])
def test_llm_rope_in_attention_equals_rope_plugin(hf_models, name: str) -> None:  # noqa: F811
    """The reference-backend LLM with ``rope="attention"`` gives the greedy tokens and (within
    float32 noise: one fused product instead of three) the log-probabilities of
    ``rope="plugin"``, which tests/test_models_hf.py checks against transformers."""
    from trtcore import LLM, SamplingParams

    v = VARIANTS[name]
    prompt = random_prompt(np.random.default_rng(seed_of(name)), 40, v.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=v.vocab_size)
    outs = {}
    for impl in ("attention", "plugin"):
        llm = LLM(hf_models.dir(name), backend="reference", dtype="float32", rope=impl, progress=False)
        outs[impl] = llm.generate([prompt], params)[0].outputs[0]
    a, b = outs["attention"], outs["plugin"]
    assert a.token_ids == b.token_ids
    for step, (ra, rb) in enumerate(zip(a.logprobs, b.logprobs)):
        ids = sorted(ra)
        np.testing.assert_allclose([ra[i].logprob for i in ids], [rb[i].logprob for i in ids], rtol=1e-5, atol=1e-5, err_msg=f"step {step}")


# ---------------------------------------------------------------------------------------
# GPU: the fused kernels against the reference
# ---------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
@pytest.mark.parametrize("rope", sorted(ROPES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_fused_enqueue_matches_reference(name: str, dtype, rope: str, packed: bool) -> None:
    check_gpu(fused_case(name, 16, dtype, packed, rope))


@pytest.mark.gpu
@pytest.mark.parametrize("rope", ["neox", "neox_longrope"])
@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
@pytest.mark.parametrize("specs", [[(4000, 1), (2500, 1), (17, 1)], [(3000, 1), (1000, 70)]], ids=["long_decodes", "decode_and_chunk"])
def test_gpu_fused_long_sequences(specs, dtype, rope: str) -> None:
    case = FusedCase(specs, bs=16, hkv=2, g=4, d=128, dtype=dtype, num_layers=2, layer=0, seed=seed_of(specs, str(dtype)), packed=True, rope=rope)
    check_gpu(case)
