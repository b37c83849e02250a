"""The KV cache contract, in one place for every KV cache mode.

Per mode (``paged``; ``contiguous`` with composed-layers attention; ``contiguous`` with
TensorRT's native ``IAttention`` + ``IKVCacheUpdateLayer`` over a fixed-size cache) this
module owns: the network's cache inputs and outputs, their optimization-profile shapes,
the per-step feeds the runtime gives the engine, and the cache buffers it allocates.
Model files never name a KV mode; the runtime never reads tensor names to find one.
"""

from __future__ import annotations

# ---------------------------------------------------------------------------------------
# network side: cache inputs / outputs and profile shapes (used by ops and the builder)
# ---------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------
# runtime side: per-step feeds and cache buffers (used by trtcore.runtime)
# ---------------------------------------------------------------------------------------
