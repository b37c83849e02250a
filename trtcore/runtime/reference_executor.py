"""The reference executor: runs a :mod:`trtcore.reference` network on NumPy or CuPy.

It implements :class:`~trtcore.runtime.executor.Executor` like the TensorRT engine
executor does, so the generate loop cannot tell them apart, and adds what only a
reference evaluator can give: any intermediate tensor by name (``capture=``), the basis
of layer-by-layer debugging against Hugging Face's hidden states.

On CuPy (``xp=cupy``, see :func:`trtcore.runtime.device.array_module`) :meth:`run` takes
host (NumPy) or device arrays, returns device arrays, and queues the whole network on the
current stream without waiting for it: the input checks read only shapes and dtypes.
bfloat16 tensors are ``uint16`` bit patterns on the device (see
:mod:`trtcore.reference.evaluator`); :meth:`ReferenceExecutor.to_host` copies outputs to
the host and gives bfloat16 back as ``ml_dtypes.bfloat16``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..reference.builder import ICudaEngine, IOptimizationProfile, validate
from ..reference.evaluator import evaluate, float32_to_bf16_bits
from ..reference.network import INetworkDefinition
from ..reference.types import DataType, nptype
from .device import to_host
from .executor import Executor

__all__ = ["ReferenceExecutor", "to_host"]


class ReferenceExecutor(Executor):
    """Executes a reference network (or a deserialized reference engine).

    Args:
        network: an ``INetworkDefinition`` of :mod:`trtcore.reference` or an ``ICudaEngine``
            from its ``Runtime``.
        profile: the optimization profile whose min/max bounds the inputs must respect
            (optional; an engine brings its first profile).
        xp: array module: ``numpy`` (CPU) or ``cupy`` (the current CUDA device).

    Raises (from :meth:`run`):
        ValueError: an input is missing, has the wrong rank, a wrong static dimension, or a
            dimension outside the profile's [min, max]; the message names the tensor.
    """

    def __init__(self, network: INetworkDefinition | ICudaEngine, profile: IOptimizationProfile | None = None, xp: Any = np):
        if isinstance(network, ICudaEngine):
            profile = profile or (network.profiles[0] if network.profiles else None)
            network = network.network
        validate(network, [profile] if profile else [])
        self.network = network
        self.profile = profile
        self.xp = xp
        self.device = "cuda" if getattr(xp, "__name__", "") == "cupy" else "cpu"
        self.input_names = [t.name for t in network._inputs]
        self.output_names = [t.name for t in network._outputs]
        self._constants: dict[int, Any] = {}

    def _check(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        checked: dict[str, Any] = {}
        for t in self.network._inputs:
            if t.name not in feeds:
                raise ValueError(f"input {t.name!r} is missing; the network needs {self.input_names}")
            a = feeds[t.name]
            shape = tuple(a.shape)
            if len(shape) != len(t.shape) or any(d != -1 and d != s for d, s in zip(t.shape, shape)):
                raise ValueError(f"input {t.name!r} has shape {shape}, expected {t.shape} (-1 = any)")
            if self.profile is not None and t.name in self.profile._shapes:
                lo, _, hi = self.profile._shapes[t.name]
                if any(not a_ <= s <= b_ for a_, s, b_ in zip(lo, shape, hi)):
                    raise ValueError(f"input {t.name!r} has shape {shape}, outside the optimization profile [{lo}, {hi}]")
            target = np.dtype(nptype(t.dtype))
            if self.xp is not np and t.dtype == DataType.BF16 and a.dtype == np.uint16:
                pass  # bfloat16 bit patterns, the device storage (host or device array)
            elif isinstance(a, np.ndarray) or self.xp is np:
                if a.dtype != target:
                    if np.dtype(a.dtype).kind != target.kind and not (target.kind in "fV" and np.dtype(a.dtype).kind in "fV"):
                        raise ValueError(f"input {t.name!r} has dtype {a.dtype}, expected {target}")
                    a = a.astype(target)
            else:
                a = self._check_device_dtype(t.name, t.dtype, a)
            checked[t.name] = a
        return checked

    def _check_device_dtype(self, name: str, dtype: DataType, a: Any) -> Any:
        """A device feed converted on the device to its storage dtype (no host read)."""
        target = np.dtype(nptype(dtype))
        kind = np.dtype(a.dtype).kind
        if dtype == DataType.BF16:  # stored as uint16 bit patterns
            if a.dtype == np.uint16:
                return a
            if kind == "f":
                return float32_to_bf16_bits(a, self.xp)
            raise ValueError(f"input {name!r} has dtype {a.dtype}, expected bfloat16 (on the device: uint16 bit patterns, or a float array to round)")
        if a.dtype == target:
            return a
        if kind != target.kind and not (target.kind == "f" and kind == "f"):
            raise ValueError(f"input {name!r} has dtype {a.dtype}, expected {target}")
        return a.astype(target)

    def run(self, feeds: Mapping[str, Any], capture: Iterable[str] | str = ()) -> dict[str, Any]:
        """Run the network; return every output and every tensor named in ``capture``.

        With CuPy the results are device arrays (bfloat16 as ``uint16`` bits) and the work
        may still be running when this returns; :meth:`to_host` waits for it. A KV cache
        input of an ``IKVCacheUpdateLayer`` is updated in place and returned as its output
        (TensorRT's aliasing, see :meth:`ICudaEngine.get_aliased_input_tensor`).
        """
        return evaluate(self.network, self._check(feeds), xp=self.xp, capture=capture, constants=self._constants)

    def to_host(self, value: Any, name: str | None = None) -> Any:
        """Copy results to the host as NumPy arrays.

        Args:
            value: one array (then ``name`` is the tensor it holds, so that a bfloat16
                tensor comes back as ``ml_dtypes.bfloat16``) or a ``{name: array}`` dict
                such as :meth:`run` returns.
            name: the tensor's name, for a single array.
        """
        if isinstance(value, Mapping):
            return {k: self.to_host(v, k) for k, v in value.items()}
        return to_host(value, self.network.tensor(name).dtype if name is not None else None)
