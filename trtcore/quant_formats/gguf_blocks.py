"""GGUF (ggml) block types kept quantized: raw blocks -> :class:`QuantizedWeight`.

Block layouts from ggml's ``ggml-common.h`` / ``ggml-quants.c`` (``dequantize_row_*``);
``QK_K = 256``; ``d``, ``dmin`` are float16; all little-endian:

* ``Q8_0`` (34 B / 32): ``d``, ``int8 qs[32]``; ``w = d * qs``.
* ``Q4_0`` (18 B / 32): ``d``, ``qs[16]``; element ``j < 16`` is ``qs[j] & 15``, ``j + 16`` is
  ``qs[j] >> 4``; ``w = d * (q - 8)``.
* ``Q4_1`` (20 B / 32): ``d``, ``m``, ``qs[16]`` as Q4_0; ``w = d * q + m``.
* ``Q4_K`` (144 B / 256): ``d``, ``dmin``, ``scales[12]`` (eight 6-bit scales ``sc`` and mins
  ``mn``, ``get_scale_min_k4``), ``qs[128]``; 64-element chunk ``c`` takes the low nibbles of
  ``qs[32c : 32c+32]`` (sub-block ``2c``) then the high nibbles (``2c+1``);
  ``w = d * sc[j] * q - dmin * mn[j]`` over sub-blocks of 32.
* ``Q5_K`` (176 B / 256): ``d``, ``dmin``, ``scales[12]``, ``qh[32]``, ``qs[128]``: Q4_K's
  nibbles plus a fifth bit, ``(qh[l] >> j) & 1`` for element ``l`` of sub-block ``j``.
* ``Q6_K`` (210 B / 256): ``ql[128]``, ``qh[64]``, ``int8 scales[16]``, ``d``; per half ``h``
  of 128 and ``l < 32``: element ``32r + l`` is ``ql[64h + l + 32(r&1)]`` (low nibble for
  ``r < 2``, high for ``r >= 2``) ``| ((qh[32h + l] >> 2r) & 3) << 4``;
  ``w = d * scales[e // 16] * (q - 32)``.

The canonical form ``w = (q - zero) * scale`` takes them as: Q8_0 codes ``qs + 128``, zero
128; Q4_0 zero 8; Q6_K 8-bit codes 0..63, zero 32; Q5_K 8-bit codes 0..31. The affine types
(Q4_1 and the K-quants' mins) get fractional zeros ``-m / d`` (``dmin * mn / (d * sc)``); a
block or sub-block whose scale is 0 is constant (``w = m``) and is stored as scale ``m``,
codes 1, zero 0. Group scales are exact in float32 (a float16 times a 6-/8-bit integer);
fractional zeros are rounded to float32.
"""

from __future__ import annotations

import numpy as np

from trtcore.errors import CheckpointError
from trtcore.quantization import QuantizedWeight

