"""Compile pass: an RMSNorm into the GEMMs that read it, and the residual add before it into the
GEMM that feeds the add.

A pre-norm decoder (Llama, Mistral, Qwen) runs, between two linears::

    y = plugin(x)                  # o_proj / down_proj: [..., N]
    h = r + y                      # the residual stream (read again by the next add)
    n = rms_norm(h) * w            # trtcore.ops.rms_norm (the chain add_norm_fusion matches)
    z = plugin_i(n)                # q/k/v, gate/up, lm_head: each reads n as its x

and at batch-1 decode the add and the norm are one row kernel of a few microseconds between the
two GEMMs (63 launches a step on Llama-3-8B). Here they go into the GEMMs on both sides, where
the plugins offer it (duck-typed: the weight-only GEMM's
:meth:`~trtcore.plugins.weight_only_gemm.WeightOnlyGemmPlugin.with_norm_input` and
:meth:`~trtcore.plugins.weight_only_gemm.WeightOnlyGemmPlugin.with_residual`)::

    h = plugin'(x, r)              # add_residual: r added in the GEMM's epilogue
    z = plugin_i'(h, w)            # norm_input: the GEMM normalizes its x itself

At decode each reader's v2 kernel folds the norm in (``NORM_X``): RMSNorm's scale is one number
per row of x, so the GEMV multiplies h by the norm's weight on the way (one rounding), sums the
squares of h beside the products, and scales each output by its row's ``1 / rms`` before the
one rounding (``rms_norm_folded_reference``; the unfused graph rounds ``h / rms`` before the
weight: within an ulp of x). No kernel runs between the two GEMMs and the reader's weights
stream from its first instruction. Prefill (more than 8 rows) normalizes first, with the
unfused graph's numbers (``rms_norm_reference``). :mod:`.add_norm_fusion` made the producer's
last block do the add and the norm instead, and that was slower (its module docstring).

The norm moves into its readers where every reader is such a plugin reading ``n`` as its x and
nothing else, ``n`` is no engine output, and the weight is a constant of ``N`` elements; the
first layer's norm (of the embeddings) has no add before it and moves alone. The add moves into
the GEMM before it where that is such a plugin whose output only the add reads and the residual
exists before it. Left as they are: RMSNorm with an offset (Gemma's ``1 + weight``), a
LayerNorm, a norm with any other reader (an FP8 or cuBLAS GEMM, a captured value), and float32
networks (their ``rms_norm`` has no cast to float32 to start from, as for
:mod:`.add_norm_fusion`). A q/k/v plugin that takes the norm no longer takes RoPE:
:mod:`.rope_fusion` runs after this pass and the plugin's ``norm_input`` and ``rope_rows``
exclude each other, so turning this pass on turns ``TRTCORE_ROPE_FUSION=1`` off for those GEMMs.

Off unless ``TRTCORE_NORM_INPUT_FUSION=1`` (read at each compile): slower as measured, on an H100
(Llama-3-8B shape, W4A16 g128 + 4-bit lm_head, one decode step's GPU time). The version that
staged the normalized x in shared memory in every block: 2,512 against 2,244 us
(bench/results/h100-2026-12-05-session27). The folded one with the norm weight prefetched into
L1: 2,550 against 2,267 us (bench/results/h100-2026-12-05-session28, call 1; per layer q/k/v's
GEMV 9.1 against 6.2 + 4.5 for GEMV and row kernel, gate/up's 34.7 against 23.4 + 3.9); alone
(``bench/bench_norm_fold.py``, call 2) gate/up's GEMV took 28.3 us with it, 25.6 without the
prefetch (as committed), against 23.5 plain, q/k/v's 8.5 against 6.8. Every warp of these GEMVs
runs its units one after another, so a few more loads and instructions per chunk lengthen
every unit. It runs before :mod:`.add_norm_fusion`, which then finds nothing where it fused.
"""

from __future__ import annotations

from typing import Any

from .add_norm_fusion import match_rms_norm, residual_add
from .graph_match import Reads, env_flag, is_node, pass_start, splice
from .ir import Graph, Node, Shape

