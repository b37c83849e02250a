"""Decode tokens/s of a Mixtral-shaped mixture-of-experts model on ``LLM(backend="cuda")`` next
to transformers' ``generate`` in the same process, on random bfloat16 weights.

The shape is Mixtral-8x7B's (hidden 4096, 8 experts of intermediate 14336, top-2 routing, 32/8
heads, vocabulary 32000) with ``--layers`` decoder layers (default 4, about 11.5 GB). For each
batch (default 1, 8, 32): ``batch`` random prompts of 128 tokens, greedy, 128 new tokens,
through the whole API (:func:`bench_e2e.trtcore_tpot`: TPOT = (time of 128 new tokens - time of
1) / 127, tok/s = batch / TPOT). transformers runs ``MixtralForCausalLM`` with random bfloat16
weights the same way (static cache, as ``bench_engine.hf_tpot``; ``--hf-cache dynamic`` when the
static cache's compilation is not wanted). At batch 1 the weight-streaming limit is what one
step must read (attention, the router, two experts per layer, the LM head) over the device copy
bandwidth measured here.

    python bench/bench_moe.py --out $OUT [--layers 4] [--batches 1,8,32] [--no-hf]

Writes ``moe.json`` under ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: Mixtral-8x7B's shape (its config.json fields that matter), layers set by --layers
MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "rope_theta": 1e6,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def active_bytes(shape: dict[str, Any]) -> int:
    """bfloat16 bytes one decode step of one token reads: per layer q/k/v/o, the router and
    ``num_experts_per_tok`` experts (gate, up, down); the LM head."""
    e, i, h, kv = shape["hidden_size"], shape["intermediate_size"], shape["num_attention_heads"], shape["num_key_value_heads"]
    d = e // h
    attn = e * (h * d) * 2 + e * (kv * d) * 2
    per_layer = attn + shape["num_local_experts"] * e + shape["num_experts_per_tok"] * 3 * e * i
    return 2 * (shape["num_hidden_layers"] * per_layer + shape["vocab_size"] * e)


def hf_mixtral_tpot(shape: dict[str, Any], batch: int, cache: str, prompt: int = 128, new: int = 128) -> dict[str, Any]:
    """transformers' ``MixtralForCausalLM.generate`` (random bfloat16 weights on the GPU), TPOT
    measured as :func:`bench_e2e.trtcore_tpot` does, after a warm-up of the same lengths."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    fields = {k: v for k, v in shape.items() if k not in ("architectures", "model_type", "rope_theta")}
    config = MixtralConfig(**fields, rope_parameters={"rope_type": "default", "rope_theta": shape["rope_theta"]})
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = MixtralForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)
    ids = torch.randint(3, config.vocab_size, (batch, prompt), device="cuda")
    kwargs: dict[str, Any] = {"cache_implementation": "static"} if cache == "static" else {}

    def timed(n: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0, **kwargs)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    t0 = time.perf_counter()
    timed(new), timed(1)
    warmup = time.perf_counter() - t0
    one = statistics.median(timed(1) for _ in range(3))
    full = statistics.median(timed(new) for _ in range(2))
    model.to("meta")
    gc.collect()
    torch.cuda.empty_cache()
    tpot = (full - one) / (new - 1) * 1e3
    return {"tpot_ms": tpot, "tok_per_s": batch * 1e3 / tpot, "warmup_s": warmup, "cache": cache}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers")
    ap.add_argument("--hf-cache", choices=("static", "dynamic"), default="static")
    args = ap.parse_args()
    import cupy as cp
    from bench_e2e import _free_gpu, random_checkpoint, trtcore_tpot
    from bench_engine import copy_bandwidth

    from trtcore import LLM

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = {**MIXTRAL_8X7B, "num_hidden_layers": args.layers}
    batches = [int(b) for b in args.batches.split(",")]
    bw = copy_bandwidth(cp)
    _free_gpu()
    results: dict[str, Any] = {"shape": shape, "copy_bandwidth_Bps": bw, "active_bytes_per_token": active_bytes(shape), "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "mixtral"
        d.mkdir()
        (d / "config.json").write_text(json.dumps({**shape, "torch_dtype": "bfloat16"}))
        t0 = time.perf_counter()
        with random_checkpoint():
            llm = LLM(d, backend="cuda", dtype="bfloat16", max_batch_size=max(batches), max_seq_len=256, max_num_tokens=max(batches) * 128, progress=False)
        results["start_s"] = time.perf_counter() - t0
        print(f"Mixtral-8x7B shape, {args.layers} layers: started in {results['start_s']:.1f} s", flush=True)
        for batch in batches:
            ours = trtcore_tpot(llm, batch)
            entry: dict[str, Any] = {"batch": batch, "trtcore": ours}
            if batch == 1:
                entry["streaming_limit_ms"] = results["active_bytes_per_token"] / bw * 1e3
            results["runs"].append(entry)
            print(f"  batch {batch}: TPOT {ours['tpot_ms']:.3f} ms, {ours['tok_per_s']:.0f} tok/s", flush=True)
            (out / "moe.json").write_text(json.dumps(results, indent=1, default=str))
        llm.close()
        del llm
        _free_gpu()
    if not args.no_hf:
        for entry in results["runs"]:
            try:
                entry["transformers"] = hf_mixtral_tpot(shape, entry["batch"], args.hf_cache)
            except Exception as exc:  # noqa: BLE001 - report the peer's failure, keep trtcore's numbers
                entry["transformers"] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
                print(f"  batch {entry['batch']}: transformers failed: {entry['transformers']['error']}", flush=True)
                continue
            entry["ratio"] = entry["transformers"]["tpot_ms"] / entry["trtcore"]["tpot_ms"]
            print(f"  batch {entry['batch']}: transformers TPOT {entry['transformers']['tpot_ms']:.3f} ms, ratio {entry['ratio']:.2f}x", flush=True)
            (out / "moe.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"\n{'batch':>5} {'TPOT ms':>9} {'tok/s':>9} {'HF TPOT':>9} {'HF tok/s':>9} {'ratio':>6} {'limit ms':>9}")
    for e in results["runs"]:
        hf = e.get("transformers", {})
        print(
            f"{e['batch']:>5} {e['trtcore']['tpot_ms']:>9.3f} {e['trtcore']['tok_per_s']:>9.0f} {hf.get('tpot_ms', float('nan')):>9.3f} "
            f"{hf.get('tok_per_s', float('nan')):>9.0f} {e.get('ratio', float('nan')):>6.2f} {e.get('streaming_limit_ms', float('nan')):>9.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
