"""Exceptions raised by :mod:`trtcore.kernels`.

All derive from :class:`trtcore.errors.TrtcoreError` (catch everything trtcore raises at
once) and from the closest built-in exception. The CUDA ones are :mod:`trtcore.gpu`'s
(:class:`CUDAError` is :class:`trtcore.gpu.CudaError`), so one ``except`` catches a failed
CUDA call wherever it happened. Bad arguments (an unknown kernel name, an unparsable arch
string, a malformed define or launch argument) raise
:class:`trtcore.errors.InvalidArgumentError` (a ``ValueError``) instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trtcore.errors import TrtcoreError
from trtcore.gpu import CudaError as CUDAError
from trtcore.gpu import CUDAToolchainError, NoGPUError, cuda_bindings, result_name

__all__ = ["CUDAError", "CUDAToolchainError", "NVRTCError", "NoGPUError", "cuda_bindings", "result_name"]


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
