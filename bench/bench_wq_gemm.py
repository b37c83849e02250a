"""The weight-only GEMM plugin (W4A16 group 128, W8A16 per channel) against cuBLAS bfloat16 at
M = 1 on the Llama-3-8B MLP shapes ``[N, K]`` = 14336 x 4096 (gate/up) and 4096 x 14336 (down).

Each launch reads another copy of the weights (codes and scales; cuBLAS: the bfloat16 matrix),
with enough copies that together they exceed 4 x 60 MB, so no launch finds its weight in the
L2 cache; launches are captured in a CUDA graph and timed with events (median of 7 replays;
``bench_gemv._time_graph``). Every output is checked against float64 NumPy of
``QuantizedWeight.dequantize()`` (relative L2 error below 1e-2). The issue's targets at M = 1:
W4A16 >= 3.2x and W8A16 >= 1.8x faster than cuBLAS bfloat16.

    python bench/bench_wq_gemm.py --out $OUT       # writes wq_gemm.json, prints a table
    python bench/bench_wq_gemm.py --out $OUT --tune    # also every decode-kernel variant (below)

The default packing is the contiguous-x K order (``weight_only_gemm.CONTIGUOUS_X``: 16-byte x
loads in the decode kernel). ``--natural-order`` also times W4A16 g128 and W8A16 packed in the
natural K order (``pack_weight(contiguous_x=False)``, what act order and partial groups use),
side by side; ``--diag`` times where the 4-bit kernel's time goes (:data:`DIAG`).

``--tune`` times, per shape and quantization, the default decode kernel (v1) at every
(warps, UNROLL) of :data:`TUNE` and the v2 kernel (``WQ_DECODE 2``, kernels/wq_gemm.cu) at
the (ROW_TILES, WQ_FOLD, SEG, L2_PF, L2_HINT, warps, UNROLL) of :data:`TUNE_V2` and the cp.async rings of
:data:`TUNE_ASYNC`, each output checked against
float64 NumPy; a table per case (best first) and the JSON. ``--tune-only v2`` skips v1;
``--tune-filter REGEX`` keeps the entries whose names match (e.g. ``'v2_rt1_.*_w4_u[12]'``). The
define sets are compiled by parallel threads in the background while the weights are made
(the disk cache serves the timing runs).

The JSON is printed too (one line after ``JSON:``), for runs whose files do not come back.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gemv import _bf16, _time_graph, _to_f64  # noqa: E402

SHAPES = {"8B gate_up": (14336, 4096), "8B down": (4096, 14336)}
#: the shapes the cuda engine runs after fusing the weight-only plugins horizontally, and a 4-bit
#: lm_head (--shapes)
FUSED_SHAPES = {"8B gate+up fused": (28672, 4096), "8B qkv fused": (6144, 4096), "8B o_proj": (4096, 4096), "8B lm_head": (128256, 4096)}
#: (label, bits, group_size (0: per channel), zero points), packed as the plugin packs by default
#: (the contiguous-x K order)
VARIANTS = [("W4A16 g128", 4, 128, False), ("W4A16 g128 zeros", 4, 128, True), ("W8A16 per-channel", 8, 0, False)]
#: ``--natural-order``: the same packed in the natural K order (``pack_weight(contiguous_x=False)``,
#: no CONTIG_X), side by side
NATURAL = [("W4A16 g128 natural order", 4, 128, False), ("W8A16 per-channel natural order", 8, 0, False)]
#: ``--diag``: where the 4-bit kernel's time goes. Per channel (no per-group scale loads), and g128
#: with one scales array shared by the rotated copies (the scales then come from L2, not DRAM)
DIAG = [("W4A16 per-channel", 4, 0, False), ("W4A16 g128, scales in L2", 4, 128, False)]
#: bytes all copies of a weight must exceed (L2 60 MB, 4x)
ROTATE_BYTES = 4 * 60 << 20


def _quantized(rng: np.random.Generator, n: int, k: int, bits: int, gs: int, zeros: bool) -> Any:
    from trtcore.quantization import QuantizedWeight

    gs = gs or k
    g = k // gs
    z = rng.integers(0, 1 << bits, (n, g)).astype(np.float32) if zeros else None
    return QuantizedWeight(rng.integers(0, 1 << bits, (n, k)).astype(np.uint8), rng.uniform(0.002, 0.02, (n, g)).astype(np.float32), z, bits, gs)


#: decode-kernel settings ``--tune`` times: (warps per tile, UNROLL)
TUNE = [(w, u) for w in (4, 8, 16) for u in (1, 2, 3)]
#: v2 settings: (ROW_TILES, WQ_FOLD, SEG, L2_PF, L2_HINT, warps per block, UNROLL): every
#: (ROW_TILES, WQ_FOLD, SEG, warps, UNROLL) without the memory knobs (1 and 2 warps with one tile:
#: what the plugin launches on the fused gate+up and the lm_head), then the memory knobs
#: (L2 prefetch 2 units ahead, 256-byte L2 fetches, both) on WQ_FOLD 1 at 8 and 16 warps.
#: bfloat16 int8 ignores WQ_FOLD (kernels/wq_gemm.cu): its FOLD 1 entries are skipped, and its
#: memory-knob entries use FOLD 0. Registers grow with ROW_TILES x SEG x UNROLL (16-byte vectors
#: in flight per lane): UNROLL 3 only with one tile.
TUNE_V2 = [
    (rt, f, seg, 0, 0, w, u)
    for rt in (1, 2)
    for f in (0, 1)
    for seg in (1, 2)
    for w in ((1, 2, 4, 8, 16) if rt == 1 else (4, 8, 16))
    for u in ((1, 2, 3) if rt == 1 else (1, 2))
] + [(rt, 1, seg, pf, hint, w, u) for rt in (1, 2) for seg in (1, 2) for pf, hint in ((2, 0), (0, 2), (2, 2)) for w in (8, 16) for u in (1, 2)]


def _fits(depth: int, warps: int, seg: int, rt: int) -> bool:
    """Whether the plugin runs ``depth`` as asked (with zero points, the larger slot)."""
    from trtcore.plugins.weight_only_gemm import async_depth

    return async_depth(depth, warps, seg, rt, True) == depth


#: v2 with the weights in flight in shared memory: (ROW_TILES, WQ_FOLD, SEG, ASYNC, warps), the
#: depths whose rings fit with zero points too (weight_only_gemm.async_depth: not lowered)
TUNE_ASYNC = [
    (rt, f, seg, a, w)
    for rt in (1, 2)
    for f in (0, 1)
    for seg in (1, 2)
    for a in (2, 3, 4, 6, 8, 12)
    for w in (4, 8, 16)
    if (rt, seg) != (2, 2) and _fits(a, w, seg, rt)
]


def _sweep(bits: int, only: str) -> list[tuple[str, dict[str, int], int]]:
    """``--tune``'s entries for a quantization: (name, extra defines (UNROLL included), warps)."""
    out = []
    if only in ("", "v1"):
        out += [(f"v1_w{w}_u{u}", {"UNROLL": u}, w) for w, u in TUNE]
    if only in ("", "v2"):
        for rt, f, seg, pf, hint, w, u in TUNE_V2:
            if f and bits == 8:  # the bench's activations are bfloat16: int8 cannot fold
                if not (pf or hint):
                    continue
                f = 0
            defines = {"UNROLL": u, "WQ_DECODE": 2, "ROW_TILES": rt, "WQ_FOLD": f, "SEG": seg, "L2_PF": pf, "L2_HINT": hint}
            out.append((f"v2_rt{rt}_f{f}_s{seg}_pf{pf}_h{hint}_w{w}_u{u}", defines, w))
        for rt, f, seg, a, w in TUNE_ASYNC:
            if f and bits == 8:
                continue
            for xpf in (0, 1):  # x loaded a unit ahead (the bench's weights are in the contiguous-x order)
                defines = {"UNROLL": 1, "WQ_DECODE": 2, "ROW_TILES": rt, "WQ_FOLD": f, "SEG": seg, "ASYNC": a, "XPF": xpf}
                out.append((f"v2_rt{rt}_f{f}_s{seg}_a{a}_x{xpf}_w{w}", defines, w))
    return [e for e in out if re.fullmatch(TUNE_FILTER[0], e[0])] if TUNE_FILTER else out


