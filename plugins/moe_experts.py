"""Mixture-of-experts experts: the ``trtcore_moe_experts`` plugin (grouped GEMMs over the tokens
routed to each expert).

``out[t] = sum_r w[t, r] * down_e(silu(gate_e(x[t])) * up_e(x[t]))`` with ``e = ids[t, r]``:
the routed experts of a sparse MoE block (transformers' ``MixtralExperts`` /
``Qwen2MoeExperts``; Shazeer et al., arXiv:1701.06538; SwiGLU experts, Shazeer,
arXiv:2002.05202). The routing itself is :func:`trtcore.ops.topk_routing`.

Kernels (``kernels/moe_experts.cu``): one launch groups the ``T * top_k`` assignments by expert;
then per expert and output column a warp walks that expert's tokens eight at a time, so each
weight row is read once per eight tokens (decode reads only the chosen experts' weights); gate
and up are one pass with SiLU-and-mul fused, down a second pass scaled by the routing weight,
and a last launch sums each token's ``top_k`` results in slot order and rounds once.

Numerical contract: :meth:`MoeExpertsPlugin.reference` is float64 NumPy rounded once to x's
dtype; the kernels accumulate in float32 (intermediates in float32), so they agree with it to
float32 accumulation error plus the final rounding.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from trtcore.dtypes import KERNEL_DTYPE_CODES

from .base import DeviceTensor, Dim, Plugin, PluginError

__all__ = ["MAX_EXPERTS", "MoeExpertsPlugin"]

#: most experts the route kernel takes (its shared-memory counters, ``MOE_MAX_EXPERTS``)
MAX_EXPERTS = 1024
#: warps per block of the GEMM kernels (``WARPS`` in moe_experts.cu): output columns per block
_WARPS = 4
_INT32 = np.dtype(np.int32)
_FLOAT32 = np.dtype(np.float32)
_ALIGN = 256


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclass
class MoeExpertsPlugin(Plugin):
    """The routed experts (plugin ``trtcore_moe_experts``, version 1, namespace ``trtcore``).

    ===  ============  ======================  ==============================================
    #    name          shape                   dtype
    ===  ============  ======================  ==============================================
    0    x             ``[..., E]``            float16, bfloat16 or float32
    1    topk_ids      ``[..., K]``            int32 (ids outside ``[0, X)`` add nothing)
    2    topk_weights  ``[..., K]``            float32
    3    gate_up       ``[X, 2 I, E]``         x's dtype (each expert's gate rows, then up rows)
    4    down          ``[X, E, I]``           x's dtype
    ===  ============  ======================  ==============================================

    Output: ``[..., E]`` of x's dtype.

    Fields: num_experts (X, 1..:data:`MAX_EXPERTS`), top_k (K), hidden_size (E),
    intermediate_size (I), all positive.
    """

    plugin_name: ClassVar[str] = "trtcore_moe_experts"
    plugin_version: ClassVar[str] = "1"
    num_outputs: ClassVar[int] = 1

    num_experts: int
    top_k: int
    hidden_size: int
    intermediate_size: int

    def validate(self) -> None:
        for name in ("num_experts", "top_k", "hidden_size", "intermediate_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PluginError(f"MoeExpertsPlugin.{name} must be a positive integer, got {v!r}")
        if self.num_experts > MAX_EXPERTS:
            raise PluginError(f"MoeExpertsPlugin.num_experts must be at most {MAX_EXPERTS}, got {self.num_experts}")

    def weight_shapes(self) -> list[tuple[int, int, int]]:
        """Shapes of inputs 3 and 4: ``[X, 2 I, E]`` and ``[X, E, I]``."""
        x, e, i = self.num_experts, self.hidden_size, self.intermediate_size
        return [(x, 2 * i, e), (x, e, i)]

    # --- shapes and types ----------------------------------------------------------------------

    def output_dtypes(self, input_dtypes: Sequence[np.dtype]) -> list[np.dtype]:
        if len(input_dtypes) != 5:
            raise PluginError(f"MoeExpertsPlugin takes 5 inputs (x, topk_ids, topk_weights, gate_up, down), got {len(input_dtypes)}")
        d = np.dtype(input_dtypes[0])
        if d not in KERNEL_DTYPE_CODES:
            raise PluginError(f"MoeExpertsPlugin: x must be float16, bfloat16 or float32, got {d}")
        return [d]

    def output_shapes(self, input_shapes: Sequence[Sequence[Dim]]) -> list[list[Dim]]:
        if len(input_shapes) != 5:
            raise PluginError(f"MoeExpertsPlugin takes 5 inputs (x, topk_ids, topk_weights, gate_up, down), got {len(input_shapes)}")
        x = list(input_shapes[0])
        for what, shape, last in (
            ("x", x, self.hidden_size),
            ("topk_ids", input_shapes[1], self.top_k),
            ("topk_weights", input_shapes[2], self.top_k),
        ):
            v = getattr(shape[-1], "value", shape[-1]) if len(shape) else None
            if v is None or (isinstance(v, int) and v >= 0 and v != last):
                raise PluginError(f"MoeExpertsPlugin: {what}'s last dimension is {v}, expected {last}")
        return [x]

    def supports(self, pos: int, dtypes: Sequence[np.dtype], num_inputs: int) -> bool:
        if num_inputs != 5:
            return False
        d = np.dtype(dtypes[pos])
        if pos == 0:
            return d in KERNEL_DTYPE_CODES
        if pos == 1:
            return d == _INT32
        if pos == 2:
            return d == _FLOAT32
        return d == np.dtype(dtypes[0])

    def workspace_size(self, inputs: Sequence[tuple[tuple[int, ...], np.dtype]], outputs: Sequence[tuple[tuple[int, ...], np.dtype]]) -> int:
        """offsets ``int32 [X + 1]``, perm ``int32 [T K]``, h ``float32 [T K, I]``, y ``float32 [T K, E]``."""
        return sum(self._workspace_parts(int(np.prod(inputs[0][0][:-1], dtype=np.int64))))

    def _workspace_parts(self, tokens: int) -> list[int]:
        a = tokens * self.top_k
        return [_aligned(4 * (self.num_experts + 1)), _aligned(4 * a), _aligned(4 * a * self.intermediate_size), _aligned(4 * a * self.hidden_size)]

    # --- numerics (the contract) -----------------------------------------------------------------

    def reference(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """float64 NumPy of the module docstring's formula, rounded once to x's dtype.

        Raises:
            PluginError: wrong input count or shapes.
        """
        if len(inputs) != 5:
            raise PluginError(f"MoeExpertsPlugin takes 5 inputs, got {len(inputs)}")
        x, ids, w, gate_up, down = (np.asarray(a) for a in inputs)
        e_dim, k = self.hidden_size, self.top_k
        if x.shape[-1:] != (e_dim,) or ids.shape != x.shape[:-1] + (k,) or w.shape != ids.shape:
            raise PluginError(f"MoeExpertsPlugin: x {x.shape}, topk_ids {ids.shape}, topk_weights {w.shape} do not fit E={e_dim}, K={k}")
        if [gate_up.shape, down.shape] != self.weight_shapes():
            raise PluginError(f"MoeExpertsPlugin: gate_up {gate_up.shape} / down {down.shape}, expected {self.weight_shapes()}")
        xs = x.reshape(-1, e_dim).astype(np.float64)
        ids2, w2 = ids.reshape(-1, k), w.reshape(-1, k).astype(np.float64)
        gu, dn = gate_up.astype(np.float64), down.astype(np.float64)
        i = self.intermediate_size
        out = np.zeros_like(xs)
        for r in range(k):
            for e in np.unique(ids2[:, r]):
                if not 0 <= e < self.num_experts:
                    continue
                rows = np.nonzero(ids2[:, r] == e)[0]
                hg = xs[rows] @ gu[e].T
                act = hg[:, :i] / (1.0 + np.exp(-hg[:, :i])) * hg[:, i:]
                out[rows] += w2[rows, r, None] * (act @ dn[e].T)
        return [out.reshape(x.shape).astype(x.dtype)]

    # --- kernels -------------------------------------------------------------------------------

    def vec(self, dtype: Any, pointers: Sequence[int] = ()) -> int:
        """Elements per load of the kernels: 16 bytes where E and I are multiples of it and every
        pointer is 16-byte aligned, else 1."""
        v = 16 // np.dtype(dtype).itemsize
        if self.hidden_size % v or self.intermediate_size % v or any(p % 16 for p in pointers):
            return 1
        return v

    def enqueue(self, inputs: Sequence[DeviceTensor], outputs: Sequence[DeviceTensor], workspace: int, stream: int) -> None:
        """route, gate/up, down and reduce on ``stream`` (no allocation, no sync).

        Raises:
            PluginError: wrong input count or dtype, or no workspace.
        """
        if len(inputs) != 5:
            raise PluginError(f"MoeExpertsPlugin takes 5 inputs, got {len(inputs)}")
        x, ids, w, gate_up, down = inputs
        out = outputs[0]
        dtype = np.dtype(x.dtype)
        if dtype not in KERNEL_DTYPE_CODES or np.dtype(ids.dtype) != _INT32 or np.dtype(w.dtype) != _FLOAT32:
            raise PluginError(f"MoeExpertsPlugin.enqueue: dtypes x {dtype}, topk_ids {ids.dtype}, topk_weights {w.dtype} not supported")
        tokens = int(np.prod(x.shape[:-1], dtype=np.int64))
        if tokens == 0:
            return
        if not workspace:
            raise PluginError("MoeExpertsPlugin.enqueue: no workspace given (see workspace_size)")
        parts = self._workspace_parts(tokens)
        offsets = workspace
        perm = offsets + parts[0]
        h = perm + parts[1]
        y = h + parts[2]
        x_dim, e_dim, i_dim, k = self.num_experts, self.hidden_size, self.intermediate_size, self.top_k
        v = self.vec(dtype, [x.ptr, gate_up.ptr, down.ptr, workspace])
        kernels = _Kernels.of((("DTYPE", KERNEL_DTYPE_CODES[dtype]), ("VEC", v)))
        kernels.launch(
            "trtcore_moe_route", (1,), (256,), [(ids.ptr, "ptr"), (tokens * k, "i32"), (x_dim, "i32"), (offsets, "ptr"), (perm, "ptr")], stream
        )
        kernels.launch(
            "trtcore_moe_gate_up", (-(-i_dim // _WARPS), x_dim), (32 * _WARPS,),
            [(x.ptr, "ptr"), (gate_up.ptr, "ptr"), (offsets, "ptr"), (perm, "ptr"), (h, "ptr"), (e_dim, "i32"), (i_dim, "i32"), (k, "i32")],
            stream,
        )  # fmt: skip
        kernels.launch(
            "trtcore_moe_down", (-(-e_dim // _WARPS), x_dim), (32 * _WARPS,),
            [(h, "ptr"), (down.ptr, "ptr"), (offsets, "ptr"), (perm, "ptr"), (w.ptr, "ptr"), (y, "ptr"), (e_dim, "i32"), (i_dim, "i32")],
            stream,
        )  # fmt: skip
        kernels.launch(
            "trtcore_moe_reduce", (tokens,), (min(256, -(-e_dim // 32) * 32),),
            [(y, "ptr"), (ids.ptr, "ptr"), (out.ptr, "ptr"), (e_dim, "i32"), (k, "i32"), (x_dim, "i32")],
            stream,
        )  # fmt: skip


class _Kernels:
    """The loaded kernels of one variant of moe_experts.cu (loaded again in a new CUDA context)."""

    _all: ClassVar[dict[tuple[tuple[str, int], ...], _Kernels]] = {}
    _all_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, defines: tuple[tuple[str, int], ...]):
        self.defines = defines
        self.loaded: dict[str, Any] = {}
        self.lock = threading.Lock()

    @classmethod
    def of(cls, defines: tuple[tuple[str, int], ...]) -> _Kernels:
        with cls._all_lock:
            return cls._all.setdefault(defines, cls(defines))

    def _load(self, symbol: str, again: bool) -> Any:
        with self.lock:
            if again or symbol not in self.loaded:
                self.loaded[symbol] = _cubin(self.defines).function(symbol)
            return self.loaded[symbol]

    def launch(self, symbol: str, grid: tuple[int, ...], block: tuple[int, ...], args: list[Any], stream: int) -> None:
        """Launch programmatically (every kernel starts with PDL_WAIT)."""
        try:
            self._load(symbol, False).launch(grid, block, args, stream=stream, programmatic=True)
        except Exception as exc:  # loaded in another context
            if getattr(exc, "result", None) != "CUDA_ERROR_INVALID_CONTEXT":
                raise
            self._load(symbol, True).launch(grid, block, args, stream=stream, programmatic=True)


@functools.cache
def _cubin(defines: tuple[tuple[str, int], ...]) -> Any:
    from trtcore import kernels

    return kernels.compile_kernel("moe_experts", defines=dict(defines))
