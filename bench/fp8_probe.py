"""Does cuBLASLt run trtcore's FP8 GEMM on this GPU? One call on the H200 answers it (issue 10).

For each shape (M = 1, 16, 128 rows of x; (N, K) from 64 to 4096) and output type (bfloat16,
float16, float32) it runs ``D[M, N] = s_a * s_b * X[M, K] @ W[N, K]^T`` on random E4M3
operands, in up to three ways, and prints per run ``OK`` with the largest error relative to
``max|D|`` against a float64 NumPy reference of the same E4M3 values, or cuBLASLt's status:

* ``trtcore``: :class:`trtcore.cuda.cublaslt.Fp8Matmul` from this checkout, as the
  ``trtcore_fp8_gemm`` plugin calls it (the decisive row): no A/B scale pointers,
  ``POINTER_MODE_DEVICE``, alpha = a device float32 ``s_a * s_b``, beta = a device 0. The row
  also reads its plan's descriptor back from cuBLASLt (``cublasLtMatmulDescGetAttribute``:
  pointer mode 1, both scale pointers null) and runs a second time with another value at
  the same alpha address (the result must follow: alpha is read when the matmul runs, as a
  dynamic activation scale needs); either failing is ``WRONG-SETUP``;
* ``raw:...``: the descriptors made here with nvmath-python's bindings directly, one
  difference at a time, to tell which rule the failing code broke: ``scales-after`` is what
  the plugin did when every FP8 matmul failed with CUBLAS_STATUS_NOT_SUPPORTED on 2026-12-02
  (A/B scale pointers set after ``cublasLtMatmulAlgoGetHeuristic``, result 0 taken
  unchecked); ``scales-first`` sets them before; ``scales-after+any8`` keeps the old order
  but takes the first of 8 results whose state is success; ``scales-first+modes`` also states
  ``A/B_SCALE_MODE = SCALAR_32F``; ``no-scales`` leaves the pointers null (scales 1);
  ``alpha-device`` passes the scales' product as a device alpha (the recipe trtcore uses
  since); ``alpha-vector`` one device alpha per row of D.

Tolerance, relative to ``max|D|``: the output type's rounding (bfloat16 ``2**-7``, float16
``2**-10``, float32 ``1e-5``) plus ``2**-10`` for the FP8 tensor cores' accumulation, which
is not float32 throughout (the H200 measured ``2**-12.3 .. 2**-11.2`` on float32 outputs;
derivation at ``trtcore.cuda.cublaslt.FP8_ACCUMULATION_RTOL``).

Then, unless ``--no-plugin``, the whole ``trtcore_fp8_gemm`` plugin (quantize kernel + GEMM +
per-channel epilogue) through ``trtcore.testing.check_plugin`` on a few cases.

Needs only numpy, cupy, cuda-python and nvmath-python (and this checkout on ``sys.path``; the
``trtcore`` rows are skipped, saying why, if it does not import). No pytest.

    python3 bench/fp8_probe.py [--out DIR] [--log LEVEL] [--quick] [--no-plugin]

``--log 1`` sets ``CUBLASLT_LOG_LEVEL=1`` before cuBLASLt loads: cuBLASLt prints why it refuses a
call (to stdout; 5 traces every API call). Exit status 0 when every ``trtcore`` and plugin row is OK, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: (N, K) of the weight
SHAPES = [(64, 64), (256, 1024), (1008, 512), (4096, 1024), (4096, 4096)]
ROWS = [1, 16, 128]
#: cudaDataType_t of D: name, bytes
OUT_TYPES = {14: ("bfloat16", 2), 2: ("float16", 2), 0: ("float32", 4)}
R_8F_E4M3, COMPUTE_32F, R_32F = 28, 68, 0
WORKSPACE = 32 << 20
#: max error relative to max|D|: the output's rounding plus the FP8 accumulation (trtcore.cuda.cublaslt.FP8_ACCUMULATION_RTOL)
TOLERANCE = {14: 2.0**-7 + 2.0**-10, 2: 2.0**-10 + 2.0**-10, 0: 1e-5 + 2.0**-10}


def e4m3_table() -> np.ndarray:
    """float64 value of each E4M3 code (OCP OFP8: S.EEEE.MMM, bias 7; S.1111.111 NaN)."""
    b = np.arange(256)
    s, e, m = b >> 7, (b >> 3) & 15, b & 7
    mag = np.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * 2.0 ** (e - 7))
    v = np.where(s == 1, -mag, mag)
    v[(e == 15) & (m == 7)] = np.nan
    return v


TABLE = e4m3_table()
#: codes with |value| <= 2 (no NaN): products stay far from float16's range
SMALL = np.flatnonzero(np.abs(np.nan_to_num(TABLE, nan=9.0)) <= 2.0).astype(np.uint8)


def to_float(cp: Any, d: Any, out_type: int) -> np.ndarray:
    """Device output as float64 (bfloat16 stored as uint16 bits)."""
    h = cp.asnumpy(d)
    if out_type == 14:
        return (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return h.astype(np.float64)


class Raw:
    """The FP8 GEMM through nvmath-python's cuBLASLt bindings with a chosen order of the
    descriptor's set-up (the probe's diagnosis; trtcore's own class is the decisive row)."""

    def __init__(self) -> None:
        from nvmath.bindings import cublasLt

        self.lt = cublasLt
        self.handle = cublasLt.create()
        self.one = np.ones(1, np.float32)
        self.zero = np.zeros(1, np.float32)

    def _set(self, desc: int, attr: Any, value: int) -> None:
        buf = np.array(value, dtype=self.lt.get_matmul_desc_attribute_dtype(attr))
        self.lt.matmul_desc_set_attribute(desc, attr, buf.ctypes.data, buf.nbytes)

    def run(
        self,
        mode: str,
        m: int,
        n: int,
        k: int,
        w: int,
        x: int,
        sa: int,
        sb: int,
        d: int,
        out_type: int,
        ws: int,
        stream: int,
        alpha: tuple[int, int, int] = (0, 0, 0),
    ) -> None:
        """``mode``: ``scales-first`` / ``scales-after`` / ``no-scales``, optionally ``+modes``
        (A/B_SCALE_MODE = SCALAR_32F stated) and ``+any8`` (8 heuristic results, the first whose
        state is success, instead of result 0 unchecked)."""
        lt = self.lt
        D = lt.MatmulDescAttribute
        order, *extra = mode.split("+")
        desc = lt.matmul_desc_create(COMPUTE_32F, R_32F)
        lay = [lt.matrix_layout_create(R_8F_E4M3, k, n, k), lt.matrix_layout_create(R_8F_E4M3, k, m, k), lt.matrix_layout_create(out_type, n, m, n)]
        pref = lt.matmul_preference_create()
        try:
            self._set(desc, D.TRANSA, 1)
            self._set(desc, D.TRANSB, 0)
            if "modes" in extra:
                self._set(desc, D.A_SCALE_MODE, 0)
                self._set(desc, D.B_SCALE_MODE, 0)
            if order == "scales-first":
                self._set(desc, D.A_SCALE_POINTER, sa)
                self._set(desc, D.B_SCALE_POINTER, sb)
            alpha_ptr, beta_ptr = self.one.ctypes.data, self.zero.ctypes.data
            if order == "alpha-device":  # the scales' product as a device alpha (POINTER_MODE_DEVICE), no scale pointers
                self._set(desc, D.POINTER_MODE, 1)
                alpha_ptr, beta_ptr = alpha[0], alpha[1]
            if order == "alpha-vector":  # one device alpha per row of D (POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO)
                self._set(desc, D.POINTER_MODE, 3)
                alpha_ptr, beta_ptr = alpha[2], 0
            P = lt.MatmulPreferenceAttribute
            buf = np.array(WORKSPACE, dtype=lt.get_matmul_preference_attribute_dtype(P.MAX_WORKSPACE_BYTES))
            lt.matmul_preference_set_attribute(pref, P.MAX_WORKSPACE_BYTES, buf.ctypes.data, buf.nbytes)
            limit = 8 if "any8" in extra else 1
            res = lt.MatmulHeuristicResult(limit)
            count = np.zeros(1, np.int32)
            lt.matmul_algo_get_heuristic(self.handle, desc, lay[0], lay[1], lay[2], lay[2], pref, limit, res.ptr, count.ctypes.data)
            states = [int(np.asarray(res[i]["state"]).reshape(-1)[0]) for i in range(int(count[0]))]
            pick = next((i for i, st in enumerate(states) if st == 0), None) if "any8" in extra else (0 if states else None)
            if pick is None:
                raise RuntimeError(f"no usable heuristic result (states {states})")
            algo = np.frombuffer(np.asarray(res[pick]["algo"]).reshape(-1)[0].tobytes(), np.uint8).copy()
            if order == "scales-after":
                self._set(desc, D.A_SCALE_POINTER, sa)
                self._set(desc, D.B_SCALE_POINTER, sb)
            lt.matmul(
                self.handle, desc, alpha_ptr, w, lay[0], x, lay[1], beta_ptr, d, lay[2], d, lay[2],
                algo.ctypes.data, ws, WORKSPACE, stream,
            )  # fmt: skip
            import cupy as cp

            cp.cuda.runtime.streamSynchronize(stream)  # before the descriptors go
        finally:
            lt.matmul_preference_destroy(pref)
            lt.matmul_desc_destroy(desc)
            for layout in lay:
                lt.matrix_layout_destroy(layout)


