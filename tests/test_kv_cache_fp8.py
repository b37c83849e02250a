"""The FP8 (E4M3) KV cache end to end: ``LLM(..., kv_cache_dtype="fp8")`` (vLLM's argument and
values), ``--kv-cache-dtype``, the plan, the pool's dtype and size, the checkpoint's per-layer
``k_scale`` / ``v_scale`` (vLLM's "Quantized KV Cache").

CPU (CI): a tiny bfloat16 Llama (head_dim 64, GQA 2:1) on the reference backend generates with the
FP8 pool and its log-probabilities stay close to the bfloat16 pool's; scales in the checkpoint
reach the plugins and change the outcome (scales of 1.0 do not: they equal the default); bad
values and combinations are refused naming what was given; the pool takes half the bytes per
token, so the same memory holds twice the blocks.

GPU (marker ``gpu``): the same tiny Llama on ``backend="cuda"`` with the FP8 KV cache gives the
reference backend's greedy tokens.
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hf_models import ModelStore, Variant, write_checkpoint

from trtcore import LLM, SamplingParams
from trtcore.checkpoint import Checkpoint, kv_cache_scales
from trtcore.errors import CheckpointError, InvalidArgumentError
from trtcore.config import load_config
from trtcore.plan import BuildConfig, BuildPlan, resolve_plan
from trtcore.runtime.kv_cache import KVCacheSpec

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)

#: head_dim 64 (the tensor-core kernels' size, so the same model runs on the cuda backend's
#: paged kernels), GQA 2:1, bfloat16 weights, one safetensors file
TINY = Variant("llama_fp8kv", dtype="bfloat16", num_attention_heads=4, num_key_value_heads=2, head_dim=64, seed=21)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    return ModelStore(tmp_path_factory.mktemp("fp8kv"), write=lambda name, path: write_checkpoint(TINY, path))


def _prompts(n: int = 3) -> list[list[int]]:
    rng = np.random.default_rng(3)
    return [[int(t) for t in rng.integers(3, TINY.vocab_size, size)] for size in (5, 23, 40)[:n]]


def _first_logprobs(llm: LLM, prompts: list[list[int]]) -> np.ndarray:
    """Full-vocabulary log-probabilities of each prompt's first generated token: [prompts, vocab]."""
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, logprobs=TINY.vocab_size), use_tqdm=False)
    rows = []
    for out in outs:
        lp = out.outputs[0].logprobs[0]
        rows.append([lp[i].logprob for i in range(TINY.vocab_size)])
    return np.asarray(rows)


