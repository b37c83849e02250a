"""Compile pass: rotary position embedding into the q/k/v GEMM's epilogue.

After :mod:`.horizontal_fusion` the attention's q, k and v linears are one plugin, and RoPE
reads its q and k (:func:`trtcore.models.llama` with ``rope="plugin"``)::

    y = plugin(x)                               # [..., N]: q heads, k heads, v heads
    q = reshape(y[..., :Hq D], [..., Hq, D])    # views
    k = reshape(y[..., Hq D : (Hq + Hkv) D], [..., Hkv, D])
    q_rot, k_rot = rope(q, k, position_ids, inv_freq)

Where the GEMM plugin offers it (``with_rope(constants, rope_rows, head_dim,
attention_scaling)``, duck-typed: the weight-only GEMM,
:meth:`trtcore.plugins.weight_only_gemm.WeightOnlyGemmPlugin.with_rope`) and the RoPE is the
plain kind (``trtcore_rope`` with half-split pairing, full rotary, no dynamic or LongRoPE
frequencies), the plugin rotates q and k in its epilogue (its rows reordered so one thread
holds a rotation pair) and takes the positions and ``inv_freq`` as two more inputs; the RoPE
node goes, and its readers read the q and k views of the plugin's output, which now hold the
rotated values: one launch less per layer (at batch-1 decode a kernel that waits for the
whole GEMM), and q and k are not written and read again -- TensorRT-LLM's and vLLM's fused
QKV + RoPE kernels do the same in other ways.

Left as they are: any other reader of y's q or k rows (or of the views on the way), y itself
an engine output, RoPE outputs that are engine outputs, positions made after the GEMM or whose
shape is not x's leading dimensions at every profile point, and a plugin without ``with_rope``.

Off unless ``TRTCORE_ROPE_FUSION=1`` (read at each compile): on the H200 the epilogue is
correct (tests/cuda/test_weight_only_gemm_gpu.py, tests/cuda/test_llm_gpu.py) but the Llama-3-8B
shape's 4-bit decode step is no faster with it (bench/bench_quant_e2e.py's ``RoPE fused``
variant: 2.100 against 2.098 ms, bench/results/h200-2026-12-05-session23): the attention kernel
after the GEMM takes the time the RoPE kernel took.
"""

from __future__ import annotations

from typing import Any

from ..reference.types import DataType
from .graph_match import Reads, add_derived_constants, env_flag, splice
from .ir import Graph, Node, Shape, infer_shapes


def enabled() -> bool:
    """Whether the pass runs: only with ``TRTCORE_ROPE_FUSION=1`` (module docstring)."""
    return env_flag("TRTCORE_ROPE_FUSION", default=False)


def _plain_rope(node: Node) -> Any:
    """The node's RoPE plugin where the epilogue can compute it (module docstring), else None."""
    p = node.attrs.get("plugin") if node.op == "plugin" else None
    if p is None or getattr(p, "plugin_name", None) != "trtcore_rope" or len(node.outputs) != 2 or len(node.inputs) != 4:
        return None
    if not p.is_neox or p.rotary_dim != p.head_dim or p.head_dim % 16 or p.dynamic or p.longrope:
        return None
    return p


def _chain(g: Graph, producers: dict[str, Node], reads: Reads, value: str) -> tuple[str, list[Any], list[str]] | None:
    """The value a chain of views leads back from ``value`` to, the chain's stages in order, and
    the values along it (``value`` first, the one it leads back to last); None where a value on it
    other than the last has another reader or is an engine output."""
    stages: list[Any] = []
    along = [value]
    v = value
    while v in producers and producers[v].op == "view":
        node = producers[v]
        stages[:0] = list(node.attrs["stages"])
        v = node.inputs[0]
        along.append(v)
    if any(reads.count(a) != 1 or a in g.outputs for a in along[:-1]):
        return None
    return v, stages, along


def _slice_of(stages: list[Any], rank: int) -> tuple[int, int] | None:
    """``(start, length)`` where ``stages`` are a slice of the last of ``rank`` axes then a
    reshape, else None."""
    if len(stages) != 2 or stages[0][0] != "slice" or stages[1][0] != "reshape":
        return None
    axis, start, length = stages[0][1]
    return (start, length) if axis == rank - 1 else None


