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
import ctypes
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

    from cuda.bindings import driver

    import trtcore.plugins.paged_attention as paged_attention
    import trtcore.plugins.rope as rope
    from trtcore.kernels import launch as kl

    class _Function:
        """A kernel whose launch does the Python work of ``KernelFunction.launch`` (argument
        packing, the programmatic launch config) and skips the driver call."""

        def launch(self, grid: Any, block: Any, args: Any = (), *, shared_mem: int = 0, stream: Any = 0, programmatic: bool = False) -> None:
            packed = [kl._pack(a, i) for i, a in enumerate(args)]
            (ctypes.c_void_p * max(len(packed), 1))(*[ctypes.addressof(o) for o in packed])
            kl.programmatic_config(kl._dims(grid, "grid"), kl._dims(block, "block"), shared_mem, driver.CUstream(int(stream)))

    class _Cublas:
        def __init__(self, *args: Any) -> None:
            pass

        def run(self, *args: Any) -> None:  # cuBLAS's own host work is not counted
            pass

    class _Functions(dict):  # type: ignore[type-arg]
        def __missing__(self, key: str) -> _Function:
            return _Function()

    runtime.Cublas = _Cublas  # type: ignore[misc,assignment]
    paged_attention._Functions.get = lambda self, symbol, reload=False: _Function()  # type: ignore[method-assign]
    rope._load_kernel = lambda *a, **k: _Function()  # type: ignore[assignment]
    engine = runtime.ICudaEngine(compiled)
    engine._load = lambda: None  # type: ignore[method-assign]
    engine._functions = _Functions()
    engine._const_ptr = {name: (i + 100) << 40 for i, name in enumerate(compiled.graph.constants)}
    return engine, kv_mode(plan, cfg), cfg


