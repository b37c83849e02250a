"""Where the GPU's time goes in ``trtcore bench throughput``: every CUDA kernel of one timed
run, grouped by kind, for bfloat16 and FP8 weights side by side (issue 10's FP8 throughput).

For each ``--quantization`` (``none`` = bfloat16, ``fp8``): random weights of ``--random-weights``
(``trtcore.bench``'s builder, the one ``trtcore bench throughput --random-weights`` uses), one
untimed run of ``--num-prompts`` requests (``--input-len`` prompt / ``--output-len`` output tokens,
greedy, EOS ignored), then the same run under ``torch.profiler`` (CUPTI records every kernel of
the process, those replayed from CUDA graphs and those of cuBLAS / cuBLASLt too). Kernel names
are grouped by :func:`kind` (GEMMs by library and precision, attention, RoPE, norms and other
generated kernels, sampling, FP8 quantization); the table gives each kind's GPU milliseconds and
share, and the run's output tokens/s without the profiler (the untimed run) beside the profiled
one.

    python bench/profile_kernels.py --out $OUT [--random-weights Llama-3-8B] [--num-prompts 256] [--max-num-tokens 8192]

Needs torch with CUDA (its profiler) and the cuda backend. Writes ``profile_kernels.json`` under
``--out`` (per run: tokens/s, kernel kinds, the 40 longest kernels by name) and prints the table.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

#: (kind, pattern of the kernel name), first match wins
KINDS = [
    # generated kernels first: their names end in a hex hash, which can spell "f8" (the FP8 GEMM rule)
    ("norm / row groups", r"^k_row_"),
    ("pointwise / other generated", r"^k_pointwise_|^k_gather_"),
    ("weight-only gemv / gemm", r"trtcore_wq_"),
    ("gemv (generated)", r"gemv"),
    ("fp8 quantize / scales", r"trtcore_fp8|quantiz"),
    ("gemm fp8 (cuBLASLt)", r"e4m3|f8|fp8|qqtst"),  # nvjet_sm90_qqtst_...: cuBLASLt 13 FP8 kernels
    ("gemm (cuBLAS/cuBLASLt)", r"gemm|xmma|cutlass|nvjet|sm90_|sm80_|ampere|hopper|splitK|splitk"),
    ("attention", r"paged_attn|paged_kv|attention|flash"),
    ("rope", r"rope|rotary"),
    ("sampling", r"sampling_"),
    ("norm / row groups", r"k_row_|row_group|rms|norm"),
    ("pointwise / other generated", r"pointwise|fused|gather|embed|copy|cast"),
]


def kind(name: str) -> str:
    """The kind of a kernel by its name (:data:`KINDS`), else ``"other"``."""
    low = name.lower()
    for k, pattern in KINDS:
        if re.search(pattern, low):
            return k
    return "other"


def kernel_spans(prof: Any) -> list[tuple[str, float, float]]:
    """The CUDA kernels of a finished ``torch.profiler.profile``: ``(name, start, end)`` of each
    launch on the GPU, microseconds."""
    import torch

    return [
        (ev.name, float(ev.time_range.start), float(ev.time_range.end))
        for ev in prof.events()
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time_total > 0
    ]


def exclusive_times(spans: list[tuple[str, float, float]]) -> dict[str, list[float]]:
    """Per name, each launch's *exclusive* milliseconds: the part of its span after every span
    that started before it ended (its own work once its predecessors are done). With
    programmatic dependent launch a kernel starts early and its span includes the wait for the
    previous kernel, so plain spans overlap and their sum exceeds the GPU's busy time; the
    exclusive times partition the busy time (one stream: spans in start order). A kernel wholly
    inside an earlier span gets 0."""
    out: dict[str, list[float]] = {}
    for name, _, _, exclusive, _ in exclusive_walk(spans):
        out.setdefault(name, []).append(exclusive / 1e3)
    return out


def exclusive_walk(spans: list[tuple[str, float, float]], frontier: float = float("-inf")) -> list[tuple[str, float, float, float, float]]:
    """``spans`` in start order as ``(name, start, end, exclusive, gap)``, microseconds: the part
    of each span after every earlier span (and ``frontier``, the end of what came before) ended,
    and the idle time before it (:func:`exclusive_times`)."""
    rows = []
    for name, start, end in sorted(spans, key=lambda s: (s[1], s[2])):
        rows.append((name, start, end, max(0.0, end - max(start, frontier)), max(0.0, start - frontier)))
        frontier = max(frontier, end)
    return rows


def kernel_times(prof: Any) -> dict[str, list[float]]:
    """The CUDA kernels of a finished ``torch.profiler.profile``: per name, each launch's GPU
    milliseconds."""
    import torch

    kernels: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time_total > 0:
            kernels.setdefault(ev.name, []).append(ev.device_time_total / 1e3)  # ms
    return kernels


def kernel_kinds(prof: Any) -> tuple[float, dict[str, dict[str, float]], list[dict[str, Any]]]:
    """The CUDA kernels of a finished ``torch.profiler.profile``: their GPU milliseconds in all,
    per :func:`kind` (``ms`` their spans, ``exclusive_ms`` (:func:`exclusive_times`), launches,
    share of the spans), and the 40 longest kernels by name."""
    return summarize(kernel_times(prof), exclusive_times(kernel_spans(prof)))


def summarize(kernels: dict[str, list[float]], exclusive: dict[str, list[float]]) -> tuple[float, dict[str, dict[str, float]], list[dict[str, Any]]]:
    """:func:`kernel_kinds` of per-name span and exclusive milliseconds."""
    kinds: dict[str, dict[str, float]] = {}
    for name, times in kernels.items():
        k = kinds.setdefault(kind(name), {"ms": 0.0, "exclusive_ms": 0.0, "launches": 0})
        k["ms"] += sum(times)
        k["exclusive_ms"] += sum(exclusive.get(name, []))
        k["launches"] += len(times)
    total = sum(k["ms"] for k in kinds.values())
    for k in kinds.values():
        k["share"] = k["ms"] / total if total else 0.0
    top = sorted(
        ({"name": n[:160], "ms": sum(t), "exclusive_ms": sum(exclusive.get(n, [])), "launches": len(t), "kind": kind(n)} for n, t in kernels.items()),
        key=lambda r: -r["ms"],
    )[:40]
    return total, dict(sorted(kinds.items(), key=lambda kv: -kv[1]["ms"])), top


def profiled_run(llm: Any, prompts: list[list[int]], output_len: int) -> tuple[float, dict[str, Any], Any]:
    """One ``trtcore bench throughput`` run of ``prompts`` under ``torch.profiler`` (CUPTI:
    CUDA-graph replays and cuBLAS kernels included; on a machine without CUDA, CPU events):
    its wall seconds (profiler overhead in), its request metrics, and :func:`kernel_kinds`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from trtcore import bench

    gpu = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CUDA] if gpu else [ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        metrics = bench._timed_run(llm, prompts, output_len)
        if gpu:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    return wall, metrics, kernel_kinds(prof)


def profile_run(args: argparse.Namespace, quantization: str | None) -> dict[str, Any]:
    """One shape and quantization: tokens/s of an unprofiled run, then the profiled run's kernels."""
    from trtcore import bench

    options = {"max_batch_size": args.num_prompts, "max_seq_len": args.input_len + args.output_len, "max_num_tokens": args.max_num_tokens}
    llm, _ = bench._random_weights_llm(args.random_weights, args.backend, "bfloat16", options, 0, quantization)
    import numpy as np

    prompts = bench._prompts(np.random.default_rng(0), args.num_prompts, args.input_len, llm.config.vocab_size)
    plain = bench._timed_run(llm, prompts, args.output_len)  # also the warm-up
    plain = bench._timed_run(llm, prompts, args.output_len)
    wall, profiled, (total, kinds, top) = profiled_run(llm, prompts, args.output_len)
    llm.close()
    del llm
    gc.collect()
    return {
        "quantization": quantization or "none",
        "output_throughput": plain["output_throughput"],
        "profiled_output_throughput": profiled["output_throughput"],
        "profiled_wall_s": wall,
        "kernel_ms": total,
        "kinds": kinds,
        "top_kernels": top,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--random-weights", default="Llama-3-8B")
    ap.add_argument("--quantizations", default="none,fp8")
    ap.add_argument("--backend", default="cuda", help="(reference: a dry run of the script on the CPU, no kernels)")
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-num-tokens", type=int, default=8192)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for q in args.quantizations.split(","):
        r = profile_run(args, None if q == "none" else q)
        runs.append(r)
        print(
            f"\n{args.random_weights} {r['quantization']}: {r['output_throughput']:.1f} output tok/s ({r['profiled_output_throughput']:.1f} profiled), "
            f"kernels {r['kernel_ms']:.1f} ms of {r['profiled_wall_s'] * 1e3:.1f} ms wall",
            flush=True,
        )
        for name, k in r["kinds"].items():
            print(f"  {name:<30} {k['ms']:9.1f} ms {100 * k['share']:5.1f}%  {k['exclusive_ms']:9.1f} ms exclusive {k['launches']:7d} launches")
        for t in r["top_kernels"][:12]:
            print(f"    {t['ms']:8.1f} ms {t['launches']:6d}x  {t['name'][:110]}")
    if len(runs) == 2:
        a, b = runs
        print(f"\n{b['quantization']} / {a['quantization']} output tok/s: {b['output_throughput'] / a['output_throughput']:.3f}")
        for name in a["kinds"]:
            if name in b["kinds"]:
                print(f"  {name:<30} {a['kinds'][name]['ms']:9.1f} -> {b['kinds'][name]['ms']:9.1f} ms")
    (out / "profile_kernels.json").write_text(
        json.dumps(
            {
                "model": args.random_weights,
                "input_len": args.input_len,
                "output_len": args.output_len,
                "num_prompts": args.num_prompts,
                "max_num_tokens": args.max_num_tokens,
                "runs": runs,
            },
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
