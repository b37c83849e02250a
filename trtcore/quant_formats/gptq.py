"""GPTQ checkpoints (AutoGPTQ / GPTQModel / transformers ``quant_method: "gptq"``).

Per quantized linear ``X`` (``N`` outputs, ``K`` inputs, ``G`` groups, ``p = 32 // bits``):

* ``X.qweight`` int32 ``[K / p, N]``: codes packed along K (code ``k`` of column ``n`` is
  slot ``k % p`` of word ``[k // p, n]``, see :mod:`.packing`);
* ``X.qzeros`` int32 ``[G, N / p]``: zero points packed along N;
* ``X.scales`` float16 ``[G, N]``;
* ``X.g_idx`` int32 ``[K]`` (optional): the group of each input feature; with ``desc_act``
  (act-order) it is a permutation of ``k // group_size``.

``w[n, k] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n]``. ``checkpoint_format: "gptq"``
(v1, the default) stores each zero point minus one (AutoGPTQ's packer subtracts 1 and its
kernels add it back); ``"gptq_v2"`` (GPTQModel) stores the zero point itself. transformers
v5 writes the same value as ``format`` too, and reads ``format`` alone (:func:`checkpoint_format`).
``group_size: -1`` means one group over all of K. ``sym: true`` checkpoints store the zero
``2**(bits-1)`` like any other, so ``sym`` needs no special case.

GPTQModel's ``dynamic`` (AutoRound's GPTQ export writes it too) overrides the config per
module: ``{"+:<re>": {"bits": 8, ...}, "-:<re>": {}}``, the first pattern that ``re.match``-es
the module's name wins (vLLM's ``get_dynamic_override``); ``"-:"`` modules are stored
unquantized (they have no ``qweight``, so nothing reads them as GPTQ). Of an override only
``bits`` matters here: ``group_size`` and act-order follow from ``scales`` / ``g_idx``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from trtcore.errors import CheckpointError
from trtcore.quantization import QuantizedWeight

from .groups import grouped_weight
from .packing import check_qweight_layout, unpack_int32

#: ``checkpoint_format`` -> what is added to a stored zero point
ZERO_OFFSETS = {"gptq": 1, "gptq_v2": 0}


def gptq_weight(
    qweight: np.ndarray,
    qzeros: np.ndarray,
    scales: np.ndarray,
    g_idx: np.ndarray | None,
    *,
    bits: int,
    checkpoint_format: str = "gptq",
    name: str = "weight",
    group_size: int | None = None,
) -> QuantizedWeight:
    """Convert one GPTQ linear's tensors (layout: module docstring) to a QuantizedWeight
    (``group_size``: the config's, to refuse a short last group, see
    :func:`~.groups.grouped_weight`).

    Raises:
        CheckpointError: dtypes/shapes inconsistent (AWQ's ``qweight`` layout named), unknown ``checkpoint_format``, a bad
            ``g_idx``, K not a multiple of ``group_size``.
    """
    if checkpoint_format not in ZERO_OFFSETS:
        raise CheckpointError(f"'{name}': GPTQ checkpoint_format {checkpoint_format!r} is not supported, expected one of {sorted(ZERO_OFFSETS)}")
    _check_bits(qzeros, scales, bits, name)
    check_qweight_layout(qweight, scales, bits, "GPTQ", name)
    codes = unpack_int32(qweight, bits, 0, f"{name}.qweight").T  # [N, K]
    n = codes.shape[0]
    zeros = unpack_int32(qzeros, bits, 1, f"{name}.qzeros")[:, :n].T.astype(np.float32) + ZERO_OFFSETS[checkpoint_format]
    if scales.shape != (zeros.shape[1], n):
        raise CheckpointError(f"'{name}.scales' has shape {scales.shape}, expected {(zeros.shape[1], n)} from qzeros and qweight")
    return grouped_weight(codes, scales.T, zeros, bits, g_idx, name, () if group_size is None else (int(group_size),))


def _check_bits(qzeros: np.ndarray, scales: np.ndarray, bits: int, name: str) -> None:
    """Refuse codes of another width than ``bits``: ``scales [G, N]`` gives N, and ``qzeros``
    holds N zero points in ``ceil(N bits / 32)`` words a row. A mismatch otherwise surfaces later
    as a shape error about ``g_idx`` or ``qweight``; here it names the width the tensors have.

    Raises:
        CheckpointError: the column count fits another width (named) or none.
    """
    if np.ndim(qzeros) != 2 or np.ndim(scales) != 2:
        return  # unpack_int32 / the scales check below name a wrong rank
    n, words = int(scales.shape[1]), int(qzeros.shape[1])
    if words == -(-n * bits // 32):
        return
    fits = [b for b in (2, 3, 4, 8) if words == -(-n * b // 32)]
    what = f"the tensors are {fits[0]}-bit: the config's bits (or its dynamic override for this module) say {bits}" if fits else "no code width fits"
    raise CheckpointError(
        f"'{name}.qzeros' has {words} words a row for N={n} outputs ({name}.scales), {bits}-bit codes need {-(-n * bits // 32)}; {what}"
    )


def checkpoint_format(config: dict[str, Any]) -> str:
    """A GPTQ ``quantization_config``'s checkpoint format, lower-cased: ``checkpoint_format``
    (AutoGPTQ / GPTQModel), else ``format`` (transformers v5's name for it, which reads
    ``checkpoint_format`` as its legacy alias and lets it win), else ``"gptq"`` (v1)."""
    return str(config.get("checkpoint_format") or config.get("format") or "gptq").lower()


def dynamic_pattern(pattern: str) -> tuple[bool, str]:
    """``(negative, regular expression)`` of a ``dynamic`` key: ``"-:<re>"`` (unquantized
    modules), ``"+:<re>"`` or a bare ``<re>`` (overrides)."""
    negative = pattern.startswith("-:")
    return negative, pattern[2:] if negative or pattern.startswith("+:") else pattern


def dynamic_override(config: dict[str, Any], module: str) -> dict[str, Any] | None:
    """The ``dynamic`` override of ``module`` (e.g. ``model.layers.1.mlp.up_proj``): the
    values of the first pattern that matches it, ``{}`` when none does, None for a ``"-:"``
    (unquantized) match. The patterns are checked by the detection (valid expressions)."""
    for pattern, values in (config.get("dynamic") or {}).items():
        negative, expression = dynamic_pattern(pattern)
        if re.match(expression, module):
            return None if negative else dict(values)
    return {}


def read_gptq(weights: Any, prefix: str, config: dict[str, Any]) -> QuantizedWeight:
    """The GPTQ linear ``prefix`` (e.g. ``model.layers.0.mlp.up_proj``) of a checkpoint
    (``get(name)`` and ``in``), with ``config`` the ``quantization_config``."""
    g_idx = weights.get(f"{prefix}.g_idx") if f"{prefix}.g_idx" in weights else None
    override = dynamic_override(config, prefix) or {}
    group_size = override.get("group_size", config.get("group_size"))
    return gptq_weight(
        weights.get(f"{prefix}.qweight"),
        weights.get(f"{prefix}.qzeros"),
        weights.get(f"{prefix}.scales"),
        g_idx,
        bits=int(override.get("bits", config.get("bits", 4))),
        checkpoint_format=checkpoint_format(config),
        name=prefix,
        group_size=None if group_size is None else int(group_size),
    )


__all__ = ["ZERO_OFFSETS", "checkpoint_format", "dynamic_override", "dynamic_pattern", "gptq_weight", "read_gptq"]
