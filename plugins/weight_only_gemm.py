"""Weight-only quantized GEMM: the ``trtcore_weight_only_gemm`` plugin (W8A16, W4A16).

``y[..., N] = x[..., K] @ dequant(W)^T`` for a :class:`trtcore.quantization.QuantizedWeight`
``W`` (int8 per output channel or group-wise, int4 group-wise, symmetric or with zero points,
optionally act-order permuted), float16/bfloat16 (or float32) activations, float32
accumulation, one rounding to the activation dtype.

The weight is repacked once, when the network is defined (:func:`pack_weight`), into the
kernels' layout and travels as network constants (the plugin's inputs 1..4); the fields
carry only shapes and flags. The layout is the A-operand layout of the tensor cores'
``mma.m16n8k16`` (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type";
``kernels/wq_gemm.cu`` documents it too), so one 16-byte load per lane gives a warp its
fragments:

* codes: ``int32 [N_pad / 16, chunks * 128]``: rows in tiles of 16 (N padded to ``N_pad``
  with zero codes), K in chunks of :func:`chunk_codes` codes (64 int4, 32 int8; padded with
  zero codes); tile ``t``'s row holds ``chunks * 32`` 16-byte vectors, vector ``c * 32 + lane``
  holding the codes lane ``lane = 4 gid + tid`` feeds to the mma's k-steps ``j`` of chunk
  ``c`` (rows ``16 t + gid`` and ``+ 8``, columns ``k0 + 2 tid``, ``+ 1``, ``+ 8``, ``+ 9`` of
  ``k0 = c * chunk + 16 j``); :func:`code_position` is the per-code formula.
* scales, zeros: ``float32 [N_pad / 16, groups * 16]`` (tile, group, row in tile; padded rows
  0); zeros only when the weight has them (symmetric uses ``2**(bits - 1)``).
* perm: ``int32 [K]`` (act-order only): stored column ``j`` multiplies ``x[..., perm[j]]``.
* contiguous x order (:attr:`PackedWeight.contiguous_x`, possible where every group is whole
  chunks and there is no act order; used where :data:`CONTIGUOUS_X` or ``pack_weight``'s
  argument asks): the columns above are stored columns, stored column ``L`` holding weight
  column :func:`contiguous_x_order` ``[L]``, a permutation inside each chunk under which the x
  columns a lane multiplies in a chunk are one contiguous run (16-byte loads of x in the decode
  kernels, instead of 4-byte ones).

Kernels: float16/bfloat16 x with a group size that is a multiple of 16 (or K) and M (the
product of x's leading dimensions) up to :data:`DECODE_MAX_M` runs on the tensor cores (one
block per 16-row tile of W and slice of at most 16 rows of x,
:meth:`WeightOnlyGemmPlugin.decode_warps` warps sharing its K, the codes dequantized to exact
16-bit integers, the scales applied in float32 per group): up to 8 rows in
``trtcore_wq_gemv``, more in ``trtcore_wq_gemv16``, which with :data:`PREFILL_KERNEL`
``"tensor_cores"`` takes any M (prefill) in ``ceil(M / 16)`` slices that re-read a tile's codes
(mostly from L2). From :data:`CUBLAS_MIN_M` rows (above :data:`DECODE_MAX_M` where the group
size does not suit the tensor cores) the default prefill (:data:`PREFILL_KERNEL` ``"cublas"``)
dequantizes W block by block into the workspace
(``trtcore_wq_dequantize``, :meth:`WeightOnlyGemmPlugin.block_rows` rows of x's dtype) and runs
cuBLASLt's float16/bfloat16 GEMM on each (:class:`trtcore.cuda.cublaslt.LinearMatmul`).
Everything else runs a tiled float32 kernel (64 x 64 outputs per block, dequantized weights in
shared memory).

The M <= 8 decode kernel has a second version (v2, ``WQ_DECODE 2`` in kernels/wq_gemm.cu),
the default (:data:`DEFAULT_DECODE`, measured) where :meth:`WeightOnlyGemmPlugin.fast_decode`
allows it (no act order, groups of whole chunks), or the setting :data:`DECODE_VARIANT` (or
``TRTCORE_WQ_DECODE``) gives: fewer instructions per byte (two row tiles per warp, the magic
offset folded into the flush, units of several chunks per group, optional L2 prefetch), and
with ``ASYNC`` the weights in flight in shared memory (cp.async) instead of registers;
``{"WQ_DECODE": 1}`` selects v1.

SwiGLU (:attr:`WeightOnlyGemmPlugin.swiglu`, made by the cuda backend's
:mod:`trtcore.cuda.swiglu_fusion` from a fused gate/up plugin followed by ``silu(gate) * up``):
the gate and up rows are interleaved by 8 (:func:`swiglu_order`), so the tensor-core kernels
write ``silu(gate) * up`` from their epilogue (``GATED``), half the output and no SwiGLU kernel;
the ``"cublas"`` prefill and the tiled kernel stage the GEMM output in the workspace and
``trtcore_wq_swiglu`` follows. The activation's numbers are the unfused graph's
(:func:`swiglu_reference`).

RoPE (:attr:`WeightOnlyGemmPlugin.rope_rows`, made by the cuda backend's
:mod:`trtcore.cuda.rope_fusion` from a fused q/k/v plugin whose q and k feed a
:class:`~trtcore.plugins.rope.RopePlugin`): each q and k head's rows are stored in
:func:`rope_order`, so a thread's mma D fragment holds a rotation pair ``(i, i + head_dim / 2)``
and the tensor-core kernels rotate q and k by each row's position in their epilogue (``ROPE``,
with the RoPE plugin's ``kernels/rope.cuh``), writing every feature at its natural place: the
RoPE plugin's launch goes away. The staged paths rotate with ``trtcore_wq_rope``. The numbers
are the unfused graph's (:func:`rope_reference`).

Residual add + RMSNorm (:attr:`WeightOnlyGemmPlugin.add_norm`, made by the cuda backend's
:mod:`trtcore.cuda.add_norm_fusion` from an o_proj / down_proj plugin whose output is added to
the residual stream and then normalized): the plugin takes the residual, the norm's weight and a
one-word counter as three more inputs and has two outputs, ``h = y + residual`` and
``RMSNorm(h)`` (:func:`add_norm_reference`). The v2 decode kernel computes them in its grid's
last block (``ADD_NORM``: each block takes a ticket from the counter after storing its tiles of
y; the last one reads all of y), so the row kernel that waited for the GEMM goes away; the other
paths launch ``trtcore_wq_add_norm`` after the GEMM. The counter is engine memory that every
launch leaves at 0 (a constant input, zero when loaded): one engine's launches of the plugin must
not run concurrently on two streams.

The same add and norm split between two GEMMs (:attr:`WeightOnlyGemmPlugin.add_residual` and
:attr:`WeightOnlyGemmPlugin.norm_input`, made by :mod:`trtcore.cuda.norm_input_fusion`): the
GEMM before the add writes ``h = y + residual`` from its epilogue (``store_rows``; the tiled and
cuBLAS paths launch ``trtcore_wq_add_residual`` after the GEMM), and each GEMM that reads the
norm takes ``h`` and the norm's weight instead and normalizes x itself. RMSNorm's scale is one
number per row of x, so the v2 decode kernel folds it out of the GEMM (``NORM_X``,
:meth:`WeightOnlyGemmPlugin.norm_folds`): ``y = round(inv * (round(h * w) @ W^T))``, the
squares of h summed on the way (:func:`rms_norm_folded_reference`); no pass over x before the
weights stream, whatever the grid. Every other path runs ``trtcore_wq_rms_norm`` into the
workspace first, the unfused graph's numbers (:func:`rms_norm_reference`). No kernel runs
between the two GEMMs at decode, but on an H100 the folded GEMVs cost more than the row kernel
they save (the pass's module docstring), so the pass is opt-in.

Numerical contract: :meth:`WeightOnlyGemmPlugin.reference` is float64 NumPy
(``x64 @ QuantizedWeight.dequantize().T`` rounded once to x's dtype); the kernels accumulate
in float32 (the decode kernel: exact products of the integer codes and x summed per group,
then scaled; the tiled kernel: ``w = fmaf(q, s, -z * s)`` times x), so they agree with it to
float32 accumulation error plus the final rounding (one output ulp at the largest magnitude
for K up to a few thousand, :func:`trtcore.testing.default_tolerance`). The ``"cublas"``
prefill rounds each weight ``(q - z) * s`` once more, to x's dtype, before cuBLASLt's float32
accumulation (as TensorRT-LLM's and vLLM's weight-only GEMMs convert the weight to the
activation type): a relative error of at most ``2**-9`` (bfloat16) / ``2**-12`` (float16) per
weight, of random sign, so about ``2**-9 / sqrt(3)`` of a typical output for bfloat16, within
the same tolerance.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import ml_dtypes
import numpy as np

from trtcore.dtypes import KERNEL_DTYPE_CODES, lookup
from trtcore.quantization import SUPPORTED_BITS, QuantizedWeight

from .base import DeviceTensor, LinearShapes, Plugin, PluginError
from .fp8_gemm import LT_WORKSPACE
from .launcher import KernelLauncher

__all__ = [
    "CONTIGUOUS_X",
    "CUBLAS_MIN_M",
    "DECODE_MAX_M",
    "DECODE_VARIANT",
    "DEFAULT_DECODE",
    "DECODE_RULE",
    "GROUP_UNIT",
    "DEQUANT_BLOCK_BYTES",
    "PREFILL_KERNEL",
    "PREFILL_KERNELS",
    "PackedWeight",
    "WeightOnlyGemmPlugin",
    "can_contiguous_x",
    "chunk_codes",
    "code_position",
    "contiguous_x_order",
    "pack_codes",
    "pack_groups",
    "pack_weight",
    "rope_order",
    "rope_reference",
    "swiglu_order",
    "swiglu_reference",
    "unpack_codes",
    "unpack_groups",
    "unpack_weight",
]

_INT32 = np.dtype(np.int32)
_FLOAT32 = np.dtype(np.float32)
_FLOAT16 = np.dtype(np.float16)
_BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
#: rows of x one block of the tensor-core kernels computes (``trtcore_wq_gemv``: M up to 8 in
#: one slice; ``_gemv16``: slices of 16 rows, ``ceil(M / 16)`` of them in the launch's grid)
DECODE_MAX_M = 16
#: rows per tile (the mma's M)
TILE_ROWS = 16
#: most warps of a decode block (``MAX_WARPS`` in wq_gemm.cu)
_MAX_WARPS = 16
#: prefill tile (``BM`` x ``BN``)
_BM = _BN = 64


def _variant_from_env() -> dict[str, int]:
    """``TRTCORE_WQ_DECODE``: a JSON object of :data:`DECODE_VARIANT` (e.g.
    ``{"WQ_DECODE": 2, "ROW_TILES": 2, "SEG": 2, "WARPS": 8}``), read once at import; unset or
    invalid (a warning): ``{}``."""
    text = os.environ.get("TRTCORE_WQ_DECODE", "")
    if not text:
        return {}
    try:
        value = json.loads(text)
        if not isinstance(value, dict) or not all(isinstance(k, str) and type(v) is int for k, v in value.items()):
            raise ValueError("not an object of integers")
    except ValueError as exc:
        warnings.warn(f"TRTCORE_WQ_DECODE={text!r} ignored: {exc}", stacklevel=2)
        return {}
    return value


#: the M <= 8 decode kernel's variant, extra defines of kernels/wq_gemm.cu: {} is the default
#: (v1); {"WQ_DECODE": 2, "ROW_TILES": 1 | 2, "WQ_FOLD": 0 | 1, "SEG": 1 .. 4, "L2_PF": 0 ..,
#: "L2_HINT": 0 | 1 | 2, "ASYNC": 0 | 2 .., "XPF": 0 | 1} (ASYNC: units in flight per warp in
#: shared memory, lowered to what :data:`_RING_SMEM` holds for the block's warps,
#: :func:`async_depth`; XPF: with ASYNC on the contiguous-x order, x loaded a unit ahead)
#: (any subset; UNROLL too) selects v2 where :meth:`WeightOnlyGemmPlugin.fast_decode` allows it
#: (SEG falls back to 1 where it does not divide the chunks per group); "WARPS" (not a define)
#: sets its warps per block instead of :meth:`WeightOnlyGemmPlugin.decode_warps`.
#: bench/bench_wq_gemm.py --tune times them; ``TRTCORE_WQ_DECODE`` sets it (:func:`_variant_from_env`).
DECODE_VARIANT: dict[str, int] = _variant_from_env()
#: the M <= 8 decode kernel the plugin runs when :data:`DECODE_VARIANT` is empty: v2 with these
#: defines per bit width, where :meth:`WeightOnlyGemmPlugin.fast_decode` allows it (else v1).
#: Chosen from the H200 tune of bench/bench_wq_gemm.py --tune on the Llama-3-8B MLP shapes at
#: M = 1 (bench/results/h200-2026-12-02-session5/call4-e2e-8b-wq/wq_tune.txt): int4 g128 2.70x /
#: 2.96x cuBLAS bfloat16 (v1: 2.05x / 2.32x), int8 per channel 1.86x / 1.94x (v1: 1.13x / 1.21x)
DEFAULT_DECODE: dict[int, dict[str, int]] = {
    4: {"WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1},
    8: {"WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 2},
}
#: the kernels of float16/bfloat16 x with more than :data:`DECODE_MAX_M` rows (prefill), one of
#: :data:`PREFILL_KERNELS` (``TRTCORE_WQ_PREFILL``, read at import). Measured on the H200, W4A16
#: g128, Llama-3-8B gate+up fused 28672 x 4096 / down 4096 x 14336, microseconds, one weight in
#: one block (bench/bench_wq_prefill.py, bench/results/h200-2026-12-04-session19/call4; the
#: M = 32 "cublas" cells from call3, where it ran at 32 rows):
#:
#: ====  =================  ============  ============  ===========
#: M     cublas             tensor_cores  tiled         cuBLAS bf16
#: ====  =================  ============  ============  ===========
#: 32    158 / 85           142 / 83      928 / 974     69 / 36
#: 48    158 / 85           209 / 123     935 / 1017    68 / 38
#: 128   162 / 88           538 / 325     1585 / 1143   72 / 41
#: 512   248 / 126          2117 / 1268   6107 / 3291   161 / 84
#: 2048  702 / 340          8499 / 5003   -             636 / 306
#: ====  =================  ============  ============  ===========
#:
#: * ``"cublas"`` (the default): from :data:`CUBLAS_MIN_M` rows (and above
#:   :data:`DECODE_MAX_M` for group sizes the tensor-core kernels do not take),
#:   ``trtcore_wq_dequantize`` writes blocks of :meth:`WeightOnlyGemmPlugin.block_rows` rows of W
#:   in x's dtype into the workspace and cuBLASLt multiplies x by each on the tensor cores (the
#:   recipe vLLM's AWQ layer takes from 256 tokens on: dequantize, then a dense GEMM); below
#:   :data:`CUBLAS_MIN_M` rows the 16-row tensor-core kernel, as ``"tensor_cores"``;
#: * ``"tensor_cores"``: ``trtcore_wq_gemv16`` with ``ceil(M / 16)`` slices of 16 rows in its
#:   grid, each slice reading and dequantizing all of W again;
#: * ``"tiled"``: ``trtcore_wq_gemm``, float32 FMAs, no tensor cores.
PREFILL_KERNELS = ("cublas", "tensor_cores", "tiled")
PREFILL_KERNEL: str = os.environ.get("TRTCORE_WQ_PREFILL", "cublas")
if PREFILL_KERNEL not in PREFILL_KERNELS:
    warnings.warn(f"TRTCORE_WQ_PREFILL={PREFILL_KERNEL!r} ignored: expected one of {PREFILL_KERNELS}", stacklevel=1)
    PREFILL_KERNEL = "cublas"
#: the fewest rows the ``"cublas"`` prefill takes where the tensor-core kernels could (the table
#: above: the 16-row kernel is faster at 32 rows on both shapes, slower at 48)
CUBLAS_MIN_M = 40
#: bytes of W one block of the ``"cublas"`` prefill dequantizes, the workspace's largest part:
#: every Llama-3-8B decoder linear in one block (gate+up fused: 224 MiB), a 128k-token vocabulary's
#: lm_head in 4. One block was the fastest in the measurement above; 32 MiB blocks, which would
#: stay in the 60 MB L2 between the dequantize kernel and the GEMM, were 5-22% slower
DEQUANT_BLOCK_BYTES = 256 << 20
#: the block's rows are a multiple of this (whole tiles of cuBLASLt's GEMM, 256-byte aligned
#: output columns)
_BLOCK_ROW_UNIT = 128
#: elements of a row each thread of ``trtcore_wq_add_norm`` keeps in registers (kernels/wq_gemm.cu AN_CACHE)
_ADD_NORM_CACHE = 16
#: the activation dtypes of the tensor-core kernels and the ``"cublas"`` prefill
_HALF_TYPES = (_FLOAT16, _BFLOAT16)
#: the workspace's parts are aligned to this many bytes
_WS_ALIGN = 256
#: whether :func:`pack_weight` stores weights in :func:`contiguous_x_order` where
#: :func:`can_contiguous_x` allows it (the default; ``TRTCORE_WQ_CONTIGUOUS_X=0``, read at
#: import, keeps the natural order). Measured on the H200 at M = 1 with the default decode
#: kernel, natural -> contiguous-x (bench/bench_wq_gemm.py --natural-order,
#: bench/results/h200-2026-12-03-session7): int4 g128 3-7% faster on the Llama-3-8B shapes
#: (gate_up 11.23 -> 10.88 us, down 10.58 -> 10.10, gate+up fused 20.64 -> 19.60, qkv fused
#: 6.67 -> 6.46, o_proj 4.64 -> 4.32), int8 per channel 1-5% (16.49 -> 16.05, 16.24 -> 15.87, ...)
CONTIGUOUS_X: bool = os.environ.get("TRTCORE_WQ_CONTIGUOUS_X", "1") != "0"
#: warps :data:`DEFAULT_DECODE`'s kernel launches in all (the tune's best: 4 per tile on
#: 14336 rows, 16 on 4096)
_V2_TARGET_WARPS = 4096
#: the default v2 decode kernel's choices by shape (:meth:`WeightOnlyGemmPlugin.decode_variant`),
#: from bench/bench_wq_gemm.py --tune at M = 1 on the shapes the cuda engine runs for Llama-3-8B
#: (H100, bench/results/h200-2026-12-06-session32/call1; the H200's of session 16 agree on
#: 14336 x 4096, 10.61 against 10.90 us):
#:
#: * ``"min_warps"``: at least this many warps a block (where K has the units): the 4-bit
#:   lm_head (128256 x 4096, 8016 tiles) got one from the warp target and took 96.6 us against
#:   88.6 with two (zero points 111.9 against 101.1, int8 182.9 against 171.3);
#: * ``"unroll2_max_warps"``: 4-bit without zero points, ``UNROLL`` 2 where a block has at most
#:   this many warps (a long chain of units each): 14336 x 4096 11.43 against 12.01 us, gate+up
#:   fused 28672 x 4096 21.63 against 22.38; with more warps (qkv 8, o_proj and down 16) and with
#:   zero points UNROLL 1 stays faster (6.49 / 4.35 / 11.53 us; zero points 13.64 against 18.89).
#:
#: ``{"min_warps": 1, "unroll2_max_warps": 0}`` is the rule before (bench_quant_e2e's
#: ``, decode rule off``). On the H200 (bench/results/h200-2026-12-06-session32, call 2) the 4-bit
#: Llama-3-8B batch-1 step took 1.887 ms with it against 1.927 without.
DECODE_RULE: dict[str, int] = {"min_warps": 2, "unroll2_max_warps": 4}
#: warps the decode kernel should launch in all (about two H200 waves of 132 SMs x 32 warps):
#: a weight with few tiles gives each tile more warps (measured on the 8B MLP shapes,
#: bench/bench_wq_gemm.py --tune)
_TARGET_WARPS = 8192


#: K and every group size (per channel: K) are multiples of this many codes (the kernels' unit)
GROUP_UNIT = 8


#: dynamic shared memory the decode kernel's cp.async rings may take per block: within what every
#: GPU that runs it admits when asked (compute capability 8.0+: 99 KiB on 8.6 / 8.9, 163 on 8.0,
#: 227 on 9.0; CUDA C++ Programming Guide, "Features and Technical Specifications")
_RING_SMEM = 96 * 1024


#: the deepest ring (kernels/wq_gemm.cu refuses more: ptxas clamps cp.async.wait_group's count
#: at 63, and past some tens of units in flight a warp gains nothing)
MAX_ASYNC = 32


def async_slot_bytes(seg: int, row_tiles: int, has_zeros: bool) -> int:
    """Bytes of one ``AsyncSlot`` of kernels/wq_gemm.cu: a unit's ``seg x row_tiles`` 16-byte
    vectors of 32 lanes, and each lane's two scales (and zero points) per row tile."""
    return seg * row_tiles * 32 * 16 + row_tiles * 2 * 32 * 4 * (2 if has_zeros else 1)


