"""Per-linear output error of 4-bit GPTQ against RTN on held-out text (CPU, reference backend).

For a few decoder layers of a float Llama-family checkpoint: each linear's Hessian from the
inputs of trtcore's calibration text (as ``trtcore quantize --method gptq`` builds it), then the
relative output error ``||X (Q(W) - W)^T|| / ||X W^T||`` of RTN and of GPTQ at several dampings,
on those calibration inputs, on held-out inputs (other passages), and on the held-out inputs
split into each passage's first token (the attention sink that every later token reads in
these layers) and the others. It measures each linear
alone, on the float model's inputs; ``bench/quant_quality.py`` scores the whole quantized model::

    python bench/gptq_layer_error.py --model ~/.cache/trtcore/models/SmolLM2-135M-Instruct --group-size 64 \\
        --held-out bench/data/passage-river.txt bench/data/passage-kitchen.txt --out gptq_layer_error-g64.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="float Llama-family model folder (with tokenizer.json)")
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--layers", default="0,8,16,24,29", help="comma-separated layer indices")
    ap.add_argument("--damping", default="0.01,0.1,1.0", help="comma-separated dampening fractions")
    ap.add_argument("--held-out", nargs="+", type=Path, required=True, help="text files, each one sequence")
    ap.add_argument("--calibration", type=Path, help="calibration text (default: trtcore's own)")
    ap.add_argument("--calibration-tokens", type=int, help="calibration tokens in all (default: trtcore's, DEFAULT_CALIBRATION_TOKENS)")
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = ap.parse_args()
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    from trtcore.awq import LLAMA_SCALE_GROUPS
    from trtcore.calibration import DEFAULT_CALIBRATION_TOKENS, capture_calibration
    from trtcore.families import family_of
    from trtcore.gptq import gptq_quantize, hessian, inverse_hessian_factor
    from trtcore.quantizer import group_params, quantize_rtn

    model = Path(args.model).expanduser()
    layers = [int(i) for i in args.layers.split(",")]
    damps = [float(d) for d in args.damping.split(",")]
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    held = [tok.encode(p.read_text().strip()).ids for p in args.held_out]

    def select(config: Any, present: set[str]) -> list[str]:
        return [g.input.format(i=i) for i in layers for g in LLAMA_SCALE_GROUPS if g.input.format(i=i) in present]

    config, cal, _ = capture_calibration(model, select, args.calibration, args.calibration_tokens or DEFAULT_CALIBRATION_TOKENS)
    _, ho, _ = capture_calibration(model, select, token_ids=held)
    later = np.ones(sum(len(h) for h in held), bool)
    later[np.cumsum([0] + [len(h) for h in held[:-1]])] = False  # each passage's first token
    fam = family_of(config.model_type)
    weights = load_file(str(model / "model.safetensors"))
    rows = []
    totals: dict[str, float] = {}
    for i in layers:
        for g in LLAMA_SCALE_GROUPS:
            xc, xh = cal[g.input.format(i=i)], ho[g.input.format(i=i)]
            h = hessian(xc)
            factors = {d: inverse_hessian_factor(h, d) for d in damps}
            for role in g.linears:
                w = weights[fam.tensor(role, i, ".weight")].astype(np.float64)
                deq = {"rtn": quantize_rtn(w, 4, args.group_size, False).dequantize()}
                for d, u in factors.items():
                    deq[f"gptq-{d:g}"] = gptq_quantize(w, u, lambda gg: group_params(gg, 4, False), 4, args.group_size, False).dequantize()
                row: dict[str, Any] = {"layer": i, "linear": role, "K": int(w.shape[1])}
                for name, q in deq.items():
                    for where, x in (
                        ("calibration", xc),
                        ("held_out", xh),
                        ("held_out_first_tokens", xh[~later]),
                        ("held_out_later_tokens", xh[later]),
                    ):
                        rel = float(np.linalg.norm(x @ (q - w).T) / np.linalg.norm(x @ w.T))
                        row[f"{name}/{where}"] = rel
                        totals[f"{name}/{where}"] = totals.get(f"{name}/{where}", 0.0) + rel**2
                rows.append(row)
                print(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    summary = {k: float(np.sqrt(v / len(rows))) for k, v in totals.items()}
    print("RMS over linears of the relative output error:", json.dumps(summary, indent=1))
    meta = {"model": str(model), "group_size": args.group_size, "calibration": str(args.calibration) if args.calibration else None}
    meta["calibration_tokens"] = int(next(iter(cal.values())).shape[0])
    args.out.write_text(json.dumps({**meta, "held_out": [str(p) for p in args.held_out], "rms": summary, "linears": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
