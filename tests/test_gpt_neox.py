"""``GPTNeoXForCausalLM`` (Pythia) against transformers on tiny random checkpoints.

The checkpoints are written by transformers itself (``GPTNeoXConfig`` + ``GPTNeoXForCausalLM``,
every parameter re-drawn with std >= 0.1 by :func:`hf_models.redraw_weights`, saved with
``save_pretrained``); the variants cover partial rotary 0.25 and full rotary 1.0, parallel and
sequential residual, the exact and the tanh GELU, q/k/v/dense biases on and off, tied and
untied output embeddings, and both config.json dialects (v5 ``rope_parameters``; v4
``rotary_pct`` / ``rotary_emb_base`` as Pythia's checkpoints have them).

References come from transformers (eager, float64): log-probabilities of every vocabulary
token within 1e-4 relative (``|ours - hf| <= 1e-4 * max(1, |hf|)``) at the last prompt
position and the 16 decode steps after it, greedy tokens equal for 32 steps, with both KV
cache modes on the reference backend; ``tensorrt_rtx`` builds each in float16.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import ModelStore, assert_matches_hf, hf_greedy, hf_logits, load_hf, random_prompt, redraw_weights

from trtcore import SamplingParams
from trtcore.config import ModelConfig, load_config
from trtcore.errors import ConfigError

PROMPT_LEN = 40
LOGPROB_STEPS = 17  # the last prompt position + 16 decode steps
GREEDY_STEPS = 32
RTOL = 1e-4
KV_CACHES = ("paged", "contiguous")


@dataclass(frozen=True)
class NeoX:
    name: str
    rotary_pct: float
    use_parallel_residual: bool
    hidden_act: str = "gelu"
    attention_bias: bool = True
    tie_word_embeddings: bool = False
    config_style: str = "v5"
    seed: int = 0
    vocab_size: int = 160


NEOX = {
    v.name: v
    for v in [
        NeoX("neox_parallel_pct25", rotary_pct=0.25, use_parallel_residual=True, seed=21),
        NeoX("neox_sequential_full_v4", rotary_pct=1.0, use_parallel_residual=False, config_style="v4", seed=22),
        NeoX("neox_tanh_nobias_tied", rotary_pct=0.5, use_parallel_residual=True, hidden_act="gelu_pytorch_tanh",
             attention_bias=False, tie_word_embeddings=True, seed=23),
    ]
}
ROPE_THETA = 5000.0  # not the default 10000, so that a dropped value shows


def _write(v: NeoX, path: Path) -> Path:
    import torch
    import transformers

    cfg = transformers.GPTNeoXConfig(
        vocab_size=v.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        hidden_act=v.hidden_act,
        max_position_embeddings=256,
        layer_norm_eps=1e-3,  # not the default 1e-5
        use_parallel_residual=v.use_parallel_residual,
        attention_bias=v.attention_bias,
        tie_word_embeddings=v.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA, "partial_rotary_factor": v.rotary_pct},
        bos_token_id=0,
        eos_token_id=2,
    )
    torch.manual_seed(v.seed)
    model = transformers.GPTNeoXForCausalLM(cfg)
    redraw_weights(model, v.seed)  # std >= 0.1 everywhere; LayerNorm weights 1 + 0.1 randn, biases 0.1 randn
    if v.tie_word_embeddings:  # one matrix (std 0.125 from redraw_weights) for embed_in and the output
        assert model.get_output_embeddings().weight.data_ptr() == model.gpt_neox.embed_in.weight.data_ptr()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    if v.config_style == "v4":  # as Pythia's config.json: rotary_pct / rotary_emb_base, torch_dtype
        f = path / "config.json"
        d = json.loads(f.read_text())
        rp = d.pop("rope_parameters")
        d.update(rotary_pct=rp["partial_rotary_factor"], rotary_emb_base=rp["rope_theta"], torch_dtype=d.pop("dtype"))
        f.write_text(json.dumps(d, indent=2))
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    return ModelStore(tmp_path_factory.mktemp("gpt_neox"), lambda name, path: _write(NEOX[name], path))


def _prompt(name: str) -> list[int]:
    v = NEOX[name]
    return random_prompt(np.random.default_rng([v.seed, PROMPT_LEN]), PROMPT_LEN, v.vocab_size)


# ---------------------------------------------------------------------------------------
# the checkpoints are what they claim to be


@pytest.mark.parametrize("name", list(NEOX))
def test_checkpoint_is_the_variant(store: ModelStore, name: str) -> None:
    v = NEOX[name]
    hf = store.hf(name)
    assert hf.config.rope_parameters["partial_rotary_factor"] == v.rotary_pct
    assert hf.config.rope_parameters["rope_theta"] == ROPE_THETA
    assert hf.config.use_parallel_residual == v.use_parallel_residual
    assert hf.gpt_neox.layers[0].attention.rotary_ndims == int(16 * v.rotary_pct)
    assert all(p.std() >= 0.09 for n, p in hf.named_parameters() if n.endswith("weight") and "norm" not in n)
    cfg = load_config(store.dir(name))
    assert cfg.partial_rotary_factor == v.rotary_pct and cfg.rope_theta == ROPE_THETA
    assert cfg.family_fields == {"use_parallel_residual": v.use_parallel_residual, "layer_norm_eps": 1e-3}
    assert cfg.qkv_bias == cfg.o_bias == v.attention_bias and cfg.mlp_bias
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


def test_residual_and_rotary_change_hf_logits(store: ModelStore) -> None:
    """use_parallel_residual and rotary_pct matter on the test prompt (so the comparisons test them)."""
    name = "neox_parallel_pct25"
    p = _prompt(name)
    ref = hf_logits(store.hf(name), p)[-1]
    for override in ({"use_parallel_residual": False}, {"rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA, "partial_rotary_factor": 1.0}}):
        other = hf_logits(load_hf(store.dir(name), **override), p)[-1]
        assert np.abs(other - ref).max() > 0.1, override


# ---------------------------------------------------------------------------------------
# log-probabilities and greedy tokens against transformers


@pytest.mark.parametrize("kv_cache", KV_CACHES)
@pytest.mark.parametrize("name", list(NEOX))
def test_logprobs_and_greedy_match_hf(store: ModelStore, name: str, kv_cache: str) -> None:
    p = _prompt(name)
    params = SamplingParams(temperature=0, max_tokens=GREEDY_STEPS, ignore_eos=True, logprobs=NEOX[name].vocab_size)
    [out] = store.llm(name, kv_cache).generate(p, params)
    assert_matches_hf(out, *hf_greedy(store.hf(name), p, GREEDY_STEPS), LOGPROB_STEPS, RTOL)


# ---------------------------------------------------------------------------------------
# config fields: honoured or refused


def _neox_config(**fields: Any) -> dict[str, Any]:
    d = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "vocab_size": 100, "hidden_size": 64,
         "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4}
    d.update(fields)
    return d


def test_family_record() -> None:
    from trtcore.families import family_of
    from trtcore.models import SUPPORTED_ARCHITECTURES, family_for

    fam = family_of("gpt_neox")
    assert fam.partial_rotary_factor is None  # the config's rotary_pct is applied
    assert fam.tensor("query_key_value", 3, ".bias") == "gpt_neox.layers.3.attention.query_key_value.bias"
    assert fam.is_ignored("gpt_neox.layers.0.attention.masked_bias") and fam.is_ignored("gpt_neox.layers.0.attention.bias")
    assert not fam.is_ignored("gpt_neox.layers.0.attention.dense.bias")
    assert "GPTNeoXForCausalLM" in SUPPORTED_ARCHITECTURES and family_for("GPTNeoXForCausalLM").ARCHITECTURES == ("GPTNeoXForCausalLM",)


def test_split_query_key_value_is_per_head() -> None:
    """The fused rows are [H, 3, D] (transformers: view(..., H, 3 * D).chunk(3, -1)), not [3, H, D]."""
    import torch

    from trtcore.models.gpt_neox import split_query_key_value

    H, D, E = 3, 4, 5
    w = np.random.default_rng(0).standard_normal((H * 3 * D, E))
    x = np.random.default_rng(1).standard_normal((2, E))
    qkv = torch.from_numpy(x @ w.T).view(2, H, 3 * D)
    want = [t.reshape(2, H * D).numpy() for t in qkv.chunk(3, dim=-1)]
    for got_w, ref in zip(split_query_key_value(w, H, D), want):
        np.testing.assert_allclose(x @ got_w.T, ref, rtol=1e-12)
    assert [b.shape for b in split_query_key_value(w[:, 0], H, D)] == [(H * D,)] * 3


def test_config_defaults_are_gpt_neox_config() -> None:
    from transformers import GPTNeoXConfig

    hf = GPTNeoXConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)
    cfg = ModelConfig.from_dict(_neox_config())
    assert cfg.partial_rotary_factor == hf.rope_parameters["partial_rotary_factor"] == 0.25
    assert cfg.rope_theta == hf.rope_parameters["rope_theta"]
    assert cfg.family_fields == {"use_parallel_residual": hf.use_parallel_residual, "layer_norm_eps": hf.layer_norm_eps}
    assert cfg.qkv_bias == cfg.o_bias == hf.attention_bias
    assert cfg.hidden_act == hf.hidden_act and cfg.tie_word_embeddings == hf.tie_word_embeddings
    assert cfg.max_position_embeddings == hf.max_position_embeddings
    assert (cfg.bos_token_id, cfg.eos_token_id) == (hf.bos_token_id, (hf.eos_token_id,))
    assert cfg.num_key_value_heads == 4 and cfg.head_dim == 16
    # the v4 names, and rope_parameters' own entries winning over them (as GPTNeoXConfig)
    v4 = ModelConfig.from_dict(_neox_config(rotary_pct=0.5, rotary_emb_base=123.0))
    assert (v4.partial_rotary_factor, v4.rope_theta) == (0.5, 123.0)
    both = _neox_config(rotary_pct=0.5, rope_parameters={"rope_type": "default", "rope_theta": 7.0, "partial_rotary_factor": 1.0})
    hf_both = GPTNeoXConfig(**{k: v for k, v in both.items() if k not in ("architectures", "model_type")})
    got = ModelConfig.from_dict(both)
    assert (got.partial_rotary_factor, got.rope_theta) == (hf_both.rope_parameters["partial_rotary_factor"], hf_both.rope_parameters["rope_theta"])


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"head_dim": 32}, "head_dim"),
        ({"hidden_act": "silu"}, "hidden_act"),
    ],
)
def test_config_fields_trtcore_cannot_honour_are_refused(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_dict(_neox_config(**fields))


# ---------------------------------------------------------------------------------------
# tensorrt_rtx builds it


@pytest.mark.parametrize("name", list(NEOX))
def test_rtx_builds_float16(store: ModelStore, name: str) -> None:
    import tensorrt_rtx as trt

    from trtcore.builder import BuildConfig, build_engine, define_network
    from trtcore.checkpoint import Checkpoint

    with Checkpoint(store.dir(name)) as weights:
        d = define_network(trt, load_config(store.dir(name)), weights, BuildConfig(dtype="float16", max_batch_size=2, max_seq_len=64))
        engine = build_engine(d, "sm89")
    assert len(engine) > 1000
