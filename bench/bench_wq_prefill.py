"""Prefill (M > 8) through the weight-only GEMM plugin, W4A16 group 128, on the Llama-3-8B
shapes the engine runs (gate+up fused 28672 x 4096, down 4096 x 14336): the tensor-core
kernel (``trtcore_wq_gemv16``, ``ceil(M / 16)`` slices of 16 rows in its grid: the opt-in
``weight_only_gemm.PREFILL_KERNEL = "tensor_cores"``) against the tiled float32 kernel
(``trtcore_wq_gemm``, the default above 16 rows; timed for 16 < M <= 512) and
cuBLAS bfloat16 (``torch.matmul`` on the dequantized weight), side by side in one run.

Plugin launches are captured in a CUDA graph and timed with events (``bench_gemv._time_graph``,
median of 7 replays); cuBLAS with events around 10 calls (median of 5). The new kernel's
output is checked against float64 NumPy (relative L2 error below 1e-2).

    python bench/bench_wq_prefill.py --out $OUT     # writes wq_prefill.json, prints a table
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gemv import _bf16, _time_graph, _to_f64  # noqa: E402
from bench_wq_gemm import _quantized  # noqa: E402

SHAPES = {"8B gate+up fused": (28672, 4096), "8B down": (4096, 14336)}
MS = (16, 128, 512, 2048)
TILED_MAX_M = 512


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    import cupy as cp
    import torch

    from trtcore.plugins import weight_only_gemm as wog
    from trtcore.plugins.base import DeviceTensor
    from trtcore.plugins.weight_only_gemm import WeightOnlyGemmPlugin

    bf16 = np.dtype(ml_dtypes.bfloat16)
    prefill = wog.PREFILL_KERNEL
    rng = np.random.default_rng(0)
    rows = []
    for name, (n, k) in SHAPES.items():
        qw = _quantized(rng, n, k, 4, 128, False)
        plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
        dev = [cp.asarray(a) for a in packed.arrays()]
        w64 = qw.dequantize()
        wt = torch.from_numpy(w64.astype(np.float32)).to("cuda", torch.bfloat16)
        for m in MS:
            x = _bf16(cp, (m, k), 1.0)
            y = cp.empty((m, n), cp.uint16)
            ins = [DeviceTensor(int(x.data.ptr), (m, k), bf16)] + [DeviceTensor(int(a.data.ptr), a.shape, a.dtype) for a in dev]
            outs = [DeviceTensor(int(y.data.ptr), (m, n), bf16)]

            def launch() -> None:
                plugin.enqueue(ins, outs, 0, int(cp.cuda.get_current_stream().ptr))

            y.fill(0xFFFF)
            wog.PREFILL_KERNEL = "tensor_cores"
            try:
                new_us = _time_graph(cp, [launch] * 3)
            finally:
                wog.PREFILL_KERNEL = prefill
            sub = min(m, 16)
            want = _to_f64(cp, x[-sub:]) @ w64.T
            err = float(np.linalg.norm(_to_f64(cp, y[-sub:]) - want) / np.linalg.norm(want))
            row = {"shape": name, "N": n, "K": k, "M": m, "tensor_cores_us": new_us, "rel_err": err}
            if m <= TILED_MAX_M and m > wog.DECODE_MAX_M:
                wog.PREFILL_KERNEL = "tiled"
                try:
                    row["tiled_us"] = _time_graph(cp, [launch], reps=3)
                finally:
                    wog.PREFILL_KERNEL = prefill
            xt = torch.from_dlpack(x.view(cp.int16)).view(torch.bfloat16)
            times = []
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(10):
                    torch.matmul(xt, wt.T)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 100)  # us per call
            row["cublas_bf16_us"] = statistics.median(times)
            rows.append(row)
            tiled = f"{row['tiled_us']:10.1f}" if "tiled_us" in row else f"{'-':>10s}"
            print(
                f"{name:18s} M={m:5d}: tensor cores {new_us:9.1f} us  tiled {tiled} us  cuBLAS bf16 {row['cublas_bf16_us']:8.1f} us  err {err:.1e}",
                flush=True,
            )
            assert err < 1e-2, row
            del x, y
        del dev, wt
        cp.get_default_memory_pool().free_all_blocks()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "wq_prefill.json").write_text(json.dumps({"rows": rows, "decode_max_m": wog.DECODE_MAX_M}, indent=1))
    print("JSON:", json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
