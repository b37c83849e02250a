"""AWQ checkpoints (AutoAWQ, ``quant_method: "awq"``, ``version: "gemm"``).

Per quantized linear ``X`` (``N`` outputs, ``K`` inputs, ``G = K / group_size`` groups):

* ``X.qweight`` int32 ``[K, N / 8]``: 4-bit codes packed along N, slot ``i`` of word
  ``[k, c]`` holding column ``8c + AWQ_ORDER[i]`` with ``AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]``;
* ``X.qzeros`` int32 ``[G, N / 8]``: zero points, packed the same way;
* ``X.scales`` float16 ``[G, N]``.

``w[n, k] = (q[k, n] - z[k // group_size, n]) * s[k // group_size, n]`` (no offset on the
zeros, unlike GPTQ v1). Other versions (``gemv``, ``exllama``, ``marlin``, ``ipex``) use other
layouts and are refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtcore.errors import CheckpointError
from trtcore.quantization import QuantizedWeight

from .groups import grouped_weight
from .packing import awq_unorder, check_qweight_layout, unpack_int32

#: the AWQ ``version`` values read here
AWQ_VERSIONS = ("gemm",)


def awq_version(config: dict[str, Any]) -> str:
    """An AWQ ``quantization_config``'s layout, lower-cased: ``version`` (AutoAWQ), else
    ``format`` (transformers v5's name for it), else ``"gemm"``; ``"llm-awq"`` whatever these
    say when ``backend`` is ``"llm-awq"`` (transformers 4.x wrote ``version: "gemm"`` beside
    it, for MIT llm-awq's own packing)."""
    if str(config.get("backend") or "").lower() == "llm-awq":
        return "llm-awq"
    return str(config.get("version") or config.get("format") or "gemm").lower()


def awq_weight(
    qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, *, bits: int = 4, name: str = "weight", group_size: int | None = None
) -> QuantizedWeight:
    """Convert one AWQ GEMM linear's tensors (layout: module docstring) to a QuantizedWeight
    (``group_size``: the config's, to refuse a short last group, see :func:`~.groups.grouped_weight`).

    Raises:
        CheckpointError: dtypes or shapes inconsistent (GPTQ's ``qweight`` layout named), ``bits`` not 4, K not a multiple of
            ``group_size``.
    """
    if bits != 4:
        raise CheckpointError(f"'{name}': AWQ GEMM checkpoints have 4-bit weights, got bits={bits}")
    check_qweight_layout(qweight, scales, bits, "AWQ", name)
    codes = awq_unorder(unpack_int32(qweight, bits, 1, f"{name}.qweight"), 1).T  # [N, K]
    zeros = awq_unorder(unpack_int32(qzeros, bits, 1, f"{name}.qzeros"), 1).T.astype(np.float32)
    if scales.shape != zeros.shape[::-1] or zeros.shape[0] != codes.shape[0]:
        raise CheckpointError(f"'{name}': scales {scales.shape}, qzeros {qzeros.shape} and qweight {qweight.shape} do not fit together")
    return grouped_weight(codes, scales.T, zeros, bits, None, name, () if group_size is None else (int(group_size),))


def read_awq(weights: Any, prefix: str, config: dict[str, Any]) -> QuantizedWeight:
    """The AWQ linear ``prefix`` of a checkpoint, ``config`` the ``quantization_config``."""
    bits = int(config.get("bits", config.get("w_bit", 4)))
    group_size = config.get("group_size", config.get("q_group_size"))
    return awq_weight(
        weights.get(f"{prefix}.qweight"),
        weights.get(f"{prefix}.qzeros"),
        weights.get(f"{prefix}.scales"),
        bits=bits,
        name=prefix,
        group_size=None if group_size is None else int(group_size),
    )


__all__ = ["AWQ_VERSIONS", "awq_version", "awq_weight", "read_awq"]
