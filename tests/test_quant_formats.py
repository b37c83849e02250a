"""GPTQ / AWQ / compressed-tensors checkpoints read into QuantizedWeight: tiny checkpoints
made here by the independent float64 packers of :mod:`quant_packers` (random weights
quantized, packed, written with safetensors) dequantize exactly to the packers' float64
weights; detection from ``quantization_config`` and refusal of everything else."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from quant_packers import pack_awq, pack_compressed, pack_gptq, quantize
from safetensors.numpy import save_file

from trtcore.checkpoint import Checkpoint
from trtcore.errors import CheckpointError, InvalidArgumentError, UnsupportedQuantizationError
from trtcore.quant_formats import SUPPORTED_FORMATS, QuantizedCheckpoint, detect_quantization, quantized_weights

N, K = 48, 128  # N a multiple of 8 (AWQ / packed zeros), K of every group size used


def _write(tmp_path: Path, prefix: str, tensors: dict[str, np.ndarray]) -> Checkpoint:
    save_file(
        {f"{prefix}.{k}": np.ascontiguousarray(v) for k, v in tensors.items()} | {"model.norm.weight": np.ones(4, np.float32)},
        str(tmp_path / "model.safetensors"),
    )
    return Checkpoint(tmp_path)


def _read(tmp_path: Path, config: dict[str, Any], tensors: dict[str, np.ndarray]) -> Any:
    prefix = "model.layers.0.mlp.up_proj"
    ck = quantized_weights(_write(tmp_path, prefix, tensors), config)
    assert isinstance(ck, QuantizedCheckpoint)
    # packed tensors are hidden behind one X.weight; other tensors read through
    assert ck.names == ["model.layers.0.mlp.up_proj.weight", "model.norm.weight"]
    assert ck.get("model.norm.weight").tolist() == [1.0] * 4
    with pytest.raises(CheckpointError, match="quantized"):
        ck.get(f"{prefix}.weight")
    return ck.quantized(f"{prefix}.weight")


def _weight(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((N, K)) * 0.1 + rng.uniform(-0.05, 0.05, (N, 1))  # asymmetric rows


@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [32, -1])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("desc_act", [False, True])
def test_gptq_dequantizes_exactly(tmp_path: Path, fmt: str, bits: int, group_size: int, sym: bool, desc_act: bool) -> None:
    rng = np.random.default_rng([bits, group_size + 1, sym, desc_act])
    qz = quantize(_weight(bits), bits, group_size, sym=sym, rng=rng, act_order=desc_act, min_zero=1 if fmt == "gptq" else 0)
    if not sym:
        assert len(np.unique(qz.z)) > 3  # really asymmetric
    config = {"quant_method": "gptq", "bits": bits, "group_size": group_size, "sym": sym, "desc_act": desc_act, "checkpoint_format": fmt}
    if fmt == "gptq":
        del config["checkpoint_format"]  # v1 is the default
    qw = _read(tmp_path, config, pack_gptq(qz, bits, fmt, with_g_idx=desc_act or bool(rng.integers(2))))
    assert qw.bits == bits and qw.group_size == (K if group_size == -1 else group_size)
    assert (qw.perm is not None) == (desc_act and group_size != -1)  # one group: any order is contiguous
    assert (qw.zeros is None) == sym
    np.testing.assert_array_equal(qw.dequantize(), qz.dequantize())


def test_gptq_v1_and_v2_differ_by_one_zero_step(tmp_path: Path) -> None:
    """The same tensors read as v2 are one scale step above v1 (v1 stores zero - 1)."""
    qz = quantize(_weight(3), 4, 32, sym=False, rng=np.random.default_rng(0), min_zero=1)
    tensors = pack_gptq(qz, 4, "gptq")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    v1 = _read(tmp_path / "a", {"quant_method": "gptq", "bits": 4}, tensors)
    v2 = _read(tmp_path / "b", {"quant_method": "gptq", "bits": 4, "checkpoint_format": "gptq_v2"}, tensors)
    s = np.repeat(qz.s.astype(np.float64), 32, axis=1)
    np.testing.assert_array_equal(v1.dequantize(), qz.dequantize())
    np.testing.assert_allclose(v2.dequantize() - v1.dequantize(), s, rtol=1e-12, atol=0)


@pytest.mark.parametrize("group_size", [32, 64])
def test_awq_gemm_dequantizes_exactly(tmp_path: Path, group_size: int) -> None:
    qz = quantize(_weight(group_size), 4, group_size, sym=False, rng=np.random.default_rng(1))
    assert len(np.unique(qz.z)) > 3
    config = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm"}
    qw = _read(tmp_path, config, pack_awq(qz))
    assert qw.group_size == group_size and qw.perm is None
    np.testing.assert_array_equal(qw.dequantize(), qz.dequantize())


def test_gptq_and_awq_tensors_read_as_the_other_format_name_it(tmp_path: Path) -> None:
    """GPTQ and AWQ share the tensor names and the ``qzeros`` / ``scales`` layouts; only
    ``qweight``'s packed axis differs (K for GPTQ, N for AWQ). Tensors of one read with the
    other's config (4-bit: AWQ GEMM's only width) are refused with both formats and the fix
    named, not a bare shape message."""
    rng = np.random.default_rng()
    qz = quantize(_weight(int(rng.integers(100))), 4, 32, sym=False, rng=rng)
    prefix = "model.layers.0.mlp.up_proj"
    for fmt, other, tensors, shape, axis in (
        ("awq", "gptq", pack_gptq(qz, 4, "gptq"), (K // 8, N), "K"),
        ("gptq", "awq", pack_awq(qz), (K, N // 8), "N"),
    ):
        (tmp_path / fmt).mkdir()
        ck = quantized_weights(_write(tmp_path / fmt, prefix, tensors), {"quant_method": fmt, "bits": 4, "group_size": 32})
        want = (
            rf"'{prefix}.qweight' has shape \({shape[0]}, {shape[1]}\) for N={N} outputs .* packed along {axis}, {other.upper()}'s layout .*"
            rf"where {fmt.upper()} packs along .* these are {other.upper()} tensors, which quant_method '{fmt}' does not describe: "
            rf"where config.json's quantization_config says '{fmt}', its quant_method should be '{other}'; .* pass quantization='{other}'"
        )
        with pytest.raises(CheckpointError, match=want):
            ck.quantized(f"{prefix}.weight")


def _ct_config(bits: int, strategy: str, group_size: int | None, sym: bool, actorder: str | None = None) -> dict[str, Any]:
    weights = {"num_bits": bits, "type": "int", "symmetric": sym, "strategy": strategy, "group_size": group_size, "actorder": actorder}
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}},
        "ignore": ["lm_head"],
    }


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("strategy", ["group", "channel"])
@pytest.mark.parametrize("zero_point", ["symmetric", "packed", "plain"])
def test_compressed_tensors_dequantizes_exactly(tmp_path: Path, bits: int, strategy: str, zero_point: str) -> None:
    sym = zero_point == "symmetric"
    group_size = 32 if strategy == "group" else -1
    qz = quantize(_weight(bits + 1), bits, group_size, sym=sym, rng=np.random.default_rng(2))
    tensors = pack_compressed(qz, bits, sym=sym, packed_zero_point=zero_point == "packed")
    qw = _read(tmp_path, _ct_config(bits, strategy, group_size if strategy == "group" else None, sym), tensors)
    np.testing.assert_array_equal(qw.dequantize(), qz.dequantize())


@pytest.mark.parametrize("bits", [4, 8])
def test_compressed_tensors_mixed_num_bits_read_each_linear_by_its_packed_width(tmp_path: Path, bits: int) -> None:
    """Config groups of 8 and 4 bits (mixed-precision recipes) are detected, and a linear's
    num_bits is the one whose packing gives its weight_packed width; a width neither gives is
    refused by name."""
    config = _ct_config(8, "channel", None, True)
    config["config_groups"]["group_1"] = {"targets": ["re:.*mlp.*"], "weights": {**config["config_groups"]["group_0"]["weights"], "num_bits": 4}}
    assert detect_quantization(config).method == "compressed-tensors"
    qz = quantize(_weight(bits), bits, -1, sym=True, rng=np.random.default_rng(4))
    (tmp_path / "ok").mkdir()
    (tmp_path / "bad").mkdir()
    qw = _read(tmp_path / "ok", config, pack_compressed(qz, bits, sym=True))
    assert qw.bits == bits
    np.testing.assert_array_equal(qw.dequantize(), qz.dequantize())
    bad = pack_compressed(qz, bits, sym=True)
    bad["weight_packed"] = np.zeros((bad["weight_packed"].shape[0], 3), np.int32)
    with pytest.raises(CheckpointError, match=r"weight_packed' has 3 int32 columns for K=\d+; the config groups' num_bits \[4, 8\]"):
        _read(tmp_path / "bad", config, bad)


def _args_product() -> list[dict[str, Any]]:
    """QuantizationArgs objects leaving out any of the fields trtcore reads (``...``: left out)."""
    import itertools

    fields = {
        "num_bits": (..., 4, 8),
        "type": (..., "int", "FLOAT"),
        "symmetric": (..., False),
        "group_size": (..., None, 128, -1),
        "strategy": (..., None, "Group", "channel", "tensor", "token"),
        "dynamic": (..., True, False),
    }
    return [{k: v for k, v in zip(fields, values) if v is not ...} for values in itertools.product(*fields.values())]


def test_quantization_args_fill_what_compressed_tensors_fills() -> None:
    """A field a config group's ``weights`` / ``input_activations`` leaves out means what
    compressed-tensors' ``QuantizationArgs`` makes of it (the judge: the library itself, as
    transformers and vLLM read configs through it). A helper's trial found static FP8 input
    scales dropped where ``dynamic`` was left out (``{"num_bits": 8, "type": "float", "strategy":
    "tensor"}``, transformers' documented config) and int weights without ``strategy`` refused."""
    from compressed_tensors.quantization import QuantizationArgs

    from trtcore.quant_formats.compressed_tensors import quantization_args

    checked = 0
    for args in _args_product():
        try:
            want = QuantizationArgs.model_validate(args)
        except ValueError:
            continue  # compressed-tensors refuses it (e.g. static per-token): no meaning to match
        got = quantization_args(dict(args))
        for key in ("num_bits", "type", "symmetric", "group_size", "strategy", "dynamic"):
            assert got[key] == getattr(want, key), (args, key, got[key], getattr(want, key))
        checked += 1
    assert checked > 100


def test_compressed_tensors_int_weights_without_strategy_or_num_bits_read_as_the_library_reads_them(tmp_path: Path) -> None:
    """``{"group_size": 32, "num_bits": 4}`` is group quantization and ``{"strategy":
    "channel"}`` 8-bit (compressed-tensors' inference and default): read, not refused."""
    for bits, weights, group_size in ((4, {"num_bits": 4, "group_size": 32, "symmetric": False}, 32), (8, {"strategy": "channel"}, -1)):
        config = _ct_config(bits, "group", group_size, True)
        config["config_groups"]["group_0"]["weights"] = weights
        qz = quantize(_weight(bits), bits, group_size, sym=weights.get("symmetric", True), rng=np.random.default_rng(bits))
        (tmp_path / str(bits)).mkdir()
        qw = _read(tmp_path / str(bits), config, pack_compressed(qz, bits, sym=weights.get("symmetric", True)))
        np.testing.assert_array_equal(qw.dequantize(), qz.dequantize())


def test_compressed_tensors_format_per_config_group() -> None:
    config = _ct_config(4, "group", 32, True)
    config["config_groups"]["group_0"]["format"] = config.pop("format")
    assert detect_quantization(config).method == "compressed-tensors"


def test_compressed_tensors_actorder_g_idx(tmp_path: Path) -> None:
    qz = quantize(_weight(7), 4, 32, sym=False, rng=np.random.default_rng(3), act_order=True)
    qw = _read(tmp_path, _ct_config(4, "group", 32, False, "group"), pack_compressed(qz, 4, sym=False, with_g_idx=True))
    assert qw.perm is not None
    np.testing.assert_array_equal(qw.dequantize(), qz.dequantize())


@pytest.mark.parametrize("actorder", ["group", True])
def test_compressed_tensors_actorder_group_without_g_idx_is_refused(tmp_path: Path, actorder: Any) -> None:
    """actorder 'group' (True in older configs) stores each linear's weight_g_idx; without it the
    features' groups are unknown, so reading contiguous groups could misread the weight."""
    qz = quantize(_weight(7), 4, 32, sym=False, rng=np.random.default_rng(3), act_order=True)
    with pytest.raises(CheckpointError, match=r"actorder 'group', but '[\w.]+\.weight_g_idx' is not in the checkpoint"):
        _read(tmp_path, _ct_config(4, "group", 32, False, actorder), pack_compressed(qz, 4, sym=False, with_g_idx=False))


@pytest.mark.parametrize(
    ("where", "value", "names"),
    [("weights", True, "dynamic=True"), ("output_activations", {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}, "output_activations")],
)
def test_compressed_tensors_run_time_weight_or_output_quantization_is_refused(where: str, value: Any, names: str) -> None:
    """Int weights quantized at run time (``dynamic``) or a quantized output are schemes of
    their own, not weight-only int checkpoints: refused by name (vLLM matches no scheme to them)."""
    config = _ct_config(4, "group", 32, True)
    group = config["config_groups"]["group_0"]
    if where == "weights":
        group["weights"]["dynamic"] = value
    else:
        group[where] = value
    with pytest.raises(UnsupportedQuantizationError, match=names):
        detect_quantization(config, None)


def test_g_idx_with_unequal_groups_is_refused(tmp_path: Path) -> None:
    qz = quantize(_weight(8), 4, 32, sym=False, rng=np.random.default_rng(4))
    tensors = pack_gptq(qz, 4, "gptq_v2")
    tensors["g_idx"] = np.where(np.arange(K) == 0, 1, qz.g_idx).astype(np.int32)  # group 1 gets 33 features
    with pytest.raises(CheckpointError, match="g_idx"):
        _read(tmp_path, {"quant_method": "gptq", "bits": 4, "checkpoint_format": "gptq_v2"}, tensors)


def _ragged(seed: int, k: int, group_size: int) -> Any:
    """Random codes, zeros and scales of an ``[N, k]`` weight whose last group is short
    (``k`` not a multiple of ``group_size``): ``ceil(k / group_size)`` groups, as AutoGPTQ's
    ``g_idx = k // group_size`` and compressed-tensors' group strategy store them."""
    from quant_packers import Quantized

    rng = np.random.default_rng(seed)
    groups = -(-k // group_size)
    s = rng.uniform(0.01, 0.1, (N, groups)).astype(np.float16)
    return Quantized(rng.integers(0, 16, (N, k)), rng.integers(0, 16, (N, groups)), s, np.arange(k) // group_size)


@pytest.mark.parametrize("fmt", ["gptq", "gptq_no_g_idx", "awq", "compressed-tensors"])
def test_k_not_a_multiple_of_the_group_size_is_refused(tmp_path: Path, fmt: str) -> None:
    """K = 200 in groups of 64 is 4 groups, the last of 8 features. Read as 4 equal groups of
    50 the weight would be silently wrong; it is refused, naming K and the group size."""
    qz = _ragged(21, 200, 64)
    if fmt.startswith("gptq"):
        config: dict[str, Any] = {"quant_method": "gptq", "bits": 4, "group_size": 64, "checkpoint_format": "gptq_v2"}
        tensors = pack_gptq(qz, 4, "gptq_v2", with_g_idx=fmt == "gptq")
    elif fmt == "awq":
        config, tensors = {"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemm"}, pack_awq(qz)
    else:
        config, tensors = _ct_config(4, "group", 64, False), pack_compressed(qz, 4, sym=False)
    with pytest.raises(CheckpointError, match=r"K=200 .*not a multiple of group_size 64"):
        _read(tmp_path, config, tensors)


@pytest.fixture(name="fresh_warnings")
def fresh_warnings_fixture(monkeypatch: pytest.MonkeyPatch) -> None:
    """The quant_formats warn-once memo, empty for this test."""
    import trtcore.quant_formats.groups as groups

    monkeypatch.setattr(groups, "_WARNED", set())


def test_tensors_group_size_wins_over_a_config_that_divides_k(tmp_path: Path, fresh_warnings: None) -> None:
    """A config group_size that K is a multiple of but the tensors do not follow (a per-module
    override) is not refused: the tensors' own group size is read, and a warning says that the
    config and the tensors disagree (transformers and vLLM go by the config), once per shape and
    checkpoint."""
    import warnings

    qz = quantize(_weight(22), 4, 32, sym=False, rng=np.random.default_rng(5))
    config = {"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemm"}
    with pytest.warns(UserWarning, match=rf"says group_size 64, but linears such as 'model\.layers\.0\.mlp\.up_proj' \(K={K}\) hold {K // 32} groups of 32"):
        qw = _read(tmp_path, config, pack_awq(qz))
    assert qw.group_size == 32
    np.testing.assert_array_equal(qw.dequantize(), qz.dequantize())
    (tmp_path / "again").mkdir()
    with pytest.warns(UserWarning, match="says group_size 64"):  # another checkpoint: warned about again
        _read(tmp_path / "again", config, pack_awq(qz))
    from trtcore.quant_formats.groups import warn_once

    with pytest.warns(UserWarning, match="once") as caught:  # within one checkpoint, once per key
        for _ in range(3):
            warn_once(("test",), "once")
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_once(("test",), "once")


def test_compressed_tensors_config_that_contradicts_its_tensors_warns(tmp_path: Path, fresh_warnings: None) -> None:
    """Hand-edited configs of a new-user trial ran silently: strategy 'channel' over group-wise
    tensors, and symmetric: true over real zero points. The tensors are read as they are (equal
    to the float64 dequantization) and a warning names the disagreement; a config that fits
    its tensors warns about nothing."""
    import warnings

    qz = quantize(_weight(23), 4, 32, sym=False, rng=np.random.default_rng(6))
    tensors = pack_compressed(qz, 4, sym=False)
    for sub in ("ok", "channel", "sym"):
        (tmp_path / sub).mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(_read(tmp_path / "ok", _ct_config(4, "group", 32, False), tensors).dequantize(), qz.dequantize())
    with pytest.warns(UserWarning, match=rf"says per channel, but linears such as .* hold {K // 32} groups of 32"):
        qw = _read(tmp_path / "channel", _ct_config(4, "channel", None, False), tensors)
    np.testing.assert_array_equal(qw.dequantize(), qz.dequantize())
    with pytest.warns(UserWarning, match="says symmetric: true, but linears such as .* hold zero points other than the symmetric one"):
        qw = _read(tmp_path / "sym", _ct_config(4, "group", 32, True), tensors)
    np.testing.assert_array_equal(qw.dequantize(), qz.dequantize())


# ---------------------------------------------------------------------------------------
# detection


def test_compressed_tensors_refusals_name_the_field() -> None:
    """A new-user trial's hand-edited configs: without 'format' the refusal said "format
    ['None']", and a weights field out of range printed the whole object without naming the
    field. Now: 'without a format' and the formats that exist; the field, its value and what is
    read."""
    no_format = _ct_config(4, "group", 32, False)
    del no_format["format"]
    with pytest.raises(UnsupportedQuantizationError, match=r"compressed-tensors without a format \(neither .* has 'format'; a packed int checkpoint says 'pack-quantized'"):
        detect_quantization(no_format)
    with pytest.raises(UnsupportedQuantizationError, match=r"compressed-tensors weights strategy='tensor' \(of .*; int weights read: strategy one of \['group', 'channel'\]\)"):
        detect_quantization(_ct_config(4, "tensor", None, True))
    with pytest.raises(UnsupportedQuantizationError, match=r"compressed-tensors weights num_bits=2 "):
        detect_quantization(_ct_config(2, "group", 32, True))


@pytest.mark.parametrize(
    "config",
    [
        {"quant_method": "bitsandbytes", "load_in_4bit": True},
        {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
        {"quant_method": "awq", "bits": 4, "version": "gemv"},
        {"quant_method": "gptq", "bits": 3},
        {"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"},
        {"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {}},
        {"quant_method": "compressed-tensors", "config_groups": {"g": {"format": "nvfp4-pack-quantized", "weights": {"num_bits": 4}}}},
        _ct_config(4, "tensor", None, True),
        {"quant_method": "gguf", "ggml_types": {"x.weight": "IQ2_XS"}},
    ],
)
def test_unsupported_formats_are_refused_with_the_list(config: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedQuantizationError) as e:
        detect_quantization(config)
    assert SUPPORTED_FORMATS in str(e.value)
    for name in ("gptq", "awq", "compressed-tensors", "gguf", "Q4_K", "pack-quantized"):
        assert name in str(e.value)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"quant_method": "gptq", "bits": None}, r"GPTQ bits=None \(expected an integer"),
        ({"quant_method": "gptq", "bits": "four"}, r"GPTQ bits='four' \(expected an integer"),
        ({"quant_method": "gptq", "bits": 4, "group_size": "128g"}, r"GPTQ group_size='128g' \(expected an integer"),
        ({"quant_method": "gptq", "bits": 4, "dynamic": {"+:.*down_proj": {"group_size": [32]}}}, r"group_size=\[32\] \(expected an integer"),
        ({"quant_method": "awq", "bits": "x", "version": "gemm"}, r"AWQ bits='x' \(expected an integer"),
        ({"quant_method": "awq", "w_bit": 4, "q_group_size": 12.5, "version": "gemm"}, r"AWQ q_group_size=12.5 \(expected an integer"),
    ],
)
def test_non_integer_bits_and_group_size_are_refused_by_name(config: dict[str, Any], match: str) -> None:
    """A ``bits`` / ``group_size`` that is no integer is refused naming the key and the value
    (not a bare TypeError / ValueError from int(), nor at the first weight read)."""
    with pytest.raises(UnsupportedQuantizationError, match=match):
        detect_quantization(config)


def test_quantization_argument_is_case_insensitive() -> None:
    """``quantization="FP8"`` is vLLM's ``"fp8"`` (as ``kv_cache_dtype="FP8"`` is ``"fp8"``); a
    mismatch or an unknown name is refused echoing what was given."""
    assert detect_quantization(None, "FP8").method == "fp8"
    assert detect_quantization({"quant_method": "GPTQ", "bits": 4, "group_size": 128}, "Gptq").method == "gptq"
    with pytest.raises(InvalidArgumentError, match=r"quantization='AWQ', but config\.json has no quantization_config"):
        detect_quantization(None, "AWQ")
    with pytest.raises(InvalidArgumentError, match=r"quantization='INT4' is not supported; expected None or one of"):
        detect_quantization(None, "INT4")


def test_integer_strings_are_read_as_integers() -> None:
    """``"bits": "4"`` (hand-edited configs) reads as 4, at the top level and in a dynamic
    override; ``"group_size": null`` leaves the group size to the tensors."""
    assert detect_quantization({"quant_method": "gptq", "bits": "4", "group_size": "128", "dynamic": {"+:.*down_proj": {"bits": "8"}}})
    assert detect_quantization({"quant_method": "gptq", "bits": 4, "group_size": None})
    with pytest.raises(UnsupportedQuantizationError, match=r"bits='3'"):
        detect_quantization({"quant_method": "gptq", "bits": 4, "dynamic": {"+:.*down_proj": {"bits": "3"}}})


def test_a_4_bit_float_format_is_not_called_fp8() -> None:
    """NVFP4 (compressed-tensors ``nvfp4-pack-quantized``, 4-bit float weights in groups of 16)
    is refused by its own name and bit width, not as an FP8 format."""
    config = {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}}
        },
    }
    with pytest.raises(UnsupportedQuantizationError, match=r"format 'nvfp4-pack-quantized' with 4-bit float weights is not supported") as e:
        detect_quantization(config)
    assert "FP8 format" not in str(e.value)


