"""Compile pass: shuffle / slice / identity as views, no copy, where the strides allow.

A *view* node has no kernel: its output is its input's memory with another ``(offset,
strides)`` layout (in elements). Stages: ``("permute", perm)``, ``("reshape", attrs)``
(``IShuffleLayer``'s ``reshape_dims`` / ``zero_is_placeholder``) and ``("slice", (axis,
start, length))``. A transpose and a slice are always views; a reshape is a view when the
input's strides allow it without a copy (NumPy's rule, :func:`reshape_strides`), which the
pass checks at the profile's min, opt and max shapes: where one fails, the shuffle stays a
``copy`` of the permuted input followed by a reshape view of the dense copy.

``gather`` with constant indices that form a contiguous range (``ops.gather_const`` slices,
e.g. RoPE's partial rotary part) becomes a slice view; an ``identity`` (same dtype) is an
empty view.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import NetworkError
from .ir import Graph, Node, Shape, infer_shapes, reshape_target

Layout = tuple[int, tuple[int, ...]]  # (offset in elements, strides in elements)


def dense_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides (elements) of ``shape``."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(int(d), 1)
    return tuple(reversed(out))


def is_dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether ``strides`` address ``shape`` row-major without gaps (size-1 dims ignored)."""
    expect = 1
    for d, s in zip(reversed(shape), reversed(strides)):
        if d == 1:
            continue
        if s != expect:
            return False
        expect *= d
    return True


def reshape_strides(shape: Shape, strides: Sequence[int], new_shape: Shape) -> tuple[int, ...] | None:
    """Strides of ``new_shape`` over the same memory as ``(shape, strides)``, or None when a
    reshape needs a copy (NumPy's ``_attempt_nocopy_reshape``: runs of old dimensions that
    are contiguous with each other map onto runs of new dimensions)."""
    if int(math.prod(shape)) != int(math.prod(new_shape)):
        return None
    if int(math.prod(shape)) == 0:
        return dense_strides(new_shape)
    old = [(d, s) for d, s in zip(shape, strides) if d != 1]
    out = [0] * len(new_shape)
    oi, ni = 0, 0
    olds = [d for d, _ in old]
    oldst = [s for _, s in old]
    new = list(new_shape)
    while oi < len(olds) and ni < len(new):
        np_, op_ = new[ni], olds[oi]
        nj, oj = ni + 1, oi + 1
        while np_ != op_:
            if np_ < op_:
                np_ *= new[nj]
                nj += 1
            else:
                op_ *= olds[oj]
                oj += 1
        for k in range(oi, oj - 1):
            if oldst[k] != olds[k + 1] * oldst[k + 1]:
                return None
        out[nj - 1] = oldst[oj - 1]
        for k in range(nj - 1, ni, -1):
            out[k - 1] = out[k] * new[k]
        ni, oi = nj, oj
    for k in range(len(new)):
        if new[k] == 1 and out[k] == 0:
            out[k] = 1
    # trailing size-1 dims left unassigned
    for k in range(ni, len(new)):
        out[k] = 1
    return tuple(out)


def apply_stages(stages: Sequence[tuple[str, Any]], shape: Shape, layout: Layout) -> tuple[Shape, Layout] | None:
    """The shape and layout after a view's stages, or None where a reshape needs a copy."""
    offset, strides = layout
    for kind, arg in stages:
        if kind == "permute":
            shape = tuple(shape[p] for p in arg)
            strides = tuple(strides[p] for p in arg)
        elif kind == "reshape":
            new_shape = reshape_target(arg, shape)
            st = reshape_strides(shape, strides, new_shape)
            if st is None:
                return None
            shape, strides = new_shape, st
        elif kind == "slice":
            axis, start, length = arg
            offset += start * strides[axis]
            shape = shape[:axis] + (length,) + shape[axis + 1 :]
        else:  # pragma: no cover - the pass only makes the three kinds
            raise ValueError(kind)
    return shape, (offset, tuple(strides))


def shuffle_view_stages(attrs: dict[str, Any]) -> list[tuple[str, Any]]:
    """An ``IShuffleLayer``'s attributes as view stages (identity transposes dropped)."""
    stages: list[tuple[str, Any]] = []
    perm = tuple(attrs["first_transpose"])
    if perm != tuple(range(len(perm))):
        stages.append(("permute", perm))
    if attrs["reshape_dims"] is not None:
        stages.append(("reshape", {"reshape_dims": attrs["reshape_dims"], "zero_is_placeholder": attrs["zero_is_placeholder"]}))
    second = attrs["second_transpose"]
    if second is not None and tuple(second) != tuple(range(len(second))):
        stages.append(("permute", tuple(second)))
    return stages


