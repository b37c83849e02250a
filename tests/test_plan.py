"""Build choices resolved once (trtcore.plan) and the KV cache contract (trtcore.kv_modes).

* ``trtcore build`` and ``LLM(...)`` pick the same plan (KV mode, RoPE, attention, dtype)
  for the same arguments, on every TensorRT backend; ``tensorrt`` is a stand-in module that
  hosts plugins (the real one needs a GPU), so the old disagreement (build: paged,
  LLM: contiguous) shows;
* the sidecar of a real ``tensorrt_rtx`` build records the resolved plan;
* a float16 build of a bfloat16 checkpoint warns about float16's range (65504);
* each KV mode's declared inputs, outputs and profile are those of the network built.
"""

from __future__ import annotations

import json
import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import ModelStore, hf_models  # noqa: F401  (hf_models is a fixture)

import trtcore.builder
import trtcore.errors
import trtcore.llm
import trtcore.trt
from trtcore import LLM, cli
from trtcore.config import load_config
from trtcore.errors import InvalidArgumentError


class _Stop(Exception):
    """Raised by the recording define_network: the plan is all a test needs."""


def _fake_tensorrt() -> Any:
    """A module named ``tensorrt`` that hosts plugins (what hosts_plugins checks)."""
    fake = types.ModuleType("tensorrt")

    class INetworkDefinition:
        def add_plugin_v3(self) -> None: ...

    fake.INetworkDefinition = INetworkDefinition  # type: ignore[attr-defined]
    fake.IPluginV3 = object  # type: ignore[attr-defined]
    fake.Builder = object  # type: ignore[attr-defined]
    fake.__version__ = "fake"  # type: ignore[attr-defined]
    return fake


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """define_network records its plan and stops; ``tensorrt`` is the stand-in; no GPU check."""
    seen: list[Any] = []
    real_import = trtcore.trt._import
    fake = _fake_tensorrt()
    monkeypatch.setattr(trtcore.trt, "_import", lambda name: fake if name == "tensorrt" else real_import(name))

    def record(trt: Any, config: Any, weights: Any, plan: Any) -> Any:
        seen.append(plan)
        raise _Stop

    monkeypatch.setattr(trtcore.builder, "define_network", record)
    monkeypatch.setattr(trtcore.llm, "define_network", record)
    import trtcore.runtime.trt_executor as te

    monkeypatch.setattr(te, "require_gpu", lambda **_: None)
    monkeypatch.delenv("TRTCORE_BACKEND", raising=False)
    return seen


ARGS = [
    {},
    {"rope": "layers"},
    {"attention": "native"},
    {"kv_cache": "contiguous", "dtype": "float32"},
    {"max_seq_len": 64, "dtype": "bfloat16"},
]


def _cli_args(kw: dict[str, Any]) -> list[str]:
    return [a for k, v in kw.items() for a in (f"--{k.replace('_', '-')}", str(v))]


@pytest.mark.parametrize("kw", ARGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "defaults")
@pytest.mark.parametrize("backend", ["tensorrt", "tensorrt_rtx"])
def test_build_and_llm_resolve_the_same_plan(hf_models: ModelStore, recorded: list[Any], tmp_path: Path, backend: str, kw: dict) -> None:  # noqa: F811
    model = hf_models.dir("llama3_rope")
    with pytest.raises(_Stop):
        LLM(model, backend=backend, progress=False, **kw)
    with pytest.raises(_Stop):
        cli.main(["build", "--model", str(model), "--output", str(tmp_path / "x.engine"), "--backend", backend, *_cli_args(kw)])
    from_llm, from_cli = recorded
    assert from_llm == from_cli
    assert from_llm.implementations == from_cli.implementations
    # llama3_rope's head_dim (16) is no multiple of 32, what the paged kernels take: both contiguous
    assert from_llm.kv_cache == "contiguous"
    assert from_llm.backend == backend
    assert from_llm.rope == kw.get("rope", "plugin" if backend == "tensorrt" else "layers")


