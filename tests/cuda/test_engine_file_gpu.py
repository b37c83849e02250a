"""Engine files on the GPU (marker ``gpu``; skips without a GPU, CuPy and nvmath-python, fails
under ``TRTCORE_REQUIRE_GPU=1``): ``trtcore build --backend cuda`` on the GPU, then
``LLM(engine=...)`` in the same process, no build, gives the freshly built cuda LLM's greedy
tokens and transformers' (float64); the sidecar records this GPU as the target.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import ModelStore, hf_greedy, hf_models, random_prompt  # noqa: F401
from test_engine_file import no_build
from test_gpu_backend import cp  # noqa: F401

from trtcore import LLM, SamplingParams, cli, gpu
from trtcore.engine_file import sidecar_path

pytestmark = pytest.mark.gpu

NAME = "llama3_rope"
STEPS = 12


def test_cuda_engine_file_round_trip(cp: Any, hf_models: ModelStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    model = hf_models.dir(NAME)
    engine = tmp_path / "tiny.cuda.engine"
    # contiguous KV cache: the tiny models' head_dim is below what the paged attention kernels take
    argv = ["build", "--model", str(model), "--output", str(engine), "--backend", "cuda", "--dtype", "float32",
            "--kv-cache", "contiguous", "--max-batch-size", "2", "--max-seq-len", "64"]  # fmt: skip
    assert cli.main(argv) == 0
    meta = json.loads(sidecar_path(engine).read_text())
    major, minor = gpu.compute_capability()
    assert meta["target"] == {"compute_capability": f"sm{major}{minor}"} and meta["backend"] == "cuda"

    rng = np.random.default_rng(21)
    prompts = [random_prompt(rng, n, hf_models.variant(NAME).vocab_size) for n in (6, 23)]
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    fresh = LLM(model, backend="cuda", dtype="float32", kv_cache="contiguous", max_batch_size=2, max_seq_len=64, progress=False)
    want = [o.outputs[0].token_ids for o in fresh.generate(prompts, params)]
    del fresh

    no_build(monkeypatch)
    loaded = LLM(engine=engine, progress=False)
    assert (loaded.backend, loaded.device, loaded.plan.dtype) == ("cuda", "cuda", "float32")
    got = [o.outputs[0].token_ids for o in loaded.generate(prompts, params)]
    assert got == want
    for prompt, tokens in zip(prompts, got):
        assert tokens == hf_greedy(hf_models.hf(NAME), prompt, STEPS)[0]
