"""The FP8 GEMM's cuBLASLt calls (:class:`trtcore.cuda.cublaslt.Fp8Matmul`), on the CPU, against
cuBLAS's documented rules (NVIDIA, cuBLAS documentation, "cublasLtMatmul()", FP8: TN format,
``CUBLAS_COMPUTE_32F`` with ``CUDA_R_32F`` scales, E4M3 x E4M3 -> C and D of one type among
bfloat16 / float16 / float32, 16-byte aligned pointers and leading dimensions), with the
scales as a device alpha: the recipe the H200 ran (bench/fp8_probe.py, mode ``alpha-device``;
cuBLASLt 13.1 refused every FP8 matmul with A/B scale pointers, CUBLAS_STATUS_NOT_SUPPORTED).

A stand-in for nvmath-python's ``cublasLt`` bindings records every call and, for
``cublasLtMatmul``, computes what cuBLASLt's column-major definition says
(``D = alpha * s_A * s_B * op(A) op(B) + beta * C``, ``op`` from ``TRANSA``/``TRANSB``, each
matrix ``rows x cols`` with its leading dimension; alpha and beta read from the pointers given,
as float32, and ``POINTER_MODE`` says whose memory that is) on host memory. Checked:

* the descriptor is complete -- TRANSA/TRANSB and ``POINTER_MODE = DEVICE`` set, no A/B scale
  pointer (nor scale mode) ever set -- before ``cublasLtMatmulAlgoGetHeuristic``, and never
  changed after it;
* the matmul gets the caller's alpha / beta pointers themselves (device memory), not host
  copies, so a scale the quantize kernel computes on the device is the one used;
* the layouts mean the row-major linear ``D[M, N] = alpha X[M, K] W[N, K]^T``,
  ``alpha = s_w s_x`` (the emulation against float64 NumPy), for each output type;
* one plan per shape / output type, reused whatever the alpha / beta pointers (they are
  arguments of the call, not of the descriptor);
* shapes and pointers cuBLASLt documents as unsupported are refused with the value named.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import types
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from trtcore.cuda import cublaslt

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
TYPES = {28: np.dtype(np.uint8), 0: np.dtype(np.float32), 2: np.dtype(np.float16), 14: np.dtype(ml_dtypes.bfloat16)}


def _read(ptr: int, dtype: np.dtype, count: int) -> np.ndarray:
    return np.frombuffer((ctypes.c_uint8 * (count * dtype.itemsize)).from_address(ptr), dtype=dtype).copy()


def _matrix(ptr: int, layout: dict, dtype: np.dtype) -> np.ndarray:
    """A column-major ``rows x cols`` matrix with leading dimension ``ld`` at ``ptr``."""
    rows, cols, ld = layout["rows"], layout["cols"], layout["ld"]
    flat = _read(ptr, dtype, ld * (cols - 1) + rows)
    return np.stack([flat[j * ld : j * ld + rows] for j in range(cols)], axis=1)


def _operand(ptr: int, layout: dict) -> np.ndarray:
    """A matmul operand in float64 (E4M3 codes decoded)."""
    raw = _matrix(ptr, layout, TYPES[layout["type"]])
    return (raw.view(E4M3) if layout["type"] == 28 else raw).astype(np.float64)


class FakeLt(types.ModuleType):
    """nvmath.bindings.cublasLt as far as LinearMatmul / Fp8Matmul use it, recording calls."""

    class MatmulDescAttribute:
        POINTER_MODE, TRANSA, TRANSB, A_SCALE_POINTER, B_SCALE_POINTER, FAST_ACCUM, A_SCALE_MODE, B_SCALE_MODE = 2, 3, 4, 17, 18, 25, 31, 32

    class MatmulPreferenceAttribute:
        MAX_WORKSPACE_BYTES, MIN_ALIGNMENT_A_BYTES, MIN_ALIGNMENT_B_BYTES, MIN_ALIGNMENT_C_BYTES, MIN_ALIGNMENT_D_BYTES = 1, 5, 6, 7, 8

    _ATTR = {2: np.int32, 3: np.int32, 4: np.int32, 17: np.intp, 18: np.intp, 25: np.int8, 31: np.int32, 32: np.int32}
    _PREF = {1: np.uint64, 5: np.uint32, 6: np.uint32, 7: np.uint32, 8: np.uint32}

    #: cublasLtMatmulHeuristicResult_t
    RESULT = np.dtype([("algo", "V64"), ("workspace_size", "u8"), ("state", "i4"), ("waves_count", "f4"), ("reserved", "4i4")])

    class MatmulHeuristicResult:
        def __init__(self, n: int = 1):
            self.data = np.zeros(n, dtype=FakeLt.RESULT)
            self.ptr = self.data.ctypes.data

        def __getitem__(self, i: int) -> np.ndarray:
            return self.data[i : i + 1]

    def __init__(self) -> None:
        super().__init__("nvmath.bindings.cublasLt")
        self.calls: list[tuple] = []
        self.descs: dict[int, dict] = {}
        self.layouts: dict[int, dict] = {}
        self.prefs: dict[int, dict] = {}
        self.states = [0]  # the heuristic's results: their state (0 success), algo byte 0 = index
        self._next = 100

    def _id(self) -> int:
        self._next += 1
        return self._next

    def create(self) -> int:
        return 1

    def destroy(self, handle: int) -> None:
        self.calls.append(("destroy",))

    def get_matmul_desc_attribute_dtype(self, attr: int) -> Any:
        return self._ATTR[attr]

    def get_matmul_preference_attribute_dtype(self, attr: int) -> Any:
        return self._PREF[attr]

    def matmul_desc_create(self, compute: int, scale: int) -> int:
        d = self._id()
        self.descs[d] = {"compute": compute, "scale": scale, "attrs": {}}
        self.calls.append(("desc_create", d))
        return d

    def matmul_desc_set_attribute(self, desc: int, attr: int, ptr: int, nbytes: int) -> None:
        dtype = np.dtype(self._ATTR[attr])
        assert nbytes == dtype.itemsize, (attr, nbytes)
        self.descs[desc]["attrs"][attr] = int(_read(ptr, dtype, 1)[0])
        self.calls.append(("desc_set", desc, attr))

    def matmul_desc_destroy(self, desc: int) -> None:
        self.calls.append(("desc_destroy", desc))

    def matrix_layout_create(self, t: int, rows: int, cols: int, ld: int) -> int:
        lay = self._id()
        self.layouts[lay] = {"type": t, "rows": rows, "cols": cols, "ld": ld}
        return lay

    def matrix_layout_destroy(self, lay: int) -> None:
        pass

    def matmul_preference_create(self) -> int:
        pref = self._id()
        self.prefs[pref] = {}
        return pref

    def matmul_preference_set_attribute(self, pref: int, attr: int, ptr: int, nbytes: int) -> None:
        dtype = np.dtype(self._PREF[attr])
        assert nbytes == dtype.itemsize, (attr, nbytes)
        self.prefs[pref][attr] = int(_read(ptr, dtype, 1)[0])

    def matmul_preference_destroy(self, pref: int) -> None:
        pass

    def matmul_algo_get_heuristic(self, handle, desc, a, b, c, d, pref, n, results_ptr, count_ptr) -> None:  # noqa: ANN001
        self.calls.append(("heuristic", desc, dict(self.descs[desc]["attrs"]), (a, b, c, d), dict(self.prefs[pref])))
        got = min(n, len(self.states))
        out = np.frombuffer((ctypes.c_uint8 * (got * self.RESULT.itemsize)).from_address(results_ptr), self.RESULT)
        for i in range(got):
            out[i]["algo"] = bytes([i]) + bytes(63)
            out[i]["state"] = self.states[i]
        ctypes.c_int32.from_address(count_ptr).value = got

    def matmul(self, handle, desc, alpha, a, adesc, b, bdesc, beta, c, cdesc, d, ddesc, algo, ws, wss, stream) -> None:  # noqa: ANN001
        """cuBLASLt's definition, column-major: D = alpha * sA * sB * op(A) @ op(B) + beta * C."""
        self.calls.append(("matmul", desc, (adesc, bdesc, cdesc, ddesc), (c, d), _read(algo, np.dtype(np.uint8), 1)[0], (alpha, beta)))
        spec = self.descs[desc]
        at = spec["attrs"]
        la, lb, lc, ld_ = (self.layouts[x] for x in (adesc, bdesc, cdesc, ddesc))
        A, B = _operand(a, la), _operand(b, lb)
        opA = A.T if at.get(3, 0) == 1 else A
        opB = B.T if at.get(4, 0) == 1 else B
        sa = float(_read(at[17], np.dtype(np.float32), 1)[0]) if at.get(17) else 1.0
        sb = float(_read(at[18], np.dtype(np.float32), 1)[0]) if at.get(18) else 1.0
        al = float(_read(alpha, np.dtype(np.float32), 1)[0])
        be = float(_read(beta, np.dtype(np.float32), 1)[0])
        out = al * sa * sb * (opA @ opB)
        assert out.shape == (ld_["rows"], ld_["cols"]), (out.shape, ld_)
        dt = TYPES[ld_["type"]]
        buf = (ctypes.c_uint8 * ((ld_["ld"] * (ld_["cols"] - 1) + ld_["rows"]) * dt.itemsize)).from_address(d)
        mem = np.frombuffer(buf, dtype=dt)
        if be:  # C is D here (the caller's output, its previous contents)
            out = out + be * _matrix(c, lc, dt).astype(np.float64)
        for j in range(ld_["cols"]):
            mem[j * ld_["ld"] : j * ld_["ld"] + ld_["rows"]] = out[:, j].astype(dt)


