"""The cuda engine's generated memory-bound kernels against the device copy bandwidth.

Two kernels that every Llama-shaped decoder layer runs, as the cuda engine generates them
(:mod:`trtcore.cuda.codegen`), over ``M`` token rows of the Llama-3-8B shape in bfloat16:

* ``swiglu``: ``silu(gate) * up`` of two dense ``[M, 14336]`` inputs (the pointwise kernel after
  the fused gate/up GEMM, where gate and up are views of one ``[M, 28672]`` output: stride 1
  along the row too, rows 28672 apart; the same path of the kernel);
* ``residual_rms_norm``: ``h = a + b; y = rms_norm(h) * w`` over ``[M, 4096]`` (the row kernel
  between two sublayers).

Variants, built and timed side by side in one run:

* ``swiglu``: ``vector`` (:data:`~trtcore.cuda.codegen.VECTORIZE`: a lane's 8 elements as one
  16-byte load per input) and ``element`` (the path for any strides: 2-byte loads 32 elements
  apart, all of a lane's loads issued before its stores);
* ``residual_rms_norm``: ``cached`` (:func:`~trtcore.cuda.codegen.row_threads`: enough threads
  per block that every element sits in a register: 512 for 4096), ``1024 threads`` (at decode,
  fewer than 132 rows: one per 4 elements, the rule before) and ``256 threads`` (with more rows:
  256 threads a row whatever its width, the rule before).

Each launch reads and writes its own copy of the tensors (copies rotate through at least
256 MiB, so no launch finds its inputs in the 50 MB L2), the launches of one variant are
captured in a CUDA graph (``execute_async_v3`` of one execution context per copy) and timed
with events, median of 7 replays. Reported: microseconds per launch, GB/s (bytes read + written
over time) and that against the device-to-device copy bandwidth of the same run. Each
variant's output is checked against the reference backend (:func:`trtcore.reference.evaluator.evaluate`,
the same bfloat16 rounding steps in NumPy): at most 2 bfloat16 ulps apart (float32 sums
in another order, ``expf`` against NumPy's ``exp``).

    python bench/bench_generated.py --out $OUT      # writes generated.json, prints a table
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import copy_bandwidth  # noqa: E402
from bench_gemv import _time_graph  # noqa: E402

INTERMEDIATE, HIDDEN = 14336, 4096
ROWS = (1, 16, 256, 512, 2048)
BF16 = np.dtype(ml_dtypes.bfloat16)


def _network(kind: str, max_rows: int) -> tuple[Any, dict[str, tuple[tuple[int, ...], ...]], list[str]]:
    """The case's network, its profile shapes and its output names."""
    import trtcore.cuda as tc
    from trtcore import ops

    net = tc.Builder(tc.Logger(tc.Logger.ERROR)).create_network(1 << int(tc.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    g = ops.Graph(tc, net, "bfloat16")
    width = INTERMEDIATE if kind == "swiglu" else HIDDEN
    names = ("gate", "up") if kind == "swiglu" else ("a", "b")
    x, z = (net.add_input(n, tc.DataType.BF16, (-1, width)) for n in names)
    if kind == "swiglu":
        g.output(ops.mul(g, ops.silu(g, x), z, "glu"), "y")
        outputs = ["y"]
    else:
        h = ops.add(g, x, z, "residual")
        w = 1 + 0.1 * np.random.default_rng(0).standard_normal(width)
        g.output(ops.rms_norm(g, h, w, 1e-5, "norm"), "y")
        net.mark_output(h)
        outputs = ["y", "residual"]
    shape = ((1, width), (max_rows, width), (max_rows, width))
    return net, {n: shape for n in names}, outputs


def _engine(net: Any, shapes: dict[str, tuple[tuple[int, ...], ...]]) -> Any:
    import trtcore.cuda as tc

    b = tc.Builder(tc.Logger(tc.Logger.ERROR))
    cfg = b.create_builder_config()
    prof = b.create_optimization_profile()
    for name, (lo, opt, hi) in shapes.items():
        prof.set_shape(name, lo, opt, hi)
    cfg.add_optimization_profile(prof)
    return tc.Runtime().deserialize_cuda_engine(b.build_serialized_network(net, cfg))


def _bf16_bits(cp: Any, a: np.ndarray) -> Any:
    return cp.asarray(np.ascontiguousarray(a).view(np.uint16))


def time_case(cp: Any, kind: str, rows: int, variant: str) -> dict[str, Any]:
    """One case's variant: microseconds per launch, bytes moved, worst error in ulps."""
    from trtcore.cuda import codegen
    from trtcore.reference.evaluator import evaluate

    saved = codegen.VECTORIZE, codegen.row_threads
    try:
        codegen.VECTORIZE = variant != "element"
        if variant in ("256 threads", "1024 threads"):  # the rule before 2b60be0 / this commit
            codegen.row_threads = lambda r, w, n: max(32, min(1024, -(-w // 4 // 32) * 32)) if r < 132 else 256  # type: ignore[assignment]
        net, shapes, outputs = _network(kind, max(ROWS))
        engine = _engine(net, shapes)
        rng = np.random.default_rng(rows)
        feeds = {n: rng.standard_normal((rows, shapes[n][0][1])).astype(BF16) for n in shapes}
        ref = evaluate(net, {k: v.copy() for k, v in feeds.items()})
        per_copy = sum(a.nbytes for a in feeds.values()) + sum(ref[o].nbytes for o in outputs)
        copies = max(1, min(64, -(-(256 << 20) // per_copy)))
        contexts, bufs = [], []
        for _ in range(copies):
            ctx = engine.create_execution_context()
            dev = {n: _bf16_bits(cp, a) for n, a in feeds.items()}
            dev.update({o: cp.full(ref[o].size, 0x7FFF, dtype=cp.uint16) for o in outputs})  # poisoned: NaN in bfloat16
            for n, a in feeds.items():
                ctx.set_input_shape(n, a.shape)
            for n, d in dev.items():
                ctx.set_tensor_address(n, int(d.data.ptr))
            contexts.append(ctx)
            bufs.append(dev)
        launches = [lambda c=c: c.execute_async_v3(cp.cuda.get_current_stream().ptr) for c in contexts]
        us = _time_graph(cp, launches)
        worst = 0.0
        for o in outputs:
            got = cp.asnumpy(bufs[-1][o]).view(BF16).reshape(ref[o].shape).astype(np.float64)
            want = ref[o].astype(np.float64)
            ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(want), 2.0**-126))) - 7)  # bfloat16: 8 significant bits
            worst = max(worst, float(np.max(np.abs(got - want) / np.maximum(ulp, 1e-30))) if want.size else 0.0)
        kernels = [k.name for k in engine.kernels]
        return {
            "kind": kind,
            "rows": rows,
            "variant": variant,
            "us": us,
            "bytes": per_copy,
            "copies": copies,
            "max_err_ulp": worst,
            "kernels": kernels,
        }
    finally:
        codegen.VECTORIZE, codegen.row_threads = saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--kinds", default="swiglu,residual_rms_norm")
    args = ap.parse_args()
    import cupy as cp

    bw = copy_bandwidth(cp)
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    results: list[dict[str, Any]] = []
    ok = True
    kinds = {"swiglu": ("vector", "element"), "residual_rms_norm": ("cached", "1024 threads", "256 threads")}
    for kind in args.kinds.split(","):
        for rows in (int(r) for r in args.rows.split(",")):
            for variant in kinds[kind]:
                if variant in ("1024 threads", "256 threads") and (variant == "1024 threads") != (rows < 132):
                    continue  # the rule before gave that block only at these rows
                r = time_case(cp, kind, rows, variant)
                r["GBps"] = r["bytes"] / (r["us"] * 1e-6) / 1e9
                r["of_copy"] = r["bytes"] / (r["us"] * 1e-6) / bw
                good = r["max_err_ulp"] <= 2.0
                ok &= good
                results.append(r)
                print(
                    f"{kind:18s} M={rows:5d} {variant:12s} {r['us']:9.2f} us {r['GBps']:7.0f} GB/s {r['of_copy']:6.1%} of copy  "
                    f"err {r['max_err_ulp']:.2f} ulp{'' if good else '  WRONG'}",
                    flush=True,
                )
    out = {"copy_bandwidth_Bps": bw, "results": results}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "generated.json").write_text(json.dumps(out, indent=1))
    print("JSON:", json.dumps(out))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
