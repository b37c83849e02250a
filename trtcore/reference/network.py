"""``INetworkDefinition`` and its layers, as trtcore's reference implementation.

This is the subset of TensorRT's network-definition API that trtcore's ops use, with
TensorRT's names and semantics (TensorRT 10 Python API and "Operators" documentation):

* networks are strongly typed: every layer's output type follows from its inputs' types
  (``ICastLayer`` changes it), and mixed-type inputs are an error;
* shapes use ``-1`` for dimensions only known at run time; ``IShuffleLayer.reshape_dims``
  treats ``0`` as "copy the input dimension" and one ``-1`` as "infer";
* elementwise, matrix-multiply and select inputs must have equal rank and broadcast
  dimensions of size 1;
* reduce and softmax axes are bitmasks;
* ``IAttention`` (``add_attention_v2``) and ``IKVCacheUpdateLayer`` (``add_kv_cache_update``)
  follow TensorRT 10.15+ / TensorRT-RTX 1.7 (see their docstrings for the rules checked).

Shapes are inferred when a layer is added and again when one of its attributes is set,
so ``tensor.shape`` can be read as in TensorRT. A shape or type error is remembered, not
raised, while attributes may still change (``add_concatenation`` then ``.axis``); reading
the shape of an affected tensor, validating the network for a build, or evaluating it
raises :class:`trtcore.errors.NetworkError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dims import Dim
from ..errors import NetworkError
from .types import (
    FLOATING,
    ActivationType,
    AttentionIOForm,
    AttentionNormalizationOp,
    CausalMaskKind,
    DataType,
    ElementWiseOperation,
    GatherMode,
    KVCacheMode,
    LayerType,
    MatrixOperation,
    ReduceOperation,
    UnaryOperation,
    Weights,
)

Shape = tuple[int, ...]


class ITensor:
    """A tensor of the network: an input, a layer output or a constant."""

    def __init__(self, network: INetworkDefinition, name: str, producer: ILayer | None, index: int = 0):
        self._network = network
        self._name = name
        self.producer = producer
        self.index = index
        self._shape: Shape = ()
        self._dtype = DataType.FLOAT

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self._network._rename(self, value)

    @property
    def shape(self) -> Shape:
        """Dimensions; -1 where only known at run time.

        Raises:
            NetworkError: the producing layer (or one before it) is inconsistent.
        """
        self._check()
        return self._shape

    @property
    def dtype(self) -> DataType:
        self._check()
        return self._dtype

    def _check(self) -> None:
        if self.producer is None:
            return
        self._network._refresh()
        if self.producer._error is not None:
            self.producer._update()  # the message names the layer as it is called now
            raise self.producer._error

    @property
    def is_network_input(self) -> bool:
        return self.producer is None

    @property
    def is_network_output(self) -> bool:
        return self in self._network._outputs

    def __repr__(self) -> str:
        return f"ITensor({self._name!r}, shape={self._shape}, dtype={self._dtype.name})"


def _bad(layer: ILayer, msg: str) -> NetworkError:
    return NetworkError(f"{layer.type.name} layer {layer.name!r}: {msg}")


def _broadcast(layer: ILayer, shapes: Sequence[Shape]) -> Shape:
    ranks = {len(s) for s in shapes}
    if len(ranks) != 1:
        raise _bad(layer, f"inputs must have equal rank, got shapes {list(shapes)}")
    out = []
    for dims in zip(*shapes):
        known = {d for d in dims if d not in (-1, 1)}
        if len(known) > 1:
            raise _bad(layer, f"shapes {list(shapes)} do not broadcast")
        if known:
            out.append(known.pop())
        elif -1 in dims:
            out.append(-1)
        else:
            out.append(1)
    return tuple(out)


def _axes(mask: int, rank: int) -> tuple[int, ...]:
    return tuple(i for i in range(rank) if mask >> i & 1)


class ILayer:
    """Base of every layer: ``name``, ``type``, inputs and outputs."""

    type: LayerType
    _attrs: tuple[str, ...] = ()

    def __init__(self, network: INetworkDefinition, inputs: Sequence[ITensor | None], num_outputs: int = 1):
        object.__setattr__(self, "_ready", False)
        self._error: NetworkError | None = None
        self._network = network
        self._inputs: list[ITensor | None] = list(inputs)
        index = network.num_layers
        self.name = f"({type(self).__name__[1:]} {index})"
        self._outputs = [ITensor(network, f"{self.name}_output_{i}", self, i) for i in range(num_outputs)]
        self.metadata = ""
        object.__setattr__(self, "_ready", True)

    def __setattr__(self, key: str, value: Any) -> None:
        object.__setattr__(self, key, value)
        if key in self._attrs and getattr(self, "_ready", False):
            self._changed()

    def _changed(self) -> None:
        """An attribute changed: re-infer, and make later layers re-infer on next read."""
        self._update()
        self._network._version += 1
        self._network._seen = self._network._version if self is self._network._layers[-1] else self._network._seen

    # TensorRT API -----------------------------------------------------------------
    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def get_input(self, index: int) -> ITensor | None:
        return self._inputs[index]

    def get_output(self, index: int) -> ITensor:
        return self._outputs[index]

    def set_input(self, index: int, tensor: ITensor) -> None:
        while len(self._inputs) <= index:
            self._inputs.append(None)
        self._inputs[index] = tensor
        self._update()

    # inference ----------------------------------------------------------------------
    def _update(self) -> None:
        try:
            shapes, dtypes = self._infer()
        except NetworkError as exc:
            self._error = exc
            return
        self._error = None
        for out, shape, dtype in zip(self._outputs, shapes, dtypes):
            out._shape = tuple(int(d) for d in shape)
            out._dtype = DataType(dtype)

    def _infer(self) -> tuple[list[Shape], list[DataType]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _in(self, i: int) -> ITensor:
        t = self._inputs[i]
        if t is None:
            raise _bad(self, f"input {i} is not set")
        return t

    def _same_dtype(self, tensors: Sequence[ITensor]) -> DataType:
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1:
            desc = ", ".join(f"{t.name}: {t.dtype.name}" for t in tensors)
            raise _bad(self, f"strongly typed network needs one input type, got {desc}; add a cast")
        return dtypes.pop()


class IConstantLayer(ILayer):
    type = LayerType.CONSTANT
    _attrs = ("shape", "weights")

    def __init__(self, network: INetworkDefinition, shape: Shape, weights: Weights):
        self.shape = tuple(int(d) for d in shape)
        self.weights = weights
        super().__init__(network, [])
        self._update()

    def _infer(self) -> tuple[list[Shape], list[DataType]]:
        if int(np.prod(self.shape)) != self.weights.size:
            raise _bad(self, f"shape {self.shape} needs {int(np.prod(self.shape))} values, weights have {self.weights.size}")
        return [self.shape], [self.weights.dtype]


class IElementWiseLayer(ILayer):
    type = LayerType.ELEMENTWISE
    _attrs = ("op",)

    def __init__(self, network: INetworkDefinition, a: ITensor, b: ITensor, op: ElementWiseOperation):
        self.op = ElementWiseOperation(op)
        super().__init__(network, [a, b])
        self._update()

    def _infer(self) -> tuple[list[Shape], list[DataType]]:
        a, b = self._in(0), self._in(1)
        dtype = self._same_dtype([a, b])
        if self.op in (ElementWiseOperation.AND, ElementWiseOperation.OR, ElementWiseOperation.XOR):
            if dtype != DataType.BOOL:
                raise _bad(self, f"{self.op.name} needs BOOL inputs, got {dtype.name}")
        elif dtype == DataType.BOOL and self.op != ElementWiseOperation.EQUAL:
            raise _bad(self, f"{self.op.name} does not take BOOL inputs")
        out = DataType.BOOL if self.op in (ElementWiseOperation.EQUAL, ElementWiseOperation.GREATER, ElementWiseOperation.LESS) else dtype
        return [_broadcast(self, [a.shape, b.shape])], [out]


class IUnaryLayer(ILayer):
    type = LayerType.UNARY
    _attrs = ("op",)

    def __init__(self, network: INetworkDefinition, x: ITensor, op: UnaryOperation):
        self.op = UnaryOperation(op)
        super().__init__(network, [x])
        self._update()

    def _infer(self) -> tuple[list[Shape], list[DataType]]:
        x = self._in(0)
        out = DataType.BOOL if self.op in (UnaryOperation.ISINF, UnaryOperation.ISNAN) else x.dtype
        if self.op == UnaryOperation.NOT:
            allowed = {DataType.BOOL}
        elif self.op in (UnaryOperation.ABS, UnaryOperation.NEG, UnaryOperation.SIGN):
            allowed = set(FLOATING) | {DataType.INT32, DataType.INT64, DataType.INT8}
        else:
            allowed = set(FLOATING)
        if x.dtype not in allowed:
            raise _bad(self, f"{self.op.name} does not take {x.dtype.name} inputs")
        return [x.shape], [out]


class IActivationLayer(ILayer):
    type = LayerType.ACTIVATION
    _attrs = ()

    #: TensorRT's default alpha / beta per activation (``IActivationLayer`` documentation)
    DEFAULTS = {
        ActivationType.LEAKY_RELU: (0.01, 0.0),
        ActivationType.ELU: (1.0, 0.0),
        ActivationType.SELU: (1.6732632423543772, 1.0507009873554805),
        ActivationType.SOFTPLUS: (1.0, 1.0),
        ActivationType.CLIP: (-3.4028234663852886e38, 3.4028234663852886e38),
        ActivationType.HARD_SIGMOID: (0.2, 0.5),
        ActivationType.SCALED_TANH: (1.0, 1.0),
        ActivationType.THRESHOLDED_RELU: (1.0, 0.0),
    }

    def __init__(self, network: INetworkDefinition, x: ITensor, kind: ActivationType):
        self.alpha, self.beta = self.DEFAULTS.get(ActivationType(kind), (0.0, 0.0))
        object.__setattr__(self, "_kind", ActivationType(kind))
        super().__init__(network, [x])
        self._update()

    # TensorRT names the activation kind ``type``; the layer kind is ``LayerType.ACTIVATION``.
    @property  # type: ignore[override]
    def type(self) -> ActivationType:  # noqa: F811 - the activation kind shadows the class-level layer kind, as in TensorRT
        return self._kind

    @type.setter
    def type(self, value: ActivationType) -> None:
        object.__setattr__(self, "_kind", ActivationType(value))
        if getattr(self, "_ready", False):
            self._changed()

    def _infer(self) -> tuple[list[Shape], list[DataType]]:
        x = self._in(0)
        ints = {DataType.INT32, DataType.INT64} if self._kind == ActivationType.RELU else set()
        if x.dtype not in FLOATING and x.dtype not in ints:
            raise _bad(self, f"activation {self._kind.name} does not take {x.dtype.name} inputs")
        return [x.shape], [x.dtype]


class IReduceLayer(ILayer):
    type = LayerType.REDUCE
    _attrs = ("op", "axes", "keep_dims")

    def __init__(self, network: INetworkDefinition, x: ITensor, op: ReduceOperation, axes: int, keep_dims: bool):
        self.op = ReduceOperation(op)
        self.axes = int(axes)
        self.keep_dims = bool(keep_dims)
        super().__init__(network, [x])
        self._update()

    def _infer(self) -> tuple[list[Shape], list[DataType]]:
        x = self._in(0)
        if x.dtype == DataType.BOOL:
            raise _bad(self, "reduce does not take BOOL inputs")
        axes = _axes(self.axes, len(x.shape))
        if not axes or self.axes >> len(x.shape):
            raise _bad(self, f"axes bitmask {self.axes:#b} does not fit rank {len(x.shape)}")
        if self.keep_dims:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        return [shape], [x.dtype]


class ISoftMaxLayer(ILayer):
    type = LayerType.SOFTMAX
    _attrs = ("axes",)

    def __init__(self, network: INetworkDefinition, x: ITensor):
        self.axes = 1 << max(len(x.shape) - 3, 0)  # TensorRT's default axis
        super().__init__(network, [x])
        self._update()

    def _infer(self) -> tuple[list[Shape], list[DataType]]:
        x = self._in(0)
        if len(_axes(self.axes, len(x.shape))) != 1:
            raise _bad(self, f"softmax axes {self.axes:#b} must name exactly one axis of rank {len(x.shape)}")
        if x.dtype not in FLOATING:
            raise _bad(self, "softmax needs a floating-point input")
        return [x.shape], [x.dtype]


class IConcatenationLayer(ILayer):
    type = LayerType.CONCATENATION
    _attrs = ("axis",)

    def __init__(self, network: INetworkDefinition, tensors: Sequence[ITensor]):
        self.axis = max(len(tensors[0].shape) - 3, 0) if tensors else 0  # TensorRT's default axis
        super().__init__(network, list(tensors))
        self._update()

    def _infer(self) -> tuple[list[Shape], list[DataType]]:
        ts = [self._in(i) for i in range(self.num_inputs)]
        dtype = self._same_dtype(ts)
        rank = len(ts[0].shape)
        axis = self.axis
        if any(len(t.shape) != rank for t in ts) or not 0 <= axis < rank:
            raise _bad(self, f"cannot concatenate shapes {[t.shape for t in ts]} on axis {axis}")
        out = list(ts[0].shape)
        total = 0
        for t in ts:
            total = -1 if total == -1 or t.shape[axis] == -1 else total + t.shape[axis]
        for i in range(rank):
            if i == axis:
                out[i] = total
                continue
            known = {t.shape[i] for t in ts if t.shape[i] != -1}
            if len(known) > 1:
                raise _bad(self, f"shapes {[t.shape for t in ts]} differ outside axis {axis}")
            out[i] = known.pop() if known else -1
        return [tuple(out)], [dtype]


class IShuffleLayer(ILayer):
    type = LayerType.SHUFFLE
    _attrs = ("first_transpose", "reshape_dims", "second_transpose", "zero_is_placeholder")

    def __init__(self, network: INetworkDefinition, x: ITensor):
        rank = len(x.shape)
        self.first_transpose = tuple(range(rank))
        self.reshape_dims: Shape | None = None
        self.second_transpose: tuple[int, ...] | None = None
        self.zero_is_placeholder = True
        super().__init__(network, [x])
        self._update()

    def resolve_reshape(self, in_shape: Shape) -> Shape:
        """The reshape target for a concrete (or partly -1) ``in_shape``."""
        dims = list(self.reshape_dims or ())
        out: list[int] = []
        for i, d in enumerate(dims):
            if d == 0 and self.zero_is_placeholder:
                if i >= len(in_shape):
                    raise _bad(self, f"placeholder 0 at index {i} beyond input rank {len(in_shape)}")
                out.append(in_shape[i])
            else:
                out.append(int(d))
        explicit_infer = [i for i, d in enumerate(dims) if d == -1]
        if len(explicit_infer) > 1:
            raise _bad(self, f"reshape {dims} has more than one -1")
        if -1 in in_shape and explicit_infer:
            # TensorRT still resolves the -1 when every unknown input dim is copied by a 0
            copied = {i for i, d in enumerate(dims) if d == 0 and self.zero_is_placeholder and i < len(in_shape)}
            rest = [d for i, d in enumerate(in_shape) if i not in copied]
            if -1 not in rest:
                known = int(np.prod([d for i, d in enumerate(out) if i not in copied and i != explicit_infer[0]]))
                if known and int(np.prod(rest)) % known == 0:
                    out[explicit_infer[0]] = int(np.prod(rest)) // known
            return tuple(out)
        if -1 not in in_shape:
            vol = int(np.prod(in_shape))
            if out.count(-1) == 1:
                rest = int(np.prod([d for d in out if d != -1]))
                if rest == 0 or vol % rest:
                    raise _bad(self, f"cannot reshape {in_shape} into {dims}")
                out[out.index(-1)] = vol // rest
            elif int(np.prod(out)) != vol:
                raise _bad(self, f"cannot reshape {in_shape} ({vol} elements) into {tuple(out)}")
        return tuple(out)

    def _infer(self) -> tuple[list[Shape], list[DataType]]:
        x = self._in(0)
        perm = tuple(self.first_transpose)
        if sorted(perm) != list(range(len(x.shape))):
            raise _bad(self, f"first_transpose {perm} is no permutation of rank {len(x.shape)}")
        shape = tuple(x.shape[p] for p in perm)
        if self.reshape_dims is not None:
            shape = self.resolve_reshape(shape)
        if self.second_transpose is not None:
            perm2 = tuple(self.second_transpose)
            if sorted(perm2) != list(range(len(shape))):
                raise _bad(self, f"second_transpose {perm2} is no permutation of rank {len(shape)}")
            shape = tuple(shape[p] for p in perm2)
        return [shape], [x.dtype]


class IMatrixMultiplyLayer(ILayer):
    type = LayerType.MATRIX_MULTIPLY
    _attrs = ("op0", "op1")

    def __init__(self, network: INetworkDefinition, a: ITensor, op0: MatrixOperation, b: ITensor, op1: MatrixOperation):
        self.op0 = MatrixOperation(op0)
        self.op1 = MatrixOperation(op1)
        super().__init__(network, [a, b])
        self._update()

    def _infer(self) -> tuple[list[Shape], list[DataType]]:
        a, b = self._in(0), self._in(1)
        dtype = self._same_dtype([a, b])
        if dtype not in FLOATING:
            raise _bad(self, f"matrix multiply needs floating-point inputs, got {dtype.name}")
        if self.op0 == MatrixOperation.VECTOR or self.op1 == MatrixOperation.VECTOR:
            raise _bad(self, "MatrixOperation.VECTOR is not supported by the reference backend")
        if len(a.shape) != len(b.shape) or len(a.shape) < 2:
            raise _bad(self, f"inputs need equal rank >= 2, got {a.shape} and {b.shape}")
        m, ka = (a.shape[-1], a.shape[-2]) if self.op0 == MatrixOperation.TRANSPOSE else a.shape[-2:]
        kb, n = (b.shape[-1], b.shape[-2]) if self.op1 == MatrixOperation.TRANSPOSE else b.shape[-2:]
        if -1 not in (ka, kb) and ka != kb:
            raise _bad(self, f"inner dimensions differ: {a.shape} ({self.op0.name}) x {b.shape} ({self.op1.name})")
        batch = _broadcast(self, [a.shape[:-2], b.shape[:-2]]) if len(a.shape) > 2 else ()
        return [batch + (m, n)], [dtype]


class IGatherLayer(ILayer):
    type = LayerType.GATHER
    _attrs = ("axis", "mode", "num_elementwise_dims")

    def __init__(self, network: INetworkDefinition, data: ITensor, indices: ITensor, axis: int):
        self.axis = int(axis)
        self.mode = GatherMode.DEFAULT
        self.num_elementwise_dims = 0
        super().__init__(network, [data, indices])
        self._update()

    def _infer(self) -> tuple[list[Shape], list[DataType]]:
        data, idx = self._in(0), self._in(1)
        if self.mode != GatherMode.DEFAULT or self.num_elementwise_dims:
            raise _bad(self, "only GatherMode.DEFAULT without elementwise dims is supported")
        if idx.dtype not in (DataType.INT32, DataType.INT64):
            raise _bad(self, f"indices must be INT32 or INT64, got {idx.dtype.name}")
        if not 0 <= self.axis < len(data.shape):
            raise _bad(self, f"axis {self.axis} out of range for rank {len(data.shape)}")
        shape = data.shape[: self.axis] + idx.shape + data.shape[self.axis + 1 :]
        return [shape], [data.dtype]


class ICastLayer(ILayer):
    type = LayerType.CAST
    _attrs = ("to_type",)

    def __init__(self, network: INetworkDefinition, x: ITensor, to_type: DataType):
        self.to_type = DataType(to_type)
        super().__init__(network, [x])
        self._update()

    def _infer(self) -> tuple[list[Shape], list[DataType]]:
        return [self._in(0).shape], [self.to_type]


class IIdentityLayer(ILayer):
    type = LayerType.IDENTITY

    def __init__(self, network: INetworkDefinition, x: ITensor):
        super().__init__(network, [x])
        self._update()

    def _infer(self) -> tuple[list[Shape], list[DataType]]:
        x = self._in(0)
        return [x.shape], [x.dtype]


class ISelectLayer(ILayer):
    type = LayerType.SELECT

    def __init__(self, network: INetworkDefinition, cond: ITensor, then: ITensor, other: ITensor):
        super().__init__(network, [cond, then, other])
        self._update()

    def _infer(self) -> tuple[list[Shape], list[DataType]]:
        c, t, e = self._in(0), self._in(1), self._in(2)
        if c.dtype != DataType.BOOL:
            raise _bad(self, f"condition must be BOOL, got {c.dtype.name}")
        dtype = self._same_dtype([t, e])
        return [_broadcast(self, [c.shape, t.shape, e.shape])], [dtype]


class IPluginV3Layer(ILayer):
    """A plugin in the network; shapes and types come from the plugin object."""

    type = LayerType.PLUGIN_V3

    def __init__(self, network: INetworkDefinition, inputs: Sequence[ITensor], plugin: Any):
        self.plugin = plugin
        super().__init__(network, list(inputs), num_outputs=int(plugin.num_outputs))
        self._update()

    def _infer(self) -> tuple[list[Shape], list[DataType]]:
        from .types import from_numpy_dtype, nptype

        ins = [self._in(i) for i in range(self.num_inputs)]
        try:
            dtypes = self.plugin.output_dtypes([np.dtype(nptype(t.dtype)) for t in ins])
            shapes = self.plugin.output_shapes([[Dim(d) for d in t.shape] for t in ins])
        except Exception as exc:  # the plugin rejected its inputs
            raise _bad(self, f"plugin {self.plugin.plugin_name}: {exc}") from exc
        out_shapes = [tuple(-1 if Dim.of(d) is None else Dim.of(d) for d in s) for s in shapes]
        return out_shapes, [from_numpy_dtype(d) for d in dtypes]  # type: ignore[misc]


def _agree(a: int, b: int) -> bool:
    """Two dimensions can be equal (either is only known at run time, or they are)."""
    return a == -1 or b == -1 or a == b


def _optional_input(index: int, name: str) -> property:
    """A property over :class:`IAttention`'s optional input ``index`` (None when unset;
    setting None removes it), as TensorRT's ``IAttention.<name>``."""

    def get(self: IAttention) -> ITensor | None:
        return self._opt(index)

    def set(self: IAttention, tensor: ITensor | None) -> None:
        self._set_opt(index, tensor)

    return property(get, set, doc=f"The optional input {index} (``{name}``), an ITensor or None.")


