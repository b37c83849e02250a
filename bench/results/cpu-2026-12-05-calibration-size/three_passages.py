"""Scratch script of this run (kept as run, not a maintained bench): quantize the default model
once per spec and score three passages with bench/quant_quality.py's ``mean_logprob``, against
the bfloat16 log-probabilities of earlier runs (BASE). ``bench/quant_quality.py --passage A B C``
now does the same with the baseline computed in the same run.

    python three_passages.py OUT.json NAME:CALIBRATION:TOKENS:HOW ...   (CALIBRATION "default": trtcore's)

The runs used two copies of this script that spelled the variant differently (``method:group``
and a HOW key); the variants are the same.
"""

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, "/work/main/bench")
from quant_quality import mean_logprob  # noqa: E402

from trtcore import LLM  # noqa: E402
from trtcore.quantizer import quantize_checkpoint  # noqa: E402

M = Path.home() / ".cache/trtcore/models/SmolLM2-135M-Instruct"
BASE = {"passage": -3.0247, "river": -3.3068, "kitchen": -3.1578}
PASS = {"passage": "/work/main/tests/data/passage.txt", "river": "/work/main/bench/data/passage-river.txt", "kitchen": "/work/main/bench/data/passage-kitchen.txt"}
HOW = {
    "gptq-g64": {"method": "gptq", "bits": 4, "group_size": 64},
    "gptq-g32": {"method": "gptq", "bits": 4, "group_size": 32},
    "awq-g64": {"method": "awq", "bits": 4, "group_size": 64},
    "awq-g32": {"method": "awq", "bits": 4, "group_size": 32},
    "fp8-channel-static": {"method": "fp8", "strategy": "channel"},
    "fp8-tensor-static": {"method": "fp8", "strategy": "tensor"},
}
out = {}
for spec in sys.argv[2:]:
    name, calib, ntok, how = spec.split(":")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        kw = {} if calib == "default" else {"calibration": calib, "calibration_tokens": int(ntok)}
        d = quantize_checkpoint(M, Path(tmp) / "q", **HOW[how], **kw)
        tq = time.time() - t0
        llm = LLM(d, backend="reference", dtype="bfloat16", max_batch_size=1, max_seq_len=512, progress=False, kv_cache="contiguous")
        res = {}
        for p, f in PASS.items():
            ids = list(llm.tokenizer.encode(Path(f).read_text().strip()).ids)
            res[p] = round(abs(mean_logprob(llm, ids) - BASE[p]) / abs(BASE[p]) * 100, 2)
        llm.close()
    out[name] = res
    print(name, f"quantized {tq:.0f}s", res, flush=True)
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
