"""Tests of trtcore.config against transformers' own config classes (the reference)."""

from __future__ import annotations

import dataclasses
import json
import random
import re

import numpy as np
import pytest
import transformers
from transformers import AutoConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from trtcore.config import (
    GenerationConfig,
    ModelConfig,
    load_config,
    load_generation_config,
)
from trtcore.errors import ConfigError, UnsupportedArchitectureError

transformers.logging.set_verbosity_error()

MODEL_TYPES = ["llama", "mistral", "qwen2", "qwen3"]


def _rng(seed_material: str) -> random.Random:
    return random.Random(f"{seed_material}-{random.getrandbits(32)}")


def _sizes(rng: random.Random) -> dict:
    kv = rng.choice([1, 2, 4])
    heads = kv * rng.choice([1, 2, 4])
    head_dim = rng.choice([8, 16, 32])
    return dict(
        vocab_size=rng.randint(50, 5000),
        hidden_size=heads * head_dim,
        intermediate_size=rng.randint(16, 512),
        num_hidden_layers=rng.randint(1, 6),
        num_attention_heads=heads,
        num_key_value_heads=kv,
    )


def _write(tmp_path, d: dict, name: str = "config.json"):
    (tmp_path / name).write_text(json.dumps(d))
    return tmp_path


def _hf_rope(hf) -> tuple[float, dict | None, float]:
    """(rope_theta, rope_scaling as trtcore normalizes it, partial_rotary_factor) from an HF v5 config."""
    rp = dict(hf.rope_parameters)
    if set(rp) & {"full_attention", "sliding_attention"}:
        rp = dict(rp["full_attention"])
    theta = rp.pop("rope_theta")
    prf = rp.pop("partial_rotary_factor", getattr(hf, "partial_rotary_factor", None) or 1.0)
    rp.pop("type", None)
    if rp.get("rope_type", "default") == "default":
        return theta, None, prf
    return theta, rp, prf


def _assert_matches_hf(cfg: ModelConfig, hf) -> None:
    for name in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "max_position_embeddings",
        "rms_norm_eps",
        "tie_word_embeddings",
        "hidden_act",
        "bos_token_id",
        "pad_token_id",
    ):
        assert getattr(cfg, name) == getattr(hf, name), name
    hf_head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    assert cfg.head_dim == hf_head_dim
    eos = hf.eos_token_id
    assert cfg.eos_token_id == (() if eos is None else (eos,) if isinstance(eos, int) else tuple(eos))
    theta, scaling, prf = _hf_rope(hf)
    assert cfg.rope_theta == theta
    assert cfg.rope_scaling == scaling
    assert cfg.partial_rotary_factor == prf
    assert cfg.model_type == hf.model_type
    if cfg.model_type in ("qwen2", "qwen3"):
        assert cfg.layer_types == tuple(
            t if hf.sliding_window is not None else "full_attention" for t in hf.layer_types
        )
    if cfg.model_type != "llama":
        assert cfg.sliding_window == hf.sliding_window or (
            "sliding_attention" not in hf.layer_types and cfg.sliding_window is None
        )


# --------------------------------------------------------------------------- real HF configs


def test_llama_llama3_rope_scaling(tmp_path):
    rng = _rng("llama")
    sizes = _sizes(rng)
    orig = rng.choice([1024, 2048, 8192])
    hf = LlamaConfig(
        **sizes,
        max_position_embeddings=orig * 4,
        rope_theta=float(rng.choice([10000.0, 500000.0])),
        rope_scaling={
            "rope_type": "llama3",
            "factor": float(rng.choice([2, 4, 8])),
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": orig,
        },
        eos_token_id=[rng.randint(0, 9), rng.randint(10, 20)],
        tie_word_embeddings=rng.random() < 0.5,
        attention_bias=rng.random() < 0.5,
        mlp_bias=rng.random() < 0.5,
        rms_norm_eps=rng.choice([1e-5, 1e-6]),
        architectures=["LlamaForCausalLM"],
    )
    hf.save_pretrained(tmp_path)
    cfg = load_config(tmp_path)
    ref = AutoConfig.from_pretrained(tmp_path)
    _assert_matches_hf(cfg, ref)
    assert cfg.rope_scaling["rope_type"] == "llama3"
    assert cfg.rope_scaling["original_max_position_embeddings"] == orig
    assert cfg.architecture == "LlamaForCausalLM"
    assert cfg.num_kv_groups == sizes["num_attention_heads"] // sizes["num_key_value_heads"]
    assert cfg.qkv_bias == cfg.o_bias == hf.attention_bias == cfg.attention_bias
    assert cfg.mlp_bias == hf.mlp_bias
    assert cfg.sliding_window is None
    # load_config also takes the file path itself
    assert load_config(tmp_path / "config.json") == cfg


