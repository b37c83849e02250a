"""The default W4A16 decode GEMV (bfloat16, v2, CONTIG_X, SEG 2, UNROLL 1) compiled for sm_90 by
NVRTC on the CPU, with EARLY_REFILL 0 and 1: registers and spills (ptxas -v) and, from the SASS
(cuobjdump of the nvidia-cuda-cuobjdump wheel: CUOBJDUMP=path), the order of the weight loads
(LDG...NA), the mmas (HMMA) and the flush (FFMA) in the grouped main loop.

    CUOBJDUMP=/path/to/cuobjdump python grouped_loop.py
"""

import os
import re
import subprocess
import tempfile

from trtcore.kernels.nvrtc import compile_kernel

BASE = {"DTYPE": 2, "BITS": 4, "HAS_ZEROS": 0, "HAS_PERM": 0, "CONTIG_X": 1, "WQ_DECODE": 2, "ROW_TILES": 1, "WQ_FOLD": 0, "SEG": 2, "UNROLL": 1}
for early in (0, 1):
    k = compile_kernel("wq_gemm", defines={**BASE, "EARLY_REFILL": early}, arch="sm_90", options=["--ptxas-options=-v"])
    m = re.search(r"Function properties for trtcore_wq_gemv\n(.*)\n(.*)\n", k.log)
    print(f"EARLY_REFILL {early}: " + (" ".join(x.split(":", 1)[-1].strip(" .") for x in m.groups()) if m else "(from the cache: no ptxas log)"))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.cubin)
        f.flush()
        sass = subprocess.run([os.environ.get("CUOBJDUMP", "cuobjdump"), "-sass", "-fun", "trtcore_wq_gemv", f.name], capture_output=True, text=True).stdout
    ops = [(int(a, 16), o, t) for a, o, t in re.findall(r"/\*([0-9a-f]{4})\*/\s+(@?!?P?\d?\s*(?:LDG\S*|HMMA\S*|FFMA|BRA))\s*(0x[0-9a-f]+)?", sass)]
    # the grouped loop: the backward branch whose body holds the flush (FFMA)
    loops = [(int(t, 16), a) for a, o, t in ops if "BRA" in o and t and int(t, 16) < a]
    lo, hi = next((lo, hi) for lo, hi in loops if any(lo <= a <= hi and o.endswith("FFMA") for a, o, _ in ops))
    body = [o.split()[-1].split(".")[0] + (".NA" if ".NA" in o else "") for a, o, _ in ops if lo <= a <= hi and "BRA" not in o]
    print(f"   grouped loop {lo:#06x}-{hi:#06x}: " + " ".join(body))
