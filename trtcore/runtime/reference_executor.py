"""The reference executor: runs a :mod:`trtcore.reference` network on NumPy.

It implements :class:`~trtcore.runtime.executor.Executor` like the TensorRT engine
executor does, so the generate loop cannot tell them apart, and adds what only a
reference evaluator can give: any intermediate tensor by name (``capture=``), the basis
of layer-by-layer debugging against Hugging Face's hidden states.
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


class ReferenceExecutor(Executor):
    """Executes a reference network (or a deserialized reference engine).

    Args:
        network: an ``INetworkDefinition`` of :mod:`trtcore.reference` or an ``ICudaEngine``
            from its ``Runtime``.
        profile: the optimization profile whose min/max bounds the inputs must respect
            (optional; an engine brings its first profile).
        xp: array module (``numpy``; CuPy support comes with the GPU backend).

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
            if a.dtype != target:
                if np.dtype(a.dtype).kind != target.kind and not (target.kind in "fV" and np.dtype(a.dtype).kind in "fV"):
                    raise ValueError(f"input {t.name!r} has dtype {a.dtype}, expected {target}")
                a = a.astype(target)
            checked[t.name] = a
        return checked

    def run(self, feeds: Mapping[str, Any], capture: Iterable[str] | str = ()) -> dict[str, Any]:
        """Run the network; return every output and every tensor named in ``capture``."""
        return evaluate(self.network, self._check(feeds), xp=self.xp, capture=capture, constants=self._constants)
