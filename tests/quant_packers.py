"""Independent float64 quantizers and packers for the published weight-only formats, written
from their documentation (not a conftest: test modules import it).

* GPTQ (AutoGPTQ ``QuantLinear.pack``, GPTQModel ``gptq_v2``): ``qweight`` int32 ``[K/p, N]``
  packed along K, ``qzeros`` int32 ``[G, N/p]`` packed along N, ``scales`` float16 ``[G, N]``,
  ``g_idx`` int32 ``[K]``; v1 stores ``zero - 1``.
* AWQ GEMM (AutoAWQ ``WQLinear_GEMM``): ``qweight`` int32 ``[K, N/8]`` packed along N in
  the order ``[0, 2, 4, 6, 1, 3, 5, 7]``, ``qzeros`` alike, ``scales`` float16 ``[G, N]``.
* compressed-tensors ``pack-quantized`` (``pack_to_int32``): ``weight_packed`` int32
  ``[N, K/p]`` of ``q_signed + 2**(bits-1)``, ``weight_scale`` ``[N, G]``,
  ``weight_zero_point`` signed (packed along N, offset, or plain int8), ``weight_g_idx``.

Every packer returns the tensors and the float64 weight they stand for, computed from the
integers and scales with the format's formula ``w = (q - z) * s``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def pack_along(codes: np.ndarray, bits: int, axis: int, order: list[int] | None = None) -> np.ndarray:
    """Pack non-negative ints ``< 2**bits`` along ``axis`` into int32 words, slot ``i`` at bit
    ``bits * i``; ``order``: slot ``i`` takes element ``order[i]`` of each run (AWQ)."""
    per = 32 // bits
    c = np.moveaxis(np.asarray(codes, np.int64), axis, -1)
    assert c.min() >= 0 and c.max() < 1 << bits
    runs = c.reshape(*c.shape[:-1], -1, per)
    words = np.zeros(runs.shape[:-1], np.int64)
    for slot in range(per):
        words |= runs[..., order[slot] if order else slot] << (bits * slot)
    return np.moveaxis(words.astype(np.uint32).view(np.int32), -1, axis)


@dataclass
class Quantized:
    """Integers and scales of a group-wise quantized ``[N, K]`` weight."""

    q: np.ndarray  # int64 [N, K] codes, 0 <= q < 2**bits
    z: np.ndarray  # int64 [N, G] zero points
    s: np.ndarray  # float16 [N, G] scales
    g_idx: np.ndarray  # int64 [K] group of each input feature

    def dequantize(self) -> np.ndarray:
        """float64 ``[N, K]``: ``(q - z[:, g_idx]) * s[:, g_idx]``."""
        return (self.q - self.z[:, self.g_idx]).astype(np.float64) * self.s[:, self.g_idx].astype(np.float64)


def quantize(
    w: np.ndarray, bits: int, group_size: int, *, sym: bool, rng: np.random.Generator, act_order: bool = False, min_zero: int = 0
) -> Quantized:
    """Round-to-nearest group quantization of ``w`` (float ``[N, K]``), float64 arithmetic.

    ``group_size=-1``: one group. ``act_order``: groups over a random permutation of the
    input features (GPTQ ``desc_act``: ``g_idx[perm[j]] = j // group_size``). ``min_zero``:
    smallest zero point (1 for GPTQ v1, whose packer cannot store ``zero - 1 = -1``).
    """
    n, k = w.shape
    gs = k if group_size == -1 else group_size
    perm = rng.permutation(k) if act_order else np.arange(k)
    g_idx = np.empty(k, np.int64)
    g_idx[perm] = np.arange(k) // gs
    maxq = (1 << bits) - 1
    groups = k // gs
    q = np.empty((n, k), np.int64)
    z = np.empty((n, groups), np.int64)
    s = np.empty((n, groups), np.float16)
    w = np.asarray(w, np.float64)
    for g in range(groups):
        cols = g_idx == g
        x = w[:, cols]
        if sym:
            scale = np.maximum(np.abs(x).max(1), 1e-8) / ((maxq + 1) / 2 - 0.5)
            zero = np.full(n, (maxq + 1) // 2)
        else:
            lo, hi = np.minimum(x.min(1), 0), np.maximum(x.max(1), 0)
            scale = np.maximum(hi - lo, 1e-8) / maxq
            zero = np.clip(np.round(-lo / scale), min_zero, maxq).astype(np.int64)
        s[:, g] = scale.astype(np.float16)
        z[:, g] = zero
        q[:, cols] = np.clip(np.round(x / s[:, g : g + 1].astype(np.float64)) + zero[:, None], 0, maxq)
    return Quantized(q, z, s, g_idx)


def pack_gptq(qz: Quantized, bits: int, checkpoint_format: str, with_g_idx: bool = True) -> dict[str, np.ndarray]:
    """GPTQ tensors (suffixes) of ``qz``; v1 (``"gptq"``) stores ``zero - 1``."""
    groups = qz.s.shape[1]
    stored_z = qz.z - (1 if checkpoint_format == "gptq" else 0)
    out = {
        "qweight": pack_along(qz.q.T, bits, 0),
        "qzeros": pack_along(stored_z.T.reshape(groups, -1), bits, 1),
        "scales": np.ascontiguousarray(qz.s.T),
    }
    if with_g_idx:
        out["g_idx"] = qz.g_idx.astype(np.int32)
    return out


def pack_awq(qz: Quantized) -> dict[str, np.ndarray]:
    """AWQ GEMM tensors (suffixes) of ``qz`` (4-bit)."""
    return {
        "qweight": pack_along(qz.q.T, 4, 1, AWQ_ORDER),
        "qzeros": pack_along(qz.z.T, 4, 1, AWQ_ORDER),
        "scales": np.ascontiguousarray(qz.s.T),
    }


def pack_compressed(qz: Quantized, bits: int, *, sym: bool, packed_zero_point: bool = True, with_g_idx: bool = False) -> dict[str, np.ndarray]:
    """compressed-tensors ``pack-quantized`` tensors (suffixes) of ``qz``: signed values
    ``q - 2**(bits-1)`` stored offset by ``2**(bits-1)``, signed zero points."""
    off = 1 << (bits - 1)
    n, k = qz.q.shape
    out = {
        "weight_packed": pack_along(qz.q, bits, 1),
        "weight_scale": qz.s.copy(),
        "weight_shape": np.array([n, k], np.int64),
    }
    if not sym:
        zp_signed = qz.z - off
        out["weight_zero_point"] = pack_along(zp_signed + off, bits, 0) if packed_zero_point else zp_signed.astype(np.int8)
    if with_g_idx:
        out["weight_g_idx"] = qz.g_idx.astype(np.int32)
    return out
