"""FP8's loss on the default model as a draw of E4M3 rounding: each FP8 checkpoint (per tensor,
per channel; static activation scales) re-rounded with its weight scales multiplied by a factor f
(1 = the checkpoint as trtcore quantize writes it; f > 1 changes which grid point each weight
rounds to, not the grid's relative step), scored like bench/quant_quality.py (mean log-probability
of the three passages, reference backend, bfloat16, against the bfloat16 engine's).

    python fp8_draws.py SRC_FLOAT_DIR FP8_TENSOR_DIR FP8_CHANNEL_DIR OUT_DIR QUANT_QUALITY_JSON

QUANT_QUALITY_JSON: a quant_quality.py result with the bfloat16 variant on the three passages
(its mean log-probabilities are the baselines). Each row keeps the mean log-probabilities and
the loss in percent.
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from quant_quality import mean_logprob  # noqa: E402

from trtcore import LLM  # noqa: E402
from trtcore.checkpoint import Checkpoint  # noqa: E402
from trtcore.fp8 import E4M3, quantize  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
PASSAGES = [ROOT / "tests/data/passage.txt", ROOT / "bench/data/passage-river.txt", ROOT / "bench/data/passage-kitchen.txt"]
FACTORS = [1.0, 1.0137, 1.0281, 1.0433]

src, dirs, out = Path(sys.argv[1]), {"tensor": Path(sys.argv[2]), "channel": Path(sys.argv[3])}, Path(sys.argv[4])
BASE = {Path(k).name: v["mean_logprob"] for k, v in json.loads(Path(sys.argv[5]).read_text())["variants"]["bfloat16"]["passages"].items()}
results = []
with Checkpoint(src) as fl:
    for strategy, d in dirs.items():
        with Checkpoint(d) as q:
            names = list(q.names)
            for f in FACTORS:
                with tempfile.TemporaryDirectory() as tmp:
                    tensors = {}
                    for n in names:
                        v = np.asarray(q.get(n))
                        if n.endswith(".weight") and n.replace(".weight", ".weight_scale") in names:
                            s = np.asarray(q.get(n.replace(".weight", ".weight_scale")), np.float32) * np.float32(f)
                            w = np.asarray(fl.get(n), np.float32)
                            tensors[n] = quantize(w, s.reshape(-1, 1) if s.size > 1 else s.reshape(())).view(E4M3)
                            tensors[n.replace(".weight", ".weight_scale")] = s
                        elif n not in tensors:
                            tensors[n] = v
                    save_file(tensors, str(Path(tmp) / "model.safetensors"))
                    for extra in d.iterdir():
                        if extra.name != "model.safetensors":
                            shutil.copy(extra, tmp)
                    llm = LLM(tmp, backend="reference", dtype="bfloat16", max_batch_size=1, max_seq_len=512, progress=False, kv_cache="contiguous")
                    row = {"strategy": strategy, "factor": f}
                    for p in PASSAGES:
                        ids = list(llm.tokenizer.encode(p.read_text().strip()).ids)
                        lp = mean_logprob(llm, ids)
                        row[f"{p.name} mean_logprob"] = lp
                        row[p.name] = 100 * (BASE[p.name] - lp) / abs(BASE[p.name])
                    llm.close()
                    results.append(row)
                    print(json.dumps(row), flush=True)
                    (out / "fp8_draws.json").write_text(json.dumps(results, indent=1))
