"""Where a kernel's warps wait, from an Nsight Compute source page: the totals per stall reason
and the SASS instructions with the most warp samples.

    ncu --set full -k regex:NAME --launch-count 1 -o rep python3 ...
    ncu -i rep.ncu-rep --page source --csv --print-source sass > sass.csv
    python bench/ncu_stalls.py sass.csv [TOP]

Columns read: ``Address``, ``Source``, ``Warp Stall Sampling (All Samples)`` and the
``stall_*`` reason columns (Nsight Compute 2025+; "Not Issued" columns are left out). Prints
the total samples, the ten largest reasons with their share, then the TOP (default 30)
instructions by samples with their three largest reasons. A sample is a warp seen in that
state at that instruction (Nsight Compute's "Warp State Sampling"), so the shares say where
time is spent waiting, not what the wait is for: a load's latency shows at the first
instruction that uses its register.
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("top", nargs="?", type=int, default=30, help="instructions to list")
    args = ap.parse_args(argv)
    with open(args.csv, newline="") as f:
        rows = list(csv.reader(f))
    header = next((r for r in rows if SAMPLES in r), None)
    if header is None:
        print(f"{args.csv}: no {SAMPLES!r} column (not an ncu source page with --print-source sass?)", file=sys.stderr)
        return 2
    ix = {h: i for i, h in enumerate(header)}
    data = [r for r in rows[rows.index(header) + 1 :] if len(r) == len(header)]
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    totals: collections.Counter[str] = collections.Counter()
    for r in data:
        for s in reasons:
            totals[s] += int(r[ix[s]] or 0)
    n = sum(int(r[ix[SAMPLES]] or 0) for r in data) or 1
    print("total samples", n)
    print([(k, v, round(100 * v / n, 1)) for k, v in totals.most_common(10)])
    data.sort(key=lambda r: -int(r[ix[SAMPLES]] or 0))
    for r in data[: args.top]:
        s = int(r[ix[SAMPLES]] or 0)
        top = sorted(((int(r[ix[k]] or 0), k) for k in reasons), reverse=True)[:3]
        print(f"{s:6d} {100 * s / n:5.1f}% {r[ix['Address']][-5:]} {r[ix['Source']].strip()[:60]:60s} {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
