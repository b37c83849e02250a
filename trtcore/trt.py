"""The one place where trtcore imports a TensorRT module.

``load_trt(backend)`` returns a module that exposes TensorRT's network-definition API:

========================  ===========================================  =====================
backend                   module                                       install
========================  ===========================================  =====================
``"tensorrt"``            NVIDIA TensorRT 10.13+ / 11.x                ``pip install trtcore[trt]``
``"tensorrt_rtx"``        NVIDIA TensorRT for RTX 1.7                  ``pip install trtcore[rtx]``
``"reference"``           :mod:`trtcore.reference` (NumPy)             always present
``"cuda"``                :mod:`trtcore.cuda`, trtcore's own engine    always present (runs
                          builder and runtime for CUDA GPUs            with ``trtcore[gpu]``)
========================  ===========================================  =====================

With no argument the environment variable ``TRTCORE_BACKEND`` decides; when that is unset,
the first importable of ``tensorrt``, ``tensorrt_rtx``, ``reference`` is taken. No other
trtcore module imports ``tensorrt`` or ``tensorrt_rtx``.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

from .errors import BackendNotAvailableError, InvalidArgumentError

BACKENDS: tuple[str, ...] = ("tensorrt", "tensorrt_rtx", "reference", "cuda")

_MODULES = {
    "tensorrt": "tensorrt",
    "tensorrt_rtx": "tensorrt_rtx",
    "reference": "trtcore.reference",
    "cuda": "trtcore.cuda",
}
_INSTALL = {
    "tensorrt": "pip install 'trtcore[trt]'  (NVIDIA TensorRT, package tensorrt-cu13)",
    "tensorrt_rtx": "pip install 'trtcore[rtx]'  (NVIDIA TensorRT for RTX, package tensorrt-rtx-cu13)",
    "reference": "it ships with trtcore; reinstall trtcore",
    "cuda": "it ships with trtcore; on the GPU it needs pip install 'trtcore[gpu]' (CuPy, nvmath-python)",
}
_ALIASES = {"trt": "tensorrt", "rtx": "tensorrt_rtx", "ref": "reference", "numpy": "reference"}


def normalize_backend(backend: str) -> str:
    """Return the canonical backend name for ``backend`` (aliases: trt, rtx, ref).

    Raises:
        InvalidArgumentError: ``backend`` is not one of :data:`BACKENDS` or an alias.
    """
    name = _ALIASES.get(backend.strip().lower(), backend.strip().lower())
    if name not in BACKENDS:
        raise InvalidArgumentError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    return name


def _import(name: str) -> ModuleType:
    try:
        module = importlib.import_module(_MODULES[name])
    except ImportError as exc:
        raise BackendNotAvailableError(f"backend {name!r} is not installed ({exc}); install it with: {_INSTALL[name]}") from exc
    # `pip install tensorrt-stubs` leaves an importable but empty `tensorrt` package.
    if not hasattr(module, "Builder"):
        raise BackendNotAvailableError(
            f"backend {name!r}: the module {module.__name__!r} found at "
            f"{getattr(module, '__path__', ['?'])[0]} has no Builder (type stubs only?); "
            f"install it with: {_INSTALL[name]}"
        )
    return module


def resolve_backend(backend: str | None = None) -> str:
    """The backend name that :func:`load_trt` would use for ``backend``.

    ``backend`` (or ``$TRTCORE_BACKEND``) wins; otherwise the first importable one.
    """
    requested = backend or os.environ.get("TRTCORE_BACKEND") or None
    if requested:
        return normalize_backend(requested)
    for name in BACKENDS:
        try:
            _import(name)
            return name
        except BackendNotAvailableError:
            continue
    return "reference"  # pragma: no cover - the reference always imports


def load_trt(backend: str | None = None) -> Any:
    """Import and return the TensorRT module for ``backend``.

    Args:
        backend: ``"tensorrt"``, ``"tensorrt_rtx"``, ``"reference"`` (or alias), or None
            for ``$TRTCORE_BACKEND`` / auto-detection.

    Raises:
        BackendNotAvailableError: the requested module is not installed; the message says
            how to install it.
        InvalidArgumentError: unknown backend name.
    """
    return _import(resolve_backend(backend))


def is_available(backend: str) -> bool:
    """True when ``backend`` can be imported here."""
    try:
        _import(normalize_backend(backend))
        return True
    except BackendNotAvailableError:
        return False


def backend_name(module: Any) -> str:
    """The backend name of a module returned by :func:`load_trt` (``tensorrt``, ...).

    Raises:
        InvalidArgumentError: ``module`` is none of the backends' modules.
    """
    name = getattr(module, "__name__", None)
    for backend, module_name in _MODULES.items():
        if name == module_name:
            return backend
    raise InvalidArgumentError(f"module {name!r} is not a TensorRT backend module; expected one of {', '.join(_MODULES.values())}")
