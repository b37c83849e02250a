"""The cuda backend's graph IR: a strongly typed network as nodes over named values.

:func:`from_network` reads a :class:`trtcore.reference.network.INetworkDefinition` (the
network every model builds) into a :class:`Graph`: one :class:`Node` per layer (``op``,
input and output value names, attributes copied from the layer), one :class:`Value` per
tensor (dtype and static shape, ``-1`` for dimensions only known at run time), constants as
NumPy arrays. The compile passes rewrite this graph; the runtime executes it.

Shapes are symbolic over the optimization profile's dynamic dimensions in the sense that
every value's concrete shape is a function of the input shapes: :func:`infer_shapes`
evaluates that function for concrete input shapes (the runtime does it once per input-shape
combination; the builder at the profile's min, opt and max points, which is how passes
compare shapes and the memory planner sizes buffers for the largest shapes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..dims import Dim
from ..errors import NetworkError
from ..reference import network as refnet
from ..reference.types import DataType

Shape = tuple[int, ...]

#: ops computed element by element (fusable into one generated kernel)
POINTWISE = frozenset({"elementwise", "unary", "activation", "cast", "select", "identity"})


@dataclass
class Value:
    """A tensor: ``name``, ``dtype`` (:class:`DataType`), static ``shape`` (-1 = dynamic)."""

    name: str
    dtype: DataType
    shape: Shape


@dataclass
class Node:
    """One operation: ``op`` (see :func:`from_network` for the list), ``inputs`` / ``outputs``
    (value names; an optional input absent is ``""``), ``attrs`` (op parameters), ``layers``
    (the network layers it came from, for the engine's kernel list)."""

    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    layers: list[str] = field(default_factory=list)


@dataclass
class Graph:
    """Values, nodes in execution order, network inputs/outputs, constants, aliases
    (output name -> input name whose memory it shares, as ``IKVCacheUpdateLayer``)."""

    values: dict[str, Value]
    nodes: list[Node]
    inputs: list[str]
    outputs: list[str]
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)

    def consumers(self) -> dict[str, list[int]]:
        """value name -> indices of the nodes reading it (a node reading it twice: once)."""
        out: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for v in dict.fromkeys(n.inputs):
                if v:
                    out.setdefault(v, []).append(i)
        return out

    def producers(self) -> dict[str, int]:
        """value name -> index of the node writing it."""
        return {v: i for i, n in enumerate(self.nodes) for v in n.outputs}

    def copy(self) -> Graph:
        """A copy whose node lists, attributes and dicts can be changed without touching this graph (arrays are shared)."""
        return Graph(
            dict(self.values),
            [dataclasses.replace(n, inputs=list(n.inputs), outputs=list(n.outputs), attrs=dict(n.attrs), layers=list(n.layers)) for n in self.nodes],
            list(self.inputs),
            list(self.outputs),
            dict(self.constants),
            dict(self.aliases),
        )

    def remove_unused(self) -> None:
        """Drop nodes none of whose outputs is read or is a network output (plugins stay:
        they may write their inputs in place), and unused constants."""
        while True:
            used = set(self.outputs) | {v for n in self.nodes for v in n.inputs if v}
            keep = [n for n in self.nodes if n.op == "plugin" or any(o in used for o in n.outputs)]
            if len(keep) == len(self.nodes):
                break
            self.nodes = keep
        used = set(self.outputs) | {v for n in self.nodes for v in n.inputs if v}
        for name in [c for c in self.constants if c not in used]:
            del self.constants[name]
        # inlined constants and fused members' values keep their Value (dtype, static shape)
        inner = {v for n in self.nodes for v in n.attrs.get("scalars", {})}
        inner |= {v for n in self.nodes for m in n.attrs.get("members", []) for v in (*m.inputs, *m.outputs) if v}
        live = used | inner | {o for n in self.nodes for o in n.outputs} | set(self.inputs)
        self.values = {k: v for k, v in self.values.items() if k in live}


