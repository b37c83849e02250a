"""Weight-only quantized GEMM: the ``trtcore_weight_only_gemm`` plugin (W8A16, W4A16).

``y[..., N] = x[..., K] @ dequant(W)^T`` for a :class:`trtcore.quantization.QuantizedWeight`
``W`` (int8 per output channel or group-wise, int4 group-wise, symmetric or with zero points,
optionally act-order permuted), float16/bfloat16 (or float32) activations, float32
accumulation, one rounding to the activation dtype.

The weight is repacked once, when the network is defined (:func:`pack_weight`), into the
kernels' layout and travels as network constants (the plugin's inputs 1..4); the fields
carry only shapes and flags. The layout (``kernels/wq_gemm.cu`` documents it too):

* codes: ``int32 [N, K_pad * bits / 32]``. A *unit* is 8 consecutive codes along K, packed
  little end first into 32-bit words (int4: one word, code ``e`` at bits ``4e..4e+3``; int8:
  two words, code ``e`` at bits ``8(e % 4)..`` of word ``e // 4``). Rows are padded with zero
  codes to ``K_pad``, a multiple of ``TILE`` codes (1024 int4, 512 int8); within tile ``t``,
  the 16-byte vector ``t * 32 + lane`` holds the units ``t * 32 * UNITS + lane + 32 * u``
  (``UNITS`` = 4 int4, 2 int8), so one coalesced uint4 load per lane brings a whole tile
  into a warp and the lanes' activation loads are contiguous.
* scales, zeros: ``float32 [N, K / group_size]`` as in the QuantizedWeight (zeros only when
  the weight has them; symmetric uses ``2**(bits - 1)``).
* perm: ``int32 [K]`` (act-order only): stored column ``j`` multiplies ``x[..., perm[j]]``.

Kernels: M (the product of x's leading dimensions) up to :data:`DECODE_MAX_M` runs the
GEMV-style decode kernel (one warp per output row, every code dequantized once in registers
for all M rows, split-K over blocks with a deterministic reduction when N is small); larger
M runs a tiled float32 kernel (64 x 64 outputs per block, dequantized weights in shared
memory). Tensor cores are not used yet.

Numerical contract: :meth:`WeightOnlyGemmPlugin.reference` is float64 NumPy
(``x64 @ QuantizedWeight.dequantize().T`` rounded once to x's dtype); the kernels compute
``w = fmaf(q, s, -z * s)`` and accumulate ``w * x`` in float32, so they agree with it to
float32 accumulation error plus the final rounding (one output ulp at the largest magnitude
for K up to a few thousand, :func:`trtcore.testing.default_tolerance`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from trtcore.dtypes import KERNEL_DTYPE_CODES
from trtcore.quantization import SUPPORTED_BITS, QuantizedWeight

from .base import DeviceTensor, Dim, Plugin, PluginError

__all__ = ["DECODE_MAX_M", "PackedWeight", "WeightOnlyGemmPlugin", "pack_codes", "pack_weight", "unpack_codes", "unpack_weight"]

_INT32 = np.dtype(np.int32)
_FLOAT32 = np.dtype(np.float32)
#: largest M of the decode (GEMV) kernel (``DECODE_MAX_M`` in wq_gemm.cu)
DECODE_MAX_M = 8
#: output rows per decode block (``DECODE_WARPS``)
_DECODE_WARPS = 4
#: prefill tile (``BM`` x ``BN``)
_BM = _BN = 64
#: warps the decode kernel should have in flight before splitting K (about 2 waves of an H200's
#: 132 SMs x 32 resident warps)
_TARGET_WARPS = 8192


def units_per_vector(bits: int) -> int:
    """8-code units per 16-byte vector: 4 (int4) or 2 (int8)."""
    return 4 if bits == 4 else 2


def tile_codes(bits: int) -> int:
    """Codes per row in one warp-wide load (``TILE``): 1024 (int4) or 512 (int8)."""
    return 32 * units_per_vector(bits) * 8


def padded_k(k: int, bits: int) -> int:
    """K rounded up to a multiple of :func:`tile_codes`."""
    t = tile_codes(bits)
    return -(-k // t) * t


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned codes ``uint8 [N, K]`` into the kernels' ``int32 [N, K_pad * bits / 32]`` layout
    (module docstring).

    Raises:
        PluginError: bits not 4 or 8, K not a multiple of 8, or a code out of range.
    """
    if bits not in SUPPORTED_BITS:
        raise PluginError(f"pack_codes: bits must be one of {SUPPORTED_BITS}, got {bits!r}")
    n, k = codes.shape
    if k % 8:
        raise PluginError(f"pack_codes: K must be a multiple of 8, got {k}")
    if codes.size and int(codes.max()) >= 1 << bits:
        raise PluginError(f"pack_codes: codes must be below 2**{bits}, got {int(codes.max())}")
    kp, units = padded_k(k, bits), units_per_vector(bits)
    padded = np.zeros((n, kp), np.uint32)
    padded[:, :k] = codes
    per_word = 32 // bits
    # [n, tile, u, lane, 8] -> [n, tile, lane, u, words of the unit, codes of a word]
    u = padded.reshape(n, kp // tile_codes(bits), units, 32, 8).transpose(0, 1, 3, 2, 4)
    u = u.reshape(*u.shape[:4], 8 // per_word, per_word)
    shifts = (np.arange(per_word, dtype=np.uint32) * bits).astype(np.uint32)
    words = np.bitwise_or.reduce(u << shifts, axis=-1).astype(np.uint32)
    return words.reshape(n, kp * bits // 32).view(np.int32)


def unpack_codes(packed: np.ndarray, bits: int, k: int) -> np.ndarray:
    """The inverse of :func:`pack_codes`: ``uint8 [N, K]``."""
    n = packed.shape[0]
    kp, units, per_word = padded_k(k, bits), units_per_vector(bits), 32 // bits
    if packed.shape != (n, kp * bits // 32):
        raise PluginError(f"unpack_codes: packed codes must be int32 [{n}, {kp * bits // 32}] for K={k}, bits={bits}; got {packed.shape}")
    words = np.ascontiguousarray(packed).view(np.uint32).reshape(n, kp // tile_codes(bits), 32, units, 8 // per_word, 1)
    shifts = (np.arange(per_word, dtype=np.uint32) * bits).astype(np.uint32)
    codes = (words >> shifts) & np.uint32((1 << bits) - 1)  # [n, tile, lane, u, words, per_word]
    codes = codes.reshape(n, kp // tile_codes(bits), 32, units, 8).transpose(0, 1, 3, 2, 4).reshape(n, kp)
    return codes[:, :k].astype(np.uint8)


@dataclass(frozen=True)
class PackedWeight:
    """A :class:`~trtcore.quantization.QuantizedWeight` in the kernels' layout: the plugin's
    constant inputs (module docstring).

    Attributes:
        codes: ``int32 [N, K_pad * bits / 32]``.
        scales: ``float32 [N, K / group_size]``.
        zeros: ``float32 [N, K / group_size]`` or None (symmetric).
        perm: ``int32 [K]`` or None.
        bits, group_size, in_features (K), out_features (N).
    """

    codes: np.ndarray
    scales: np.ndarray
    zeros: np.ndarray | None
    perm: np.ndarray | None
    bits: int
    group_size: int
    in_features: int
    out_features: int

    def arrays(self) -> list[np.ndarray]:
        """The plugin's inputs after x, in order: codes, scales, [zeros], [perm]."""
        return [a for a in (self.codes, self.scales, self.zeros, self.perm) if a is not None]


def pack_weight(qw: QuantizedWeight) -> PackedWeight:
    """Repack ``qw`` for the kernels (once, at build).

    Raises:
        PluginError: K or group_size not a multiple of 8 (the kernels' unit).
    """
    n, k = qw.shape
    if qw.group_size % 8:
        raise PluginError(f"weight-only GEMM: group_size must be a multiple of 8, got {qw.group_size}")
    zeros = None if qw.zeros is None else np.ascontiguousarray(qw.zeros, np.float32)
    perm = None if qw.perm is None else np.ascontiguousarray(qw.perm, np.int32)
    return PackedWeight(pack_codes(qw.codes, qw.bits), np.ascontiguousarray(qw.scales, np.float32), zeros, perm, qw.bits, qw.group_size, k, n)


def unpack_weight(pw: PackedWeight) -> QuantizedWeight:
    """The :class:`QuantizedWeight` ``pw`` was packed from (exactly)."""
    codes = unpack_codes(pw.codes, pw.bits, pw.in_features)
    return QuantizedWeight(codes, pw.scales, pw.zeros, pw.bits, pw.group_size, pw.perm)


@dataclass
class WeightOnlyGemmPlugin(Plugin):
    """``y = x @ dequant(W)^T`` (plugin ``trtcore_weight_only_gemm``, version 1, namespace ``trtcore``).

    Inputs (make them with :meth:`from_quantized` / :func:`pack_weight`):

    ===  ======  ==================================  ===========================================
    #    name    shape                               dtype
    ===  ======  ==================================  ===========================================
    0    x       ``[..., K]``                        float16, bfloat16 or float32
    1    codes   ``[N, K_pad * bits / 32]``          int32 (:func:`pack_codes`)
    2    scales  ``[N, K / group_size]``             float32
    3    zeros   ``[N, K / group_size]``             float32, only when ``has_zeros``
    4    perm    ``[K]``                             int32, only when ``has_perm``
    ===  ======  ==================================  ===========================================

    Output: ``y [..., N]`` of x's dtype.

    Fields:
        in_features: K (a multiple of 8). out_features: N.
        bits: 4 or 8. group_size: K-elements per scale (a multiple of 8 dividing K; K for one
            scale per output channel).
        has_zeros: zero points given (else symmetric, ``2**(bits - 1)``).
        has_perm: act-order permutation given.
    """

    plugin_name: ClassVar[str] = "trtcore_weight_only_gemm"
    plugin_version: ClassVar[str] = "1"
    num_outputs: ClassVar[int] = 1

    in_features: int
    out_features: int
    bits: int
    group_size: int
    has_zeros: bool = False
    has_perm: bool = False

    def validate(self) -> None:
        if self.bits not in SUPPORTED_BITS:
            raise PluginError(f"WeightOnlyGemmPlugin.bits must be one of {SUPPORTED_BITS}, got {self.bits!r}")
        k, g = self.in_features, self.group_size
        if k <= 0 or k % 8:
            raise PluginError(f"WeightOnlyGemmPlugin.in_features must be a positive multiple of 8, got {k!r}")
        if self.out_features <= 0:
            raise PluginError(f"WeightOnlyGemmPlugin.out_features must be positive, got {self.out_features!r}")
        if g <= 0 or g % 8 or k % g:
            raise PluginError(f"WeightOnlyGemmPlugin.group_size must be a multiple of 8 dividing in_features={k}, got {g!r}")

    @classmethod
    def from_quantized(cls, qw: QuantizedWeight) -> tuple[WeightOnlyGemmPlugin, PackedWeight]:
        """The plugin for ``qw`` and its constant inputs (packed once, here)."""
        pw = pack_weight(qw)
        plugin = cls(pw.in_features, pw.out_features, pw.bits, pw.group_size, pw.zeros is not None, pw.perm is not None)
        return plugin, pw

    @property
    def num_inputs(self) -> int:
        return 3 + int(self.has_zeros) + int(self.has_perm)

    @property
    def groups(self) -> int:
        return self.in_features // self.group_size

    def input_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the constant inputs 1.. (codes, scales, [zeros], [perm])."""
        n, k = self.out_features, self.in_features
        shapes: list[tuple[int, ...]] = [(n, padded_k(k, self.bits) * self.bits // 32), (n, self.groups)]
        if self.has_zeros:
            shapes.append((n, self.groups))
        if self.has_perm:
            shapes.append((k,))
        return shapes

    def _constant_dtypes(self) -> list[np.dtype]:
        return [_INT32, _FLOAT32] + [_FLOAT32] * int(self.has_zeros) + [_INT32] * int(self.has_perm)

    def _check_count(self, n: int) -> None:
        if n != self.num_inputs:
            raise PluginError(
                f"WeightOnlyGemmPlugin takes {self.num_inputs} inputs (x, codes, scales{', zeros' * self.has_zeros}{', perm' * self.has_perm}), got {n}"
            )

    # --- shapes and types ----------------------------------------------------------------------

    def output_dtypes(self, input_dtypes: Sequence[np.dtype]) -> list[np.dtype]:
        self._check_count(len(input_dtypes))
        d = np.dtype(input_dtypes[0])
        if d not in KERNEL_DTYPE_CODES:
            raise PluginError(f"WeightOnlyGemmPlugin: x must be float16, bfloat16 or float32, got {d}")
        return [d]

    def output_shapes(self, input_shapes: Sequence[Sequence[Dim]]) -> list[list[Dim]]:
        self._check_count(len(input_shapes))
        x = list(input_shapes[0])
        if not x:
            raise PluginError("WeightOnlyGemmPlugin: x must have rank >= 1 ([..., in_features])")
        last = getattr(x[-1], "value", x[-1])
        if isinstance(last, int) and last >= 0 and last != self.in_features:
            raise PluginError(f"WeightOnlyGemmPlugin: x's last dimension is {last}, expected in_features={self.in_features}")
        return [x[:-1] + [Dim(self.out_features)]]

    def supports(self, pos: int, dtypes: Sequence[np.dtype], num_inputs: int) -> bool:
        if num_inputs != self.num_inputs:
            return False
        d = np.dtype(dtypes[pos])
        if pos == 0:
            return d in KERNEL_DTYPE_CODES
        if pos >= num_inputs:
            return d == np.dtype(dtypes[0])
        return d == self._constant_dtypes()[pos - 1]

    # --- numerics (the contract) -----------------------------------------------------------------

    def quantized_weight(self, *constants: np.ndarray) -> QuantizedWeight:
        """The :class:`QuantizedWeight` the constant inputs (codes, scales, [zeros], [perm]) hold."""
        if len(constants) != self.num_inputs - 1:
            raise PluginError(f"WeightOnlyGemmPlugin: expected {self.num_inputs - 1} constant inputs, got {len(constants)}")
        it = iter(np.asarray(c) for c in constants)
        codes, scales = next(it), next(it)
        zeros = next(it) if self.has_zeros else None
        perm = next(it) if self.has_perm else None
        pw = PackedWeight(codes, scales, zeros, perm, self.bits, self.group_size, self.in_features, self.out_features)
        return unpack_weight(pw)

    def reference(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """float64 NumPy: ``x64 @ dequantize(W)^T`` rounded once to x's dtype.

        Raises:
            PluginError: wrong input count or x's last dimension is not in_features.
        """
        self._check_count(len(inputs))
        x = np.asarray(inputs[0])
        if x.shape[-1:] != (self.in_features,):
            raise PluginError(f"WeightOnlyGemmPlugin: x {x.shape} must end in in_features={self.in_features}")
        w = self.quantized_weight(*inputs[1:]).dequantize()
        y = x.astype(np.float64).reshape(-1, self.in_features) @ w.T
        return [y.reshape(*x.shape[:-1], self.out_features).astype(x.dtype)]

    # --- kernels -------------------------------------------------------------------------------

    def defines(self, dtype: Any) -> dict[str, int]:
        """The kernels' compile-time defines for activation ``dtype``."""
        return {"DTYPE": KERNEL_DTYPE_CODES[np.dtype(dtype)], "BITS": self.bits, "HAS_ZEROS": int(self.has_zeros), "HAS_PERM": int(self.has_perm)}

    def decode_splits(self) -> int:
        """K-splits of the decode kernel: enough blocks that about :data:`_TARGET_WARPS` warps
        run (N warps without a split), at most one tile per split; 1 means no partials."""
        tiles = padded_k(self.in_features, self.bits) // tile_codes(self.bits)
        want = max(1, -(-_TARGET_WARPS // self.out_features))
        splits = min(tiles, want)
        per = -(-tiles // splits)
        return -(-tiles // per)  # no empty split

    def workspace_size(self, inputs: Sequence[tuple[tuple[int, ...], np.dtype]], outputs: Sequence[tuple[tuple[int, ...], np.dtype]]) -> int:
        """float32 split-K partials ``[splits, M, N]`` of the decode kernel (0 without a split)."""
        splits = self.decode_splits()
        if splits == 1:
            return 0
        m = int(np.prod(inputs[0][0][:-1], dtype=np.int64))
        return splits * min(m, DECODE_MAX_M) * self.out_features * 4

    def enqueue(self, inputs: Sequence[DeviceTensor], outputs: Sequence[DeviceTensor], workspace: int, stream: int) -> None:
        """Decode kernel for M <= :data:`DECODE_MAX_M` (plus the split-K reduction), tiled kernel
        above; on ``stream``, no allocation, no sync.

        Raises:
            PluginError: unsupported dtype, M beyond the grid, or a split needs a workspace
                that was not given.
        """
        self._check_count(len(inputs))
        x, out = inputs[0], outputs[0]
        dtype = np.dtype(x.dtype)
        if dtype not in KERNEL_DTYPE_CODES:
            raise PluginError(f"WeightOnlyGemmPlugin.enqueue: x dtype {dtype} not supported")
        m = int(np.prod(x.shape[:-1], dtype=np.int64))
        if m == 0:
            return
        n, k = self.out_features, self.in_features
        zeros = inputs[3].ptr if self.has_zeros else 0
        perm = inputs[3 + int(self.has_zeros)].ptr if self.has_perm else 0
        common = [(x.ptr, "ptr"), (inputs[1].ptr, "ptr"), (inputs[2].ptr, "ptr"), (zeros, "ptr"), (perm, "ptr"), (out.ptr, "ptr")]
        defines = tuple(sorted(self.defines(dtype).items()))
        if m <= DECODE_MAX_M:
            splits = self.decode_splits()
            if splits > 1 and not workspace:
                raise PluginError(f"WeightOnlyGemmPlugin: {splits} K-splits need a workspace of {splits * m * n * 4} bytes")
            tiles = padded_k(k, self.bits) // tile_codes(self.bits)
            per = -(-tiles // splits)
            args = [*common, (workspace if splits > 1 else 0, "ptr"), (m, "i32"), (n, "i32"), (k, "i32"), (self.group_size, "i32"), (per, "i32")]
            _launch(defines, "trtcore_wq_gemv", (-(-n // _DECODE_WARPS), splits), (32 * _DECODE_WARPS,), args, stream)
            if splits > 1:
                red = [(workspace, "ptr"), (out.ptr, "ptr"), (m * n, "i32"), (splits, "i32")]
                _launch(defines, "trtcore_wq_splitk_reduce", (-(-(m * n) // 256),), (256,), red, stream)
            return
        if -(-m // _BM) > 65535:
            raise PluginError(f"WeightOnlyGemmPlugin: M={m} rows exceed the prefill kernel's grid (at most {65535 * _BM})")
        args = [*common, (m, "i32"), (n, "i32"), (k, "i32"), (self.group_size, "i32")]
        _launch(defines, "trtcore_wq_gemm", (-(-n // _BN), -(-m // _BM)), (256,), args, stream)


_lock = threading.Lock()
_functions: dict[tuple[tuple[tuple[str, int], ...], str], Any] = {}


@functools.cache
def _compiled(defines: tuple[tuple[str, int], ...]) -> Any:
    from trtcore import kernels

    return kernels.compile_kernel("wq_gemm", defines=dict(defines))


def _function(defines: tuple[tuple[str, int], ...], name: str, reload: bool = False) -> Any:
    """The loaded kernel ``name`` of the variant ``defines`` (compiled once per process,
    disk-cached; ``reload`` after the current context changed)."""
    fn = None if reload else _functions.get((defines, name))
    if fn is None:
        with _lock:
            fn = _compiled(defines).function(name)
            _functions[(defines, name)] = fn
    return fn


def _launch(defines: tuple[tuple[str, int], ...], name: str, grid: tuple[int, ...], block: tuple[int, ...], args: list, stream: int) -> None:
    try:
        _function(defines, name).launch(grid, block, args, stream=stream, programmatic=True)  # kernels start with PDL_WAIT
    except Exception as exc:  # loaded in another context: load it here
        if getattr(exc, "result", None) != "CUDA_ERROR_INVALID_CONTEXT":
            raise
        _function(defines, name, reload=True).launch(grid, block, args, stream=stream, programmatic=True)