def test_mixed_precision_is_read_by_its_groups_formats() -> None:
    """compressed-tensors ``format: "mixed-precision"`` names each group's format in the group
    (compressed-tensors#415, vllm#22468): int groups of different bits, all pack-quantized, are
    read (each linear's bits come from its tensors); an FP8 group beside an int one is refused
    naming both formats, not as a bare "format 'mixed-precision'"."""
    w4 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}
    w8 = {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}
    fp8 = {"num_bits": 8, "type": "float", "strategy": "channel"}
    mlp = {"targets": ["re:.*mlp.*"], "weights": w4, "format": "pack-quantized"}

    def config(attn: dict) -> dict:
        return {"quant_method": "compressed-tensors", "format": "mixed-precision", "config_groups": {"mlp": mlp, "attn": attn}}

    scheme = detect_quantization(config({"targets": ["re:.*self_attn.*"], "weights": w8, "format": "pack-quantized"}))
    assert scheme is not None and scheme.method == "compressed-tensors"
    attn = {"targets": ["re:.*self_attn.*"], "weights": fp8, "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}}
    with pytest.raises(UnsupportedQuantizationError, match=r"'mixed-precision' with config groups in formats \['float-quantized', 'pack-quantized'\]"):
        detect_quantization(config({**attn, "format": "float-quantized"}))


def test_requested_quantization_must_match_the_config() -> None:
    gptq = {"quant_method": "gptq", "bits": 4}
    assert detect_quantization(gptq).method == "gptq"
    assert detect_quantization(gptq, "gptq").method == "gptq"
    assert detect_quantization(None) is None
    with pytest.raises(InvalidArgumentError, match="quant_method 'gptq'"):
        detect_quantization(gptq, "awq")
    with pytest.raises(InvalidArgumentError, match="no quantization_config"):
        detect_quantization(None, "gptq")
    with pytest.raises(InvalidArgumentError, match="bitsandbytes"):
        detect_quantization(gptq, "bitsandbytes")


def test_llm_refuses_unsupported_and_mismatched_quantization(tmp_path: Path) -> None:
    from hf_models import VARIANTS, write_checkpoint

    from trtcore import LLM

    d = write_checkpoint(VARIANTS["llama3_rope"], tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "bitsandbytes"}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedQuantizationError, match="supported formats: gptq"):
        LLM(d, backend="reference", progress=False)
    del cfg["quantization_config"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InvalidArgumentError, match="no quantization_config"):
        LLM(d, backend="reference", progress=False, quantization="awq")


