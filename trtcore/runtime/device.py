"""Where a backend executes: the reference backend on the CPU (NumPy), every other backend
on a CUDA GPU.

::

    resolve_device("reference", None)    # "cpu"
    resolve_device("reference", "cuda")  # InvalidArgumentError: use backend="cuda"
    resolve_device("cuda", None)         # "cuda"
    resolve_device("tensorrt", "cpu")    # InvalidArgumentError: device='cpu' needs backend='reference'

Spellings: ``"cuda"`` and ``"gpu"`` mean the current CUDA device (``CUDA_VISIBLE_DEVICES``
picks it); ``"cpu"`` means NumPy; ``None`` means "where the backend runs".

The reference backend is the NumPy oracle only: the GPU runs the same networks through
trtcore's own engine, ``backend="cuda"`` (:mod:`trtcore.cuda`), which the GPU tests
compare with the reference layer by layer (its CuPy evaluator is retired).
"""

from __future__ import annotations

from ..errors import InvalidArgumentError

__all__ = ["DEVICES", "INSTALL_GPU", "normalize_device", "resolve_device"]

#: canonical device names
DEVICES: tuple[str, ...] = ("cpu", "cuda")
_ALIASES = {"cpu": "cpu", "cuda": "cuda", "gpu": "cuda"}

#: how to get what the cuda backend executes with (CuPy for CUDA 13, nvmath-python)
INSTALL_GPU = "pip install 'trtcore[gpu]'  (CuPy for CUDA 13 and nvmath-python)"


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
        raise InvalidArgumentError(f"unknown device {device!r}; expected 'cpu', 'cuda' (or 'gpu'), or None for where the backend runs")
    return name


def resolve_device(backend: str, device: str | None = None) -> str:
    """The device ``backend`` executes on: ``"cpu"`` for ``"reference"``, ``"cuda"`` for
    every other backend.

    Args:
        backend: a canonical backend name (:data:`trtcore.trt.BACKENDS`).
        device: ``"cpu"``, ``"cuda"`` / ``"gpu"``, or None (the backend's device).

    Raises:
        InvalidArgumentError: an unknown spelling; ``"cuda"`` with the reference backend
            (the message points to ``backend="cuda"``); ``"cpu"`` with a GPU backend.
    """
    name = normalize_device(device)
    if backend == "reference":
        if name == "cuda":
            raise InvalidArgumentError(
                f"device={device!r}: the reference backend is the NumPy oracle and runs on the CPU only; "
                f"on a CUDA GPU use backend='cuda' (trtcore's engine; it needs {INSTALL_GPU}), or device='cpu'"
            )
        return "cpu"
    if name == "cpu":
        raise InvalidArgumentError(f"backend {backend!r} executes on a CUDA GPU; device='cpu' needs backend='reference'")
    return "cuda"
