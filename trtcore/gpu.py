"""The one CUDA module: the error class, the status check and the GPU probe.

Everything in trtcore that talks to CUDA through ``cuda.bindings`` (the TensorRT executor,
the NVRTC kernels, ``setup_cuda.py``) or asks whether a GPU is there (the backend default,
the plugin test harness) goes through here::

    from trtcore import gpu

    ptr = gpu.check(cudart.cudaMalloc(1024), "cudaMalloc(1024)")   # value, or CudaError
    gpu.device_count()                  # 0 without cuda-python, driver or device; never raises
    ok, why = gpu.gpu_status()          # the same, as (usable, reason)
    ok, why = gpu.gpu_status(cupy=True) # ... as CuPy sees it (the plugin test harness)
    ok, why = gpu.cuda_backend_status() # can the cuda backend execute here (CuPy, nvmath, GPU)?
    gpu.require_gpu(0, "TensorRTExecutor needs a CUDA GPU")  # or NoGPUError naming the cudaError_t

Errors: :class:`CudaError` (a call failed; ``call`` and ``result`` name the API function and
the ``cudaError_t`` / ``CUresult``) and its subclass :class:`NoGPUError` (no driver, no device,
driver too old). Both derive from :class:`trtcore.errors.TrtcoreError` and ``RuntimeError``.
This module imports nothing above the error classes, so ``kernels/`` and ``plugins/`` may use it.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from .errors import TrtcoreError

__all__ = [
    "CUDAToolchainError",
    "CudaError",
    "NoGPUError",
    "call",
    "check",
    "compute_capability",
    "cuda_backend_status",
    "cuda_bindings",
    "describe_device",
    "device_count",
    "gpu_status",
    "require_gpu",
    "result_name",
]


class CudaError(TrtcoreError, RuntimeError):
    """A CUDA driver or runtime call failed (allocating, copying, loading a module, launching).

    Attributes:
        call: the API function, e.g. ``"cuLaunchKernel"`` (empty when not given).
        result: the error's name, e.g. ``"CUDA_ERROR_INVALID_VALUE"`` or ``"cudaErrorNoDevice"``
            (``None`` if the call raised instead of returning a code, e.g. ``libcuda`` missing).
    """

    def __init__(self, message: str, *, call: str = "", result: str | None = None) -> None:
        self.call = call
        self.result = result
        super().__init__(message)

    def __reduce__(self):  # picklable across processes, with its attributes
        return (_rebuild, (type(self), str(self), self.call, self.result))


def _rebuild(cls: type, message: str, call: str, result: str | None) -> CudaError:
    return cls(message, call=call, result=result)


class NoGPUError(CudaError):
    """No usable CUDA GPU: no driver, no device, or the driver is too old."""


class CUDAToolchainError(TrtcoreError, RuntimeError):
    """A CUDA library is not installed here: ``cuda-python``, the NVRTC library
    (``nvidia-cuda-nvrtc``), or a CUDA include directory with ``cuda_fp16.h``
    (``nvidia-cuda-runtime`` wheel or ``$CUDA_HOME/include``); the message says what to install."""


#: results that mean "there is no usable GPU here" rather than "this call went wrong"
_NO_GPU_RESULTS = frozenset({
    "cudaErrorNoDevice",
    "cudaErrorInsufficientDriver",
    "cudaErrorDevicesUnavailable",
    "cudaErrorCallRequiresNewerDriver",
    "CUDA_ERROR_NO_DEVICE",
    "CUDA_ERROR_NOT_INITIALIZED",
})  # fmt: skip


def cuda_bindings(module: str, install: str = "cuda-python") -> Any:
    """``cuda.bindings.<module>`` (``runtime``, ``driver``, ``nvrtc``).

    Raises:
        CUDAToolchainError: cuda-python is not installed; the message says
            ``pip install <install>``.
    """
    try:
        return importlib.import_module(f"cuda.bindings.{module}")
    except ImportError as exc:
        raise CUDAToolchainError(f"cuda.bindings.{module} is not available: cuda-python is not installed ({exc}); pip install {install}") from exc


def result_name(res: Any) -> str:
    """The name of a CUDA / NVRTC result code (``CUDA_ERROR_INVALID_VALUE``, ``cudaErrorNoDevice``...)."""
    return str(getattr(res, "name", res))


def _describe(err: Any) -> str:
    """CUDA's text for a ``cudaError_t`` or ``CUresult`` (``"?"`` where it has none)."""
    try:
        if type(err).__name__ == "CUresult":
            _, text = cuda_bindings("driver").cuGetErrorString(err)
        else:
            _, text = cuda_bindings("runtime").cudaGetErrorString(err)
    except Exception:  # noqa: BLE001 - a code the bindings do not know, or no libcuda
        return "?"
    return text.decode(errors="replace") if isinstance(text, bytes) else str(text)


def _call_name(what: str) -> str:
    """The CUDA API function named in ``what`` (``"cudaMalloc(16) for 'x'"`` -> ``"cudaMalloc"``)."""
    m = re.search(r"\bcu(?:da)?[A-Z]\w*", what)
    return m.group(0) if m else what


