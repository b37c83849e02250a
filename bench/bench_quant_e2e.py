"""End-to-end decode of a model shape with weight-only quantized linears against the bfloat16
engine, in one run: ``LLM(backend="cuda")`` on random weights, prompt 128, 128 new tokens,
greedy (``bench_e2e.trtcore_tpot``), batch 1 and 16.

Variants: bfloat16 (:class:`trtcore.cuda.synthetic.RandomWeights`), W4A16 group 128 and W8A16
per channel (:class:`~trtcore.cuda.synthetic.RandomQuantizedWeights`: the decoder's seven
linear layers quantized, embeddings, norms and ``lm_head`` bfloat16, as published GPTQ / AWQ
checkpoints). Reported: TPOT, tok/s, the weight pool's bytes and the ratio of tok/s to the
bfloat16 engine's. The issue's target: W4A16 at batch 1 on the Llama-3-8B shape at least 2.5x
the bfloat16 engine's tok/s.

    python bench/bench_quant_e2e.py --out $OUT [--models Llama-3-8B] [--batches 1,16]

Writes ``quant_e2e.json`` under ``--out`` and prints it (one line after ``JSON:``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import _free_gpu, _model_dir, random_checkpoint, trtcore_tpot  # noqa: E402

#: (label, bits, group_size (0: per channel)); bits 16: bfloat16
VARIANTS = [("bfloat16", 16, 0), ("W4A16 g128", 4, 128), ("W8A16 per-channel", 8, 0)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--models", default="Llama-3-8B")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--variants", default=",".join(v[0] for v in VARIANTS))
    args = ap.parse_args()
    from trtcore import LLM
    from trtcore.cuda import synthetic

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    wanted = args.variants.split(",")
    results: dict[str, Any] = {"runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            d = _model_dir(Path(tmp), name)
            config = synthetic.config(name)
            base: dict[int, float] = {}
            for label, bits, gs in [v for v in VARIANTS if v[0] in wanted]:
                if bits == 16:
                    make = None
                else:

                    def make(bits: int = bits, gs: int = gs) -> Any:
                        return synthetic.RandomQuantizedWeights(config, bits, gs, seed=1)

                t0 = time.perf_counter()
                with random_checkpoint(make):
                    llm = LLM(d, backend="cuda", dtype="bfloat16", max_batch_size=max(batches), max_seq_len=256,
                              max_num_tokens=max(batches) * 128, progress=False)  # fmt: skip
                start_s = time.perf_counter() - t0
                weight_bytes = int(llm.executor.device.pools.get("weights", 0))
                print(f"{name} {label}: started in {start_s:.1f} s, weights {weight_bytes / 2**30:.2f} GiB", flush=True)
                for batch in batches:
                    ours = trtcore_tpot(llm, batch)
                    entry = {"model": name, "variant": label, "batch": batch, "start_s": start_s, "weight_bytes": weight_bytes, **ours}
                    if bits == 16:
                        base[batch] = ours["tok_per_s"]
                    if batch in base:
                        entry["speedup_vs_bfloat16"] = ours["tok_per_s"] / base[batch]
                    results["runs"].append(entry)
                    print(
                        f"  batch {batch}: TPOT {ours['tpot_ms']:.3f} ms, {ours['tok_per_s']:.0f} tok/s, x{entry.get('speedup_vs_bfloat16', float('nan')):.2f} vs bfloat16",
                        flush=True,
                    )
                    (out / "quant_e2e.json").write_text(json.dumps(results, indent=1))
                llm.close()
                del llm
                _free_gpu()
    print("JSON:", json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
