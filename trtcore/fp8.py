"""FP8 (E4M3) quantization: the number format, scales, and trtcore's canonical FP8 linear weight.

E4M3 (OCP "8-bit Floating Point Specification (OFP8)" rev. 1.0, 2023; ``float8_e4m3fn`` in
ml_dtypes, PyTorch and safetensors' ``F8_E4M3``): 1 sign bit, 4 exponent bits (bias 7), 3
mantissa bits, no infinities, one NaN pattern per sign (``S.1111.111``); the largest finite
magnitude is ``1.75 * 2**8 = 448`` (:data:`E4M3_MAX`), the smallest subnormal ``2**-9``.

Quantizing a tensor ``x`` with a (positive, float32) scale ``s``, as TensorRT's FP8
``IQuantizeLayer`` and vLLM/llm-compressor's static FP8 schemes do::

    q = e4m3(clip(float32(x) / float32(s), -448, 448))       (division in float32, then
                                                              round to nearest, ties to even)
    dequantized value = float(q) * s

Scales (symmetric, "amax / 448"): per tensor ``s = max|w| / 448``; per output channel
(compressed-tensors' ``channel`` strategy) ``s[n] = max_k |w[n, k]| / 448``; an all-zero
tensor or row gets ``s = 1``. Activations use one static per-tensor scale from calibration
(``max|x| / 448`` over the calibration tokens) or, when none is given, a dynamic one computed
per call the same way from the call's own ``x`` (vLLM's ``activation_scheme: "dynamic"``): over
every row of the call, so in a batched step the sequences share it (and a padded row counts),
as in vLLM. Per-token dynamic activations (compressed-tensors' ``strategy: "token"``,
``dynamic: true``, llm-compressor's ``FP8_DYNAMIC`` scheme; vLLM's per-token FP8 path) give
each row ``m`` of ``x [M, K]`` (each token) its own scale ``s[m] = max_k |x[m, k]| / 448``
(float32, 1 for an all-zero row) and quantize the row with it, so a row's result does not
depend on the other rows of the call.

The product of an FP8 linear is ``y = (q_x * s_x) @ (q_w * s_w)^T``: :meth:`Fp8Weight.reference_linear`
computes it in float64, the contract every implementation (TensorRT's Q/DQ, the
``trtcore_fp8_gemm`` plugin's cuBLASLt FP8 GEMM) is held to.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .errors import InvalidArgumentError

#: largest finite E4M3 magnitude (OCP OFP8: S.1111.110 = 1.75 * 2**8)
E4M3_MAX = 448.0
#: the NumPy type of E4M3 values
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
#: weight-scale strategies (compressed-tensors' names): one scale, or one per output channel
WEIGHT_STRATEGIES = ("tensor", "channel")


def to_e4m3(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to E4M3 (nearest, ties to even) after saturating to ``[-448, 448]``
    (TensorRT's FP8 quantization saturates; a plain cast of a larger value would be NaN).

    Args:
        x: any float array (computed from its float32 values).

    Returns:
        ``uint8`` array of the same shape: the E4M3 bit patterns.
    """
    x32 = np.asarray(x, dtype=np.float32)
    return np.clip(x32, -E4M3_MAX, E4M3_MAX).astype(E4M3).view(np.uint8)


#: the float64 value of each of the 256 E4M3 bit patterns (ml_dtypes' decoding)
_VALUES = np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float64)


def from_e4m3(bits: np.ndarray) -> np.ndarray:
    """E4M3 bit patterns (``uint8``) as ``float64`` values (a table lookup)."""
    return _VALUES[np.asarray(bits, dtype=np.uint8)]


def amax_scale(amax: np.ndarray | float) -> np.ndarray:
    """``amax / 448`` as float32, 1 where ``amax`` is 0 (the scale of a tensor whose largest
    magnitude is ``amax``).

    Raises:
        InvalidArgumentError: a negative or non-finite ``amax``.
    """
    a = np.asarray(amax, dtype=np.float64)
    if not np.isfinite(a).all() or (a < 0).any():
        raise InvalidArgumentError(f"amax must be finite and >= 0, got {a.min() if a.size else a}..{a.max() if a.size else a}")
    return np.where(a > 0, a / E4M3_MAX, 1.0).astype(np.float32)


def quantize(x: np.ndarray, scale: np.ndarray | float) -> np.ndarray:
    """E4M3 bit patterns of ``float32(x) / float32(scale)`` (``scale`` broadcasts against ``x``;
    module docstring)."""
    return to_e4m3(np.asarray(x, np.float32) / np.asarray(scale, np.float32))