def check(result: tuple[Any, ...], what: str) -> Any:
    """Check the status of a ``cuda.bindings`` runtime or driver call and return its value(s).

    ``result`` is the tuple such a call returns, ``(status, *values)``: ``None`` comes back for
    no value, the value for one, the tuple of values for several.

    Raises:
        NoGPUError: the status says there is no usable GPU (``cudaErrorNoDevice``, ...).
        CudaError: any other failure; the message is ``"<what> failed: <name> (<CUDA's text>)"``.
    """
    err = result[0]
    if int(err) != 0:
        name = result_name(err)
        cls = NoGPUError if name in _NO_GPU_RESULTS else CudaError
        # CUDA's text for a machine with no NVIDIA driver at all reads as a version problem
        hint = "; also what CUDA reports where no NVIDIA driver is installed (no GPU here)" if name == "cudaErrorInsufficientDriver" else ""
        raise cls(f"{what} failed: {name} ({_describe(err)}{hint})", call=_call_name(what), result=name)
    values = result[1:]
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def call(what: str, fn: Any, *args: Any) -> Any:
    """``check(fn(*args), what)``, where ``fn`` raising (a CUDA library that cannot be
    loaded) becomes :class:`NoGPUError` too.

    Raises:
        NoGPUError, CudaError: as :func:`check`.
    """
    try:
        result = fn(*args)
    except Exception as exc:  # the bindings raise when libcuda cannot be loaded
        raise NoGPUError(f"{what} failed: {exc}", call=_call_name(what)) from exc
    return check(result, what)


# ---------------------------------------------------------------------------------------------
# the GPU probe
# ---------------------------------------------------------------------------------------------


def _cupy_count() -> int:
    try:
        import cupy
    except ImportError as exc:
        raise NoGPUError(f"CuPy is not installed ({exc})") from exc
    except Exception as exc:  # a broken install (missing CUDA libraries, ...)
        raise NoGPUError(f"CuPy does not import ({type(exc).__name__}: {exc})") from exc
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # cudaErrorNoDevice, cudaErrorInsufficientDriver, ...
        raise NoGPUError(f"CuPy finds no usable CUDA device ({type(exc).__name__}: {exc})") from exc


def _count(what: str, cupy: bool) -> int:
    """The number of visible CUDA devices, through CuPy or ``cuda.bindings``; NoGPUError if none can be counted."""
    if cupy:
        return _cupy_count()
    try:
        rt = cuda_bindings("runtime")
    except TrtcoreError as exc:
        raise NoGPUError(f"{what}: {exc}" if what else str(exc)) from exc
    return int(call(f"{what}: cudaGetDeviceCount" if what else "cudaGetDeviceCount", rt.cudaGetDeviceCount))


def gpu_status(*, cupy: bool = False) -> tuple[bool, str]:
    """``(usable, why)``: whether at least one CUDA GPU is visible; never raises.

    Args:
        cupy: ask CuPy (the plugin harness's and the cuda backend's device memory): also
            False when CuPy is missing or broken. Otherwise ask the CUDA runtime through ``cuda.bindings``.
    """
    try:
        n = _count("", cupy)
    except TrtcoreError as exc:
        return False, str(exc)
    if n < 1:
        return False, ("CuPy finds no CUDA device" if cupy else "the CUDA runtime finds no CUDA device")
    return True, f"{n} CUDA device(s)"


def cuda_backend_status() -> tuple[bool, str]:
    """``(usable, why)``: whether the cuda backend (:mod:`trtcore.cuda`) can execute here: a
    CUDA GPU that the CUDA runtime (``cuda.bindings``, which the executor drives) and CuPy
    (device memory) both see, and nvmath-python's cuBLAS bindings (the GEMMs). Never raises."""
    for probe in (lambda: gpu_status(), lambda: gpu_status(cupy=True)):
        ok, why = probe()
        if not ok:
            return False, why
    try:
        importlib.import_module("nvmath.bindings.cublas")
    except Exception as exc:  # ImportError, or a cuBLAS library that does not load
        return False, f"nvmath-python's cuBLAS bindings do not import ({type(exc).__name__}: {exc})"
    return True, "CuPy, nvmath-python and a CUDA GPU are there"


def device_count() -> int:
    """Number of CUDA GPUs visible through the CUDA runtime; 0 without cuda-python, driver or
    device (never raises)."""
    try:
        return max(0, _count("", False))
    except TrtcoreError:
        return 0


def require_gpu(device: int = 0, purpose: str = "this needs a CUDA GPU") -> int:
    """Check that CUDA device ``device`` is usable (before spending time on an engine build);
    return the number of visible devices.

    Raises:
        NoGPUError: no driver or no GPU (``"<purpose>: cudaGetDeviceCount failed: <cudaError_t> (...)"``),
            or no device ``device``.
    """
    count = _count(purpose, False)
    if not 0 <= device < count:
        raise NoGPUError(f"{purpose}: CUDA device {device} does not exist ({count} device(s) visible)")
    return count


def compute_capability(device: int | None = None) -> tuple[int, int]:
    """``(major, minor)`` of ``device`` (default: the CUDA runtime's current device).

    Raises:
        NoGPUError: no usable GPU (no driver, no device, driver too old).
        CudaError: another CUDA error (e.g. a bad device ordinal).
    """
    rt = cuda_bindings("runtime")
    if device is None:
        device = call("cudaGetDevice", rt.cudaGetDevice)
    attr = rt.cudaDeviceAttr
    major = call("cudaDeviceGetAttribute", rt.cudaDeviceGetAttribute, attr.cudaDevAttrComputeCapabilityMajor, device)
    minor = call("cudaDeviceGetAttribute", rt.cudaDeviceGetAttribute, attr.cudaDevAttrComputeCapabilityMinor, device)
    return int(major), int(minor)


def describe_device(device: int = 0) -> str:
    """``"<name>, compute capability X.Y"`` of ``device``, for messages.

    Raises:
        NoGPUError, CudaError: as :func:`check`.
    """
    rt = cuda_bindings("runtime")
    props = call("cudaGetDeviceProperties", rt.cudaGetDeviceProperties, device)
    name = props.name.decode(errors="replace").rstrip("\x00") if isinstance(props.name, bytes) else str(props.name)
    return f"{name}, compute capability {props.major}.{props.minor}"
