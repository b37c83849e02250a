"""The server's own overhead on the CPU: ``trtcore serve``'s real code over a stand-in LLM.

The stand-in (:class:`StandInLLM`) has the online API the server drives (``add_request`` /
``step`` / ``abort_request`` and the scheduler state it reads) but no model: each ``step()``
spends ``--host-ms`` of Python work holding the GIL (the engine's own host work per step) and
then sleeps until ``--step-ms`` after its start (the GPU step), and returns one token for every
live request. Its own throughput at a concurrency C (C requests in flight, each replaced when
it finishes, as ``trtcore bench throughput`` at ``max_batch_size`` C) is the bound the server
can reach; the served output tok/s of ``trtcore bench serve``'s :func:`~trtcore.bench_serve.benchmark`
against the real server (FastAPI + uvicorn + :class:`~trtcore.serve.engine.AsyncEngine`,
in a separate process started by this script with ``--serve``; the stand-in runs in the
server's engine process, built there from a :func:`functools.partial` of :class:`StandInLLM`)
over it is what the server delivers. Their ratio is issue 11's "served / offline" measured
without a GPU::

    python bench/bench_serve_overhead.py --json out.json [--concurrency 1,8,32,128]

The load generator runs in this process, the server in a child process (and the engine in
the server's child); on a machine with few cores they share them (the ratio is then a lower
bound of the server's). The server's CPU counts the server process and its children.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from trtcore.llm import StreamOutput
from trtcore.serve.core import ServedModel

_LISTENING = "trtcore serve: listening on "


class StandInModel(ServedModel):
    """The stand-in's description for the server's routes (no tokenizer, no chat template):
    one token id per whitespace-separated word, a chat is its contents joined."""

    def encode(self, text: str) -> list[int]:
        return [hash(w) % self.vocab_size for w in text.split()]

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return " ".join(m["content"] for m in messages)


class StandInLLM:
    """A time-based stand-in of :class:`trtcore.llm.LLM` for the server (module docstring).

    Args:
        step_s: wall time of one step, seconds (the GPU step).
        host_s: Python work per step holding the GIL, seconds (the engine's host work).
        max_batch_size: most requests running; more wait (FCFS).
        max_seq_len: the context (prompt + output tokens).
    """

    def __init__(self, step_s: float = 1.3e-3, host_s: float = 0.25e-3, max_batch_size: int = 256, max_seq_len: int = 4096):
        self.step_s, self.host_s = step_s, host_s
        self.build_config = SimpleNamespace(max_batch_size=max_batch_size, max_seq_len=max_seq_len)
        self.config = SimpleNamespace(vocab_size=50000)
        self.tokenizer = None
        self.engine_file = None
        self.model_dir = "stand-in"
        self._next = 0
        self._waiting: list[list[Any]] = []  # [request_id, tokens left]
        self._running: list[list[Any]] = []
        self.engine = SimpleNamespace(
            scheduler=SimpleNamespace(
                running=[],
                num_running=0,
                num_preemptions=0,
                block_manager=SimpleNamespace(num_used_blocks=0, num_free_blocks=1024),
            )
        )

    def served_model(self) -> StandInModel:
        """What the server's routes need of it (:func:`trtcore.serve.core.describe`)."""
        bc = self.build_config
        return StandInModel(self.model_dir, self.config.vocab_size, bc.max_seq_len, bc.max_batch_size)

    def add_request(self, prompt: list[int], params: Any) -> int:
        rid = self._next
        self._next += 1
        self._waiting.append([rid, params.max_tokens])
        return rid

    def abort_request(self, request_id: int) -> bool:
        for q in (self._waiting, self._running):
            for r in q:
                if r[0] == request_id:
                    q.remove(r)
                    return True
        return False

    def has_unfinished_requests(self) -> bool:
        return bool(self._waiting or self._running)

    def step(self) -> list[StreamOutput]:
        """Admit, spend the step's time, one token per running request."""
        start = time.perf_counter()
        free = self.build_config.max_batch_size - len(self._running)
        self._running += self._waiting[:free]
        del self._waiting[:free]
        sched = self.engine.scheduler
        sched.running = [SimpleNamespace(request_id=r[0]) for r in self._running]
        sched.num_running = len(self._running)
        while time.perf_counter() - start < self.host_s:
            pass
        rest = self.step_s - (time.perf_counter() - start)
        if rest > 0:
            time.sleep(rest)
        outs = []
        for r in self._running:
            r[1] -= 1
            outs.append(StreamOutput(r[0], 42, " tok", finish_reason="length" if r[1] == 0 else None))
        self._running = [r for r in self._running if r[1] > 0]
        return outs

    def close(self) -> None:
        pass


def offline_tok_s(concurrency: int, num_prompts: int, output_len: int, step_s: float, host_s: float) -> float:
    """The stand-in's own output tok/s at ``max_batch_size = concurrency``."""
    llm = StandInLLM(step_s, host_s, max_batch_size=concurrency)
    params = SimpleNamespace(max_tokens=output_len)
    for _ in range(num_prompts):
        llm.add_request([1], params)
    t0, n = time.perf_counter(), 0
    while llm.has_unfinished_requests():
        n += len(llm.step())
    return n / (time.perf_counter() - t0)


def serve_stand_in(step_s: float, host_s: float, max_batch_size: int, switch_interval_s: float | None = None) -> int:
    """Run the real server (:func:`trtcore.serve.server.run_server`) over a stand-in on a free port."""
    if switch_interval_s is not None:
        sys.setswitchinterval(switch_interval_s)
    from trtcore.serve.engine import AsyncEngine
    from trtcore.serve.metrics import ServerMetrics
    from trtcore.serve.server import run_server

    # the class by its module's name (this file's folder is on sys.path, which the engine
    # process inherits), not as __main__'s: the engine process unpickles the factory and the
    # server unpickles the stand-in's StandInModel
    from bench_serve_overhead import StandInLLM as stand_in

    engine = AsyncEngine(functools.partial(stand_in, step_s, host_s, max_batch_size), ServerMetrics("stand-in"))
    return run_server(engine, "stand-in", "127.0.0.1", 0)


def cpu_seconds(pid: int, children: bool = True) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) and, with ``children``,
    of its live descendants (the engine process), from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    if children:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                try:
                    total += cpu_seconds(int(child))
                except FileNotFoundError:
                    pass  # exited meanwhile
    return total