#: ``--tune-filter``: a regular expression the tune entries' names must match (fullmatch)
TUNE_FILTER: list[str] = []


class Precompile:
    """Every define set ``--tune`` uses, compiled into the disk cache by ``jobs`` threads in the
    background (NVRTC releases the GIL) while the weights are made; :meth:`wait` before the
    first timing."""

    def __init__(self, only: str, jobs: int, natural: bool = False) -> None:
        import concurrent.futures

        from trtcore import kernels
        from trtcore.dtypes import KERNEL_DTYPE_CODES
        from trtcore.plugins import weight_only_gemm as wog

        sets = set()
        for label, bits, _gs, zeros in VARIANTS + (NATURAL if natural else []):
            base = {"DTYPE": KERNEL_DTYPE_CODES[np.dtype(ml_dtypes.bfloat16)], "BITS": bits, "HAS_ZEROS": int(zeros), "HAS_PERM": 0}
            if not label.endswith("natural order") and wog.CONTIGUOUS_X:  # the bench's shapes can all take it
                base["CONTIG_X"] = 1
            for _, extra, _ in _sweep(bits, only):
                if extra.get("XPF") and "CONTIG_X" not in base:
                    continue  # the plugin drops XPF there: another entry's kernel
                if extra.get("ASYNC"):  # the plugin adds the slot's size (decode_variant)
                    extra = {**extra, "ASLOT": wog.async_slot_bytes(extra["SEG"], extra["ROW_TILES"], zeros)}
                sets.add(tuple(sorted({**base, **extra}.items())))
        self.count, self.t0 = len(sets), time.perf_counter()
        arch = kernels.current_arch()  # the key the launcher's compile_kernel(arch=None) uses
        self.pool: Any = concurrent.futures.ThreadPoolExecutor(jobs)
        self.futures = [self.pool.submit(kernels.compile_kernel, "wq_gemm", defines=dict(d), arch=arch) for d in sorted(sets)]

    def wait(self) -> None:
        """Block until every set is compiled (once); a failure only leaves it to first use."""
        if self.pool is None:
            return
        try:
            for f in self.futures:
                f.result()
        except Exception as exc:  # the timing runs compile what is missing, one after another
            print(f"precompile failed ({exc!r}); compiling on first use", flush=True)
        self.pool.shutdown()
        self.pool = None
        print(f"precompiled {self.count} define sets in {time.perf_counter() - self.t0:.1f} s (in the background)", flush=True)


