"""GPTQ weight quantization for ``trtcore quantize --method gptq``.

Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers", arXiv:2210.17323, Algorithm 1. A linear ``y = x W^T`` (``W [N, K]``) is quantized
one input column at a time, in order; after column ``j`` is rounded, its error is spread over the
columns not yet quantized so that the layer's output on the calibration inputs moves least
(the Optimal Brain Surgeon update, the paper's equations 2-3)::

    H = 2 X^T X / T + lambda I              X [T, K]: the linear's inputs over the calibration tokens;
                                            lambda = dampening_frac * mean(diag(2 X^T X / T)) over
                                            the features seen (nonzero diagonal)
    U = upper Cholesky factor of H^-1       (H^-1 = U^T U: the paper's "Cholesky reformulation")
    for j = 0 .. K-1:
        q_j = quantize(W[:, j])             RTN with its group's scale and zero point
        e   = (W[:, j] - q_j) / U[j, j]
        W[:, j:] -= e U[j, j:]              (lazily, per block of columns: the paper's step 2)

A group's scale and zero point (``group_size`` columns; per channel: the whole row) are chosen
when its first column is reached, from the group's weights as every earlier column's update left
them, by the same rule as RTN's (:func:`trtcore.quantizer.group_params`: min-max or the MSE
observer). GPTQ's reference code also chooses them at the group's first column, but from weights
that miss the updates of the current lazy block's earlier columns; other implementations fix
every group's parameters before the loop. The codes and
scales are then a :class:`~trtcore.quantization.QuantizedWeight` like RTN's, written in the same
compressed-tensors ``pack-quantized`` layout (llm-compressor writes its GPTQ output so too).

Defaults follow llm-compressor's ``GPTQModifier`` (``block_size=128``, ``dampening_frac=0.01``;
AutoGPTQ's ``damp_percent``). Differences from the reference code, each for a stated reason:

* ``X`` is the float model's own activations, captured once on the reference backend (as
  :mod:`trtcore.awq` does), not each layer's inputs recomputed through the layers quantized
  before it ("true sequential"): one calibration run instead of one per layer;
* an input feature that is 0 on every calibration token keeps its weights (the reference code
  zeroes them): nothing in the calibration set says they are unused; its diagonal entry becomes
  the live features' mean, which ``lambda`` is also taken over (so the damping does not depend on
  the activations' scale);
* no act order (``desc_act``): the columns are taken in their stored order, so the groups stay
  contiguous and the checkpoint needs no ``g_idx``;
* where ``H`` is not positive definite after damping, the damping is multiplied by 10 up to
  :data:`MAX_DAMPING_TRIES` times (GPTQModel raises it in steps as well);
* each calibration sequence's first token (position 0, the attention sink every later token
  reads) counts :data:`FIRST_TOKEN_WEIGHT` times in ``H`` (``H = 2 X^T D X / sum(D)``): its
  normalized inputs are small, so unweighted GPTQ moves error onto it, and the whole model's
  score follows that token (bench/results/cpu-2026-12-05-gptq, -calibration-size). On the
  default model, group 64, 4,096 tokens, the three quality passages lost 6.80 / 7.72 / 6.16% of
  the bfloat16 log-probability with weight 1, 2.74 / 3.29 / 2.80% with 4, 3.41 / 3.40 / 0.95%
  with 16, 5.09 / 3.70 / 2.59% with 64 (RTN: 6.36 / 3.34 / 4.78%). IntactKV (Liu et al. 2024,
  arXiv:2403.01241) names such pivot tokens; the weighting is trtcore's own.

Cost: :func:`inverse_hessian_factor` is ``O(K^3)`` once per distinct input (q/k/v share one,
gate/up another); :func:`gptq_quantize` ``O(N K^2)`` per linear. :func:`gptq_linears` holds every
layer's captured inputs in float32 (:func:`trtcore.calibration.capture_calibration`): calibration
tokens times the sum of the four inputs' widths times 4 bytes -- SmolLM2-135M about 0.4 MB a token,
Llama-3-8B about 3.4 MB -- and one layer's float64 Hessians and factors at a time.

Calibration tokens: ``X^T X`` has rank at most ``T``; with fewer tokens than a linear's K, ``H`` is
invertible only through the damping and the fit to the calibration tokens carries over less to
other text, so :func:`gptq_linears` warns (GPTQ's paper calibrates on 128 sequences of 2048
tokens). On the default model more tokens alone did not make the whole model's score better: the
first token's error grew (bench/results/cpu-2026-12-05-calibration-size), which the first-token
weight below bounds.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .calibration import DEFAULT_CALIBRATION_TOKENS
from .errors import InvalidArgumentError
from .quantization import QuantizedWeight

__all__ = [
    "BLOCK_SIZE",
    "DAMPENING_FRAC",
    "FIRST_TOKEN_WEIGHT",
    "first_token_weights",
    "gptq_linears",
    "gptq_quantize",
    "hessian",
    "inverse_hessian_factor",
]

#: columns updated eagerly before the rest takes their errors in one product (the paper's "lazy batch")
BLOCK_SIZE = 128
#: damping of ``H``'s diagonal, a fraction of its mean (llm-compressor ``dampening_frac``, AutoGPTQ ``damp_percent``)
DAMPENING_FRAC = 0.01
#: how often the damping is raised tenfold before a Hessian that is not positive definite is an error
MAX_DAMPING_TRIES = 4
#: the weight of each calibration sequence's first token in ``H`` (module docstring)
FIRST_TOKEN_WEIGHT = 4.0

#: ``params(group [N, g]) -> (scale [N], zero [N])``: a group's float32 scales (as float64) and zero points
GroupParams = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def hessian(x: np.ndarray, row_weights: np.ndarray | None = None) -> np.ndarray:
    """``2 X^T D X / sum(D)`` in float64 (``[K, K]``) of the inputs ``x [..., K]`` (``T`` rows in
    all) with ``D = diag(row_weights)`` (None: all 1, ``2 X^T X / T``): the Hessian of the
    (weighted) squared output error that GPTQ minimizes (paper, section 3). An integer weight
    counts its row that many times.

    Raises:
        InvalidArgumentError: no row, or ``row_weights`` not ``T`` non-negative finite numbers
            with a positive sum.
    """
    x2 = np.asarray(x, np.float64).reshape(-1, np.shape(x)[-1])
    if x2.shape[0] == 0:
        raise InvalidArgumentError("GPTQ needs at least one calibration token, got none")
    if row_weights is None:
        return 2.0 * (x2.T @ x2) / x2.shape[0]
    r = np.asarray(row_weights, np.float64)
    if r.shape != (x2.shape[0],) or not np.isfinite(r).all() or (r < 0).any() or r.sum() <= 0:
        raise InvalidArgumentError(f"GPTQ row weights must be {x2.shape[0]} non-negative finite numbers with a positive sum, got shape {r.shape}")
    return 2.0 * ((x2 * r[:, None]).T @ x2) / r.sum()


def first_token_weights(lengths: Sequence[int], weight: float = FIRST_TOKEN_WEIGHT) -> np.ndarray:
    """Row weights for :func:`hessian` over sequences of ``lengths`` concatenated: ``weight`` on
    each sequence's first row, 1 elsewhere (float64 ``[sum(lengths)]``)."""
    r = np.ones(int(sum(lengths)))
    if len(lengths):
        starts = np.cumsum([0, *lengths[:-1]]).astype(np.int64)
        r[starts[np.asarray(lengths) > 0]] = weight
    return r