#: the nvmath-direct variants (``Raw.run`` modes), each isolating one difference
RAW_MODES = [
    "no-scales",
    "scales-after",
    "scales-first",
    "scales-after+any8",
    "scales-first+modes",
    "alpha-device",
    "alpha-device+any8",
    "alpha-vector",
    "alpha-vector+any8",
]


def status_of(exc: BaseException) -> str:
    text = str(exc)
    for word in text.replace("(", " ").replace(")", " ").split():
        if word.startswith("CUBLAS_STATUS_"):
            return word
    return f"{type(exc).__name__}: {text[:160]}"


def trtcore_setup(cp: Any, ours: Any, alpha_dev: Any, d: Any, k: int, ptrs: tuple, ws: Any, stream: Any, ref: np.ndarray) -> dict[str, Any]:
    """What cuBLASLt holds for trtcore's plan (its descriptor read back) and whether alpha is
    read at run time: ``{"pointer_mode", "a_scale", "b_scale", "alpha_followed", "ok"}``."""
    from nvmath.bindings import cublasLt as lt

    D = lt.MatmulDescAttribute
    m, n = d.shape
    w_ptr, x_ptr, _, _, d_ptr, out_type = ptrs
    alpha, beta = int(alpha_dev.data.ptr), int(alpha_dev.data.ptr) + 4
    desc = ours.plan(m, n, k, out_type, WORKSPACE, tuple(min(256, p & -p) for p in (w_ptr, x_ptr, d_ptr)))[0]  # the plan run used

    def get(attr: Any) -> int:
        buf = np.zeros(1, dtype=lt.get_matmul_desc_attribute_dtype(attr))
        written = np.zeros(1, np.uint64)
        lt.matmul_desc_get_attribute(desc, attr, buf.ctypes.data, buf.nbytes, written.ctypes.data)
        return int(buf[0])

    got = {"pointer_mode": get(D.POINTER_MODE), "a_scale": get(D.A_SCALE_POINTER), "b_scale": get(D.B_SCALE_POINTER)}
    # another alpha at the same device address, written on the matmul's stream: the result must scale with it
    err4 = float("inf")
    for times in (4.0, 1.0):  # then back: D as the row checks it
        with stream:
            alpha_dev[0] = np.float32(0.0125 * 0.03125 * times)
        ours.run(m, n, k, w_ptr, x_ptr, alpha, beta, d_ptr, out_type, int(ws.ptr), WORKSPACE, int(stream.ptr))
        stream.synchronize()
        if times != 1.0:
            err4 = float(np.abs(to_float(cp, d, out_type) - times * ref).max()) / (times * float(np.abs(ref).max() or 1.0))
    got["alpha_followed"] = bool(err4 <= TOLERANCE[out_type])
    got["ok"] = got["pointer_mode"] == 1 and got["a_scale"] == 0 and got["b_scale"] == 0 and got["alpha_followed"]
    return got