def test_tensorrt_backend_rejects_nothing_it_hosts(hf_models: ModelStore, recorded: list[Any], tmp_path: Path) -> None:  # noqa: F811
    """Explicit paged on the plugin-hosting backend is honoured by both."""
    model = hf_models.dir("llama3_rope")
    with pytest.raises(_Stop):
        LLM(model, backend="tensorrt", kv_cache="paged", progress=False)
    with pytest.raises(_Stop):
        cli.main(["build", "--model", str(model), "--output", str(tmp_path / "x.engine"), "--backend", "tensorrt", "--kv-cache", "paged"])
    assert [p.kv_cache for p in recorded] == ["paged", "paged"]
    assert recorded[0].attention == recorded[1].attention == "plugin"


def test_default_backend_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """$TRTCORE_BACKEND, else tensorrt where its runtime is usable, else cuda where a GPU and
    the cuda backend's dependencies are, else reference (engine files: tensorrt_rtx)."""
    import trtcore.plan as plan
    from trtcore.plan import default_backend

    monkeypatch.setenv("TRTCORE_BACKEND", "rtx")
    monkeypatch.setattr(plan, "tensorrt_usable", lambda: True)
    assert default_backend() == "tensorrt_rtx"
    monkeypatch.delenv("TRTCORE_BACKEND")
    for trt_ok, cuda_ok, want, want_engine in (
        (True, True, "tensorrt", "tensorrt"),
        (True, False, "tensorrt", "tensorrt"),
        (False, True, "cuda", "cuda"),
        (False, False, "reference", "tensorrt_rtx"),
    ):
        monkeypatch.setattr(plan, "tensorrt_usable", lambda ok=trt_ok: ok)
        monkeypatch.setattr(plan, "cuda_usable", lambda ok=cuda_ok: ok)
        assert (default_backend(), default_backend(engine=True)) == (want, want_engine), (trt_ok, cuda_ok)


def _probe_world(monkeypatch: pytest.MonkeyPatch, *, installed: bool, gpus: int, builder: Any = lambda logger: object(), cupy: bool, nvmath: bool) -> None:
    """Stand-ins for what the probes look at: an importable ``tensorrt`` (whose ``Builder`` is
    ``builder``), ``gpus`` CUDA devices (CUDA runtime and CuPy alike), CuPy, nvmath-python."""
    import importlib

    import trtcore.gpu as gpu

    fake = _fake_tensorrt()
    fake.Builder = builder  # type: ignore[attr-defined]
    fake.Logger = type("Logger", (), {"ERROR": 1, "__init__": lambda self, level=0: None})  # type: ignore[attr-defined]
    real_import = trtcore.trt._import

    def fake_import(name: str) -> Any:
        if name == "tensorrt":
            if not installed:
                raise trtcore.errors.BackendNotAvailableError("tensorrt is not installed")
            return fake
        return real_import(name)

    monkeypatch.setattr(trtcore.trt, "_import", fake_import)
    def count(what: str, use_cupy: bool) -> int:
        if use_cupy and not cupy:
            raise gpu.NoGPUError("CuPy is not installed")
        return gpus

    monkeypatch.setattr(gpu, "_count", count)
    real_module = importlib.import_module

    def fake_module(name: str, *a: Any) -> Any:
        if name.startswith("nvmath") and not nvmath:
            raise ImportError(f"No module named {name!r}")
        if name.startswith("nvmath"):
            return types.ModuleType(name)
        return real_module(name, *a)

    monkeypatch.setattr(gpu.importlib, "import_module", fake_module)
    monkeypatch.delenv("TRTCORE_BACKEND", raising=False)


def _refuses(logger: Any) -> Any:
    raise RuntimeError("CUDA initialization failure with error: 100")


