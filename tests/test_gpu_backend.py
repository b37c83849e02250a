"""The GPU side of the oracle (marker ``gpu``): the cuda engine (:mod:`trtcore.cuda`, run by
``TensorRTExecutor`` as ``LLM(backend="cuda")`` runs it) against the NumPy reference on every
layer type, and the helpers with which tests/cuda/test_llm_gpu.py compares ``LLM(backend="cuda")``
with ``transformers`` on the same GPU.

Skips, saying why, where CuPy, nvmath-python or a CUDA GPU (or, for the model tests, torch
with CUDA) is missing; with ``TRTCORE_REQUIRE_GPU=1`` (``scripts/gpu-check`` sets it) a
missing GPU stack fails instead, so a broken GPU machine cannot pass by skipping.

a. Every layer type, enum member and dtype of :func:`test_device_select.layer_network`
   (a plugin whose ``enqueue`` runs on the raw device pointers included) through the cuda
   engine against the NumPy evaluation of the same inputs. Each output is one layer applied
   to inputs or constants, so the only difference is that layer's float32 arithmetic (CUDA's
   libm and cuBLAS against NumPy's): float32 ``|gpu - cpu| <= 1e-6 * max(1, |cpu|)``
   (``|a| @ |b|`` in place of ``|cpu|`` for matrix products, whose summation order differs);
   float16 and bfloat16 outputs within one unit in the last place of their type (a float32
   difference of a few float32 ulps can move the single rounding to the neighbouring value,
   never further); integers, booleans and data movement bit exact. CUDA may flush float32
   subnormals to zero, so an element also passes when it equals NumPy's result with
   subnormals flushed.
b. The helpers of the model tests: the tiny checkpoints of ``hf_models.VARIANTS`` through
   ``LLM(dir, backend=..., dtype="float32")`` against transformers (torch CUDA, float32, eager,
   TF32 off): every vocabulary log-probability at every step within ``1e-4 * max(1, |hf|)``
   and greedy tokens equal for 32 steps, in a batch of two prompts of different lengths that
   finish at different steps; bfloat16 and float16 log-probabilities within ``64 u`` of the
   float32 run, ``u`` the type's unit roundoff (2^-8, 2^-11): every layer rounds its output
   once (relative error <= u), and through the ~25 rounded tensors of two decoder layers the
   errors of the O(1..10) logits added up to 14 u (bfloat16) and 19 u (float16) at most on
   these checkpoints (measured with the reference evaluator, which rounds once per layer as
   the engine does or less often where it fuses); 64 u leaves a factor of 3 or more.
"""

from __future__ import annotations

import os
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hf_models import (  # noqa: F401
    VARIANTS,
    ModelStore,
    hf_models,
    load_hf,
    log_softmax,
    random_prompt,
)
from test_device_select import FLOAT_NAMES, AffinePlugin, layer_feeds, layer_network

import trtcore.reference as ref
from trtcore import LLM, SamplingParams
from trtcore.gpu import cuda_backend_status
from trtcore.runtime.reference_executor import ReferenceExecutor

pytestmark = pytest.mark.gpu

REQUIRE_GPU = os.environ.get("TRTCORE_REQUIRE_GPU") == "1"
BF16 = np.dtype(ml_dtypes.bfloat16)
NAMES = list(VARIANTS)
RTOL = 1e-4
STEPS = 32
#: unit roundoff of the low-precision types, and the log-prob tolerance in units of it
UNIT_ROUNDOFF = {"bfloat16": 2.0**-8, "float16": 2.0**-11}
LOW_PRECISION_UNITS = 64


