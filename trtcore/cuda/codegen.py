"""Kernel generators: CUDA C++ source for each kernel node of a compiled graph.

Every generator returns a :class:`KernelSource` (the source text, the ``extern "C"``
function name, and the parameter list the runtime fills in). Sources are compiled by NVRTC
through :func:`trtcore.kernels.compile_kernel` (:func:`compile_source`), cached on disk by
their text like trtcore's other kernels.

Numerics: float16/bfloat16 values stay 16-bit in memory (``__half`` / ``__nv_bfloat16``),
FP8 ones 8-bit (``__nv_fp8_e4m3``), are widened to float32 when loaded, and every value is
rounded to its own type where the layer's output type says (round to nearest even), so a fused
kernel computes what the layers compute one by one; reductions, softmax and attention
accumulate in float32. FP8 (E4M3) is a floating type here like the 16-bit ones: a cast from
float32 rounds the value itself to the nearest E4M3 value (ties to even, OCP OFP8 rev. 1.0),
never through an integer, and, as the reference backend's cast (ml_dtypes'
``float8_e4m3fn``) does, a magnitude above 464 (448 plus half an E4M3 ulp at 448), an
infinity or a NaN becomes NaN -- E4M3 has no infinity; saturation to 448 is the quantize
step's clip, not the cast's (:data:`E4M3_HELPERS`).
Integers compute in their own width, booleans as ``bool`` (one byte, as TensorRT stores them).

Parameters: pointers (``ptr``) and 64-bit integers (``i64``: sizes, dimensions, strides in
elements). Input strides are per dimension of the kernel's iteration domain (0 where the
input broadcasts).
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import dtypes as dtype_table
from ..reference.types import (
    FLOATING,
    ActivationType,
    DataType,
    ElementWiseOperation,
    ReduceOperation,
    UnaryOperation,
)
from .ir import Node

#: types whose values a kernel computes as floats: ``FLOATING`` (the types float arithmetic
#: layers take) and FP8, which only casts and Q/DQ reach
FLOAT_VALUES = FLOATING | {DataType.FP8}


def ctype(dtype: DataType) -> str:
    """The CUDA C storage type of ``dtype`` (:mod:`trtcore.dtypes`)."""
    return str(dtype_table.lookup(dtype).cuda)


def compute_type(dtype: DataType) -> str:
    """The CUDA C type values of ``dtype`` are computed in (float for 16-bit floats)."""
    return str(dtype_table.lookup(dtype).cuda_compute)


#: float32 <-> E4M3 of the generated kernels (host and device, so a CPU test can compile it
#: with a C++ compiler and ``cuda_fp8.h`` and compare every code with ml_dtypes):
#: ``e4m3_bits``: cuda_fp8.h's round-to-nearest-even conversion (``cvt.rn.satfinite`` on
#: compute capability 8.9+), with magnitudes above 464 and infinities sent to NaN (0x7f) first,
#: so it equals ml_dtypes' ``float8_e4m3fn`` cast (the reference backend's) on every float32
#: value; ``e4m3_value``: the exact float32 value of a code.
E4M3_HELPERS = r"""
__host__ __device__ __forceinline__ __nv_fp8_storage_t e4m3_bits(float v) {
  return fabsf(v) > 464.0f ? (__nv_fp8_storage_t)0x7fu : __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}
__host__ __device__ __forceinline__ float e4m3_value(__nv_fp8_storage_t b) { __nv_fp8_e4m3 r; r.__x = b; return float(r); }
"""

PREAMBLE = (
    r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
typedef long long i64;
"""
    + E4M3_HELPERS
    + r"""
#include "pdl.cuh"  // PDL_WAIT / PDL_LAUNCH: every generated kernel starts with them (PDL_ENTRY)
__device__ __forceinline__ float ld(const float* p) { return *p; }
__device__ __forceinline__ float ld(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float ld(const __nv_fp8_e4m3* p) { return float(*p); }
__device__ __forceinline__ int ld(const int* p) { return *p; }
__device__ __forceinline__ long long ld(const long long* p) { return *p; }
__device__ __forceinline__ int ld(const signed char* p) { return *p; }
__device__ __forceinline__ int ld(const unsigned char* p) { return *p; }
__device__ __forceinline__ bool ld(const bool* p) { return *p; }
__device__ __forceinline__ void st(float* p, float v) { *p = v; }
__device__ __forceinline__ void st(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void st(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void st(__nv_fp8_e4m3* p, float v) { p->__x = e4m3_bits(v); }
__device__ __forceinline__ void st(int* p, int v) { *p = v; }
__device__ __forceinline__ void st(long long* p, long long v) { *p = v; }
__device__ __forceinline__ void st(signed char* p, int v) { *p = (signed char)v; }
__device__ __forceinline__ void st(unsigned char* p, int v) { *p = (unsigned char)v; }
__device__ __forceinline__ void st(bool* p, bool v) { *p = v; }
__device__ __forceinline__ float rnd_half(float v) { return __half2float(__float2half_rn(v)); }
__device__ __forceinline__ float rnd_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float rnd_e4m3(float v) { return e4m3_value(e4m3_bits(v)); }
__device__ __forceinline__ float op_max(float a, float b) { return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b); }
__device__ __forceinline__ float op_min(float a, float b) { return (a != a || b != b) ? __int_as_float(0x7fc00000) : fminf(a, b); }
template <typename X> __device__ __forceinline__ X op_max(X a, X b) { return a > b ? a : b; }
template <typename X> __device__ __forceinline__ X op_min(X a, X b) { return a < b ? a : b; }
__device__ __forceinline__ float op_floordiv(float a, float b) { return floorf(a / b); }
template <typename X> __device__ __forceinline__ X op_floordiv(X a, X b) { X q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
__device__ __forceinline__ float op_sign(float x) { return x != x ? x : (x > 0.f ? 1.f : (x < 0.f ? -1.f : 0.f)); }
template <typename X> __device__ __forceinline__ X op_sign(X x) { return x > 0 ? 1 : (x < 0 ? -1 : 0); }
__device__ __forceinline__ float op_abs(float x) { return fabsf(x); }
template <typename X> __device__ __forceinline__ X op_abs(X x) { return x < 0 ? -x : x; }
__device__ __forceinline__ float warp_sum(float v) { for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o); return v; }
__device__ __forceinline__ float warp_max(float v) { for (int o = 16; o > 0; o >>= 1) v = op_max(v, __shfl_xor_sync(0xffffffffu, v, o)); return v; }
__device__ __forceinline__ float warp_min(float v) { for (int o = 16; o > 0; o >>= 1) v = op_min(v, __shfl_xor_sync(0xffffffffu, v, o)); return v; }
// block-wide reduction of one float per thread (blockDim.x a multiple of 32, <= 1024)
template <int KIND> __device__ __forceinline__ float block_reduce(float v, float* smem) {
  v = KIND == 0 ? warp_sum(v) : (KIND == 1 ? warp_max(v) : warp_min(v));
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < nw ? smem[lane] : (KIND == 0 ? 0.f : smem[0]);
    w = KIND == 0 ? warp_sum(w) : (KIND == 1 ? warp_max(w) : warp_min(w));
    if (lane == 0) smem[0] = w;
  }
  __syncthreads();
  return smem[0];
}
"""
)


#: the first statements of every generated kernel (see PDL_WAIT in :data:`PREAMBLE`)
PDL_ENTRY = "  PDL_WAIT(); PDL_LAUNCH();"


@dataclass
class KernelSource:
    """A generated kernel: ``source``, ``function`` (its symbol), ``params`` (names, in
    order, each ``("ptr"|"i64", role)``) and ``block`` (threads per block)."""

    source: str
    function: str
    params: list[tuple[str, str]] = field(default_factory=list)
    block: int = 256

    @property
    def key(self) -> str:
        """SHA-256 of the source (the kernel's identity in a plan)."""
        return hashlib.sha256(self.source.encode()).hexdigest()[:32]


def float_literal(x: float) -> str:
    """An exact float32 literal."""
    bits = struct.unpack("<I", struct.pack("<f", np.float32(x)))[0]
    return f"__int_as_float(0x{bits:08x})"


def scalar_literal(arr: np.ndarray, dtype: DataType) -> str:
    """A one-element constant as a literal of its compute type (16-bit floats exactly)."""
    v = np.asarray(arr).reshape(-1)[0]
    if dtype in FLOAT_VALUES:
        return float_literal(float(np.float32(v)))
    if dtype == DataType.BOOL:
        return "true" if bool(v) else "false"
    if dtype == DataType.INT64:
        return f"({int(v)}LL)"
    return f"({int(v)})"


