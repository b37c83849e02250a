"""``Phi3ForCausalLM`` (Phi-3 / Phi-3.5 mini) against transformers on tiny random checkpoints.

The checkpoints are written by transformers itself (``Phi3Config`` + ``Phi3ForCausalLM``, every
parameter re-drawn with std >= 0.1 by :func:`hf_models.redraw_weights`, saved with
``save_pretrained``). The variants cover:

* ``longrope`` whose threshold the decode steps cross: ``original_max_position_embeddings`` 48,
  a 40-token prompt; transformers rotates the prompt and the steps at positions < 48 with the
  short factors, every later step with the long ones, and the cached keys keep their rotation;
* ``longrope`` past the threshold from the prompt on (24 < 40), with partial rotary 0.5, the
  v4 dialect (``rope_scaling`` with the legacy type name ``"yarn"``, which Phi-3 maps to
  ``longrope``; top-level ``rope_theta``, ``torch_dtype``), MHA;
* no ``rope_scaling``, a sliding window of 8 on every layer, GQA 4:1, tied embeddings.

References come from transformers (eager, float64) decoding as ``generate`` does, with its KV
cache (:func:`hf_models.hf_greedy_cached`): log-probabilities of every vocabulary token within
1e-4 relative (``|ours - hf| <= 1e-4 * max(1, |hf|)``) at the last prompt position and the 16
decode steps after it, greedy tokens equal for 32 steps, with both KV cache modes on the
reference backend (and, for the crossing variant, the composed-layers RoPE and LongRoPE fused into
the paged attention plugin); ``tensorrt_rtx``
builds each in float16; ``trtcore check --bisect`` aligns every module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import ModelStore, assert_matches_hf, hf_greedy, hf_greedy_cached, load_hf, random_prompt, redraw_weights

from trtcore import LLM, SamplingParams
from trtcore.config import ModelConfig, load_config
from trtcore.errors import ConfigError

PROMPT_LEN = 40
LOGPROB_STEPS = 17  # the last prompt position + 16 decode steps
GREEDY_STEPS = 32
RTOL = 1e-4
KV_CACHES = ("paged", "contiguous")
ROPE_THETA = 5000.0  # not the default 10000, so that a dropped value shows


@dataclass(frozen=True)
class Phi3:
    name: str
    num_key_value_heads: int = 2
    rope: dict[str, Any] | None = None
    original_max_position_embeddings: int = 4096
    partial_rotary_factor: float = 1.0
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    config_style: str = "v5"
    extra: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    vocab_size: int = 160


def _factors(seed: int, n: int, lo: float, hi: float) -> list[float]:
    return sorted(float(x) for x in np.random.default_rng(seed).uniform(lo, hi, n))


PHI3 = {
    v.name: v
    for v in [
        Phi3("phi3_longrope_cross", rope={"rope_type": "longrope", "short_factor": _factors(1, 8, 1.0, 1.5), "long_factor": _factors(2, 8, 1.5, 9.0)},
             original_max_position_embeddings=48, seed=31),
        Phi3("phi3_longrope_long_partial_v4", num_key_value_heads=4, rope={"type": "yarn", "short_factor": _factors(3, 4, 1.0, 1.2),
             "long_factor": _factors(4, 4, 2.0, 6.0)}, original_max_position_embeddings=24, partial_rotary_factor=0.5, config_style="v4", seed=32),
        Phi3("phi3_plain_sw8_tied", num_key_value_heads=1, sliding_window=8, tie_word_embeddings=True, seed=33),
    ]
}


def _write(v: Phi3, path: Path) -> Path:
    import torch
    import transformers

    rope = {"rope_type": "default", **(v.rope or {}), "rope_theta": ROPE_THETA, "partial_rotary_factor": v.partial_rotary_factor}
    cfg = transformers.Phi3Config(
        vocab_size=v.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=v.num_key_value_heads,
        intermediate_size=96,
        max_position_embeddings=256,
        original_max_position_embeddings=v.original_max_position_embeddings,
        rms_norm_eps=1e-4,  # not the default 1e-5
        rope_parameters=rope,
        sliding_window=v.sliding_window,
        tie_word_embeddings=v.tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(v.seed)
    model = transformers.Phi3ForCausalLM(cfg)
    redraw_weights(model, v.seed)  # std >= 0.1 everywhere; norm weights 1 + 0.1 randn
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    if v.config_style == "v4":  # as Phi-3's own config.json: rope_scaling with "type", top-level rope_theta, torch_dtype
        f = path / "config.json"
        d = json.loads(f.read_text())
        rp = d.pop("rope_parameters")
        d["rope_theta"], d["partial_rotary_factor"] = rp.pop("rope_theta"), rp.pop("partial_rotary_factor")
        rp.pop("original_max_position_embeddings", None)  # Phi-3 keeps it at the top level
        rp.pop("rope_type", None)
        d["rope_scaling"] = rp  # {"type": "yarn", short_factor, long_factor}
        d["torch_dtype"] = d.pop("dtype")
        f.write_text(json.dumps(d, indent=2))
    return path


class _Store(ModelStore):
    """The module's checkpoints, and transformers' reference decoding of each."""

    def __init__(self, root: Path):
        super().__init__(root, lambda name, path: _write(PHI3[name], path))
        self._ref: dict[str, tuple[list[int], np.ndarray]] = {}

    def reference(self, name: str) -> tuple[list[int], np.ndarray]:
        """transformers' greedy tokens and log-prob rows, decoding with its KV cache."""
        if name not in self._ref:
            self._ref[name] = hf_greedy_cached(self.hf(name), _prompt(name), GREEDY_STEPS)
        return self._ref[name]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> _Store:
    return _Store(tmp_path_factory.mktemp("phi3"))


