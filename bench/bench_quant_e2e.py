"""End-to-end decode of a model shape with weight-only quantized linears against the bfloat16
engine, in one run: ``LLM(backend="cuda")`` on random weights, prompt 128, 128 new tokens,
greedy (``bench_e2e.trtcore_tpot``), batch 1 and 16.

Variants: bfloat16 (:class:`trtcore.cuda.synthetic.RandomWeights`), W4A16 group 128 and W8A16
per channel (:class:`~trtcore.cuda.synthetic.RandomQuantizedWeights`: the decoder's seven
linear layers quantized, embeddings, norms and ``lm_head`` bfloat16, as published GPTQ / AWQ
checkpoints; ``+ lm_head``: the ``lm_head`` 4-bit too, as GPTQModel's ``lm_head=True`` and
gpt-fast's int4; the weights packed in the contiguous-x K order, ``weight_only_gemm.CONTIGUOUS_X``,
the default; ``, natural order``: in the natural one; ``, SwiGLU unfused``: built without
:mod:`trtcore.cuda.swiglu_fusion`, so SwiGLU runs as a kernel of its own; ``, RoPE fused``: built
with :mod:`trtcore.cuda.rope_fusion`, off by default, so q/k/v's GEMM rotates q and k; ``, add+norm
fused``: built with :mod:`trtcore.cuda.add_norm_fusion`, off by default, so o_proj's and down_proj's
GEMV add the residual and normalize in their last block instead of a row kernel; ``, norm in
GEMV``: built with :mod:`trtcore.cuda.norm_input_fusion`, so o_proj's and down_proj's GEMV add the
residual in their epilogue and the GEMVs after them (q/k/v, gate/up, lm_head) fold the RMSNorm into
their x and output (``NORM_X``): no row kernel in the step; ``, attention
unsplit``: the paged attention plugin's ``TUNING["splits"] = 1`` for the variant's life, so decode
attention runs one slice per sequence and no reduction kernel; ``, attention 4 splits``: 4 slices
of at least 64 keys, ``min_keys_per_split`` 64 (what the split rule itself takes at batch 1 and
``max_seq_len`` 256 since its few-CTA case; 2 before);
``, few-CTA splits off``: the split rule without its few-CTA case, ``TUNING["few_cta_splits"] = 1``;
``, decode rule off``: the 4-bit decode GEMVs without ``weight_only_gemm.DECODE_RULE``'s choices),
FP8 W8A8 with per-tensor weight scales
(one per packed module) and static or dynamic activation scales, or (``channel``) per-channel
weight scales; the cuda engine fuses q/k/v and gate/up in both
(:class:`~trtcore.cuda.synthetic.RandomFp8Weights`: the ``trtcore_fp8_gemm`` plugin, cuBLASLt's
FP8 GEMM). Reported: TPOT, tok/s, the weight pool's bytes and the ratio of tok/s to the
bfloat16 engine's. The issue's targets: W4A16 at batch 1 on the Llama-3-8B shape at least 2.5x
the bfloat16 engine's tok/s; FP8 throughput (256 requests, 128 in / 128 out) at least 1.5x
bfloat16's (``--throughput 256``: every variant also streams that many requests through
continuous batching, ``trtcore bench throughput``'s measurement, and reports output tok/s).

    python bench/bench_quant_e2e.py --out $OUT [--models Llama-3-8B] [--batches 1,16]
    python bench/bench_quant_e2e.py --out $OUT --variants bfloat16,"FP8 W8A8 static" --batches 1 --throughput 256
    python bench/bench_quant_e2e.py --out $OUT --rope attention ...   # RoPE inside the attention plugin

Writes ``quant_e2e.json`` under ``--out`` and prints it (one line after ``JSON:``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_e2e import _free_gpu, _model_dir, random_checkpoint, trtcore_tpot  # noqa: E402

#: (label, bits, group_size (0: per channel; negative: lm_head quantized too)); bits 16: bfloat16;
#: bits "fp8": W8A8 FP8, group_size 1 static / 0 dynamic activations
VARIANTS: list[tuple[str, Any, int]] = [
    ("bfloat16", 16, 0),
    ("W4A16 g128", 4, 128),
    ("W4A16 g128 + lm_head", 4, -128),  # lm_head 4-bit too (GPTQModel's lm_head=True; gpt-fast's int4)
    ("W4A16 g128 + lm_head, natural order", 4, -128),  # packed in the natural K order (no CONTIG_X)
    ("W4A16 g128 + lm_head, SwiGLU unfused", 4, -128),  # TRTCORE_SWIGLU_FUSION=0 while it builds: the SwiGLU kernel of its own
    ("W4A16 g128 + lm_head, RoPE fused", 4, -128),  # TRTCORE_ROPE_FUSION=1 while it builds: RoPE in q/k/v's epilogue
    ("W4A16 g128 + lm_head, add+norm fused", 4, -128),  # TRTCORE_ADD_NORM_FUSION=1 while it builds: add + RMSNorm in o_proj's / down's GEMV
    ("W4A16 g128 + lm_head, norm in GEMV", 4, -128),  # TRTCORE_NORM_INPUT_FUSION=1: the add in o_proj's / down's epilogue, the norm in the next GEMVs
    ("W4A16 g128 + lm_head, attention unsplit", 4, -128),  # paged_attention.TUNING["splits"] = 1: no split-KV, no reduction kernel
    ("W4A16 g128 + lm_head, add+norm fused, attention unsplit", 4, -128),  # both
    ("W4A16 g128 + lm_head, norm in GEMV, attention 4 splits", 4, -128),  # TUNING splits 4, min_keys_per_split 64
    ("W4A16 g128 + lm_head, attention 4 splits", 4, -128),  # TUNING splits 4, min_keys_per_split 64
    ("W4A16 g128 + lm_head, few-CTA splits off", 4, -128),  # paged_attention.TUNING["few_cta_splits"] = 1: the split rule before it
    ("W4A16 g128 + lm_head, decode rule off", 4, -128),  # weight_only_gemm.DECODE_RULE as before it: 1 warp a block at least, UNROLL 1
    ("W8A16 per-channel", 8, 0),
    ("FP8 W8A8 static", "fp8", 1),
    ("FP8 W8A8 static + FP8 KV", "fp8", 1),  # and kv_cache_dtype="fp8" (E4M3 KV pool, scales 1.0)
    ("FP8 W8A8 dynamic", "fp8", 0),
    # per-channel weight scales (trtcore quantize --method fp8's default): q/k/v and gate/up fuse
    ("FP8 W8A8 channel static", "fp8", 1),
    ("FP8 W8A8 channel static + FP8 KV", "fp8", 1),
]


def variant_labels(text: str) -> list[str]:
    """The labels of ``--variants``: comma-separated, where a label with a comma of its own
    (``W4A16 g128 + lm_head, natural order``) is taken whole, the longest known label first; an
    unknown piece is kept as it is (and reported)."""
    known = {v[0] for v in VARIANTS}
    parts, labels, i = text.split(","), [], 0
    while i < len(parts):
        j = next((j for j in range(len(parts), i, -1) if ",".join(parts[i:j]) in known), i + 1)
        labels.append(",".join(parts[i:j]))
        i = j
    return labels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--models", default="Llama-3-8B")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--variants", default=",".join(v[0] for v in VARIANTS))
    ap.add_argument("--throughput", type=int, default=0, help="also stream this many requests (128 in / 128 out) per variant")
    ap.add_argument(
        "--throughput-runs",
        type=int,
        default=3,
        help="timed throughput runs per variant (after one warm-up): the median is reported, every run's tok/s kept",
    )
    ap.add_argument("--rope", default=None, choices=["plugin", "attention"], help="every variant's RoPE implementation (default: the plan's)")
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        help="also profile one sequence's decode steps (this many new tokens less one) per variant: GPU us per step per kernel kind",
    )
    ap.add_argument(
        "--profile-throughput",
        action="store_true",
        help="also profile one more throughput run per variant (torch.profiler): GPU ms by kernel kind against the wall time",
    )
    args = ap.parse_args()
    from trtcore import LLM
    from trtcore.cuda import synthetic
    from trtcore.plugins import paged_attention as pa
    from trtcore.plugins import weight_only_gemm as wog

    default_rule = dict(wog.DECODE_RULE)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    wanted = variant_labels(args.variants)
    unknown = [w for w in wanted if w not in {v[0] for v in VARIANTS}]
    if unknown:
        ap.error(f"unknown --variants {unknown}; known: {[v[0] for v in VARIANTS]}")
    results: dict[str, Any] = {"runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            d = _model_dir(Path(tmp), name)
            config = synthetic.config(name)
            base: dict[int, float] = {}
            base_tput = 0.0
            for label, bits, gs in sorted((v for v in VARIANTS if v[0] in wanted), key=lambda v: wanted.index(v[0])):  # in the order asked
                if bits == 16:
                    make = None
                elif bits == "fp8":

                    def make(gs: int = gs, strategy: str = "channel" if " channel " in label else "tensor") -> Any:
                        return synthetic.RandomFp8Weights(config, strategy, static=bool(gs), seed=1)

                else:

                    def make(bits: int = bits, gs: int = gs) -> Any:
                        return synthetic.RandomQuantizedWeights(config, bits, abs(gs), seed=1, lm_head=gs < 0)

                t0 = time.perf_counter()
                seqs = max([*batches, args.throughput])
                packing = wog.CONTIGUOUS_X
                wog.CONTIGUOUS_X = packing and not label.endswith("natural order")  # read when the weights are packed, at build
                # compile passes switched for this variant (the variables are read at each compile)
                switch = {
                    "SwiGLU unfused": ("TRTCORE_SWIGLU_FUSION", "0"),
                    "RoPE fused": ("TRTCORE_ROPE_FUSION", "1"),
                    "add+norm fused": ("TRTCORE_ADD_NORM_FUSION", "1"),
                    "norm in GEMV": ("TRTCORE_NORM_INPUT_FUSION", "1"),
                }
                parts = label.split(", ")[1:]
                env = dict(v for k, v in switch.items() if k in parts)
                before = {k: os.environ.get(k) for k in env}
                os.environ.update(env)
                # read at each enqueue (and so at graph capture): kept for the variant's life
                pa.TUNING["splits"] = 1 if "attention unsplit" in parts else 4 if "attention 4 splits" in parts else 0
                min_keys = pa.TUNING["min_keys_per_split"]
                pa.TUNING["min_keys_per_split"] = 64 if "attention 4 splits" in parts else min_keys
                few = pa.TUNING["few_cta_splits"]
                pa.TUNING["few_cta_splits"] = 1 if "few-CTA splits off" in parts else few
                # the decode GEMV's shape rule, read at each enqueue: as before it, or the default
                wog.DECODE_RULE.update({"min_warps": 1, "unroll2_max_warps": 0} if "decode rule off" in parts else default_rule)
                try:
                    with random_checkpoint(make):
                        llm = LLM(d, backend="cuda", dtype="bfloat16", max_batch_size=seqs, max_seq_len=256,
                                  kv_cache_dtype="fp8" if label.endswith("+ FP8 KV") else "auto", rope=args.rope,
                                  max_num_tokens=max(max(batches) * 128, 8192 if args.throughput else 0), progress=False)  # fmt: skip
                finally:
                    wog.CONTIGUOUS_X = packing
                    for k, v in before.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v
                start_s = time.perf_counter() - t0
                weight_bytes = int(llm.executor.device.pools.get("weights", 0))
                print(f"{name} {label}: started in {start_s:.1f} s, weights {weight_bytes / 2**30:.2f} GiB", flush=True)
                for batch in batches:
                    ours = trtcore_tpot(llm, batch)
                    entry = {
                        "model": name,
                        "variant": label,
                        "batch": batch,
                        "rope": llm.plan.rope,
                        "start_s": start_s,
                        "weight_bytes": weight_bytes,
                        **ours,
                    }
                    if bits == 16:
                        base[batch] = ours["tok_per_s"]
                    if batch in base:
                        entry["speedup_vs_bfloat16"] = ours["tok_per_s"] / base[batch]
                    results["runs"].append(entry)
                    print(
                        f"  batch {batch}: TPOT {ours['tpot_ms']:.3f} ms, {ours['tok_per_s']:.0f} tok/s, one-token generate {ours['ttft_ms']:.2f} ms, "
                        + (f"x{entry['speedup_vs_bfloat16']:.2f} vs bfloat16" if "speedup_vs_bfloat16" in entry else "no bfloat16 run to compare"),
                        flush=True,
                    )
                    (out / "quant_e2e.json").write_text(json.dumps(results, indent=1))
                if args.profile:
                    prof = profile_steps(llm, args.profile)
                    results.setdefault("profile", []).append({"model": name, "variant": label, **prof})
                    print(f"  decode step, GPU us by kernel kind ({prof['steps']} steps):", flush=True)
                    for kname, k in prof["kinds"].items():
                        print(f"    {kname:<30} {k['us_per_step']:8.1f} us {k['launches_per_step']:6.1f} launches", flush=True)
                    for t in prof["top_kernels"][:12]:
                        print(f"      {t['us_per_step']:8.1f} us {t['launches_per_step']:5.1f}x  {t['name'][:100]}", flush=True)
                    line = prof["timeline"]
                    if line:
                        print(
                            f"  one step: {len(line)} kernels, {line[-1]['start_us'] + line[-1]['span_us']:.1f} us first start to last end, "
                            f"{sum(r['exclusive_us'] for r in line):.1f} us busy, {sum(r['gap_us'] for r in line):.1f} us idle",
                            flush=True,
                        )
                    (out / "quant_e2e.json").write_text(json.dumps(results, indent=1))
                if args.throughput:
                    tput = throughput(llm, args.throughput, runs=args.throughput_runs)
                    entry = {"model": name, "variant": label, "requests": args.throughput, "rope": llm.plan.rope, **tput}
                    if bits == 16:
                        base_tput = tput["output_throughput"]
                    entry["throughput_vs_bfloat16"] = tput["output_throughput"] / base_tput if base_tput else None
                    results.setdefault("throughput", []).append(entry)
                    print(
                        f"  {args.throughput} requests 128/128: {tput['output_throughput']:.0f} output tok/s, x{entry['throughput_vs_bfloat16'] or float('nan'):.2f} vs bfloat16"
                        f" (median of {' / '.join(f'{t:.0f}' for t in tput['output_throughput_runs'])})",
                        flush=True,
                    )
                    (out / "quant_e2e.json").write_text(json.dumps(results, indent=1))
                    if args.profile_throughput:
                        prof = profile_throughput(llm, args.throughput)
                        results.setdefault("throughput_profile", []).append({"model": name, "variant": label, **prof})
                        print(
                            f"  throughput run profiled: wall {prof['wall_ms']:.0f} ms, kernels {prof['gpu_ms']:.0f} ms "
                            f"({prof['gpu_ms'] / prof['wall_ms']:.0%} of the wall; PDL spans overlap, exclusive times do not)",
                            flush=True,
                        )
                        for kname, k in prof["kinds"].items():
                            print(
                                f"    {kname:<30} {k['ms']:8.1f} ms spans {k['exclusive_ms']:8.1f} ms exclusive {k['launches']:7d} launches",
                                flush=True,
                            )
                        for t in prof["top_kernels"][:15]:
                            print(f"      {t['ms']:8.1f} ms {t['exclusive_ms']:8.1f} ms {t['launches']:6d}x  {t['name'][:100]}", flush=True)
                        (out / "quant_e2e.json").write_text(json.dumps(results, indent=1))
                llm.close()
                del llm
                pa.TUNING["splits"] = 0
                pa.TUNING["min_keys_per_split"] = min_keys
                pa.TUNING["few_cta_splits"] = few
                _free_gpu()
    print("JSON:", json.dumps(results))
    return 0


def profile_steps(llm: Any, new: int, prompt: int = 128) -> dict[str, Any]:
    """Where a batch-1 decode step's GPU time goes: the kernels (``torch.profiler``, CUPTI: those
    replayed from CUDA graphs too) of one greedy sequence with ``new`` tokens minus those of one
    with 1 token (the prefill and the first token), divided by the ``new - 1`` decode steps, per
    kernel kind (``profile_kernels.kind``) and per kernel name. With programmatic dependent
    launch a kernel's span includes its wait for the previous kernel, so the spans add up only
    with ``TRTCORE_CUDA_PDL=0``."""
    import numpy as np
    import torch
    from profile_kernels import kernel_spans, kernel_times, kind
    from torch.profiler import ProfilerActivity, profile

    from trtcore import SamplingParams

    rng = np.random.default_rng(7)
    ids = [int(t) for t in rng.integers(3, llm.config.vocab_size, size=prompt)]

    spans: list[tuple[str, float, float]] = []

    def times(n: int) -> dict[str, list[float]]:
        llm.generate([ids], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))  # warm
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            llm.generate([ids], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
            torch.cuda.synchronize()
        spans[:] = kernel_spans(prof)
        return kernel_times(prof)

    one, many = times(1), times(new)
    steps = new - 1
    names = {}
    for name, t in many.items():
        base = one.get(name, [])
        names[name] = {"kind": kind(name), "us_per_step": (sum(t) - sum(base)) * 1e3 / steps, "launches_per_step": (len(t) - len(base)) / steps}
    kinds: dict[str, dict[str, float]] = {}
    for v in names.values():
        k = kinds.setdefault(v["kind"], {"us_per_step": 0.0, "launches_per_step": 0.0})
        k["us_per_step"] += v["us_per_step"]
        k["launches_per_step"] += v["launches_per_step"]
    top = sorted(({"name": n[:160], **v} for n, v in names.items()), key=lambda r: -r["us_per_step"])[:25]
    return {
        "steps": steps,
        "pdl": os.environ.get("TRTCORE_CUDA_PDL", "1") != "0",
        "gpu_us_per_step": sum(k["us_per_step"] for k in kinds.values()),
        "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1]["us_per_step"])),
        "top_kernels": top,
        "timeline": step_timeline(spans),
    }


def step_timeline(spans: list[tuple[str, float, float]]) -> list[dict[str, Any]]:
    """One decode step kernel by kernel: the launches after the middle ``sampling_step`` kernel
    of a profiled sequence up to and including the next one (a step ends with its sampling), each
    with its span's start relative to the step's first kernel, its span, its exclusive time
    (``profile_kernels.exclusive_times``: the part after every earlier span ended) and the idle
    gap before it, microseconds; ``[]`` when the sequence had fewer than two sampling kernels."""
    from profile_kernels import exclusive_walk

    ordered = sorted(spans, key=lambda s: (s[1], s[2]))
    ends = [i for i, (name, _, _) in enumerate(ordered) if name.startswith("sampling_step")]
    if len(ends) < 3:
        return []
    mid = len(ends) // 2
    step = ordered[ends[mid - 1] + 1 : ends[mid] + 1]
    t0 = step[0][1]
    return [
        {"name": name[:120], "start_us": start - t0, "span_us": end - start, "exclusive_us": exclusive, "gap_us": gap}
        for name, start, end, exclusive, gap in exclusive_walk(step, frontier=ordered[ends[mid - 1]][2])
    ]


def profile_throughput(llm: Any, requests: int, input_len: int = 128, output_len: int = 128) -> dict[str, Any]:
    """One more :func:`throughput` run (after the measured ones, so warm) under
    ``torch.profiler`` (``profile_kernels.profiled_run``): its wall milliseconds (profiler
    overhead in) and the kernels' GPU milliseconds by kind (spans, and exclusive times that do
    not overlap under PDL), to tell GPU-bound from host-bound and which kernels a variant
    speeds up."""
    import numpy as np
    from profile_kernels import profiled_run

    from trtcore.bench import _prompts

    prompts = _prompts(np.random.default_rng(0), requests, input_len, llm.config.vocab_size)
    wall, _, (total, kinds, top) = profiled_run(llm, prompts, output_len)
    return {"wall_ms": wall * 1e3, "gpu_ms": total, "kinds": kinds, "top_kernels": top}


def throughput(llm: Any, requests: int, input_len: int = 128, output_len: int = 128, runs: int = 3) -> dict[str, Any]:
    """``requests`` random prompts of ``input_len`` tokens streamed to ``output_len`` new tokens
    each through continuous batching, after one warm-up run (``trtcore bench throughput``'s
    measurement: :func:`trtcore.bench._timed_run`), ``runs`` times: the metrics of the run with
    the median output tok/s, and every run's in ``output_throughput_runs`` (one run of the FP8
    engine moved by up to 15% between calls on the H200, bench/results/h200-2026-12-03-session12).

    Raises:
        ValueError: ``runs`` < 1.
    """
    import numpy as np

    from trtcore.bench import _prompts, _timed_run

    if runs < 1:
        raise ValueError(f"throughput runs must be >= 1, got {runs}")
    prompts = _prompts(np.random.default_rng(0), requests, input_len, llm.config.vocab_size)
    _timed_run(llm, prompts, output_len)
    done = sorted((_timed_run(llm, prompts, output_len) for _ in range(runs)), key=lambda r: r["output_throughput"])
    return {**done[(runs - 1) // 2], "output_throughput_runs": [r["output_throughput"] for r in done]}


if __name__ == "__main__":
    sys.exit(main())
