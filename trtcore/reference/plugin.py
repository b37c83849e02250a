"""Plugins in the reference API: ``PluginField``, ``PluginFieldCollection``, the plugin
registry, and ``IPluginV3Layer`` (``network.add_plugin_v3``).

Names and enum values follow TensorRT's Python API. The reference registry's creators
return the plugin object itself (a :class:`trtcore.plugins.base.Plugin`, duck-typed here:
``output_dtypes``, ``output_shapes``, ``reference``, ``enqueue``), which the evaluator runs
with ``reference`` on NumPy (the cuda engine calls ``enqueue``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np


class PluginFieldType(enum.IntEnum):
    FLOAT16 = 0
    FLOAT32 = 1
    FLOAT64 = 2
    INT8 = 3
    INT16 = 4
    INT32 = 5
    CHAR = 6
    DIMS = 7
    UNKNOWN = 8
    BF16 = 9
    INT64 = 10


class TensorRTPhase(enum.IntEnum):
    BUILD = 0
    RUNTIME = 1


class PluginField:
    """One named plugin attribute (``tensorrt.PluginField``): ``name``, ``data``, ``type``, ``size``."""

    def __init__(self, name: str, data: Any = None, type: PluginFieldType = PluginFieldType.UNKNOWN):  # noqa: A002
        self.name = name
        self.data = np.asarray(data if data is not None else [])
        self.type = PluginFieldType(type)

    @property
    def size(self) -> int:
        return int(self.data.size)


class PluginFieldCollection:
    """A list of :class:`PluginField` (``tensorrt.PluginFieldCollection``)."""

    def __init__(self, fields: Sequence[PluginField] = ()):
        self._fields = list(fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __iter__(self) -> Iterator[PluginField]:
        return iter(self._fields)

    def __getitem__(self, i: int) -> PluginField:
        return self._fields[i]


class PluginCreator:
    """Creator for a trtcore plugin class (the reference's ``IPluginCreatorV3One``)."""

    def __init__(self, plugin_cls: Any):
        self.plugin_cls = plugin_cls
        self.name = plugin_cls.plugin_name
        self.plugin_version = plugin_cls.plugin_version
        self.plugin_namespace = plugin_cls.plugin_namespace

    def create_plugin(self, name: str, fc: PluginFieldCollection, phase: TensorRTPhase) -> Any:
        return self.plugin_cls.from_field_collection(fc)


class IPluginRegistry:
    """Creators by (name, version, namespace) (``tensorrt.IPluginRegistry`` subset)."""

    def __init__(self) -> None:
        self._creators: dict[tuple[str, str, str], Any] = {}

    def register_creator(self, creator: Any, plugin_namespace: str = "") -> bool:
        key = (creator.name, creator.plugin_version, plugin_namespace)
        if key in self._creators:
            return False
        self._creators[key] = creator
        return True

    def deregister_creator(self, creator: Any) -> bool:
        for key, c in list(self._creators.items()):
            if c is creator:
                del self._creators[key]
                return True
        return False

    def get_creator(self, name: str, version: str, plugin_namespace: str = "") -> Any:
        return self._creators.get((name, version, plugin_namespace))

    @property
    def all_creators(self) -> list[Any]:
        return list(self._creators.values())


_REGISTRY = IPluginRegistry()


def get_plugin_registry() -> IPluginRegistry:
    """The process-wide reference plugin registry."""
    return _REGISTRY