@pytest.mark.parametrize("sliding", [None, 64])
def test_mistral(tmp_path, sliding):
    rng = _rng("mistral")
    hf = MistralConfig(**_sizes(rng), sliding_window=sliding, rope_theta=1e6)
    hf.save_pretrained(tmp_path)
    cfg = load_config(tmp_path)
    _assert_matches_hf(cfg, AutoConfig.from_pretrained(tmp_path))
    assert cfg.sliding_window == sliding
    assert cfg.layer_types == (
        ("full_attention" if sliding is None else "sliding_attention"),
    ) * cfg.num_hidden_layers
    assert (cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias) == (False, False, False)
    assert cfg.architecture == "MistralForCausalLM"  # inferred: save_pretrained wrote none


@pytest.mark.parametrize("use_sliding_window", [False, True])
def test_qwen2(tmp_path, use_sliding_window):
    rng = _rng("qwen2")
    sizes = _sizes(rng)
    sizes["num_hidden_layers"] = rng.randint(3, 6)
    hf = Qwen2Config(
        **sizes,
        use_sliding_window=use_sliding_window,
        sliding_window=rng.choice([32, 128]),
        max_window_layers=rng.randint(1, sizes["num_hidden_layers"] - 1),
        rope_theta=1e6,
        tie_word_embeddings=True,
        eos_token_id=rng.randint(100, 200),
    )
    hf.save_pretrained(tmp_path)
    cfg = load_config(tmp_path)
    _assert_matches_hf(cfg, AutoConfig.from_pretrained(tmp_path))
    assert cfg.qkv_bias is True and cfg.o_bias is False and cfg.mlp_bias is False
    if use_sliding_window:
        assert cfg.sliding_window == hf.sliding_window
        assert cfg.layer_types == tuple(hf.layer_types)
        assert "sliding_attention" in cfg.layer_types
    else:
        assert cfg.sliding_window is None
        assert set(cfg.layer_types) == {"full_attention"}


def test_qwen3_explicit_head_dim(tmp_path):
    rng = _rng("qwen3")
    sizes = _sizes(rng)
    head_dim = 2 * sizes["hidden_size"] // sizes["num_attention_heads"]  # != hidden/heads
    hf = Qwen3Config(**sizes, head_dim=head_dim, attention_bias=True, rope_theta=1e6)
    hf.save_pretrained(tmp_path)
    cfg = load_config(tmp_path)
    _assert_matches_hf(cfg, AutoConfig.from_pretrained(tmp_path))
    assert cfg.head_dim == head_dim != cfg.hidden_size // cfg.num_attention_heads
    assert cfg.qkv_bias is True and cfg.o_bias is True and cfg.mlp_bias is False


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_per_model_defaults_match_transformers(tmp_path, model_type):
    """A minimal config.json: every absent field takes the HF class default."""
    d = {
        "model_type": model_type,
        "vocab_size": 1000,
        "hidden_size": 512,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 64,  # != every family's num_key_value_heads default
    }
    _write(tmp_path, d)
    cfg = load_config(tmp_path)
    ref = AutoConfig.from_pretrained(tmp_path)
    _assert_matches_hf(cfg, ref)
    # the defaults that differ per model, spelled out
    expected_kv = {"llama": 64, "mistral": 8, "qwen2": 32, "qwen3": 32}[model_type]
    expected_head_dim = {"qwen3": 128}.get(model_type, 512 // 64)
    assert cfg.num_key_value_heads == ref.num_key_value_heads == expected_kv
    assert cfg.head_dim == expected_head_dim
    assert cfg.rope_theta == 10000.0 and cfg.rope_scaling is None
    assert cfg.sliding_window == (4096 if model_type == "mistral" else None)
    assert cfg.dtype is None


def test_null_head_dim_and_kv_heads_are_derived(tmp_path):
    d = {
        "model_type": "qwen3",
        "vocab_size": 100,
        "hidden_size": 96,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 6,
        "num_key_value_heads": None,
        "head_dim": None,
    }
    cfg = load_config(_write(tmp_path, d))
    assert cfg.head_dim == 16
    assert cfg.num_key_value_heads == 6


# --------------------------------------------------------------------------- hand-written json


def _base(model_type="llama", **kw):
    d = {
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                           "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM"}[model_type]],
        "model_type": model_type,
        "vocab_size": 320,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
    }
    d.update(kw)
    return d


