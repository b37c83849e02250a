"""Group bookkeeping shared by the converters: the act-order permutation from ``g_idx``, and
the :class:`~trtcore.quantization.QuantizedWeight` they all produce."""

from __future__ import annotations

import warnings

import numpy as np

from trtcore.errors import CheckpointError
from trtcore.quantization import QuantizedWeight

#: the config / tensor disagreements warned about for the checkpoint being read (a model has
#: hundreds of linears of a few shapes: one warning each; :func:`reset_warnings` per checkpoint)
_WARNED: set[tuple] = set()


def reset_warnings() -> None:
    """Forget what :func:`warn_once` warned about (a new checkpoint is being read)."""
    _WARNED.clear()


def warn_once(key: tuple, message: str) -> None:
    """``warnings.warn(message)`` the first time ``key`` is seen since :func:`reset_warnings`
    (which :func:`trtcore.quant_formats.quantized_weights` calls for each checkpoint)."""
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, stacklevel=3)


def grouped_weight(
    codes: np.ndarray,
    scales: np.ndarray,
    zeros: np.ndarray | None,
    bits: int,
    g_idx: np.ndarray | None,
    name: str,
    group_sizes: tuple[int, ...] = (),
) -> QuantizedWeight:
    """A :class:`QuantizedWeight` from per-element codes and per-group scales/zeros.

    Args:
        codes: ``uint8 [N, K]`` codes in the input features' order.
        scales: ``[N, G]`` (any float dtype; widened to float32, exact from fp16/bf16).
        zeros: ``[N, G]`` zero points in code units, or None (symmetric ``2**(bits-1)``).
            Zeros equal to ``2**(bits-1)`` everywhere are stored as None.
        bits: 4 or 8.
        g_idx: None (group of feature ``k`` is ``k // (K // G)``), or ``int [K]``: the group of
            each input feature (GPTQ ``desc_act``). When it is not the trivial one, the
            columns are sorted by group (stable) and the permutation kept as ``perm``.
        name: the weight's name, for errors.
        group_sizes: the group sizes the ``quantization_config`` names for this weight (any
            of them, for configs of several groups; ``-1`` or ``0``: one group over K, per
            channel); empty: not checked. The tensors' own group size ``K // G`` is read (a
            per-module override the config does not spell out); where their ``G`` is not
            ``ceil(K / group_size)`` for any of these, a warning says that the config and the
            tensors disagree (other readers, transformers and vLLM, go by the config and fail or
            misread). A short last group (``K`` not a multiple: AutoGPTQ's ``g_idx = k //
            group_size``, compressed-tensors' group strategy), which ``K // G`` equal groups
            would misread, is refused.

    Raises:
        CheckpointError: shapes inconsistent, ``K`` not a multiple of the group size (a short
            last group), or ``g_idx`` does not give every group the same number of features.
    """
    n, k = codes.shape
    if scales.ndim == 2 and scales.shape[0] == n:
        for gs in group_sizes:
            if gs > 0 and k % gs and scales.shape[1] == -(-k // gs) > 1:  # one group (K < gs) is whole
                raise CheckpointError(
                    f"'{name}': K={k} input features are not a multiple of group_size {gs} (the last of its {scales.shape[1]} groups "
                    f"holds {k % gs}); trtcore reads groups of equal size only, K a multiple of the group size"
                )
    if scales.ndim != 2 or scales.shape[0] != n or scales.shape[1] == 0 or k % scales.shape[1]:
        raise CheckpointError(f"'{name}': scales of shape {scales.shape} do not fit a [{n}, {k}] weight (expected [{n}, G], G dividing {k})")
    expected = {-(-k // gs) if gs > 0 else 1 for gs in group_sizes}
    if expected and scales.shape[1] not in expected:
        named = " / ".join("per channel" if gs <= 0 else f"group_size {gs}" for gs in sorted(set(group_sizes), reverse=True))
        warn_once(
            ("groups", k, scales.shape[1], named),
            f"the quantization_config says {named}, but linears such as '{name}' (K={k}) hold {scales.shape[1]} groups of "
            f"{k // scales.shape[1]}; trtcore reads the tensors' groups, other readers (transformers, vLLM) go by the config",
        )
    groups = scales.shape[1]
    size = k // groups
    if zeros is not None and zeros.shape != scales.shape:
        raise CheckpointError(f"'{name}': zero points of shape {zeros.shape}, expected {scales.shape} like the scales")
    perm = None
    if g_idx is not None:
        g_idx = np.asarray(g_idx).astype(np.int64).reshape(-1)
        contiguous = np.arange(k) // size
        if g_idx.shape != (k,):
            raise CheckpointError(f"'{name}': g_idx has shape {g_idx.shape}, expected ({k},)")
        if not np.array_equal(g_idx, contiguous):
            order = np.argsort(g_idx, kind="stable")
            if not np.array_equal(g_idx[order], contiguous):
                raise CheckpointError(f"'{name}': g_idx does not assign {size} input features to each of the {groups} groups")
            perm, codes = order.astype(np.int32), codes[:, order]
    zf = None if zeros is None else np.asarray(zeros, np.float32)
    if zf is not None and np.all(zf == 1 << (bits - 1)):
        zf = None
    return QuantizedWeight(np.ascontiguousarray(codes), np.asarray(scales, np.float32), zf, bits, size, perm)


__all__ = ["grouped_weight", "reset_warnings", "warn_once"]