def async_depth(depth: int, warps: int, seg: int, row_tiles: int, has_zeros: bool) -> int:
    """The ``ASYNC`` the decode kernel runs for a requested ``depth``: at most what
    :data:`_RING_SMEM` holds for ``warps`` rings of slots (:func:`async_slot_bytes`) and at
    most :data:`MAX_ASYNC`; 0 (the register path) where that is below 2 or ``depth`` is 0."""
    fits = _RING_SMEM // (warps * async_slot_bytes(seg, row_tiles, has_zeros))
    d = min(depth, fits, MAX_ASYNC)
    return d if d >= 2 else 0


def chunk_codes(bits: int) -> int:
    """Codes per tile row in one 16-byte vector per lane (``CHUNK``): 64 (int4) or 32 (int8)."""
    return 64 if bits == 4 else 32


def _padded(n: int, k: int, bits: int) -> tuple[int, int]:
    c = chunk_codes(bits)
    return -(-n // TILE_ROWS) * TILE_ROWS, -(-k // c) * c


def code_position(bits: int, tile: int, chunk: int, lane: int, word: int, slot: int) -> tuple[int, int]:
    """The (row, column) of the code at ``slot`` (nibble 0..7 for int4, byte 0..3 for int8) of
    32-bit ``word`` (0..3) of 16-byte vector ``chunk * 32 + lane`` in tile ``tile``'s row (the
    layout of the module docstring, written from the mma.m16n8k16 A-fragment table: register
    ``reg`` of lane ``4 gid + tid`` holds rows ``gid + 8 (reg % 2)``, columns
    ``2 tid + 8 (reg // 2) + e``, e = 0, 1 in its low / high half)."""
    gid, tid = divmod(lane, 4)
    if bits == 4:
        j, (e, reg) = word, divmod(slot, 4)  # nibble = reg + 4 e
    else:
        (j, c8), (h, e) = divmod(word, 2), divmod(slot, 2)  # word = 2 j + c8, byte = 2 h + e
        reg = h + 2 * c8
    row = tile * TILE_ROWS + gid + 8 * (reg % 2)
    col = chunk * chunk_codes(bits) + 16 * j + 8 * (reg // 2) + 2 * tid + e
    return row, col


def contiguous_x_order(k: int, bits: int) -> np.ndarray:
    """The contiguous-x K order: ``int64 [K]``, element ``L`` the weight column stored at column
    ``L`` (K a multiple of :func:`chunk_codes` C). Inside each chunk, stored column
    ``16 j + 2 tid + e + 8 hi`` (k-step ``j``, the mma B fragment's ``b0`` pair (hi 0) or ``b1``
    pair (hi 1) of lane ``4 gid + tid``) holds column ``tid * C / 4 + 4 j + 2 hi + e``: lane
    ``tid``'s columns of a chunk are ``tid * C / 4 ..`` ``+ C / 4 - 1``, k-step ``j``'s b0 and b1 the
    32-bit words ``2 j`` and ``2 j + 1`` of that run (kernels/wq_gemm.cu ``CONTIG_X``).

    Raises:
        PluginError: K not a multiple of the chunk.
    """
    c = chunk_codes(bits)
    if k <= 0 or k % c:
        raise PluginError(f"contiguous_x_order: K must be a positive multiple of {c} for {bits}-bit codes, got {k}")
    stored = np.arange(c)
    j, kk = divmod(stored, 16)
    hi, low = divmod(kk, 8)
    tid, e = divmod(low, 2)
    within = tid * (c // 4) + 4 * j + 2 * hi + e
    return (np.arange(0, k, c)[:, None] + within[None, :]).reshape(-1)


def _axes(bits: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The padded codes' split shape (after [tiles, ..]) and the transpose into the layout."""
    if bits == 4:
        # [T, h, gid, C, j, c8, tid, e] -> [T, C, gid, tid, j, e, c8, h]: nibble 4 e + 2 c8 + h
        return (2, 8, -1, 4, 2, 4, 2), (0, 3, 2, 6, 4, 7, 5, 1)
    # [T, h, gid, C, j, c8, tid, e] -> [T, C, gid, tid, j, c8, h, e]: word 2 j + c8, byte 2 h + e
    return (2, 8, -1, 2, 2, 4, 2), (0, 3, 2, 6, 4, 5, 1, 7)


def pack_codes(codes: np.ndarray, bits: int, contiguous_x: bool = False) -> np.ndarray:
    """Unsigned codes ``uint8 [N, K]`` into the kernels' ``int32 [N_pad / 16, chunks * 128]``
    layout (module docstring; :func:`code_position` per code). ``contiguous_x``: store them in
    :func:`contiguous_x_order` (K whole chunks), the same as packing
    ``codes[:, contiguous_x_order(K, bits)]`` but without the column gather: that order is a
    permutation of axes inside each chunk, so it joins the layout's one transpose. The int4
    nibbles of rows ``gid`` and ``gid + 8`` share a byte, so they are merged before it.

    Raises:
        PluginError: bits not 4 or 8, K not a multiple of 8 (of the chunk with
            ``contiguous_x``), or a code out of range.
    """
    if bits not in SUPPORTED_BITS:
        raise PluginError(f"pack_codes: bits must be one of {SUPPORTED_BITS}, got {bits!r}")
    n, k = codes.shape
    c = chunk_codes(bits)
    if k % 8 or (contiguous_x and k % c):
        raise PluginError(f"pack_codes: K must be a multiple of {c if contiguous_x else 8}, got {k}")
    if codes.size and int(codes.max()) >= 1 << bits:
        raise PluginError(f"pack_codes: codes must be below 2**{bits}, got {int(codes.max())}")
    n_pad, k_pad = _padded(n, k, bits)
    padded = np.asarray(codes, np.uint8)
    if padded.shape != (n_pad, k_pad):
        padded = np.zeros((n_pad, k_pad), np.uint8)
        padded[:n, :k] = codes
    tiles, chunks, steps = n_pad // TILE_ROWS, k_pad // c, c // 16
    rows = padded.reshape(tiles, 2, 8, k_pad)  # [T, h, gid, K]
    # a chunk's K: stored column 16 j + 8 c8 + 2 tid + e, or (contiguous x) weight column
    # tid C / 4 + 4 j + 2 c8 + e; into [T, C, gid, tid, j, ...]: lane 4 gid + tid, word j
    if bits == 4:
        merged = rows[:, 0] | (rows[:, 1] << 4)  # [T, gid, K]: nibble 4 e + 2 c8 + h, h the low bit
        if contiguous_x:
            u = merged.reshape(tiles, 8, chunks, 4, steps, 2, 2).transpose(0, 2, 1, 3, 4, 6, 5)
        else:
            u = merged.reshape(tiles, 8, chunks, steps, 2, 4, 2).transpose(0, 2, 1, 5, 3, 6, 4)
        # [T, C, gid, tid, j, e, c8]: byte 2 e + c8 of word j
    elif contiguous_x:
        u = rows.reshape(tiles, 2, 8, chunks, 4, steps, 2, 2).transpose(0, 3, 2, 4, 5, 6, 1, 7)
    else:
        u = rows.reshape(tiles, 2, 8, chunks, steps, 2, 4, 2).transpose(0, 3, 2, 6, 4, 5, 1, 7)
        # int8, [T, C, gid, tid, j, c8, h, e]: byte 2 h + e of word 2 j + c8
    return np.ascontiguousarray(u).reshape(tiles, chunks * 512).view("<u4").reshape(tiles, chunks * 128).view(np.int32)


def unpack_codes(packed: np.ndarray, bits: int, n: int, k: int) -> np.ndarray:
    """The inverse of :func:`pack_codes`: ``uint8 [N, K]``.

    Raises:
        PluginError: ``packed`` is not the shape :func:`pack_codes` makes for N, K, bits.
    """
    n_pad, k_pad = _padded(n, k, bits)
    tiles, chunks = n_pad // TILE_ROWS, k_pad // chunk_codes(bits)
    if packed.shape != (tiles, chunks * 128):
        raise PluginError(f"unpack_codes: packed codes must be int32 [{tiles}, {chunks * 128}] for N={n}, K={k}, bits={bits}; got {packed.shape}")
    words = np.ascontiguousarray(packed).view(np.uint32).reshape(tiles, chunks, 32, 4, 1)
    shifts = (np.arange(32 // bits, dtype=np.uint32) * bits).astype(np.uint32)
    u = (words >> shifts) & np.uint32((1 << bits) - 1)
    split, order = _axes(bits)
    shape = [tiles, *split]
    shape[shape.index(-1)] = chunks
    inverse = np.argsort(order)
    laid = [shape[a] for a in order]
    codes = u.reshape(laid).transpose(inverse).reshape(n_pad, k_pad)
    return codes[:n, :k].astype(np.uint8)


def pack_groups(values: np.ndarray) -> np.ndarray:
    """Per-group values ``float32 [N, G]`` (scales, zeros) into ``[N_pad / 16, G * 16]``
    (tile, group, row in tile; padded rows 0)."""
    n, g = values.shape
    n_pad = -(-n // TILE_ROWS) * TILE_ROWS
    out = np.zeros((n_pad, g), np.float32)
    out[:n] = values
    return np.ascontiguousarray(out.reshape(n_pad // TILE_ROWS, TILE_ROWS, g).transpose(0, 2, 1).reshape(n_pad // TILE_ROWS, g * TILE_ROWS))


def unpack_groups(packed: np.ndarray, n: int, g: int) -> np.ndarray:
    """The inverse of :func:`pack_groups`: ``float32 [N, G]``."""
    tiles = -(-n // TILE_ROWS)
    if packed.shape != (tiles, g * TILE_ROWS):
        raise PluginError(f"unpack_groups: per-group values must be float32 [{tiles}, {g * TILE_ROWS}] for N={n}, {g} groups; got {packed.shape}")
    return np.asarray(packed, np.float32).reshape(tiles, g, TILE_ROWS).transpose(0, 2, 1).reshape(tiles * TILE_ROWS, g)[:n]


def swiglu_order(n: int) -> np.ndarray:
    """The row order of a SwiGLU plugin's weight (:attr:`WeightOnlyGemmPlugin.swiglu`): ``int64
    [N]``, element ``r`` the row of the stacked ``[gate; up]`` weight (``N = 2 I`` rows, gate rows
    first) stored at row ``r``. Rows ``16 t .. 16 t + 7`` of each 16-row tile are gate rows ``8 t
    ..`` ``8 t + 7`` and rows ``16 t + 8 ..`` the up rows of the same features, so one thread's
    mma D fragment (rows ``gid`` and ``gid + 8``) holds both halves of intermediate feature
    ``8 t + gid`` (kernels/wq_gemm.cu ``GATED``).

    Raises:
        PluginError: N is not a positive multiple of 16 (I a multiple of 8).
    """
    if n <= 0 or n % TILE_ROWS:
        raise PluginError(f"swiglu_order: the gate and up rows must be a positive multiple of {TILE_ROWS} in all (I a multiple of 8), got {n}")
    t, p = np.divmod(np.arange(n), TILE_ROWS)
    return np.where(p < 8, 8 * t + p, n // 2 + 8 * t + p - 8)


def swiglu_reference(y: np.ndarray) -> np.ndarray:
    """``silu(gate) * up`` of a SwiGLU plugin's GEMM output ``y [M, 2 I]`` (rows in
    :func:`swiglu_order`, float16 / bfloat16 / float32): ``[M, I]`` of y's dtype, computed as
    :func:`trtcore.ops.swiglu_mlp`'s layers are on the reference backend (``ops.sigmoid``
    ``1 / (1 + exp(-g))``, then ``g * s`` and ``a * up``, each in float32 and rounded to y's
    dtype), so the fused plugin equals the unfused graph."""
    m, n = y.shape
    pairs = np.asarray(y).reshape(m, n // TILE_ROWS, 2, 8).astype(np.float32)
    g, u = pairs[:, :, 0].reshape(m, n // 2), pairs[:, :, 1].reshape(m, n // 2)
    dt = y.dtype
    with np.errstate(over="ignore"):  # exp(-g) is inf below g = -88: s = 0, the limit
        s = (1.0 / (1.0 + np.exp(-g))).astype(dt).astype(np.float32)
    a = (g * s).astype(dt).astype(np.float32)
    return (a * u).astype(dt)


def rope_order(n: int, rope_rows: int, head_dim: int) -> np.ndarray:
    """The row order of a RoPE plugin's weight (:attr:`WeightOnlyGemmPlugin.rope_rows`): ``int64
    [N]``, element ``r`` the natural row (output feature) stored at row ``r``. The first
    ``rope_rows`` rows are heads of ``head_dim`` features (q, then k), each stored in
    :func:`swiglu_order` of ``head_dim``: tile ``t`` of a head holds features ``8 t .. 8 t + 7`` in
    its rows 0-7 and their rotation partners ``+ head_dim / 2`` in rows 8-15 (the half-split
    pairing of ``rotate_half``), so one thread's mma D fragment (rows ``gid``, ``gid + 8``) is a
    pair; rows from ``rope_rows`` on (v) keep their order.

    Raises:
        PluginError: head_dim not a positive multiple of 16, or rope_rows not whole heads within N.
    """
    if head_dim <= 0 or head_dim % TILE_ROWS or rope_rows <= 0 or rope_rows % head_dim or rope_rows > n:
        raise PluginError(f"rope_order: rope_rows={rope_rows} must be whole heads of head_dim={head_dim} (a multiple of {TILE_ROWS}) within N={n}")
    order = np.arange(n)
    heads = rope_rows // head_dim
    order[:rope_rows] = (np.arange(heads)[:, None] * head_dim + swiglu_order(head_dim)[None, :]).reshape(-1)
    return order


def rope_reference(
    y: np.ndarray, position_ids: np.ndarray, inv_freq: np.ndarray, rope_rows: int, head_dim: int, attention_scaling: float
) -> np.ndarray:
    """The output of a RoPE plugin (:attr:`WeightOnlyGemmPlugin.rope_rows`) from its GEMM output
    ``y [M, N]`` (rows in :func:`rope_order`, float16 / bfloat16 / float32) and each row's
    position (``[M]``): ``[M, N]`` of y's dtype in the natural order, its first ``rope_rows``
    features (q and k heads) rotated by :meth:`trtcore.plugins.rope.RopePlugin.reference`
    (half-split pairing, full rotary, ``inv_freq [head_dim / 2]`` float32), so the fused plugin
    equals the unfused graph: the GEMM rounded to y's dtype, then the RoPE plugin."""
    from .rope import RopePlugin

    m, n = y.shape
    out = np.empty_like(y)
    out[:, rope_order(n, rope_rows, head_dim)] = y
    heads = out[:, :rope_rows].reshape(m, rope_rows // head_dim, head_dim)
    rope = RopePlugin(head_dim, head_dim, is_neox=True, attention_scaling=attention_scaling)
    pos = np.asarray(position_ids, np.int32).reshape(m)
    rotated = rope.reference(heads, heads[:, :1], pos, np.asarray(inv_freq, np.float32))[0]
    out[:, :rope_rows] = rotated.reshape(m, rope_rows)
    return out


def rms_norm_reference(h: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``RMSNorm(h)`` as the unfused graph computes it (:func:`trtcore.ops.rms_norm` without
    offset, on the reference backend): ``inv = 1 / sqrt(mean(h32 * h32) + eps)`` in float32
    (``h32``: h in float32); ``round(round(h32 * inv) * weight)`` in h's dtype. ``h``:
    ``[M, N]``; ``weight``: ``[N]`` (or broadcastable) of h's dtype. Source: Zhang & Sennrich,
    arXiv:1910.07467, eq. 4; transformers' ``LlamaRMSNorm``."""
    dt = h.dtype
    normed = (h.astype(np.float32) * _rms_inv(h, eps)).astype(dt) * np.asarray(weight, dt).reshape(-1)
    return normed.astype(dt)


def _rms_inv(h: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm's scale per row, ``1 / sqrt(mean(h32 * h32) + eps)`` in float32 (``[M, 1]``);
    a sum of squares past float32's range gives inf, so 0, as the kernels."""
    h32 = h.astype(np.float32)
    with np.errstate(over="ignore"):
        var = np.mean(h32 * h32, axis=-1, keepdims=True) + np.float32(eps)
    return np.float32(1.0) / np.sqrt(var)


def rms_norm_folded_reference(h: np.ndarray, weight: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """RMSNorm with its scale folded out of the next GEMM, as the ``NORM_X`` decode kernel
    computes it (:meth:`WeightOnlyGemmPlugin.norm_folds`): ``x = round(h * weight)`` in h's dtype
    (the product exact, rounded once) and ``inv = 1 / sqrt(mean(h32 * h32) + eps)`` per row in
    float32, as the kernel and :func:`rms_norm_reference` (a sum of squares past float32's range
    gives inv 0 in all three), so that ``RMSNorm(h) @ W^T = inv * (x @ W^T)`` up to the
    roundings of x. ``h``: ``[M, N]`` float16 / bfloat16; ``weight``: ``[N]`` of h's dtype.
    Returns ``(x [M, N] of h's dtype, inv [M, 1] float32)``. Source: Zhang & Sennrich,
    arXiv:1910.07467, eq. 4 (the scale is one number per row)."""
    x = (h.astype(np.float64) * np.asarray(weight).astype(np.float64).reshape(-1)).astype(h.dtype)
    return x, _rms_inv(h, eps)


def add_norm_reference(y: np.ndarray, residual: np.ndarray, weight: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``h = y + residual`` (rounded to y's dtype) and :func:`rms_norm_reference` of it, as the
    unfused graph computes them. ``y``, ``residual``: ``[M, N]``; ``weight``: ``[N]``, all of one
    dtype."""
    h = (y + residual).astype(y.dtype)
    return h, rms_norm_reference(h, weight, eps)


def _row_reordered(
    arrays: Sequence[np.ndarray], plugin: WeightOnlyGemmPlugin, order: np.ndarray, half_tiles: Callable[[np.ndarray], np.ndarray] | None
) -> list[np.ndarray]:
    """The constant inputs (codes, scales, [zeros], [perm]) of ``plugin``'s weight with its rows
    in ``order`` (element ``r``: the row stored at ``r``): the codes by ``half_tiles`` (moving
    packed half tiles, where the order allows it) or else unpacked, permuted and packed again;
    the per-group values unpacked, permuted and packed again (exact either way)."""
    n = plugin.out_features
    out = [np.asarray(c) for c in arrays]
    if half_tiles is not None:
        out[0] = half_tiles(out[0])
    else:
        # unpacked in stored columns (contiguous-x order included): packed again as they are
        out[0] = pack_codes(unpack_codes(out[0], plugin.bits, n, plugin.in_features)[order], plugin.bits)
    for i in range(1, 2 + int(plugin.has_zeros)):  # scales, [zeros]
        out[i] = pack_groups(unpack_groups(out[i], n, plugin.groups)[order])
    return out


def _swiglu_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Packed codes of ``[gate; up]`` (:func:`pack_codes` of N = 2 I rows, I a multiple of 16)
    in :func:`swiglu_order`, by moving half tiles: a tile's rows ``0 .. 7`` are the low nibble of
    each byte (int4) or the low 16 bits of each word (int8), rows ``8 .. 15`` the high ones
    (:func:`code_position`), so new tile ``t`` is half ``t % 2`` of gate tile ``t // 2`` in its low
    halves and the same half of the up tile in its high halves. Equal to packing the permuted
    rows (tests/test_weight_only_gemm.py)."""
    shift = 4 if bits == 4 else 16
    low = np.uint32(0x0F0F0F0F if bits == 4 else 0x0000FFFF)
    words = np.ascontiguousarray(codes).view(np.uint32)
    tiles = words.shape[0] // 2

    def halves(w: np.ndarray) -> np.ndarray:  # [tiles, W] -> [2 tiles, W]: each tile's low, then high half, in the low bits
        return np.stack([w & low, (w >> np.uint32(shift)) & low], axis=1).reshape(2 * tiles, -1)

    return np.ascontiguousarray(halves(words[:tiles]) | (halves(words[tiles:]) << np.uint32(shift))).view(np.int32)


def _rope_codes(codes: np.ndarray, bits: int, rope_rows: int, head_dim: int) -> np.ndarray:
    """Packed codes in :func:`rope_order` (``head_dim / 2`` a multiple of 16): each head's tiles
    as :func:`_swiglu_codes` moves a gate/up pair's, its first half the "gate" (features
    ``0 .. head_dim / 2 - 1``), the rest the "up" (their partners); the tiles after the heads as
    they are."""
    per_head = head_dim // TILE_ROWS
    out = np.array(codes)
    for h in range(rope_rows // head_dim):
        out[h * per_head : (h + 1) * per_head] = _swiglu_codes(codes[h * per_head : (h + 1) * per_head], bits)
    return out


@dataclass(frozen=True)
class PackedWeight:
    """A :class:`~trtcore.quantization.QuantizedWeight` in the kernels' layout: the plugin's
    constant inputs (module docstring).

    Attributes:
        codes: ``int32 [N_pad / 16, chunks * 128]`` (:func:`pack_codes`).
        scales: ``float32 [N_pad / 16, groups * 16]`` (:func:`pack_groups`).
        zeros: the same shape, or None (symmetric).
        perm: ``int32 [K]`` or None.
        bits, group_size, in_features (K), out_features (N).
        contiguous_x: codes stored in :func:`contiguous_x_order` (module docstring).
    """

    codes: np.ndarray
    scales: np.ndarray
    zeros: np.ndarray | None
    perm: np.ndarray | None
    bits: int
    group_size: int
    in_features: int
    out_features: int
    contiguous_x: bool = False

    def arrays(self) -> list[np.ndarray]:
        """The plugin's inputs after x, in order: codes, scales, [zeros], [perm]."""
        return [a for a in (self.codes, self.scales, self.zeros, self.perm) if a is not None]


def can_contiguous_x(k: int, bits: int, group_size: int, has_perm: bool) -> bool:
    """Whether a weight can be stored in :func:`contiguous_x_order`: no act order, and every
    group whole chunks (so K is whole chunks too and the order keeps each group's columns)."""
    return not has_perm and group_size % chunk_codes(bits) == 0 and k % group_size == 0


def pack_weight(qw: QuantizedWeight, contiguous_x: bool | None = None) -> PackedWeight:
    """Repack ``qw`` for the kernels (once, at build). ``contiguous_x``: store the codes in
    :func:`contiguous_x_order`; None (the default): :data:`CONTIGUOUS_X`, where
    :func:`can_contiguous_x` allows it.

    Raises:
        PluginError: K or group_size not a multiple of 8 (the kernels' unit); ``contiguous_x``
            asked for a weight :func:`can_contiguous_x` refuses.
    """
    n, k = qw.shape
    if qw.group_size % GROUP_UNIT:
        what = f"per-channel weight's K={k}" if qw.group_size == k else f"group_size={qw.group_size}"
        raise PluginError(f"weight-only GEMM: the {what} must be a multiple of {GROUP_UNIT} (the kernels' unit)")
    allowed = can_contiguous_x(k, qw.bits, qw.group_size, qw.perm is not None)
    if contiguous_x and not allowed:
        raise PluginError(
            f"weight-only GEMM: the contiguous-x order needs whole-chunk groups ({chunk_codes(qw.bits)} codes) and no act order; "
            f"got K={k}, group_size={qw.group_size}, act order {qw.perm is not None}"
        )
    contiguous = (allowed and CONTIGUOUS_X) if contiguous_x is None else bool(contiguous_x)
    zeros = None if qw.zeros is None else pack_groups(np.asarray(qw.zeros, np.float32))
    perm = None if qw.perm is None else np.ascontiguousarray(qw.perm, np.int32)
    codes = pack_codes(qw.codes, qw.bits, contiguous)
    return PackedWeight(codes, pack_groups(np.asarray(qw.scales, np.float32)), zeros, perm, qw.bits, qw.group_size, k, n, contiguous)


def unpack_weight(pw: PackedWeight) -> QuantizedWeight:
    """The :class:`QuantizedWeight` ``pw`` was packed from (exactly)."""
    n, k = pw.out_features, pw.in_features
    g = k // pw.group_size
    codes = unpack_codes(pw.codes, pw.bits, n, k)
    if pw.contiguous_x:
        codes = codes[:, np.argsort(contiguous_x_order(k, pw.bits))]
    zeros = None if pw.zeros is None else unpack_groups(pw.zeros, n, g)
    return QuantizedWeight(codes, unpack_groups(pw.scales, n, g), zeros, pw.bits, pw.group_size, pw.perm)


@dataclass
class WeightOnlyGemmPlugin(LinearShapes, Plugin):
    """``y = x @ dequant(W)^T`` (plugin ``trtcore_weight_only_gemm``, version 1, namespace ``trtcore``).

    Inputs (make them with :meth:`from_quantized` / :func:`pack_weight`):

    ===  ======  ==================================  ===========================================
    #    name    shape                               dtype
    ===  ======  ==================================  ===========================================
    0    x       ``[..., K]``                        float16, bfloat16 or float32
    1    codes   ``[N_pad / 16, chunks * 128]``      int32 (:func:`pack_codes`)
    2    scales  ``[N_pad / 16, groups * 16]``       float32 (:func:`pack_groups`)
    3    zeros   ``[N_pad / 16, groups * 16]``       float32, only when ``has_zeros``
    4    perm    ``[K]``                             int32, only when ``has_perm``
    5    pos     ``[...]`` (x's leading dimensions)  int32, only with ``rope_rows``: each row's position
    6    freq    ``[rope_head_dim / 2]``             float32, only with ``rope_rows``: RoPE's ``inv_freq``
    5    resid   ``[..., N]`` (x's leading dims)     x's dtype, only with ``add_residual``: added to y
    5/6  norm_w  ``[K]``                             x's dtype, only with ``norm_input``: x's RMSNorm weight
    5    resid   ``[..., N]`` (x's leading dims)     x's dtype, only with ``add_norm``: the residual stream
    6    norm_w  ``[N]``                             x's dtype, only with ``add_norm``: the RMSNorm weight
    7    count   ``[1]``                             int32, only with ``add_norm``: zero (engine memory the kernel uses)
    ===  ======  ==================================  ===========================================

    (Absent inputs leave no gap: after the weight's come pos and freq, then resid
    (``add_residual``), then norm_w (``norm_input``), then add_norm's three, each where present.)

    Output: ``y [..., N]`` of x's dtype; with ``swiglu``, ``h [..., N / 2]``; with
    ``add_residual``, ``y + resid``; with ``add_norm`` two, ``h = y + resid`` and
    ``RMSNorm(h) [..., N]``.

    Fields:
        in_features: K (a multiple of 8). out_features: N.
        bits: 4 or 8. group_size: K-elements per scale (a multiple of 8 dividing K; K for one
            scale per output channel).
        has_zeros: zero points given (else symmetric, ``2**(bits - 1)``).
        has_perm: act-order permutation given.
        contiguous_x: the codes are stored in :func:`contiguous_x_order` (added after version 1:
            engines serialized before it load with False, their codes' order).
        swiglu: W is a gate and an up linear of ``N / 2`` rows each, stored in
            :func:`swiglu_order`, and the output is ``silu(gate) * up`` with the unfused graph's
            roundings (:meth:`reference`): the MLP's activation in the GEMM's epilogue
            (TensorRT-LLM's GEMM + SwiGLU plugin; vLLM's ``MergedColumnParallelLinear`` followed by
            ``SiluAndMul``). Made by :meth:`with_swiglu` (the cuda backend's
            :mod:`trtcore.cuda.swiglu_fusion`); added after version 1, False when absent.
        rope_rows: with RoPE in the epilogue, the rows (q and k heads, stored in
            :func:`rope_order`) rotated by each x row's position, as
            :class:`~trtcore.plugins.rope.RopePlugin` with half-split pairing and full rotary
            (:func:`rope_reference`); 0 (the default, added after version 1) without. Made by
            :meth:`with_rope` (the cuda backend's :mod:`trtcore.cuda.rope_fusion`).
        rope_head_dim: those heads' features (a multiple of 16); 0 without RoPE.
        rope_scaling: RoPE's ``attention_scaling`` (multiplies cos and sin); 1 without.
        add_norm: the residual add and the RMSNorm after it in the plugin (:func:`add_norm_reference`);
            made by :meth:`with_add_norm` (the cuda backend's :mod:`trtcore.cuda.add_norm_fusion`);
            added after version 1, False when absent.
        norm_eps: that RMSNorm's epsilon (``rms_norm_eps``), add_norm's or norm_input's; 0
            without either.
        add_residual: the output is ``round(y + resid)`` (:attr:`output_features` of x's dtype,
            the unfused graph's add); made by :meth:`with_residual`
            (:mod:`trtcore.cuda.norm_input_fusion`); added after version 1, False when absent.
        norm_input: x is ``h`` and the GEMM's x is ``RMSNorm(h) * norm_w`` with
            :attr:`norm_eps` (:func:`rms_norm_reference`; folded into the decode kernel where
            :meth:`norm_folds`, :func:`rms_norm_folded_reference`); made by :meth:`with_norm_input`
            (:mod:`trtcore.cuda.norm_input_fusion`); added after version 1, False when absent.
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
    contiguous_x: bool = False
    swiglu: bool = False
    rope_rows: int = 0
    rope_head_dim: int = 0
    rope_scaling: float = 1.0
    add_norm: bool = False
    norm_eps: float = 0.0
    add_residual: bool = False
    norm_input: bool = False

    _OPTIONAL_FIELDS: ClassVar[dict[str, Any]] = {
        "add_residual": False,
        "norm_input": False,
        "contiguous_x": False,
        "swiglu": False,
        "rope_rows": 0,
        "rope_head_dim": 0,
        "rope_scaling": 1.0,
        "add_norm": False,
        "norm_eps": 0.0,
    }

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
        if self.contiguous_x and not can_contiguous_x(k, self.bits, g, self.has_perm):
            raise PluginError(
                f"WeightOnlyGemmPlugin.contiguous_x needs groups of whole {chunk_codes(self.bits)}-code chunks and no act order; "
                f"got in_features={k}, group_size={g}, has_perm={self.has_perm}"
            )
        if self.swiglu and self.out_features % TILE_ROWS:
            raise PluginError(
                f"WeightOnlyGemmPlugin.swiglu needs out_features (gate and up rows) a multiple of {TILE_ROWS}, got {self.out_features!r}"
            )
        if self.rope_rows or self.rope_head_dim:
            d, r = self.rope_head_dim, self.rope_rows
            if self.swiglu or d <= 0 or d % TILE_ROWS or r <= 0 or r % d or r > self.out_features:
                raise PluginError(
                    f"WeightOnlyGemmPlugin.rope_rows={r} must be whole heads of rope_head_dim={d} (a positive multiple of {TILE_ROWS}) "
                    f"within out_features={self.out_features}, and not with swiglu"
                )

        if self.add_norm and (self.swiglu or self.rope_rows or self.add_residual or self.norm_input):
            raise PluginError(
                "WeightOnlyGemmPlugin.add_norm excludes swiglu, rope_rows, add_residual and norm_input (an o_proj / down_proj takes it)"
            )
        if self.add_residual and (self.swiglu or self.rope_rows):
            raise PluginError("WeightOnlyGemmPlugin.add_residual excludes swiglu and rope_rows (an o_proj / down_proj takes it)")
        if self.norm_input and self.rope_rows:
            raise PluginError("WeightOnlyGemmPlugin.norm_input excludes rope_rows")
        if not (np.isfinite(self.norm_eps) and self.norm_eps >= 0) or (self.norm_eps and not (self.add_norm or self.norm_input)):
            raise PluginError(f"WeightOnlyGemmPlugin.norm_eps must be finite, >= 0 and only with add_norm or norm_input, got {self.norm_eps!r}")

    @property
    def output_features(self) -> int:
        """The output's last dimension: N, or N / 2 with :attr:`swiglu`."""
        return self.out_features // 2 if self.swiglu else self.out_features

    def output_shapes(self, input_shapes: Sequence[Sequence[Any]]) -> list[list[Any]]:
        shape = super().output_shapes(input_shapes)[0]
        out = shape[:-1] + [type(shape[-1])(self.output_features)]
        return [out, list(out)] if self.add_norm else [out]

    def output_dtypes(self, input_dtypes: Sequence[np.dtype]) -> list[np.dtype]:
        return super().output_dtypes(input_dtypes) * (2 if self.add_norm else 1)

    @classmethod
    def from_quantized(cls, qw: QuantizedWeight) -> tuple[WeightOnlyGemmPlugin, PackedWeight]:
        """The plugin for ``qw`` and its constant inputs (packed once, here)."""
        pw = pack_weight(qw)
        plugin = cls(pw.in_features, pw.out_features, pw.bits, pw.group_size, pw.zeros is not None, pw.perm is not None, pw.contiguous_x)
        return plugin, pw

    def row_fusion_key(self, constants: Sequence[np.ndarray]) -> Any:
        """Weights of the same K, bits, group size, zero-point presence, K order and act-order
        permutation (compared by value) stack along N (q/k/v, gate/up): see :meth:`fuse_rows`.
        None (no fusion) with :attr:`swiglu`, :attr:`rope_rows` or any input after the weight's
        (:attr:`add_residual`, :attr:`norm_input`, :attr:`add_norm`)."""
        if self.swiglu or self.rope_rows or self._extra_inputs():
            return None
        perm = np.asarray(constants[-1]).tobytes() if self.has_perm else b""
        return (self.in_features, self.bits, self.group_size, self.has_zeros, self.has_perm, perm, self.contiguous_x)

    @classmethod
    def fuse_rows(cls, parts: Sequence[tuple[Plugin, Sequence[np.ndarray]]]) -> tuple[WeightOnlyGemmPlugin, list[np.ndarray]]:
        """The weights of ``parts`` (equal :meth:`row_fusion_key`) stacked along N: one plugin
        with the same per-row numbers. Packed arrays are per 16-row tile, so where every N is
        a multiple of 16 they are concatenated as they are; otherwise the weights are
        unpacked, stacked and packed again (exact either way)."""
        plugins = [p for p, _ in parts]
        if not all(isinstance(p, WeightOnlyGemmPlugin) for p in plugins) or len({p.row_fusion_key(c) for p, c in parts}) != 1:
            raise PluginError("WeightOnlyGemmPlugin.fuse_rows: the parts differ in K, bits, group size, zero points, K order or act order")
        first = plugins[0]
        n = sum(p.out_features for p in plugins)
        if all(p.out_features % TILE_ROWS == 0 for p in plugins):
            arrays = [np.concatenate([np.asarray(c[i]) for _, c in parts]) for i in range(2 + int(first.has_zeros))]
            if first.has_perm:
                arrays.append(np.asarray(parts[0][1][-1]))
            return dataclasses.replace(first, out_features=n), arrays
        qws = [p.quantized_weight(*c) for p, c in parts]  # type: ignore[attr-defined]
        zeros = None if qws[0].zeros is None else np.concatenate([q.zeros for q in qws])
        qw = QuantizedWeight(
            np.concatenate([q.codes for q in qws]), np.concatenate([q.scales for q in qws]), zeros, first.bits, first.group_size, qws[0].perm
        )
        plugin, packed = cls.from_quantized(qw)
        return plugin, packed.arrays()

    def with_swiglu(self, constants: Sequence[np.ndarray]) -> tuple[WeightOnlyGemmPlugin, list[np.ndarray]] | None:
        """This plugin with :attr:`swiglu`, for a weight whose rows are a gate linear (the first
        ``N / 2``) stacked on an up linear (the rest), as :meth:`fuse_rows` stacks them: the
        plugin computing ``silu(x @ gate^T) * (x @ up^T)`` and its constant inputs in
        :func:`swiglu_order`; None where that cannot be (already SwiGLU, or N / 2 not a multiple
        of 8). The codes move by half tiles where N / 2 is a multiple of 16, else are unpacked
        and packed again (exact either way)."""
        n = self.out_features
        if self.swiglu or self.rope_rows or n % TILE_ROWS:
            return None
        moves = (lambda codes: _swiglu_codes(codes, self.bits)) if (n // 2) % TILE_ROWS == 0 else None
        return dataclasses.replace(self, swiglu=True), _row_reordered(constants, self, swiglu_order(n), moves)

    def with_rope(
        self, constants: Sequence[np.ndarray], rope_rows: int, head_dim: int, attention_scaling: float = 1.0
    ) -> tuple[WeightOnlyGemmPlugin, list[np.ndarray]] | None:
        """This plugin with RoPE in its epilogue (:attr:`rope_rows`), for a weight whose first
        ``rope_rows`` rows are q and k heads of ``head_dim`` features (as :meth:`fuse_rows` stacks
        q, k, v): the plugin and its constant inputs (codes, scales, [zeros], [perm]) in
        :func:`rope_order`; it then takes two more inputs, the positions and ``inv_freq``. None
        where that cannot be (already SwiGLU or RoPE, head_dim not a multiple of 16, rope_rows not
        whole heads within N). The codes move by half tiles where ``head_dim / 2`` is a multiple
        of 16, else are unpacked and packed again (exact either way)."""
        n = self.out_features
        if (
            self.swiglu
            or self.rope_rows
            or self.add_norm
            or self.add_residual
            or self.norm_input
            or head_dim <= 0
            or head_dim % TILE_ROWS
            or rope_rows <= 0
            or rope_rows % head_dim
            or rope_rows > n
        ):
            return None
        moves = (lambda codes: _rope_codes(codes, self.bits, rope_rows, head_dim)) if (head_dim // 2) % TILE_ROWS == 0 else None
        plugin = dataclasses.replace(self, rope_rows=rope_rows, rope_head_dim=head_dim, rope_scaling=float(np.float32(attention_scaling)))
        return plugin, _row_reordered(constants, self, rope_order(n, rope_rows, head_dim), moves)

    def with_add_norm(self, constants: Sequence[np.ndarray], eps: float) -> tuple[WeightOnlyGemmPlugin, list[np.ndarray]] | None:
        """This plugin with the residual add and RMSNorm after it (:attr:`add_norm`, epsilon
        ``eps``): the plugin and its constant inputs (codes, scales, [zeros], [perm] as they are);
        the fused node then also takes the residual, the norm's weight and a zero counter (int32
        ``[1]``, its own). None where that cannot be (SwiGLU, RoPE or add_norm already, an
        epsilon that is negative or not finite)."""
        if self.swiglu or self.rope_rows or self.add_norm or self.add_residual or self.norm_input or not (np.isfinite(eps) and eps >= 0):
            return None
        return dataclasses.replace(self, add_norm=True, norm_eps=float(np.float32(eps))), [np.asarray(c) for c in constants]

    def with_residual(self, constants: Sequence[np.ndarray]) -> tuple[WeightOnlyGemmPlugin, list[np.ndarray]] | None:
        """This plugin with the residual add after it (:attr:`add_residual`): the plugin and its
        constant inputs as they are; the node then also takes the residual ``[..., N]``. None
        where that cannot be (SwiGLU, RoPE, add_norm or add_residual already)."""
        if self.swiglu or self.rope_rows or self.add_norm or self.add_residual:
            return None
        return dataclasses.replace(self, add_residual=True), [np.asarray(c) for c in constants]

    def with_norm_input(self, constants: Sequence[np.ndarray], eps: float) -> tuple[WeightOnlyGemmPlugin, list[np.ndarray]] | None:
        """This plugin reading ``h`` and normalizing it (:attr:`norm_input`, epsilon ``eps``):
        the plugin and its constant inputs as they are; the node then also takes the norm's
        weight ``[K]``. None where that cannot be (RoPE, add_norm or norm_input already, an
        epsilon that is negative or not finite)."""
        if self.rope_rows or self.add_norm or self.norm_input or not (np.isfinite(eps) and eps >= 0):
            return None
        return dataclasses.replace(self, norm_input=True, norm_eps=float(np.float32(eps))), [np.asarray(c) for c in constants]

    @property
    def num_inputs(self) -> int:
        return self.num_weight_inputs + 1 + len(self._extra_inputs())

    def _extra_inputs(self) -> list[str]:
        """The names of the inputs after the weight's, in order (the table of the class docstring)."""
        names = ["pos", "freq"] if self.rope_rows > 0 else []
        names += ["resid"] * self.add_residual + ["norm_w"] * self.norm_input
        return names + ["resid", "norm_w", "count"] * self.add_norm

    def supports(self, pos: int, dtypes: Sequence[np.dtype], num_inputs: int) -> bool:
        """:meth:`LinearShapes.supports`, and the inputs after the weight's: pos and count int32,
        freq float32, resid and norm_w x's dtype (TensorRT's ``supports_format_combination``)."""
        first = 1 + self.num_weight_inputs
        if num_inputs != self.num_inputs or pos < first or pos >= num_inputs:
            return super().supports(pos, dtypes, num_inputs)
        want = {"pos": _INT32, "count": _INT32, "freq": _FLOAT32}.get(self._extra_inputs()[pos - first], np.dtype(dtypes[0]))
        return np.dtype(dtypes[pos]) == want

    def _extra(self, inputs: Sequence[Any], name: str) -> Any:
        """Input ``name`` (:meth:`_extra_inputs`; add_norm excludes the others) of ``inputs``."""
        return inputs[1 + self.num_weight_inputs + self._extra_inputs().index(name)]

    @property
    def num_weight_inputs(self) -> int:
        """The constant inputs after x that hold the weight: codes, scales, [zeros], [perm]."""
        return 2 + int(self.has_zeros) + int(self.has_perm)

    @property
    def groups(self) -> int:
        return self.in_features // self.group_size

    def input_shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the constant inputs 1.. (codes, scales, [zeros], [perm])."""
        n, k = self.out_features, self.in_features
        n_pad, k_pad = _padded(n, k, self.bits)
        tiles = n_pad // TILE_ROWS
        shapes: list[tuple[int, ...]] = [(tiles, k_pad // chunk_codes(self.bits) * 128), (tiles, self.groups * TILE_ROWS)]
        if self.has_zeros:
            shapes.append((tiles, self.groups * TILE_ROWS))
        if self.has_perm:
            shapes.append((k,))
        return shapes

    def _constant_dtypes(self) -> list[np.dtype]:
        return [_INT32, _FLOAT32] + [_FLOAT32] * int(self.has_zeros) + [_INT32] * int(self.has_perm)

    def _check_count(self, n: int) -> None:
        if n != self.num_inputs:
            extra = "".join(", " + name for name in self._extra_inputs())
            raise PluginError(
                f"WeightOnlyGemmPlugin takes {self.num_inputs} inputs (x, codes, scales{', zeros' * self.has_zeros}{', perm' * self.has_perm}{extra}), got {n}"
            )

    # --- numerics (the contract) -----------------------------------------------------------------

    def quantized_weight(self, *constants: np.ndarray) -> QuantizedWeight:
        """The :class:`QuantizedWeight` the constant inputs (codes, scales, [zeros], [perm]) hold."""
        if len(constants) != self.num_weight_inputs:
            raise PluginError(f"WeightOnlyGemmPlugin: expected {self.num_weight_inputs} constant inputs, got {len(constants)}")
        it = iter(np.asarray(c) for c in constants)
        codes, scales = next(it), next(it)
        zeros = next(it) if self.has_zeros else None
        perm = next(it) if self.has_perm else None
        pw = PackedWeight(codes, scales, zeros, perm, self.bits, self.group_size, self.in_features, self.out_features, self.contiguous_x)
        return unpack_weight(pw)

    def reference(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """float64 NumPy: ``x64 @ dequantize(W)^T`` rounded once to x's dtype; with
        :attr:`swiglu`, then :func:`swiglu_reference` of it; with :attr:`rope_rows`, then
        :func:`rope_reference` of it (inputs 5 and 6: the positions, ``inv_freq``); with
        :attr:`add_norm`, ``[h, RMSNorm(h)]`` of it (:func:`add_norm_reference`). With
        :attr:`norm_input` x is first :func:`rms_norm_reference` of it, or where
        :meth:`norm_folds` the GEMM is ``round(inv * (x' @ W^T))`` with ``x', inv`` from
        :func:`rms_norm_folded_reference`; with :attr:`add_residual` the output is
        ``round(y + resid)``.

        Raises:
            PluginError: wrong input count or x's last dimension is not in_features.
        """
        self._check_count(len(inputs))
        x = np.asarray(inputs[0])
        if x.shape[-1:] != (self.in_features,):
            raise PluginError(f"WeightOnlyGemmPlugin: x {x.shape} must end in in_features={self.in_features}")
        # dequantized once while the same constants come back (the reference backend's, per token)
        w = self.from_constants(inputs[1 : 1 + self.num_weight_inputs], lambda arrays: self.quantized_weight(*arrays).dequantize())
        x2 = x.reshape(-1, self.in_features)
        inv = 1.0
        if self.norm_input:
            norm_w = np.asarray(self._extra(inputs, "norm_w"))
            if norm_w.size != self.in_features or norm_w.shape[-1:] != (self.in_features,) or norm_w.dtype != x.dtype:
                raise PluginError(
                    f"WeightOnlyGemmPlugin: the norm weight {norm_w.shape} {norm_w.dtype} must hold in_features={self.in_features} of {x.dtype}"
                )
            if self.norm_folds(x.dtype, x2.shape[0]):
                x2, inv = rms_norm_folded_reference(x2, norm_w, self.norm_eps)
            else:
                x2 = rms_norm_reference(x2, norm_w, self.norm_eps)
        y = (inv * (x2.astype(np.float64) @ w.T)).astype(x.dtype)
        if self.add_residual:
            resid = np.asarray(self._extra(inputs, "resid"))
            if resid.shape != (*x.shape[:-1], self.out_features) or resid.dtype != x.dtype:
                raise PluginError(
                    f"WeightOnlyGemmPlugin: the residual {resid.shape} {resid.dtype} must be {(*x.shape[:-1], self.out_features)} {x.dtype}"
                )
            y = (y + resid.reshape(-1, self.out_features)).astype(x.dtype)
        if self.swiglu:
            y = swiglu_reference(y)
        if self.rope_rows:
            pos, freq = (np.asarray(a) for a in inputs[-2:])
            if pos.shape != x.shape[:-1]:
                raise PluginError(f"WeightOnlyGemmPlugin: the positions {pos.shape} must have x's leading dimensions {x.shape[:-1]}")
            y = rope_reference(y, pos.reshape(-1), freq, self.rope_rows, self.rope_head_dim, self.rope_scaling)
        if self.add_norm:
            resid, weight = (np.asarray(a) for a in inputs[-3:-1])
            if resid.shape != (*x.shape[:-1], self.out_features) or resid.dtype != x.dtype or weight.size != self.out_features:
                raise PluginError(
                    f"WeightOnlyGemmPlugin: the residual {resid.shape} {resid.dtype} must be {(*x.shape[:-1], self.out_features)} {x.dtype}, "
                    f"the norm weight {weight.shape} hold out_features={self.out_features}"
                )
            h, normed = add_norm_reference(y, resid.reshape(-1, self.out_features), weight, self.norm_eps)
            return [a.reshape(*x.shape[:-1], self.out_features) for a in (h, normed)]
        return [y.reshape(*x.shape[:-1], self.output_features)]

    # --- kernels -------------------------------------------------------------------------------

    def defines(self, dtype: Any) -> dict[str, int]:
        """The kernels' compile-time defines for activation ``dtype``."""
        d = {"DTYPE": KERNEL_DTYPE_CODES[np.dtype(dtype)], "BITS": self.bits, "HAS_ZEROS": int(self.has_zeros), "HAS_PERM": int(self.has_perm)}
        if self.contiguous_x:  # left out at 0: the define sets of engines before it stay the same
            d["CONTIG_X"] = 1
        if self.rope_rows:
            d.update(ROPE=1, ROTARY_DIM=self.rope_head_dim)
        return d

    def uses_tensor_cores(self, dtype: Any, m: int) -> bool:
        """Whether ``m`` rows of ``dtype`` run the tensor-core kernels (float16/bfloat16, a
        group size that is a multiple of 16 or K, and ``m <= DECODE_MAX_M``, or any ``m`` with
        :data:`PREFILL_KERNEL` ``"tensor_cores"``, or below :data:`CUBLAS_MIN_M` with ``"cublas"``:
        ``trtcore_wq_gemv16`` in slices of 16 rows); else :meth:`prefill_on_cublas` or the tiled
        float32 kernel."""
        rows_ok = 0 < m <= DECODE_MAX_M or (m > 0 and PREFILL_KERNEL == "tensor_cores") or (0 < m < CUBLAS_MIN_M and PREFILL_KERNEL == "cublas")
        return np.dtype(dtype) in _HALF_TYPES and rows_ok and self._tensor_core_groups()

    def _tensor_core_groups(self) -> bool:
        """Whether the group size suits the tensor-core kernels: a multiple of 16, or K."""
        return self.group_size % 16 == 0 or self.group_size == self.in_features

    def _prefill_cublas(self, inputs: Sequence[DeviceTensor], out_ptr: int, m: int, workspace: int, stream: int) -> None:
        """The ``"cublas"`` prefill (:data:`PREFILL_KERNEL`): act order gathers x into the
        stored column order; then per block of :meth:`block_rows` rows ``n0 ..``,
        ``trtcore_wq_dequantize`` writes the block in x's dtype at the workspace's start and
        cuBLASLt computes ``y[:, n0 ..] = x @ block^T`` (rows of y ``N`` apart). The blocks share
        one buffer: stream order keeps a block's GEMM before the next block's writes."""
        from trtcore.cuda.cublaslt import thread_linear

        x = inputs[0]
        dtype = np.dtype(x.dtype)
        n, k = self.out_features, self.in_features
        defines = tuple(sorted(self.defines(dtype).items()))
        gathered, lt_off, _ = self._workspace_layout(m)
        zeros = inputs[3].ptr if self.has_zeros else 0
        x_ptr = x.ptr
        if self.has_perm:
            perm = inputs[3 + int(self.has_zeros)].ptr
            x_ptr = workspace + gathered
            args = [(x.ptr, "ptr"), (perm, "ptr"), (x_ptr, "ptr"), (m, "i32"), (k, "i32")]
            _launch(defines, "trtcore_wq_gather_x", (-(-m * k // 8 // 256),), (256,), args, stream)
        cuda_type = lookup(dtype).cuda_data_type
        mm = thread_linear(cuda_type)
        rows = self.block_rows()
        chunks = -(-k // chunk_codes(self.bits))
        for n0 in range(0, n, rows):
            r = min(rows, n - n0)
            args = [(inputs[1].ptr, "ptr"), (inputs[2].ptr, "ptr"), (zeros, "ptr"), (workspace, "ptr"), (n0, "i32"), (r, "i32")]
            threads = -(-r // TILE_ROWS) * chunks * 32  # one per 16-byte vector of the block's tiles
            _launch(defines, "trtcore_wq_dequantize", (-(-threads // 256),), (256,), args + [(k, "i32"), (self.group_size, "i32")], stream)
            mm.matmul(m, r, k, workspace, x_ptr, out_ptr + n0 * dtype.itemsize, cuda_type, workspace + lt_off, LT_WORKSPACE, stream, ldd=n)

    def prefill_on_cublas(self, dtype: Any, m: int) -> bool:
        """Whether ``m`` rows of ``dtype`` take the ``"cublas"`` prefill (:data:`PREFILL_KERNEL`):
        float16/bfloat16 and at least :data:`CUBLAS_MIN_M` rows, or more than
        :data:`DECODE_MAX_M` where the group size does not suit the tensor-core kernels."""
        rows_ok = m >= CUBLAS_MIN_M or (m > DECODE_MAX_M and not self._tensor_core_groups())
        return PREFILL_KERNEL == "cublas" and np.dtype(dtype) in _HALF_TYPES and rows_ok

    def block_rows(self) -> int:
        """Rows of W the ``"cublas"`` prefill dequantizes at a time: the most whole
        ``_BLOCK_ROW_UNIT`` (128) rows in :data:`DEQUANT_BLOCK_BYTES` at 2 bytes a weight (at
        least 128), at most N."""
        rows = DEQUANT_BLOCK_BYTES // (2 * self.in_features) // _BLOCK_ROW_UNIT * _BLOCK_ROW_UNIT
        return min(self.out_features, max(_BLOCK_ROW_UNIT, rows))

    def _workspace_layout(self, m: int) -> tuple[int, int, int]:
        """Byte offsets in the ``"cublas"`` prefill's workspace of x gathered into the stored
        order (act order only, ``m * K`` elements; else equal to the next), of cuBLASLt's
        workspace (:data:`~trtcore.plugins.fp8_gemm.LT_WORKSPACE` bytes), and the total. The
        dequantized block of W comes first, at 0."""

        def up(b: int) -> int:
            return -(-b // _WS_ALIGN) * _WS_ALIGN

        gathered = up(2 * self.block_rows() * self.in_features)
        lt = gathered + (up(2 * m * self.in_features) if self.has_perm else 0)
        return gathered, lt, lt + LT_WORKSPACE

    def kernel_path(self, dtype: Any, m: int, workspace: bool = True) -> str:
        """The path :meth:`enqueue` takes for ``m`` rows of ``dtype``: ``"cublas"`` where
        :meth:`prefill_on_cublas` and a workspace is given; ``"tensor_cores"`` where
        :meth:`uses_tensor_cores`, and for the ``"cublas"`` rows without a workspace where the
        group size suits the tensor cores (the 16-row kernel); else ``"tiled"``."""
        cublas = self.prefill_on_cublas(dtype, m)
        if cublas and workspace:
            return "cublas"
        return "tensor_cores" if self.uses_tensor_cores(dtype, m) or (cublas and self._tensor_core_groups()) else "tiled"

    def staged_output(self, dtype: Any, m: int) -> bool:
        """Whether a :attr:`swiglu` or :attr:`rope_rows` plugin's ``m`` rows of ``dtype`` take a
        kernel without that epilogue (the ``"cublas"`` prefill or the tiled kernel,
        :meth:`kernel_path` with a workspace): the GEMM's output is then staged in the workspace
        (:meth:`staging_bytes`) and ``trtcore_wq_swiglu`` / ``trtcore_wq_rope`` writes the
        output from it."""
        return (self.swiglu or self.rope_rows > 0) and self.kernel_path(dtype, m) != "tensor_cores"

    def staging_bytes(self, dtype: Any, m: int) -> int:
        """Bytes at the workspace's start of the staged GEMM output (:meth:`staged_output`):
        ``m x N`` of ``dtype``, aligned; 0 where nothing is staged."""
        if not self.staged_output(dtype, m):
            return 0
        return -(-m * self.out_features * np.dtype(dtype).itemsize // _WS_ALIGN) * _WS_ALIGN

    def workspace_size(self, inputs: Sequence[tuple[tuple[int, ...], np.dtype]], outputs: Sequence[tuple[tuple[int, ...], np.dtype]]) -> int:
        """The workspace for the largest x (``inputs[0]``): the staged GEMM output of a
        :attr:`swiglu` or :attr:`rope_rows` plugin (:meth:`staging_bytes`), then the ``"cublas"`` prefill's: a block
        of :meth:`block_rows` rows of W in x's dtype, x gathered into the stored order (act
        order), cuBLASLt's workspace. 0 where neither runs (no SwiGLU staging; float32 x, at
        most :data:`DECODE_MAX_M` rows, another :data:`PREFILL_KERNEL`)."""
        shape, dtype = inputs[0]
        m = int(np.prod(shape[:-1], dtype=np.int64))
        cublas = self._workspace_layout(m)[2] if self.prefill_on_cublas(dtype, m) else 0
        return self.norm_bytes(dtype, m) + self.staging_bytes(dtype, m) + cublas

    def norm_bytes(self, dtype: Any, m: int) -> int:
        """Bytes at the workspace's start of a :attr:`norm_input` plugin's x: normalized
        (``m x K`` of ``dtype``, aligned) for the paths that do not normalize in the kernel, or
        for :meth:`norm_folds` x and the norm weight (``K`` more) copied to 16-byte alignment
        where either is off it; 0 without norm_input. Reserved at every M."""
        if not self.norm_input:
            return 0
        return -(-(m + 1) * self.in_features * np.dtype(dtype).itemsize // _WS_ALIGN) * _WS_ALIGN

    def norm_folds(self, dtype: Any, m: int) -> bool:
        """Whether a :attr:`norm_input` plugin's ``m`` rows of ``dtype`` take the norm folded
        into the v2 decode kernel (``NORM_X``: the numbers of :func:`rms_norm_folded_reference`,
        see :meth:`reference`): up to 8 rows of float16 / bfloat16 where :meth:`decode_variant`
        is v2 on the contiguous-x order. Elsewhere ``trtcore_wq_rms_norm`` writes the normalized
        x (:func:`rms_norm_reference`) into the workspace first."""
        return self.norm_input and self.contiguous_x and self.decode_variant(dtype, m).get("WQ_DECODE") == 2

    def chunks_per_group(self) -> int:
        """Whole chunks per group (0 when groups do not cover whole chunks): the decode
        kernel's fast path, a chunk as one group segment, needs it above 0."""
        g, c = self.group_size, chunk_codes(self.bits)
        return g // c if g % c == 0 else 0

    def fast_decode(self, dtype: Any, m: int) -> bool:
        """Whether the v2 decode kernel (``WQ_DECODE 2``) can run ``m`` rows: the tensor-core
        kernel of up to 8 rows, no act order, and every group whole chunks (so K is whole
        chunks too: v2 has no bounds checks)."""
        return self.uses_tensor_cores(dtype, m) and m <= 8 and not self.has_perm and self.chunks_per_group() > 0

    def decode_variant(self, dtype: Any, m: int) -> dict[str, int]:
        """The extra defines of the decode kernel for ``m`` rows: :data:`DECODE_VARIANT`, or
        when it is empty :data:`DEFAULT_DECODE` of the bit width (with ``WARPS`` for about
        :data:`_V2_TARGET_WARPS` in all, and the shape's choices of :data:`DECODE_RULE`), where
        :meth:`fast_decode` allows v2, else none (v1);
        ``SEG`` left out (1) where it does not divide :meth:`chunks_per_group` (a unit of SEG
        chunks must lie inside one group); ``ASYNC`` lowered by :func:`async_depth` (left out
        where that is 0), and with it ``ASLOT`` (:func:`async_slot_bytes`) and ``WARPS`` (the
        launch's warps, which size the rings) set; ``XPF`` left out without ``ASYNC`` or the
        contiguous-x order.

        Raises:
            PluginError: a ``WARPS`` outside 1 .. 16.
        """
        chosen = DECODE_VARIANT or DEFAULT_DECODE[self.bits]
        if chosen.get("WQ_DECODE", 1) != 2 or not self.fast_decode(dtype, m):
            return {}
        variant = dict(chosen)
        if self.norm_input and self.contiguous_x:  # NORM_X (norm_folds) is the register path's, one unit in flight: int8's two took 79 registers
            variant.pop("ASYNC", None)
            variant.pop("XPF", None)
            variant["UNROLL"] = 1
        if self.chunks_per_group() % variant.get("SEG", 1):
            del variant["SEG"]
        rt = variant.get("ROW_TILES", 1)
        if not DECODE_VARIANT:
            units = max(1, self.in_features // (chunk_codes(self.bits) * variant.get("SEG", 1)))
            warps = max(self.decode_warps(rt, _V2_TARGET_WARPS), min(int(DECODE_RULE["min_warps"]), units))
            variant["WARPS"] = warps
            if self.bits == 4 and not self.has_zeros and variant.get("UNROLL", 1) == 1 and warps <= int(DECODE_RULE["unroll2_max_warps"]):
                if not (self.norm_input and self.contiguous_x):  # NORM_X keeps its one unit in flight (above)
                    variant["UNROLL"] = 2
        if not 1 <= variant.get("WARPS", 1) <= _MAX_WARPS:
            raise PluginError(f"DECODE_VARIANT: WARPS must be 1 .. {_MAX_WARPS}, got {variant['WARPS']}")
        if variant.get("ASYNC", 0):  # the launch's shared memory: WARPS x ASYNC x ASLOT bytes
            warps = variant.get("WARPS") or self.decode_warps(rt)
            variant["ASYNC"] = async_depth(variant["ASYNC"], warps, variant.get("SEG", 1), rt, self.has_zeros)
            if variant["ASYNC"]:
                variant["ASLOT"] = async_slot_bytes(variant.get("SEG", 1), rt, self.has_zeros)
                variant["WARPS"] = warps
        if not variant.get("ASYNC", 1):
            del variant["ASYNC"]  # the register path's define set, as without the key
        if variant.get("XPF") and not (variant.get("ASYNC") and self.contiguous_x):
            del variant["XPF"]  # x loaded a unit ahead: the cp.async path's, on the contiguous-x order
        return variant

    def decode_warps(self, row_tiles: int = 1, target: int = _TARGET_WARPS) -> int:
        """Warps per block (per ``row_tiles`` 16-row tiles) of the decode kernel: about
        ``target`` in all, a power of two from 1 to 16, at most one per chunk of K."""
        tiles = -(-self.out_features // (TILE_ROWS * row_tiles))
        chunks = -(-self.in_features // chunk_codes(self.bits))
        want = max(1, min(_MAX_WARPS, target // tiles, chunks))
        return 1 << (want.bit_length() - 1)  # a power of two

    def enqueue(self, inputs: Sequence[DeviceTensor], outputs: Sequence[DeviceTensor], workspace: int, stream: int) -> None:
        """The ``"cublas"`` prefill where :meth:`prefill_on_cublas` and a workspace is given
        (without one, the tensor-core kernel in slices of 16 rows), else the decode kernel on the
        tensor cores where :meth:`uses_tensor_cores`, else the tiled kernel; on ``stream``, no
        allocation, no sync. With :attr:`swiglu` the tensor-core kernels compute SwiGLU in their
        epilogue; the other two stage the GEMM output in the workspace and
        ``trtcore_wq_swiglu`` follows (:meth:`staged_output`); likewise with :attr:`rope_rows`
        (``trtcore_wq_rope``).

        Raises:
            PluginError: unsupported dtype, a staged SwiGLU or RoPE output without a workspace,
                RoPE positions that are not one per row of x, an add + norm or add_residual
                residual that is not one row of N per row of x, a norm_input weight that is not
                ``[K]`` of x's dtype, a norm_input x to normalize before the GEMM (or, folded,
                to copy to 16-byte alignment with its weight) without a workspace, M beyond
                the tiled kernel's grid, or an x address the
                kernel's loads cannot take (decode: 4-byte aligned; tiled: 16-byte, its 16-byte
                x loads, unless act order gathers x by element): refused before a launch, which
                would fault and take the CUDA context with it.
        """
        self._check_count(len(inputs))
        x, out = inputs[0], outputs[0]
        dtype = np.dtype(x.dtype)
        if dtype not in KERNEL_DTYPE_CODES:
            raise PluginError(f"WeightOnlyGemmPlugin.enqueue: x dtype {dtype} not supported")
        m = int(np.prod(x.shape[:-1], dtype=np.int64))
        if m == 0:
            return
        if self.add_norm:
            self._check_add_norm(inputs)
        if self.add_residual:
            self._check_residual(inputs)
        norm_w_ptr = 0
        if self.norm_input:
            w = self._extra(inputs, "norm_w")
            if tuple(w.shape)[-1:] != (self.in_features,) or int(np.prod(w.shape)) != self.in_features or np.dtype(w.dtype) != dtype:
                raise PluginError(
                    f"WeightOnlyGemmPlugin.enqueue: norm weight {tuple(w.shape)} {np.dtype(w.dtype)}; [{self.in_features}] {dtype} expected"
                )
            norm_w_ptr = w.ptr
        norm_x = self.norm_folds(dtype, m)
        if self.norm_input and (not norm_x or x.ptr % 16 or norm_w_ptr % 16):  # the workspace's first part is x's
            if not workspace:
                raise PluginError(
                    f"WeightOnlyGemmPlugin.enqueue: the norm_input plugin's M={m} rows of {dtype} at {x.ptr:#x} (norm weight at "
                    f"{norm_w_ptr:#x}) {'copy' if norm_x else 'normalize'} x in a workspace; none was given"
                )
            if norm_x:  # the folded norm's 16-byte loads: x and the weight copied to alignment
                norm_w_ptr = self._align_norm_inputs(inputs, norm_w_ptr, workspace, m, dtype, stream)
            else:  # x normalized into the workspace, then any path
                self._rms_norm(inputs, workspace, m, dtype, stream)
            x = DeviceTensor(workspace, tuple(x.shape), x.dtype)
            inputs = [x, *inputs[1:]]
        if self.norm_input and workspace:  # reserved at every M
            workspace += self.norm_bytes(dtype, m)
        path = self.kernel_path(dtype, m, bool(workspace))
        if path == "cublas":
            staged = self.staging_bytes(dtype, m)
            self._prefill_cublas(inputs, workspace if staged else out.ptr, m, workspace + staged, stream)
            if staged:
                self._epilogue(inputs, workspace, out.ptr, m, dtype, stream)
            if self.add_norm:
                self._add_norm(inputs, outputs, m, dtype, stream)
            self._add_residual(inputs, out, m, dtype, stream)
            return
        tensor_cores = path == "tensor_cores"
        y = out.ptr  # the GEMM's output: staged in the workspace for a SwiGLU or RoPE plugin's tiled kernel
        staged = (self.swiglu or self.rope_rows > 0) and not tensor_cores
        if staged:
            if not workspace:
                raise PluginError(
                    f"WeightOnlyGemmPlugin.enqueue: the {'SwiGLU' if self.swiglu else 'RoPE'} plugin's M={m} rows of {dtype} stage the GEMM output "
                    "in a workspace; none was given"
                )
            y = workspace
        align = 4 if tensor_cores else 1 if self.has_perm else 16
        if x.ptr % align:
            raise PluginError(f"WeightOnlyGemmPlugin.enqueue: x at address {x.ptr:#x} is not {align}-byte aligned, as the kernel for M={m} needs")
        n, k = self.out_features, self.in_features
        zeros = inputs[3].ptr if self.has_zeros else 0
        perm = inputs[3 + int(self.has_zeros)].ptr if self.has_perm else 0
        args = [(x.ptr, "ptr"), (inputs[1].ptr, "ptr"), (inputs[2].ptr, "ptr"), (zeros, "ptr"), (perm, "ptr"), (y, "ptr")]
        args += [(m, "i32"), (n, "i32"), (k, "i32"), (self.group_size, "i32")]
        defines = tuple(sorted(self.defines(dtype).items()))
        if tensor_cores:
            name = "trtcore_wq_gemv" if m <= 8 else "trtcore_wq_gemv16"
            cdiv = self.chunks_per_group()
            cmagic = -(-(1 << 32) // cdiv) if cdiv > 1 else 0  # kernels/wq_gemm.cu chunk_group
            # v2 reads a contiguous-x run in 16-byte loads: an x (a view) off that alignment takes v1
            variant = {} if self.contiguous_x and x.ptr % 16 else self.decode_variant(dtype, m)
            tail = self.add_norm and variant.get("WQ_DECODE") == 2  # v2's last block adds and normalizes
            an_norm_w = norm_w_ptr if norm_x else 0
            args += [(cdiv, "i32"), (cmagic, "u32"), *self._rope_args(inputs), *self._add_norm_args(inputs, outputs, tail, an_norm_w)]
            warps = variant.pop("WARPS", 0) or self.decode_warps(variant.get("ROW_TILES", 1))
            rt = variant.get("ROW_TILES", 1)
            rings = warps * variant.get("ASYNC", 0) * variant.get("ASLOT", 0)  # bytes of the cp.async rings
            if self.swiglu:
                variant["GATED"] = 1  # the SwiGLU epilogue
            if tail:
                variant["ADD_NORM"] = 1
            if norm_x:  # the norm folded in (section NORM_X of kernels/wq_gemm.cu)
                variant["NORM_X"] = 1
            if variant:
                defines = tuple(sorted({**dict(defines), **variant}.items()))
            slices = 1 if m <= 8 else -(-m // DECODE_MAX_M)  # gemv16: blockIdx.y is a slice of 16 rows
            if slices > 65535:
                raise PluginError(f"WeightOnlyGemmPlugin: M={m} rows exceed the decode kernel's grid (at most {65535 * DECODE_MAX_M})")
            _launch(defines, name, (-(-n // (TILE_ROWS * rt)), slices), (32 * warps,), args, stream, shared_mem=rings)
            if self.add_norm and not tail:
                self._add_norm(inputs, outputs, m, dtype, stream)
            return
        if -(-m // _BM) > 65535:
            raise PluginError(f"WeightOnlyGemmPlugin: M={m} rows exceed the tiled kernel's grid (at most {65535 * _BM})")
        _launch(defines, "trtcore_wq_gemm", (-(-n // _BN), -(-m // _BM)), (256,), args, stream)
        if staged:
            self._epilogue(inputs, y, out.ptr, m, dtype, stream)
        if self.add_norm:
            self._add_norm(inputs, outputs, m, dtype, stream)
        self._add_residual(inputs, out, m, dtype, stream)

    def _rope_args(self, inputs: Sequence[DeviceTensor]) -> list[tuple[Any, str]]:
        """The ``ROPE`` epilogue's kernel arguments: positions, ``inv_freq``, rows, scaling (null
        and 0 without RoPE: the kernels take them always)."""
        if not self.rope_rows:
            return [(0, "ptr"), (0, "ptr"), (0, "i32"), (1.0, "f32")]
        pos, freq = inputs[-2], inputs[-1]
        if pos.size != int(np.prod(inputs[0].shape[:-1], dtype=np.int64)):
            raise PluginError(f"WeightOnlyGemmPlugin.enqueue: {pos.size} positions for x {tuple(inputs[0].shape)}; one per row expected")
        return [(pos.ptr, "ptr"), (freq.ptr, "ptr"), (self.rope_rows, "i32"), (self.rope_scaling, "f32")]

    def _check_add_norm(self, inputs: Sequence[DeviceTensor]) -> None:
        """Raises PluginError where the residual's shape is not x's leading dimensions and N (an
        :attr:`add_norm` plugin; before any launch: the kernels read it row for row, no broadcast)."""
        resid, want = tuple(inputs[-3].shape), (*inputs[0].shape[:-1], self.out_features)
        if resid != want:
            raise PluginError(f"WeightOnlyGemmPlugin.enqueue: residual {resid} for x {tuple(inputs[0].shape)}; {want} expected")

    def _add_norm_args(self, inputs: Sequence[DeviceTensor], outputs: Sequence[DeviceTensor], tail: bool, norm_w_ptr: int) -> list[tuple[Any, str]]:
        """The decode kernels' ``an_*`` arguments: the ``ADD_NORM`` tail's residual, norm weight,
        normalized output, counter, epsilon where ``tail``; else the :attr:`add_residual`
        epilogue's residual and the folded norm's (``NORM_X``) weight at ``norm_w_ptr`` and
        epsilon where that is not 0 (null and 0 where unused: the kernels take them always)."""
        if tail:
            resid, weight, counter = inputs[-3:]
            return [(resid.ptr, "ptr"), (weight.ptr, "ptr"), (outputs[1].ptr, "ptr"), (counter.ptr, "ptr"), (self.norm_eps, "f32")]
        resid = self._extra(inputs, "resid").ptr if self.add_residual else 0
        return [(resid, "ptr"), (norm_w_ptr, "ptr"), (0, "ptr"), (0, "ptr"), (self.norm_eps if norm_w_ptr else 0.0, "f32")]

    def _check_residual(self, inputs: Sequence[DeviceTensor]) -> None:
        """Raises PluginError where an :attr:`add_residual` plugin's residual is not x's leading
        dimensions and N (before any launch: the kernels read it row for row, no broadcast)."""
        resid, want = tuple(self._extra(inputs, "resid").shape), (*inputs[0].shape[:-1], self.out_features)
        if resid != want:
            raise PluginError(f"WeightOnlyGemmPlugin.enqueue: residual {resid} for x {tuple(inputs[0].shape)}; {want} expected")

    def _add_residual(self, inputs: Sequence[DeviceTensor], out: DeviceTensor, m: int, dtype: np.dtype, stream: int) -> None:
        """The :attr:`add_residual` add of the paths without the epilogue (tiled, cuBLAS):
        ``trtcore_wq_add_residual`` on ``out`` in place; nothing without add_residual."""
        if not self.add_residual:
            return
        total = m * self.out_features
        args = [(out.ptr, "ptr"), (self._extra(inputs, "resid").ptr, "ptr"), (total, "i64")]
        _launch(tuple(sorted(self.defines(dtype).items())), "trtcore_wq_add_residual", (min(4096, -(-total // 256)),), (256,), args, stream)

    def _align_norm_inputs(self, inputs: Sequence[DeviceTensor], norm_w_ptr: int, workspace: int, m: int, dtype: np.dtype, stream: int) -> int:
        """A :meth:`norm_folds` plugin's x (``m x K``) copied to the workspace's start, and its
        norm weight after it where that is off 16-byte alignment (``trtcore_wq_copy``); returns
        the norm weight's address to use. Raises PluginError for a workspace off 16-byte
        alignment (before any launch)."""
        if workspace % 16:
            raise PluginError(f"WeightOnlyGemmPlugin.enqueue: workspace at {workspace:#x} is not 16-byte aligned, as the folded norm's copies need")
        size = np.dtype(dtype).itemsize
        defines = tuple(sorted(self.defines(dtype).items()))
        pairs = [(inputs[0].ptr, workspace, m * self.in_features)]
        if norm_w_ptr % 16:
            pairs.append((norm_w_ptr, workspace + m * self.in_features * size, self.in_features))  # K: whole chunks, so aligned
            norm_w_ptr = pairs[-1][1]
        for src, dst, n in pairs:
            _launch(defines, "trtcore_wq_copy", (min(4096, -(-n // 256)),), (256,), [(src, "ptr"), (dst, "ptr"), (n, "i64")], stream)
        return norm_w_ptr

    def _rms_norm(self, inputs: Sequence[DeviceTensor], normed: int, m: int, dtype: np.dtype, stream: int) -> None:
        """A :attr:`norm_input` plugin's x normalized into ``normed`` (``[m, K]``) where the GEMM
        does not fold it (:meth:`norm_folds`): ``trtcore_wq_rms_norm``, one block per row."""
        threads = min(1024, max(32, -(-self.in_features // _ADD_NORM_CACHE // 32) * 32))
        args = [
            (inputs[0].ptr, "ptr"),
            (self._extra(inputs, "norm_w").ptr, "ptr"),
            (normed, "ptr"),
            (self.in_features, "i32"),
            (self.norm_eps, "f32"),
        ]
        _launch(tuple(sorted(self.defines(dtype).items())), "trtcore_wq_rms_norm", (m,), (threads,), args, stream)

    def _add_norm(self, inputs: Sequence[DeviceTensor], outputs: Sequence[DeviceTensor], m: int, dtype: np.dtype, stream: int) -> None:
        """The add + norm of the paths without the decode tail: ``trtcore_wq_add_norm``, one block
        of up to 1024 threads per row, on ``outputs[0]`` (the GEMM's y, made h in place)."""
        resid, weight, _ = inputs[-3:]
        threads = min(1024, max(32, -(-self.out_features // _ADD_NORM_CACHE // 32) * 32))
        args = [
            (outputs[0].ptr, "ptr"),
            (resid.ptr, "ptr"),
            (weight.ptr, "ptr"),
            (outputs[1].ptr, "ptr"),
            (self.out_features, "i32"),
            (self.norm_eps, "f32"),
        ]
        _launch(tuple(sorted(self.defines(dtype).items())), "trtcore_wq_add_norm", (m,), (threads,), args, stream)

    def _epilogue(self, inputs: Sequence[DeviceTensor], y: int, out: int, m: int, dtype: np.dtype, stream: int) -> None:
        """The staged paths' epilogue kernel: ``trtcore_wq_swiglu`` (``out [m, N / 2]``) or
        ``trtcore_wq_rope`` (``out [m, N]``) from the staged GEMM output ``y [m, N]``."""
        defines = tuple(sorted(self.defines(dtype).items()))
        if self.swiglu:
            total = m * self.output_features
            args = [(y, "ptr"), (out, "ptr"), (m, "i32"), (self.output_features, "i32")]
            _launch(defines, "trtcore_wq_swiglu", (-(-total // 256),), (256,), args, stream)
            return
        pairs = m * (-(-self.out_features // TILE_ROWS) * 8)  # one thread per stored row pair
        pos, freq, rows, scale = self._rope_args(inputs)
        args = [(y, "ptr"), (out, "ptr"), pos, freq, (m, "i32"), (self.out_features, "i32"), rows, scale]
        _launch(defines, "trtcore_wq_rope", (-(-pairs // 256),), (256,), args, stream)


_KERNELS = KernelLauncher("wq_gemm")
_launch = _KERNELS.launch