@pytest.fixture
def lt(monkeypatch: pytest.MonkeyPatch) -> FakeLt:
    fake = FakeLt()
    nvmath = types.ModuleType("nvmath")
    bindings = types.ModuleType("nvmath.bindings")
    bindings.cublasLt = fake  # type: ignore[attr-defined]
    nvmath.bindings = bindings  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nvmath", nvmath)
    monkeypatch.setitem(sys.modules, "nvmath.bindings", bindings)
    monkeypatch.setitem(sys.modules, "nvmath.bindings.cublasLt", fake)
    return fake


def _aligned(nbytes: int, align: int = 256) -> tuple[np.ndarray, int]:
    """A host buffer and an ``align``-byte aligned address inside it."""
    raw = np.zeros(nbytes + align, np.uint8)
    off = -raw.ctypes.data % align
    return raw, raw.ctypes.data + off


def _store(values: np.ndarray) -> tuple[np.ndarray, int]:
    """``values`` in a fresh 256-byte aligned host buffer (standing in for device memory)."""
    raw, p = _aligned(values.nbytes)
    np.frombuffer((ctypes.c_uint8 * values.nbytes).from_address(p), values.dtype)[:] = values.ravel()
    return raw, p


@pytest.mark.parametrize("out_type", [14, 2, 0], ids=["bfloat16", "float16", "float32"])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 16, 32), (7, 48, 64), (33, 32, 16)])
def test_fp8_matmul_is_the_row_major_linear_with_a_device_alpha(lt: FakeLt, out_type: int, m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(m * 1000 + n + k)
    finite = np.flatnonzero(~np.isnan(np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float32))).astype(np.uint8)
    w, x = rng.choice(finite, (n, k)), rng.choice(finite, (m, k))
    (w_raw, wp), (x_raw, xp) = _store(w), _store(x)
    s_w, s_x = 0.375, 2.0**-7
    scalars_raw, ap = _store(np.array([s_w * s_x, 0.0], np.float32))  # alpha, beta (the quantize kernel's)
    dt = TYPES[out_type]
    d_raw, dp = _aligned(m * n * 4)  # room for a float32 output
    old = rng.normal(0, 1, (m, n)).astype(dt)  # old contents: beta = 0 must drop them
    np.frombuffer((ctypes.c_uint8 * old.nbytes).from_address(dp), dt)[:] = old.ravel()

    def result() -> np.ndarray:
        return np.frombuffer((ctypes.c_uint8 * (m * n * dt.itemsize)).from_address(dp), dt).reshape(m, n).astype(np.float64)

    def want(alpha: float) -> np.ndarray:
        exact = x.view(E4M3).astype(np.float64) @ w.view(E4M3).astype(np.float64).T
        return (float(np.float32(alpha)) * exact).astype(dt).astype(np.float64)

    mm = cublaslt.Fp8Matmul()
    mm.run(m, n, k, wp, xp, ap, ap + 4, dp, out_type, 0, 1 << 20, 0)
    np.testing.assert_array_equal(result(), want(s_w * s_x))

    # the descriptor: TN, device pointer mode, no scale pointer; complete before the heuristic, untouched after it
    heur = [c for c in lt.calls if c[0] == "heuristic"]
    assert len(heur) == 1
    desc, attrs = heur[0][1], heur[0][2]
    assert attrs[3] == 1 and attrs[4] == 0, "FP8 needs the TN form: TRANSA = T, TRANSB = N"
    assert attrs[2] == 1, "alpha and beta are device pointers: CUBLASLT_POINTER_MODE_DEVICE"
    ever = {c[2] for c in lt.calls if c[0] == "desc_set"}
    assert not ever & {17, 18, 31, 32}, "no A/B scale pointer or scale mode (cuBLASLt 13.1 refused them on the H200)"
    assert attrs.get(25, 0) == 0, "FAST_ACCUM off"
    assert heur[0][4] == {1: 1 << 20, 5: 256, 6: 256, 7: 256, 8: 256}, "workspace and the pointers' alignment"
    spec = lt.descs[desc]
    assert (spec["compute"], spec["scale"]) == (68, 0), "CUBLAS_COMPUTE_32F with CUDA_R_32F scales (alpha, beta float32)"
    i = lt.calls.index(heur[0])
    assert not [c for c in lt.calls[i:] if c[0] == "desc_set" and c[1] == desc], "descriptor changed after the heuristic"
    a, b, c, d = heur[0][3]
    assert c == d and lt.layouts[d]["type"] == out_type, "C and D of the output type"
    assert lt.layouts[a]["type"] == lt.layouts[b]["type"] == 28
    assert lt.layouts[a]["ld"] % 16 == 0 and lt.layouts[b]["ld"] % 16 == 0
    [call] = [c for c in lt.calls if c[0] == "matmul"]
    assert call[5] == (ap, ap + 4), "the caller's (device) alpha and beta themselves, not host copies"

    # alpha is read when the matmul runs (a dynamic scale is written on the device before each
    # call): a new value at the same address changes the result, with the same plan
    np.frombuffer((ctypes.c_uint8 * 4).from_address(ap), np.float32)[0] = 0.8125 * 2.0**-9
    mm.run(m, n, k, wp, xp, ap, ap + 4, dp, out_type, 0, 1 << 20, 0)
    np.testing.assert_array_equal(result(), want(0.8125 * 2.0**-9))
    # other alpha / beta pointers: the same plan (they are call arguments, not descriptor attributes)
    other_raw, op = _store(np.array([0.0, 1.5 * 2.0**-10, 0.0], np.float32))
    mm.run(m, n, k, wp, xp, op + 4, op + 8, dp, out_type, 0, 1 << 20, 0)
    np.testing.assert_array_equal(result(), want(1.5 * 2.0**-10))
    assert len([c for c in lt.calls if c[0] == "heuristic"]) == 1
    assert [c[5] for c in lt.calls if c[0] == "matmul"][-1] == (op + 4, op + 8)
    # another output type is another plan
    mm.run(m, n, k, wp, xp, ap, ap + 4, dp, 0 if out_type else 14, 0, 1 << 20, 0)
    assert len([c for c in lt.calls if c[0] == "heuristic"]) == 2
    mm.close()
    assert sum(c[0] == "desc_destroy" for c in lt.calls) == 2
    del w_raw, x_raw, scalars_raw, d_raw, other_raw


