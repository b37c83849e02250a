"""The functional layer over TensorRT's ``INetworkDefinition``.

This module (like TensorRT-LLM's ``functional.py``) is the only code in trtcore that calls
``network.add_*``. Model files compose these ops; they never touch the network.

Every op takes a :class:`Graph` (the TensorRT module in use, the network, a name scope) and
``ITensor`` arguments, and returns an ``ITensor``. Layers and their output tensors are
named after the model's structure (``model.layers.3.self_attn.q_proj``), so any
intermediate tensor can be read back by name on the reference backend.

Precision is explicit, as in TensorRT's strongly typed networks: weights are constants of
the engine's dtype, RMSNorm and softmax compute in float32 through casts.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from . import kv_modes
from .checkpoint import LazyTensor
from .dtypes import ENGINE_DTYPES, trt_dtype
from .errors import InvalidArgumentError, NetworkError
from .fp8 import E4M3, E4M3_MAX, Fp8Weight, from_e4m3, share_tensor_scale
from .kv_modes import KVMode
from .parallel import Mapping
from .plan import IMPLEMENTATIONS, ROPE_IN_ATTENTION
from .quantization import QuantizedWeight
from .rope import RopeSpec

if TYPE_CHECKING:  # checked by mypy against tensorrt-stubs; never imported at run time
    import tensorrt as trt_types

    Tensor = trt_types.ITensor
    Network = trt_types.INetworkDefinition
    Layer = trt_types.ILayer
else:
    Tensor = Network = Layer = Any

_NP_DTYPES = ENGINE_DTYPES


class Graph:
    """A network under construction, with its TensorRT module and a naming scope.

    Args:
        trt: the TensorRT module (``tensorrt``, ``tensorrt_rtx`` or ``trtcore.reference``).
        network: a strongly typed ``INetworkDefinition`` created from that module.
        dtype: the engine's activation/weight type, ``"float32"``, ``"float16"`` or
            ``"bfloat16"``.

        implementations: per fused op, the implementation to use (``{"rope": "plugin"}``);
            see :data:`IMPLEMENTATIONS` and :func:`trtcore.plan.resolve_plan`.
        block_size: tokens per block of the paged KV cache.
        max_seq_len: tokens per sequence of a fixed-size KV cache (the static length of the
            ``attention="native"`` cache inputs); None where the network has none.
        kv_mode: the network's KV cache contract (:func:`trtcore.kv_modes.kv_mode`): its
            inputs and outputs, declared by :func:`model_inputs` and :func:`cached_attention`;
            None for networks without a KV cache (single-op tests).
        mapping: the tensor-parallel rank this network is (:class:`trtcore.parallel.Mapping`;
            default one rank): :func:`linear` (``parallel=``), :func:`embedding`,
            :func:`self_attention` and :func:`swiglu_mlp` slice their weights to the rank's
            share and add the collectives (:func:`all_reduce`, :func:`all_gather`).

    Attributes:
        keepalive: arrays whose memory TensorRT reads at build time (constants made with
            ``trt.Weights(type, pointer, count)``); keep the graph alive until the build ends.
    """

    def __init__(
        self,
        trt: Any,
        network: Network,
        dtype: str = "float32",
        implementations: dict[str, str] | None = None,
        block_size: int = 16,
        max_seq_len: int | None = None,
        kv_mode: KVMode | None = None,
        mapping: Mapping | None = None,
    ):
        if dtype not in _NP_DTYPES:
            raise InvalidArgumentError(f"dtype {dtype!r} is not supported; expected one of {sorted(_NP_DTYPES)}")
        self.trt = trt
        self.network = network
        self.dtype = dtype
        self.np_dtype = _NP_DTYPES[dtype]
        self.trt_dtype = self.trt_type(self.np_dtype)
        self.keepalive: list[np.ndarray] = []
        #: which implementation each fused op uses, e.g. ``{"rope": "plugin"}`` (see ``IMPLEMENTATIONS``)
        self.implementations = dict(implementations or {})
        #: tokens per KV-cache block (paged mode)
        self.block_size = int(block_size)
        #: tokens per sequence of a fixed-size KV cache (contiguous mode, native attention)
        self.max_seq_len = None if max_seq_len is None else int(max_seq_len)
        #: the KV cache contract (network I/O) of a whole-model network
        self.kv_mode = kv_mode
        #: the tensor-parallel rank of this network
        self.mapping = mapping or Mapping()
        #: network inputs declared by :func:`model_inputs`, by name
        self.inputs: dict[str, Tensor] = {}
        #: tensors shared by all layers (e.g. RoPE's cos/sin), keyed by op
        self.shared: dict[Any, Any] = {}
        #: FP8 KV cache (``plan.kv_cache_dtype == "fp8_e4m3"``): ``{layer: (k_scale, v_scale)}``
        #: from the checkpoint (:func:`trtcore.checkpoint.kv_cache_scales`); layers absent use 1.0
        self.kv_scales: dict[int, tuple[float, float]] = {}
        #: warnings already logged for this network (each once)
        self.warned: set[str] = set()
        self._scope: list[str] = []
        self._used: dict[str, int] = {}

    # naming ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Prefix the names of layers added inside with ``name`` (joined by dots)."""
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    @contextlib.contextmanager
    def scope_at(self, path: str) -> Iterator[None]:
        """Name layers added inside under the absolute scope ``path`` (for tensors shared by
        all layers, such as RoPE's cos/sin, whatever scope first asks for them)."""
        saved, self._scope = self._scope, [p for p in path.split(".") if p]
        try:
            yield
        finally:
            self._scope = saved

    def unique(self, name: str) -> str:
        """``scope.name``, suffixed ``_1``, ``_2``... if already used."""
        full = ".".join([*self._scope, name]) if name else ".".join(self._scope)
        n = self._used.get(full, 0)
        self._used[full] = n + 1
        return full if n == 0 else f"{full}_{n}"

    def named(self, layer: Layer, name: str) -> Tensor:
        """Name ``layer`` and its first output ``name`` (made unique); return that output."""
        full = self.unique(name)
        layer.name = full
        out = layer.get_output(0)
        out.name = full
        return out

    # types ---------------------------------------------------------------------------------
    def trt_type(self, dtype: Any) -> Any:
        """The TensorRT ``DataType`` of a NumPy dtype (:func:`trtcore.dtypes.trt_dtype`; TypeError if none)."""
        return trt_dtype(self.trt, np.dtype(dtype))

    # inputs / outputs ------------------------------------------------------------------------
    def input(self, name: str, dtype: Any, shape: Sequence[int]) -> Tensor:
        """Add a network input; ``dtype`` a NumPy dtype, -1 for dynamic dimensions."""
        return self.network.add_input(name, self.trt_type(dtype), tuple(shape))

    def output(self, tensor: Tensor, name: str) -> Tensor:
        """Mark ``tensor`` as a network output called ``name``."""
        tensor.name = name
        self.network.mark_output(tensor)
        return tensor


# ---------------------------------------------------------------------------------------
# constants and shape ops
# ---------------------------------------------------------------------------------------


def constant(g: Graph, array: np.ndarray, name: str, dtype: Any = None) -> Tensor:
    """A constant tensor holding ``array`` (converted to ``dtype``, default: its own).

    Memory: the graph owns one C-contiguous copy per distinct source array and dtype
    (``array`` may be a read-only view into a memory-mapped checkpoint; a tied embedding
    used twice is converted once), so a network costs about its weights once.
    """
    target = np.dtype(dtype if dtype is not None else array.dtype)
    # the same bytes (e.g. a tied embedding, reshaped for lm_head) are converted once
    key = ("constant", array.ctypes.data, array.size, array.dtype, target) if array.flags.c_contiguous else None
    cached = g.shared.get(key) if key is not None else None
    if cached is not None:
        arr = cached[1].reshape(array.shape)
    else:
        arr = np.array(array, dtype=target, order="C")  # owned: never the checkpoint's mapping
        if key is not None:
            g.shared[key] = (array, arr)  # holding `array` keeps its memory (the key) from being reused
        g.keepalive.append(arr)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if getattr(g.trt, "__name__", "") == "trtcore.reference":
        weights = g.trt.Weights(arr)  # the reference module keeps the array itself (no copy)
    else:
        weights = g.trt.Weights(g.trt_type(arr.dtype), arr.ctypes.data, arr.size)  # read at build time
    layer = g.network.add_constant(tuple(arr.shape), weights)
    return g.named(layer, name)


def scalar(g: Graph, value: float, rank: int, dtype: Any, name: str) -> Tensor:
    """A constant of shape ``[1] * rank`` (broadcasts against any tensor of that rank)."""
    return constant(g, np.full((1,) * rank, value), name, dtype=dtype)


def reshape(g: Graph, x: Tensor, dims: Sequence[int], name: str = "reshape") -> Tensor:
    """Reshape; ``0`` copies the input dimension at that index, one ``-1`` is inferred."""
    layer = g.network.add_shuffle(x)
    layer.reshape_dims = tuple(dims)
    return g.named(layer, name)


def transpose(g: Graph, x: Tensor, perm: Sequence[int], name: str = "transpose") -> Tensor:
    """Permute dimensions: output dim ``i`` is input dim ``perm[i]``."""
    layer = g.network.add_shuffle(x)
    layer.first_transpose = tuple(perm)
    return g.named(layer, name)


def cast(g: Graph, x: Tensor, dtype: Any, name: str = "cast") -> Tensor:
    """Convert ``x`` to the NumPy dtype ``dtype`` (no layer if already of that type)."""
    target = g.trt_type(dtype)
    if x.dtype == target:
        return x
    return g.named(g.network.add_cast(x, target), name)


def concat(g: Graph, xs: Sequence[Tensor], axis: int, name: str = "concat") -> Tensor:
    """Concatenate along ``axis``."""
    layer = g.network.add_concatenation(list(xs))
    layer.axis = axis
    return g.named(layer, name)


def gather(g: Graph, data: Tensor, indices: Tensor, axis: int, name: str = "gather") -> Tensor:
    """``numpy.take(data, indices, axis)``: output shape ``data[:axis] + indices + data[axis+1:]``."""
    return g.named(g.network.add_gather(data, indices, axis), name)


def gather_const(g: Graph, data: Tensor, indices: Sequence[int], axis: int, name: str) -> Tensor:
    """Gather constant ``indices`` along ``axis`` (a static slice/permutation of that axis)."""
    idx = constant(g, np.asarray(indices, dtype=np.int32), f"{name}.indices")
    return gather(g, data, idx, axis, name)


# ---------------------------------------------------------------------------------------
# arithmetic
# ---------------------------------------------------------------------------------------


class _Binary(Protocol):
    def __call__(self, g: Graph, a: Tensor, b: Tensor, name: str = ...) -> Tensor: ...


def _elementwise(public_name: str, op: str, default_name: str) -> _Binary:
    """The op ``a <op> b`` with TensorRT's broadcasting (``IElementWiseLayer`` with
    ``ElementWiseOperation.<op>``; both inputs of one rank and dtype), the layer named ``name``."""

    def apply(g: Graph, a: Tensor, b: Tensor, name: str = default_name) -> Tensor:
        return g.named(g.network.add_elementwise(a, b, getattr(g.trt.ElementWiseOperation, op)), name)

    apply.__name__ = apply.__qualname__ = public_name
    apply.__doc__ = f"``ElementWiseOperation.{op}`` of ``a`` and ``b`` (broadcast as TensorRT does); returns the output tensor."
    return apply


add = _elementwise("add", "SUM", "add")
sub = _elementwise("sub", "SUB", "sub")
mul = _elementwise("mul", "PROD", "mul")
div = _elementwise("div", "DIV", "div")
maximum = _elementwise("maximum", "MAX", "max")
minimum = _elementwise("minimum", "MIN", "min")
power = _elementwise("power", "POW", "pow")


def unary(g: Graph, x: Tensor, op: str, name: str) -> Tensor:
    """``op`` names a ``UnaryOperation`` member (``"EXP"``, ``"SQRT"``, ``"COS"``...)."""
    return g.named(g.network.add_unary(x, getattr(g.trt.UnaryOperation, op)), name)


def reduce(g: Graph, x: Tensor, op: str, axes: Sequence[int], keep_dims: bool = True, name: str = "reduce") -> Tensor:
    """Reduce over ``axes`` (negative allowed) with the ``ReduceOperation`` named ``op``."""
    rank = len(x.shape)
    mask = 0
    for a in axes:
        mask |= 1 << (a % rank)
    layer = g.network.add_reduce(x, getattr(g.trt.ReduceOperation, op), mask, keep_dims)
    return g.named(layer, name)