#: the tune table lines of every case (written to wq_tune.txt) and how many per case are printed
TUNE_LINES: list[str] = []
TOP = 12


def _tune_table(case: str, cublas_us: float, sweep: dict[str, dict[str, Any]]) -> list[str]:
    """A case's tune entries, fastest first (wrong outputs flagged)."""
    lines = [f"  tune {case}: best first (cuBLAS bf16 {cublas_us:.2f} us)"]
    for name, t in sorted(sweep.items(), key=lambda kv: kv[1]["us"]):
        flag = "" if t["ok"] else "  WRONG (rel_err >= 1e-2)"
        lines.append(f"    {name:28s} {t['us']:8.2f} us  x{t['speedup_vs_cublas']:.2f}  err {t['rel_err']:.1e}{flag}")
    return lines


def _best(sweep: dict[str, dict[str, Any]], prefix: str) -> tuple[str, dict[str, Any]] | None:
    ok = [(name, t) for name, t in sweep.items() if name.startswith(prefix) and t["ok"]]
    return min(ok, key=lambda kv: kv[1]["us"]) if ok else None


def _summary(results: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The tune run's summary: per case the default, the best v1 and the best v2 setting (only
    correct outputs count), as printed lines and as a dict (the JSON line)."""

    def cell(b: tuple[str, dict[str, Any]] | None) -> str:
        return f"{b[0]} {b[1]['us']:.2f} x{b[1]['speedup_vs_cublas']:.2f}" if b else "none correct"

    summary: dict[str, Any] = {}
    lines = [f"{'case':32s} {'cuBLAS':>8s} {'default':>16s} {'best v1':>30s} {'best v2':>46s}"]
    for name, row in results["shapes"].items():
        cublas_us = row["variants"]["cublas bf16"]["us"]
        for label, v in row["variants"].items():
            if "tune" not in v:
                continue
            b1, b2 = _best(v["tune"], "v1_"), _best(v["tune"], "v2_")
            summary[f"{name} {label}"] = {"cublas_us": cublas_us, "default_us": v["us"], "best_v1": b1, "best_v2": b2}
            lines.append(f"{name + ' ' + label:32s} {cublas_us:8.2f} {v['us']:9.2f} x{v['speedup_vs_cublas']:.2f} {cell(b1):>30s} {cell(b2):>46s}")
    wrong = sum(not t["ok"] for row in results["shapes"].values() for v in row["variants"].values() for t in v.get("tune", {}).values())
    lines.append(f"tune entries with a wrong output: {wrong}")
    return lines, summary


def time_shape(
    cp: Any,
    blas: Any,
    n: int,
    k: int,
    rng: np.random.Generator,
    tune: bool = False,
    only: str = "",
    pre: Precompile | None = None,
    natural: bool = False,
    diag: bool = False,
) -> dict[str, Any]:
    from trtcore.cuda.gemm import GemmCall
    from trtcore.plugins.base import DeviceTensor
    from trtcore.plugins import weight_only_gemm as wog
    from trtcore.plugins.weight_only_gemm import WeightOnlyGemmPlugin, pack_weight
    from trtcore.reference.types import DataType

    bf16 = ml_dtypes.bfloat16
    x = _bf16(cp, (1, k), 1.0)
    x64 = _to_f64(cp, x)
    row: dict[str, Any] = {"N": n, "K": k, "variants": {}}

    def stream() -> int:
        return int(cp.cuda.get_current_stream().ptr)

    def check(y: Any, want: np.ndarray) -> float:
        return float(np.linalg.norm(_to_f64(cp, y)[0] - want) / np.linalg.norm(want))

    # cuBLAS bfloat16
    copies = max(1, -(-ROTATE_BYTES // (n * k * 2)))
    ws = [_bf16(cp, (n, k), 0.05) for _ in range(copies)]
    ys = [cp.empty((1, n), cp.uint16) for _ in range(copies)]
    call = GemmCall(op_x=1, op_y=0, m=n, n=1, k=k, x_off=0, ldx=k, stride_x=0, y_off=0, ldy=k, stride_y=0, c_off=0, ldc=n, stride_c=0, batch=1)
    ys[0].fill(0xFFFF)
    us = _time_graph(
        cp,
        [lambda w=w, y=y: blas.run(call, DataType.BF16, int(w.data.ptr), int(x.data.ptr), int(y.data.ptr), stream()) for w, y in zip(ws, ys)]
        * max(1, 24 // copies),
    )
    row["variants"]["cublas bf16"] = {
        "us": round(us, 3),
        "GBps": round((n * k + k + n) * 2 / us * 1e-3, 1),
        "rel_err": check(ys[0], _to_f64(cp, ws[0]) @ x64[0]),
    }
    cublas_us = us
    del ws, ys
    cp.get_default_memory_pool().free_all_blocks()

    for label, bits, gs, zeros in VARIANTS + (NATURAL if natural else []) + (DIAG if diag else []):
        qw = _quantized(rng, n, k, bits, gs, zeros)
        plugin, packed = WeightOnlyGemmPlugin.from_quantized(qw)
        if label.endswith("natural order"):
            packed = pack_weight(qw, contiguous_x=False)
            plugin = WeightOnlyGemmPlugin(k, n, bits, qw.group_size, zeros, False, False)
        arrays = packed.arrays()
        nbytes = sum(a.nbytes for a in arrays)
        copies = max(1, -(-ROTATE_BYTES // nbytes))
        dev = [[cp.asarray(a) for a in arrays] for _ in range(copies)]
        if label.endswith("scales in L2"):  # every copy's codes, one copy's scales
            dev = [[d[0]] + dev[0][1:] for d in dev]
        ys = [cp.empty((1, n), cp.uint16) for _ in range(copies)]
        xt = DeviceTensor(int(x.data.ptr), (1, k), np.dtype(bf16))
        want = qw.dequantize() @ x64[0]

        def launch(d: list[Any], y: Any, plugin: Any = plugin, xt: Any = xt) -> None:
            ins = [xt] + [DeviceTensor(int(a.data.ptr), a.shape, a.dtype) for a in d]
            plugin.enqueue(ins, [DeviceTensor(int(y.data.ptr), (1, n), np.dtype(bf16))], 0, stream())

        def timed(plugin: Any = plugin, dev: list[Any] = dev, ys: list[Any] = ys) -> tuple[float, float]:
            ys[0].fill(0xFFFF)
            us = _time_graph(cp, [lambda d=d, y=y: launch(d, y) for d, y in zip(dev, ys)] * max(1, 24 // copies))
            return us, check(ys[0], want)

        us, err = timed()
        row["variants"][label] = {
            "us": round(us, 3),
            "GBps": round((nbytes + (k + n) * 2) / us * 1e-3, 1),
            "speedup_vs_cublas": round(cublas_us / us, 3),
            "warps": plugin.decode_warps(),
            "contiguous_x": plugin.contiguous_x,
            "rel_err": err,
        }
        assert err < 1e-2, (n, k, label, err)
        if tune:
            if pre is not None:
                pre.wait()
            cls = type(plugin)
            base_defines, base_warps, base_variant = cls.defines, cls.decode_warps, dict(wog.DECODE_VARIANT)
            sweep = {}
            try:
                for name, extra, warps in _sweep(bits, only):
                    unroll = {"UNROLL": extra["UNROLL"]}
                    variant = {key: val for key, val in extra.items() if key != "UNROLL"}
                    cls.defines = lambda self, dtype, u=unroll: {**base_defines(self, dtype), **u}  # type: ignore[method-assign]
                    cls.decode_warps = lambda self, row_tiles=1, w=warps: w  # type: ignore[method-assign]
                    wog.DECODE_VARIANT.clear()
                    wog.DECODE_VARIANT.update(variant)
                    chosen = plugin.decode_variant(np.dtype(bf16), 1)
                    if variant and not chosen:
                        continue  # v2 does not apply (it never does here: no perm, whole-chunk groups)
                    if any(chosen.get(key, 0) != variant.get(key, 0) for key in ("ASYNC", "SEG", "XPF")):
                        continue  # lowered by the plugin (SEG not dividing a group; the ring not fitting): another entry's kernel
                    t_us, t_err = timed()
                    sweep[name] = {"us": round(t_us, 3), "speedup_vs_cublas": round(cublas_us / t_us, 3), "rel_err": t_err, "ok": t_err < 1e-2}
            finally:
                cls.defines, cls.decode_warps = base_defines, base_warps  # type: ignore[method-assign]
                wog.DECODE_VARIANT.clear()
                wog.DECODE_VARIANT.update(base_variant)
            row["variants"][label]["tune"] = sweep
            lines = _tune_table(f"{n}x{k} {label}", cublas_us, sweep)
            print("\n".join(lines[: TOP + 1]), flush=True)  # the whole table goes to wq_tune.txt
            TUNE_LINES.extend(lines)
        del dev, ys
        cp.get_default_memory_pool().free_all_blocks()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join({**SHAPES, **FUSED_SHAPES})}")
    ap.add_argument("--tune", action="store_true", help="also time every decode-kernel variant (TUNE, TUNE_V2)")
    ap.add_argument("--tune-only", default="", choices=["", "v1", "v2"], help="with --tune: only v1 or only v2")
    ap.add_argument("--tune-filter", default="", help="with --tune: only the entries whose names match this regular expression")
    ap.add_argument("--natural-order", action="store_true", help="also the natural K order's packing (NATURAL)")
    ap.add_argument("--diag", action="store_true", help="also the DIAG variants (per-channel int4; g128 with its scales L2-resident)")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="threads compiling the --tune variants in the background")
    args = ap.parse_args()
    if args.tune_filter:
        TUNE_FILTER.append(args.tune_filter)
    pre = Precompile(args.tune_only, args.jobs, args.natural_order) if args.tune else None
    import cupy as cp

    from trtcore.cuda.gemm import WORKSPACE_BYTES, Cublas

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workspace = cp.cuda.alloc(WORKSPACE_BYTES)
    blas = Cublas(int(workspace.ptr), WORKSPACE_BYTES)
    rng = np.random.default_rng(0)
    results: dict[str, Any] = {"shapes": {}}
    for name in args.shapes.split(","):
        row = time_shape(cp, blas, *{**SHAPES, **FUSED_SHAPES}[name], rng, args.tune, args.tune_only, pre, args.natural_order, args.diag)
        results["shapes"][name] = row
        for label, v in row["variants"].items():
            print(
                f"{name:12s} {label:20s} {v['us']:9.2f} us {v['GBps']:7.0f} GB/s  x{v.get('speedup_vs_cublas', 1.0):.2f}  err {v['rel_err']:.1e}",
                flush=True,
            )
    (out / "wq_gemm.json").write_text(json.dumps(results, indent=1))
    if not args.tune:
        print("JSON:", json.dumps(results))
        return 0
    (out / "wq_tune.txt").write_text("\n".join(TUNE_LINES) + "\n")
    lines, summary = _summary(results)
    print("\n".join(lines), flush=True)
    print("JSON:", json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
