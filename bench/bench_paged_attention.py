"""Decode bandwidth of the paged attention plugin, beside PyTorch SDPA on a contiguous cache.

For context lengths 1k/4k/16k/32k, batches 1/8/64 and block sizes 16/32/64 (Llama-3-8B-like
heads: 32 query heads, 8 KV heads, head_dim 128, bfloat16), one decode step per layer is
timed: the plugin's ``enqueue`` (k/v write + split decode + reduction) against
``torch.nn.functional.scaled_dot_product_attention`` over a contiguous
``[batch, kv_heads, context, head_dim]`` cache holding the same keys and values (the GQA
group folded into the query-length axis, ``q [batch, kv_heads, group, head_dim]``, no
mask: the standard decode trick that lets SDPA's flash kernel read each K/V byte once).

Method (METHOD.md): both are captured into a CUDA graph of one step per layer, the graph is
replayed after a warm-up, each replay timed with CUDA events; the median of ``--reps``
replays over the number of layers is the step time. The layers rotate through distinct
memory (at least ~512 MiB in all), so repeated steps do not run out of the 60 MB L2.
Bandwidth = K/V bytes the step must read (batch * context * kv_heads * head_dim * 2 (K, V)
* 2 bytes) / time, against the device-to-device copy bandwidth measured in the same run
(bytes read + written). Every configuration also checks the plugin's output against SDPA's
(relative L2 error), on random (never zero) data.

``--kv-fp8`` times every configuration a second time with the FP8 KV cache (the pool holds
the E4M3 codes of the same keys and values over :data:`FP8_SCALE`; bandwidth counts one byte a
code; the output is checked against SDPA on the values the codes read), side by side.

    python bench/bench_paged_attention.py --out bench/results/paged-attention-h200.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import Any

import numpy as np


def _events_median(torch: Any, fn: Any, reps: int, warmup: int = 3) -> float:
    """Median milliseconds of ``fn()`` between two CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _graph(torch: Any, step: Any) -> Any:
    """``step`` captured in a CUDA graph (after two eager runs on the capture stream)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
        step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    torch.cuda.synchronize()
    return g


def copy_bandwidth(torch: Any, nbytes: int = 4 << 30, reps: int = 20) -> float:
    """Device-to-device copy, GB/s counting bytes read plus written."""
    src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = _events_median(torch, lambda: dst.copy_(src), reps)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def read_bandwidth(torch: Any, nbytes: int = 4 << 30, reps: int = 20) -> float:
    """A read-only pass (sum in float32), GB/s counting bytes read."""
    x = torch.randn(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    ms = _events_median(torch, lambda: x.sum(dtype=torch.float32), reps)
    return nbytes / (ms * 1e-3) / 1e9


#: ``--kv-fp8``: the FP8 pool's k_scale and v_scale (about the calibrated amax / 448 of the
#: N(0, 1) keys and values, so the codes use their range)
FP8_SCALE = 0.0125


def bench_config(
    torch: Any,
    ctx: int,
    batch: int,
    bs: int,
    *,
    hq: int = 32,
    hkv: int = 8,
    d: int = 128,
    reps: int = 20,
    min_bytes: int = 512 << 20,
    sdpa: bool = True,
    kv_fp8: bool = False,
) -> dict:
    """One configuration's decode step (module docstring). ``kv_fp8``: the pool holds the E4M3
    codes of the same keys and values over :data:`FP8_SCALE` (the plugin's ``kv_fp8``), the
    bandwidth counts one byte a code, and the output is checked against SDPA on the values
    those codes read (``float(code) * scale``)."""
    import ml_dtypes
    from trtcore.plugins.base import DeviceTensor
    from trtcore.plugins.paged_attention import PagedAttentionPlugin

    bf16 = np.dtype(ml_dtypes.bfloat16)
    g = hq // hkv
    kv_bytes = batch * ctx * hkv * d * 2 * (1 if kv_fp8 else 2)
    layers = max(1, min(16, math.ceil(min_bytes / kv_bytes)))
    nblk = ctx // bs
    num_blocks = batch * nblk + 3
    gen = torch.Generator(device="cuda").manual_seed(ctx * 1000 + batch * 10 + bs)
    # contiguous caches [L, B, Hkv, ctx, D] and the same data in the paged pool
    K = torch.randn((layers, batch, hkv, ctx, d), dtype=torch.bfloat16, device="cuda", generator=gen)
    V = torch.randn((layers, batch, hkv, ctx, d), dtype=torch.bfloat16, device="cuda", generator=gen)
    perm = torch.randperm(num_blocks, device="cuda", generator=gen)[: batch * nblk]
    bt = perm.reshape(batch, nblk).to(torch.int32).contiguous()
    pool = torch.empty((layers, num_blocks, 2, hkv, bs, d), dtype=torch.bfloat16, device="cuda")
    pool.fill_(float("nan"))
    for kv, src in ((0, K), (1, V)):
        tiles = src.reshape(layers, batch, hkv, nblk, bs, d).permute(0, 1, 3, 2, 4, 5).reshape(layers, batch * nblk, hkv, bs, d)
        pool[:, perm.long(), kv] = tiles
        del tiles
    pool_dt = bf16
    if kv_fp8:  # the codes of x / scale (NaN codes in the unused blocks), one byte each
        pool = (pool.float() / FP8_SCALE).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)  # saturating, as e4m3_of
        pool_dt = np.dtype(np.uint8)
    q = torch.randn((batch, hq, d), dtype=torch.bfloat16, device="cuda", generator=gen)
    # this step's k/v: the cache's last position (the plugin rewrites it, the same values)
    k_new = [K[l, :, :, ctx - 1, :].contiguous() for l in range(layers)]
    v_new = [V[l, :, :, ctx - 1, :].contiguous() for l in range(layers)]
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
    out = torch.empty((batch, hq * d), dtype=torch.bfloat16, device="cuda")
    fp8 = {"kv_fp8": True, "k_scale": FP8_SCALE, "v_scale": FP8_SCALE} if kv_fp8 else {}
    plugins = [PagedAttentionPlugin(layer_idx=l, num_kv_heads=hkv, head_dim=d, block_size=bs, **fp8) for l in range(layers)]
    p0 = plugins[0]
    shapes = [
        ((batch, hq, d), bf16),
        ((batch, hkv, d), bf16),
        ((batch, hkv, d), bf16),
        (tuple(pool.shape), pool_dt),
        (tuple(bt.shape), np.int32),
        ((batch,), np.int32),
        ((batch + 1,), np.int32),
    ]
    ws_bytes = p0.workspace_size(shapes, [((batch, hq * d), bf16)])
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")

    def desc(t: Any, dt: Any) -> DeviceTensor:
        return DeviceTensor(t.data_ptr(), tuple(t.shape), np.dtype(dt))

    common = [desc(pool, pool_dt), desc(bt, np.int32), desc(seq_lens, np.int32), desc(qsl, np.int32)]
    ins = [[desc(q, bf16), desc(k_new[l], bf16), desc(v_new[l], bf16), *common] for l in range(layers)]
    outs = [desc(out, bf16)]

    def step() -> None:
        stream = torch.cuda.current_stream().cuda_stream
        for l in range(layers):
            plugins[l].enqueue(ins[l], outs, ws.data_ptr() if ws_bytes else 0, stream)

    step()
    torch.cuda.synchronize()
    graph = _graph(torch, step)
    ms = _events_median(torch, graph.replay, reps) / layers
    ours = out.float().reshape(batch, hkv, g, d)
    row = {
        "context": ctx,
        "batch": batch,
        "block_size": bs,
        "kv_cache": "fp8" if kv_fp8 else "bfloat16",
        "layers_rotated": layers,
        "kv_bytes": kv_bytes,
        "splits": p0.num_splits(batch, hq, nblk, bf16),
        "plugin_us": ms * 1e3,
        "plugin_GBps": kv_bytes / (ms * 1e-3) / 1e9,
    }
    # the last layer's output against SDPA on the contiguous cache
    qf = q.reshape(batch, hkv, g, d)
    if kv_fp8:  # the values the codes read: bfloat16(float32(code) * scale), the plugin's contract
        K, V = (((x.float() / FP8_SCALE).clamp(-448, 448).to(torch.float8_e4m3fn).float() * FP8_SCALE).to(torch.bfloat16) for x in (K, V))
    ref = (
        torch.nn.functional.scaled_dot_product_attention(qf.float(), K[layers - 1].float(), V[layers - 1].float()) if kv_bytes <= (2 << 30) else None
    )
    if ref is None:  # large: compare against bf16 SDPA (itself within ~1e-2 of exact)
        ref = torch.nn.functional.scaled_dot_product_attention(qf, K[layers - 1], V[layers - 1]).float()
    row["rel_err_vs_sdpa"] = float((ours - ref).norm() / ref.norm())
    del ref
    if sdpa and not kv_fp8:

        def sdpa_step() -> None:
            for l in range(layers):
                torch.nn.functional.scaled_dot_product_attention(qf, K[l], V[l])

        sg = _graph(torch, sdpa_step)
        sms = _events_median(torch, sg.replay, reps) / layers
        row["sdpa_us"] = sms * 1e3
        row["sdpa_GBps"] = kv_bytes / (sms * 1e-3) / 1e9
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--contexts", default="1024,4096,16384,32768")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--block-sizes", default="16,32,64")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--max-kv-gib", type=float, default=16.0, help="skip configurations whose K/V exceed this")
    ap.add_argument("--sweep", action="store_true", help="also sweep the decode split knobs (TUNING) on a few configurations")
    ap.add_argument("--kv-fp8", action="store_true", help="also time every configuration with the FP8 (E4M3) pool, side by side")
    ap.add_argument(
        "--short-decode",
        default="",
        help="also time batch-1 decode at these short contexts (block size 16) with each forced split count, e.g. "
        "'192:1,2,3,4,6' (min_keys_per_split lowered so that every count is allowed): the e2e bench's regime",
    )
    ap.add_argument(
        "--sweep-at",
        default="",
        help="also time these 'CTX:BATCH' decode points (';'-separated, block size 16) with the --sweep-splits forced "
        "split counts (0: the heuristic) and --sweep-stages ring stages, the FP8 pool too with --kv-fp8",
    )
    ap.add_argument("--sweep-splits", default="0,1,2,3,4", help="with --sweep-at: the split counts (0: the heuristic's)")
    ap.add_argument("--sweep-stages", default="2,3", help="with --sweep-at: the ring stages")
    args = ap.parse_args(argv)

    import torch
    from trtcore.plugins import paged_attention as pa

    t0 = time.time()
    props = torch.cuda.get_device_properties(0)
    copy_bw = copy_bandwidth(torch)
    read_bw = read_bandwidth(torch)
    result: dict[str, Any] = {
        "device": props.name,
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__,
        "heads": {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "dtype": "bfloat16"},
        "copy_bandwidth_GBps": copy_bw,
        "read_bandwidth_GBps": read_bw,
        "tuning": dict(pa.TUNING),
        "method": "CUDA graph of one decode step per layer (layers rotate over >= 512 MiB), CUDA events, median of reps replays; "
        "bandwidth = K/V bytes that must be read / step time; copy bandwidth = (read + written) / time of a 4 GiB device copy",
        "results": [],
    }
    print(f"{props.name}: copy {copy_bw:.0f} GB/s (read+write), read-only sum {read_bw:.0f} GB/s", flush=True)
    for ctx in (int(x) for x in args.contexts.split(",")):
        for batch in (int(x) for x in args.batches.split(",")):
            kv = batch * ctx * 8 * 128 * 4
            if kv > args.max_kv_gib * 2**30:
                print(f"skip ctx {ctx} batch {batch}: {kv / 2**30:.1f} GiB of K/V", flush=True)
                continue
            for bs in (int(x) for x in args.block_sizes.split(",")):
                for kv_fp8 in (False, True) if args.kv_fp8 else (False,):
                    row = bench_config(torch, ctx, batch, bs, reps=args.reps, kv_fp8=kv_fp8)
                    torch.cuda.empty_cache()
                    row["plugin_frac_of_copy"] = row["plugin_GBps"] / copy_bw
                    if "sdpa_GBps" in row:
                        row["sdpa_frac_of_copy"] = row["sdpa_GBps"] / copy_bw
                    result["results"].append(row)
                    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)

    def forced_row(tag: str, ctx: int, batch: int, splits: int, stages: int, kv_fp8: bool = False) -> dict[str, Any]:
        """One decode point under the TUNING just set (block size 16, no SDPA peer), printed."""
        row = bench_config(torch, ctx, batch, 16, reps=args.reps, sdpa=False, kv_fp8=kv_fp8)
        torch.cuda.empty_cache()
        row.update(forced_splits=splits, stages=stages, plugin_frac_of_copy=row["plugin_GBps"] / copy_bw)
        print(tag, json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
        return row

    if args.sweep:
        sweep = []
        base = dict(pa.TUNING)
        points = [
            ((32768, 1), (32, 42, 49, 64)),
            ((4096, 8), (3, 6, 9, 12)),
            ((16384, 8), (6, 12)),
            ((4096, 64), (1, 2, 3)),
            ((32768, 64), (1, 2, 4)),
        ]
        runs = [(ctx, batch, s, 2) for (ctx, batch), splits in points for s in splits]
        runs += [(4096, 8, 0, 3), (32768, 1, 0, 3), (4096, 64, 0, 3)]  # heuristic splits, 3 stages
        for ctx, batch, splits, stages in runs:
            pa.TUNING.update(splits=splits, stages=stages)
            sweep.append(forced_row("sweep", ctx, batch, splits, stages))
        pa.TUNING.clear()
        pa.TUNING.update(base)
        result["sweep"] = sweep
    if args.short_decode:
        short = []
        base = dict(pa.TUNING)
        for spec in args.short_decode.split(";"):
            ctx, counts = spec.split(":")
            for splits in (int(x) for x in counts.split(",")):
                pa.TUNING.update(splits=splits, min_keys_per_split=16)
                row = bench_config(torch, int(ctx), 1, 16, reps=args.reps, sdpa=splits == 1)
                row.update(forced_splits=splits)
                short.append(row)
                print("short", json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
        pa.TUNING.clear()
        pa.TUNING.update(base)
        result["short_decode"] = short
    if args.sweep_at:
        at = []
        base = dict(pa.TUNING)
        for spec in args.sweep_at.split(";"):
            ctx, batch = (int(x) for x in spec.split(":"))
            for kv_fp8 in (False, True) if args.kv_fp8 else (False,):
                for stages in (int(x) for x in args.sweep_stages.split(",")):
                    for splits in (int(x) for x in args.sweep_splits.split(",")):
                        pa.TUNING.update(splits=splits, stages=stages, min_keys_per_split=16 if splits else base["min_keys_per_split"])
                        at.append(forced_row("at", ctx, batch, splits, stages, kv_fp8))
        pa.TUNING.clear()
        pa.TUNING.update(base)
        result["sweep_at"] = at
    result["elapsed_s"] = time.time() - t0
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(f"\ncopy bandwidth {copy_bw:.0f} GB/s; K/V bytes / step time; frac = of copy bandwidth")
    print(
        f"{'ctx':>6} {'batch':>5} {'bs':>3} {'splits':>6} {'plugin us':>10} {'GB/s':>7} {'frac':>5} {'sdpa us':>9} {'GB/s':>7} {'frac':>5} {'err':>8}"
    )
    for r in result["results"]:
        print(
            f"{r['context']:>6} {r['batch']:>5} {r['block_size']:>3} {r['splits']:>6} {r['plugin_us']:>10.1f} {r['plugin_GBps']:>7.0f} "
            f"{r['plugin_frac_of_copy']:>5.2f} {r.get('sdpa_us', float('nan')):>9.1f} {r.get('sdpa_GBps', float('nan')):>7.0f} "
            f"{r.get('sdpa_frac_of_copy', float('nan')):>5.2f} {r['rel_err_vs_sdpa']:>8.1e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
