"""Tiny GPTQ / AWQ / compressed-tensors Llamas run end to end on the reference backend: every
linear of a tiny transformers Llama is quantized and packed by :mod:`quant_packers`; the
greedy tokens of trtcore on the packed checkpoint equal transformers' (float64) on a plain
checkpoint of the packers' float64 dequantized weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import VARIANTS, hf_greedy, load_hf, random_prompt, write_checkpoint
from quant_packers import pack_awq, pack_compressed, pack_gptq, quantize
from safetensors.numpy import load_file, save_file

from trtcore import LLM, SamplingParams

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CONFIGS: dict[str, dict[str, Any]] = {
    "gptq_v1_act_order": {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False, "desc_act": True},
    "gptq_v2_8bit": {"quant_method": "gptq", "bits": 8, "group_size": -1, "sym": True, "desc_act": False, "checkpoint_format": "gptq_v2"},
    # GPTQModel's QuantizeConfig(lm_head=True): lm_head quantized too, config "lm_head": true
    "gptq_lm_head": {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True, "desc_act": False, "lm_head": True},
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"},
    "compressed_tensors": {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 32}}
        },
    },
    # a mixed-precision recipe (llm-compressor): attention 8-bit per channel, MLP 4-bit group 32
    "compressed_tensors_mixed": {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "attention": {
                "targets": ["re:.*self_attn.*"],
                "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "group_size": None},
            },
            "mlp": {"targets": ["re:.*mlp.*"], "weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 32}},
        },
    },
}


def _pack(case: str, w: np.ndarray, rng: np.random.Generator, prefix: str = "") -> tuple[dict[str, np.ndarray], np.ndarray]:
    c = CONFIGS[case]
    if c["quant_method"] == "gptq":
        fmt = c.get("checkpoint_format", "gptq")
        qz = quantize(w, c["bits"], c["group_size"], sym=c["sym"], rng=rng, act_order=c["desc_act"], min_zero=1 if fmt == "gptq" else 0)
        return pack_gptq(qz, c["bits"], fmt), qz.dequantize()
    if c["quant_method"] == "awq":
        qz = quantize(w, 4, 32, sym=False, rng=rng)
        return pack_awq(qz), qz.dequantize()
    if case == "compressed_tensors_mixed" and ".self_attn." in prefix:
        qz = quantize(w, 8, -1, sym=True, rng=rng)
        return pack_compressed(qz, 8, sym=True), qz.dequantize()
    qz = quantize(w, 4, 32, sym=False, rng=rng)
    return pack_compressed(qz, 4, sym=False), qz.dequantize()


def _checkpoints(tmp_path: Path, case: str) -> tuple[Path, Path]:
    """The tiny Llama's checkpoint with every linear packed in ``case``'s format, and a plain
    one of the packers' float64 dequantized weights."""
    v = VARIANTS["llama3_rope"]
    src = write_checkpoint(v, tmp_path / "src")
    weights = load_file(str(src / "model.safetensors"))
    rng = np.random.default_rng(list(case.encode()))
    packed: dict[str, np.ndarray] = {}
    dense: dict[str, np.ndarray] = {}
    for name, value in weights.items():
        prefix = name.removesuffix(".weight")
        if prefix.rsplit(".", 1)[-1] in LINEARS or (prefix == "lm_head" and CONFIGS[case].get("lm_head")):
            tensors, deq = _pack(case, value.astype(np.float64), rng, prefix)
            packed |= {f"{prefix}.{k}": np.ascontiguousarray(t) for k, t in tensors.items()}
            dense[name] = deq.astype(np.float32)  # exact: the engine rounds the same float64 values
        else:
            packed[name] = dense[name] = value
    config = json.loads((src / "config.json").read_text())
    qdir, ddir = tmp_path / "quantized", tmp_path / "dense"
    for d, tensors, cfg in ((qdir, packed, config | {"quantization_config": CONFIGS[case]}), (ddir, dense, config)):
        d.mkdir()
        save_file(tensors, str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps(cfg))
    return qdir, ddir


