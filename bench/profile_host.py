"""Where the host's share of a graphed decode step at batch 1 goes: for each model shape,
:func:`trtcore.bench.host_time_per_step` (wall time per ``LLM.step()``, host work, device time,
exposed host time; with asynchronous scheduling and one step at a time), ``--repeats`` times
with the garbage collector's own time in the timed steps counted (``gc.callbacks``; the host's
spread between runs of one process is large), then ``cProfile`` of ``--steps`` more
``LLM.step()`` calls, the functions by own time.

Random bfloat16 weights in the shape of a Hugging Face config (``bench_e2e``'s checkpoint
stand-in), ``LLM(backend="cuda", max_batch_size=1)``.

    python bench/profile_host.py --out $OUT [--models SmolLM2-135M,Llama-3.2-1B] [--steps 300]

Writes ``profile_host.json`` (the timings and, per model, the top functions: calls, own and
cumulative microseconds per step) under ``--out`` and prints them.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def profile_steps(llm: Any, steps: int, top: int = 25) -> list[dict[str, Any]]:
    """``cProfile`` of ``steps`` graphed decode steps of one request: the ``top`` functions by
    own time, each ``{"function", "calls_per_step", "own_us_per_step", "cum_us_per_step"}``."""
    from trtcore import SamplingParams

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
    stats = pstats.Stats(prof)
    rows = []
    for (path, line, fn), (_, ncalls, own, cum, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {
                "function": f"{Path(path).name}:{line}({fn})",
                "calls_per_step": ncalls / steps,
                "own_us_per_step": own / steps * 1e6,
                "cum_us_per_step": cum / steps * 1e6,
            }
        )
    rows.sort(key=lambda r: -r["own_us_per_step"])
    return rows[:top]


def gc_timed(measure: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``measure(*args, **kwargs)`` (a dict) with the garbage collector's own time during the
    call (``gc.callbacks``): ``gc_ms`` and ``gc_collections`` per generation added."""
    spent, started, counts = [0.0], [0.0], [0, 0, 0]

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            spent[0] += time.perf_counter() - started[0]
            counts[info["generation"]] += 1

    gc.callbacks.append(callback)
    try:
        result = dict(measure(*args, **kwargs))
    finally:
        gc.callbacks.remove(callback)
    return {**result, "gc_ms": spent[0] * 1e3, "gc_collections": counts}


#: how the host waits for a step's sampled ids (``--wait``; an experiment, see :func:`set_wait`)
WAITS = ("sync", "poll", "event-block", "spin", "yield", "block")


def set_wait(mode: str) -> None:
    """Choose how the stepping thread waits for a step's tokens, before any CUDA context exists:

    * ``sync``: trtcore's own wait (``cudaEventSynchronize``, the driver's default scheduling);
    * ``poll``: a Python loop over ``cudaEventQuery`` (busy, but in ordinary instructions);
    * ``event-block``: the sampler's events made with ``cudaEventBlockingSync`` (the thread sleeps);
    * ``spin`` / ``yield`` / ``block``: ``cudaSetDeviceFlags(cudaDeviceSchedule{Spin,Yield,BlockingSync})``.
    """
    from cuda.bindings import runtime as rt

    from trtcore.runtime import sampling_gpu

    if mode in ("spin", "yield", "block"):
        flag = {"spin": rt.cudaDeviceScheduleSpin, "yield": rt.cudaDeviceScheduleYield, "block": rt.cudaDeviceScheduleBlockingSync}[mode]
        err = rt.cudaSetDeviceFlags(flag)[0]
        if err:
            raise RuntimeError(f"cudaSetDeviceFlags({mode}): {err}")
    elif mode in ("poll", "event-block"):
        proxy = types.ModuleType("cuda_runtime_proxy")
        proxy.__dict__.update(rt.__dict__)
        if mode == "poll":
            query, ready = rt.cudaEventQuery, rt.cudaError_t.cudaSuccess

            def synchronize(event: Any) -> tuple[Any]:
                while True:
                    r = query(event)
                    if r[0] == ready or r[0] != rt.cudaError_t.cudaErrorNotReady:
                        return (r[0],)

            proxy.cudaEventSynchronize = synchronize  # type: ignore[attr-defined]
        else:
            proxy.cudaEventDisableTiming = rt.cudaEventDisableTiming | rt.cudaEventBlockingSync  # type: ignore[attr-defined]
        sampling_gpu._RUNTIME = proxy
    elif mode != "sync":
        raise ValueError(f"--wait must be one of {WAITS}; got {mode!r}")