def test_a_mismatched_quantization_name_says_the_fix() -> None:
    """quantization='awq' on a compressed-tensors checkpoint (what trtcore quantize --method awq
    writes) is refused as vLLM refuses it, naming both methods and the two ways out."""
    from trtcore.quant_formats import detect_quantization

    weights = {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 64}
    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}
    with pytest.raises(InvalidArgumentError) as ei:
        detect_quantization(qc, "awq")
    msg = str(ei.value)
    assert "quantization='awq'" in msg and "quant_method 'compressed-tensors'" in msg
    assert "leave quantization out" in msg and "or pass 'compressed-tensors'" in msg and "trtcore quantize writes" in msg


def test_model_config_keeps_quantization_config() -> None:
    from hf_models import VARIANTS, _config

    from trtcore.config import ModelConfig
    from trtcore.errors import ConfigError

    d = _config(VARIANTS["llama3_rope"]).to_dict()
    assert ModelConfig.from_dict(d).quantization_config is None
    qc = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"}
    c = ModelConfig.from_dict(d | {"quantization_config": qc})
    assert c.quantization_config == qc
    assert ModelConfig.from_dict(c.to_dict()).quantization_config == qc
    with pytest.raises(ConfigError, match="quantization_config"):
        ModelConfig.from_dict(d | {"quantization_config": "gptq"})