@pytest.mark.parametrize(
    "scaling",
    [
        {"type": "linear", "factor": 4.0},
        {"type": "dynamic", "factor": 2.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
        {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 1024},
    ],
)
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_v4_style_rope_scaling(tmp_path, scaling, model_type):
    theta = float(random.choice([10000, 500000, 1000000]))
    d = _base(model_type, rope_theta=theta, rope_scaling=dict(scaling), torch_dtype="bfloat16",
              eos_token_id=7, bos_token_id=3)
    cfg = load_config(_write(tmp_path, d))
    _assert_matches_hf(cfg, AutoConfig.from_pretrained(tmp_path))
    assert cfg.rope_theta == theta
    rope_type = scaling.get("rope_type", scaling.get("type"))
    assert cfg.rope_scaling["rope_type"] == rope_type
    assert "type" not in cfg.rope_scaling and "rope_theta" not in cfg.rope_scaling
    assert cfg.rope_scaling["factor"] == scaling["factor"]
    assert cfg.dtype == "bfloat16"
    assert cfg.eos_token_id == (7,) and cfg.bos_token_id == 3


def test_v4_default_rope_type_is_none(tmp_path):
    d = _base(rope_theta=5e5, rope_scaling={"type": "default"})
    cfg = load_config(_write(tmp_path, d))
    assert cfg.rope_scaling is None and cfg.rope_theta == 5e5


def test_v5_rope_parameters(tmp_path):
    d = _base(
        "qwen3",
        dtype="float16",
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                         "original_max_position_embeddings": 1000},
    )
    cfg = load_config(_write(tmp_path, d))
    _assert_matches_hf(cfg, AutoConfig.from_pretrained(tmp_path))
    assert cfg.rope_theta == 1e6
    assert cfg.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1000}
    assert cfg.dtype == "float16"


def test_v5_rope_parameters_default_type_and_partial_rotary(tmp_path):
    d = _base(rope_parameters={"rope_type": "default", "rope_theta": 123456.0, "partial_rotary_factor": 0.5})
    cfg = load_config(_write(tmp_path, d))
    assert cfg.rope_scaling is None
    assert cfg.rope_theta == 123456.0
    assert cfg.partial_rotary_factor == 0.5
    assert cfg.rotary_dim == cfg.head_dim // 2
    ref = AutoConfig.from_pretrained(tmp_path)
    assert ref.rope_parameters["partial_rotary_factor"] == cfg.partial_rotary_factor


def test_v5_nested_rope_parameters_take_full_attention(tmp_path):
    d = _base(
        "qwen2",
        use_sliding_window=True,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    )
    cfg = load_config(_write(tmp_path, d))
    assert cfg.rope_theta == 1e6
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert cfg.layer_types == ("sliding_attention", "full_attention")
    assert cfg.sliding_window == 16
    ref = AutoConfig.from_pretrained(tmp_path)
    assert ref.rope_parameters["full_attention"]["rope_theta"] == cfg.rope_theta


def test_llama3_original_max_defaults_to_max_position(tmp_path):
    d = _base(rope_theta=5e5, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0})
    cfg = load_config(_write(tmp_path, d))
    ref = AutoConfig.from_pretrained(tmp_path)
    assert cfg.rope_scaling["original_max_position_embeddings"] == 4096
    assert ref.rope_parameters["original_max_position_embeddings"] == 4096


def test_eos_list_and_model_type_inferred(tmp_path):
    d = _base("qwen2", eos_token_id=[151645, 151643], pad_token_id=151643)
    del d["model_type"]
    cfg = load_config(_write(tmp_path, d))
    assert cfg.model_type == "qwen2"
    assert cfg.eos_token_id == (151645, 151643)
    assert cfg.pad_token_id == 151643


