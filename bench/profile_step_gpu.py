"""Where the host work of a graphed decode step at batch 1 goes on the GPU machine itself (the
CPU harness ``bench/profile_step_host.py`` stubs CUDA out; this one does not).

Random bfloat16 weights in a Hugging Face shape (``bench_e2e``'s stand-in), ``LLM(backend="cuda",
max_batch_size=1)``, one greedy request:

1. :func:`trtcore.bench.host_time_per_step` ``--repeats`` times (its spread on this host) with
   the garbage collector as it is, with the start-up heap frozen (``gc.freeze()``) and with the
   collector off, each with the collector's own time in the timed steps (``gc.callbacks``);
2. ``--steps`` steps under :mod:`cProfile`: the functions with the most own time, per step
   (the profiler inflates Python code about 2x, not the time spent inside CUDA calls, so a
   blocking CUDA call stands out).

    python bench/profile_step_gpu.py --out $OUT [--model SmolLM2-135M] [--steps 300]

Writes ``profile_step_gpu.json`` and ``profile_step_gpu.txt`` (the profile) under ``--out``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def profiled_steps(llm: Any, steps: int) -> pstats.Stats:
    """``steps`` decode steps of one request under cProfile (after 20 warm-up steps)."""
    from trtcore.runtime.sampling import SamplingParams

    llm.add_request([5] * 16, SamplingParams(temperature=0, max_tokens=steps + 25, ignore_eos=True))
    for _ in range(20):
        llm.step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        llm.step()
    prof.disable()
    while llm.has_unfinished_requests():
        llm.step()
    return pstats.Stats(prof)


def gc_timed(measure: Any, llm: Any, steps: int) -> dict[str, Any]:
    """``measure(llm, steps=steps)`` with the garbage collector's own time counted
    (``gc.callbacks``): ``gc_ms`` and ``gc_collections`` per generation during the call."""
    spent = [0.0]
    counts = [0, 0, 0]
    started = [0.0]

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - started[0]
            counts[info["generation"]] += 1

    gc.callbacks.append(callback)
    try:
        r = dict(measure(llm, steps=steps))
    finally:
        gc.callbacks.remove(callback)
    return {**r, "gc_ms": spent[0] * 1e3, "gc_collections": counts}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--model", default="SmolLM2-135M")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    from bench_e2e import _free_gpu, _model_dir, random_checkpoint

    from trtcore import LLM
    from trtcore.bench import host_time_per_step

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with random_checkpoint():
            llm = LLM(_model_dir(Path(tmp), args.model), backend="cuda", dtype="bfloat16", max_batch_size=1, max_seq_len=1024, progress=False)
        variants: dict[str, list[dict[str, Any]]] = {}
        variants["gc on"] = [gc_timed(host_time_per_step, llm, args.steps) for _ in range(args.repeats)]
        gc.collect()
        gc.freeze()  # the start-up heap out of the collector's scans (what vLLM's engine does)
        variants["gc frozen"] = [gc_timed(host_time_per_step, llm, args.steps) for _ in range(args.repeats)]
        gc.unfreeze()
        gc.disable()
        try:
            variants["gc off"] = [gc_timed(host_time_per_step, llm, args.steps) for _ in range(args.repeats)]
        finally:
            gc.enable()
        for label, rs in variants.items():
            print(
                f"{args.model} host_time_per_step ({label}): host "
                + " / ".join(f"{r['host_us']:.1f}" for r in rs)
                + " us; GC in the timed steps "
                + " / ".join(f"{r['gc_ms']:.2f} ms ({r['gc_collections']})" for r in rs),
                flush=True,
            )
        stats = profiled_steps(llm, args.steps)
        llm.close()
        _free_gpu()
    text = io.StringIO()
    stats.stream = text  # type: ignore[attr-defined]
    stats.sort_stats("tottime").print_stats(args.top)
    (out / "profile_step_gpu.txt").write_text(text.getvalue())
    rows = []
    for (file, line, fn), (_cc, nc, tt, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(file).name}:{line}({fn})", "calls_per_step": nc / args.steps, "own_us_per_step": tt / args.steps * 1e6, "cum_us_per_step": ct / args.steps * 1e6})
    rows.sort(key=lambda r: -r["own_us_per_step"])
    print(f"{'own us/step':>12} {'cum us/step':>12} {'calls/step':>10}  function")
    for r in rows[: args.top]:
        print(f"{r['own_us_per_step']:12.2f} {r['cum_us_per_step']:12.2f} {r['calls_per_step']:10.2f}  {r['function']}")
    total = sum(r["own_us_per_step"] for r in rows)
    print(f"profiled total {total:.1f} us per step ({args.steps} steps)")
    result = {"model": args.model, "host_time": variants, "profile_total_us_per_step": total, "profile": rows[:200]}
    (out / "profile_step_gpu.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
