"""Host time of the cuda engine's ``IExecutionContext.prepare`` (the launch list of one execution,
built for every new combination of input shapes and addresses, ``trtcore/cuda/runtime.py``) on
the paged SmolLM2-135M network, for prefill / mixed step shapes. No GPU needed: placeholder
addresses, the plan compiled for ``--arch``.

    python bench/profile_prepare.py [--arch sm_90] [--out DIR]

Prints one line per shape and writes ``prepare.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    import trtcore.cuda as tc
    from trtcore.builder import _builder_config, define_network
    from trtcore.cuda import synthetic
    from trtcore.cuda.builder import compile_network
    from trtcore.cuda.runtime import ICudaEngine
    from trtcore.plan import BuildConfig

    cfg = synthetic.config("SmolLM2-135M")
    bc = BuildConfig(dtype="bfloat16", max_batch_size=32, max_seq_len=512, max_num_tokens=2048, max_num_blocks=2048, kv_cache="paged")
    d = define_network(tc, cfg, synthetic.RandomWeights(pool_size=1 << 22), bc)
    plan = compile_network(d.network, _builder_config(d, None), None, arch=args.arch)
    engine = ICudaEngine(plan)
    ctx = engine.create_execution_context_without_device_memory()
    ctx.set_device_memory(1 << 40, engine.device_memory_size_v2)
    for i in range(engine.num_io_tensors):
        ctx.set_tensor_address(engine.get_tensor_name(i), (i + 2) << 40)
    pool = plan.graph.values["kv_cache_pool"].shape
    consts = {name: (i + 100) << 40 for i, name in enumerate(plan.graph.constants)}
    rows = []
    for tokens, seqs in ((128, 1), (160, 5), (159, 32), (1000, 32)):
        shapes = {
            "input_ids": (tokens,), "position_ids": (tokens,), "kv_cache_pool": (pool[0], 64, *pool[2:]), "block_tables": (seqs, 32),
            "seq_lens": (seqs,), "query_start_loc": (seqs + 1,), "last_token_ids": (seqs,),
        }  # fmt: skip
        for name, shape in shapes.items():
            ctx.set_input_shape(name, shape)
        t0 = time.perf_counter()
        steps = ctx.prepare(consts)
        ms = (time.perf_counter() - t0) * 1e3
        rows.append({"tokens": tokens, "seqs": seqs, "prepare_ms": ms, "launches": len(steps)})
        print(f"prepare tokens={tokens} seqs={seqs}: {ms:.1f} ms for {len(steps)} launches")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "prepare.json").write_text(json.dumps({"model": "SmolLM2-135M", "arch": args.arch, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