# FP8 with per-token dynamic activations (llm-compressor's FP8_DYNAMIC scheme)


def _fp8_dynamic_config(strategy: str = "token", dynamic: bool = True, weights: str = "channel") -> dict[str, Any]:
    """The ``quantization_config`` of RedHatAI's ``*-FP8-dynamic`` checkpoints (llm-compressor
    FP8_DYNAMIC), its activation strategy and ``dynamic`` flag as given."""
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": weights, "symmetric": True, "dynamic": False, "group_size": None},
                "input_activations": {
                    "num_bits": 8,
                    "type": "float",
                    "strategy": strategy,
                    "symmetric": True,
                    "dynamic": dynamic,
                    "group_size": None,
                },
                "output_activations": None,
            }
        },
    }


def test_fp8_dynamic_per_token_checkpoint_is_detected_and_read(tmp_path: Path) -> None:
    scheme = detect_quantization(_fp8_dynamic_config())
    assert scheme is not None and scheme.method == "compressed-tensors" and scheme.fp8
    assert "per token dynamic" in SUPPORTED_FORMATS
    rng = np.random.default_rng(11)
    codes = rng.integers(0, 0x7E, (N, K), dtype=np.uint8) | (rng.integers(0, 2, (N, K), dtype=np.uint8) << 7)
    import ml_dtypes

    tensors = {"weight": codes.view(ml_dtypes.float8_e4m3fn), "weight_scale": rng.uniform(0.01, 0.1, (N, 1)).astype(np.float32)}
    fw = _read(tmp_path, _fp8_dynamic_config(), tensors)
    assert fw.per_token and fw.input_scale is None and fw.per_channel
    np.testing.assert_array_equal(fw.weight, codes)
    # the per-tensor dynamic config of the same tensors reads a weight that is not per token
    (tmp_path / "t").mkdir()
    assert not _read(tmp_path / "t", _fp8_dynamic_config("tensor"), tensors).per_token
    # an input_scale tensor beside a dynamic config is ignored (with a warning), as vLLM does
    for i, strategy in enumerate(("token", "tensor")):
        (tmp_path / f"s{i}").mkdir()
        with pytest.warns(UserWarning, match="input_scale tensors are ignored"):
            fw = _read(tmp_path / f"s{i}", _fp8_dynamic_config(strategy), tensors | {"input_scale": np.full(1, 0.5, np.float32)})
        assert fw.input_scale is None and fw.per_token == (strategy == "token")


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (_fp8_dynamic_config(dynamic=False), "static per-token scales cannot exist"),
        (_fp8_dynamic_config("group"), "FP8 activations are read per tensor, static or dynamic, and per token, dynamic"),
        (_fp8_dynamic_config(weights="block"), "strategy tensor or channel"),
    ],
)
def test_unsupported_fp8_activation_variants_are_refused(config: dict[str, Any], match: str) -> None:
    with pytest.raises(UnsupportedQuantizationError, match=match) as e:
        detect_quantization(config)
    assert SUPPORTED_FORMATS in str(e.value)