@dataclass(frozen=True)
class Fp8Weight:
    """An FP8 (E4M3) ``[N, K]`` linear weight with its scales (``y = x @ W.T``).

    Attributes:
        weight: ``uint8 [N, K]`` E4M3 bit patterns.
        weight_scale: ``float32 [1]`` (per tensor) or ``float32 [N]`` (per output channel), > 0.
        input_scale: ``float32 [1]``: the activations' static per-tensor scale, or None
            (dynamic: ``max|x| / 448`` of each call's x).
        per_token: dynamic per-token activation scales (``max|x[m, :]| / 448`` for each row
            ``m``; needs ``input_scale`` None), else one scale per call (module docstring).

    Raises:
        InvalidArgumentError: a field's dtype or shape is wrong, a scale is not positive and
            finite, the weight holds a NaN pattern (the message names the field), or
            ``per_token`` comes with a static ``input_scale``.
    """

    weight: np.ndarray
    weight_scale: np.ndarray
    input_scale: np.ndarray | None = None
    per_token: bool = False

    def __post_init__(self) -> None:
        w = self.weight
        if not isinstance(w, np.ndarray) or w.dtype != np.uint8 or w.ndim != 2:
            raise InvalidArgumentError(
                f"Fp8Weight.weight must be uint8 [N, K] E4M3 bits, got {getattr(w, 'dtype', type(w))} {getattr(w, 'shape', '')}"
            )
        nan = np.argwhere((w & 0x7F) == 0x7F)
        if nan.size:
            raise InvalidArgumentError(
                f"Fp8Weight.weight holds an E4M3 NaN pattern (0x7f / 0xff) at {tuple(int(i) for i in nan[0])} ({len(nan)} such)"
            )
        n = w.shape[0]
        s = self.weight_scale
        if not isinstance(s, np.ndarray) or s.dtype != np.float32 or s.shape not in ((1,), (n,)):
            raise InvalidArgumentError(
                f"Fp8Weight.weight_scale must be float32 [1] or [{n}], got {getattr(s, 'dtype', type(s))} {getattr(s, 'shape', '')}"
            )
        _check_positive("Fp8Weight.weight_scale", s)
        i = self.input_scale
        if i is not None:
            if not isinstance(i, np.ndarray) or i.dtype != np.float32 or i.shape != (1,):
                raise InvalidArgumentError(
                    f"Fp8Weight.input_scale must be None or float32 [1], got {getattr(i, 'dtype', type(i))} {getattr(i, 'shape', '')}"
                )
            _check_positive("Fp8Weight.input_scale", i)
            if self.per_token:
                raise InvalidArgumentError("Fp8Weight: per_token activation scales are dynamic; input_scale must be None")

    @property
    def shape(self) -> tuple[int, int]:
        """``(N, K)``."""
        return (int(self.weight.shape[0]), int(self.weight.shape[1]))

    @property
    def per_channel(self) -> bool:
        """Whether the weight has one scale per output channel."""
        return self.weight_scale.shape[0] != 1

    def dequantize(self) -> np.ndarray:
        """``float64 [N, K]``: ``e4m3(weight) * weight_scale`` (per row or for all); computed
        once per object (read-only)."""
        cached = self.__dict__.get("_dequantized")
        if cached is None:
            cached = from_e4m3(self.weight) * self.weight_scale.astype(np.float64)[:, None]
            cached.flags.writeable = False
            object.__setattr__(self, "_dequantized", cached)
        return cached

    def activation_scale(self, x: np.ndarray) -> np.ndarray:
        """The scale x ``[..., K]`` is quantized with, float32: ``input_scale`` ``[1]``, or
        (dynamic) ``max|x| / 448`` ``[1]``, or (``per_token``) ``max_k |x[..., k]| / 448``
        ``[..., 1]``, one per row (1 for an all-zero row or tensor)."""
        if self.input_scale is not None:
            return self.input_scale
        a = np.abs(np.asarray(x, np.float32))
        if self.per_token:
            return amax_scale(a.max(axis=-1, keepdims=True, initial=0.0))
        return amax_scale(a.max(initial=0.0)).reshape(1)

    def reference_linear(self, x: np.ndarray) -> np.ndarray:
        """``float64 [..., N]``: ``(e4m3(x / s_x) * s_x) @ dequantize()^T`` (module docstring;
        ``s_x`` per row when ``per_token``).

        Raises:
            InvalidArgumentError: x's last dimension is not K.
        """
        x = np.asarray(x)
        n, k = self.shape
        if x.shape[-1:] != (k,):
            raise InvalidArgumentError(f"FP8 linear: x {x.shape} must end in K={k}")
        s_x = self.activation_scale(x)
        xq = from_e4m3(quantize(x, s_x)) * s_x.astype(np.float64)
        return (xq.reshape(-1, k) @ self.dequantize().T).reshape(*x.shape[:-1], n)


def _check_positive(name: str, s: np.ndarray) -> None:
    bad = np.flatnonzero(~(np.isfinite(s) & (s > 0)))
    if bad.size:
        raise InvalidArgumentError(f"{name} must be positive and finite, got {s.flat[bad[0]]} at index {bad[0]} ({bad.size} of {s.size} such)")