def inverse_hessian_factor(hess: np.ndarray, dampening_frac: float = DAMPENING_FRAC) -> np.ndarray:
    """The upper Cholesky factor ``U`` of ``(H + lambda I)^-1`` (``(H + lambda I)^-1 = U^T U``),
    ``lambda = dampening_frac * mean`` of the live features' diagonal (module docstring), raised
    tenfold while the damped ``H`` is not positive definite.

    Args:
        hess: ``[K, K]`` float64, :func:`hessian` of a linear's calibration inputs.
        dampening_frac: ``lambda`` over the live diagonal's mean, > 0.

    Returns:
        ``U``, float64 ``[K, K]``, upper triangular: what :func:`gptq_quantize` takes.

    Raises:
        InvalidArgumentError: not a square matrix, a NaN or infinity in it, or damping up to
            ``dampening_frac * 10**MAX_DAMPING_TRIES`` does not make it positive definite.
    """
    h = np.array(hess, dtype=np.float64)  # a copy: dead features are edited
    if h.ndim != 2 or h.shape[0] != h.shape[1]:
        raise InvalidArgumentError(f"GPTQ: the Hessian must be a square [K, K] matrix, got shape {h.shape}")
    if not np.isfinite(h).all():
        raise InvalidArgumentError("GPTQ: the calibration Hessian holds a NaN or an infinity")
    k = h.shape[0]
    diag = np.diag(h).copy()
    dead = diag == 0
    live_mean = float(diag[~dead].mean()) if (~dead).any() else 1.0
    h[dead, dead] = live_mean  # a feature never seen: its error goes nowhere, its weights stay
    frac = float(dampening_frac)
    for _ in range(MAX_DAMPING_TRIES + 1):
        try:
            lower = np.linalg.cholesky(h + frac * live_mean * np.eye(k))
            inv = np.linalg.inv(lower)  # L^-1: (L L^T)^-1 = L^-T L^-1
            return np.linalg.cholesky(inv.T @ inv).T
        except np.linalg.LinAlgError:
            frac *= 10.0
    raise InvalidArgumentError(
        f"GPTQ: the calibration Hessian [{k}, {k}] is not positive definite even with dampening_frac {frac / 10.0:.3g} "
        f"(given {dampening_frac:.3g}); give a larger dampening_frac (--dampening-frac), more calibration tokens, or use --method rtn"
    )


