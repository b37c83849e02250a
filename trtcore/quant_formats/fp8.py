"""FP8 (E4M3) checkpoints, read into :class:`trtcore.fp8.Fp8Weight`.

Two published layouts, both with the E4M3 weight in the linear's own ``X.weight`` tensor
(safetensors ``F8_E4M3``, ``[N, K]``):

* compressed-tensors ``float-quantized`` (llm-compressor's FP8 schemes; ``quant_method:
  "compressed-tensors"``, ``format: "float-quantized"`` or ``"naive-quantized"``, config groups
  whose ``weights`` are ``{"type": "float", "num_bits": 8, "strategy": "tensor" | "channel"}``):
  ``X.weight_scale`` ``[1]`` / ``[]`` (tensor) or ``[N, 1]`` (channel), and ``X.input_scale``
  ``[1]`` when the group's ``input_activations`` are static (``"dynamic": false``, strategy
  ``tensor``); dynamic activations have none: per tensor (strategy ``tensor``) or per token
  (strategy ``token``, ``"dynamic": true``: llm-compressor's ``FP8_DYNAMIC`` scheme, e.g.
  RedHatAI's ``*-FP8-dynamic`` models; one scale per row of x, :mod:`trtcore.fp8`);
* Hugging Face / vLLM ``quant_method: "fp8"`` (``activation_scheme: "static" | "dynamic"``):
  ``X.weight_scale`` (one per tensor, or ``[N]`` / ``[N, 1]`` per channel) or, from HF's
  ``FP8Linear``, ``X.weight_scale_inv`` (the same number: ``w = q * weight_scale_inv``), and
  ``X.input_scale`` when static (transformers' ``FP8Linear`` names it ``X.activation_scale``:
  the same number, read as the input scale, as SGLang reads it). GPTQModel's FP8 export
  (``weight_scale_semantics: "inverse"``) stores the reciprocal in ``X.weight_scale_inv``:
  ``w = q / weight_scale_inv`` (GPTQModel ``TorchFP8Linear.dequantize_weight``); another
  semantics is refused. Block-wise scales (``weight_block_size``) are refused.

In both, ``w = e4m3(weight) * weight_scale`` (per row for channel scales).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from trtcore.errors import CheckpointError, InvalidArgumentError
from trtcore.fp8 import E4M3, Fp8Weight

#: compressed-tensors formats holding FP8 weights as they are
FLOAT_FORMATS = ("float-quantized", "naive-quantized")
#: compressed-tensors activation strategies read: ``tensor`` (static or dynamic, one scale per
#: tensor) and ``token`` (dynamic only, one scale per row)
ACTIVATION_STRATEGIES = ("tensor", "token")
#: the tensor suffixes an FP8 linear ``X`` owns (besides ``X.weight``)
FP8_SUFFIXES = (".weight_scale", ".weight_scale_inv", ".input_scale", ".activation_scale")


def fp8_weight_args(group_weights: list[dict[str, Any]]) -> bool:
    """Whether compressed-tensors config groups' ``weights`` describe FP8 (``type: float``)."""
    return bool(group_weights) and all(a.get("type") == "float" for a in group_weights)


