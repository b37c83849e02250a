"""Every tiny checkpoint's network is a valid TensorRT graph: ``tensorrt_rtx`` builds it on
the CPU (ahead of time, for sm89) in float16 and float32, and ``save_engine`` writes the
serialized engine with its JSON sidecar.

``tensorrt_rtx`` is imported directly, not through ``pytest.importorskip``: CI installs it
and this test must never be skipped there.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import tensorrt_rtx as trt  # no importorskip: CI must run this file

from hf_models import VARIANTS, ModelStore, hf_models  # noqa: F401  (hf_models is a fixture)
from trtcore.builder import BuildConfig, build_engine, define_network, save_engine
from trtcore.checkpoint import Checkpoint
from trtcore.config import load_config

CC = "sm89"
MAX_BATCH, MAX_SEQ = 4, 256


def _hf_config(store: ModelStore, name: str) -> dict:
    """config.json as transformers itself reads it (not via trtcore)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(store.dir(name)).to_dict()


def _build(store: ModelStore, name: str, dtype: str, out: Path, max_seq_len: int = MAX_SEQ) -> tuple[Path, Path, object]:
    d_dir = store.dir(name)
    with Checkpoint(d_dir) as weights:
        d = define_network(trt, load_config(d_dir), weights, BuildConfig(dtype=dtype, max_batch_size=MAX_BATCH, max_seq_len=max_seq_len))
        engine = build_engine(d, CC)
    path = out / f"{name}.{dtype}.engine"
    side = save_engine(d, engine, path, backend="tensorrt_rtx", compute_capability=CC)
    return path, side, d


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_rtx_builds_engine_with_sidecar(hf_models: ModelStore, tmp_path: Path, name: str, dtype: str) -> None:
    path, side, d = _build(hf_models, name, dtype, tmp_path)
    data = path.read_bytes()
    assert len(data) > 1000
    assert side == path.with_name(path.name + ".json")
    meta = json.loads(side.read_text())
    assert meta["engine_sha256"] == hashlib.sha256(data).hexdigest()
    assert meta["engine_bytes"] == len(data)
    assert meta["engine_file"] == path.name
    assert meta["backend"] == "tensorrt_rtx"
    assert meta["dtype"] == dtype
    assert meta["tensorrt_version"] == trt.__version__
    assert meta["target"] == {"compute_capability": CC}
    assert meta["kv_cache"] == "contiguous"

    # optimization profile: one, covering every network input, min <= opt <= max
    [profile] = meta["optimization_profiles"]
    inputs = {d.network.get_input(i).name: tuple(d.network.get_input(i).shape) for i in range(d.network.num_inputs)}
    assert set(profile) == set(inputs)
    hf = _hf_config(hf_models, name)
    L, B = MAX_SEQ, MAX_BATCH
    for tensor, rng in profile.items():
        lo, opt, hi = rng["min"], rng["opt"], rng["max"]
        assert len(lo) == len(opt) == len(hi) == len(inputs[tensor]), tensor
        assert all(a <= b <= c for a, b, c in zip(lo, opt, hi)), (tensor, rng)
        for dim, (s, m) in enumerate(zip(inputs[tensor], hi)):
            if s != -1:
                assert lo[dim] == opt[dim] == m == s, (tensor, dim)
    assert profile["input_ids"]["max"] == [B, L]
    assert profile["last_token_ids"]["max"] == [B]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    for i in range(hf["num_hidden_layers"]):
        for kind in ("key", "value"):
            assert profile[f"past_key_values.{i}.{kind}"]["max"] == [B, hf["num_key_value_heads"], L - 1, head_dim]

    # the model config in the sidecar is the checkpoint's, as transformers reads it
    mc = meta["model_config"]
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings"):
        assert mc[key] == hf[key], key
    assert mc["head_dim"] == head_dim
    assert mc["architectures"] == hf["architectures"]
    assert mc["rope_theta"] == hf["rope_parameters"]["rope_theta"]
    hf_type = hf["rope_parameters"].get("rope_type", hf["rope_parameters"].get("type"))
    assert (mc["rope_scaling"] or {}).get("rope_type", "default") == hf_type
    assert mc.get("dtype") == VARIANTS[name].dtype

    # engine I/O: the network's outputs are there, logits float32
    outputs = {d.network.get_output(i).name: d.network.get_output(i).dtype for i in range(d.network.num_outputs)}
    assert outputs["logits"] == trt.float32
    assert {f"present.{i}.{k}" for i in range(hf["num_hidden_layers"]) for k in ("key", "value")} <= set(outputs)


