"""Where the reference backend executes: NumPy on the CPU or CuPy on a CUDA GPU.

::

    resolve_device(None)     # "cuda" when CuPy imports and sees a GPU, else "cpu"
    resolve_device("cuda")   # "cuda", or InvalidArgumentError saying how to get CuPy
    xp = array_module("cuda")  # the cupy module (numpy for "cpu")

Spellings: ``"cuda"`` and ``"gpu"`` mean the current CUDA device (CuPy's current device,
``CUDA_VISIBLE_DEVICES`` picks it); ``"cpu"`` means NumPy; ``None`` picks ``"cuda"`` when
it can, else ``"cpu"``.

:func:`to_host` copies a device array to a NumPy array (one device->host copy, which waits
for the work queued before it) and reinterprets bfloat16 tensors, which live on the device
as ``uint16`` bit patterns (see :mod:`trtcore.reference.evaluator`), as
``ml_dtypes.bfloat16``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import host_view
from ..errors import InvalidArgumentError
from ..gpu import gpu_status

__all__ = ["DEVICES", "INSTALL_GPU", "array_module", "cuda_status", "normalize_device", "resolve_device", "to_host"]

#: canonical device names
DEVICES: tuple[str, ...] = ("cpu", "cuda")
_ALIASES = {"cpu": "cpu", "cuda": "cuda", "gpu": "cuda"}

#: how to get the GPU backend (CuPy for CUDA 13)
INSTALL_GPU = "pip install 'trtcore[gpu]'  (CuPy for CUDA 13, package cupy-cuda13x)"


def normalize_device(device: str | None) -> str | None:
    """``"cpu"``, ``"cuda"`` or None (undecided) for a spelling; checks nothing else.

    Raises:
        InvalidArgumentError: ``device`` is not ``"cpu"``, ``"cuda"``, ``"gpu"`` or None.
    """
    if device is None:
        return None
    if not isinstance(device, str):
        raise InvalidArgumentError(f"device must be a string ('cpu', 'cuda' or 'gpu') or None, got {type(device).__name__}")
    name = _ALIASES.get(device.strip().lower())
    if name is None:
        raise InvalidArgumentError(f"unknown device {device!r}; expected 'cpu', 'cuda' (or 'gpu'), or None to pick the GPU when there is one")
    return name


def cuda_status() -> tuple[bool, str]:
    """``(usable, why)``: whether CuPy imports and sees at least one CUDA device
    (:func:`trtcore.gpu.gpu_status` with ``cupy=True``)."""
    return gpu_status(cupy=True)


def resolve_device(device: str | None = None) -> str:
    """The device the reference backend will use: ``"cpu"`` or ``"cuda"``.

    Args:
        device: ``"cuda"`` / ``"gpu"`` (CuPy on the current CUDA device), ``"cpu"``
            (NumPy), or None: ``"cuda"`` when CuPy imports and a device is visible, else
            ``"cpu"``.

    Raises:
        InvalidArgumentError: an unknown spelling, or ``"cuda"`` without CuPy or without a
            visible GPU (the message says why and how to install ``trtcore[gpu]``).
    """
    name = normalize_device(device)
    if name == "cpu":
        return "cpu"
    ok, why = cuda_status()
    if name is None:
        return "cuda" if ok else "cpu"
    if not ok:
        raise InvalidArgumentError(
            f"device={device!r} needs CuPy and a CUDA GPU, but {why}; install the GPU backend with: {INSTALL_GPU}, or use device='cpu'"
        )
    return "cuda"


def array_module(device: str | None = None) -> Any:
    """The array module for ``device`` (resolved with :func:`resolve_device`): ``numpy``
    for ``"cpu"``, ``cupy`` for ``"cuda"``."""
    if resolve_device(device) == "cpu":
        return np
    import cupy

    return cupy


def to_host(array: Any, dtype: Any = None) -> np.ndarray:
    """``array`` as a NumPy array (a device array is copied; NumPy arrays are returned as is).

    Args:
        array: a NumPy or CuPy array (or anything ``numpy.asarray`` takes).
        dtype: the tensor's logical type (a TensorRT-style ``DataType`` or NumPy dtype);
            an array in device storage is viewed as that type
            (:func:`trtcore.dtypes.host_view`: a ``uint16`` array of a bfloat16 tensor
            becomes ``ml_dtypes.bfloat16``).

    Raises:
        trtcore.errors.UnsupportedDTypeError: ``dtype`` is not a data type trtcore knows.
    """
    get = getattr(array, "get", None)
    host = get() if callable(get) and not isinstance(array, np.ndarray) else np.asarray(array)
    return host if dtype is None else host_view(host, dtype)
