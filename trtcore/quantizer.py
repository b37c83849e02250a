"""trtcore's own weight quantizer (``trtcore quantize``): round to nearest (RTN), optionally
after AWQ's activation-aware scaling (``method="awq"``, :mod:`trtcore.awq`), or GPTQ's rounding
column by column with error feedback (``method="gptq"``, :mod:`trtcore.gptq`), written as a
compressed-tensors ``pack-quantized`` checkpoint, which :mod:`trtcore.quant_formats` reads back
(and vLLM and transformers load), so the linears run as weight-only GEMMs; or FP8
(``method="fp8"``, :func:`fp8_tensors`), written as a compressed-tensors ``float-quantized``
checkpoint.

For every decoder linear (``q/k/v/o_proj``, ``gate/up/down_proj`` of each layer; the embedding,
the norms and ``lm_head`` stay as they are), per output row and group of ``group_size`` input
features (``group_size=0``: the whole row, compressed-tensors' ``channel`` strategy), in
float64, with ``b`` bits (``L = 2**b - 1``):

* asymmetric (default): ``lo = min(w, 0)``, ``hi = max(w, 0)``, scale ``s = (hi - lo) / L``,
  zero point ``z = clip(round(-lo / s), 0, L)``;
* symmetric: ``s = max|w| / (2**(b-1) - 1)``, ``z = 2**(b-1)``;

``s`` is stored as float32 (a group of zeros gets ``s = 1``), and the codes are
``q = clip(round(w / s) + z, 0, L)`` with that stored ``s``, so ``(q - z) * s`` is the nearest
point of the group's grid that the stored scale defines. That is the ``"minmax"`` observer
(compressed-tensors' ``observer`` field). The ``"mse"`` observer shrinks each group's range
first: ``lo``, ``hi`` (symmetric: ``max|w|``) times the ``p`` of ``1, 0.99, ..., 0.81`` whose grid
minimizes ``sum |(q - z) s - w| ** 2.4`` over the group (the largest such ``p``): GPTQ's
``Quantizer.find_params(mse=True)`` and llm-compressor's MSE observer (grid 100, maxshrink 0.2,
norm 2.4). Clipping a few outliers buys a finer grid for the rest. RTN is the baseline of GPTQ (Frantar
et al. 2022, arXiv:2210.17323) and AWQ (Lin et al. 2023, arXiv:2306.00978), both of which use
calibration data. With ``method="awq"`` each linear is RTN-quantized after its input channels
are multiplied by AWQ's scale, and the inverse scale is folded into the norm or linear that
feeds it (those tensors are written changed, in their own dtype). With ``method="gptq"`` each
linear's groups take the same scales and zero points (:func:`group_params`, chosen when GPTQ
reaches the group), and its codes are GPTQ's: each column rounded after the earlier columns'
errors were spread onto it (:mod:`trtcore.gptq`; the other tensors are copied unchanged).

The output folder holds ``config.json`` with the ``quantization_config``
(``{"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups":
{"group_0": {"targets": ["Linear"], "weights": {"num_bits", "type": "int", "symmetric",
"strategy", "group_size"}}}, "ignore": ["lm_head"]}``), ``model.safetensors`` (per linear
``X``: ``X.weight_packed``, ``X.weight_scale``, ``X.weight_zero_point`` when asymmetric,
``X.weight_shape``; every other tensor copied) and the model folder's other files (tokenizer,
generation config). It is written beside the target and renamed into place
(:func:`trtcore.fileio.atomic_folder`).

FP8 (``method="fp8"``, :mod:`trtcore.fp8`): every decoder linear's weight becomes E4M3 with
``amax / 448`` scales per output channel (``strategy="channel"``) or per tensor (one scale for
the linears of a packed module, q/k/v and gate/up: the largest amax of theirs, so that they
run as one GEMM, as NVIDIA ModelOpt's export and vLLM's loading unify them), and, with
static activations (the default), each linear's input gets one scale, ``amax / 448`` of that
input over the calibration tokens run through the float model on the reference backend
(:func:`trtcore.calibration.capture_calibration`; the linears reading one tensor share it);
``activations="dynamic"`` computes one scale per call instead, ``"token"`` one per token (row of
x) per call, ``max|x[m, :]| / 448`` (llm-compressor's ``FP8_DYNAMIC`` scheme with channel weights).
The checkpoint is compressed-tensors ``float-quantized`` (llm-compressor's ``FP8`` scheme with
``channel`` or ``tensor`` weights): per linear ``X``, ``X.weight`` (``F8_E4M3``),
``X.weight_scale`` (float32 ``[N, 1]`` or ``[1]``) and ``X.input_scale`` (float32 ``[1]``,
static only); ``quantization_config.config_groups.group_0`` holds ``weights`` ``{"num_bits": 8,
"type": "float", "strategy", "symmetric": true, "dynamic": false}`` and ``input_activations``
``{"num_bits": 8, "type": "float", "strategy": "tensor"`` (``"token"`` per token) ``, "symmetric": true, "dynamic"}``.
transformers (with the compressed-tensors package) and vLLM load it, and so does
:mod:`trtcore.quant_formats.fp8`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .cache_dir import COMPLETE_MARKER
from .calibration import DEFAULT_CALIBRATION_TOKENS
from .errors import InvalidArgumentError, UnsupportedArchitectureError
from .families import family_of
from .fp8 import E4M3, WEIGHT_STRATEGIES, Fp8Weight, amax_scale, quantize_weight
from .plugins.weight_only_gemm import GROUP_UNIT  # the groups the weight-only GEMM runs: quantize refuses others
from .quant_formats import CONFIG_FILES, KV_CACHE_SCHEME, packed_siblings
from .quant_formats.packing import pack_int32
from .quantization import QuantizedWeight

__all__ = [
    "GROUP_SIZES",
    "METHODS",
    "OBSERVERS",
    "common_group_size",
    "fp8_input_amax",
    "fp8_tensors",
    "group_params",
    "quantize_checkpoint",
    "quantize_rtn",
]

#: ``trtcore quantize --method`` values implemented
METHODS = ("rtn", "awq", "gptq", "fp8")
#: FP8 activation scales: calibrated per tensor, computed per call (one per tensor), or computed
#: per call for each token (row of x: llm-compressor's FP8_DYNAMIC scheme)
ACTIVATIONS = ("static", "dynamic", "token")
#: the decoder linears a Llama-family checkpoint quantizes (family roles)
LINEAR_ROLES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: files of the model folder quantize does not copy: the weights and config it writes itself, and
#: the default model's cache marker (its wheel and GGUF, not this folder's)
_SKIP_FILES = {"model.safetensors", "model.safetensors.index.json", "config.json", COMPLETE_MARKER}
#: the group sizes tried, largest first, for the default and for the hint of a bad one
GROUP_SIZES = (128, 64, 32)


#: ``observer`` values: how a group's range is chosen (compressed-tensors' ``QuantizationArgs.observer``)
OBSERVERS = ("minmax", "mse")
#: the ``"mse"`` observer's shrink grid: ``p = 1 - i / MSE_GRID`` for ``i < MSE_MAXSHRINK * MSE_GRID``,
#: and the error's norm (GPTQ's ``Quantizer.find_params`` with ``mse=True``, llm-compressor's MSE
#: observer: grid 100, maxshrink 0.2, norm 2.4)
MSE_GRID, MSE_MAXSHRINK, MSE_NORM = 100, 0.2, 2.4
#: the observer when none is given (quantize_rtn, quantize_checkpoint)
DEFAULT_OBSERVER = "minmax"
#: rows quantized at once (bounds the float64 temporaries of an 8B model's large linears)
_ROW_BLOCK = 2048


def _rtn_groups(g: np.ndarray, bits: int, symmetric: bool, shrink: np.ndarray | float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """RTN of groups ``g [n, G, gs]`` (float64) with ranges shrunk by ``shrink`` (``[n, G]`` or a
    number): ``(float32 scales [n, G], zero points [n, G] (float64), codes [n, G, gs] float64)``
    (formulas: module docstring)."""
    top = (1 << bits) - 1
    if symmetric:
        scale = np.abs(g).max(axis=2) * shrink / ((1 << (bits - 1)) - 1)
    else:
        lo, hi = np.minimum(g.min(axis=2), 0.0) * shrink, np.maximum(g.max(axis=2), 0.0) * shrink
        scale = (hi - lo) / top
    scale32 = np.where(scale > 0, scale, 1.0).astype(np.float32)
    s = scale32.astype(np.float64)
    zero = np.full(s.shape, float(1 << (bits - 1))) if symmetric else np.clip(np.round(-lo / s), 0, top)
    codes = np.clip(np.round(g / s[..., None]) + zero[..., None], 0, top)
    return scale32, zero, codes


def _mse_shrink(g: np.ndarray, bits: int, symmetric: bool) -> np.ndarray:
    """The ``"mse"`` observer: per group of ``g [n, G, gs]``, the shrink ``p`` of the grid
    (:data:`MSE_GRID`) whose RTN minimizes ``sum |(q - z) s - w| ** MSE_NORM``; the largest ``p``
    among equals (``p = 1`` is min-max)."""
    best_p = np.ones(g.shape[:2])
    best_err = np.full(g.shape[:2], np.inf)
    for i in range(int(MSE_MAXSHRINK * MSE_GRID)):
        p = 1.0 - i / MSE_GRID
        scale32, zero, codes = _rtn_groups(g, bits, symmetric, p)
        err = (np.abs((codes - zero[..., None]) * scale32.astype(np.float64)[..., None] - g) ** MSE_NORM).sum(axis=2)
        better = err < best_err
        best_p = np.where(better, p, best_p)
        best_err = np.where(better, err, best_err)
    return best_p


def group_params(g: np.ndarray, bits: int, symmetric: bool, observer: str = DEFAULT_OBSERVER) -> tuple[np.ndarray, np.ndarray]:
    """RTN's scale and zero point of one group of columns ``g [N, gs]`` (each row's, by the
    observer's rule: module docstring): ``(scale [N], zero [N])`` float64, the scales
    float32-exact (what is stored), the zero points the unsigned codes' (``2**(bits-1)``
    symmetric). :mod:`trtcore.gptq` chooses each group's parameters with it."""
    g3 = np.asarray(g, np.float64)[:, None, :]
    shrink = _mse_shrink(g3, bits, symmetric) if observer == "mse" else 1.0
    scale32, zero, _ = _rtn_groups(g3, bits, symmetric, shrink)
    return scale32[:, 0].astype(np.float64), zero[:, 0]


