"""Compile pass: a SwiGLU MLP's activation into its gate/up GEMM's epilogue.

After :mod:`.horizontal_fusion` a SwiGLU MLP (:func:`trtcore.ops.swiglu_mlp` with ``hidden_act``
``"silu"``) whose gate and up linears are one plugin reads::

    y = plugin(x)                          # [..., 2 I]: the gate rows, then the up rows
    gate = y[..., :I]    up = y[..., I:]   # slice views
    s = sigmoid(gate)    a = gate * s    h = a * up

Where the plugin offers it (``with_swiglu(constants)``, duck-typed as ``row_fusion_key``: the
weight-only GEMM, :meth:`trtcore.plugins.weight_only_gemm.WeightOnlyGemmPlugin.with_swiglu`),
these six nodes become one plugin node that writes ``h``: its kernel computes SwiGLU in the
epilogue with the same roundings as the pointwise kernel would, so that kernel's launch and the
write and read of ``y`` go away -- what TensorRT-LLM's GEMM + SwiGLU plugin and vLLM's fused
``silu_and_mul`` epilogues do. At batch-1 decode the SwiGLU kernel is one small launch per
layer that waits for the whole gate/up GEMM.

Left as they are: other activations (GeGLU), a plugin without ``with_swiglu``, and any
intermediate value that something else reads or that is an engine output (captured).
``TRTCORE_SWIGLU_FUSION=0`` (read at each compile) turns the pass off, for A/B measurements.
"""

from __future__ import annotations

import os
from typing import Any

from ..reference.types import ActivationType, ElementWiseOperation
from .ir import Graph, Node, Value


def enabled() -> bool:
    """Whether the pass runs: unless ``TRTCORE_SWIGLU_FUSION=0`` (module docstring)."""
    return os.environ.get("TRTCORE_SWIGLU_FUSION", "1") != "0"


def _only_reader(g: Graph, cons: dict[str, list[int]], value: str) -> Node | None:
    """The one node reading ``value``, or None (several readers, none, or an engine output)."""
    readers = cons.get(value, [])
    return g.nodes[readers[0]] if len(readers) == 1 and value not in g.outputs else None


def _is_prod(node: Node | None, operands: set[str]) -> bool:
    return node is not None and node.op == "elementwise" and node.attrs["op"] == int(ElementWiseOperation.PROD) and set(node.inputs) == operands


def _match(g: Graph, node: Node, cons: dict[str, list[int]]) -> tuple[list[Node], str] | None:
    """The nodes after plugin ``node`` that make SwiGLU of its output (views, sigmoid and the
    two products, module docstring) and the value they write, or None."""
    y = node.outputs[0]
    readers = [g.nodes[i] for i in cons.get(y, [])]
    shape = g.values[y].shape
    if y in g.outputs or len(readers) != 2 or not shape or shape[-1] <= 0 or shape[-1] % 2:
        return None
    half, rank = shape[-1] // 2, len(shape)
    views: dict[int, str] = {}
    for v in readers:
        stages = v.attrs.get("stages") if v.op == "view" else None
        if not stages or len(stages) != 1 or stages[0][0] != "slice" or tuple(stages[0][1]) not in ((rank - 1, 0, half), (rank - 1, half, half)):
            return None
        views[stages[0][1][1]] = v.outputs[0]
    if set(views) != {0, half}:
        return None
    gate, up = views[0], views[half]
    gate_readers = [g.nodes[i] for i in cons.get(gate, [])]
    sig = next((n for n in gate_readers if n.op == "activation" and n.attrs["kind"] == int(ActivationType.SIGMOID)), None)
    if gate in g.outputs or sig is None or len(gate_readers) != 2:
        return None
    act = _only_reader(g, cons, sig.outputs[0])
    if not _is_prod(act, {gate, sig.outputs[0]}) or act not in gate_readers:
        return None
    assert act is not None
    gated = _only_reader(g, cons, act.outputs[0])
    if not _is_prod(gated, {act.outputs[0], up}) or _only_reader(g, cons, up) is not gated:
        return None
    assert gated is not None
    dtype = g.values[y].dtype
    if any(g.values[n.outputs[0]].dtype != dtype for n in (sig, act, gated)):
        return None
    return [*readers, sig, act, gated], gated.outputs[0]


def run(graph: Graph, stats: dict[str, Any]) -> Graph:
    """Fuse each matching SwiGLU into its plugin (module docstring); ``stats["swiglu_fused"]``
    counts them."""
    stats["swiglu_fused"] = 0
    if not enabled():
        return graph
    g = graph.copy()
    cons = g.consumers()
    replace: dict[int, Node] = {}  # id of a plugin node -> its SwiGLU form
    drop: set[int] = set()  # ids of the nodes it takes in
    for node in g.nodes:
        if node.op != "plugin" or len(node.outputs) != 1 or not node.inputs or any(c not in g.constants for c in node.inputs[1:]):
            continue
        make = getattr(node.attrs["plugin"], "with_swiglu", None)
        found = _match(g, node, cons) if make is not None else None
        if found is None:
            continue
        made = make([g.constants[c] for c in node.inputs[1:]])
        if made is None:
            continue
        plugin, arrays = made
        fused_nodes, out = found
        names = []
        for c, arr in zip(node.inputs[1:], arrays):
            name = f"{c}.swiglu"
            g.constants[name] = arr
            g.values[name] = Value(name, g.values[c].dtype, tuple(arr.shape))
            names.append(name)
        layers = [layer for n in (node, *fused_nodes) for layer in n.layers]
        replace[id(node)] = Node(node.name, "plugin", [node.inputs[0], *names], [out], {**node.attrs, "plugin": plugin}, layers)
        drop |= {id(n) for n in fused_nodes}
        stats["swiglu_fused"] += 1
    if replace:
        # the fused node takes the plugin's place: it reads only x and constants, and every
        # reader of h comes after the products, so after it too
        g.nodes = [replace.get(id(n), n) for n in g.nodes if id(n) not in drop]
        g.remove_unused()
    return g
