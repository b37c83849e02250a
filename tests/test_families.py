"""Families own their rules (trtcore.families): config fields honoured only where the
family's transformers modeling code reads them, one RoPE type list, the load report
(missing / unexpected tensors by name), the GGUF mapping.

References are transformers itself (tiny checkpoints written with ``*ForCausalLM`` and
``save_pretrained``; float64 eager forward) and the checkpoint files' own tensor lists.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from hf_models import (  # noqa: F401
    VARIANTS,
    ModelStore,
    Variant,
    hf_logits,
    hf_models,
    load_hf,
    log_softmax,
    random_prompt,
    write_checkpoint,
)
from safetensors.numpy import load_file, save_file

from trtcore import LLM, SamplingParams
from trtcore.config import load_config
from trtcore.errors import ConfigError, MissingTensorError

# ---------------------------------------------------------------------------------------
# a config field is honoured only where the family's modeling code reads it


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_partial_rotary_factor_follows_transformers(family: str, tmp_path: Path) -> None:
    """Llama/Mistral/Qwen2/Qwen3's default RoPE computes ``inv_freq`` over the whole
    ``head_dim`` and ignores ``partial_rotary_factor``; trtcore used to rotate only half."""
    v = Variant(f"{family}_partial", family=family, head_dim=16, rope={"partial_rotary_factor": 0.5}, seed=11)
    d = write_checkpoint(v, tmp_path / v.name)
    hf = load_hf(d)
    assert hf.config.rope_parameters["partial_rotary_factor"] == 0.5  # the field is set and read by the config
    assert load_config(d).partial_rotary_factor == 0.5
    prompt = random_prompt(np.random.default_rng(), 24, v.vocab_size)
    expected = log_softmax(hf_logits(hf, prompt)[-1])
    llm = LLM(d, backend="reference", dtype="float32", progress=False)
    [out] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1, logprobs=v.vocab_size))
    got = out.outputs[0].logprobs[0]
    np.testing.assert_allclose([got[t].logprob for t in range(v.vocab_size)], expected, rtol=1e-4, atol=1e-4)


def test_families_declare_the_rules() -> None:
    from trtcore.families import MODEL_FAMILIES, gguf_families
    from trtcore.gguf_convert import SUPPORTED_ARCHITECTURES

    # the four Llama-style families hard-code full rotary (GPT-NeoX reads rotary_pct: tests/test_gpt_neox.py)
    assert {f.partial_rotary_factor for f in MODEL_FAMILIES.values() if f.builder == "trtcore.models.llama"} == {1.0}
    assert SUPPORTED_ARCHITECTURES == {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
    assert gguf_families()["llama"].gguf.permute_qk and not gguf_families()["qwen2"].gguf.permute_qk  # type: ignore[union-attr]
    fam = MODEL_FAMILIES["qwen3"]
    assert fam.tensor("q_norm", 3) == "model.layers.3.self_attn.q_norm.weight"
    assert fam.tensor("q_proj", 0, ".bias") == "model.layers.0.self_attn.q_proj.bias"
    assert fam.is_ignored("model.layers.0.self_attn.rotary_emb.inv_freq") and fam.is_ignored("model.rotary_emb.inv_freq")
    assert not fam.is_ignored("model.layers.0.self_attn.q_proj.weight")
    with pytest.raises(ConfigError, match="no tensor role"):
        fam.tensor("qkv_proj", 0)


# ---------------------------------------------------------------------------------------
# one RoPE type list


def test_unsupported_rope_type_fails_at_load(tmp_path: Path, hf_models: ModelStore) -> None:  # noqa: F811
    """An unsupported type (here Qwen2-VL's multimodal ``mrope``) is refused by load_config,
    which names the supported types (``longrope`` used to parse and then fail at build; it is
    supported now)."""
    from trtcore.rope import ROPE_TYPES, SUPPORTED_ROPE_TYPES

    d = tmp_path / "m"
    shutil.copytree(hf_models.dir("llama3_rope"), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "mrope", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="mrope") as err:
        load_config(d)
    for name in SUPPORTED_ROPE_TYPES:
        assert name in str(err.value)
    assert "mrope" not in ROPE_TYPES and "longrope" in ROPE_TYPES


# ---------------------------------------------------------------------------------------
# the load report


def _copy(hf_models: ModelStore, tmp_path: Path, name: str = "llama3_rope") -> Path:  # noqa: F811
    d = tmp_path / name
    shutil.copytree(hf_models.dir(name), d)
    return d


def test_unexpected_tensors_are_reported_by_name(hf_models: ModelStore, tmp_path: Path) -> None:  # noqa: F811
    d = _copy(hf_models, tmp_path)
    tensors = load_file(d / "model.safetensors")
    tensors["model.layers.0.mlp.extra_proj.weight"] = np.ones((4, 4), np.float32)
    tensors["model.layers.1.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)  # a buffer, not unexpected
    save_file(tensors, d / "model.safetensors")
    with pytest.warns(UserWarning, match=r"model\.layers\.0\.mlp\.extra_proj\.weight") as rec:
        LLM(d, backend="reference", progress=False)
    text = " ".join(str(w.message) for w in rec)
    assert "inv_freq" not in text and "1 tensors" in text


def test_missing_tensors_are_all_listed(hf_models: ModelStore, tmp_path: Path) -> None:  # noqa: F811
    d = _copy(hf_models, tmp_path)
    tensors = load_file(d / "model.safetensors")
    gone = ["model.layers.0.self_attn.k_proj.weight", "model.norm.weight"]
    for name in gone:
        del tensors[name]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(MissingTensorError) as err:
        LLM(d, backend="reference", progress=False)
    assert all(name in str(err.value) for name in gone) and "2 tensors" in str(err.value)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_tensor_names_cover_transformers_checkpoints(hf_models: ModelStore, name: str) -> None:  # noqa: F811
    """Every tensor transformers saves is read (no unexpected-tensor warning), none missing."""
    import trtcore.reference as ref
    from trtcore.builder import define_network
    from trtcore.checkpoint import Checkpoint
    from trtcore.plan import BuildConfig, resolve_plan

    config = load_config(hf_models.dir(name))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Checkpoint(hf_models.dir(name)) as weights:
            define_network(ref, config, weights, resolve_plan(config, BuildConfig(max_seq_len=32, dtype="float32"), "reference"))
