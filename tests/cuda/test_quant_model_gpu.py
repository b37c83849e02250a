"""Quantized tiny Llamas on the GPU (marker ``gpu``): a GPTQ / AWQ checkpoint (every linear
packed by tests/quant_packers.py, tests/test_quant_model.py's checkpoints) built with
``backend="cuda"`` runs its linears as the weight-only GEMM plugin inside trtcore's engine,
and its greedy tokens equal transformers' (float32, TF32 off) on a plain checkpoint of the
packers' float64 dequantized weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import VARIANTS, load_hf, random_prompt
from test_gpu_backend import cp, torch_cuda  # noqa: F401  (fixtures)
from test_quant_model import _checkpoints

from trtcore import LLM, SamplingParams

pytestmark = pytest.mark.gpu

STEPS = 12


@pytest.mark.parametrize("case", ["gptq_v1_act_order", "gptq_v2_8bit", "awq"])
def test_quantized_llama_on_cuda_equals_transformers(tmp_path: Path, case: str, torch_cuda: Any) -> None:  # noqa: F811
    torch = torch_cuda
    qdir, ddir = _checkpoints(tmp_path, case)
    llm = LLM(qdir, backend="cuda", dtype="float32", max_batch_size=2, max_seq_len=128, progress=False)
    prompt = random_prompt(np.random.default_rng(7), 12, VARIANTS["llama3_rope"].vocab_size)
    [out] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True))
    llm.close()
    model = load_hf(ddir).to("cuda")
    seq: list[int] = []
    with torch.no_grad():
        ids = torch.tensor([prompt], device="cuda")
        for _ in range(STEPS):
            tok = int(model(ids).logits[0, -1].argmax())
            seq.append(tok)
            ids = torch.cat([ids, torch.tensor([[tok]], device="cuda")], dim=1)
    assert out.outputs[0].token_ids == seq