def serve(engine: Any, mode: Any, concurrency: int, run_mode: str, args: Any, rng: np.random.Generator) -> dict[str, Any]:
    """One run of ``max(32, 4 * concurrency)`` requests through a fresh runner (module docstring)."""
    from trtcore import SamplingParams
    from trtcore.runtime.device_memory import HostDevice
    from trtcore.runtime.device_runner import DeviceRunner
    from trtcore.runtime.generate import make_device_engine
    from trtcore.runtime.request import Request

    pad, graphs = {"exact": (False, False), "padded": (True, False), "graphs": (True, True)}[run_mode]
    device = HostDevice(memory=64 << 30, deferred=True)  # the sampling and copies run when waited for, not in execute
    blocks = concurrency * -(-(args.input_len + args.output_len) // mode.plan.block_size) + 2
    t0 = time.perf_counter()
    runner = DeviceRunner(engine, device, mode, num_blocks=min(blocks, mode.plan.max_num_blocks), pad_eager_steps=pad, eager_graphs=graphs)
    startup_s = time.perf_counter() - t0
    warm_prepares, warm_s = runner.eager.num_prepares, runner.eager.prepare_seconds
    core = make_device_engine(runner, mode, async_scheduling=True)
    steps: list[dict[str, Any]] = []  # per executed step: its shape, padded shape, host ms, prepares
    execute = runner.execute

    def timed(batch: Any) -> int:
        prepares = runner.eager.num_prepares
        t = time.perf_counter()
        rows = execute(batch)
        host = (time.perf_counter() - t) * 1e3
        tokens, seqs = sum(s.num_new_tokens for s in batch.seqs), len(batch.seqs)
        eager = not runner.is_decode(batch)
        shape = runner.last_eager_shape if eager else (rows, rows)
        steps.append({"eager": eager, "tokens": tokens, "seqs": seqs, "shape": shape, "host_ms": host, "prepares": runner.eager.num_prepares - prepares})
        return rows

    runner.execute = timed  # type: ignore[method-assign]
    n_requests = max(32, 4 * concurrency)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    arrivals = [0.0] * concurrency  # times (ms) of the next requests: all clients start at once
    sent, clock = 0, 0.0
    arrival_of: dict[int, float] = {}
    first: dict[int, float] = {}
    while True:
        arrivals.sort()
        while arrivals and arrivals[0] <= clock and sent < n_requests:
            arrival_of[sent] = arrivals.pop(0)
            prompt = [int(t) for t in rng.integers(1000, 40000, size=args.input_len)]
            core.add_request(Request(sent, prompt, params, frozenset()))
            sent += 1
        if not core.has_unfinished_requests():
            if not arrivals or sent >= n_requests:
                break
            clock = arrivals[0]
            continue
        done = len(steps)
        events = core.step()
        # the device runs each step after its launches: a step takes its device time or, when
        # longer, the host's launch work (an eager step's launches are exposed)
        clock += sum(max(gpu_ms(*s["shape"]), s["host_ms"]) for s in steps[done:])
        for ev in events:
            if ev.request_id not in first and ev.token_id is not None and ev.token_id >= 0:
                first[ev.request_id] = clock
            if ev.finished:
                arrivals.append(clock + rng.exponential(args.think_ms))
    ttft = np.array([first[r] - arrival_of[r] for r in first])
    eager = [s for s in steps if s["eager"]]
    misses = [s for s in eager if s["prepares"]]
    out = {
        "concurrency": concurrency,
        "mode": run_mode,
        "requests": n_requests,
        "startup_s": startup_s,
        "warm_prepares": warm_prepares,
        "warm_prepare_s": warm_s,
        "steps": len(steps),
        "eager_steps": len(eager),
        "distinct_eager_shapes": len({(s["tokens"], s["seqs"]) for s in eager}),
        "distinct_padded_shapes": len({s["shape"] for s in eager}),
        "prepares_while_serving": runner.eager.num_prepares - warm_prepares,
        "prepare_ms_per_miss": (runner.eager.prepare_seconds - warm_s) * 1e3 / max(runner.eager.num_prepares - warm_prepares, 1),
        "eager_host_ms_median": float(np.median([s["host_ms"] for s in eager])) if eager else 0.0,
        "eager_host_ms_median_hits": float(np.median([s["host_ms"] for s in eager if not s["prepares"]])) if len(eager) > len(misses) else 0.0,
        "eager_graph_replays": runner.num_eager_graph_replays,
        "decode_host_ms_median": float(np.median([s["host_ms"] for s in steps if not s["eager"]])),
        "prepared_kept": len(runner.eager._prepared),
        "model_ttft_p50_ms": float(np.median(ttft)),
        "model_ttft_p90_ms": float(np.percentile(ttft, 90)),
        "model_output_tok_s": n_requests * args.output_len / (clock / 1e3),
    }
    runner.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--concurrency", default="1,8,32,128")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--think-ms", type=float, default=1.0, help="mean client gap between a response and its next request")
    ap.add_argument("--modes", default="exact,padded,graphs", help="exact (unpadded eager steps), padded, graphs (padded, replayed from CUDA graphs)")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    max_seq_len = 1 << (args.input_len + args.output_len + 16).bit_length()
    engine, mode, _ = build_engine(args.arch, max(levels), max_seq_len)
    rows = []
    for c in levels:
        for name in args.modes.split(","):
            row = serve(engine, mode, c, name, args, np.random.default_rng(c))
            rows.append(row)
            print(
                f"C={c:>3} {name:<7} {row['requests']:>3} requests: eager steps {row['eager_steps']:>3} ({row['distinct_eager_shapes']:>2} shapes, "
                f"padded {row['distinct_padded_shapes']:>2}), prepares while serving {row['prepares_while_serving']:>2} "
                f"({row['prepare_ms_per_miss']:.1f} ms each), host ms per eager step p50 {row['eager_host_ms_median']:.2f} "
                f"(cached {row['eager_host_ms_median_hits']:.2f}), graph replays {row['eager_graph_replays']:>3}, decode {row['decode_host_ms_median']:.2f}; "
                f"warm-up {row['warm_prepares']} in {row['warm_prepare_s']:.2f} s; model TTFT p50/p90 {row['model_ttft_p50_ms']:.1f}/"
                f"{row['model_ttft_p90_ms']:.1f} ms, {row['model_output_tok_s']:.0f} tok/s",
                flush=True,
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"model": "SmolLM2-135M", "arch": args.arch, "machine": platform.processor() or platform.machine(), "args": vars(args), "rows": rows}
    (out / "eager_steps.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
