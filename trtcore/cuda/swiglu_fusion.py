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

from typing import Any, TypeGuard

from ..reference.types import ActivationType, ElementWiseOperation
from .graph_match import Reads, add_derived_constants, env_flag, is_node, splice
from .ir import Graph, Node


def enabled() -> bool:
    """Whether the pass runs: unless ``TRTCORE_SWIGLU_FUSION=0`` (module docstring)."""
    return env_flag("TRTCORE_SWIGLU_FUSION", default=True)


def _is_prod(node: Node | None, operands: set[str]) -> TypeGuard[Node]:
    return is_node(node, "elementwise", int(ElementWiseOperation.PROD)) and set(node.inputs) == operands


def _match(g: Graph, node: Node, reads: Reads) -> tuple[list[Node], str] | None:
    """The nodes after plugin ``node`` that make SwiGLU of its output (views, sigmoid and the
    two products, module docstring) and the value they write, or None."""
    y = node.outputs[0]
    readers = reads.of(y)
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
    gate_readers = reads.of(gate)
    sig = next((n for n in gate_readers if is_node(n, "activation", int(ActivationType.SIGMOID), attr="kind")), None)
    if gate in g.outputs or sig is None or len(gate_readers) != 2:
        return None
    act = reads.only(sig.outputs[0])
    if not _is_prod(act, {gate, sig.outputs[0]}) or act not in gate_readers:
        return None
    gated = reads.only(act.outputs[0])
    if not _is_prod(gated, {act.outputs[0], up}) or reads.only(up) is not gated:
        return None
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
    reads = Reads(g)
    replace: dict[int, Node] = {}  # id of a plugin node -> its SwiGLU form
    drop: set[int] = set()  # ids of the nodes it takes in
    for node in g.nodes:
        if node.op != "plugin" or len(node.outputs) != 1 or not node.inputs or any(c not in g.constants for c in node.inputs[1:]):
            continue
        make = getattr(node.attrs["plugin"], "with_swiglu", None)
        found = _match(g, node, reads) if make is not None else None
        if make is None or found is None:
            continue
        made = make([g.constants[c] for c in node.inputs[1:]])
        if made is None:
            continue
        plugin, arrays = made
        fused_nodes, out = found
        names = add_derived_constants(g, node.inputs[1:], arrays, "swiglu")
        layers = [layer for n in (node, *fused_nodes) for layer in n.layers]
        replace[id(node)] = Node(node.name, "plugin", [node.inputs[0], *names], [out], {**node.attrs, "plugin": plugin}, layers)
        drop |= {id(n) for n in fused_nodes}
        stats["swiglu_fused"] += 1
    # the fused node takes the plugin's place: it reads only x and constants, and every reader
    # of h comes after the products, so after it too
    splice(g, replace, drop)
    return g