class IAttention(ILayer):
    """Fused scaled-dot-product attention (``tensorrt.IAttention``, from ``add_attention_v2``).

    Computes ``norm(Q @ K^T (+|masked) mask) @ V`` per batch and query head, where ``norm`` is
    ``norm_op`` (softmax over the key axis, or none). As TensorRT documents ("Fused
    Attention"), there is **no scale**: the caller multiplies Q (or K) by the attention
    scale first.

    Inputs (``PADDED_BHND``, the only form the reference supports): query ``[B, Hq, S_q, D]``,
    key and value ``[B, Hkv, S_kv, D]``, all of one type (FLOAT, HALF or BF16); ``Hq`` must
    be a multiple of ``Hkv`` (GQA / MQA: query head ``h`` uses key/value head
    ``h // (Hq // Hkv)``). Output: ``[B, Hq, S_q, D]`` of the query's type.

    Optional inputs, set as attributes:

    * ``mask`` ``[a0, a1, S_q, S_kv]`` (rank 4; ``a0`` 1 or ``B``, ``a1`` 1 or ``Hq``):
      BOOL, True where the query may attend; or a float of the query's type, added to
      ``Q @ K^T``. It cannot be combined with a ``causal_kind`` other than ``NONE``
      (TensorRT refuses that in ``setMask`` / ``setCausalKind``; here it raises at once).
    * ``causal_kind``: ``UPPER_LEFT`` keeps keys ``j <= i``, ``LOWER_RIGHT`` keys
      ``j <= i + (S_kv - S_q)``. ``causal`` (deprecated) is ``causal_kind != NONE``.
    * ``key_value_lengths``: INT32 ``[B]``, keys ``j >= key_value_lengths[b]`` take no part.
      (Combined with ``LOWER_RIGHT`` the diagonal's anchor is not documented; refused here.)

    The reference computes in float32 from the inputs' values, softmax included, and rounds
    the output to its type once. A query row with no key left (a BOOL mask all False) gives
    zeros. Not supported by the reference: ``PACKED_NHD`` forms (``query_lengths``),
    normalization quantization, ``num_ranks > 1``. ``decomposable`` is recorded and has no
    effect (TensorRT needs it True where it has no fused kernel, e.g. float32 or
    ``head_dim`` 8 with TensorRT-RTX 1.7 for sm89).

    TensorRT's ``IAttention`` is no ``ILayer``: it adds an attention-input and an
    attention-output boundary layer to the network. The reference keeps it as one entry of
    the layer list, of type ``LayerType.ATTENTION_OUTPUT``.
    """

    type = LayerType.ATTENTION_OUTPUT
    _attrs = ("norm_op", "causal_kind", "decomposable", "query_form", "key_value_form", "num_ranks")
    #: input indices of the optional tensors (as TensorRT counts them in ``num_inputs``)
    _MASK, _QUANT_SCALE, _QUERY_LENGTHS, _KV_LENGTHS = 3, 4, 5, 6

    def __init__(
        self,
        network: INetworkDefinition,
        query: ITensor,
        key: ITensor,
        value: ITensor,
        norm_op: AttentionNormalizationOp,
        causal_kind: CausalMaskKind,
    ):
        self.norm_op = AttentionNormalizationOp(norm_op)
        self.causal_kind = CausalMaskKind(causal_kind)
        self.decomposable = False
        self.query_form = AttentionIOForm.PADDED_BHND
        self.key_value_form = AttentionIOForm.PADDED_BHND
        self.num_ranks = 1
        self.normalization_quantize_to_type = DataType.FLOAT
        super().__init__(network, [query, key, value])
        self._update()

    # optional inputs ---------------------------------------------------------------
    def _opt(self, index: int) -> ITensor | None:
        inputs = self.__dict__.get("_inputs", [])
        return inputs[index] if index < len(inputs) else None

    def _set_opt(self, index: int, tensor: ITensor | None) -> None:
        if tensor is not None and tensor._network is not self._network:
            raise NetworkError(f"tensor {tensor.name!r} belongs to another network")
        while len(self._inputs) <= index:
            self._inputs.append(None)
        self._inputs[index] = tensor
        while len(self._inputs) > 3 and self._inputs[-1] is None:
            self._inputs.pop()
        self._changed()

    @property
    def mask(self) -> ITensor | None:
        return self._opt(self._MASK)

    @mask.setter
    def mask(self, tensor: ITensor | None) -> None:
        if tensor is not None and self.causal_kind != CausalMaskKind.NONE:
            raise NetworkError(
                f"attention {self.name!r}: a mask cannot be used together with causal_kind {self.causal_kind.name}; "
                "set causal_kind to NONE and fold the causal rule into the mask"
            )
        self._set_opt(self._MASK, tensor)

    @property
    def causal_kind(self) -> CausalMaskKind:
        return self.__dict__["_causal_kind"]

    @causal_kind.setter
    def causal_kind(self, kind: CausalMaskKind) -> None:
        kind = CausalMaskKind(kind)
        if kind != CausalMaskKind.NONE and self._opt(self._MASK) is not None:
            raise NetworkError(f"attention {self.name!r}: causal_kind {kind.name} cannot be used together with a mask")
        self.__dict__["_causal_kind"] = kind

    @property
    def causal(self) -> bool:
        """Deprecated: ``causal_kind != NONE``; setting True means ``UPPER_LEFT``."""
        return self.causal_kind != CausalMaskKind.NONE

    @causal.setter
    def causal(self, value: bool) -> None:
        self.causal_kind = CausalMaskKind.UPPER_LEFT if value else CausalMaskKind.NONE

    key_value_lengths = _optional_input(_KV_LENGTHS, "key_value_lengths")
    query_lengths = _optional_input(_QUERY_LENGTHS, "query_lengths")
    normalization_quantize_scale = _optional_input(_QUANT_SCALE, "normalization_quantize_scale")

    def set_input(self, index: int, tensor: ITensor) -> None:
        """Replace the query (0), key (1) or value (2)."""
        if index not in (0, 1, 2):
            raise NetworkError(
                f"attention {self.name!r}: set_input takes index 0 (query), 1 (key) or 2 (value), got {index}; "
                "set mask / key_value_lengths as attributes"
            )
        self._inputs[index] = tensor
        self._changed()

    # inference -----------------------------------------------------------------------
    def _infer(self) -> tuple[list[Shape], list[DataType]]:
        q, k, v = self._in(0), self._in(1), self._in(2)
        if self.query_form != AttentionIOForm.PADDED_BHND or self.key_value_form != AttentionIOForm.PADDED_BHND:
            raise _bad(self, "the PACKED_NHD form is not supported by the reference backend; use PADDED_BHND")
        if self._opt(self._QUANT_SCALE) is not None:
            raise _bad(self, "normalization quantization is not supported by the reference backend")
        if self.num_ranks != 1:
            raise _bad(self, f"num_ranks {self.num_ranks} (multi-device attention) is not supported by the reference backend")
        dtype = self._same_dtype([q, k, v])
        if dtype not in FLOATING:
            raise _bad(self, f"query, key and value must be FLOAT, HALF or BF16, got {dtype.name}")
        if any(len(t.shape) != 4 for t in (q, k, v)):
            raise _bad(self, f"query, key and value must have rank 4 [batch, heads, tokens, head_dim], got {q.shape}, {k.shape}, {v.shape}")
        if not all(_agree(a, b) for a, b in zip(k.shape, v.shape)):
            raise _bad(self, f"key {k.shape} and value {v.shape} must have the same shape")
        B, Hq, S, D = q.shape
        if not (_agree(B, k.shape[0]) and _agree(D, k.shape[3])):
            raise _bad(self, f"query {q.shape} and key {k.shape} differ in batch or head_dim")
        Hkv = k.shape[1]
        if Hq != -1 and Hkv != -1 and (Hkv == 0 or Hq % Hkv):
            raise _bad(self, f"query number of heads {Hq} must be divisible by key/value number of heads {Hkv}")
        mask = self._opt(self._MASK)
        if mask is not None:
            if self.causal_kind != CausalMaskKind.NONE:
                raise _bad(self, "a mask cannot be used together with a causal_kind other than NONE")
            if len(mask.shape) != 4:
                raise _bad(self, f"mask must be a 4D tensor [batch or 1, heads or 1, S_q, S_kv], got {mask.shape}")
            if mask.dtype != DataType.BOOL and mask.dtype != dtype:
                raise _bad(self, f"mask must be BOOL or of the query's type {dtype.name}, got {mask.dtype.name}")
            a0, a1, ms, mk = mask.shape
            if not (a0 in (1, -1) or _agree(a0, B)) or not (a1 in (1, -1) or _agree(a1, Hq)):
                raise _bad(self, f"mask {mask.shape} does not broadcast to batch {B} and {Hq} heads")
            if not (_agree(ms, S) and _agree(mk, k.shape[2])):
                raise _bad(self, f"mask {mask.shape} must be [.., .., S_q, S_kv] for query {q.shape} and key {k.shape}")
        lengths = self._opt(self._KV_LENGTHS)
        if lengths is not None:
            if lengths.dtype != DataType.INT32 or len(lengths.shape) != 1 or not _agree(lengths.shape[0], B):
                raise _bad(self, f"key_value_lengths must be INT32 [batch], got {lengths.dtype.name} {lengths.shape}")
            if self.causal_kind == CausalMaskKind.LOWER_RIGHT:
                raise _bad(self, "key_value_lengths with causal_kind LOWER_RIGHT is not supported by the reference backend")
        return [q.shape], [dtype]


