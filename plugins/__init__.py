"""trtcore's TensorRT plugins (``IPluginV3``), one module per plugin; installed as ``trtcore.plugins``.

* :mod:`trtcore.plugins.base` — the authoring base (:class:`~trtcore.plugins.base.Plugin`),
  registration, entry-point discovery;
* :mod:`trtcore.plugins.rope` — fused rotary position embedding;
* :mod:`trtcore.plugins.paged_attention` — attention over the paged KV cache;
* :mod:`trtcore.plugins.weight_only_gemm` — int4/int8 weight-only quantized GEMM;
* :mod:`trtcore.plugins.fp8_gemm` — FP8 (E4M3) GEMM through cuBLASLt;
* :mod:`trtcore.plugins.moe_experts` — mixture-of-experts experts (grouped GEMMs);
* :mod:`trtcore.plugins.collective` — all-reduce / all-gather of tensor parallelism (NCCL);
* :mod:`trtcore.plugins.launcher` — compiling and launching a plugin's kernels.
"""

from __future__ import annotations

from typing import Any


def builtin_plugins() -> list[type]:
    """The plugin classes trtcore ships."""
    from .collective import CollectivePlugin
    from .fp8_gemm import Fp8GemmPlugin
    from .moe_experts import MoeExpertsPlugin
    from .paged_attention import PagedAttentionPlugin
    from .rope import RopePlugin
    from .weight_only_gemm import WeightOnlyGemmPlugin

    return [RopePlugin, PagedAttentionPlugin, WeightOnlyGemmPlugin, MoeExpertsPlugin, CollectivePlugin, Fp8GemmPlugin]


def register_all(trt: Any) -> list[type]:
    """Register trtcore's plugins and those published under the entry-point group
    ``trtcore.plugins`` with ``trt``'s plugin registry (needed before TensorRT deserializes
    an engine that contains them). Does nothing for modules that cannot host plugins.

    Returns:
        The registered classes.
    """
    from .base import hosts_plugins, load_entry_point_plugins, register

    if not hosts_plugins(trt):
        return []
    classes = builtin_plugins()
    for cls in classes:
        register(cls, trt)
    return classes + load_entry_point_plugins(trt)
