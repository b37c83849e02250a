"""SHA-1 of the weight-only GEMM's sm_90 cubins (kernels/wq_gemm.cu) for the plugin's default
decode define sets and the opt-in ASYNC / ASYNC + XPF variants, one line of JSON: run it on two
trees (e.g. before and after a refactor, each with its own ``TRTCORE_CACHE``) and compare, to
show that a change leaves the compiled kernels byte-identical. NVRTC only, no GPU.

    python bench/wq_cubin_hashes.py > now.json
    git worktree add /tmp/old REV && python bench/wq_cubin_hashes.py --source /tmp/old/kernels/wq_gemm.cu > old.json

(``--source``: another tree's kernel file, compiled with the define sets of this tree; a set that
the other file does not know, such as ASYNC before it existed, is reported as its error.)
"""

from __future__ import annotations

import argparse
import hashlib
import json

from trtcore import kernels
from trtcore.plugins import weight_only_gemm as wog


def define_sets() -> list[dict[str, int]]:
    """The default decode defines of each dtype / bit width / zero points / K order, alone and
    with ASYNC 4 (and XPF 1 on the contiguous-x order), as the plugin would compile them."""
    sets = []
    for bits in (4, 8):
        for dtype in (1, 2):
            for zeros in (0, 1):
                for contig in (0, 1):
                    for extra in ({}, {"ASYNC": 4}, {"ASYNC": 4, "XPF": 1}):
                        if extra.get("XPF") and not contig:
                            continue
                        d = {"DTYPE": dtype, "BITS": bits, "HAS_ZEROS": zeros, "HAS_PERM": 0, **wog.DEFAULT_DECODE[bits], **extra}
                        if contig:
                            d["CONTIG_X"] = 1
                        if d.get("ASYNC"):
                            d["ASLOT"] = wog.async_slot_bytes(d.get("SEG", 1), d.get("ROW_TILES", 1), bool(zeros))
                        sets.append(d)
    return sets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default="wq_gemm", help="the kernel: this tree's (default) or a .cu file's absolute path")
    args = ap.parse_args()
    out = {}
    for d in define_sets():
        try:
            ck = kernels.compile_kernel(args.source, defines=d, arch="sm_90")
            out[json.dumps(d, sort_keys=True)] = hashlib.sha1(ck.cubin).hexdigest()
        except kernels.NVRTCError as exc:
            out[json.dumps(d, sort_keys=True)] = f"error: {str(exc).splitlines()[0][:120]}"
    print(json.dumps(out, indent=0))


if __name__ == "__main__":
    main()
