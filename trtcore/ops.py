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
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from . import kv_modes
from .dtypes import ENGINE_DTYPES, trt_dtype
from .errors import InvalidArgumentError, NetworkError
from .fp8 import E4M3, E4M3_MAX, Fp8Weight, from_e4m3
from .kv_modes import KVMode
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
        #: network inputs declared by :func:`model_inputs`, by name
        self.inputs: dict[str, Tensor] = {}
        #: tensors shared by all layers (e.g. RoPE's cos/sin), keyed by op
        self.shared: dict[Any, Any] = {}
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


def linear(g: Graph, x: Tensor, weight: np.ndarray | QuantizedWeight | Fp8Weight, bias: np.ndarray | None = None, name: str = "linear") -> Tensor:
    """``x @ weight.T + bias`` (``torch.nn.Linear``).

    Args:
        x: ``[..., in_features]`` of the graph dtype.
        weight: ``[out_features, in_features]`` (Hugging Face layout), any float dtype;
            stored as a constant of the graph dtype. A
            :class:`~trtcore.quantization.QuantizedWeight` (a quantized checkpoint's linear)
            stays quantized: :func:`weight_only_linear`; an :class:`~trtcore.fp8.Fp8Weight`
            runs as an FP8 GEMM: :func:`fp8_linear`.
        bias: ``[out_features]`` or None.

    Returns:
        ``[..., out_features]`` of the graph dtype, named ``name``.
    """
    if isinstance(weight, QuantizedWeight):
        return weight_only_linear(g, x, weight, bias, name)
    if isinstance(weight, Fp8Weight):
        return fp8_linear(g, x, weight, bias, name)
    if weight.ndim != 2 or (x.shape[-1] != -1 and x.shape[-1] != weight.shape[1]):
        raise NetworkError(f"{name}: weight {weight.shape} does not fit input {tuple(x.shape)}")
    rank = len(x.shape)
    w = constant(g, weight.reshape((1,) * (rank - 2) + weight.shape), f"{name}.weight", g.np_dtype)
    y = matmul(g, x, w, transpose_b=True, name=name if bias is None else f"{name}.matmul")
    if bias is not None:
        b = constant(g, bias.reshape((1,) * (rank - 1) + bias.shape), f"{name}.bias", g.np_dtype)
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
    ``(e4m3(x / s_x) * s_x) @ (q_w * s_w)^T``, ``s_x`` static or dynamic).

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
            ``g.implementations["fp8_gemm"]`` if set, else the plugin where the TensorRT
            module hosts plugins and the shape suits cuBLASLt (K and N multiples of 16),
            ``"qdq"`` otherwise.

    Returns:
        ``[..., N]`` of x's dtype, named ``name``.

    Raises:
        NetworkError: x's last dimension is not K, or the bias is not ``[N]``.
        InvalidArgumentError: unknown ``impl``.
    """
    n, k = fw.shape
    if x.shape[-1] != -1 and x.shape[-1] != k:
        raise NetworkError(f"{name}: FP8 weight [{n}, {k}] does not fit input {tuple(x.shape)}")
    if bias is not None and bias.shape != (n,):
        raise NetworkError(f"{name}: bias must be [{n}], got {bias.shape}")
    if impl is None:
        from trtcore.plugins.base import hosts_plugins

        fits = k % 16 == 0 and n % 16 == 0
        impl = g.implementations.get("fp8_gemm") or ("plugin" if hosts_plugins(g.trt) and fits else "qdq")
    if impl not in FP8_IMPLEMENTATIONS:
        raise InvalidArgumentError(f"{name}: FP8 GEMM implementation {impl!r} is not one of {FP8_IMPLEMENTATIONS}")
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
    TensorRT's quantize layer) or ``[1] * rank`` (broadcasting, the reference's emulation)."""
    if fw.input_scale is not None:
        return _fp8_scalar(g, fw.input_scale[0], rank, "input_scale")
    amax = reduce(g, unary(g, xf, "ABS", "x_abs"), "MAX", list(range(len(xf.shape))), keep_dims=rank != 0, name="x_amax")
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


def embedding(g: Graph, ids: Tensor, table: np.ndarray, name: str = "embed_tokens") -> Tensor:
    """Look up rows of ``table`` (``[vocab_size, hidden_size]``) for int32 ``ids`` ``[...]``."""
    t = constant(g, table, f"{name}.weight", g.np_dtype)
    return gather(g, t, ids, 0, name)


