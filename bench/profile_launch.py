"""What a graphed decode step's host work is made of on the GPU machine, measured without a
profiler: the CPU time of ``cudaGraphLaunch`` for one decode step's graph and for graphs that
hold ``K`` decode steps back to back (does the launch cost grow with the graph's nodes?), the
device time per step of each, ``cudaEventSynchronize`` / ``cudaEventQuery`` on a finished
event, and :func:`trtcore.bench.host_time_per_step`.

Random bfloat16 weights in a Hugging Face shape (``bench_e2e``'s stand-in), ``LLM(backend="cuda",
max_batch_size=1)``; the K-step graphs are captured here from the runner's bucket-1 context and
sampler (the staging copy, the feed, the engine, the sampling with its copies back, K times).

    python bench/profile_launch.py --out $OUT [--models SmolLM2-135M,Llama-3.2-1B] [--k 1,2,4,8]

Writes ``profile_launch[_LABEL].json`` under ``--out`` and prints a table. ``TRTCORE_CUDA_PDL=0`` in
the environment measures the same without programmatic dependent launches.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _launch_cpu_us(device: Any, graph: Any, n: int) -> tuple[float, float]:
    """Median and p90 CPU microseconds of one ``cudaGraphLaunch`` call (``n`` calls, the device
    synchronized every 8 so the launch queue never fills)."""
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        device.launch_graph(graph)
        times.append((time.perf_counter() - t0) * 1e6)
        if i % 8 == 7:
            device.synchronize()
    device.synchronize()
    times.sort()
    return statistics.median(times), times[int(0.9 * len(times))]


def _graph_nodes(device: Any, exe: Any) -> tuple[int | None, dict[str, int]]:
    """The node count of ``exe``'s graph and its nodes by type (``cudaGraphNodeType`` names
    without the prefix: ``Kernel``, ``Memcpy``, ...): which kinds make up the launch cost."""
    rt = device._rt
    for graph, e in device._graphs:
        if e is exe:
            err, _, n = rt.cudaGraphGetNodes(graph, 0)
            if int(err):
                return None, {}
            err, nodes, n = rt.cudaGraphGetNodes(graph, n)
            kinds: dict[str, int] = {}
            for node in nodes[: int(n)]:
                err_t, kind = rt.cudaGraphNodeGetType(node)
                name = kind.name.removeprefix("cudaGraphNodeType") if int(err_t) == 0 else "?"
                kinds[name] = kinds.get(name, 0) + 1
            return int(n), kinds
    return None, {}


def k_step_graph(runner: Any, k: int) -> Any:
    """A graph of ``k`` bucket-1 decode steps back to back (host sides alternating)."""
    g = runner.graphs[1]
    dev = runner.device
    dev.begin_capture()
    try:
        for j in range(k):
            side = j % 2
            runner._stage(g.layout, side)
            runner._run(g.context)
            runner.sampler.kernel.enqueue_step(side, g.size, runner.logits_ptr, runner.vocab_size)
    finally:
        exe = dev.end_capture()
    return exe


def event_costs(device: Any, n: int = 200) -> dict[str, float]:
    """CPU microseconds (median) of ``cudaEventRecord`` + ``cudaEventSynchronize`` on an idle
    stream and of ``cudaEventQuery`` on a finished event."""
    rt = device._rt
    ev = device._event
    rec, sync, query = [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        rt.cudaEventRecord(ev, device._stream)
        t1 = time.perf_counter()
        rt.cudaEventSynchronize(ev)
        t2 = time.perf_counter()
        rt.cudaEventQuery(ev)
        t3 = time.perf_counter()
        rec.append((t1 - t0) * 1e6)
        sync.append((t2 - t1) * 1e6)
        query.append((t3 - t2) * 1e6)
    return {"record_us": statistics.median(rec), "synchronize_us": statistics.median(sync), "query_us": statistics.median(query)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--models", default="SmolLM2-135M,Llama-3.2-1B")
    ap.add_argument("--k", default="1,2,4,8")
    ap.add_argument("--launches", type=int, default=400)
    ap.add_argument("--label", default="", help="suffix of the JSON file's name")
    args = ap.parse_args()
    from bench_e2e import _free_gpu, _model_dir, random_checkpoint

    from trtcore import LLM
    from trtcore.bench import host_time_per_step

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            with random_checkpoint():
                llm = LLM(_model_dir(Path(tmp), name), backend="cuda", dtype="bfloat16", max_batch_size=1, max_seq_len=512, progress=False)
            runner = llm.executor
            # TRTCORE_CUDA_PDL=0 turns programmatic dependent launches off (kernels.launch)
            entry: dict[str, Any] = {"pdl": os.environ.get("TRTCORE_CUDA_PDL", "1") != "0", "host_time": host_time_per_step(llm, steps=300)}
            entry["events"] = event_costs(runner.device)
            rows = []
            for k in (int(x) for x in args.k.split(",")):
                exe = runner.graphs[1].graphs[0] if k == 1 else k_step_graph(runner, k)
                med, p90 = _launch_cpu_us(runner.device, exe, args.launches)
                gpu_s = _gpu_seconds(runner.device, exe, 50)
                nodes, kinds = _graph_nodes(runner.device, exe)
                rows.append(
                    {
                        "k": k,
                        "nodes": nodes,
                        "node_types": kinds,
                        "launch_cpu_us": med,
                        "launch_cpu_p90_us": p90,
                        "launch_cpu_us_per_step": med / k,
                        "gpu_us_per_step": gpu_s * 1e6 / k,
                    }
                )
                print(
                    f"{name} K={k}: nodes {nodes} {kinds}, launch {med:.1f} us (p90 {p90:.1f}), {med / k:.1f} us per step; GPU {gpu_s * 1e6 / k:.1f} us per step",
                    flush=True,
                )
            entry["k_step_graphs"] = rows
            ht = entry["host_time"]
            print(f"{name}: host_time_per_step {ht['host_us']:.1f} us host work, {ht['step_us']:.1f} us wall; events {entry['events']}", flush=True)
            results[name] = entry
            llm.close()
            _free_gpu()
    (out / f"profile_launch{'_' + args.label if args.label else ''}.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


def _gpu_seconds(device: Any, exe: Any, n: int) -> float:
    device.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        device.launch_graph(exe)
    device.synchronize()
    return (time.perf_counter() - t0) / n


if __name__ == "__main__":
    sys.exit(main())