#: ggml type name -> (elements per block, bytes per block)
BLOCKS = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}
#: the ggml types kept quantized
GGUF_TYPES = tuple(BLOCKS)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<f2")[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Q4_0/Q4_1: 16 bytes -> 32 codes, the low nibbles first."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``get_scale_min_k4`` for all eight sub-blocks: ``scales[12]`` -> ``(sc, mn)`` ``[..., 8]``."""
    s = s.astype(np.uint16)
    lo_sc, lo_mn = s[..., 0:4] & 63, s[..., 4:8] & 63
    hi_sc = (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)
    hi_mn = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return np.concatenate([lo_sc, hi_sc], -1).astype(np.float32), np.concatenate([lo_mn, hi_mn], -1).astype(np.float32)


def _k_chunks(qs: np.ndarray, qh: np.ndarray | None) -> np.ndarray:
    """Q4_K/Q5_K codes ``[..., 256]`` from ``qs[128]`` (and Q5_K's ``qh[32]``)."""
    q = qs.reshape(*qs.shape[:-1], 4, 32)
    codes = np.stack([q & 15, q >> 4], axis=-2)  # [..., chunk, half, 32]: sub-block 2c + half
    if qh is not None:
        j = np.arange(8, dtype=np.uint8).reshape(4, 2, 1)
        codes = codes | (((qh[..., None, None, :] >> j) & 1) << 4)
    return codes.reshape(*qs.shape[:-1], 256)


def _affine(codes: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``w = scale * q + offset`` per group -> codes, scales, zeros (``-offset / scale``);
    groups with scale 0 become scale ``offset``, codes 1, zero 0."""
    flat = scale == 0
    zeros = np.where(flat, 0.0, -offset.astype(np.float64) / np.where(flat, 1.0, scale)).astype(np.float32)
    scales = np.where(flat, offset, scale).astype(np.float32)
    g = codes.shape[-1] // scale.shape[-1]
    grouped = codes.reshape(*scale.shape, g)
    grouped = np.where(flat[..., None], np.uint8(1), grouped)
    return grouped.reshape(codes.shape), scales, zeros


def gguf_weight(raw: np.ndarray, ggml_type: str, k: int, name: str = "weight") -> QuantizedWeight:
    """Convert a ``[N, K]`` GGUF tensor's raw blocks to a QuantizedWeight.

    Args:
        raw: ``uint8 [N, K / block * bytes]``, each row the row's blocks in order (as
            ``gguf.GGUFReader`` gives quantized tensor data).
        ggml_type: one of :data:`GGUF_TYPES`.
        k: ``K``, the row length in elements.
        name: the tensor's name, for errors.

    Raises:
        CheckpointError: an unsupported type, or ``raw`` of the wrong dtype/shape.
    """
    if ggml_type not in BLOCKS:
        raise CheckpointError(f"'{name}': GGUF type {ggml_type!r} is not kept quantized; supported: {', '.join(GGUF_TYPES)}")
    per_block, nbytes = BLOCKS[ggml_type]
    if raw.dtype != np.uint8 or raw.ndim != 2 or k % per_block or raw.shape[1] != k // per_block * nbytes:
        raise CheckpointError(f"'{name}': {ggml_type} data of {raw.dtype} {raw.shape}, expected uint8 [N, {k // per_block * nbytes}] for K={k}")
    n = raw.shape[0]
    b = raw.reshape(n, k // per_block, nbytes)
    zeros: np.ndarray | None = None
    if ggml_type == "Q8_0":
        codes = (b[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        scales, bits = _f16(b[..., 0:2]), 8
    elif ggml_type == "Q4_0":
        codes, scales, bits = _nibbles(b[..., 2:]), _f16(b[..., 0:2]), 4
    elif ggml_type == "Q4_1":
        codes, scales, zeros = _affine(_nibbles(b[..., 4:]), _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None])
        bits = 4
    elif ggml_type in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]
        sc, mn = _k_scale_min(b[..., 4:16])
        q5 = ggml_type == "Q5_K"
        raw_codes = _k_chunks(b[..., 48:176], b[..., 16:48]) if q5 else _k_chunks(b[..., 16:144], None)
        codes, scales, zeros = _affine(raw_codes, d * sc, -(dmin * mn))
        bits = 8 if q5 else 4
    else:  # Q6_K
        ql, qh = b[..., 0:128].reshape(n, -1, 2, 64), b[..., 128:192].reshape(n, -1, 2, 1, 32)
        low = np.concatenate([ql[..., 0:32] & 15, ql[..., 32:64] & 15, ql[..., 0:32] >> 4, ql[..., 32:64] >> 4], axis=-1)
        high = (qh >> (2 * np.arange(4, dtype=np.uint8)).reshape(4, 1)) & 3  # [n, blocks, half, r, 32]
        codes = low | (high.reshape(*low.shape) << 4)
        scales = _f16(b[..., 208:210])[..., None] * b[..., 192:208].view(np.int8).astype(np.float32)
        zeros, bits = np.full(scales.shape, 32, np.float32), 8
    codes = codes.reshape(n, k)
    scales = scales.reshape(n, -1)
    return QuantizedWeight(np.ascontiguousarray(codes), scales, None if zeros is None else zeros.reshape(n, -1), bits, k // scales.shape[1])


__all__ = ["BLOCKS", "GGUF_TYPES", "gguf_weight"]
