"""TensorRT's runtime API over a reference network on a :class:`~trtcore.runtime.device_memory.HostDevice`:
the stand-in that lets the device executor (:mod:`trtcore.runtime.device_runner`) run, and be
tested, on the CPU with the reference backend.

:class:`HostEngine` answers what the executor asks an ``ICudaEngine`` (I/O names, modes,
dtypes, ``device_memory_size_v2``, execution contexts); :class:`HostExecutionContext` keeps
``set_input_shape`` / ``set_tensor_address`` / ``set_device_memory`` as TensorRT does and, on
``execute_async_v3``, enqueues on the device one evaluation of the network by the reference
evaluator (:class:`trtcore.runtime.reference_executor.ReferenceExecutor`): it reads every input
from its bound address with the shapes set at enqueue time, the KV pool in place (the paged
attention plugin's reference writes into it), and writes the outputs to their bound addresses.
Captured into a "graph" it runs at each replay, reading whatever the buffers hold then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..dtypes import numpy_dtype
from ..reference.builder import ICudaEngine
from .device_memory import HostDevice
from .reference_executor import ReferenceExecutor

__all__ = ["HostEngine", "HostExecutionContext"]


class HostEngine:
    """A reference ``ICudaEngine`` with the runtime side the device executor uses.

    Args:
        engine: the reference engine (``build_reference_engine``).
        device: the host device whose addresses the contexts read and write.

    Attributes:
        num_executions: ``execute_async_v3`` evaluations run so far (not counting captures).
    """

    #: activation bytes an execution context needs (the evaluator allocates its own temporaries)
    device_memory_size_v2 = 0

    def __init__(self, engine: ICudaEngine, device: HostDevice) -> None:
        self.engine = engine
        self.device = device
        self.executor = ReferenceExecutor(engine)
        self.num_executions = 0

    def __getattr__(self, name: str) -> Any:  # the ICudaEngine queries
        return getattr(self.engine, name)

    def create_execution_context_without_device_memory(self) -> HostExecutionContext:
        """A context (``set_device_memory`` then binds its activation block)."""
        return HostExecutionContext(self)


class HostExecutionContext:
    """``IExecutionContext`` on host memory (see the module docstring)."""

    def __init__(self, engine: HostEngine) -> None:
        self.engine = engine
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._addresses: dict[str, int] = {}
        self.device_memory = 0
        self._inputs = [n for n in engine.executor.input_names]
        self._outputs = [n for n in engine.executor.output_names]

    def set_input_shape(self, name: str, shape: Sequence[int]) -> bool:
        """False for a name that is no input or a shape outside optimization profile 0."""
        if name not in self._inputs:
            return False
        shape = tuple(int(d) for d in shape)
        profile = self.engine.executor.profile
        if profile is not None and name in profile._shapes:
            lo, _, hi = profile._shapes[name]
            if len(shape) != len(lo) or any(not a <= s <= b for a, s, b in zip(lo, shape, hi)):
                return False
        self._shapes[name] = shape
        return True

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        """Bind an I/O tensor to an address of the host device; False for other names."""
        if name not in self._inputs and name not in self._outputs:
            return False
        self._addresses[name] = int(ptr)
        return True

    def set_device_memory(self, memory: int, size: int) -> None:
        """Record the activation block (unused: the evaluator keeps its own)."""
        self.device_memory = int(memory)

    def execute_async_v3(self, stream_handle: int) -> bool:
        """Enqueue one evaluation with the shapes and addresses bound now."""
        missing = [n for n in self._inputs if n not in self._shapes or n not in self._addresses]
        if missing or any(n not in self._addresses for n in self._outputs):
            return False
        engine, device = self.engine, self.engine.device
        bound = [(n, self._addresses[n], self._shapes[n], numpy_dtype(engine.get_tensor_dtype(n))) for n in self._inputs]
        outputs = [(n, self._addresses[n], numpy_dtype(engine.get_tensor_dtype(n))) for n in self._outputs]

        def run() -> None:
            feeds = {n: device.view(ptr, shape, dt) for n, ptr, shape, dt in bound}
            results = engine.executor.run(feeds)
            engine.num_executions += 1
            for n, ptr, dt in outputs:
                value = results[n]
                device.view(ptr, value.shape, dt)[...] = value

        device.enqueue(run)
        return True
