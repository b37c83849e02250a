"""The generated GEMV kernel's variants against cuBLAS at decode shapes, on the weights' own
stream from DRAM.

For each weight shape ``[N, K]`` of the SmolLM2-135M, Llama-3.2-1B and Llama-3-8B decoder
layers (bfloat16, ``M`` = 1 token row), every variant of :func:`trtcore.cuda.codegen.gemv`
(``prefetch`` / ``unroll``: 16-byte weight loads in flight per lane; warps per block) and
``cublasGemmEx`` run ``y = x W^T``. Each launch reads another copy of the weight, with enough
copies (at least 256 MiB together) that no launch finds its weight in the 50 MB L2 cache,
as in a real decode step where every layer has its own weights; the launches are captured
in a CUDA graph and timed with events (median of 7 replays). Reported: microseconds per
launch and GB/s (weight + activation bytes over time) against the device-to-device copy
bandwidth measured in the same run. Every variant's output is checked against float64
NumPy (relative L2 error below 1e-2: bfloat16 output rounding).

    python bench/bench_gemv.py --out $OUT          # writes gemv.json, prints a table
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

SHAPES = {  # name: (N out features, K)
    "135M qkv": (960, 576),
    "135M o": (576, 576),
    "135M gate_up": (3072, 576),
    "135M down": (576, 1536),
    "1B qkv": (3072, 2048),
    "1B o": (2048, 2048),
    "1B gate_up": (16384, 2048),
    "1B down": (2048, 8192),
    "8B qkv": (6144, 4096),
    "8B o": (4096, 4096),
    "8B gate_up": (28672, 4096),
    "8B down": (4096, 14336),
}
# (prefetch, unroll, max_m, L2::256B, x staged in shared memory)
VARIANTS = [(p, u, m, l2, sx) for p, u in ((4, 4), (2, 2)) for m in (1, 4) for l2 in (False, True) for sx in (False, True)]
#: the defaults of :func:`trtcore.cuda.codegen.gemv` (staged x, 8 warps) are ``p4u4 m1 sx w8`` for one row
WARPS = (2, 4, 8)


def copy_bandwidth(cp: Any) -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read + write), median of 10."""
    n = 1 << 30
    a, b = cp.empty(n, cp.uint8), cp.empty(n, cp.uint8)
    return 2 * n / (_time_graph(cp, [lambda: b.__setitem__(Ellipsis, a)], 10) * 1e-6)


