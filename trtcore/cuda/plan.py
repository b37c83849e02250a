"""The serialized form of a cuda engine: a :class:`Plan`.

A plan holds everything another process needs to run the engine: the compiled graph (its
constants are the weights, in the engine's types), the optimization profile, each generated
kernel's source and NVRTC compile key, the GEMM tactic choices, the memory plan, and the
build log. ``Builder.build_serialized_network`` pickles it; ``Runtime.deserialize_cuda_engine``
unpickles it (load only plans you built yourself, as with any pickle).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .codegen import KernelSource
from .ir import Graph

#: bump when the plan's layout changes
FORMAT = "trtcore-cuda-plan-1"


@dataclass
class KernelInfo:
    """One launch of the engine: ``name``, ``kind`` (``pointwise_group``, ``row_group``,
    ``gemm``, ``plugin``, ``copy``, ...), the network ``layers`` it came from, and the source
    ``key`` of a generated kernel (empty for GEMMs and plugins)."""

    name: str
    kind: str
    layers: list[str]
    key: str


@dataclass
class Plan:
    """A compiled engine: ``graph`` (after every pass; constants in the engine's types),
    ``profile`` (input -> (min, opt, max)), ``sources`` (node name -> generated kernel),
    ``compile_keys`` (node name -> NVRTC cache key, where compiled at build), ``arch``,
    ``kernels`` (the launches, with their layers), ``offsets`` / ``sizes`` (bytes, per planned
    buffer), ``device_memory_size`` (bytes), ``tactics`` (per GEMM), ``build_log``, ``stats``."""

    format: str
    graph: Graph
    profile: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]
    sources: dict[str, KernelSource]
    compile_keys: dict[str, str]
    arch: str | None
    kernels: list[KernelInfo]
    offsets: dict[str, int]
    sizes: dict[str, int]
    device_memory_size: int
    tactics: dict[str, dict[str, Any]]
    build_log: list[str]
    stats: dict[str, Any]
