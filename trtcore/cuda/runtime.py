"""Runtime objects of the cuda backend with TensorRT's semantics: ``Runtime``,
``ICudaEngine``, ``IExecutionContext``.

``IExecutionContext.execute_async_v3(stream)`` only enqueues work on ``stream``: generated
kernels (``cuLaunchKernel``), cuBLAS GEMMs (a handle per context with a fixed workspace in
the context's memory) and plugin ``enqueue`` calls. It never synchronizes and never
allocates device memory: activations live at the memory plan's offsets in the block given
by ``set_device_memory`` (or allocated once by ``create_execution_context``), weights were
uploaded once per engine. The first call for a combination of input shapes and tensor
addresses prepares the launches on the host (shape inference, layouts, kernel arguments);
later calls replay them (the last ``max_prepared`` combinations are kept, LRU), so after that
warm-up a call can be captured in a CUDA graph, as TensorRT documents for ``enqueueV3``;
:meth:`IExecutionContext.prepare_launches` does the preparation alone.

Host-side preparation (:meth:`IExecutionContext.prepare`) needs no GPU; it returns the list
of steps, which the tests inspect on the CPU.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..errors import NetworkError, TrtcoreError
from ..reference.types import DataType, Logger, TensorIOMode, nptype
from . import codegen
from .cublaslt import Lt, signature
from .gemm import Cublas, GemmCall, gemv_applies, gemv_launch, plan_gemm
from .ir import infer_shapes
from .plan import FORMAT, KernelInfo, Plan, dumps, loads
from .views import Layout, apply_stages, dense_strides, is_dense

_log = logging.getLogger(__name__)


#: launch lists an execution context keeps (LRU): a server's padded step shapes fit many times
MAX_PREPARED = 256


class EngineExecutionError(TrtcoreError, RuntimeError):
    """The engine cannot run with the shapes or memory it was given."""


@dataclass
class Step:
    """One launch: ``kind`` (``kernel``, ``gemm``, ``plugin``), the node's ``name``, and what
    the launch needs (``args`` for a kernel, ``calls`` for a GEMM, tensors for a plugin)."""

    kind: str
    name: str
    grid: tuple[int, int, int] = (1, 1, 1)
    block: int = 1
    shared_mem: int = 0
    args: list[tuple[int, str]] = field(default_factory=list)
    calls: list[GemmCall] = field(default_factory=list)
    ptrs: tuple[int, int, int] = (0, 0, 0)
    dtype: DataType = DataType.FLOAT
    plugin: Any = None
    tensors: tuple[Any, Any, int] = ((), (), 0)
    tactics: list[dict[str, Any]] = field(default_factory=list)


def _gemm_override() -> str | None:
    """``TRTCORE_CUDA_GEMV``: ``1`` runs every GEMM the GEMV kernel can run on it, ``0`` runs
    every GEMM on ``cublasGemmEx``; unset, each GEMM runs the tactic the build chose (read
    when launches are prepared)."""
    value = os.environ.get("TRTCORE_CUDA_GEMV")
    return value if value in ("0", "1") else None


def _grid(n: int, block: int) -> int:
    return max(1, min(-(-n // block), 65535))


def _per_axis(role: str, values: Sequence[int]) -> dict[str, int]:
    """Launch roles ``{role}:{d}`` for each axis ``d`` (the names codegen gives dims and strides)."""
    return {f"{role}:{d}": v for d, v in enumerate(values)}


class ICudaEngine:
    """A compiled engine (``tensorrt.ICudaEngine`` subset) over a :class:`Plan`."""

    def __init__(self, plan: Plan):
        if getattr(plan, "format", None) != FORMAT:
            raise NetworkError(f"not a trtcore cuda plan (format {getattr(plan, 'format', None)!r}, expected {FORMAT!r})")
        self.plan = plan
        g = plan.graph
        self._io = list(g.inputs) + list(g.outputs)
        self._functions: dict[str, Any] = {}
        self._weights: Any = None
        self._const_ptr: dict[str, int] = {}
        self._tactics_valid: bool | None = None

    # TensorRT API ------------------------------------------------------------------------
    @property
    def num_io_tensors(self) -> int:
        """Number of network inputs and outputs."""
        return len(self._io)

    @property
    def num_optimization_profiles(self) -> int:
        """Always 1: the cuda backend builds one profile."""
        return 1

    @property
    def num_layers(self) -> int:
        """Launches of one execution (kernels, GEMMs, plugins)."""
        return len(self.plan.kernels)

    def get_tensor_name(self, index: int) -> str:
        """The I/O tensor at ``index`` (inputs first, then outputs, in network order)."""
        return self._io[index]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        """INPUT, OUTPUT or NONE for ``name``."""
        if name in self.plan.graph.inputs:
            return TensorIOMode.INPUT
        return TensorIOMode.OUTPUT if name in self.plan.graph.outputs else TensorIOMode.NONE

    def get_tensor_dtype(self, name: str) -> DataType:
        """The tensor's :class:`DataType`; EngineExecutionError for an unknown name."""
        return self._value(name).dtype

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        """The static shape (-1 for dynamic dimensions)."""
        return tuple(self._value(name).shape)

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple[int, ...]]:
        """(min, opt, max) of an input in profile 0; EngineExecutionError for another index."""
        if profile_index != 0:
            raise EngineExecutionError(f"profile index {profile_index} out of range: the engine has 1 optimization profile")
        return [tuple(s) for s in self.plan.profile.get(name, ((), (), ()))]

    def is_shape_inference_io(self, name: str) -> bool:
        """Always False: the engine has no shape tensors."""
        return False

    @property
    def device_memory_size_v2(self) -> int:
        """Bytes of the activation block an execution context needs."""
        return int(self.plan.device_memory_size)

    device_memory_size = device_memory_size_v2

    def get_aliased_input_tensor(self, name: str) -> str | None:
        """The input whose memory output ``name`` shares (a KV-cache update), else None."""
        return self.plan.graph.aliases.get(name)

    def create_execution_context(self) -> IExecutionContext:
        """A context with its own device memory (allocated once, here)."""
        ctx = IExecutionContext(self)
        import cupy

        ctx._own_memory = cupy.cuda.alloc(max(self.device_memory_size_v2, 1))
        ctx.set_device_memory(int(ctx._own_memory.ptr), self.device_memory_size_v2)
        return ctx

    def create_execution_context_without_device_memory(self) -> IExecutionContext:
        """A context that needs ``set_device_memory`` before it executes."""
        return IExecutionContext(self)

    # trtcore extensions ------------------------------------------------------------------
    def tactic(self, sig: str) -> dict[str, Any]:
        """The GEMM tactic the build chose for call signature ``sig``
        (:mod:`trtcore.cuda.tactics`); ``cublasGemmEx`` for shapes that were not timed and on
        a GPU other than the one that timed them."""
        t = self.plan.tactics.get(sig)
        if t is None:
            return {"kind": "cublas"}
        if self._tactics_valid is None:
            try:
                import cupy

                from ..gpu import describe_device

                here = describe_device(int(cupy.cuda.runtime.getDevice()))
            except Exception as exc:  # noqa: BLE001 - no GPU to compare with: run the default
                here = f"no GPU ({exc})"
            self._tactics_valid = here == self.plan.stats.get("tactics_device")
            if not self._tactics_valid:
                _log.warning("engine tactics were timed on %s, this is %s: GEMMs use cublasGemmEx", self.plan.stats.get("tactics_device"), here)
        return t if self._tactics_valid else {"kind": "cublas"}

    @property
    def kernels(self) -> list[KernelInfo]:
        """Every launch of one execution, by name, with the layers it came from."""
        return list(self.plan.kernels)

    @property
    def build_log(self) -> list[str]:
        """The build's log lines (the first: "fused N layers into M kernels")."""
        return list(self.plan.build_log)

    def serialize(self) -> bytes:
        """The plan as bytes (what ``build_serialized_network`` returns; :func:`~trtcore.cuda.plan.dumps`)."""
        return dumps(self.plan)

    def _value(self, name: str) -> Any:
        try:
            return self.plan.graph.values[name]
        except KeyError:
            raise EngineExecutionError(f"no tensor {name!r} in the engine") from None

    # device resources (once per engine) ----------------------------------------------------
    def _load(self) -> None:
        """Compile/load every kernel for the current GPU and upload the weights (once)."""
        if self._weights is not None:
            return
        import cupy

        from ..kernels import ensure_context

        ensure_context()
        from concurrent.futures import ThreadPoolExecutor

        from ..kernels import current_arch

        unique = {ks.key: ks for ks in self.plan.sources.values()}  # every decoder layer's are equal
        arch = current_arch()
        with ThreadPoolExecutor(max_workers=8) as pool:  # NVRTC compiles on a cache miss
            compiled = dict(zip(unique, pool.map(lambda ks: codegen.compile_source(ks, arch), unique.values())))
        loaded = {key: compiled[key].function(ks.function) for key, ks in unique.items()}
        for name, ks in self.plan.sources.items():
            self._functions[name] = loaded[ks.key]
        g = self.plan.graph
        used = {v for n in g.nodes for v in n.inputs if v in g.constants}
        arrays = {name: np.ascontiguousarray(g.constants[name]) for name in sorted(used)}
        total = 0
        offsets = {}
        for name, arr in arrays.items():
            offsets[name] = total
            total += (arr.nbytes + 255) // 256 * 256
        self._weights = cupy.cuda.alloc(max(total, 1))
        base = int(self._weights.ptr)
        for name, arr in arrays.items():
            if arr.nbytes:
                cupy.cuda.runtime.memcpy(base + offsets[name], arr.ctypes.data, arr.nbytes, cupy.cuda.runtime.memcpyHostToDevice)
            self._const_ptr[name] = base + offsets[name]


