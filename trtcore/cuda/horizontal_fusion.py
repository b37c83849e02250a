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
    return (a, tb, w.ndim, inner, g.values[b].dtype)


def run(graph: Graph, stats: dict[str, Any]) -> Graph:
    """Fuse products sharing an input (see the module docstring)."""
    g = graph.copy()
    buckets: dict[tuple[Any, ...], list[int]] = {}
    for i, node in enumerate(g.nodes):
        k = _key(g, node)
        if k is not None:
            buckets.setdefault(k, []).append(i)
    replace: dict[int, list[Node]] = {}
    drop: set[int] = set()
    fused = 0
    for key, idx in buckets.items():
        if len(idx) < 2:
            continue
        nodes = [g.nodes[i] for i in idx]
        tb = key[1]
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
        new = [Node(f"gemm:{out}", "matmul", [key[0], wname], [out], dict(nodes[0].attrs), layers)]
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
            nodes_out.append(node)
    g.nodes = nodes_out
    g.remove_unused()
    stats["horizontal_fused_matmuls"] = fused
    return g
