"""compressed-tensors ``pack-quantized`` checkpoints (llm-compressor, ``quant_method:
"compressed-tensors"``, ``format: "pack-quantized"``), integer weights, ``group`` or
``channel`` strategy.

Per quantized linear ``X`` (``N`` outputs, ``K`` inputs, ``G`` groups, ``p = 32 // num_bits``):

* ``X.weight_packed`` int32 ``[N, K / p]``: codes packed along K (``pack_to_int32``); each
  stored code is the signed quantized value plus ``2**(num_bits-1)``;
* ``X.weight_scale`` ``[N, G]`` (the checkpoint's float dtype);
* ``X.weight_zero_point`` (asymmetric only): signed zero points, either packed like the
  codes along N (int32 ``[N / p, G]``, offset by ``2**(num_bits-1)``) or plain ``[N, G]``
  integers (older files);
* ``X.weight_g_idx`` (``actorder``): the group of each input feature, as GPTQ's ``g_idx``;
* ``X.weight_shape``: ``[N, K]``.

``w = (q_signed - zero_point) * scale`` = ``(code - (zero_point + 2**(num_bits-1))) * scale``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtcore.errors import CheckpointError
from trtcore.quantization import QuantizedWeight

from .groups import grouped_weight, warn_once
from .packing import unpack_int32

#: the ``format`` values read here, and the quantization strategies
FORMATS = ("pack-quantized",)
STRATEGIES = ("group", "channel")


def pack_quantized_weight(
    weight_packed: np.ndarray,
    weight_scale: np.ndarray,
    weight_zero_point: np.ndarray | None,
    weight_g_idx: np.ndarray | None,
    *,
    num_bits: int,
    shape: tuple[int, int],
    name: str = "weight",
    group_sizes: tuple[int, ...] = (),
    symmetric: bool = False,
) -> QuantizedWeight:
    """Convert one ``pack-quantized`` linear's tensors (layout: module docstring);
    ``group_sizes``: the config groups' (:func:`config_group_sizes`), which the tensors' group
    count should fit (:func:`~.groups.grouped_weight`); ``symmetric``: every config group says
    ``symmetric: true``, so zero points other than the symmetric one contradict it (a warning:
    the tensors are read as they are).

    Raises:
        CheckpointError: dtypes or shapes inconsistent, K not a multiple of the group size.
    """
    n, k = shape
    codes = unpack_int32(weight_packed, num_bits, 1, f"{name}.weight_packed")[:, :k]
    if codes.shape != (n, k):
        raise CheckpointError(f"'{name}.weight_packed' unpacks to {codes.shape}, expected weight_shape {(n, k)}")
    offset = 1 << (num_bits - 1)
    zeros = None
    if weight_zero_point is not None:
        zp = np.asarray(weight_zero_point)
        if zp.shape == weight_scale.shape:
            zeros = zp.astype(np.float32) + offset
        else:
            zeros = unpack_int32(zp, num_bits, 0, f"{name}.weight_zero_point")[:n].astype(np.float32)
    qw = grouped_weight(codes, weight_scale, zeros, num_bits, weight_g_idx, name, group_sizes)
    if symmetric and qw.zeros is not None:
        warn_once(
            ("symmetric",),
            "the quantization_config says symmetric: true, but linears such as "
            f"'{name}' hold zero points other than the symmetric one; trtcore reads them, other readers (transformers, vLLM) "
            "go by the config",
        )
    return qw


def read_pack_quantized(weights: Any, prefix: str, config: dict[str, Any]) -> QuantizedWeight:
    """The ``pack-quantized`` linear ``prefix`` of a checkpoint (``config``: the
    ``quantization_config``; the weights' ``num_bits``: :func:`linear_bits`).

    Raises:
        CheckpointError: as :func:`pack_quantized_weight`, a packed width no config group's
            ``num_bits`` gives, or no ``weight_g_idx`` where every config group says ``actorder``
            ``"group"`` (or its alias ``"dynamic"``).
    """

    def opt(suffix: str) -> np.ndarray | None:
        return weights.get(f"{prefix}.{suffix}") if f"{prefix}.{suffix}" in weights else None

    shape = tuple(int(s) for s in weights.get(f"{prefix}.weight_shape").reshape(-1))
    packed = weights.get(f"{prefix}.weight_packed")
    g_idx = opt("weight_g_idx")
    # (every group: in a mixed config, this linear's group is not known without matching targets)
    # "dynamic": compressed-tensors' alias of "group" (ActivationOrdering.get_aliases)
    if g_idx is None and all(a.get("actorder") in ("group", "dynamic", True) for a in weight_args(config)):
        raise CheckpointError(
            f"the quantization_config says actorder 'group', but '{prefix}.weight_g_idx' is not in the checkpoint "
            "(act-order groups are read from each linear's weight_g_idx; without it the input features' groups are unknown)"
        )
    return pack_quantized_weight(
        packed,
        weights.get(f"{prefix}.weight_scale"),
        opt("weight_zero_point"),
        g_idx,
        num_bits=linear_bits(config, shape[1], int(np.shape(packed)[-1]), prefix),
        shape=(shape[0], shape[1]),
        name=prefix,
        group_sizes=config_group_sizes(config),
        symmetric=all(bool(a.get("symmetric", True)) for a in weight_args(config)),
    )


def config_group_sizes(config: dict[str, Any]) -> tuple[int, ...]:
    """The group sizes the config groups' weights name: ``group_size`` of the group strategy,
    -1 for the channel strategy (one group over K)."""
    sizes = []
    for a in weight_args(config):
        if a.get("strategy") == "group" and a.get("group_size"):
            sizes.append(int(a["group_size"]))
        elif a.get("strategy") == "channel":
            sizes.append(-1)
    return tuple(sizes)


#: compressed-tensors ``QuantizationArgs``' defaults of the fields trtcore reads (``num_bits``,
#: ``type``, ``symmetric``, ``group_size``, ``strategy``, ``dynamic``, ``actorder``): what a
#: ``weights`` / ``input_activations`` / ``output_activations`` object means where it leaves a
#: field out (compressed_tensors.quantization.quant_args; transformers and vLLM read it through it)
ARGS_DEFAULTS: dict[str, Any] = {
    "num_bits": 8,
    "type": "int",
    "symmetric": True,
    "group_size": None,
    "strategy": None,
    "dynamic": False,
    "actorder": None,
}
#: the argument objects of a config group (:func:`with_defaults` fills each)
GROUP_ARGS = ("weights", "input_activations", "output_activations")


def quantization_args(args: Any) -> Any:
    """One ``QuantizationArgs`` object of a config group as compressed-tensors reads it: each
    field of :data:`ARGS_DEFAULTS` it leaves out takes its default, ``type`` / ``strategy`` /
    ``dynamic`` strings in lower case, and a ``strategy`` left out or null inferred from
    ``group_size`` as ``QuantizationArgs``' validator infers it (none: ``"tensor"``, positive:
    ``"group"``, -1: ``"channel"``). E.g. ``{"num_bits": 8, "type": "float"}`` (input
    activations) is static per tensor: ``dynamic`` False, so the ``input_scale`` tensors hold
    the scales. Fields given as null other than ``strategy`` stay null (the readers refuse them,
    naming the value); anything but an object is returned as it is (the same)."""
    if not isinstance(args, dict):
        return args
    out = {**ARGS_DEFAULTS, **args}
    for key in ("type", "strategy", "dynamic"):
        if isinstance(out[key], str):
            out[key] = out[key].lower()
    if out["strategy"] is None:
        size = out["group_size"]
        if size is None:
            out["strategy"] = "tensor"
        elif isinstance(size, int) and not isinstance(size, bool) and size > 0:
            out["strategy"] = "group"
        elif size == -1:
            out["strategy"] = "channel"
    return out


def with_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """A compressed-tensors ``quantization_config`` with each config group's argument objects
    (:data:`GROUP_ARGS`) through :func:`quantization_args` (a copy; groups or ``config_groups``
    that are not objects are left for the checks to refuse)."""
    groups = config.get("config_groups")
    if not isinstance(groups, dict):
        return dict(config)
    filled = {
        name: ({**g, **{key: quantization_args(g[key]) for key in GROUP_ARGS if g.get(key) is not None}} if isinstance(g, dict) else g)
        for name, g in groups.items()
    }
    return {**config, "config_groups": filled}


def weight_args(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``weights`` argument objects of every config group."""
    groups = config.get("config_groups") or {}
    return [g["weights"] for g in groups.values() if isinstance(g, dict) and isinstance(g.get("weights"), dict)]


def linear_bits(config: dict[str, Any], k: int, packed_columns: int, name: str = "weight") -> int:
    """The ``num_bits`` of one linear with ``k`` input features whose ``weight_packed`` has
    ``packed_columns`` int32 columns: the config groups' ``num_bits`` (4 or 8) that packs K into
    that many (``ceil(K / (32 // num_bits))``). Mixed-precision checkpoints (llm-compressor
    recipes with, say, 8-bit attention and 4-bit MLP groups) give each linear's from its tensors,
    with no need to match the groups' ``targets`` against module names.

    Raises:
        CheckpointError: no config group's ``num_bits`` packs K into ``packed_columns``.
    """
    choices = sorted({int(a.get("num_bits", ARGS_DEFAULTS["num_bits"])) for a in weight_args(config)})
    for bits in choices:
        if packed_columns == -(-k // (32 // bits)):
            return bits
    raise CheckpointError(
        f"'{name}.weight_packed' has {packed_columns} int32 columns for K={k}; the config groups' num_bits {choices} "
        f"pack K into {[-(-k // (32 // b)) for b in choices]}"
    )


__all__ = ["FORMATS", "STRATEGIES", "config_group_sizes", "linear_bits", "pack_quantized_weight", "read_pack_quantized", "weight_args"]