def rms_norm(g: Graph, x: Tensor, weight: np.ndarray, eps: float, name: str = "norm") -> Tensor:
    """RMSNorm (Zhang & Sennrich, arXiv:1910.07467) over the last axis, as ``LlamaRMSNorm``.

    Computes ``weight * (x32 / sqrt(mean(x32**2) + eps)).to(dtype)`` with ``x32`` = x in
    float32; ``x`` is ``[..., hidden]``, ``weight`` ``[hidden]``. Output: graph dtype.
    """
    rank = len(x.shape)
    with g.scope(name):
        x32 = cast(g, x, np.float32, "to_float")
        sq = mul(g, x32, x32, "square")
        var = reduce(g, sq, "AVG", [-1], True, "variance")
        var = add(g, var, scalar(g, eps, rank, np.float32, "eps"), "add_eps")
        inv = unary(g, unary(g, var, "SQRT", "sqrt"), "RECIP", "rsqrt")
        normed = cast(g, mul(g, x32, inv, "normalize"), g.np_dtype, "to_dtype")
    w = constant(g, weight.reshape((1,) * (rank - 1) + weight.shape), f"{name}.weight", g.np_dtype)
    return mul(g, normed, w, name)


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


def silu(g: Graph, x: Tensor, name: str = "silu") -> Tensor:
    """``x * sigmoid(x)`` (SiLU / swish)."""
    s = g.named(g.network.add_activation(x, g.trt.ActivationType.SIGMOID), f"{name}.sigmoid")
    return mul(g, x, s, name)


def swiglu_mlp(
    g: Graph,
    x: Tensor,
    gate: np.ndarray,
    up: np.ndarray,
    down: np.ndarray,
    biases: tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None] = (None, None, None),
    name: str = "mlp",
) -> Tensor:
    """``down(silu(gate(x)) * up(x))`` (Shazeer, "GLU Variants", arXiv:2002.05202; ``LlamaMLP``)."""
    with g.scope(name):
        h = mul(g, silu(g, linear(g, x, gate, biases[0], "gate_proj"), "act_fn"), linear(g, x, up, biases[1], "up_proj"), "gated")
        return linear(g, h, down, biases[2], "down_proj")


# ---------------------------------------------------------------------------------------
# rotary embedding (composed standard layers)
# ---------------------------------------------------------------------------------------


def rope_cos_sin(g: Graph, position_ids: Tensor, spec: RopeSpec, name: str = "rotary_emb", seq_lens: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """cos and sin of ``position * inv_freq`` for int32 ``position_ids`` ``[...]``
    (``[batch, seq]`` padded, or ``[num_tokens]`` packed).

    Returns two float32 tensors ``[..., 1, rotary_dim]`` (each half repeated, as
    transformers' ``cat((freqs, freqs), -1)``; the 1 broadcasts over heads), scaled by the
    attention factor. For ``dynamic`` scaling the base is recomputed per sequence
    (:func:`trtcore.rope.dynamic_ntk_base`) from ``seq_lens`` (int32, same shape as
    ``position_ids``: each token's sequence length in this call) or, when None, from the
    largest position of each row of a ``[batch, seq]`` input, as transformers does per
    forward call.
    """
    half = spec.rotary_dim // 2
    r = len(position_ids.shape)
    keep = (0,) * r
    with g.scope(name):
        pos = reshape(g, cast(g, position_ids, np.float32, "positions"), keep + (1,), "positions_col")
        if spec.rope_type == "dynamic":
            # inv_freq = base'^(-2i/d), base' = base * (f*s/L - (f-1))^(d/(d-2)), s = max(L, seq_len)
            d, f, L = spec.rotary_dim, spec.dynamic_factor, float(spec.max_position_embeddings)
            if seq_lens is not None:
                s = reshape(g, cast(g, seq_lens, np.float32, "seq_lens_float"), keep + (1,), "seq_len")
            else:
                smax = reduce(g, pos, "MAX", [r - 1], True, "max_position")
                s = add(g, smax, scalar(g, 1.0, r + 1, np.float32, "one"), "seq_len")
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


def _rope_plugin_inputs(g: Graph, position_ids: Tensor, spec: RopeSpec, name: str = "rotary_emb", seq_lens: Tensor | None = None) -> list[Tensor]:
    """The inputs after ``position_ids`` of RoPE's plugins (RopePlugin, fused RoPE of the paged
    attention plugin), made once per network: ``[inv_freq]`` (a float32 constant), plus for
    dynamic scaling each token's sequence length (``seq_lens``, else ``max(position_ids) + 1``
    of its row)."""
    key = ("rope_plugin_inputs", id(position_ids))
    if key not in g.shared:
        with g.scope_at(f"model.{name}"):
            extra = [constant(g, spec.inv_freq.astype(np.float32), "inv_freq", np.float32)]
            if spec.rope_type == "dynamic" and seq_lens is not None:
                extra.append(seq_lens)
            elif spec.rope_type == "dynamic":
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
) -> Tensor:
    """Paged attention of one layer on packed tokens (:class:`trtcore.plugins.paged_attention.PagedAttentionPlugin`).

    Args:
        q: ``[T, Hq, D]``, k/v: ``[T, Hkv, D]``, graph dtype; or, with k and v None, the
            packed ``qkv [T, (Hq + 2 Hkv) * D]`` (q heads, k heads, v heads per token: the
            plugin's ``packed_qkv``).
        rope: None: q and k arrive rotated; a (not ``dynamic``) :class:`trtcore.rope.RopeSpec`:
            the plugin rotates them (fused RoPE, neox pairing) by int32 ``position_ids [T]``.
        kv_pool: ``[num_layers, num_blocks, 2, Hkv, block_size, D]``; the plugin writes this
            step's k/v of layer ``layer_idx`` into it in place.
        block_tables: int32 ``[B, max_blocks]``; seq_lens: int32 ``[B]``; query_start_loc:
            int32 ``[B + 1]``.

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
            raise InvalidArgumentError(f"{name}: fused RoPE needs position_ids and a RoPE without dynamic scaling, got {rope.rope_type!r}")
        rp = RopePlugin.from_spec(rope)
        rotary = {"rotary_dim": rp.rotary_dim, "is_neox": rp.is_neox, "attention_scaling": rp.attention_scaling}
        extra = [position_ids, *_rope_plugin_inputs(g, position_ids, rope)]
    plugin = PagedAttentionPlugin(
        layer_idx=layer_idx,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        sliding_window=sliding_window,
        scale=scale,
        packed_qkv=packed,
        **rotary,
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
    key = ("rope_cos_sin", id(position_ids))
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
) -> Tensor:
    """Scaled dot-product attention with GQA/MQA over a contiguous cache.

    Args:
        q: ``[batch, seq, num_heads, head_dim]`` (graph dtype, RoPE applied).
        k_cache, v_cache: ``[batch, num_kv_heads, total_len, head_dim]`` (past + new).
        mask: float32 additive mask ``[batch, 1, 1, seq, total_len]`` (0 or a large negative).
        scale: softmax scale, usually ``head_dim ** -0.5``.

    Returns:
        ``[batch, seq, num_heads * head_dim]``. Query head ``h`` attends to KV head
        ``h // (num_heads // num_kv_heads)`` (transformers' ``repeat_kv``); scores are
        scaled, masked and soft-maxed in float32 (Vaswani et al., arXiv:1706.03762).
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

    Returns:
        ``[..., H * D]`` of the graph dtype.

    Raises:
        InvalidArgumentError: ``g`` has no KV cache contract, or its inputs are undeclared
            (call :func:`model_inputs` first), or packed qkv / ``rope`` outside the paged mode.
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
        ctx = attention(g, q, k_all, v_all, mask, num_kv_heads, head_dim, scale, name)
    g.output(k_all, mode.cache_output(layer_idx, "key"))
    g.output(v_all, mode.cache_output(layer_idx, "value"))
    return ctx


