"""Graph matching and rewriting shared by the compile passes that move nodes into a plugin's
epilogue (:mod:`.swiglu_fusion`, :mod:`.rope_fusion`, :mod:`.add_norm_fusion`).

Each such pass finds a plugin node, walks the nodes after it that compute a known pattern, asks
the plugin for a fused form and, where it gets one, puts the fused node in the plugin's place and
drops the nodes it took in. The steps they share are here: who reads a value (:class:`Reads`),
what a node is (:func:`is_node`), the constants a fused form adds (:func:`add_derived_constants`),
the rewrite of the node list (:func:`splice`) and the environment switch each pass has
(:func:`env_flag`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import numpy as np

from .ir import Graph, Node, Value, infer_shapes

__all__ = ["Reads", "add_derived_constants", "env_flag", "is_node", "pass_start", "splice"]


def env_flag(name: str, default: bool) -> bool:
    """Whether a pass switched by the environment variable ``name`` runs (read at each call):
    on by default (``default=True``) unless it is ``"0"``; off by default unless it is ``"1"``."""
    value = os.environ.get(name)
    return value != "0" if default else value == "1"


def is_node(node: Node | None, op: str, kind: int | None = None, attr: str = "op") -> TypeGuard[Node]:
    """Whether ``node`` is an ``op`` node (and, with ``kind``, its ``attrs[attr]`` equals it:
    ``"op"`` for elementwise, unary and reduce nodes, ``"kind"`` for activations)."""
    return node is not None and node.op == op and (kind is None or node.attrs.get(attr) == kind)


class Reads:
    """The nodes of a graph reading each value, taken once (the graph's node list must not
    change while it is used)."""

    def __init__(self, g: Graph) -> None:
        self.g = g
        self.cons = g.consumers()

    def of(self, value: str) -> list[Node]:
        """The nodes reading ``value``, in graph order (each once)."""
        return [self.g.nodes[i] for i in self.cons.get(value, [])]

    def count(self, value: str) -> int:
        """How many nodes read ``value``."""
        return len(self.cons.get(value, []))

    def only(self, value: str) -> Node | None:
        """The one node reading ``value``; None where several or none read it, or it is an engine
        output (a fused node would no longer write it)."""
        readers = self.of(value)
        return readers[0] if len(readers) == 1 and value not in self.g.outputs else None


def pass_start(graph: Graph, points: Sequence[Mapping[str, Any]]) -> tuple[Graph, list[dict[str, Any]], Reads, dict[str, int]]:
    """What a fusing pass starts from: a copy of ``graph`` to rewrite, its shapes at each profile
    point (``infer_shapes``), its readers (:class:`Reads`) and each node output's producer's index
    in its node list."""
    g = graph.copy()
    shapes = [infer_shapes(g, p) for p in points]
    return g, shapes, Reads(g), {o: i for i, n in enumerate(g.nodes) for o in n.outputs}


def add_derived_constants(g: Graph, names: Sequence[str], arrays: Sequence[np.ndarray], suffix: str) -> list[str]:
    """Add ``arrays`` to ``g`` as the constants ``f"{name}.{suffix}"`` (each with the data type of
    the constant ``name`` it is derived from: a plugin's weights in a fused form's layout) and
    return their names.

    Raises:
        ValueError: ``names`` and ``arrays`` differ in length.
    """
    if len(names) != len(arrays):
        raise ValueError(f"{len(arrays)} derived constants for {len(names)} constants {list(names)}")
    made = []
    for c, arr in zip(names, arrays):
        name = f"{c}.{suffix}"
        g.constants[name] = arr
        g.values[name] = Value(name, g.values[c].dtype, tuple(arr.shape))
        made.append(name)
    return made


def splice(g: Graph, replace: Mapping[int, Node], drop: set[int], rename: Mapping[str, str] | None = None) -> None:
    """Rewrite ``g``'s node list in place: each node whose ``id`` is in ``replace`` becomes that
    node, in its place; the nodes whose ids are in ``drop`` go; every input named in ``rename`` is
    read under its new name; values nothing reads any more are removed.

    Keeping the replaced node's place is right where the fused node reads only values that exist
    there (each pass checks that) and the readers of what it writes came after the nodes it took
    in, so after it too.
    """
    if not replace and not drop:
        return
    g.nodes = [replace.get(id(n), n) for n in g.nodes if id(n) not in drop]
    if rename:
        for n in g.nodes:
            n.inputs = [rename.get(v, v) for v in n.inputs]
    g.remove_unused()