def test_fast_accumulation_is_a_descriptor_attribute_and_part_of_the_plan(lt: FakeLt) -> None:
    """``Fp8Matmul(fast_accum=True)`` sets ``CUBLASLT_MATMUL_DESC_FAST_ACCUM`` (25) to 1 before
    the heuristic; the default leaves it 0."""
    for fast in (False, True):
        keep, (wp, xp, sa, sb, dp) = _operands(2, 32, 32)
        lt.calls.clear()
        mm = cublaslt.Fp8Matmul(fast_accum=fast) if fast else cublaslt.Fp8Matmul()
        mm.run(2, 32, 32, wp, xp, sa, sb, dp, 0, 0, 1 << 20, 0)
        [heur] = [c for c in lt.calls if c[0] == "heuristic"]
        assert heur[2].get(25, 0) == int(fast)
        mm.close()
        del keep


def _operands(m: int, n: int, k: int, d_offset: int = 0) -> tuple[list, tuple[int, ...]]:
    """Zero E4M3 operands, alpha 1, beta 0 and a float32 output (``d_offset`` bytes past 256-byte
    alignment): the buffers to keep and the pointers (w, x, alpha, beta, d)."""
    (w, wp), (x, xp), (s, sp), (d, dp) = _aligned(n * k), _aligned(m * k), _aligned(8), _aligned(m * n * 4 + d_offset)
    np.frombuffer((ctypes.c_uint8 * 8).from_address(sp), np.float32)[:] = [1.0, 0.0]
    return [w, x, s, d], (wp, xp, sp, sp + 4, dp + d_offset)


