"""cuBLASLt matmuls for the engine's GEMMs (nvmath-python's low-level ``cublasLt`` bindings).

A :class:`~trtcore.cuda.gemm.GemmCall` (column-major ``C(m x n) = op(X) op(Y)``, strided
batch) maps one to one onto ``cublasLtMatmul`` with ``A = X``, ``B = Y``, ``C = D`` (the
output), ``CUBLAS_COMPUTE_32F`` and float32 ``alpha = 1``, ``beta = 0``. Unlike
``cublasGemmEx``, cuBLASLt lets the caller pick the algorithm: :meth:`Lt.heuristics` asks
``cublasLtMatmulAlgoGetHeuristic`` for its best candidates within the engine's fixed
workspace, :meth:`Lt.split_k` derives split-K variants of a candidate
(``CUBLASLT_ALGO_CONFIG_SPLITK_NUM``, checked with ``cublasLtMatmulAlgoCheck``) for the
small-M GEMMs of decode, where one wave of CTAs over ``N`` alone leaves most SMs idle, and
:mod:`trtcore.cuda.tactics` times them. An algorithm is the opaque 64-byte
``cublasLtMatmulAlgo_t``; it is stored as bytes in the plan and the timing cache, as
TensorRT's timing cache stores tactics (NVIDIA, cuBLASLt API reference,
"cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmulAlgoConfigAttributes_t").

Everything here is host-side descriptor work except :meth:`Lt.run`, which only enqueues on
the given stream (capturable in a CUDA graph).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import dtypes
from ..reference.types import DataType
from .gemm import COMPUTE_32F, GemmCall, HandleOwner

#: ``cudaDataType_t`` CUDA_R_32F (the scale type of a 32F-compute matmul)
_R_32F = 0


@dataclass(frozen=True)
class Candidate:
    """One cuBLASLt algorithm for one call shape: the 64 ``algo`` bytes, the ``workspace``
    bytes it needs, and a short ``label`` (heuristic rank, split-K count) for the build log."""

    algo: bytes
    workspace: int
    label: str


def _field(record: Any, name: str) -> Any:
    """Field ``name`` of a one-element array of cuBLASLt structs, as a NumPy scalar (indexing
    such an array gives a one-element array again)."""
    return np.asarray(record[name]).reshape(-1)[0]


def signature(call: GemmCall, dtype: DataType) -> str:
    """The shape key of ``call`` (everything an algorithm depends on, offsets excluded):
    ``"bfloat16 TN m=.. n=.. k=.. ld=../../.. stride=../../.. batch=.."``."""
    ops = "NT"[call.op_x] + "NT"[call.op_y]
    return (
        f"{dtype.name.lower()} {ops} m={call.m} n={call.n} k={call.k} ld={call.ldx}/{call.ldy}/{call.ldc} "
        f"stride={call.stride_x}/{call.stride_y}/{call.stride_c} batch={call.batch}"
    )


class Lt(HandleOwner):
    """A cuBLASLt handle with the engine's fixed workspace; descriptors cached per shape.

    Raises (from every method): ``nvmath.bindings.cublasLt.cuBLASLtError`` for a status
    other than success (e.g. an algorithm that does not fit the shape).
    """

    def __init__(self, workspace: int, workspace_size: int):
        from nvmath.bindings import cublasLt

        self._lt = cublasLt
        self.handle = cublasLt.create()
        self.workspace = int(workspace)
        self.workspace_size = int(workspace_size)
        self._descs: dict[str, tuple[int, int, int, int]] = {}
        self._one = np.ones(1, dtype=np.float32)
        self._zero = np.zeros(1, dtype=np.float32)
        self._algos: dict[bytes, np.ndarray] = {}

    @staticmethod
    def version() -> int:
        """cuBLASLt's version number (part of the timing cache's key)."""
        from nvmath.bindings import cublasLt

        return int(cublasLt.get_version())

    def _set(self, setter: Any, dtype_of: Any, obj: int, attr: Any, value: int) -> None:
        buf = np.array(value, dtype=dtype_of(attr))
        setter(obj, attr, buf.ctypes.data, buf.nbytes)

    def _layout(self, t: int, rows: int, cols: int, ld: int, batch: int, stride: int) -> int:
        lt = self._lt
        layout = lt.matrix_layout_create(t, rows, cols, ld)
        if batch > 1:
            A = lt.MatrixLayoutAttribute
            self._set(lt.matrix_layout_set_attribute, lt.get_matrix_layout_attribute_dtype, layout, A.BATCH_COUNT, batch)
            self._set(lt.matrix_layout_set_attribute, lt.get_matrix_layout_attribute_dtype, layout, A.STRIDED_BATCH_OFFSET, stride)
        return layout

    def descriptors(self, call: GemmCall, dtype: DataType) -> tuple[int, int, int, int]:
        """``(matmul_desc, a_layout, b_layout, c_layout)`` of ``call`` (made once per shape)."""
        key = signature(call, dtype)
        got = self._descs.get(key)
        if got is not None:
            return got
        lt = self._lt
        t = dtypes.lookup(dtype).cuda_data_type
        desc = lt.matmul_desc_create(COMPUTE_32F, _R_32F)
        D = lt.MatmulDescAttribute
        self._set(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, desc, D.TRANSA, call.op_x)
        self._set(lt.matmul_desc_set_attribute, lt.get_matmul_desc_attribute_dtype, desc, D.TRANSB, call.op_y)
        ax = (call.m, call.k) if call.op_x == 0 else (call.k, call.m)
        by = (call.k, call.n) if call.op_y == 0 else (call.n, call.k)
        a = self._layout(t, *ax, call.ldx, call.batch, call.stride_x)
        b = self._layout(t, *by, call.ldy, call.batch, call.stride_y)
        c = self._layout(t, call.m, call.n, call.ldc, call.batch, call.stride_c)
        self._descs[key] = (desc, a, b, c)
        return self._descs[key]

    def heuristics(self, call: GemmCall, dtype: DataType, limit: int = 8) -> list[Candidate]:
        """cuBLASLt's best ``limit`` algorithms for ``call`` within the workspace, best first."""
        lt = self._lt
        desc, a, b, c = self.descriptors(call, dtype)
        pref = lt.matmul_preference_create()
        try:
            P = lt.MatmulPreferenceAttribute
            self._set(lt.matmul_preference_set_attribute, lt.get_matmul_preference_attribute_dtype, pref, P.MAX_WORKSPACE_BYTES, self.workspace_size)
            results = lt.MatmulHeuristicResult(limit)
            count = np.zeros(1, dtype=np.int32)
            lt.matmul_algo_get_heuristic(self.handle, desc, a, b, c, c, pref, limit, results.ptr, count.ctypes.data)
        finally:
            lt.matmul_preference_destroy(pref)
        return [
            Candidate(_field(results[i], "algo").tobytes(), int(_field(results[i], "workspace_size")), f"heuristic#{i}") for i in range(int(count[0]))
        ]

    def split_k(self, call: GemmCall, dtype: DataType, base: Candidate, splits: tuple[int, ...] = (2, 4, 8, 16)) -> list[Candidate]:
        """Variants of ``base`` that split ``k`` into ``splits`` parts, those cuBLASLt accepts
        for ``call`` within the workspace (``cublasLtMatmulAlgoCheck``)."""
        lt = self._lt
        desc, a, b, c = self.descriptors(call, dtype)
        C = lt.MatmulAlgoConfigAttribute
        out = []
        for s in splits:
            if call.k < 64 * s:
                continue
            algo = np.frombuffer(base.algo, dtype=np.uint8).copy()
            try:
                self._set(lt.matmul_algo_config_set_attribute, lt.get_matmul_algo_config_attribute_dtype, algo.ctypes.data, C.SPLITK_NUM, s)
                check = lt.MatmulHeuristicResult(1)
                lt.matmul_algo_check(self.handle, desc, a, b, c, c, algo.ctypes.data, check.ptr)
            except Exception:  # noqa: BLE001 - this algorithm has no split-K form for the shape
                continue
            ws = int(_field(check, "workspace_size"))
            if ws <= self.workspace_size:
                out.append(Candidate(algo.tobytes(), ws, f"{base.label}+splitk{s}"))
        return out

    def run(self, call: GemmCall, dtype: DataType, algo: bytes, x_ptr: int, y_ptr: int, c_ptr: int, stream: int) -> None:
        """Enqueue ``call`` with algorithm ``algo`` on ``stream`` (pointers are the operands'
        bases; the call's offsets are added here)."""
        desc, a, b, c = self.descriptors(call, dtype)
        buf = self._algos.get(algo)
        if buf is None:
            buf = self._algos[algo] = np.frombuffer(algo, dtype=np.uint8).copy()
        size = dtype.itemsize
        x, y, cc = x_ptr + call.x_off * size, y_ptr + call.y_off * size, c_ptr + call.c_off * size
        self._lt.matmul(
            self.handle, desc, self._one.ctypes.data, x, a, y, b, self._zero.ctypes.data, cc, c, cc, c,
            buf.ctypes.data, self.workspace, self.workspace_size, int(stream),
        )  # fmt: skip

    def close(self) -> None:
        """Destroy the descriptors and the handle (idempotent)."""
        lt = self._lt
        for desc, a, b, c in self._descs.values():
            lt.matmul_desc_destroy(desc)
            for layout in (a, b, c):
                lt.matrix_layout_destroy(layout)
        self._descs.clear()
        if self.handle:
            lt.destroy(self.handle)
            self.handle = 0


