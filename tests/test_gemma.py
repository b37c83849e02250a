"""``GemmaForCausalLM``, ``Gemma2ForCausalLM``, ``Gemma3ForCausalLM`` against transformers on tiny
random checkpoints.

The checkpoints are written by transformers itself (``GemmaConfig`` / ``Gemma2Config`` /
``Gemma3TextConfig`` + the ``*ForCausalLM`` class, every parameter re-drawn with std >= 0.1 by
:func:`hf_models.redraw_weights`, saved with ``save_pretrained``). The variants cover attention
and final logit soft-capping on and off, ``query_pre_attn_scalar`` different from ``head_dim``,
sliding windows on alternating layers (Gemma 2) and on five of six (Gemma 3's pattern, here 3)
with a prompt much longer than the window, Gemma 3's local RoPE base and linearly scaled global
RoPE, q/k norms, biases, tied and untied output embeddings, and Gemma 1's legacy
``hidden_act="gelu"`` (which means the tanh GELU).

References come from transformers (eager, float64): log-probabilities of every vocabulary
token within 1e-4 relative (``|ours - hf| <= 1e-4 * max(1, |hf|)``) at the last prompt
position and the 16 decode steps after it, greedy tokens equal for 32 steps, with both KV
cache modes on the reference backend; ``tensorrt_rtx`` builds each in float16.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import ModelStore, assert_matches_hf, hf_greedy, hf_logits, load_hf, random_prompt, redraw_weights
from test_gpu_backend import cp  # noqa: F401  (the cuda backend's skip-or-fail fixture)

from trtcore import LLM, SamplingParams
from trtcore.config import ModelConfig, load_config
from trtcore.errors import ConfigError, InvalidArgumentError

PROMPT_LEN = 40
LOGPROB_STEPS = 17  # the last prompt position + 16 decode steps
GREEDY_STEPS = 32
RTOL = 1e-4
KV_CACHES = ("paged", "contiguous")
WINDOW = 8  # much shorter than the prompt


@dataclass(frozen=True)
class Gemma:
    name: str
    family: str  # "gemma", "gemma2", "gemma3"
    fields: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    vocab_size: int = 160
    num_hidden_layers: int = 2


GEMMA = {
    v.name: v
    for v in [
        Gemma("gemma1_legacy_gelu", "gemma", {"hidden_act": "gelu", "tie_word_embeddings": True}, seed=31),
        Gemma(
            "gemma2_softcap",
            "gemma2",
            {"attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0, "query_pre_attn_scalar": 24, "sliding_window": WINDOW},
            seed=32,
            num_hidden_layers=3,
        ),
        Gemma(
            "gemma2_nocap_bias_untied",
            "gemma2",
            {"attn_logit_softcapping": None, "final_logit_softcapping": None, "query_pre_attn_scalar": 8, "sliding_window": WINDOW,
             "attention_bias": True, "tie_word_embeddings": False},
            seed=33,
        ),
        Gemma(
            "gemma3_local_rope",
            "gemma3",
            {"query_pre_attn_scalar": 32, "sliding_window": WINDOW, "sliding_window_pattern": 3, "final_logit_softcapping": 4.0,
             "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 20000.0},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}}},
            seed=34,
            num_hidden_layers=4,
        ),
        # transformers' Gemma 3 attention never applies attn_logit_softcapping: neither may trtcore
        Gemma(
            "gemma3_attn_softcap_unread",
            "gemma3",
            {"query_pre_attn_scalar": 12, "attn_logit_softcapping": 1.5, "sliding_window": WINDOW,
             "layer_types": ["full_attention", "sliding_attention"]},
            seed=35,
        ),
    ]
}


#: GPU-only variants (head_dim 256: the paged attention CUDA kernels take multiples of 32)
GPU_GEMMA = {
    v.name: v
    for v in [
        Gemma("gemma2_d256_softcap", "gemma2", {"head_dim": 256, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
                                                 "query_pre_attn_scalar": 200, "sliding_window": WINDOW}, seed=36, num_hidden_layers=3),
        Gemma("gemma3_d256", "gemma3", {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": WINDOW, "sliding_window_pattern": 2,
                                        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 20000.0},
                                                            "sliding_attention": {"rope_type": "default", "rope_theta": 300.0}}},
              seed=37),
    ]
}


def _hf_config(v: Gemma) -> Any:
    import transformers

    cls = {"gemma": transformers.GemmaConfig, "gemma2": transformers.Gemma2Config, "gemma3": transformers.Gemma3TextConfig}[v.family]
    common = dict(vocab_size=v.vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=v.num_hidden_layers,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-5,
                  bos_token_id=2, eos_token_id=1, pad_token_id=0)
    if v.family != "gemma3":
        common["rope_parameters"] = {"rope_type": "default", "rope_theta": 5000.0}
    return cls(**{**common, **v.fields})


def _write(v: Gemma, path: Path) -> Path:
    import torch
    import transformers

    cls = {"gemma": transformers.GemmaForCausalLM, "gemma2": transformers.Gemma2ForCausalLM, "gemma3": transformers.Gemma3ForCausalLM}[v.family]
    torch.manual_seed(v.seed)
    model = cls(_hf_config(v))
    redraw_weights(model, v.seed)  # std >= 0.1; norm weights 1 + 0.1 randn (Gemma scales by 1 + weight)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    return ModelStore(tmp_path_factory.mktemp("gemma"), lambda name, path: _write({**GEMMA, **GPU_GEMMA}[name], path))


def _prompt(name: str) -> list[int]:
    v = {**GEMMA, **GPU_GEMMA}[name]
    return random_prompt(np.random.default_rng([v.seed, PROMPT_LEN]), PROMPT_LEN, v.vocab_size)


# ---------------------------------------------------------------------------------------
# the checkpoints are what they claim to be, and their distinguishing fields matter


@pytest.mark.parametrize("name", list(GEMMA))
def test_checkpoint_is_the_variant(store: ModelStore, name: str) -> None:
    v = GEMMA[name]
    hf = store.hf(name)
    cfg = load_config(store.dir(name))
    assert cfg.architecture == type(hf).__name__ and cfg.head_dim == 16
    assert all(p.std() >= 0.09 for n, p in hf.named_parameters() if n.endswith("weight") and "norm" not in n)
    assert cfg.hidden_act == "gelu_pytorch_tanh"
    if v.family != "gemma":
        assert tuple(hf.config.layer_types) == cfg.layer_types and "sliding_attention" in cfg.layer_types
        assert cfg.sliding_window == hf.config.sliding_window == WINDOW
        for k in ("query_pre_attn_scalar", "final_logit_softcapping") + (("attn_logit_softcapping",) if v.family == "gemma2" else ()):
            assert cfg.family_fields[k] == getattr(hf.config, k), k
        assert cfg.family_fields["query_pre_attn_scalar"] != cfg.head_dim
    if v.family == "gemma3":
        assert cfg.family_fields["rope_local_base_freq"] == hf.config.rope_parameters["sliding_attention"]["rope_theta"]
        assert cfg.rope_theta == hf.config.rope_parameters["full_attention"]["rope_theta"]
    assert cfg.tie_word_embeddings == hf.config.tie_word_embeddings
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "name, override",
    [
        ("gemma2_softcap", {"attn_logit_softcapping": None}),
        ("gemma2_softcap", {"final_logit_softcapping": None}),
        ("gemma2_softcap", {"query_pre_attn_scalar": 16}),
        ("gemma2_softcap", {"sliding_window": 64}),
    ],
)
def test_distinguishing_fields_change_hf_logits(store: ModelStore, name: str, override: dict[str, Any]) -> None:
    """Each field the variants cover matters on the test prompt (so the comparisons test it)."""
    p = _prompt(name)
    ref = hf_logits(store.hf(name), p)[-1]
    other = hf_logits(load_hf(store.dir(name), **override), p)[-1]
    assert np.abs(other - ref).max() > 0.05, override


def test_gemma3_attention_does_not_apply_attn_logit_softcapping(store: ModelStore) -> None:
    """transformers' Gemma3Attention stores attn_logit_softcapping but never passes it on, so
    the field changes nothing (trtcore does not read it; the log-prob test checks that)."""
    name = "gemma3_attn_softcap_unread"
    assert store.hf(name).config.attn_logit_softcapping == 1.5
    p = _prompt(name)
    other = hf_logits(load_hf(store.dir(name), attn_logit_softcapping=None), p)[-1]
    np.testing.assert_array_equal(other, hf_logits(store.hf(name), p)[-1])
    assert "attn_logit_softcapping" not in load_config(store.dir(name)).family_fields


# ---------------------------------------------------------------------------------------
# log-probabilities and greedy tokens against transformers


def check_against_hf(store: ModelStore, name: str, kv_cache: str, backend: str = "reference") -> None:
    """Greedy tokens equal to transformers' for 32 steps, log-probabilities within 1e-4
    relative at the last prompt position and 16 decode steps."""
    p = _prompt(name)
    params = SamplingParams(temperature=0, max_tokens=GREEDY_STEPS, ignore_eos=True, logprobs={**GEMMA, **GPU_GEMMA}[name].vocab_size)
    device = {"device": "cuda"} if backend == "cuda" else {}
    [out] = store.llm(name, kv_cache, backend=backend, **device).generate(p, params)
    assert_matches_hf(out, *hf_greedy(store.hf(name), p, GREEDY_STEPS), LOGPROB_STEPS, RTOL)


@pytest.mark.parametrize("kv_cache", KV_CACHES)
@pytest.mark.parametrize("name", list(GEMMA))
def test_logprobs_and_greedy_match_hf(store: ModelStore, name: str, kv_cache: str) -> None:
    check_against_hf(store, name, kv_cache)


@pytest.mark.parametrize("rope", ["layers", "plugin", "attention"])
def test_gemma3_two_ropes_with_every_rope_implementation(store: ModelStore, rope: str) -> None:
    """Gemma 3's global and local RoPE side by side in one network, with each RoPE
    implementation (composed layers, the RoPE plugin, fused into the paged attention plugin)."""
    name = "gemma3_local_rope"
    p = _prompt(name)
    llm = LLM(store.dir(name), backend="reference", dtype="float32", kv_cache="paged", rope=rope, progress=False)
    [out] = llm.generate(p, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=GEMMA[name].vocab_size))
    tokens, rows = hf_greedy(store.hf(name), p, 4)
    assert list(out.outputs[0].token_ids) == tokens
    ours = np.array([[d[t].logprob for t in range(GEMMA[name].vocab_size)] for d in out.outputs[0].logprobs])
    np.testing.assert_allclose(ours, rows, rtol=RTOL, atol=RTOL)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_cache", KV_CACHES)
@pytest.mark.parametrize("name", list(GPU_GEMMA))
def test_cuda_engine_matches_hf(cp: Any, store: ModelStore, name: str, kv_cache: str) -> None:  # noqa: F811
    """The cuda engine (float32; paged: the attention plugin's kernels with soft-capping and
    head_dim 256) against transformers (float64, CPU), as the reference backend is."""
    check_against_hf(store, name, kv_cache, backend="cuda")


# ---------------------------------------------------------------------------------------
# config fields: transformers' defaults, honoured or refused


def _config(model_type: str, **fields: Any) -> dict[str, Any]:
    arch = {"gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}[model_type]
    d = {"architectures": [arch], "model_type": model_type, "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 7, "num_attention_heads": 4, "num_key_value_heads": 2}
    d.update(fields)
    return d


@pytest.mark.parametrize("model_type", ["gemma", "gemma2", "gemma3_text"])
def test_config_defaults_are_transformers(model_type: str) -> None:
    import transformers

    cls = {"gemma": transformers.GemmaConfig, "gemma2": transformers.Gemma2Config, "gemma3_text": transformers.Gemma3TextConfig}[model_type]
    d = _config(model_type)
    hf = cls(**{k: v for k, v in d.items() if k not in ("architectures", "model_type")})
    cfg = ModelConfig.from_dict(d)
    assert (cfg.head_dim, cfg.num_key_value_heads, cfg.max_position_embeddings) == (hf.head_dim, hf.num_key_value_heads, hf.max_position_embeddings)
    assert (cfg.rms_norm_eps, cfg.tie_word_embeddings, cfg.attention_bias) == (hf.rms_norm_eps, hf.tie_word_embeddings, hf.attention_bias)
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (hf.bos_token_id, (hf.eos_token_id,), hf.pad_token_id)
    rp = hf.rope_parameters.get("full_attention", hf.rope_parameters)
    assert cfg.rope_theta == rp["rope_theta"]
    if model_type == "gemma":
        assert cfg.hidden_act == hf.hidden_act and cfg.layer_types == ("full_attention",) * 7
        return
    assert cfg.hidden_act == hf.hidden_activation
    assert cfg.layer_types == tuple(hf.layer_types) and cfg.sliding_window == hf.sliding_window
    for k in ("query_pre_attn_scalar", "final_logit_softcapping") + (("attn_logit_softcapping",) if model_type == "gemma2" else ()):
        assert cfg.family_fields[k] == getattr(hf, k), k
    if model_type == "gemma3_text":
        assert cfg.family_fields["rope_local_base_freq"] == hf.rope_parameters["sliding_attention"]["rope_theta"]


def test_gemma3_v4_dialect() -> None:
    """Gemma 3's config.json as transformers 4.x wrote it: rope_theta, rope_scaling (global),
    rope_local_base_freq, sliding_window_pattern (as Gemma3TextConfig reads them)."""
    import transformers

    fields = dict(rope_theta=12345.0, rope_scaling={"rope_type": "linear", "factor": 8.0}, rope_local_base_freq=777.0, sliding_window_pattern=4)
    d = _config("gemma3_text", **fields)
    hf = transformers.Gemma3TextConfig(**{k: v for k, v in d.items() if k not in ("architectures", "model_type")})
    cfg = ModelConfig.from_dict(d)
    assert cfg.layer_types == tuple(hf.layer_types)
    assert cfg.rope_theta == hf.rope_parameters["full_attention"]["rope_theta"] == 12345.0
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert cfg.family_fields["rope_local_base_freq"] == hf.rope_parameters["sliding_attention"]["rope_theta"] == 777.0


@pytest.mark.parametrize("name", list(GEMMA))
def test_to_dict_loads_back_in_transformers(store: ModelStore, name: str) -> None:
    """ModelConfig.to_dict() is a config.json transformers' config class reads as the original
    (Gemma 3: rope_parameters per layer type)."""
    hf = store.hf(name).config
    d = load_config(store.dir(name)).to_dict()
    back = type(hf)(**{k: v for k, v in d.items() if k not in ("architectures", "model_type")})
    fields = ["rope_parameters", "head_dim", "num_key_value_heads", "tie_word_embeddings", "attention_bias"]
    if GEMMA[name].family != "gemma":
        fields += ["layer_types", "sliding_window", "query_pre_attn_scalar", "final_logit_softcapping", "hidden_activation"]
    if GEMMA[name].family == "gemma2":  # Gemma 3 does not read it (test_gemma3_attention_does_not_apply_attn_logit_softcapping)
        fields.append("attn_logit_softcapping")
    for f in fields:
        assert getattr(back, f) == getattr(hf, f), f


def test_gemma1_legacy_gelu_means_tanh() -> None:
    import transformers

    hf = transformers.GemmaConfig(hidden_act="gelu")
    assert ModelConfig.from_dict(_config("gemma", hidden_act="gelu")).hidden_act == hf.hidden_act == "gelu_pytorch_tanh"


@pytest.mark.parametrize(
    "model_type, fields, match",
    [
        ("gemma2", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ("gemma3_text", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ("gemma2", {"hidden_activation": "relu"}, "hidden_activation"),
        ("gemma", {"hidden_act": "relu"}, "hidden_act"),
        ("gemma2", {"attn_logit_softcapping": -1.0}, "attn_logit_softcapping"),
        ("gemma2", {"query_pre_attn_scalar": None}, "query_pre_attn_scalar"),
        ("gemma3_text", {"sliding_window_pattern": None}, "sliding_window_pattern"),
        ("gemma3_text", {"sliding_window_pattern": 0}, "sliding_window_pattern"),
        ("gemma3_text", {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                             "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}}, "sliding layers"),
    ],
)
def test_config_fields_trtcore_cannot_honour_are_refused(model_type: str, fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_dict(_config(model_type, **fields))


def test_family_records() -> None:
    from trtcore.families import family_of
    from trtcore.models import SUPPORTED_ARCHITECTURES, family_for

    for arch in ("GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM"):
        assert arch in SUPPORTED_ARCHITECTURES and arch in family_for(arch).ARCHITECTURES
    assert family_of("gemma2").tensor("post_feedforward_layernorm", 3) == "model.layers.3.post_feedforward_layernorm.weight"


def test_native_attention_refuses_soft_capping(store: ModelStore) -> None:
    import trtcore.reference as ref
    from trtcore.builder import BuildConfig, define_network
    from trtcore.checkpoint import Checkpoint

    name = "gemma2_softcap"
    with Checkpoint(store.dir(name)) as weights, pytest.raises(InvalidArgumentError, match="soft-capping"):
        define_network(ref, load_config(store.dir(name)), weights, BuildConfig(dtype="float32", max_batch_size=1, max_seq_len=64, kv_cache="contiguous", attention="native"))


# ---------------------------------------------------------------------------------------
# trtcore check --bisect


def test_bisect_reports_every_module_within_tolerance(store: ModelStore) -> None:
    from trtcore.check import compare

    for name in ("gemma2_softcap", "gemma3_local_rope"):
        report = compare(store.dir(name), _prompt(name)[:20])
        assert report.ok and all(m.rel_error is not None for m in report.modules), report.table()


def test_bisect_names_the_perturbed_layer(store: ModelStore, tmp_path: Path) -> None:
    """A copy with one layer's o_proj perturbed, against the original: layer 1's attention is
    the first divergence."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from trtcore.check import compare

    name = "gemma2_softcap"
    copy = tmp_path / "perturbed"
    shutil.copytree(store.dir(name), copy)
    f = copy / "model.safetensors"
    tensors = load_file(f)
    key = "model.layers.1.self_attn.o_proj.weight"
    tensors[key] = tensors[key] + np.float32(0.05) * np.random.default_rng(0).standard_normal(tensors[key].shape).astype(np.float32)
    save_file(tensors, f, metadata={"format": "pt"})
    report = compare(copy, _prompt(name)[:20], reference=store.dir(name))
    first = report.first_divergence
    assert first is not None and first.module == "model.layers.1.self_attn", report.table()


# ---------------------------------------------------------------------------------------
# tensorrt_rtx builds it


@pytest.mark.parametrize("name", ["gemma1_legacy_gelu", "gemma2_softcap", "gemma3_local_rope"])
def test_rtx_builds_float16(store: ModelStore, name: str) -> None:
    import tensorrt_rtx as trt

    from trtcore.builder import BuildConfig, build_engine, define_network
    from trtcore.checkpoint import Checkpoint

    with Checkpoint(store.dir(name)) as weights:
        d = define_network(trt, load_config(store.dir(name)), weights, BuildConfig(dtype="float16", max_batch_size=2, max_seq_len=64))
        engine = build_engine(d, "sm89")
    assert len(engine) > 1000


def test_awq_refuses_gemma(store: ModelStore) -> None:
    """AWQ's scales fold into Llama-style norms (weight * x); Gemma's are (1 + weight) * x and
    Gemma 2/3's post_attention_layernorm does not feed the MLP: refused, not folded wrongly."""
    from trtcore.awq import awq_plan

    with pytest.raises(InvalidArgumentError, match="Gemma2ForCausalLM.*not supported"):
        awq_plan(store.dir("gemma2_softcap"), None, lambda w: w, token_ids=[[3, 4, 5]])