def server_metrics(url: str) -> dict[str, float]:
    """The ``_sum`` and ``_count`` samples of the server's ``/metrics``."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name.endswith(("_sum", "_count")):
                out[smp.name.removeprefix("trtcore:")] = smp.value
    return out


def mean_ms(m0: dict[str, float], m1: dict[str, float], name: str) -> float:
    """The mean of histogram ``name`` (seconds) over the samples between ``m0`` and ``m1``, in ms."""
    n = m1[f"{name}_seconds_count"] - m0.get(f"{name}_seconds_count", 0)
    return (m1[f"{name}_seconds_sum"] - m0.get(f"{name}_seconds_sum", 0)) / max(n, 1) * 1e3


def start_server(step_ms: float, host_ms: float, max_batch_size: int, extra: list[str]) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, __file__, "--serve", "--step-ms", str(step_ms), "--host-ms", str(host_ms), "--max-batch-size", str(max_batch_size), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith(_LISTENING):
            url = line[len(_LISTENING) :].strip()
            break
    else:
        raise RuntimeError(f"the server exited with status {proc.wait()}")
    import httpx

    for _ in range(600):
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the server did not get healthy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve", action="store_true", help="(internal) run the server over the stand-in")
    ap.add_argument("--step-ms", type=float, default=1.3, help="stand-in step time (default 1.3 ms, the H200's at batch 32)")
    ap.add_argument("--host-ms", type=float, default=0.25, help="stand-in host work per step holding the GIL (default 0.25 ms)")
    ap.add_argument("--max-batch-size", type=int, default=256)
    ap.add_argument("--concurrency", default="1,8,32,128")
    ap.add_argument("--prompts-per-client", type=int, default=4, help="requests per concurrent client (at least 32 requests)")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--switch-interval-ms", type=float, help="(experiment) the server's sys.setswitchinterval")
    ap.add_argument("--num-workers", type=int, default=1, help="load-generating processes (trtcore bench serve --num-workers; at most the clients)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--label", default="", help="a note stored in the JSON (e.g. the commit)")
    args = ap.parse_args()
    if args.serve:
        interval = args.switch_interval_ms / 1e3 if args.switch_interval_ms else None
        sys.exit(serve_stand_in(args.step_ms / 1e3, args.host_ms / 1e3, args.max_batch_size, interval))

    from trtcore.bench_serve import benchmark, random_prompts

    rows = []
    extra = ["--switch-interval-ms", str(args.switch_interval_ms)] if args.switch_interval_ms else []
    proc, url = start_server(args.step_ms, args.host_ms, args.max_batch_size, extra)
    try:
        for c in (int(x) for x in args.concurrency.split(",")):
            n = max(32, args.prompts_per_client * c)
            prompts = random_prompts(n, args.input_len, args.output_len, np.random.default_rng(0))
            workers = min(c, args.num_workers)
            asyncio.run(benchmark(url, prompts[: min(n, c)], max_concurrency=c, ignore_eos=True))  # warm-up
            cpu0, api0, m0 = cpu_seconds(proc.pid), cpu_seconds(proc.pid, False), server_metrics(url)
            rep = asyncio.run(benchmark(url, prompts, max_concurrency=c, ignore_eos=True, num_workers=workers))
            cpu, api, client = cpu_seconds(proc.pid) - cpu0, cpu_seconds(proc.pid, False) - api0, rep["client_cpu_s"]
            m1 = server_metrics(url)
            if rep["completed"] != n:
                raise RuntimeError(f"{n - rep['completed']} requests failed: {next(e for e in rep['errors'] if e)}")
            off = offline_tok_s(c, n, args.output_len, args.step_ms / 1e3, args.host_ms / 1e3)
            row = {
                "concurrency": c,
                "num_prompts": n,
                "client_workers": workers,
                "served_output_tok_s": rep["output_throughput"],
                "stand_in_tok_s": off,
                "ratio": rep["output_throughput"] / off,
                "ttft_p50_ms": rep["median_ttft_ms"],
                "tpot_p50_ms": rep["median_tpot_ms"],
                "itl_p99_ms": rep["p99_itl_ms"],
                "server_cpu_us_per_token": cpu / rep["total_output_tokens"] * 1e6,
                "server_cpu_busy": cpu / rep["duration"],
                "server_api_process_cpu_busy": api / rep["duration"],
                "client_cpu_busy": client / rep["duration"],
                "server_ttft_mean_ms": mean_ms(m0, m1, "time_to_first_token"),
                "server_itl_mean_ms": mean_ms(m0, m1, "inter_token_latency"),
            }
            rows.append(row)
            print(
                f"c={c:4d}  served {row['served_output_tok_s']:8.1f} tok/s  stand-in {off:8.1f} tok/s  ratio {row['ratio']:.2f}  "
                f"TTFT p50 {row['ttft_p50_ms']:.2f} ms  TPOT p50 {row['tpot_p50_ms']:.2f} ms  "
                f"server CPU {row['server_cpu_us_per_token']:.1f} us/token ({row['server_cpu_busy']:.2f} cores, "
                f"{row['server_api_process_cpu_busy']:.2f} in the HTTP process), "
                f"client {row['client_cpu_busy']:.2f} cores; the server's TTFT {row['server_ttft_mean_ms']:.2f} ms, ITL {row['server_itl_mean_ms']:.2f} ms",
                flush=True,
            )
    finally:
        proc.terminate()
        status = proc.wait(60)
    result = {
        "label": args.label,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()} {platform.processor()}, python {platform.python_version()}",
        "step_ms": args.step_ms,
        "host_ms": args.host_ms,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "server_exit_status": status,
        "rows": rows,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