def _match(
    g: Graph, rope_node: Node, producers: dict[str, Node], reads: Reads, shapes: list[dict[str, Shape]], order: dict[int, int]
) -> tuple[Node, int] | None:
    """The GEMM plugin node whose output ``rope_node``'s q and k are views of, with the rows they
    cover (q then k, from row 0), where the epilogue can take the rotation; else None.
    ``order``: each node's index in ``g.nodes``, by ``id``."""
    rope = _plain_rope(rope_node)
    if rope is None or any(o in g.outputs or o in g.aliases.values() for o in rope_node.outputs):
        return None
    q_in, k_in, pos, freq = rope_node.inputs
    q_chain, k_chain = (_chain(g, producers, reads, v) for v in (q_in, k_in))
    if q_chain is None or k_chain is None or q_chain[0] != k_chain[0]:
        return None
    y = q_chain[0]
    gemm = producers.get(y)
    if gemm is None or gemm.op != "plugin" or len(gemm.outputs) != 1 or getattr(gemm.attrs["plugin"], "with_rope", None) is None:
        return None
    if y in g.outputs or y in g.aliases or y in g.aliases.values():  # its q and k rows would change under the engine output
        return None
    # the fused GEMM reads the positions where it runs: a network input, or a value made before it
    if pos not in g.inputs and pos not in g.constants and (pos not in producers or order[id(producers[pos])] > order[id(gemm)]):
        return None
    rank = len(g.values[y].shape)
    q, k = _slice_of(q_chain[1], rank), _slice_of(k_chain[1], rank)
    d = rope.head_dim
    if q is None or k is None or q[0] != 0 or k[0] != q[1] or q[1] % d or k[1] % d:
        return None
    rows = q[1] + k[1]
    x = gemm.inputs[0]
    if freq not in g.constants or g.constants[freq].shape != (d // 2,) or g.values[pos].dtype != DataType.INT32:
        return None
    if g.values[y].dtype != g.values[rope_node.outputs[0]].dtype:
        return None
    for s in shapes:
        if s[pos] != s[x][:-1] or s[q_in] != s[y][:-1] + (q[1] // d, d) or s[k_in] != s[y][:-1] + (k[1] // d, d):
            return None
    # every other view of y reads rows past q and k (v)
    chains = {q_chain[2][-2], k_chain[2][-2]}  # the views reading y directly
    for reader in reads.of(y):
        if reader.outputs[0] in chains:
            continue
        st = reader.attrs.get("stages") if reader.op == "view" else None
        if not st or st[0][0] != "slice" or st[0][1][0] != rank - 1 or st[0][1][1] < rows:
            return None
    return gemm, rows


def run(graph: Graph, points: list[dict[str, Shape]], stats: dict[str, Any]) -> Graph:
    """Fuse each matching RoPE into its q/k/v plugin (module docstring); ``stats["rope_fused"]``
    counts them."""
    stats["rope_fused"] = 0
    if not enabled():
        return graph
    g = graph.copy()
    shapes = [infer_shapes(g, p) for p in points]
    producers = {o: n for n in g.nodes for o in n.outputs}
    reads = Reads(g)
    order = {id(n): i for i, n in enumerate(g.nodes)}
    replace: dict[int, Node] = {}  # id of a GEMM plugin node -> its RoPE form
    drop: set[int] = set()
    rename: dict[str, str] = {}  # a RoPE output -> the view of the plugin's output holding it
    for node in g.nodes:
        found = _match(g, node, producers, reads, shapes, order)
        if found is None:
            continue
        gemm, rows = found
        weights = gemm.inputs[1:]
        if id(gemm) in replace or any(c not in g.constants for c in weights):
            continue
        rope = node.attrs["plugin"]
        made = gemm.attrs["plugin"].with_rope([g.constants[c] for c in weights], rows, rope.head_dim, rope.attention_scaling)
        if made is None:
            continue
        plugin, arrays = made
        names = add_derived_constants(g, weights, arrays, "rope")
        q_in, k_in, pos, freq = node.inputs
        inputs = [gemm.inputs[0], *names, pos, freq]
        replace[id(gemm)] = Node(gemm.name, "plugin", inputs, list(gemm.outputs), {**gemm.attrs, "plugin": plugin}, [*gemm.layers, *node.layers])
        drop.add(id(node))
        rename.update({node.outputs[0]: q_in, node.outputs[1]: k_in})
        stats["rope_fused"] += 1
    # the positions exist before the GEMM (_match) and inv_freq is a constant: the GEMM can read them where it is
    splice(g, replace, drop, rename)
    return g