@pytest.mark.filterwarnings("error::UserWarning")  # every packed tensor is read (none unexpected)
@pytest.mark.parametrize("case", list(CONFIGS))
def test_quantized_llama_greedy_equals_transformers_on_dequantized_weights(tmp_path: Path, case: str) -> None:
    v = VARIANTS["llama3_rope"]
    qdir, ddir = _checkpoints(tmp_path, case)
    llm = LLM(qdir, backend="reference", dtype="float32", progress=False)
    assert llm.quantization == CONFIGS[case]["quant_method"]
    prompt = random_prompt(np.random.default_rng(3), 12, v.vocab_size)
    [out] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    expected, _ = hf_greedy(load_hf(ddir), prompt, 16)
    assert out.outputs[0].token_ids == expected


def _layer_kinds(network: Any) -> list[str]:
    kinds = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        plugin = getattr(layer, "plugin", None)
        kinds.append(type(plugin).__name__ if plugin is not None else str(layer.type).rsplit(".", 1)[-1])
    return kinds


@pytest.mark.parametrize("case", ["gptq_v1_act_order", "awq", "gptq_lm_head"])
def test_quantized_linears_stay_quantized_in_the_network(tmp_path: Path, case: str) -> None:
    """Every linear of a quantized checkpoint is a weight-only GEMM in the network (none is
    dequantized at load), ``lm_head`` too where the checkpoint quantized it: the plugin where the
    backend hosts plugins (the reference), TensorRT's dequantize layer on ``tensorrt_rtx`` (no
    plugins), which builds the network."""
    from trtcore.builder import BuildConfig, build_engine, define_network
    from trtcore.checkpoint import Checkpoint
    from trtcore.config import load_config
    from trtcore.trt import load_trt

    qdir, _ = _checkpoints(tmp_path, case)
    config = load_config(qdir)
    expected = len(LINEARS) * config.num_hidden_layers + int(bool(CONFIGS[case].get("lm_head")))
    with Checkpoint(qdir) as weights:
        d = define_network(load_trt("reference"), config, weights, BuildConfig(dtype="float32", max_batch_size=2, max_seq_len=64))
    assert _layer_kinds(d.network).count("WeightOnlyGemmPlugin") == expected
    rtx = pytest.importorskip("tensorrt_rtx")
    with Checkpoint(qdir) as weights:
        d = define_network(rtx, config, weights, BuildConfig(dtype="float16", max_batch_size=2, max_seq_len=64))
    assert _layer_kinds(d.network).count("DEQUANTIZE") == expected
    assert len(build_engine(d, "sm89")) > 1000


@pytest.mark.parametrize("nested", [False, True])
def test_compression_config_key_is_read_as_the_quantization_config(tmp_path: Path, nested: bool) -> None:
    """compressed-tensors checkpoints saved by llm-compressor in 2024 keep their config under
    ``compression_config`` (vLLM reads it where ``quantization_config`` is absent), the earliest
    ones nested as ``{"quantization_config": {...}, "sparsity_config": ...}`` (transformers'
    ``CompressedTensorsConfig.from_dict`` unwraps it; it said "quant_method None" here): the
    packed checkpoint runs as under ``quantization_config``, not as a float one missing its weights."""
    qdir, ddir = _checkpoints(tmp_path, "compressed_tensors")
    config = json.loads((qdir / "config.json").read_text())
    q = config.pop("quantization_config")
    config["compression_config"] = {"quantization_config": q, "sparsity_config": None} if nested else q
    (qdir / "config.json").write_text(json.dumps(config))
    llm = LLM(qdir, backend="reference", dtype="float32", progress=False)
    assert llm.quantization == "compressed-tensors"
    prompt = random_prompt(np.random.default_rng(4), 12, VARIANTS["llama3_rope"].vocab_size)
    [out] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert out.outputs[0].token_ids == hf_greedy(load_hf(ddir), prompt, 8)[0]