#: ``cudaDataType_t`` CUDA_R_8F_E4M3
R_8F_E4M3 = 28
#: ``cudaDataType_t`` of the FP8 GEMM's output (and C): CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF
FP8_OUTPUT_TYPES = {0: "float32", 2: "float16", 14: "bfloat16"}
#: cuBLASLt's FP8 operands and output: pointers and leading dimensions 16-byte aligned
FP8_ALIGN = 16


#: How far cuBLASLt's FP8 GEMM may be from float64 on the same E4M3 operands, relative to
#: ``max|D|``, before the output's own rounding: ``2**-10``. Derivation: the accumulation is not
#: float32 throughout. Measured on the H200 (``bench/results/h200-2026-12-02-fp8-probe/``, the
#: float32 rows without scale pointers): ``1.9e-4 .. 4.3e-4`` (``2**-12.3 .. 2**-11.2``) for
#: K = 64 .. 4096, M = 1 .. 128, already at K = 64, where a float32 sum of the (exact, 8-bit)
#: E4M3 products would be off by ``~2**-24``, and not growing with K. That is the tensor cores'
#: own FP8 accumulator, which keeps about 14 bits of the aligned sum (DeepSeek-V3 technical
#: report, arXiv 2412.19437, section 3.3.2, on H800), so each partial sum is off by up to
#: ``~2**-13`` of its size; with ``FAST_ACCUM = 0`` cuBLASLt adds the partial of each
#: promotion interval of ``K_c`` steps into float32, so ``K / K_c`` such errors add up. For
#: zero-mean operands (the tests' random data) a partial is ``~sqrt(K_c / K)`` of the output
#: and the errors have random signs, so they add in quadrature to ``~2**-13 .. 2**-12`` of the
#: output whatever K is -- as measured. The bound is 4x that (2.3x the worst measured); a
#: wrong scale, layout or E4M3 code is off by 2**-4 or more. It assumes ``max|D|`` is of the
#: order of ``sqrt(sum_k (x_k w_k)**2)`` (no systematic cancellation in every output).
FP8_ACCUMULATION_RTOL = 2.0**-10
#: error bound of :class:`Fp8Matmul` with ``fast_accum`` (the whole K in the tensor cores'
#: accumulator, no float32 promotion), relative to ``max|D|``: ``2**-6``. Measured on the H200
#: (``bench/bench_fp8_gemm.py``, ``bench/results/h200-2026-12-03-session12/call4``; bfloat16
#: output, whose rounding is up to ``2**-9``): ``3.7e-3 .. 1.0e-2`` for K = 4096 .. 14336 on
#: zero-mean E4M3 operands below 2, against ``2.2e-3 .. 2.8e-3`` with promotion; 14-bit partial
#: sums over the whole K add more errors than over one promotion interval. The bound is 1.5x the
#: worst measured; a wrong scale or layout is off by ``2**-4`` or more.
FP8_FAST_ACCUMULATION_RTOL = 2.0**-6
#: ``cublasLtPointerMode_t`` CUBLASLT_POINTER_MODE_DEVICE: alpha and beta are device pointers
POINTER_MODE_DEVICE = 1
#: the pointers of :func:`fp8_check` that point to one float32 (4-byte aligned); the rest are matrices
FP8_SCALAR_POINTERS = ("alpha", "beta")