def test_rtx_engines_differ_by_dtype(hf_models: ModelStore, tmp_path: Path) -> None:
    """float16 and float32 builds of the same network are different engines."""
    a, _, _ = _build(hf_models, "llama3_rope", "float16", tmp_path / "a")
    b, _, _ = _build(hf_models, "llama3_rope", "float32", tmp_path / "b")
    assert a.read_bytes() != b.read_bytes()


def _short_build_check(path: Path, side: Path) -> None:
    meta = json.loads(side.read_text())
    assert meta["engine_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    profile = meta["optimization_profiles"][0]
    assert profile["input_ids"]["max"] == [MAX_BATCH, 64]
    # Mistral: every layer slides, so the network has only the sliding-window mask input
    assert "attention_mask" not in profile
    assert profile["sliding_attention_mask"]["max"][-2:] == [64, 127]
    for rng in profile.values():
        assert all(a <= b <= c for a, b, c in zip(rng["min"], rng["opt"], rng["max"]))


def test_rtx_builds_short_max_seq_len_with_opt_inside(hf_models: ModelStore, tmp_path: Path) -> None:
    """max_seq_len <= 128 (the default opt_seq_len): the profile's opt point (cached + new
    tokens) must stay within its max."""
    d_dir = hf_models.dir("mistral_sw8")
    with Checkpoint(d_dir) as weights:
        bc = BuildConfig(dtype="float16", max_batch_size=MAX_BATCH, max_seq_len=64, opt_seq_len=64)
        d = define_network(trt, load_config(d_dir), weights, bc)
        engine = build_engine(d, CC)
    path = tmp_path / "short.engine"
    _short_build_check(path, save_engine(d, engine, path, backend="tensorrt_rtx", compute_capability=CC))


def test_rtx_builds_short_max_seq_len(hf_models: ModelStore, tmp_path: Path) -> None:
    path, side, _ = _build(hf_models, "mistral_sw8", "float16", tmp_path, max_seq_len=64)
    _short_build_check(path, side)


def test_rtx_builds_with_captured_tensors_as_outputs(hf_models: ModelStore) -> None:  # noqa: F811
    """``build_engine(capture=...)`` on TensorRT marks the named layer outputs as network
    outputs (``mark_output``) and the engine builds; an unknown name is refused before building."""
    from trtcore.errors import InvalidArgumentError

    d_dir = hf_models.dir("llama3_rope")
    names = ["model.layers.0.self_attn.o_proj", "model.layers.1.mlp.down_proj", "model.norm"]
    with Checkpoint(d_dir) as weights:
        d = define_network(trt, load_config(d_dir), weights, BuildConfig(dtype="float16", max_batch_size=2, max_seq_len=64))
        before = [d.network.get_output(i).name for i in range(d.network.num_outputs)]
        with pytest.raises(InvalidArgumentError, match="no layer output named \\['model.layers.0.nope'\\]"):
            build_engine(d, CC, capture=["model.layers.0.nope"])
        assert d.network.num_outputs == len(before)  # nothing marked by the refused call
        engine = build_engine(d, CC, capture=names)
    after = [d.network.get_output(i).name for i in range(d.network.num_outputs)]
    assert after[: len(before)] == before and sorted(after[len(before) :]) == sorted(names)
    assert len(engine) > 1000
