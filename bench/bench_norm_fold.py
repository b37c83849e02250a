"""The weight-only decode GEMV with the RMSNorm folded in (``norm_input``, the kernel's
``NORM_X``) and with the residual add in its epilogue (``add_residual``) against the plain GEMV
on the same weights, at M = 1 on the Llama-3-8B shapes (4-bit, group 128): what the two
halves of :mod:`trtcore.cuda.norm_input_fusion` cost inside the GEMVs they move into. Each
launch on its own copy of the weights (more than the L2 in all), in a CUDA graph, median of 7.

    python bench/bench_norm_fold.py --out $OUT [--extra '[{"UNROLL": 2}]']

``--extra``: a JSON list of define sets; the three plugins are also timed with each on top of
their own defines (a kernel experiment). Writes ``norm_fold.json`` under ``--out`` and prints a
table. Results: bench/results/h100-2026-12-05-session28 (calls 2 and 3).
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
from bench_gemv import _bf16, _time_graph  # noqa: E402
from bench_wq_gemm import ROTATE_BYTES, _quantized  # noqa: E402

#: (name, N, K, SwiGLU): q/k/v fused, gate/up fused with SwiGLU in the epilogue, down_proj, o_proj
SHAPES = [("qkv", 6144, 4096, False), ("gate_up", 28672, 4096, True), ("down", 4096, 14336, False), ("o_proj", 4096, 4096, False)]


def time_case(cp: Any, plugin: Any, arrays: list[np.ndarray], x: Any, extras: list[Any], k: int, n_out: int) -> float:
    """Microseconds per launch of ``plugin`` on x and rotated copies of its constant arrays;
    ``extras``: the device arrays after the weight's (residual, norm weight)."""
    from trtcore.plugins.base import DeviceTensor

    bf16 = np.dtype(ml_dtypes.bfloat16)
    nbytes = sum(a.nbytes for a in arrays)
    copies = max(1, -(-ROTATE_BYTES // nbytes))
    dev = [[cp.asarray(a) for a in arrays] for _ in range(copies)]
    ys = [cp.empty((1, n_out), cp.uint16) for _ in range(copies)]

    def launch(d: list[Any], y: Any) -> None:
        ins = [DeviceTensor(int(x.data.ptr), (1, k), bf16)] + [DeviceTensor(int(a.data.ptr), a.shape, a.dtype) for a in d]
        ins += [DeviceTensor(int(e.data.ptr), e.shape, bf16) for e in extras]
        plugin.enqueue(ins, [DeviceTensor(int(y.data.ptr), (1, n_out), bf16)], 0, int(cp.cuda.get_current_stream().ptr))

    us = _time_graph(cp, [lambda d=d, y=y: launch(d, y) for d, y in zip(dev, ys)] * max(1, 24 // copies))
    del dev, ys
    cp.get_default_memory_pool().free_all_blocks()
    return us


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".")
    ap.add_argument("--extra", default="[]", help="JSON list of extra define sets timed on the folded plugin")
    args = ap.parse_args()
    import cupy as cp

    from trtcore.plugins.weight_only_gemm import WeightOnlyGemmPlugin

    extra_sets = json.loads(args.extra)
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    cls = WeightOnlyGemmPlugin
    base_defines = cls.defines
    for name, n, k, swiglu in SHAPES:
        plugin, packed = WeightOnlyGemmPlugin.from_quantized(_quantized(rng, n, k, 4, 128, False))
        arrays = packed.arrays()
        if swiglu:
            plugin, arrays = plugin.with_swiglu(arrays)  # type: ignore[misc]
        n_out = plugin.output_features
        x = _bf16(cp, (1, k), 1.0)
        norm_w = _bf16(cp, (k,), 1.0)
        resid = _bf16(cp, (1, n_out), 1.0)
        row: dict[str, Any] = {"shape": name, "N": n, "K": k, "us": {}}
        folded, _ = plugin.with_norm_input(arrays, 1e-5)  # type: ignore[misc]
        added = None if swiglu else plugin.with_residual(arrays)[0]  # type: ignore[index]
        for extra in [{}, *extra_sets]:
            tag = f" {json.dumps(extra)}" if extra else ""
            cls.defines = lambda self, dtype, e=extra: {**base_defines(self, dtype), **e}  # type: ignore[method-assign]
            try:
                row["us"][f"plain{tag}"] = time_case(cp, plugin, arrays, x, [], k, n_out)
                row["us"][f"norm folded{tag}"] = time_case(cp, folded, arrays, x, [norm_w], k, n_out)
                if added is not None:
                    row["us"][f"residual added{tag}"] = time_case(cp, added, arrays, x, [resid], k, n_out)
            finally:
                cls.defines = base_defines  # type: ignore[method-assign]
        rows.append(row)
        for label, us in row["us"].items():
            print(f"{name:8} {label:60} {us:8.2f} us  ({us / row['us']['plain']:.3f}x plain)", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "norm_fold.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
