"""trtcore.kernels: CUDA C++ kernels compiled at run time by NVRTC, cached on disk, and
launched through ``cuda.bindings`` (no CuPy needed).

The ``.cu``/``.cuh`` files in this folder are package data. A kernel is one ``.cu`` file;
its kernels are ``extern "C" __global__`` functions; it may ``#include "common.cuh"`` (any
header here), ``<cuda_fp16.h>`` and ``<cuda_bf16.h>``; it is specialised by defines, and it
declares the define-sets CI and ``setup_cuda.py`` build in ``// trtcore-variants: [...]``
comment lines (:func:`variants`). Defines are macros seen by CUDA's headers too: give them
distinctive upper-case names (``HEAD_DIM``, ``DTYPE``) -- ``-DT=float`` breaks every
``template <typename T>`` in ``cuda_fp16.h``. Typical use in a plugin::

    from trtcore import kernels

    ck = kernels.compile_kernel("rope", defines={"HEAD_DIM": 128, "DTYPE": "__half"})
    fn = ck.function("rope_neox")           # loaded into the current device's context
    fn.launch((blocks,), (128,), [(q.ptr, "ptr"), (pos.ptr, "ptr"), (n, "i32"), (theta, "f32")],
              stream=stream)

API (all re-exported here, imported on first use so that ``import trtcore.kernels`` stays
cheap and works without cuda-python):

* compile: :func:`compile_kernel` -> :class:`CompiledKernel`; :func:`compile_all`,
  :func:`list_kernels`, :func:`variants`; :func:`kernel_cache_dir`, :func:`normalize_arch`,
  :func:`supported_archs`, :func:`nvrtc_version`, :func:`cuda_include_dir`;
  :func:`cubin_arch`, :func:`cubin_kernel_names`, :func:`cubin_register_counts` (ELF
  inspection, no GPU needed).
  Implementation and cache rules: :mod:`trtcore.kernels.nvrtc`.
* run: :meth:`CompiledKernel.function` -> :class:`KernelFunction` with
  :meth:`KernelFunction.launch`; :func:`gpu_count`, :func:`compute_capability`,
  :func:`current_arch`, :func:`ensure_context`. Argument typing: :mod:`trtcore.kernels.launch`.
* errors: :class:`NVRTCError`, :class:`CUDAToolchainError`, :class:`CUDAError`,
  :class:`NoGPUError` (all :class:`trtcore.errors.TrtcoreError`); bad arguments raise
  :class:`trtcore.errors.InvalidArgumentError`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

#: The folder holding trtcore's kernel sources.
KERNEL_DIR = Path(__file__).resolve().parent

_LAZY = {
    "CompiledKernel": "nvrtc",
    "DefineValue": "nvrtc",
    "compile_all": "nvrtc",
    "compile_kernel": "nvrtc",
    "cubin_arch": "nvrtc",
    "cubin_kernel_names": "nvrtc",
    "cubin_register_counts": "nvrtc",
    "cuda_include_dir": "nvrtc",
    "kernel_cache_dir": "nvrtc",
    "list_kernels": "nvrtc",
    "normalize_arch": "nvrtc",
    "nvrtc_version": "nvrtc",
    "supported_archs": "nvrtc",
    "variants": "nvrtc",
    "ARG_TYPES": "launch",
    "KernelFunction": "launch",
    "compute_capability": "launch",
    "current_arch": "nvrtc",
    "ensure_context": "launch",
    "gpu_count": "launch",
    "CUDAError": "errors",
    "CUDAToolchainError": "errors",
    "NVRTCError": "errors",
    "NoGPUError": "errors",
}

__all__ = sorted([*_LAZY, "KERNEL_DIR"])


def __getattr__(name: str) -> Any:  # PEP 562
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:
    from .errors import CUDAError, CUDAToolchainError, NoGPUError, NVRTCError
    from .launch import ARG_TYPES, KernelFunction, compute_capability, ensure_context, gpu_count
    from .nvrtc import (
        CompiledKernel,
        DefineValue,
        compile_all,
        compile_kernel,
        cubin_arch,
        cubin_kernel_names,
        cubin_register_counts,
        cuda_include_dir,
        current_arch,
        kernel_cache_dir,
        list_kernels,
        normalize_arch,
        nvrtc_version,
        supported_archs,
        variants,
    )