def _prompt(name: str) -> list[int]:
    v = PHI3[name]
    return random_prompt(np.random.default_rng([v.seed, PROMPT_LEN]), PROMPT_LEN, v.vocab_size)


# ---------------------------------------------------------------------------------------
# the checkpoints are what they claim to be, and their distinguishing fields matter


@pytest.mark.parametrize("name", list(PHI3))
def test_checkpoint_is_the_variant(store: _Store, name: str) -> None:
    v = PHI3[name]
    hf = store.hf(name)
    rp = hf.config.rope_parameters
    assert rp["rope_type"] == ("longrope" if v.rope else "default") and rp["rope_theta"] == ROPE_THETA
    assert rp["partial_rotary_factor"] == v.partial_rotary_factor and hf.config.sliding_window == v.sliding_window
    assert hf.model.layers[0].self_attn.qkv_proj.weight.shape == (64 + 2 * 16 * v.num_key_value_heads, 64)
    assert all(p.std() >= 0.09 for n, p in hf.named_parameters() if n.endswith("weight") and "norm" not in n)
    cfg = load_config(store.dir(name))
    assert cfg.model_type == "phi3" and cfg.rope_theta == ROPE_THETA and cfg.partial_rotary_factor == v.partial_rotary_factor
    assert cfg.sliding_window == v.sliding_window and cfg.num_key_value_heads == v.num_key_value_heads
    if v.rope:
        assert cfg.rope_scaling["rope_type"] == "longrope"
        assert cfg.rope_scaling["original_max_position_embeddings"] == v.original_max_position_embeddings == rp["original_max_position_embeddings"]
    assert not (cfg.qkv_bias or cfg.o_bias or cfg.mlp_bias)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


def test_longrope_crossing_shows_in_transformers(store: _Store) -> None:
    """The crossing variant's reference differs from full re-forwards once the steps pass
    position 48 (the cache keeps the short rotation; a full forward re-rotates all with the
    long factors) and not before: the comparisons below test transformers' cached behaviour."""
    name = "phi3_longrope_cross"
    cached = store.reference(name)[1][:LOGPROB_STEPS]
    _, full = hf_greedy(store.hf(name), _prompt(name), LOGPROB_STEPS)
    diff = np.abs(cached - full).max(-1)
    assert diff[:9].max() < 1e-9  # steps at positions 39..47 (sequence lengths <= 48)
    assert diff[9:].min() > 1e-3  # from position 48 on


def test_distinguishing_fields_change_hf_logits(store: _Store) -> None:
    """Partial rotary, the long factors and the sliding window each matter on the test prompts."""
    import torch

    from hf_models import hf_logits

    for name, override in (
        ("phi3_longrope_long_partial_v4", {"long_factor": [1.0] * 4}),
        ("phi3_longrope_long_partial_v4", {"partial_rotary_factor": 1.0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}),
    ):
        p = _prompt(name)
        ref = hf_logits(store.hf(name), p)[-1]
        hf = load_hf(store.dir(name))
        hf.config.rope_parameters.update(override)
        hf.model.rotary_emb.__init__(hf.config)  # recompute the frequencies
        hf.model.rotary_emb.to(torch.float64)
        assert np.abs(hf_logits(hf, p)[-1] - ref).max() > 0.1, override
    name = "phi3_plain_sw8_tied"
    p = _prompt(name)
    assert np.abs(hf_logits(load_hf(store.dir(name), sliding_window=None), p)[-1] - hf_logits(store.hf(name), p)[-1]).max() > 0.1


# ---------------------------------------------------------------------------------------
# log-probabilities and greedy tokens against transformers