def _time_graph(cp: Any, launches: list[Any], reps: int = 7) -> float:
    """Median microseconds per launch of ``launches`` (captured once in a graph, replayed)."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for fn in launches:
            fn()
        stream.begin_capture()
        for fn in launches:
            fn()
        graph = stream.end_capture()
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for i in range(reps + 2):
            start.record(stream)
            graph.launch(stream)
            stop.record(stream)
            stop.synchronize()
            if i >= 2:
                times.append(cp.cuda.get_elapsed_time(start, stop) * 1e3 / len(launches))
    return statistics.median(times)


def _bf16(cp: Any, shape: tuple[int, ...], scale: float) -> Any:
    x = cp.random.standard_normal(shape, dtype=cp.float32) * scale
    return (x.view(cp.uint32) >> 16).astype(cp.uint16)


def _to_f64(cp: Any, bf16: Any) -> np.ndarray:
    return cp.asnumpy((bf16.astype(cp.uint32) << 16).view(cp.float32)).astype(np.float64)


def time_shape(cp: Any, blas: Any, fns: dict[tuple[int, int, int, bool, bool], Any], n: int, k: int) -> dict[str, Any]:
    """cuBLAS and every GEMV variant (``fns``: :data:`VARIANTS` -> kernel) on ``[n, k]``
    bfloat16 weights and one token row; each checked against float64 NumPy."""
    from trtcore.cuda.gemm import GemmCall, gemv_launch
    from trtcore.reference.types import DataType

    bf16 = DataType.BF16
    copies = max(1, -(-(256 << 20) // (n * k * 2)))
    ws = [_bf16(cp, (n, k), 0.05) for _ in range(copies)]
    x = _bf16(cp, (1, k), 1.0)
    want = _to_f64(cp, ws[0]) @ _to_f64(cp, x)[0]
    call = GemmCall(op_x=1, op_y=0, m=n, n=1, k=k, x_off=0, ldx=k, stride_x=0, y_off=0, ldy=k, stride_y=0, c_off=0, ldc=n, stride_c=0, batch=1)
    ys = [cp.empty((1, n), cp.uint16) for _ in range(copies)]
    nbytes = (n * k + k + n) * 2
    row: dict[str, Any] = {"N": n, "K": k, "copies": copies, "variants": {}}

    def stream() -> int:
        return int(cp.cuda.get_current_stream().ptr)  # the capturing stream of _time_graph

    def record(label: str, launches: list[Any]) -> None:
        ys[0].fill(0xFFFF)  # NaN: a launch that writes nothing fails the check
        us = _time_graph(cp, launches * max(1, 24 // len(launches)))
        err = float(np.linalg.norm(_to_f64(cp, ys[0])[0] - want) / np.linalg.norm(want))
        row["variants"][label] = {"us": round(us, 3), "GBps": round(nbytes / us * 1e-3, 1), "rel_err": err}
        assert err < 1e-2, (n, k, label, err)

    record(
        "cublasGemmEx", [lambda w=w, y=y: blas.run(call, bf16, int(w.data.ptr), int(x.data.ptr), int(y.data.ptr), stream()) for w, y in zip(ws, ys)]
    )
    for (p, u, m, l2, sx), fn in fns.items():
        smem = k * 2 if sx else 0
        for warps in WARPS:
            grid, block, _, _ = gemv_launch(call, 2, 0, 0, 0, warps=warps)
            launches = []
            for w, y in zip(ws, ys):
                a = gemv_launch(call, 2, int(y.data.ptr), int(w.data.ptr), int(x.data.ptr), warps=warps)[3]
                launches.append(lambda a=a, fn=fn, grid=grid, block=block, smem=smem: fn.launch(grid, block, a, shared_mem=smem, stream=stream()))
            record(f"gemv p{p}u{u} m{m}{' l2' if l2 else ''}{' sx' if sx else ''} w{warps}", launches)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    import cupy as cp

    from trtcore.cuda import codegen
    from trtcore.cuda.gemm import WORKSPACE_BYTES, Cublas
    from trtcore.kernels import current_arch
    from trtcore.reference.types import DataType

    bf16 = DataType.BF16
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth(cp)
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    workspace = cp.cuda.alloc(WORKSPACE_BYTES)
    blas = Cublas(int(workspace.ptr), WORKSPACE_BYTES)
    arch = current_arch()
    fns = {}
    regs = {}
    for v in VARIANTS:
        p, u, m, l2, sx = v
        ks = codegen.gemv(bf16, max_m=m, prefetch=p, unroll=u, l2_256b=l2, stage_x=sx)
        fns[v] = codegen.compile_source(ks, arch).function(ks.function)
        regs[ks.function] = fns[v].attribute("NUM_REGS")
    print("registers per thread:", regs, flush=True)
    results: dict[str, Any] = {"copy_bandwidth_Bps": bw, "registers": regs, "shapes": {}}
    for name in args.shapes.split(","):
        row = time_shape(cp, blas, fns, *SHAPES[name])
        best = min(((k, v) for k, v in row["variants"].items() if k != "cublasGemmEx"), key=lambda kv: kv[1]["us"])
        cub = row["variants"]["cublasGemmEx"]
        print(
            f"{name:14s} N={row['N']:6d} K={row['K']:6d}  cublas {cub['us']:8.2f} us {cub['GBps']:7.0f} GB/s   "
            f"best {best[0]:22s} {best[1]['us']:8.2f} us {best[1]['GBps']:7.0f} GB/s",
            flush=True,
        )
        results["shapes"][name] = row
        cp.get_default_memory_pool().free_all_blocks()
    (out / "gemv.json").write_text(json.dumps(results, indent=1))
    labels = list(next(iter(results["shapes"].values()))["variants"])
    print("\nus per launch (" + ", ".join(results["shapes"]) + ")")
    for label in labels:
        print(f"{label:22s} " + " ".join(f"{r['variants'][label]['us']:8.2f}" for r in results["shapes"].values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