__all__ = ["enabled", "run"]


def enabled() -> bool:
    """Whether the pass runs: only with ``TRTCORE_NORM_INPUT_FUSION=1`` (module docstring)."""
    return env_flag("TRTCORE_NORM_INPUT_FUSION", default=False)


def _readers(g: Graph, reads: Reads, n: str, eps: float) -> list[tuple[Node, Any]] | None:
    """Each reader of the norm's output ``n`` and its plugin with the norm in it; None where one
    cannot take it (module docstring)."""
    readers = reads.of(n)
    if not readers or n in g.outputs:
        return None
    made = []
    for node in readers:
        make = getattr(node.attrs.get("plugin"), "with_norm_input", None) if node.op == "plugin" else None
        if make is None or node.inputs[0] != n or n in node.inputs[1:] or any(c not in g.constants for c in node.inputs[1:]):
            return None
        found = make([g.constants[c] for c in node.inputs[1:]], eps)
        if found is None:
            return None
        made.append((node, found[0]))
    return made


def _producer(g: Graph, h: str, reads: Reads, shapes: list[dict[str, Shape]], made_at: dict[str, int]) -> tuple[Node, Node, str, Any] | None:
    """The plugin node whose output is added to the residual to make ``h``, the add node, the
    residual and the plugin with the add in it; None where there is none (module docstring)."""
    at = made_at.get(h)
    add = g.nodes[at] if at is not None else None
    if not is_node(add, "elementwise"):
        return None
    for y in add.inputs:
        i = made_at.get(y)
        gemm = g.nodes[i] if i is not None else None
        make = getattr(gemm.attrs.get("plugin"), "with_residual", None) if gemm is not None and gemm.op == "plugin" else None
        if gemm is None or make is None or len(gemm.outputs) != 1 or any(c not in g.constants for c in gemm.inputs[1:]):
            continue
        found = residual_add(g, gemm, reads, shapes, made_at)
        if found is None or found[0] is not add:
            continue
        made = make([g.constants[c] for c in gemm.inputs[1:]])
        if made is not None:
            return gemm, add, found[1], made[0]
    return None


def run(graph: Graph, points: list[dict[str, Shape]], stats: dict[str, Any]) -> Graph:
    """Move each matching RMSNorm into its readers and the residual add before it into its GEMM
    (module docstring); ``stats["norm_input_fused"]`` counts the norms, ``stats["residual_fused"]``
    the adds."""
    stats["norm_input_fused"] = stats["residual_fused"] = 0
    if not enabled():
        return graph
    g, shapes, reads, made_at = pass_start(graph, points)
    replace: dict[int, Node] = {}
    drop: set[int] = set()
    for cast in g.nodes:
        if not is_node(cast, "cast") or id(cast) in drop:
            continue
        h = cast.inputs[0]
        norm = match_rms_norm(g, reads, h)
        if norm is None:
            continue
        nodes, w, eps = norm
        readers = _readers(g, reads, nodes[-1].outputs[0], eps)
        if readers is None or any(id(node) in replace for node, _ in readers):
            continue
        for i, (node, plugin) in enumerate(readers):
            layers = [*node.layers, *(layer for n in nodes for layer in n.layers)] if i == 0 else node.layers
            replace[id(node)] = Node(node.name, "plugin", [h, *node.inputs[1:], w], list(node.outputs), {**node.attrs, "plugin": plugin}, layers)
        drop |= {id(n) for n in nodes}
        stats["norm_input_fused"] += 1
        found = _producer(g, h, reads, shapes, made_at)
        if found is None or id(found[0]) in replace:
            continue
        gemm, add, r, plugin = found
        replace[id(gemm)] = Node(gemm.name, "plugin", [*gemm.inputs, r], [h], {**gemm.attrs, "plugin": plugin}, [*gemm.layers, *add.layers])
        drop.add(id(add))
        stats["residual_fused"] += 1
    # the readers keep their places (h is made before the norm was); the producer takes the add's
    # output in its own place: its residual exists there (residual_add) and h's readers came after
    splice(g, replace, drop)
    return g