# ---------------------------------------------------------------------------------------
# reading a reference network
# ---------------------------------------------------------------------------------------


def _layer_node(layer: refnet.ILayer, ins: list[str], outs: list[str]) -> Node:
    L = refnet
    a: dict[str, Any]
    if isinstance(layer, L.IElementWiseLayer):
        op, a = "elementwise", {"op": int(layer.op)}
    elif isinstance(layer, L.IUnaryLayer):
        op, a = "unary", {"op": int(layer.op)}
    elif isinstance(layer, L.IActivationLayer):
        op, a = "activation", {"kind": int(layer.type), "alpha": float(layer.alpha), "beta": float(layer.beta)}
    elif isinstance(layer, L.ICastLayer):
        op, a = "cast", {"to": int(layer.to_type)}
    elif isinstance(layer, L.IIdentityLayer):
        op, a = "identity", {}
    elif isinstance(layer, L.ISelectLayer):
        op, a = "select", {}
    elif isinstance(layer, L.IReduceLayer):
        rank = len(layer._in(0).shape)
        op, a = "reduce", {"op": int(layer.op), "axes": refnet._axes(layer.axes, rank), "keep_dims": bool(layer.keep_dims)}
    elif isinstance(layer, L.ISoftMaxLayer):
        rank = len(layer._in(0).shape)
        op, a = "softmax", {"axis": refnet._axes(layer.axes, rank)[0]}
    elif isinstance(layer, L.IConcatenationLayer):
        op, a = "concat", {"axis": int(layer.axis)}
    elif isinstance(layer, L.IShuffleLayer):
        op, a = (
            "shuffle",
            {
                "first_transpose": tuple(layer.first_transpose),
                "reshape_dims": None if layer.reshape_dims is None else tuple(layer.reshape_dims),
                "second_transpose": None if layer.second_transpose is None else tuple(layer.second_transpose),
                "zero_is_placeholder": bool(layer.zero_is_placeholder),
            },
        )
    elif isinstance(layer, L.IMatrixMultiplyLayer):
        op, a = "matmul", {"transpose_a": layer.op0 == 1, "transpose_b": layer.op1 == 1}
    elif isinstance(layer, L.IGatherLayer):
        op, a = "gather", {"axis": int(layer.axis)}
    elif isinstance(layer, L.IPluginV3Layer):
        op, a = "plugin", {"plugin": layer.plugin}
    elif isinstance(layer, L.IAttention):
        op, a = "attention", {"norm_op": int(layer.norm_op), "causal_kind": int(layer.causal_kind)}
    elif isinstance(layer, L.IKVCacheUpdateLayer):
        op, a = "kv_cache_update", {}
    else:
        raise NetworkError(f"layer {layer.name!r} of type {type(layer).__name__} is not supported by the cuda backend")
    return Node(layer.name, op, ins, outs, a, [layer.name])


def from_network(network: refnet.INetworkDefinition) -> Graph:
    """The IR of a (validated) reference network.

    Ops: ``elementwise``/``unary`` (``op``: the enum value), ``activation`` (``kind``,
    ``alpha``, ``beta``), ``cast`` (``to``), ``identity``, ``select``, ``reduce`` (``op``,
    ``axes`` tuple, ``keep_dims``), ``softmax`` (``axis``), ``concat`` (``axis``), ``shuffle``
    (TensorRT's three stages), ``matmul`` (``transpose_a``/``transpose_b``), ``gather``
    (``axis``), ``plugin`` (the plugin object), ``attention`` (``norm_op``, ``causal_kind``;
    inputs q, k, v, mask, -, -, key_value_lengths as ``IAttention`` counts them),
    ``kv_cache_update``. Constant layers become entries of ``Graph.constants``.

    Raises:
        NetworkError: a layer type the cuda backend does not implement, or an invalid layer.
    """
    network._refresh()
    values: dict[str, Value] = {}
    g = Graph(values, [], [t.name for t in network._inputs], [t.name for t in network._outputs])
    for t in network._inputs:
        values[t.name] = Value(t.name, t.dtype, tuple(t.shape))
    for layer in network._layers:
        if layer._error is not None:
            raise layer._error
        outs = [t.name for t in layer._outputs]
        for t in layer._outputs:
            values[t.name] = Value(t.name, t._dtype, tuple(t._shape))
        if isinstance(layer, refnet.IConstantLayer):
            arr = np.asarray(layer.weights.array).reshape(layer.shape)
            g.constants[outs[0]] = np.ascontiguousarray(arr)
            continue
        ins = ["" if t is None else t.name for t in layer._inputs]
        g.nodes.append(_layer_node(layer, ins, outs))
        if isinstance(layer, refnet.IKVCacheUpdateLayer):
            g.aliases[outs[0]] = ins[0]
    return g