def _check_generation(store: _Store, name: str, llm: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=GREEDY_STEPS, ignore_eos=True, logprobs=PHI3[name].vocab_size)
    [out] = llm.generate(_prompt(name), params)
    assert_matches_hf(out, *store.reference(name), LOGPROB_STEPS, RTOL)


@pytest.mark.parametrize("kv_cache", KV_CACHES)
@pytest.mark.parametrize("name", list(PHI3))
def test_logprobs_and_greedy_match_hf(store: _Store, name: str, kv_cache: str) -> None:
    """The default RoPE implementation on the reference backend (the RoPE plugin)."""
    _check_generation(store, name, LLM(store.dir(name), backend="reference", dtype="float32", kv_cache=kv_cache, progress=False))


@pytest.mark.parametrize("kv_cache", KV_CACHES)
def test_composed_layers_rope_crossing_matches_hf(store: _Store, kv_cache: str) -> None:
    """The composed-layers RoPE (what tensorrt_rtx builds) over the decode steps that cross
    original_max_position_embeddings."""
    name = "phi3_longrope_cross"
    _check_generation(store, name, LLM(store.dir(name), backend="reference", dtype="float32", kv_cache=kv_cache, rope="layers", progress=False))


def test_longrope_fused_into_paged_attention_matches_hf(store: _Store) -> None:
    """``rope="attention"``: LongRoPE inside the paged attention plugin (it picks each
    sequence's short or long frequencies by its ``seq_lens``); no RoPE plugin, no
    ``rope_seq_lens`` input."""
    name = "phi3_longrope_cross"
    llm = LLM(store.dir(name), backend="reference", dtype="float32", kv_cache="paged", rope="attention", progress=False)
    names = [layer.name for layer in llm.executor.network.layers]
    assert not any(".rotary_emb.plugin" in n for n in names) and any(n.endswith("self_attn.qkv_proj") for n in names)
    net = llm.executor.network
    assert "rope_seq_lens" not in [net.get_input(i).name for i in range(net.num_inputs)]
    _check_generation(store, name, llm)


# ---------------------------------------------------------------------------------------
# config fields: honoured or refused


def _phi3_config(**fields: Any) -> dict[str, Any]:
    d = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 100, "hidden_size": 64,
         "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4}
    d.update(fields)
    return d


def _hf_config(d: dict[str, Any]) -> Any:
    from transformers import Phi3Config

    return Phi3Config(**{k: v for k, v in d.items() if k not in ("architectures", "model_type")})


def test_family_record() -> None:
    from trtcore.families import family_of
    from trtcore.models import SUPPORTED_ARCHITECTURES, family_for

    fam = family_of("phi3")
    assert fam.partial_rotary_factor is None  # the config's is applied
    assert fam.tensor("qkv_proj", 3) == "model.layers.3.self_attn.qkv_proj.weight"
    assert fam.tensor("gate_up_proj", 0) == "model.layers.0.mlp.gate_up_proj.weight"
    assert fam.packed_modules == {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    assert "Phi3ForCausalLM" in SUPPORTED_ARCHITECTURES and family_for("Phi3ForCausalLM").ARCHITECTURES == ("Phi3ForCausalLM",)


def test_split_fused_is_transformers_slicing() -> None:
    """q | k | v rows of qkv_proj (Phi3Attention slices its output) and gate | up rows of
    gate_up_proj (Phi3MLP's chunk(2, dim=-1)), read through SplitFused."""
    import torch

    from trtcore.models.phi3 import SplitFused

    cfg = ModelConfig.from_dict(_phi3_config(num_key_value_heads=1))
    rng = np.random.default_rng(0)
    qkv, gate_up = rng.standard_normal((64 + 2 * 16, 64)), rng.standard_normal((2 * 96, 64))
    store = {"model.layers.1.self_attn.qkv_proj.weight": qkv, "model.layers.1.mlp.gate_up_proj.weight": gate_up, "model.norm.weight": np.ones(64)}

    class Weights:
        def get(self, name: str, shape: Any = None, dtype: Any = None) -> np.ndarray:
            assert shape is None or store[name].shape == tuple(shape)
            return store[name]

        def __contains__(self, name: object) -> bool:
            return name in store

    w = SplitFused(Weights(), cfg)
    x = rng.standard_normal((3, 64))
    y = torch.from_numpy(x @ qkv.T)
    want = {"q_proj": y[..., :64], "k_proj": y[..., 64:80], "v_proj": y[..., 80:]}
    gate, up = torch.from_numpy(x @ gate_up.T).chunk(2, dim=-1)
    want.update(gate_proj=gate, up_proj=up)
    for role, ref in want.items():
        part = "self_attn" if role[0] in "qkv" else "mlp"
        name = f"model.layers.1.{part}.{role}.weight"
        assert name in w
        np.testing.assert_array_equal(x @ w.get(name).T, ref.numpy())
    assert w.get("model.norm.weight") is store["model.norm.weight"]


def test_config_defaults_are_phi3_config() -> None:
    d = _phi3_config()
    hf = _hf_config(d)
    cfg = ModelConfig.from_dict(d)
    assert cfg.num_key_value_heads == hf.num_key_value_heads == 4 and cfg.head_dim == 16
    assert cfg.rms_norm_eps == hf.rms_norm_eps and cfg.hidden_act == hf.hidden_act
    assert cfg.max_position_embeddings == hf.max_position_embeddings and cfg.rope_theta == hf.rope_parameters["rope_theta"]
    assert cfg.rope_scaling is None and cfg.sliding_window is hf.sliding_window is None
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (hf.bos_token_id, (hf.eos_token_id,), hf.pad_token_id)
    assert cfg.tie_word_embeddings == hf.tie_word_embeddings


def test_original_max_position_embeddings_at_the_top_level_wins() -> None:
    """Phi3Config's own original_max_position_embeddings (default 4096) replaces the one inside
    the RoPE parameters (transformers' standardize_rope_params)."""
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8, "original_max_position_embeddings": 100}
    for top in ({}, {"original_max_position_embeddings": 64}):
        d = _phi3_config(max_position_embeddings=8192, rope_parameters=dict(rope), **top)
        want = _hf_config(d).rope_parameters["original_max_position_embeddings"]
        assert ModelConfig.from_dict(d).rope_scaling["original_max_position_embeddings"] == want == top.get("original_max_position_embeddings", 4096)