# --------------------------------------------------------------------------- to_dict round trip


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_to_dict_round_trip_through_transformers(tmp_path, model_type):
    rng = _rng(model_type)
    sizes = _sizes(rng)
    extra = {
        "llama": dict(rope_theta=5e5, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 512},
                      mlp_bias=True, attention_bias=True),
        "mistral": dict(sliding_window=rng.randint(10, 100)),
        "qwen2": dict(use_sliding_window=True, sliding_window=32, max_window_layers=1,
                      num_hidden_layers=3, rope_scaling={"type": "yarn", "factor": 4.0}),
        "qwen3": dict(head_dim=24, rope_theta=1e6, attention_bias=True),
    }[model_type]
    d = {**_base(model_type), **sizes, **extra, "eos_token_id": [5, 6], "torch_dtype": "bfloat16"}
    cfg = ModelConfig.from_dict(d)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert hash(ModelConfig.from_dict(cfg.to_dict())) == hash(cfg)
    out = tmp_path / "rt"
    out.mkdir()
    _write(out, cfg.to_dict())
    ref = AutoConfig.from_pretrained(out)
    _assert_matches_hf(cfg, ref)
    # and transformers' own serialization parses back to the same config
    ref.save_pretrained(tmp_path / "hf")
    assert load_config(tmp_path / "hf") == cfg


def test_frozen():
    cfg = ModelConfig.from_dict(_base())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.hidden_size = 1  # type: ignore[misc]


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size", "num_attention_heads",
                                   "intermediate_size", "num_hidden_layers"])
def test_missing_required_field(tmp_path, field):
    d = _base()
    del d[field]
    with pytest.raises(ConfigError) as ei:
        load_config(_write(tmp_path, d))
    msg = str(ei.value)
    assert f"'{field}'" in msg and "missing" in msg and str(tmp_path / "config.json") in msg


@pytest.mark.parametrize("field,value", [("hidden_size", 0), ("num_hidden_layers", -2),
                                         ("vocab_size", "big"), ("intermediate_size", 1.5),
                                         ("max_position_embeddings", 0), ("head_dim", -8)])
def test_non_positive_sizes(tmp_path, field, value):
    with pytest.raises(ConfigError) as ei:
        load_config(_write(tmp_path, _base(**{field: value})))
    msg = str(ei.value)
    assert f"'{field}'" in msg and repr(value) in msg and "positive integer" in msg


def test_heads_not_divisible_by_kv_heads(tmp_path):
    with pytest.raises(ConfigError) as ei:
        load_config(_write(tmp_path, _base(num_attention_heads=4, num_key_value_heads=3)))
    msg = str(ei.value)
    assert "num_key_value_heads" in msg and "3" in msg and "num_attention_heads (4)" in msg


def test_hidden_not_divisible_without_head_dim(tmp_path):
    with pytest.raises(ConfigError, match="hidden_size"):
        load_config(_write(tmp_path, _base(hidden_size=66)))


def test_invalid_json_names_file(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "hidden_size": 64,,}')
    with pytest.raises(ConfigError) as ei:
        load_config(tmp_path)
    assert str(tmp_path / "config.json") in str(ei.value) and "not valid JSON" in str(ei.value)


def test_missing_file_and_non_object(tmp_path):
    with pytest.raises(ConfigError, match="model config not found"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match=f"model folder not found: {re.escape(str(tmp_path / 'nope'))}$"):
        load_config(tmp_path / "nope")
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        load_config(tmp_path)


