"""trtcore's CUDA engine: the ``cuda`` backend, a TensorRT-like module that compiles.

Networks are defined with the reference backend's network API (the same
``INetworkDefinition`` objects every model builds: ``Builder.create_network``, the layers,
``Weights``, the enums and the plugin registry are :mod:`trtcore.reference`'s);
``Builder.build_serialized_network`` compiles the network into fused kernels, cuBLAS GEMMs
and plugin calls over one planned activation block (:mod:`trtcore.cuda.builder` lists the
passes), and ``Runtime(logger).deserialize_cuda_engine(plan)`` returns an
:class:`~trtcore.cuda.runtime.ICudaEngine` whose execution contexts run on a CUDA GPU with
TensorRT's semantics (:mod:`trtcore.cuda.runtime`). Needs CuPy (device memory),
nvmath-python (cuBLAS) and a GPU to execute; building and kernel generation need neither
(NVRTC compiles for a named architecture without a GPU).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .. import reference as _reference
from ..reference import *  # noqa: F403 - this backend's API is the reference's, the engine side replaced below
from .weights import Weights as Weights

# the engine side is this backend's own, imported on first use (below): drop the reference's
for _name in ("Builder", "ICudaEngine", "Runtime"):
    globals().pop(_name, None)

if TYPE_CHECKING:
    from .builder import Builder as Builder
    from .runtime import EngineExecutionError as EngineExecutionError
    from .runtime import ICudaEngine as ICudaEngine
    from .runtime import IExecutionContext as IExecutionContext
    from .runtime import Runtime as Runtime

__version__ = "0.1.0"

#: the compiler and the runtime objects, imported on first use (PEP 562), so that the
#: package's own modules can import their siblings without importing the whole compiler
_LAZY = {
    "Builder": "builder",
    "EngineExecutionError": "runtime",
    "ICudaEngine": "runtime",
    "IExecutionContext": "runtime",
    "Runtime": "runtime",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


class IPluginV3:
    """Plugins here are trtcore plugin objects (``output_shapes``, ``output_dtypes``,
    ``workspace_size``, ``enqueue``), created through :func:`get_plugin_registry`'s creators
    as on the reference backend; this name marks the module as hosting them."""


#: the reference backend's names (Builder, ICudaEngine, Runtime and Weights are this backend's
#: own, imported above) and the execution side's; IAttention is made through INetworkDefinition
__all__ = sorted((set(_reference.__all__) - {"IAttention"}) | {"EngineExecutionError", "IExecutionContext", "IPluginV3"})