def _with_scales(src: Path, dst: Path, scales: dict[str, float]) -> Path:
    """A copy of the checkpoint folder ``src`` whose safetensors file also holds the scalar
    tensors ``scales`` (name -> value, float32, shape [] as llm-compressor writes them)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    [f] = sorted(dst.glob("*.safetensors"))
    tensors = load_file(f)
    tensors |= {name: torch.tensor(value, dtype=torch.float32) for name, value in scales.items()}
    save_file(tensors, f, metadata={"format": "pt"})
    return dst


def _llm(d: Path, kv: str, **kw) -> LLM:
    return LLM(d, backend="reference", dtype="bfloat16", kv_cache_dtype=kv, max_seq_len=128, max_num_tokens=64, progress=False, **kw)


def test_llm_fp8_kv_generates_close_to_bfloat16_kv(store: ModelStore) -> None:
    d = store.dir(TINY.name)
    auto, fp8 = _llm(d, "auto"), _llm(d, "fp8")
    assert auto.plan.kv_cache_dtype == "auto" and fp8.plan.kv_cache_dtype == "fp8_e4m3"
    assert fp8.kv_mode.pool_dtype == E4M3 and auto.kv_mode.pool_dtype == np.dtype(ml_dtypes.bfloat16)
    assert fp8.engine.kv_cache.pool.dtype == E4M3
    prompts = _prompts()
    a, f = _first_logprobs(auto, prompts), _first_logprobs(fp8, prompts)
    diff = np.abs(a - f)
    # E4M3 keeps 3 mantissa bits: each K/V element moves by up to 2^-4 relative (vs 2^-8 for
    # bfloat16). Through this model's scores (|q.k| * scale of order 1) that moves the logits by
    # a few hundredths to tenths; measured max 0.14 over the vocabulary, so 0.5 bounds it with room
    # while a broken dequantization (wrong scale, wrong code, garbage) moves them by units.
    assert 0 < diff.max() < 0.5, diff.max()
    assert diff.mean() < 0.1, diff.mean()
    # and it generates: several greedy steps (decode reads the FP8 pool), all finite
    [out] = fp8.generate([prompts[1]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0), use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 8
    assert all(np.isfinite(lp[t].logprob) for lp, t in zip(out.outputs[0].logprobs, out.outputs[0].token_ids))


def test_checkpoint_kv_scales_reach_the_plugins_and_change_the_outcome(store: ModelStore, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = store.dir(TINY.name)
    # k scales small enough that most keys saturate at 448 * scale: the outcome changes a lot
    scaled = _with_scales(
        d,
        tmp_path / "scaled",
        {
            "model.layers.0.self_attn.k_scale": 0.002,
            "model.layers.0.self_attn.v_scale": 0.5,
            "model.layers.1.self_attn.k_proj.output_scale": 0.003,  # the other published form
            "model.layers.1.self_attn.v_proj.output_scale": 0.25,
        },
    )
    ones = _with_scales(d, tmp_path / "ones", {f"model.layers.{i}.self_attn.{kv}_scale": 1.0 for i in range(2) for kv in "kv"})
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    assert kv_cache_scales(Checkpoint(scaled), 2) == {0: (f32(0.002), 0.5), 1: (f32(0.003), 0.25)}
    with caplog.at_level(logging.WARNING, logger="trtcore"):
        caplog.clear()
        llm_scaled = _llm(scaled, "fp8")
        assert not [r for r in caplog.records if "scaling factor 1.0" in r.getMessage()]
        llm_default = _llm(d, "fp8")
        assert len([r for r in caplog.records if "scaling factor 1.0" in r.getMessage()]) == 1
    prompts = _prompts(2)
    base = _first_logprobs(llm_default, prompts)
    with_ones = _first_logprobs(_llm(ones, "fp8"), prompts)
    with_scaled = _first_logprobs(llm_scaled, prompts)
    np.testing.assert_array_equal(with_ones, base)  # scales of 1.0 are the default
    assert np.abs(with_scaled - base).max() > 0.5, "the checkpoint's scales did not change the outcome"
    # the bfloat16 KV cache reads no scale (the tensors are reported as unused, not applied)
    with pytest.warns(UserWarning, match="not used"):
        auto = _llm(scaled, "auto")
    np.testing.assert_array_equal(_first_logprobs(auto, prompts), _first_logprobs(_llm(d, "auto"), prompts))


def test_kv_cache_scales_refuses_bad_tensors(store: ModelStore, tmp_path: Path) -> None:
    d = store.dir(TINY.name)
    bad = _with_scales(d, tmp_path / "neg", {"model.layers.1.self_attn.v_scale": -1.0})
    with pytest.raises(CheckpointError, match="v_scale"):
        kv_cache_scales(Checkpoint(bad), 2)
    # a float32 subnormal: 1 / scale overflows float32 (the kernels' x / scale saturates every code)
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.float32(1) / np.float32(1e-40))
    sub = _with_scales(d, tmp_path / "subnormal", {"model.layers.1.self_attn.k_scale": 1e-40})
    with pytest.raises(CheckpointError, match=r"k_scale must be one finite number >= 1\.17"):
        kv_cache_scales(Checkpoint(sub), 2)
    beyond = _with_scales(d, tmp_path / "beyond", {"model.layers.5.self_attn.k_scale": 1.0})
    with pytest.raises(CheckpointError, match="layer 5"):
        kv_cache_scales(Checkpoint(beyond), 2)
    both = _with_scales(d, tmp_path / "both", {"model.layers.0.self_attn.kv_scale": 0.5})
    assert kv_cache_scales(Checkpoint(both), 2, warn=False) == {0: (0.5, 0.5)}
    # two names for one layer's scale that disagree: which one is meant is unknown, so refused
    # naming both; the same value under two names is one scale
    clash = _with_scales(d, tmp_path / "clash", {"model.layers.0.self_attn.k_scale": 0.125, "model.layers.0.self_attn.kv_scale": 0.5})
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.self_attn\.k_scale.*model\.layers\.0\.self_attn\.kv_scale"):
        kv_cache_scales(Checkpoint(clash), 2)
    clash_v = _with_scales(d, tmp_path / "clash_v", {"model.layers.1.self_attn.v_scale": 0.25, "model.layers.1.self_attn.v_proj.output_scale": 0.75})
    with pytest.raises(CheckpointError, match="v_proj.output_scale"):
        kv_cache_scales(Checkpoint(clash_v), 2)
    same = _with_scales(d, tmp_path / "same", {"model.layers.0.self_attn.k_scale": 0.5, "model.layers.0.self_attn.k_proj.output_scale": 0.5})
    assert kv_cache_scales(Checkpoint(same), 2, warn=False) == {0: (0.5, 1.0)}


def test_bad_kv_cache_dtype_is_refused(store: ModelStore) -> None:
    d = store.dir(TINY.name)
    with pytest.raises(InvalidArgumentError, match=r"kv_cache_dtype 'int8' is not supported; expected one of auto, fp8, fp8_e4m3"):
        _llm(d, "int8")
    with pytest.raises(InvalidArgumentError, match="needs kv_cache='paged'"):
        _llm(d, "fp8", kv_cache="contiguous")
    # the messages name only what is missing (the paged cache is there)
    with pytest.raises(InvalidArgumentError, match=r"^the FP8 KV cache \(kv_cache_dtype='fp8'\) needs a float16 or bfloat16 engine .*got dtype='float32'$"):
        LLM(d, backend="reference", dtype="float32", kv_cache_dtype="fp8", progress=False)
    with pytest.raises(InvalidArgumentError, match="dtype='bfloat16', on the command line --dtype bfloat16") as e:  # the reference backend's default float32, with advice
        LLM(d, backend="reference", kv_cache_dtype="fp8", progress=False)
    assert "paged KV cache" not in str(e.value)
    # tensorrt_rtx has no paged cache (no plugins): the advice names the backend, not the dtype
    with pytest.raises(InvalidArgumentError, match=r"backend 'tensorrt_rtx' has no paged KV cache .*use backend 'tensorrt', 'cuda' or 'reference'\)$") as e:
        resolve_plan(load_config(d), BuildConfig(kv_cache_dtype="fp8"), "tensorrt_rtx")
    assert "dtype" not in str(e.value).split("(this plan")[1]
    assert BuildConfig(kv_cache_dtype="FP8").kv_cache_dtype == "fp8_e4m3" == BuildConfig(kv_cache_dtype="fp8_e4m3").kv_cache_dtype


def test_fp8_pool_takes_half_the_bytes(store: ModelStore) -> None:
    bf16 = KVCacheSpec(2, 2, 64, 16, "bfloat16")
    fp8 = KVCacheSpec(2, 2, 64, 16, "fp8")
    assert fp8.dtype == E4M3
    assert 2 * fp8.bytes_per_token == bf16.bytes_per_token == 2 * 2 * 2 * 64 * 2
    budget = 10 * bf16.bytes_per_block
    assert fp8.num_blocks_for_budget(budget) == 2 * bf16.num_blocks_for_budget(budget) == 20
    # through the LLM: the same kv_cache_memory holds twice the blocks
    d = store.dir(TINY.name)
    auto, f = _llm(d, "auto", kv_cache_memory=budget), _llm(d, "fp8", kv_cache_memory=budget)
    assert f.engine.kv_cache.num_blocks == 2 * auto.engine.kv_cache.num_blocks == 20
    assert f.engine.kv_cache.pool.nbytes == auto.engine.kv_cache.pool.nbytes


def test_plan_records_kv_cache_dtype() -> None:
    """The sidecar's plan carries the choice (an FP8-KV engine is never taken for a bfloat16-KV
    one: LLM(engine=...) compares every build option with it); a plan written before the field
    reads as "auto"."""
    plan = BuildPlan("cuda", "bfloat16", "plugin", "paged", "plugin", 16, 8, 128, 1, 128, 64, 100, "fp8_e4m3")
    d = plan.to_dict()
    assert d["kv_cache_dtype"] == "fp8_e4m3" and BuildPlan.from_dict(d) == plan and plan.kv_fp8 and plan.kv_pool_dtype == "float8_e4m3fn"
    del d["kv_cache_dtype"]
    assert BuildPlan.from_dict(d).kv_cache_dtype == "auto"


def test_engine_file_refuses_another_kv_cache_dtype() -> None:
    from trtcore.engine_file import EngineFile

    plan = BuildPlan("cuda", "bfloat16", "plugin", "paged", "plugin", 16, 8, 128, 1, 128, 64, 100, "auto")
    ef = EngineFile.__new__(EngineFile)
    ef.sidecar = {"plan": plan.to_dict()}
    ef.path = Path("x.engine")
    with pytest.raises(InvalidArgumentError, match="kv_cache_dtype='fp8_e4m3', but x.engine was built with kv_cache_dtype='auto'"):
        ef.plan_for(BuildConfig(kv_cache_dtype="fp8"), None)
    assert ef.plan_for(BuildConfig(), None) == plan


def test_cli_kv_cache_dtype_flag() -> None:
    from trtcore.cli import _parser, _plan_choices

    for argv in (["generate", "hi"], ["build", "--output", "x.engine"], ["bench", "latency"], ["serve"]):
        args = _parser().parse_args([*argv, "--kv-cache-dtype", "fp8"])
        assert args.kv_cache_dtype == "fp8"
    assert _plan_choices(_parser().parse_args(["generate", "hi", "--kv-cache-dtype", "fp8_e4m3"]))["kv_cache_dtype"] == "fp8_e4m3"
    # any case, as LLM(kv_cache_dtype="FP8") takes it
    assert _plan_choices(_parser().parse_args(["generate", "hi", "--kv-cache-dtype", "FP8"]))["kv_cache_dtype"] == "fp8"
    assert "kv_cache_dtype" not in _plan_choices(_parser().parse_args(["generate", "hi"]))
    with pytest.raises(SystemExit):
        _parser().parse_args(["generate", "hi", "--kv-cache-dtype", "int8"])
    # --quantization too, as LLM(quantization="FP8") takes it
    assert _parser().parse_args(["generate", "hi", "--quantization", "FP8"]).quantization == "fp8"


def test_cuda_backend_builds_the_fp8_pool_network_on_the_cpu(store: ModelStore) -> None:
    """The cuda backend's engine builder (which runs without a GPU) takes the network with the FP8
    pool input (TensorRT DataType.FP8) and the plugins' FP8 fields."""
    from trtcore.builder import build_engine, define_network
    from trtcore.config import load_config
    from trtcore.plan import resolve_plan
    from trtcore.trt import load_trt

    d = store.dir(TINY.name)
    cfg = load_config(d)
    trt = load_trt("cuda")
    plan = resolve_plan(cfg, BuildConfig(dtype="bfloat16", kv_cache_dtype="fp8", max_seq_len=128, max_num_tokens=64), "cuda", trt=trt)
    dn = define_network(trt, cfg, Checkpoint(d), plan)
    pool = [dn.network.get_input(i) for i in range(dn.network.num_inputs) if dn.network.get_input(i).name == "kv_cache_pool"]
    assert [p.dtype for p in pool] == [trt.DataType.FP8]
    assert len(build_engine(dn)) > 0


