"""Decode-step time of trtcore's cuda engine against transformers, and the GB/s of its GEMMs.

For random bfloat16 weights in the shapes of SmolLM2-135M, Llama-3.2-1B and Llama-3-8B
(:mod:`trtcore.cuda.synthetic`; the 8B weights are slices of one random pool, made in
seconds), the network every backend builds (paged KV cache, RoPE and paged-attention
plugins) is compiled by the cuda backend and one decode step (batch 1, and 16 for the 8B
shape; 128 cached tokens per sequence) is captured in a CUDA graph and replayed; the
replay's logits must equal the eager call's. In the same run:

* the device-to-device copy bandwidth (bytes read + written over time, 2 GiB buffers);
  weight bytes / that bandwidth is the weight-streaming limit of a batch-1 step;
* transformers' ``generate`` with its static cache as it runs by default (auto-compiled, warmed up; prompt 128, 128 new tokens, greedy, the
  same random-weight shapes in bfloat16, its default attention): TPOT = (time of 128 new tokens -
  time of 1 new token) / 127;
* every GEMM of one decoder layer and the LM head at batch 1, alone, 20 launches captured in
  a graph: achieved GB/s = (weights + activations) bytes / time.

The build times each GEMM shape's tactics (cuBLAS ``gemm_ex``, cuBLASLt heuristics and their
split-K variants, the generated GEMV kernel: :mod:`trtcore.cuda.tactics`); the engine's step
is timed with the chosen tactics (``tuned``) and with every GEMM on ``gemm_ex``
(``TRTCORE_CUDA_GEMV=0``, ``cublas``), and their logits are compared; also without
programmatic dependent launch (``TRTCORE_CUDA_PDL=0``, ``no_pdl``) and, at batch 1, with every
GEMM the GEMV kernel can run on it (``TRTCORE_CUDA_GEMV=1``, ``gemv``: with its fused prologues). A second build of the
same network reads every tactic from the timing cache (``rebuild_s``, ``rebuild_log``).

Profile (``profile``): every launch of the tuned step alone, 20 captured in a graph, median of
``--reps``; per launch kind (norm, GEMM by role, RoPE, attention, ...): count and total
microseconds, against the whole step's time.

Method (METHOD.md): CUDA events around graph replays, warm-up first, median of ``--reps``.
Writes ``engine.json`` and ``engine.png`` under ``--out`` and prints a table last.

    python bench/bench_engine.py --out $OUT
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

TARGETS_MS = {"SmolLM2-135M": 0.8, "Llama-3.2-1B": 1.2}


#: the environment of each timed variant of the step besides ``tuned`` (see the module docstring)
VARIANT_ENV = {"no_pdl": {"TRTCORE_CUDA_PDL": "0"}, "gemv": {"TRTCORE_CUDA_GEMV": "1"}, "cublas": {"TRTCORE_CUDA_GEMV": "0"}}


def _median_ms(cp: Any, fn: Any, reps: int, warmup: int = 3) -> float:
    stream = cp.cuda.get_current_stream()
    for _ in range(warmup):
        fn()
    stream.synchronize()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(reps):
        a.record(stream)
        fn()
        b.record(stream)
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b))
    return statistics.median(times)


def copy_bandwidth(cp: Any) -> float:
    """Bytes/s of a 2 GiB device-to-device copy (read + write)."""
    n = 2 << 30
    src = cp.random.random(n // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    ms = _median_ms(cp, lambda: dst.__setitem__(Ellipsis, src), 20)
    return 2 * n / (ms * 1e-3)


def build(name: str, batch: int) -> tuple[Any, Any, dict[str, Any]]:
    import trtcore.cuda as tc
    from trtcore.builder import BuildConfig, _builder_config, define_network
    from trtcore.cuda import synthetic

    cfg = synthetic.config(name)
    bc = BuildConfig(dtype="bfloat16", max_batch_size=batch, max_seq_len=256, opt_batch_size=batch, opt_seq_len=1,
                     max_num_tokens=max(batch, 16), max_num_blocks=batch * 16 + 16, kv_cache="paged")
    t0 = time.perf_counter()
    d = define_network(tc, cfg, synthetic.RandomWeights(seed=1), bc)
    t1 = time.perf_counter()
    engine = d.builder.build_engine(d.network, _builder_config(d, None))
    t2 = time.perf_counter()
    weight_bytes = sum(int(a.nbytes) for a in engine.plan.graph.constants.values())
    info = {"define_s": t1 - t0, "build_s": t2 - t1, "weight_bytes": weight_bytes, "build_log": engine.build_log,
            "kernels": len(engine.kernels), "device_memory_bytes": engine.device_memory_size_v2}
    del d
    gc.collect()
    return engine, cfg, info


def step_profile(cp: Any, engine: Any, ctx: Any, reps: int) -> dict[str, Any]:
    """Every launch of the prepared step alone (20 per graph): time per launch kind."""
    import re

    steps = next(iter(ctx._prepared.values()))
    kinds = {k.name: k.kind for k in engine.plan.kernels}
    stream = cp.cuda.Stream(non_blocking=True)
    by: dict[str, dict[str, float]] = {}
    total = 0.0
    for s in steps:
        if s.kind == "skip":
            continue
        with stream:
            ctx._launch(s, stream.ptr)
            stream.begin_capture()
            for _ in range(20):
                ctx._launch(s, stream.ptr)
            graph = stream.end_capture()
            us = _median_ms(cp, lambda g=graph: g.launch(stream), reps) / 20 * 1e3
        base = s.name.removesuffix("#gemv")
        kind = kinds.get(base, s.kind) + ("#gemv" if s.name.endswith("#gemv") else "")
        if s.kind == "gemm" and s.tactics:
            kind += "#" + "+".join(sorted({t["kind"] for t in s.tactics}))
        role = re.sub(r"model\.layers\.\d+\.", "", base.split(":", 1)[-1])
        key = f"{kind}:{role}"
        e = by.setdefault(key, {"count": 0, "us": 0.0})
        e["count"] += 1
        e["us"] += us
        total += us
    return {"launches": sum(int(e["count"]) for e in by.values()), "sum_us": total,
            "by_kind": dict(sorted(by.items(), key=lambda kv: -kv[1]["us"]))}


def decode_feeds(cfg: Any, engine: Any, batch: int, ctx_len: int = 128) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    pool_shape = list(engine.get_tensor_profile_shape("kv_cache_pool", 0)[2])
    blocks_per_seq = -(-(ctx_len + 1) // 16)
    pool_shape[1] = batch * blocks_per_seq
    return {
        "input_ids": rng.integers(0, cfg.vocab_size, size=batch).astype(np.int32),
        "position_ids": np.full(batch, ctx_len, np.int32),
        "kv_cache_pool": tuple(pool_shape),  # type: ignore[dict-item]  # allocated on the device
        "block_tables": np.arange(batch * blocks_per_seq, dtype=np.int32).reshape(batch, blocks_per_seq),
        "seq_lens": np.full(batch, ctx_len + 1, np.int32),
        "query_start_loc": np.arange(batch + 1, dtype=np.int32),
        "last_token_ids": np.arange(batch, dtype=np.int32),
    }


def run_engine(cp: Any, engine: Any, cfg: Any, batch: int, reps: int) -> dict[str, Any]:
    ctx = engine.create_execution_context()
    feeds = decode_feeds(cfg, engine, batch)
    dev: dict[str, Any] = {}
    for name, arr in feeds.items():
        if isinstance(arr, tuple):
            x = cp.random.RandomState(0).standard_normal(arr, dtype=cp.float32) * 0.5  # the same cache for every tactic
            d = (x.view(cp.uint32) >> 16).astype(cp.uint16)  # bfloat16 (truncated) of random normals
            shape = arr
        else:
            d = cp.asarray(arr)
            shape = arr.shape
        dev[name] = d
        assert ctx.set_input_shape(name, shape), name
        ctx.set_tensor_address(name, int(d.data.ptr))
    logits = cp.empty(ctx.get_tensor_shape("logits"), cp.float32)
    ctx.set_tensor_address("logits", int(logits.data.ptr))
    stream = cp.cuda.Stream(non_blocking=True)
    pool0 = dev["kv_cache_pool"].copy()
    with stream:
        ctx.execute_async_v3(stream.ptr)
        stream.synchronize()
        dev["kv_cache_pool"][...] = pool0
        ctx.execute_async_v3(stream.ptr)
        stream.synchronize()
        eager = logits.copy()
        stream.begin_capture()
        ctx.execute_async_v3(stream.ptr)
        graph = stream.end_capture()
        dev["kv_cache_pool"][...] = pool0
        logits.fill(0)
        graph.launch(stream)
        stream.synchronize()
        equal = bool(cp.array_equal(logits, eager))
        finite = bool(cp.isfinite(eager).all())
        ms = _median_ms(cp, lambda: graph.launch(stream), reps)
        eager_ms = _median_ms(cp, lambda: ctx.execute_async_v3(stream.ptr), max(3, reps // 10))
    return {"step_ms": ms, "eager_step_ms": eager_ms, "graph_equals_eager": equal, "finite": finite, "ctx": ctx, "dev": dev,
            "logits": cp.asnumpy(eager)}


def gemm_bandwidth(cp: Any, engine: Any, ctx: Any, reps: int) -> list[dict[str, Any]]:
    """Each GEMM of layer 0 and the LM head at the prepared batch, alone, 20 per graph."""
    from trtcore.cuda.gemm import gemm_bytes

    steps = next(iter(ctx._prepared.values()))
    by_name = {n.name: n for n in engine.plan.graph.nodes}
    out = []
    stream = cp.cuda.Stream(non_blocking=True)
    for s in steps:
        gemv = s.name.endswith("#gemv")
        if s.kind != "gemm" and not gemv:
            continue
        layers = by_name[s.name.removesuffix("#gemv")].layers
        if not (any(x.startswith("model.layers.0.") for x in layers) or "lm_head" in s.name):
            continue
        with stream:
            for _ in range(2):
                ctx._launch(s, stream.ptr)
            stream.begin_capture()
            for _ in range(20):
                ctx._launch(s, stream.ptr)
            graph = stream.end_capture()
            ms = _median_ms(cp, lambda g=graph: g.launch(stream), reps) / 20
        if gemv:
            m, n, k = (int(a[0]) for a in s.args[3:6])
            nbytes = (n * k + m * k + m * n) * engine.plan.graph.values[by_name[s.name.removesuffix("#gemv")].outputs[0]].dtype.itemsize
        else:
            nbytes = gemm_bytes(s.calls, s.dtype)
            m, n, k = s.calls[0].n, s.calls[0].m, s.calls[0].k
        out.append({"name": s.name, "m": m, "n": n, "k": k, "ms": ms, "bytes": nbytes, "GBps": nbytes / (ms * 1e-3) / 1e9})
    return out


def hf_tpot(name: str, batch: int, prompt: int = 128, new: int = 128) -> dict[str, Any]:
    """transformers' ``generate`` with ``cache_implementation="static"`` as it runs by default
    (its decode step auto-compiled by torch.compile), warmed up with the same lengths first."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from trtcore.cuda import synthetic

    shape = dict(synthetic.SHAPES[name])
    shape.pop("architectures"), shape.pop("model_type")
    config = LlamaConfig(**shape)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # initialize in bfloat16 on the GPU directly (8B in seconds)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)
    ids = torch.randint(3, config.vocab_size, (batch, prompt), device="cuda")

    def gen(n: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           cache_implementation="static", pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - t

    t0 = time.perf_counter()
    gen(new), gen(1)  # compiles
    warm = time.perf_counter() - t0
    t1 = statistics.median(gen(1) for _ in range(3))
    tn = statistics.median(gen(new) for _ in range(2))
    model.to("meta")  # frees the GPU memory before the next model
    gc.collect()
    torch.cuda.empty_cache()
    tpot = (tn - t1) / (new - 1) * 1e3
    return {"tpot_ms": tpot, "tok_per_s": batch * 1e3 / tpot, "warmup_s": warm}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--models", default="SmolLM2-135M,Llama-3.2-1B,Llama-3-8B")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--no-hf", action="store_true", help="skip transformers")
    ap.add_argument("--hf", default="Llama-3-8B", help="models timed with transformers (8B: batch 16 only; compiling costs minutes)")
    args = ap.parse_args()
    import cupy as cp

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth(cp)
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    results: dict[str, Any] = {"copy_bandwidth_Bps": bw, "models": []}
    for name in args.models.split(","):
        batches = [1, 16] if name == "Llama-3-8B" else [1]
        engine, cfg, info = build(name, max(batches))  # one engine; each batch is a shape of its profile
        info["gemm_tactics"] = {sig: {k: v for k, v in t.items() if k != "algo"} for sig, t in engine.plan.tactics.items()}
        t0 = time.perf_counter()
        again, _, _ = build(name, max(batches))  # the timing cache answers every shape
        info["rebuild_s"] = time.perf_counter() - t0
        info["rebuild_log"] = [line for line in again.build_log if line.startswith("GEMM tactics")]
        print("  build:", [line for line in info["build_log"] if line.startswith("GEMM tactics")], "rebuild:", info["rebuild_log"], flush=True)
        del again
        gc.collect()
        for batch in batches:
            entry = {"model": name, "batch": batch, **info, "streaming_limit_ms": info["weight_bytes"] / bw * 1e3, "tactics": {}}
            logits = {}
            # the build's timed choices; the same without programmatic dependent launch; every
            # GEMM the GEMV kernel can run on it (batch 1); every GEMM on cublasGemmEx
            for tactic in ("tuned", "no_pdl", "gemv", "cublas") if batch == 1 else ("tuned", "no_pdl", "cublas"):
                os.environ.pop("TRTCORE_CUDA_GEMV", None)
                os.environ.pop("TRTCORE_CUDA_PDL", None)
                if tactic in VARIANT_ENV:
                    os.environ.update(VARIANT_ENV[tactic])
                r = run_engine(cp, engine, cfg, batch, args.reps)
                gemms = gemm_bandwidth(cp, engine, r["ctx"], args.reps) if batch == 1 else []
                entry["tactics"][tactic] = {"step_ms": r["step_ms"], "eager_step_ms": r["eager_step_ms"], "graph_equals_eager": r["graph_equals_eager"],
                                            "finite": r["finite"], "gemms": gemms}
                if tactic == "tuned":
                    entry["profile"] = step_profile(cp, engine, r["ctx"], args.reps)
                    print(f"  profile: {entry['profile']['launches']} launches, sum {entry['profile']['sum_us']:.1f} us (step {r['step_ms'] * 1e3:.1f} us)")
                    for k, e in entry["profile"]["by_kind"].items():
                        print(f"    {k[:70]:70s} x{int(e['count']):4d} {e['us']:8.1f} us  ({e['us'] / e['count']:.2f} us each)")
                logits[tactic] = r["logits"].astype(np.float64)
                for gm in gemms:
                    print(f"  {tactic} {gm['name'][:56]:56s} M={gm['m']} N={gm['n']} K={gm['k']} {gm['ms'] * 1e3:7.1f} us {gm['GBps']:6.0f} GB/s", flush=True)
                del r
                gc.collect()
            os.environ.pop("TRTCORE_CUDA_GEMV", None)
            os.environ.pop("TRTCORE_CUDA_PDL", None)
            entry["tuned_vs_cublas_rel_l2"] = float(np.linalg.norm(logits["tuned"] - logits["cublas"]) / np.linalg.norm(logits["cublas"]))
            entry.update({k: v for k, v in entry["tactics"]["tuned"].items() if k != "gemms"})
            entry["fraction_of_streaming_limit"] = entry["streaming_limit_ms"] / entry["step_ms"]
            results["models"].append(entry)
            print(json.dumps({k: v for k, v in entry.items() if k not in ("tactics", "build_log")}), flush=True)
        del engine
        gc.collect()
        cp.get_default_memory_pool().free_all_blocks()
        if not args.no_hf and name in args.hf.split(","):
            for entry in results["models"]:
                if entry["model"] != name or entry["batch"] not in (1, 16) or (name == "Llama-3-8B" and entry["batch"] != 16):
                    continue
                try:
                    entry["transformers"] = hf_tpot(name, entry["batch"])
                except Exception as exc:  # noqa: BLE001 - record and go on
                    entry["transformers"] = {"error": repr(exc)}
                print(f"  transformers {name} B={entry['batch']}: {entry['transformers']}", flush=True)
        (out / "engine.json").write_text(json.dumps(results, indent=1, default=str))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4))
        labels = [f"{m['model']}\nB={m['batch']}" for m in results["models"]]
        x = np.arange(len(labels))
        ax.bar(x - 0.2, [m["step_ms"] for m in results["models"]], 0.4, label="trtcore cuda (graph)")
        ax.bar(x + 0.2, [m.get("transformers", {}).get("tpot_ms", 0) for m in results["models"]], 0.4, label="transformers static TPOT")
        ax.scatter(x, [m["streaming_limit_ms"] for m in results["models"]], color="k", marker="_", s=400, label="weight streaming limit")
        ax.set_xticks(x, labels)
        ax.set_ylabel("ms per decode step")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "engine.png", dpi=120)
    except Exception as exc:  # noqa: BLE001
        print(f"no plot: {exc}")
    print(f"\n{'model':14s} {'B':>3s} {'step ms':>8s} {'no_pdl':>8s} {'gemv':>8s} {'cublas':>8s} {'limit ms':>9s} {'% limit':>8s} {'HF ms':>8s} {'graph==eager':>12s}")
    for m in results["models"]:
        hf = m.get("transformers", {}).get("tpot_ms", float("nan"))
        tt = {k: v["step_ms"] for k, v in m["tactics"].items()}
        print(
            f"{m['model']:14s} {m['batch']:3d} {m['step_ms']:8.3f} {tt['no_pdl']:8.3f} {tt.get('gemv', float('nan')):8.3f} {tt['cublas']:8.3f} "
            f"{m['streaming_limit_ms']:9.3f} {100 * m['fraction_of_streaming_limit']:7.1f}% {hf:8.3f} {m['graph_equals_eager']!s:>12s}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