def test_unknown_model_type_and_rope(tmp_path):
    with pytest.raises(UnsupportedArchitectureError, match="'gpt2'"):
        load_config(_write(tmp_path, {**_base(), "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ConfigError, match="rope_type 'weird'"):
        load_config(_write(tmp_path, _base(rope_scaling={"type": "weird", "factor": 2.0})))
    with pytest.raises(ConfigError, match=r"lacks \['factor'\]"):
        load_config(_write(tmp_path, _base(rope_scaling={"type": "linear"})))


def test_errors_are_value_errors():
    with pytest.raises(ValueError):
        ModelConfig.from_dict(_base(num_key_value_heads=3))


# --------------------------------------------------------------------------- generation config


def test_generation_config_from_transformers(tmp_path):
    rng = _rng("gen")
    model_cfg = ModelConfig.from_dict(_base(bos_token_id=1, eos_token_id=2, pad_token_id=0))
    hf = transformers.GenerationConfig(
        bos_token_id=rng.randint(3, 9),
        eos_token_id=[rng.randint(10, 20), rng.randint(21, 30)],
        do_sample=True,
        temperature=rng.choice([0.6, 0.7, 0.8]),
        top_k=rng.randint(1, 100),
        top_p=rng.choice([0.8, 0.9, 0.95]),
        max_new_tokens=rng.randint(10, 100),
    )
    hf.save_pretrained(tmp_path)
    g = load_generation_config(tmp_path, model_cfg)
    assert g.bos_token_id == hf.bos_token_id
    assert g.eos_token_id == tuple(hf.eos_token_id)  # the file's list wins, no union
    assert g.pad_token_id == 0  # absent from the file -> model config's
    assert (g.do_sample, g.temperature, g.top_k, g.top_p, g.max_new_tokens) == (
        hf.do_sample, hf.temperature, hf.top_k, hf.top_p, hf.max_new_tokens)


def test_generation_config_absent_falls_back(tmp_path):
    model_cfg = ModelConfig.from_dict(_base(bos_token_id=11, eos_token_id=[12, 13], pad_token_id=None))
    g = load_generation_config(tmp_path, model_cfg)
    defaults = transformers.GenerationConfig._get_default_generation_params()
    assert g == GenerationConfig(bos_token_id=11, eos_token_id=(12, 13), pad_token_id=None)
    assert (g.do_sample, g.temperature, g.top_k, g.top_p, g.max_length) == tuple(
        defaults[k] for k in ("do_sample", "temperature", "top_k", "top_p", "max_length"))
    assert g.max_new_tokens is None


def test_generation_config_int_eos_and_partial_file(tmp_path):
    model_cfg = ModelConfig.from_dict(_base(bos_token_id=1, eos_token_id=[2, 3]))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 9, "temperature": 0.0}))
    g = load_generation_config(tmp_path, model_cfg)
    assert g.eos_token_id == (9,) and g.bos_token_id == 1 and g.temperature == 0.0 and g.top_k == 50


def test_generation_config_errors_name_file(tmp_path):
    (tmp_path / "generation_config.json").write_text('{"top_p": 1.5}')
    with pytest.raises(ConfigError) as ei:
        load_generation_config(tmp_path, None)
    assert "generation_config.json" in str(ei.value) and "top_p" in str(ei.value) and "1.5" in str(ei.value)
    (tmp_path / "generation_config.json").write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_generation_config(tmp_path, None)


def test_a_file_of_another_kind_says_what_was_expected(tmp_path):
    """A GGUF file, or a file of another kind, given as the model folder: the message says
    what it is / what was expected (it was "'utf-8' codec can't decode byte ...")."""
    from trtcore import LLM

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(range(256)))
    for load in (load_config, LLM):
        with pytest.raises(ConfigError, match=r"model\.gguf is a GGUF file, not a model folder; .*`trtcore convert --gguf .*model\.gguf --output DIR`"):
            load(gguf)
    # a safetensors file (the weights, not their folder): the folder is named when it holds a config.json
    from safetensors.numpy import save_file

    model = tmp_path / "model"
    model.mkdir()
    save_file({"w": np.zeros((2, 2), np.float32)}, str(model / "model.safetensors"))
    renamed = tmp_path / "weights.st"  # detected by its header, not only by the suffix
    renamed.write_bytes((model / "model.safetensors").read_bytes())
    with pytest.raises(ConfigError, match=r"weights\.st is a safetensors weights file, not a model folder; pass the model folder that holds it and its config\.json$"):
        load_config(renamed)
    (model / "config.json").write_text("{}")
    for load in (load_config, LLM):
        with pytest.raises(ConfigError, match=rf"model\.safetensors is a safetensors weights file, not a model folder; pass {re.escape(str(model))}$"):
            load(model / "model.safetensors")
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\xc3\x28" + bytes(64))
    with pytest.raises(ConfigError, match=r"weights\.bin.*\(expected a Hugging Face model folder with config\.json, or its config\.json\)"):
        load_config(other)
