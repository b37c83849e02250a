"""FP8 (E4M3) linear: the ``trtcore_fp8_gemm`` plugin, cuBLASLt's FP8 GEMM on Hopper / Ada.

``y[..., N] = (e4m3(x / s_x) * s_x) @ (W * s_w)^T`` for an :class:`trtcore.fp8.Fp8Weight`
(E4M3 weight, per-tensor or per-output-channel scales; the activations quantized with a
static per-tensor scale, a dynamic one, ``max|x| / 448`` of the call's x, or -- ``per_token``
-- one dynamic scale per row, ``s[m] = max|x[m, :]| / 448``).

:meth:`Fp8GemmPlugin.enqueue` (compute capability 8.9+; ``kernels/fp8_gemm.cu``):

1. dynamic scale only: ``trtcore_fp8_zero`` and ``trtcore_fp8_amax`` (``max|x|`` into the
   workspace);
2. ``trtcore_fp8_quantize``: x to E4M3 in the workspace, the scale used beside it, and
   cuBLASLt's device ``alpha = s_x * s_w`` (per-channel weights: ``alpha = s_x``) and
   ``beta = 0`` in the workspace's scalars (computed on the device on every call: a dynamic
   ``s_x`` exists only there);
3. cuBLASLt's FP8 GEMM (:class:`trtcore.cuda.cublaslt.Fp8Matmul`, TN, float32 accumulation,
   no A/B scale pointers -- cuBLASLt 13.1 refused them on the H200 -- but
   ``CUBLASLT_POINTER_MODE_DEVICE`` with that alpha and beta):
   per-tensor weights straight into the output (bfloat16 / float16 / float32); per-channel
   weights into a float32 buffer that ``trtcore_fp8_scale_rows`` scales by ``s_w[n]`` and
   rounds into the output.

Per-token activations (``per_token``) replace steps 1-2 by ``trtcore_fp8_quantize_tokens`` (one
block per row: the row's ``max|x[m, :]|``, its scale ``s[m]`` into the workspace, the row's E4M3
codes, and ``alpha = 1``, ``beta = 0``); the GEMM writes the float32 buffer, and
``trtcore_fp8_scale_tokens`` rounds ``d[m, n] * (s[m] * s_w)`` (``s_w[n]`` or the one ``s_w``)
into the output.

Prequantized (``prequantized``, made by the cuda engine's compile pass
:mod:`trtcore.cuda.fp8_input_fusion`, never by a network): input 0 holds the E4M3 codes
``e4m3(clip(x / s_x, -448, 448))`` of a static-scale linear's x, computed by the kernel that
produces x, and input 4 the constant ``[alpha, 0]`` (:meth:`Fp8GemmPlugin.alpha_beta`: the
quantize kernel's ``alpha = s_x * s_w``, or ``s_x`` per channel); enqueue runs only the GEMM (and
the per-channel epilogue), with the same numbers as the plugin that quantizes x itself.

Workspace (:meth:`Fp8GemmPlugin.workspace_size`): 256 bytes of scalars (amax bits at 0, x's
scale at 4, alpha and beta at :data:`_ALPHA` and 4 past it), ``M * K`` E4M3 bytes, ``M * N``
float32 (per-channel or per-token), ``M`` float32 row scales (per-token), and
:data:`LT_WORKSPACE` bytes for cuBLASLt, each 256-byte aligned. ``K`` and ``N`` must be
multiples of 16 (cuBLASLt's FP8 operands: 16-byte aligned leading dimensions; PyTorch's
``_scaled_mm`` asks the same).

Numerical contract: :meth:`Fp8GemmPlugin.reference` is :meth:`trtcore.fp8.Fp8Weight.reference_linear`
(float64) rounded once to x's dtype; the GPU agrees with it exactly on the E4M3 codes of x and
to the tensor cores' FP8 accumulation error on the product (on the H200 about ``2**-12`` of
``max|y|``, see :data:`trtcore.cuda.cublaslt.FP8_ACCUMULATION_RTOL`), plus one float32 rounding
of ``alpha = s_x * s_w`` (per-channel: of the unscaled sum; per-token: of the unscaled sum and
of ``s[m] * s_w``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import ml_dtypes
import numpy as np

from trtcore.dtypes import KERNEL_DTYPE_CODES, lookup
from trtcore.fp8 import Fp8Weight

from .base import DeviceTensor, LinearShapes, Plugin, PluginError
from .launcher import KernelLauncher

__all__ = ["LT_WORKSPACE", "Fp8GemmPlugin"]

_UINT8 = np.dtype(np.uint8)
_FLOAT32 = np.dtype(np.float32)
#: what a prequantized plugin's x may be: E4M3 bits (uint8) or ml_dtypes' E4M3 type
_CODE_DTYPES = (_UINT8, np.dtype(ml_dtypes.float8_e4m3fn))
#: a prequantized plugin's output dtype codes (``out_dtype``) -> the dtypes
_OUT_DTYPES = {code: d for d, code in KERNEL_DTYPE_CODES.items()}
#: bytes of cuBLASLt workspace in the plugin's workspace
LT_WORKSPACE = 8 << 20
_ALIGN = 256
_THREADS = 256
#: byte offset of cuBLASLt's device alpha (beta 4 bytes after it) in the workspace's scalars
_ALPHA = 16


def _up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclass
class Fp8GemmPlugin(LinearShapes, Plugin):
    """``y = fp8(x) @ fp8(W)^T`` (plugin ``trtcore_fp8_gemm``, version 1, namespace ``trtcore``).

    Inputs (make them with :meth:`from_fp8`):

    ===  ============  =====================  ===========================================
    #    name          shape                  dtype
    ===  ============  =====================  ===========================================
    0    x             ``[..., K]``           float16, bfloat16 or float32
    1    weight        ``[N, K]``             uint8 (E4M3 bits)
    2    weight_scale  ``[1]`` or ``[N]``     float32 (``[N]`` when ``per_channel``)
    3    input_scale   ``[1]``                float32, only when ``static_input``
    4    alpha_beta    ``[2]``                float32, only when ``prequantized``
    ===  ============  =====================  ===========================================

    Output: ``y [..., N]`` of x's dtype (``prequantized``: of ``out_dtype``; x is then uint8
    E4M3 codes).

    Fields:
        in_features: K (a multiple of 16). out_features: N (a multiple of 16).
        per_channel: one weight scale per output channel (else one for all).
        static_input: the activation scale is input 3 (else dynamic, ``max|x| / 448``).
        per_token: dynamic per-token activation scales (``max|x[m, :]| / 448`` per row; needs
            ``static_input`` False).
        prequantized: x arrives as its E4M3 codes under the static input scale (module
            docstring; needs ``static_input``).
        out_dtype: the output's dtype when ``prequantized``, as its kernel code (``DTYPE`` of
            the kernels, :data:`trtcore.dtypes.KERNEL_DTYPE_CODES`: 0 float32, 1 float16, 2
            bfloat16); -1 otherwise.
    """

    plugin_name: ClassVar[str] = "trtcore_fp8_gemm"
    plugin_version: ClassVar[str] = "1"
    num_outputs: ClassVar[int] = 1

    in_features: int
    out_features: int
    per_channel: bool = False
    static_input: bool = True
    per_token: bool = False
    prequantized: bool = False
    out_dtype: int = -1

    _OPTIONAL_FIELDS: ClassVar[dict[str, Any]] = {"per_token": False, "prequantized": False, "out_dtype": -1}

    def validate(self) -> None:
        if self.per_token and self.static_input:
            raise PluginError("Fp8GemmPlugin: per_token activation scales are dynamic; static_input must be False")
        if self.prequantized and not self.static_input:
            raise PluginError("Fp8GemmPlugin: prequantized x needs a static input scale (static_input True)")
        if self.prequantized and self.out_dtype not in _OUT_DTYPES:
            raise PluginError(
                f"Fp8GemmPlugin: a prequantized plugin's out_dtype must be a kernel dtype code {sorted(_OUT_DTYPES)}, got {self.out_dtype!r}"
            )
        if self.in_features <= 0 or self.in_features % 16:
            raise PluginError(f"Fp8GemmPlugin.in_features must be a positive multiple of 16 (cuBLASLt FP8), got {self.in_features!r}")
        if self.out_features <= 0 or self.out_features % 16:
            raise PluginError(f"Fp8GemmPlugin.out_features must be a positive multiple of 16 (cuBLASLt FP8), got {self.out_features!r}")

    @classmethod
    def from_fp8(cls, fw: Fp8Weight) -> tuple[Fp8GemmPlugin, list[np.ndarray]]:
        """The plugin for ``fw`` and its constant inputs (weight, weight_scale[, input_scale])."""
        n, k = fw.shape
        plugin = cls(k, n, fw.per_channel, fw.input_scale is not None, fw.per_token)
        consts = [fw.weight, fw.weight_scale] + ([fw.input_scale] if fw.input_scale is not None else [])
        return plugin, consts

    def prequantized_for(self, out_dtype: Any) -> Fp8GemmPlugin:
        """This static-scale linear as it reads x's E4M3 codes (``prequantized``), x being of
        ``out_dtype`` (float16, bfloat16 or float32).

        Raises:
            PluginError: dynamic or per-token activation scales, or already prequantized.
        """
        if not self._static_quantize:
            raise PluginError("Fp8GemmPlugin.prequantized_for: only a static-scale plugin that quantizes x itself can read codes")
        d = np.dtype(out_dtype)
        if d not in KERNEL_DTYPE_CODES:
            raise PluginError(f"Fp8GemmPlugin.prequantized_for: out_dtype must be float16, bfloat16 or float32, got {d}")
        return dataclasses.replace(self, prequantized=True, out_dtype=KERNEL_DTYPE_CODES[d])

    def static_fp8_input_scale(self, constants: Sequence[np.ndarray]) -> np.ndarray | None:
        """The static input scale (float32 ``[1]``, constant input 3) when this plugin quantizes
        x itself with it and can read the codes instead (:meth:`prequantized_for`), else None:
        the hook of the cuda engine's :mod:`trtcore.cuda.fp8_input_fusion`."""
        return np.asarray(constants[2], np.float32).reshape(-1)[:1] if self._static_quantize else None

    @property
    def _static_quantize(self) -> bool:
        """Whether enqueue quantizes x itself with the static input scale (what a prequantized
        form can take over)."""
        return self.static_input and not self.per_token and not self.prequantized

    def alpha_beta(self, constants: Sequence[np.ndarray]) -> np.ndarray:
        """The prequantized plugin's input 4 from the constant inputs (weight, weight_scale,
        input_scale): float32 ``[s_x * s_w, 0]`` (the float32 product, as the quantize kernel
        forms it) per tensor, ``[s_x, 0]`` per channel (the epilogue applies ``s_w[n]``)."""
        s_x = np.float32(np.asarray(constants[2], np.float32).reshape(-1)[0])
        alpha = s_x if self.per_channel else np.float32(s_x * np.float32(np.asarray(constants[1], np.float32).reshape(-1)[0]))
        return np.array([alpha, 0.0], np.float32)

    def row_fusion_key(self, constants: Sequence[np.ndarray]) -> Any:
        """FP8 linears stack along N (q/k/v, gate/up) where the product of each output row is
        unchanged: the same K and activation scheme and, for static activations, the same
        input scale (q/k/v calibrated on one input have it), with per-channel weight scales
        or one per-tensor weight scale equal in all (compared by value); see :meth:`fuse_rows`."""
        if self.prequantized:
            return None
        arrays = [np.asarray(c, np.float32) for c in constants[1:]]
        per_tensor = b"" if self.per_channel else arrays[0].tobytes()
        static = arrays[1].tobytes() if self.static_input else b""
        return (self.in_features, self.per_channel, self.static_input, self.per_token, per_tensor, static)

    @classmethod
    def fuse_rows(cls, parts: Sequence[tuple[Plugin, Sequence[np.ndarray]]]) -> tuple[Fp8GemmPlugin, list[np.ndarray]]:
        """The E4M3 weights of ``parts`` (equal :meth:`row_fusion_key`) stacked along N, their
        per-channel scales too (one per-tensor scale is shared), the input scale shared."""
        plugins = [p for p, _ in parts]
        if not all(isinstance(p, Fp8GemmPlugin) for p in plugins) or len({p.row_fusion_key(c) for p, c in parts}) != 1:
            raise PluginError("Fp8GemmPlugin.fuse_rows: the parts differ in K, scales or activation scheme")
        first, consts = plugins[0], parts[0][1]
        weight = np.concatenate([np.asarray(c[0]) for _, c in parts])
        scale = np.concatenate([np.asarray(c[1], np.float32).reshape(-1) for _, c in parts]) if first.per_channel else np.asarray(consts[1])
        fused = dataclasses.replace(first, out_features=int(weight.shape[0]))
        return fused, [weight, scale] + ([np.asarray(consts[2])] if first.static_input else [])

    @property
    def num_inputs(self) -> int:
        return 3 + int(self.static_input) + int(self.prequantized)

    def _constant_dtypes(self) -> list[np.dtype]:
        return [_UINT8] + [_FLOAT32] * (self.num_inputs - 2)

    def _check_count(self, n: int) -> None:
        if n != self.num_inputs:
            names = "x, weight, weight_scale" + ", input_scale" * self.static_input + ", alpha_beta" * self.prequantized
            raise PluginError(f"Fp8GemmPlugin takes {self.num_inputs} inputs ({names}), got {n}")

    def output_dtypes(self, input_dtypes: Sequence[np.dtype]) -> list[np.dtype]:
        if not self.prequantized:
            return super().output_dtypes(input_dtypes)
        self._check_count(len(input_dtypes))
        if np.dtype(input_dtypes[0]) not in _CODE_DTYPES:
            raise PluginError(f"Fp8GemmPlugin (prequantized): x must be E4M3 codes (uint8 or float8_e4m3fn), got {np.dtype(input_dtypes[0])}")
        return [_OUT_DTYPES[self.out_dtype]]

    def supports(self, pos: int, dtypes: Sequence[np.dtype], num_inputs: int) -> bool:
        if self.prequantized and pos == 0:  # the codes
            return num_inputs == self.num_inputs and np.dtype(dtypes[0]) in _CODE_DTYPES
        if self.prequantized and pos >= num_inputs:  # the output
            return num_inputs == self.num_inputs and np.dtype(dtypes[pos]) == _OUT_DTYPES[self.out_dtype]
        return super().supports(pos, dtypes, num_inputs)

    # --- numerics (the contract) -----------------------------------------------------------------

    def fp8_weight(self, *constants: np.ndarray) -> Fp8Weight:
        """The :class:`Fp8Weight` the constant inputs hold (made once while the same arrays
        come back, as the reference backend's constants do: its dequantized weight is reused)."""
        want = 2 + int(self.static_input)  # weight, weight_scale[, input_scale] (not alpha_beta)
        if len(constants) != want:
            raise PluginError(
                f"Fp8GemmPlugin: expected {want} constant inputs (weight, weight_scale{', input_scale' * self.static_input}), got {len(constants)}"
            )

        def make(arrays: list[np.ndarray]) -> Fp8Weight:
            w, s = arrays[0], arrays[1].astype(np.float32).reshape(-1)
            return Fp8Weight(w, s, arrays[2].astype(np.float32).reshape(1) if self.static_input else None, self.per_token)

        return self.from_constants(constants, make)

    def reference(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """float64 NumPy (:meth:`trtcore.fp8.Fp8Weight.reference_linear`) rounded once to x's dtype.

        Raises:
            PluginError: wrong input count or x's last dimension is not in_features.
        """
        self._check_count(len(inputs))
        x = np.asarray(inputs[0])
        if x.shape[-1:] != (self.in_features,):
            raise PluginError(f"Fp8GemmPlugin: x {x.shape} must end in in_features={self.in_features}")
        if self.prequantized:  # the values the codes stand for: code * s_x, which quantize back to the same codes
            s_x = np.float64(np.asarray(inputs[3], np.float32).reshape(-1)[0])
            values = np.asarray(x).view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64) * s_x
            return [self.fp8_weight(*inputs[1:4]).reference_linear(values).astype(_OUT_DTYPES[self.out_dtype])]
        return [self.fp8_weight(*inputs[1:]).reference_linear(x).astype(x.dtype)]

    # --- GPU ---------------------------------------------------------------------------------------

    def _layout(self, m: int) -> tuple[int, int, int, int, int]:
        """Workspace offsets ``(xq, d32, rows, lt, total)`` for ``m`` rows (scalars at 0: amax,
        scale; ``rows``: the per-token scales)."""
        xq = _ALIGN
        d32 = xq + (0 if self.prequantized else _up(m * self.in_features))
        rows = d32 + (_up(m * self.out_features * 4) if self.per_channel or self.per_token else 0)
        lt = rows + (_up(m * 4) if self.per_token else 0)
        return xq, d32, rows, lt, lt + LT_WORKSPACE

    def workspace_size(self, inputs: Sequence[tuple[tuple[int, ...], np.dtype]], outputs: Sequence[tuple[tuple[int, ...], np.dtype]]) -> int:
        m = int(np.prod(inputs[0][0][:-1], dtype=np.int64))
        return self._layout(m)[4]

    def enqueue(self, inputs: Sequence[DeviceTensor], outputs: Sequence[DeviceTensor], workspace: int, stream: int) -> None:
        """Quantize x, then cuBLASLt's FP8 GEMM (module docstring); on ``stream``, no allocation,
        no sync.

        Raises:
            PluginError: unsupported dtype or no workspace.
        """
        self._check_count(len(inputs))
        x, out = inputs[0], outputs[0]
        dtype = np.dtype(out.dtype) if self.prequantized else np.dtype(x.dtype)
        if dtype not in KERNEL_DTYPE_CODES:
            raise PluginError(f"Fp8GemmPlugin.enqueue: x dtype {dtype} not supported")
        m = int(np.prod(x.shape[:-1], dtype=np.int64))
        if m == 0:
            return
        if not workspace:
            raise PluginError("Fp8GemmPlugin.enqueue: no workspace given (see workspace_size)")
        n, k = self.out_features, self.in_features
        xq_off, d_off, rows_off, lt_off, _ = self._layout(m)
        amax, scale, alpha = workspace, workspace + 4, workspace + _ALPHA
        defines = (("DTYPE", KERNEL_DTYPE_CODES[dtype]),)
        if self.per_token:
            rows = workspace + rows_off
            args = [(x.ptr, "ptr"), (k, "i32"), (rows, "ptr"), (alpha, "ptr"), (workspace + xq_off, "ptr")]
            _launch(defines, "trtcore_fp8_quantize_tokens", (m,), (_THREADS,), args, stream)
            _matmul().run(
                m, n, k, inputs[1].ptr, workspace + xq_off, alpha, alpha + 4, workspace + d_off, 0, workspace + lt_off, LT_WORKSPACE, stream
            )
            args = [
                (workspace + d_off, "ptr"),
                (rows, "ptr"),
                (inputs[2].ptr, "ptr"),
                (int(self.per_channel), "i32"),
                (m * n, "i64"),
                (n, "i32"),
                (out.ptr, "ptr"),
            ]
            _launch(defines, "trtcore_fp8_scale_tokens", (max(1, min(1024, -(-m * n // _THREADS))),), (_THREADS,), args, stream)
            return
        if self.prequantized:  # x holds the codes, input 4 alpha and beta
            xq, alpha = x.ptr, inputs[4].ptr
        else:
            xq = workspace + xq_off
            blocks = max(1, min(1024, -(-m * k // (8 * _THREADS))))  # 8 elements per thread (the kernels' vectorized loop)
            if not self.static_input:
                _launch(defines, "trtcore_fp8_zero", (1,), (32,), [(amax, "ptr")], stream)
                _launch(defines, "trtcore_fp8_amax", (blocks,), (_THREADS,), [(x.ptr, "ptr"), (m * k, "i64"), (amax, "ptr")], stream)
            static = inputs[3].ptr if self.static_input else 0
            w_scale = 0 if self.per_channel else inputs[2].ptr  # per-channel: alpha = s_x, the epilogue scales
            args = [(x.ptr, "ptr"), (m * k, "i64"), (static, "ptr"), (amax, "ptr"), (w_scale, "ptr"), (scale, "ptr"), (alpha, "ptr")]
            _launch(defines, "trtcore_fp8_quantize", (blocks,), (_THREADS,), args + [(xq, "ptr")], stream)
        target, out_type = (workspace + d_off, 0) if self.per_channel else (out.ptr, lookup(dtype).cuda_data_type)
        _matmul().run(m, n, k, inputs[1].ptr, xq, alpha, alpha + 4, target, out_type, workspace + lt_off, LT_WORKSPACE, stream)
        if self.per_channel:
            args = [(workspace + d_off, "ptr"), (inputs[2].ptr, "ptr"), (m * n, "i64"), (n, "i32"), (out.ptr, "ptr")]
            _launch(defines, "trtcore_fp8_scale_rows", (max(1, min(1024, -(-m * n // _THREADS))),), (_THREADS,), args, stream)


_KERNELS = KernelLauncher("fp8_gemm")
_launch = _KERNELS.launch


def _matmul() -> Any:
    """This thread's cuBLASLt FP8 matmul (:func:`trtcore.cuda.cublaslt.thread_linear`). Fast
    accumulation (:class:`trtcore.cuda.cublaslt.Fp8Matmul`) with ``TRTCORE_FP8_FAST_ACCUM=1``
    in the environment (an experiment's switch: off by default)."""
    import os

    from trtcore.cuda.cublaslt import R_8F_E4M3, thread_linear

    return thread_linear(R_8F_E4M3, fast_accum=os.environ.get("TRTCORE_FP8_FAST_ACCUM") == "1")