def test_fp8_groups_with_different_activation_strategies_are_refused() -> None:
    config = _fp8_dynamic_config()
    config["config_groups"]["group_1"] = _fp8_dynamic_config("tensor")["config_groups"]["group_0"] | {"targets": ["re:.*down_proj"]}
    with pytest.raises(UnsupportedQuantizationError, match="different FP8 activation strategies"):
        detect_quantization(config)


# --- published checkpoints' quantization_config objects (tests/data/quant_configs/*.json) ---

_PUBLISHED = sorted((Path(__file__).parent / "data" / "quant_configs").glob("*.json"))


@pytest.mark.parametrize("path", _PUBLISHED, ids=[p.stem for p in _PUBLISHED])
def test_published_quantization_configs(path):
    data = json.loads(path.read_text())
    assert data["source"] and data["expect"] in ("accept", "refuse")
    if data["expect"] == "accept":
        assert detect_quantization(data["quantization_config"], None) is not None
    else:
        with pytest.raises(UnsupportedQuantizationError) as e:
            detect_quantization(data["quantization_config"], None)
        assert data["refusal_names"] in str(e.value) and "supported formats:" in str(e.value)


def test_int_weights_with_quantized_activations_are_refused():
    """A W4A8 pack-quantized group (int8 per-token activations) is not read as weight-only."""
    data = json.loads((Path(__file__).parent / "data" / "quant_configs" / "redhatai-llama-3.1-8b-instruct-quantized-w4a16.json").read_text())
    config = data["quantization_config"]
    config["config_groups"]["group_0"]["input_activations"] = {"dynamic": True, "num_bits": 8, "strategy": "token", "symmetric": True, "type": "int"}
    with pytest.raises(UnsupportedQuantizationError, match="input_activations"):
        detect_quantization(config, None)


_SPARSE_24 = {
    "format": "sparse-24-bitmask",
    "global_sparsity": 0.45,
    "ignore": ["lm_head"],
    "registry_requires_subclass": False,
    "sparsity_structure": "2:4",
    "targets": ["Linear"],
}


@pytest.mark.parametrize(
    "config",
    [
        _fp8_dynamic_config() | {"sparsity_config": _SPARSE_24},  # llm-compressor W8A8-FP8 + 2:4 (float-quantized + sparse-24-bitmask)
        _ct_config(4, "group", 128, True) | {"sparsity_config": _SPARSE_24 | {"format": "sparse-bitmask", "sparsity_structure": "unstructured"}},
        {"quant_method": "compressed-tensors", "sparsity_config": _SPARSE_24},  # 2:4 sparse, not quantized
    ],
)
def test_sparse_compressed_tensors_are_refused_by_their_sparsity_format(config: dict[str, Any]) -> None:
    """A compressed-tensors sparsity compressor stores a linear as ``X.compressed`` /
    ``X.bitmask`` / ``X.shape`` instead of ``X.weight`` (or ``X.weight_packed``): refused at
    detection naming the sparsity format, not accepted and then missing ``X.weight`` at load."""
    with pytest.raises(UnsupportedQuantizationError, match=r"sparsity_config format 'sparse-(24-)?bitmask'") as e:
        detect_quantization(config)
    assert SUPPORTED_FORMATS in str(e.value)


def test_dense_sparsity_config_is_read() -> None:
    """``sparsity_config`` with ``format: "dense"``, null or ``{}`` -- what compressed-tensors'
    ``ModelCompressor.update_config`` writes into every checkpoint without sparsity, beside
    ``"transform_config": {}``; refused before, so every recent llm-compressor checkpoint was
    (found by a trial against published configs) -- stores the weights as they are."""
    for sparsity in (None, {}, _SPARSE_24 | {"format": "dense"}):
        config = _ct_config(4, "group", 128, True) | {"sparsity_config": sparsity, "transform_config": {}}
        assert detect_quantization(config).method == "compressed-tensors"
    assert detect_quantization(_fp8_dynamic_config() | {"sparsity_config": {}, "transform_config": {}}).fp8


