"""Quality of the quantized variants of the default model (SmolLM2-135M-Instruct, a Q4_1 GGUF):
the mean log-probability per token of a fixed English passage (``tests/data/passage.txt``),
teacher-forced, under each variant against the bfloat16 engine's, and a greedy continuation of
a prompt, on the reference backend (CPU; the weight-only GEMMs run their plugin's reference).

Variants:

* ``bfloat16``: the GGUF converted to float16 (``trtcore convert``), run in bfloat16: the baseline;
* ``gguf-q4_1``: the GGUF's own 4-bit blocks kept (``convert --keep-quantized``);
* ``rtn-w8-channel``: ``trtcore quantize --bits 8 --group-size 0 --symmetric`` of the float16 folder;
* ``rtn-w4-g64`` / ``rtn-w4-g32``: ``trtcore quantize --bits 4 --group-size 64 / 32``;
* ``awq-w4-g64`` / ``awq-w4-g32``: the same with ``--method awq`` (trtcore's own calibration
  text, ``trtcore/data/calibration.txt``, 4,096 tokens -- 433 before 2026-12-05 --: not the
  scored passages; ``--calibration`` / ``--calibration-tokens`` change it);
* ``rtn-mse-w4-g64`` / ``rtn-mse-w4-g32`` / ``awq-mse-w4-g64``: the same with ``--observer mse``
  (each group's range shrunk to minimize its error, GPTQ's / llm-compressor's MSE observer);
* ``fp8-channel-static``: ``trtcore quantize --method fp8`` (E4M3 weights with per-channel
  scales, activations with static per-tensor scales calibrated on the same tokens);
* ``fp8-tensor-dynamic``: ``--method fp8 --strategy tensor --activations dynamic`` (vLLM's
  on-the-fly ``quantization="fp8"``: one weight scale per tensor, activation scales per call);
* ``fp8-tensor-static``: ``--method fp8 --strategy tensor`` (per-tensor weight scales, static
  activation scales: the FP8 variant bench_quant_e2e.py's throughput runs);
* ``fp8-channel-dynamic``: ``--method fp8 --activations dynamic``;
* ``fp8-channel-token``: ``--method fp8 --activations token`` (llm-compressor's ``FP8_DYNAMIC``:
  per-channel weights, one activation scale per token per call);
* ``bfloat16-paged``: the bfloat16 weights scored through the paged KV cache (one teacher-forced
  token per step through the paged attention plugin): the baseline of the KV cache variants'
  path, which should equal ``bfloat16`` up to float32 summation order;
* ``kv-fp8``: the same with ``kv_cache_dtype="fp8"`` (vLLM's FP8 E4M3 KV cache; the converted
  GGUF has no ``k_scale`` / ``v_scale`` tensors, so every scale is vLLM's default 1.0);
* ``fp8-tensor-static-kv-fp8``: ``fp8-tensor-static``'s checkpoint through the FP8 KV cache
  (scales 1.0), and ``fp8-tensor-static-kv-calibrated``: ``--kv-cache-scales`` too, the same
  cache with each layer's calibrated ``k_scale`` / ``v_scale``.

The issue's bounds: within 5% (4-bit) and 1% (8-bit, FP8, the FP8 KV cache) of the bfloat16
engine's mean log-probability (bfloat16-paged: 0.5%, the same engine through another attention).

    python bench/quant_quality.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out $OUT
    python bench/quant_quality.py ... --passage bench/data/passage-river.txt   # another text: the noise of the measure
    python bench/quant_quality.py ... --passage tests/data/passage.txt bench/data/passage-river.txt \
        bench/data/passage-kitchen.txt --calibration bench/data/calibration-smollm2-generated.txt --calibration-tokens 4096
        # several texts scored on each variant (quantized once); another calibration text
    python bench/quant_quality.py --model ~/.cache/trtcore/models/SmolLM2-135M-Instruct \
        --variants bfloat16,bfloat16-paged,kv-fp8 --out $OUT      # the GGUF already converted
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

PASSAGE = Path(__file__).resolve().parent.parent / "tests" / "data" / "passage.txt"
PROMPT = "The history of the printing press"
#: (variant, bits: the bound's class, how it is made from the float16 folder)
VARIANTS: list[tuple[str, int, dict[str, Any] | None]] = [
    ("bfloat16", 16, None),
    ("gguf-q4_1", 4, None),
    ("rtn-w8-channel", 8, {"bits": 8, "group_size": 0, "symmetric": True}),
    ("rtn-w4-g64", 4, {"bits": 4, "group_size": 64}),
    ("rtn-w4-g32", 4, {"bits": 4, "group_size": 32}),
    ("awq-w4-g64", 4, {"method": "awq", "bits": 4, "group_size": 64}),
    ("awq-w4-g32", 4, {"method": "awq", "bits": 4, "group_size": 32}),
    ("gptq-w4-g64", 4, {"method": "gptq", "bits": 4, "group_size": 64}),
    ("gptq-w4-g32", 4, {"method": "gptq", "bits": 4, "group_size": 32}),
    ("gptq-w4-g64-damp0.1", 4, {"method": "gptq", "bits": 4, "group_size": 64, "dampening_frac": 0.1}),
    ("gptq-w4-g32-damp0.1", 4, {"method": "gptq", "bits": 4, "group_size": 32, "dampening_frac": 0.1}),
    ("gptq-w8-channel", 8, {"method": "gptq", "bits": 8, "group_size": 0, "symmetric": True}),
    ("rtn-mse-w4-g64", 4, {"bits": 4, "group_size": 64, "observer": "mse"}),
    ("rtn-mse-w4-g32", 4, {"bits": 4, "group_size": 32, "observer": "mse"}),
    ("awq-mse-w4-g64", 4, {"method": "awq", "bits": 4, "group_size": 64, "observer": "mse"}),
    ("fp8-channel-static", 8, {"method": "fp8", "strategy": "channel"}),
    ("fp8-tensor-dynamic", 8, {"method": "fp8", "strategy": "tensor", "activations": "dynamic"}),
    ("fp8-tensor-static", 8, {"method": "fp8", "strategy": "tensor"}),
    ("fp8-channel-dynamic", 8, {"method": "fp8", "strategy": "channel", "activations": "dynamic"}),
    ("fp8-channel-token", 8, {"method": "fp8", "strategy": "channel", "activations": "token"}),
    ("bfloat16-paged", 16, None),
    ("kv-fp8", 8, None),
    ("fp8-tensor-static-kv-fp8", 8, {"method": "fp8", "strategy": "tensor"}),
    ("fp8-tensor-static-kv-calibrated", 8, {"method": "fp8", "strategy": "tensor", "kv_cache_scales": True}),
]
#: variants scored through the paged cache (the bfloat16 weights where not quantized): their kv_cache_dtype
KV_VARIANTS = {"bfloat16-paged": "auto", "kv-fp8": "fp8", "fp8-tensor-static-kv-fp8": "fp8", "fp8-tensor-static-kv-calibrated": "fp8"}
#: 16: the bfloat16 engine through another attention path (bfloat16-paged), half the 8-bit bound
BOUNDS = {4: 0.05, 8: 0.01, 16: 0.005}


def mean_logprob(llm: Any, token_ids: list[int]) -> float:
    """Mean natural-log probability of ``token_ids[1:]``, each given the ones before
    (teacher-forced through the contiguous KV cache, float64 log-softmax)."""
    from trtcore.check import _trtcore_logits

    logits = _trtcore_logits(llm, token_ids[:1], token_ids[1:-1])
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(logp[np.arange(len(token_ids) - 1), token_ids[1:]].mean())


def mean_logprob_paged(llm: Any, token_ids: list[int]) -> float:
    """:func:`mean_logprob` through the paged KV cache (``llm.engine.kv_cache``, one sequence
    on blocks 0, 1, ...): token ``i`` is fed at position ``i`` as a one-token step, and the
    logits of that step score token ``i + 1``."""
    kv = llm.engine.kv_cache
    nblk = -(-len(token_ids) // kv.block_size)
    if nblk > kv.num_blocks:
        raise ValueError(f"the passage needs {nblk} KV blocks, the pool has {kv.num_blocks}")
    table = np.arange(nblk, dtype=np.int32)[None]

    class _Seq:
        num_new_tokens = 1

    class _Step:  # trtcore.kv_modes.StepBatch of one decode step
        seqs = [_Seq()]

        def __init__(self, tok: int, pos: int):
            self.tok, self.pos = tok, pos

        def input_ids(self) -> np.ndarray:
            return np.array([self.tok], np.int32)

        def positions(self) -> np.ndarray:
            return np.array([self.pos], np.int32)

        def block_tables(self) -> np.ndarray:
            return table

        def seq_lens(self) -> np.ndarray:
            return np.array([self.pos + 1], np.int32)

        def query_start_loc(self) -> np.ndarray:
            return np.array([0, 1], np.int32)

        def last_token_indices(self) -> np.ndarray:
            return np.array([0], np.int32)

    total = 0.0
    for i in range(len(token_ids) - 1):
        out = llm.executor.run(kv.feeds(_Step(token_ids[i], i)))
        logits = np.asarray(llm.executor.to_host(out["logits"], "logits")[0], np.float64)
        shifted = logits - logits.max()
        total += float(shifted[token_ids[i + 1]] - np.log(np.exp(shifted).sum()))
    return total / (len(token_ids) - 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", help="SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--model", help="instead of --gguf: the folder trtcore converted it into (float16; no gguf-q4_1 variant then)")
    ap.add_argument("--out", default=".")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--variants", default=",".join(v for v, _, _ in VARIANTS), help="comma-separated; the first is the baseline")
    ap.add_argument("--name", default="quant_quality", help="the JSON file's name (without .json)")
    ap.add_argument(
        "--passage",
        type=Path,
        nargs="+",
        default=[PASSAGE],
        help="the texts to score (default: the issue's passage, tests/data/passage.txt; others measure its noise); "
        "the JSON's top-level numbers are the first's, 'passages' holds each",
    )
    ap.add_argument("--calibration", type=Path, help="awq, gptq, fp8 variants: calibration text (default: trtcore's own)")
    ap.add_argument("--calibration-tokens", type=int, help="awq, gptq, fp8 variants: calibration tokens in all (default: trtcore's)")
    args = ap.parse_args()
    chosen = args.variants.split(",")
    unknown = sorted(set(chosen) - {v for v, _, _ in VARIANTS})
    if unknown:
        ap.error(f"unknown variants {unknown}")
    variants = [v for v in VARIANTS if v[0] in chosen]
    if (args.gguf is None) == (args.model is None) or ("gguf-q4_1" in chosen and args.gguf is None):
        ap.error("give --gguf, or --model without the gguf-q4_1 variant")
    from trtcore import LLM, SamplingParams
    from trtcore.gguf_convert import convert_gguf
    from trtcore.quantizer import quantize_checkpoint

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    passages = {str(f): f.read_text().strip() for f in args.passage}
    results: dict[str, Any] = {"passage_file": str(args.passage[0]), "passage_files": list(passages), "prompt": PROMPT, "variants": {}}
    results |= {"calibration": str(args.calibration) if args.calibration else None, "calibration_tokens_asked": args.calibration_tokens}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dense = Path(args.model) if args.model else convert_gguf(args.gguf, root / "float16", progress=False)
        dirs = {"bfloat16": dense, **{name: dense for name, _, how in VARIANTS if name in KV_VARIANTS and how is None}}
        if "gguf-q4_1" in chosen:
            dirs["gguf-q4_1"] = convert_gguf(args.gguf, root / "q4_1", progress=False, keep_quantized=True)
        calibration = {"calibration": args.calibration, "calibration_tokens": args.calibration_tokens}
        for name, _, how in variants:
            if how is not None:
                t0 = time.perf_counter()
                # the methods that read calibration text (FP8's dynamic and per-token activations refuse it)
                calibrated = how.get("method") in ("awq", "gptq") or (
                    how.get("method") == "fp8" and (how.get("activations") in (None, "static") or how.get("kv_cache_scales"))
                )
                dirs[name] = quantize_checkpoint(dense, root / name, **how, **(calibration if calibrated else {}))
                print(f"{name}: quantized in {time.perf_counter() - t0:.1f} s", flush=True)
        base: dict[str, float] = {}  # passage file -> the baseline's mean log-probability
        for name, bits, _ in variants:
            t0 = time.perf_counter()
            if name in KV_VARIANTS:
                kv_options: dict[str, Any] = {"kv_cache": "paged", "kv_cache_dtype": KV_VARIANTS[name]}
            else:
                kv_options = {"kv_cache": "contiguous"}
            llm = LLM(dirs[name], backend="reference", dtype="bfloat16", max_batch_size=1, max_seq_len=512, progress=False, **kv_options)
            scores: dict[str, dict[str, Any]] = {}
            for file, passage in passages.items():
                ids = list(llm.tokenizer.encode(passage).ids)  # tokenizers.Tokenizer
                lp = mean_logprob_paged(llm, ids) if name in KV_VARIANTS else mean_logprob(llm, ids)
                score: dict[str, Any] = {"mean_logprob": lp, "tokens": len(ids)}
                if file in base:
                    score["relative_difference"] = abs(lp - base[file]) / abs(base[file])
                    score["bound"] = BOUNDS[bits]
                    score["within_bound"] = score["relative_difference"] <= BOUNDS[bits]
                else:  # the first variant: the baseline
                    base[file] = lp
                scores[file] = score
                rel = f"{score['relative_difference'] * 100:.2f}% (bound {BOUNDS[bits] * 100:g}%)" if "bound" in score else "baseline"
                print(f"{name:16} {Path(file).name}: mean log-prob {lp:.4f} over {len(ids) - 1} tokens, {rel}", flush=True)
            [gen] = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=args.new_tokens))
            entry: dict[str, Any] = {**scores[str(args.passage[0])], "quantization": llm.quantization, "greedy": gen.outputs[0].text}
            entry |= {"kv_cache": llm.plan.kv_cache, "kv_cache_dtype": llm.plan.kv_cache_dtype, "passages": scores}
            entry["seconds"] = time.perf_counter() - t0
            results["variants"][name] = entry
            print(f"{name:16} greedy: {entry['greedy']!r}", flush=True)
            (out / f"{args.name}.json").write_text(json.dumps(results, indent=1))
            llm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