def test_the_first_successful_heuristic_result_runs_for_the_real_alignment(lt: FakeLt) -> None:
    """A heuristic result whose state is not success is skipped (its algo is not valid), and
    the heuristic is told the pointers' real alignment (an algorithm picked for the default,
    256 bytes, may refuse a less aligned operand)."""
    keep, (wp, xp, sa, sb, dp) = _operands(3, 32, 32, d_offset=16)
    lt.states = [15, 0]  # CUBLAS_STATUS_NOT_SUPPORTED, then success
    mm = cublaslt.Fp8Matmul()
    mm.run(3, 32, 32, wp, xp, sa, sb, dp, 0, 0, 1 << 20, 0)
    assert [c[4] for c in lt.calls if c[0] == "matmul"] == [1]
    heur = [c for c in lt.calls if c[0] == "heuristic"]
    assert heur[0][4][7] == heur[0][4][8] == 16 and heur[0][4][5] == heur[0][4][6] == 256
    lt.states = [15]
    with pytest.raises(RuntimeError, match="no FP8 GEMM algorithm for m=3 n=32 k=32 output bfloat16"):
        mm.run(3, 32, 32, wp, xp, sa, sb, dp, 14, 0, 1 << 20, 0)
    mm.close()
    del keep


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((1, 16, 24, 14, {}), "K and N multiples of 16.*K=24"),
        ((1, 20, 32, 14, {}), "K and N multiples of 16.*N=20"),
        ((0, 16, 32, 14, {}), "m, n, k must be >= 1"),
        ((1, 16, 32, 28, {}), "output cudaDataType_t 28"),
        ((1, 16, 32, 14, {"X": 0x1008}), "X pointer 0x1008 must be non-null and 16-byte aligned"),
        ((1, 16, 32, 14, {"alpha": 0}), "alpha pointer 0x0 must be non-null"),
        ((1, 16, 32, 14, {"beta": 0x1002}), "beta pointer 0x1002 must be non-null and 4-byte aligned"),
        ((1, 16, 32, 14, {"W": 0x1004}), "W pointer 0x1004 must be non-null and 16-byte aligned"),
    ],
)
def test_unsupported_fp8_gemms_are_refused_naming_the_value(args: tuple, match: str) -> None:
    m, n, k, out_type, bad = args
    ptrs = {"W": 0x1000, "X": 0x2000, "D": 0x3000, "alpha": 0x4000, "beta": 0x4004, **bad}
    with pytest.raises(ValueError, match=match):
        cublaslt.fp8_check(m, n, k, out_type, ptrs)