@pytest.mark.filterwarnings("error::UserWarning")
def test_the_empty_sparsity_and_transform_configs_compressed_tensors_writes_are_read(tmp_path: Path) -> None:
    """compressed-tensors' ``ModelCompressor.update_config`` writes ``"sparsity_config": {}`` and
    ``"transform_config": {}`` into every checkpoint without them (llm-compressor's current
    output): the packed checkpoint runs and equals transformers on its dequantized weights."""
    qdir, ddir = _checkpoints(tmp_path, "compressed_tensors")
    config = json.loads((qdir / "config.json").read_text())
    config["quantization_config"] |= {"sparsity_config": {}, "transform_config": {}, "version": "0.12.2"}
    (qdir / "config.json").write_text(json.dumps(config))
    llm = LLM(qdir, backend="reference", dtype="float32", progress=False)
    prompt = random_prompt(np.random.default_rng(6), 12, VARIANTS["llama3_rope"].vocab_size)
    [out] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert out.outputs[0].token_ids == hf_greedy(load_hf(ddir), prompt, 8)[0]


@pytest.mark.parametrize(("case", "filename"), [("gptq_v1_act_order", "quantize_config.json"), ("awq", "quant_config.json")])
def test_quantization_flag_reads_the_autogptq_autoawq_config_file(tmp_path: Path, case: str, filename: str) -> None:
    """AutoGPTQ / AutoAWQ checkpoints whose config.json has no quantization_config keep it in
    ``quantize_config.json`` (AutoGPTQ) or ``quant_config.json`` (AutoAWQ: ``w_bit``,
    ``q_group_size``, ``version: "GEMM"``). As vLLM, ``quantization="gptq"`` / ``"awq"``
    reads that file; without the flag the error names the file and the flag."""
    from trtcore.errors import InvalidArgumentError

    qdir, ddir = _checkpoints(tmp_path, case)
    config = json.loads((qdir / "config.json").read_text())
    qc = config.pop("quantization_config")
    if case == "awq":  # AutoAWQ's own names
        qc = {"zero_point": True, "q_group_size": qc["group_size"], "w_bit": qc["bits"], "version": "GEMM"}
    (qdir / "config.json").write_text(json.dumps(config))
    (qdir / filename).write_text(json.dumps(qc))
    method = CONFIGS[case]["quant_method"]
    llm = LLM(qdir, backend="reference", dtype="float32", progress=False, quantization=method)
    assert llm.quantization == method
    prompt = random_prompt(np.random.default_rng(5), 12, VARIANTS["llama3_rope"].vocab_size)
    [out] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert out.outputs[0].token_ids == hf_greedy(load_hf(ddir), prompt, 8)[0]
    with pytest.raises(InvalidArgumentError, match=rf"{filename}.*quantization='{method}'"):
        LLM(qdir, backend="reference", dtype="float32", progress=False)


@pytest.mark.parametrize("case", ["compressed_tensors", "gptq_v1_act_order"])
def test_quantized_tensors_under_a_config_without_quantization_are_refused(tmp_path: Path, case: str) -> None:
    """A packed checkpoint whose config.json lost its quantization_config (and has no AutoGPTQ /
    AutoAWQ file beside it) is refused at the build, naming a packed tensor and the cause,
    instead of listing every ``*.weight`` as missing."""
    from trtcore.errors import UnsupportedQuantizationError

    qdir, _ = _checkpoints(tmp_path, case)
    config = json.loads((qdir / "config.json").read_text())
    del config["quantization_config"]
    (qdir / "config.json").write_text(json.dumps(config))
    kind = {"compressed_tensors": r"compressed-tensors pack-quantized \(weight_packed\)", "gptq_v1_act_order": r"GPTQ or AWQ \(qweight\)"}[case]
    with pytest.raises(UnsupportedQuantizationError, match=rf"holds quantized linears \({kind}: e\.g\. 'model\.layers\.0\..*no quantization_config"):
        LLM(qdir, backend="reference", dtype="float32", progress=False)


