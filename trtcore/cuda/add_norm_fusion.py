"""Compile pass: a residual add and the RMSNorm after it into the GEMM that feeds the add.

A pre-norm decoder (Llama, Mistral, Qwen) ends each attention and each MLP with::

    y = plugin(x)                         # o_proj / down_proj: [..., N]
    h = r + y                             # the residual stream (read again by the next add)
    n = rms_norm(h) * w                   # trtcore.ops.rms_norm: cast, square, mean, + eps,
                                          # sqrt, reciprocal, multiply, cast, weight

and the next GEMM (q/k/v, gate/up, lm_head) reads ``n``. At batch-1 decode the add and the norm
are one row kernel (:mod:`.reduction_fusion`) of a few microseconds that waits for the whole
GEMM and holds back the next one: 63 launches a step on Llama-3-8B. Where the plugin offers it
(``with_add_norm(constants, eps)``, duck-typed: the weight-only GEMM,
:meth:`trtcore.plugins.weight_only_gemm.WeightOnlyGemmPlugin.with_add_norm`) these nodes become
one plugin node with two outputs, ``h`` and ``n``, that also reads ``r``, the norm's weight and a
zero counter of its own (a constant: the decode kernel's grid counts its finished blocks in it,
so that its last block adds and normalizes, and leaves it at zero). TensorRT-LLM's
``fused_add_rms_norm`` after its GEMMs and vLLM's ``fused_add_rms_norm`` do the add and the norm
in one kernel; here they also leave the kernel list.

Left as they are: RMSNorm with an offset (Gemma's ``1 + weight``), a LayerNorm, any intermediate
value that something else reads or that is an engine output, a residual made after the GEMM, and
a plugin without ``with_add_norm``.

Off unless ``TRTCORE_ADD_NORM_FUSION=1`` (read at each compile). On the H200 the fused plugin is
correct (tests/cuda/test_weight_only_gemm_gpu.py, tests/cuda/test_llm_gpu.py), but its first
kernel made the Llama-3-8B shape's 4-bit decode step 31% slower (2.676 against 2.041 ms,
bench/results/h200-2026-12-05-session23): the tail raised the decode kernel from 50 to 124
registers, halving the blocks resident. The kernel now caps them (two 512-thread blocks per SM,
64 registers), and that version is slower too: 2.387 against 2.026 ms a step
(bench/results/h200-2026-12-05-session26). Per layer the o_proj GEMV with its tail took 12.8 us
where GEMV and row kernel took 4.1 + 4.1, down_proj 18-20 against 10.1 + 4.3, and the gate/up
GEMV after the fused o_proj 22.9 against 19.5: the one block that adds and normalizes after all
the others costs more than the launch it saves, and the next GEMV no longer starts under it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..reference.types import DataType, ElementWiseOperation, ReduceOperation, UnaryOperation
from .graph_match import Reads, env_flag, is_node, pass_start, splice
from .ir import Graph, Node, Shape, Value


def enabled() -> bool:
    """Whether the pass runs: only with ``TRTCORE_ADD_NORM_FUSION=1`` (module docstring)."""
    return env_flag("TRTCORE_ADD_NORM_FUSION", default=False)


def _scalar(g: Graph, value: str) -> float | None:
    """The constant ``value``'s one number, or None (not a constant of one element)."""
    arr = g.constants.get(value)
    return float(np.asarray(arr, np.float64).reshape(-1)[0]) if arr is not None and arr.size == 1 else None


def _match(
    g: Graph, gemm: Node, reads: Reads, shapes: list[dict[str, Shape]], made_at: dict[str, int]
) -> tuple[list[Node], str, str, str, float] | None:
    """For plugin node ``gemm``: the nodes of ``r + y`` and the RMSNorm of it (module docstring),
    the residual ``r``, ``h``, the norm weight's constant and epsilon; None where they are not
    there exactly. ``made_at``: each node output's producer's index in ``g.nodes``."""
    found = residual_add(g, gemm, reads, shapes, made_at)
    if found is None:
        return None
    add, r, h = found
    norm = match_rms_norm(g, reads, h)
    if norm is None:
        return None
    nodes, w, eps = norm
    return [add, *nodes], r, h, w, eps


def residual_add(g: Graph, gemm: Node, reads: Reads, shapes: list[dict[str, Shape]], made_at: dict[str, int]) -> tuple[Node, str, str] | None:
    """For plugin node ``gemm``: the node of ``h = r + y`` (y: the plugin's output, read by
    nothing else), ``r`` and ``h``; None where that is not there exactly (another dtype than
    float16 / bfloat16 / float32, a broadcast, or a residual made after the GEMM). ``made_at``:
    each node output's producer's index in ``g.nodes``."""
    y = gemm.outputs[0]
    add = reads.only(y)
    if not is_node(add, "elementwise", int(ElementWiseOperation.SUM)) or len(set(add.inputs)) != 2 or y in g.outputs:
        return None
    (r,) = [v for v in add.inputs if v != y]
    h = add.outputs[0]
    dtype = g.values[y].dtype
    if g.values[r].dtype != dtype or g.values[h].dtype != dtype or dtype not in (DataType.HALF, DataType.BF16, DataType.FLOAT):
        return None
    if any(s[r] != s[y] or s[h] != s[y] for s in shapes):
        return None
    # the residual exists where the GEMM runs: a network input, a constant, or made before it
    if r not in g.inputs and r not in g.constants and made_at.get(r, len(g.nodes)) > made_at[y]:
        return None
    return add, r, h