def fuses_rope(g: Graph, spec: RopeSpec) -> bool:
    """Whether :func:`self_attention` rotates inside the paged attention plugin: the plan's
    ``rope`` is ``"attention"``, the KV cache is paged and the RoPE has no dynamic scaling
    (per-sequence frequencies stay with the RoPE plugin)."""
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
) -> Tensor:
    """A decoder layer's attention up to (not including) ``o_proj``: the q/k/v projections,
    optional RMSNorm of each q/k head, RoPE (neox pairing) by the network's ``position_ids``,
    and :func:`cached_attention`.

    When :func:`fuses_rope`, RoPE runs inside the paged attention plugin; without head norms
    the three projections are also one product ``qkv_proj`` (the weights concatenated along
    the output features, q|k|v, as TensorRT-LLM's fused QKV) whose output is the plugin's
    packed ``qkv`` input: no RoPE layer, no q/k/v split. Otherwise ``q_proj`` / ``k_proj`` /
    ``v_proj``, ``q_heads`` / ``k_heads`` / ``v_heads``, (``q_norm`` / ``k_norm``) and
    :func:`rotary` as separate layers.

    Args:
        x: ``[..., hidden]`` normalized hidden states (the token layout of the KV mode).
        weights: ``(q_proj, k_proj, v_proj)`` weights, ``[out_features, hidden]`` each.
        biases: their biases (``[out_features]`` or None each), or None.
        spec: the model's RoPE (:func:`trtcore.rope.rope_spec`).
        head_norms: ``(q_norm weight, k_norm weight, eps)`` (Qwen3: RMSNorm of each head
            before RoPE), or None.
        others: as :func:`cached_attention`.

    Returns:
        ``[..., num_heads * head_dim]`` of the graph dtype.
    """
    inputs = g.inputs
    if kv_modes.POSITION_IDS not in inputs:
        raise InvalidArgumentError("self_attention needs the network inputs; call ops.model_inputs(g) first")
    bias = list(biases) if biases is not None else [None, None, None]
    fused = fuses_rope(g, spec)
    common: dict[str, Any] = dict(num_kv_heads=num_kv_heads, head_dim=head_dim, scale=scale, layer_type=layer_type, sliding_window=sliding_window)
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
        q = rms_norm(g, q, q_w, eps, "q_norm")
        k = rms_norm(g, k, k_w, eps, "k_norm")
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
    """Mark ``logits`` ``[B, vocab_size]``, cast to float32, as the network's logits output."""
    return g.output(cast(g, logits, np.float32, "logits_float"), kv_modes.LOGITS)
