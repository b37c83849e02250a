"""Compile pass: constant folding.

A node whose inputs are all constants is evaluated once at build time and replaced by a
constant. The evaluation is the NumPy reference's (:func:`trtcore.reference.evaluator.evaluate`
on a one-layer network re-created from the node), so a folded value is exactly what the
layer computes, rounded to its type. Plugins, attention and KV-cache updates never fold.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import reference as ref
from ..reference.evaluator import evaluate
from .ir import Graph, Node

FOLDABLE = frozenset(
    {"elementwise", "unary", "activation", "cast", "identity", "select", "reduce", "softmax", "concat", "shuffle", "matmul", "gather"}
)

#: constants larger than this are not produced by folding (a broadcast of a scalar into a
#: big tensor would only cost memory)
MAX_FOLDED_ELEMENTS = 1 << 24


def add_layer(net: Any, node: Node, ins: list[Any]) -> Any:
    """Add the reference layer equivalent to ``node`` to ``net`` over tensors ``ins``."""
    a = node.attrs
    op = node.op
    if op == "elementwise":
        return net.add_elementwise(ins[0], ins[1], ref.ElementWiseOperation(a["op"]))
    if op == "unary":
        return net.add_unary(ins[0], ref.UnaryOperation(a["op"]))
    if op == "activation":
        layer = net.add_activation(ins[0], ref.ActivationType(a["kind"]))
        layer.alpha, layer.beta = a["alpha"], a["beta"]
        return layer
    if op == "cast":
        return net.add_cast(ins[0], ref.DataType(a["to"]))
    if op == "identity":
        return net.add_identity(ins[0])
    if op == "select":
        return net.add_select(ins[0], ins[1], ins[2])
    if op == "reduce":
        mask = sum(1 << ax for ax in a["axes"])
        return net.add_reduce(ins[0], ref.ReduceOperation(a["op"]), mask, a["keep_dims"])
    if op == "softmax":
        layer = net.add_softmax(ins[0])
        layer.axes = 1 << a["axis"]
        return layer
    if op == "concat":
        layer = net.add_concatenation(ins)
        layer.axis = a["axis"]
        return layer
    if op == "shuffle":
        layer = net.add_shuffle(ins[0])
        layer.first_transpose = a["first_transpose"]
        if a["reshape_dims"] is not None:
            layer.reshape_dims = a["reshape_dims"]
        if a["second_transpose"] is not None:
            layer.second_transpose = a["second_transpose"]
        layer.zero_is_placeholder = a["zero_is_placeholder"]
        return layer
    if op == "matmul":
        M = ref.MatrixOperation
        return net.add_matrix_multiply(ins[0], M.TRANSPOSE if a["transpose_a"] else M.NONE, ins[1], M.TRANSPOSE if a["transpose_b"] else M.NONE)
    if op == "gather":
        return net.add_gather(ins[0], ins[1], a["axis"])
    raise ValueError(f"op {op!r} has no reference layer here")


def evaluate_node(graph: Graph, node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """``node`` evaluated by the NumPy reference on ``arrays`` (one per input)."""
    net = ref.Builder(ref.Logger(ref.Logger.ERROR)).create_network(1 << int(ref.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    ins = [net.add_input(f"in{i}", graph.values[v].dtype, arr.shape) for i, (v, arr) in enumerate(zip(node.inputs, arrays))]
    layer = add_layer(net, node, ins)
    for j in range(layer.num_outputs):
        net.mark_output(layer.get_output(j))
    res = evaluate(net, {f"in{i}": arr for i, arr in enumerate(arrays)})
    return [np.asarray(res[layer.get_output(j).name]) for j in range(layer.num_outputs)]


def run(graph: Graph, stats: dict[str, Any]) -> Graph:
    """Fold every node whose inputs are constants (repeatedly, in execution order)."""
    g = graph.copy()
    kept: list[Node] = []
    folded = 0
    for node in g.nodes:
        if node.op in FOLDABLE and node.inputs and all(v and v in g.constants for v in node.inputs):
            outs = evaluate_node(g, node, [g.constants[v] for v in node.inputs])
            if all(o.size <= MAX_FOLDED_ELEMENTS for o in outs) and not any(o in g.outputs for o in node.outputs):
                for name, arr in zip(node.outputs, outs):
                    g.constants[name] = np.ascontiguousarray(arr)
                folded += 1
                continue
        kept.append(node)
    g.nodes = kept
    g.remove_unused()
    stats["folded_layers"] = folded
    return g