def fp8_check(m: int, n: int, k: int, out_type: int, pointers: dict[str, int]) -> None:
    """Refuse an FP8 GEMM cuBLASLt documents as unsupported, naming the value (the rules of
    :class:`Fp8Matmul`): ``m, n, k >= 1``; ``k`` and ``n`` multiples of 16 (the leading
    dimensions of the E4M3 operands, ``k`` bytes, and of the output, ``n`` elements); an
    output type of :data:`FP8_OUTPUT_TYPES`; every pointer in ``pointers`` (name -> address)
    non-null, the matrices' 16-byte aligned and the float32 scalars'
    (:data:`FP8_SCALAR_POINTERS`) 4-byte aligned.

    Raises:
        ValueError: the first rule broken.
    """
    if m < 1 or n < 1 or k < 1:
        raise ValueError(f"cuBLASLt FP8 GEMM: m, n, k must be >= 1, got m={m} n={n} k={k}")
    if k % 16 or n % 16:
        raise ValueError(f"cuBLASLt FP8 GEMM needs K and N multiples of 16 (16-byte aligned leading dimensions), got K={k} N={n}")
    if out_type not in FP8_OUTPUT_TYPES:
        raise ValueError(
            f"cuBLASLt FP8 GEMM: output cudaDataType_t {out_type} is not one of {FP8_OUTPUT_TYPES} (E4M3 x E4M3 -> float32/float16/bfloat16)"
        )
    for name, ptr in pointers.items():
        align = 4 if name in FP8_SCALAR_POINTERS else FP8_ALIGN
        if not ptr or ptr % align:
            raise ValueError(f"cuBLASLt FP8 GEMM: {name} pointer 0x{ptr:x} must be non-null and {align}-byte aligned")


