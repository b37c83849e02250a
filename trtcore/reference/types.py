"""Enums, data types and ``Weights`` of trtcore's reference TensorRT API.

Names and members follow the TensorRT Python API (``tensorrt.DataType``,
``tensorrt.ElementWiseOperation``, ...; TensorRT 10 "Python API" reference), so code written
against :mod:`trtcore.reference` runs unchanged against ``tensorrt`` or ``tensorrt_rtx``.
"""

from __future__ import annotations

import collections
import ctypes
import enum
from typing import Any

import numpy as np

from .. import dtypes
from ..errors import UnsupportedDTypeError


class DataType(enum.IntEnum):
    """Tensor element types (``tensorrt.DataType``); values equal TensorRT's."""

    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    FP8 = 6
    BF16 = 7
    INT64 = 8

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        size = _ITEMSIZE.get(self)
        return size if size is not None else int(np.dtype(nptype(self)).itemsize)


FLOATING = frozenset({DataType.FLOAT, DataType.HALF, DataType.BF16})


def nptype(dtype: DataType) -> Any:
    """The NumPy type of a :class:`DataType` (BF16 -> ``ml_dtypes.bfloat16``), like ``trt.nptype``
    (from :mod:`trtcore.dtypes`).

    Raises:
        TypeError: not a data type here (``trtcore.errors.UnsupportedDTypeError``).
    """
    cached = _NPTYPE.get(dtype)  # asked for every tensor of every launch list (cuda engine's prepare)
    if cached is not None:
        return cached
    try:
        member = DataType(dtype)
    except ValueError:
        raise UnsupportedDTypeError(f"no NumPy type for TensorRT data type {dtype!r}") from None
    return dtypes.numpy_dtype(member).type


#: :func:`nptype` and :attr:`DataType.itemsize` of every member, computed once
_NPTYPE: dict[Any, Any] = {m: dtypes.numpy_dtype(m).type for m in DataType}
_ITEMSIZE: dict[Any, int] = {m: int(np.dtype(t).itemsize) for m, t in _NPTYPE.items()}


def from_numpy_dtype(dtype: Any) -> DataType:
    """The :class:`DataType` of a NumPy dtype (from :mod:`trtcore.dtypes`).

    Raises:
        TypeError: it has none, e.g. float64 (``trtcore.errors.UnsupportedDTypeError``).
    """
    row = dtypes.lookup(np.dtype(dtype))
    if row.trt is None:
        raise UnsupportedDTypeError(f"NumPy dtype {row.numpy} has no TensorRT data type")
    return DataType[row.trt]


class NetworkDefinitionCreationFlag(enum.IntEnum):
    """``tensorrt.NetworkDefinitionCreationFlag``; networks are always strongly typed here."""

    STRONGLY_TYPED = 1


class ElementWiseOperation(enum.IntEnum):
    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    SUB = 4
    DIV = 5
    POW = 6
    FLOOR_DIV = 7
    AND = 8
    OR = 9
    XOR = 10
    EQUAL = 11
    GREATER = 12
    LESS = 13


class UnaryOperation(enum.IntEnum):
    EXP = 0
    LOG = 1
    SQRT = 2
    RECIP = 3
    ABS = 4
    NEG = 5
    SIN = 6
    COS = 7
    TAN = 8
    SINH = 9
    COSH = 10
    ASIN = 11
    ACOS = 12
    ATAN = 13
    ASINH = 14
    ACOSH = 15
    ATANH = 16
    CEIL = 17
    FLOOR = 18
    ERF = 19
    NOT = 20
    SIGN = 21
    ROUND = 22
    ISINF = 23
    ISNAN = 24


class ActivationType(enum.IntEnum):
    RELU = 0
    SIGMOID = 1
    TANH = 2
    LEAKY_RELU = 3
    ELU = 4
    SELU = 5
    SOFTSIGN = 6
    SOFTPLUS = 7
    CLIP = 8
    HARD_SIGMOID = 9
    SCALED_TANH = 10
    THRESHOLDED_RELU = 11
    GELU_ERF = 12
    GELU_TANH = 13


class ReduceOperation(enum.IntEnum):
    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4


class MatrixOperation(enum.IntEnum):
    NONE = 0
    TRANSPOSE = 1
    VECTOR = 2


class GatherMode(enum.IntEnum):
    DEFAULT = 0
    ELEMENT = 1
    ND = 2


