"""The executor interface: run one network (an engine) on named host arrays.

There are two implementations, and everything above them (KV cache manager, scheduler,
sampling, CUDA Graphs) talks only to this interface:

* :class:`trtcore.runtime.trt_executor.TensorRTExecutor` runs a serialized TensorRT
  engine (``IExecutionContext``, ``set_tensor_address`` + ``execute_async_v3``).
* the reference executor in :mod:`trtcore.reference` evaluates the same network with
  NumPy / CuPy, for machines without a TensorRT runtime.

Both take host arrays keyed by input name and return host arrays keyed by output name;
output shapes are resolved on every call from the input shapes (dynamic dimensions).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self

import numpy as np


class Executor(abc.ABC):
    """Runs a built network. Subclasses set the two name lists.

    Attributes:
        xp: the array module of the outputs (``numpy``; the reference executor on the GPU
            returns CuPy arrays, so that caches fed back stay on the device).
    """

    input_names: list[str]
    output_names: list[str]
    xp: Any = np

    @abc.abstractmethod
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once; ``feeds`` maps every input name to an array, the result every output name."""

    def to_host(self, value: Any, name: str | None = None) -> Any:
        """An output as a NumPy array (``name``: the tensor it holds); identity for host outputs."""
        return np.asarray(value)

    def close(self) -> None:  # noqa: B027 - optional to override
        """Release what the executor holds (device memory, streams). Safe to call twice."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