# ---------------------------------------------------------------------------------------
# concrete shape inference
# ---------------------------------------------------------------------------------------


def broadcast(shapes: Sequence[Shape]) -> Shape:
    """TensorRT broadcast of equal-rank concrete shapes (size-1 dimensions stretch)."""
    out = []
    for dims in zip(*shapes):
        big = {d for d in dims if d != 1}
        if len(big) > 1:
            raise NetworkError(f"shapes {list(shapes)} do not broadcast")
        out.append(big.pop() if big else 1)
    return tuple(out)


def reshape_target(attrs: Mapping[str, Any], in_shape: Shape) -> Shape:
    """``IShuffleLayer.reshape_dims`` resolved for a concrete input shape (0 copies, -1 infers)."""
    dims = list(attrs["reshape_dims"])
    out = [in_shape[i] if d == 0 and attrs["zero_is_placeholder"] else int(d) for i, d in enumerate(dims)]
    if -1 in out:
        rest = int(math.prod([d for d in out if d != -1]))
        vol = int(math.prod(in_shape))
        out[out.index(-1)] = vol // rest if rest else 0
    if int(math.prod(out)) != int(math.prod(in_shape)):
        raise NetworkError(f"cannot reshape {in_shape} into {tuple(out)}")
    return tuple(out)


def shuffle_stages(attrs: Mapping[str, Any], in_shape: Shape) -> list[tuple[str, Any]]:
    """A shuffle as view transforms: ``("permute", perm)`` / ``("reshape", shape)``."""
    stages: list[tuple[str, Any]] = []
    perm = tuple(attrs["first_transpose"])
    shape = tuple(in_shape[p] for p in perm)
    if perm != tuple(range(len(perm))):
        stages.append(("permute", perm))
    if attrs["reshape_dims"] is not None:
        shape = reshape_target(attrs, shape)
        stages.append(("reshape", shape))
    if attrs["second_transpose"] is not None:
        stages.append(("permute", tuple(attrs["second_transpose"])))
    return stages


