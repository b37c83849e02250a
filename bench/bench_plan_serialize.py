"""Serializing a cuda plan: the whole-plan pickle (the format before 2026-12-03) against
:func:`trtcore.cuda.plan.dumps` / :func:`~trtcore.cuda.plan.loads` (a pickle with the arrays'
bytes out of band), side by side in one run, on the CPU.

The plan is a Llama of ``--model``'s shape with random bfloat16 weights
(``trtcore.cuda.synthetic``), compiled for sm_90 without a GPU; each way is timed
``--repeats`` times (median), and the loaded plans' constants are checked bit for bit.

    python bench/bench_plan_serialize.py --out bench/results/cpu-2026-12-03-plan-serialize [--model Llama-3.2-1B]
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--model", default="Llama-3.2-1B")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import trtcore.cuda as tc
    from trtcore.builder import _builder_config, define_network
    from trtcore.cuda import plan as plan_module
    from trtcore.cuda import synthetic
    from trtcore.plan import BuildConfig

    bc = BuildConfig(dtype="bfloat16", max_batch_size=16, max_seq_len=256, max_num_tokens=2048, kv_cache="paged")
    d = define_network(tc, synthetic.config(args.model), synthetic.RandomWeights(seed=1), bc)
    cfg = _builder_config(d, None)
    cfg.set_compute_capability("sm_90", 0)
    plan = tc.Builder(tc.Logger(tc.Logger.ERROR)).build_engine(d.network, cfg).plan
    del d
    weight_bytes = sum(int(a.nbytes) for a in plan.graph.constants.values())

    def timed(fn: object) -> tuple[float, object]:
        times, out = [], None
        for _ in range(args.repeats):
            out = None
            t0 = time.perf_counter()
            out = fn()  # type: ignore[operator]
            times.append(time.perf_counter() - t0)
        return statistics.median(times), out

    rows = {}
    for way, dump, load in (
        ("whole pickle", lambda: pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL), pickle.loads),
        ("dumps / loads", lambda: plan_module.dumps(plan), plan_module.loads),
    ):
        dump_s, blob = timed(dump)
        load_s, back = timed(lambda blob=blob, load=load: load(blob))
        same = all(
            back.graph.constants[k].dtype == a.dtype and np.array_equal(np.ascontiguousarray(back.graph.constants[k]).view(np.uint8), np.ascontiguousarray(a).view(np.uint8))
            for k, a in plan.graph.constants.items()
        )
        rows[way] = {"serialize_s": dump_s, "load_s": load_s, "bytes": len(blob), "constants_equal": same}
        print(f"{way:14s} serialize {dump_s:6.2f} s  load {load_s:6.2f} s  {len(blob) / 2**30:.2f} GiB  constants equal: {same}", flush=True)
        del blob, back
    a, b = rows["whole pickle"], rows["dumps / loads"]
    result = {
        "model": args.model,
        "weight_bytes": weight_bytes,
        "repeats": args.repeats,
        "machine": "the CI machine (2 cores, no GPU)",
        "ways": rows,
        "speedup": {"serialize": a["serialize_s"] / b["serialize_s"], "load": a["load_s"] / b["load_s"], "both": (a["serialize_s"] + a["load_s"]) / (b["serialize_s"] + b["load_s"])},
    }
    print(json.dumps(result["speedup"]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan_serialize.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
