"""The one table of element types: name <-> NumPy <-> TensorRT <-> safetensors <-> device storage <-> CUDA.

=============  ==========================  ==========  ===========  ==============  ==================  ======
name           NumPy (host)                TensorRT    safetensors  device storage  CUDA C type         kernel
=============  ==========================  ==========  ===========  ==============  ==================  ======
float32        ``float32``                 ``FLOAT``   ``F32``      same            ``float``           0
float16        ``float16``                 ``HALF``    ``F16``      same            ``__half``          1
bfloat16       ``ml_dtypes.bfloat16``      ``BF16``    ``BF16``     ``uint16``      ``__nv_bfloat16``   2
float8_e4m3fn  ``ml_dtypes.float8_e4m3fn`` ``FP8``     ``F8_E4M3``  ``uint8``       ``__nv_fp8_e4m3``
int8, uint8, int32, int64, bool: the same in every column (TensorRT ``INT8`` ``UINT8`` ``INT32`` ``INT64`` ``BOOL``)
float64, int16, uint16, uint32, uint64, float8_e5m2, float8_e8m0fnu: checkpoints only (no TensorRT type)
=============  ==========================  ==========  ===========  ==============  ==================  ======

*Device storage* is how an array module without the type holds it: CuPy has no bfloat16 or
FP8 dtype, so there a bfloat16 tensor is its raw 16-bit pattern in a ``uint16`` array --
exactly the memory TensorRT and trtcore's kernels read and write -- and the host view is
``ml_dtypes.bfloat16`` again (:func:`storage_dtype`, :func:`host_view`). The *kernel* code
is the ``DTYPE`` define of ``kernels/dtype.cuh``. TensorRT names are looked up by member
name, so the ``DataType`` of ``tensorrt``, ``tensorrt_rtx`` and :mod:`trtcore.reference`
all work. Sources: TensorRT ``DataType`` (Python API), the safetensors format
(``Dtype`` in ``safetensors/src/tensor.rs``), CUDA's ``cuda_fp16.h``/``cuda_bf16.h``/``cuda_fp8.h``.

This module imports only NumPy, ml_dtypes and :mod:`trtcore.errors`: every layer may use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from .errors import UnsupportedDTypeError

__all__ = [
    "DTYPES",
    "ENGINE_DTYPES",
    "KERNEL_DTYPE_CODES",
    "NCCL_DTYPE_CODES",
    "NAMES",
    "SAFETENSORS_DTYPES",
    "DType",
    "host_view",
    "lookup",
    "numpy_dtype",
    "storage_dtype",
    "trt_dtype",
]


@dataclass(frozen=True)
class DType:
    """One element type in every form trtcore meets it (one row of the module's table).

    Attributes:
        name: the NumPy name (``"bfloat16"``), the name trtcore's APIs take.
        numpy: the host NumPy dtype (``ml_dtypes`` for bfloat16 and FP8).
        trt: the TensorRT ``DataType`` member name (``"BF16"``), None where TensorRT has none.
        safetensors: the safetensors dtype code (``"BF16"``), None where it has none.
        storage: the dtype of a device array holding it (``uint16`` for bfloat16).
        cuda: the CUDA C type (``"__nv_bfloat16"``), None where kernels have none.
        kernel: the ``DTYPE`` define of ``kernels/dtype.cuh``, None where kernels lack it.
        aliases: other names accepted by :func:`lookup` (``"bf16"``).
        cuda_data_type: the ``cudaDataType_t`` code cuBLAS takes (``CUDA_R_16BF`` = 14; CUDA
            Toolkit ``library_types.h``), None where cuBLAS has none.
        nccl: the ``ncclDataType_t`` code (``ncclBfloat16`` = 9; ``nccl.h``), None where NCCL
            has none.
    """

    name: str
    numpy: np.dtype
    trt: str | None
    safetensors: str | None
    storage: np.dtype
    cuda: str | None = None
    kernel: int | None = None
    aliases: tuple[str, ...] = ()
    cuda_data_type: int | None = None
    nccl: int | None = None

    @property
    def cuda_compute(self) -> str | None:
        """The CUDA C type kernels compute this type in: ``float`` for 32-bit and narrower
        floats (TensorRT's kernels accumulate float16/bfloat16 in float32), ``int`` for
        integers narrower than 32 bits, else the type itself."""
        if self.cuda is None:
            return None
        if self.numpy.kind == "f" or self.name.startswith("float8") or self.name == "bfloat16":
            return "double" if self.itemsize == 8 else "float"
        if self.numpy.kind in "iu" and self.itemsize < 4:
            return "int"
        return self.cuda

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return int(self.numpy.itemsize)


def _row(name: str, numpy: Any, trt: str | None, st: str | None, storage: Any = None, **kw: Any) -> DType:
    np_dt = np.dtype(numpy)
    return DType(name, np_dt, trt, st, np.dtype(storage) if storage is not None else np_dt, **kw)


#: every type, in the module docstring's order
DTYPES: tuple[DType, ...] = tuple(
    row
    for row in (
        _row("float32", np.float32, "FLOAT", "F32", cuda="float", kernel=0, aliases=("fp32", "float"), cuda_data_type=0, nccl=7),
        _row("float16", np.float16, "HALF", "F16", cuda="__half", kernel=1, aliases=("fp16", "half"), cuda_data_type=2, nccl=6),
        _row("bfloat16", ml_dtypes.bfloat16, "BF16", "BF16", np.uint16, cuda="__nv_bfloat16", kernel=2, aliases=("bf16",), cuda_data_type=14, nccl=9),
        _row("float8_e4m3fn", ml_dtypes.float8_e4m3fn, "FP8", "F8_E4M3", np.uint8, cuda="__nv_fp8_e4m3", aliases=("fp8", "fp8_e4m3")),
        _row("int8", np.int8, "INT8", "I8", cuda="signed char", cuda_data_type=3),
        _row("uint8", np.uint8, "UINT8", "U8", cuda="unsigned char", cuda_data_type=8),
        _row("int32", np.int32, "INT32", "I32", cuda="int", cuda_data_type=10),
        _row("int64", np.int64, "INT64", "I64", cuda="long long"),
        _row("bool", np.bool_, "BOOL", "BOOL", cuda="bool"),
        _row("float64", np.float64, None, "F64", cuda="double", cuda_data_type=1),
        _row("int16", np.int16, None, "I16", cuda="short"),
        _row("uint16", np.uint16, None, "U16", cuda="unsigned short"),
        _row("uint32", np.uint32, None, "U32", cuda="unsigned int"),
        _row("uint64", np.uint64, None, "U64", cuda="unsigned long long"),
        _row("float8_e5m2", ml_dtypes.float8_e5m2, None, "F8_E5M2", np.uint8),
        *([_row("float8_e8m0fnu", ml_dtypes.float8_e8m0fnu, None, "F8_E8M0", np.uint8)] if hasattr(ml_dtypes, "float8_e8m0fnu") else []),
    )
)

_BY_NUMPY = {row.numpy: row for row in DTYPES}
_BY_TRT = {row.trt: row for row in DTYPES if row.trt}
_BY_NAME: dict[str, DType] = {}
for _r in DTYPES:  # names, aliases, TensorRT names and safetensors codes, case-insensitive
    for _key in (_r.name, *_r.aliases, _r.trt, _r.safetensors):
        if _key:
            _BY_NAME.setdefault(_key.lower(), _r)

#: every accepted spelling, lower-case (names, aliases, TensorRT names, safetensors codes) -> NumPy dtype
NAMES: dict[str, np.dtype] = {k: row.numpy for k, row in _BY_NAME.items()}
#: the engine (activation and weight) types trtcore builds, by name
ENGINE_DTYPES: dict[str, np.dtype] = {n: _BY_NAME[n].numpy for n in ("float32", "float16", "bfloat16")}
#: safetensors dtype code -> NumPy dtype (little-endian; the host is assumed little-endian)
SAFETENSORS_DTYPES: dict[str, np.dtype] = {row.safetensors: row.numpy for row in DTYPES if row.safetensors}
#: NumPy dtype -> the ``DTYPE`` define of ``kernels/dtype.cuh`` (float32 0, float16 1, bfloat16 2)
KERNEL_DTYPE_CODES: dict[np.dtype, int] = {row.numpy: row.kernel for row in DTYPES if row.kernel is not None}
#: NumPy dtype -> ``ncclDataType_t`` (the floats NCCL's collectives take here)
NCCL_DTYPE_CODES: dict[np.dtype, int] = {row.numpy: row.nccl for row in DTYPES if row.nccl is not None}


def _is_trt_datatype(x: Any) -> bool:
    """A TensorRT ``DataType`` member of any module (recognised by its upper-case ``name``)."""
    return not isinstance(x, (np.dtype, type, str)) and isinstance(getattr(x, "name", None), str) and x.name.isupper()


def lookup(dtype: Any) -> DType:
    """The table row of ``dtype``: a name or alias (``"bfloat16"``, ``"bf16"``, any case), a
    TensorRT name or safetensors code (``"HALF"``, ``"F16"``), a TensorRT ``DataType`` of any
    TensorRT module, a :class:`DType`, or anything :class:`numpy.dtype` accepts.

    Raises:
        UnsupportedDTypeError: not in the table (the message names ``dtype``); a ``ValueError``
            and a ``TypeError``.
    """
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str):
        row = _BY_NAME.get(dtype.strip().lower())
        if row is not None:
            return row
    elif _is_trt_datatype(dtype):
        row = _BY_TRT.get(str(dtype.name))
        if row is not None:
            return row
        raise UnsupportedDTypeError(f"TensorRT data type {getattr(dtype, 'name', dtype)} has no NumPy equivalent in trtcore")
    try:
        row = _BY_NUMPY.get(np.dtype(dtype))
    except TypeError:
        row = None
    if row is None:
        raise UnsupportedDTypeError(f"unknown data type {dtype!r}; expected one of {', '.join(r.name for r in DTYPES)}")
    return row


def numpy_dtype(dtype: Any) -> np.dtype:
    """The host NumPy dtype of ``dtype`` (anything :func:`lookup` takes; BF16 -> ``ml_dtypes.bfloat16``).

    Raises:
        UnsupportedDTypeError: as :func:`lookup`.
    """
    return lookup(dtype).numpy


def trt_dtype(trt: Any, dtype: Any) -> Any:
    """The ``trt.DataType`` member of ``dtype`` in the TensorRT module ``trt`` (``tensorrt``,
    ``tensorrt_rtx`` or :mod:`trtcore.reference`).

    Raises:
        UnsupportedDTypeError: ``dtype`` is unknown or has no TensorRT type (float64, int16, ...).
    """
    row = lookup(dtype)
    if row.trt is None:
        raise UnsupportedDTypeError(f"data type {row.name} has no TensorRT equivalent")
    return getattr(trt.DataType, row.trt)


def storage_dtype(dtype: Any, xp: Any = np) -> np.dtype:
    """The dtype of an ``xp`` array holding ``dtype``: the NumPy dtype on NumPy, the device
    storage (bfloat16 -> ``uint16`` bit patterns) on CuPy and other array modules.

    Raises:
        UnsupportedDTypeError: as :func:`lookup`.
    """
    row = lookup(dtype)
    return row.numpy if xp is np else row.storage


def host_view(array: np.ndarray, dtype: Any) -> np.ndarray:
    """``array`` (a host array in device storage, e.g. ``uint16`` bits) viewed as the host
    type of ``dtype`` (``ml_dtypes.bfloat16``); arrays already of that type are returned as is.

    Raises:
        UnsupportedDTypeError: as :func:`lookup`.
    """
    row = lookup(dtype)
    if array.dtype == row.storage and row.storage != row.numpy:
        return array.view(row.numpy)
    return array
