"""``attention="native"`` (``IKVCacheUpdateLayer`` + ``IAttention``) on the reference backend's
CuPy path (marker ``gpu``); tests/test_native_attention.py covers NumPy and TensorRT-RTX.

* float32: every tiny checkpoint gives the greedy tokens and full log-probability rows of
  ``attention="layers"`` on the same GPU (1e-5), in a batch of prompts of different lengths
  finishing at different steps (device-side row compaction of the fixed cache).
* bfloat16 (``uint16`` bit patterns on the device): finite log-probabilities within
  ``64 u`` (``u = 2^-8``) of the float32 run, the bound of tests/test_gpu_backend.py.
* the cache stays on the device and is written in place: each step's ``present.*`` is the
  very device array fed as ``kv_cache.*``; only the logits come to the host.

Skips where CuPy or a GPU is missing, unless ``TRTCORE_REQUIRE_GPU=1`` (then it fails).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hf_models import VARIANTS, ModelStore, hf_models, random_prompt  # noqa: F401  (hf_models is a fixture)

import trtcore.reference as ref
from trtcore.builder import BuildConfig, build_reference_engine, define_network
from trtcore.checkpoint import Checkpoint
from trtcore.config import load_config
from trtcore.runtime.device import cuda_status
from trtcore.kv_modes import kv_mode
from trtcore.runtime.generate import EngineCore, make_engine
from trtcore.runtime.request import Request
from trtcore.runtime.reference_executor import ReferenceExecutor
from trtcore.runtime.sampling import SamplingParams

pytestmark = pytest.mark.gpu

MAX_BATCH, MAX_SEQ = 4, 64


@pytest.fixture(scope="module")
def cp() -> Any:
    ok, why = cuda_status()
    if not ok:
        if os.environ.get("TRTCORE_REQUIRE_GPU") == "1":
            pytest.fail(f"TRTCORE_REQUIRE_GPU=1 but CuPy and a CUDA GPU are needed: {why}")
        pytest.skip(f"needs CuPy and a CUDA GPU: {why}")
    import cupy

    return cupy


def _generator(cp: Any, store: ModelStore, name: str, attention: str, dtype: str) -> EngineCore:
    d_dir = store.dir(name)
    config = load_config(d_dir)
    bc = BuildConfig(dtype=dtype, max_batch_size=MAX_BATCH, max_seq_len=MAX_SEQ, kv_cache="contiguous", rope="layers",
                     attention=attention).for_model(config)
    with Checkpoint(d_dir) as weights:
        d = define_network(ref, config, weights, bc)
        executor = ReferenceExecutor(build_reference_engine(d), xp=cp)
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
def test_native_matches_layers_on_cupy(cp: Any, hf_models: ModelStore, name: str) -> None:  # noqa: F811
    native = _run(_generator(cp, hf_models, name, "native", "float32"), name)
    layers = _run(_generator(cp, hf_models, name, "layers", "float32"), name)
    vocab = VARIANTS[name].vocab_size
    for i in native:
        assert [e.token_id for e in native[i]] == [e.token_id for e in layers[i]], f"request {i}"
        np.testing.assert_allclose(_rows(native[i], vocab), _rows(layers[i], vocab), rtol=1e-5, atol=1e-5, err_msg=f"request {i}")


@pytest.mark.parametrize("name", ["llama_bf16_sharded", "qwen2_mixed_swa"])
def test_native_bfloat16_on_cupy(cp: Any, hf_models: ModelStore, name: str) -> None:  # noqa: F811
    gen = _generator(cp, hf_models, name, "native", "bfloat16")
    ex = gen.executor
    fed: list[dict[str, Any]] = []
    got: list[dict[str, Any]] = []
    copies: list[Any] = []
    run, to_host = ex.run, ex.to_host  # type: ignore[attr-defined]

    def recording_run(feeds: Any, capture: Any = ()) -> Any:
        fed.append({k: v for k, v in feeds.items() if k.startswith("kv_cache.")})
        out = run(feeds, capture)
        got.append({k: v for k, v in out.items() if k.startswith("present.")})
        return out

    def counting_to_host(value: Any, name: Any = None) -> Any:
        copies.append(name)
        return to_host(value, name)

    ex.run, ex.to_host = recording_run, counting_to_host  # type: ignore[method-assign, attr-defined]
    try:
        low = _run(gen, name)
    finally:
        del ex.run, ex.to_host
    ref32 = _run(_generator(cp, hf_models, name, "native", "float32"), name)
    vocab = VARIANTS[name].vocab_size
    u = 2.0**-8
    for i in low:
        # the prefill rows (same tokens in both runs; later steps may pick other tokens)
        a, b = _rows(low[i][:1], vocab), _rows(ref32[i][:1], vocab)
        assert np.isfinite(a).all()
        assert np.all(np.abs(a - b) <= 64 * u * np.maximum(1.0, np.abs(b))), f"request {i}: {np.abs(a - b).max()}"
    assert copies == ["logits"] * len(fed)
    for feeds, outs in zip(fed, got):
        for key, value in feeds.items():
            assert isinstance(value, cp.ndarray) and value.dtype == np.uint16, (key, type(value), value.dtype)
            present = outs["present." + key.removeprefix("kv_cache.")]
            assert present.data.ptr == value.data.ptr, f"{key}: present.* is not the cache written in place"
