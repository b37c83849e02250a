"""One decode step kernel by kernel, from ``bench_quant_e2e.py --profile`` results: per kernel
name of the step's ``timeline`` (``bench_quant_e2e.step_timeline``), its launches, exclusive
microseconds (the part of its span after every earlier span ended), idle gaps before it and
spans, longest first, then the step's totals.

    python bench/step_timeline.py RESULTS/quant_e2e.json [...]

With programmatic dependent launch (the default) a span includes the wait for the previous
kernel, so only the exclusive times add up to the step; with ``TRTCORE_CUDA_PDL=0`` spans and
exclusive times are the same.
"""

from __future__ import annotations

import collections
import json
import sys


def main(paths: list[str]) -> int:
    for path in paths:
        with open(path) as f:
            results = json.load(f)
        for prof in results.get("profile", []):
            line = prof.get("timeline", [])
            print(f"{path} {prof['variant']} ({'PDL' if prof['pdl'] else 'no PDL'}): {len(line)} kernels")
            agg: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
            for r in line:
                a = agg[r["name"][:50]]
                a[0] += 1
                a[1] += r["exclusive_us"]
                a[2] += r["gap_us"]
                a[3] += r["span_us"]
            for name, (n, excl, gap, span) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
                print(f"  {name:<50} {n:4.0f}x exclusive {excl:8.1f} gap {gap:7.1f} span {span:8.1f}  ({excl / n:.2f} us each)")
            print(f"  step: exclusive {sum(r['exclusive_us'] for r in line):.1f} us, idle {sum(r['gap_us'] for r in line):.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
