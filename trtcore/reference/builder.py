"""``Builder``, ``IBuilderConfig``, optimization profiles and engines of the reference API.

``build_serialized_network`` validates the network and its optimization profiles as
TensorRT does (every input has min <= opt <= max in each profile, static dimensions agree,
at least one output) and returns a host-memory blob; ``Runtime.deserialize_cuda_engine``
turns it back into an :class:`ICudaEngine` that :class:`~trtcore.reference.executor.ReferenceExecutor`
runs. The blob is a pickle of the network: load only engines you built yourself.
"""

from __future__ import annotations

import enum
import pickle
from collections.abc import Sequence
from typing import Any

from ..errors import NetworkError
from .network import IKVCacheUpdateLayer, INetworkDefinition
from .types import DataType, Logger, MemoryPoolType, TensorIOMode

Shape = tuple[int, ...]


class BuilderFlag(enum.IntEnum):
    """Subset of ``tensorrt.BuilderFlag``; accepted and recorded, no effect on the reference."""

    DEBUG = 2
    REFIT = 4
    TF32 = 6


class IOptimizationProfile:
    """Min / opt / max shapes per network input (``tensorrt.IOptimizationProfile``)."""

    def __init__(self) -> None:
        self._shapes: dict[str, tuple[Shape, Shape, Shape]] = {}

    def set_shape(self, input: str, min: Sequence[int], opt: Sequence[int], max: Sequence[int]) -> None:  # noqa: A002
        lo, mid, hi = (tuple(int(d) for d in s) for s in (min, opt, max))
        if not (len(lo) == len(mid) == len(hi)):
            raise NetworkError(f"profile for {input!r}: min/opt/max ranks differ: {lo}, {mid}, {hi}")
        if any(not (a <= b <= c) for a, b, c in zip(lo, mid, hi)) or any(a < 0 for a in lo):
            raise NetworkError(f"profile for {input!r}: need 0 <= min <= opt <= max, got {lo}, {mid}, {hi}")
        self._shapes[input] = (lo, mid, hi)

    def get_shape(self, input: str) -> list[Shape]:  # noqa: A002
        return list(self._shapes.get(input, ((), (), ())))

    def __bool__(self) -> bool:
        return bool(self._shapes)


class IBuilderConfig:
    """Build options (``tensorrt.IBuilderConfig`` subset)."""

    def __init__(self) -> None:
        self._profiles: list[IOptimizationProfile] = []
        self._pools: dict[MemoryPoolType, int] = {}
        self._flags: set[int] = set()
        self.builder_optimization_level = 3
        self.num_compute_capabilities = 0
        self._compute_capabilities: dict[int, Any] = {}

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        self._profiles.append(profile)
        return len(self._profiles) - 1

    @property
    def num_optimization_profiles(self) -> int:
        return len(self._profiles)

    def set_memory_pool_limit(self, pool: MemoryPoolType, pool_size: int) -> None:
        self._pools[MemoryPoolType(pool)] = int(pool_size)

    def get_memory_pool_limit(self, pool: MemoryPoolType) -> int:
        return self._pools.get(MemoryPoolType(pool), 0)

    def set_flag(self, flag: BuilderFlag) -> None:
        self._flags.add(int(flag))

    def clear_flag(self, flag: BuilderFlag) -> None:
        self._flags.discard(int(flag))

    def get_flag(self, flag: BuilderFlag) -> bool:
        return int(flag) in self._flags

    def set_compute_capability(self, capability: Any, index: int) -> None:
        self._compute_capabilities[index] = capability


class IHostMemory(bytes):
    """Serialized engine bytes (``tensorrt.IHostMemory``)."""

    @property
    def nbytes(self) -> int:
        return len(self)


