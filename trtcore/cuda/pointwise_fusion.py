"""Compile pass: pointwise fusion.

Chains (and DAGs) of elementwise / unary / activation / cast / select layers become one
kernel generated for them (:func:`trtcore.cuda.codegen.pointwise_group`). Broadcasts are
free: the kernel reads a broadcast input with stride 0. What does **not** fuse:

* a value read by two consumers that end up in different groups, or by a non-pointwise
  layer: it has to be in memory;
* a network output: it has to be in memory (it ends a group);
* a GEMM and the cast after it (a dtype boundary): the GEMM's output is rounded to its type
  first, as TensorRT's strongly typed semantics require, so the cast is never folded into
  the GEMM's output type.

Inside a group every member's value is rounded to its own type (float16/bfloat16 values
computed in float32 and rounded where the layer's output type says), so the fused kernel
computes exactly what the layers compute one by one.
"""

from __future__ import annotations

from typing import Any

from . import fusion, reduction_fusion
from .fusion import Context, Group
from .ir import POINTWISE, Graph, Shape


def fusible(ctx: Context, i: int) -> bool:
    """Pointwise nodes (and reductions, for :mod:`.reduction_fusion`) may be in a group."""
    return ctx.graph.nodes[i].op in POINTWISE or ctx.graph.nodes[i].op == "reduce"


def pointwise_rule(ctx: Context, i: int, group: Group | None) -> str | None:
    """A pointwise node joins its consumers' group when its output and inputs broadcast to
    the group's domain (scalars inlined, others read with broadcast strides)."""
    node = ctx.graph.nodes[i]
    if group is None or node.op not in POINTWISE:
        return None
    if not ctx.broadcasts_to(node.outputs[0], group.domain):
        return None
    for v in node.inputs:
        if v and not ctx.broadcasts_to(v, group.domain):
            return None
    return "internal"


def run(graph: Graph, points: list[dict[str, Shape]], stats: dict[str, Any]) -> Graph:
    """Fuse pointwise chains and row reductions (with :mod:`.reduction_fusion`'s rules)."""
    shapes = [_with_constants(graph, p) for p in points]
    groups = fusion.grow(graph, shapes, fusible, [reduction_fusion.reduce_rule, reduction_fusion.residual_rule, pointwise_rule])
    return fusion.rewrite(graph, groups, stats)


def _with_constants(graph: Graph, point: dict[str, Shape]) -> dict[str, Shape]:
    from .ir import infer_shapes

    return infer_shapes(graph, point)