#: bfloat16 log-probabilities of the cuda engine and the reference backend differ by up to 64
#: bfloat16 unit roundoffs (tests/test_gpu_backend.py's LOW_PRECISION_UNITS): a greedy step whose
#: top two candidates are closer than that may pick either
NEAR_TIE = 64 * 2.0**-8


@pytest.mark.gpu
def test_gpu_cuda_backend_fp8_kv_tokens_equal_reference(store: ModelStore) -> None:
    """backend="cuda" with the FP8 KV cache (the KV_FP8 kernels) gives the reference backend's
    greedy tokens: both attend over the same dequantized values. A sequence may part from the
    reference's only at a near-tie of the reference (top two log-probs within NEAR_TIE), after
    which it is not compared further."""
    from trtcore.testing import gpu_status

    ok, why = gpu_status()
    if not ok:
        pytest.skip(why)
    d = _with_scales(store.dir(TINY.name), store.root / "gpu_scaled", {f"model.layers.{i}.self_attn.{kv}_scale": 0.02 for i in range(2) for kv in "kv"})
    prompts = _prompts()
    ref = _llm(d, "fp8").generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2), use_tqdm=False)
    gpu = LLM(d, backend="cuda", dtype="bfloat16", kv_cache_dtype="fp8", max_seq_len=128, max_num_tokens=64, progress=False)
    assert gpu.plan.kv_fp8 and gpu.kv_cache == "paged" and gpu.backend == "cuda"
    got = gpu.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    compared = 0
    for r, g in zip(ref, got):
        rt, gt = r.outputs[0].token_ids, g.outputs[0].token_ids
        for step, (a, b) in enumerate(zip(rt, gt)):
            if a != b:
                top = sorted((lp.logprob for lp in r.outputs[0].logprobs[step].values()), reverse=True)
                assert top[0] - top[1] <= NEAR_TIE, f"step {step}: cuda {b} != reference {a} with a clear margin {top[0] - top[1]:.3g}"
                break
            compared += 1
    assert compared >= 24, f"only {compared} tokens agreed before near-ties"