@pytest.mark.parametrize("case", ["compressed_tensors", "awq", "gptq_file"])
def test_a_quantization_config_over_float_weights_is_refused(tmp_path: Path, case: str) -> None:
    """A float checkpoint under a quantized checkpoint's config.json, or with a stray AutoGPTQ
    ``quantize_config.json`` read with ``quantization="gptq"``: no linear is stored quantized,
    so the declared format is refused after the build instead of running the model as float."""
    from trtcore.errors import UnsupportedQuantizationError

    qdir, ddir = _checkpoints(tmp_path, "gptq_v1_act_order" if case == "gptq_file" else case)
    method = "gptq" if case == "gptq_file" else CONFIGS[case]["quant_method"]
    if case == "gptq_file":
        (ddir / "quantize_config.json").write_text(json.dumps(CONFIGS["gptq_v1_act_order"]))
    else:
        (ddir / "config.json").write_text((qdir / "config.json").read_text())
    marker = {"compressed-tensors": r"\*\.weight_packed", "awq": r"\*\.qweight", "gptq": r"\*\.qweight"}[method]
    with pytest.raises(UnsupportedQuantizationError, match=rf"declares {method} quantization, but no linear of LlamaForCausalLM .*\(no {marker}\)"):
        LLM(ddir, backend="reference", dtype="float32", progress=False, quantization=method if case == "gptq_file" else None)


def test_the_quantization_checks_look_only_at_what_the_build_reads(tmp_path: Path) -> None:
    """A float checkpoint with an extra float8 tensor and an extra ``*.qweight`` that no layer
    reads builds (with the unexpected-tensor warning), and synthetic weights (one dtype
    attribute, not a per-tensor method) build twice from one object (both found by an
    adversarial review of the checks above)."""
    import ml_dtypes

    import trtcore.cuda as tc
    from trtcore.builder import BuildConfig, define_network
    from trtcore.cuda import synthetic

    src = write_checkpoint(VARIANTS["llama3_rope"], tmp_path / "src")
    tensors = load_file(str(src / "model.safetensors"))
    tensors["model.mtp.0.fc.weight"] = np.ones((4, 4), ml_dtypes.float8_e4m3fn)
    tensors["model.extra_proj.qweight"] = np.zeros((4, 4), np.int32)
    save_file(tensors, str(src / "model.safetensors"))
    with pytest.warns(UserWarning, match=r"2 tensors .* are not used .*model\.extra_proj\.qweight, model\.mtp\.0\.fc\.weight"):
        llm = LLM(src, backend="reference", dtype="float32", progress=False)
    assert llm.quantization is None
    cfg = synthetic.config("SmolLM2-135M", num_hidden_layers=1, vocab_size=256)
    bc = BuildConfig(dtype="bfloat16", max_batch_size=1, max_seq_len=64, max_num_tokens=64, max_num_blocks=16, kv_cache="paged")
    for weights in (synthetic.RandomWeights(pool_size=1 << 16), synthetic.RandomQuantizedWeights(cfg, 4, 64, seed=1)):
        for _ in range(2):
            define_network(tc, cfg, weights, bc)


def test_gptq_codes_of_another_width_than_the_config_says_are_named(tmp_path: Path) -> None:
    """A GPTQ checkpoint stored 8-bit whose config (or a dynamic override) says 4: the load names
    the width the tensors have, from qzeros' words per row against the scales' N, instead of a
    shape error about g_idx (found by a trial against published configs)."""
    from trtcore.errors import CheckpointError

    qdir, _ = _checkpoints(tmp_path, "gptq_v2_8bit")
    config = json.loads((qdir / "config.json").read_text())
    config["quantization_config"]["bits"] = 4
    (qdir / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"qzeros' has \d+ words a row for N=\d+ outputs .*the tensors are 8-bit: the config's bits .* say 4"):
        LLM(qdir, backend="reference", dtype="float32", progress=False)
