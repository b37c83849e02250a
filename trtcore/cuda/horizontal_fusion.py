"""Compile pass: horizontal fusion of matrix products that share an input.

``q_proj``, ``k_proj`` and ``v_proj`` (and ``gate_proj`` / ``up_proj``) multiply the same
activation by different constant weights. They become one GEMM over the weights
concatenated along the output features, and each original product becomes a slice view of
the fused output's last axis (no copy: consumers read it with the fused row stride). One
launch reads the input once and streams all weights.

Fused: products with the same input ``A`` (not transposed), constant ``B`` of equal rank,
equal dtype, equal inner dimension and the same ``transpose_b`` (``ops.linear``'s weights
are ``[..., out, in]`` with ``transpose_b``). Products whose ``B`` is not a constant, or
alone, are left as they are.

Plugin linears (the weight-only GEMM of quantized checkpoints) fuse the same way where the
plugin offers it: plugins of one class reading the same ``x`` (input 0) with constant inputs
1.. and equal ``row_fusion_key(constants)`` become the plugin ``fuse_rows`` returns, and each
output a slice view. A ``concat`` of exactly those views, in order, along the last axis (the
network's packed ``qkv_proj`` of three quantized projections) becomes an empty view of the
fused output: no copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .ir import Graph, Node, Value


def _key(g: Graph, node: Node) -> tuple[Any, ...] | None:
    if node.op != "matmul" or node.attrs["transpose_a"]:
        return None
    a, b = node.inputs
    if b not in g.constants:
        return None
    w = g.constants[b]
    tb = node.attrs["transpose_b"]
    if any(d != 1 for d in w.shape[:-2]):
        return None
    inner = w.shape[-1] if tb else w.shape[-2]
    return ("matmul", a, tb, w.ndim, inner, g.values[b].dtype)


def _plugin_key(g: Graph, node: Node) -> tuple[Any, ...] | None:
    if node.op != "plugin" or len(node.outputs) != 1 or len(node.inputs) < 2:
        return None
    plugin = node.attrs["plugin"]
    x, *consts = node.inputs
    if x in g.constants or any(c not in g.constants for c in consts):
        return None
    row_key = getattr(plugin, "row_fusion_key", None)
    key = row_key([g.constants[c] for c in consts]) if row_key is not None else None
    return None if key is None else ("plugin", x, type(plugin), key)


def _fuse_plugins(g: Graph, nodes: list[Node]) -> tuple[list[Node], str]:
    """The fused plugin node and its slice views, and its output's name."""
    parts = [(n.attrs["plugin"], [g.constants[c] for c in n.inputs[1:]]) for n in nodes]
    plugin, arrays = type(parts[0][0]).fuse_rows(parts)
    out = "+".join(n.outputs[0] for n in nodes)
    names = []
    for i, arr in enumerate(arrays):
        name = "+".join(n.inputs[1 + i] for n in nodes)
        g.constants[name] = np.ascontiguousarray(arr)
        g.values[name] = Value(name, g.values[nodes[0].inputs[1 + i]].dtype, tuple(arr.shape))
        names.append(name)
    widths = [int(g.values[n.outputs[0]].shape[-1]) for n in nodes]
    shape = list(g.values[nodes[0].outputs[0]].shape)
    shape[-1] = sum(widths)
    g.values[out] = Value(out, g.values[nodes[0].outputs[0]].dtype, tuple(shape))
    layers = [layer for n in nodes for layer in n.layers]
    new = [Node(f"plugin:{out}", "plugin", [nodes[0].inputs[0], *names], [out], {**nodes[0].attrs, "plugin": plugin}, layers)]
    start = 0
    for n, width in zip(nodes, widths):
        new.append(Node(n.name, "view", [out], [n.outputs[0]], {"stages": [("slice", (len(shape) - 1, start, width))]}, n.layers))
        start += width
    return new, out


def run(graph: Graph, stats: dict[str, Any]) -> Graph:
    """Fuse products sharing an input (see the module docstring)."""
    g = graph.copy()
    buckets: dict[tuple[Any, ...], list[int]] = {}
    for i, node in enumerate(g.nodes):
        k = _key(g, node) or _plugin_key(g, node)
        if k is not None:
            buckets.setdefault(k, []).append(i)
    replace: dict[int, list[Node]] = {}
    drop: set[int] = set()
    fused = fused_plugins = 0
    whole: dict[tuple[str, ...], str] = {}  # the slice views of a fused plugin, in order -> its output
    for key, idx in buckets.items():
        if len(idx) < 2:
            continue
        nodes = [g.nodes[i] for i in idx]
        if key[0] == "plugin":
            replace[idx[0]], out = _fuse_plugins(g, nodes)
            drop |= set(idx[1:])
            whole[tuple(n.outputs[0] for n in nodes)] = out
            fused_plugins += len(nodes)
            continue
        a, tb = key[1], key[2]
        axis = -2 if tb else -1
        weights = [g.constants[n.inputs[1]] for n in nodes]
        w = np.concatenate(weights, axis=axis)
        wname = "+".join(n.inputs[1] for n in nodes)
        out = "+".join(n.outputs[0] for n in nodes)
        g.constants[wname] = np.ascontiguousarray(w)
        g.values[wname] = Value(wname, g.values[nodes[0].inputs[1]].dtype, tuple(w.shape))
        out_shape = list(g.values[nodes[0].outputs[0]].shape)
        out_shape[-1] = int(w.shape[axis])
        g.values[out] = Value(out, g.values[nodes[0].outputs[0]].dtype, tuple(out_shape))
        layers = [layer for n in nodes for layer in n.layers]
        new = [Node(f"gemm:{out}", "matmul", [a, wname], [out], dict(nodes[0].attrs), layers)]
        start = 0
        rank = len(out_shape)
        for n, wt in zip(nodes, weights):
            width = int(wt.shape[axis])
            new.append(Node(n.name, "view", [out], [n.outputs[0]], {"stages": [("slice", (rank - 1, start, width))]}, n.layers))
            start += width
        # the fused product runs where the first of them ran: every one reads only A and constants
        replace[idx[0]] = new
        drop |= set(idx[1:])
        fused += len(nodes)
    nodes_out: list[Node] = []
    for i, node in enumerate(g.nodes):
        if i in replace:
            nodes_out.extend(replace[i])
        elif i not in drop:
            nodes_out.append(_elide_concat(g, node, whole))
    g.nodes = nodes_out
    g.remove_unused()
    stats["horizontal_fused_matmuls"] = fused
    stats["horizontal_fused_plugins"] = fused_plugins
    return g


def _elide_concat(g: Graph, node: Node, whole: dict[tuple[str, ...], str]) -> Node:
    """A concat of a fused plugin's slice views, all of them in order along the last axis, as an
    empty view of the fused output; any other node as it is."""
    if node.op != "concat" or tuple(node.inputs) not in whole:
        return node
    rank = len(g.values[node.outputs[0]].shape)
    if node.attrs["axis"] % rank != rank - 1:
        return node
    return Node(node.name, "view", [whole[tuple(node.inputs)]], list(node.outputs), {"stages": []}, node.layers)
