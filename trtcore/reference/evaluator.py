"""Executes a reference network layer by layer on NumPy: the numerical oracle.

Numerics follow TensorRT's strongly typed semantics: each layer's output is stored in the
output tensor's type. float16/bfloat16 layers compute in float32 and round the result to
their type once (as TensorRT's kernels accumulate in float32), so the only rounding is at
layer boundaries; a fused ``IAttention`` is one layer (scores, softmax and the weighted sum
in float32, one rounding of its output). Every intermediate tensor can be captured by name.

``IKVCacheUpdateLayer`` writes into its cache input's array in place and returns that array,
as TensorRT binds the cache input and the updated-cache output to the same memory: a cache
fed as a NumPy array is modified by the run.

Tensors are NumPy arrays of the type's NumPy dtype (:func:`trtcore.reference.types.nptype`:
bfloat16 as ``ml_dtypes.bfloat16``); plugins run their NumPy ``reference``. The GPU runs the
same networks through the cuda backend's engine (:mod:`trtcore.cuda`), which the GPU tests
compare with this evaluator layer by layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

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
    nptype,
)


def _compute(x: np.ndarray, dtype: DataType) -> np.ndarray:
    """float16/bfloat16 -> float32 for arithmetic; other types unchanged."""
    return x.astype(np.float32) if dtype in (DataType.BF16, DataType.HALF) else x


def _store(x: Any, dtype: DataType) -> np.ndarray:
    """``x`` (a compute value or already stored) in ``dtype``'s NumPy type."""
    x = np.asarray(x)
    target = np.dtype(nptype(dtype))
    return x if x.dtype == target else x.astype(target)


_UNARY = {
    UnaryOperation.EXP: lambda x: np.exp(x),
    UnaryOperation.LOG: lambda x: np.log(x),
    UnaryOperation.SQRT: lambda x: np.sqrt(x),
    UnaryOperation.RECIP: lambda x: 1.0 / x,
    UnaryOperation.ABS: lambda x: np.abs(x),
    UnaryOperation.NEG: lambda x: -x,
    UnaryOperation.SIN: lambda x: np.sin(x),
    UnaryOperation.COS: lambda x: np.cos(x),
    UnaryOperation.TAN: lambda x: np.tan(x),
    UnaryOperation.SINH: lambda x: np.sinh(x),
    UnaryOperation.COSH: lambda x: np.cosh(x),
    UnaryOperation.ASIN: lambda x: np.arcsin(x),
    UnaryOperation.ACOS: lambda x: np.arccos(x),
    UnaryOperation.ATAN: lambda x: np.arctan(x),
    UnaryOperation.ASINH: lambda x: np.arcsinh(x),
    UnaryOperation.ACOSH: lambda x: np.arccosh(x),
    UnaryOperation.ATANH: lambda x: np.arctanh(x),
    UnaryOperation.CEIL: lambda x: np.ceil(x),
    UnaryOperation.FLOOR: lambda x: np.floor(x),
    UnaryOperation.NOT: lambda x: np.logical_not(x),
    UnaryOperation.SIGN: lambda x: np.sign(x),
    UnaryOperation.ROUND: lambda x: np.round(x),
    UnaryOperation.ISINF: lambda x: np.isinf(x),
    UnaryOperation.ISNAN: lambda x: np.isnan(x),
}

_ELEMENTWISE = {
    ElementWiseOperation.SUM: lambda a, b: a + b,
    ElementWiseOperation.PROD: lambda a, b: a * b,
    ElementWiseOperation.MAX: lambda a, b: np.maximum(a, b),
    ElementWiseOperation.MIN: lambda a, b: np.minimum(a, b),
    ElementWiseOperation.SUB: lambda a, b: a - b,
    ElementWiseOperation.POW: lambda a, b: np.power(a, b),
    ElementWiseOperation.FLOOR_DIV: lambda a, b: np.floor_divide(a, b),
    ElementWiseOperation.AND: lambda a, b: np.logical_and(a, b),
    ElementWiseOperation.OR: lambda a, b: np.logical_or(a, b),
    ElementWiseOperation.XOR: lambda a, b: np.logical_xor(a, b),
    ElementWiseOperation.EQUAL: lambda a, b: a == b,
    ElementWiseOperation.GREATER: lambda a, b: a > b,
    ElementWiseOperation.LESS: lambda a, b: a < b,
}


