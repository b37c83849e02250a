#!/usr/bin/env python3
"""Time the GPU sampling step (kernels/sampling.cu through
:class:`trtcore.runtime.sampling_gpu.GpuSampler`) per sampling configuration, with
``torch.argmax`` on the same logits as the peer of the greedy row (what transformers'
``generate`` runs for greedy decoding), measured in the same run.

    python bench/bench_sampling.py --out $OUT [--vocab 128256] [--batches 1,32]

What is measured (CUDA events on one stream, warm-up first, median of ``--rounds`` rounds of
``--launches`` back-to-back steps each): one :meth:`GpuSampler.sample` -- the ``sampling_step``
kernel (it reads its parameters from and writes its results into pinned host memory) and the
step's event, as a decode step enqueues them -- on random bfloat16 logits ``[batch, vocab]`` already on the device, for
greedy, temperature, top-k, top-p, min-p, penalties and logprobs rows (every row of a batch
alike). The tokens are not checked here (tests/cuda/test_sampling_gpu.py does that). Writes
JSON to ``--out`` (a folder: ``sampling.json``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIGS: dict[str, dict[str, Any]] = {
    "greedy": dict(temperature=0.0),
    "greedy + logprobs 5": dict(temperature=0.0, logprobs=5),
    "temperature 0.8": dict(temperature=0.8, seed=1),
    "top_k 50": dict(temperature=1.0, top_k=50, seed=1),
    "top_p 0.9": dict(temperature=1.0, top_p=0.9, seed=1),
    "min_p 0.05": dict(temperature=1.0, min_p=0.05, seed=1),
    "repetition 1.2 (greedy)": dict(temperature=0.0, repetition_penalty=1.2),
    "top_k 50 + top_p 0.9": dict(temperature=0.7, top_k=50, top_p=0.9, seed=1),
}


def _ok(res: tuple) -> Any:
    if int(res[0]) != 0:
        raise RuntimeError(f"CUDA error {res[0]}")
    return res[1] if len(res) == 2 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for sampling.json")
    ap.add_argument("--vocab", type=int, default=128256, help="vocabulary (Llama-3's by default)")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {list(CONFIGS)}")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--launches", type=int, default=50)
    args = ap.parse_args()
    wanted = [c for c in args.configs.split(",") if c]
    unknown = [c for c in wanted if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown --configs {unknown}; known: {list(CONFIGS)}")
    batches = [int(b) for b in args.batches.split(",")]

    import torch
    from cuda.bindings import runtime as rt

    from trtcore.runtime.sampling import SamplingParams, SamplingRow
    from trtcore.runtime.sampling_gpu import GpuSampler

    stream = torch.cuda.Stream()
    s_int = int(stream.cuda_stream)
    rng = np.random.default_rng(0)
    runs: list[dict[str, Any]] = []

    def time_ms(fn: Any) -> float:
        for _ in range(5):
            fn()
        stream.synchronize()
        per = []
        for _ in range(args.rounds):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(stream)
            for _ in range(args.launches):
                fn()
            b.record(stream)
            b.synchronize()
            per.append(a.elapsed_time(b) / args.launches)
        return float(statistics.median(per))

    for batch in batches:
        host = (rng.standard_normal((batch, args.vocab)) * 3).astype(ml_dtypes.bfloat16)
        logits = torch.from_numpy(host.view(np.int16)).cuda().view(torch.bfloat16)
        with torch.cuda.stream(stream):
            peer_ms = time_ms(lambda x=logits: torch.argmax(x, dim=-1))
        runs.append({"batch": batch, "config": "torch.argmax (peer)", "us": peer_ms * 1e3})
        print(f"batch {batch:3d}  {'torch.argmax (peer)':28s} {peer_ms * 1e3:9.1f} us", flush=True)
        ptr = logits.data_ptr()
        with GpuSampler(batch, args.vocab, "bfloat16", s_int) as sampler:
            prompt = rng.integers(0, args.vocab, 64).tolist()
            for slot in range(batch):
                sampler.add_request(slot, prompt)
            for name in wanted:
                rows = [SamplingRow(SamplingParams(max_tokens=64, **CONFIGS[name]), prompt, []) for _ in range(batch)]
                sampler.set_params(rows)

                ms = time_ms(lambda s=sampler, p=ptr: s.sample(p))
                _ok(rt.cudaStreamSynchronize(s_int))
                sampler.result()
                runs.append({"batch": batch, "config": name, "us": ms * 1e3})
                print(f"batch {batch:3d}  {name:28s} {ms * 1e3:9.1f} us", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(), "vocab": args.vocab, "dtype": "bfloat16", "python": platform.python_version()}
    tmp = args.out / "sampling.json.tmp"
    tmp.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    tmp.replace(args.out / "sampling.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
