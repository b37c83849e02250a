"""GEMMs through cuBLAS (nvmath-python's low-level bindings): from a matrix-multiply node's
operand layouts to ``cublasGemmEx`` / ``cublasGemmStridedBatchedEx`` calls.

cuBLAS is column-major; trtcore's tensors are row-major. A row-major ``C [M, N] = A @ B``
is the column-major ``C^T = B^T A^T``, so the first cuBLAS operand is ``B`` and the second
``A`` (:func:`plan_gemm` derives each operand's ``op`` and leading dimension from its strides:
a row-major operand and a transposed view are both taken without a copy). Batch dimensions
(broadcast ones with stride 0) become cuBLAS's strided batch where their strides are uniform
and a loop of calls otherwise; a batch dimension over which ``B`` is broadcast and ``A``'s
rows continue is folded into ``M`` (grouped-query attention's ``[B, Hkv, G, S, D] @ [B, Hkv,
1, T, D]^T`` becomes one ``[G*S, D] x [D, T]`` product per KV head).

Compute type is always 32-bit float (``CUBLAS_COMPUTE_32F``: float32 inputs are not rounded
to TF32), operands and output in the node's type; ``cublasGemmEx`` runs
``CUBLAS_GEMM_DEFAULT`` (cuBLAS's heuristic); :mod:`trtcore.cuda.cublaslt` runs a chosen
cuBLASLt algorithm and :mod:`trtcore.cuda.tactics` times the two against the generated GEMV
kernel at build. :func:`emulate` runs a call on
NumPy arrays with cuBLAS's column-major semantics, so the planning is tested on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import dtypes
from ..reference.types import DataType
from .codegen import GEMV_X_MAX_BYTES

#: ``cublasComputeType_t`` CUBLAS_COMPUTE_32F
COMPUTE_32F = 68
#: ``cublasGemmAlgo_t`` CUBLAS_GEMM_DEFAULT
GEMM_DEFAULT = -1
OP_N, OP_T = 0, 1
#: bytes of the fixed cuBLAS workspace in the engine's memory (NVIDIA recommends 32 MiB on Hopper)
WORKSPACE_BYTES = 32 << 20


@dataclass(frozen=True)
class GemmCall:
    """One cuBLAS call in column-major terms: ``C(m x n) = op(X) op(Y)`` ``batch`` times;
    offsets and strides in elements from each operand's base."""

    op_x: int
    op_y: int
    m: int
    n: int
    k: int
    x_off: int
    ldx: int
    stride_x: int
    y_off: int
    ldy: int
    stride_y: int
    c_off: int
    ldc: int
    stride_c: int
    batch: int


def _operand(rows: int, cols: int, s_rows: int, s_cols: int) -> tuple[str, int] | None:
    """A logical ``[rows, cols]`` matrix with these strides as cuBLAS sees it: ``("rm", ld)``
    row-major (unit column stride) or ``("cm", ld)`` column-major, else None."""
    if cols == 1:
        s_cols = 1
    if rows == 1:
        s_rows = max(cols, 1) if s_cols == 1 else s_rows
    if s_cols == 1 and s_rows >= max(cols, 1):
        return "rm", s_rows
    if rows == 1 and s_cols != 1:
        return "cm", max(s_cols, 1)
    if s_rows == 1 and s_cols >= max(rows, 1):
        return "cm", s_cols
    return None