def _div(a: Any, b: Any) -> Any:
    if a.dtype.kind in "iu":  # TensorRT integer DIV truncates toward zero
        q = np.abs(a) // np.abs(b)
        return np.where((a < 0) ^ (b < 0), -q, q)
    return a / b


def _activation(layer: IActivationLayer, x: Any) -> Any:
    kind, alpha, beta = layer.type, layer.alpha, layer.beta
    if kind == ActivationType.RELU:
        return np.maximum(x, 0)
    if kind == ActivationType.SIGMOID:
        return 1.0 / (1.0 + np.exp(-x))
    if kind == ActivationType.TANH:
        return np.tanh(x)
    if kind == ActivationType.LEAKY_RELU:
        return np.where(x >= 0, x, alpha * x)
    if kind == ActivationType.SOFTPLUS:
        return alpha * np.log1p(np.exp(beta * x))
    if kind == ActivationType.CLIP:
        return np.clip(x, alpha, beta)
    if kind == ActivationType.ELU:
        return np.where(x >= 0, x, alpha * (np.exp(x) - 1))
    if kind == ActivationType.SELU:
        return beta * np.where(x >= 0, x, alpha * (np.exp(x) - 1))
    if kind == ActivationType.SOFTSIGN:
        return x / (1 + np.abs(x))
    if kind == ActivationType.HARD_SIGMOID:
        return np.clip(alpha * x + beta, 0, 1)
    if kind == ActivationType.SCALED_TANH:
        return alpha * np.tanh(beta * x)
    if kind == ActivationType.THRESHOLDED_RELU:
        return np.where(x > alpha, x, 0)
    if kind == ActivationType.GELU_TANH:
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    if kind == ActivationType.GELU_ERF:
        from math import sqrt

        return 0.5 * x * (1.0 + _erf(x / sqrt(2.0)))
    raise NetworkError(f"activation {kind.name} is not implemented by the reference backend")


def _layer_outputs(layer: ILayer, args: list[Any]) -> list[Any]:
    """Compute one layer's outputs from its input arrays (already in compute types)."""
    if isinstance(layer, IConstantLayer):
        return [np.asarray(layer.weights.array).reshape(layer.shape)]
    if isinstance(layer, IElementWiseLayer):
        a, b = args
        if layer.op == ElementWiseOperation.DIV:
            return [_div(a, b)]
        return [_ELEMENTWISE[layer.op](a, b)]
    if isinstance(layer, IUnaryLayer):
        return [_UNARY[layer.op](args[0])] if layer.op != UnaryOperation.ERF else [_erf(args[0])]
    if isinstance(layer, IActivationLayer):
        return [_activation(layer, args[0])]
    if isinstance(layer, IReduceLayer):
        x = args[0]
        axes = _axes(layer.axes, x.ndim)
        fn: Any = {
            ReduceOperation.SUM: np.sum,
            ReduceOperation.PROD: np.prod,
            ReduceOperation.MAX: np.max,
            ReduceOperation.MIN: np.min,
            ReduceOperation.AVG: np.mean,
        }[layer.op]
        return [fn(x, axis=axes, keepdims=layer.keep_dims)]
    if isinstance(layer, ISoftMaxLayer):
        x = args[0]
        (axis,) = _axes(layer.axes, x.ndim)
        m = np.max(x, axis=axis, keepdims=True)
        e = np.exp(x - np.where(np.isfinite(m), m, 0))
        return [e / np.sum(e, axis=axis, keepdims=True)]
    if isinstance(layer, IConcatenationLayer):
        return [np.concatenate(args, axis=layer.axis)]
    if isinstance(layer, IShuffleLayer):
        x = np.transpose(args[0], layer.first_transpose)
        if layer.reshape_dims is not None:
            x = x.reshape(layer.resolve_reshape(tuple(x.shape)))
        if layer.second_transpose is not None:
            x = np.transpose(x, layer.second_transpose)
        return [x]
    if isinstance(layer, IMatrixMultiplyLayer):
        a, b = args
        if layer.op0 == MatrixOperation.TRANSPOSE:
            a = np.swapaxes(a, -1, -2)
        if layer.op1 == MatrixOperation.TRANSPOSE:
            b = np.swapaxes(b, -1, -2)
        return [np.matmul(a, b)]
    if isinstance(layer, IGatherLayer):
        data, idx = args
        return [_gather(layer, data, idx)]
    if isinstance(layer, ICastLayer):
        return [args[0]]
    if isinstance(layer, IIdentityLayer):
        return [args[0]]
    if isinstance(layer, ISelectLayer):
        return [np.where(*args)]
    raise NetworkError(f"layer {layer.name!r} of type {type(layer).__name__} is not implemented by the reference backend")


