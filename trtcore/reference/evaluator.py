"""Executes a reference network layer by layer on NumPy (CPU) or CuPy (GPU).

Numerics follow TensorRT's strongly typed semantics: each layer's output is stored in the
output tensor's type. float16/bfloat16 layers compute in float32 and round the result to
their type once (as TensorRT's kernels accumulate in float32), so the only rounding is at
layer boundaries; a fused ``IAttention`` is one layer (scores, softmax and the weighted sum
in float32, one rounding of its output). Every intermediate tensor can be captured by name.

``IKVCacheUpdateLayer`` writes into its cache input's array in place and returns that array,
as TensorRT binds the cache input and the updated-cache output to the same memory: a cache
fed as a NumPy (or device) array is modified by the run.

Storage of each :class:`DataType` in the array module ``xp``:

=================  ==========================  ==========================================
DataType           ``xp`` is NumPy              any other ``xp`` (CuPy)
=================  ==========================  ==========================================
FLOAT / HALF       float32 / float16            float32 / float16
BF16               ``ml_dtypes.bfloat16``       ``uint16`` holding the bfloat16 bit pattern
INT8/32/64, BOOL   the NumPy type               the same type
=================  ==========================  ==========================================

CuPy has no bfloat16 dtype, so there a bfloat16 tensor is its raw 16-bit pattern in a
``uint16`` array: exactly the memory TensorRT and trtcore's CUDA kernels read and write
(``__nv_bfloat16``), so plugins get it unchanged. For arithmetic the bits become float32 by
``(u16.astype(uint32) << 16).view(float32)`` (exact), and float32 results become bfloat16
by round-to-nearest-even in integer arithmetic (:func:`float32_to_bf16_bits`; NaN becomes
the quiet NaN ``0x7FC0`` with its sign, as ``ml_dtypes`` does), so the GPU path rounds
bit for bit like the NumPy path. Layers that only move data (shuffle, concatenation,
gather, select, identity) move the stored bits without converting them. Outputs and
captured tensors are returned in this storage; :func:`trtcore.runtime.device.to_host`
turns a bfloat16 ``uint16`` array back into ``ml_dtypes.bfloat16`` on the host. The
helpers :func:`bf16_bits_to_float32` / :func:`float32_to_bf16_bits` work with any ``xp``
(NumPy included) so they can be tested against ``ml_dtypes`` on the CPU; on CuPy each is
one fused elementwise kernel with the same integer arithmetic.

On CuPy nothing in :func:`evaluate` reads device memory from the host, so a whole network
is queued on the current stream without a host synchronisation: constants are copied to the
device once (the ``constants`` cache), plugins are launched with ``enqueue`` on the current
stream, erf uses ``cupyx.scipy.special.erf``, and the gather index range check, which needs
the indices on the host, is skipped (see :func:`_gather`). One numerical difference remains:
CuPy's kernels flush float32 subnormals (|x| < 2^-126) to zero in arithmetic (seen on the
H200: ``sign``/``abs`` of a subnormal give 0), where NumPy keeps them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..dims import Dim
from ..dtypes import storage_dtype
from ..errors import NetworkError
from .network import (
    IActivationLayer,
    IAttention,
    ICastLayer,
    IConcatenationLayer,
    IConstantLayer,
    IElementWiseLayer,
    IGatherLayer,
    IIdentityLayer,
    IKVCacheUpdateLayer,
    ILayer,
    IMatrixMultiplyLayer,
    INetworkDefinition,
    IPluginV3Layer,
    IReduceLayer,
    ISelectLayer,
    IShuffleLayer,
    ISoftMaxLayer,
    IUnaryLayer,
    _axes,
)
from .types import (
    FLOATING,
    ActivationType,
    AttentionNormalizationOp,
    CausalMaskKind,
    DataType,
    ElementWiseOperation,
    MatrixOperation,
    ReduceOperation,
    UnaryOperation,
    from_numpy_dtype,
    nptype,
)


def _is_device(xp: Any) -> bool:
    """Whether ``xp`` is CuPy (arrays on a CUDA device)."""
    return getattr(xp, "__name__", "") == "cupy"


# ---------------------------------------------------------------------------------------
# bfloat16 as uint16 bit patterns (any array module)
# ---------------------------------------------------------------------------------------


#: on CuPy each conversion is one fused kernel (the generic array expressions below would
#: launch up to 13 kernels per tensor); the arithmetic is the same, integer ops on the bits
_CUPY_SOURCES = {
    "bf16_bits_to_float32": ("uint16 b", "float32 y", "y = __uint_as_float(((unsigned int)b) << 16);"),
    "float32_to_bf16_bits": (
        "float32 x",
        "uint16 y",
        """
        unsigned int u = __float_as_uint(x);
        y = ((u & 0x7fffffffu) > 0x7f800000u)
            ? (unsigned short)(((u >> 16) & 0x8000u) | 0x7fc0u)
            : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        """,
    ),
}
_CUPY_KERNELS: dict[str, Any] = {}


def _cupy_kernel(xp: Any, name: str) -> Any:
    kernel = _CUPY_KERNELS.get(name)
    if kernel is None:
        kernel = _CUPY_KERNELS[name] = xp.ElementwiseKernel(*_CUPY_SOURCES[name], f"trtcore_{name}")
    return kernel


def bf16_bits_to_float32(bits: Any, xp: Any = np) -> Any:
    """float32 values of bfloat16 bit patterns (``uint16``; exact: the bits are float32's top half)."""
    if _is_device(xp):
        return _cupy_kernel(xp, "bf16_bits_to_float32")(xp.asarray(bits))
    return (xp.asarray(bits).astype(xp.uint32) << xp.uint32(16)).view(xp.float32)


def float32_to_bf16_bits(x: Any, xp: Any = np) -> Any:
    """bfloat16 bit patterns (``uint16``) of ``x`` rounded to nearest, ties to even.

    ``x`` is converted to float32 first (so float64 rounds twice, as ``ml_dtypes`` does).
    Overflow rounds to +-inf, float32 subnormals round like normal numbers (no flush to
    zero), and NaN becomes the quiet NaN ``0x7FC0`` / ``0xFFC0`` keeping its sign; this
    equals ``x.astype(ml_dtypes.bfloat16).view(uint16)`` bit for bit.
    """
    x = xp.asarray(x)
    if x.dtype != np.float32:
        x = x.astype(xp.float32)
    if _is_device(xp):
        return _cupy_kernel(xp, "float32_to_bf16_bits")(x)
    u = xp.ascontiguousarray(x).view(xp.uint32)
    lsb = (u >> xp.uint32(16)) & xp.uint32(1)
    rounded = (u + (xp.uint32(0x7FFF) + lsb)) >> xp.uint32(16)  # no overflow: only NaN patterns could wrap
    nan = (u & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000)
    quiet = ((u >> xp.uint32(16)) & xp.uint32(0x8000)) | xp.uint32(0x7FC0)
    return xp.where(nan, quiet, rounded).astype(xp.uint16)


class _Storage:
    """How tensors are held in the array module ``xp`` (see the module docstring)."""

    def __init__(self, xp: Any):
        self.xp = xp
        self.numpy = xp is np  # the NumPy path: ml_dtypes.bfloat16, plugin.reference
        self.device = _is_device(xp)
        self.bf16_bits = not self.numpy  # bfloat16 as uint16 bit patterns
        self.raw_moves = not self.numpy  # data-moving layers skip the float32 round trip

    def dtype(self, dtype: DataType) -> np.dtype:
        """The array dtype a tensor of ``dtype`` is stored in (:func:`trtcore.dtypes.storage_dtype`)."""
        return storage_dtype(dtype, self.xp)

    def feed(self, a: Any, dtype: DataType) -> Any:
        """A network input in storage form (host arrays are copied to the device)."""
        xp = self.xp
        if self.numpy:
            return xp.asarray(a)
        if dtype == DataType.BF16 and self.bf16_bits:
            if isinstance(a, np.ndarray) and a.dtype.name == "bfloat16":
                return xp.asarray(np.ascontiguousarray(a).view(np.uint16))
            a = xp.asarray(a)
            return a if a.dtype == np.uint16 else float32_to_bf16_bits(a, xp)
        return xp.asarray(a)

    def constant(self, array: np.ndarray, shape: tuple[int, ...], dtype: DataType) -> Any:
        """A constant layer's weights in storage form (on the device for CuPy)."""
        host = np.asarray(array).reshape(shape)
        if dtype == DataType.BF16 and self.bf16_bits and host.dtype.name == "bfloat16":
            host = np.ascontiguousarray(host).view(np.uint16)
        return self.store(self.xp.asarray(host), dtype)

    def compute(self, x: Any, dtype: DataType) -> Any:
        """float16/bfloat16 -> float32 for arithmetic; other types unchanged."""
        if dtype == DataType.BF16:
            return bf16_bits_to_float32(x, self.xp) if self.bf16_bits else x.astype(self.xp.float32)
        if dtype == DataType.HALF:
            return x.astype(self.xp.float32)
        return x

    def store(self, x: Any, dtype: DataType) -> Any:
        """``x`` (a compute value or already stored) in ``dtype``'s storage."""
        xp = self.xp
        x = xp.asarray(x)
        if dtype == DataType.BF16 and self.bf16_bits:
            return x if x.dtype == np.uint16 else float32_to_bf16_bits(x, xp)
        target = self.dtype(dtype)
        return x if x.dtype == target else x.astype(target)

    def logical(self, x: Any, dtype: DataType) -> np.dtype:
        """The NumPy dtype a plugin sees for a stored tensor (bfloat16: ``ml_dtypes.bfloat16``)."""
        return np.dtype(nptype(dtype)) if dtype == DataType.BF16 else np.dtype(x.dtype)


_UNARY = {
    UnaryOperation.EXP: lambda xp, x: xp.exp(x),
    UnaryOperation.LOG: lambda xp, x: xp.log(x),
    UnaryOperation.SQRT: lambda xp, x: xp.sqrt(x),
    UnaryOperation.RECIP: lambda xp, x: 1.0 / x,
    UnaryOperation.ABS: lambda xp, x: xp.abs(x),
    UnaryOperation.NEG: lambda xp, x: -x,
    UnaryOperation.SIN: lambda xp, x: xp.sin(x),
    UnaryOperation.COS: lambda xp, x: xp.cos(x),
    UnaryOperation.TAN: lambda xp, x: xp.tan(x),
    UnaryOperation.SINH: lambda xp, x: xp.sinh(x),
    UnaryOperation.COSH: lambda xp, x: xp.cosh(x),
    UnaryOperation.ASIN: lambda xp, x: xp.arcsin(x),
    UnaryOperation.ACOS: lambda xp, x: xp.arccos(x),
    UnaryOperation.ATAN: lambda xp, x: xp.arctan(x),
    UnaryOperation.ASINH: lambda xp, x: xp.arcsinh(x),
    UnaryOperation.ACOSH: lambda xp, x: xp.arccosh(x),
    UnaryOperation.ATANH: lambda xp, x: xp.arctanh(x),
    UnaryOperation.CEIL: lambda xp, x: xp.ceil(x),
    UnaryOperation.FLOOR: lambda xp, x: xp.floor(x),
    UnaryOperation.NOT: lambda xp, x: xp.logical_not(x),
    UnaryOperation.SIGN: lambda xp, x: xp.sign(x),
    UnaryOperation.ROUND: lambda xp, x: xp.round(x),
    UnaryOperation.ISINF: lambda xp, x: xp.isinf(x),
    UnaryOperation.ISNAN: lambda xp, x: xp.isnan(x),
}

_ELEMENTWISE = {
    ElementWiseOperation.SUM: lambda xp, a, b: a + b,
    ElementWiseOperation.PROD: lambda xp, a, b: a * b,
    ElementWiseOperation.MAX: lambda xp, a, b: xp.maximum(a, b),
    ElementWiseOperation.MIN: lambda xp, a, b: xp.minimum(a, b),
    ElementWiseOperation.SUB: lambda xp, a, b: a - b,
    ElementWiseOperation.POW: lambda xp, a, b: xp.power(a, b),
    ElementWiseOperation.FLOOR_DIV: lambda xp, a, b: xp.floor_divide(a, b),
    ElementWiseOperation.AND: lambda xp, a, b: xp.logical_and(a, b),
    ElementWiseOperation.OR: lambda xp, a, b: xp.logical_or(a, b),
    ElementWiseOperation.XOR: lambda xp, a, b: xp.logical_xor(a, b),
    ElementWiseOperation.EQUAL: lambda xp, a, b: a == b,
    ElementWiseOperation.GREATER: lambda xp, a, b: a > b,
    ElementWiseOperation.LESS: lambda xp, a, b: a < b,
}


def _div(xp: Any, a: Any, b: Any) -> Any:
    if a.dtype.kind in "iu":  # TensorRT integer DIV truncates toward zero
        q = xp.abs(a) // xp.abs(b)
        return xp.where((a < 0) ^ (b < 0), -q, q)
    return a / b


def _activation(layer: IActivationLayer, xp: Any, x: Any) -> Any:
    kind, alpha, beta = layer.type, layer.alpha, layer.beta
    if kind == ActivationType.RELU:
        return xp.maximum(x, 0)
    if kind == ActivationType.SIGMOID:
        return 1.0 / (1.0 + xp.exp(-x))
    if kind == ActivationType.TANH:
        return xp.tanh(x)
    if kind == ActivationType.LEAKY_RELU:
        return xp.where(x >= 0, x, alpha * x)
    if kind == ActivationType.SOFTPLUS:
        return alpha * xp.log1p(xp.exp(beta * x))
    if kind == ActivationType.CLIP:
        return xp.clip(x, alpha, beta)
    if kind == ActivationType.ELU:
        return xp.where(x >= 0, x, alpha * (xp.exp(x) - 1))
    if kind == ActivationType.SELU:
        return beta * xp.where(x >= 0, x, alpha * (xp.exp(x) - 1))
    if kind == ActivationType.SOFTSIGN:
        return x / (1 + xp.abs(x))
    if kind == ActivationType.HARD_SIGMOID:
        return xp.clip(alpha * x + beta, 0, 1)
    if kind == ActivationType.SCALED_TANH:
        return alpha * xp.tanh(beta * x)
    if kind == ActivationType.THRESHOLDED_RELU:
        return xp.where(x > alpha, x, 0)
    if kind == ActivationType.GELU_TANH:
        return 0.5 * x * (1.0 + xp.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    if kind == ActivationType.GELU_ERF:
        from math import erf, sqrt

        if _is_device(xp):
            return 0.5 * x * (1.0 + _erf(xp, x / sqrt(2.0)))
        verf = np.vectorize(erf, otypes=[np.float64])
        return 0.5 * x * (1.0 + xp.asarray(verf(np.asarray(x) / sqrt(2.0)), dtype=x.dtype))
    raise NetworkError(f"activation {kind.name} is not implemented by the reference backend")


def _layer_outputs(layer: ILayer, args: list[Any], xp: Any) -> list[Any]:
    """Compute one layer's outputs from its input arrays (already in compute types)."""
    if isinstance(layer, IConstantLayer):
        return [xp.asarray(layer.weights.array).reshape(layer.shape)]
    if isinstance(layer, IElementWiseLayer):
        a, b = args
        if layer.op == ElementWiseOperation.DIV:
            return [_div(xp, a, b)]
        return [_ELEMENTWISE[layer.op](xp, a, b)]
    if isinstance(layer, IUnaryLayer):
        return [_UNARY[layer.op](xp, args[0])] if layer.op != UnaryOperation.ERF else [_erf(xp, args[0])]
    if isinstance(layer, IActivationLayer):
        return [_activation(layer, xp, args[0])]
    if isinstance(layer, IReduceLayer):
        x = args[0]
        axes = _axes(layer.axes, x.ndim)
        fn = {
            ReduceOperation.SUM: xp.sum,
            ReduceOperation.PROD: xp.prod,
            ReduceOperation.MAX: xp.max,
            ReduceOperation.MIN: xp.min,
            ReduceOperation.AVG: xp.mean,
        }[layer.op]
        return [fn(x, axis=axes, keepdims=layer.keep_dims)]
    if isinstance(layer, ISoftMaxLayer):
        x = args[0]
        (axis,) = _axes(layer.axes, x.ndim)
        m = xp.max(x, axis=axis, keepdims=True)
        e = xp.exp(x - xp.where(xp.isfinite(m), m, 0))
        return [e / xp.sum(e, axis=axis, keepdims=True)]
    if isinstance(layer, IConcatenationLayer):
        return [xp.concatenate(args, axis=layer.axis)]
    if isinstance(layer, IShuffleLayer):
        x = xp.transpose(args[0], layer.first_transpose)
        if layer.reshape_dims is not None:
            x = x.reshape(layer.resolve_reshape(tuple(x.shape)))
        if layer.second_transpose is not None:
            x = xp.transpose(x, layer.second_transpose)
        return [x]
    if isinstance(layer, IMatrixMultiplyLayer):
        a, b = args
        if layer.op0 == MatrixOperation.TRANSPOSE:
            a = xp.swapaxes(a, -1, -2)
        if layer.op1 == MatrixOperation.TRANSPOSE:
            b = xp.swapaxes(b, -1, -2)
        return [xp.matmul(a, b)]
    if isinstance(layer, IGatherLayer):
        data, idx = args
        return [_gather(layer, data, idx, xp)]
    if isinstance(layer, ICastLayer):
        return [args[0]]
    if isinstance(layer, IIdentityLayer):
        return [args[0]]
    if isinstance(layer, ISelectLayer):
        return [xp.where(*args)]
    raise NetworkError(f"layer {layer.name!r} of type {type(layer).__name__} is not implemented by the reference backend")


def _gather(layer: IGatherLayer, data: Any, idx: Any, xp: Any) -> Any:
    """``take`` along ``layer.axis``. On NumPy, indices outside ``[0, n)`` raise (TensorRT
    requires ``0 <= index < dim``). On the device the check is skipped: it would need the
    indices' min/max on the host, a synchronisation in every step. There, as in a TensorRT
    engine, such indices give unspecified values (CuPy's ``take`` wraps them around, it
    never reads outside the array); callers validate token ids on the host before a step
    (``LLM.generate`` does)."""
    n = data.shape[layer.axis]
    if not _is_device(xp) and idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise NetworkError(f"gather {layer.name!r}: index out of range [0, {n}) on axis {layer.axis}: min {int(idx.min())}, max {int(idx.max())}")
    return xp.take(data, idx, axis=layer.axis)


def _run_plugin(layer: IPluginV3Layer, args: list[Any], st: _Storage) -> list[Any]:
    """NumPy: the plugin's ``reference``; CuPy: its ``enqueue`` on the current stream, into
    freshly allocated outputs (no host synchronisation).

    ``args`` are stored values. A plugin always sees bfloat16 as ``ml_dtypes.bfloat16``: on
    the device the ``uint16`` bit patterns are handed over as they are (same memory), with
    dtype ``ml_dtypes.bfloat16`` in the descriptor; other array modules on the host get
    ``ml_dtypes.bfloat16`` views for ``reference``.
    """
    plugin = layer.plugin
    xp = st.xp
    in_dtypes = [t.dtype for t in layer._inputs if t is not None]
    if st.numpy:
        return list(plugin.reference(*args))
    if not st.device:  # a host array module other than NumPy itself: reference on bf16 views
        views = [np.asarray(a).view(nptype(d)) if d == DataType.BF16 and st.bf16_bits else np.asarray(a) for a, d in zip(args, in_dtypes)]
        outs = []
        for o in plugin.reference(*views):
            o = np.asarray(o)
            outs.append(xp.asarray(o.view(np.uint16) if st.bf16_bits and o.dtype.name == "bfloat16" else o))
        return outs
    from types import SimpleNamespace

    args = [xp.ascontiguousarray(a) for a in args]  # kernels take dense row-major memory
    logical = [st.logical(a, d) for a, d in zip(args, in_dtypes)]
    shapes = plugin.output_shapes([[Dim(int(d)) for d in a.shape] for a in args])
    out_dtypes = [np.dtype(dt) for dt in plugin.output_dtypes(logical)]
    outs = [xp.empty(tuple(int(d) for d in shape), dtype=st.dtype(from_numpy_dtype(dt))) for shape, dt in zip(shapes, out_dtypes)]

    def dev(a: Any, dtype: np.dtype) -> Any:
        return SimpleNamespace(ptr=int(a.data.ptr), shape=tuple(int(x) for x in a.shape), dtype=dtype, size=int(a.size))

    ws = int(plugin.workspace_size([(tuple(a.shape), d) for a, d in zip(args, logical)], [(tuple(o.shape), d) for o, d in zip(outs, out_dtypes)]))
    workspace = xp.empty(max(ws, 1), dtype=np.uint8)
    stream = int(xp.cuda.get_current_stream().ptr)
    plugin.enqueue(
        [dev(a, d) for a, d in zip(args, logical)],
        [dev(o, d) for o, d in zip(outs, out_dtypes)],
        int(workspace.data.ptr) if ws else 0,
        stream,
    )
    return outs


def _kv_cache_update(layer: IKVCacheUpdateLayer, cache: Any, update: Any, write_indices: Any, xp: Any) -> Any:
    """``cache[b, :, w[b] + s, :] = update[b, :, s, :]``, in place (as TensorRT: the output
    is the cache's memory), on the stored values (bfloat16 bits move unchanged).

    On NumPy, indices with ``w[b] < 0`` or ``w[b] + S > S_max`` raise; on the device the
    check is skipped (it would read the indices on the host): there, as in TensorRT, such
    writes are unspecified. A read-only NumPy cache is copied first."""
    B, S = int(update.shape[0]), int(update.shape[2])
    L = int(cache.shape[2])
    if int(cache.shape[0]) != B or int(write_indices.shape[0]) != B:
        raise NetworkError(
            f"KV_CACHE_UPDATE layer {layer.name!r}: cache {tuple(cache.shape)}, update {tuple(update.shape)} and "
            f"write_indices {tuple(write_indices.shape)} differ in batch size"
        )
    if not _is_device(xp) and B and (int(write_indices.min()) < 0 or int(write_indices.max()) + S > L):
        raise NetworkError(
            f"KV_CACHE_UPDATE layer {layer.name!r}: write_indices must satisfy 0 <= w and w + {S} <= {L}, "
            f"got min {int(write_indices.min())}, max {int(write_indices.max())}"
        )
    out = cache
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        out = out.copy()
    if B and S:
        rows = xp.arange(B)[:, None]
        slots = write_indices.astype(xp.int64)[:, None] + xp.arange(S)[None, :]  # [B, S]
        # through a [B, S_max, H, D] view: the two index arrays are adjacent, so the
        # selection is [B, S, H, D], the update's tokens-major view
        xp.swapaxes(out, 1, 2)[rows, slots] = xp.swapaxes(update, 1, 2)
    return out


def _attention(layer: IAttention, q: Any, k: Any, v: Any, mask: Any, kv_lengths: Any, xp: Any) -> Any:
    """``IAttention`` in float32: ``norm(Q K^T (+|masked) mask) V`` with GQA (query head ``h``
    reads key/value head ``h // (Hq // Hkv)``); a row with no key left gives zeros."""
    f32 = xp.float32
    q, k, v = q.astype(f32, copy=False), k.astype(f32, copy=False), v.astype(f32, copy=False)
    B, Hq, S, D = (int(d) for d in q.shape)
    Hkv, T = int(k.shape[1]), int(k.shape[2])
    if Hkv == 0 or Hq % Hkv:
        raise NetworkError(f"attention {layer.name!r}: {Hq} query heads are not a multiple of {Hkv} key/value heads")
    G = Hq // Hkv
    q5 = q.reshape(B, Hkv, G, S, D)
    k5, v5 = k[:, :, None], v[:, :, None]  # [B, Hkv, 1, T, D]
    scores = xp.matmul(q5, xp.swapaxes(k5, -1, -2))  # [B, Hkv, G, S, T]
    allowed = None
    if mask is not None:
        a0, a1 = int(mask.shape[0]), int(mask.shape[1])
        m5 = mask.reshape(a0, Hkv, G, S, T) if a1 == Hq and a1 != 1 else mask.reshape(a0, 1, 1, S, T)
        if m5.dtype == np.bool_:
            allowed = m5
        else:
            scores = scores + m5.astype(f32, copy=False)
    kind = layer.causal_kind
    if kind != CausalMaskKind.NONE:
        i, j = xp.arange(S)[:, None], xp.arange(T)[None, :]
        causal = j <= i if kind == CausalMaskKind.UPPER_LEFT else j <= i + (T - S)
        allowed = causal if allowed is None else allowed & causal
    if kv_lengths is not None:
        valid = (xp.arange(T)[None, :] < kv_lengths.astype(xp.int64)[:, None]).reshape(B, 1, 1, 1, T)
        allowed = valid if allowed is None else allowed & valid
    if layer.norm_op == AttentionNormalizationOp.SOFTMAX:
        if allowed is not None:
            scores = xp.where(allowed, scores, f32(-np.inf))
        m = xp.max(scores, axis=-1, keepdims=True)
        e = xp.exp(scores - xp.where(xp.isfinite(m), m, f32(0)))
        total = xp.sum(e, axis=-1, keepdims=True)
        probs = e / xp.where(total > 0, total, f32(1))
    else:
        probs = scores if allowed is None else xp.where(allowed, scores, f32(0))
    out = xp.matmul(probs, v5)  # [B, Hkv, G, S, D]
    return out.reshape(B, Hq, S, D)


def _erf(xp: Any, x: Any) -> Any:
    if _is_device(xp):
        import cupyx.scipy.special

        return cupyx.scipy.special.erf(x).astype(x.dtype, copy=False)
    from math import erf

    return xp.asarray(np.vectorize(erf, otypes=[np.float64])(np.asarray(x)), dtype=x.dtype)


#: layers that only move data: on non-NumPy modules they take their inputs as stored
#: (bfloat16 bits, float16), which is exact and saves two conversions per tensor
_MOVES = (IShuffleLayer, IConcatenationLayer, IGatherLayer, IIdentityLayer, ISelectLayer)


def evaluate(
    network: INetworkDefinition,
    feeds: Mapping[str, Any],
    *,
    xp: Any = np,
    capture: Iterable[str] | str = (),
    constants: dict[int, Any] | None = None,
) -> dict[str, Any]:
    """Run ``network`` on ``feeds`` and return its outputs (and captured tensors).

    Args:
        network: a reference network; layers run in the order they were added.
        feeds: one array per network input, already of the input's dtype and a shape
            matching its static dimensions (the executor checks both). With CuPy a feed may
            be a host (NumPy) array, copied to the device here, or a device array; a
            bfloat16 input may be given as ``ml_dtypes.bfloat16`` (host) or as ``uint16``
            bit patterns (device).
        xp: the array module, ``numpy`` or ``cupy``.
        capture: names of intermediate tensors to return as well, or ``"all"``.
        constants: a dict kept by the caller between runs; constant layers' arrays are
            stored there once in ``xp`` (so CuPy copies weights to the device only once).

    Returns:
        ``{name: array}`` for every marked output and every captured tensor, as ``xp``
        arrays in the storage of the module docstring's table (bfloat16 on CuPy: ``uint16``).

    Raises:
        NetworkError: a layer cannot run on these inputs (e.g. gather index out of range,
            checked on NumPy only).
    """
    network._refresh()
    for layer in network._layers:
        if layer._error is not None:
            layer._update()  # the message names the layer as it is called now
            raise layer._error
    want = {t.name for t in network._outputs}
    keep_all = capture == "all"
    if not keep_all:
        names = [capture] if isinstance(capture, str) else list(capture)
        for name in names:
            network.tensor(name)  # raises KeyError naming the tensor
        want |= set(names)
    last_use: dict[int, int] = {}
    for i, layer in enumerate(network._layers):
        for t in layer._inputs:
            if t is not None:
                last_use[id(t)] = i
    st = _Storage(xp)
    if constants is None:
        constants = {}
    values: dict[int, Any] = {id(t): st.feed(feeds[t.name], t.dtype) for t in network._inputs}
    result: dict[str, Any] = {}
    for t in network._inputs:
        if keep_all or t.name in want:
            result[t.name] = values[id(t)]
    for i, layer in enumerate(network._layers):
        if isinstance(layer, IConstantLayer):
            out = layer._outputs[0]
            if id(layer) not in constants:
                constants[id(layer)] = st.constant(layer.weights.array, layer.shape, out.dtype)
            values[id(out)] = constants[id(layer)]
            if keep_all or out.name in want:
                result[out.name] = values[id(out)]
            continue
        if isinstance(layer, IPluginV3Layer):  # plugins take their inputs in their own types
            outs = _run_plugin(layer, [values[id(t)] for t in layer._inputs if t is not None], st)
            for t, value in zip(layer._outputs, outs):
                values[id(t)] = st.store(value, t.dtype)
                if keep_all or t.name in want:
                    result[t.name] = values[id(t)]
            continue
        if isinstance(layer, IKVCacheUpdateLayer):  # stored values, written in place
            args = [values[id(layer._in(i))] for i in range(3)]
        elif isinstance(layer, IAttention):  # q, k, v, then optional inputs by index (None if unset)
            args = [None if t is None else st.compute(values[id(t)], t.dtype) for t in layer._inputs]
        elif st.raw_moves and isinstance(layer, _MOVES):
            args = [values[id(t)] for t in layer._inputs if t is not None]
        else:
            args = [st.compute(values[id(t)], t.dtype) for t in layer._inputs if t is not None]
        try:
            if isinstance(layer, IKVCacheUpdateLayer):
                outs = [_kv_cache_update(layer, *args, xp)]
            elif isinstance(layer, IAttention):
                opt = args + [None] * (7 - len(args))
                outs = [_attention(layer, opt[0], opt[1], opt[2], opt[IAttention._MASK], opt[IAttention._KV_LENGTHS], xp)]
            else:
                outs = _layer_outputs(layer, args, xp)
        except NetworkError:
            raise
        except (ValueError, IndexError, TypeError) as exc:
            shapes = [tuple(a.shape) for a in args if a is not None]
            raise NetworkError(f"layer {layer.name!r} ({type(layer).__name__}) failed on input shapes {shapes}: {exc}") from exc
        for t, value in zip(layer._outputs, outs):
            value = st.store(value, t.dtype)
            values[id(t)] = value
            if keep_all or t.name in want:
                result[t.name] = value
        for t in layer._inputs:
            if t is not None and last_use.get(id(t)) == i and not t.is_network_input:
                values.pop(id(t), None)
    return result


__all__ = ["FLOATING", "bf16_bits_to_float32", "evaluate", "float32_to_bf16_bits"]
