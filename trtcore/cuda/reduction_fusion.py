"""Compile pass rules: row-reduction fusion.

A reduction over the last axis with ``keep_dims`` (SUM / AVG / MAX / MIN of a floating
type) takes the pointwise layers before it (its prologue) and after it (its epilogue) into
one *row kernel* (:func:`trtcore.cuda.codegen.row_group`): one thread block per row reads
the row, reduces it in float32, and writes the epilogue's outputs. ``ops.rms_norm``'s
cast / square / mean / add eps / sqrt / recip / multiply / cast / weight becomes one kernel.

The residual add that feeds a normalization (``h = h + o`` then ``rms_norm(h)``) joins the
same kernel although ``h`` is also read by the next residual add: it becomes a second output
of the kernel (written once), provided every reader outside runs after the kernel. So a
decoder layer's two "add + norm" pairs are two kernels.
"""

from __future__ import annotations

from .fusion import Context, Group, row_reducible
from .ir import POINTWISE


def reduce_rule(ctx: Context, i: int, group: Group | None) -> str | None:
    """A row-reducible reduction joins a group without one when its input has the group's
    domain shape (then the group becomes a row group over that domain)."""
    node = ctx.graph.nodes[i]
    if group is None or node.op != "reduce":
        return None
    if group.reduce is not None or not row_reducible(ctx, i) or not ctx.same_shape(node.inputs[0], group.domain):
        return None
    return "internal"


def residual_rule(ctx: Context, i: int, group: Group | None) -> str | None:
    """A pointwise node of the domain's shape whose value is also read outside a row group
    joins it as one more output (the residual add feeding a norm)."""
    node = ctx.graph.nodes[i]
    if group is None or group.reduce is None or node.op not in POINTWISE:
        return None
    out = node.outputs[0]
    cons = ctx.consumers.get(out, [])
    if all(c in group.nodes for c in cons) and out not in ctx.outputs:
        return None  # plain internal value: the pointwise rule decides
    if not ctx.same_shape(out, group.domain):
        return None
    if any(v and not ctx.broadcasts_to(v, group.domain) for v in node.inputs):
        return None
    return "output"