def _transforms(*locations: str) -> dict[str, Any]:
    """A compressed-tensors ``transform_config`` with one scheme applying at ``locations``
    (llm-compressor's QuIP preset: input + weight_input, weight_output + output)."""
    apply = [{"targets": ["Linear"], "location": loc, "ignore": "lm_head", "inverse": i % 2 == 1} for i, loc in enumerate(locations)]
    return {"config_groups": {"v": {"type": "hadamard", "apply": apply, "randomize": True}}}


def test_transforms_applied_at_run_time_are_refused() -> None:
    """A ``transform_config`` with a location that rotates activations at run time (QuIP,
    SpinQuant's online Hadamards: input, output, k_cache, q_attn) is refused naming them --
    trtcore would read the rotated weights without the inverse rotation, garbage with no error --
    while transforms merged into the stored weights (weight_input / weight_output) are read."""
    base = _ct_config(4, "group", 128, False)
    for locations, online in ((("input", "weight_input"), "['input']"), (("weight_output", "output", "k_cache"), "['k_cache', 'output']")):
        with pytest.raises(UnsupportedQuantizationError, match=rf"transform_config applied at run time at {re.escape(online)}"):
            detect_quantization(base | {"transform_config": _transforms(*locations)})
    assert detect_quantization(base | {"transform_config": _transforms("weight_input", "weight_output")}).method == "compressed-tensors"


def test_gptqmodel_pack_dtypes_other_than_int32_are_refused() -> None:
    """GPTQModel's ``pack_dtype`` (the words the codes are packed in): int32 (also written
    ``torch.int32``) is read; int16 / int8 are refused at detection by name, not at load as a
    qweight of the wrong dtype."""
    config = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
    for pack in ("int32", "torch.int32"):
        assert detect_quantization(config | {"pack_dtype": pack}).method == "gptq"
    with pytest.raises(UnsupportedQuantizationError, match=r"GPTQ pack_dtype='int16' \(codes packed in int16 words"):
        detect_quantization(config | {"pack_dtype": "int16"})


def test_autogptq_marlin_checkpoints_are_refused() -> None:
    """AutoGPTQ <= 0.7.1 marks a Marlin-serialized checkpoint (tensors ``B`` / ``s``, not
    ``qweight``) with ``is_marlin_format: true`` instead of ``checkpoint_format: "marlin"``
    (vLLM's ``check_marlin_format`` reads both): refused by name, not read as GPTQ v1."""
    config = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True, "is_marlin_format": True}
    with pytest.raises(UnsupportedQuantizationError, match=r"is_marlin_format=True") as e:
        detect_quantization(config)
    assert SUPPORTED_FORMATS in str(e.value)
    assert detect_quantization(config | {"is_marlin_format": False, "checkpoint_format": "gptq"}).method == "gptq"


@pytest.mark.parametrize("key", ["format", "FORMAT_UPPER"])
def test_gptq_format_key_names_the_checkpoint_format(tmp_path: Path, key: str) -> None:
    """transformers (v5) names GPTQ's checkpoint format ``format`` (``checkpoint_format`` is its
    legacy alias, lower-cased): ``{"format": "gptq_v2"}`` is v2, whose zero points are stored
    as they are; read as v1 every weight would be one scale step off."""
    qz = quantize(_weight(31), 4, 32, sym=False, rng=np.random.default_rng(6))
    config: dict[str, Any] = {"quant_method": "gptq", "bits": 4, "group_size": 32}
    config |= {"format": "gptq_v2"} if key == "format" else {"checkpoint_format": "GPTQ_V2"}
    qw = _read(tmp_path, config, pack_gptq(qz, 4, "gptq_v2"))
    np.testing.assert_array_equal(qw.dequantize(), qz.dequantize())
    with pytest.raises(UnsupportedQuantizationError, match=r"checkpoint_format 'marlin'"):
        detect_quantization({"quant_method": "gptq", "bits": 4, "format": "marlin"})


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "format": "gemv"}, r"AWQ version 'gemv'"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "format": "gemv_fast", "version": "gemv_fast"}, r"AWQ version 'gemv_fast'"),
        # transformers 4.x AwqConfig(backend="llm-awq") wrote version "gemm" beside it: MIT llm-awq's own packing
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "backend": "llm-awq"}, r"AWQ version 'llm-awq'"),
    ],
)
def test_awq_format_and_llm_awq_backend_are_read(config: dict[str, Any], match: str) -> None:
    """An AWQ config's layout is ``version``, else ``format`` (transformers v5's name), and
    ``backend: "llm-awq"`` (transformers 4.x) means llm-awq's layout whatever the version says."""
    with pytest.raises(UnsupportedQuantizationError, match=match) as e:
        detect_quantization(config)
    assert SUPPORTED_FORMATS in str(e.value)
    assert detect_quantization({"quant_method": "awq", "bits": 4, "format": "gemm", "backend": "auto"}).method == "awq"


def test_weight_only_fp8_is_refused() -> None:
    """A compressed-tensors FP8 group without ``input_activations`` is weight-only FP8 (W8A16:
    vLLM's CompressedTensorsW8A16Fp8, activations stay in the model dtype). Read as an FP8
    linear, its activations would be quantized to E4M3 too, a different function from the
    checkpoint's; it is refused by name."""
    config = _fp8_dynamic_config()
    config["config_groups"]["group_0"]["input_activations"] = None
    with pytest.raises(UnsupportedQuantizationError, match=r"FP8 weights without input_activations \(group 'group_0': weight-only FP8, W8A16") as e:
        detect_quantization(config)
    assert SUPPORTED_FORMATS in str(e.value)


@pytest.mark.parametrize("layout", ["fp8", "compressed-tensors"])
def test_static_fp8_linear_without_input_scale_is_refused(tmp_path: Path, layout: str) -> None:
    """A config with static activation scales (``activation_scheme: "static"``, or
    compressed-tensors ``input_activations`` ``dynamic: false``) whose linear has no
    ``input_scale`` is refused naming the tensor, not run with dynamic scales instead."""
    import ml_dtypes

    rng = np.random.default_rng(12)
    codes = rng.integers(0, 0x7E, (N, K), dtype=np.uint8)
    tensors = {"weight": codes.view(ml_dtypes.float8_e4m3fn), "weight_scale": np.full(1, 0.02, np.float32)}
    if layout == "fp8":
        config: dict[str, Any] = {"quant_method": "fp8", "activation_scheme": "static"}
    else:
        config = _fp8_dynamic_config("tensor", dynamic=False, weights="tensor")
    with pytest.raises(CheckpointError, match=r"'model.layers.0.mlp.up_proj' has no input_scale.*static"):
        _read(tmp_path, config, tensors)
    (tmp_path / "ok").mkdir()
    fw = _read(tmp_path / "ok", config, tensors | {"input_scale": np.full(1, 0.5, np.float32)})
    assert fw.input_scale is not None and fw.input_scale.tolist() == [0.5]
    if layout == "fp8":  # the same tensors under activation_scheme "dynamic": the scale is ignored, as vLLM does
        (tmp_path / "dyn").mkdir()
        with pytest.warns(UserWarning, match="input_scale tensors are ignored"):
            fw = _read(tmp_path / "dyn", {**config, "activation_scheme": "dynamic"}, tensors | {"input_scale": np.full(1, 0.5, np.float32)})
        assert fw.input_scale is None