@pytest.mark.parametrize(
    ("world", "want"),
    [
        ({"installed": True, "gpus": 1, "cupy": True, "nvmath": True}, ("tensorrt", "tensorrt")),
        # installed but unusable: no GPU (CPU-only CI), or TensorRT refuses this GPU (the H200 case)
        ({"installed": True, "gpus": 0, "cupy": True, "nvmath": True}, ("reference", "tensorrt_rtx")),
        ({"installed": True, "gpus": 1, "builder": _refuses, "cupy": True, "nvmath": True}, ("cuda", "cuda")),
        ({"installed": False, "gpus": 1, "cupy": True, "nvmath": True}, ("cuda", "cuda")),
        # the cuda backend lacks a dependency
        ({"installed": False, "gpus": 1, "cupy": False, "nvmath": True}, ("reference", "tensorrt_rtx")),
        ({"installed": False, "gpus": 1, "cupy": True, "nvmath": False}, ("reference", "tensorrt_rtx")),
        ({"installed": False, "gpus": 0, "cupy": True, "nvmath": True}, ("reference", "tensorrt_rtx")),
    ],
    ids=["trt_on_gpu", "trt_no_gpu", "trt_refuses_gpu", "no_trt_gpu", "no_cupy", "no_nvmath", "no_gpu"],
)
def test_default_backend_probes(monkeypatch: pytest.MonkeyPatch, world: dict[str, Any], want: tuple[str, str]) -> None:
    """The probes behind the rule, on stand-ins: a TensorRT that is installed counts only where
    it starts on a GPU; a GPU counts for cuda only with CuPy and nvmath-python."""
    from trtcore.plan import default_backend

    _probe_world(monkeypatch, **world)
    assert (default_backend(), default_backend(engine=True)) == want


def test_reference_plan_defaults_and_cap(hf_models: ModelStore) -> None:  # noqa: F811
    from trtcore.plan import BuildConfig, resolve_plan

    config = load_config(hf_models.dir("llama3_rope"))
    plan = resolve_plan(config, None, "reference")
    assert (plan.dtype, plan.rope, plan.kv_cache, plan.attention) == ("float32", "plugin", "paged", "plugin")
    assert plan.max_seq_len == config.max_position_embeddings
    long = resolve_plan(config, BuildConfig(max_seq_len=10 * config.max_position_embeddings), "reference")
    assert long.max_seq_len == config.max_position_embeddings
    native = resolve_plan(config, BuildConfig(attention="native"), "reference")
    assert (native.kv_cache, native.attention) == ("contiguous", "native")
    with pytest.raises(InvalidArgumentError, match="cannot write an engine"):
        resolve_plan(config, None, "reference", engine=True)
    with pytest.raises(InvalidArgumentError, match="add_plugin_v3"):
        resolve_plan(config, BuildConfig(kv_cache="paged"), "tensorrt_rtx")


def test_sidecar_holds_the_plan(hf_models: ModelStore, tmp_path: Path) -> None:  # noqa: F811
    from trtcore.plan import BuildConfig, BuildPlan, resolve_plan

    model = hf_models.dir("mistral_sw8")
    out = tmp_path / "m.engine"
    argv = ["build", "--model", str(model), "--output", str(out), "--backend", "tensorrt_rtx", "--compute-capability", "sm89",
            "--max-batch-size", "2", "--max-seq-len", "64", "--attention", "native", "--dtype", "float32"]
    assert cli.main(argv) == 0
    side = json.loads(out.with_name(out.name + ".json").read_text())
    plan = BuildPlan.from_dict(side["plan"])
    expected = resolve_plan(load_config(model), BuildConfig(dtype="float32", max_batch_size=2, max_seq_len=64, attention="native"),
                            "tensorrt_rtx", engine=True)
    assert plan == expected
    assert (plan.kv_cache, plan.attention, plan.rope, plan.max_seq_len) == ("contiguous", "native", "layers", 64)
    assert side["optimization_profiles"][0]["input_ids"]["max"] == [2, 64]