@pytest.mark.parametrize("in_type", [14, 2], ids=["bfloat16", "float16"])
def test_linear_matmul_writes_a_column_block_of_a_wider_output(lt: FakeLt, in_type: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """:class:`LinearMatmul` with 16-bit operands (the weight-only GEMM's prefill): D's rows
    ``ldd`` apart, so ``X @ W^T`` lands in columns ``16 .. 16 + N`` of a wider ``[M, 80]``
    output and the other columns keep their contents; alpha 1 and beta 0 from host memory (no
    POINTER_MODE set), no FAST_ACCUM (an FP8 attribute); one plan per ``ldd``; an operand type
    outside LINEAR_INPUT_TYPES is refused at construction."""
    dt = TYPES[in_type]
    rng = np.random.default_rng(in_type)
    m, n, k, ldd, col = 5, 48, 64, 80, 16
    w, x = rng.normal(0, 1, (n, k)).astype(dt), rng.normal(0, 1, (m, k)).astype(dt)
    (w_raw, wp), (x_raw, xp) = _store(w), _store(x)
    old = rng.normal(0, 1, (m, ldd)).astype(dt)
    d_raw, dp = _store(old)
    mm = cublaslt.LinearMatmul(in_type)
    mm.matmul(m, n, k, wp, xp, dp + col * dt.itemsize, in_type, 0, 1 << 20, 0, ldd=ldd)
    got = np.frombuffer((ctypes.c_uint8 * old.nbytes).from_address(dp), dt).reshape(m, ldd)
    want = (x.astype(np.float64) @ w.astype(np.float64).T).astype(dt)
    np.testing.assert_array_equal(got[:, col : col + n], want)
    np.testing.assert_array_equal(np.delete(got, np.s_[col : col + n], axis=1), np.delete(old, np.s_[col : col + n], axis=1))
    [heur] = [c for c in lt.calls if c[0] == "heuristic"]
    assert heur[2] == {3: 1, 4: 0}, "TN only: no POINTER_MODE (alpha / beta on the host), no FAST_ACCUM"
    a, b, _, d = heur[3]
    assert (lt.layouts[a]["type"], lt.layouts[b]["type"], lt.layouts[d]["type"], lt.layouts[d]["ld"]) == (in_type, in_type, in_type, ldd)
    assert heur[4][8] == 32, "D's alignment: 16 columns of 2 bytes past 256"
    wide_raw, wide = _aligned(m * (ldd + 8) * dt.itemsize)  # room for the wider rows (the stand-in writes them)
    mm.matmul(m, n, k, wp, xp, wide, in_type, 0, 1 << 20, 0, ldd=ldd + 8)
    assert len([c for c in lt.calls if c[0] == "heuristic"]) == 2, "another ldd, another plan"
    with pytest.raises(ValueError, match="ldd=40 is below N=48"):
        mm.matmul(m, n, k, wp, xp, dp, in_type, 0, 1 << 20, 0, ldd=40)
    mm.close()
    with pytest.raises(ValueError, match="operand cudaDataType_t 0 is not one of"):
        cublaslt.LinearMatmul(0)
    monkeypatch.setattr(cublaslt, "_local", threading.local())  # handles on the fake stay in this test
    a1, a2 = cublaslt.thread_linear(in_type), cublaslt.thread_linear(in_type)
    assert a1 is a2 and type(a1) is cublaslt.LinearMatmul and a1.in_type == in_type
    assert isinstance(cublaslt.thread_linear(28), cublaslt.Fp8Matmul)
    del w_raw, x_raw, d_raw, wide_raw