def _rounded(expr: str, dtype: DataType) -> str:
    if dtype == DataType.HALF:
        return f"rnd_half({expr})"
    if dtype == DataType.BF16:
        return f"rnd_bf16({expr})"
    if dtype == DataType.FP8:
        return f"rnd_e4m3({expr})"
    return expr


E, U, A = ElementWiseOperation, UnaryOperation, ActivationType

_EW = {
    E.SUM: "({a} + {b})",
    E.PROD: "({a} * {b})",
    E.MAX: "op_max({a}, {b})",
    E.MIN: "op_min({a}, {b})",
    E.SUB: "({a} - {b})",
    E.DIV: "({a} / {b})",
    E.POW: "powf({a}, {b})",
    E.FLOOR_DIV: "op_floordiv({a}, {b})",
    E.AND: "({a} && {b})",
    E.OR: "({a} || {b})",
    E.XOR: "({a} != {b})",
    E.EQUAL: "({a} == {b})",
    E.GREATER: "({a} > {b})",
    E.LESS: "({a} < {b})",
}
_UN = {
    U.EXP: "expf({x})",
    U.LOG: "logf({x})",
    U.SQRT: "sqrtf({x})",
    U.RECIP: "(1.0f / {x})",
    U.ABS: "op_abs({x})",
    U.NEG: "(-{x})",
    U.SIN: "sinf({x})",
    U.COS: "cosf({x})",
    U.TAN: "tanf({x})",
    U.SINH: "sinhf({x})",
    U.COSH: "coshf({x})",
    U.ASIN: "asinf({x})",
    U.ACOS: "acosf({x})",
    U.ATAN: "atanf({x})",
    U.ASINH: "asinhf({x})",
    U.ACOSH: "acoshf({x})",
    U.ATANH: "atanhf({x})",
    U.CEIL: "ceilf({x})",
    U.FLOOR: "floorf({x})",
    U.ERF: "erff({x})",
    U.NOT: "(!{x})",
    U.SIGN: "op_sign({x})",
    U.ROUND: "rintf({x})",
    U.ISINF: "isinf({x})",
    U.ISNAN: "isnan({x})",
}


def _activation(kind: ActivationType, x: str, alpha: float, beta: float, dtype: DataType) -> str:
    al, be = float_literal(alpha), float_literal(beta)
    if dtype not in FLOAT_VALUES:  # RELU on integers
        return f"op_max({x}, ({compute_type(dtype)})0)"
    return {
        A.RELU: f"op_max({x}, 0.0f)",
        A.SIGMOID: f"(1.0f / (1.0f + expf(-{x})))",
        A.TANH: f"tanhf({x})",
        A.LEAKY_RELU: f"({x} >= 0.0f ? {x} : {al} * {x})",
        A.ELU: f"({x} >= 0.0f ? {x} : {al} * (expf({x}) - 1.0f))",
        A.SELU: f"({be} * ({x} >= 0.0f ? {x} : {al} * (expf({x}) - 1.0f)))",
        A.SOFTSIGN: f"({x} / (1.0f + fabsf({x})))",
        A.SOFTPLUS: f"({al} * log1pf(expf({be} * {x})))",
        A.CLIP: f"op_min(op_max({x}, {al}), {be})",
        A.HARD_SIGMOID: f"op_min(op_max({al} * {x} + {be}, 0.0f), 1.0f)",
        A.SCALED_TANH: f"({al} * tanhf({be} * {x}))",
        A.THRESHOLDED_RELU: f"({x} > {al} ? {x} : 0.0f)",
        A.GELU_ERF: f"(0.5f * {x} * (1.0f + erff({x} * {float_literal(1 / np.sqrt(2.0))})))",
        A.GELU_TANH: f"(0.5f * {x} * (1.0f + tanhf({float_literal(np.sqrt(2 / np.pi))} * ({x} + {float_literal(0.044715)} * {x} * {x} * {x}))))",
    }[kind]


def member_expr(node: Node, args: Sequence[str], in_dtypes: Sequence[DataType], out_dtype: DataType) -> str:
    """The C expression (compute type, rounded to ``out_dtype``) of one pointwise member."""
    op, a = node.op, node.attrs
    if op == "elementwise":
        e = _EW[E(a["op"])].format(a=args[0], b=args[1])
    elif op == "unary":
        e = _UN[U(a["op"])].format(x=args[0])
    elif op == "activation":
        e = _activation(A(a["kind"]), args[0], a["alpha"], a["beta"], in_dtypes[0])
    elif op == "cast":
        src, dst = in_dtypes[0], out_dtype
        if dst == DataType.BOOL:
            e = f"({args[0]} != 0)"
        else:
            e = f"(({compute_type(dst)}){args[0]})"
        if src in FLOAT_VALUES and dst not in FLOAT_VALUES and dst != DataType.BOOL:  # float -> integer: truncate
            e = f"(({compute_type(dst)})(long long)({args[0]}))" if dst != DataType.INT64 else f"((long long)({args[0]}))"
    elif op == "select":
        e = f"({args[0]} ? {args[1]} : {args[2]})"
    elif op == "identity":
        e = f"(({compute_type(out_dtype)}){args[0]})"
    else:  # pragma: no cover - fusion only groups the ops above
        raise ValueError(op)
    return _rounded(e, out_dtype)


class _Body:
    """Builds the statements of one element's computation, memoizing member values."""

    def __init__(self, members: list[Node], dtypes: dict[str, DataType], loads: dict[str, str], scalars: dict[str, str]):
        self.members = {o: m for m in members for o in m.outputs}
        self.dtypes = dtypes
        self.loads = loads
        self.scalars = scalars
        self.lines: list[str] = []
        self.names: dict[str, str] = {}
        self.counter = 0

    def value(self, v: str) -> str:
        if v in self.names:
            return self.names[v]
        if v in self.scalars:
            return self.scalars[v]
        if v in self.loads:
            expr = self.loads[v]
        else:
            m = self.members[v]
            args = [self.value(x) for x in m.inputs if x]
            expr = member_expr(m, args, [self.dtypes[x] for x in m.inputs if x], self.dtypes[v])
        name = f"v{self.counter}"
        self.counter += 1
        self.lines.append(f"    const {compute_type(self.dtypes[v])} {name} = {expr};")
        self.names[v] = name
        return name


def _index_code(rank: int, inputs: Sequence[str], prefix: str = "") -> list[str]:
    """Decompose ``idx`` over the domain ``d0..`` into offsets ``o_<k>`` of each input."""
    lines = [f"    i64 rem = {prefix}idx;"]
    for k in range(len(inputs)):
        lines.append(f"    i64 o{k} = 0;")
    for dim in reversed(range(rank)):
        lines.append(f"    {{ i64 c = rem % d{dim}; rem /= d{dim};")
        for k in range(len(inputs)):
            lines.append(f"      o{k} += c * s{k}_{dim};")
        lines.append("    }")
    return lines


def _i64(sig: list[str], params: list[tuple[str, str]], name: str, role: str) -> None:
    """Append one ``i64`` kernel argument: ``name`` to the C signature, ``role`` (what the
    runtime fills it with) to the launch parameters, the two lists kept in step."""
    sig.append(f"i64 {name}")
    params.append(("i64", role))


def _group_signature(node: Node, dtypes: dict[str, DataType], rank: int, count: str, role: str) -> tuple[list[str], list[tuple[str, str]]]:
    """A group kernel's parameters: outputs, inputs, the element/row count, the domain's
    dimensions, each input's strides over the domain."""
    params: list[tuple[str, str]] = []
    sig: list[str] = []
    for j, o in enumerate(node.outputs):
        sig.append(f"{ctype(dtypes[o])}* __restrict__ out{j}")
        params.append(("ptr", f"out:{o}"))
    for k, v in enumerate(node.inputs):
        sig.append(f"const {ctype(dtypes[v])}* __restrict__ in{k}")
        params.append(("ptr", f"in:{v}"))
    _i64(sig, params, count, role)
    for d in range(rank):
        _i64(sig, params, f"d{d}", f"dim:{d}")
    for k, v in enumerate(node.inputs):
        for d in range(rank):
            _i64(sig, params, f"s{k}_{d}", f"stride:{v}:{d}")
    return sig, params


