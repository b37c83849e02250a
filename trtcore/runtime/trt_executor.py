"""The TensorRT engine executor: a serialized engine run through ``IExecutionContext``.

``TensorRTExecutor(trt_module, serialized_engine)`` deserializes the engine with
``trt_module.Runtime`` (``trt_module`` is what :func:`trtcore.trt.load_trt` returned:
``tensorrt`` or ``tensorrt_rtx``), and every :meth:`~TensorRTExecutor.run`

1. checks and casts the host inputs (rank, static dims, dtype of the engine),
2. sets the input shapes (``set_input_shape``) and reads the output shapes back
   (``get_tensor_shape``),
3. copies the inputs to device buffers from a grow-only pool on one CUDA stream,
4. binds every I/O tensor (``set_tensor_address``; an output that the engine says aliases
   an input, ``get_aliased_input_tensor``, e.g. an ``IKVCacheUpdateLayer``'s updated cache,
   gets that input's buffer), runs ``execute_async_v3``,
5. copies the outputs back and synchronizes the stream.

CUDA is driven through ``cuda.bindings.runtime``; every call's status is checked
(:func:`trtcore.gpu.check`) and a failure raises :class:`trtcore.gpu.CudaError` with the
``cudaError_t`` name. TensorRT's messages go to :func:`trtcore.log.trt_logger`. Not thread-safe: one
executor per thread (or a lock around :meth:`run`). Only optimization profile 0 is used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from cuda.bindings import runtime as cudart

from .. import gpu
from ..dtypes import numpy_dtype
from ..gpu import CudaError, describe_device
from ..gpu import check as cuda_check
from ..log import trt_logger
from .executor import Executor

if TYPE_CHECKING:  # the stubs (tensorrt-stubs) type the calls; nothing is imported at run time
    import tensorrt as trt_types

__all__ = [
    "CudaError",
    "DeviceBufferPool",
    "TensorRTExecutor",
    "check_input",
    "cuda_check",
    "deserialize_failure",
    "numpy_dtype",
    "open_device_runner",
    "require_gpu",
]

_ALIGNMENT = 256  # bytes; cudaMalloc aligns to at least this, and no buffer is empty


def require_gpu(device: int = 0, backend: str = "tensorrt", purpose: str | None = None) -> None:
    """Check that CUDA device ``device`` is usable, before spending time on an engine build.

    Args:
        purpose: the message's start (an engine file's: :meth:`~trtcore.engine_file.EngineFile.cpu_advice`);
            default: ``backend`` runs on a GPU, and the reference backend on the CPU.

    Raises:
        trtcore.gpu.NoGPUError: no driver, no GPU, or no device ``device`` (a :class:`CudaError`);
            the message names ``backend`` and the one that runs on the CPU.
    """
    gpu.require_gpu(device, purpose or f"backend {backend!r} runs its engine on a CUDA GPU (on the CPU use backend 'reference')")


def check_input(name: str, array: Any, expected_shape: Sequence[int], dtype: np.dtype[Any]) -> np.ndarray:
    """Validate one host input against the engine's declared shape and cast it to ``dtype``.

    ``expected_shape`` is the engine's shape for the tensor, -1 for a dynamic dimension.
    Returns a C-contiguous array of ``dtype``.

    Raises:
        ValueError: wrong rank, a static dimension differs, or the cast would change the kind
            of the values (float -> int, say); the message names the tensor.
    """
    arr = np.asarray(array)
    expected = tuple(int(d) for d in expected_shape)
    if arr.ndim != len(expected) or any(e >= 0 and e != f for e, f in zip(expected, arr.shape)):
        raise ValueError(f"input {name!r}: expected shape {_fmt_shape(expected)} (-1 = any size), found {tuple(arr.shape)}")
    if arr.dtype != dtype:
        if not np.can_cast(arr.dtype, dtype, casting="same_kind"):
            raise ValueError(f"input {name!r}: cannot cast {arr.dtype} to the engine's {dtype} without changing its kind")
        arr = arr.astype(dtype)
    return np.ascontiguousarray(arr)


def _dims(dims: trt_types.Dims) -> tuple[int, ...]:
    """A TensorRT ``Dims`` as a tuple of ints (-1 for a dynamic dimension)."""
    return tuple(int(dims[i]) for i in range(len(dims)))


def _fmt_shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def deserialize_failure(trt_module: Any, device: int, said: str = "") -> str:
    """Why ``trt_module`` could not deserialize an engine on CUDA device ``device`` (``said``:
    TensorRT's own messages, ``"; TensorRT said: ..."``), with the usual causes."""
    module = getattr(trt_module, "__name__", repr(trt_module))
    version = getattr(trt_module, "__version__", "?")
    where = f"device {device}"
    try:
        where += f" ({describe_device(device)})"
    except Exception:  # pragma: no cover - the message is still useful without it
        pass
    text = f"{module} {version} could not deserialize the engine on {where}{said}."
    capabilities = getattr(trt_module, "ComputeCapability", None)
    if capabilities is not None:  # TensorRT-RTX: AOT engines for RTX-class GPUs only
        sms = [n for n in dir(capabilities) if n.startswith("SM")]
        text += (
            f" TensorRT-RTX runs only on RTX-class GPUs ({', '.join(sms)}) and refuses compute "
            "capability 9.0 (H100/H200); build for this GPU's capability, or use the tensorrt "
            "backend or the reference executor there."
        )
    else:
        text += " The engine must come from the same TensorRT version and suit this GPU."
    return text


def open_device_runner(trt_module: Any, serialized_engine: bytes, mode: Any, *, device: int = 0, **options: Any) -> Any:
    """Deserialize ``serialized_engine`` with ``trt_module`` (``tensorrt`` or the cuda backend)
    and start the device executor over it
    (:class:`~trtcore.runtime.device_runner.DeviceRunner`, paged KV cache ``mode``) on CUDA
    device ``device``; ``options`` go to the runner (``gpu_memory_utilization``,
    ``kv_cache_memory``, ``num_blocks``, ``enforce_eager``). The weights' device bytes are
    measured around deserialization and loading (``cudaMemGetInfo``).

    Raises:
        NoGPUError: no usable GPU.
        RuntimeError: the engine cannot be deserialized here (see :func:`deserialize_failure`).
        trtcore.runtime.device_runner.DeviceRunnerError: the runner cannot start.
    """
    from trtcore.plugins import register_all

    from .device_memory import CudaDevice
    from .device_runner import DeviceRunner

    gpu.require_gpu(device, "the device executor needs a CUDA GPU")
    dev = CudaDevice(device)
    try:
        free0, _ = dev.mem_get_info()
        logger = trt_logger(trt_module)
        logger.messages.clear()
        runtime = trt_module.Runtime(logger)
        register_all(trt_module)
        engine = runtime.deserialize_cuda_engine(serialized_engine)
        if engine is None:
            said = ("; TensorRT said: " + " | ".join(logger.messages)) if logger.messages else ""
            raise RuntimeError(deserialize_failure(trt_module, device, said))
        load = getattr(engine, "_load", None)  # the cuda backend uploads its weights lazily: now
        if load is not None:
            load()
        free1, _ = dev.mem_get_info()
        runner = DeviceRunner(engine, dev, mode, weights_bytes=max(0, free0 - free1), **options)
    except BaseException:
        dev.close()
        raise
    runner.runtime = runtime  # the runtime outlives its engine (TensorRT's rule)
    return runner


class DeviceBufferPool:
    """Grow-only device buffers keyed by name: reused while big enough, reallocated when not."""

    def __init__(self) -> None:
        self._buffers: dict[str, tuple[int, int]] = {}  # name -> (device pointer, capacity)

    def get(self, key: str, nbytes: int) -> int:
        """A device pointer to at least ``nbytes`` bytes for ``key`` (never null)."""
        current = self._buffers.get(key)
        if current is not None and current[1] >= nbytes:
            return current[0]
        if current is not None:
            del self._buffers[key]
            cuda_check(cudart.cudaFree(current[0]), f"cudaFree of the buffer for {key!r}")
        size = max(_ALIGNMENT, -(-nbytes // _ALIGNMENT) * _ALIGNMENT)
        ptr = int(cuda_check(cudart.cudaMalloc(size), f"cudaMalloc({size}) for {key!r}"))
        self._buffers[key] = (ptr, size)
        return ptr

    @property
    def nbytes(self) -> int:
        """Device bytes held."""
        return sum(size for _, size in self._buffers.values())

    def free(self) -> None:
        """Free every buffer; raises the first CudaError after trying them all."""
        buffers, self._buffers = self._buffers, {}
        first: CudaError | None = None
        for key, (ptr, _) in buffers.items():
            try:
                cuda_check(cudart.cudaFree(ptr), f"cudaFree of the buffer for {key!r}")
            except CudaError as exc:
                first = first or exc
        if first is not None:
            raise first


class TensorRTExecutor(Executor):
    """Runs a serialized TensorRT engine on host arrays (see the module docstring).

    Args:
        trt_module: ``tensorrt`` or ``tensorrt_rtx``, as :func:`trtcore.trt.load_trt` returns it.
        serialized_engine: the engine (``bytes``, or any buffer such as ``IHostMemory``).
        device: CUDA device ordinal.

    Raises:
        CudaError: no usable CUDA device / driver (the message names the ``cudaError_t``).
        RuntimeError: the engine cannot be deserialized here (TensorRT's own errors and the
            device's compute capability are in the message), or no execution context.
        TypeError: ``trt_module`` has no TensorRT runtime, or an I/O dtype has no NumPy form.
    """

    def __init__(self, trt_module: Any, serialized_engine: bytes, *, device: int = 0) -> None:
        self._closed = True  # until the stream exists, so close() / __del__ have nothing to do
        self._pool = DeviceBufferPool()
        self._stream: Any = None
        self.device = device
        self._trt = trt_module
        self.input_names = []
        self.output_names = []
        module = getattr(trt_module, "__name__", repr(trt_module))
        if not hasattr(trt_module, "Runtime"):
            raise TypeError(
                f"{module} has no TensorRT runtime; TensorRTExecutor needs tensorrt or tensorrt_rtx "
                "(use the reference executor for the reference backend)"
            )
        # CUDA first: without a GPU/driver, say so, rather than TensorRT's "engine is None".
        count = gpu.require_gpu(0, "TensorRTExecutor needs a CUDA GPU")
        if not 0 <= device < count:
            raise ValueError(f"CUDA device {device} does not exist ({count} device(s) visible)")
        cuda_check(cudart.cudaSetDevice(device), f"cudaSetDevice({device})")
        self._stream = cuda_check(cudart.cudaStreamCreate(), "cudaStreamCreate")
        self._closed = False
        try:
            self._logger = trt_logger(trt_module)
            self._logger.messages.clear()  # the process's logger: forget earlier operations
            self._runtime: trt_types.Runtime = trt_module.Runtime(self._logger)
            from trtcore.plugins import register_all

            register_all(trt_module)  # an engine with trtcore plugins needs their creators first
            engine: trt_types.ICudaEngine | None = self._runtime.deserialize_cuda_engine(serialized_engine)
            if engine is None:
                raise RuntimeError(self._deserialize_failure(module))
            self._engine: trt_types.ICudaEngine = engine
            context: trt_types.IExecutionContext | None = engine.create_execution_context()
            if context is None:
                raise RuntimeError(f"{module}: create_execution_context() failed{self._tensorrt_said()}")
            self._context: trt_types.IExecutionContext = context
            self._dtypes: dict[str, np.dtype[Any]] = {}
            for i in range(engine.num_io_tensors):
                name = engine.get_tensor_name(i)
                if engine.is_shape_inference_io(name):
                    raise NotImplementedError(f"engine I/O tensor {name!r} is a shape tensor; TensorRTExecutor does not bind those")
                self._dtypes[name] = numpy_dtype(engine.get_tensor_dtype(name))
                mode = engine.get_tensor_mode(name)
                if mode == trt_module.TensorIOMode.INPUT:
                    self.input_names.append(name)
                elif mode == trt_module.TensorIOMode.OUTPUT:
                    self.output_names.append(name)
            # outputs updated in place in an input's memory (IKVCacheUpdateLayer's cache,
            # TensorRT 10.15+ / TensorRT-RTX): bound to that input's buffer, as TensorRT requires
            self._aliases: dict[str, str] = {}
            aliased_input = getattr(engine, "get_aliased_input_tensor", None)
            if aliased_input is not None:
                for name in self.output_names:
                    source = aliased_input(name)
                    if source:
                        self._aliases[name] = str(source)
        except BaseException:
            self.close()
            raise

    # --- errors -------------------------------------------------------------------------

    def _tensorrt_said(self) -> str:
        logger = getattr(self, "_logger", None)
        messages = list(logger.messages) if logger is not None else []
        return ("; TensorRT said: " + " | ".join(messages)) if messages else ""

    def _deserialize_failure(self, module: str) -> str:
        return deserialize_failure(self._trt, self.device, self._tensorrt_said())

    def _profile_failure(self, name: str, shape: tuple[int, ...]) -> str:
        text = f"input {name!r}: shape {shape} is not accepted by the engine"
        try:
            low, opt, high = self._engine.get_tensor_profile_shape(name, 0)
            text += f" (optimization profile 0: min {_fmt_shape(_dims(low))}, opt {_fmt_shape(_dims(opt))}, max {_fmt_shape(_dims(high))})"
        except Exception:  # pragma: no cover - no profile information
            pass
        return text + self._tensorrt_said()

    # --- running ------------------------------------------------------------------------

    def _bind(self, name: str, ptr: int) -> None:
        if not self._context.set_tensor_address(name, ptr):
            raise RuntimeError(f"set_tensor_address({name!r}) failed{self._tensorrt_said()}")

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._closed:
            raise RuntimeError("this TensorRTExecutor is closed")
        missing = [n for n in self.input_names if n not in feeds]
        unknown = [n for n in feeds if n not in self._dtypes or n in self.output_names]
        if missing or unknown:
            raise ValueError(f"feeds must name exactly the engine inputs {self.input_names}; missing {missing}, unknown {unknown}")
        hosts = {name: check_input(name, feeds[name], _dims(self._engine.get_tensor_shape(name)), self._dtypes[name]) for name in self.input_names}
        self._logger.messages.clear()
        cuda_check(cudart.cudaSetDevice(self.device), f"cudaSetDevice({self.device})")
        for name, arr in hosts.items():
            if not self._context.set_input_shape(name, arr.shape):
                raise ValueError(self._profile_failure(name, arr.shape))

        outputs: dict[str, np.ndarray] = {}
        for name in self.output_names:
            shape = _dims(self._context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise RuntimeError(
                    f"output {name!r} has shape {shape} after setting the inputs: a data-dependent shape "
                    f"(needs an IOutputAllocator, not supported) or inconsistent inputs{self._tensorrt_said()}"
                )
            outputs[name] = np.empty(shape, dtype=self._dtypes[name])

        h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        for name, arr in hosts.items():
            ptr = self._pool.get(name, arr.nbytes)
            if arr.nbytes:
                cuda_check(
                    cudart.cudaMemcpyAsync(ptr, arr.ctypes.data, arr.nbytes, h2d, self._stream),
                    f"cudaMemcpyAsync (host to device) of input {name!r}",
                )
            self._bind(name, ptr)
        for name, out in outputs.items():
            self._bind(name, self._pool.get(self._aliases.get(name, name), out.nbytes))

        if not self._context.execute_async_v3(int(self._stream)):
            raise RuntimeError(f"execute_async_v3 failed{self._tensorrt_said()}")

        d2h = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for name, out in outputs.items():
            if out.nbytes:
                cuda_check(
                    cudart.cudaMemcpyAsync(out.ctypes.data, self._pool.get(self._aliases.get(name, name), out.nbytes), out.nbytes, d2h, self._stream),
                    f"cudaMemcpyAsync (device to host) of output {name!r}",
                )
        cuda_check(cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize after execute_async_v3")
        del hosts  # the host inputs stay alive until the copies are done
        return outputs

    # --- cleanup ------------------------------------------------------------------------

    def close(self) -> None:
        """Release the execution context, engine, device buffers and stream. Idempotent."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        for attr in ("_context", "_engine", "_runtime"):  # context before engine before runtime
            if hasattr(self, attr):
                delattr(self, attr)
        first: CudaError | None = None
        try:
            cudart.cudaSetDevice(self.device)
            cudart.cudaStreamSynchronize(self._stream)
            self._pool.free()
        except CudaError as exc:
            first = exc
        if self._stream is not None:
            stream, self._stream = self._stream, None
            try:
                cuda_check(cudart.cudaStreamDestroy(stream), "cudaStreamDestroy")
            except CudaError as exc:
                first = first or exc
        if first is not None:
            raise first

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing sensible to do in a finalizer
            pass

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"device {self.device}"
        return f"TensorRTExecutor(inputs={self.input_names}, outputs={self.output_names}, {state})"
