"""``trtcore serve`` under load on the GPU against the offline engine (issue 11's H200 line).

One process tree, one GPU, one model (the default model, or ``--model DIR``):

1. the offline throughput of ``trtcore bench throughput`` (``LLM.generate`` of ``--num-prompts``
   requests of ``--input-len`` prompt / ``--output-len`` output tokens, EOS ignored, greedy) at
   ``--max-batch-size`` equal to each concurrency measured below, in one process;
2. ``trtcore serve`` started as a real process (``--port 0``, its announced port read from its
   stderr), waited on until ``GET /health`` answers 200;
3. ``trtcore bench serve`` against it at each ``--concurrency`` (``--max-concurrency``; random
   prompts of exactly ``--input-len`` tokens, ``ignore_eos``, greedy; ``--prompts-per-client``
   requests per client; ``--client-workers`` load-generating processes, so that the client's
   own CPU is not what is measured), vLLM's metrics, with the client's and the server's CPU
   time and the server's own TTFT and queue time;
4. SIGTERM to the server (it drains and must exit 0).

The served output tok/s over the offline tok/s at the same concurrency is the server's overhead
(HTTP, SSE streaming, detokenization, the asyncio engine loop). Writes ``serve_gpu.json`` (every
report), ``serve_gpu.png`` (TTFT / TPOT p50 and p99 and tok/s against the concurrency) under
``--out`` and prints a table::

    python bench/bench_serve_gpu.py --out $OUT/serve [--model DIR] [--concurrency 1,8,32,128]

The default model is ``$TRTCORE_DEFAULT_MODEL_DIR`` (``scripts/gpu-check`` converts the carried
GGUF there), else :func:`trtcore.default_model.default_model_dir`. A machine without network needs
the ``serve`` extra as wheels: fastapi, starlette, pydantic, pydantic-core, annotated-types,
typing-inspection, uvicorn, httptools, and for the load generator aiohttp with multidict, yarl,
propcache, frozenlist, aiosignal, aiohappyeyeballs and attrs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve_overhead import cpu_seconds, mean_ms, server_metrics  # noqa: E402


def _trtcore(*args: str) -> list[str]:
    return [sys.executable, "-m", "trtcore.cli", *args]


def _model_dir(arg: str | None) -> str:
    if arg:
        return arg
    env = os.environ.get("TRTCORE_DEFAULT_MODEL_DIR")
    if env:
        return env
    from trtcore.default_model import default_model_dir

    return str(default_model_dir(progress=False))


def offline(model: str, backend: str, batch: int, num_prompts: int, input_len: int, output_len: int, out: Path) -> dict[str, Any]:
    """``trtcore bench throughput`` at ``max_batch_size=batch``; its report's row."""
    path = out / f"offline-b{batch}.json"
    cmd = _trtcore(
        "bench", "throughput", "--model", model, "--backend", backend, "--num-prompts", str(num_prompts),
        "--max-batch-size", str(batch), "--input-len", str(input_len), "--output-len", str(output_len), "--json", str(path),
    )  # fmt: skip
    subprocess.run(cmd, check=True)
    report = json.loads(path.read_text())
    return report["results"][0]


