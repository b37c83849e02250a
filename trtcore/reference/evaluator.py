"""Executes a reference network layer by layer on NumPy (or another array module).

Numerics follow TensorRT's strongly typed semantics: each layer's output is stored in the
output tensor's type. float16/bfloat16 layers compute in float32 and round the result to
their type once (as TensorRT's kernels accumulate in float32), so the only rounding is at
layer boundaries. Every intermediate tensor can be captured by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..errors import NetworkError
from .network import (
    IActivationLayer,
    ICastLayer,
    IConcatenationLayer,
    IConstantLayer,
    IElementWiseLayer,
    IGatherLayer,
    IIdentityLayer,
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
    _Dim,
)
from .types import (
    FLOATING,
    ActivationType,
    DataType,
    ElementWiseOperation,
    MatrixOperation,
    ReduceOperation,
    UnaryOperation,
    nptype,
)


def _compute(x: Any, xp: Any) -> Any:
    """float16/bfloat16 -> float32 for arithmetic; other types unchanged."""
    if x.dtype.itemsize == 2 and x.dtype.kind in "fV" or str(x.dtype) == "bfloat16":
        return x.astype(xp.float32)
    return x


def _store(x: Any, dtype: DataType, xp: Any) -> Any:
    target = np.dtype(nptype(dtype))
    x = xp.asarray(x)
    return x if x.dtype == target else x.astype(target)


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
        n = data.shape[layer.axis]
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):  # TensorRT: 0 <= index < dim
            raise NetworkError(
                f"gather {layer.name!r}: index out of range [0, {n}) on axis {layer.axis}: "
                f"min {int(idx.min())}, max {int(idx.max())}"
            )
        return [xp.take(data, idx, axis=layer.axis)]
    if isinstance(layer, ICastLayer):
        return [args[0]]
    if isinstance(layer, IIdentityLayer):
        return [args[0]]
    if isinstance(layer, ISelectLayer):
        return [xp.where(*args)]
    raise NetworkError(f"layer {layer.name!r} of type {type(layer).__name__} is not implemented by the reference backend")


def _run_plugin(layer: IPluginV3Layer, args: list[Any], xp: Any) -> list[Any]:
    """NumPy: the plugin's ``reference``; other array modules (CuPy): its ``enqueue`` on the
    current stream, into freshly allocated outputs (no host synchronisation)."""
    plugin = layer.plugin
    if xp is np:
        return list(plugin.reference(*args))
    shapes = plugin.output_shapes([[_Dim(int(d)) for d in a.shape] for a in args])
    dtypes = plugin.output_dtypes([a.dtype for a in args])
    outs = [xp.empty(tuple(int(_Dim.of(d)) for d in shape), dtype=np.dtype(dt)) for shape, dt in zip(shapes, dtypes)]
    from types import SimpleNamespace

    def dev(a: Any) -> Any:
        return SimpleNamespace(ptr=int(a.data.ptr), shape=tuple(int(x) for x in a.shape), dtype=np.dtype(a.dtype), size=int(a.size))

    ws = int(plugin.workspace_size([(tuple(a.shape), a.dtype) for a in args], [(tuple(o.shape), o.dtype) for o in outs]))
    workspace = xp.empty(max(ws, 1), dtype=np.uint8)
    stream = int(xp.cuda.get_current_stream().ptr)
    plugin.enqueue([dev(a) for a in args], [dev(o) for o in outs], int(workspace.data.ptr) if ws else 0, stream)
    return outs


def _erf(xp: Any, x: Any) -> Any:
    from math import erf

    return xp.asarray(np.vectorize(erf, otypes=[np.float64])(np.asarray(x)), dtype=x.dtype)


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
            matching its static dimensions (the executor checks both).
        xp: the array module, ``numpy`` or ``cupy``.
        capture: names of intermediate tensors to return as well, or ``"all"``.
        constants: a dict kept by the caller between runs; constant layers' arrays are
            stored there once in ``xp`` (so CuPy copies weights to the device only once).

    Returns:
        ``{name: array}`` for every marked output and every captured tensor.

    Raises:
        NetworkError: a layer cannot run on these inputs (e.g. gather index out of range).
    """
    for layer in network._layers:
        if layer._error is not None:
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
    values: dict[int, Any] = {id(t): xp.asarray(feeds[t.name]) for t in network._inputs}
    result: dict[str, Any] = {}
    for t in network._inputs:
        if keep_all or t.name in want:
            result[t.name] = values[id(t)]
    for i, layer in enumerate(network._layers):
        if constants is not None and isinstance(layer, IConstantLayer):
            out = layer._outputs[0]
            if id(layer) not in constants:
                constants[id(layer)] = _store(xp.asarray(layer.weights.array).reshape(layer.shape), out.dtype, xp)
            values[id(out)] = constants[id(layer)]
            if keep_all or out.name in want:
                result[out.name] = values[id(out)]
            continue
        if isinstance(layer, IPluginV3Layer):  # plugins take their inputs in their own types
            outs = _run_plugin(layer, [values[id(t)] for t in layer._inputs if t is not None], xp)
            for t, value in zip(layer._outputs, outs):
                values[id(t)] = _store(value, t.dtype, xp)
                if keep_all or t.name in want:
                    result[t.name] = values[id(t)]
            continue
        args = [_compute(values[id(t)], xp) for t in layer._inputs if t is not None]
        try:
            outs = _layer_outputs(layer, args, xp)
        except NetworkError:
            raise
        except (ValueError, IndexError, TypeError) as exc:
            shapes = [tuple(a.shape) for a in args]
            raise NetworkError(f"layer {layer.name!r} ({type(layer).__name__}) failed on input shapes {shapes}: {exc}") from exc
        for t, value in zip(layer._outputs, outs):
            value = _store(value, t.dtype, xp)
            values[id(t)] = value
            if keep_all or t.name in want:
                result[t.name] = value
        for t in layer._inputs:
            if t is not None and last_use.get(id(t)) == i and not t.is_network_input:
                values.pop(id(t), None)
    return result


__all__ = ["evaluate", "FLOATING"]
