import sys, json, time, tempfile
from pathlib import Path
sys.path.insert(0, "/work/main/bench")
from quant_quality import mean_logprob
from trtcore import LLM
from trtcore.quantizer import quantize_checkpoint
M = Path.home() / ".cache/trtcore/models/SmolLM2-135M-Instruct"
BASE = {"passage": -3.0247, "river": -3.3068, "kitchen": -3.1578}
PASS = {"passage": "/work/main/tests/data/passage.txt", "river": "/work/main/bench/data/passage-river.txt", "kitchen": "/work/main/bench/data/passage-kitchen.txt"}
out = {}
for spec in sys.argv[2:]:
    name, calib, ntok, method, gs = spec.split(":")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        kw = {} if calib == "default" else {"calibration": calib, "calibration_tokens": int(ntok)}
        d = quantize_checkpoint(M, Path(tmp) / "q", method=method, bits=4, group_size=int(gs), **kw)
        tq = time.time() - t0
        llm = LLM(d, backend="reference", dtype="bfloat16", max_batch_size=1, max_seq_len=512, progress=False, kv_cache="contiguous")
        res = {}
        for p, f in PASS.items():
            ids = list(llm.tokenizer.encode(Path(f).read_text().strip()).ids)
            lp = mean_logprob(llm, ids)
            res[p] = round(abs(lp - BASE[p]) / abs(BASE[p]) * 100, 2)
        llm.close()
    out[name] = res
    print(name, f"quantized {tq:.0f}s", res, flush=True)
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