def _stat(**record: Any) -> None:
    """Append a result line to ``$TRTCORE_GPU_STATS`` (JSON lines; scripts/gpu-check tabulates it)."""
    path = os.environ.get("TRTCORE_GPU_STATS")
    if path:
        import json

        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def _missing(why: str) -> None:
    if REQUIRE_GPU:
        pytest.fail(f"TRTCORE_REQUIRE_GPU=1 but {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def cp() -> Any:
    """The cupy module, where the cuda backend can execute (a GPU, CuPy, nvmath-python; else
    skip, or fail under TRTCORE_REQUIRE_GPU=1)."""
    ok, why = cuda_backend_status()
    if not ok:
        _missing(f"the cuda backend needs a CUDA GPU, CuPy and nvmath-python: {why}")
    import cupy

    return cupy


@pytest.fixture(scope="module")
def torch_cuda(cp: Any) -> Any:
    """torch with CUDA, float32 matmuls in full precision (no TF32)."""
    try:
        import torch
    except ImportError as exc:
        _missing(f"the transformers comparison needs torch: {exc}")
    if not torch.cuda.is_available():
        _missing("the transformers comparison needs torch built with CUDA and a GPU it can see")
    try:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"
    except (AttributeError, RuntimeError):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return torch


# ---------------------------------------------------------------------------------------
# (a) every layer type and dtype: the cuda engine against NumPy


def _ordered(bits: np.ndarray) -> np.ndarray:
    """16-bit float patterns mapped to integers in the order of their values (so the
    difference of two is their distance in ulps; +0 and -0 coincide)."""
    b = bits.astype(np.int32)
    mag = b & 0x7FFF
    return np.where(b & 0x8000, -mag, mag)


TINY32 = float(np.finfo(np.float32).tiny)


def _flush(a: np.ndarray) -> np.ndarray:
    """float32 subnormals (|x| < 2^-126) replaced by zero, as the GPU's flush-to-zero does."""
    a32 = a.astype(np.float32)
    return np.where(np.abs(a32) < TINY32, np.float32(0), a32).astype(a.dtype)


def _mismatch(got: np.ndarray, want: np.ndarray, scale: np.ndarray | None) -> np.ndarray:
    """Elementwise: ``got`` is not within the tolerance of ``want`` (float32: 1e-6 relative to
    ``max(1, scale)``; float16/bfloat16: one ulp; NaN only against NaN; the rest exact)."""
    if want.dtype.kind in "biu":
        return got != want
    g32, w32 = got.astype(np.float32), want.astype(np.float32)
    nan = np.isnan(g32) | np.isnan(w32)
    with np.errstate(invalid="ignore", over="ignore"):
        if want.dtype == np.float32:
            mag = np.abs(w32) if scale is None else np.broadcast_to(scale, w32.shape)
            close = (g32 == w32) | (np.abs(g32 - w32) <= 1e-6 * np.maximum(1.0, mag))
        else:
            close = np.abs(_ordered(got.view(np.uint16)) - _ordered(want.view(np.uint16))) <= 1
    return np.where(nan, np.isnan(g32) != np.isnan(w32), ~close)


def _compare(name: str, got: np.ndarray, wants: list[np.ndarray], scale: np.ndarray | None = None) -> str | None:
    """None when every element of ``got`` matches one of ``wants`` (:func:`_mismatch`), else a
    description of the first bad elements."""
    want = wants[0]
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{name}: {got.dtype}{got.shape} instead of {want.dtype}{want.shape}"
    bad = np.ones(got.shape, bool)
    for w in wants:
        bad &= _mismatch(got, w, scale)
    if not bad.any():
        return None
    where = np.argwhere(bad)[:3]
    return f"{name}: {int(bad.sum())} of {bad.size} differ, e.g. at {where.tolist()}: gpu {got[bad][:3].tolist()} numpy {want[bad][:3].tolist()}"


def _matmul_scales(feeds: dict[str, np.ndarray], net: Any) -> dict[str, np.ndarray]:
    """``|a| @ |b|`` of the network's matrix products: the size of their terms, the scale of
    a float32 dot product's rounding error (its order differs between cuBLAS and NumPy)."""
    a = {k: np.abs(np.asarray(feeds[k]).astype(np.float32).astype(np.float64)) for k in ("x", "y", "mb")}
    return {
        "matmul": a["x"] @ a["mb"],
        "matmul.t0": np.swapaxes(a["x"], -1, -2) @ a["y"],
        "matmul.t1": a["x"] @ np.swapaxes(a["y"], -1, -2),
    }


def cuda_executor(net: Any, capture: Any = ()) -> Any:
    """``net`` compiled by the cuda backend (one profile at the inputs' static shapes, tensors
    named in ``capture`` kept as outputs) in the executor ``LLM(backend="cuda")`` uses."""
    import trtcore.cuda as tc
    from trtcore.runtime.trt_executor import TensorRTExecutor

    builder = tc.Builder(tc.Logger(tc.Logger.ERROR))
    config = builder.create_builder_config()
    config.add_optimization_profile(builder.create_optimization_profile())
    return TensorRTExecutor(tc, bytes(builder.build_serialized_network(net, config, capture=capture)))


@pytest.mark.parametrize("float_name", FLOAT_NAMES)
def test_every_layer_on_the_cuda_engine_equals_numpy(cp: Any, float_name: str) -> None:
    """Every output equals NumPy's within the module docstring's tolerances (moved here from
    the retired CuPy evaluator, with its assertions); run twice, the second time on the
    prepared launches."""
    net, kinds = layer_network(float_name)
    feeds = layer_feeds(net, seed=21)
    host = dict(feeds)
    host["p"] = feeds["p"].astype(np.float32)  # both executors round this float32 feed to the input type
    flushed = {k: _flush(v) if v.dtype.kind in "fV" else v for k, v in host.items()}
    with np.errstate(all="ignore"):
        want = ReferenceExecutor(net).run({k: v.copy() for k, v in host.items()})
        want_ftz = ReferenceExecutor(net).run({k: v.copy() for k, v in flushed.items()})
    AffinePlugin.seen.clear()
    scales = _matmul_scales(host, net)
    errors = []
    with cuda_executor(net) as ex:
        for attempt in range(2):
            got = ex.run({k: v.copy() for k, v in host.items()})
            assert set(got) == set(want) == set(kinds)
            for name in want:
                w = want[name]
                wants = [w] if w.dtype.kind not in "fV" else [w, _flush(w), want_ftz[name], _flush(want_ftz[name])]
                err = _compare(f"{name} (run {attempt})", got[name], wants, scales.get(name))
                if err:
                    errors.append(err)
    _stat(test="layers_cuda_engine", dtype=float_name, outputs=len(want), mismatches=len(errors))
    assert not errors, f"{len(errors)} outputs differ from NumPy:\n" + "\n".join(errors[:40])
    dtype = np.dtype(ref.nptype(getattr(ref.DataType, float_name)))
    assert AffinePlugin.seen == [(dtype, dtype)] * 2, "the plugin must see bfloat16 as ml_dtypes.bfloat16"


# ---------------------------------------------------------------------------------------
# (b) the tiny Hugging Face checkpoints against transformers on the GPU

_LLMS: dict[tuple[Any, ...], LLM] = {}
_HF: dict[str, Any] = {}


def _llm(store: ModelStore, name: str, dtype: str, rope: str | None = None, device: str = "cuda", backend: str = "cuda") -> LLM:
    key = (name, dtype, rope, device, backend)
    if key not in _LLMS:
        kwargs: dict[str, Any] = {"rope": rope} if rope else {}
        # contiguous KV cache: the tiny models' head_dim (16, 24) is below what the paged
        # attention CUDA kernels take (multiples of 32); the default-model tests run paged
        _LLMS[key] = LLM(
            store.dir(name), backend=backend, device=device, dtype=dtype, kv_cache="contiguous", progress=False, **kwargs
        )
    return _LLMS[key]


def _hf(store: ModelStore, name: str, torch_device: str) -> Any:
    key = f"{name}@{torch_device}"
    if key not in _HF:
        _HF[key] = load_hf(store.dir(name), "float32").to(torch_device)
    return _HF[key]


def hf_logits_on(model: Any, ids: list[int]) -> np.ndarray:
    """float32 logits ``[len(ids), vocab]`` of one transformers forward (no cache, all-ones mask)."""
    import torch

    dev = next(model.parameters()).device
    with torch.no_grad():
        out = model(torch.tensor([ids], device=dev), attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=dev), use_cache=False)
    return out.logits[0].float().cpu().numpy()


