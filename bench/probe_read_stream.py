"""The floor under the 4-bit decode GEMV: how fast can any kernel read its weight bytes?

Issue 10 asks the W4A16 kernel at M = 1 to be 3.2x faster than cuBLAS bfloat16 on 14336 x 4096
and 4096 x 14336 (H200: 10.17 / 9.93 us against cuBLAS's 32.54 / 31.78). Those weights are
29.4 MB of codes plus 0.9 MB of scales. This probe times kernels that do nothing but read
that many bytes, the way bench/bench_wq_gemm.py times the GEMV (each launch reads another copy,
the copies together over 240 MB so none is in the 60 MB L2; launches captured in one CUDA graph,
median of 7 replays), so its best time is the floor any GEMV on those bytes can reach here:

* ``tiles``: the decode GEMV's access pattern without its arithmetic. Block ``b`` reads tile
  ``b`` (``--tile-bytes``, 32 KiB: 16 rows of K = 4096 at 4 bits); its warps take units of
  ``SEG`` x 512 bytes (32 lanes x 16 bytes, ``ld.global.nc.L1::no_allocate``) round robin and keep
  ``U`` units in flight in registers, refilling a unit's registers once they are consumed (the
  register path of kernels/wq_gemm.cu, ``UNROLL`` = ``U``).
* ``flat``: the classic bandwidth kernel. A grid of ``blocks_per_sm`` x SMs blocks of 512
  threads; thread ``t`` reads 16-byte vectors ``t, t + T, ...`` (``T`` threads in all), ``U`` in
  flight.
* ``cupy copy``: CuPy copying the same bytes to another buffer (it also writes them).

Every kernel folds what it read into one word (XOR) and stores it only if it equals a value no
input makes, so no load is dead; the fold is checked against NumPy's for one launch.

    python bench/probe_read_stream.py --out $OUT        # probe_read_stream.json, a table
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gemv import _time_graph  # noqa: E402

#: bytes read per launch: (label, bytes). The issue's two shapes at 4 bits with g128 scales (the
#: codes and the float32 scales, as the plugin stores them), the fused gate+up, o_proj
SIZES = {
    "14336x4096 w4 g128": 14336 * 4096 // 2 + 14336 * 32 * 4,
    "28672x4096 w4 g128": 28672 * 4096 // 2 + 28672 * 32 * 4,
    "4096x4096 w4 g128": 4096 * 4096 // 2 + 4096 * 32 * 4,
}
#: the copies together exceed this (4 x the 60 MB L2), as bench_wq_gemm's ROTATE_BYTES
ROTATE_BYTES = 4 * 60 << 20

SOURCE = r"""
#ifndef U
#define U 1
#endif
#ifndef SEG
#define SEG 1
#endif
__device__ __forceinline__ uint4 ld_nc(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}
__device__ __forceinline__ unsigned int fold(const uint4& v) { return v.x ^ v.y ^ v.z ^ v.w; }

// block b reads tile b (tile_vecs 16-byte vectors; units of SEG x 32 vectors, warps round robin,
// U units in flight per warp in registers, each refilled once consumed)
extern "C" __global__ void tiles(const uint4* __restrict__ w, unsigned int* out, long long tile_vecs, long long total_vecs) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const uint4* t = w + (long long)blockIdx.x * tile_vecs + lane;
    const long long units = min(tile_vecs, total_vecs - (long long)blockIdx.x * tile_vecs) / (SEG * 32);
    uint4 buf[U][SEG];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const long long c = warp + (long long)u * warps;
#pragma unroll
        for (int s = 0; s < SEG; ++s) buf[u][s] = c < units ? ld_nc(t + (c * SEG + s) * 32) : make_uint4(0, 0, 0, 0);
    }
    unsigned int acc = 0;
    long long next = warp + (long long)U * warps;
    for (long long base = warp; base < units; base += (long long)U * warps) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (base + (long long)u * warps >= units) break;