def _gather(layer: IGatherLayer, data: Any, idx: Any) -> Any:
    """``take`` along ``layer.axis``; indices outside ``[0, n)`` raise (TensorRT requires
    ``0 <= index < dim``)."""
    n = data.shape[layer.axis]
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise NetworkError(f"gather {layer.name!r}: index out of range [0, {n}) on axis {layer.axis}: min {int(idx.min())}, max {int(idx.max())}")
    return np.take(data, idx, axis=layer.axis)


def _kv_cache_update(layer: IKVCacheUpdateLayer, cache: Any, update: Any, write_indices: Any) -> Any:
    """``cache[b, :, w[b] + s, :] = update[b, :, s, :]``, in place (as TensorRT: the output
    is the cache's memory), on the stored values.

    Indices with ``w[b] < 0`` or ``w[b] + S > S_max`` raise. A read-only cache is copied first."""
    B, S = int(update.shape[0]), int(update.shape[2])
    L = int(cache.shape[2])
    if int(cache.shape[0]) != B or int(write_indices.shape[0]) != B:
        raise NetworkError(
            f"KV_CACHE_UPDATE layer {layer.name!r}: cache {tuple(cache.shape)}, update {tuple(update.shape)} and "
            f"write_indices {tuple(write_indices.shape)} differ in batch size"
        )
    if B and (int(write_indices.min()) < 0 or int(write_indices.max()) + S > L):
        raise NetworkError(
            f"KV_CACHE_UPDATE layer {layer.name!r}: write_indices must satisfy 0 <= w and w + {S} <= {L}, "
            f"got min {int(write_indices.min())}, max {int(write_indices.max())}"
        )
    out = cache
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        out = out.copy()
    if B and S:
        rows = np.arange(B)[:, None]
        slots = write_indices.astype(np.int64)[:, None] + np.arange(S)[None, :]  # [B, S]
        # through a [B, S_max, H, D] view: the two index arrays are adjacent, so the
        # selection is [B, S, H, D], the update's tokens-major view
        np.swapaxes(out, 1, 2)[rows, slots] = np.swapaxes(update, 1, 2)
    return out


def _attention(layer: IAttention, q: Any, k: Any, v: Any, mask: Any, kv_lengths: Any) -> Any:
    """``IAttention`` in float32: ``norm(Q K^T (+|masked) mask) V`` with GQA (query head ``h``
    reads key/value head ``h // (Hq // Hkv)``); a row with no key left gives zeros."""
    f32 = np.float32
    q, k, v = q.astype(f32, copy=False), k.astype(f32, copy=False), v.astype(f32, copy=False)
    B, Hq, S, D = (int(d) for d in q.shape)
    Hkv, T = int(k.shape[1]), int(k.shape[2])
    if Hkv == 0 or Hq % Hkv:
        raise NetworkError(f"attention {layer.name!r}: {Hq} query heads are not a multiple of {Hkv} key/value heads")
    G = Hq // Hkv
    q5 = q.reshape(B, Hkv, G, S, D)
    k5, v5 = k[:, :, None], v[:, :, None]  # [B, Hkv, 1, T, D]
    scores = np.matmul(q5, np.swapaxes(k5, -1, -2))  # [B, Hkv, G, S, T]
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
        i, j = np.arange(S)[:, None], np.arange(T)[None, :]
        causal = j <= i if kind == CausalMaskKind.UPPER_LEFT else j <= i + (T - S)
        allowed = causal if allowed is None else allowed & causal
    if kv_lengths is not None:
        valid = (np.arange(T)[None, :] < kv_lengths.astype(np.int64)[:, None]).reshape(B, 1, 1, 1, T)
        allowed = valid if allowed is None else allowed & valid
    if layer.norm_op == AttentionNormalizationOp.SOFTMAX:
        if allowed is not None:
            scores = np.where(allowed, scores, f32(-np.inf))
        m = np.max(scores, axis=-1, keepdims=True)
        e = np.exp(scores - np.where(np.isfinite(m), m, f32(0)))
        total = np.sum(e, axis=-1, keepdims=True)
        probs = e / np.where(total > 0, total, f32(1))
    else:
        probs = scores if allowed is None else np.where(allowed, scores, f32(0))
    out = np.matmul(probs, v5)  # [B, Hkv, G, S, D]
    return out.reshape(B, Hq, S, D)