def check_compressed_fp8(config: dict[str, Any]) -> str | None:
    """What in a compressed-tensors FP8 ``quantization_config`` trtcore cannot read, or None."""
    for name, g in (config.get("config_groups") or {}).items():
        if not isinstance(g, dict):
            continue
        w = g.get("weights") or {}
        a = g.get("input_activations")
        for field, value in (("weights", w), ("input_activations", a)):
            if value is not None and not isinstance(value, dict):
                return f"compressed-tensors {field} {value!r} (group {name!r}; an object, compressed-tensors QuantizationArgs, is read)"
        if w.get("num_bits") != 8 or w.get("strategy") not in ("tensor", "channel") or w.get("dynamic"):
            return f"compressed-tensors float weights {w!r} (group {name!r}; FP8 needs num_bits 8, strategy tensor or channel, static)"
        if a is None:
            return (
                f"compressed-tensors FP8 weights without input_activations (group {name!r}: weight-only FP8, W8A16; "
                "FP8 linears are read with FP8 activations, input_activations per tensor static / dynamic or per token dynamic)"
            )
        if a.get("type", "float") != "float" or a.get("num_bits", 8) != 8 or a.get("strategy", "tensor") not in ACTIVATION_STRATEGIES:
            return (
                f"compressed-tensors input_activations {a!r} (group {name!r}; FP8 activations are read per tensor, "
                "static or dynamic, and per token, dynamic)"
            )
        if a is not None and a.get("strategy") == "token" and not a.get("dynamic"):
            return (
                f"compressed-tensors input_activations {a!r} (group {name!r}; static per-token scales cannot exist: "
                "a token's scale is computed from the token, so per-token activations must be dynamic: true)"
            )
    if len({_activation_kind(g) for g in (config.get("config_groups") or {}).values() if isinstance(g, dict)}) > 1:
        return "compressed-tensors config groups with different FP8 activation strategies (one strategy for every group is read)"
    return None


def _activation_kind(group: dict[str, Any]) -> str:
    a = group.get("input_activations")
    return "token" if isinstance(a, dict) and a.get("strategy") == "token" else "tensor"


def compressed_per_token(config: dict[str, Any]) -> bool:
    """Whether a compressed-tensors FP8 ``quantization_config`` (accepted by
    :func:`check_compressed_fp8`) has dynamic per-token activations."""
    return any(_activation_kind(g) == "token" for g in (config.get("config_groups") or {}).values() if isinstance(g, dict))


def check_hf_fp8(config: dict[str, Any]) -> str | None:
    """What in a ``quant_method: "fp8"`` config trtcore cannot read, or None."""
    if config.get("weight_block_size"):
        return f"FP8 weight_block_size {config['weight_block_size']!r} (block-wise scales; per-tensor and per-channel scales are read)"
    if str(config.get("activation_scheme", "dynamic")).lower() not in ("static", "dynamic"):
        return f"FP8 activation_scheme {config.get('activation_scheme')!r}"
    if str(config.get("fmt", "e4m3")) != "e4m3":
        return f"FP8 fmt {config.get('fmt')!r} (E4M3 is read)"
    if str(config.get("format", "float8_e4m3fn")).lower() not in ("float8_e4m3fn", "e4m3", "e4m3fn"):  # GPTQModel names the dtype "format"
        return f"FP8 format {config.get('format')!r} (E4M3, float8_e4m3fn, is read)"
    if _scale_semantics(config) not in (None, "inverse"):  # GPTQModel's, which knows only "inverse"
        return f"FP8 weight_scale_semantics {config.get('weight_scale_semantics')!r} (GPTQModel's 'inverse' is read: w = q / weight_scale_inv)"
    return None


def _scale_semantics(config: dict[str, Any]) -> str | None:
    # GPTQModel's field as its _normalize_fp8_scale_semantics reads it (null: "inverse"); None
    # where the config has no such field (Hugging Face's and vLLM's fp8)
    if "weight_scale_semantics" not in config:
        return None
    value = config["weight_scale_semantics"]
    return "inverse" if value is None else str(value).strip().lower()


def inverse_scales(config: dict[str, Any]) -> bool:
    """Whether an FP8 ``quantization_config`` says ``weight_scale_inv`` holds the reciprocal of
    the weight scale (GPTQModel's ``weight_scale_semantics: "inverse"``, or null, which GPTQModel
    reads as it): ``w = q / weight_scale_inv``. ``config``: a
    :class:`~trtcore.quant_formats.QuantScheme`'s (its ``quant_method`` lower case, as detected)."""
    return config.get("quant_method") == "fp8" and _scale_semantics(config) == "inverse"