#pragma unroll
            for (int s = 0; s < SEG; ++s) acc ^= fold(buf[u][s]);
            if (next < units) {
#pragma unroll
                for (int s = 0; s < SEG; ++s) buf[u][s] = ld_nc(t + (next * SEG + s) * 32);
            }
            next += warps;
        }
    }
    if (acc == 0x9E3779B9u) out[0] = acc;  // never taken for the test data; keeps every load
    out[1 + blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

// thread i of T reads vectors i, i + T, ..., U in flight
extern "C" __global__ void flat(const uint4* __restrict__ w, unsigned int* out, long long tile_vecs, long long total_vecs) {
    const long long T = (long long)gridDim.x * blockDim.x, i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int acc = 0;
    for (long long i = i0; i < total_vecs; i += U * T) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = i + u * T < total_vecs ? ld_nc(w + i + u * T) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < U; ++u) acc ^= fold(v[u]);
    }
    if (acc == 0x9E3779B9u) out[0] = acc;
    out[1 + i0] = acc;
}
"""


def _fold(words: np.ndarray) -> int:
    """XOR of all 32-bit words (what the kernels' per-thread folds XOR together to)."""
    return int(np.bitwise_xor.reduce(words))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    ap.add_argument("--tile-bytes", type=int, default=32 * 1024)
    args = ap.parse_args()
    import cupy as cp

    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    dev_name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    results: dict[str, Any] = {"device": dev_name, "sms": sms, "tile_bytes": args.tile_bytes, "sizes": {}}
    kernels: dict[tuple[str, int, int], Any] = {}

    def kernel(name: str, u: int, seg: int) -> Any:
        if (name, u, seg) not in kernels:
            kernels[name, u, seg] = cp.RawKernel(SOURCE, name, options=(f"-DU={u}", f"-DSEG={seg}"))
        return kernels[name, u, seg]

    for label in args.sizes.split(","):
        nbytes = SIZES[label] // 1024 * 1024  # whole units of both SEG
        vecs = nbytes // 16
        copies = max(1, -(-ROTATE_BYTES // nbytes))
        rng = np.random.default_rng(0)
        host = rng.integers(0, 1 << 32, nbytes // 4, dtype=np.uint32)
        want = _fold(host)
        bufs = [cp.asarray(host) for _ in range(copies)]
        dsts = [cp.empty_like(bufs[0]) for _ in range(copies)]
        tile_vecs = args.tile_bytes // 16
        rows: dict[str, Any] = {}
        cases: list[tuple[str, str, tuple[int, int, int], int, int]] = []
        for warps in (1, 2, 4, 8, 16):
            for u in (1, 2, 4, 8):
                for seg in (1, 2):
                    if u * seg > 8:
                        continue
                    cases.append((f"tiles w{warps} u{u} s{seg}", "tiles", (-(-vecs // tile_vecs), 32 * warps, 0), u, seg))
        for bps in (1, 2, 4, 8):
            for u in (1, 2, 4, 8):
                cases.append((f"flat {bps}x{sms}x512 u{u}", "flat", (bps * sms, 512, 0), u, 1))
        for name, fn, (grid, block, _), u, seg in cases:
            k = kernel(fn, u, seg)
            out = cp.zeros(1 + grid * block, cp.uint32)
            args_for = [(b, out, np.int64(tile_vecs), np.int64(vecs)) for b in bufs]
            k((grid,), (block,), args_for[0])
            got = _fold(cp.asnumpy(out[1:]))
            us = _time_graph(cp, [lambda a=a: k((grid,), (block,), a) for a in args_for] * max(1, 24 // copies))
            rows[name] = {"us": round(us, 3), "GBps": round(nbytes / us / 1e3, 1), "ok": got == want}
        us = _time_graph(cp, [lambda s=s, d=d: d.__setitem__(Ellipsis, s) for s, d in zip(bufs, dsts)] * max(1, 24 // copies))
        rows["cupy copy (reads and writes)"] = {"us": round(us, 3), "GBps": round(nbytes / us / 1e3, 1), "ok": True}
        results["sizes"][label] = {"bytes": nbytes, "copies": copies, "cases": rows}
        best = sorted(rows.items(), key=lambda kv: kv[1]["us"])
        print(f"{label}: {nbytes / 1e6:.1f} MB, {dev_name}, best first (read GB/s)", flush=True)
        for name, r in best[:12]:
            print(f"  {name:28s} {r['us']:8.2f} us {r['GBps']:7.0f} GB/s{'' if r['ok'] else '  WRONG FOLD'}", flush=True)
        for name in ("tiles w4 u1 s2", "tiles w4 u2 s2", "tiles w16 u1 s2", "cupy copy (reads and writes)"):
            r = rows[name]
            print(f"  ({name:26s} {r['us']:8.2f} us {r['GBps']:7.0f} GB/s)", flush=True)
        wrong = [n for n, r in rows.items() if not r["ok"]]
        if wrong:
            print(f"  wrong folds: {wrong}", flush=True)
        del bufs, dsts
        cp.get_default_memory_pool().free_all_blocks()
    out_path = Path(args.out) / "probe_read_stream.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(out_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