@pytest.mark.parametrize(
    ("scheme", "field"),
    [
        ({"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}, None),  # llm-compressor's
        ({"num_bits": 8, "type": "float", "dynamic": False}, None),  # strategy left out: per tensor
        ({"num_bits": 8, "type": "int", "strategy": "tensor", "dynamic": False}, "type='int'"),
        ({"num_bits": 8, "strategy": "tensor"}, "type='int'"),  # compressed-tensors' default type
        ({"num_bits": 4, "type": "float", "strategy": "tensor"}, "num_bits=4"),
        ({"num_bits": 8, "type": "float", "strategy": "head"}, "strategy='head'"),
        ({"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": True}, "dynamic=True"),
    ],
)
def test_kv_cache_scheme_is_checked_for_the_fp8_cache(store: ModelStore, tmp_path: Path, scheme: dict, field: str | None) -> None:
    """A checkpoint's kv_cache_scheme (compressed-tensors) other than 8-bit float with static
    per-layer scales is refused naming the field when the FP8 KV cache would read its scales (a
    new-user trial's int8, 4-bit and per-head schemes ran silently as FP8); with
    kv_cache_dtype='auto' the scheme is not used and not checked."""
    import json

    from trtcore.errors import UnsupportedQuantizationError
    from trtcore.quantizer import quantize_checkpoint

    out = quantize_checkpoint(store.dir(TINY.name), tmp_path / "q", method="fp8", activations="dynamic")
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"]["kv_cache_scheme"] = scheme
    (out / "config.json").write_text(json.dumps(cfg))
    if field is None:
        _llm(out, "fp8").close()
    else:
        with pytest.raises(UnsupportedQuantizationError, match=rf"kv_cache_scheme {re.escape(field)} is not supported: .*kv_cache_dtype='auto'"):
            _llm(out, "fp8")
    _llm(out, "auto").close()


def test_autofp8_static_kv_cache_scheme_is_read() -> None:
    """AutoFP8's ``save_quantized_model`` writes ``"kv_cache_scheme": "static"`` (a string: one
    static FP8 scale per layer for the k_proj / v_proj outputs, ``output_scale``, which vLLM and
    trtcore read as the KV cache's). It was refused as "expected an object" after trtcore's own
    warning pointed to kv_cache_dtype='fp8'; another string is still refused by name."""
    from trtcore.errors import UnsupportedQuantizationError
    from trtcore.quant_formats import check_kv_cache_scheme

    check_kv_cache_scheme({"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"], "kv_cache_scheme": "static"})
    with pytest.raises(UnsupportedQuantizationError, match=r"kv_cache_scheme 'dynamic': expected an object .* or 'static'"):
        check_kv_cache_scheme({"quant_method": "fp8", "kv_cache_scheme": "dynamic"})


def test_kv_cache_only_compressed_tensors_checkpoint_reads_its_scales(store: ModelStore, tmp_path: Path) -> None:
    """llm-compressor's FP8 KV cache alone (``kv_cache_scheme``, no config group quantizing
    weights: float linears plus ``k_scale`` / ``v_scale``) was refused at detection as
    "format 'dense'"; vLLM reads its linears unquantized. It now builds, its FP8 cache reads the
    checkpoint's scales exactly as the same folder without the quantization_config does, and
    its scheme is still checked."""
    import json

    from trtcore.errors import UnsupportedQuantizationError

    d = store.dir(TINY.name)
    scales = {f"model.layers.{i}.self_attn.{kv}_scale": s for i, pair in enumerate(((0.002, 0.5), (0.003, 0.25))) for kv, s in zip("kv", pair)}
    plain = _with_scales(d, tmp_path / "plain", scales)
    kv_only = _with_scales(d, tmp_path / "kv_only", scales)
    cfg = json.loads((kv_only / "config.json").read_text())
    scheme = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "config_groups": {},
        "format": "dense",
        "kv_cache_scheme": scheme,
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
    }
    (kv_only / "config.json").write_text(json.dumps(cfg))
    prompts = _prompts(2)
    llm = _llm(kv_only, "fp8")
    assert llm.quantization is None
    np.testing.assert_array_equal(_first_logprobs(llm, prompts), _first_logprobs(_llm(plain, "fp8"), prompts))
    cfg["quantization_config"]["kv_cache_scheme"] = scheme | {"type": "int"}
    (kv_only / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedQuantizationError, match=r"kv_cache_scheme type='int' is not supported"):
        _llm(kv_only, "fp8")
