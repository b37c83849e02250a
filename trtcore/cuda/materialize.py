"""Compile pass: copies where a view cannot be read as it is.

* a plugin input that is a view gets a ``copy`` with ``if_needed``: plugins take dense
  row-major memory, and at run time the copy is skipped (the view is passed as it is) for
  shapes where the view is dense, e.g. one decode token's slice of the fused q/k/v output;
* a GEMM operand whose strides suit no cuBLAS layout at some profile point gets such a copy;
* a network output that is a view, a network input or a constant gets a ``copy`` into the
  memory the caller binds for it (always).
"""

from __future__ import annotations

from typing import Any

from ..errors import NetworkError
from .gemm import plan_gemm
from .ir import Graph, Node, Shape, Value, infer_shapes
from .views import is_dense, view_layouts, view_root


def _copy(g: Graph, src: str, tag: str, layers: list[str], if_needed: bool) -> tuple[str, Node]:
    name = f"{src}#{tag}"
    g.values[name] = Value(name, g.values[src].dtype, g.values[src].shape)
    return name, Node(f"copy:{name}", "copy", [src], [name], {"if_needed": if_needed}, layers)


def run(graph: Graph, points: list[dict[str, Shape]], stats: dict[str, Any]) -> Graph:
    """Insert the copies of the module docstring; ``points`` are the profile's input shapes."""
    g = graph.copy()
    root = view_root(g)
    shapes = [infer_shapes(g, p) for p in points]
    layouts = [view_layouts(g, s) for s in shapes]
    out_nodes: list[Node] = []
    copies = 0
    for node in g.nodes:
        if node.op == "plugin":
            for k, v in enumerate(node.inputs):
                if v and v in root:
                    name, cp = _copy(g, v, f"dense{k}", node.layers, True)
                    out_nodes.append(cp)
                    node.inputs[k] = name
                    copies += 1
        elif node.op == "matmul":
            for k in (0, 1):
                v = node.inputs[k]
                if v not in root:
                    continue
                ok = True
                for s, lay in zip(shapes, layouts):
                    a, b = node.inputs
                    la = lay.get(a, (0, ())) if a in lay else None
                    lb = lay.get(b, (0, ())) if b in lay else None
                    if la is None or lb is None or plan_gemm(s[a], la[1], s[b], lb[1], node.attrs["transpose_a"], node.attrs["transpose_b"]) is None:
                        ok = False
                if not ok:
                    name, cp = _copy(g, v, f"dense{k}", node.layers, True)
                    out_nodes.append(cp)
                    node.inputs[k] = name
                    copies += 1
        out_nodes.append(node)
    produced = {o for n in out_nodes if n.op != "view" for o in n.outputs}
    for out in g.outputs:
        if out in g.aliases:
            continue
        if out not in produced:
            # the caller's buffer gets the value: rename the source, copy into the output
            if out in g.inputs:
                raise NetworkError(f"network input {out!r} is marked as an output; the cuda backend needs a layer between them")
            src = f"{out}#src"
            for n in out_nodes:
                n.outputs = [src if o == out else o for o in n.outputs]
                n.inputs = [src if v == out else v for v in n.inputs]
            if out in g.constants:
                g.constants[src] = g.constants.pop(out)
            g.values[src] = Value(src, g.values[out].dtype, g.values[out].shape)
            out_nodes.append(Node(f"copy:{out}", "copy", [src], [out], {"if_needed": False}, []))
            copies += 1
    g.nodes = out_nodes
    stats["copies"] = copies
    return g


def dense_for(shape: Shape, strides: tuple[int, ...]) -> bool:
    """Whether a view of ``shape`` with ``strides`` can be passed as dense memory."""
    return is_dense(shape, strides)