def plan_gemm(
    a_shape: Sequence[int],
    a_strides: Sequence[int],
    b_shape: Sequence[int],
    b_strides: Sequence[int],
    transpose_a: bool,
    transpose_b: bool,
) -> list[GemmCall] | None:
    """cuBLAS calls computing the dense row-major ``C = op(A) @ op(B)`` (batch dims
    broadcast), or None where an operand's strides suit no cuBLAS layout (then the builder
    copies it first)."""
    a_shape, a_st = list(a_shape), list(a_strides)
    b_shape, b_st = list(b_shape), list(b_strides)
    if transpose_a:
        a_shape[-2:], a_st[-2:] = a_shape[-2:][::-1], a_st[-2:][::-1]
    if transpose_b:
        b_shape[-2:], b_st[-2:] = b_shape[-2:][::-1], b_st[-2:][::-1]
    M, K = a_shape[-2:]
    N = b_shape[-1]
    batch = [max(x, y) for x, y in zip(a_shape[:-2], b_shape[:-2])]
    sa = [a_st[i] if a_shape[i] != 1 else 0 for i in range(len(batch))]
    sb = [b_st[i] if b_shape[i] != 1 else 0 for i in range(len(batch))]
    sc = []
    acc = M * N
    for d in reversed(batch):
        sc.append(acc)
        acc *= d
    sc = sc[::-1]
    sam, sak = a_st[-2], a_st[-1]
    sbk, sbn = b_st[-2], b_st[-1]
    # fold trailing batch dims over which B is broadcast into M (A's rows must continue)
    while batch:
        d = batch[-1]
        a_rm = _operand(M, K, sam, sak)
        if d == 1:
            batch.pop(), sa.pop(), sb.pop(), sc.pop()
            continue
        if sb[-1] == 0 and a_rm is not None and a_rm[0] == "rm" and sa[-1] == M * a_rm[1] and sc[-1] == M * N:
            sam = a_rm[1]
            M *= d
            batch.pop(), sa.pop(), sb.pop(), sc.pop()
            continue
        break
    ao = _operand(M, K, sam, sak)
    bo = _operand(K, N, sbk, sbn)
    if ao is None or bo is None:
        return None
    # X = B^T (N x K col-major) ; Y = A^T (K x M col-major)
    op_x, ldx = (OP_N, bo[1]) if bo[0] == "rm" else (OP_T, bo[1])
    op_y, ldy = (OP_N, ao[1]) if ao[0] == "rm" else (OP_T, ao[1])
    # merge batch dims with uniform strides, innermost becomes cuBLAS's batch
    dims = list(zip(batch, sa, sb, sc))
    merged: list[list[int]] = []
    for d, x, y, z in dims:
        if merged and merged[-1][1] == x * d and merged[-1][2] == y * d and merged[-1][3] == z * d:
            merged[-1] = [merged[-1][0] * d, x, y, z]
        else:
            merged.append([d, x, y, z])
    inner = merged.pop() if merged else [1, 0, 0, M * N]
    calls = []
    outer = [m[0] for m in merged]
    for idx in np.ndindex(*outer) if outer else [()]:
        off_a = sum(i * m[1] for i, m in zip(idx, merged))
        off_b = sum(i * m[2] for i, m in zip(idx, merged))
        off_c = sum(i * m[3] for i, m in zip(idx, merged))
        calls.append(GemmCall(op_x, op_y, N, M, K, off_b, ldx, inner[2], off_a, ldy, inner[1], off_c, N, inner[3], inner[0]))
    return calls


def emulate(call: GemmCall, x: np.ndarray, y: np.ndarray, c: np.ndarray) -> None:
    """Run ``call`` on flat NumPy arrays (the B, A and C memories) as cuBLAS would, in float64."""

    def mat(mem: np.ndarray, off: int, ld: int, rows: int, cols: int) -> np.ndarray:
        out = np.empty((rows, cols))
        for j in range(cols):
            out[:, j] = mem[off + j * ld : off + j * ld + rows]
        return out

    for b in range(call.batch):
        rx, cx = (call.m, call.k) if call.op_x == OP_N else (call.k, call.m)
        ry, cy = (call.k, call.n) if call.op_y == OP_N else (call.n, call.k)
        X = mat(x, call.x_off + b * call.stride_x, call.ldx, rx, cx)
        Y = mat(y, call.y_off + b * call.stride_y, call.ldy, ry, cy)
        X = X if call.op_x == OP_N else X.T
        Y = Y if call.op_y == OP_N else Y.T
        C = X @ Y
        base = call.c_off + b * call.stride_c
        for j in range(call.n):
            c[base + j * call.ldc : base + j * call.ldc + call.m] = C[:, j]


class HandleOwner:
    """A holder of a library handle: ``close()`` releases it, and so does garbage collection
    (best effort: at interpreter exit the CUDA context may already be gone)."""

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - the CUDA context may already be gone at exit
            pass