def test_transformers_fp8_activation_scale_is_the_input_scale(tmp_path: Path) -> None:
    """transformers' ``FP8Linear`` (finegrained FP8, ``activation_scheme: "static"``) saves the
    static activation scale as ``X.activation_scale`` beside ``X.weight_scale_inv``, as its
    Ministral-3 / Devstral-2 FP8 checkpoints are published (transformers#42715); it is read as
    the input scale, as SGLang reads it (it was refused: 'has no input_scale')."""
    import ml_dtypes

    rng = np.random.default_rng(14)
    codes = rng.integers(0, 0x7E, (N, K), dtype=np.uint8)
    tensors = {"weight": codes.view(ml_dtypes.float8_e4m3fn), "weight_scale_inv": np.array(0.02, np.float32), "activation_scale": np.array(0.05, np.float32)}
    fw = _read(tmp_path, {"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": None}, tensors)
    assert fw.input_scale is not None and fw.input_scale.tolist() == [np.float32(0.05)]
    np.testing.assert_array_equal(fw.weight_scale, [np.float32(0.02)])


def test_gptqmodel_fp8_inverse_scales_divide(tmp_path: Path) -> None:
    """GPTQModel's FP8 export stores ``weight_scale_inv = fp8_max / amax`` and dequantizes with
    ``w = q / weight_scale_inv`` (``weight_scale_semantics: "inverse"``, GPTQModel
    ``TorchFP8Linear.dequantize_weight``); read as Hugging Face's multiplier every weight was
    off by (448 / amax)^2. Another semantics is refused by name."""
    import ml_dtypes

    rng = np.random.default_rng(15)
    w = rng.standard_normal((N, K))
    inv = (448.0 / np.abs(w).max(axis=1)).astype(np.float32)  # per row, GPTQModel's weight_scale_method "row"
    codes = np.clip(w * inv[:, None], -448, 448).astype(ml_dtypes.float8_e4m3fn)
    config = {"quant_method": "fp8", "format": "float8_e4m3fn", "weight_scale_method": "row", "weight_scale_semantics": "inverse"}
    want = codes.astype(np.float64) / inv.astype(np.float64)[:, None]  # GPTQModel's dequantization, in float64
    # quant_method in capitals, and a null semantics (GPTQModel reads null as "inverse"), too
    for i, cfg in enumerate([config, {**config, "quant_method": "FP8"}, {**config, "weight_scale_semantics": None}]):
        (tmp_path / str(i)).mkdir()
        fw = _read(tmp_path / str(i), cfg, {"weight": codes, "weight_scale_inv": inv})
        got = codes.astype(np.float64) * fw.weight_scale.astype(np.float64)[:, None]
        np.testing.assert_allclose(got, want, rtol=2e-7)
        assert np.abs(got - w).max() < 0.07 * np.abs(w).max()  # E4M3's step at the top of each row: an FP8 copy of w
    with pytest.raises(UnsupportedQuantizationError, match="weight_scale_semantics 'direct'"):
        detect_quantization({**config, "weight_scale_semantics": "direct"})


def test_compressed_tensors_actorder_dynamic_needs_g_idx(tmp_path: Path) -> None:
    """compressed-tensors' ``actorder: "dynamic"`` is an alias of ``"group"``
    (``ActivationOrdering.get_aliases``): a linear without ``weight_g_idx`` is refused as for
    ``"group"`` (the guard skipped the alias)."""
    qz = quantize(_weight(16), 4, 32, sym=True, rng=np.random.default_rng(16), act_order=True)
    tensors = pack_compressed(qz, 4, sym=True)  # without weight_g_idx
    config = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32, "actorder": "dynamic"}}},
    }
    with pytest.raises(CheckpointError, match="weight_g_idx"):
        _read(tmp_path, config, tensors)
    (tmp_path / "ok").mkdir()
    assert _read(tmp_path / "ok", config, pack_compressed(qz, 4, sym=True, with_g_idx=True)).perm is not None


def test_autoawq_config_in_quantize_config_json_names_awq(tmp_path: Path) -> None:
    """An AutoAWQ config (``w_bit``, ``q_group_size``) in ``quantize_config.json`` (vLLM reads AWQ's
    config from that file too): without ``quantization`` the message names ``'awq'`` (it said
    ``'gptq'``), ``quantization="gptq"`` is refused naming awq (it was read as GPTQ, ``w_bit``
    ignored), and ``quantization="awq"`` reads it."""
    import dataclasses
    import json

    from trtcore.quant_formats import resolve_quantization

    @dataclasses.dataclass(frozen=True)
    class Config:
        quantization_config: dict[str, Any] | None = None

    (tmp_path / "quantize_config.json").write_text(json.dumps({"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"}))
    with pytest.raises(InvalidArgumentError, match=r"quant_method 'awq'\); pass quantization='awq'"):
        resolve_quantization(tmp_path, Config(), None)
    with pytest.raises(InvalidArgumentError, match=r"holds a awq quantization config, not gptq; pass quantization='awq'"):
        resolve_quantization(tmp_path, Config(), "gptq")
    config, scheme = resolve_quantization(tmp_path, Config(), "awq")
    assert scheme is not None and scheme.method == "awq" and config.quantization_config["quant_method"] == "awq"
    # a method no quantization= reads from these files: named, not offered as quantization='fp8'
    (tmp_path / "quantize_config.json").write_text(json.dumps({"quant_method": "fp8", "activation_scheme": "dynamic"}))
    for asked in (None, "gptq"):
        with pytest.raises(InvalidArgumentError, match=r"quant_method 'fp8' config; trtcore reads only GPTQ and AWQ configs from"):
            resolve_quantization(tmp_path, Config(), asked)


@pytest.mark.parametrize("where", ["config", "group"])
def test_compressed_tensors_format_that_is_not_a_string_is_refused_by_name(where: str) -> None:
    """A compressed-tensors ``format`` that is a list or an object (a fuzzed config; no
    published one) is refused naming it (the config's raised ``TypeError: unhashable type``; a
    group's passed unread)."""
    group = {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}}
    config: dict[str, Any] = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": group}}
    if where == "config":
        config["format"] = ["pack-quantized"]
    else:
        config["config_groups"]["group_0"] = group | {"format": {"name": "pack-quantized"}}
    with pytest.raises(UnsupportedQuantizationError, match=r"compressed-tensors format .*pack-quantized.* a format name, a string, is read"):
        detect_quantization(config)


def test_packed_siblings_names_the_packed_module_s_linears() -> None:
    from trtcore.families import LLAMA_PACKED_MODULES
    from trtcore.quant_formats import packed_siblings

    p = "model.layers.3.self_attn"
    assert packed_siblings(f"{p}.k_proj.weight", LLAMA_PACKED_MODULES) == [f"{p}.{m}_proj.weight" for m in "qkv"]
    assert packed_siblings(f"{p}.k_proj", LLAMA_PACKED_MODULES) == [f"{p}.{m}_proj" for m in "qkv"]
    assert packed_siblings("model.layers.0.mlp.up_proj.weight", LLAMA_PACKED_MODULES) == [
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
    ]
    assert packed_siblings("up_proj.weight", LLAMA_PACKED_MODULES) == ["gate_proj.weight", "up_proj.weight"]
    for alone in ("model.layers.0.self_attn.o_proj.weight", "lm_head.weight", "model.layers.0.mlp.down_proj"):
        assert packed_siblings(alone, LLAMA_PACKED_MODULES) == [alone]