class LayerType(enum.IntEnum):
    """Layer kinds; values equal TensorRT's (checked against tensorrt_rtx)."""

    CAST = 1
    ACTIVATION = 2
    SOFTMAX = 6
    CONCATENATION = 8
    ELEMENTWISE = 9
    PLUGIN = 10
    UNARY = 11
    SHUFFLE = 13
    REDUCE = 14
    GATHER = 16
    MATRIX_MULTIPLY = 17
    CONSTANT = 19
    IDENTITY = 20
    SLICE = 22
    SHAPE = 23
    SELECT = 30
    PLUGIN_V3 = 46
    ATTENTION_INPUT = 51
    ATTENTION_OUTPUT = 52
    KV_CACHE_UPDATE = 54


class AttentionNormalizationOp(enum.IntEnum):
    """``tensorrt.AttentionNormalizationOp``: what ``IAttention`` applies to the scores."""

    NONE = 0
    SOFTMAX = 1


class CausalMaskKind(enum.IntEnum):
    """``tensorrt.CausalMaskKind`` (TensorRT 10.15+ / TensorRT-RTX 1.3+): where the causal
    diagonal of ``IAttention`` is anchored, for ``s_q`` queries and ``s_kv`` keys.

    * ``UPPER_LEFT``: query ``i`` sees keys ``j <= i`` (``add_attention(causal=True)``);
    * ``LOWER_RIGHT``: query ``i`` sees keys ``j <= i + (s_kv - s_q)`` (decode-aligned);
      both equal when ``s_q == s_kv``.
    """

    NONE = 0
    UPPER_LEFT = 1
    LOWER_RIGHT = 2


class AttentionIOForm(enum.IntEnum):
    """``tensorrt.AttentionIOForm``: ``PADDED_BHND`` ``[batch, heads, tokens, head_dim]`` or
    ``PACKED_NHD`` ``[total_tokens, heads, head_dim]`` (with cumulative lengths)."""

    PADDED_BHND = 0
    PACKED_NHD = 1


class KVCacheMode(enum.IntEnum):
    """``tensorrt.KVCacheMode`` of ``IKVCacheUpdateLayer``; only ``LINEAR`` exists."""

    LINEAR = 0


class MemoryPoolType(enum.IntEnum):
    WORKSPACE = 0
    TACTIC_SHARED_MEMORY = 5


class TensorIOMode(enum.IntEnum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class Weights:
    """Constant data, like ``tensorrt.Weights``.

    Accepts ``Weights(array)`` (a NumPy array; its dtype decides the type) or TensorRT's
    pointer form ``Weights(DataType, pointer, count)`` (the bytes are copied, so the caller
    need not keep the buffer alive here, unlike TensorRT).
    """

    def __init__(self, *args: Any) -> None:
        if len(args) == 1:
            array = np.ascontiguousarray(args[0])
            self.dtype = from_numpy_dtype(array.dtype)
            self.array = array
        elif len(args) == 3:
            dtype, ptr, count = DataType(args[0]), int(args[1]), int(args[2])
            nbytes = count * dtype.itemsize
            raw = (ctypes.c_char * nbytes).from_address(ptr) if nbytes else b""
            self.array = np.frombuffer(bytes(raw), dtype=nptype(dtype)).copy()
            self.dtype = dtype
        else:
            raise TypeError("Weights(array) or Weights(DataType, pointer, count)")

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(self.array.size)

    @property
    def nbytes(self) -> int:
        """Number of bytes."""
        return int(self.array.nbytes)


class Logger:
    """Severity-filtered logger (``tensorrt.Logger``); prints to stderr."""

    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3
    VERBOSE = 4

    def __init__(self, min_severity: int = WARNING) -> None:
        self.min_severity = min_severity
        #: the last 32 warnings and errors, and every error (as :func:`trtcore.log.trt_logger`'s
        #: loggers keep them, so executors can quote what the builder or runtime said)
        self.messages: collections.deque[str] = collections.deque(maxlen=32)
        self.errors: list[str] = []

    def log(self, severity: int, msg: str) -> None:
        if severity <= self.WARNING:
            self.messages.append(msg)
        if severity <= self.ERROR:
            self.errors.append(msg)
        if severity <= self.min_severity:
            import sys

            print(f"[trtcore.reference] {msg}", file=sys.stderr)