def _contiguous_range(idx: np.ndarray) -> tuple[int, int] | None:
    flat = np.asarray(idx).reshape(-1).astype(np.int64)
    if idx.ndim != 1 or flat.size == 0:
        return None
    if np.array_equal(flat, np.arange(flat[0], flat[0] + flat.size)):
        return int(flat[0]), int(flat.size)
    return None


def run(graph: Graph, points: list[dict[str, Shape]], stats: dict[str, Any]) -> Graph:
    """Turn shuffles, identities and constant-range gathers into views (see the module doc)."""
    g = graph.copy()
    nodes: list[Node] = []
    views = copies = 0
    for node in g.nodes:
        a = node.attrs
        if node.op == "identity" and g.values[node.inputs[0]].dtype == g.values[node.outputs[0]].dtype:
            nodes.append(Node(node.name, "view", node.inputs, node.outputs, {"stages": []}, node.layers))
            views += 1
            continue
        if node.op == "gather" and node.inputs[1] in g.constants:
            rng = _contiguous_range(g.constants[node.inputs[1]])
            if rng is not None:
                stages = [("slice", (a["axis"], rng[0], rng[1]))]
                nodes.append(Node(node.name, "view", [node.inputs[0]], node.outputs, {"stages": stages}, node.layers))
                views += 1
                continue
        if node.op == "shuffle":
            stages = shuffle_view_stages(a)
            nodes.append(Node(node.name, "view", [node.inputs[0]], node.outputs, {"stages": stages}, node.layers))
            views += 1
            continue
        nodes.append(node)
    g.nodes = nodes
    g.remove_unused()
    # a reshape that cannot be a view at some profile point: copy the (permuted) input first
    fixed: list[Node] = []
    for node in g.nodes:
        if node.op != "view" or not any(k == "reshape" for k, _ in node.attrs["stages"]):
            fixed.append(node)
            continue
        if _viewable(g, fixed, node, points):
            fixed.append(node)
            continue
        stages = node.attrs["stages"]
        cut = max(i for i, (k, _) in enumerate(stages) if k == "reshape")
        src = node.inputs[0]
        head, tail = stages[:cut], stages[cut:]
        if head:
            mid = f"{node.outputs[0]}#pre"
            shape0 = g.values[src].shape
            g.values[mid] = type(g.values[src])(mid, g.values[src].dtype, _static_after(head, shape0))
            fixed.append(Node(f"{node.name}#pre", "view", [src], [mid], {"stages": head}, node.layers))
            src = mid
        dense = f"{node.outputs[0]}#dense"
        g.values[dense] = type(g.values[src])(dense, g.values[src].dtype, g.values[src].shape)
        fixed.append(Node(f"{node.name}#copy", "copy", [src], [dense], {}, node.layers))
        fixed.append(Node(node.name, "view", [dense], node.outputs, {"stages": tail}, node.layers))
        copies += 1
    g.nodes = fixed
    stats["views"] = views
    stats["view_copies"] = copies
    return g


def _static_after(stages: Sequence[tuple[str, Any]], shape: Shape) -> Shape:
    for kind, arg in stages:
        if kind == "permute":
            shape = tuple(shape[p] for p in arg)
    return shape


def _viewable(g: Graph, done: list[Node], node: Node, points: list[dict[str, Shape]]) -> bool:
    """Whether ``node``'s stages are views at every profile point, given the layouts of
    values before it (views of views compose; other values are dense)."""
    probe = Graph(g.values, done + [node], g.inputs, g.outputs, g.constants, g.aliases)
    for point in points:
        try:
            shapes = infer_shapes(probe, point)
        except NetworkError:
            return True  # shape errors are reported by the runtime for the shapes given
        layouts = view_layouts(probe, shapes)
        if node.outputs[0] not in layouts:
            return False
    return True


def view_layouts(graph: Graph, shapes: dict[str, Shape]) -> dict[str, Layout]:
    """Layout of every value for concrete ``shapes``: dense for values with memory of their
    own, composed for views; a view whose reshape needs a copy is left out."""
    layouts: dict[str, Layout] = {}
    for name, shape in shapes.items():
        layouts[name] = (0, dense_strides(shape))
    for node in graph.nodes:
        if node.op != "view":
            continue
        src = node.inputs[0]
        if src not in layouts:
            layouts.pop(node.outputs[0], None)
            continue
        res = apply_stages(node.attrs["stages"], shapes[src], layouts[src])
        if res is None:
            layouts.pop(node.outputs[0], None)
        else:
            layouts[node.outputs[0]] = res[1]
    return layouts


def view_root(graph: Graph) -> dict[str, str]:
    """value -> the value owning its memory (itself unless it is a view)."""
    root: dict[str, str] = {}
    for node in graph.nodes:
        if node.op == "view":
            src = node.inputs[0]
            root[node.outputs[0]] = root.get(src, src)
    return root