def softmax(g: Graph, x: Tensor, axis: int = -1, name: str = "softmax") -> Tensor:
    """Softmax along ``axis``."""
    layer = g.network.add_softmax(x)
    layer.axes = 1 << (axis % len(x.shape))
    return g.named(layer, name)


def matmul(g: Graph, a: Tensor, b: Tensor, transpose_b: bool = False, name: str = "matmul") -> Tensor:
    """Batched matrix product ``a @ b`` (or ``a @ b^T``); ranks must be equal, batch dims broadcast."""
    mo = g.trt.MatrixOperation
    layer = g.network.add_matrix_multiply(a, mo.NONE, b, mo.TRANSPOSE if transpose_b else mo.NONE)
    return g.named(layer, name)


# ---------------------------------------------------------------------------------------
# neural-network ops
# ---------------------------------------------------------------------------------------


#: the tensor-parallel styles of :func:`linear`'s ``parallel``
PARALLEL_STYLES = ("column", "row", "vocab")

Weight = np.ndarray | LazyTensor


def read_weight(w: Any, axis: int = 0, start: int = 0, stop: int | None = None) -> Any:
    """The slice ``[start, stop)`` along ``axis`` of a weight (all of it by default): a
    :class:`~trtcore.checkpoint.LazyTensor` reads only that slice from the checkpoint, an
    array is sliced (a view), a :class:`~trtcore.quantization.QuantizedWeight`, an
    :class:`~trtcore.fp8.Fp8Weight` or None is returned as it is when the whole is asked for."""
    if w is None or (isinstance(w, (QuantizedWeight, Fp8Weight)) and start == 0 and stop is None):
        return w
    if isinstance(w, LazyTensor):
        return w.read(axis, start, stop)
    if isinstance(w, (QuantizedWeight, Fp8Weight)):
        raise InvalidArgumentError("tensor parallelism does not slice quantized weights yet; use an unquantized checkpoint")
    a = np.asarray(w)
    index = [slice(None)] * a.ndim
    index[axis % a.ndim] = slice(start, stop)
    return a[tuple(index)]


def linear(
    g: Graph,
    x: Tensor,
    weight: Weight | QuantizedWeight | Fp8Weight,
    bias: Weight | None = None,
    name: str = "linear",
    parallel: str | None = None,
) -> Tensor:
    """``x @ weight.T + bias`` (``torch.nn.Linear``).

    Args:
        x: ``[..., in_features]`` of the graph dtype (``parallel="row"``: this rank's share
            of the input features, the output of a column-parallel op).
        weight: ``[out_features, in_features]`` (Hugging Face layout), any float dtype, an
            array or a :class:`~trtcore.checkpoint.LazyTensor` (then only this rank's slice is
            read); stored as a constant of the graph dtype. A
            :class:`~trtcore.quantization.QuantizedWeight` (a quantized checkpoint's linear)
            stays quantized: :func:`weight_only_linear`; an :class:`~trtcore.fp8.Fp8Weight`
            runs as an FP8 GEMM: :func:`fp8_linear`.
        bias: ``[out_features]`` or None.
        parallel: with ``g.mapping.tp_size > 1`` (Megatron-LM, arXiv:1909.08053, section 3):
            ``"column"``: this rank's even share of the output features (weight rows, bias);
            ``"row"``: the share of the input features (weight columns), the partial products
            summed over ranks by :func:`all_reduce`, then the whole bias added once;
            ``"vocab"`` (the LM head): ``ceil(out_features / tp_size)`` rows per rank (the last
            zero-padded), the ranks' outputs joined by :func:`all_gather` and the padding
            dropped: the whole ``[..., out_features]`` on every rank. None: not split.

    Returns:
        ``[..., out_features]`` of the graph dtype (``"column"``: this rank's share), named ``name``.

    Raises:
        InvalidArgumentError: an unknown ``parallel``; a quantized weight with tensor parallelism.
        ConfigError: ``tp_size`` does not divide the split dimension.
        NetworkError: the weight does not fit ``x``.
    """
    if parallel is not None and parallel not in PARALLEL_STYLES:
        raise InvalidArgumentError(f"{name}: parallel={parallel!r} is not one of {PARALLEL_STYLES}")
    m = g.mapping
    if m.parallel and parallel is not None:
        if isinstance(weight, (QuantizedWeight, Fp8Weight)):
            raise InvalidArgumentError(f"{name}: tensor parallelism does not slice quantized weights yet; use an unquantized checkpoint")
        out_f, in_f = weight.shape
        if parallel == "column":
            lo, hi = m.split(out_f, f"{name} out_features")
            return linear(g, x, read_weight(weight, 0, lo, hi), read_weight(bias, 0, lo, hi), name)
        if parallel == "row":
            lo, hi = m.split(in_f, f"{name} in_features")
            partial = linear(g, x, read_weight(weight, 1, lo, hi), None, f"{name}.partial")
            y = all_reduce(g, partial, name if bias is None else f"{name}.all_reduce")
            if bias is not None:
                whole: np.ndarray = read_weight(bias)
                y = add(g, y, constant(g, whole.reshape((1,) * (len(x.shape) - 1) + whole.shape), f"{name}.bias", g.np_dtype), name)
            return y
        return _vocab_parallel_linear(g, x, weight, bias, name)
    wt: Any = read_weight(weight)
    bs: np.ndarray | None = read_weight(bias)
    if isinstance(wt, QuantizedWeight):
        return weight_only_linear(g, x, wt, bs, name)
    if isinstance(wt, Fp8Weight):
        return fp8_linear(g, x, wt, bs, name)
    if wt.ndim != 2 or (x.shape[-1] != -1 and x.shape[-1] != wt.shape[1]):
        raise NetworkError(f"{name}: weight {wt.shape} does not fit input {tuple(x.shape)}")
    rank = len(x.shape)
    w = constant(g, wt.reshape((1,) * (rank - 2) + wt.shape), f"{name}.weight", g.np_dtype)
    y = matmul(g, x, w, transpose_b=True, name=name if bs is None else f"{name}.matmul")
    if bs is not None:
        b = constant(g, bs.reshape((1,) * (rank - 1) + bs.shape), f"{name}.bias", g.np_dtype)
        y = add(g, y, b, name)
    return y


#: implementations of :func:`weight_only_linear`: trtcore's plugin, or TensorRT's dequantize layer feeding a matmul
WEIGHT_ONLY_IMPLEMENTATIONS = ("plugin", "dequantize")


def weight_only_linear(
    g: Graph, x: Tensor, qw: QuantizedWeight, bias: np.ndarray | None = None, name: str = "linear", impl: str | None = None
) -> Tensor:
    """``x @ dequant(qw)^T + bias`` for a weight-only quantized weight (:class:`trtcore.quantization.QuantizedWeight`, ``[N, K]``).

    Args:
        x: ``[..., K]`` float16/bfloat16/float32 (the graph dtype in models).
        qw: the weight; int4/int8 codes, group-wise or per-channel scales, optional zero
            points and act-order ``perm``.
        bias: ``[N]`` or None (added in x's dtype).
        impl: ``"plugin"`` (:class:`trtcore.plugins.weight_only_gemm.WeightOnlyGemmPlugin`, the
            weight repacked once here into the kernels' layout) or ``"dequantize"`` (TensorRT's
            ``IDequantizeLayer`` on signed int4/int8 codes with block scales of x's dtype,
            feeding a matmul; a zero point ``z != 2**(bits-1)`` adds the float32 term
            ``sum_g xsum[..., g] * (2**(bits-1) - z[n, g]) * s[n, g]``, ``xsum`` the sums of x
            over each group). Default: ``g.implementations["weight_only_gemm"]`` if set, else
            the plugin where the TensorRT module hosts plugins, the dequantize layer where not.
            On ``trtcore.reference``, which has no dequantize layer, ``"dequantize"`` is
            emulated by a cast and a multiply of the same signed codes and rounded scales.

    Returns:
        ``[..., N]`` of x's dtype, named ``name``.

    Raises:
        NetworkError: x's last dimension is not K, or the bias is not ``[N]``.
        InvalidArgumentError: unknown ``impl``.
    """
    n, k = qw.shape
    if x.shape[-1] != -1 and x.shape[-1] != k:
        raise NetworkError(f"{name}: quantized weight [{n}, {k}] does not fit input {tuple(x.shape)}")
    if bias is not None and bias.shape != (n,):
        raise NetworkError(f"{name}: bias must be [{n}], got {bias.shape}")
    if impl is None:  # the plugin where the network can host plugins (tensorrt_rtx cannot)
        from trtcore.plugins.base import hosts_plugins

        impl = g.implementations.get("weight_only_gemm") or ("plugin" if hosts_plugins(g.trt) else "dequantize")
    if impl not in WEIGHT_ONLY_IMPLEMENTATIONS:
        raise InvalidArgumentError(f"{name}: weight-only GEMM implementation {impl!r} is not one of {WEIGHT_ONLY_IMPLEMENTATIONS}")
    np_x = _np_of(g, x)
    with g.scope(name):
        y = _weight_only_plugin(g, x, qw) if impl == "plugin" else _weight_only_dequantize(g, x, qw, np_x)
    if bias is not None:
        y = add(g, y, constant(g, bias.reshape((1,) * (len(x.shape) - 1) + bias.shape), f"{name}.bias", np_x), name)
    else:
        y.name = g.unique(name)
    return y


_log = logging.getLogger("trtcore.ops")


def _one_fp8_scale(weights: list[Any]) -> list[Any]:
    """The linears of one packed module (q/k/v, gate/up) with one per-tensor FP8 scale when all
    are per-tensor FP8 (:func:`trtcore.fp8.share_tensor_scale`, as vLLM loads them: the cuda
    engine then runs them as one GEMM), else as they are."""
    if len(weights) > 1 and all(isinstance(w, Fp8Weight) for w in weights):
        return list(share_tensor_scale(weights))
    return weights


def _np_of(g: Graph, x: Tensor) -> np.dtype:
    """The NumPy dtype of ``x`` (one of the engine dtypes)."""
    for d in _NP_DTYPES.values():
        if g.trt_type(d) == x.dtype:
            return np.dtype(d)
    raise NetworkError(f"tensor {x.name!r} has type {x.dtype}, expected one of {sorted(_NP_DTYPES)}")


def _weight_only_plugin(g: Graph, x: Tensor, qw: QuantizedWeight) -> Tensor:
    from trtcore.plugins.base import create
    from trtcore.plugins.weight_only_gemm import WeightOnlyGemmPlugin

    plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
    parts = ["codes", "scales"] + ["zeros"] * (packed.zeros is not None) + ["perm"] * (packed.perm is not None)
    consts = [constant(g, a, f"weight.{part}") for a, part in zip(packed.arrays(), parts)]
    layer = g.network.add_plugin_v3([x, *consts], [], create(plugin, g.trt))
    return g.named(layer, "plugin")


