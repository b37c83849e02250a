"""trtcore's canonical form of a weight-only quantized linear weight.

Every quantized checkpoint format (GPTQ, AWQ, compressed-tensors ``pack-quantized``, GGUF
block types) is converted once, at load, into :class:`QuantizedWeight`; the weight-only GEMM
plugin and its NumPy reference take only this form, so a format is one converter and a
kernel is one layout. The value of weight element ``(n, k)`` is

    w[n, k] = (q[n, k] - zeros[n, g]) * scales[n, g],    g = k // group_size

with ``q`` the unsigned code (``0 <= q < 2**bits``). Symmetric schemes are the special case
``zeros = 2**(bits - 1)`` (GPTQ ``sym=True`` stores exactly that), ``zeros=None`` means the
same. Asymmetric GGUF types whose offset is not an integer multiple of the scale (``Q4_1``:
``w = d * q + m``) use fractional zeros (``zeros = -m / d``). Act-order checkpoints (GPTQ
``desc_act`` with ``g_idx``) are stored with their input columns permuted so that groups are
contiguous: stored column ``j`` multiplies input feature ``perm[j]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import InvalidArgumentError

#: code widths the weight-only GEMM takes; 5- and 6-bit GGUF codes travel as 8-bit codes
SUPPORTED_BITS = (4, 8)


@dataclass(frozen=True)
class QuantizedWeight:
    """A weight-only quantized ``[N, K]`` linear weight (``N`` output features, ``K`` input
    features; ``y = x @ W.T`` as ``torch.nn.Linear``).

    Attributes:
        codes: ``uint8 [N, K]`` unsigned codes, one per element (for 4-bit: values 0..15;
            packing into the kernel's layout is the plugin's business, at build).
        scales: ``float32 [N, K // group_size]``.
        zeros: ``float32 [N, K // group_size]`` zero points in code units, or None
            (symmetric: ``2**(bits - 1)``).
        bits: 4 or 8.
        group_size: elements of K per scale (``K`` for one scale per output channel).
        perm: None, or ``int32 [K]``: stored column ``j`` multiplies input feature
            ``perm[j]`` (act-order checkpoints).

    Raises:
        InvalidArgumentError: shapes, dtypes, bits or code range inconsistent (the message
            names the field).
    """

    codes: np.ndarray
    scales: np.ndarray
    zeros: np.ndarray | None
    bits: int
    group_size: int
    perm: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.bits not in SUPPORTED_BITS:
            raise InvalidArgumentError(f"QuantizedWeight.bits must be one of {SUPPORTED_BITS}, got {self.bits!r}")
        c = self.codes
        if not isinstance(c, np.ndarray) or c.dtype != np.uint8 or c.ndim != 2:
            raise InvalidArgumentError(
                f"QuantizedWeight.codes must be a uint8 [N, K] array, got {getattr(c, 'dtype', type(c))} {getattr(c, 'shape', '')}"
            )
        n, k = c.shape
        g = self.group_size
        if not isinstance(g, int) or g <= 0 or k % g:
            raise InvalidArgumentError(f"QuantizedWeight.group_size must divide K={k}, got {g!r}")
        want = (n, k // g)
        if self.scales.shape != want or self.scales.dtype != np.float32:
            raise InvalidArgumentError(f"QuantizedWeight.scales must be float32 {want}, got {self.scales.dtype} {self.scales.shape}")
        if self.zeros is not None and (self.zeros.shape != want or self.zeros.dtype != np.float32):
            raise InvalidArgumentError(f"QuantizedWeight.zeros must be None or float32 {want}, got {self.zeros.dtype} {self.zeros.shape}")
        if c.size and int(c.max()) >= 1 << self.bits:
            raise InvalidArgumentError(f"QuantizedWeight.codes must be below 2**bits = {1 << self.bits}, got a code {int(c.max())}")
        if self.perm is not None:
            p = self.perm
            if p.shape != (k,) or p.dtype != np.int32 or not np.array_equal(np.sort(p), np.arange(k, dtype=np.int32)):
                raise InvalidArgumentError(f"QuantizedWeight.perm must be None or an int32 permutation of range({k}), got {p.dtype} {p.shape}")

    @property
    def shape(self) -> tuple[int, int]:
        """``(N, K)``."""
        return (int(self.codes.shape[0]), int(self.codes.shape[1]))

    def dequantize(self) -> np.ndarray:
        """The weight as ``float64 [N, K]`` in the input features' own order (the
        reference every format converter and kernel is tested against)."""
        n, k = self.shape
        g = self.group_size
        zeros = self.zeros if self.zeros is not None else np.full_like(self.scales, 1 << (self.bits - 1))
        q = self.codes.astype(np.float64).reshape(n, k // g, g)
        w = ((q - zeros.astype(np.float64)[..., None]) * self.scales.astype(np.float64)[..., None]).reshape(n, k)
        if self.perm is None:
            return w
        out = np.empty_like(w)
        out[:, self.perm] = w
        return out


__all__ = ["SUPPORTED_BITS", "QuantizedWeight"]
