"""The mixture-of-experts plugin's kernels (kernels/moe_experts.cu) against its float64 reference,
and a Mixtral-shaped tiny random model on ``LLM(backend="cuda")`` against transformers on the
same GPU (marker ``gpu``; skipped with the reason without a GPU).

* kernels: through :func:`trtcore.testing.check_plugin` (outputs poisoned with NaN before each of
  two runs, which must give identical bits; inputs must come back unchanged), float32 / float16 /
  bfloat16, 1 to 300 tokens (decode, and more than the eight tokens a warp takes per pass), 8 and
  60 experts, top-1/2/4, 16-byte loads and the scalar path (hidden 60), ids out of range. The
  kernels accumulate in float32 over ``hidden`` then ``intermediate`` terms: one output ulp at
  ``max|out|`` plus ``4 sqrt(hidden + intermediate)`` float32 roundings relative.
* model: the Mixtral-shaped checkpoint (8 experts, top-2, head_dim 32 so the paged attention
  kernels run) written by transformers; in float32 greedy tokens equal transformers' (eager,
  float32, TF32 off, its KV cache) for 32 steps, and the first step's log-probabilities within
  ``1e-4 * max(1, |hf|)``; in bfloat16 the decode stays finite.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from test_gpu_backend import cp, torch_cuda  # noqa: F401
from test_moe import Moe, write

from trtcore import LLM, SamplingParams
from trtcore.plugins.moe_experts import MoeExpertsPlugin
from trtcore.testing import check_plugin, default_tolerance, gpu_status

pytestmark = pytest.mark.gpu

DTYPES = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
CASES = [
    # (tokens, experts, top_k, hidden, intermediate)
    (1, 8, 2, 256, 512),
    (5, 8, 2, 128, 384),
    (300, 8, 2, 128, 64),
    (17, 60, 4, 64, 96),
    (9, 16, 1, 60, 36),  # hidden 60: no 16-byte loads
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernels_match_reference(case: tuple, dtype: np.dtype) -> None:
    ok, why = gpu_status()
    if not ok:
        pytest.skip(why)
    t, x, k, e, i = case
    rng = np.random.default_rng(zlib.crc32(repr((case, str(dtype))).encode()))
    plugin = MoeExpertsPlugin(num_experts=x, top_k=k, hidden_size=e, intermediate_size=i)
    ids = np.stack([rng.permutation(x)[:k] for _ in range(t)]).astype(np.int32)
    if t > 3:
        ids[2, 0] = x + 3  # out of range: adds nothing
    gate_up = (rng.standard_normal((x, 2 * i, e)) * e**-0.5).astype(dtype)
    down = (rng.standard_normal((x, e, i)) * i**-0.5).astype(dtype)
    specs = [((t, e), dtype), ((t, k), np.int32, ids), ((t, k), np.float32, (0.05, 1.0)), (gate_up.shape, dtype, gate_up), (down.shape, dtype, down)]
    rtol = default_tolerance(dtype)[0] + 4 * np.sqrt(e + i) * 2.0**-24
    check_plugin(plugin, specs, rtol=rtol)


MIXTRAL = Moe("mixtral_gpu", "mixtral", 8, 2, {"hidden_size": 128, "intermediate_size": 192}, seed=41, vocab_size=256)


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(MIXTRAL, tmp_path_factory.mktemp("moe_gpu") / MIXTRAL.name)


def test_mixtral_on_the_cuda_engine_matches_transformers(cp: Any, torch_cuda: Any, mixtral_dir: Path) -> None:  # noqa: F811
    from transformers import AutoModelForCausalLM

    torch = torch_cuda
    llm = LLM(mixtral_dir, backend="cuda", dtype="float32", progress=False)
    assert llm.backend == "cuda"
    hf = AutoModelForCausalLM.from_pretrained(mixtral_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
    hf = hf.to("cuda").eval()
    rng = np.random.default_rng(7)
    prompts = [[int(v) for v in rng.integers(3, MIXTRAL.vocab_size, n)] for n in (1, 23, 64)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=MIXTRAL.vocab_size))
    for prompt, out in zip(prompts, outs):
        assert out.error is None
        seq, first = [], None
        with torch.no_grad():
            res = hf(torch.tensor([prompt], device="cuda"), use_cache=True)
            for _ in range(32):
                logits = res.logits[0, -1].double()
                if first is None:
                    first = torch.log_softmax(logits, -1).cpu().numpy()
                seq.append(int(logits.argmax()))
                res = hf(torch.tensor([[seq[-1]]], device="cuda"), past_key_values=res.past_key_values, use_cache=True)
        comp = out.outputs[0]
        assert list(comp.token_ids) == seq
        ours = np.array([comp.logprobs[0][t].logprob for t in range(MIXTRAL.vocab_size)])
        assert np.all(np.abs(ours - first) <= 1e-4 * np.maximum(1.0, np.abs(first))), np.abs(ours - first).max()


def test_mixtral_bfloat16_decodes(cp: Any, mixtral_dir: Path) -> None:  # noqa: F811
    llm = LLM(mixtral_dir, backend="cuda", dtype="bfloat16", progress=False)
    [out] = llm.generate([[5, 9, 11, 40]], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=0))
    comp = out.outputs[0]
    assert len(comp.token_ids) == 16 and all(np.isfinite(d[t].logprob) for d, t in zip(comp.logprobs, comp.token_ids))
