"""Exceptions raised by :mod:`trtcore.kernels`.

All derive from :class:`trtcore.errors.TrtcoreError` (catch everything trtcore raises at
once) and from the closest built-in exception. Bad arguments (an unknown kernel name, an
unparsable arch string, a malformed define or launch argument) raise
:class:`trtcore.errors.InvalidArgumentError` (a ``ValueError``) instead.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from trtcore.errors import TrtcoreError

__all__ = ["CUDAError", "CUDAToolchainError", "NVRTCError", "NoGPUError", "cuda_bindings", "result_name"]


def cuda_bindings(module: str, install: str = "cuda-python") -> Any:
    """``cuda.bindings.<module>`` (``runtime``, ``driver``, ``nvrtc``).

    Raises:
        CUDAToolchainError: cuda-python is not installed; the message says ``pip install <install>``.
    """
    try:
        return importlib.import_module(f"cuda.bindings.{module}")
    except ImportError as exc:
        raise CUDAToolchainError(f"cuda.bindings.{module} is not available: cuda-python is not installed ({exc}); pip install {install}") from exc


def result_name(res: Any) -> str:
    """The name of a CUDA / NVRTC result code (``CUDA_ERROR_INVALID_VALUE``...)."""
    return str(getattr(res, "name", res))


class CUDAToolchainError(TrtcoreError, RuntimeError):
    """Kernels cannot be compiled here at all: ``cuda-python`` is not installed, the NVRTC
    library (``nvidia-cuda-nvrtc``) cannot be loaded, or no CUDA include directory with
    ``cuda_fp16.h`` was found (``nvidia-cuda-runtime`` wheel or ``$CUDA_HOME/include``)."""


class NVRTCError(TrtcoreError, RuntimeError):
    """NVRTC failed to compile a kernel.

    ``str(err)`` holds the kernel, arch, defines, NVRTC's result code and NVRTC's complete
    log (compiler errors with file:line). The pieces are also attributes.

    Attributes:
        kernel: path of the ``.cu`` file.
        arch: target, e.g. ``"sm_90"``.
        defines: the ``-D`` macros, as given.
        options: the complete NVRTC option list.
        result: NVRTC's result name, e.g. ``"NVRTC_ERROR_COMPILATION"``.
        log: NVRTC's program log (empty if NVRTC gave none).
    """

    def __init__(self, kernel: str, arch: str, defines: Mapping[str, object], options: Sequence[str], result: str, log: str) -> None:
        self.kernel = kernel
        self.arch = arch
        self.defines = dict(defines)
        self.options = list(options)
        self.result = result
        self.log = log
        super().__init__(
            f"NVRTC could not compile {kernel} for {arch} with defines {self.defines} ({result}):\n{log.rstrip() or '(NVRTC gave no log)'}"
        )

    def __reduce__(self):  # picklable across processes
        return (type(self), (self.kernel, self.arch, self.defines, self.options, self.result, self.log))

    def first_error(self) -> str:
        """The first line of the log that reports an error (else the first non-empty line,
        else the result code): a one-line summary for command-line tools."""
        lines = [ln.strip() for ln in self.log.splitlines() if ln.strip()]
        for ln in lines:
            if "error" in ln.lower():
                return ln
        return lines[0] if lines else self.result


class CUDAError(TrtcoreError, RuntimeError):
    """A CUDA driver or runtime call failed (loading a module, launching a kernel, ...).

    Attributes:
        call: the API function, e.g. ``"cuLaunchKernel"``.
        result: the error's name, e.g. ``"CUDA_ERROR_INVALID_VALUE"`` (``None`` if the call
            raised instead of returning a code, e.g. when ``libcuda`` is missing).
    """

    def __init__(self, message: str, *, call: str = "", result: str | None = None) -> None:
        self.call = call
        self.result = result
        super().__init__(message)

    def __reduce__(self):
        return (_rebuild_cuda_error, (type(self), str(self), self.call, self.result))


def _rebuild_cuda_error(cls: type, message: str, call: str, result: str | None) -> CUDAError:
    return cls(message, call=call, result=result)


class NoGPUError(CUDAError):
    """No usable CUDA GPU: no driver, no device, or the driver is too old. Raised where a GPU
    is required (``compile_kernel(arch=None)``, loading or launching a kernel)."""