def static_activations(config: dict[str, Any]) -> bool:
    """Whether an FP8 ``quantization_config`` (either layout, accepted by the checks above)
    says every FP8 linear has a static ``input_scale``: ``activation_scheme: "static"``, or
    compressed-tensors config groups whose ``input_activations`` are all ``dynamic: false``.
    ``config``: a :class:`~trtcore.quant_formats.QuantScheme`'s (its ``quant_method`` lower case,
    as detected)."""
    if config.get("quant_method") == "fp8":
        return str(config.get("activation_scheme", "dynamic")).lower() == "static" and not config.get("on_the_fly")
    acts = [g.get("input_activations") for g in (config.get("config_groups") or {}).values() if isinstance(g, dict)]
    return bool(acts) and all(isinstance(a, dict) and a.get("dynamic") is False for a in acts)


def read_fp8(weights: Any, prefix: str, per_token: bool = False, static: bool = False, inverse: bool = False) -> Fp8Weight:
    """The FP8 linear ``prefix`` of a checkpoint (either layout of the module docstring);
    ``per_token``: its activations are quantized per token (:func:`compressed_per_token`);
    ``static``: the config says its activations have a static scale (:func:`static_activations`);
    ``inverse``: ``weight_scale_inv`` is the reciprocal of the scale (:func:`inverse_scales`).
    An ``input_scale`` tensor of a linear whose config says dynamic is ignored, with a warning,
    as vLLM ignores it (its FP8 methods make no input scale for dynamic activations): the
    config, not the tensors present, decides the function.

    Raises:
        CheckpointError: the weight is not E4M3, a scale's shape fits neither strategy, or a
            static linear has no ``input_scale``.
    """

    def opt(suffix: str) -> np.ndarray | None:
        name = f"{prefix}.{suffix}"
        return np.asarray(weights.get(name), np.float32) if name in weights else None

    w = np.asarray(weights.get(f"{prefix}.weight", copy=False))
    if w.dtype != E4M3 or w.ndim != 2:
        raise CheckpointError(f"'{prefix}.weight' must be an F8_E4M3 [N, K] tensor in an FP8 checkpoint, got {w.dtype} {w.shape}")
    n = w.shape[0]
    scale = opt("weight_scale")
    if scale is None:
        scale = opt("weight_scale_inv")
        if scale is not None and inverse:
            with np.errstate(divide="ignore"):
                scale = np.float32(1.0) / scale  # a zero gives inf: refused below as not positive and finite
    if scale is None:
        raise CheckpointError(f"FP8 linear '{prefix}' has neither weight_scale nor weight_scale_inv")
    scale = scale.reshape(-1)
    if scale.size not in (1, n):
        raise CheckpointError(f"'{prefix}.weight_scale' has {scale.size} values; expected 1 (per tensor) or {n} (per output channel)")
    inp = opt("input_scale")
    if inp is None:
        inp = opt("activation_scale")  # transformers' FP8Linear
    if inp is not None and inp.size != 1:
        raise CheckpointError(f"'{prefix}.input_scale' has {inp.size} values; expected 1 (per tensor)")
    if inp is None and static:
        raise CheckpointError(
            f"FP8 linear '{prefix}' has no input_scale, but the quantization_config says its activations are static "
            f"(activation_scheme 'static' / input_activations dynamic: false); expected a float32 [1] '{prefix}.input_scale'"
        )
    if inp is not None and not static:
        warnings.warn(
            "FP8 checkpoint: its input_scale tensors are ignored, since the quantization_config says the activations "
            "are dynamic (activation_scheme 'dynamic' / input_activations dynamic: true), as vLLM does",
            stacklevel=2,
        )
        inp = None
    try:
        return Fp8Weight(np.ascontiguousarray(w.view(np.uint8)), np.ascontiguousarray(scale), None if inp is None else inp.reshape(1), per_token)
    except InvalidArgumentError as exc:  # a NaN code or a scale that is not positive: name the linear
        raise CheckpointError(f"FP8 linear '{prefix}': {exc}") from exc


__all__ = [
    "ACTIVATION_STRATEGIES",
    "FLOAT_FORMATS",
    "FP8_SUFFIXES",
    "check_compressed_fp8",
    "compressed_per_token",
    "check_hf_fp8",
    "fp8_weight_args",
    "inverse_scales",
    "read_fp8",
    "static_activations",
]