def cpu_migrations(llm: Any, steps: int) -> dict[str, Any]:
    """The CPUs the stepping thread ran on, read (``sched_getcpu``) after each of ``steps``
    graphed decode steps of one request: ``{"cpus": {cpu: steps}, "migrations": count}``."""
    import ctypes

    from trtcore import SamplingParams

    getcpu = ctypes.CDLL(None).sched_getcpu
    llm.add_request([5] * 16, SamplingParams(temperature=0, max_tokens=steps + 25, ignore_eos=True))
    for _ in range(20):
        llm.step()
    seen = []
    for _ in range(steps):
        llm.step()
        seen.append(getcpu())
    while llm.has_unfinished_requests():
        llm.step()
    counts: dict[int, int] = {}
    for c in seen:
        counts[c] = counts.get(c, 0) + 1
    return {"cpus": counts, "migrations": sum(a != b for a, b in zip(seen, seen[1:]))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".", help="folder of profile_host.json (default: .)")
    ap.add_argument("--models", default="SmolLM2-135M,Llama-3.2-1B", help="comma-separated model shapes (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=300, help="LLM.step() calls under cProfile (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=1, help="host_time_per_step runs per scheduling mode")
    ap.add_argument("--cpu-affinity", help="pin the stepping thread for the timed runs: 'auto' or a CPU list (trtcore.runtime.affinity)")
    ap.add_argument("--async-only", action="store_true", help="only the asynchronous mode's timings, no cProfile")
    ap.add_argument("--wait", default="sync", choices=WAITS, help="how the host waits for a step's tokens (set_wait)")
    ap.add_argument("--label", default="", help="suffix of the JSON file's name")
    args = ap.parse_args()
    set_wait(args.wait)
    from bench_e2e import _free_gpu, _model_dir, random_checkpoint

    from trtcore import LLM
    from trtcore.bench import host_time_per_step

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            t0 = time.perf_counter()
            with random_checkpoint():
                llm = LLM(_model_dir(Path(tmp), name), backend="cuda", dtype="bfloat16", max_batch_size=1, max_seq_len=512, progress=False)
            entry: dict[str, Any] = {"start_s": time.perf_counter() - t0, "wait": args.wait, "cpu_affinity": args.cpu_affinity}
            modes = (("async", True),) if args.async_only else (("async", True), ("one_step_at_a_time", False))
            for key, ahead in modes:
                llm.engine.async_scheduling = ahead
                runs = [gc_timed(host_time_per_step, llm, steps=args.steps, cpu_affinity=args.cpu_affinity) for _ in range(max(1, args.repeats))]
                entry[key] = runs[0] if len(runs) == 1 else {"runs": runs, "median_host_us": statistics.median(r["host_us"] for r in runs)}
                for ht in runs:
                    print(
                        f"{name} ({key}, wait {args.wait}, CPUs {ht['cpus'] or 'free'}): {ht['step_us']:.1f} us wall, host work {ht['host_us']:.1f} us (per step p50 {ht['host_p50_us']:.1f}, "
                        f"p90 {ht['host_p90_us']:.1f}, p99 {ht['host_p99_us']:.1f}, max {ht['host_max_us']:.0f}; CPU time {ht['host_cpu_us']:.1f}, p50 {ht['host_cpu_p50_us']:.1f}; steal {ht['steal_ms']} ms), GPU {ht['gpu_us']:.1f} us, "
                        f"exposed host time {ht['exposed_host_us']:.1f} us; GC {ht['gc_ms']:.2f} ms in the timed steps",
                        flush=True,
                    )
            llm.engine.async_scheduling = True
            entry["cpu_migrations"] = mig = cpu_migrations(llm, args.steps)
            print(f"{name}: the stepping thread ran on CPUs {mig['cpus']} ({mig['migrations']} migrations in {args.steps} steps)", flush=True)
            if not args.async_only:
                entry["profile_async"] = prof = profile_steps(llm, args.steps)
                print(f"{name}: cProfile of {args.steps} steps (async), us per step (profiled, so inflated):")
                for r in prof:
                    print(f"  {r['own_us_per_step']:8.1f} own {r['cum_us_per_step']:8.1f} cum {r['calls_per_step']:5.1f}x  {r['function']}")
            results[name] = entry
            (out / f"profile_host{'_' + args.label if args.label else ''}.json").write_text(json.dumps(results, indent=1))
            llm.close()
            del llm
            _free_gpu()
    return 0


if __name__ == "__main__":
    sys.exit(main())
