"""trtcore: an LLM inference runtime written against TensorRT's network-definition API.

Public API (shaped like vLLM's)::

    from trtcore import LLM, SamplingParams
    llm = LLM()                                   # the default model, reference backend
    out = llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=32))
    print(out[0].outputs[0].text)
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "LLM": "trtcore.llm",
    "RequestOutput": "trtcore.llm",
    "CompletionOutput": "trtcore.llm",
    "StreamOutput": "trtcore.llm",
    "SamplingParams": "trtcore.runtime.sampling",
    "ModelConfig": "trtcore.config",
    "load_trt": "trtcore.trt",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __dir__() -> list[str]:
    """The module's names, the lazily imported public API (:data:`__all__`) included."""
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str) -> Any:  # PEP 562: keep `import trtcore` cheap
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trtcore' has no attribute {name!r}")