@pytest.mark.parametrize("alias", ["su", "yarn", "longrope"])
def test_legacy_rope_type_names_are_longrope(alias: str) -> None:
    d = _phi3_config(max_position_embeddings=8192, original_max_position_embeddings=512,
                     rope_scaling={"type": alias, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8})
    cfg = ModelConfig.from_dict(d)
    assert cfg.rope_scaling["rope_type"] == "longrope" and "type" not in cfg.rope_scaling
    if alias != "su":  # transformers 5.x maps "su" too but then misses original_max_position_embeddings
        assert _hf_config(d).rope_parameters["rope_type"] == "longrope"


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "Phi-3 takes 'default' or 'longrope'"),
        ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "Phi-3 takes 'default' or 'longrope'"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
        ({"rope_scaling": {"type": "longrope", "long_factor": [1.0] * 8}}, "short_factor"),
    ],
)
def test_config_fields_trtcore_cannot_honour_are_refused(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_dict(_phi3_config(**fields))


# ---------------------------------------------------------------------------------------
# tensorrt_rtx builds it; check --bisect aligns it


@pytest.mark.parametrize("name", list(PHI3))
def test_rtx_builds_float16(store: _Store, name: str) -> None:
    import tensorrt_rtx as trt

    from trtcore.builder import BuildConfig, build_engine, define_network
    from trtcore.checkpoint import Checkpoint

    with Checkpoint(store.dir(name)) as weights:
        d = define_network(trt, load_config(store.dir(name)), weights, BuildConfig(dtype="float16", max_batch_size=2, max_seq_len=64))
        engine = build_engine(d, "sm89")
    assert len(engine) > 1000


@pytest.mark.parametrize("kv_cache", KV_CACHES)
def test_check_bisect_within_tolerance_and_finds_a_perturbed_layer(store: _Store, kv_cache: str, tmp_path: Path) -> None:
    """A 60-token prompt (long factors, past original_max_position_embeddings 48): every
    module within 1e-4; a copy whose layer-1 o_proj was perturbed diverges first at layer 1's
    attention."""
    from test_check_bisect import _perturbed_copy

    from trtcore.check import FIRST_DIVERGENCE, OK, compare

    name = "phi3_longrope_cross"
    ids = random_prompt(np.random.default_rng(5), 60, PHI3[name].vocab_size)
    report = compare(store.dir(name), ids, kv_cache=kv_cache, tolerance=1e-4)
    assert report.ok and all(m.status == OK for m in report.modules), report.table()
    assert len(report.modules) == 2 + 3 * 2 + 1
    if kv_cache == "paged":
        bad = _perturbed_copy(store.dir(name), tmp_path / "perturbed")
        report = compare(bad, ids, kv_cache=kv_cache, tolerance=1e-4, reference=store.dir(name))
        first = report.first_divergence
        assert first is not None and first.module == "model.layers.1.self_attn" and first.status == FIRST_DIVERGENCE, report.table()