def probe_gemms(cp: Any, quick: bool) -> list[dict[str, Any]]:
    rng = np.random.default_rng(10)
    stream = cp.cuda.Stream(non_blocking=True)
    dev = cp.cuda.Device()
    ws = cp.cuda.alloc(WORKSPACE)
    scales = cp.asarray(np.array([0.0125, 0.03125], np.float32))
    sa, sb = int(scales.data.ptr), int(scales.data.ptr) + 4
    # the alpha variants: the scales' product as a device scalar (with a device zero beta), and as a vector per row of D
    alpha_dev = cp.asarray(np.array([0.0125 * 0.03125, 0.0], np.float32))
    alpha_vec = cp.full(8192, 0.0125 * 0.03125, np.float32)
    alphas = (int(alpha_dev.data.ptr), int(alpha_dev.data.ptr) + 4, int(alpha_vec.data.ptr))
    raw = Raw()
    try:
        sys.path.insert(0, str(ROOT))
        from trtcore.cuda.cublaslt import Fp8Matmul

        ours: Any = Fp8Matmul()
        why = ""
    except Exception as exc:  # noqa: BLE001 - report, run the raw rows anyway
        ours, why = None, f"trtcore does not import: {exc!r}"
        print(f"!! {why}")
    rows = []
    shapes = SHAPES[:2] if quick else SHAPES
    for n, k in shapes:
        wc = rng.choice(SMALL, (n, k))
        wd = cp.asarray(wc)
        for m in ROWS[:2] if quick else ROWS:
            xc = rng.choice(SMALL, (m, k))
            xd = cp.asarray(xc)
            ref = 0.0125 * 0.03125 * (TABLE[xc] @ TABLE[wc].T)
            scale = float(np.abs(ref).max()) or 1.0
            for out_type, (tname, _) in OUT_TYPES.items():
                d = cp.zeros((m, n), np.uint16 if out_type == 14 else (np.float16 if out_type == 2 else np.float32))
                ptrs = (int(wd.data.ptr), int(xd.data.ptr), sa, sb, int(d.data.ptr), out_type)
                ways = (["trtcore"] if ours is not None else []) + [f"raw:{mode}" for mode in RAW_MODES]
                for way in ways:
                    d.fill(0)  # on the null stream: the device-wide syncs order it with the probe's stream
                    dev.synchronize()
                    row = {"way": way, "m": m, "n": n, "k": k, "out": tname}
                    try:
                        if way == "trtcore":
                            w_ptr, x_ptr, _, _, d_ptr, _ = ptrs
                            ours.run(m, n, k, w_ptr, x_ptr, alphas[0], alphas[1], d_ptr, out_type, int(ws.ptr), WORKSPACE, int(stream.ptr))
                            row["setup"] = trtcore_setup(cp, ours, alpha_dev, d, k, ptrs, ws, stream, ref)
                        else:
                            raw.run(way.split(":", 1)[1], m, n, k, *ptrs, int(ws.ptr), int(stream.ptr), alphas)
                        dev.synchronize()
                        got = to_float(cp, d, out_type)
                        unit = 1.0 if way != "raw:no-scales" else 0.0125 * 0.03125  # null scale pointers: 1
                        err = float(np.abs(got - ref / unit).max()) / (scale / unit)
                        tol = TOLERANCE[out_type]
                        setup_ok = row.get("setup", {}).get("ok", True)
                        row.update(ok=bool(err <= tol and setup_ok), err=err, tol=tol)
                        row["status"] = "OK" if row["ok"] else ("WRONG" if err > tol else f"WRONG-SETUP {row['setup']}")
                    except Exception as exc:  # noqa: BLE001 - the status is the result
                        row.update(ok=False, status=status_of(exc))
                    rows.append(row)
                    err_text = f"max err {row['err']:.2e} (tol {row['tol']:.0e})" if "err" in row else ""
                    print(f"{way:24s} M={m:<4d} N={n:<5d} K={k:<5d} {tname:9s} {row['status']:34s} {err_text}", flush=True)
    if ours is not None:
        ours.close()
    return rows


