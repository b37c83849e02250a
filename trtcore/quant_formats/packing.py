"""Bit-unpacking of the int32 words GPTQ, AWQ and compressed-tensors pack their codes into.

All three formats put ``32 // bits`` unsigned codes into one 32-bit word, the first code in
the least significant bits: code ``i`` of a word is ``(word >> (bits * i)) & (2**bits - 1)``
(AutoGPTQ ``QuantLinear.pack``, AutoAWQ ``WQLinear_GEMM.from_linear``, compressed-tensors
``pack_to_int32``). They differ in the axis they pack along and, for AWQ, in the order of
the codes inside a word (:data:`AWQ_ORDER`).
"""

from __future__ import annotations

import numpy as np

from trtcore.errors import CheckpointError

#: AutoAWQ's GEMM packing: code slot ``i`` of a word holds column ``8 * word + AWQ_ORDER[i]``
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def unpack_int32(words: np.ndarray, bits: int, axis: int, name: str = "tensor") -> np.ndarray:
    """Unpack ``32 // bits`` codes per int32 word along ``axis``.

    Args:
        words: int32 (or uint32) array; ``axis`` has ``L`` words.
        bits: 4 or 8 (code width).
        axis: the packed axis; it becomes ``L * 32 // bits`` long.
        name: the tensor's name, for errors.

    Returns:
        ``uint8`` codes, word ``w`` slot ``i`` at position ``w * (32 // bits) + i``.

    Raises:
        CheckpointError: ``words`` is not a 32-bit integer array or ``bits`` does not divide 32.
    """
    if words.dtype not in (np.dtype(np.int32), np.dtype(np.uint32)):
        raise CheckpointError(f"tensor '{name}' has dtype {words.dtype}, expected int32 (packed {bits}-bit codes)")
    if bits not in (4, 8):
        raise CheckpointError(f"tensor '{name}': {bits}-bit codes are not supported, expected 4 or 8")
    per_word = 32 // bits
    w = np.moveaxis(np.ascontiguousarray(words).view(np.uint32), axis, -1)
    shifts = np.arange(per_word, dtype=np.uint32) * np.uint32(bits)
    codes = ((w[..., None] >> shifts) & np.uint32((1 << bits) - 1)).astype(np.uint8)
    return np.moveaxis(codes.reshape(*w.shape[:-1], w.shape[-1] * per_word), -1, axis)


#: the int32 ``qweight`` layouts of the two formats that share ``qzeros [G, N * bits / 32]`` and
#: ``scales [G, N]``: the axis each packs its codes along
QWEIGHT_LAYOUTS = {"GPTQ": ("K", "[K * bits / 32, N]"), "AWQ": ("N", "[K, N * bits / 32]")}


def check_qweight_layout(qweight: np.ndarray, scales: np.ndarray, bits: int, fmt: str, name: str) -> None:
    """Refuse a ``qweight`` packed along the other format's axis (:data:`QWEIGHT_LAYOUTS`):
    GPTQ and AWQ files hold the same tensor names, ``qzeros`` and ``scales`` alike, so a GPTQ
    checkpoint read as AWQ (``quantization="awq"`` given for an AutoGPTQ folder, or the
    reverse) would otherwise fail with a shape message that names neither format. ``scales``
    ``[G, N]`` give N; ``qweight``'s last axis is N for GPTQ and ``N * bits / 32`` for AWQ.

    Raises:
        CheckpointError: ``qweight``'s columns fit the other format's layout and not ``fmt``'s
            (both formats, the axis and the fix named).
    """
    if np.ndim(qweight) != 2 or np.ndim(scales) != 2:
        return  # the readers name a wrong rank
    n, cols = int(scales.shape[1]), int(qweight.shape[1])
    packed_n = -(-n * bits // 32)
    other, expected, foreign = ("AWQ", n, packed_n) if fmt == "GPTQ" else ("GPTQ", packed_n, n)
    if cols == foreign != expected:
        axis, layout = QWEIGHT_LAYOUTS[other]
        raise CheckpointError(
            f"'{name}.qweight' has shape {tuple(qweight.shape)} for N={n} outputs ('{name}.scales'): packed along {axis}, "
            f"{other}'s layout {layout}, where {fmt} packs along {QWEIGHT_LAYOUTS[fmt][0]} {QWEIGHT_LAYOUTS[fmt][1]}; "
            f"these are {other} tensors, which quant_method {fmt.lower()!r} does not describe: where config.json's "
            f"quantization_config says {fmt.lower()!r}, its quant_method should be {other.lower()!r}; where the method came from "
            f"quantization={fmt.lower()!r} (a folder with a quantize_config.json beside config.json), pass quantization={other.lower()!r}"
        )


def pack_int32(codes: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """The inverse of :func:`unpack_int32`: ``32 // bits`` unsigned codes per int32 word along
    ``axis`` (whose length must be a multiple of it), the first code in the low bits.

    Raises:
        CheckpointError: ``bits`` is not 4 or 8, a code does not fit ``bits``, or the axis
            length is not a multiple of ``32 // bits``.
    """
    if bits not in (4, 8):
        raise CheckpointError(f"{bits}-bit codes are not supported, expected 4 or 8")
    per_word = 32 // bits
    c = np.moveaxis(np.asarray(codes), axis, -1)
    if c.shape[-1] % per_word:
        raise CheckpointError(f"{c.shape[-1]} codes along axis {axis} do not fill whole words of {per_word}")
    if c.size and int(c.max()) >= 1 << bits:
        raise CheckpointError(f"a code {int(c.max())} does not fit {bits} bits")
    slots = c.astype(np.uint32).reshape(*c.shape[:-1], -1, per_word)
    shifts = np.arange(per_word, dtype=np.uint32) * np.uint32(bits)
    words = np.bitwise_or.reduce(slots << shifts, axis=-1).astype(np.uint32)
    return np.ascontiguousarray(np.moveaxis(words.view(np.int32), -1, axis))


def awq_unorder(codes: np.ndarray, axis: int) -> np.ndarray:
    """Put AWQ's interleaved columns (:data:`AWQ_ORDER`, unpacked along ``axis`` by
    :func:`unpack_int32`) back in their natural order."""
    c = np.moveaxis(codes, axis, -1)
    groups = c.reshape(*c.shape[:-1], -1, len(AWQ_ORDER))
    natural = np.empty_like(groups)
    natural[..., list(AWQ_ORDER)] = groups
    return np.moveaxis(natural.reshape(c.shape), -1, axis)


__all__ = ["AWQ_ORDER", "QWEIGHT_LAYOUTS", "awq_unorder", "check_qweight_layout", "pack_int32", "unpack_int32"]