def test_float16_from_bfloat16_warns(hf_models: ModelStore) -> None:  # noqa: F811
    model = hf_models.dir("llama_bf16_sharded")
    assert json.loads((model / "config.json").read_text()).get("dtype", "bfloat16") == "bfloat16"
    with pytest.warns(UserWarning, match="65504"):
        LLM(model, backend="reference", dtype="float16", kv_cache="contiguous", progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # bfloat16 and float32 engines do not warn
        LLM(model, backend="reference", dtype="bfloat16", kv_cache="contiguous", progress=False)
        LLM(hf_models.dir("llama3_rope"), backend="reference", dtype="float16", kv_cache="contiguous", progress=False)


# ---------------------------------------------------------------------------------------
# the KV cache contract (network side)


@pytest.mark.parametrize(
    "name, kw",
    [
        ("llama_dynamic_v4", {}),  # paged, dynamic RoPE: rope_seq_lens
        ("qwen2_mixed_swa", {}),  # paged, both attention kinds
        ("qwen2_mixed_swa", {"kv_cache": "contiguous"}),
        ("llama_dynamic_v4", {"kv_cache": "contiguous"}),
        ("qwen2_mixed_swa", {"attention": "native"}),
        ("mistral_sw8", {"attention": "native", "dtype": "bfloat16"}),
    ],
)
def test_kv_mode_describes_the_network(hf_models: ModelStore, name: str, kw: dict) -> None:  # noqa: F811
    import trtcore.reference as ref
    from trtcore.builder import define_network
    from trtcore.checkpoint import Checkpoint
    from trtcore.kv_modes import kv_mode
    from trtcore.plan import BuildConfig, resolve_plan

    config = load_config(hf_models.dir(name))
    plan = resolve_plan(config, BuildConfig(max_batch_size=3, max_seq_len=48, **kw), "reference")
    mode = kv_mode(plan, config)
    with Checkpoint(hf_models.dir(name)) as weights:
        net = define_network(ref, config, weights, plan).network
    graph_inputs = [net.get_input(i) for i in range(net.num_inputs)]
    assert [(t.name, tuple(t.shape)) for t in graph_inputs] == [(s.name, s.shape) for s in mode.inputs]
    dt = {np.dtype(np.float32): ref.float32, np.dtype(np.int32): ref.int32, np.dtype(np.bool_): ref.bool}
    import ml_dtypes

    dt[np.dtype(ml_dtypes.bfloat16)] = ref.bfloat16
    assert [t.dtype for t in graph_inputs] == [dt[s.dtype] for s in mode.inputs]
    outputs = {net.get_output(i).name: net.get_output(i) for i in range(net.num_outputs)}
    assert sorted(outputs) == sorted(s.name for s in mode.outputs)
    for s in mode.outputs:
        assert outputs[s.name].dtype == dt[s.dtype], s.name
    # the profile covers exactly the inputs, within their static dims
    prof = mode.profile_shapes()
    assert set(prof) == {s.name for s in mode.inputs}
    for s in mode.inputs:
        lo, opt, hi = prof[s.name]
        assert all(a <= b <= c for a, b, c in zip(lo, opt, hi)) and len(lo) == len(s.shape), s.name
        assert all(d == -1 or lo[j] == hi[j] == d for j, d in enumerate(s.shape)), s.name
    # what the runtime reads instead of tensor names
    assert mode.takes_rope_seq_lens == any(s.name == "rope_seq_lens" for s in mode.inputs)
    assert mode.takes_rope_seq_lens == (mode.kv_cache == "paged" and name == "llama_dynamic_v4")
    kinds = set(config.layer_types) if mode.kv_cache == "contiguous" else set()
    assert set(mode.mask_inputs) == kinds
    assert len(mode.cache_inputs) == len(mode.cache_outputs) == (2 * config.num_hidden_layers if mode.kv_cache == "contiguous" else 0)
    assert mode.cache_len == (48 if plan.attention == "native" else None)
    if plan.attention == "native":
        engine = ref.Builder().build_engine(net, _config_with(ref, net, prof))
        assert {o: engine.get_aliased_input_tensor(o) for o in mode.aliases} == mode.aliases
    else:
        assert mode.aliases == {}


def _config_with(ref: Any, net: Any, prof: dict) -> Any:
    builder = ref.Builder()
    cfg = builder.create_builder_config()
    p = builder.create_optimization_profile()
    for name, (lo, opt, hi) in prof.items():
        p.set_shape(name, lo, opt, hi)
    cfg.add_optimization_profile(p)
    return cfg


def test_kv_mode_lookup_errors(hf_models: ModelStore) -> None:  # noqa: F811
    import dataclasses

    from trtcore.kv_modes import kv_mode
    from trtcore.plan import resolve_plan

    config = load_config(hf_models.dir("llama3_rope"))
    plan = dataclasses.replace(resolve_plan(config, None, "reference"), attention="native")
    with pytest.raises(InvalidArgumentError, match="no KV cache mode"):
        kv_mode(plan, config)
    with pytest.raises(InvalidArgumentError, match="per-layer"):
        kv_mode(resolve_plan(config, None, "reference"), config).cache_input(0, "key")