def _pointwise_members(node: Node, dtypes: dict[str, DataType], store: Any, loads: dict[str, str] | None = None) -> list[str]:
    """The statements of a pointwise group's members at the input offsets ``o<k>`` (``i64``s in
    scope; or each input's expression in ``loads``), then ``store(output, value)`` for each output."""
    if loads is None:
        loads = {v: f"ld(in{k} + o{k})" for k, v in enumerate(node.inputs)}
    scalars = {v: scalar_literal(c, dtypes[v]) for v, c in node.attrs["scalars"].items()}
    body = _Body(node.attrs["members"], dtypes, loads, scalars)
    outs = [body.value(o) for o in node.outputs]
    return body.lines + ["    " + store(o, name) for o, name in zip(node.outputs, outs)]


def _pointwise_body(node: Node, dtypes: dict[str, DataType], rank: int, store: Any, by_row: bool = False) -> list[str]:
    """The statements that compute element ``idx`` (an ``i64`` in scope) of a pointwise
    group: input offsets, the members, ``store(output, value)`` for each output. ``by_row``
    (rank 2): the offsets come from ``r`` and ``j`` in scope (``idx = r * d1 + j``), no division."""
    if by_row:
        index = [f"    const i64 o{k} = r * s{k}_0 + j * s{k}_1;" for k in range(len(node.inputs))]
    else:
        index = _index_code(rank, node.inputs)
    return index + _pointwise_members(node, dtypes, store)


#: elements of the last axis one warp of a pointwise kernel computes per unit (32 lanes x 8):
#: the unit's offsets over the leading axes are found once (64-bit divisions, each some 70
#: instructions), and each lane has its loads of every input in flight together. With one
#: thread per element and a division per axis each, SwiGLU at 256 sequences x 14336 ran
#: some 250 integer instructions an element (counted from the source, not profiled), more
#: than its memory traffic takes; Llama-3-8B's 256 x (128 + 128)
#: throughput on the H200 went from 13,363 to 13,901 output tok/s with units of 4 elements a
#: lane (bench/results/h200-2026-12-03-session8). 8 a lane: a lane's elements are one 16-byte
#: vector of a 2-byte type on the vector path (:data:`POINTWISE_HELPERS`).
POINTWISE_LANE_ELEMENTS = 8
POINTWISE_SPAN = 32 * POINTWISE_LANE_ELEMENTS

#: whether :func:`pointwise_group`'s kernels have the vector path (read at code generation;
#: ``TRTCORE_CUDA_VECTOR=0`` leaves only the element-strided path, for benchmarks that time both)
VECTORIZE: bool = os.environ.get("TRTCORE_CUDA_VECTOR", "1") != "0"

#: the vector path of pointwise kernels: a lane's :data:`POINTWISE_LANE_ELEMENTS` consecutive
#: elements of a tensor as one 8-byte load (1-byte types) or one to four 16-byte loads, where
#: the address is aligned to 8 elements or 16 bytes, the smaller (``vec_ok``). The profiles of the throughput run
#: (bench/results/h200-2026-12-03-session12/call5) had the SwiGLU kernel at about 1 TB/s with
#: one 2-byte load per lane and element (43 us a launch where its bytes need about 10).
POINTWISE_HELPERS = r"""
template <int B> struct Raw8 { uint4 q[B / 16]; };
template <> struct Raw8<8> { uint2 q[1]; };
template <typename T> struct RawOf { typedef Raw8<8 * sizeof(T)> type; };
template <typename T> __device__ __forceinline__ bool vec_ok(const T* p) {
  return reinterpret_cast<unsigned long long>(p) % (8 * sizeof(T) < 16 ? 8 * sizeof(T) : 16) == 0;
}
template <typename T> __device__ __forceinline__ typename RawOf<T>::type ldv(const T* p) {
  return *reinterpret_cast<const typename RawOf<T>::type*>(p);
}
template <typename T> __device__ __forceinline__ void stv(T* p, const typename RawOf<T>::type& r) {
  *reinterpret_cast<typename RawOf<T>::type*>(p) = r;
}
"""


