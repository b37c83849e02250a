"""Region growing shared by pointwise fusion and row-reduction fusion.

Nodes are visited in reverse execution order. A fusible node joins the group of its
consumers when *all* of them belong to that one group and its output is no network output
(then the value lives in registers only); otherwise it starts a group of its own. The rules
of what may join are the two passes' (:mod:`.pointwise_fusion`, :mod:`.reduction_fusion`).
A group runs where its last node ran, so every value it reads is ready, and its outputs are
read only after it (checked for the one rule that lets a node with readers outside join).

A group becomes one node: ``pointwise_group`` or ``row_group`` with attributes ``members``
(the nodes, in order), ``scalars`` (one-element constants inlined into the kernel source as
literals), ``domain`` (the value whose shape the kernel iterates over) and, for a row group,
``reduce`` (the index in ``members`` of its reduction).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..reference.types import FLOATING, ReduceOperation
from .ir import Graph, Node, Shape


@dataclass
class Group:
    """A region being grown: node indices, its domain value, its reduction (node index)."""

    nodes: set[int]
    domain: str
    reduce: int | None = None
    extra_outputs: set[str] = field(default_factory=set)

    @property
    def last(self) -> int:
        """The group's last node: where its kernel runs."""
        return max(self.nodes)


@dataclass
class Context:
    """What the rules see: the graph, value shapes at each profile point, consumers."""

    graph: Graph
    points: list[dict[str, Shape]]
    consumers: dict[str, list[int]]
    outputs: set[str]

    def shapes(self, value: str) -> list[Shape]:
        """``value``'s concrete shape at each profile point."""
        return [p[value] for p in self.points]

    def same_shape(self, a: str, b: str) -> bool:
        """Whether ``a`` and ``b`` have equal shapes at every profile point."""
        return all(p[a] == p[b] for p in self.points)

    def broadcasts_to(self, value: str, domain: str) -> bool:
        """``value`` has the domain's rank and each dimension equals it or is 1, at every point."""
        for p in self.points:
            s, d = p[value], p[domain]
            if len(s) != len(d) or any(x != y and x != 1 for x, y in zip(s, d)):
                return False
        return True


#: a rule: (context, node index, group or None when the node has no single consumer group) ->
#: "internal" (join, value in registers), "output" (join, value written too) or None
Rule = Callable[[Context, int, "Group | None"], "str | None"]


def grow(graph: Graph, points: list[dict[str, Shape]], seed: Callable[[Context, int], bool], rules: list[Rule]) -> list[Group]:
    """Groups of ``graph``'s nodes: ``seed`` says which nodes may be in a group at all,
    ``rules`` whether one joins its consumers' group."""
    ctx = Context(graph, points, graph.consumers(), set(graph.outputs))
    group_of: dict[int, Group] = {}
    groups: list[Group] = []
    for i in reversed(range(len(graph.nodes))):
        if not seed(ctx, i):
            continue
        node = graph.nodes[i]
        out = node.outputs[0]
        cons = ctx.consumers.get(out, [])
        grouped = sorted(c for c in cons if c in group_of)
        target: Group | None = None
        verdict: str | None = None
        if grouped:
            candidate = group_of[grouped[0]]  # the first reader's group
            for rule in rules:
                verdict = rule(ctx, i, candidate)
                if verdict is not None:
                    break
            if verdict == "internal" and (out in ctx.outputs or any(c not in candidate.nodes for c in cons)):
                verdict = None
            if verdict == "output" and any(c not in candidate.nodes and c <= candidate.last for c in cons):
                verdict = None  # a reader outside would run before the group: no
            if verdict is not None:
                target = candidate
        if target is None:
            target = Group({i}, out)
            if graph.nodes[i].op == "reduce":
                target.reduce = i if row_reducible(ctx, i) else None
                if target.reduce is None:
                    continue  # a reduction no row kernel takes stays a node of its own
                target.domain = graph.nodes[i].inputs[0]
            groups.append(target)
        else:
            target.nodes.add(i)
            if verdict == "output":
                target.extra_outputs.add(out)
            if node.op == "reduce":
                target.reduce = i
        group_of[i] = target
    return groups


#: the reductions a row kernel computes
_ROW_OPS = {int(ReduceOperation.SUM), int(ReduceOperation.AVG), int(ReduceOperation.MAX), int(ReduceOperation.MIN)}


def row_reducible(ctx: Context, i: int) -> bool:
    """A reduction a row kernel takes: last axis only, keep_dims, SUM/AVG/MAX/MIN, float."""
    node = ctx.graph.nodes[i]
    if node.op != "reduce":
        return False
    x = node.inputs[0]
    rank = len(ctx.graph.values[x].shape)
    return (
        tuple(node.attrs["axes"]) == (rank - 1,)
        and node.attrs["keep_dims"]
        and node.attrs["op"] in _ROW_OPS
        and ctx.graph.values[x].dtype in FLOATING
    )


def rewrite(graph: Graph, groups: list[Group], stats: dict[str, Any]) -> Graph:
    """Replace each group (one node or more) by one group node."""
    g = graph.copy()
    consumers = g.consumers()
    at: dict[int, Group] = {}
    member_of: set[int] = set()
    fused_layers = 0
    for grp in groups:
        at[grp.last] = grp
        member_of |= grp.nodes
    out_nodes: list[Node] = []
    n_groups = 0
    for i, node in enumerate(g.nodes):
        if i in at:
            grp = at[i]
            members = [g.nodes[j] for j in sorted(grp.nodes)]
            produced = {o for m in members for o in m.outputs}
            scalars: dict[str, Any] = {}
            inputs: list[str] = []
            for m in members:
                for v in m.inputs:
                    if not v or v in produced or v in inputs or v in scalars:
                        continue
                    if v in g.constants and g.constants[v].size == 1:
                        scalars[v] = g.constants[v]
                    else:
                        inputs.append(v)
            outputs = [
                o
                for m in members
                for o in m.outputs
                if o in g.outputs or o in grp.extra_outputs or any(c not in grp.nodes for c in consumers.get(o, []))
            ]
            if grp.domain in produced and grp.domain not in outputs:
                # a group that ends at its reduction (its row result read elsewhere, e.g. a
                # captured variance): the launch needs the domain's shape, so it is written too
                outputs.append(grp.domain)
            kind = "row_group" if grp.reduce is not None else "pointwise_group"
            name = f"{kind}:{members[-1].name}"
            attrs: dict[str, Any] = {"members": members, "scalars": scalars, "domain": grp.domain}
            if grp.reduce is not None:
                attrs["reduce"] = sorted(grp.nodes).index(grp.reduce)
            layers = [layer for m in members for layer in m.layers]
            out_nodes.append(Node(name, kind, inputs, outputs, attrs, layers))
            fused_layers += len(members)
            n_groups += 1
        elif i not in member_of:
            out_nodes.append(node)
    g.nodes = out_nodes
    g.remove_unused()
    stats["fused_layers"] = stats.get("fused_layers", 0) + fused_layers
    stats["fused_groups"] = stats.get("fused_groups", 0) + n_groups
    return g