def match_rms_norm(g: Graph, reads: Reads, h: str) -> tuple[list[Node], str, float] | None:
    """The nodes of ``trtcore.ops.rms_norm(h) * w`` without offset reading ``h`` (cast to
    float32, square, mean over the last axis, + eps, sqrt, reciprocal, multiply, cast back,
    times the weight; the module docstring), the weight's constant (``[..., N]`` of h's dtype)
    and epsilon; None where they are not there exactly, or where a value between h and the
    norm's output is an engine output or read by anything else. The last node's output is the
    norm's."""
    dtype = g.values[h].dtype
    rank = len(g.values[h].shape)
    casts = [n for n in reads.of(h) if is_node(n, "cast") and n.attrs["to"] == int(DataType.FLOAT)]
    if len(casts) != 1 or casts[0].outputs[0] in g.outputs:
        return None
    cast = casts[0]
    x32 = cast.outputs[0]
    users = reads.of(x32)
    square = next((n for n in users if is_node(n, "elementwise", int(ElementWiseOperation.PROD)) and n.inputs == [x32, x32]), None)
    normalize = next((n for n in users if n is not square and is_node(n, "elementwise", int(ElementWiseOperation.PROD))), None)
    if square is None or normalize is None or len(users) != 2:
        return None
    mean = reads.only(square.outputs[0])
    if not is_node(mean, "reduce", int(ReduceOperation.AVG)) or tuple(mean.attrs["axes"]) != (rank - 1,) or not mean.attrs["keep_dims"]:
        return None
    add_eps = reads.only(mean.outputs[0])
    if not is_node(add_eps, "elementwise", int(ElementWiseOperation.SUM)):
        return None
    (eps_in,) = [v for v in add_eps.inputs if v != mean.outputs[0]] or [""]
    eps = _scalar(g, eps_in)
    sqrt = reads.only(add_eps.outputs[0])
    if eps is None or not is_node(sqrt, "unary", int(UnaryOperation.SQRT)):
        return None
    recip = reads.only(sqrt.outputs[0])
    if not is_node(recip, "unary", int(UnaryOperation.RECIP)):
        return None
    if reads.only(recip.outputs[0]) is not normalize or sorted(normalize.inputs) != sorted([x32, recip.outputs[0]]):
        return None
    back = reads.only(normalize.outputs[0])
    if not is_node(back, "cast") or back.attrs["to"] != int(dtype):
        return None
    scale = reads.only(back.outputs[0])
    if not is_node(scale, "elementwise", int(ElementWiseOperation.PROD)):
        return None
    (w,) = [v for v in scale.inputs if v != back.outputs[0]] or [""]
    n_features = g.values[h].shape[-1]
    if w not in g.constants or g.values[w].dtype != dtype or g.constants[w].size != n_features or g.constants[w].shape[-1] != n_features:
        return None
    nodes = [cast, square, mean, add_eps, sqrt, normalize, recip, back, scale]
    # the values between h and the norm go away with their nodes: none may be an engine output
    if any(n.outputs[0] in g.outputs for n in nodes[:-1]):
        return None
    return nodes, w, eps


def run(graph: Graph, points: list[dict[str, Shape]], stats: dict[str, Any]) -> Graph:
    """Fuse each matching residual add + RMSNorm into the plugin before it (module docstring);
    ``stats["add_norm_fused"]`` counts them."""
    stats["add_norm_fused"] = 0
    if not enabled():
        return graph
    g, shapes, reads, made_at = pass_start(graph, points)
    replace: dict[int, Node] = {}
    drop: set[int] = set()
    for node in g.nodes:
        make = getattr(node.attrs.get("plugin"), "with_add_norm", None) if node.op == "plugin" else None
        if make is None or len(node.outputs) != 1 or any(c not in g.constants for c in node.inputs[1:]):
            continue
        found = _match(g, node, reads, shapes, made_at)
        if found is None:
            continue
        fused, r, h, w, eps = found
        made = make([g.constants[c] for c in node.inputs[1:]], eps)
        if made is None:
            continue
        plugin, arrays = made
        counter = f"{node.name}.add_norm_counter"
        g.constants[counter] = np.zeros(1, np.int32)
        g.values[counter] = Value(counter, DataType.INT32, (1,))
        layers = [layer for n in (node, *fused) for layer in n.layers]
        replace[id(node)] = Node(
            node.name,
            "plugin",
            [node.inputs[0], *node.inputs[1:], r, w, counter],
            [h, fused[-1].outputs[0]],
            {**node.attrs, "plugin": plugin},
            layers,
        )
        drop |= {id(n) for n in fused}
        assert len(arrays) == len(node.inputs) - 1  # the weight's constants stay as they are
        stats["add_norm_fused"] += 1
    # the fused node takes the plugin's place: its residual exists there (_match) and the readers
    # of h and of the norm came after the nodes it takes in, so after it too
    splice(g, replace, drop)
    return g
