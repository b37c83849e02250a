"""Plans (CPU): serialization round trip, and every generated kernel compiles with NVRTC
for sm_80, sm_89 and sm_90 (no GPU needed)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import hf_models  # noqa: F401
from netutil import compile_net, llama_plan

import trtcore.cuda as tc
from trtcore.builder import _builder_config
from trtcore.cuda import codegen
from trtcore.cuda.plan import Plan
from trtcore.errors import NetworkError


def _same(a: Plan, b: Plan) -> None:
    ga, gb = a.graph, b.graph
    assert [(n.name, n.op, n.inputs, n.outputs, n.layers) for n in ga.nodes] == [(n.name, n.op, n.inputs, n.outputs, n.layers) for n in gb.nodes]
    assert ga.values == gb.values and ga.inputs == gb.inputs and ga.outputs == gb.outputs and ga.aliases == gb.aliases
    assert ga.constants.keys() == gb.constants.keys()
    for k in ga.constants:
        assert ga.constants[k].dtype == gb.constants[k].dtype
        np.testing.assert_array_equal(np.ascontiguousarray(ga.constants[k]).view(np.uint8), np.ascontiguousarray(gb.constants[k]).view(np.uint8))
    assert {k: (v.source, v.function, v.params) for k, v in a.sources.items()} == {k: (v.source, v.function, v.params) for k, v in b.sources.items()}
    assert a.compile_keys == b.compile_keys and a.tactics == b.tactics and a.offsets == b.offsets
    assert a.device_memory_size == b.device_memory_size and a.profile == b.profile and a.kernels == b.kernels


def test_serialized_plan_deserializes_identically() -> None:
    _, d = llama_plan(layers=2, arch=None)
    cfg = _builder_config(d, None)
    cfg.set_compute_capability("sm_90", 0)
    blob = tc.Builder(tc.Logger(tc.Logger.ERROR)).build_serialized_network(d.network, cfg)
    assert isinstance(blob, bytes)
    engine = tc.Runtime(tc.Logger()).deserialize_cuda_engine(blob)
    built = tc.Builder(tc.Logger(tc.Logger.ERROR)).build_engine(d.network, cfg)
    _same(engine.plan, built.plan)
    assert engine.plan.arch == "sm_90" and set(engine.plan.compile_keys) == set(engine.plan.sources)
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    assert names[:2] == ["input_ids", "position_ids"] and "logits" in names
    assert engine.get_tensor_mode("logits") == tc.TensorIOMode.OUTPUT and engine.get_tensor_mode("input_ids") == tc.TensorIOMode.INPUT
    assert engine.get_tensor_dtype("kv_cache_pool") == tc.DataType.BF16
    assert engine.get_tensor_profile_shape("input_ids", 0) == [(1,), (128,), (128,)]
    assert engine.device_memory_size_v2 == engine.plan.device_memory_size > 0


def test_plan_bytes_keep_every_array_and_old_plain_pickles_load() -> None:
    """The serialized plan (header, pickle, arrays out of band) gives back every constant bit
    for bit with its dtype (bfloat16 and FP8 travel as unsigned views); a plan
    pickled whole (the format before the header) loads too; a cut one is refused."""
    import pickle

    import ml_dtypes

    from trtcore.cuda import plan as plan_module

    plan, _ = llama_plan(layers=1, arch=None)
    rng = np.random.default_rng()
    extra = {
        "bf16": rng.standard_normal((3, 5)).astype(ml_dtypes.bfloat16),
        "e4m3": rng.standard_normal(7).astype(ml_dtypes.float8_e4m3fn),
        "i8": rng.integers(-128, 127, size=9).astype(np.int8),
        "strided": rng.standard_normal((4, 6)).astype(np.float32)[:, ::2],
        "empty": np.zeros((0, 3), np.float32),
    }
    plan.graph.constants.update(extra)
    blob = plan_module.dumps(plan)
    assert bytes(blob[:8]) == plan_module.MAGIC
    for data in (blob, bytearray(blob), memoryview(blob), pickle.dumps(plan, protocol=pickle.HIGHEST_PROTOCOL)):
        back = tc.Runtime(tc.Logger()).deserialize_cuda_engine(data).plan
        _same(back, plan)
        for name, want in extra.items():
            got = back.graph.constants[name]
            assert got.dtype == want.dtype and got.shape == want.shape, name
            np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8))
    with pytest.raises(NetworkError, match="not a trtcore cuda plan"):
        tc.Runtime().deserialize_cuda_engine(bytes(blob[: len(blob) // 2]))


def test_not_a_plan_is_refused() -> None:
    with pytest.raises(NetworkError, match="not a trtcore cuda plan"):
        tc.Runtime().deserialize_cuda_engine(b"not a plan")


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90"])
def test_every_generated_kernel_compiles(arch: str) -> None:
    """The kernels of every layer type (bfloat16 and float32 networks) and of a Llama
    (bfloat16), for each architecture; cached on disk, so a second run compiles nothing."""
    from test_device_select import layer_network

    sources: dict[str, codegen.KernelSource] = {}
    for name in ("BF16", "FLOAT"):
        net, _ = layer_network(name)
        sources.update({ks.key: ks for ks in compile_net(net, arch=None).sources.values()})
    plan, _ = llama_plan(layers=1, arch=None)
    sources.update({ks.key: ks for ks in plan.sources.values()})
    for dt in codegen.CUDA_GEMV_TYPES:  # the GEMV tactic for every weight type (16-byte loads of 2- and 4-byte types)
        ks = codegen.gemv(dt)
        sources[ks.key] = ks
    kinds = {ks.function.split("_")[1] for ks in sources.values()}
    assert {"pointwise", "row", "softmax", "reduce", "gather", "concat", "kv", "attention", "gemv"} <= kinds
    for ks in sources.values():
        ck = codegen.compile_source(ks, arch)
        assert ck.arch == arch and ks.function in ck.symbols


def test_trtcore_build_writes_a_cuda_engine(hf_models: Any, tmp_path: Path) -> None:  # noqa: F811
    """``trtcore build --backend cuda`` (no GPU needed): the engine file deserializes with
    ``trtcore.cuda.Runtime``, its I/O is what the plan's KV contract declares, and the
    sidecar records the plan and the engine's SHA-256."""
    from trtcore.cli import main
    from trtcore.config import load_config
    from trtcore.kv_modes import kv_mode
    from trtcore.plan import BuildPlan

    model = hf_models.dir("llama3_rope")
    out = tmp_path / "tiny.engine"
    assert main(["build", "--model", str(model), "--backend", "cuda", "--output", str(out), "--max-seq-len", "64"]) == 0
    side = json.loads((tmp_path / "tiny.engine.json").read_text())
    blob = out.read_bytes()
    assert side["backend"] == "cuda" and side["engine_sha256"] == hashlib.sha256(blob).hexdigest()
    plan = BuildPlan.from_dict(side["plan"])
    assert plan.backend == "cuda" and plan.max_seq_len == 64
    engine = tc.Runtime(tc.Logger()).deserialize_cuda_engine(blob)
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    mode = kv_mode(plan, load_config(model))
    n_in = len(mode.inputs)
    assert names[:n_in] == [t.name for t in mode.inputs]
    assert sorted(names[n_in:]) == sorted(t.name for t in mode.outputs)  # outputs in the order the network marked them
    for t in mode.inputs:
        assert engine.get_tensor_mode(t.name) == tc.TensorIOMode.INPUT
        assert tuple(engine.get_tensor_shape(t.name)) == t.shape