class ICudaEngine:
    """A built reference engine: the network plus its optimization profiles."""

    def __init__(self, network: INetworkDefinition, profiles: list[IOptimizationProfile]):
        self.network = network
        self.profiles = profiles
        self._io = [t.name for t in network._inputs] + [t.name for t in network._outputs]

    @property
    def num_io_tensors(self) -> int:
        return len(self._io)

    @property
    def num_optimization_profiles(self) -> int:
        return len(self.profiles)

    def get_tensor_name(self, index: int) -> str:
        return self._io[index]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        t = self.network.tensor(name)
        if t.is_network_input:
            return TensorIOMode.INPUT
        return TensorIOMode.OUTPUT if t.is_network_output else TensorIOMode.NONE

    def get_tensor_dtype(self, name: str) -> DataType:
        return self.network.tensor(name).dtype

    def get_tensor_shape(self, name: str) -> Shape:
        return self.network.tensor(name).shape

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[Shape]:
        return self.profiles[profile_index].get_shape(name)

    def get_aliased_input_tensor(self, name: str) -> str | None:
        """The input whose memory the output ``name`` shares (an ``IKVCacheUpdateLayer``'s
        cache), else None."""
        for layer in self.network._layers:
            if isinstance(layer, IKVCacheUpdateLayer) and layer.get_output(0).name == name:
                cache = layer.get_input(0)
                return cache.name if cache is not None else None
        return None


def validate(network: INetworkDefinition, profiles: Sequence[IOptimizationProfile]) -> None:
    """Check what TensorRT checks before building; raises :class:`NetworkError`."""
    if not network.num_outputs:
        raise NetworkError("network has no outputs; call mark_output")
    for layer in network._layers:  # shape/type errors are reported at build time, as in TensorRT
        layer._update()
        if layer._error is not None:
            raise layer._error
        if isinstance(layer, IKVCacheUpdateLayer):  # TensorRT's kVCacheUpdateLayer validation
            cache = layer.get_input(0)
            if cache is None or not cache.is_network_input:
                raise NetworkError(f"KV_CACHE_UPDATE layer {layer.name!r}: the cache tensor must be a network input")
            if not layer.get_output(0).is_network_output:
                raise NetworkError(f"KV_CACHE_UPDATE layer {layer.name!r}: the output tensor must be a network output")
    dynamic = [t for t in network._inputs if -1 in t.shape]
    if dynamic and not profiles:
        raise NetworkError(f"inputs {[t.name for t in dynamic]} have dynamic shapes but no optimization profile was added")
    for i, profile in enumerate(profiles):
        for t in dynamic:
            if t.name not in profile._shapes:
                raise NetworkError(f"optimization profile {i} has no shape for dynamic input {t.name!r}")
        inputs = {t.name: t for t in network._inputs}
        for name, (lo, opt, hi) in profile._shapes.items():
            t = inputs.get(name)
            if t is None:  # TensorRT ignores shapes for tensors that are not inputs
                continue
            if len(lo) != len(t.shape):
                raise NetworkError(f"profile {i}: {name!r} has rank {len(t.shape)}, profile gives {lo}")
            for d, a, o, b in zip(t.shape, lo, opt, hi):
                if d != -1 and not a == o == b == d:
                    raise NetworkError(
                        f"profile {i}: {name!r} has static shape {t.shape}; min/opt/max must equal it on static dimensions, got {lo}, {opt}, {hi}"
                    )


class Builder:
    """Creates networks, configs and profiles, and builds engines (``tensorrt.Builder``)."""

    def __init__(self, logger: Logger | None = None):
        self.logger = logger or Logger()

    def create_network(self, flags: int = 0) -> INetworkDefinition:
        return INetworkDefinition(flags)

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig()

    def create_optimization_profile(self) -> IOptimizationProfile:
        return IOptimizationProfile()

    def build_engine(self, network: INetworkDefinition, config: IBuilderConfig) -> ICudaEngine:
        """Validate and wrap ``network`` without serializing (trtcore extension)."""
        validate(network, config._profiles)
        return ICudaEngine(network, list(config._profiles))

    def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> IHostMemory:
        engine = self.build_engine(network, config)
        return IHostMemory(pickle.dumps(engine, protocol=pickle.HIGHEST_PROTOCOL))


class Runtime:
    """Deserializes reference engines (``tensorrt.Runtime``)."""

    def __init__(self, logger: Logger | None = None):
        self.logger = logger or Logger()

    def deserialize_cuda_engine(self, serialized: bytes) -> ICudaEngine:
        engine = pickle.loads(bytes(serialized))
        if not isinstance(engine, ICudaEngine):
            raise NetworkError("not a trtcore reference engine")
        return engine