#: ``cudaDataType_t`` of :class:`LinearMatmul`'s operands: E4M3, bfloat16, float16
LINEAR_INPUT_TYPES = {R_8F_E4M3: "FP8", 14: "bfloat16", 2: "float16"}


class LinearMatmul(HandleOwner):
    """cuBLASLt's GEMM for a row-major linear ``D[M, N] = alpha * X[M, K] @ W[N, K]^T`` (D's rows
    ``ldd >= N`` elements apart, so D may be a block of columns of a wider matrix), ``X`` and
    ``W`` of one ``in_type`` (:data:`LINEAR_INPUT_TYPES`), float32 accumulation
    (``CUBLAS_COMPUTE_32F``, ``CUDA_R_32F`` scales):

    * column-major ``A = W`` stored ``K x N`` (``ld = K``) with ``TRANSA = T``, ``B = X``
      stored ``K x M`` (``ld = K``) with ``TRANSB = N``, so ``D`` is ``N x M`` column-major
      (``ld = ldd``) = ``[M, N]`` row-major; ``C`` has ``D``'s layout and type (unused, beta 0).
      TN is the one form FP8 allows on compute capability 8.9 / 9.0 (:class:`Fp8Matmul`), and
      it needs no transposed copy of a row-major ``[N, K]`` weight for 16-bit types either;
    * ``device_scalars``: alpha and beta are device float32 pointers given to each call
      (``CUBLASLT_POINTER_MODE_DEVICE``); else ``alpha = 1``, ``beta = 0`` from host memory
      (the default pointer mode);
    * one plan (descriptor, layouts, algorithm) per shape, ``ldd``, output type, workspace and
      operand alignment; the algorithm is cuBLASLt's first heuristic candidate whose state is
      success, within the workspace and for the pointers' actual alignment
      (``CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES``, as nvmath-python gives it; the default
      assumes 256 bytes).

    Raises (from :meth:`matmul`): ValueError for an ``in_type`` not in
    :data:`LINEAR_INPUT_TYPES` (at construction) or ``ldd < N``; RuntimeError when cuBLASLt
    offers no algorithm; ``nvmath.bindings.cublasLt.cuBLASLtError`` from cuBLASLt itself.
    """

    def __init__(self, in_type: int, device_scalars: bool = False, fast_accum: bool = False) -> None:
        if in_type not in LINEAR_INPUT_TYPES:
            raise ValueError(f"LinearMatmul: operand cudaDataType_t {in_type} is not one of {LINEAR_INPUT_TYPES}")
        from nvmath.bindings import cublasLt

        self._lt = cublasLt
        self.in_type = int(in_type)
        self.device_scalars = bool(device_scalars)
        self.fast_accum = bool(fast_accum)
        self.handle = cublasLt.create()
        self._plans: dict[tuple[int, ...], tuple[int, int, int, int, np.ndarray]] = {}
        self._one = np.ones(1, dtype=np.float32)
        self._zero = np.zeros(1, dtype=np.float32)

    def _set(self, obj: int, attr: Any, value: int) -> None:
        lt = self._lt
        buf = np.array(value, dtype=lt.get_matmul_desc_attribute_dtype(attr))
        lt.matmul_desc_set_attribute(obj, attr, buf.ctypes.data, buf.nbytes)

    def plan(
        self, m: int, n: int, k: int, out_type: int, workspace_size: int, align: tuple[int, int, int] = (256, 256, 256), ldd: int = 0
    ) -> tuple[int, int, int, int, np.ndarray]:
        """``(matmul_desc, a_layout, b_layout, d_layout, algo)`` for the call (made once; the
        descriptor is complete -- TN, pointer mode, FP8's ``FAST_ACCUM`` -- before the
        heuristic). ``align``: the byte alignment (at most 256) the W, X and D pointers are known
        to have, given to the heuristic (an algorithm picked for 256-byte aligned operands may
        refuse less aligned ones). ``ldd``: D's row stride in elements (0: ``n``)."""
        ldd = ldd or n
        if ldd < n:
            raise ValueError(f"LinearMatmul: D's row stride ldd={ldd} is below N={n}")
        key = (m, n, k, out_type, workspace_size, align, ldd)
        got = self._plans.get(key)
        if got is not None:
            return got
        lt = self._lt
        desc = lt.matmul_desc_create(COMPUTE_32F, _R_32F)
        a = b = d = 0
        try:
            D = lt.MatmulDescAttribute
            self._set(desc, D.TRANSA, 1)  # CUBLAS_OP_T
            self._set(desc, D.TRANSB, 0)  # CUBLAS_OP_N
            if self.device_scalars:
                self._set(desc, D.POINTER_MODE, POINTER_MODE_DEVICE)
            if self.in_type == R_8F_E4M3:
                self._set(desc, D.FAST_ACCUM, int(self.fast_accum))
            a = lt.matrix_layout_create(self.in_type, k, n, k)
            b = lt.matrix_layout_create(self.in_type, k, m, k)
            d = lt.matrix_layout_create(out_type, n, m, ldd)
            algo = self._heuristic(desc, a, b, d, workspace_size, align)
            if algo is None:
                what = LINEAR_INPUT_TYPES[self.in_type]
                out = FP8_OUTPUT_TYPES.get(out_type, out_type)
                raise RuntimeError(f"cuBLASLt has no {what} GEMM algorithm for m={m} n={n} k={k} output {out}")
        except BaseException:
            lt.matmul_desc_destroy(desc)
            for layout in (a, b, d):
                if layout:
                    lt.matrix_layout_destroy(layout)
            raise
        self._plans[key] = (desc, a, b, d, algo)
        return self._plans[key]

    def _heuristic(self, desc: int, a: int, b: int, d: int, workspace_size: int, align: tuple[int, int, int]) -> np.ndarray | None:
        """The first of cuBLASLt's (up to 8) heuristic results whose ``state`` is success, as
        algorithm bytes; None when there is none."""
        lt = self._lt
        pref = lt.matmul_preference_create()
        try:
            P = lt.MatmulPreferenceAttribute
            settings = [(P.MAX_WORKSPACE_BYTES, workspace_size)]
            settings += [(P.MIN_ALIGNMENT_A_BYTES, align[0]), (P.MIN_ALIGNMENT_B_BYTES, align[1])]
            settings += [(P.MIN_ALIGNMENT_C_BYTES, align[2]), (P.MIN_ALIGNMENT_D_BYTES, align[2])]
            for attr, value in settings:
                buf = np.array(value, dtype=lt.get_matmul_preference_attribute_dtype(attr))
                lt.matmul_preference_set_attribute(pref, attr, buf.ctypes.data, buf.nbytes)
            results = lt.MatmulHeuristicResult(8)
            count = np.zeros(1, dtype=np.int32)
            lt.matmul_algo_get_heuristic(self.handle, desc, a, b, d, d, pref, 8, results.ptr, count.ctypes.data)
        finally:
            lt.matmul_preference_destroy(pref)
        for i in range(int(count[0])):
            if int(_field(results[i], "state")) == 0:  # CUBLAS_STATUS_SUCCESS
                return np.frombuffer(_field(results[i], "algo").tobytes(), dtype=np.uint8).copy()
        return None

    def matmul(
        self, m: int, n: int, k: int, w_ptr: int, x_ptr: int, d_ptr: int, out_type: int, workspace: int, workspace_size: int,
        stream: int, ldd: int = 0, alpha_ptr: int = 0, beta_ptr: int = 0,
    ) -> None:  # fmt: skip
        """Enqueue ``D = alpha * X @ W^T + beta * D`` on ``stream`` (W ``[N, K]``, X ``[M, K]``
        row-major of ``in_type``; D ``[M, N]`` of ``out_type``, a ``cudaDataType_t``, rows
        ``ldd`` apart, 0: ``n``); ``alpha_ptr`` / ``beta_ptr`` device float32 pointers with
        ``device_scalars``, ignored without (alpha 1, beta 0)."""
        align = tuple(min(256, p & -p) for p in (w_ptr, x_ptr, d_ptr))
        desc, a, b, d, algo = self.plan(m, n, k, out_type, workspace_size, align, ldd)
        if self.device_scalars:
            alpha, beta = int(alpha_ptr), int(beta_ptr)
        else:
            alpha, beta = self._one.ctypes.data, self._zero.ctypes.data
        self._lt.matmul(
            self.handle, desc, alpha, w_ptr, a, x_ptr, b, beta, d_ptr, d, d_ptr, d,
            algo.ctypes.data, workspace, workspace_size, int(stream),
        )  # fmt: skip

    def close(self) -> None:
        """Destroy the descriptors and the handle (idempotent)."""
        lt = self._lt
        for desc, a, b, d, _ in self._plans.values():
            lt.matmul_desc_destroy(desc)
            for layout in (a, b, d):
                lt.matrix_layout_destroy(layout)
        self._plans.clear()
        if self.handle:
            lt.destroy(self.handle)
            self.handle = 0


