"""Model families, one file each; installed as ``trtcore.models``.

A family module provides ``ARCHITECTURES`` (Hugging Face ``architectures`` names),
``io_spec(config, dtype)`` and ``build(graph, config, weights)``; it composes
:mod:`trtcore.ops` and never calls ``network.add_*`` itself.
"""

from __future__ import annotations

from types import ModuleType

from trtcore.errors import UnsupportedArchitectureError

from . import llama

_FAMILIES: tuple[ModuleType, ...] = (llama,)

SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(a for f in _FAMILIES for a in f.ARCHITECTURES)


def family_for(architecture: str) -> ModuleType:
    """The family module that builds ``architecture`` (e.g. ``"Qwen2ForCausalLM"``).

    Raises:
        UnsupportedArchitectureError: no family builds it; the message lists those that do.
    """
    for family in _FAMILIES:
        if architecture in family.ARCHITECTURES:
            return family
    raise UnsupportedArchitectureError(
        f"architecture {architecture!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )
