"""How often a server's eager (prefill / mixed) steps make the cuda engine prepare a new launch
list, and what that costs on the host: issue 11's TTFT, measured without a GPU.

The real step loop (:func:`~trtcore.runtime.generate.make_device_engine`, the scheduler with
asynchronous scheduling, :class:`~trtcore.runtime.device_runner.DeviceRunner` with its staging,
padding and buckets) drives the real cuda engine's execution contexts of the paged
SmolLM2-135M network (the plan compiled for ``--arch``, random weights) on a stand-in device
(:class:`~trtcore.runtime.device_memory.HostDevice`): each ``execute_async_v3`` prepares its
launch list on a new shape combination exactly as on the GPU (``IExecutionContext.prepare``,
counted by ``num_prepares`` / ``prepare_seconds``), and only the launches themselves are
skipped (no GPU; the logits stay zero, so greedy sampling gives token 0: EOS is ignored).

Arrivals: ``trtcore bench serve --max-concurrency C`` (issue 11's H200 line): ``C`` clients,
each sending its next request (``--input-len`` prompt tokens, ``--output-len`` output tokens)
``--think-ms`` (exponential) after its last one finished, ``max(32, 4 C)`` requests in all, on a
virtual clock that advances per step by a model of the H200's device time
(:func:`gpu_ms`) plus the host seconds that step spent preparing launch lists (the rest of the
host work overlaps the device: asynchronous scheduling). The TTFT it reports is that clock's
(arrival to the step that sampled the first token), a model: the counts and host times are
the measurement.

    python bench/profile_eager_steps.py [--concurrency 1,8,32,128] [--out DIR]

Prints one line per concurrency and padding mode and writes ``eager_steps.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def gpu_ms(tokens: int, seqs: int) -> float:
    """A model of one step's device time on the H200, SmolLM2-135M bf16 (milliseconds): the
    decode step at batch 1 (0.69 ms, bench/results/h200-2026-12-02-final), plus per sequence
    and per token (TPOT 1.6 ms at batch 32; a 128-token prefill ~1.2 ms)."""
    return 0.69 + 0.028 * seqs + 0.004 * max(tokens - seqs, 0)


def build_engine(arch: str, max_batch_size: int, max_seq_len: int) -> tuple[Any, Any, Any]:
    """The compiled paged SmolLM2-135M plan as a cuda ``ICudaEngine`` whose contexts prepare on
    the host only (no kernel loads, no cuBLAS handle, launches skipped), its KV mode and config."""
    import trtcore.cuda as tc
    from trtcore.builder import _builder_config, define_network
    from trtcore.cuda import runtime, synthetic
    from trtcore.cuda.builder import compile_network
    from trtcore.kv_modes import kv_mode
    from trtcore.plan import BuildConfig, resolve_plan

    cfg = synthetic.config("SmolLM2-135M")
    plan = resolve_plan(cfg, BuildConfig(dtype="bfloat16", max_batch_size=max_batch_size, max_seq_len=max_seq_len, kv_cache="paged"), "cuda")
    d = define_network(tc, cfg, synthetic.RandomWeights(pool_size=1 << 22), plan)
    compiled = compile_network(d.network, _builder_config(d, None), None, arch=arch)

    class _NoCublas:
        def __init__(self, *args: Any) -> None:
            pass

    runtime.Cublas = _NoCublas  # type: ignore[misc,assignment]
    runtime.IExecutionContext._launch = lambda self, step, stream: None  # type: ignore[method-assign]
    engine = runtime.ICudaEngine(compiled)
    engine._load = lambda: None  # type: ignore[method-assign]
    engine._const_ptr = {name: (i + 100) << 40 for i, name in enumerate(compiled.graph.constants)}
    return engine, kv_mode(plan, cfg), cfg


def serve(engine: Any, mode: Any, concurrency: int, pad: bool, warm: bool, args: Any, rng: np.random.Generator) -> dict[str, Any]:
    """One run of ``max(32, 4 * concurrency)`` requests through a fresh runner (module docstring)."""
    from trtcore import SamplingParams
    from trtcore.runtime.device_memory import HostDevice
    from trtcore.runtime.device_runner import DeviceRunner
    from trtcore.runtime.generate import make_device_engine
    from trtcore.runtime.request import Request

    device = HostDevice(memory=64 << 30)
    blocks = concurrency * -(-(args.input_len + args.output_len) // mode.plan.block_size) + 2
    t0 = time.perf_counter()
    runner = DeviceRunner(engine, device, mode, num_blocks=min(blocks, mode.plan.max_num_blocks), pad_eager_steps=pad, warm_eager=warm)
    startup_s = time.perf_counter() - t0
    warm_prepares, warm_s = runner.eager.num_prepares, runner.eager.prepare_seconds
    core = make_device_engine(runner, mode, async_scheduling=True)
    eager_shapes: list[tuple[int, int]] = []  # (tokens, sequences) of each eager step, unpadded
    execute = runner.execute

    def counted(batch: Any) -> int:
        if not runner.is_decode(batch):
            eager_shapes.append((sum(s.num_new_tokens for s in batch.seqs), len(batch.seqs)))
        return execute(batch)

    runner.execute = counted  # type: ignore[method-assign]
    n_requests = max(32, 4 * concurrency)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    arrivals = [(0.0, c) for c in range(concurrency)]  # (time ms, client): all clients start at once
    sent = 0
    clock = 0.0
    arrival_of: dict[int, float] = {}
    first: dict[int, float] = {}
    eager_steps, eager_prepare_ms, eager_host_ms = 0, [], []
    while len(first) < n_requests or core.has_unfinished_requests():
        arrivals.sort()
        while arrivals and arrivals[0][0] <= clock and sent < n_requests:
            at, _client = arrivals.pop(0)
            prompt = [int(t) for t in rng.integers(1000, 40000, size=args.input_len)]
            core.add_request(Request(sent, prompt, params, frozenset()))
            arrival_of[sent] = at
            sent += 1
        if not core.has_unfinished_requests():
            if not arrivals or sent >= n_requests:
                break
            clock = arrivals[0][0]
            continue
        before = (runner.eager.num_prepares, runner.eager.prepare_seconds, runner.num_steps, len(eager_shapes))
        t1 = time.perf_counter()
        events = core.step()
        host_ms = (time.perf_counter() - t1) * 1e3
        prepared_ms = (runner.eager.prepare_seconds - before[1]) * 1e3
        steps_run = runner.num_steps - before[2]
        if len(eager_shapes) > before[3]:  # this call enqueued an eager step (and maybe a decode behind it)
            eager_steps += len(eager_shapes) - before[3]
            eager_prepare_ms.append(prepared_ms)
            eager_host_ms.append(host_ms)
        tokens = sum(1 for _ in events)
        clock += gpu_ms(max(tokens, 1), max(tokens, 1)) * max(steps_run, 1) + prepared_ms
        for ev in events:
            rid = ev.request_id
            if rid not in first and ev.token_id is not None and ev.token_id >= 0:
                first[rid] = clock
            if ev.finished:
                arrivals.append((clock + rng.exponential(args.think_ms), 0))
    ttft = np.array([first[r] - arrival_of[r] for r in first])
    out = {
        "concurrency": concurrency,
        "pad_eager_steps": pad,
        "warm_eager": warm,
        "requests": n_requests,
        "startup_s": startup_s,
        "warm_prepares": warm_prepares,
        "warm_prepare_s": warm_s,
        "steps": runner.num_steps,
        "eager_steps": eager_steps,
        "prepares_while_serving": runner.eager.num_prepares - warm_prepares,
        "prepare_ms_per_miss": (runner.eager.prepare_seconds - warm_s) * 1e3 / max(runner.eager.num_prepares - warm_prepares, 1),
        "eager_prepare_ms_mean": float(np.mean(eager_prepare_ms)) if eager_prepare_ms else 0.0,
        "eager_host_ms_median": float(np.median(eager_host_ms)) if eager_host_ms else 0.0,
        "distinct_eager_shapes": len(set(eager_shapes)),
        "prepared_kept": len(runner.eager._prepared),
        "model_ttft_p50_ms": float(np.median(ttft)),
        "model_ttft_p90_ms": float(np.percentile(ttft, 90)),
    }
    runner.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--concurrency", default="1,8,32,128")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--think-ms", type=float, default=1.0, help="mean client gap between a response and its next request")
    ap.add_argument("--modes", default="exact,padded", help="exact (unpadded eager steps), padded (warmed at start-up), padded-cold")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    max_seq_len = 1 << (args.input_len + args.output_len + 16).bit_length()
    engine, mode, _ = build_engine(args.arch, max(levels), max_seq_len)
    modes = {"exact": (False, False), "padded": (True, True), "padded-cold": (True, False)}
    rows = []
    for c in levels:
        for name in args.modes.split(","):
            pad, warm = modes[name]
            row = serve(engine, mode, c, pad, warm, args, np.random.default_rng(c))
            row["mode"] = name
            rows.append(row)
            print(
                f"C={c:>3} {name:<11} requests {row['requests']:>3}: eager steps {row['eager_steps']:>4} ({row['distinct_eager_shapes']} shapes), prepares while serving "
                f"{row['prepares_while_serving']:>3} ({row['prepare_ms_per_miss']:.1f} ms each), host ms per eager step (median) "
                f"{row['eager_host_ms_median']:.1f}, warm-up {row['warm_prepares']} in {row['warm_prepare_s']:.2f} s, "
                f"model TTFT p50/p90 {row['model_ttft_p50_ms']:.1f}/{row['model_ttft_p90_ms']:.1f} ms",
                flush=True,
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"model": "SmolLM2-135M", "arch": args.arch, "machine": platform.processor() or platform.machine(), "args": vars(args), "rows": rows}
    (out / "eager_steps.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
