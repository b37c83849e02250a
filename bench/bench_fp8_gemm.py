"""cuBLASLt's FP8 GEMM as the ``trtcore_fp8_gemm`` plugin calls it, with and without fast
accumulation, against cuBLAS bfloat16 on the same shapes, in one run.

For each Llama-3-8B decoder linear (``[N, K]``: q/k/v fused 6144 x 4096, o 4096 x 4096,
gate/up fused 28672 x 4096, down 4096 x 14336) and each number of token rows ``M`` (1, 16 and
256 for decode steps, 2048 and 8192 for prefill chunks), ``D[M, N] = alpha * X @ W^T`` runs as:

* ``cublas bf16``: ``cublasGemmEx`` on bfloat16 operands (trtcore's :class:`~trtcore.cuda.gemm.Cublas`);
* ``fp8``: :class:`~trtcore.cuda.cublaslt.Fp8Matmul` (E4M3 x E4M3, bfloat16 output, device
  alpha), cuBLASLt's first heuristic algorithm, ``CUBLASLT_MATMUL_DESC_FAST_ACCUM`` 0 (the
  plugin's default);
* ``fp8 fast``: the same with fast accumulation (``TRTCORE_FP8_FAST_ACCUM=1`` for the plugin).

Each launch reads another copy of the weight (at least 256 MiB of copies, so none is found in
the L2 cache), captured in a CUDA graph and timed with events (median of 7 replays, as
``bench_gemv.py``). Reported: microseconds, TFLOP/s (``2 M N K`` per launch) and each
variant's error on the first 64 rows against float64 NumPy: ``max|D - D64| / max|D64|``
(bfloat16 output rounding is ``2**-9``; the accumulator's error shows above it).

    python bench/bench_fp8_gemm.py --out $OUT      # writes fp8_gemm.json, prints a table
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gemv import _bf16, _time_graph, _to_f64  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
ROWS = (1, 16, 256, 2048, 8192)
CHECK_ROWS = 64
_BF16_OUT = 14  # cudaDataType_t CUDA_R_16BF


def _codes(cp: Any, shape: tuple[int, int]) -> Any:
    """Random E4M3 codes of magnitude below 2 (exponent field <= 7; no NaN pattern), so the
    products stay small and the output is not dominated by a few huge terms."""
    c = cp.random.randint(0, 256, shape, dtype=cp.int32).astype(cp.uint8)
    return (c & 0x80) | (c & 0x3F)  # sign, exponent 0..7, any mantissa


def _e4m3_f64(cp: Any, codes: Any) -> np.ndarray:
    from trtcore.fp8 import from_e4m3

    return from_e4m3(cp.asnumpy(codes))


def time_case(cp: Any, blas: Any, mms: dict[str, Any], n: int, k: int, m: int, lt_ws: Any, lt_ws_size: int) -> dict[str, Any]:
    from trtcore.cuda.gemm import GemmCall
    from trtcore.reference.types import DataType

    copies = max(1, -(-(256 << 20) // (n * k)))
    w8 = [_codes(cp, (n, k)) for _ in range(copies)]
    x8 = _codes(cp, (m, k))
    rows = min(m, CHECK_ROWS)
    want8 = _e4m3_f64(cp, x8[:rows]) @ _e4m3_f64(cp, w8[-1]).T  # the last launch's copy wrote d
    alpha = cp.asarray(np.array([1.0, 0.0], np.float32))
    d = cp.empty((m, n), cp.uint16)
    flops = 2.0 * m * n * k
    out: dict[str, Any] = {"N": n, "K": k, "M": m, "copies": copies}

    def stream() -> int:
        return int(cp.cuda.get_current_stream().ptr)

    def record(label: str, launches: list[Any], want: np.ndarray) -> None:
        d.fill(0xFFFF)  # NaN: a launch that writes nothing fails the check
        us = _time_graph(cp, launches * max(1, 8 // len(launches)))
        got = _to_f64(cp, d[:rows])
        err = float(np.abs(got - want).max() / np.abs(want).max())
        out[label] = {"us": round(us, 3), "TFLOPs": round(flops / us * 1e-6, 1), "max_rel_err": err}
        assert err < 2e-2, (n, k, m, label, err)

    for label, mm in mms.items():
        record(
            label,
            [
                lambda w=w, mm=mm: mm.run(
                    m, n, k, int(w.data.ptr), int(x8.data.ptr), int(alpha.data.ptr), int(alpha.data.ptr) + 4, int(d.data.ptr),
                    _BF16_OUT, int(lt_ws.ptr), lt_ws_size, stream(),
                )  # fmt: skip
                for w in w8
            ],
            want8,
        )
    del w8
    cp.get_default_memory_pool().free_all_blocks()
    copies = max(1, -(-(256 << 20) // (n * k * 2)))
    wb = [_bf16(cp, (n, k), 0.05) for _ in range(copies)]
    xb = _bf16(cp, (m, k), 1.0)
    wantb = _to_f64(cp, xb[:rows]) @ _to_f64(cp, wb[-1]).T
    call = GemmCall(op_x=1, op_y=0, m=n, n=m, k=k, x_off=0, ldx=k, stride_x=0, y_off=0, ldy=k, stride_y=0, c_off=0, ldc=n, stride_c=0, batch=1)
    bf16 = DataType.BF16
    record("cublas bf16", [lambda w=w: blas.run(call, bf16, int(w.data.ptr), int(xb.data.ptr), int(d.data.ptr), stream()) for w in wb], wantb)
    del wb
    cp.get_default_memory_pool().free_all_blocks()
    base = out["cublas bf16"]["us"]
    for label in mms:
        out[label]["speedup_vs_bf16"] = round(base / out[label]["us"], 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    args = ap.parse_args()
    import cupy as cp

    from trtcore.cuda.cublaslt import Fp8Matmul
    from trtcore.cuda.gemm import WORKSPACE_BYTES, Cublas
    from trtcore.plugins.fp8_gemm import LT_WORKSPACE

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workspace = cp.cuda.alloc(WORKSPACE_BYTES)
    blas = Cublas(int(workspace.ptr), WORKSPACE_BYTES)
    lt_ws = cp.cuda.alloc(LT_WORKSPACE)
    mms = {"fp8": Fp8Matmul(), "fp8 fast": Fp8Matmul(fast_accum=True)}
    rows: list[dict[str, Any]] = []
    print(f"{'shape':8s} {'M':>5s}  {'bf16 us':>9s} {'fp8 us':>9s} {'fast us':>9s}  {'fp8/bf16':>8s} {'fast/bf16':>9s}  {'fp8 err':>8s} {'fast err':>8s}")
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        for m in map(int, args.rows.split(",")):
            r = time_case(cp, blas, mms, n, k, m, lt_ws, LT_WORKSPACE)
            r["shape"] = name
            rows.append(r)
            b, f, q = r["cublas bf16"], r["fp8"], r["fp8 fast"]
            print(
                f"{name:8s} {m:5d}  {b['us']:9.2f} {f['us']:9.2f} {q['us']:9.2f}  x{f['speedup_vs_bf16']:7.2f} x{q['speedup_vs_bf16']:8.2f}  "
                f"{f['max_rel_err']:8.1e} {q['max_rel_err']:8.1e}",
                flush=True,
            )
    (out / "fp8_gemm.json").write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