def node_shapes(node: Node, ins: list[Shape | None], graph: Graph) -> list[Shape]:
    """Concrete output shapes of ``node`` from its inputs' concrete shapes."""
    op, a = node.op, node.attrs
    if op in ("elementwise", "select"):
        return [broadcast([s for s in ins if s is not None])]
    if op in ("unary", "activation", "cast", "identity"):
        return [ins[0]]  # type: ignore[list-item]
    if op == "pointwise_group" or op == "row_group":
        return [tuple(s) for s in _group_shapes(node, ins)]
    if op == "reduce":
        x = ins[0]
        assert x is not None
        if a["keep_dims"]:
            return [tuple(1 if i in a["axes"] else d for i, d in enumerate(x))]
        return [tuple(d for i, d in enumerate(x) if i not in a["axes"])]
    if op == "softmax" or op == "copy":
        return [ins[0]]  # type: ignore[list-item]
    if op == "concat":
        shapes = [s for s in ins if s is not None]
        out = list(shapes[0])
        out[a["axis"]] = sum(s[a["axis"]] for s in shapes)
        return [tuple(out)]
    if op == "shuffle" or op == "view":
        shape = ins[0]
        assert shape is not None
        stages = a["stages"] if op == "view" else shuffle_stages(a, shape)
        for kind, arg in stages:
            if kind == "permute":
                shape = tuple(shape[p] for p in arg)
            elif kind == "reshape":
                shape = reshape_target(a, shape) if op == "shuffle" else _view_reshape(arg, shape, a)
            elif kind == "slice":
                axis, _start, length = arg
                shape = shape[:axis] + (length,) + shape[axis + 1 :]
        return [tuple(shape)]
    if op in ("matmul", "gemm"):
        x, w = ins[0], ins[1]
        assert x is not None and w is not None
        m = x[-1] if a["transpose_a"] else x[-2]
        n = w[-2] if a["transpose_b"] else w[-1]
        batch = broadcast([x[:-2], w[:-2]]) if len(x) > 2 else ()
        return [batch + (m, n)]
    if op == "gather":
        data, idx = ins[0], ins[1]
        assert data is not None and idx is not None
        return [data[: a["axis"]] + idx + data[a["axis"] + 1 :]]
    if op == "plugin":
        shapes = a["plugin"].output_shapes([[Dim(int(d)) for d in s] for s in ins if s is not None])
        return [tuple(int(Dim.of(d)) for d in s) for s in shapes]  # type: ignore[arg-type]
    if op == "attention":
        return [ins[0]]  # type: ignore[list-item]
    if op == "kv_cache_update":
        return [ins[0]]  # type: ignore[list-item]
    raise NetworkError(f"no shape rule for op {op!r} (node {node.name!r})")


def _view_reshape(target: Any, shape: Shape, attrs: Mapping[str, Any]) -> Shape:
    """A view's reshape stage: ``target`` is the reshape attrs of the original shuffle."""
    return reshape_target(target, shape)


def _group_shapes(node: Node, ins: list[Shape | None]) -> list[Shape]:
    """Output shapes of a fused group: re-run the member nodes' shape rules."""
    shapes: dict[str, Shape] = {v: s for v, s in zip(node.inputs, ins) if v and s is not None}
    for v, c in node.attrs.get("scalars", {}).items():
        shapes[v] = tuple(c.shape)
    for member in node.attrs["members"]:
        outs = node_shapes(member, [shapes.get(v) if v else None for v in member.inputs], None)  # type: ignore[arg-type]
        shapes.update(zip(member.outputs, outs))
    return [shapes[o] for o in node.outputs]


def infer_shapes(graph: Graph, input_shapes: Mapping[str, Shape]) -> dict[str, Shape]:
    """Every value's concrete shape for concrete network input shapes.

    Raises:
        NetworkError: an input shape is missing or a layer rejects the shapes.
    """
    shapes: dict[str, Shape] = {k: tuple(v.shape) for k, v in ((k, graph.constants[k]) for k in graph.constants)}
    for name in graph.inputs:
        if name not in input_shapes:
            raise NetworkError(f"no shape given for input {name!r}")
        shapes[name] = tuple(int(d) for d in input_shapes[name])
    for node in graph.nodes:
        try:
            outs = node_shapes(node, [shapes[v] if v else None for v in node.inputs], graph)
        except NetworkError:
            raise
        except Exception as exc:
            raise NetworkError(f"node {node.name!r} ({node.op}) rejects input shapes {[shapes.get(v) for v in node.inputs]}: {exc}") from exc
        shapes.update(zip(node.outputs, outs))
    return shapes


def profile_points(graph: Graph, profile: Any) -> list[dict[str, Shape]]:
    """Input shapes at the profile's (min, opt, max) points; static inputs as declared."""
    points: list[dict[str, Shape]] = [{}, {}, {}]
    for name in graph.inputs:
        static = graph.values[name].shape
        got = profile.get_shape(name) if profile is not None else [(), (), ()]
        for i in range(3):
            points[i][name] = tuple(got[i]) if got and got[0] else static
    return points