class IKVCacheUpdateLayer(ILayer):
    """Writes new keys or values into a KV cache (``tensorrt.IKVCacheUpdateLayer``).

    Inputs: ``cache`` ``[B, H, S_max, D]`` (a network input; ``S_max`` must be static),
    ``update`` ``[B, H, S, D]`` of the cache's type (FLOAT, HALF or BF16), ``write_indices``
    INT32 or INT64 ``[B]``. In ``KVCacheMode.LINEAR`` (the only mode),
    ``output[b, :, write_indices[b] + s, :] = update[b, :, s, :]`` for ``s < S``; the rest of
    the cache is unchanged. ``write_indices[b] + S <= S_max`` is required (checked on NumPy).

    The output has the cache's shape and type, must be a network output, and **is** the
    cache: TensorRT updates it in place (the engine reports the input it aliases with
    ``get_aliased_input_tensor``, and both must be bound to the same memory). The reference
    does the same: the output is the cache input's array, written in place (a NumPy array
    fed to the executor is modified). ``update_form`` ``PACKED_NHD`` is not supported.
    """

    type = LayerType.KV_CACHE_UPDATE
    _attrs = ("cache_mode", "update_form")

    def __init__(self, network: INetworkDefinition, cache: ITensor, update: ITensor, write_indices: ITensor, cache_mode: KVCacheMode):
        self.cache_mode = KVCacheMode(cache_mode)
        self.update_form = AttentionIOForm.PADDED_BHND
        super().__init__(network, [cache, update, write_indices])
        self._update()

    @property
    def update_lengths(self) -> ITensor | None:
        inputs = self.__dict__.get("_inputs", [])
        return inputs[3] if len(inputs) > 3 else None

    @update_lengths.setter
    def update_lengths(self, tensor: ITensor | None) -> None:
        if tensor is None:
            del self._inputs[3:]
        else:
            self.set_input(3, tensor)
        self._changed()

    def _infer(self) -> tuple[list[Shape], list[DataType]]:
        cache, update, wi = self._in(0), self._in(1), self._in(2)
        if self.update_form != AttentionIOForm.PADDED_BHND:
            raise _bad(self, "update_form PACKED_NHD is not supported by the reference backend; use PADDED_BHND")
        dtype = self._same_dtype([cache, update])
        if dtype not in FLOATING:
            raise _bad(self, f"cache and update must be FLOAT, HALF or BF16, got {dtype.name}")
        if len(cache.shape) != 4 or len(update.shape) != 4:
            raise _bad(self, f"cache and update must have rank 4 [batch, heads, tokens, head_dim], got {cache.shape} and {update.shape}")
        if len(wi.shape) != 1 or wi.dtype not in (DataType.INT32, DataType.INT64):
            raise _bad(self, f"write_indices must be INT32 or INT64 of rank 1 [batch], got {wi.dtype.name} {wi.shape}")
        if cache.shape[2] == -1:
            raise _bad(self, f"the KV cache tensor must have a static sequence length dimension, got {cache.shape}")
        if not (_agree(cache.shape[1], update.shape[1]) and _agree(cache.shape[3], update.shape[3])):
            raise _bad(self, f"the KV cache {cache.shape} and the update {update.shape} must have the same number of heads and head size")
        if not (_agree(cache.shape[0], update.shape[0]) and _agree(cache.shape[0], wi.shape[0]) and _agree(update.shape[0], wi.shape[0])):
            raise _bad(self, f"cache {cache.shape}, update {update.shape} and write_indices {wi.shape} differ in batch size")
        if update.shape[2] > cache.shape[2]:
            raise _bad(self, f"the update's {update.shape[2]} tokens exceed the cache's {cache.shape[2]}")
        return [cache.shape], [dtype]