def start_server(model: str, backend: str, max_batch_size: int, max_seq_len: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``trtcore serve`` on a free port; returns the process and its base URL once
    ``/health`` answers 200.

    Raises:
        RuntimeError: the server exited, or did not announce a port or get healthy in 600 s.
    """
    err = open(log, "wb")  # noqa: SIM115 - the server writes it for its whole life
    cmd = _trtcore(
        "serve", "--model", model, "--backend", backend, "--port", "0", "--max-batch-size", str(max_batch_size),
        "--max-seq-len", str(max_seq_len), "--log-level", "warning",
    )  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 600
    url = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"trtcore serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
        if url is None:
            m = re.search(r"http://127\.0\.0\.1:(\d+)", log.read_text(errors="replace"))
            if m:
                url = f"http://127.0.0.1:{m.group(1)}"
        if url is not None:
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return proc, url
            except OSError:
                pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"trtcore serve did not get healthy in 600 s: {log.read_text()[-2000:]}")


def load(url: str, model: str, concurrency: int, num_prompts: int, input_len: int, output_len: int, out: Path, server_pid: int, workers: int = 1) -> dict[str, Any]:
    """``trtcore bench serve`` at ``--max-concurrency concurrency``; its report, with where the
    time went: ``client_cpu_s`` (the load generator's processes while sending), ``server_cpu_s``
    (the server process and its engine process) and the server's own mean queue time and TTFT over the run
    (``server_queue_time_mean_ms``, ``server_ttft_mean_ms``: its ``/metrics`` histograms)."""
    path = out / f"serve-c{concurrency}.json"
    cmd = _trtcore(
        "bench", "serve", "--base-url", url, "--max-concurrency", str(concurrency), "--num-prompts", str(num_prompts),
        "--input-len", str(input_len), "--output-len", str(output_len), "--tokenizer", model, "--ignore-eos", "--json", str(path),
        "--num-workers", str(workers),
    )  # fmt: skip
    m0, server0 = server_metrics(url), cpu_seconds(server_pid)
    subprocess.run(cmd, check=True)
    m1, server1 = server_metrics(url), cpu_seconds(server_pid)
    report = json.loads(path.read_text())  # with client_cpu_s, the load generator's own
    report["server_cpu_s"] = server1 - server0
    report["server_queue_time_mean_ms"] = mean_ms(m0, m1, "request_queue_time")
    report["server_ttft_mean_ms"] = mean_ms(m0, m1, "time_to_first_token")
    return report


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """TTFT / TPOT p50 and p99 (ms, log scale) and served and offline tok/s against the concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = [r["concurrency"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for key, style in (("ttft", "o-"), ("tpot", "s-")):
        a.plot(c, [r[f"median_{key}_ms"] for r in rows], style, label=f"{key.upper()} p50")
        a.plot(c, [r[f"p99_{key}_ms"] for r in rows], style.replace("-", "--"), label=f"{key.upper()} p99")
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xlabel("concurrent clients")
    a.set_ylabel("ms")
    a.legend()
    a.grid(alpha=0.3)
    b.plot(c, [r["output_throughput"] for r in rows], "o-", label="trtcore serve")
    b.plot(c, [r["offline_output_throughput"] for r in rows], "s--", label="offline (bench throughput)")
    b.set_xscale("log", base=2)
    b.set_xlabel("concurrent clients (offline: max_batch_size)")
    b.set_ylabel("output tokens/s")
    b.legend()
    b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--model", help="model folder (default: the default model)")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--concurrency", default="1,8,32,128")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--prompts-per-client", type=int, default=8, help="requests per concurrent client (at least 32 in all)")
    ap.add_argument(
        "--client-workers", type=int, default=4, help="load-generating processes (bench serve --num-workers), at most the clients (default 4)"
    )
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = _model_dir(args.model)
    levels = [int(c) for c in args.concurrency.split(",")]
    max_seq_len = 1 << (args.input_len + args.output_len + 16).bit_length()
    n = {c: max(32, args.prompts_per_client * c) for c in levels}

    rows = [{"concurrency": c, "offline": offline(model, args.backend, c, n[c], args.input_len, args.output_len, out)} for c in levels]
    proc, url = start_server(model, args.backend, max(levels), max_seq_len, out / "server.log")
    try:
        for row in rows:
            c = row["concurrency"]
            rep = load(url, model, c, n[c], args.input_len, args.output_len, out, proc.pid, min(c, args.client_workers))
            row.update({k: v for k, v in rep.items() if not isinstance(v, list)})
            row["offline_output_throughput"] = row["offline"]["output_throughput"]
            row["served_over_offline"] = row["output_throughput"] / row["offline_output_throughput"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = "killed after 120 s"
    report = {"model": model, "backend": args.backend, "input_len": args.input_len, "output_len": args.output_len, "server_exit": rc, "rows": rows}
    (out / "serve_gpu.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(rows, out / "serve_gpu.png")
    print(f"\ntrtcore serve, {Path(model).name} on {args.backend}, {args.input_len} in / {args.output_len} out, greedy, EOS ignored")
    print(
        f"{'clients':>7} {'reqs':>5} {'tok/s':>9} {'offline':>9} {'ratio':>6} {'TTFT p50/p99 ms':>17} {'TPOT p50/p99 ms':>17} {'ITL p99':>8} {'E2E p99':>8}"
        f" {'client/server cores':>19} {'server TTFT/queue ms':>20}"
    )
    for r in rows:
        print(
            f"{r['concurrency']:>7} {r['completed']:>5} {r['output_throughput']:>9.1f} {r['offline_output_throughput']:>9.1f} "
            f"{r['served_over_offline']:>6.2f} {r['median_ttft_ms']:>8.2f}/{r['p99_ttft_ms']:<8.2f} "
            f"{r['median_tpot_ms']:>8.3f}/{r['p99_tpot_ms']:<8.3f} {r['p99_itl_ms']:>8.3f} {r['p99_e2el_ms']:>8.1f}"
            f" {r['client_cpu_s'] / r['duration']:>9.2f}/{r['server_cpu_s'] / r['duration']:<9.2f}"
            f" {r['server_ttft_mean_ms']:>9.2f}/{r['server_queue_time_mean_ms']:<9.2f}"
        )
    print(f"server exit status after SIGTERM: {rc}")
    return 0 if rc == 0 and all(r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