def _erf(x: Any) -> Any:
    from math import erf

    return np.asarray(np.vectorize(erf, otypes=[np.float64])(np.asarray(x)), dtype=x.dtype)


def evaluate(
    network: INetworkDefinition,
    feeds: Mapping[str, Any],
    *,
    capture: Iterable[str] | str = (),
    constants: dict[int, Any] | None = None,
) -> dict[str, Any]:
    """Run ``network`` on ``feeds`` and return its outputs (and captured tensors).

    Args:
        network: a reference network; layers run in the order they were added.
        feeds: one array per network input, already of the input's dtype and a shape
            matching its static dimensions (the executor checks both).
        capture: names of intermediate tensors to return as well, or ``"all"``.
        constants: a dict kept by the caller between runs; constant layers' arrays are
            stored there once, in their tensor's type.

    Returns:
        ``{name: array}`` for every marked output and every captured tensor (NumPy arrays
        of the tensors' types, bfloat16 as ``ml_dtypes.bfloat16``).

    Raises:
        KeyError: a ``capture`` name is no tensor of the network.
        NetworkError: a layer cannot run on these inputs (e.g. gather index out of range).
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
    if constants is None:
        constants = {}
    values: dict[int, Any] = {id(t): np.asarray(feeds[t.name]) for t in network._inputs}
    result: dict[str, Any] = {}
    for t in network._inputs:
        if keep_all or t.name in want:
            result[t.name] = values[id(t)]
    for i, layer in enumerate(network._layers):
        if isinstance(layer, IConstantLayer):
            out = layer._outputs[0]
            if id(layer) not in constants:
                constants[id(layer)] = _store(np.asarray(layer.weights.array).reshape(layer.shape), out.dtype)
            values[id(out)] = constants[id(layer)]
            if keep_all or out.name in want:
                result[out.name] = values[id(out)]
            continue
        if isinstance(layer, IPluginV3Layer):  # plugins take their inputs in their own types
            outs = list(layer.plugin.reference(*[values[id(t)] for t in layer._inputs if t is not None]))
            for t, value in zip(layer._outputs, outs):
                values[id(t)] = _store(value, t.dtype)
                if keep_all or t.name in want:
                    result[t.name] = values[id(t)]
            continue
        if isinstance(layer, IKVCacheUpdateLayer):  # stored values, written in place
            args = [values[id(layer._in(i))] for i in range(3)]
        elif isinstance(layer, IAttention):  # q, k, v, then optional inputs by index (None if unset)
            args = [None if t is None else _compute(values[id(t)], t.dtype) for t in layer._inputs]
        else:
            args = [_compute(values[id(t)], t.dtype) for t in layer._inputs if t is not None]
        try:
            if isinstance(layer, IKVCacheUpdateLayer):
                outs = [_kv_cache_update(layer, *args)]
            elif isinstance(layer, IAttention):
                opt = args + [None] * (7 - len(args))
                outs = [_attention(layer, opt[0], opt[1], opt[2], opt[IAttention._MASK], opt[IAttention._KV_LENGTHS])]
            else:
                outs = _layer_outputs(layer, args)
        except NetworkError:
            raise
        except (ValueError, IndexError, TypeError) as exc:
            shapes = [tuple(a.shape) for a in args if a is not None]
            raise NetworkError(f"layer {layer.name!r} ({type(layer).__name__}) failed on input shapes {shapes}: {exc}") from exc
        for t, value in zip(layer._outputs, outs):
            value = _store(value, t.dtype)
            values[id(t)] = value
            if keep_all or t.name in want:
                result[t.name] = value
        for t in layer._inputs:
            if t is not None and last_use.get(id(t)) == i and not t.is_network_input:
                values.pop(id(t), None)
    return result


__all__ = ["FLOATING", "evaluate"]