def test_resolve_quantization_takes_any_case(tmp_path: Path) -> None:
    """quantization='GPTQ' (upper case, as LLM(...) callers write it) reads AutoGPTQ's
    quantize_config.json as 'gptq' does (it was refused: 'no quantize_config.json')."""
    import dataclasses
    import json

    from trtcore.quant_formats import resolve_quantization

    @dataclasses.dataclass(frozen=True)
    class Config:
        quantization_config: dict[str, Any] | None = None

    (tmp_path / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128, "desc_act": False, "sym": True}))
    for name in ("gptq", "GPTQ", "Gptq"):
        config, scheme = resolve_quantization(tmp_path, Config(), name)
        assert scheme is not None and scheme.method == "gptq" and config.quantization_config["quant_method"] == "gptq"


def test_one_group_shorter_than_the_group_size_is_read() -> None:
    """K below the config's group size (a small linear of a group-128 checkpoint) is one whole
    group, not a short last group (it was refused: 'the last of its 1 groups holds 64')."""
    from trtcore.quant_formats.groups import grouped_weight

    rng = np.random.default_rng(8)
    codes = rng.integers(0, 16, (8, 64)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, (8, 1))
    qw = grouped_weight(codes, scales, None, 4, None, "w", (128,))
    np.testing.assert_array_equal(qw.dequantize(), (codes.astype(np.float64) - 8) * scales.astype(np.float32))


def test_gptq_rotated_and_e5m2_fp8_and_bitsandbytes_configs_are_refused_by_name() -> None:
    """Published configs a trial found misread: GPTQModel's ``rotation`` (its loader re-applies
    a Hadamard rotation to activations before down_proj at run time; read as plain GPTQ the
    output is wrong with no error), GPTQModel's FP8 ``format: "float8_e5m2"`` (accepted, then
    refused at load), and a transformers 4.x bitsandbytes config with ``load_in_4bit`` and no
    ``quant_method`` ("quant_method None")."""
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "checkpoint_format": "gptq", "pack_dtype": "int32"}
    with pytest.raises(UnsupportedQuantizationError, match=r"GPTQ rotation='hadamard' \(GPTQModel rotates") as e:
        detect_quantization(gptq | {"rotation": "hadamard"})
    assert SUPPORTED_FORMATS in str(e.value)
    assert detect_quantization(gptq | {"rotation": None}).method == "gptq"
    with pytest.raises(UnsupportedQuantizationError, match=r"FP8 format 'float8_e5m2' \(E4M3, float8_e4m3fn, is read\)"):
        detect_quantization({"quant_method": "fp8", "activation_scheme": "dynamic", "format": "float8_e5m2"})
    assert detect_quantization({"quant_method": "fp8", "activation_scheme": "dynamic", "format": "float8_e4m3fn"}).fp8
    for key in ("load_in_4bit", "load_in_8bit"):
        with pytest.raises(UnsupportedQuantizationError, match=r"bitsandbytes \(load_in_4bit / load_in_8bit without quant_method"):
            detect_quantization({key: True, "bnb_4bit_quant_type": "nf4"})
        with pytest.raises(UnsupportedQuantizationError, match=r"bitsandbytes"):
            detect_quantization({"quant_method": None, key: True})
    with pytest.raises(UnsupportedQuantizationError, match=r"FP8 format 'float8_e4m3fnuz'"):  # AMD's E4M3: another bias, other numbers
        detect_quantization({"quant_method": "fp8", "activation_scheme": "dynamic", "format": "float8_e4m3fnuz"})
    for config in ({"bits": 4}, {"quant_method": None, "bits": 4}, {"quant_method": ""}):  # said "quant_method None is not supported"
        with pytest.raises(UnsupportedQuantizationError, match=r"quantization_config: a config without quant_method is not supported; supported formats"):
            detect_quantization(config)


_KV_FP8 = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


@pytest.mark.parametrize(
    "config",
    [
        # llm-compressor QuantizationModifier(kv_cache_scheme=...) alone: the linears stay float
        {
            "quant_method": "compressed-tensors",
            "config_groups": {},
            "format": "dense",
            "kv_cache_scheme": _KV_FP8,
            "quantization_status": "compressed",
        },
        {"quant_method": "compressed-tensors", "kv_cache_scheme": _KV_FP8, "sparsity_config": {}, "transform_config": {}},
        # offline transforms merged into float weights, nothing quantized
        {"quant_method": "compressed-tensors", "transform_config": _transforms("weight_input", "weight_output")},
    ],
)
def test_compressed_tensors_without_quantized_weights_is_a_float_checkpoint(config: dict[str, Any]) -> None:
    """A compressed-tensors config whose groups quantize no weights describes float linears
    (vLLM's ``get_scheme`` falls back to the unquantized linear method): no scheme, rather than
    a refusal of the format; ``quantization="compressed-tensors"`` agrees with it. What the
    config cannot describe is still refused: activations quantized over float weights, run-time
    transforms, sparse compressors."""
    assert detect_quantization(config) is None
    assert detect_quantization(config, "compressed-tensors") is None
    acts = {"quant_method": "compressed-tensors", "format": "dense"}
    acts["config_groups"] = {"g": {"targets": ["Linear"], "input_activations": _KV_FP8 | {"dynamic": True}}}
    with pytest.raises(UnsupportedQuantizationError, match=r"activations quantized without quantized weights \(groups \['g'\]\)"):
        detect_quantization(acts)
    with pytest.raises(UnsupportedQuantizationError, match=r"transform_config applied at run time"):
        detect_quantization({"quant_method": "compressed-tensors", "kv_cache_scheme": _KV_FP8, "transform_config": _transforms("input")})
    # a quantized format with no group describing its weights (a review's find: int-quantized
    # int8 X.weight read as float), and compressed-tensors' preset shorthand, which names no weights
    for fmt in ("int-quantized", "naive-quantized", "pack-quantized", "float-quantized"):
        with pytest.raises(UnsupportedQuantizationError, match=rf"format \['{fmt}'\] with no config group describing its weights"):
            detect_quantization(
                {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"g": {"targets": ["Linear"], "weights": None}}}
            )
    with pytest.raises(UnsupportedQuantizationError, match=r"config_groups \{'W8A16': \['Linear'\]\} \(a preset name's shorthand"):
        detect_quantization({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"W8A16": ["Linear"]}})
    with pytest.raises(UnsupportedQuantizationError, match=r"activations quantized without quantized weights \(groups \['o'\]\)"):
        detect_quantization({"quant_method": "compressed-tensors", "config_groups": {"o": {"output_activations": _KV_FP8}}})