def pointwise_units(domain: Sequence[int]) -> int:
    """Warp units of :func:`pointwise_group`'s kernel over ``domain`` (its shape): one per
    :data:`POINTWISE_SPAN` elements of each row of the last axis (the launch needs 32 threads
    per unit); a rank-0 domain is one element, one unit."""
    if not domain:
        return 1
    rows = math.prod(domain[:-1])
    return int(rows) * -(-int(domain[-1]) // POINTWISE_SPAN)


def _vector_condition(node: Node, rank: int) -> list[str]:
    """The statements that set ``vec`` (uniform over the launch): whether every lane's
    :data:`POINTWISE_LANE_ELEMENTS` elements may be loaded and stored as vectors. So it is when
    the last axis is a multiple of them, every input runs along it with stride 1 (its address
    aligned, its strides over the other axes multiples of the lane's elements, so every row starts
    aligned) or 0 (broadcast: one load a lane), and every (dense) output is aligned."""
    last, n = rank - 1, POINTWISE_LANE_ELEMENTS
    lines = [f"  bool vec = dl % {n} == 0;"]
    for k in range(len(node.inputs)):
        rows = "".join(f" && (d{d} == 1 || s{k}_{d} % {n} == 0)" for d in range(last))
        lines.append(f"  vec = vec && (s{k}_{last} == 0 || (s{k}_{last} == 1 && vec_ok(in{k}){rows}));")
    lines += [f"  vec = vec && vec_ok(out{j});" for j in range(len(node.outputs))]
    return lines


def _vector_elements(node: Node, dtypes: dict[str, DataType], rank: int) -> list[str]:
    """The vector path's statements for the lane's :data:`POINTWISE_LANE_ELEMENTS` elements from
    ``j`` of row ``row`` (``j``, ``idx = row * dl + j`` and the row bases ``b<k>`` in scope): each
    input one vector (or, where broadcast along the last axis, one element), the members per
    element, each output one vector."""
    last, n = rank - 1, POINTWISE_LANE_ELEMENTS
    lines = []
    for k in range(len(node.inputs)):
        lines += [
            f"        decltype(ldv(in{k})) r{k} = {{}};",
            f"        decltype(ld(in{k})) x{k} = 0;",
            f"        if (s{k}_{last}) r{k} = ldv(in{k} + b{k} + j); else x{k} = ld(in{k} + b{k});",
        ]
    lines += [f"        decltype(ldv(out{j})) y{j};" for j in range(len(node.outputs))]
    loads = {v: f"(s{k}_{last} ? ld(reinterpret_cast<const {ctype(dtypes[v])}*>(&r{k}) + e) : x{k})" for k, v in enumerate(node.inputs)}

    def store(o: str, value: str) -> str:
        j = node.outputs.index(o)
        return f"st(reinterpret_cast<{ctype(dtypes[o])}*>(&y{j}) + e, {value});"

    lines += ["        #pragma unroll", f"        for (int e = 0; e < {n}; ++e) {{"]
    lines += ["      " + x for x in _pointwise_members(node, dtypes, store, loads)]
    lines.append("        }")
    lines += [f"        stv(out{j} + idx, y{j});" for j in range(len(node.outputs))]
    return lines


def pointwise_group(node: Node, dtypes: dict[str, DataType], rank: int) -> KernelSource:
    """The domain (rank ``rank``) in units of :data:`POINTWISE_SPAN` elements of one row
    of the last axis, one warp per unit (:func:`pointwise_units`; a grid-stride loop over
    them); inputs strided (broadcast = 0), outputs dense. Rank 0: one thread.

    Two paths, chosen once per launch: the vector path (:func:`_vector_condition`: a lane's
    :data:`POINTWISE_LANE_ELEMENTS` consecutive elements as vectors, :data:`POINTWISE_HELPERS`) and
    the element path (a lane's elements 32 apart, any strides). Both compute each element with
    the same statements, so they give the same bits."""
    sig, params = _group_signature(node, dtypes, rank, "n", "numel")
    lines = [
        PREAMBLE,
        POINTWISE_HELPERS,
        f'extern "C" __global__ void FUNCTION_NAME({", ".join(sig)}) {{',  # named by a hash: equal groups share one kernel
        PDL_ENTRY,
    ]
    if rank == 0:
        lines.append("  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x) {")
        lines += _pointwise_body(node, dtypes, rank, lambda o, v: f"st(out{node.outputs.index(o)} + idx, {v});")
        lines += ["  }", "}"]
        return _named("\n".join(lines), "pointwise", params, 256)
    last = rank - 1
    k_in = range(len(node.inputs))
    lines += [
        f"  const i64 dl = d{last};",
        "  if (n <= 0 || dl <= 0) return;",
        f"  const i64 per_row = (dl + {POINTWISE_SPAN - 1}) / {POINTWISE_SPAN};",
        "  const i64 units = n / dl * per_row;",
        "  const int lane = threadIdx.x & 31;",
    ]
    lines += _vector_condition(node, rank) if VECTORIZE else ["  const bool vec = false;"]
    lines += [
        "  for (i64 w = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < units; w += ((i64)gridDim.x * blockDim.x) >> 5) {",
        "    const i64 row = w / per_row;",
        f"    const i64 u0 = (w - row * per_row) * {POINTWISE_SPAN};",
        "    i64 rem = row;",
    ]
    lines += [f"    i64 b{k} = 0;" for k in k_in]
    for dim in reversed(range(last)):
        lines.append(f"    {{ i64 c = rem % d{dim}; rem /= d{dim};")
        lines += [f"      b{k} += c * s{k}_{dim};" for k in k_in]
        lines.append("    }")
    if VECTORIZE:
        lines += [
            "    if (vec) {",
            f"      const i64 j = u0 + lane * {POINTWISE_LANE_ELEMENTS};",
            "      if (j < dl) {",
            "        const i64 idx = row * dl + j;",
        ]
        lines += _vector_elements(node, dtypes, rank)
        lines += ["      }", "      continue;", "    }"]
    # the element path: every load of the lane first (a store between them would keep the compiler
    # from moving the next element's loads ahead of it: each element a memory round trip)
    n = POINTWISE_LANE_ELEMENTS
    lines += [f"    decltype(ld(in{k})) c{k}[{n}];" for k in k_in]
    lines += ["    #pragma unroll", f"    for (int u = 0; u < {n}; ++u) {{", "      const i64 j = u0 + lane + u * 32;"]
    lines += [f"      c{k}[u] = j < dl ? ld(in{k} + b{k} + j * s{k}_{last}) : 0;" for k in k_in]
    lines += [
        "    }",
        "    #pragma unroll",
        f"    for (int u = 0; u < {n}; ++u) {{",
        "      const i64 j = u0 + lane + u * 32;",
        "      if (j < dl) {",
    ]
    lines.append("        const i64 idx = row * dl + j;")
    cached = {v: f"c{k}[u]" for k, v in enumerate(node.inputs)}
    lines += ["    " + x for x in _pointwise_members(node, dtypes, lambda o, v: f"st(out{node.outputs.index(o)} + idx, {v});", cached)]
    lines += ["      }", "    }", "  }", "}"]
    return _named("\n".join(lines), "pointwise", params, 256)


def _named(text: str, kind: str, params: list[tuple[str, str]], block: int) -> KernelSource:
    fn = f"k_{kind}_" + hashlib.sha1(text.encode()).hexdigest()[:16]
    return KernelSource(text.replace("FUNCTION_NAME", fn), fn, params, block)


#: elements of each input that a row kernel's thread loads into registers before anything
#: else (:func:`_row_body`), and elements per round of the loop over the rest: a row group
#: at decode is one block (the runtime gives it one thread per 4 elements, up to 1024), so its
#: time is the latency of its rounds of dependent loads. A loop over memory with a run-time
#: trip count below its unroll factor runs one iteration at a time, each load waited on in
#: turn, and again for the outputs: 4 + 4 rounds for Llama-3-8B's residual + RMSNorm (5.4 us
#: a launch in a profile without PDL, bench/results/h200-2026-12-03-session6/call2/prof).
#: Cached, all of a thread's loads (the weights' too, an RMSNorm's gamma) are in flight at
#: once and the output loop reads registers. Batch-1 decode did not get measurably faster on
#: the H200 (4.766 ms against 4.761, bench/results/h200-2026-12-03-session8): with PDL the
#: next GEMV's weight prefetch runs under the norm anyway. 8 keeps a row kernel within the
#: 64 registers a 1024-thread block allows.
ROW_CACHED = 8
ROW_UNROLL = 8


def row_cached(n_inputs: int) -> int:
    """Elements of each input a row kernel's thread caches in registers (:func:`_row_body`):
    :data:`ROW_CACHED`, fewer (down to 4) for groups of more than 3 inputs, to stay within the
    64 registers of a 1024-thread block without spilling."""
    return min(ROW_CACHED, max(4, 24 // max(1, n_inputs)))


def row_threads(rows: int, width: int, n_inputs: int) -> int:
    """Threads of a row kernel's block (one block a row; whole warps, for ``block_reduce``):
    enough that every element is one a thread caches (:func:`row_cached`), up to 1024; with
    more rows than the H200's 132 SMs at least 256. Measured on the H200 with Llama-3-8B's
    residual + RMSNorm (bench/bench_generated.py, bench/results/h200-2026-12-04-session16):
    at 256 rows 6.3 us against 11.0 with 256 threads a row (the rule before: half of each
    thread's elements went to the uncached loop, whose output pass loads each element after
    the previous one's stores, a memory round trip each; some 18 us a launch at about 500
    rows in the throughput run of bench/results/h200-2026-12-03-session12/call5); at one row
    3.7 us with 512 threads against 4.5 with 1024 (one per 4 elements, the rule before)."""
    floor = 32 if rows < 132 else 256
    return max(floor, min(1024, -(-width // row_cached(n_inputs) // 32) * 32))


def _row_loop(lines: list[str], n: str, cached: int, cached_loads: dict[str, str], loads: dict[str, str], emit: Any) -> None:
    """Append a loop over the row's elements ``j``: first the ``cached`` register-cached
    ones of this thread (loads ``cached_loads``: ``c<k>[t]``), then the rest from memory
    (``loads``) in rounds of :data:`ROW_UNROLL` predicated iterations, in increasing ``j`` (so
    a thread's float32 sums add in the same order as one plain loop). ``emit(loads)``
    returns the loop body's statements."""
    if cached:
        lines.append("  #pragma unroll")
        lines.append(f"  for (int t = 0; t < {cached}; ++t) {{")
        lines.append("    const i64 j = threadIdx.x + (i64)t * blockDim.x;")
        lines.append(f"    if (j < {n}) {{")
        lines += ["  " + x for x in emit(cached_loads)]
        lines.append("    }")
        lines.append("  }")
    lines.append(f"  for (i64 j0 = threadIdx.x + (i64){cached} * blockDim.x; j0 < {n}; j0 += (i64){ROW_UNROLL} * blockDim.x) {{")
    lines.append("    #pragma unroll")
    lines.append(f"    for (int u = 0; u < {ROW_UNROLL}; ++u) {{")
    lines.append("      const i64 j = j0 + (i64)u * blockDim.x;")
    lines.append(f"      if (j < {n}) {{")
    lines += ["    " + x for x in emit(loads)]
    lines.append("      }")
    lines.append("    }")
    lines.append("  }")


def _row_body(node: Node, dtypes: dict[str, DataType], rank: int, row_outputs: set[str], store: Any, cached: int | None = None) -> list[str]:
    """The statements that compute row ``row`` (an ``i64`` in scope) of a row group with the
    block's threads: each thread first loads its ``cached`` elements of every input
    into registers, loop 1 reduces the reduction's input (float32, ``block_reduce`` over
    ``smem``), loop 2 computes the outputs; ``store(output, index, value)`` is the statement
    that writes one element (index ``row * N + j``, or ``row`` for outputs of row shape
    ``[..., 1]`` in ``row_outputs``, written by thread 0). ``cached`` None: :data:`ROW_CACHED`,
    fewer (down to 4, what decode needs up to 4096 elements) for groups of more than 3 inputs,
    to stay within 64 registers without spilling."""
    if cached is None:
        cached = row_cached(len(node.inputs))
    a = node.attrs
    members: list[Node] = a["members"]
    red = members[a["reduce"]]
    kind = ReduceOperation(red.attrs["op"])
    scalars = {v: scalar_literal(c, dtypes[v]) for v, c in a["scalars"].items()}
    loads = {v: f"ld(in{k} + b{k} + j * s{k}_{rank - 1})" for k, v in enumerate(node.inputs)}
    cache = {v: f"c{k}[t]" for k, v in enumerate(node.inputs)}
    n = f"d{rank - 1}"
    lines = ["  i64 rem = row;"]  # row base offsets of each input over the leading dimensions
    for k in range(len(node.inputs)):
        lines.append(f"  i64 b{k} = 0;")
    for dim in reversed(range(rank - 1)):
        lines.append(f"  {{ i64 c = rem % d{dim}; rem /= d{dim};")
        for k in range(len(node.inputs)):
            lines.append(f"    b{k} += c * s{k}_{dim};")
        lines.append("  }")
    # the register cache: every input's elements j = threadIdx.x + t * blockDim.x
    if cached:
        for k in range(len(node.inputs)):
            lines.append(f"  decltype(ld(in{k})) c{k}[{cached}];")
        lines.append("  #pragma unroll")
        lines.append(f"  for (int t = 0; t < {cached}; ++t) {{")
        lines.append("    const i64 j = threadIdx.x + (i64)t * blockDim.x;")
        for k in range(len(node.inputs)):
            lines.append(f"    c{k}[t] = j < {n} ? {loads[node.inputs[k]]} : 0;")
        lines.append("  }")
    # loop 1: the reduction
    pre = [m for m in members if m is not red]
    init = {
        ReduceOperation.SUM: "0.0f",
        ReduceOperation.AVG: "0.0f",
        ReduceOperation.MAX: "__int_as_float(0xff800000)",
        ReduceOperation.MIN: "__int_as_float(0x7f800000)",
    }[kind]
    comb = {
        ReduceOperation.SUM: "acc += {x};",
        ReduceOperation.AVG: "acc += {x};",
        ReduceOperation.MAX: "acc = op_max(acc, {x});",
        ReduceOperation.MIN: "acc = op_min(acc, {x});",
    }[kind]
    lines.append(f"  float acc = {init};")

    def reduce_step(ld_of: dict[str, str]) -> list[str]:
        body = _Body(pre, dtypes, ld_of, scalars)
        x = body.value(red.inputs[0])
        return [*body.lines, "    " + comb.format(x=x)]

    _row_loop(lines, n, cached, cache, loads, reduce_step)
    kid = {ReduceOperation.SUM: 0, ReduceOperation.AVG: 0, ReduceOperation.MAX: 1, ReduceOperation.MIN: 2}[kind]
    lines.append(f"  acc = block_reduce<{kid}>(acc, smem);")
    if kind == ReduceOperation.AVG:
        lines.append(f"  acc = acc / (float){n};")
    red_val = _rounded("acc", dtypes[red.outputs[0]])
    lines.append(f"  const float red = {red_val};")
    # loop 2: the outputs
    full = [o for o in node.outputs if o not in row_outputs]
    rowo = [o for o in node.outputs if o in row_outputs]

    def output_step(ld_of: dict[str, str]) -> list[str]:
        body = _Body(pre, dtypes, ld_of, {**scalars, red.outputs[0]: "red"})
        names = [body.value(o) for o in full]
        return [*body.lines, *("    " + store(o, f"row * {n} + j", name) for o, name in zip(full, names))]

    _row_loop(lines, n, cached, cache, loads, output_step)
    if rowo:
        lines.append("  if (threadIdx.x == 0) {")
        lines.append("    const i64 j = 0;")
        body3 = _Body(pre, dtypes, loads, {**scalars, red.outputs[0]: "red"})
        names = [body3.value(o) for o in rowo]
        lines += body3.lines
        for o, name in zip(rowo, names):
            lines.append("    " + store(o, "row", name))
        lines.append("  }")
    return lines


def row_group(node: Node, dtypes: dict[str, DataType], rank: int, row_outputs: set[str]) -> KernelSource:
    """One block per row of the domain ``[..., N]`` (see :func:`_row_body`)."""
    sig, params = _group_signature(node, dtypes, rank, "rows", "rows")
    lines = [
        PREAMBLE,
        # named by a hash: equal groups share one kernel; up to 1024 threads at decode (the runtime's rule)
        f'extern "C" __global__ __launch_bounds__(1024) void FUNCTION_NAME({", ".join(sig)}) {{',
        PDL_ENTRY,
        "  __shared__ float smem[32];",
        "  const i64 row = blockIdx.x;",
        "  if (row >= rows) return;",
    ]
    lines += _row_body(node, dtypes, rank, row_outputs, lambda o, i, v: f"st(out{node.outputs.index(o)} + {i}, {v});")
    lines.append("}")
    return _named("\n".join(lines), "row", params, 256)


def _strided_params(names: Sequence[str], rank: int) -> tuple[list[str], list[tuple[str, str]]]:
    sig: list[str] = []
    params: list[tuple[str, str]] = []
    for v in names:
        for d in range(rank):
            _i64(sig, params, f"s_{v}_{d}", f"stride:{v}:{d}")
    return sig, params


def softmax(dtype_in: DataType, dtype_out: DataType, rank: int) -> KernelSource:
    """Softmax over axis ``rank - 1`` of a strided input whose dims were permuted so that
    the softmax axis is last (the runtime passes dims/strides that way); one block per row,
    float32; output dense in the permuted order's inverse (given as output strides)."""
    fn = f"k_softmax_{dtype_in.name}_{dtype_out.name}_r{rank}"
    sig = [f"{ctype(dtype_out)}* __restrict__ out", f"const {ctype(dtype_in)}* __restrict__ x", "i64 rows"]
    params = [("ptr", "out"), ("ptr", "in:0"), ("i64", "rows")]
    for d in range(rank):
        _i64(sig, params, f"d{d}", f"dim:{d}")
    for who in ("x", "o"):
        for d in range(rank):
            _i64(sig, params, f"{who}s{d}", f"stride:{who}:{d}")
    n = f"d{rank - 1}"
    lines = [
        PREAMBLE,
        f'extern "C" __global__ void {fn}({", ".join(sig)}) {{',
        PDL_ENTRY,
        "  __shared__ float smem[32];",
        "  const i64 row = blockIdx.x; if (row >= rows) return;",
        "  i64 rem = row, bx = 0, bo = 0;",
    ]
    for dim in reversed(range(rank - 1)):
        lines.append(f"  {{ i64 c = rem % d{dim}; rem /= d{dim}; bx += c * xs{dim}; bo += c * os{dim}; }}")
    lines += [
        "  float m = __int_as_float(0xff800000);",
        f"  for (i64 j = threadIdx.x; j < {n}; j += blockDim.x) m = op_max(m, ld(x + bx + j * xs{rank - 1}));",
        "  m = block_reduce<1>(m, smem);",
        "  const float shift = isfinite(m) ? m : 0.0f;",
        "  float s = 0.0f;",
        f"  for (i64 j = threadIdx.x; j < {n}; j += blockDim.x) s += expf(ld(x + bx + j * xs{rank - 1}) - shift);",
        "  s = block_reduce<0>(s, smem);",
        f"  for (i64 j = threadIdx.x; j < {n}; j += blockDim.x) st(out + bo + j * os{rank - 1}, expf(ld(x + bx + j * xs{rank - 1}) - shift) / s);",
        "}",
    ]
    return KernelSource("\n".join(lines), fn, params, 256)


def reduce_generic(op: ReduceOperation, dtype: DataType, kept: int, reduced: int) -> KernelSource:
    """Any reduction: one thread per output element over ``kept`` dims, a loop over the
    ``reduced`` dims (float32 accumulation for floats, 64-bit for integers)."""
    fn = f"k_reduce_{op.name}_{dtype.name}_{kept}_{reduced}"
    acc_t = "float" if dtype in FLOAT_VALUES else "long long"
    sig = [f"{ctype(dtype)}* __restrict__ out", f"const {ctype(dtype)}* __restrict__ x", "i64 n", "i64 count"]
    params = [("ptr", "out"), ("ptr", "in:0"), ("i64", "numel"), ("i64", "count")]
    for d in range(kept):
        sig += [f"i64 kd{d}", f"i64 ks{d}"]
        params += [("i64", f"kdim:{d}"), ("i64", f"kstride:{d}")]
    for d in range(reduced):
        sig += [f"i64 rd{d}", f"i64 rs{d}"]
        params += [("i64", f"rdim:{d}"), ("i64", f"rstride:{d}")]
    init = {
        ReduceOperation.SUM: "0",
        ReduceOperation.AVG: "0",
        ReduceOperation.PROD: "1",
        ReduceOperation.MAX: "__int_as_float(0xff800000)" if dtype in FLOAT_VALUES else "(-9223372036854775807LL - 1)",
        ReduceOperation.MIN: "__int_as_float(0x7f800000)" if dtype in FLOAT_VALUES else "9223372036854775807LL",
    }[op]
    comb = {
        ReduceOperation.SUM: "acc += v;",
        ReduceOperation.AVG: "acc += v;",
        ReduceOperation.PROD: "acc *= v;",
        ReduceOperation.MAX: "acc = op_max(acc, v);",
        ReduceOperation.MIN: "acc = op_min(acc, v);",
    }[op]
    lines = [
        PREAMBLE,
        f'extern "C" __global__ void {fn}({", ".join(sig)}) {{',
        PDL_ENTRY,
        "  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x) {",
        "    i64 rem = idx, base = 0;",
    ]
    for d in reversed(range(kept)):
        lines.append(f"    {{ i64 c = rem % kd{d}; rem /= kd{d}; base += c * ks{d}; }}")
    lines += [f"    {acc_t} acc = {init};", "    for (i64 r = 0; r < count; ++r) {", "      i64 rr = r, off = base;"]
    for d in reversed(range(reduced)):
        lines.append(f"      {{ i64 c = rr % rd{d}; rr /= rd{d}; off += c * rs{d}; }}")
    lines += [f"      {acc_t} v = ({acc_t})ld(x + off);", f"      {comb}", "    }"]
    if op == ReduceOperation.AVG:
        lines.append(f"    acc = acc / ({acc_t})count;")
    lines += ["    st(out + idx, acc);", "  }", "}"]
    return KernelSource("\n".join(lines), fn, params, 256)


def gather(dtype: DataType, idx_dtype: DataType, pre: int, idx_rank: int, post: int) -> KernelSource:
    """``take(data, indices, axis)``: output ``[pre..., idx..., post...]`` dense; data strided;
    indices strided; an index outside ``[0, n)`` is clamped (TensorRT leaves it undefined;
    this never reads outside the data)."""
    fn = f"k_gather_{dtype.name}_{idx_dtype.name}_{pre}_{idx_rank}_{post}"
    sig = [
        f"{ctype(dtype)}* __restrict__ out",
        f"const {ctype(dtype)}* __restrict__ x",
        f"const {ctype(idx_dtype)}* __restrict__ ix",
        "i64 n",
        "i64 axis_len",
        "i64 axis_stride",
    ]
    params = [("ptr", "out"), ("ptr", "in:0"), ("ptr", "in:1"), ("i64", "numel"), ("i64", "axis_len"), ("i64", "axis_stride")]
    dims: list[tuple[str, str, str]] = []  # (dim name, stride var, which)
    for d in range(pre):
        dims.append((f"pd{d}", f"ps{d}", "x"))
    for d in range(idx_rank):
        dims.append((f"id{d}", f"is{d}", "i"))
    for d in range(post):
        dims.append((f"qd{d}", f"qs{d}", "x"))
    for dn, sn, _ in dims:
        sig += [f"i64 {dn}", f"i64 {sn}"]
        params += [("i64", f"gdim:{dn}"), ("i64", f"gstride:{sn}")]
    lines = [
        PREAMBLE,
        f'extern "C" __global__ void {fn}({", ".join(sig)}) {{',
        PDL_ENTRY,
        "  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x) {",
        "    i64 rem = idx, xo = 0, io = 0;",
    ]
    for dn, sn, which in reversed(dims):
        target = "xo" if which == "x" else "io"
        lines.append(f"    {{ i64 c = rem % {dn}; rem /= {dn}; {target} += c * {sn}; }}")
    lines += [
        "    long long k = (long long)ix[io];",
        "    if (k < 0) k += axis_len;",
        "    k = k < 0 ? 0 : (k >= axis_len ? axis_len - 1 : k);",
        "    out[idx] = x[xo + k * axis_stride];",
        "  }",
        "}",
    ]
    return KernelSource("\n".join(lines), fn, params, 256)


def concat(dtype: DataType, n_inputs: int, rank: int) -> KernelSource:
    """Concatenation along the dimension ``axis`` (a parameter), the extent of input ``k``
    along it ``len_k``; one thread per output element, each input strided."""
    fn = f"k_concat_{dtype.name}_{n_inputs}_r{rank}"
    sig = [f"{ctype(dtype)}* __restrict__ out"] + [f"const {ctype(dtype)}* __restrict__ x{k}" for k in range(n_inputs)]
    params = [("ptr", "out")] + [("ptr", f"in:{k}") for k in range(n_inputs)]
    _i64(sig, params, "n", "numel")
    _i64(sig, params, "axis", "axis")
    for d in range(rank):
        _i64(sig, params, f"d{d}", f"dim:{d}")
    for k in range(n_inputs):
        _i64(sig, params, f"len{k}", f"len:{k}")
        for d in range(rank):
            _i64(sig, params, f"s{k}_{d}", f"stride:{k}:{d}")
    lines = [
        PREAMBLE,
        f'extern "C" __global__ void {fn}({", ".join(sig)}) {{',
        PDL_ENTRY,
        "  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x) {",
        f"    i64 c[{rank}]; i64 rem = idx;",
    ]
    for d in reversed(range(rank)):
        lines.append(f"    c[{d}] = rem % d{d}; rem /= d{d};")
    lines.append("    i64 a = c[axis];")
    for k in range(n_inputs):
        offs = " + ".join(f"(({d} == axis) ? a : c[{d}]) * s{k}_{d}" for d in range(rank))
        lines.append(f"    if (a < len{k}) {{ out[idx] = x{k}[{offs}]; continue; }}")
        lines.append(f"    a -= len{k};")
    lines += ["  }", "}"]
    return KernelSource("\n".join(lines), fn, params, 256)


def kv_cache_update(dtype: DataType, idx_dtype: DataType) -> KernelSource:
    """``cache[b, h, w[b] + s, d] = update[b, h, s, d]`` in place; update strided, cache dense."""
    fn = f"k_kv_update_{dtype.name}_{idx_dtype.name}"
    sig = [
        f"{ctype(dtype)}* __restrict__ cache",
        f"const {ctype(dtype)}* __restrict__ upd",
        f"const {ctype(idx_dtype)}* __restrict__ w",
        "i64 n",
        "i64 H",
        "i64 S",
        "i64 D",
        "i64 L",
        "i64 u0",
        "i64 u1",
        "i64 u2",
        "i64 u3",
    ]
    params = [
        ("ptr", "out"),
        ("ptr", "in:1"),
        ("ptr", "in:2"),
        ("i64", "numel"),
        ("i64", "H"),
        ("i64", "S"),
        ("i64", "D"),
        ("i64", "L"),
        ("i64", "stride:1:0"),
        ("i64", "stride:1:1"),
        ("i64", "stride:1:2"),
        ("i64", "stride:1:3"),
    ]
    lines = [
        PREAMBLE,
        f'extern "C" __global__ void {fn}({", ".join(sig)}) {{',
        PDL_ENTRY,
        "  for (i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (i64)gridDim.x * blockDim.x) {",
        "    i64 d = idx % D, s = (idx / D) % S, h = (idx / (D * S)) % H, b = idx / (D * S * H);",
        "    i64 slot = (i64)w[b] + s;",
        "    if (slot < 0 || slot >= L) continue;",
        "    cache[((b * H + h) * L + slot) * D + d] = upd[b * u0 + h * u1 + s * u2 + d * u3];",
        "  }",
        "}",
    ]
    return KernelSource("\n".join(lines), fn, params, 256)


def attention(dtype: DataType, mask: DataType | None, has_lengths: bool, softmax_norm: bool) -> KernelSource:
    """``IAttention`` (PADDED_BHND): one block per (query row, head, batch); scores in shared
    memory (``T`` floats, dynamic), float32 softmax, GQA by ``h / (Hq / Hkv)``; q/k/v/mask
    strided (rank 4), output dense. ``causal``: 0 none, 1 upper-left, 2 lower-right."""
    mname = "none" if mask is None else mask.name
    fn = f"k_attention_{dtype.name}_{mname}_{int(has_lengths)}_{int(softmax_norm)}"
    sig = [
        f"{ctype(dtype)}* __restrict__ out",
        f"const {ctype(dtype)}* __restrict__ q",
        f"const {ctype(dtype)}* __restrict__ k",
        f"const {ctype(dtype)}* __restrict__ v",
    ]
    params = [("ptr", "out"), ("ptr", "in:0"), ("ptr", "in:1"), ("ptr", "in:2")]
    if mask is not None:
        sig.append(f"const {ctype(mask)}* __restrict__ mk")
        params.append(("ptr", "in:3"))
    if has_lengths:
        sig.append("const int* __restrict__ kvl")
        params.append(("ptr", "in:6"))
    for name in ("Hq", "Hkv", "S", "T", "D", "causal"):
        _i64(sig, params, name, name)
    for who in ("q", "k", "v") + (("m",) if mask is not None else ()):
        for d in range(4):
            _i64(sig, params, f"{who}s{d}", f"stride:{who}:{d}")
    lines = [
        PREAMBLE,
        f'extern "C" __global__ void {fn}({", ".join(sig)}) {{',
        PDL_ENTRY,
        "  extern __shared__ float sc[];",
        "  __shared__ float smem[32];",
        "  const i64 s = blockIdx.x, h = blockIdx.y, b = blockIdx.z;",
        "  const i64 hk = h / (Hq / Hkv);",
        "  for (i64 j = threadIdx.x; j < T; j += blockDim.x) {",
        "    bool ok = true;",
        "    if (causal == 1) ok = j <= s;",
        "    if (causal == 2) ok = j <= s + (T - S);",
    ]
    if has_lengths:
        lines.append("    if (j >= (i64)kvl[b]) ok = false;")
    lines += [
        "    float acc = 0.0f;",
        "    for (i64 d = 0; d < D; ++d) acc += ld(q + b * qs0 + h * qs1 + s * qs2 + d * qs3) * ld(k + b * ks0 + hk * ks1 + j * ks2 + d * ks3);",
    ]
    if mask is not None:
        if mask == DataType.BOOL:
            lines.append("    if (!mk[b * ms0 + h * ms1 + s * ms2 + j * ms3]) ok = false;")
        else:
            lines.append("    acc += ld(mk + b * ms0 + h * ms1 + s * ms2 + j * ms3);")
    if softmax_norm:
        lines.append("    sc[j] = ok ? acc : __int_as_float(0xff800000);")
    else:
        lines.append("    sc[j] = ok ? acc : 0.0f;")
    lines.append("  }")
    lines.append("  __syncthreads();")
    if softmax_norm:
        lines += [
            "  float m = __int_as_float(0xff800000);",
            "  for (i64 j = threadIdx.x; j < T; j += blockDim.x) m = op_max(m, sc[j]);",
            "  m = block_reduce<1>(m, smem);",
            "  const float shift = isfinite(m) ? m : 0.0f;",
            "  float tot = 0.0f;",
            "  for (i64 j = threadIdx.x; j < T; j += blockDim.x) { float e = expf(sc[j] - shift); sc[j] = e; tot += e; }",
            "  tot = block_reduce<0>(tot, smem);",
            "  const float inv = tot > 0.0f ? 1.0f / tot : 1.0f;",
        ]
    else:
        lines.append("  const float inv = 1.0f;")
    lines += [
        "  __syncthreads();",
        "  for (i64 d = threadIdx.x; d < D; d += blockDim.x) {",
        "    float acc = 0.0f;",
        "    for (i64 j = 0; j < T; ++j) acc += sc[j] * ld(v + b * vs0 + hk * vs1 + j * vs2 + d * vs3);",
        "    st(out + ((b * Hq + h) * S + s) * D + d, acc * inv);",
        "  }",
        "}",
    ]
    return KernelSource("\n".join(lines), fn, params, 128)


# ---------------------------------------------------------------------------------------
# compiling
# ---------------------------------------------------------------------------------------


def source_dir() -> Path:
    """Where generated sources are written for NVRTC (beside trtcore's kernel cache)."""
    from ..kernels import kernel_cache_dir

    path = kernel_cache_dir().parent / "generated"
    path.mkdir(parents=True, exist_ok=True)
    return path


def compile_source(ks: KernelSource, arch: Any = None) -> Any:
    """Compile ``ks`` with NVRTC (disk-cached) for ``arch`` (None: the current GPU);
    returns the :class:`trtcore.kernels.CompiledKernel`.

    Raises:
        trtcore.kernels.NVRTCError: the generated source does not compile (log in the message).
    """
    from ..kernels import compile_kernel

    path = source_dir() / f"gen_{ks.key}.cu"
    if not path.exists() or path.read_text() != ks.source:
        tmp = path.with_suffix(f".{id(ks)}.tmp")
        tmp.write_text(ks.source)
        tmp.replace(path)
    return compile_kernel(path, arch=arch)


#: weight types :func:`gemv` takes
CUDA_GEMV_TYPES = (DataType.FLOAT, DataType.HALF, DataType.BF16)


#: 8 elements of a weight / activation row as 16-byte vectors, and their widening to float32
GEMV_HELPERS = r"""
struct V8 { uint4 a, b; };  // 16-bit types use a only; float uses a and b
__device__ __forceinline__ uint4 ld_stream(const void* p) {  // weights are read once: keep them out of L1
  uint4 r;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && defined(GEMV_L2_256B)
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
#else
  r = __ldg(reinterpret_cast<const uint4*>(p));
#endif
  return r;
}
template <typename T> __device__ __forceinline__ V8 ldw8(const T* p) {
  V8 v; v.a = ld_stream(p); if (sizeof(T) == 4) v.b = ld_stream(p + 4); return v;
}
template <typename T> __device__ __forceinline__ V8 ldx8(const T* p) {
  V8 v; v.a = *reinterpret_cast<const uint4*>(p); if (sizeof(T) == 4) v.b = *reinterpret_cast<const uint4*>(p + 4); return v;
}
template <typename T> __device__ __forceinline__ void stx8(T* p, const V8& v) {  // the 8 elements only
  *reinterpret_cast<uint4*>(p) = v.a; if (sizeof(T) == 4) *reinterpret_cast<uint4*>(p + 4) = v.b;
}
__device__ __forceinline__ void unpack8(const __nv_bfloat16*, const V8& v, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v.a);
  #pragma unroll
  for (int i = 0; i < 4; ++i) { const float2 t = __bfloat1622float2(h[i]); f[2 * i] = t.x; f[2 * i + 1] = t.y; }
}
__device__ __forceinline__ void unpack8(const __half*, const V8& v, float* f) {
  const __half2* h = reinterpret_cast<const __half2*>(&v.a);
  #pragma unroll
  for (int i = 0; i < 4; ++i) { const float2 t = __half22float2(h[i]); f[2 * i] = t.x; f[2 * i + 1] = t.y; }
}
__device__ __forceinline__ void unpack8(const float*, const V8& v, float* f) {
  f[0] = __uint_as_float(v.a.x); f[1] = __uint_as_float(v.a.y); f[2] = __uint_as_float(v.a.z); f[3] = __uint_as_float(v.a.w);
  f[4] = __uint_as_float(v.b.x); f[5] = __uint_as_float(v.b.y); f[6] = __uint_as_float(v.b.z); f[7] = __uint_as_float(v.b.w);
}
"""


def _gemv_core(
    dtype: DataType, max_m: int, x_row: str, prologue: Sequence[str] = (), prefetch: int | None = None, unroll: int | None = None
) -> list[str]:
    """The GEMV loop: one warp per output feature ``feat`` streams the weight row with 16-byte
    loads (``unroll``, default :data:`GEMV_UNROLL`, in flight per lane), reads ``x`` 8 elements at a time with
    16-byte loads, accumulates ``M <= max_m`` rows in float32 and reduces over the warp.
    ``x_row`` is the expression of row ``m``'s base pointer (``const T*``, 16-byte aligned;
    global memory or shared). The first ``prefetch`` (:data:`GEMV_PREFETCH`) weight loads of each lane are
    issued before ``prologue`` (statements every thread of the block runs, e.g. the fused
    producer of ``x``), so the weight stream's DRAM latency overlaps it."""
    t = ctype(dtype)
    P, U = prefetch or GEMV_PREFETCH, unroll or GEMV_UNROLL
    fma = [
        "      float wf[8];",
        f"      unpack8(({t}*)0, {{w}}, wf);",
        f"      #pragma unroll\n      for (int m = 0; m < {max_m}; ++m) {{",
        "        if (m < M) {",
        f"          float xf[8]; unpack8(({t}*)0, ldx8({x_row} + k), xf);",
        "          #pragma unroll\n          for (int j = 0; j < 8; ++j) acc[m] = fmaf(wf[j], xf[j], acc[m]);",
        "        }",
        "      }",
    ]
    lines = [
        "  const int lane = threadIdx.x & 31;",
        "  const i64 feat = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);",
        "  const bool active = feat < N;",
        "  const int kk = (int)K;",
        f"  const {t}* wr = w + (active ? feat : 0) * ldw;",
        f"  V8 pre[{P}];",
        f"  #pragma unroll\n  for (int p = 0; p < {P}; ++p) {{",
        "    const int k = lane * 8 + p * 256;",
        "    if (active && k < kk) pre[p] = ldw8(wr + k);",
        "  }",
        PDL_ENTRY,  # after the weight prefetch: weights are constants, x is the previous kernel's
        *prologue,
        "  if (!active) return;",
        f"  float acc[{max_m}];",
        f"  #pragma unroll\n  for (int m = 0; m < {max_m}; ++m) acc[m] = 0.0f;",
        f"  #pragma unroll\n  for (int p = 0; p < {P}; ++p) {{",
        "    const int k = lane * 8 + p * 256;",
        "    if (k < kk) {",
        *[x.replace("{w}", "pre[p]") for x in fma],
        "    }",
        "  }",
        f"  for (int k0 = lane * 8 + {P * 256}; k0 < kk; k0 += {U * 256}) {{",
        f"    V8 v[{U}];",
        f"    #pragma unroll\n    for (int u = 0; u < {U}; ++u) {{ const int k = k0 + u * 256; if (k < kk) v[u] = ldw8(wr + k); }}",
        f"    #pragma unroll\n    for (int u = 0; u < {U}; ++u) {{",
        "      const int k = k0 + u * 256;",
        "      if (k < kk) {",
        *["  " + x.replace("{w}", "v[u]") for x in fma],
        "      }",
        "    }",
        "  }",
        f"  #pragma unroll\n  for (int m = 0; m < {max_m}; ++m) {{",
        "    if (m < M) { float s = warp_sum(acc[m]); if (lane == 0) st(y + m * ldy + feat, s); }",
        "  }",
    ]
    return lines


#: 16-byte weight loads per lane the GEMV issues before its prologue (``4 * 256`` elements of K)
GEMV_PREFETCH = 4
#: 16-byte weight loads per lane in flight in the GEMV's main loop
GEMV_UNROLL = 4

_GEMV_PARAMS = [("i64", r) for r in ("M", "N", "K", "ldw", "ldx", "ldy")]


def gemv(
    dtype: DataType, max_m: int = 4, prefetch: int | None = None, unroll: int | None = None, l2_256b: bool = False, stage_x: bool = True
) -> KernelSource:
    """``y[m, n] = sum_k x[m, k] * w[n, k]`` for ``M <= max_m`` rows of ``x`` (decode)
    (:func:`_gemv_core`; ``K`` and ``ldx`` multiples of 8, ``w`` and ``x`` 16-byte aligned);
    ``x`` and ``y`` strided by row (``ldx``, ``ldy``). ``prefetch`` / ``unroll``: weight loads
    in flight per lane (defaults :data:`GEMV_PREFETCH`, :data:`GEMV_UNROLL`; other values are
    for ``bench/bench_gemv.py``); ``l2_256b``: weight loads ask L2 for 256-byte sectors;
    ``stage_x`` (default): each block first copies ``x`` into dynamic shared memory (``M * K``
    elements, at most :data:`GEMV_X_MAX_BYTES`: the launch gives that many bytes), which
    ``bench/bench_gemv.py`` measured faster than reading it from L1 in every warp. With
    ``max_m=1`` (one token row, decode at batch 1) the kernel needs fewer registers (50
    against 64 on sm_90) and streams large weights at about 96% of the copy bandwidth (H200, 2026-12-01)."""
    t = ctype(dtype)
    fn = f"k_gemv_{dtype.name}_m{max_m}" + (f"_p{prefetch}u{unroll}" if prefetch or unroll else "") + ("_l2" if l2_256b else "")
    fn += "" if stage_x else "_gx"
    stage = [
        "  extern __shared__ __align__(16) unsigned char xs_bytes[];",
        f"  {t}* xs = reinterpret_cast<{t}*>(xs_bytes);",
        "  for (int r = 0; r < (int)M; ++r)",
        "    for (int c = threadIdx.x * 8; c < (int)K; c += blockDim.x * 8)",
        "      stx8(xs + r * K + c, ldx8(x + r * ldx + c));",
        "  __syncthreads();",
    ]
    lines = [
        "#define GEMV_L2_256B" if l2_256b else "",
        PREAMBLE,
        GEMV_HELPERS,
        f'extern "C" __global__ void {fn}({t}* __restrict__ y, const {t}* __restrict__ w, const {t}* __restrict__ x,',
        "    i64 M, i64 N, i64 K, i64 ldw, i64 ldx, i64 ldy) {",
        *_gemv_core(dtype, max_m, "(xs + m * K)" if stage_x else "(x + m * ldx)", stage if stage_x else (), prefetch=prefetch, unroll=unroll),
        "}",
    ]
    params = [("ptr", "y"), ("ptr", "w"), ("ptr", "x")] + _GEMV_PARAMS
    return KernelSource("\n".join(lines), fn, params, 256)


#: most bytes of ``x`` (``M * K`` elements of its type) a GEMV kernel (staged, or with a
#: fused prologue) keeps in shared memory: the default per-block limit, which leaves room for
#: several blocks per SM; larger inputs run on cuBLAS
GEMV_X_MAX_BYTES = 48 * 1024

#: most producer elements all blocks of a fused GEMV prologue compute together (blocks x M x K):
#: on the H200 the fusion won at up to 2.2e5 (SmolLM2-135M: 3.9 -> 3.3 us and one launch fewer
#: per GEMM), broke even at 7.9e5 (Llama-3.2-1B q/k/v) and lost 2x at 2.1e6 and more (1B gate/up,
#: down, LM head), so larger GEMMs keep the producer's own kernel
PROLOGUE_MAX_WORK = 1 << 19


def gemv_prologue(producer: Node, dtypes: dict[str, DataType], rank: int, a: str, row_outputs: set[str], max_m: int = 4) -> KernelSource:
    """The GEMV of :func:`gemv` with the kernel that produces its ``x`` (= ``a``, an output
    of the row group or pointwise group ``producer`` whose only reader is the GEMM) fused in
    front: every block computes the producer's whole ``[M, K]`` domain (at most
    :data:`GEMV_X_MAX_BYTES`, in dynamic shared memory in ``a``'s type, rounded exactly as
    the unfused kernel stores it), block 0 also writes the producer's other
    outputs, then the GEMV reads ``x`` from shared memory. Saves one launch per fused GEMM
    at decode (the norm before q/k/v and gate/up, the SwiGLU product before down)."""
    wt = dtypes[a]
    sig, params = _group_signature(
        producer, dtypes, rank, "rows" if producer.op == "row_group" else "n", "rows" if producer.op == "row_group" else "numel"
    )
    sig += [f"{ctype(wt)}* __restrict__ y", f"const {ctype(wt)}* __restrict__ w"] + [f"i64 {r}" for r in ("M", "N", "K", "ldw", "ldx", "ldy")]
    params += [("ptr", "y"), ("ptr", "w")] + _GEMV_PARAMS

    def keep(o: str, index: str, v: str) -> str:
        if o == a:
            return f"st(xs + {index}, {v});"
        return f"if (blockIdx.x == 0) st(out{producer.outputs.index(o)} + {index}, {v});"

    lines = [
        PREAMBLE,
        GEMV_HELPERS,
        f'extern "C" __global__ void FUNCTION_NAME({", ".join(sig)}) {{',
        "  extern __shared__ __align__(16) unsigned char xs_bytes[];",
        f"  {ctype(wt)}* xs = reinterpret_cast<{ctype(wt)}*>(xs_bytes);",
        "  __shared__ float smem[32];",
    ]
    if producer.op == "row_group":
        # no register cache: it would raise the GEMV's registers (56 -> 72 for 4 elements) and
        # cost it occupancy; the loops' predicated rounds still keep ROW_UNROLL loads in flight
        rows_body = _row_body(producer, dtypes, rank, row_outputs, keep, cached=0)
        prologue = ["  for (i64 row = 0; row < rows; ++row) {", *rows_body, "  __syncthreads();", "  }"]
    else:
        assert rank == 2, rank
        prologue = ["  for (i64 r = 0; r < d0; ++r) for (i64 j = threadIdx.x; j < d1; j += blockDim.x) {", "    const i64 idx = r * d1 + j;"]
        prologue += _pointwise_body(producer, dtypes, rank, lambda o, v: keep(o, "idx", v), by_row=True)
        prologue += ["  }"]
    lines += _gemv_core(wt, max_m, "(xs + m * K)", [*prologue, "  __syncthreads();"])
    lines.append("}")
    return _named("\n".join(lines), "gemv_prologue", params, 256)