def hf_greedy_on(model: Any, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
    """transformers' greedy tokens by repeated full forwards, and the top-2 logit margin of each step."""
    seq, margins = list(prompt), []
    for _ in range(steps):
        logits = hf_logits_on(model, seq)[-1]
        top2 = np.sort(logits)[-2:]
        margins.append(float(top2[1] - top2[0]))
        seq.append(int(np.argmax(logits)))
    return seq[len(prompt) :], margins


def prompts_for(name: str) -> tuple[list[int], list[int]]:
    """A long and a short prompt of variant ``name`` (seeded)."""
    v = VARIANTS[name]
    rng = np.random.default_rng([v.seed, 2024])
    return random_prompt(rng, 80, v.vocab_size), random_prompt(rng, 50, v.vocab_size)


def check_float32_against_hf(
    store: ModelStore, name: str, rope: str | None, device: str, torch_device: str, backend: str = "cuda"
) -> dict[str, float]:
    """The batch of :func:`prompts_for` through ``LLM(device=device, backend=backend)`` against
    transformers on ``torch_device``; the long prompt stops after 12 tokens, the short one runs
    32 alone, so the cache loses a row and the columns only the long prompt used. Returns statistics."""
    v = VARIANTS[name]
    llm = _llm(store, name, "float32", rope, device, backend)
    assert llm.device == device
    long_p, short_p = prompts_for(name)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=v.vocab_size) for n in (12, STEPS)]
    outs = llm.generate([long_p, short_p], params)
    model = _hf(store, name, torch_device)
    stats = {"max_abs_logprob_diff": 0.0, "min_margin": np.inf}
    for prompt, out, steps in ((long_p, outs[0], 12), (short_p, outs[1], STEPS)):
        assert out.error is None
        comp = out.outputs[0]
        ref_tokens, margins = hf_greedy_on(model, prompt, steps)
        stats["min_margin"] = min(stats["min_margin"], min(margins))
        assert comp.token_ids == ref_tokens, (
            f"greedy tokens differ from transformers: ours {comp.token_ids}, hf {ref_tokens}; hf top-2 margins {np.round(margins, 5).tolist()}"
        )
        ref = log_softmax(hf_logits_on(model, prompt + comp.token_ids[:-1])[len(prompt) - 1 :])
        ours = np.full_like(ref, np.nan)
        assert len(comp.logprobs) == steps
        for step, d in enumerate(comp.logprobs):
            assert set(d) == set(range(v.vocab_size))
            for tok, lp in d.items():
                ours[step, tok] = lp.logprob
        diff = np.abs(ours - ref)
        ok = diff <= RTOL * np.maximum(1.0, np.abs(ref))
        bad = np.argwhere(~ok)
        assert ok.all(), f"{len(bad)} log-probs beyond {RTOL} relative; first (step, token) {bad[:5].tolist()}; max abs diff {diff.max():.3g}"
        stats["max_abs_logprob_diff"] = max(stats["max_abs_logprob_diff"], float(diff.max()))
    return stats


def low_precision_logprobs(store: ModelStore, name: str, dtype: str, backend: str = "cuda") -> tuple[np.ndarray, np.ndarray]:
    """Full-vocabulary log-probabilities after three prompts (80, 33, 7 tokens) in float32 and ``dtype``."""
    v = VARIANTS[name]
    rng = np.random.default_rng([v.seed, 99])
    prompts = [[int(t) for t in rng.integers(3, v.vocab_size, n)] for n in (80, 33, 7)]
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, logprobs=v.vocab_size)
    rows = []
    for dt in ("float32", dtype):
        outs = _llm(store, name, dt, None, backend=backend).generate(prompts, sp)
        rows.append(np.array([[o.outputs[0].logprobs[0][t].logprob for t in range(v.vocab_size)] for o in outs]))
    return rows[0], rows[1]
