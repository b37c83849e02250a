"""Model families, one file each; installed as ``trtcore.models``.

Each family's rules (config defaults, bias rules, tensor names, GGUF mapping) are its
record in :mod:`trtcore.families`; the record's ``builder`` names the family file here. A
family file provides ``ARCHITECTURES`` (Hugging Face ``architectures`` names) and
``build(graph, config, weights)``; it composes :mod:`trtcore.ops` (inputs and outputs
through the KV cache contract) and never calls ``network.add_*`` itself.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from trtcore.errors import UnsupportedArchitectureError
from trtcore.families import MODEL_FAMILIES, ModelFamily


def _supported() -> dict[str, ModelFamily]:
    return {f.architecture: f for f in MODEL_FAMILIES.values()}


SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_supported())


def family_for(architecture: str) -> ModuleType:
    """The family module that builds ``architecture`` (e.g. ``"Qwen2ForCausalLM"``).

    Raises:
        UnsupportedArchitectureError: no family builds it; the message lists those that do.
    """
    family = _supported().get(architecture)
    if family is None:
        raise UnsupportedArchitectureError(f"architecture {architecture!r} is not supported; supported: {', '.join(_supported())}")
    return importlib.import_module(family.builder)