class INetworkDefinition:
    """A strongly typed network (``tensorrt.INetworkDefinition`` subset).

    Layers execute in the order they were added (each layer's inputs must already exist),
    which :class:`trtcore.reference.executor.ReferenceExecutor` relies on.
    """

    def __init__(self, flags: int = 0):
        self.flags = flags
        self.name = "network"
        self._layers: list[ILayer] = []
        self._inputs: list[ITensor] = []
        self._outputs: list[ITensor] = []
        self._tensors: dict[str, ITensor] = {}
        self._version = 0  # bumped when a layer's attributes change after it was added
        self._seen = 0  # the version all layers were last inferred at

    def _refresh(self) -> None:
        """Re-infer every layer in order if attributes changed since the last pass, so that
        layers added after a tensor see its producer's current shape (as in TensorRT)."""
        if self._seen != self._version:
            self._seen = self._version
            for layer in self._layers:
                layer._update()

    # bookkeeping ------------------------------------------------------------------------
    def _rename(self, tensor: ITensor, name: str) -> None:
        if name == tensor._name:
            return
        if name in self._tensors:
            raise NetworkError(f"tensor name {name!r} is already used in the network")
        self._tensors.pop(tensor._name, None)
        tensor._name = name
        self._tensors[name] = tensor

    def _add(self, layer: ILayer) -> ILayer:
        for t in layer._inputs:
            if t is not None and t._network is not self:
                raise NetworkError(f"tensor {t.name!r} belongs to another network")
        self._layers.append(layer)
        for out in layer._outputs:
            self._tensors[out._name] = out
        return layer

    def tensor(self, name: str) -> ITensor:
        """The tensor called ``name`` (trtcore extension, for layer-by-layer debugging)."""
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"no tensor {name!r} in network {self.name!r}") from None

    @property
    def layers(self) -> list[ILayer]:
        """All layers in execution order (trtcore extension)."""
        return list(self._layers)

    # TensorRT API ------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self._layers)

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def get_layer(self, index: int) -> ILayer:
        return self._layers[index]

    def get_input(self, index: int) -> ITensor:
        return self._inputs[index]

    def get_output(self, index: int) -> ITensor:
        return self._outputs[index]

    def add_input(self, name: str, dtype: DataType, shape: Sequence[int]) -> ITensor:
        if name in self._tensors:
            raise NetworkError(f"tensor name {name!r} is already used in the network")
        t = ITensor(self, name, None)
        t._shape = tuple(int(d) for d in shape)
        t._dtype = DataType(dtype)
        self._inputs.append(t)
        self._tensors[name] = t
        return t

    def mark_output(self, tensor: ITensor) -> None:
        if tensor not in self._outputs:
            self._outputs.append(tensor)

    def unmark_output(self, tensor: ITensor) -> None:
        self._outputs.remove(tensor)

    def add_constant(self, shape: Sequence[int], weights: Weights | np.ndarray) -> IConstantLayer:
        w = weights if isinstance(weights, Weights) else Weights(np.asarray(weights))
        return self._add(IConstantLayer(self, tuple(shape), w))  # type: ignore[return-value]

    def add_elementwise(self, a: ITensor, b: ITensor, op: ElementWiseOperation) -> IElementWiseLayer:
        return self._add(IElementWiseLayer(self, a, b, op))  # type: ignore[return-value]

    def add_unary(self, x: ITensor, op: UnaryOperation) -> IUnaryLayer:
        return self._add(IUnaryLayer(self, x, op))  # type: ignore[return-value]

    def add_activation(self, x: ITensor, type: ActivationType) -> IActivationLayer:  # noqa: A002
        return self._add(IActivationLayer(self, x, type))  # type: ignore[return-value]

    def add_reduce(self, x: ITensor, op: ReduceOperation, axes: int, keep_dims: bool) -> IReduceLayer:
        return self._add(IReduceLayer(self, x, op, axes, keep_dims))  # type: ignore[return-value]

    def add_softmax(self, x: ITensor) -> ISoftMaxLayer:
        return self._add(ISoftMaxLayer(self, x))  # type: ignore[return-value]

    def add_concatenation(self, inputs: Sequence[ITensor]) -> IConcatenationLayer:
        return self._add(IConcatenationLayer(self, inputs))  # type: ignore[return-value]

    def add_shuffle(self, x: ITensor) -> IShuffleLayer:
        return self._add(IShuffleLayer(self, x))  # type: ignore[return-value]

    def add_matrix_multiply(self, a: ITensor, op0: MatrixOperation, b: ITensor, op1: MatrixOperation) -> IMatrixMultiplyLayer:
        return self._add(IMatrixMultiplyLayer(self, a, op0, b, op1))  # type: ignore[return-value]

    def add_gather(self, data: ITensor, indices: ITensor, axis: int) -> IGatherLayer:
        return self._add(IGatherLayer(self, data, indices, axis))  # type: ignore[return-value]

    def add_cast(self, x: ITensor, to_type: DataType) -> ICastLayer:
        return self._add(ICastLayer(self, x, to_type))  # type: ignore[return-value]

    def add_identity(self, x: ITensor) -> IIdentityLayer:
        return self._add(IIdentityLayer(self, x))  # type: ignore[return-value]

    def add_plugin_v3(self, inputs: Sequence[ITensor], shape_inputs: Sequence[ITensor], plugin: Any) -> IPluginV3Layer:
        """Add a plugin created by a registered creator (``shape_inputs`` must be empty)."""
        if shape_inputs:
            raise NetworkError("shape inputs to plugins are not supported by the reference backend")
        return self._add(IPluginV3Layer(self, inputs, plugin))  # type: ignore[return-value]

    def add_select(self, condition: ITensor, then_input: ITensor, else_input: ITensor) -> ISelectLayer:
        return self._add(ISelectLayer(self, condition, then_input, else_input))  # type: ignore[return-value]

    def add_attention_v2(
        self, query: ITensor, key: ITensor, value: ITensor, norm_op: AttentionNormalizationOp, causal_kind: CausalMaskKind
    ) -> IAttention:
        """Fused attention over ``[B, H, S, D]`` query / key / value (see :class:`IAttention`)."""
        return self._add(IAttention(self, query, key, value, norm_op, causal_kind))  # type: ignore[return-value]

    def add_attention(self, query: ITensor, key: ITensor, value: ITensor, norm_op: AttentionNormalizationOp, causal: bool) -> IAttention:
        """Deprecated form of :meth:`add_attention_v2`: ``causal=True`` is ``CausalMaskKind.UPPER_LEFT``."""
        return self.add_attention_v2(query, key, value, norm_op, CausalMaskKind.UPPER_LEFT if causal else CausalMaskKind.NONE)

    def add_kv_cache_update(self, cache: ITensor, update: ITensor, write_indices: ITensor, cache_mode: KVCacheMode) -> IKVCacheUpdateLayer:
        """Write ``update`` into ``cache`` at ``write_indices`` (see :class:`IKVCacheUpdateLayer`)."""
        return self._add(IKVCacheUpdateLayer(self, cache, update, write_indices, cache_mode))  # type: ignore[return-value]
