"""``attention="native"`` (``IKVCacheUpdateLayer`` + ``IAttention``) through the cuda engine
(marker ``gpu``), run by the executor ``LLM(backend="cuda")`` uses; tests/test_native_attention.py
covers NumPy and TensorRT-RTX. Moved from the retired CuPy evaluator with its numerical
assertions (its checks that the cache stays on the device went with it: the TensorRT executor
copies every input and output through the host, DESIGN.md "Not yet").

* float32: every tiny checkpoint gives the greedy tokens and full log-probability rows of
  ``attention="layers"`` on the same GPU (1e-5), in a batch of prompts of different lengths
  finishing at different steps (row compaction of the fixed cache).
* bfloat16: finite log-probabilities within ``64 u`` (``u = 2^-8``) of the float32 run, the
  bound of tests/test_gpu_backend.py.

Skips where the cuda backend cannot execute (a GPU, CuPy, nvmath-python), unless
``TRTCORE_REQUIRE_GPU=1`` (then it fails).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hf_models import VARIANTS, ModelStore, hf_models, random_prompt  # noqa: F401  (hf_models is a fixture)

import trtcore.cuda as tc
from trtcore.builder import BuildConfig, build_engine, define_network
from trtcore.checkpoint import Checkpoint
from trtcore.config import load_config
from trtcore.gpu import cuda_backend_status
from trtcore.kv_modes import kv_mode
from trtcore.runtime.generate import EngineCore, make_engine
from trtcore.runtime.request import Request
from trtcore.runtime.sampling import SamplingParams

pytestmark = pytest.mark.gpu

MAX_BATCH, MAX_SEQ = 4, 64


@pytest.fixture(scope="module")
def cp() -> Any:
    ok, why = cuda_backend_status()
    if not ok:
        if os.environ.get("TRTCORE_REQUIRE_GPU") == "1":
            pytest.fail(f"TRTCORE_REQUIRE_GPU=1 but the cuda backend cannot execute: {why}")
        pytest.skip(f"the cuda backend needs a CUDA GPU, CuPy and nvmath-python: {why}")
    import cupy

    return cupy


def _generator(cp: Any, store: ModelStore, name: str, attention: str, dtype: str) -> EngineCore:
    d_dir = store.dir(name)
    config = load_config(d_dir)
    bc = BuildConfig(dtype=dtype, max_batch_size=MAX_BATCH, max_seq_len=MAX_SEQ, kv_cache="contiguous", rope="layers",
                     attention=attention).for_model(config)
    with Checkpoint(d_dir) as weights:
        from trtcore.runtime.trt_executor import TensorRTExecutor

        d = define_network(tc, config, weights, bc)
        executor = TensorRTExecutor(tc, build_engine(d))
    return make_engine(executor, kv_mode(d.plan, config))


def _run(gen: EngineCore, name: str) -> dict[int, list[Any]]:
    v = VARIANTS[name]
    rng = np.random.default_rng([v.seed, 12])
    lens, max_tokens = [30, 7, 19, 12], [12, 20, 5, 9]
    reqs = [
        Request(i, random_prompt(rng, n, v.vocab_size), SamplingParams(temperature=0, max_tokens=m, ignore_eos=True, logprobs=v.vocab_size))
        for i, (n, m) in enumerate(zip(lens, max_tokens))
    ]
    events: dict[int, list[Any]] = {i: [] for i in range(len(reqs))}
    for ev in gen.generate(reqs):
        events[ev.request_id].append(ev)
    return events


def _rows(events: list[Any], vocab: int) -> np.ndarray:
    return np.array([[dict(e.logprobs.top)[t].logprob for t in range(vocab)] for e in events])


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_native_matches_layers_on_the_cuda_engine(cp: Any, hf_models: ModelStore, name: str) -> None:  # noqa: F811
    native = _run(_generator(cp, hf_models, name, "native", "float32"), name)
    layers = _run(_generator(cp, hf_models, name, "layers", "float32"), name)
    vocab = VARIANTS[name].vocab_size
    for i in native:
        assert [e.token_id for e in native[i]] == [e.token_id for e in layers[i]], f"request {i}"
        np.testing.assert_allclose(_rows(native[i], vocab), _rows(layers[i], vocab), rtol=1e-5, atol=1e-5, err_msg=f"request {i}")


@pytest.mark.parametrize("name", ["llama_bf16_sharded", "qwen2_mixed_swa"])
def test_native_bfloat16_on_the_cuda_engine(cp: Any, hf_models: ModelStore, name: str) -> None:  # noqa: F811
    low = _run(_generator(cp, hf_models, name, "native", "bfloat16"), name)
    ref32 = _run(_generator(cp, hf_models, name, "native", "float32"), name)
    vocab = VARIANTS[name].vocab_size
    u = 2.0**-8
    for i in low:
        # the prefill rows (same tokens in both runs; later steps may pick other tokens)
        a, b = _rows(low[i][:1], vocab), _rows(ref32[i][:1], vocab)
        assert np.isfinite(a).all()
        assert np.all(np.abs(a - b) <= 64 * u * np.maximum(1.0, np.abs(b))), f"request {i}: {np.abs(a - b).max()}"