def quantize_rtn(weight: np.ndarray, bits: int, group_size: int = 128, symmetric: bool = False, observer: str = DEFAULT_OBSERVER) -> QuantizedWeight:
    """Round-to-nearest quantization of one ``[N, K]`` weight (formulas: module docstring).

    Args:
        weight: ``[N, K]``, any float dtype (computed in float64).
        bits: 4 or 8.
        group_size: input features per scale; 0 for one scale per output row.
        symmetric: no zero points (``z = 2**(bits-1)``).
        observer: ``"minmax"`` (each group's range as it is) or ``"mse"`` (each group's range
            shrunk by the factor of a grid that minimizes its error, :data:`MSE_GRID`; module
            docstring).

    Returns:
        The :class:`~trtcore.quantization.QuantizedWeight` (``float32`` scales and zeros).

    Raises:
        InvalidArgumentError: ``bits`` not 4 or 8, a 2-D weight is not given, ``group_size``
            negative or not dividing ``K``, an unknown ``observer``, or a non-finite weight.
    """
    if bits not in (4, 8):
        raise InvalidArgumentError(f"bits must be 4 or 8, got {bits!r}")
    if observer not in OBSERVERS:
        raise InvalidArgumentError(f"observer must be one of {OBSERVERS}, got {observer!r}")
    w = np.asarray(weight, dtype=np.float64)
    if w.ndim != 2:
        raise InvalidArgumentError(f"quantize_rtn takes a [N, K] weight, got shape {w.shape}")
    n, k = w.shape
    gs = k if group_size == 0 else int(group_size)
    if gs <= 0 or k % gs:
        raise InvalidArgumentError(f"group_size={group_size} must be 0 (per channel) or a positive divisor of K={k}")
    if not np.isfinite(w).all():
        raise InvalidArgumentError("the weight holds a NaN or an infinity; it cannot be quantized")
    codes = np.empty((n, k), np.uint8)
    scales = np.empty((n, k // gs), np.float32)
    zeros = np.empty((n, k // gs), np.float32)
    for r0 in range(0, n, _ROW_BLOCK):
        g = w[r0 : r0 + _ROW_BLOCK].reshape(-1, k // gs, gs)
        shrink = _mse_shrink(g, bits, symmetric) if observer == "mse" else 1.0
        scale32, zero, q = _rtn_groups(g, bits, symmetric, shrink)
        codes[r0 : r0 + _ROW_BLOCK] = q.astype(np.uint8).reshape(-1, k)
        scales[r0 : r0 + _ROW_BLOCK] = scale32
        zeros[r0 : r0 + _ROW_BLOCK] = zero
    return QuantizedWeight(codes, scales, None if symmetric else zeros, bits, gs)


def compressed_tensors_tensors(prefix: str, qw: QuantizedWeight) -> dict[str, np.ndarray]:
    """``qw`` as the ``pack-quantized`` tensors of linear ``prefix`` (the layout
    :mod:`trtcore.quant_formats.compressed_tensors` reads): codes packed along K, zero points
    (asymmetric) packed along N, both as the unsigned codes (signed value + ``2**(bits-1)``).

    Raises:
        InvalidArgumentError: ``qw`` has an act-order permutation (not in this layout's RTN
            output).
    """
    if qw.perm is not None:
        raise InvalidArgumentError(f"{prefix}: act-order weights are not written by the RTN quantizer")
    n, k = qw.shape
    per_word = 32 // qw.bits
    out = {
        f"{prefix}.weight_packed": pack_int32(_pad(qw.codes, 1, per_word), qw.bits, 1),
        f"{prefix}.weight_scale": np.ascontiguousarray(qw.scales, np.float32),
        f"{prefix}.weight_shape": np.array([n, k], np.int64),
    }
    if qw.zeros is not None:
        out[f"{prefix}.weight_zero_point"] = pack_int32(_pad(qw.zeros.astype(np.uint8), 0, per_word), qw.bits, 0)
    return out


def fp8_tensors(prefix: str, fw: Fp8Weight) -> dict[str, np.ndarray]:
    """``fw`` as the compressed-tensors ``float-quantized`` tensors of linear ``prefix``
    (module docstring; per-channel scales as ``[N, 1]``)."""
    out = {
        f"{prefix}.weight": fw.weight.view(E4M3),
        f"{prefix}.weight_scale": fw.weight_scale.reshape(-1, 1) if fw.per_channel else fw.weight_scale.copy(),
    }
    if fw.input_scale is not None:
        out[f"{prefix}.input_scale"] = fw.input_scale.copy()
    return out


def fp8_input_amax(
    model_dir: str | os.PathLike[str],
    calibration: str | os.PathLike[str] | None = None,
    num_tokens: int = DEFAULT_CALIBRATION_TOKENS,
    token_ids: Sequence[Sequence[int]] | None = None,
) -> dict[str, float]:
    """``max|x|`` of every decoder linear's input over the calibration tokens (float model,
    reference backend): ``{linear weight name: amax}``.

    Raises:
        InvalidArgumentError / InvalidRequestError: see :func:`trtcore.calibration.capture_calibration`.
    """
    return fp8_calibration_amax(model_dir, calibration, num_tokens, token_ids)[0]


#: the network tensors a layer writes into its KV cache (keys after RoPE, values), one per
#: layer, in the contiguous-cache network calibration runs (``ops.cached_attention``)
_KV_WRITES = re.compile(r"^(?P<attn>(?:.*\.)?layers\.(?P<layer>\d+)\.[^.]+)\.(?P<kind>k|v)_bhsd$")


def fp8_calibration_amax(
    model_dir: str | os.PathLike[str],
    calibration: str | os.PathLike[str] | None = None,
    num_tokens: int = DEFAULT_CALIBRATION_TOKENS,
    token_ids: Sequence[Sequence[int]] | None = None,
    *,
    inputs: bool = True,
    kv_cache: bool = False,
) -> tuple[dict[str, float], dict[str, float]]:
    """One calibration pass (float model, reference backend) for FP8 scales:
    ``({linear weight name: max|x| of its input}, {KV scale tensor name: max|k| or max|v|})``.

    ``inputs``: the first dict (else empty). ``kv_cache``: the second, keyed by the tensor names
    vLLM reads for its FP8 KV cache (``model.layers.N.self_attn.k_scale`` / ``v_scale``; the
    attention module's name as the network's scope gives it), over what each layer writes into
    its cache: the keys after RoPE and the values (llm-compressor's KV cache observer; vLLM
    docs, "Quantized KV Cache"). Else empty.

    Raises:
        InvalidArgumentError / InvalidRequestError: see :func:`trtcore.calibration.capture_calibration`;
            a layer without a tensor to calibrate (named).
    """
    from .awq import LLAMA_SCALE_GROUPS
    from .calibration import capture_calibration

    def select(config: Any, present: set[str]) -> list[str]:
        names = (
            [g.input.format(i=i) for i in range(config.num_hidden_layers) for g in LLAMA_SCALE_GROUPS if g.input.format(i=i) in present]
            if inputs
            else []
        )
        return names + (sorted(n for n in present if _KV_WRITES.match(n)) if kv_cache else [])

    config, captured, _ = capture_calibration(model_dir, select, calibration, num_tokens, token_ids=token_ids)
    fam = family_of(config.model_type)
    amax: dict[str, float] = {}
    for i in range(config.num_hidden_layers) if inputs else ():
        for g in LLAMA_SCALE_GROUPS:
            x = captured.get(g.input.format(i=i))
            if x is None:
                raise InvalidArgumentError(f"the {config.architecture} network has no tensor {g.input.format(i=i)!r} to calibrate {g.linears}")
            for role in g.linears:
                amax[fam.tensor(role, i, ".weight")] = float(np.abs(x).max(initial=0.0))
    kv: dict[str, float] = {}
    written: set[tuple[int, str]] = set()
    for name, x in captured.items() if kv_cache else ():
        m = _KV_WRITES.match(name)
        if m is not None:
            kv[f"{m['attn']}.{m['kind']}_scale"] = float(np.abs(x).max(initial=0.0))
            written.add((int(m["layer"]), m["kind"]))
    missing = [(i, k) for i in range(config.num_hidden_layers) for k in "kv" if kv_cache and (i, k) not in written]
    if missing:
        raise InvalidArgumentError(f"the {config.architecture} network has no KV cache write to calibrate (layer, k/v): {missing[:4]}")
    return amax, kv


def _pad(codes: np.ndarray, axis: int, multiple: int) -> np.ndarray:
    extra = -codes.shape[axis] % multiple
    if not extra:
        return codes
    width = [(0, 0)] * codes.ndim
    width[axis] = (0, extra)
    return np.pad(codes, width)


def _linear_names(config: Any) -> Iterator[str]:
    fam = family_of(config.model_type)
    if fam.builder != "trtcore.models.llama":
        raise UnsupportedArchitectureError(
            f"trtcore quantize writes checkpoints for the Llama-family architectures only; {config.architecture} "
            f"({config.model_type}) is built by {fam.builder}. For FP8, LLM(..., quantization='fp8') (--quantization fp8) "
            "quantizes a float checkpoint's linears when the engine is built, where the family's network reads them quantized "
            "(not Phi-3's or GPT-NeoX's, whose networks read every linear as a float tensor)"
        )
    for layer in range(config.num_hidden_layers):
        for role in LINEAR_ROLES:
            yield fam.tensor(role, layer, ".weight")


#: per option of :func:`quantize_checkpoint`, the methods that use it (``"fp8-static"``: fp8
#: with calibrated input scales); an option given to another method is refused
_USED_BY = {
    "bits": ("rtn", "awq", "gptq"),
    "group_size": ("rtn", "awq", "gptq"),
    "observer": ("rtn", "awq", "gptq"),
    "symmetric": ("rtn", "awq", "gptq"),
    "calibration": ("awq", "gptq", "fp8-static"),
    "calibration_tokens": ("awq", "gptq", "fp8-static"),
    "calibration_ids": ("awq", "gptq", "fp8-static"),
    "strategy": ("fp8-static", "fp8-dynamic", "fp8-token"),
    "activations": ("fp8-static", "fp8-dynamic", "fp8-token"),
    "kv_cache_scales": ("fp8-static", "fp8-dynamic", "fp8-token"),
    "dampening_frac": ("gptq",),
    "first_token_weight": ("gptq",),
}


#: options of :func:`quantize_checkpoint` that ``trtcore quantize`` has no flag for
_API_ONLY = {"calibration_ids"}


def _all_finite(a: np.ndarray, chunk: int = 1 << 24) -> bool:
    """Whether every element of ``a`` is finite (integer tensors are), ``chunk`` elements at a
    time (a memory-mapped tensor is never held twice in full)."""
    if a.dtype.kind in "biu":
        return True
    flat = a.reshape(-1)
    return all(bool(np.isfinite(flat[i : i + chunk]).all()) for i in range(0, flat.size, chunk))


def _option(name: str) -> str:
    """An option as both the function and ``trtcore quantize`` name it: ``group_size
    (--group-size)``; ``calibration_ids (Python API only)``. Errors reach users of both."""
    return f"{name} ({'Python API only' if name in _API_ONLY else '--' + name.replace('_', '-')})"


#: the largest ``first_token_weight`` taken: beyond it the first tokens are all the Hessian holds
MAX_FIRST_TOKEN_WEIGHT = 1e6
#: the largest ``dampening_frac`` taken: at 1e12 the damping already swamps every correlation
#: (GPTQ then writes RTN's checkpoint, tests/test_gptq.py); larger values only risk overflow
MAX_DAMPENING_FRAC = 1e12


def _number_option(name: str, value: Any, low: float, high: float, *, low_inclusive: bool) -> float | None:
    """A real-number option of :func:`quantize_checkpoint` as a float (None stays None), within
    ``low`` (inclusive or not) and ``high`` (inclusive).

    Raises:
        InvalidArgumentError: a bool, a string or any non-real value, NaN, a value too large for a
            float, or out of the range (named with its flag and the range).
    """
    if value is None:
        return None
    number: float | None = None
    if not isinstance(value, bool) and isinstance(value, int | float | np.integer | np.floating):  # np.bool_ is neither
        try:
            number = float(value)
        except OverflowError:
            number = None
    if number is None or not (low <= number if low_inclusive else low < number) or not number <= high:
        bound = ">=" if low_inclusive else ">"
        raise InvalidArgumentError(f"{_option(name)} must be a number {bound} {low:g} and <= {high:g}, got {value!r}")
    return number


#: the group sizes vLLM's Marlin weight-only kernels take (its ``MARLIN_SUPPORTED_GROUP_SIZES``,
#: besides -1 per channel), which the README's "vLLM reads these folders" rests on
VLLM_GROUP_SIZES = (32, 64, 128)


def _refuse_unused(method: str, fp8_activations: str, **given: Any) -> None:
    """InvalidArgumentError for the first option in ``given`` (not None) that ``method`` does
    not use (:data:`_USED_BY`); fp8's 8 bits, per-channel group size 0 and min-max observer
    (what its config records) are accepted."""
    key = f"fp8-{fp8_activations}" if method == "fp8" else method
    for name, value in given.items():
        if value is None or key in _USED_BY[name] or (method == "fp8" and (name, value) in (("bits", 8), ("group_size", 0), ("observer", "minmax"))):
            continue
        used = _USED_BY[name]
        fp8 = "fp8" if "fp8-dynamic" in used else "fp8 with static activations" if "fp8-static" in used else None
        users = ", ".join([u for u in used if not u.startswith("fp8")] + ([fp8] if fp8 else []))
        what = f"FP8 with {fp8_activations} activations" if key in ("fp8-dynamic", "fp8-token") else f"method {method!r}"
        raise InvalidArgumentError(f"quantize: {_option(name)} = {value!r} does not apply to {what}; it is used by {users}")


def quantize_checkpoint(
    model_dir: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    *,
    method: str = "rtn",
    bits: int | None = None,
    group_size: int | None = None,
    symmetric: bool = False,
    observer: str | None = None,
    overwrite: bool = False,
    calibration: str | os.PathLike[str] | None = None,
    calibration_tokens: int | None = None,
    calibration_ids: Sequence[Sequence[int]] | None = None,
    strategy: str | None = None,
    activations: str | None = None,
    kv_cache_scales: bool = False,
    dampening_frac: float | None = None,
    first_token_weight: float | None = None,
    progress: bool = False,
) -> Path:
    """Quantize the decoder linears of the checkpoint in ``model_dir`` into ``output_dir``
    (a compressed-tensors ``pack-quantized`` checkpoint; module docstring).

    Args:
        model_dir: a Hugging Face model folder (safetensors, one file or sharded).
        output_dir: the folder to write (created; replaced only with ``overwrite``).
        method: ``"rtn"``, ``"awq"``, ``"gptq"`` or ``"fp8"`` (:data:`METHODS`).
        bits, group_size, symmetric, observer: see :func:`quantize_rtn` (not for ``"fp8"``, whose
            weights are 8-bit E4M3); ``bits=None``: 4; ``group_size=None``: the largest of
            :data:`GROUP_SIZES` that divides the K of every linear (:func:`common_group_size`),
            recorded in the output's config; ``observer=None``: :data:`DEFAULT_OBSERVER`
            (recorded in the config as compressed-tensors' ``observer``).
        calibration: ``"awq"``, ``"gptq"`` and static ``"fp8"``: a text file (default
            :data:`trtcore.calibration.DEFAULT_CALIBRATION`).
        calibration_tokens: calibration tokens in all (None:
            :data:`trtcore.calibration.DEFAULT_CALIBRATION_TOKENS`, 4096, or all that the default
            text gives where that is fewer, without a warning).
        progress: tqdm bars (stderr) over AWQ's per-layer scale search and over the tensors
            written (``trtcore quantize`` shows them).
        calibration_ids: calibration sequences as token ids instead of a text
            (:func:`trtcore.awq.awq_plan`'s ``token_ids``).
        strategy: ``"fp8"``: weight scales per ``"channel"`` (None) or per ``"tensor"``.
        activations: ``"fp8"``: ``"static"`` (None: calibrated input scales), ``"dynamic"`` (one
            scale per call) or ``"token"`` (one scale per token per call).
        kv_cache_scales: ``"fp8"``: also calibrate the FP8 KV cache's scales, one ``k_scale`` /
            ``v_scale`` per layer (``max|k|`` of the keys after RoPE, ``max|v|``, over 448) with
            the config's ``kv_cache_scheme``, as llm-compressor writes them and vLLM and
            ``LLM(kv_cache_dtype="fp8")`` read them (the calibration options then apply
            with any ``activations``).
        dampening_frac: ``"gptq"``: the Hessian's damping over its mean diagonal (None:
            :data:`trtcore.gptq.DAMPENING_FRAC`, 0.01); larger values trust the calibration
            statistics less (a small calibration set leaves ``X^T X`` singular).
        first_token_weight: ``"gptq"``: how many times each calibration sequence's first token
            counts in the Hessian (None: :data:`trtcore.gptq.FIRST_TOKEN_WEIGHT`, 4; 1: the
            GPTQ paper's unweighted ``2 X^T X``): position 0 is the attention sink every later
            token reads, and its normalized inputs are small, so unweighted GPTQ moves error onto
            it (:mod:`trtcore.gptq`).

    An option the method does not use (``calibration`` for ``"rtn"``, ``bits=4`` or a group
    size for ``"fp8"``, ``strategy`` for ``"awq"``, ...) is refused rather than ignored.

    Returns:
        ``output_dir``.

    Raises:
        InvalidArgumentError: an unknown method (method, observer, strategy and activations are
            taken in any case), ``symmetric`` or ``kv_cache_scales`` not a bool, an option the
            method does not use (named), a tensor holding a NaN or an infinity (named),
            bits / group size / calibration_tokens not integers, a ``dampening_frac`` that is not a
            number in (0, :data:`MAX_DAMPENING_FRAC`], a ``first_token_weight`` that is not one in
            [1, :data:`MAX_FIRST_TOKEN_WEIGHT`], bad bits / group size, a linear whose K the
            group size does not divide (named), an already quantized checkpoint, a missing
            calibration file, ``calibration`` or ``calibration_tokens`` with ``calibration_ids``,
            calibration (awq, gptq, static fp8) without token ids on a model with no
            tokenizer.json, ``calibration_tokens`` below 1, ``output_dir`` exists and is not
            empty without ``overwrite``, or it overlaps ``model_dir`` (the same folder, or one
            inside the other), or it cannot be created (:func:`trtcore.fileio.check_folder_free`: checked
            before any work).
        UnsupportedArchitectureError: not a Llama-family architecture.
        CheckpointError / MissingTensorError: the checkpoint cannot be read.
    """
    from safetensors.numpy import save_file

    from .checkpoint import KV_SCALE_MIN, Checkpoint
    from .config import load_config
    from .fileio import atomic_folder, check_folder_free

    # the names in any case, as the CLI and LLM(quantization=...) take them: "AWQ" is "awq"
    method, observer, strategy, activations = (v.lower() if isinstance(v, str) else v for v in (method, observer, strategy, activations))
    if method not in METHODS:
        raise InvalidArgumentError(f"quantization method {method!r} is not implemented; available: {', '.join(METHODS)}")
    for name, flag in (("symmetric", symmetric), ("kv_cache_scales", kv_cache_scales)):
        if not isinstance(flag, bool | np.bool_):
            raise InvalidArgumentError(f"{_option(name)} must be True or False, got {flag!r} ({type(flag).__name__})")
    for name, given in (("bits", bits), ("group_size", group_size), ("calibration_tokens", calibration_tokens)):
        if given is not None and (isinstance(given, bool) or not isinstance(given, int | np.integer)):
            raise InvalidArgumentError(f"{_option(name)} must be an integer, got {given!r} ({type(given).__name__})")
    if method == "fp8" and activations is not None and activations not in ACTIVATIONS:  # before the option check, which keys on it
        raise InvalidArgumentError(f"FP8 activations {activations!r}: expected one of {ACTIVATIONS}")
    _refuse_unused(
        method,
        activations or "static",
        bits=bits,
        group_size=group_size,
        observer=observer,
        symmetric=symmetric or None,  # False is the default, given or not
        strategy=strategy,
        activations=activations,
        kv_cache_scales=kv_cache_scales or None,
        dampening_frac=dampening_frac,
        first_token_weight=first_token_weight,
    )
    first_token_weight = _number_option("first_token_weight", first_token_weight, 1.0, MAX_FIRST_TOKEN_WEIGHT, low_inclusive=True)
    dampening_frac = _number_option("dampening_frac", dampening_frac, 0.0, MAX_DAMPENING_FRAC, low_inclusive=False)
    # calibration feeds static input scales and the KV cache scales
    calibrates = "static" if kv_cache_scales else activations or "static"
    try:
        _refuse_unused(method, calibrates, calibration=calibration, calibration_tokens=calibration_tokens, calibration_ids=calibration_ids)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{exc}{', and by fp8 with ' + _option('kv_cache_scales') if method == 'fp8' else ''}") from None
    if calibration_ids is not None and (calibration is not None or calibration_tokens is not None):  # they would be ignored
        given = _option("calibration") if calibration is not None else _option("calibration_tokens")
        raise InvalidArgumentError(f"{given} and {_option('calibration_ids')} exclude each other: the token ids are the whole calibration set")
    bits = 4 if bits is None else bits
    observer = DEFAULT_OBSERVER if observer is None else observer
    if observer not in OBSERVERS:
        raise InvalidArgumentError(f"{_option('observer')} must be one of {OBSERVERS}, got {observer!r}")
    calibration_tokens = DEFAULT_CALIBRATION_TOKENS if calibration_tokens is None else calibration_tokens
    strategy, activations = strategy or "channel", activations or "static"
    if method == "fp8":
        if strategy not in WEIGHT_STRATEGIES:
            raise InvalidArgumentError(f"FP8 weight {_option('strategy')} {strategy!r} is not one of {WEIGHT_STRATEGIES}")
        if activations not in ACTIVATIONS:
            raise InvalidArgumentError(f"FP8 activations {activations!r}: expected one of {ACTIVATIONS}")
        bits, group_size = 8, 0  # no group-size check below
    if bits not in (4, 8):
        raise InvalidArgumentError(f"{_option('bits')} must be 4 or 8, got {bits!r}")
    if group_size is not None and group_size < 0:
        raise InvalidArgumentError(f"{_option('group_size')} must be 0 (per channel) or positive, got {group_size}")
    if calibration_tokens < 1:
        raise InvalidArgumentError(f"{_option('calibration_tokens')} must be positive, got {calibration_tokens}")
    check_folder_free(output_dir, overwrite, source=model_dir)  # as given: "" is not "."
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    config = load_config(model_dir)  # names a missing folder, a safetensors or GGUF file given as the model
    if not model_dir.is_dir():  # a config.json: load_config reads it, the weights are beside it
        raise InvalidArgumentError(f"{model_dir} is a file; quantize reads a model folder (config.json and safetensors): pass {model_dir.parent}")
    if config.quantization_config:
        raise InvalidArgumentError(
            f"{model_dir} is already quantized ({config.quantization_config.get('quant_method')}); quantize a float checkpoint"
        )
    for name in sorted({n for names in CONFIG_FILES.values() for n in names}):  # AutoGPTQ / AutoAWQ keep it beside config.json
        if (model_dir / name).is_file():
            raise InvalidArgumentError(
                f"{model_dir} is already quantized: it has {name} (AutoGPTQ's / AutoAWQ's quantization config, read with "
                "quantization='gptq' or 'awq'); quantize a float checkpoint"
            )
    raw_config = json.loads((model_dir / "config.json").read_text())
    linears = set(_linear_names(config))
    calibrated = method in ("awq", "gptq") or (method == "fp8" and (activations == "static" or kv_cache_scales))
    if calibrated and calibration_ids is None:
        from .calibration import calibration_text

        calibration_text(calibration, max_chars=4096)  # a missing or unreadable file first: the more specific mistake
    if calibrated and calibration_ids is None and not (model_dir / "tokenizer.json").is_file():
        raise InvalidArgumentError(
            f"{method} calibration tokenizes its text with the model's tokenizer, and {model_dir} has no tokenizer.json; "
            f"add a tokenizer.json, give {_option('calibration_ids')} as token ids, or use --method rtn"
            + (" or --activations dynamic" if method == "fp8" and activations == "static" else "")
            + (f", or leave out {_option('kv_cache_scales')}" if kv_cache_scales else "")
        )
    tensors: dict[str, np.ndarray] = {}
    with Checkpoint(model_dir) as weights:
        missing = sorted(linears - set(weights.names))
        if missing:
            raise InvalidArgumentError(f"{model_dir}: the checkpoint lacks the linears {missing[:4]}{' ...' if len(missing) > 4 else ''}")
        ks = {name: weights.shape(name)[1] for name in sorted(linears)}  # the headers: no data read twice
        if group_size is None:
            group_size = common_group_size(ks.values())
            if group_size is None:
                raise InvalidArgumentError(
                    f"no group size of {'/'.join(map(str, GROUP_SIZES))} divides the K of every linear "
                    f"(K in {sorted(set(ks.values()))}); give one that does, or 0 (per channel)"
                )
        for name, k in ks.items():
            if group_size and k % group_size:
                fits = common_group_size(ks.values())
                hint = (
                    f"such as {fits}, which divides the K of every linear"
                    if fits
                    else f"of every linear's K ({sorted(set(ks.values()))}; none of {'/'.join(map(str, GROUP_SIZES))} is)"
                )
                raise InvalidArgumentError(f"{name}: K={k} is not a multiple of group_size={group_size}; choose a divisor {hint}, or 0 (per channel)")
            if method != "fp8" and (group_size or k) % GROUP_UNIT:
                fits = common_group_size(ks.values())
                hint = (
                    f"choose a group size that is, such as {fits}, which divides every linear's K"
                    if fits
                    else f"no group size of {'/'.join(map(str, GROUP_SIZES))} divides every linear's K ({sorted(set(ks.values()))})"
                )
                what = (
                    f"its whole row (K={k}, the one group of per-channel quantization, group_size 0)"
                    if not group_size
                    else f"group_size={group_size}"
                )
                raise InvalidArgumentError(
                    f"{name}: {what} is not a multiple of {GROUP_UNIT}, which trtcore's weight-only GEMM needs to run the checkpoint; {hint}"
                )
        if method != "fp8" and group_size not in (0, *VLLM_GROUP_SIZES):
            warnings.warn(
                f"group_size {group_size} runs in trtcore, but vLLM's Marlin kernels take group sizes {VLLM_GROUP_SIZES} or "
                "per channel (0): vLLM may not load this checkpoint",
                stacklevel=2,
            )
        if calibrated:  # a NaN or infinity would first surface as non-finite logits of the calibration run: name its tensor
            for name in weights.names:
                if not _all_finite(weights.get(name, copy=False)):
                    raise InvalidArgumentError(
                        f"{name}: the checkpoint's tensor holds a NaN or an infinity; {method} cannot calibrate or quantize it"
                    )
        plan = None
        amax: dict[str, float] = {}
        packed = family_of(config.model_type).packed_modules
        weight_amaxes: dict[str, float] = {}

        def weight_amax(name: str) -> float:  # per tensor: one scale per packed module (q/k/v, gate/up), the largest
            if name not in weight_amaxes:
                weight_amaxes[name] = float(np.abs(np.asarray(weights.get(name, copy=False), np.float64)).max(initial=0.0))
            return weight_amaxes[name]

        kv_amax: dict[str, float] = {}
        if method == "fp8" and (activations == "static" or kv_cache_scales):
            amax, kv_amax = fp8_calibration_amax(
                model_dir, calibration, calibration_tokens, calibration_ids, inputs=activations == "static", kv_cache=kv_cache_scales
            )
        for name, a in kv_amax.items():  # float32 scalars, at least the smallest normal (what the loader takes)
            tensors[name] = np.asarray(max(float(amax_scale(a)), KV_SCALE_MIN), dtype=np.float32)  # [] as input_scale
        if method == "awq":
            from .awq import awq_plan

            plan = awq_plan(
                model_dir,
                weights,
                lambda w: quantize_rtn(w, bits, group_size, symmetric).dequantize(),  # the scale search: min-max ranges
                calibration,
                calibration_tokens,
                token_ids=calibration_ids,
                progress=progress,
            )
        done: dict[str, dict[str, np.ndarray]] = {}  # GPTQ's linears, packed as they come
        if method == "gptq":
            from .gptq import DAMPENING_FRAC, FIRST_TOKEN_WEIGHT, gptq_linears, gptq_quantize

            damp = DAMPENING_FRAC if dampening_frac is None else dampening_frac
            first = FIRST_TOKEN_WEIGHT if first_token_weight is None else first_token_weight

            def gptq_one(w: np.ndarray, u: np.ndarray) -> QuantizedWeight:
                return gptq_quantize(w, u, lambda g: group_params(g, bits, symmetric, observer), bits, group_size, symmetric)

            for name, qw in gptq_linears(
                model_dir, weights, gptq_one, damp, calibration, calibration_tokens, calibration_ids, progress, first_token_weight=first
            ):
                done[name] = compressed_tensors_tensors(name.removesuffix(".weight"), qw)
        from tqdm.auto import tqdm

        for name in tqdm(weights.names, desc=f"quantize ({method})", unit="tensor", disable=not progress):
            if name in done:  # GPTQ read and packed it already
                tensors |= done.pop(name)
                continue
            value = weights.get(name)
            edited = value if plan is None else plan.apply(name, value)
            if name not in linears:
                tensors[name] = edited if edited is value else edited.astype(value.dtype)
                continue
            try:
                if method == "fp8":
                    scale = amax_scale(amax[name]) if amax else None
                    shared = max(weight_amax(n) for n in packed_siblings(name, packed) if n in linears) if strategy == "tensor" else None
                    tensors |= fp8_tensors(name.removesuffix(".weight"), quantize_weight(value, strategy, scale, amax=shared))
                    continue
                tensors |= compressed_tensors_tensors(name.removesuffix(".weight"), quantize_rtn(edited, bits, group_size, symmetric, observer))
            except InvalidArgumentError as exc:  # e.g. a NaN in the weight: name the tensor
                raise InvalidArgumentError(f"{name}: {exc}") from exc
    raw_config["quantization_config"] = (
        _fp8_config(strategy, activations) | ({"kv_cache_scheme": {**KV_CACHE_SCHEME, "symmetric": True}} if kv_cache_scales else {})
        if method == "fp8"
        else {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": bits,
                        "type": "int",
                        "symmetric": bool(symmetric),
                        "strategy": "group" if group_size else "channel",
                        "group_size": group_size or None,
                        "observer": observer,
                    },
                }
            },
            "ignore": ["lm_head"],
        }
    )
    with atomic_folder(output_dir, overwrite=overwrite) as tmp:
        for item in model_dir.iterdir():  # tokenizer, generation config, ...: copied as they are
            if item.is_file() and item.name not in _SKIP_FILES and not item.name.endswith(".safetensors"):
                shutil.copy2(item, tmp / item.name)
        (tmp / "config.json").write_text(json.dumps(raw_config, indent=2) + "\n")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    return output_dir


def common_group_size(ks: Iterable[int]) -> int | None:
    """The largest of :data:`GROUP_SIZES` dividing every K in ``ks`` (None: none does), so
    one group size fits every linear of a checkpoint (SmolLM2-135M: K=576 and 1536 take 64)."""
    ks = list(ks)
    return next((g for g in GROUP_SIZES if all(k % g == 0 for k in ks)), None)


def _fp8_config(strategy: str, activations: str) -> dict[str, Any]:
    """The compressed-tensors ``quantization_config`` of an FP8 checkpoint (module docstring)."""
    args = {"num_bits": 8, "type": "float", "symmetric": True, "observer": "minmax"}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": args | {"strategy": strategy, "dynamic": False},
                "input_activations": args
                | {"strategy": "token" if activations == "token" else "tensor", "dynamic": activations != "static"}
                | ({"observer": None} if activations != "static" else {}),
            }
        },
        "ignore": ["lm_head"],
    }