def test_every_generated_kernel_waits_for_its_predecessor_first() -> None:
    """The runtime launches generated kernels with programmatic dependent launch, which is
    sound only if each kernel executes ``griddepcontrol.wait`` before it touches activations:
    the wait is the kernel's first statement, or (GEMV) follows only loads of the weight."""
    from test_device_select import layer_network

    sources: dict[str, codegen.KernelSource] = {}
    for name in ("BF16", "FLOAT"):
        net, _ = layer_network(name)
        sources.update(compile_net(net, arch=None).sources)
    plan, _ = llama_plan(layers=1, arch=None)
    sources.update(plan.sources)
    for name, ks in sources.items():
        body = ks.source.split(f"void {ks.function}(", 1)[1].split(") {", 1)[1]
        before = body.split(codegen.PDL_ENTRY, 1)
        assert len(before) == 2, f"{name}: no {codegen.PDL_ENTRY!r}"
        if "#gemv" in name:  # only the weight prefetch precedes the wait: no activation pointer is used
            assert "ldw8(wr + k)" in before[0] and not re.search(r"(?<![.\w])(x|y|in\d+|out\d+)\b", before[0]), (name, before[0])
        else:
            assert all(ln.strip().startswith(("__shared__", "extern __shared__")) or not ln.strip() for ln in before[0].splitlines()), (name, before[0])
