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
from typing import Self

import numpy as np


class Executor(abc.ABC):
    """Runs a built network on host arrays. Subclasses set the two name lists."""

    input_names: list[str]
    output_names: list[str]

    @abc.abstractmethod
    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once; ``feeds`` maps every input name to an array, the result every output name."""

    def close(self) -> None:
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
