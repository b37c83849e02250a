"""End-to-end decode tokens/s of ``LLM(backend="cuda")`` against transformers' static-cache
``generate``, in one run, on random bfloat16 weights in the shapes of SmolLM2-135M,
Llama-3.2-1B and Llama-3-8B (:mod:`trtcore.cuda.synthetic`).

For each shape and batch (1, 16, 32): ``batch`` random prompts of 128 tokens, greedy, 128 new
tokens (``ignore_eos``), through the whole API -- scheduler, device executor (paged KV pool
on the device, decode steps replayed from CUDA graphs), host sampler, detokenization-free
outputs. TPOT = (time of 128 new tokens - time of 1 new token) / 127, the method
``bench_engine.hf_tpot`` uses for transformers, so the two are comparable; tok/s = batch / TPOT.
``--cb``: continuous batching of 256 requests (128 prompt + 128 output tokens) on the 8B shape,
output tokens/s over the whole run. The weight-streaming limit of a batch-1 step (weight bytes
/ device copy bandwidth measured here) is reported beside it.

The random weights reach ``LLM`` through its checkpoint reader: a folder holds the shape's
``config.json`` and :class:`trtcore.cuda.synthetic.RandomWeights` answers for the safetensors
(``trtcore.llm.Checkpoint`` is replaced for the run), so no 16 GB file is written.

    python bench/bench_e2e.py --out $OUT [--models ...] [--batches 1,16,32] [--cb] [--no-hf]

Also where a graphed decode step's time goes at batch 1 (:func:`trtcore.bench.host_time_per_step`:
wall time per ``LLM.step()``, the host's own work, the device time of the step replayed back to
back, and the exposed host time, their difference; ``--host-repeats`` runs of it per mode, since
the lent VM's CPU speed drifts between runs: each run's numbers, the median run, the median of
the runs' host work and how many were at most 50 us; ``--cpu-affinity auto`` also with the
stepping thread pinned to one CPU). ``--sync`` turns asynchronous scheduling off (for comparison).
Writes ``e2e.json`` and ``e2e.png`` under ``--out`` and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _model_dir(root: Path, name: str) -> Path:
    from trtcore.cuda import synthetic

    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({**synthetic.SHAPES[name], "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}))
    return d


@contextlib.contextmanager
def random_checkpoint(make: Any = None) -> Any:
    """``LLM`` reads random weights (``make()``, default ``RandomWeights(seed=1)``) instead of
    safetensors files while inside."""
    import trtcore.llm as llm_module
    from trtcore.cuda import synthetic

    make = make or (lambda: synthetic.RandomWeights(seed=1))
    original = llm_module.Checkpoint
    llm_module.Checkpoint = lambda _d: contextlib.nullcontext(make())  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        llm_module.Checkpoint = original  # type: ignore[misc]


def _free_gpu() -> None:
    gc.collect()
    try:
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
    except ImportError:
        pass


def trtcore_tpot(llm: Any, batch: int, prompt: int = 128, new: int = 128) -> dict[str, Any]:
    """TPOT and tok/s of ``llm.generate`` for ``batch`` prompts (see the module docstring), and
    the milliseconds of a one-token ``generate`` (``ttft_ms``: the prefill and the first token,
    host included)."""
    from trtcore import SamplingParams

    rng = np.random.default_rng(batch)
    vocab = llm.config.vocab_size
    prompts = [[int(t) for t in rng.integers(3, vocab, size=prompt)] for _ in range(batch)]

    def gen(n: int) -> float:
        t = time.perf_counter()
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        short = [(len(o.outputs[0].token_ids), o.outputs[0].finish_reason, o.error) for o in outs if len(o.outputs[0].token_ids) != n]
        assert not short, f"{len(short)} of {len(outs)} requests ended before {n} tokens (tokens, finish_reason, error): {short[:4]}"
        return time.perf_counter() - t

    gen(new), gen(1)  # warm-up: eager prefill shapes prepared
    t1 = statistics.median(gen(1) for _ in range(3))
    tn = statistics.median(gen(new) for _ in range(2))
    tpot = (tn - t1) / (new - 1) * 1e3
    return {"tpot_ms": tpot, "tok_per_s": batch * 1e3 / tpot, "ttft_ms": t1 * 1e3}


def plot(results: dict[str, Any], path: Path) -> None:
    """Decode tok/s of trtcore and transformers per model and batch (a bar chart)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        print(f"no plot: {exc}")
        return
    runs = results["runs"]
    labels = [f"{e['model']}\nb{e['batch']}" for e in runs]
    x = np.arange(len(runs))
    fig, ax = plt.subplots(figsize=(max(6, len(runs) * 1.1), 4))
    ax.bar(x - 0.2, [e["trtcore"]["tok_per_s"] for e in runs], 0.4, label="trtcore (cuda)")
    ax.bar(x + 0.2, [e.get("transformers", {}).get("tok_per_s", 0) for e in runs], 0.4, label="transformers static cache")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("decode tokens/s")
    ax.set_title("end-to-end decode, prompt 128, 128 new tokens, bfloat16, H200")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def continuous_batching(llm: Any, requests: int = 256, prompt: int = 128, new: int = 128) -> dict[str, Any]:
    """Output tokens/s of ``requests`` requests through ``llm.generate`` at once."""
    from trtcore import SamplingParams

    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(3, llm.config.vocab_size, size=prompt)] for _ in range(requests)]
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    llm.generate(prompts[:8], params)  # warm-up
    t = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"requests": requests, "output_tokens": tokens, "seconds": dt, "output_tok_per_s": tokens / dt}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".", help="folder of e2e.json and e2e.png (default: .)")
    ap.add_argument("--models", default="SmolLM2-135M,Llama-3.2-1B,Llama-3-8B", help="comma-separated model shapes (default: %(default)s)")
    ap.add_argument("--batches", default="1,16,32", help="comma-separated batch sizes (default: %(default)s)")
    ap.add_argument("--cb", action="store_true", help="also 256 requests through continuous batching on the 8B shape")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers")
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (for comparison)")
    ap.add_argument("--sync", action="store_true", help="no asynchronous scheduling (for comparison)")
    ap.add_argument("--host-repeats", type=int, default=5, help="host_time_per_step runs per mode (the VM's speed drifts between runs)")
    ap.add_argument(
        "--cpu-affinity", help="also time the host's work per step with the stepping thread pinned ('auto' or a CPU list; trtcore.runtime.affinity)"
    )
    args = ap.parse_args()
    import cupy as cp
    from bench_engine import copy_bandwidth, hf_tpot

    from trtcore import LLM
    from trtcore.bench import host_time_per_step

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth(cp)
    _free_gpu()
    batches = [int(b) for b in args.batches.split(",")]
    results: dict[str, Any] = {"copy_bandwidth_Bps": bw, "enforce_eager": args.enforce_eager, "async_scheduling": not args.sync, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            d = _model_dir(Path(tmp), name)
            t0 = time.perf_counter()
            with random_checkpoint():
                llm = LLM(d, backend="cuda", dtype="bfloat16", max_batch_size=max(batches), max_seq_len=256,
                          max_num_tokens=max(batches) * 128, enforce_eager=args.enforce_eager, async_scheduling=not args.sync,
                          progress=False)  # fmt: skip
            start_s = time.perf_counter() - t0
            runner = llm.executor
            report = runner.memory_report()
            weight_bytes = int(runner.device.pools.get("weights", 0))
            print(f"{name}: started in {start_s:.1f} s", *report, sep="\n  ", flush=True)
            if not args.enforce_eager:
                modes = [("host_time_batch1", True, None), ("host_time_batch1_sync", False, None)]
                if args.cpu_affinity:
                    modes.insert(1, ("host_time_batch1_pinned", True, args.cpu_affinity))
                for key, ahead, cpus in modes:
                    if ahead and args.sync:
                        continue
                    llm.engine.async_scheduling = ahead  # the same engine, with / without running ahead
                    runs = []
                    for _ in range(max(1, args.host_repeats)):
                        runs.append(ht := host_time_per_step(llm, cpu_affinity=cpus))
                        print(
                            f"  graphed decode step (batch 1, {'async' if ahead else 'one step at a time'}, CPUs {ht['cpus'] or 'free'}): "
                            f"{ht['step_us']:.1f} us wall, host work {ht['host_us']:.1f} us (per step p50 {ht['host_p50_us']:.1f}, "
                            f"p90 {ht['host_p90_us']:.1f}; CPU time {ht['host_cpu_us']:.1f}; steal {ht['steal_ms']} ms), GPU {ht['gpu_us']:.1f} us, "
                            f"exposed host time {ht['exposed_host_us']:.1f} us",
                            flush=True,
                        )
                    host = sorted(r["host_us"] for r in runs)
                    median = statistics.median(host)
                    results.setdefault(key, {})[name] = {**sorted(runs, key=lambda r: r["host_us"])[len(runs) // 2], "runs": runs, "host_us_median_of_runs": median,
                                                         "runs_at_most_50_us": sum(h <= 50 for h in host)}  # fmt: skip
                    print(f"  host work per step, {len(runs)} runs: median {median:.1f} us, range {host[0]:.1f}-{host[-1]:.1f}, "
                          f"{sum(h <= 50 for h in host)} at most 50 us", flush=True)  # fmt: skip
                llm.engine.async_scheduling = not args.sync
            for batch in batches:
                ours = trtcore_tpot(llm, batch)
                entry: dict[str, Any] = {"model": name, "batch": batch, "trtcore": ours, "start_s": start_s, "memory": report}
                if batch == 1 and weight_bytes:
                    limit_ms = weight_bytes / bw * 1e3
                    entry["streaming_limit_ms"] = limit_ms
                    entry["fraction_of_streaming_limit"] = limit_ms / ours["tpot_ms"]
                results["runs"].append(entry)
                print(f"  batch {batch}: TPOT {ours['tpot_ms']:.3f} ms, {ours['tok_per_s']:.0f} tok/s", flush=True)
                (out / "e2e.json").write_text(json.dumps(results, indent=1, default=str))  # a cut run keeps what it measured
            llm.close()
            del llm, runner
            _free_gpu()
            if args.cb and name == "Llama-3-8B":
                with random_checkpoint():
                    llm = LLM(d, backend="cuda", dtype="bfloat16", max_batch_size=256, max_seq_len=256, max_num_tokens=8192,
                              enforce_eager=args.enforce_eager, progress=False)  # fmt: skip
                results["continuous_batching"] = {"model": name, "async_scheduling": not args.sync, **continuous_batching(llm)}
                print(f"  continuous batching: {results['continuous_batching']['output_tok_per_s']:.0f} output tok/s", flush=True)
                if not args.sync:  # the same engine one step at a time, for the ratio
                    llm.engine.async_scheduling = False
                    results["continuous_batching_sync"] = {"model": name, "async_scheduling": False, **continuous_batching(llm)}
                    print(
                        f"  continuous batching, one step at a time: {results['continuous_batching_sync']['output_tok_per_s']:.0f} output tok/s",
                        flush=True,
                    )
                (out / "e2e.json").write_text(json.dumps(results, indent=1, default=str))
                llm.close()
                del llm
                _free_gpu()
            if not args.no_hf:
                for entry in [e for e in results["runs"] if e["model"] == name]:
                    entry["transformers"] = hf_tpot(name, entry["batch"])
                    entry["ratio"] = entry["transformers"]["tpot_ms"] / entry["trtcore"]["tpot_ms"]
                    print(
                        f"  batch {entry['batch']}: transformers TPOT {entry['transformers']['tpot_ms']:.3f} ms, ratio {entry['ratio']:.2f}x",
                        flush=True,
                    )
                _free_gpu()
            (out / "e2e.json").write_text(json.dumps(results, indent=1, default=str))
    plot(results, out / "e2e.png")
    print(f"\n{'model':14} {'batch':>5} {'TPOT ms':>9} {'tok/s':>9} {'HF TPOT':>9} {'ratio':>6}")
    for e in results["runs"]:
        hf = e.get("transformers", {}).get("tpot_ms", float("nan"))
        print(
            f"{e['model']:14} {e['batch']:>5} {e['trtcore']['tpot_ms']:>9.3f} {e['trtcore']['tok_per_s']:>9.0f} {hf:>9.3f} {e.get('ratio', float('nan')):>6.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