def gptq_quantize(
    weight: np.ndarray,
    factor: np.ndarray,
    params: GroupParams,
    bits: int,
    group_size: int,
    symmetric: bool,
    block_size: int = BLOCK_SIZE,
) -> QuantizedWeight:
    """GPTQ of one ``[N, K]`` weight (module docstring).

    Args:
        weight: ``[N, K]``, any float dtype (computed in float64).
        factor: ``[K, K]`` float64, :func:`inverse_hessian_factor` of the linear's calibration
            Hessian (shared by the linears that read one input).
        params: a group's scale and zero point from its current weights ``[N, g]``, as RTN
            chooses them (:func:`trtcore.quantizer.group_params`): scales float32-exact, zero
            points the unsigned codes' (``2**(bits-1)`` symmetric).
        bits: 4 or 8. group_size: input features per scale, 0 for one per row (must divide K).
        symmetric: no zero points in the result.
        block_size: columns per lazy batch (groups smaller than it: a multiple of the group size
            that fits; groups that are not a multiple of it: one group).

    Returns:
        The :class:`~trtcore.quantization.QuantizedWeight`: codes ``clip(round(w / s) + z, 0,
        2**bits - 1)`` of the updated weights.

    Raises:
        InvalidArgumentError: shapes that do not match, ``group_size`` not dividing K, or a
            non-finite weight.
    """
    w = np.array(weight, dtype=np.float64)  # a copy: updated in place
    if w.ndim != 2:
        raise InvalidArgumentError(f"gptq_quantize takes a [N, K] weight, got shape {w.shape}")
    n, k = w.shape
    u = np.asarray(factor, np.float64)
    if u.shape != (k, k):
        raise InvalidArgumentError(f"gptq_quantize: the inverse Hessian factor must be [{k}, {k}] for K={k}, got {u.shape}")
    gs = k if group_size == 0 else int(group_size)
    if gs <= 0 or k % gs:
        raise InvalidArgumentError(f"group_size={group_size} must be 0 (per channel) or a positive divisor of K={k}")
    if not np.isfinite(w).all():
        raise InvalidArgumentError("GPTQ: the weight holds a NaN or an infinity; it cannot be quantized")
    top = (1 << bits) - 1
    bs = int(block_size)
    # a group must start at a block's start or lie inside one block, so that the weights its
    # parameters are chosen from hold every earlier column's update: whole blocks of a larger
    # group (per channel: one group from column 0), else blocks of whole groups
    block = bs if gs == k or gs % bs == 0 else gs * max(1, bs // gs)
    codes = np.empty((n, k), np.uint8)
    scales = np.empty((n, k // gs), np.float32)
    zeros = np.empty((n, k // gs), np.float32)
    s = z = np.zeros(n)
    for b0 in range(0, k, block):
        b1 = min(b0 + block, k)
        wb = w[:, b0:b1]  # a view: the block's columns, updated eagerly
        err = np.empty((n, b1 - b0))
        for i in range(b1 - b0):
            col = b0 + i
            if col % gs == 0:  # a group starts: its parameters from its weights as updated so far
                s, z = params(w[:, col : col + gs])
                scales[:, col // gs], zeros[:, col // gs] = s, z
            q = np.clip(np.round(wb[:, i] / s) + z, 0, top)
            codes[:, col] = q
            e = (wb[:, i] - (q - z) * s) / u[col, col]
            wb[:, i:] -= np.outer(e, u[col, col:b1])
            err[:, i] = e
        w[:, b1:] -= err @ u[b0:b1, b1:]
    return QuantizedWeight(codes, scales, None if symmetric else zeros, bits, gs)


def gptq_linears(
    model_dir: str | os.PathLike[str],
    weights: Any,
    quantize: Callable[[np.ndarray, np.ndarray], QuantizedWeight],
    dampening_frac: float = DAMPENING_FRAC,
    calibration: str | os.PathLike[str] | None = None,
    num_tokens: int = DEFAULT_CALIBRATION_TOKENS,
    token_ids: Sequence[Sequence[int]] | None = None,
    progress: bool = False,
    first_token_weight: float = FIRST_TOKEN_WEIGHT,
) -> Iterator[tuple[str, QuantizedWeight]]:
    """GPTQ of every decoder linear of the Llama-family checkpoint in ``model_dir``, one layer
    at a time (one layer's factors held at once; every layer's captured inputs are held, module
    docstring): yields ``(weight name, quantized)``.

    Args:
        model_dir: a float Llama-family Hugging Face folder (with its tokenizer unless ``token_ids``).
        weights: its tensors (``get(name)``, e.g. an open :class:`trtcore.checkpoint.Checkpoint`).
        quantize: ``(W [N, K], U [K, K]) -> QuantizedWeight``, e.g. :func:`gptq_quantize` with
            the checkpoint's bits and groups bound; ``U`` is :func:`inverse_hessian_factor` of
            the linear's input, computed once for the linears that share it.
        dampening_frac: the factor's damping.
        calibration, num_tokens, token_ids: the calibration set
            (:func:`trtcore.calibration.capture_calibration`).
        progress: a tqdm bar over the layers (stderr).
        first_token_weight: each calibration sequence's first token's weight in ``H``
            (:data:`FIRST_TOKEN_WEIGHT`; 1: the paper's unweighted Hessian).

    Raises:
        InvalidArgumentError: not a Llama-style family (its inputs are not captured), a
            calibration problem (see :func:`trtcore.calibration.capture_calibration`), or a
            layer whose input is missing from the network (named), or a Hessian that damping does
            not make positive definite (named with the layer's linears).
        InvalidRequestError: the checkpoint has no tokenizer and no ``token_ids`` are given.
    """
    from tqdm.auto import tqdm

    from .awq import LLAMA_BUILDER, LLAMA_SCALE_GROUPS
    from .calibration import capture_calibration
    from .config import load_config
    from .families import family_of

    fam = family_of(load_config(model_dir).model_type)
    if fam.builder != LLAMA_BUILDER:
        raise InvalidArgumentError(
            f"GPTQ captures the inputs of Llama-style decoder layers; {fam.architecture} ({fam.builder}) is not supported (use --method rtn)"
        )

    def select(config: Any, present: set[str]) -> list[str]:
        return [g.input.format(i=i) for i in range(config.num_hidden_layers) for g in LLAMA_SCALE_GROUPS if g.input.format(i=i) in present]

    config, inputs, lengths = capture_calibration(model_dir, select, calibration, num_tokens, token_ids=token_ids)
    rows = first_token_weights(lengths, first_token_weight)
    tokens = min(x.shape[0] for x in inputs.values())
    widest = max(x.shape[1] for x in inputs.values())
    if tokens < widest:
        warnings.warn(
            f"GPTQ on {tokens} calibration tokens: a linear with K={widest} inputs gets a Hessian of rank at most {tokens}, "
            f"so its fit carries over less to other text; give at least {widest} tokens (--calibration-tokens, "
            "with a --calibration text that long)",
            stacklevel=2,
        )
    for i in tqdm(range(config.num_hidden_layers), desc="gptq", unit="layer", disable=not progress):
        for g in LLAMA_SCALE_GROUPS:
            key = g.input.format(i=i)
            if key not in inputs:
                raise InvalidArgumentError(f"GPTQ: the network has no tensor {key!r}, the input of layer {i}'s {g.linears}")
            try:
                u = inverse_hessian_factor(hessian(inputs.pop(key), rows), dampening_frac)
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(f"layer {i} {g.linears}: {exc}") from exc
            for role in g.linears:
                name = fam.tensor(role, i, ".weight")
                try:
                    yield name, quantize(weights.get(name), u)
                except InvalidArgumentError as exc:
                    raise InvalidArgumentError(f"{name}: {exc}") from exc
