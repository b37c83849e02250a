"""``Builder.build_serialized_network`` of the cuda backend: compile, don't interpret.

The pipeline (one module per pass, in this order):

1. :mod:`.ir` reads the network into the IR;
2. :mod:`.fold_constants`;
3. :mod:`.horizontal_fusion` (q/k/v, gate/up into one GEMM with slice views), then
   :mod:`.swiglu_fusion` (a SwiGLU after a fused gate/up plugin into that plugin's epilogue);
4. :mod:`.fp8_input_fusion` (opt-in, ``TRTCORE_FP8_INPUT_FUSION=1``: a static-scale FP8
   linear's input quantization as pointwise nodes, which step 6 folds into the kernel producing
   the input);
5. :mod:`.views` (shuffle / slice / identity as views);
6. :mod:`.pointwise_fusion` with :mod:`.reduction_fusion`'s rules (one generated kernel per
   group; a GEMM's bias or residual add is folded into the next fused kernel: cuBLAS's
   epilogues are not used);
7. :mod:`.materialize` (copies only where a view cannot be read as it is);
8. :mod:`.codegen` writes each kernel's source; NVRTC compiles it for the target (the
   config's compute capability, else the current GPU; without either, compiling waits for
   deserialization);
9. :mod:`.memory` places every buffer in one activation block sized for the profile's
   largest shapes;
10. :mod:`.tactics` times the GEMM candidates (cuBLAS, cuBLASLt algorithms with split-K
   variants, the GEMV kernel) for every GEMM shape at the profile's min/opt/max where the
   build has a GPU, with a timing cache on disk.

The log says "fused N layers into M kernels" (INFO), and :attr:`Plan.kernels` lists every
kernel by name with the layers it came from.

``capture=`` (:func:`keep_captured`): intermediate tensors named at build time become extra
outputs of the engine, so an executor returns them with the outputs, the cuda counterpart of
the reference executor's ``run(feeds, capture=...)``. A compiled engine keeps in memory only
what it must, so which tensors to keep is a build choice (as marking a tensor as an output is
in TensorRT); the passes then leave each captured value in memory (a fused kernel writes it
as one more output, a view is copied out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from ..errors import EngineBuildError, NetworkError
from ..reference import builder as refbuilder
from ..reference.types import DataType
from . import (
    add_norm_fusion,
    codegen,
    fold_constants,
    fp8_input_fusion,
    horizontal_fusion,
    materialize,
    memory,
    norm_input_fusion,
    pointwise_fusion,
    rope_fusion,
    swiglu_fusion,
    tactics,
    views,
)
from .gemm import WORKSPACE_BYTES
from .ir import Graph, Node, from_network, infer_shapes, profile_points
from .plan import FORMAT, KernelInfo, Plan, dumps

#: ops that run as a generated kernel
GENERATED = ("pointwise_group", "row_group", "copy", "softmax", "reduce", "gather", "concat", "kv_cache_update", "attention")


def kernel_source(g: Graph, node: Node, points: list[dict[str, tuple[int, ...]]]) -> codegen.KernelSource | None:
    """The generated kernel of ``node`` (None for views, GEMMs and plugins)."""
    dt = {k: v.dtype for k, v in g.values.items()}
    op = node.op
    if op == "copy":
        member = Node(f"{node.name}#identity", "identity", list(node.inputs), list(node.outputs))
        group = Node(
            node.name, "pointwise_group", list(node.inputs), list(node.outputs), {"members": [member], "scalars": {}, "domain": node.outputs[0]}
        )
        return codegen.pointwise_group(group, dt, len(g.values[node.outputs[0]].shape))
    if op == "pointwise_group":
        return codegen.pointwise_group(node, dt, len(g.values[node.attrs["domain"]].shape))
    if op == "row_group":
        domain = node.attrs["domain"]
        rank = len(g.values[domain].shape)
        maxp = points[-1]
        row_outputs = {o for o in node.outputs if maxp[o][-1] == 1 and maxp[domain][-1] != 1}
        return codegen.row_group(node, dt, rank, row_outputs)
    if op == "softmax":
        return codegen.softmax(dt[node.inputs[0]], dt[node.outputs[0]], len(g.values[node.inputs[0]].shape))
    if op == "reduce":
        rank = len(g.values[node.inputs[0]].shape)
        axes = node.attrs["axes"]
        from ..reference.types import ReduceOperation

        return codegen.reduce_generic(ReduceOperation(node.attrs["op"]), dt[node.inputs[0]], rank - len(axes), len(axes))
    if op == "gather":
        data, idx = node.inputs
        axis = node.attrs["axis"]
        rank = len(g.values[data].shape)
        return codegen.gather(dt[data], dt[idx], axis, len(g.values[idx].shape), rank - axis - 1)
    if op == "concat":
        return codegen.concat(dt[node.outputs[0]], len(node.inputs), len(g.values[node.outputs[0]].shape))
    if op == "kv_cache_update":
        return codegen.kv_cache_update(dt[node.inputs[0]], dt[node.inputs[2]])
    if op == "attention":
        mask = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3] else None
        lengths = len(node.inputs) > 6 and bool(node.inputs[6])
        return codegen.attention(dt[node.inputs[0]], dt[mask] if mask else None, lengths, node.attrs["norm_op"] == 1)
    if op in ("view", "matmul", "plugin"):
        return None
    raise NetworkError(f"node {node.name!r}: op {op!r} has no kernel in the cuda backend")


def _gemv_prologue(
    g: Graph, mm: Node, readers: dict[str, int], producers: dict[str, Node], points: list[dict[str, tuple[int, ...]]], max_m: int = 4
) -> codegen.KernelSource | None:
    """The GEMV kernel with ``mm``'s input producer fused in front (:func:`codegen.gemv_prologue`),
    where that is sound: the producer is a row group or pointwise group over exactly the
    ``[tokens, K]`` input, the GEMM is the input's only reader, the input is no network
    output and has the weight's type; sets ``mm.attrs["prologue"]`` to the producer's name.
    The runtime uses it only when the GEMV tactic runs and the producer's launch comes right
    before."""
    a = mm.inputs[0]
    p = producers.get(a)
    if p is None or p.op not in ("row_group", "pointwise_group") or mm.attrs.get("transpose_a") or readers.get(a) != 1 or a in g.outputs:
        return None
    if g.values[a].dtype != g.values[mm.inputs[1]].dtype or len(g.values[a].shape) != 2:
        return None
    domain = p.attrs["domain"]
    if any(pt[domain] != pt[a] for pt in points):
        return None
    dt = {k: v.dtype for k, v in g.values.items()}
    row_outputs = {o for o in p.outputs if points[-1][o][-1] == 1 and points[-1][domain][-1] != 1} if p.op == "row_group" else set()
    mm.attrs["prologue"] = p.name
    return codegen.gemv_prologue(p, dt, 2, a, row_outputs, max_m)


def _memory_plan(g: Graph, points: list[dict[str, tuple[int, ...]]]) -> tuple[dict[str, int], dict[str, int], int]:
    """Offsets of activations and workspaces, their sizes, and the block size."""
    root = views.view_root(g)
    shapes_all = [infer_shapes(g, p) for p in points]
    external = set(g.inputs) | set(g.outputs) | set(g.constants) | set(g.aliases)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, node in enumerate(g.nodes):
        for o in node.outputs:
            r = root.get(o, o)
            if node.op != "view" and r not in external:
                first.setdefault(r, i)
                last[r] = max(last.get(r, i), i)
        for v in node.inputs:
            r = root.get(v, v)
            if v and r in first:
                last[r] = max(last[r], i)
    # a GEMV with a fused prologue reads its producer's inputs while it writes its own output:
    # those inputs live until the GEMM, so the output never takes their bytes
    index = {node.name: i for i, node in enumerate(g.nodes)}
    for j, node in enumerate(g.nodes):
        if node.op == "matmul" and node.attrs.get("prologue") in index:
            for v in g.nodes[index[node.attrs["prologue"]]].inputs:
                r = root.get(v, v)
                if v and r in first:
                    last[r] = max(last[r], j)
    # a copy made only where needed (materialize's in front of a plugin or a GEMM) is skipped at
    # run time where its source is already dense: its readers then read the source's bytes, so
    # the source lives as long as the copy's output (reversed: a chain of such copies too)
    for node in reversed(g.nodes):
        if node.op == "copy" and node.attrs.get("if_needed"):
            src, dst = (root.get(v, v) for v in (node.inputs[0], node.outputs[0]))
            if src in last and dst in last:
                last[src] = max(last[src], last[dst])
    sizes = {name: max(int(__import__("numpy").prod(s[name])) for s in shapes_all) * g.values[name].dtype.itemsize for name in first}
    buffers = [memory.Buffer(n, sizes[n], first[n], last[n]) for n in first]
    for i, node in enumerate(g.nodes):
        if node.op == "plugin":
            ws = _plugin_workspace(g, node, shapes_all[-1])
            if ws:
                buffers.append(memory.Buffer(f"workspace:{node.name}", ws, i, i))
                sizes[f"workspace:{node.name}"] = ws
    buffers.append(memory.Buffer("workspace:cublas", WORKSPACE_BYTES, 0, max(len(g.nodes) - 1, 0)))
    sizes["workspace:cublas"] = WORKSPACE_BYTES
    offsets, total = memory.plan(buffers)
    return offsets, sizes, total


def _plugin_workspace(g: Graph, node: Node, shapes: dict[str, tuple[int, ...]]) -> int:
    import numpy as np

    from ..reference.types import nptype

    plugin = node.attrs["plugin"]
    ins = [(shapes[v], np.dtype(nptype(g.values[v].dtype))) for v in node.inputs if v]
    outs = [(shapes[o], np.dtype(nptype(g.values[o].dtype))) for o in node.outputs]
    fn = getattr(plugin, "workspace_size", None)
    return int(fn(ins, outs)) if fn is not None else 0


def _arch_of(config: Any) -> str | None:
    caps = getattr(config, "_compute_capabilities", {})
    if caps:
        cap = caps[min(caps)]
        name = getattr(cap, "name", cap)
        from ..kernels import normalize_arch

        return normalize_arch(str(name).lower().replace("sm", "sm_").replace("__", "_"))
    from ..kernels import gpu_count

    try:
        if gpu_count() > 0:
            from ..kernels import current_arch

            return current_arch()
    except Exception:  # noqa: BLE001 - no usable GPU: compile at deserialization
        return None
    return None


def keep_captured(g: Graph, capture: Iterable[str] | str) -> list[str]:
    """Make the tensors named in ``capture`` outputs of ``g`` (in place, after those already
    there); return the names added.

    Args:
        g: the IR just read from the network (:func:`trtcore.cuda.ir.from_network`).
        capture: tensor names, one name, or ``"all"``: every output of a layer that is not
            a constant. Network inputs and constants (the weights) cannot be captured: the
            caller has them (``network``'s ``IConstantLayer.weights``), and the engine holds
            weights converted and folded.

    Raises:
        NetworkError: a name is no tensor of the network, a network input or a constant.
    """
    if capture == "all":
        names = [v for v in g.values if v not in g.inputs and v not in g.constants]
    else:
        names = [capture] if isinstance(capture, str) else list(capture)
    added = []
    for name in names:
        if name not in g.values:
            raise NetworkError(f"capture: the network has no tensor {name!r}")
        if name in g.inputs:
            raise NetworkError(f"capture: {name!r} is a network input (the caller has it); capture layer outputs")
        if name in g.constants:
            raise NetworkError(f"capture: {name!r} is a constant (weights); read it from the network's IConstantLayer, capture layer outputs")
        if name not in g.outputs and name not in added:
            added.append(name)
    for name in added:
        # the producer writes NAME#captured, read by its consumers and by an identity into
        # NAME, the engine output: the passes see one more reader (so a fused kernel keeps
        # the value as an extra output) and a view output (so materialize copies it out),
        # and the engine's output keeps the tensor's name
        src = f"{name}#captured"
        at = 0
        for i, node in enumerate(g.nodes):
            node.inputs = [src if v == name else v for v in node.inputs]
            if name in node.outputs:
                node.outputs = [src if v == name else v for v in node.outputs]
                at = i + 1
        g.values[src] = dataclasses.replace(g.values[name], name=src)
        g.nodes.insert(at, Node(f"capture:{name}", "identity", [src], [name]))
        g.outputs.append(name)
    return added


def compile_network(network: Any, config: Any, logger: Any = None, arch: str | None = None, capture: Iterable[str] | str = ()) -> Plan:
    """Compile a validated reference network and its builder config into a :class:`Plan`.

    Args:
        capture: tensors to keep as extra engine outputs (:func:`keep_captured`); listed in
            ``Plan.stats["captured"]``.

    Raises:
        NetworkError: invalid network / profiles, a layer the backend lacks, or a ``capture``
            name that is no tensor (or an input) of the network.
        EngineBuildError: a generated kernel does not compile.
    """
    profiles = list(config._profiles)
    refbuilder.validate(network, profiles)
    if len(profiles) > 1:
        raise NetworkError(f"the cuda backend builds one optimization profile, got {len(profiles)}")
    profile = profiles[0] if profiles else None
    stats: dict[str, Any] = {}
    g = from_network(network)
    stats["captured"] = keep_captured(g, capture)
    n_layers = len(g.nodes) + len(g.constants)  # constants are layers of the network too
    stats["layers"] = n_layers
    points = profile_points(g, profile)
    g = fold_constants.run(g, stats)
    g = horizontal_fusion.run(g, stats)
    g = swiglu_fusion.run(g, stats)
    g = norm_input_fusion.run(g, points, stats)
    g = add_norm_fusion.run(g, points, stats)
    g = fp8_input_fusion.run(g, stats)
    g = views.run(g, points, stats)
    g = rope_fusion.run(g, points, stats)
    g = pointwise_fusion.run(g, points, stats)
    g = materialize.run(g, points, stats)
    shapes = [infer_shapes(g, p) for p in points]
    producers = {o: n for n in g.nodes for o in n.outputs}
    readers: dict[str, int] = {}
    for n in g.nodes:
        for v in n.inputs:
            readers[v] = readers.get(v, 0) + 1
    sources: dict[str, codegen.KernelSource] = {}
    kernels: list[KernelInfo] = []
    for node in g.nodes:
        ks = kernel_source(g, node, shapes)
        if ks is not None:
            sources[node.name] = ks
        if node.op == "matmul" and node.inputs[1] in g.constants and g.values[node.inputs[1]].dtype in codegen.CUDA_GEMV_TYPES:
            # the runtime's small-M tactic: up to 4 token rows, and one row (decode at batch 1)
            for key, max_m in (("#gemv", 4), ("#gemv1", 1)):
                sources[f"{node.name}{key}"] = codegen.gemv(g.values[node.inputs[1]].dtype, max_m)
                fused = _gemv_prologue(g, node, readers, producers, shapes, max_m)
                if fused is not None:
                    sources[f"{node.name}{key}_prologue"] = fused
        if node.op != "view":
            kind = {"matmul": "gemm", "plugin": "plugin"}.get(node.op, node.op)
            kernels.append(KernelInfo(node.name, kind, list(node.layers), ks.key if ks else ""))
    offsets, sizes, total = _memory_plan(g, shapes)
    arch = arch or _arch_of(config)
    compile_keys: dict[str, str] = {}
    if arch is not None:
        for name, ks in sources.items():
            try:
                compile_keys[name] = codegen.compile_source(ks, arch).key
            except Exception as exc:
                raise EngineBuildError(f"kernel {ks.function} of {name!r} does not compile for {arch}: {exc}") from exc
    msg = f"fused {n_layers} layers into {len(kernels)} kernels"
    log = [msg, f"passes: {stats}", f"activation memory: {total} bytes"]
    if logger is not None:
        logger.log(logger.INFO if hasattr(logger, "INFO") else 3, msg)
    return Plan(
        FORMAT,
        g,
        {k: v for k, v in (profile._shapes.items() if profile else [])},
        sources,
        compile_keys,
        arch,
        kernels,
        offsets,
        sizes,
        total,
        {},  # GEMM tactics by call signature: filled by tactics.tune where the build has a GPU
        log,
        stats,
    )


class Builder(refbuilder.Builder):
    """``tensorrt.Builder`` of the cuda backend: networks and configs as the reference's,
    builds compile (see the module docstring)."""

    def build_engine(self, network: Any, config: Any, capture: Iterable[str] | str = ()) -> Any:  # type: ignore[override]
        """Compile and return the engine without serializing (trtcore extension); ``capture``:
        tensors kept as extra outputs (:func:`keep_captured`)."""
        from .runtime import ICudaEngine

        return ICudaEngine(self._compile(network, config, capture))

    def build_serialized_network(self, network: Any, config: Any, capture: Iterable[str] | str = ()) -> refbuilder.IHostMemory:
        """The compiled plan as bytes (:meth:`trtcore.cuda.Runtime.deserialize_cuda_engine` reads it);
        ``capture`` (a trtcore extension): tensors kept as extra outputs (:func:`keep_captured`)."""
        plan = self._compile(network, config, capture)
        return refbuilder.IHostMemory(dumps(plan))

    def _compile(self, network: Any, config: Any, capture: Iterable[str] | str = ()) -> Plan:
        """:func:`compile_network`, then the GEMM tactics timed on this GPU when there is one
        (:mod:`trtcore.cuda.tactics`)."""
        plan = compile_network(network, config, self.logger, capture=capture)
        if tactics.timing_enabled():
            lines = tactics.tune(plan)
            plan.build_log.extend(lines)
            if self.logger is not None:
                for line in lines:
                    self.logger.log(self.logger.INFO if hasattr(self.logger, "INFO") else 3, line)
        return plan


__all__ = ["Builder", "DataType", "compile_network", "keep_captured", "kernel_source"]