def _weight_only_dequantize(g: Graph, x: Tensor, qw: QuantizedWeight, np_x: np.dtype) -> Tensor:
    n, k = qw.shape
    rank = len(x.shape)
    mid = 1 << (qw.bits - 1)
    if qw.perm is not None:
        x = gather_const(g, x, qw.perm.tolist(), rank - 1, "perm")
    signed = (qw.codes.astype(np.int16) - mid).astype(np.int8)  # [-2^(b-1), 2^(b-1)): int4 / int8
    scales = constant(g, qw.scales, "weight.scales", np_x)
    if hasattr(g.network, "add_dequantize"):
        if qw.bits == 4:  # TensorRT's INT4: two per byte, the first element in the low nibble
            nib = (signed.reshape(n, k // 2, 2).astype(np.uint8) & 0xF).astype(np.uint8)
            data = np.ascontiguousarray(nib[..., 0] | (nib[..., 1] << 4))
            g.keepalive.append(data)
            codes = g.named(g.network.add_constant((n, k), g.trt.Weights(g.trt.int4, data.ctypes.data, n * k)), "weight.codes")
        else:
            codes = constant(g, signed, "weight.codes")
        w = g.named(g.network.add_dequantize(codes, scales, g.trt_type(np_x)), "weight.dequantize")
    else:  # trtcore.reference: the dequantize layer's arithmetic, code * scale, in layers
        codes = cast(g, constant(g, signed, "weight.codes"), np.float32, "weight.codes_f32")
        per_group = reshape(g, codes, (n, k // qw.group_size, qw.group_size), "weight.grouped")
        s3 = reshape(g, cast(g, scales, np.float32, "weight.scales_f32"), (n, k // qw.group_size, 1), "weight.scales3")
        w = cast(g, reshape(g, mul(g, per_group, s3, "weight.scaled"), (n, k), "weight.flat"), np_x, "weight.dequantize")
    w = reshape(g, w, (1,) * (rank - 2) + (n, k), "weight.rank") if rank != 2 else w
    y = matmul(g, x, w, transpose_b=True, name="matmul")
    if qw.zeros is None or np.all(qw.zeros == mid):
        return y
    # (q - z) s = (q - mid) s + (mid - z) s: the second term is constant over each group
    corr = ((mid - qw.zeros.astype(np.float64)) * qw.scales.astype(np.float64)).astype(np.float32)
    groups = k // qw.group_size
    xg = reshape(g, cast(g, x, np.float32, "x_f32"), (0,) * (rank - 1) + (groups, qw.group_size), "x_grouped")
    xsum = reduce(g, xg, "SUM", [-1], keep_dims=False, name="x_group_sums")
    c = constant(g, corr.reshape((1,) * (rank - 2) + corr.shape), "zero_point_term.weight")
    term = cast(g, matmul(g, xsum, c, transpose_b=True, name="zero_point_term"), np_x, "zero_point_term.cast")
    return add(g, y, term, "sum")


#: implementations of :func:`fp8_linear`: trtcore's cuBLASLt plugin, or TensorRT's quantize / dequantize layers feeding a matmul
FP8_IMPLEMENTATIONS = ("plugin", "qdq")
#: the smallest normal float32: the floor of a dynamic activation scale (an all-zero x gives zeros for any scale)
_MIN_SCALE = float(np.finfo(np.float32).tiny)


def fp8_linear(g: Graph, x: Tensor, fw: Fp8Weight, bias: np.ndarray | None = None, name: str = "linear", impl: str | None = None) -> Tensor:
    """``x @ W^T + bias`` for an FP8 (E4M3) weight with x quantized to FP8 too (:mod:`trtcore.fp8`:
    ``(e4m3(x / s_x) * s_x) @ (q_w * s_w)^T``, ``s_x`` static, dynamic, or dynamic per token:
    ``fw.per_token``, one ``s_x`` per row of x).

    Args:
        x: ``[..., K]`` float16/bfloat16/float32.
        fw: the :class:`~trtcore.fp8.Fp8Weight` ``[N, K]``.
        bias: ``[N]`` or None (added in x's dtype).
        impl: ``"plugin"`` (:class:`trtcore.plugins.fp8_gemm.Fp8GemmPlugin`: cuBLASLt's FP8 GEMM
            on the GPU) or ``"qdq"``: explicit quantize / dequantize for TensorRT (strongly
            typed): x cast to float32, ``IQuantizeLayer`` to FP8 with ``s_x`` (a constant, or
            ``max(max|x| / 448, 2**-126)`` computed in the network), ``IDequantizeLayer`` back
            to float32, the FP8 weight constant through an ``IDequantizeLayer`` with ``s_w``
            (per tensor, or per channel on axis 0), a float32 matmul, a cast to x's dtype --
            the pattern TensorRT fuses into an FP8 GEMM. On ``trtcore.reference``, which has no
            quantize layer, ``"qdq"`` computes the same in standard layers, exactly as
            :mod:`trtcore.fp8` defines it: ``x / s_x`` in float32, clipped to ``[-448, 448]``,
            cast to FP8 (round to nearest even), back to float32, multiplied by the E4M3
            weight values (float32 constants, exact), then by ``s_w`` and ``s_x``. Default:
            ``g.implementations["fp8_gemm"]`` if set, else on ``trtcore.reference`` and
            ``trtcore.cuda`` the plugin (its NumPy reference; cuBLASLt's FP8 GEMM) when K and N
            are multiples of 16, else ``"qdq"`` (TensorRT fuses the Q/DQ pattern into its own
            FP8 GEMM). On cuda the plugin is cuBLASLt's FP8 GEMM with the scales as a device
            alpha (:class:`trtcore.cuda.cublaslt.Fp8Matmul`), which passed on the H200
            (``bench/fp8_probe.py``, ``tests/cuda/test_fp8_gemm_gpu.py``). Per-token
            activations with ``"qdq"``: the emulation (reference and cuda backends) reduces
            ``max|x|`` over the last axis instead (one scale per row, broadcast); TensorRT's
            quantize layer takes no per-row scale computed in the network, so ``"qdq"`` (the
            default there) on TensorRT refuses a per-token weight (``"plugin"`` where the
            network takes plugins; TensorRT-RTX has no ``add_plugin_v3``).

    Returns:
        ``[..., N]`` of x's dtype, named ``name``.

    Raises:
        NetworkError: x's last dimension is not K, or the bias is not ``[N]``.
        InvalidArgumentError: unknown ``impl``, or ``"qdq"`` for a per-token weight on TensorRT.
    """
    n, k = fw.shape
    if x.shape[-1] != -1 and x.shape[-1] != k:
        raise NetworkError(f"{name}: FP8 weight [{n}, {k}] does not fit input {tuple(x.shape)}")
    if bias is not None and bias.shape != (n,):
        raise NetworkError(f"{name}: bias must be [{n}], got {bias.shape}")
    from trtcore.trt import backend_name

    backend = backend_name(g.trt)
    if impl is None:
        fits = k % 16 == 0 and n % 16 == 0
        impl = g.implementations.get("fp8_gemm") or ("plugin" if backend in ("reference", "cuda") and fits else "qdq")
        if backend == "cuda" and impl == "qdq" and "fp8_unaligned" not in g.warned:
            g.warned.add("fp8_unaligned")
            _log.warning(
                f"{name}: FP8 weight [{n}, {k}]: cuBLASLt's FP8 GEMM needs K and N multiples of 16, so this network's "
                "FP8 linears of such shapes run as quantize / dequantize layers with a float32 matmul (same numbers, slower)"
            )
    if impl not in FP8_IMPLEMENTATIONS:
        raise InvalidArgumentError(f"{name}: FP8 GEMM implementation {impl!r} is not one of {FP8_IMPLEMENTATIONS}")
    if impl == "qdq" and fw.per_token and hasattr(g.network, "add_quantize"):
        raise InvalidArgumentError(
            f"{name}: FP8 per-token dynamic activations are not built with TensorRT's quantize / dequantize layers (impl='qdq': "
            "its quantize layer takes a per-tensor scale computed in the network, not one per row); build on the reference or "
            "cuda backend (--backend cuda), or in Python use impl='plugin' (g.implementations['fp8_gemm'] = 'plugin') where the "
            "network takes plugins"
        )
    np_x = _np_of(g, x)
    with g.scope(name):
        if impl == "plugin":
            from trtcore.plugins.base import create
            from trtcore.plugins.fp8_gemm import Fp8GemmPlugin

            plugin, consts = Fp8GemmPlugin.from_fp8(fw)
            parts = ("weight", "weight_scale", "input_scale")
            tensors = [constant(g, a, part) for a, part in zip(consts, parts)]
            y = g.named(g.network.add_plugin_v3([x, *tensors], [], create(plugin, g.trt)), "plugin")
        else:
            y = _fp8_qdq(g, x, fw, np_x)
    if bias is not None:
        y = add(g, y, constant(g, bias.reshape((1,) * (len(x.shape) - 1) + bias.shape), f"{name}.bias", np_x), name)
    else:
        y.name = g.unique(name)
    return y


def _fp8_scalar(g: Graph, value: np.ndarray | float, rank: int, name: str) -> Tensor:
    """A float32 constant of shape ``[1] * rank``, or 0-D for ``rank=0`` (TensorRT's per-tensor scale)."""
    c = constant(g, np.full((1,) * max(rank, 1), value, np.float32), name)
    return c if rank else reshape(g, c, (), f"{name}.scalar")


def _fp8_input_scale(g: Graph, xf: Tensor, fw: Fp8Weight, rank: int) -> Tensor:
    """x's scale: the static ``input_scale`` or ``max(max|x| / 448, 2**-126)``, 0-D (``rank=0``,
    TensorRT's quantize layer) or ``[1] * rank`` (broadcasting, the reference's emulation);
    per token (``fw.per_token``, emulation only): the max over the last axis, ``[..., 1]``."""
    if fw.input_scale is not None:
        return _fp8_scalar(g, fw.input_scale[0], rank, "input_scale")
    axes = [len(xf.shape) - 1] if fw.per_token else list(range(len(xf.shape)))
    amax = reduce(g, unary(g, xf, "ABS", "x_abs"), "MAX", axes, keep_dims=rank != 0, name="x_amax")
    s = div(g, amax, _fp8_scalar(g, E4M3_MAX, rank, "e4m3_max"), "x_scale_raw")
    return maximum(g, s, _fp8_scalar(g, _MIN_SCALE, rank, "min_scale"), "x_scale")


def _fp8_qdq(g: Graph, x: Tensor, fw: Fp8Weight, np_x: np.dtype) -> Tensor:
    n, k = fw.shape
    rank = len(x.shape)
    lead = (1,) * (rank - 2)
    xf = x if np_x == np.float32 else cast(g, x, np.float32, "x_f32")
    if hasattr(g.network, "add_quantize"):  # TensorRT: Q/DQ on x, DQ on the FP8 weight
        fp8 = g.trt.DataType.FP8
        s_x = _fp8_input_scale(g, xf, fw, 0)
        q = g.named(g.network.add_quantize(xf, s_x, fp8), "input.quantize")
        xd = g.named(g.network.add_dequantize(q, s_x, g.trt.float32), "input.dequantize")
        data = np.ascontiguousarray(fw.weight)
        g.keepalive.append(data)
        wq = g.named(g.network.add_constant((n, k), g.trt.Weights(fp8, data.ctypes.data, n * k)), "weight")
        per_channel = fw.per_channel
        s_w = constant(g, fw.weight_scale, "weight_scale") if per_channel else _fp8_scalar(g, fw.weight_scale[0], 0, "weight_scale")
        layer = g.network.add_dequantize(wq, s_w, g.trt.float32)
        if per_channel:
            layer.axis = 0
        wd = g.named(layer, "weight.dequantize")
        wd = reshape(g, wd, lead + (n, k), "weight.rank") if rank != 2 else wd
        y = matmul(g, xd, wd, transpose_b=True, name="matmul")
    else:  # trtcore.reference: the same arithmetic in standard layers, scales after the product
        s_x = _fp8_input_scale(g, xf, fw, rank)
        v = div(g, xf, s_x, "input.scaled")
        clip = g.network.add_activation(v, g.trt.ActivationType.CLIP)
        clip.alpha, clip.beta = -E4M3_MAX, E4M3_MAX
        q = cast(g, g.named(clip, "input.clip"), E4M3, "input.quantize")
        qf = cast(g, q, np.float32, "input.values")
        w = constant(g, from_e4m3(fw.weight).astype(np.float32).reshape(lead + (n, k)), "weight.values")
        y = matmul(g, qf, w, transpose_b=True, name="matmul")
        y = mul(g, y, constant(g, fw.weight_scale.reshape((1,) * (rank - 1) + (-1,)), "weight_scale"), "weight_scaled")
        y = mul(g, y, s_x, "scaled")
    return y if np_x == np.float32 else cast(g, y, np_x, "output")


def embedding(g: Graph, ids: Tensor, table: Weight, name: str = "embed_tokens", scale: float | None = None) -> Tensor:
    """Look up rows of ``table`` (``[vocab_size, hidden_size]``, an array or a
    :class:`~trtcore.checkpoint.LazyTensor`) for int32 ``ids`` ``[...]``.

    ``scale``: each row multiplied by it, the factor first rounded to the graph dtype (Gemma's
    ``sqrt(hidden_size)``: transformers' ``*ScaledWordEmbedding`` multiplies by
    ``embed_scale.to(weight.dtype)``); the lookup is then ``{name}.lookup``. Output:
    ``[..., hidden_size]`` of the graph dtype, named ``name``.

    With ``g.mapping.tp_size > 1`` the table is vocabulary-parallel (Megatron-LM's
    ``VocabParallelEmbedding``): this rank holds ``ceil(vocab_size / tp_size)`` rows
    (:meth:`trtcore.parallel.Mapping.vocab`), looks up ``ids`` in its rows (two constant
    gathers map an id to its local row and to 1 or 0, whether the rank holds it), zeroes the
    others, and :func:`all_reduce` adds the ranks' rows: exactly one rank contributes each row.
    """
    m = g.mapping
    looked_up = name if scale is None else f"{name}.lookup"
    if not m.parallel:
        rows = gather(g, constant(g, read_weight(table), f"{name}.weight", g.np_dtype), ids, 0, looked_up)
    else:
        rows = _vocab_parallel_lookup(g, ids, table, name, looked_up)
    if scale is None:
        return rows
    return mul(g, rows, scalar(g, scale, len(rows.shape), g.np_dtype, f"{name}.embed_scale"), name)


def _vocab_parallel_lookup(g: Graph, ids: Tensor, table: Weight, name: str, out_name: str) -> Tensor:
    """:func:`embedding` over tensor-parallel ranks (see there), named ``out_name``."""
    m = g.mapping
    vocab = table.shape[0]
    start, stop, _ = m.vocab(vocab)
    local = np.zeros(vocab, np.int32)
    local[start:stop] = np.arange(stop - start, dtype=np.int32)
    held = np.zeros(vocab, np.float32)
    held[start:stop] = 1.0
    with g.scope(name):
        local_ids = gather(g, constant(g, local, "local_ids"), ids, 0, "local_ids_of")
        rows = gather(g, constant(g, _vocab_rows(g, table), "weight", g.np_dtype), local_ids, 0, "lookup")
        keep = gather(g, constant(g, held, "held", g.np_dtype), ids, 0, "held_of")
        masked = mul(g, rows, reshape(g, keep, (0,) * len(ids.shape) + (1,), "held_col"), "masked")
    return all_reduce(g, masked, out_name)


def _vocab_rows(g: Graph, table: Weight) -> np.ndarray:
    """This rank's ``ceil(vocab / tp_size)`` rows of ``table`` (zero rows past the vocabulary),
    made once per table (a tied LM head shares the embedding's)."""
    key = ("vocab_rows", id(table))
    if key not in g.shared:
        start, stop, rows = g.mapping.vocab(table.shape[0])
        part = read_weight(table, 0, start, stop)
        if stop - start < rows:
            part = np.concatenate([part, np.zeros((rows - (stop - start), *part.shape[1:]), part.dtype)])
        g.shared[key] = (table, part)  # holding the table keeps its id from being reused
    return g.shared[key][1]  # type: ignore[no-any-return]


def _vocab_parallel_linear(g: Graph, x: Tensor, weight: Weight, bias: Weight | None, name: str) -> Tensor:
    """:func:`linear` with ``parallel="vocab"``: the rank's rows, then the ranks' outputs gathered."""
    vocab = weight.shape[0]
    _, _, rows = g.mapping.vocab(vocab)
    r = len(x.shape)
    with g.scope(name):
        b = None
        if bias is not None:
            start, stop, _ = g.mapping.vocab(vocab)
            b = np.zeros(rows, np.float32)
            b[: stop - start] = read_weight(bias, 0, start, stop)
        part = linear(g, x, _vocab_rows(g, weight), b, "partial")  # [..., rows]
        last_first = [r - 1, *range(r - 1)]
        gathered = all_gather(g, transpose(g, part, last_first, "vocab_first"), "all_gather")  # [tp * rows, ...]
        y = transpose(g, gathered, [*range(1, r), 0], "vocab_last")
        if rows * g.mapping.tp_size != vocab:
            y = gather_const(g, y, range(vocab), r - 1, "unpad")
    y.name = g.unique(name)
    return y


#: implementations of :func:`all_reduce` / :func:`all_gather`: trtcore's collective plugin
#: (NCCL on the GPU, the simulated ranks on the reference backend) or TensorRT's
#: ``IDistCollectiveLayer`` (``add_dist_collective``, TensorRT 10.16+ / TensorRT-RTX 1.7)
COLLECTIVE_IMPLEMENTATIONS = ("plugin", "native")


def _collective(g: Graph, x: Tensor, collective: str, name: str) -> Tensor:
    m = g.mapping
    if not m.parallel:
        return x
    from trtcore.plugins.base import create, hosts_plugins

    impl = g.implementations.get("collective") or ("plugin" if hosts_plugins(g.trt) else "native")
    if impl not in COLLECTIVE_IMPLEMENTATIONS:
        raise InvalidArgumentError(f"{name}: collective implementation {impl!r} is not one of {COLLECTIVE_IMPLEMENTATIONS}")
    if impl == "plugin":
        from trtcore.plugins.collective import CollectivePlugin

        plugin = CollectivePlugin(collective=collective, group=m.group, rank=m.tp_rank, world_size=m.tp_size)
        return g.named(g.network.add_plugin_v3([x], [], create(plugin, g.trt)), name)
    if not hasattr(g.network, "add_dist_collective"):
        raise InvalidArgumentError(f"{name}: {getattr(g.trt, '__name__', g.trt)} has neither plugins nor IDistCollectiveLayer for the {collective}")
    op = getattr(g.trt.CollectiveOperation, collective.upper())
    reduce_op = g.trt.ReduceOperation.SUM if collective == "all_reduce" else g.trt.ReduceOperation.NONE
    layer = g.network.add_dist_collective(x, op, reduce_op, -1, None)
    layer.num_ranks = m.tp_size
    return g.named(layer, name)


def all_reduce(g: Graph, x: Tensor, name: str = "all_reduce") -> Tensor:
    """The elementwise sum of ``x`` over the ranks of ``g.mapping`` (every rank gets it);
    ``x`` itself with one rank. Implementation: ``g.implementations["collective"]`` if set,
    else the collective plugin where the module hosts plugins, else TensorRT's
    ``IDistCollectiveLayer`` (:data:`COLLECTIVE_IMPLEMENTATIONS`).

    Raises:
        InvalidArgumentError: the module has neither.
    """
    return _collective(g, x, "all_reduce", name)


def all_gather(g: Graph, x: Tensor, name: str = "all_gather") -> Tensor:
    """``x`` ``[d0, ...]`` of every rank of ``g.mapping`` concatenated along the first axis,
    rank-major: ``[tp_size * d0, ...]`` (NCCL's ``ncclAllGather``); ``x`` itself with one rank.
    Implementations as :func:`all_reduce`."""
    return _collective(g, x, "all_gather", name)


def rms_norm(g: Graph, x: Tensor, weight: np.ndarray, eps: float, name: str = "norm", offset: float | None = None) -> Tensor:
    """RMSNorm (Zhang & Sennrich, arXiv:1910.07467) over the last axis.

    ``offset`` None (``LlamaRMSNorm``): ``weight * (x32 / sqrt(mean(x32**2) + eps)).to(dtype)``
    with ``x32`` = x in float32. ``offset`` a number (Gemma's ``GemmaRMSNorm`` / ``Gemma2RMSNorm``
    / ``Gemma3RMSNorm``, offset 1): ``((x32 / sqrt(mean(x32**2) + eps)) * (offset + weight32)).to(dtype)``,
    the weight applied in float32 before the one rounding to the dtype. ``x`` is
    ``[..., hidden]``, ``weight`` ``[hidden]``. Output: the graph dtype, named ``name``.
    """
    rank = len(x.shape)
    with g.scope(name):
        x32 = cast(g, x, np.float32, "to_float")
        sq = mul(g, x32, x32, "square")
        var = reduce(g, sq, "AVG", [-1], True, "variance")
        var = add(g, var, scalar(g, eps, rank, np.float32, "eps"), "add_eps")
        inv = unary(g, unary(g, var, "SQRT", "sqrt"), "RECIP", "rsqrt")
        normed32 = mul(g, x32, inv, "normalize")
        if offset is None:
            normed = cast(g, normed32, g.np_dtype, "to_dtype")
    if offset is not None:
        # (offset + w) in float32, as float(offset) + weight.float() (exact for offset 1 and a weight of dtype precision)
        w32 = constant(
            g, (np.float32(offset) + np.asarray(weight, np.float32)).reshape((1,) * (rank - 1) + weight.shape), f"{name}.weight", np.float32
        )
        y = mul(g, normed32, w32, f"{name}.scaled")
        return cast(g, y, g.np_dtype, name) if g.np_dtype != np.float32 else g.named(g.network.add_identity(y), name)
    w = constant(g, weight.reshape((1,) * (rank - 1) + weight.shape), f"{name}.weight", g.np_dtype)
    return mul(g, normed, w, name)


def soft_cap(g: Graph, x: Tensor, cap: float, name: str = "softcap") -> Tensor:
    """Logit soft-capping ``cap * tanh(x / cap)`` (Gemma 2, Team Gemma arXiv:2408.00118, section 2;
    transformers: ``x / softcap``, ``torch.tanh``, ``* softcap``), computed in float32.

    Args:
        x: any shape, float32/float16/bfloat16.
        cap: the cap, > 0 (``attn_logit_softcapping`` / ``final_logit_softcapping``).

    Returns:
        x's shape and type, named ``name``.

    Raises:
        InvalidArgumentError: ``cap`` is not a positive finite number.
    """
    if not (isinstance(cap, (int, float)) and np.isfinite(cap) and cap > 0):
        raise InvalidArgumentError(f"{name}: soft-cap {cap!r} must be a positive finite number")
    rank = len(x.shape)
    np_x = _np_of(g, x)
    with g.scope(name):
        c = scalar(g, cap, rank, np.float32, "cap")
        x32 = cast(g, x, np.float32, "to_float")
        t = g.named(g.network.add_activation(div(g, x32, c, "divided"), g.trt.ActivationType.TANH), "tanh")
        y = mul(g, t, c, "capped")
    return cast(g, y, np_x, name) if np_x != np.float32 else g.named(g.network.add_identity(y), name)


def layer_norm(g: Graph, x: Tensor, weight: np.ndarray, bias: np.ndarray | None, eps: float, name: str = "norm") -> Tensor:
    """LayerNorm (Ba et al., arXiv:1607.06450) over the last axis, as ``torch.nn.LayerNorm``.

    Computes ``((x32 - mean) / sqrt(var + eps) * weight + bias).to(dtype)`` with ``x32`` = x
    in float32 and ``var`` the biased variance ``mean((x32 - mean)**2)`` (PyTorch's kernel
    accumulates in float32 and rounds once, at the output). Composed of reduce/elementwise
    layers (``trtcore.reference`` has no ``INormalizationLayer``).

    Args:
        x: ``[..., hidden]`` of the graph dtype.
        weight: ``[hidden]``; bias: ``[hidden]`` or None (``nn.LayerNorm(bias=False)``).
        eps: added to the variance, > 0.

    Returns:
        ``[..., hidden]`` of the graph dtype, named ``name``.

    Raises:
        NetworkError: weight or bias is not ``[hidden]``.
    """
    hidden = x.shape[-1]
    for what, a in (("weight", weight), ("bias", bias)):
        if a is not None and (a.ndim != 1 or (hidden != -1 and a.shape[0] != hidden)):
            raise NetworkError(f"{name}: {what} {a.shape} does not fit input {tuple(x.shape)}, expected [{hidden}]")
    rank = len(x.shape)
    with g.scope(name):
        x32 = cast(g, x, np.float32, "to_float")
        mean = reduce(g, x32, "AVG", [-1], True, "mean")
        centered = sub(g, x32, mean, "centered")
        var = reduce(g, mul(g, centered, centered, "square"), "AVG", [-1], True, "variance")
        var = add(g, var, scalar(g, eps, rank, np.float32, "eps"), "add_eps")
        inv = unary(g, unary(g, var, "SQRT", "sqrt"), "RECIP", "rsqrt")
        y = mul(g, mul(g, centered, inv, "normalize"), constant(g, weight.reshape((1,) * (rank - 1) + weight.shape), "weight", np.float32), "scaled")
        if bias is not None:
            y = add(g, y, constant(g, bias.reshape((1,) * (rank - 1) + bias.shape), "bias", np.float32), "shifted")
    return cast(g, y, g.np_dtype, name) if g.np_dtype != np.float32 else g.named(g.network.add_identity(y), name)


#: ``hidden_act`` (transformers' ``ACT2FN`` names) -> TensorRT ``ActivationType`` of :func:`gelu`:
#: ``"gelu"`` is the exact erf form (``nn.GELU()``); ``"gelu_new"`` / ``"gelu_pytorch_tanh"``
#: the tanh approximation (``nn.GELU(approximate="tanh")``, Hendrycks & Gimpel, arXiv:1606.08415).
GELU_ACTIVATIONS = {"gelu": "GELU_ERF", "gelu_new": "GELU_TANH", "gelu_pytorch_tanh": "GELU_TANH"}


def gelu(g: Graph, x: Tensor, approximate: str = "none", name: str = "gelu") -> Tensor:
    """GELU ``x * Phi(x)`` (Hendrycks & Gimpel, arXiv:1606.08415), as ``torch.nn.GELU``.

    ``approximate="none"``: ``0.5 x (1 + erf(x / sqrt 2))`` (``ActivationType.GELU_ERF``);
    ``"tanh"``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (``GELU_TANH``).
    Output: x's shape and type.

    Raises:
        InvalidArgumentError: ``approximate`` is neither ``"none"`` nor ``"tanh"``.
    """
    kinds = {"none": "GELU_ERF", "tanh": "GELU_TANH"}
    if approximate not in kinds:
        raise InvalidArgumentError(f"{name}: gelu approximate={approximate!r}, expected 'none' or 'tanh'")
    return g.named(g.network.add_activation(x, getattr(g.trt.ActivationType, kinds[approximate])), name)


def gelu_mlp(
    g: Graph,
    x: Tensor,
    up: tuple[np.ndarray, np.ndarray | None],
    down: tuple[np.ndarray, np.ndarray | None],
    hidden_act: str = "gelu",
    names: tuple[str, str] = ("dense_h_to_4h", "dense_4h_to_h"),
    name: str = "mlp",
) -> Tensor:
    """``down(act(up(x)))``, the ungated MLP of GPT-NeoX / GPT-2 (``GPTNeoXMLP``).

    Args:
        x: ``[..., hidden]``.
        up, down: ``(weight [out, in], bias [out] or None)`` of the two projections.
        hidden_act: a key of :data:`GELU_ACTIVATIONS`.
        names: the two projections' layer names.

    Raises:
        InvalidArgumentError: ``hidden_act`` is not one of :data:`GELU_ACTIVATIONS`.
    """
    if hidden_act not in GELU_ACTIVATIONS:
        raise InvalidArgumentError(f"{name}: hidden_act {hidden_act!r} is not supported; expected one of {sorted(GELU_ACTIVATIONS)}")
    approximate = "none" if GELU_ACTIVATIONS[hidden_act] == "GELU_ERF" else "tanh"
    with g.scope(name):
        h = gelu(g, linear(g, x, up[0], up[1], names[0]), approximate, "act")
        return linear(g, h, down[0], down[1], names[1])


def sigmoid(g: Graph, x: Tensor, name: str = "sigmoid") -> Tensor:
    """``1 / (1 + exp(-x))`` (``ActivationType.SIGMOID``); x's shape and type."""
    return g.named(g.network.add_activation(x, g.trt.ActivationType.SIGMOID), name)


def silu(g: Graph, x: Tensor, name: str = "silu") -> Tensor:
    """``x * sigmoid(x)`` (SiLU / swish)."""
    return mul(g, x, sigmoid(g, x, f"{name}.sigmoid"), name)


def swiglu_mlp(
    g: Graph,
    x: Tensor,
    gate: np.ndarray,
    up: np.ndarray,
    down: np.ndarray,
    biases: tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None] = (None, None, None),
    name: str = "mlp",
    hidden_act: str = "silu",
) -> Tensor:
    """``down(act(gate(x)) * up(x))`` (Shazeer, "GLU Variants", arXiv:2002.05202): SwiGLU with
    ``hidden_act`` ``"silu"`` (``LlamaMLP``), GeGLU with a GELU of :data:`GELU_ACTIVATIONS`
    (``GemmaMLP``: ``"gelu_pytorch_tanh"``, the tanh approximation).

    With ``g.mapping.tp_size > 1``: gate/up column-parallel, down row-parallel (one all-reduce).
    Per-tensor FP8 gate/up get one weight scale, the larger (:func:`trtcore.fp8.share_tensor_scale`).

    Raises:
        InvalidArgumentError: ``hidden_act`` is neither ``"silu"`` nor one of :data:`GELU_ACTIVATIONS`.
    """
    if hidden_act != "silu" and hidden_act not in GELU_ACTIVATIONS:
        raise InvalidArgumentError(f"{name}: hidden_act {hidden_act!r} is not supported; expected 'silu' or one of {sorted(GELU_ACTIVATIONS)}")
    gate, up = _one_fp8_scale([gate, up])
    with g.scope(name):
        gate_out = linear(g, x, gate, biases[0], "gate_proj", parallel="column")
        if hidden_act == "silu":
            act = silu(g, gate_out, "act_fn")
        else:
            act = gelu(g, gate_out, "none" if GELU_ACTIVATIONS[hidden_act] == "GELU_ERF" else "tanh", "act_fn")
        h = mul(g, act, linear(g, x, up, biases[1], "up_proj", parallel="column"), "gated")
        return linear(g, h, down, biases[2], "down_proj", parallel="row")


# ---------------------------------------------------------------------------------------
# mixture of experts: top-k routing and the routed experts
# ---------------------------------------------------------------------------------------


class Routing(NamedTuple):
    """The experts chosen for each token by :func:`topk_routing`.

    Attributes:
        weights: float32 ``[..., top_k]``, the routing weight of each chosen expert, largest
            probability first.
        ids: int32 ``[..., top_k]``, the chosen experts' indices.
        one_hot: float32 ``[..., top_k, num_experts]``, 1 where slot ``r`` chose expert ``e``.
    """

    weights: Tensor
    ids: Tensor
    one_hot: Tensor


def _select01(g: Graph, cond: Tensor, name: str) -> Tensor:
    """float32 1 where ``cond`` (bool) holds, else 0."""
    rank = len(cond.shape)
    one, zero = scalar(g, 1.0, rank, np.float32, f"{name}.one"), scalar(g, 0.0, rank, np.float32, f"{name}.zero")
    return g.named(g.network.add_select(cond, one, zero), name)


def topk_routing(g: Graph, router_logits: Tensor, top_k: int, normalize: bool, name: str = "router") -> Routing:
    """Top-k routing of a mixture of experts (Shazeer et al., arXiv:1701.06538; transformers'
    ``MixtralTopKRouter`` / ``Qwen2MoeTopKRouter``): ``p = softmax(float32(logits))`` over the
    experts, the ``top_k`` largest ``p`` (ties: the lower index first, as ``torch.topk``), and
    with ``normalize`` their weights divided by their sum (Mixtral always; Qwen when
    ``norm_topk_prob``).

    Composed of standard layers, so every backend builds it: expert ``e``'s rank is the number
    of experts ``j`` with ``p_j > p_e`` (or ``p_j == p_e`` and ``j < e``), a ``[..., X, X]``
    comparison; slot ``r`` holds the expert of rank ``r``.

    Args:
        router_logits: ``[..., num_experts]`` (any float dtype).
        top_k: experts per token, ``1 <= top_k <= num_experts``.

    Returns:
        :class:`Routing` (float32 weights, int32 ids, float32 one-hot).

    Raises:
        InvalidArgumentError: ``top_k`` out of range or the number of experts not static.
    """
    x = router_logits.shape[-1]
    if x < 1 or not 1 <= top_k <= x:
        raise InvalidArgumentError(f"{name}: top_k {top_k!r} must be in [1, num_experts = {x}]")
    r = len(router_logits.shape)
    keep = (0,) * (r - 1)
    with g.scope(name):
        p = softmax(g, cast(g, router_logits, np.float32, "logits_float"), -1, "probs")
        p_e = reshape(g, p, keep + (x, 1), "probs_e")  # [..., X, 1]
        p_j = reshape(g, p, keep + (1, x), "probs_j")  # [..., 1, X]
        gt = g.named(g.network.add_elementwise(p_j, p_e, g.trt.ElementWiseOperation.GREATER), "greater")
        eq = g.named(g.network.add_elementwise(p_j, p_e, g.trt.ElementWiseOperation.EQUAL), "equal")
        lower = constant(g, np.tril(np.ones((x, x), bool), -1).reshape((1,) * (r - 1) + (x, x)), "lower_index")
        tie = g.named(g.network.add_elementwise(eq, lower, g.trt.ElementWiseOperation.AND), "tie_lower")
        beats = g.named(g.network.add_elementwise(gt, tie, g.trt.ElementWiseOperation.OR), "beats")
        rank = reduce(g, _select01(g, beats, "beats_float"), "SUM", [-1], keep_dims=False, name="rank")  # [..., X]
        slots = constant(g, np.arange(top_k, dtype=np.float32).reshape((1,) * (r - 1) + (top_k, 1)), "slots")
        chosen = g.named(g.network.add_elementwise(reshape(g, rank, keep + (1, x), "rank_j"), slots, g.trt.ElementWiseOperation.EQUAL), "chosen")
        one_hot = _select01(g, chosen, "one_hot")  # [..., k, X]
        weights = reduce(g, mul(g, one_hot, p_j, "chosen_probs"), "SUM", [-1], keep_dims=False, name="topk_probs")
        index = constant(g, np.arange(x, dtype=np.float32).reshape((1,) * r + (x,)), "expert_index")
        ids = cast(g, reduce(g, mul(g, one_hot, index, "chosen_index"), "SUM", [-1], keep_dims=False, name="ids_float"), np.int32, "topk_ids")
        if normalize:
            weights = div(g, weights, reduce(g, weights, "SUM", [-1], True, "topk_sum"), "topk_weights")
    return Routing(weights, ids, one_hot)


#: implementations of :func:`moe_experts`: trtcore's grouped-GEMM plugin, or dense standard layers
MOE_EXPERTS_IMPLEMENTATIONS = ("plugin", "layers")


def moe_experts(
    g: Graph, x: Tensor, routing: Routing, gate_up: np.ndarray, down: np.ndarray, name: str = "experts", impl: str | None = None
) -> Tensor:
    """The routed experts of a sparse MoE block: ``sum_r w_r * down_e(silu(gate_e(x)) * up_e(x))``
    over each token's chosen experts ``e = ids[r]`` (``MixtralExperts`` / ``Qwen2MoeExperts``).

    Args:
        x: ``[..., hidden]`` of the graph dtype.
        routing: from :func:`topk_routing` on the same tokens.
        gate_up: ``[num_experts, 2 * I, hidden]``, each expert's gate rows then up rows
            (transformers 5's ``experts.gate_up_proj``).
        down: ``[num_experts, hidden, I]`` (``experts.down_proj``).
        impl: ``"plugin"`` (:class:`trtcore.plugins.moe_experts.MoeExpertsPlugin`: grouped GEMMs
            over the tokens routed to each expert) or ``"layers"`` (dense: every expert on every
            token as one ``[X * I, hidden]`` GEMM each for gate and up, the activations scaled by
            the routing weight, zero for experts not chosen, and one ``[hidden, X * I]`` GEMM that
            sums the experts). Default: ``g.implementations["moe_experts"]`` if set, else the
            plugin where the TensorRT module hosts plugins, the layers where not.

    Returns:
        ``[..., hidden]`` of the graph dtype, named ``name``.

    Raises:
        NetworkError: the weights' shapes do not fit each other or x.
        InvalidArgumentError: an unknown ``impl``.
    """
    if gate_up.ndim != 3 or down.ndim != 3 or gate_up.shape[1] % 2:
        raise NetworkError(f"{name}: gate_up {gate_up.shape} must be [X, 2 I, hidden] and down {down.shape} [X, hidden, I]")
    num_experts, two_i, hidden = gate_up.shape
    inter = two_i // 2
    if down.shape != (num_experts, hidden, inter) or x.shape[-1] not in (-1, hidden):
        raise NetworkError(f"{name}: gate_up {gate_up.shape}, down {down.shape} and x {tuple(x.shape)} do not fit ([X, 2 I, E], [X, E, I], [..., E])")
    if impl is None:
        from trtcore.plugins.base import hosts_plugins

        impl = g.implementations.get("moe_experts") or ("plugin" if hosts_plugins(g.trt) else "layers")
    if impl not in MOE_EXPERTS_IMPLEMENTATIONS:
        raise InvalidArgumentError(f"{name}: MoE experts implementation {impl!r} is not one of {MOE_EXPERTS_IMPLEMENTATIONS}")
    if impl == "plugin":
        from trtcore.plugins.base import create
        from trtcore.plugins.moe_experts import MoeExpertsPlugin

        plugin = MoeExpertsPlugin(num_experts=num_experts, top_k=int(routing.ids.shape[-1]), hidden_size=hidden, intermediate_size=inter)
        with g.scope(name):
            consts = [constant(g, gate_up, "gate_up_proj", g.np_dtype), constant(g, down, "down_proj", g.np_dtype)]
        layer = g.network.add_plugin_v3([x, routing.ids, routing.weights, *consts], [], create(plugin, g.trt))
        return g.named(layer, name)
    rank = len(x.shape)
    keep = (0,) * (rank - 1)
    with g.scope(name):
        gate = linear(g, x, gate_up[:, :inter].reshape(num_experts * inter, hidden), None, "gate_proj")
        up = linear(g, x, gate_up[:, inter:].reshape(num_experts * inter, hidden), None, "up_proj")
        act = reshape(g, cast(g, mul(g, silu(g, gate, "act_fn"), up, "gated"), np.float32, "gated_float"), keep + (num_experts, inter), "per_expert")
        # dense routing weights [..., X]: the weight of each slot on its expert, 0 elsewhere
        w = reshape(g, routing.weights, keep + (routing.weights.shape[-1], 1), "slot_weights")
        dense = reduce(g, mul(g, routing.one_hot, w, "slot_expert_weights"), "SUM", [-2], keep_dims=False, name="expert_weights")
        scaled = mul(g, act, reshape(g, dense, keep + (num_experts, 1), "expert_weights_col"), "routed")
        flat = reshape(g, cast(g, scaled, g.np_dtype, "routed_dtype"), keep + (num_experts * inter,), "routed_flat")
    out = linear(g, flat, np.ascontiguousarray(down.transpose(1, 0, 2).reshape(hidden, num_experts * inter)), None, name)
    return out


# ---------------------------------------------------------------------------------------
# rotary embedding (composed standard layers)
# ---------------------------------------------------------------------------------------


def rope_cos_sin(g: Graph, position_ids: Tensor, spec: RopeSpec, name: str = "rotary_emb", seq_lens: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """cos and sin of ``position * inv_freq`` for int32 ``position_ids`` ``[...]``
    (``[batch, seq]`` padded, or ``[num_tokens]`` packed).

    Returns two float32 tensors ``[..., 1, rotary_dim]`` (each half repeated, as
    transformers' ``cat((freqs, freqs), -1)``; the 1 broadcasts over heads), scaled by the
    attention factor. For ``dynamic`` and ``longrope`` scaling the frequencies depend on
    each token's sequence length ``s`` in this call: ``seq_lens`` (int32, same shape as
    ``position_ids``) or, when None, the largest position of each row of a ``[batch, seq]``
    input + 1, as transformers does per forward call. ``dynamic`` recomputes the base
    (:func:`trtcore.rope.dynamic_ntk_base`); ``longrope`` takes ``spec.long_inv_freq`` where
    ``s > original_max_position_embeddings``, else ``spec.inv_freq``
    (:func:`trtcore.rope.longrope_uses_long`).
    """
    half = spec.rotary_dim // 2
    r = len(position_ids.shape)
    keep = (0,) * r
    with g.scope(name):
        pos = reshape(g, cast(g, position_ids, np.float32, "positions"), keep + (1,), "positions_col")
        s = None
        if spec.per_sequence:
            if seq_lens is not None:
                s = reshape(g, cast(g, seq_lens, np.float32, "seq_lens_float"), keep + (1,), "seq_len")
            else:
                smax = reduce(g, pos, "MAX", [r - 1], True, "max_position")
                s = add(g, smax, scalar(g, 1.0, r + 1, np.float32, "one"), "seq_len")
        if spec.rope_type == "longrope":
            # long = clamp(s - L, 0, 1): exactly 1 where s > L, else 0 (integers in float32);
            # inv_freq = short * (1 - long) + long_inv * long selects one set exactly
            assert s is not None and spec.long_inv_freq is not None
            L = float(spec.original_max_position_embeddings)
            over = sub(g, s, scalar(g, L, r + 1, np.float32, "original_max_position_embeddings"), "over")
            use_long = minimum(
                g, maximum(g, over, scalar(g, 0.0, r + 1, np.float32, "zero"), "over_pos"), scalar(g, 1.0, r + 1, np.float32, "one_"), "use_long"
            )
            use_short = sub(g, scalar(g, 1.0, r + 1, np.float32, "one_s"), use_long, "use_short")
            short_c = constant(g, spec.inv_freq.reshape((1,) * r + (half,)), "short_inv_freq", np.float32)
            long_c = constant(g, spec.long_inv_freq.reshape((1,) * r + (half,)), "long_inv_freq", np.float32)
            inv_freq = add(g, mul(g, short_c, use_short, "short_part"), mul(g, long_c, use_long, "long_part"), "inv_freq")
        elif spec.rope_type == "dynamic":
            # inv_freq = base'^(-2i/d), base' = base * (f*s/L - (f-1))^(d/(d-2)), s = max(L, seq_len)
            assert s is not None
            d, f, L = spec.rotary_dim, spec.dynamic_factor, float(spec.max_position_embeddings)
            s = maximum(g, s, scalar(g, L, r + 1, np.float32, "max_position_embeddings"), "seq_len_clamped")
            ratio = sub(
                g, mul(g, s, scalar(g, f / L, r + 1, np.float32, "f_over_L"), "scaled"), scalar(g, f - 1, r + 1, np.float32, "f_minus_1"), "ratio"
            )
            base = mul(
                g,
                power(g, ratio, scalar(g, d / (d - 2), r + 1, np.float32, "exponent"), "ratio_pow"),
                scalar(g, spec.base, r + 1, np.float32, "theta"),
                "base",
            )
            expo = constant(g, (-np.arange(0, d, 2, dtype=np.float64) / d).reshape((1,) * r + (half,)), "neg_exponents", np.float32)
            inv_freq = power(g, base, expo, "inv_freq")
        else:
            inv_freq = constant(g, spec.inv_freq.reshape((1,) * r + (half,)), "inv_freq", np.float32)
        freqs = mul(g, pos, inv_freq, "freqs")  # [..., half]
        emb = concat(g, [freqs, freqs], r, "emb")
        cos, sin = unary(g, emb, "COS", "cos"), unary(g, emb, "SIN", "sin")
        if spec.attention_scaling != 1.0:
            sc = scalar(g, spec.attention_scaling, r + 1, np.float32, "attention_scaling")
            cos, sin = mul(g, cos, sc, "cos_scaled"), mul(g, sin, sc, "sin_scaled")
        dims = keep + (1, spec.rotary_dim)
        return reshape(g, cos, dims, "cos_heads"), reshape(g, sin, dims, "sin_heads")


def apply_rope(g: Graph, x: Tensor, cos: Tensor, sin: Tensor, spec: RopeSpec, name: str) -> Tensor:
    """Rotate ``x`` ``[..., heads, head_dim]`` (neox / half-split pairing).

    ``x * cos + rotate_half(x) * sin`` on the first ``rotary_dim`` features (transformers'
    ``apply_rotary_pos_emb``), the rest passed through; cos/sin from :func:`rope_cos_sin`,
    cast to the graph dtype first as transformers does.
    """
    d, rd = spec.head_dim, spec.rotary_dim
    half = rd // 2
    axis = len(x.shape) - 1
    with g.scope(name):
        cos_t, sin_t = cast(g, cos, g.np_dtype, "cos"), cast(g, sin, g.np_dtype, "sin")
        rot = x if rd == d else gather_const(g, x, range(rd), axis, "rot_part")
        # rotate_half: cat(-x2, x1) == gather [x2, x1] then multiply by sign [-1]*half + [1]*half
        swapped = gather_const(g, rot, [*range(half, rd), *range(half)], axis, "swap_halves")
        sign = constant(g, np.concatenate([-np.ones(half), np.ones(half)]).reshape((1,) * axis + (rd,)), "sign", g.np_dtype)
        rotated = add(g, mul(g, rot, cos_t, "x_cos"), mul(g, mul(g, swapped, sign, "rotate_half"), sin_t, "rot_sin"), "rotated")
        if rd == d:
            return rotated
        passed = gather_const(g, x, range(rd, d), axis, "pass_part")
        return concat(g, [rotated, passed], axis, "out")


def rope_plugin(
    g: Graph,
    q: Tensor,
    k: Tensor,
    position_ids: Tensor,
    spec: RopeSpec,
    is_neox: bool = True,
    name: str = "rotary_emb",
    seq_lens: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """RoPE on q ``[..., num_heads, head_dim]`` and k ``[..., num_kv_heads, head_dim]`` with
    the fused plugin (:class:`trtcore.plugins.rope.RopePlugin`); ``position_ids`` int32
    ``[...]`` (the same leading dimensions, e.g. ``[batch, seq]``).

    The plugin takes ``inv_freq`` as a float32 network constant (computed on the host by
    :func:`trtcore.rope.rope_spec`) and, for dynamic NTK scaling, each token's sequence
    length (``seq_lens`` when given, else ``max(position_ids) + 1`` of its row).
    """
    from trtcore.plugins.base import create
    from trtcore.plugins.rope import RopePlugin

    extra = _rope_plugin_inputs(g, position_ids, spec, name, seq_lens)
    with g.scope(name):
        plugin = create(RopePlugin.from_spec(spec, is_neox=is_neox), g.trt)
        layer = g.network.add_plugin_v3([q, k, position_ids, *extra], [], plugin)
        full = g.unique("plugin")
        layer.name = full
        q_out, k_out = layer.get_output(0), layer.get_output(1)
        q_out.name, k_out.name = f"{full}.q", f"{full}.k"
        return q_out, k_out


def _rope_key(spec: RopeSpec) -> tuple[Any, ...]:
    """What tells two RoPEs of one network apart (Gemma 3's global and local RoPE): their
    frequencies and scaling, hashable."""
    return (spec.rope_type, spec.rotary_dim, spec.inv_freq.tobytes(), spec.attention_scaling, spec.dynamic_factor)


def _inv_freq_input(g: Graph, spec: RopeSpec, name: str = "rotary_emb") -> Tensor:
    """The ``inv_freq`` input of RoPE's plugins, a float32 constant made once per network
    (:meth:`trtcore.plugins.rope.RopePlugin.inv_freq_of`: longrope's short and long
    frequencies as one constant)."""
    from trtcore.plugins.rope import RopePlugin

    values = RopePlugin.inv_freq_of(spec)
    key = ("rope_inv_freq", values.tobytes())
    if key not in g.shared:
        with g.scope_at(f"model.{name}"):
            g.shared[key] = constant(g, values, "inv_freq", np.float32)
    return g.shared[key]


def _rope_plugin_inputs(g: Graph, position_ids: Tensor, spec: RopeSpec, name: str = "rotary_emb", seq_lens: Tensor | None = None) -> list[Tensor]:
    """The inputs after ``position_ids`` of RoPE's plugins (RopePlugin, fused RoPE of the paged
    attention plugin), made once per network: ``[inv_freq]`` (:func:`_inv_freq_input`), plus
    for dynamic / longrope scaling each token's sequence length (``seq_lens``, else
    ``max(position_ids) + 1`` of its row)."""
    key = ("rope_plugin_inputs", id(position_ids), _rope_key(spec))  # Gemma 3: two RoPEs in one network
    if key not in g.shared:
        extra = [_inv_freq_input(g, spec, name)]
        with g.scope_at(f"model.{name}"):
            if spec.per_sequence and seq_lens is not None:
                extra.append(seq_lens)
            elif spec.per_sequence:
                rank = len(position_ids.shape)
                smax = reduce(g, position_ids, "MAX", [rank - 1], True, "max_position")
                one = scalar(g, 1, rank, np.int32, "one")
                zero = scalar(g, 0, rank, np.int32, "zero")
                seq_len = add(g, smax, one, "seq_len")
                extra.append(add(g, mul(g, position_ids, zero, "zeros"), seq_len, "seq_lens"))
        g.shared[key] = extra
    return list(g.shared[key])


def paged_attention(
    g: Graph,
    q: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    kv_pool: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    *,
    layer_idx: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    sliding_window: int,
    scale: float,
    rope: RopeSpec | None = None,
    position_ids: Tensor | None = None,
    name: str = "attention",
    softcap: float | None = None,
    kv_fp8: bool = False,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> Tensor:
    """Paged attention of one layer on packed tokens (:class:`trtcore.plugins.paged_attention.PagedAttentionPlugin`).

    Args:
        q: ``[T, Hq, D]``, k/v: ``[T, Hkv, D]``, graph dtype; or, with k and v None, the
            packed ``qkv [T, (Hq + 2 Hkv) * D]`` (q heads, k heads, v heads per token: the
            plugin's ``packed_qkv``).
        rope: None: q and k arrive rotated; a (not ``dynamic``) :class:`trtcore.rope.RopeSpec`:
            the plugin rotates them (fused RoPE, neox pairing) by int32 ``position_ids [T]``
            (``longrope``: each sequence by its ``seq_lens``, the plugin's rule).
        kv_pool: ``[num_layers, num_blocks, 2, Hkv, block_size, D]``; the plugin writes this
            step's k/v of layer ``layer_idx`` into it in place.
        block_tables: int32 ``[B, max_blocks]``; seq_lens: int32 ``[B]``; query_start_loc:
            int32 ``[B + 1]``.
        scale: the score scale; softcap: attention logit soft-capping, or None (the plugin's
            ``scale`` / ``softcap`` fields); sliding_window: 0 or the layer's window.
        kv_fp8: ``kv_pool`` holds E4M3 codes (the FP8 KV cache), with the layer's float32
            ``k_scale`` / ``v_scale`` (the plugin's fields of those names).

    Returns:
        ``[T, Hq * D]``, named ``name``.
    """
    from trtcore.plugins.base import create
    from trtcore.plugins.paged_attention import PagedAttentionPlugin
    from trtcore.plugins.rope import RopePlugin

    packed = k is None and v is None
    if packed != (k is None or v is None):
        raise InvalidArgumentError(f"{name}: give k and v, or neither (packed qkv)")
    rotary: dict[str, Any] = {}
    extra: list[Tensor] = []
    if rope is not None:
        if rope.rope_type == "dynamic" or position_ids is None:
            raise InvalidArgumentError(f"{name}: fused RoPE needs position_ids and a RoPE without dynamic NTK scaling, got {rope.rope_type!r}")
        rp = RopePlugin.from_spec(rope)
        rotary = {
            "rotary_dim": rp.rotary_dim,
            "is_neox": rp.is_neox,
            "attention_scaling": rp.attention_scaling,
            "original_max_position_embeddings": rp.original_max_position_embeddings,
        }
        extra = [position_ids, _inv_freq_input(g, rope)]
    plugin = PagedAttentionPlugin(
        layer_idx=layer_idx,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        sliding_window=sliding_window,
        scale=scale,
        softcap=softcap or 0.0,
        packed_qkv=packed,
        **rotary,
        **({"kv_fp8": True, "k_scale": k_scale, "v_scale": v_scale} if kv_fp8 else {}),
    )
    qkv = [q] if packed else [q, k, v]
    layer = g.network.add_plugin_v3([*qkv, kv_pool, block_tables, seq_lens, query_start_loc, *extra], [], create(plugin, g.trt))
    return g.named(layer, name)


def rotary(
    g: Graph, q: Tensor, k: Tensor, position_ids: Tensor, spec: RopeSpec, name: str = "rotary_emb", seq_lens: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """RoPE (neox pairing) on q ``[..., H, D]`` and k ``[..., Hkv, D]`` (``...`` = ``[B, S]``
    or packed ``[T]``, as ``position_ids``) with the implementation
    ``g.implementations["rope"]``: ``"plugin"`` (:func:`rope_plugin`) or ``"layers"``
    (:func:`rope_cos_sin` + :func:`apply_rope`; cos/sin shared by all layers); ``"attention"``
    (RoPE inside the paged attention plugin, :func:`self_attention`) rotates here with the
    plugin where the attention cannot take it. ``seq_lens``: see :func:`rope_cos_sin`
    (dynamic scaling on packed tokens)."""
    impl = g.implementations.get("rope", "layers")
    if impl in ("plugin", ROPE_IN_ATTENTION):
        return rope_plugin(g, q, k, position_ids, spec, True, name, seq_lens)
    if impl != "layers":
        own = tuple(i for i in IMPLEMENTATIONS["rope"] if i != ROPE_IN_ATTENTION)  # "attention" takes the plugin here
        raise InvalidArgumentError(f"rope implementation {impl!r} is not one of {own}")
    key = ("rope_cos_sin", id(position_ids), _rope_key(spec))
    if key not in g.shared:
        with g.scope_at("model"):
            g.shared[key] = rope_cos_sin(g, position_ids, spec, name, seq_lens)
    cos, sin = g.shared[key]
    return apply_rope(g, q, cos, sin, spec, "q_rope"), apply_rope(g, k, cos, sin, spec, "k_rope")


# ---------------------------------------------------------------------------------------
# attention over a contiguous KV cache (composed standard layers)
# ---------------------------------------------------------------------------------------


def attention(
    g: Graph,
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    mask: Tensor,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    name: str = "attention",
    softcap: float | None = None,
) -> Tensor:
    """Scaled dot-product attention with GQA/MQA over a contiguous cache.

    Args:
        q: ``[batch, seq, num_heads, head_dim]`` (graph dtype, RoPE applied).
        k_cache, v_cache: ``[batch, num_kv_heads, total_len, head_dim]`` (past + new).
        mask: float32 additive mask ``[batch, 1, 1, seq, total_len]`` (0 or a large negative).
        scale: softmax scale, usually ``head_dim ** -0.5`` (Gemma 2/3: ``query_pre_attn_scalar ** -0.5``).
        softcap: attention logit soft-capping (:func:`soft_cap` of the scaled scores before the
            mask, as transformers' ``eager_attention_forward`` of Gemma 2/3), or None.

    Returns:
        ``[batch, seq, num_heads * head_dim]``. Query head ``h`` attends to KV head
        ``h // (num_heads // num_kv_heads)`` (transformers' ``repeat_kv``); scores are
        scaled, (soft-capped,) masked and soft-maxed in float32 (Vaswani et al., arXiv:1706.03762).
    """
    num_heads = q.shape[2]
    groups = num_heads // num_kv_heads
    with g.scope(name):
        q5 = reshape(g, q, (0, 0, num_kv_heads, groups, head_dim), "q_grouped")
        q5 = transpose(g, q5, (0, 2, 3, 1, 4), "q_bhgsd")  # [B, Hkv, G, S, D]
        k5 = reshape(g, k_cache, (0, 0, 1, -1, head_dim), "k_5d")  # [B, Hkv, 1, T, D]
        v5 = reshape(g, v_cache, (0, 0, 1, -1, head_dim), "v_5d")
        scores = cast(g, matmul(g, q5, k5, transpose_b=True, name="qk"), np.float32, "qk_float")
        scores = mul(g, scores, scalar(g, scale, 5, np.float32, "scale"), "scaled")
        if softcap:
            scores = soft_cap(g, scores, softcap, "softcap")
        scores = add(g, scores, mask, "masked")
        probs = cast(g, softmax(g, scores, -1, "softmax"), g.np_dtype, "probs")
        ctx = matmul(g, probs, v5, name="pv")  # [B, Hkv, G, S, D]
        ctx = transpose(g, ctx, (0, 3, 1, 2, 4), "context_bshgd")
        return reshape(g, ctx, (0, 0, num_heads * head_dim), "context")


# ---------------------------------------------------------------------------------------
# attention over a fixed-size contiguous cache with TensorRT's own layers
# ---------------------------------------------------------------------------------------


def _network_v2(g: Graph) -> Any:
    """``g.network`` for ``add_kv_cache_update`` / ``add_attention_v2``: tensorrt-stubs 10.13
    predate both (TensorRT 10.15+, TensorRT-RTX 1.2+), so mypy cannot check these two calls;
    tests/test_native_attention.py builds them with ``tensorrt_rtx`` instead.

    Raises:
        InvalidArgumentError: the TensorRT module predates these layers.
    """
    network: Any = g.network  # deliberately untyped: see above
    if not (hasattr(network, "add_attention_v2") and hasattr(network, "add_kv_cache_update")):
        module = getattr(g.trt, "__name__", "this TensorRT module")
        raise InvalidArgumentError(
            f"attention='native' needs IAttention and IKVCacheUpdateLayer (add_attention_v2, add_kv_cache_update: "
            f"TensorRT 10.15+ or TensorRT-RTX); {module} {getattr(g.trt, '__version__', '')} has none; use attention='layers'"
        )
    return network


def kv_cache_update(g: Graph, cache: Tensor, update: Tensor, write_indices: Tensor, name: str = "kv_cache_update") -> Tensor:
    """Write ``update`` into ``cache`` (``IKVCacheUpdateLayer``, ``KVCacheMode.LINEAR``).

    Args:
        cache: ``[batch, heads, max_seq_len, head_dim]``, a network input whose
            ``max_seq_len`` is static (TensorRT requires both).
        update: ``[batch, heads, new_tokens, head_dim]``, the cache's type.
        write_indices: int32 ``[batch]``: ``update[b, :, s]`` goes to slot ``write_indices[b] + s``
            (``write_indices[b] + new_tokens <= max_seq_len``).

    Returns:
        The updated cache, named ``name``; mark it as a network output. TensorRT updates the
        cache in place: the output aliases the input (``ICudaEngine.get_aliased_input_tensor``),
        and both are bound to the same memory.
    """
    layer = _network_v2(g).add_kv_cache_update(cache, update, write_indices, g.trt.KVCacheMode.LINEAR)
    return g.named(layer, name)


def sdpa_native(g: Graph, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, name: str = "sdpa") -> Tensor:
    """``softmax(q @ k^T masked) @ v`` with TensorRT's ``IAttention`` (``add_attention_v2``).

    Args:
        q: ``[batch, num_heads, seq, head_dim]``, **already scaled** (``IAttention`` has no
            scale; TensorRT asks for Q or K to be multiplied by it beforehand).
        k, v: ``[batch, num_kv_heads, kv_len, head_dim]``; ``num_heads`` a multiple of
            ``num_kv_heads`` (GQA/MQA are native).
        mask: bool ``[batch or 1, 1 or num_heads, seq, kv_len]``, True where the query may
            attend (a float mask of q's type would be added instead), or None.

    The layer is marked decomposable: TensorRT-RTX 1.7 has no fused kernel for float32 or for
    ``head_dim`` 8 and refuses to build a non-decomposable one there.

    Returns:
        ``[batch, num_heads, seq, head_dim]`` of q's type, named ``name``.
    """
    layer = _network_v2(g).add_attention_v2(q, k, v, g.trt.AttentionNormalizationOp.SOFTMAX, g.trt.CausalMaskKind.NONE)
    if mask is not None:
        layer.mask = mask
    layer.decomposable = True
    return g.named(layer, name)


def native_attention(
    g: Graph,
    q: Tensor,
    k_new: Tensor,
    v_new: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    write_indices: Tensor,
    mask: Tensor,
    *,
    head_dim: int,
    scale: float,
    name: str = "attention",
) -> tuple[Tensor, Tensor, Tensor]:
    """One layer's attention over a fixed-size contiguous cache, with TensorRT's own layers:
    this step's keys/values go into the cache (:func:`kv_cache_update`), then the queries
    attend over the whole cache (:func:`sdpa_native`), the mask selecting the slots.

    Args:
        q: ``[batch, seq, num_heads, head_dim]`` (graph dtype, RoPE applied).
        k_new, v_new: ``[batch, seq, num_kv_heads, head_dim]``.
        k_cache, v_cache: network inputs ``[batch, num_kv_heads, max_seq_len, head_dim]``.
        write_indices: int32 ``[batch]``, the slot of each sequence's first new token.
        mask: bool ``[batch, 1, seq, max_seq_len]``, True where query ``s`` may read slot ``j``
            (causal rule, padding, sliding window and unwritten slots folded in).
        scale: the softmax scale, applied to q in float32 before the attention.

    Returns:
        ``(context [batch, seq, num_heads * head_dim], k_present, v_present)``: the updated
        caches, to be marked as network outputs (they alias ``k_cache`` / ``v_cache``).
    """
    num_heads = q.shape[2]
    with g.scope(name):
        k_all = kv_cache_update(g, k_cache, transpose(g, k_new, (0, 2, 1, 3), "k_bhsd"), write_indices, "k_cache_update")
        v_all = kv_cache_update(g, v_cache, transpose(g, v_new, (0, 2, 1, 3), "v_bhsd"), write_indices, "v_cache_update")
        q_bhsd = cast(g, transpose(g, q, (0, 2, 1, 3), "q_bhsd"), np.float32, "q_float")
        q_scaled = cast(g, mul(g, q_bhsd, scalar(g, scale, 4, np.float32, "scale"), "q_scaled"), g.np_dtype, "q_scaled_dtype")
        ctx = sdpa_native(g, q_scaled, k_all, v_all, mask, "sdpa")  # [B, H, S, D]
        ctx = transpose(g, ctx, (0, 2, 1, 3), "context_bshd")
        return reshape(g, ctx, (0, 0, num_heads * head_dim), "context"), k_all, v_all


# ---------------------------------------------------------------------------------------
# a whole model's I/O through the KV cache contract (trtcore.kv_modes)
# ---------------------------------------------------------------------------------------


class ModelInputs(NamedTuple):
    """The network inputs a model's layers read (the KV cache inputs stay with
    :func:`cached_attention`).

    Attributes:
        input_ids: int32 token ids, ``[T]`` packed or ``[B, S]`` padded.
        position_ids: int32, the shape of ``input_ids``.
        rope_seq_lens: int32 ``[T]`` for :func:`rotary` (packed ``dynamic`` RoPE), else None.
    """

    input_ids: Tensor
    position_ids: Tensor
    rope_seq_lens: Tensor | None


def _kv_mode(g: Graph) -> KVMode:
    if g.kv_mode is None:
        raise InvalidArgumentError("this graph has no KV cache contract; create it with Graph(..., kv_mode=kv_modes.kv_mode(plan, config))")
    return g.kv_mode


def model_inputs(g: Graph) -> ModelInputs:
    """Declare every network input of ``g.kv_mode`` (:attr:`trtcore.kv_modes.KVMode.inputs`,
    in order) into ``g.inputs``; return those the layers read.

    Raises:
        InvalidArgumentError: ``g`` has no KV cache contract.
    """
    for spec in _kv_mode(g).inputs:
        g.inputs[spec.name] = g.input(spec.name, spec.dtype, spec.shape)
    return ModelInputs(g.inputs[kv_modes.INPUT_IDS], g.inputs[kv_modes.POSITION_IDS], g.inputs.get(kv_modes.ROPE_SEQ_LENS))


def split_heads(g: Graph, x: Tensor, num_heads: int, head_dim: int, name: str) -> Tensor:
    """``[..., num_heads * head_dim]`` -> ``[..., num_heads, head_dim]`` (leading dims kept)."""
    return reshape(g, x, (0,) * (len(x.shape) - 1) + (num_heads, head_dim), name)


def cached_attention(
    g: Graph,
    layer_idx: int,
    q: Tensor,
    k: Tensor | None,
    v: Tensor | None,
    *,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    layer_type: str = "full_attention",
    sliding_window: int | None = None,
    rope: RopeSpec | None = None,
    name: str = "attention",
    softcap: float | None = None,
) -> Tensor:
    """Attention of layer ``layer_idx`` over the KV cache, with the implementation of
    ``g.kv_mode`` (the plan's ``kv_cache`` / ``attention``), its cache I/O included:

    * paged: :func:`paged_attention` (the plugin writes the pool in place, applies the window);
    * contiguous, ``"layers"``: this step's k/v appended to ``past_key_values.{i}.*``
      (outputs ``present.{i}.*``), then :func:`attention` with the layer's mask;
    * contiguous, ``"native"``: :func:`native_attention` over the fixed-size ``kv_cache.{i}.*``
      (outputs ``present.{i}.*``, aliasing them).

    Args:
        q: ``[..., H, D]``, k/v: ``[..., Hkv, D]`` (``...`` = the token layout, RoPE applied);
            paged mode only: k and v None and q the packed ``qkv [T, (H + 2 Hkv) * D]``.
        rope: paged mode only: q and k arrive unrotated and the plugin applies this RoPE
            (its fused RoPE, by ``position_ids``); None: they arrive rotated.
        layer_type: the layer's ``config.layer_types`` entry, ``"full_attention"`` or
            ``"sliding_attention"`` (which mask it reads; whether ``sliding_window`` applies).
        sliding_window: the model's window (``config.sliding_window``), or None.
        softcap: attention logit soft-capping (``attn_logit_softcapping``), or None.

    Returns:
        ``[..., H * D]`` of the graph dtype.

    Raises:
        InvalidArgumentError: ``g`` has no KV cache contract, or its inputs are undeclared
            (call :func:`model_inputs` first), or packed qkv / ``rope`` outside the paged mode,
            or ``softcap`` with TensorRT's native attention (``IAttention`` has no soft-capping).
    """
    mode = _kv_mode(g)
    if mode.kv_cache != "paged" and (rope is not None or k is None or v is None):
        raise InvalidArgumentError(f"{name}: packed qkv and fused RoPE need the paged KV cache, the plan has {mode.kv_cache!r}")
    x = g.inputs
    if kv_modes.INPUT_IDS not in x:
        raise InvalidArgumentError("cached_attention needs the network inputs; call ops.model_inputs(g) first")
    if layer_type not in kv_modes.MASK_NAMES:
        raise InvalidArgumentError(f"layer_type {layer_type!r} is not one of {', '.join(kv_modes.MASK_NAMES)}")
    window = sliding_window if layer_type == "sliding_attention" else None
    if softcap and mode.attention == "native":
        raise InvalidArgumentError(
            f"{name}: attention logit soft-capping ({softcap!r}) cannot be built with attention='native' "
            "(TensorRT's IAttention has no soft-capping); use attention='layers' or the paged KV cache"
        )
    if mode.kv_cache == "paged":
        return paged_attention(
            g,
            q,
            k,
            v,
            x[kv_modes.KV_CACHE_POOL],
            x[kv_modes.BLOCK_TABLES],
            x[kv_modes.SEQ_LENS],
            x[kv_modes.QUERY_START_LOC],
            layer_idx=layer_idx,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            block_size=mode.plan.block_size,
            sliding_window=window or 0,
            scale=scale,
            rope=rope,
            position_ids=x[kv_modes.POSITION_IDS],
            name=name,
            softcap=softcap,
            kv_fp8=mode.plan.kv_fp8,
            k_scale=g.kv_scales.get(layer_idx, (1.0, 1.0))[0],
            v_scale=g.kv_scales.get(layer_idx, (1.0, 1.0))[1],
        )
    assert k is not None and v is not None  # checked above
    mask = x[kv_modes.MASK_NAMES[layer_type]]
    past_k, past_v = (x[mode.cache_input(layer_idx, kind)] for kind in kv_modes.KV_KINDS)
    if mode.attention == "native":
        ctx, k_all, v_all = native_attention(
            g,
            q,
            k,
            v,
            past_k,
            past_v,
            x[kv_modes.CACHE_WRITE_POSITIONS],
            mask,
            head_dim=head_dim,
            scale=scale,
            name=name,
        )
    else:
        k_all = concat(g, [past_k, transpose(g, k, (0, 2, 1, 3), "k_bhsd")], 2, "k_cache")
        v_all = concat(g, [past_v, transpose(g, v, (0, 2, 1, 3), "v_bhsd")], 2, "v_cache")
        ctx = attention(g, q, k_all, v_all, mask, num_kv_heads, head_dim, scale, name, softcap=softcap)
    g.output(k_all, mode.cache_output(layer_idx, "key"))
    g.output(v_all, mode.cache_output(layer_idx, "value"))
    return ctx


def fuses_rope(g: Graph, spec: RopeSpec) -> bool:
    """Whether :func:`self_attention` rotates inside the paged attention plugin: the plan's
    ``rope`` is ``"attention"``, the KV cache is paged and the RoPE has no dynamic NTK scaling
    (its per-sequence base stays with the RoPE plugin; LongRoPE's two frequency sets are fused:
    the attention plugin picks them by each sequence's ``seq_lens``)."""
    return (
        g.implementations.get("rope") == ROPE_IN_ATTENTION and g.kv_mode is not None and g.kv_mode.kv_cache == "paged" and spec.rope_type != "dynamic"
    )


def self_attention(
    g: Graph,
    layer_idx: int,
    x: Tensor,
    weights: Sequence[np.ndarray],
    biases: Sequence[np.ndarray | None] | None,
    spec: RopeSpec,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    layer_type: str = "full_attention",
    sliding_window: int | None = None,
    head_norms: tuple[np.ndarray, np.ndarray, float] | None = None,
    head_norm_offset: float | None = None,
    softcap: float | None = None,
) -> Tensor:
    """A decoder layer's attention up to (not including) ``o_proj``: the q/k/v projections,
    optional RMSNorm of each q/k head, RoPE (neox pairing) by the network's ``position_ids``,
    and :func:`cached_attention`.

    With ``g.mapping.tp_size > 1`` the rank computes its ``num_heads / tp_size`` query heads
    and the KV heads they read (:meth:`trtcore.parallel.Mapping.kv_heads`), reading only those
    rows of the q/k/v weights; the result is its share of the heads, for a row-parallel ``o_proj``.

    When :func:`fuses_rope`, RoPE runs inside the paged attention plugin; without head norms
    the three projections are also one product ``qkv_proj`` (the weights concatenated along
    the output features, q|k|v, as TensorRT-LLM's fused QKV) whose output is the plugin's
    packed ``qkv`` input: no RoPE layer, no q/k/v split. Otherwise ``q_proj`` / ``k_proj`` /
    ``v_proj``, ``q_heads`` / ``k_heads`` / ``v_heads``, (``q_norm`` / ``k_norm``) and
    :func:`rotary` as separate layers.

    Args:
        x: ``[..., hidden]`` normalized hidden states (the token layout of the KV mode).
        weights: ``(q_proj, k_proj, v_proj)`` weights, ``[out_features, hidden]`` each (arrays
            or :class:`~trtcore.checkpoint.LazyTensor`, or quantized; per-tensor FP8 ones get
            one weight scale, the largest: :func:`trtcore.fp8.share_tensor_scale`).
        biases: their biases (``[out_features]`` or None each), or None.
        spec: the model's RoPE (:func:`trtcore.rope.rope_spec`).
        head_norms: ``(q_norm weight, k_norm weight, eps)`` (Qwen3: RMSNorm of each head
            before RoPE), or None.
        head_norm_offset: the head norms' weight offset (:func:`rms_norm`; Gemma 3: 1), or None.
        softcap: attention logit soft-capping, or None (:func:`cached_attention`).
        others: as :func:`cached_attention`.

    Returns:
        ``[..., num_heads * head_dim]`` of the graph dtype (this rank's heads).
    """
    inputs = g.inputs
    if kv_modes.POSITION_IDS not in inputs:
        raise InvalidArgumentError("self_attention needs the network inputs; call ops.model_inputs(g) first")
    bias = list(biases) if biases is not None else [None, None, None]
    # tensor parallelism: this rank's query heads and the KV heads they read (column-parallel q/k/v)
    (h0, h1), (kv0, kv1) = g.mapping.split(num_heads, "num_attention_heads"), g.mapping.kv_heads(num_kv_heads)
    if g.mapping.parallel:
        rows = [(h0 * head_dim, h1 * head_dim), (kv0 * head_dim, kv1 * head_dim), (kv0 * head_dim, kv1 * head_dim)]
        weights = [read_weight(w, 0, lo, hi) for w, (lo, hi) in zip(weights, rows)]
        bias = [read_weight(b, 0, lo, hi) for b, (lo, hi) in zip(bias, rows)]
    else:
        weights, bias = _one_fp8_scale([read_weight(w) for w in weights]), [read_weight(b) for b in bias]
    num_heads, num_kv_heads = h1 - h0, kv1 - kv0
    fused = fuses_rope(g, spec)
    common: dict[str, Any] = dict(
        num_kv_heads=num_kv_heads, head_dim=head_dim, scale=scale, layer_type=layer_type, sliding_window=sliding_window, softcap=softcap
    )
    if fused and head_norms is None:
        if any(isinstance(a, (QuantizedWeight, Fp8Weight)) for a in weights):  # three quantized GEMMs (own scales, groups, act orders)
            parts = [linear(g, x, wi, bi, f"{role}_proj") for role, wi, bi in zip("qkv", weights, bias)]
            qkv = concat(g, parts, len(x.shape) - 1, "qkv_proj")
            return cached_attention(g, layer_idx, qkv, None, None, rope=spec, **common)
        w = np.concatenate([np.asarray(a) for a in weights], axis=0)
        b = None
        if any(a is not None for a in bias):
            b = np.concatenate([np.zeros(np.asarray(wi).shape[0], np.float32) if bi is None else np.asarray(bi) for wi, bi in zip(weights, bias)])
        qkv = linear(g, x, w, b, "qkv_proj")
        return cached_attention(g, layer_idx, qkv, None, None, rope=spec, **common)
    heads = (num_heads, num_kv_heads, num_kv_heads)
    q, k, v = (
        split_heads(g, linear(g, x, wi, bi, f"{role}_proj"), n, head_dim, f"{role}_heads") for role, wi, bi, n in zip("qkv", weights, bias, heads)
    )
    if head_norms is not None:
        q_w, k_w, eps = head_norms
        q = rms_norm(g, q, q_w, eps, "q_norm", head_norm_offset)
        k = rms_norm(g, k, k_w, eps, "k_norm", head_norm_offset)
    if fused:
        return cached_attention(g, layer_idx, q, k, v, rope=spec, **common)
    q, k = rotary(g, q, k, inputs[kv_modes.POSITION_IDS], spec, seq_lens=inputs.get(kv_modes.ROPE_SEQ_LENS))
    return cached_attention(g, layer_idx, q, k, v, **common)


def last_token_hidden(g: Graph, h: Tensor, name: str = "last_hidden") -> Tensor:
    """The rows of ``h`` (``[T, E]`` packed or ``[B, S, E]`` padded) at ``last_token_ids``:
    ``[B, E]``, one per sequence."""
    flat = h if len(h.shape) == 2 else reshape(g, h, (-1, h.shape[-1]), "flat_hidden")
    return gather(g, flat, g.inputs[kv_modes.LAST_TOKEN_IDS], 0, name)


def logits_output(g: Graph, logits: Tensor) -> Tensor:
    """Mark ``logits`` ``[B, vocab_size]``, cast to float32, as the network's logits output
    (a float32 ``logits`` passes through an identity layer, so that the tensor given keeps its
    name, e.g. ``lm_head`` for ``trtcore check --bisect``)."""
    out = cast(g, logits, np.float32, "logits_float")
    if out is logits:
        out = g.named(g.network.add_identity(logits), "logits_float")
    return g.output(out, kv_modes.LOGITS)