class Fp8Matmul(LinearMatmul):
    """cuBLASLt's FP8 GEMM for a row-major linear ``D[M, N] = alpha * X[M, K] @ W[N, K]^T``
    with E4M3 ``X`` and ``W`` and ``alpha = s_x * s_w`` a float32 on the device.

    The rules it follows (NVIDIA, cuBLAS documentation, "cublasLtMatmul()", the FP8 paragraph
    "To use FP8 kernels, the following set of requirements must be satisfied": all matrix
    dimensions meet the Tensor Core requirements -- pointers and leading dimensions 16-byte
    aligned --; "A must be transposed and B non-transposed (The "TN" format)" on compute
    capability 8.9 / 9.0; compute type ``CUBLAS_COMPUTE_32F``; scale type ``CUDA_R_32F``; and
    its type table: E4M3 x E4M3 with ``C`` and ``D`` both bfloat16, both float16 or both
    float32):

    * the TN layouts of :class:`LinearMatmul` (D's ``ldd = N``);
    * **no** ``A_SCALE_POINTER`` / ``B_SCALE_POINTER``: the two scales' product is the
      matmul's ``alpha``, with ``CUBLASLT_MATMUL_DESC_POINTER_MODE`` =
      ``CUBLASLT_POINTER_MODE_DEVICE`` (alpha and beta device float32 scalars, read when the
      matmul runs, so an activation scale computed on the device -- the quantize kernel of
      ``kernels/fp8_gemm.cu`` writes ``alpha = s_x * s_w`` and ``beta = 0`` -- needs no host
      sync and a CUDA graph captures the call). Evidence: on the H200 (cuBLASLt 13.1,
      ``bench/results/h200-2026-12-02-fp8-probe/``) every FP8 matmul with the A/B scale
      pointers set returned ``CUBLAS_STATUS_NOT_SUPPORTED`` from ``cublasLtMatmul``, whether
      they were set before or after the heuristic (which still offered an algorithm), while
      the same matmul with a device alpha ran and matched float64 (``bench/fp8_probe.py``, mode
      ``alpha-device``); a device alpha vector per row
      (``POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO``) was refused too, so per-channel weight
      scales stay an epilogue of the caller's;
    * ``CUBLASLT_MATMUL_DESC_FAST_ACCUM`` = 0 (cuBLASLt's default, stated: the tensor cores'
      FP8 accumulation is promoted to float32 at cuBLASLt's intervals, not only at the end)
      unless ``fast_accum`` (1: no promotion, the whole K in the tensor cores' accumulator,
      which keeps about 14 bits: faster where the GEMM is bound by its math, less exact by up
      to ``~sqrt(K) * 2**-14`` of the output for zero-mean operands; vLLM's CUTLASS FP8
      kernels for Hopper use the fast-accumulation schedules);
    * :class:`LinearMatmul`'s plans and heuristic: the alpha / beta pointers are arguments of
      each ``cublasLtMatmul``, not attributes of the descriptor, so they are not part of the
      plan's key;
    * ``K`` and ``N`` multiples of 16 (:func:`fp8_check`); ``M`` any.

    Raises (from :meth:`run`): ValueError for a rule above broken (:func:`fp8_check`);
    RuntimeError when cuBLASLt offers no algorithm; ``nvmath.bindings.cublasLt.cuBLASLtError``
    from cuBLASLt itself.
    """

    def __init__(self, fast_accum: bool = False) -> None:
        super().__init__(R_8F_E4M3, device_scalars=True, fast_accum=fast_accum)

    def run(
        self, m: int, n: int, k: int, w_ptr: int, x_ptr: int, alpha_ptr: int, beta_ptr: int, d_ptr: int, out_type: int,
        workspace: int, workspace_size: int, stream: int,
    ) -> None:  # fmt: skip
        """Enqueue ``D = alpha * X @ W^T + beta * D`` on ``stream`` (``out_type`` a
        ``cudaDataType_t``: 14 bfloat16, 2 float16, 0 float32; ``alpha_ptr`` / ``beta_ptr``
        device pointers to float32, ``alpha = s_x * s_w`` and ``beta = 0``, read by the GPU when
        the matmul runs; W ``[N, K]``, X ``[M, K]`` E4M3 and D ``[M, N]`` row-major)."""
        fp8_check(m, n, k, out_type, {"W": w_ptr, "X": x_ptr, "D": d_ptr, "alpha": alpha_ptr, "beta": beta_ptr})
        self.matmul(m, n, k, w_ptr, x_ptr, d_ptr, out_type, workspace, workspace_size, stream, alpha_ptr=alpha_ptr, beta_ptr=beta_ptr)


