"""GEMM tactics on the CPU: which calls a build would time, the timing cache on disk, and
how the runtime dispatches a chosen tactic (timing itself runs on the GPU: test_engine_gpu)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from netutil import decode_shapes, llama_plan

import trtcore.cuda as tc
from trtcore.cuda.runtime import ICudaEngine
from trtcore.cuda import synthetic, tactics
from trtcore.cuda.cublaslt import signature
from trtcore.cuda.gemm import GemmCall, gemv_applies, gemv_launch


def _call(**kw: Any) -> GemmCall:
    base = dict(op_x=1, op_y=0, m=960, n=1, k=576, x_off=0, ldx=576, stride_x=0, y_off=0, ldy=576, stride_y=0, c_off=0, ldc=960, stride_c=0, batch=1)
    return GemmCall(**{**base, **kw})


def test_signature_keys_the_shape_not_the_offsets() -> None:
    bf16 = tc.DataType.BF16
    assert signature(_call(), bf16) == signature(_call(x_off=64, y_off=3, c_off=7), bf16)
    for change in ({"n": 2}, {"ldy": 1536}, {"op_x": 0}, {"batch": 2, "stride_c": 960}):
        assert signature(_call(**change), bf16) != signature(_call(), bf16), change
    assert signature(_call(), bf16) != signature(_call(), tc.DataType.HALF)


def test_gemv_applies_to_dense_weight_times_few_rows_only() -> None:
    assert gemv_applies(_call()) and gemv_applies(_call(n=4))
    assert not gemv_applies(_call(n=5))  # more than 4 token rows
    assert not gemv_applies(_call(op_x=0))  # weight not [N, K] row-major
    assert not gemv_applies(_call(k=570, ldx=570))  # no 16-byte loads
    assert not gemv_applies(_call(batch=2))
    assert gemv_applies(_call(y_off=8)) and not gemv_applies(_call(y_off=3))  # activation rows start 16-byte aligned
    assert gemv_applies(_call(n=2, ldy=584)) and not gemv_applies(_call(n=2, ldy=580))
    assert gemv_applies(_call(ldy=580))  # one token row: its pitch is never used


@pytest.mark.parametrize(("features", "rows"), [(576, 1), (960, 4), (3072, 2), (28672, 1)])
def test_gemv_launch_covers_every_feature_with_one_warp(features: int, rows: int) -> None:
    """Every output feature gets exactly one warp of the launch, and the block's shared
    memory holds the ``M * K`` activations it stages."""
    grid, block, smem, _ = gemv_launch(_call(m=features, ldc=features, n=rows), 2, 0, 0, 0)
    warps = block // 32
    assert block % 32 == 0 and (grid[0] - 1) * warps < features <= grid[0] * warps
    assert smem == rows * 576 * 2


def test_gemv_needs_the_activations_to_fit_shared_memory() -> None:
    from trtcore.cuda.codegen import GEMV_X_MAX_BYTES

    k = GEMV_X_MAX_BYTES // 2  # bfloat16 values in the limit
    assert gemv_applies(_call(k=k, ldx=k, ldy=k), 2) and not gemv_applies(_call(k=k + 8, ldx=k + 8, ldy=k + 8), 2)
    assert not gemv_applies(_call(k=k, ldx=k, ldy=k), 4)  # float32: twice the bytes
    assert not gemv_applies(_call(n=4, k=k // 2, ldx=k // 2, ldy=k // 2), 2)  # 4 rows of K/2


def test_profile_calls_are_the_models_gemms_at_the_profile_points() -> None:
    plan, d = llama_plan(layers=2, arch=None)
    cfg = synthetic.config("SmolLM2-135M", num_hidden_layers=2, vocab_size=512)
    h, q, kv, inter = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim, cfg.intermediate_size
    want_mk = {(q + 2 * kv, h), (h, q), (2 * inter, h), (h, inter), (cfg.vocab_size, h)}  # column-major m = out features
    calls = tactics.profile_calls(plan)
    got_mk = {(c.m, c.k) for _, c, _, _ in calls}
    assert got_mk == want_mk
    tokens = {p[0] for p in plan.profile["input_ids"]}  # the token counts of min / opt / max
    assert {c.n for _, c, _, _ in calls if c.m != cfg.vocab_size} == tokens
    assert len({signature(c, dt) for _, c, dt, _ in calls}) == len(calls)
    assert all(has for name, _, _, has in calls)  # every weight GEMM has a GEMV kernel


def test_timing_cache_round_trip_and_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "sub" / tactics.CACHE_FILE
    cache = tactics.TimingCache(path)
    algo = bytes(range(64))
    cache.put("H200|lt 1|sig", {"kind": "lt", "algo": algo, "workspace": 1024, "us": 3.5})
    cache.save()
    again = tactics.TimingCache(path)
    assert again.get("H200|lt 1|sig") == {"kind": "lt", "algo": algo, "workspace": 1024, "us": 3.5}
    assert again.get("other") is None
    assert json.loads(path.read_text())["H200|lt 1|sig"]["algo"] == algo.hex()
    path.write_text("{not json")
    assert tactics.TimingCache(path).entries == {}  # unreadable: start empty


def test_timing_cache_write_failure_is_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cache = tactics.TimingCache(blocker / "cache.json")  # its folder is a file
    cache.put("k", {"kind": "cublas"})
    cache.save()
    assert "cannot write the timing cache" in caplog.text


def _prepared(plan: Any, monkeypatch: pytest.MonkeyPatch, override: str | None) -> list[Any]:
    if override is None:
        monkeypatch.delenv("TRTCORE_CUDA_GEMV", raising=False)
    else:
        monkeypatch.setenv("TRTCORE_CUDA_GEMV", override)
    engine = ICudaEngine(plan)
    engine._tactics_valid = True  # as on the GPU that timed them
    ctx = engine.create_execution_context_without_device_memory()
    ctx.set_device_memory(1 << 40, engine.device_memory_size_v2)
    for i in range(engine.num_io_tensors):
        ctx.set_tensor_address(engine.get_tensor_name(i), (i + 2) << 40)
    for name, shape in decode_shapes(plan, batch=1).items():
        assert ctx.set_input_shape(name, shape), name
    return ctx.prepare({name: (i + 100) << 40 for i, name in enumerate(plan.graph.constants)})


def test_runtime_runs_the_chosen_tactic_per_call_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    plan, _ = llama_plan(layers=2, arch=None)
    steps = _prepared(plan, monkeypatch, None)
    gemms = [s for s in steps if s.kind == "gemm"]
    assert gemms and all(t["kind"] == "cublas" for s in gemms for t in s.tactics)  # nothing timed: cublasGemmEx
    o_proj = next(s for s in gemms if s.name.endswith("o_proj"))
    down = next(s for s in gemms if s.name.endswith("down_proj"))
    plan.tactics[signature(o_proj.calls[0], o_proj.dtype)] = {"kind": "gemv", "label": "gemv"}
    plan.tactics[signature(down.calls[0], down.dtype)] = {"kind": "lt", "algo": b"\0" * 64, "label": "heuristic#0"}
    steps = _prepared(plan, monkeypatch, None)
    names = {s.name: s for s in steps}
    o_steps = [s for n, s in names.items() if "o_proj" in n]
    assert len(o_steps) == 2 and all(s.kind == "kernel" and s.name.endswith(("#gemv", "#gemv1")) for s in o_steps)  # both layers' o_proj
    downs = [s for n, s in names.items() if n.endswith("down_proj")]
    assert downs and all(s.kind == "gemm" and s.tactics[0]["kind"] == "lt" for s in downs)
    # TRTCORE_CUDA_GEMV=0: every GEMM on cublasGemmEx whatever the plan chose
    steps = _prepared(plan, monkeypatch, "0")
    assert not any(s.name.endswith(("#gemv", "#gemv1")) for s in steps)
    assert all(t["kind"] == "cublas" for s in steps if s.kind == "gemm" for t in s.tactics)


def test_tactics_timed_on_another_gpu_are_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    plan, _ = llama_plan(layers=2, arch=None)
    plan.stats["tactics_device"] = "NVIDIA H200, compute capability 9.0"
    plan.tactics["x"] = {"kind": "lt", "algo": b"\0" * 64}
    engine = ICudaEngine(plan)
    assert engine.tactic("x") == {"kind": "cublas"}  # this CPU machine is not the H200 that timed them
    assert engine.tactic("never timed") == {"kind": "cublas"}
