"""The reference executor: runs a :mod:`trtcore.reference` network on NumPy (the CPU).

It implements :class:`~trtcore.runtime.executor.Executor` like the TensorRT engine
executor does, so the generate loop cannot tell them apart, and adds what an interpreter
can give at run time: any intermediate tensor by name (``capture=``), the basis of
layer-by-layer debugging against Hugging Face's hidden states and of the GPU tests of the
cuda engine (whose own ``capture=`` is a build option, :func:`trtcore.cuda.builder.keep_captured`).
Inputs and outputs are NumPy arrays (bfloat16 as ``ml_dtypes.bfloat16``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..reference.builder import ICudaEngine, IOptimizationProfile, validate
from ..reference.evaluator import evaluate
from ..reference.network import INetworkDefinition
from ..reference.types import nptype
from .executor import Executor

__all__ = ["ReferenceExecutor"]


class ReferenceExecutor(Executor):
    """Executes a reference network (or a deserialized reference engine) with NumPy.

    Args:
        network: an ``INetworkDefinition`` of :mod:`trtcore.reference` or an ``ICudaEngine``
            from its ``Runtime``.
        profile: the optimization profile whose min/max bounds the inputs must respect
            (optional; an engine brings its first profile).

    Attributes:
        device: ``"cpu"``.

    Raises (from :meth:`run`):
        ValueError: an input is missing, has the wrong rank, a wrong static dimension, a
            dimension outside the profile's [min, max], or a dtype of another kind; the
            message names the tensor.
    """

    device = "cpu"

    def __init__(self, network: INetworkDefinition | ICudaEngine, profile: IOptimizationProfile | None = None):
        if isinstance(network, ICudaEngine):
            profile = profile or (network.profiles[0] if network.profiles else None)
            network = network.network
        validate(network, [profile] if profile else [])
        self.network = network
        self.profile = profile
        self.input_names = [t.name for t in network._inputs]
        self.output_names = [t.name for t in network._outputs]
        self._constants: dict[int, Any] = {}

    def _check(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        checked: dict[str, np.ndarray] = {}
        for t in self.network._inputs:
            if t.name not in feeds:
                raise ValueError(f"input {t.name!r} is missing; the network needs {self.input_names}")
            a = np.asarray(feeds[t.name])
            shape = tuple(a.shape)
            if len(shape) != len(t.shape) or any(d != -1 and d != s for d, s in zip(t.shape, shape)):
                raise ValueError(f"input {t.name!r} has shape {shape}, expected {t.shape} (-1 = any)")
            if self.profile is not None and t.name in self.profile._shapes:
                lo, _, hi = self.profile._shapes[t.name]
                if any(not a_ <= s <= b_ for a_, s, b_ in zip(lo, shape, hi)):
                    raise ValueError(f"input {t.name!r} has shape {shape}, outside the optimization profile [{lo}, {hi}]")
            target = np.dtype(nptype(t.dtype))
            if a.dtype != target:
                if a.dtype.kind != target.kind and not (target.kind in "fV" and a.dtype.kind in "fV"):
                    raise ValueError(f"input {t.name!r} has dtype {a.dtype}, expected {target}")
                a = a.astype(target)
            checked[t.name] = a
        return checked

    def run(self, feeds: Mapping[str, Any], capture: Iterable[str] | str = ()) -> dict[str, Any]:
        """Run the network; return every output and every tensor named in ``capture``
        (``"all"``: every tensor). A KV cache input of an ``IKVCacheUpdateLayer`` is updated
        in place and returned as its output (TensorRT's aliasing, see
        :meth:`ICudaEngine.get_aliased_input_tensor`).

        Raises:
            ValueError: a bad input (see the class docstring).
            KeyError: a ``capture`` name is no tensor of the network.
        """
        return evaluate(self.network, self._check(feeds), capture=capture, constants=self._constants)

    def to_host(self, value: Any, name: str | None = None) -> Any:
        """Results as NumPy arrays: one array, or a ``{name: array}`` dict such as :meth:`run`
        returns (they are host arrays already)."""
        if isinstance(value, Mapping):
            return {k: np.asarray(v) for k, v in value.items()}
        return np.asarray(value)
