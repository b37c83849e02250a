"""Prefill (M > 16) through the weight-only GEMM plugin, W4A16 group 128, on the Llama-3-8B
shapes the engine runs (gate+up fused 28672 x 4096, down 4096 x 14336): the plugin's prefill
kernels (``weight_only_gemm.PREFILL_KERNEL``) side by side in one run --

* ``cublas`` (the default): from ``CUBLAS_MIN_M`` rows the weight dequantized block by block
  into the workspace (``trtcore_wq_dequantize``), cuBLASLt's bfloat16 GEMM on each block (below
  it the 16-row kernel); also with smaller blocks (``DEQUANT_BLOCK_BYTES`` 32 / 64 MiB; the
  default holds each of these weights whole);
* ``tensor_cores``: ``trtcore_wq_gemv16``, ``ceil(M / 16)`` slices of 16 rows;
* ``tiled``: ``trtcore_wq_gemm``, float32 FMAs (timed for 16 < M <= 512);

against cuBLAS bfloat16 on the dequantized weight (``torch.matmul``, the bfloat16 engine's
GEMM). M = 16 runs the decode path's 16-row kernel (every setting the same) for the crossover.

Plugin launches are captured in a CUDA graph and timed with events (``bench_gemv._time_graph``,
median of 7 replays); cuBLAS with events around 10 calls (median of 5). Each setting's output is
checked against float64 NumPy on the last 16 rows (relative L2 error below 1e-2).

    python bench/bench_wq_prefill.py --out $OUT     # writes wq_prefill.json, prints a table
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gemv import _bf16, _time_graph, _to_f64  # noqa: E402
from bench_wq_gemm import _quantized  # noqa: E402

SHAPES = {"8B gate+up fused": (28672, 4096), "8B down": (4096, 14336)}
MS = (16, 24, 32, 48, 64, 128, 512, 2048)
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
    saved = (wog.PREFILL_KERNEL, wog.DEQUANT_BLOCK_BYTES)
    settings = {
        "cublas": ("cublas", 0),  # the defaults: DEQUANT_BLOCK_BYTES, below CUBLAS_MIN_M rows the 16-row kernel
        "cublas 32MiB": ("cublas", 32 << 20),
        "cublas 64MiB": ("cublas", 64 << 20),
        "tensor_cores": ("tensor_cores", 0),
        "tiled": ("tiled", 0),
    }
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
            sub = min(m, 16)
            want = _to_f64(cp, x[-sub:]) @ w64.T
            row: dict = {"shape": name, "N": n, "K": k, "M": m}
            for label, (kernel, block) in settings.items():
                if (kernel == "tiled" and not wog.DECODE_MAX_M < m <= TILED_MAX_M) or (m <= wog.DECODE_MAX_M and label != "cublas"):
                    continue
                wog.PREFILL_KERNEL, wog.DEQUANT_BLOCK_BYTES = kernel, block or saved[1]
                try:
                    size = plugin.workspace_size([((m, k), bf16)], [((m, n), bf16)])
                    ws = cp.empty(max(size, 1), cp.uint8)

                    def launch(ws_ptr: int = int(ws.data.ptr) if size else 0, call: Any = plugin.enqueue, io: tuple = (ins, outs)) -> None:
                        call(*io, ws_ptr, int(cp.cuda.get_current_stream().ptr))  # the stream being captured

                    y.fill(0xFFFF)
                    row[f"{label}_us"] = _time_graph(cp, [launch] * (1 if kernel == "tiled" else 3), reps=3 if kernel == "tiled" else 7)
                    err = float(np.linalg.norm(_to_f64(cp, y[-sub:]) - want) / np.linalg.norm(want))
                    row[f"{label}_rel_err"] = err
                    assert err < 1e-2, (label, row)
                    if label == "cublas":
                        row["workspace_bytes"] = size
                    del ws
                finally:
                    wog.PREFILL_KERNEL, wog.DEQUANT_BLOCK_BYTES = saved
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
            cells = "  ".join(f"{label} {row[f'{label}_us']:8.1f}" for label in settings if f"{label}_us" in row)
            print(f"{name:18s} M={m:5d}: {cells}  | cuBLAS bf16 {row['cublas_bf16_us']:7.1f} us", flush=True)
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