def quantize_weight(
    weight: np.ndarray,
    strategy: str = "channel",
    input_scale: float | np.ndarray | None = None,
    per_token: bool = False,
    amax: float | None = None,
) -> Fp8Weight:
    """FP8 quantization of one ``[N, K]`` weight with amax scales (module docstring).

    Args:
        weight: ``[N, K]``, any float dtype (amax taken in float64).
        strategy: ``"tensor"`` (one scale) or ``"channel"`` (one per output row).
        input_scale: the activations' static scale (e.g. :func:`amax_scale` of calibration
            amax), or None for dynamic activation scales.
        per_token: dynamic per-token activation scales (input_scale None).
        amax: ``"tensor"`` only: the amax of the one scale, at least ``max|weight|`` (a packed
            module's: the largest of its linears', so that they share the scale, as vLLM
            quantizes a fused ``qkv_proj`` at load); None: ``max|weight|``.

    Raises:
        InvalidArgumentError: unknown strategy, per_token with an input_scale, not a 2-D weight,
            a non-finite weight or scale, an ``amax`` with ``"channel"`` or below ``max|weight|``.
    """
    if strategy not in WEIGHT_STRATEGIES:
        raise InvalidArgumentError(f"FP8 weight strategy {strategy!r} is not one of {WEIGHT_STRATEGIES}")
    w = np.asarray(weight, dtype=np.float64)
    if w.ndim != 2:
        raise InvalidArgumentError(f"quantize_weight takes a [N, K] weight, got shape {w.shape}")
    if not np.isfinite(w).all():
        raise InvalidArgumentError("the weight holds a NaN or an infinity; it cannot be quantized")
    a = np.abs(w)
    if amax is not None and (strategy != "tensor" or not amax >= a.max(initial=0.0)):
        raise InvalidArgumentError(f"quantize_weight: amax {amax} needs strategy 'tensor' and at least max|weight| = {a.max(initial=0.0)}")
    scale = amax_scale(a.max(axis=1) if strategy == "channel" else np.array([a.max(initial=0.0) if amax is None else amax]))
    codes = quantize(w.astype(np.float32), scale[:, None])
    inp = None if input_scale is None else np.asarray(input_scale, np.float32).reshape(1)
    return Fp8Weight(codes, scale, inp, per_token)


def share_tensor_scale(parts: list[Fp8Weight]) -> list[Fp8Weight]:
    """The FP8 linears of one fused module (q/k/v, gate/up: vLLM's packed modules) with one
    per-tensor weight scale, the largest of theirs, so that they run as one GEMM.

    vLLM loads such modules the same way (``requantize_with_max_scale`` in its w8a8 utilities;
    TensorRT-LLM's FP8 checkpoints take the maximum of q/k/v's scales for its fused qkv): a part
    whose scale is smaller is dequantized and quantized again with the largest (its codes round
    once more; the largest scale saturates nothing), a part whose scale is already the largest
    keeps its codes. Static input scales become their largest too (the parts read one x, so a
    calibration gives them equal scales; vLLM takes the maximum). A part whose codes are all
    zero takes no part in the maximum (its scale, 1 from :func:`amax_scale`, says nothing about
    the others' range); its codes stay zero.

    Args:
        parts: the module's linears, in order.

    Returns:
        ``parts`` as they are when any has per-channel scales, the parts' activation schemes
        differ (static against dynamic, per token or not), every part is zero or their scales
        are already equal; else new :class:`Fp8Weight` objects with one ``weight_scale`` and
        ``input_scale``.
    """
    if len(parts) < 2 or any(p.per_channel for p in parts):
        return parts
    if len({(p.input_scale is None, p.per_token) for p in parts}) != 1:
        return parts
    inputs = [float(p.input_scale[0]) for p in parts if p.input_scale is not None]
    if len({float(p.weight_scale[0]) for p in parts}) == 1 and len(set(inputs)) < 2:
        return parts  # one scale already (what trtcore quantize writes): no pass over the codes
    nonzero = [float(p.weight_scale[0]) for p in parts if (p.weight & 0x7F).any()]
    if not nonzero:
        return parts
    scale = max(nonzero)
    ws = np.array([scale], np.float32)
    xs = np.array([max(inputs)], np.float32) if inputs else None
    out = []
    codes = np.arange(256, dtype=np.uint8)
    for p in parts:
        # a code's new code depends on nothing else: one lookup in the 256 patterns requantized
        table = quantize(from_e4m3(codes) * p.weight_scale.astype(np.float64)[0], ws)
        out.append(Fp8Weight(p.weight if p.weight_scale[0] == scale else table[p.weight], ws, xs, p.per_token))
    return out


__all__ = [
    "E4M3",
    "E4M3_MAX",
    "WEIGHT_STRATEGIES",
    "Fp8Weight",
    "amax_scale",
    "from_e4m3",
    "quantize",
    "quantize_weight",
    "share_tensor_scale",
    "to_e4m3",
]
