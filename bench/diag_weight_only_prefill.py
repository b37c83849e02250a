"""Which path makes a 4-bit engine's 16-bit log-probabilities differ from its float32 run
(tests/cuda/test_llm_gpu.py::test_cuda_backend_weight_only_prefill; it failed in session 19 on
a memory-plan bug, fixed in 54f83ff, and passes since: bench/results/h200-2026-12-04-session20).

A tiny checkpoint (tests/hf_models.py, the first variant) quantized to 4-bit RTN group 32, three
prompts (80, 33, 7 tokens), the first token's full-vocabulary log-probabilities through
``LLM(backend="cuda")``: float32 against float16 with each ``weight_only_gemm.PREFILL_KERNEL``
("tiled": the float32 run's kernel in 16 bits; "tensor_cores"; "cublas"), then each prompt
alone (80 rows: "cublas"; 33: the 16-row kernel; 7: the decode kernel), and float32 against the
reference backend in float32 (no GPU kernel at all). Prints the largest difference per prompt;
the tests' tolerance is 64 units of the 16-bit type's roundoff (float16: 0.031 nats).

    python bench/diag_weight_only_prefill.py     # on a GPU machine, from the repository root
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from hf_models import VARIANTS, ModelStore  # noqa: E402

from trtcore import LLM, SamplingParams  # noqa: E402
from trtcore.plugins import weight_only_gemm as wog  # noqa: E402
from trtcore.quantizer import quantize_checkpoint  # noqa: E402


def main() -> int:
    name = next(iter(VARIANTS))
    v = VARIANTS[name]
    tmp = Path(tempfile.mkdtemp())
    qdir = quantize_checkpoint(ModelStore(tmp).dir(name), tmp / "q", method="rtn", bits=4, group_size=32)
    rng = np.random.default_rng([v.seed, 7])
    prompts = [[int(t) for t in rng.integers(3, v.vocab_size, n)] for n in (80, 33, 7)]
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, logprobs=v.vocab_size)

    def logprobs(dtype: str, batch: list[list[int]], backend: str = "cuda") -> np.ndarray:
        device = "cuda" if backend == "cuda" else "cpu"
        llm = LLM(str(qdir), backend=backend, device=device, dtype=dtype, kv_cache="contiguous", progress=False)
        outs = llm.generate(batch, sp)
        return np.array([[o.outputs[0].logprobs[0][t].logprob for t in range(v.vocab_size)] for o in outs])

    f32 = logprobs("float32", prompts)
    print("float32 cuda vs reference, per prompt:", np.abs(f32 - logprobs("float32", prompts, "reference")).max(-1), flush=True)
    for kernel in wog.PREFILL_KERNELS:
        wog.PREFILL_KERNEL = kernel
        print(f"float16 {kernel:12s} vs float32, per prompt:", np.abs(logprobs("float16", prompts) - f32).max(-1), flush=True)
    wog.PREFILL_KERNEL = "cublas"
    for p in prompts:
        print(f"alone, {len(p)} tokens: float16 vs float32", np.abs(logprobs("float16", [p]) - logprobs("float32", [p])).max(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