class IExecutionContext:
    """Runs an engine (``tensorrt.IExecutionContext`` subset; see the module docstring)."""

    def __init__(self, engine: ICudaEngine):
        self.engine = engine
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._addresses: dict[str, int] = {}
        self._memory = 0
        self._memory_size = 0
        self._own_memory: Any = None
        self._prepared: OrderedDict[Any, list[Step]] = OrderedDict()
        #: most launch lists kept (LRU over the shape / address combinations met)
        self.max_prepared = MAX_PREPARED
        #: launch lists prepared (cache misses) and their host seconds
        self.num_prepares = 0
        self.prepare_seconds = 0.0
        self._cublas: Cublas | None = None
        self._lt: Lt | None = None  # made at the first cuBLASLt tactic, sharing the cuBLAS workspace
        self.name = ""

    # TensorRT API ------------------------------------------------------------------------
    def set_input_shape(self, name: str, shape: Sequence[int]) -> bool:
        """Set an input's shape; False (as TensorRT) when it is no input or outside the profile."""
        g = self.engine.plan.graph
        if name not in g.inputs:
            return False
        shape = tuple(int(d) for d in shape)
        static = g.values[name].shape
        if len(shape) != len(static) or any(s != -1 and s != d for s, d in zip(static, shape)):
            return False
        prof = self.engine.plan.profile.get(name)
        if prof is not None and any(not (lo <= d <= hi) for lo, d, hi in zip(prof[0], shape, prof[2])):
            return False
        self._shapes[name] = shape
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        """The concrete shape of ``name`` for the input shapes set (static shape with -1 where unknown)."""
        if name in self._shapes:
            return self._shapes[name]
        try:
            return self._infer()[name]
        except (NetworkError, KeyError):
            return tuple(self.engine.get_tensor_shape(name))

    def infer_shapes(self) -> list[str]:
        """Names of inputs whose shapes are still unknown (TensorRT's return value)."""
        g = self.engine.plan.graph
        missing = [n for n in g.inputs if n not in self._shapes and -1 in g.values[n].shape]
        return missing

    @property
    def all_binding_shapes_specified(self) -> bool:
        """Whether every dynamic input has a shape."""
        return not self.infer_shapes()

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        """Bind ``name`` (an I/O tensor) to device address ``ptr``; False for other names."""
        if name not in self.engine._io:
            return False
        self._addresses[name] = int(ptr)
        return True

    def get_tensor_address(self, name: str) -> int:
        """The address bound to ``name`` (0 if none)."""
        return self._addresses.get(name, 0)

    def set_device_memory(self, memory: int, size: int) -> None:
        """Use ``size`` bytes at ``memory`` for activations (at least ``device_memory_size_v2``)."""
        if int(size) < self.engine.device_memory_size_v2:
            raise EngineExecutionError(f"device memory of {size} bytes given; the engine needs {self.engine.device_memory_size_v2}")
        self._memory, self._memory_size = int(memory), int(size)

    @property
    def device_memory(self) -> int:
        """The activation block's address (TensorRT's deprecated setter form too)."""
        return self._memory

    @device_memory.setter
    def device_memory(self, memory: int) -> None:
        self._memory, self._memory_size = int(memory), self.engine.device_memory_size_v2

    def set_optimization_profile_async(self, index: int, stream: int) -> bool:
        """Only profile 0 exists: True for 0, else False."""
        return index == 0

    def execute_async_v3(self, stream_handle: int) -> bool:
        """Enqueue one execution on ``stream_handle`` (no synchronization, no allocation after
        the first call for these shapes and addresses)."""
        steps = self._steps()
        stream = int(stream_handle)
        for step in steps:
            self._launch(step, stream)
        return True

    # preparation ---------------------------------------------------------------------------
    def _infer(self) -> dict[str, tuple[int, ...]]:
        g = self.engine.plan.graph
        shapes = dict(self._shapes)
        for n in g.inputs:
            if n not in shapes:
                if -1 in g.values[n].shape:
                    raise EngineExecutionError(f"no shape set for input {n!r}; call set_input_shape")
                shapes[n] = tuple(g.values[n].shape)
        return infer_shapes(g, shapes)

    def prepare_launches(self) -> int:
        """Prepare (and keep) the launch list for the current shapes and addresses without
        enqueueing anything -- what the first ``execute_async_v3`` for them would do first
        (a trtcore extension: a server warms the shapes it will meet); returns the launches.

        Raises:
            EngineExecutionError: as :meth:`prepare`.
        """
        return len(self._steps())

    def _steps(self) -> list[Step]:
        key = (tuple(sorted(self._shapes.items())), tuple(sorted(self._addresses.items())), self._memory)
        steps = self._prepared.get(key)
        if steps is not None:
            self._prepared.move_to_end(key)
        else:
            t0 = time.perf_counter()
            self.engine._load()
            if self._cublas is None:
                ws = self._memory + self.engine.plan.offsets["workspace:cublas"]
                self._cublas = Cublas(ws, self.engine.plan.sizes["workspace:cublas"])
            steps = self.prepare(self.engine._const_ptr)
            for step in steps:  # cuBLASLt descriptors now, not while enqueueing
                for call, tactic in zip(step.calls, step.tactics):
                    if tactic["kind"] == "lt":
                        if self._lt is None:
                            self._lt = Lt(self._cublas.workspace, self._cublas.workspace_size)
                        self._lt.descriptors(call, step.dtype)
            self._prepared[key] = steps
            while len(self._prepared) > max(int(self.max_prepared), 1):
                self._prepared.popitem(last=False)
            self.num_prepares += 1
            self.prepare_seconds += time.perf_counter() - t0
        return steps

    def prepare(self, const_ptr: dict[str, int], tuned: bool = True) -> list[Step]:
        """The launches of one execution for the current shapes and addresses (host only);
        GEMMs run the plan's tactics (``tuned``) or ``cublasGemmEx``.

        Raises:
            EngineExecutionError: an input shape or address is missing, a shape needs more
                memory than planned, or a view needs a copy the plan has no room for.
        """
        plan = self.engine.plan
        g = plan.graph
        shapes = self._infer()
        if not self._memory:
            raise EngineExecutionError("no device memory: call set_device_memory or use create_execution_context")
        for name in list(g.inputs) + list(g.outputs):
            if name not in self._addresses and name not in g.aliases:
                raise EngineExecutionError(f"no address set for tensor {name!r}; call set_tensor_address")
        for name in plan.offsets:
            if name.startswith("workspace:"):
                continue
            need = int(math.prod(shapes[name])) * g.values[name].dtype.itemsize
            if need > plan.sizes[name]:
                raise EngineExecutionError(f"tensor {name!r} of shape {shapes[name]} needs {need} bytes, the plan has {plan.sizes[name]}")
        addr: dict[str, int] = {}
        lay: dict[str, Layout] = {}
        for name in g.inputs:
            addr[name], lay[name] = self._addresses[name], (0, dense_strides(shapes[name]))
        for name, p in const_ptr.items():
            addr[name], lay[name] = p, (0, dense_strides(shapes[name]))
        for name, out in g.aliases.items():
            addr[name], lay[name] = addr[out], lay[out]
        base = self._memory

        def own(v: str) -> None:
            if v in addr:
                return
            if v in self._addresses:
                addr[v] = self._addresses[v]
            else:
                addr[v] = base + plan.offsets[v]
            lay[v] = (0, dense_strides(shapes[v]))

        def ptr(v: str) -> int:
            off, _ = lay[v]
            return addr[v] + off * g.values[v].dtype.itemsize

        steps: list[Step] = []
        for node in g.nodes:
            op = node.op
            if op == "view":
                src = node.inputs[0]
                res = apply_stages(node.attrs["stages"], shapes[src], lay[src])
                if res is None:
                    raise EngineExecutionError(f"view {node.name!r} needs a copy for shape {shapes[src]}")
                addr[node.outputs[0]], lay[node.outputs[0]] = addr[src], res[1]
                continue
            if op == "copy" and node.attrs.get("if_needed") and is_dense(shapes[node.inputs[0]], lay[node.inputs[0]][1]):
                src, dst = node.inputs[0], node.outputs[0]
                addr[dst], lay[dst] = addr[src], lay[src]
                continue
            for o in node.outputs:
                own(o)
            step = self._step(node, shapes, lay, ptr, tuned)
            prologue = node.attrs.get("prologue") if op == "matmul" else None
            if prologue and step.name.endswith(("#gemv", "#gemv1")) and steps and steps[-1].name == prologue and steps[-1].kind == "kernel":
                fused = self._fused_gemv(node, step, steps[-1])
                if fused is not None:
                    steps[-1] = fused
                    continue
            steps.append(step)
        return steps

    def _fused_gemv(self, node: Any, gemv: Step, producer: Step) -> Step | None:
        """One launch for the GEMV ``gemv`` with the ``producer`` launch right before it fused
        in front (:func:`trtcore.cuda.codegen.gemv_prologue`; the one-row kernel for one
        row), or None when the plan has no such kernel, its input is not dense rows, or every
        block recomputing the producer costs more than the launch it saves
        (:data:`~trtcore.cuda.codegen.PROLOGUE_MAX_WORK`)."""
        # gemv args: y, w, x, M, N, K, ldw, ldx, ldy
        m_rows, k, ldx = gemv.args[3][0], gemv.args[5][0], gemv.args[7][0]
        name = f"{gemv.name}_prologue"
        if ldx != k or name not in self.engine.plan.sources or gemv.grid[0] * m_rows * k > codegen.PROLOGUE_MAX_WORK:
            return None
        args = producer.args + gemv.args[:2] + gemv.args[3:]
        return Step("kernel", name, gemv.grid, gemv.block, gemv.shared_mem, args)

    def _step(self, node: Any, shapes: dict[str, tuple[int, ...]], lay: dict[str, Layout], ptr: Any, tuned: bool = True) -> Step:
        plan = self.engine.plan
        g = plan.graph
        op = node.op
        dt = g.values[node.outputs[0]].dtype if node.outputs else DataType.FLOAT

        def bstrides(v: str, domain: tuple[int, ...]) -> list[int]:
            s, st = shapes[v], lay[v][1]
            return [st[d] if s[d] == domain[d] else 0 for d in range(len(domain))]

        if op == "matmul":
            a, b = node.inputs
            calls = plan_gemm(shapes[a], lay[a][1], shapes[b], lay[b][1], node.attrs["transpose_a"], node.attrs["transpose_b"])
            if calls is None:
                raise EngineExecutionError(f"GEMM {node.name!r}: operand strides suit no cuBLAS layout for shapes {shapes[a]}, {shapes[b]}")
            chosen = [self.engine.tactic(signature(c, dt)) if tuned else {"kind": "cublas"} for c in calls]
            override = _gemm_override() if tuned else "0"
            if override == "0":
                chosen = [{"kind": "cublas"} for _ in calls]
            # one token row: the kernel specialized for it (fewer registers), where the plan has it
            kernel = f"{node.name}#gemv1" if calls[0].n == 1 and f"{node.name}#gemv1" in plan.sources else f"{node.name}#gemv"
            aligned = ptr(a) % 16 == 0 and ptr(b) % 16 == 0  # the GEMV's 16-byte loads
            if (
                kernel in plan.sources
                and aligned
                and len(calls) == 1
                and gemv_applies(calls[0], dt.itemsize)
                and (override == "1" or (override is None and chosen[0]["kind"] == "gemv"))
            ):
                grid, block, smem, args = gemv_launch(calls[0], dt.itemsize, ptr(node.outputs[0]), ptr(b), ptr(a))
                return Step("kernel", kernel, grid, block, smem, args)
            chosen = [t if t["kind"] == "lt" else {"kind": "cublas"} for t in chosen]
            return Step("gemm", node.name, calls=calls, ptrs=(ptr(b), ptr(a), ptr(node.outputs[0])), dtype=dt, tactics=chosen)
        if op == "plugin":
            # what trtcore.plugins.base.DeviceTensor holds (plugins sit above this layer)
            def dev(v: str) -> SimpleNamespace:
                shape = tuple(int(d) for d in shapes[v])
                return SimpleNamespace(ptr=ptr(v), shape=shape, dtype=np.dtype(nptype(g.values[v].dtype)), size=int(math.prod(shape)))

            ins = [dev(v) for v in node.inputs if v]
            outs = [dev(o) for o in node.outputs]
            ws_name = f"workspace:{node.name}"
            ws = self._memory + plan.offsets[ws_name] if ws_name in plan.offsets else 0
            return Step("plugin", node.name, plugin=node.attrs["plugin"], tensors=(ins, outs, ws))
        ks = plan.sources[node.name]
        roles: dict[str, int] = {}
        grid: tuple[int, int, int]
        block = ks.block
        smem = 0
        if op in ("pointwise_group", "copy", "row_group"):
            domain = shapes[node.attrs["domain"]] if op != "copy" else shapes[node.outputs[0]]
            roles.update(_per_axis("dim", domain))
            for v in node.inputs:
                roles.update(_per_axis(f"stride:{v}", bstrides(v, domain)))
        if op in ("pointwise_group", "copy"):
            roles["numel"] = int(math.prod(domain))
            grid = (_grid(codegen.pointwise_units(domain) * 32, block), 1, 1)  # a warp per unit
        elif op == "row_group":
            rows = int(math.prod(domain[:-1]))
            roles["rows"] = rows
            grid = (max(rows, 1), 1, 1)
            block = codegen.row_threads(rows, int(domain[-1]), len(node.inputs))
        elif op == "softmax":
            x = node.inputs[0]
            axis = node.attrs["axis"]
            order = [d for d in range(len(shapes[x])) if d != axis] + [axis]
            dims = [shapes[x][d] for d in order]
            xs = [lay[x][1][d] for d in order]
            os_ = [dense_strides(shapes[x])[d] for d in order]
            rows = int(math.prod(dims[:-1]))
            roles["rows"] = rows
            for d in range(len(dims)):
                roles[f"dim:{d}"], roles[f"stride:x:{d}"], roles[f"stride:o:{d}"] = dims[d], xs[d], os_[d]
            grid = (max(rows, 1), 1, 1)
        elif op == "reduce":
            x = node.inputs[0]
            axes = node.attrs["axes"]
            kept = [d for d in range(len(shapes[x])) if d not in axes]
            roles["numel"] = int(math.prod([shapes[x][d] for d in kept]))
            roles["count"] = int(math.prod([shapes[x][d] for d in axes]))
            for i, d in enumerate(kept):
                roles[f"kdim:{i}"], roles[f"kstride:{i}"] = shapes[x][d], lay[x][1][d]
            for i, d in enumerate(axes):
                roles[f"rdim:{i}"], roles[f"rstride:{i}"] = shapes[x][d], lay[x][1][d]
            grid = (_grid(roles["numel"], block), 1, 1)
        elif op == "gather":
            data, idx = node.inputs
            axis = node.attrs["axis"]
            ds, dst_ = shapes[data], lay[data][1]
            roles["numel"] = int(math.prod(shapes[node.outputs[0]]))
            roles["axis_len"], roles["axis_stride"] = ds[axis], dst_[axis]
            for d in range(axis):
                roles[f"gdim:pd{d}"], roles[f"gstride:ps{d}"] = ds[d], dst_[d]
            for d in range(len(shapes[idx])):
                roles[f"gdim:id{d}"], roles[f"gstride:is{d}"] = shapes[idx][d], lay[idx][1][d]
            for j, d in enumerate(range(axis + 1, len(ds))):
                roles[f"gdim:qd{j}"], roles[f"gstride:qs{j}"] = ds[d], dst_[d]
            grid = (_grid(roles["numel"], block), 1, 1)
        elif op == "concat":
            out = shapes[node.outputs[0]]
            axis = node.attrs["axis"]
            roles["numel"], roles["axis"] = int(math.prod(out)), axis
            roles.update(_per_axis("dim", out))
            for k, v in enumerate(node.inputs):
                roles[f"len:{k}"] = shapes[v][axis]
                roles.update(_per_axis(f"stride:{k}", lay[v][1]))
            grid = (_grid(roles["numel"], block), 1, 1)
        elif op == "kv_cache_update":
            cache, upd = node.inputs[0], node.inputs[1]
            B, H, S, D = shapes[upd]
            roles.update({"numel": B * H * S * D, "H": H, "S": S, "D": D, "L": shapes[cache][2]})
            roles.update(_per_axis("stride:1", lay[upd][1]))
            grid = (_grid(roles["numel"], block), 1, 1)
        elif op == "attention":
            q, k = node.inputs[0], node.inputs[1]
            B, Hq, S, D = shapes[q]
            T = shapes[k][2]
            roles.update({"Hq": Hq, "Hkv": shapes[k][1], "S": S, "T": T, "D": D, "causal": node.attrs["causal_kind"]})
            named = {"q": 0, "k": 1, "v": 2, "m": 3}
            for who, i in named.items():
                if i < len(node.inputs) and node.inputs[i]:
                    v = node.inputs[i]
                    roles.update(_per_axis(f"stride:{who}", [lay[v][1][d] if shapes[v][d] != 1 else 0 for d in range(4)]))
            grid = (max(S, 1), max(Hq, 1), max(B, 1))
            smem = max(T, 1) * 4
            if smem > 48 * 1024:
                raise EngineExecutionError(f"attention {node.name!r}: {T} keys need {smem} bytes of shared memory (at most 49152 here)")
        else:  # pragma: no cover - the builder makes no other kernel nodes
            raise EngineExecutionError(f"no launch rule for op {op!r}")
        args: list[tuple[int, str]] = []
        for _typ, role in ks.params:
            if role.startswith("out:"):
                args.append((ptr(role[4:]), "ptr"))
            elif role == "out":
                args.append((ptr(node.outputs[0]), "ptr"))
            elif role.startswith("in:"):
                ref = role[3:]
                v = node.inputs[int(ref)] if ref.isdigit() else ref
                args.append((ptr(v), "ptr"))
            else:
                args.append((int(roles[role]), "i64"))
        if op == "kv_cache_update":  # the cache is written in place
            args[0] = (ptr(node.inputs[0]), "ptr")
        numel = roles.get("numel", roles.get("rows", 1))
        return Step("kernel", node.name, grid, block, smem, args) if numel else Step("skip", node.name)

    def _launch(self, step: Step, stream: int) -> None:
        if step.kind == "kernel":  # every generated kernel waits for its predecessor first (codegen.PDL_ENTRY)
            fn = self.engine._functions[step.name]
            fn.launch(step.grid, step.block, step.args, shared_mem=step.shared_mem, stream=stream, programmatic=True)
        elif step.kind == "gemm":
            assert self._cublas is not None
            x, y, c = step.ptrs
            for call, tactic in zip(step.calls, step.tactics or [{"kind": "cublas"}] * len(step.calls)):
                if not (call.m and call.n):
                    continue
                if tactic["kind"] == "lt":
                    assert self._lt is not None  # made by _steps
                    self._lt.run(call, step.dtype, tactic["algo"], x, y, c, stream)
                else:
                    self._cublas.run(call, step.dtype, x, y, c, stream)
        elif step.kind == "plugin":
            ins, outs, ws = step.tensors
            step.plugin.enqueue(ins, outs, ws, stream)


class Runtime:
    """Deserializes cuda engines (``tensorrt.Runtime``)."""

    def __init__(self, logger: Logger | None = None):
        self.logger = logger or Logger()

    def deserialize_cuda_engine(self, serialized: bytes) -> ICudaEngine:
        """The engine of a plan from ``Builder.build_serialized_network``.

        Raises:
            NetworkError: the bytes are no trtcore cuda plan.
        """
        return ICudaEngine(loads(serialized))


__all__ = ["EngineExecutionError", "ICudaEngine", "IExecutionContext", "Runtime", "Step", "math"]
