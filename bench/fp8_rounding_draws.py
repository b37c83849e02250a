"""How far does the quality measure move with FP8's rounding draw alone? (CPU, reference backend.)

Issue 10 holds FP8 to 1% of the bfloat16 engine's mean log-probability on one passage. Per-tensor
FP8 scores 0.03-0.12% there, per-channel 1.98-2.55%, though per-channel scales cannot round the
weights worse (E4M3's relative precision does not depend on the scale, and the weights' relative
error is the same 2.63% either way, ``bench/results/cpu-2026-12-03-passage-noise``). This script
redraws the rounding without changing the method: every scale ``s`` (per tensor or per row) is
multiplied by ``1 + d`` for a few small ``d`` and the float16 weights are quantized again with
it (``e4m3(w / (s (1 + d)))``: the largest value lands a little below 448, which costs nothing of
E4M3's relative precision), dynamic activations. Each draw is an equally valid FP8 checkpoint of
the same method; the spread of their scores is the measure's noise for this model and passage.

    python bench/fp8_rounding_draws.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out DIR [--draws 0,0.015625,0.03125,0.046875]
    python bench/fp8_rounding_draws.py --model ~/.cache/trtcore/models/SmolLM2-135M-Instruct --out DIR \
        --activations static --passage tests/data/passage.txt bench/data/passage-river.txt bench/data/passage-kitchen.txt

``--activations static``: calibrated input scales (``trtcore quantize --method fp8``'s default;
trtcore's calibration text), the same in every draw. ``--passage``: several texts scored on each
draw (default: the quality passage).

Writes ``fp8_rounding_draws.json`` under ``--out``: strategy -> d -> mean log-prob and its relative
difference from bfloat16's on the first passage, and ``passages``: the same for each passage.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_quality import PASSAGE, mean_logprob  # noqa: E402


def redraw(fp8_dir: Path, dense_dir: Path, out_dir: Path, d: float) -> Path:
    """``fp8_dir`` (an FP8 compressed-tensors checkpoint quantized from ``dense_dir``) copied to
    ``out_dir`` with every linear quantized again from its float weight with scales times ``1 + d``."""
    import torch
    from safetensors.torch import load_file, save_file

    from trtcore.checkpoint import Checkpoint
    from trtcore.fp8 import quantize

    shutil.copytree(fp8_dir, out_dir)
    tensors = load_file(str(out_dir / "model.safetensors"))
    with Checkpoint(dense_dir) as dense:
        for name in [n for n in tensors if n.endswith(".weight_scale")]:
            w = np.asarray(dense.get(name.removesuffix("_scale")), np.float64)
            s = (tensors[name].float().numpy().reshape(-1, 1) * (1 + d)).astype(np.float32)
            codes = quantize(w, s)
            tensors[name.removesuffix("_scale")] = torch.from_numpy(codes).view(torch.float8_e4m3fn)
            tensors[name] = torch.from_numpy(s.reshape(tensors[name].shape))
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", help="SmolLM2-135M-Instruct.Q4_1.gguf")
    src.add_argument("--model", type=Path, help="instead of --gguf: the float16 folder trtcore converted it into")
    ap.add_argument("--out", default=".")
    ap.add_argument("--draws", default="0,0.015625,0.03125,0.046875", help="comma-separated d (scales times 1 + d)")
    ap.add_argument("--activations", choices=["dynamic", "static"], default="dynamic", help="FP8 activation scales (static: calibrated)")
    ap.add_argument("--passage", type=Path, nargs="+", default=[PASSAGE], help="texts scored on each draw (the first is the headline)")
    args = ap.parse_args()
    from trtcore import LLM
    from trtcore.gguf_convert import convert_gguf
    from trtcore.quantizer import quantize_checkpoint

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    texts = {str(p): p.read_text().strip() for p in args.passage}
    results: dict[str, Any] = {"activations": args.activations, "passage_files": list(texts)}

    def score(d: Path) -> dict[str, float]:
        llm = LLM(d, backend="reference", dtype="bfloat16", max_batch_size=1, max_seq_len=512, progress=False, kv_cache="contiguous")
        lps = {f: mean_logprob(llm, list(llm.tokenizer.encode(t).ids)) for f, t in texts.items()}
        llm.close()
        return lps

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dense = args.model if args.model else convert_gguf(args.gguf, root / "float16", progress=False)
        base = score(dense)
        first = next(iter(texts))
        results["bfloat16"] = base[first]
        results["bfloat16_passages"] = base
        print("bfloat16 " + "  ".join(f"{lp:.6f}" for lp in base.values()), flush=True)
        for strategy in ("tensor", "channel"):
            q = quantize_checkpoint(dense, root / strategy, method="fp8", strategy=strategy, activations=args.activations)
            for d in map(float, args.draws.split(",")):
                t0 = time.perf_counter()
                lps = score(redraw(q, dense, root / f"{strategy}-{d}", d) if d else q)
                each = {f: {"mean_logprob": lp, "rel_diff": abs(lp - base[f]) / abs(base[f])} for f, lp in lps.items()}
                results.setdefault(strategy, {})[str(d)] = {**each[first], "passages": each}
                print(
                    f"{strategy:8} d={d:<9g} "
                    + "  ".join(f"{e['mean_logprob']:.6f} {e['rel_diff'] * 100:.2f}%" for e in each.values())
                    + f"  ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
                (out / "fp8_rounding_draws.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
