"""Activation-aware weight quantization (AWQ) for ``trtcore quantize --method awq``.

Lin et al., "AWQ: Activation-aware Weight Quantization for LLM Compression and Acceleration",
arXiv:2306.00978, section 3.2. The linears that read the same input share one scale per input
channel, ``s``. The weight is quantized as ``Q(W diag(s))``, and ``1 / s`` is folded into the
op that produces the input, so the float function is unchanged before quantization:

* q/k/v_proj read ``input_layernorm``, which takes ``weight / s``;
* gate/up_proj read ``post_attention_layernorm``, which takes ``weight / s``;
* down_proj reads ``act(gate) * up``, so up_proj's output rows (and bias) take ``/ s``;
* o_proj reads the attention context, so v_proj's output rows (and bias) take ``/ s``. This
  needs as many key/value heads as heads: with grouped-query attention one v channel feeds
  several heads, and o_proj is then quantized by plain RTN, as AutoAWQ does.

Per group, ``s = mean|x|^alpha``. Here ``mean|x|`` is the mean magnitude of each input channel
over the calibration tokens, and the exponent is ``alpha = i / n_grid``, ``i = 0 .. n_grid - 1``.
Each ``s`` is normalized by ``sqrt(max s * min s)``. The ``alpha`` kept is the one with the least
mean squared error of the group's outputs, ``x @ (Q(W diag(s)) / s)^T`` against ``x @ W^T``, over
the calibration tokens, in float64.

``alpha = 0`` is ``s = 1``, plain RTN (:func:`trtcore.quantizer.quantize_rtn`), so on the
calibration tokens AWQ is never worse than RTN. The paper's weight clipping search is not done.

The activations are the float model's own. :func:`awq_plan` runs the checkpoint on the
reference backend in float32 and captures the four inputs of every layer
(:func:`trtcore.calibration.capture_prefill`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .calibration import DEFAULT_CALIBRATION_TOKENS
from .errors import InvalidArgumentError

__all__ = ["LLAMA_SCALE_GROUPS", "AwqPlan", "GroupResult", "ScaleGroup", "awq_plan", "search_scale"]


@dataclass(frozen=True)
class ScaleGroup:
    """Linears that share an input, and where ``1 / s`` goes.

    Attributes:
        input: the network tensor they read (``{i}``: the layer).
        linears: their family roles.
        fold_kind: ``"norm"`` (the norm's weight, elementwise) or ``"rows"`` (a linear's
            output rows and bias).
        fold_role: the family role of that op.
        needs_mha: only with ``num_key_value_heads == num_attention_heads``.
    """

    input: str
    linears: tuple[str, ...]
    fold_kind: str
    fold_role: str
    needs_mha: bool = False


#: the family file whose decoder layer :data:`LLAMA_SCALE_GROUPS` describes
LLAMA_BUILDER = "trtcore.models.llama"

#: the Llama-family decoder layer (trtcore.models.llama's tensor names)
LLAMA_SCALE_GROUPS: tuple[ScaleGroup, ...] = (
    ScaleGroup("model.layers.{i}.input_layernorm", ("q_proj", "k_proj", "v_proj"), "norm", "input_layernorm"),
    ScaleGroup("model.layers.{i}.self_attn.attention.context", ("o_proj",), "rows", "v_proj", needs_mha=True),
    ScaleGroup("model.layers.{i}.post_attention_layernorm", ("gate_proj", "up_proj"), "norm", "post_attention_layernorm"),
    ScaleGroup("model.layers.{i}.mlp.gated", ("down_proj",), "rows", "up_proj"),
)


@dataclass(frozen=True)
class GroupResult:
    """One group's search: the layer, the linears, the ``alpha`` kept and the output mean
    squared errors of plain RTN (``alpha = 0``) and of the kept scale."""

    layer: int
    linears: tuple[str, ...]
    alpha: float
    mse_rtn: float
    mse_awq: float


def search_scale(
    x: np.ndarray,
    weights: Sequence[np.ndarray],
    quantize: Callable[[np.ndarray], np.ndarray],
    n_grid: int = 20,
) -> tuple[np.ndarray, float, float, float]:
    """The AWQ scale of one group (module docstring).

    Args:
        x: ``[T, K]`` calibration inputs.
        weights: the group's ``[N_j, K]`` weights.
        quantize: ``W -> dequantized Q(W)`` (e.g. RTN), ``[N, K]`` float64 both.
        n_grid: exponents tried, ``alpha = i / n_grid``.

    Returns:
        ``(s [K] float64, alpha, mse at alpha 0, mse at alpha)``.

    Raises:
        InvalidArgumentError: shapes that do not match, no tokens, or ``n_grid < 1``.
    """
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or not x.shape[0]:
        raise InvalidArgumentError(f"search_scale needs inputs [T, K] with T >= 1, got {x.shape}")
    if n_grid < 1:
        raise InvalidArgumentError(f"n_grid must be at least 1, got {n_grid}")
    ws = [np.asarray(w, np.float64) for w in weights]
    if any(w.ndim != 2 or w.shape[1] != x.shape[1] for w in ws):
        raise InvalidArgumentError(f"search_scale: weights {[w.shape for w in ws]} must all be [N, K={x.shape[1]}]")
    w = np.concatenate(ws, axis=0)
    ref = x @ w.T
    mean_abs = np.abs(x).mean(axis=0)

    def mse(s: np.ndarray) -> float:
        wq = quantize(w * s[None, :]) / s[None, :]
        return float(np.mean((x @ wq.T - ref) ** 2))

    best = (np.ones(x.shape[1]), 0.0, mse(np.ones(x.shape[1])))
    rtn = best[2]
    for i in range(1, n_grid):
        alpha = i / n_grid
        s = np.maximum(mean_abs, 1e-4) ** alpha
        s = s / np.sqrt(s.max() * s.min())
        err = mse(s)
        if err < best[2]:
            best = (s, alpha, err)
    return best[0], best[1], rtn, best[2]


@dataclass
class AwqPlan:
    """The scales :func:`awq_plan` chose, as edits of the checkpoint's tensors.

    Attributes:
        column_scales: linear weight name -> ``s [K]`` (its columns are multiplied by it before
            quantization).
        divisors: tensor name -> ``s``: a norm weight or bias ``[K]`` is divided elementwise, a
            linear weight ``[K, in]`` row-wise.
        groups: one :class:`GroupResult` per searched group.
    """

    column_scales: dict[str, np.ndarray] = field(default_factory=dict)
    divisors: dict[str, np.ndarray] = field(default_factory=dict)
    groups: list[GroupResult] = field(default_factory=list)

    def apply(self, name: str, value: np.ndarray) -> np.ndarray:
        """``value`` of tensor ``name`` with its scale (and divisor), in float64 when edited,
        unchanged (the same array) otherwise."""
        s = self.column_scales.get(name)
        d = self.divisors.get(name)
        if s is None and d is None:
            return value
        out = np.asarray(value, np.float64)
        if d is not None:
            out = out / (d[:, None] if out.ndim == 2 else d)
        if s is not None:
            out = out * s[None, :]
        return out


def awq_plan(
    model_dir: str | os.PathLike[str],
    weights: Any,
    quantize: Callable[[np.ndarray], np.ndarray],
    calibration: str | os.PathLike[str] | None = None,
    num_tokens: int = DEFAULT_CALIBRATION_TOKENS,
    seq_len: int = 256,
    n_grid: int = 20,
    token_ids: Sequence[Sequence[int]] | None = None,
    progress: bool = False,
) -> AwqPlan:
    """Search the AWQ scales of every decoder layer of the checkpoint in ``model_dir``.

    Args:
        model_dir: a float Llama-family Hugging Face folder (with its tokenizer).
        weights: its tensors (``get(name)``, e.g. an open :class:`trtcore.checkpoint.Checkpoint`).
        quantize: ``W -> dequantized Q(W)``, the quantizer the checkpoint is written with.
        calibration: a text file (default :data:`trtcore.calibration.DEFAULT_CALIBRATION`).
        num_tokens: calibration tokens in all. seq_len: tokens per prefill.
        n_grid: exponents tried per group.
        token_ids: calibration sequences as token ids, instead of the text (a checkpoint
            without a tokenizer).
        progress: a tqdm bar over the decoder layers' scale searches (stderr).

    Raises:
        InvalidArgumentError: the calibration file is missing or gives no token, a sequence is
            empty or longer than ``seq_len``, or the network lacks every group's input tensor,
            or the checkpoint is not of a Llama-style family (its norms are not the plain
            ``weight * x_normed`` the scales fold into: Gemma's ``(1 + weight)``, Gemma 2/3's
            norm order).
        InvalidRequestError: the checkpoint has no tokenizer and no ``token_ids`` are given.
    """
    from .calibration import capture_calibration
    from .config import load_config
    from .families import family_of

    arch_family = family_of(load_config(model_dir).model_type)
    if arch_family.builder != LLAMA_BUILDER:
        raise InvalidArgumentError(
            f"AWQ folds its scales into Llama-style norms and projections; {arch_family.architecture} ({arch_family.builder}) "
            "is not supported (use --method rtn)"
        )
    groups: list[ScaleGroup] = []

    def select(config: Any, present: set[str]) -> list[str]:
        mha = config.num_key_value_heads == config.num_attention_heads
        groups.extend(g for g in LLAMA_SCALE_GROUPS if mha or not g.needs_mha)
        names = [g.input.format(i=i) for i in range(config.num_hidden_layers) for g in groups if g.input.format(i=i) in present]
        if not names:
            raise InvalidArgumentError(f"the {config.architecture} network has none of AWQ's input tensors ({[g.input for g in groups]})")
        return names

    config, inputs, _ = capture_calibration(model_dir, select, calibration, num_tokens, seq_len, token_ids)
    fam = family_of(config.model_type)
    layers = range(config.num_hidden_layers)
    plan = AwqPlan()
    from tqdm.auto import tqdm

    for i in tqdm(layers, desc="awq scale search", unit="layer", disable=not progress):
        for g in groups:
            key = g.input.format(i=i)
            if key not in inputs:
                continue
            x = inputs.pop(key)
            lin_names = [fam.tensor(r, i, ".weight") for r in g.linears]
            s, alpha, mse_rtn, mse_awq = search_scale(x, [weights.get(n) for n in lin_names], quantize, n_grid)
            plan.groups.append(GroupResult(i, g.linears, alpha, mse_rtn, mse_awq))
            if alpha == 0.0:
                continue
            for n in lin_names:
                plan.column_scales[n] = s
            fold = [fam.tensor(g.fold_role, i, ".weight")]
            if g.fold_kind == "rows":
                bias = fam.tensor(g.fold_role, i, ".bias")
                if bias in weights:
                    fold.append(bias)
            for n in fold:
                plan.divisors[n] = plan.divisors[n] * s if n in plan.divisors else s
    return plan