class Cublas(HandleOwner):
    """A cuBLAS handle with a fixed workspace, bound to one stream at a time.

    ``cublasSetStream`` resets the workspace to cuBLAS's default pool, so the workspace is set
    again after every change of stream (both calls are host-side and capture-safe).
    """

    def __init__(self, workspace: int, workspace_size: int):
        from nvmath.bindings import cublas

        self._cublas = cublas
        self.handle = cublas.create()
        self.workspace = int(workspace)
        self.workspace_size = int(workspace_size)
        self._stream: int | None = None
        self._one = np.ones(1, dtype=np.float32)
        self._zero = np.zeros(1, dtype=np.float32)

    def bind(self, stream: int) -> None:
        """Make ``stream`` the handle's stream (and set the workspace again, see the class doc)."""
        if stream != self._stream:
            self._cublas.set_stream(self.handle, int(stream))
            self._cublas.set_workspace(self.handle, self.workspace, self.workspace_size)
            self._stream = stream

    def run(self, call: GemmCall, dtype: DataType, x_ptr: int, y_ptr: int, c_ptr: int, stream: int) -> None:
        """Enqueue ``call`` (pointers are the operands' bases, offsets are added here)."""
        self.bind(stream)
        size = dtype.itemsize
        t = dtypes.lookup(dtype).cuda_data_type
        x, y, c = x_ptr + call.x_off * size, y_ptr + call.y_off * size, c_ptr + call.c_off * size
        one, zero = self._one.ctypes.data, self._zero.ctypes.data
        # cuBLAS's argument order: the op/shape head, then each operand as (pointer, type, leading
        # dimension), the strided form adding each operand's batch stride after it
        head = (self.handle, call.op_x, call.op_y, call.m, call.n, call.k, one)
        xa, ya, ca = (x, t, call.ldx), (y, t, call.ldy), (c, t, call.ldc)
        if call.batch == 1:
            self._cublas.gemm_ex(*head, *xa, *ya, zero, *ca, COMPUTE_32F, GEMM_DEFAULT)
        else:
            self._cublas.gemm_strided_batched_ex(
                *head, *xa, call.stride_x, *ya, call.stride_y, zero, *ca, call.stride_c, call.batch, COMPUTE_32F, GEMM_DEFAULT
            )

    def close(self) -> None:
        """Destroy the cuBLAS handle (idempotent)."""
        if self.handle:
            self._cublas.destroy(self.handle)
            self.handle = 0


def gemv_applies(call: GemmCall, itemsize: int = 2) -> bool:
    """Whether the generated GEMV kernel (:func:`trtcore.cuda.codegen.gemv`) can run ``call``
    on ``itemsize``-byte values: one product of a dense ``[N, K]`` weight (operand X
    transposed, no offset) with at most 4 token rows whose ``M * K`` values fit the kernel's
    shared memory (:data:`trtcore.cuda.codegen.GEMV_X_MAX_BYTES`); ``K``, the row pitches and
    the activation's offset multiples of 8 (16-byte loads; the caller checks the base
    addresses' alignment)."""
    c = call
    return (
        c.batch == 1
        and c.op_x == OP_T
        and c.op_y == OP_N
        and c.n <= 4
        and c.n * c.k * itemsize <= GEMV_X_MAX_BYTES
        and c.k % 8 == 0
        and c.ldx % 8 == 0
        and (c.n == 1 or c.ldy % 8 == 0)
        and c.x_off == 0
        and c.y_off % 8 == 0
    )


#: warps per block of the GEMV kernel (one output feature each): measured best with ``x``
#: staged in shared memory (bench/bench_gemv.py), and a fused prologue runs once per block
GEMV_WARPS = 8


def gemv_launch(
    call: GemmCall, itemsize: int, c_ptr: int, x_ptr: int, y_ptr: int, warps: int = GEMV_WARPS
) -> tuple[tuple[int, int, int], int, int, list[tuple[int, str]]]:
    """``(grid, block, shared memory bytes, args)`` of the GEMV kernel for ``call`` (see
    :func:`gemv_applies`): ``warps`` warps per block, one output feature each, and room for
    the ``M * K`` activations; pointers are the operands' bases, offsets in elements of
    ``itemsize`` bytes are added here."""
    c = call
    args = [
        (c_ptr + c.c_off * itemsize, "ptr"),
        (x_ptr, "ptr"),
        (y_ptr + c.y_off * itemsize, "ptr"),
        (c.n, "i64"),
        (c.m, "i64"),
        (c.k, "i64"),
        (c.ldx, "i64"),
        (c.ldy, "i64"),
        (c.ldc, "i64"),
    ]
    return (max(1, -(-c.m // warps)), 1, 1), 32 * warps, c.n * c.k * itemsize, args


def gemm_bytes(calls: Sequence[GemmCall], dtype: DataType) -> int:
    """Bytes a GEMM must move at least: both operands and the output once."""
    return sum(c.batch * (c.m * c.k + c.k * c.n + c.m * c.n) for c in calls) * dtype.itemsize


__all__ = ["WORKSPACE_BYTES", "Cublas", "HandleOwner", "GemmCall", "emulate", "gemm_bytes", "GEMV_WARPS", "gemv_applies", "gemv_launch", "plan_gemm"]