_local = threading.local()


def thread_linear(in_type: int, fast_accum: bool = False) -> LinearMatmul:
    """This thread's :class:`LinearMatmul` for ``in_type`` (an :class:`Fp8Matmul` for E4M3),
    made on first use: one cuBLASLt handle per thread and kind, as plugins need them (a handle
    is not bound to a stream, the stream is an argument of each matmul).

    Raises:
        ValueError: ``in_type`` not in :data:`LINEAR_INPUT_TYPES`.
    """
    cache: dict[tuple[int, bool], LinearMatmul] = _local.__dict__.setdefault("linear", {})
    key = (int(in_type), bool(fast_accum))
    mm = cache.get(key)
    if mm is None:
        mm = cache[key] = Fp8Matmul(fast_accum) if in_type == R_8F_E4M3 else LinearMatmul(in_type, fast_accum=fast_accum)
    return mm


__all__ = [
    "FP8_ACCUMULATION_RTOL",
    "FP8_ALIGN",
    "FP8_FAST_ACCUMULATION_RTOL",
    "FP8_OUTPUT_TYPES",
    "FP8_SCALAR_POINTERS",
    "LINEAR_INPUT_TYPES",
    "POINTER_MODE_DEVICE",
    "Candidate",
    "Fp8Matmul",
    "LinearMatmul",
    "Lt",
    "R_8F_E4M3",
    "fp8_check",
    "signature",
    "thread_linear",
]
