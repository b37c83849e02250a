#!/usr/bin/env python3
"""Benchmark the fused RoPE plugin (``trtcore_rope``) on the GPU, against the device's copy
bandwidth and Hugging Face transformers' rotary embedding, measured in the same run.

    python bench/bench_rope.py --out bench/results/rope-h200.json

What is measured (CUDA events, warm-up first, median of ``--rounds`` measurements of
``--launches`` back-to-back launches each; inputs rotate among several buffer sets so that
no run finds its data in the 60 MB L2 cache; random inputs):

* ``copy``: the device's copy bandwidth, a large device-to-device copy (``cudaMemcpyAsync``
  and CuPy's elementwise copy; bytes read + bytes written; the larger is the ceiling);
* ``rope``: the plugin's kernel at ``--tokens`` tokens x ``--heads`` q heads x
  ``--kv-heads`` k heads x ``--head-dim``, bfloat16 (plus a few other variants): its bytes
  are the fewest it must move -- q and k read once and written once, plus the positions
  and inv_freq -- over its time, and that as a fraction of the copy bandwidth;
* ``hf``: transformers' ``apply_rotary_pos_emb`` (Llama) with precomputed bfloat16 cos/sin
  on the same shapes in its own layout ``[1, heads, tokens, head_dim]``, timed the same
  way; reported as time and as effective bandwidth over the same byte count.

The kernel's output is checked against the NumPy reference first (``check_plugin`` on the
benchmark shape). Writes everything as JSON to ``--out`` and prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)


def _median_ms(times: list[float]) -> float:
    return float(statistics.median(times))


def time_events(cp: Any, fn: Any, *, rounds: int, launches: int, warmup: int, stream: Any) -> list[float]:
    """Per-launch device times (ms) of ``fn(i)``: ``launches`` calls between two events on
    ``stream``, ``rounds`` times, after ``warmup`` calls."""
    for i in range(warmup):
        fn(i)
    stream.synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    out = []
    n = 0
    for _ in range(rounds):
        start.record(stream)
        for _ in range(launches):
            fn(n)
            n += 1
        end.record(stream)
        end.synchronize()
        out.append(cp.cuda.get_elapsed_time(start, end) / launches)
    return out


def bench_copy(cp: Any, nbytes: int, rounds: int) -> dict[str, Any]:
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        src = cp.arange(nbytes // 4, dtype=cp.int32)  # not zeros
        dst = cp.empty_like(src)
    rows: dict[str, dict[str, Any]] = {}

    def memcpy(_: int) -> None:
        dst.data.copy_from_device_async(src.data, nbytes, stream)

    def elementwise(_: int) -> None:
        with stream:
            cp.copyto(dst, src)

    for name, fn in (("memcpy", memcpy), ("cupy_copyto", elementwise)):
        t = time_events(cp, fn, rounds=rounds, launches=5, warmup=3, stream=stream)
        ms = _median_ms(t)
        rows[name] = {"time_us": ms * 1e3, "bytes": 2 * nbytes, "bandwidth_GBps": 2 * nbytes / (ms * 1e-3) / 1e9, "times_us": [x * 1e3 for x in t]}
    stream.synchronize()
    assert bool((dst == src).all()), "copy is wrong"
    best = max(float(r["bandwidth_GBps"]) for r in rows.values())
    return {"buffer_bytes": nbytes, "variants": rows, "bandwidth_GBps": best}


def _rope_sets(cp: Any, plugin: Any, specs: list[Any], sets: int, seed: int) -> tuple[list[Any], Any]:
    from trtcore.testing import _DeviceRun, make_inputs

    stream = cp.cuda.Stream(non_blocking=True)
    host = make_inputs(specs, np.random.default_rng(seed))
    runs = [_DeviceRun(cp, plugin, host, stream) for _ in range(sets)]
    return runs, stream


def bench_rope(cp: Any, plugin: Any, T: int, nq: int, nk: int, dtype: Any, rounds: int, launches: int) -> dict[str, Any]:
    specs = plugin.input_specs(T, nq, nk, dtype, max_position=max(T, 8192))
    dtype = np.dtype(dtype)
    qk = T * (nq + nk) * plugin.head_dim * dtype.itemsize
    nbytes = 2 * qk + 4 * T + 4 * (plugin.rotary_dim // 2) + (4 * T if plugin.dynamic else 0)
    sets = max(2, min(8, -(-4 * 60_000_000 // nbytes)))
    runs, stream = _rope_sets(cp, plugin, specs, sets, seed=1)
    t = time_events(cp, lambda i: runs[i % sets].enqueue(), rounds=rounds, launches=launches, warmup=5, stream=stream)
    # host cost of one enqueue (Python argument packing + cuLaunchKernel), kernels queued
    h0 = time.perf_counter()
    for i in range(200):
        runs[i % sets].enqueue()
    host_us = (time.perf_counter() - h0) / 200 * 1e6
    stream.synchronize()
    ms = _median_ms(t)
    vec = plugin.vector_width(dtype)
    fn = plugin.kernel(dtype, vec)
    return {
        "plugin": repr(plugin),
        "dtype": str(dtype),
        "num_tokens": T,
        "num_q_heads": nq,
        "num_k_heads": nk,
        "bytes": nbytes,
        "time_us": ms * 1e3,
        "times_us": [x * 1e3 for x in t],
        "bandwidth_GBps": nbytes / (ms * 1e-3) / 1e9,
        "host_enqueue_us": host_us,
        "buffer_sets": sets,
        "block": plugin.block_size(nq, nk, vec),
        "vec": vec,
        "registers": fn.attribute("NUM_REGS"),
        "local_bytes": fn.attribute("LOCAL_SIZE_BYTES"),
    }


def bench_tuning(cp: Any, T: int, nq: int, nk: int, hd: int, rounds: int, launches: int) -> list[dict[str, Any]]:
    """The bf16 neox kernel with other ``UNROLL`` defines and block sizes (the plugin uses
    UNROLL 4 and ``block_size``), same inputs and timing: is the default the best?"""
    from trtcore import kernels
    from trtcore.plugins.rope import RopePlugin

    plugin = RopePlugin(hd, hd)
    runs, stream = _rope_sets(cp, plugin, plugin.input_specs(T, nq, nk, BF16), 3, seed=3)
    nbytes = 2 * T * (nq + nk) * hd * 2 + 4 * T + 4 * (hd // 2)
    rows = []
    for unroll in (1, 2, 4, 8):
        defines = {**plugin.defines(BF16, 8), "UNROLL": unroll}
        fn = kernels.compile_kernel("rope", defines=defines).function("trtcore_rope")
        for block in (64, 128, 256):
            def launch(i: int, fn: Any = fn, block: int = block) -> None:
                r = runs[i % len(runs)]
                q, k, pos, inv = r.in_desc
                qo, ko = r.out_desc
                fn.launch((T,), (block,), [
                    (q.ptr, "ptr"), (k.ptr, "ptr"), (pos.ptr, "ptr"), (inv.ptr, "ptr"), (0, "ptr"),
                    (qo.ptr, "ptr"), (ko.ptr, "ptr"), (nq, "i32"), (nk, "i32"),
                    (1.0, "f32"), (10000.0, "f32"), (0.0, "f32"), (0, "i32")], stream=stream)

            t = time_events(cp, launch, rounds=max(10, rounds // 3), launches=launches, warmup=3, stream=stream)
            ms = _median_ms(t)
            rows.append({"unroll": unroll, "block": block, "registers": fn.attribute("NUM_REGS"), "time_us": ms * 1e3, "bandwidth_GBps": nbytes / (ms * 1e-3) / 1e9})
    return rows


def bench_hf(cp: Any, T: int, nq: int, nk: int, head_dim: int, rounds: int, launches: int, nbytes: int) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama as hf

    dev = torch.device("cuda")
    cfg = LlamaConfig(hidden_size=nq * head_dim, num_attention_heads=nq, num_key_value_heads=nk, head_dim=head_dim, max_position_embeddings=max(T, 8192))
    rotary = hf.LlamaRotaryEmbedding(cfg).to(dev)
    g = torch.Generator(device=dev).manual_seed(2)
    sets = max(2, min(8, -(-4 * 60_000_000 // nbytes)))
    data = [
        (
            torch.randn(1, nq, T, head_dim, device=dev, dtype=torch.bfloat16, generator=g),
            torch.randn(1, nk, T, head_dim, device=dev, dtype=torch.bfloat16, generator=g),
        )
        for _ in range(sets)
    ]
    pos = torch.arange(T, device=dev)[None]
    cos, sin = rotary(data[0][0], pos)  # [1, T, head_dim] bfloat16, precomputed
    assert cos.dtype == torch.bfloat16
    stream = torch.cuda.Stream()
    ts = []
    with torch.cuda.stream(stream):
        for i in range(5):
            hf.apply_rotary_pos_emb(*data[i % sets], cos, sin)
        stream.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n = 0
        for _ in range(rounds):
            start.record(stream)
            for _ in range(launches):
                hf.apply_rotary_pos_emb(*data[n % sets], cos, sin)
                n += 1
            end.record(stream)
            end.synchronize()
            ts.append(start.elapsed_time(end) / launches)
    ms = _median_ms(ts)
    return {
        "impl": "transformers.models.llama.modeling_llama.apply_rotary_pos_emb (eager, precomputed bf16 cos/sin)",
        "layout": "[1, heads, tokens, head_dim]",
        "torch": torch.__version__,
        "time_us": ms * 1e3,
        "times_us": [x * 1e3 for x in ts],
        "bytes_counted": nbytes,
        "bandwidth_GBps": nbytes / (ms * 1e-3) / 1e9,
        "buffer_sets": sets,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON result file")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--copy-bytes", type=int, default=1 << 30, help="source buffer of the copy benchmark")
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness check")
    ap.add_argument("--no-tune", action="store_true", help="skip the UNROLL x block-size sweep")
    args = ap.parse_args(argv)

    from trtcore.plugins.rope import RopePlugin
    from trtcore.testing import check_plugin, require_gpu

    cp = require_gpu()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    T, nq, nk, hd = args.tokens, args.heads, args.kv_heads, args.head_dim
    result: dict[str, Any] = {
        "device": name,
        "compute_capability": f"{props['major']}.{props['minor']}",
        "l2_bytes": int(props.get("l2CacheSize", 0)),
        "python": platform.python_version(),
        "cupy": cp.__version__,
        "shape": {"num_tokens": T, "num_q_heads": nq, "num_k_heads": nk, "head_dim": hd, "dtype": "bfloat16"},
        "method": "CUDA events around --launches back-to-back launches, median of --rounds; buffer sets rotated past the L2 size; warm-up first",
    }
    main_plugin = RopePlugin(hd, hd)
    if not args.no_check:
        rep = check_plugin(main_plugin, main_plugin.input_specs(T, nq, nk, BF16, max_position=131072))
        result["check"] = {"max_abs_error": rep.max_abs_error, "max_rel_error": rep.max_rel_error, "seed": rep.seed}
        print(rep, flush=True)

    result["copy"] = bench_copy(cp, args.copy_bytes, args.rounds)
    copy_bw = result["copy"]["bandwidth_GBps"]

    variants = [
        ("bf16 neox", RopePlugin(hd, hd), BF16, nq, nk),
        ("bf16 gptj", RopePlugin(hd, hd, is_neox=False), BF16, nq, nk),
        ("bf16 neox dynamic", RopePlugin(hd, hd, dynamic=True, dynamic_factor=2.0, max_position_embeddings=4096), BF16, nq, nk),
        ("bf16 neox partial 0.5", RopePlugin(hd, hd // 2), BF16, nq, nk),
        ("fp16 neox", RopePlugin(hd, hd), np.float16, nq, nk),
        ("fp32 neox", RopePlugin(hd, hd), np.float32, nq, nk),
        ("bf16 neox GQA 32/8", RopePlugin(hd, hd), BF16, 32, 8),
        ("bf16 neox hd64 64/64", RopePlugin(64, 64), BF16, 64, 64),
    ]
    result["rope"] = {}
    for label, plugin, dtype, vq, vk in variants:
        r = bench_rope(cp, plugin, T, vq, vk, dtype, args.rounds, args.launches)
        r["fraction_of_copy"] = r["bandwidth_GBps"] / copy_bw
        result["rope"][label] = r
        print(f"  {label}: {r['time_us']:.1f} us, {r['bandwidth_GBps']:.0f} GB/s, {r['fraction_of_copy']:.1%} of copy", flush=True)
    main_row = result["rope"]["bf16 neox"]

    if not args.no_tune:
        result["tuning"] = bench_tuning(cp, T, nq, nk, hd, args.rounds, args.launches)
        for r in result["tuning"]:
            r["fraction_of_copy"] = r["bandwidth_GBps"] / copy_bw

    if not args.no_hf:
        try:
            hf = bench_hf(cp, T, nq, nk, hd, args.rounds, args.launches, main_row["bytes"])
            hf["fraction_of_copy"] = hf["bandwidth_GBps"] / copy_bw
            hf["rope_speedup"] = hf["time_us"] / main_row["time_us"]
            result["hf"] = hf
        except Exception as exc:  # report, do not lose the other numbers
            result["hf"] = {"error": f"{type(exc).__name__}: {exc}"}

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))

    print()
    print(f"device: {name}; RoPE {T} tokens x ({nq} q + {nk} k heads) x {hd}, bfloat16; bytes {main_row['bytes'] / 1e6:.1f} MB")
    print(f"{'what':<34}{'time us':>10}{'GB/s':>9}{'of copy':>9}")
    for k, v in result["copy"]["variants"].items():
        print(f"{'copy ' + k:<34}{v['time_us']:>10.1f}{v['bandwidth_GBps']:>9.0f}{v['bandwidth_GBps'] / copy_bw:>9.1%}")
    for label, r in result["rope"].items():
        print(f"{'trtcore_rope ' + label:<34}{r['time_us']:>10.1f}{r['bandwidth_GBps']:>9.0f}{r['fraction_of_copy']:>9.1%}")
    if "tuning" in result:
        print("tuning (bf16 neox): " + ", ".join(f"U{r['unroll']}/B{r['block']} {r['fraction_of_copy']:.0%}" for r in result["tuning"]))
    hf = result.get("hf", {})
    if "time_us" in hf:
        print(f"{'transformers apply_rotary_pos_emb':<34}{hf['time_us']:>10.1f}{hf['bandwidth_GBps']:>9.0f}{hf['fraction_of_copy']:>9.1%}")
        print(f"trtcore_rope bf16 neox is {hf['rope_speedup']:.2f}x faster than transformers' eager RoPE")
    elif hf:
        print(f"transformers: {hf.get('error')}")
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
