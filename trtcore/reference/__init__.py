"""trtcore's reference implementation of TensorRT's network-definition API.

It plays the role ``onnx.reference`` plays for ONNX: the subset of the ``tensorrt`` Python
module that trtcore's ops use (``Builder``, ``INetworkDefinition`` and its layers,
``IBuilderConfig``, optimization profiles, ``Weights``, the enums and ``nptype``), with
TensorRT's names and semantics, executed on NumPy (CPU) by
:func:`trtcore.reference.evaluator.evaluate`. Model code cannot tell it from ``tensorrt``.
"""

from __future__ import annotations

from .builder import (
    Builder,
    BuilderFlag,
    IBuilderConfig,
    ICudaEngine,
    IHostMemory,
    IOptimizationProfile,
    Runtime,
)
from .network import (
    IAttention,
    IKVCacheUpdateLayer,
    INetworkDefinition,
    IPluginV3Layer,
    ITensor,
)
from .plugin import (
    IPluginRegistry,
    PluginCreator,
    PluginField,
    PluginFieldCollection,
    PluginFieldType,
    TensorRTPhase,
    get_plugin_registry,
)
from .types import (
    ActivationType,
    AttentionIOForm,
    AttentionNormalizationOp,
    CausalMaskKind,
    DataType,
    ElementWiseOperation,
    GatherMode,
    KVCacheMode,
    LayerType,
    Logger,
    MatrixOperation,
    MemoryPoolType,
    NetworkDefinitionCreationFlag,
    ReduceOperation,
    TensorIOMode,
    UnaryOperation,
    Weights,
    from_numpy_dtype,
    nptype,
)

__version__ = "0.1.0"

float32 = DataType.FLOAT
float16 = DataType.HALF
bfloat16 = DataType.BF16
int8 = DataType.INT8
uint8 = DataType.UINT8
int32 = DataType.INT32
int64 = DataType.INT64
bool = DataType.BOOL  # noqa: A001 - TensorRT's name

__all__ = [
    "ActivationType",
    "AttentionIOForm",
    "AttentionNormalizationOp",
    "Builder",
    "BuilderFlag",
    "CausalMaskKind",
    "DataType",
    "ElementWiseOperation",
    "GatherMode",
    "IAttention",
    "IBuilderConfig",
    "ICudaEngine",
    "IHostMemory",
    "IKVCacheUpdateLayer",
    "INetworkDefinition",
    "IOptimizationProfile",
    "KVCacheMode",
    "IPluginRegistry",
    "IPluginV3Layer",
    "ITensor",
    "LayerType",
    "PluginCreator",
    "PluginField",
    "PluginFieldCollection",
    "PluginFieldType",
    "TensorRTPhase",
    "get_plugin_registry",
    "Logger",
    "MatrixOperation",
    "MemoryPoolType",
    "NetworkDefinitionCreationFlag",
    "ReduceOperation",
    "Runtime",
    "TensorIOMode",
    "UnaryOperation",
    "Weights",
    "bfloat16",
    "bool",
    "float16",
    "float32",
    "from_numpy_dtype",
    "int32",
    "int64",
    "int8",
    "nptype",
    "uint8",
]