def probe_plugin(quick: bool) -> list[dict[str, Any]]:
    """The whole plugin (quantize + GEMM + per-channel epilogue) against its float64 reference."""
    import ml_dtypes

    from trtcore import fp8
    from trtcore.plugins.fp8_gemm import Fp8GemmPlugin
    from trtcore.testing import check_plugin, default_tolerance

    rows = []
    cases = [(256, 1024, False, True), (1008, 512, True, False), (4096, 4096, True, True)]
    for n, k, per_channel, static in cases[:2] if quick else cases:
        for dtype in (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)):
            for m in (1, 16, 128):
                rng = np.random.default_rng(m + n)
                w = rng.normal(0, 0.05, (n, k)) * rng.uniform(0.2, 5, (n, 1))
                fw = fp8.quantize_weight(w, "channel" if per_channel else "tensor", 3.0 / 448 if static else None)
                plugin, consts = Fp8GemmPlugin.from_fp8(fw)
                specs = [((m, k), dtype)] + [(a.shape, a.dtype, a) for a in consts]
                row = {"way": "plugin", "m": m, "n": n, "k": k, "out": str(dtype), "per_channel": per_channel, "static": static}
                try:
                    check_plugin(plugin, specs, rtol=default_tolerance(dtype)[0] + 2.0**-10, seed=0)
                    row.update(ok=True, status="OK")
                except Exception as exc:  # noqa: BLE001
                    row.update(ok=False, status=status_of(exc) if "CUBLAS" in str(exc) else f"{type(exc).__name__}: {str(exc)[:300]}")
                rows.append(row)
                print(
                    f"plugin {'channel' if per_channel else 'tensor '} {'static ' if static else 'dynamic'} M={m:<4d} N={n:<5d} K={k:<5d} {dtype!s:9s} {row['status']}",
                    flush=True,
                )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for fp8_probe.json")
    ap.add_argument("--log", type=int, default=0, help="CUBLASLT_LOG_LEVEL (1: errors with their reason, 5: every call)")
    ap.add_argument("--quick", action="store_true", help="two shapes, M = 1 and 16")
    ap.add_argument("--no-plugin", action="store_true", help="skip the whole-plugin rows")
    args = ap.parse_args()
    if args.log:
        os.environ["CUBLASLT_LOG_LEVEL"] = str(args.log)
    import cupy as cp
    from nvmath.bindings import cublasLt

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    info = {
        "device": props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
        "compute_capability": f"{props['major']}.{props['minor']}",
        "cublasLt_version": int(cublasLt.get_version()),
        "cuda_runtime": int(cp.cuda.runtime.runtimeGetVersion()),
    }
    print(json.dumps(info), flush=True)
    t0 = time.perf_counter()
    rows = probe_gemms(cp, args.quick)
    if not args.no_plugin:
        try:
            rows += probe_plugin(args.quick)
        except Exception:  # noqa: BLE001 - the GEMM rows stand alone
            traceback.print_exc()
            rows.append({"way": "plugin", "ok": False, "status": "plugin rows did not run (traceback above)"})
    decisive = [r for r in rows if r["way"] in ("trtcore", "plugin")]
    print("\nsummary (ok / runs):")
    for way in sorted({r["way"] for r in rows}):
        mine = [r for r in rows if r["way"] == way]
        bad = sorted({r["status"] for r in mine if not r["ok"]})
        print(f"  {way:24s} {sum(r['ok'] for r in mine):3d} / {len(mine):3d}  {'; '.join(bad)}")
    print(f"({time.perf_counter() - t0:.1f} s)")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "fp8_probe.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    return 0 if decisive and all(r["ok"] for r in decisive) else 1


if __name__ == "__main__":
    sys.exit(main())
