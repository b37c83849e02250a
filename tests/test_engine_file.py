"""Engine files built once, run many times (issue 9, point 6): ``LLM(engine=...)`` and
``trtcore generate --engine`` load an engine without rebuilding, after checking its sidecar.

* a reference engine (float32, paged) written with ``save_engine`` and loaded while every
  build function raises gives transformers' (float64) greedy tokens, as the freshly built
  LLM does; the same through ``trtcore generate --engine`` (one process);
* a flipped byte, a truncated engine, another trtcore version, another TensorRT version,
  another GPU target (a real tensorrt_rtx engine for sm89 loaded where no GPU or an sm90
  GPU is), another plugin version, another tokenizer or config: each refused with an
  :class:`~trtcore.errors.EngineFileError` whose ``field`` / ``expected`` / ``found`` and
  message name it;
* ``trtcore build`` (tensorrt_rtx, ahead of time) records the model folder's files and the
  target; a sidecar write that fails leaves the new engine beside the old sidecar, which the
  SHA-256 check refuses (nothing half written is trusted);
* build options given to ``LLM(engine=...)`` must match the engine's.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import ModelStore, hf_greedy, hf_models, random_prompt  # noqa: F401

import trtcore
from trtcore import LLM, SamplingParams, cli
from trtcore.builder import build_engine, define_network, save_engine
from trtcore.checkpoint import Checkpoint
from trtcore.config import load_config
from trtcore.engine_file import load_engine_file, sidecar_path
from trtcore.errors import EngineFileError, InvalidArgumentError
from trtcore.plan import BuildConfig, resolve_plan
from trtcore.quant_formats import FP8_ON_THE_FLY, resolve_quantization
from trtcore.trt import is_available, load_trt

NAME = "llama3_rope"
OPTIONS = {"max_batch_size": 2, "max_seq_len": 64}
STEPS = 8


def _write_engine(model: Path, out: Path, backend: str = "reference", quantization: str | None = None, **options: Any) -> Path:
    """Define + build + save (what ``trtcore build`` does) on ``backend``."""
    config, _ = resolve_quantization(model, load_config(model), quantization)
    plan = resolve_plan(config, BuildConfig(**{**OPTIONS, **options}), backend)
    with Checkpoint(model) as weights:
        d = define_network(load_trt(backend), config, weights, plan)
        engine = build_engine(d)
    save_engine(d, engine, out, backend=backend, compute_capability=None, model_dir=model)
    return out


def no_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way ``LLM`` could build raises from now on: a load that builds fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an engine was built while loading an engine file")

    import trtcore.llm

    for name in ("define_network", "build_engine", "build_reference_engine", "Checkpoint"):
        monkeypatch.setattr(trtcore.llm, name, refuse)


@pytest.fixture(name="no_build")
def no_build_fixture(monkeypatch: pytest.MonkeyPatch) -> None:
    no_build(monkeypatch)


@pytest.fixture(scope="module")
def engine_path(hf_models: ModelStore, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    return _write_engine(hf_models.dir(NAME), tmp_path_factory.mktemp("engine") / "tiny.engine")


def _copy(engine: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(engine, dest / engine.name)
    shutil.copy(sidecar_path(engine), sidecar_path(dest / engine.name))
    return dest / engine.name


def _edit_sidecar(engine: Path, **fields: Any) -> None:
    side = sidecar_path(engine)
    meta = json.loads(side.read_text())
    meta.update(fields)
    side.write_text(json.dumps(meta))


def _refused(engine: Path, field: str, expected: Any, found: Any, **kwargs: Any) -> EngineFileError:
    with pytest.raises(EngineFileError) as err:
        LLM(engine=engine, progress=False, **kwargs)
    e = err.value
    assert (e.field, e.expected, e.found) == (field, expected, found)
    assert field in str(e) and repr(expected) in str(e) and repr(found) in str(e)
    return e


def test_load_without_rebuild_gives_transformers_tokens(hf_models: ModelStore, engine_path: Path, no_build: None) -> None:  # noqa: F811
    rng = np.random.default_rng(11)
    prompts = [random_prompt(rng, n, hf_models.variant(NAME).vocab_size) for n in (5, 19)]
    from trtcore.plugins.paged_attention import PagedAttentionPlugin
    from trtcore.plugins.rope import RopePlugin

    meta = json.loads(sidecar_path(engine_path).read_text())
    assert meta["plugins"] == {p.plugin_name: p.plugin_version for p in (RopePlugin, PagedAttentionPlugin)}
    assert meta["target"] == {"compute_capability": "cpu"}
    llm = LLM(engine=engine_path, progress=False)
    assert llm.model_dir == hf_models.dir(NAME).resolve() and llm.backend == "reference"
    assert (llm.plan.max_batch_size, llm.plan.max_seq_len, llm.kv_cache) == (2, 64, "paged")
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        want, _ = hf_greedy(hf_models.hf(NAME), prompt, STEPS)
        assert out.outputs[0].token_ids == want


def test_loaded_engine_equals_the_freshly_built_llm(hf_models: ModelStore, engine_path: Path) -> None:  # noqa: F811
    prompt = random_prompt(np.random.default_rng(12), 9, hf_models.variant(NAME).vocab_size)
    params = SamplingParams(temperature=0.8, top_k=20, seed=5, max_tokens=STEPS, ignore_eos=True)
    built = LLM(hf_models.dir(NAME), backend="reference", progress=False, **OPTIONS)
    loaded = LLM(engine=engine_path, progress=False)
    assert loaded.generate([prompt], params)[0].outputs[0].token_ids == built.generate([prompt], params)[0].outputs[0].token_ids


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny llama with a real BPE tokenizer (the CLI tests' synthetic GGUF, converted) and
    its reference engine."""
    from test_gguf import write_synthetic_gguf

    root = tmp_path_factory.mktemp("tokenized")
    write_synthetic_gguf(root / "tiny.gguf", "llama", tokenizer="gpt2", pre="llama-bpe", tied=False, seed=3)
    assert cli.main(["convert", "--gguf", str(root / "tiny.gguf"), "--output", str(root / "hf")]) == 0
    return root / "hf", _write_engine(root / "hf", root / "tiny.engine")


def _generate_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    assert cli.main(["generate", "the theory of", "--max-tokens", str(STEPS), "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_cli_runs_the_engine(tokenized: tuple[Path, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from hf_models import load_hf

    model, engine = tokenized
    fresh = _generate_json(capsys, "--model", str(model), "--backend", "reference")
    no_build(monkeypatch)
    out = _generate_json(capsys, "--engine", str(engine))
    assert out["engine"] == str(engine) and out["model"] == str(model.resolve())
    assert out["prompt_token_ids"] == fresh["prompt_token_ids"]
    want, _ = hf_greedy(load_hf(model), out["prompt_token_ids"], STEPS)
    eos = json.loads((model / "generation_config.json").read_text())["eos_token_id"]
    cut = next((i + 1 for i, t in enumerate(want) if t in ({eos} if isinstance(eos, int) else set(eos))), len(want))
    assert out["token_ids"] == fresh["token_ids"] == want[:cut]
    assert out["text"] == fresh["text"]


def test_another_tokenizer_is_refused(tokenized: tuple[Path, Path], tmp_path: Path) -> None:
    model, engine = tokenized
    folder = tmp_path / "model"
    shutil.copytree(model, folder)
    tok = folder / "tokenizer.json"
    changed = tok.read_bytes().replace(b'"the"', b'"thE"', 1)
    tok.write_bytes(changed)
    expected = hashlib.sha256((model / "tokenizer.json").read_bytes()).hexdigest()
    _refused(engine, "model.files.tokenizer.json", expected, hashlib.sha256(changed).hexdigest(), model=folder)


def test_flipped_byte_is_refused(engine_path: Path, tmp_path: Path) -> None:
    engine = _copy(engine_path, tmp_path)
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0x01
    engine.write_bytes(bytes(data))
    expected = json.loads(sidecar_path(engine).read_text())["engine_sha256"]
    e = _refused(engine, "engine_sha256", expected, hashlib.sha256(data).hexdigest())
    assert "corrupted" in str(e)


def test_truncated_engine_is_refused(engine_path: Path, tmp_path: Path) -> None:
    engine = _copy(engine_path, tmp_path)
    data = engine.read_bytes()
    engine.write_bytes(data[:-100])
    _refused(engine, "engine_bytes", len(data), len(data) - 100)


def test_another_trtcore_version_is_refused(engine_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = trtcore.__version__
    monkeypatch.setattr(trtcore, "__version__", "99.0.0")
    _refused(engine_path, "trtcore_version", built, "99.0.0")


def test_another_tensorrt_version_is_refused(engine_path: Path, tmp_path: Path) -> None:
    engine = _copy(engine_path, tmp_path)
    _edit_sidecar(engine, tensorrt_version="0.0.1")
    _refused(engine, "tensorrt_version", "0.0.1", load_trt("reference").__version__)


def test_another_plugin_version_is_refused(engine_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trtcore.plugins.paged_attention import PagedAttentionPlugin

    monkeypatch.setattr(PagedAttentionPlugin, "plugin_version", "2")
    _refused(engine_path, "plugins.trtcore_paged_attention", "1", "2")


def test_another_target_is_refused(engine_path: Path, tmp_path: Path) -> None:
    engine = _copy(engine_path, tmp_path)
    _edit_sidecar(engine, target={"compute_capability": "sm90"})
    _refused(engine, "target.compute_capability", "sm90", "cpu")


@pytest.mark.skipif(not is_available("tensorrt_rtx"), reason="tensorrt_rtx is not installed")
def test_rtx_engine_for_another_gpu_is_refused(hf_models: ModelStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """A real ``trtcore build`` for sm89 (ahead of time): its sidecar records the target, the
    model folder's files and the engine's digest; loading it where no GPU is, or where an
    sm90 GPU is, is refused before TensorRT sees it."""
    model = hf_models.dir(NAME)
    engine = tmp_path / "rtx.engine"
    argv = ["build", "--model", str(model), "--output", str(engine), "--backend", "tensorrt_rtx", "--compute-capability", "sm89",
            "--max-batch-size", "2", "--max-seq-len", "64", "--dtype", "float16"]  # fmt: skip
    assert cli.main(argv) == 0
    meta = json.loads(sidecar_path(engine).read_text())
    assert meta["target"] == {"compute_capability": "sm89"}
    assert meta["model"]["path"] == str(model.resolve())
    assert meta["model"]["files"]["config.json"] == hashlib.sha256((model / "config.json").read_bytes()).hexdigest()
    assert meta["plugins"] == {}  # tensorrt_rtx hosts no plugins: RoPE as layers, contiguous cache
    _refused(engine, "target.compute_capability", "sm89", "no GPU")
    import trtcore.gpu

    monkeypatch.setattr(trtcore.gpu, "compute_capability", lambda device=None: (9, 0))
    _refused(engine, "target.compute_capability", "sm89", "sm90")


def test_another_model_folder_is_refused(hf_models: ModelStore, engine_path: Path, tmp_path: Path) -> None:  # noqa: F811
    other = hf_models.dir("mistral_sw8")
    with pytest.raises(EngineFileError) as err:
        LLM(engine=engine_path, model=other, progress=False)
    assert err.value.field.startswith("model_config.") and err.value.field in str(err.value)


def test_missing_files_are_named(engine_path: Path, tmp_path: Path) -> None:
    with pytest.raises(EngineFileError, match="cannot read the engine file"):
        load_engine_file(tmp_path / "none.engine")
    engine = _copy(engine_path, tmp_path)
    sidecar_path(engine).write_text("{not json")
    with pytest.raises(EngineFileError, match="not valid JSON"):
        load_engine_file(engine)
    sidecar_path(engine).unlink()
    with pytest.raises(EngineFileError, match=r"sidecar .*tiny\.engine\.json"):
        load_engine_file(engine)
    engine = _copy(engine_path, tmp_path / "b")
    _edit_sidecar(engine, model={"path": str(tmp_path / "gone"), "files": {}})
    with pytest.raises(EngineFileError, match="gone.*pass model="):
        load_engine_file(engine)


def test_options_must_match_the_engine(engine_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"dtype='bfloat16'.*dtype='float32'"):
        LLM(engine=engine_path, dtype="bfloat16", progress=False)
    with pytest.raises(InvalidArgumentError, match=r"max_seq_len=32.*max_seq_len=64"):
        LLM(engine=engine_path, max_seq_len=32, progress=False)
    with pytest.raises(InvalidArgumentError, match="backend 'reference'"):
        LLM(engine=engine_path, backend="cuda", progress=False)
    assert LLM(engine=engine_path, max_seq_len=64, backend="reference", progress=False).plan.max_seq_len == 64


def test_gpu_engine_on_the_cpu_points_to_the_model_folder(engine_path: Path, tmp_path: Path) -> None:
    """A cuda engine (its sidecar says so) on a machine without a GPU: with or without
    backend='reference', the message says an engine file of a GPU backend never runs on the
    CPU and names the model folder to run on the reference backend instead (it used to send
    the user from one message to the other)."""
    from trtcore.gpu import NoGPUError

    from trtcore.engine_file import current_target

    if not is_available("cuda") or current_target("cuda") != "no GPU":
        pytest.skip("needs the cuda backend installed and no usable GPU")
    engine = _copy(engine_path, tmp_path)
    meta = json.loads(sidecar_path(engine).read_text())
    meta["plan"]["backend"] = "cuda"
    _edit_sidecar(
        engine,
        backend="cuda",
        plan=meta["plan"],
        target={"compute_capability": "any"},
        tensorrt_version=getattr(load_trt("cuda"), "__version__", "unknown"),
    )
    model = meta["model"]["path"]
    advice = rf"runs on a CUDA GPU only, never on the CPU; on the CPU run the model folder instead: --model {model} --backend reference"
    with pytest.raises(InvalidArgumentError, match=rf"backend='reference', but .*tiny\.engine was built for backend 'cuda'.*{advice}"):
        LLM(engine=engine, backend="reference", progress=False)
    with pytest.raises(NoGPUError, match=advice):
        LLM(engine=engine, progress=False)
    _edit_sidecar(engine, target={"compute_capability": "sm90"})  # built for a GPU: no rebuild advice on the CPU
    with pytest.raises(EngineFileError, match=advice):
        LLM(engine=engine, progress=False)


def test_interrupted_write_is_never_trusted(hf_models: ModelStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The engine is written first: when the sidecar's write fails, the new engine sits beside
    the old sidecar, and the SHA-256 check refuses the pair."""
    model = hf_models.dir(NAME)
    engine = _write_engine(model, tmp_path / "e.engine")
    old = json.loads(sidecar_path(engine).read_text())
    import trtcore.engine_file as ef

    real = ef.write_atomic

    def fail_sidecar(path: Any, data: bytes, **kw: Any) -> None:
        if str(path).endswith(".json"):
            raise InvalidArgumentError(f"cannot write {path}: disk full")
        real(path, data, **kw)

    monkeypatch.setattr(ef, "write_atomic", fail_sidecar)
    with pytest.raises(InvalidArgumentError, match="disk full"):
        _write_engine(model, engine, dtype="bfloat16")
    monkeypatch.undo()
    assert json.loads(sidecar_path(engine).read_text()) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.engine", "e.engine.json"]  # no temporary left
    _refused(engine, "engine_bytes", old["engine_bytes"], len(engine.read_bytes()))


def test_fp8_engine_of_a_float_checkpoint_loads_as_fp8(hf_models: ModelStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """An engine built with quantization='fp8' from a float checkpoint (``trtcore build
    --quantization fp8``: its linears quantized at the build) records that config in its
    sidecar; LLM(engine=...) takes the engine's quantization without being told (the folder's
    config.json has none, so the sidecar check resolves it the same way), generates what
    LLM(folder, quantization='fp8') generates, and refuses another quantization by name."""
    model = hf_models.dir(NAME)
    engine = _write_engine(model, tmp_path / "fp8.engine", quantization="fp8")
    assert json.loads(sidecar_path(engine).read_text())["model_config"]["quantization_config"] == FP8_ON_THE_FLY
    assert load_engine_file(engine).quantization == "fp8"
    rng = np.random.default_rng(21)
    prompts = [random_prompt(rng, n, hf_models.variant(NAME).vocab_size) for n in (6, 13)]
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    built = LLM(model, backend="reference", quantization="fp8", progress=False, **OPTIONS).generate(prompts, params)
    with monkeypatch.context() as m:
        no_build(m)
        loaded = LLM(engine=engine, progress=False)
        assert loaded.quantization == "fp8" and loaded.config.quantization_config == FP8_ON_THE_FLY
        got = loaded.generate(prompts, params)
        assert LLM(engine=engine, quantization="FP8", progress=False).quantization == "fp8"
        with pytest.raises(InvalidArgumentError, match=r"quantization='gptq', but .*fp8\.engine was built with quantization 'fp8'"):
            LLM(engine=engine, quantization="gptq", progress=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in built]
    # a sidecar whose quantization config is not what the folder resolves to (ModelConfig's
    # equality leaves quantization_config out: it is compared on its own)
    edited = _copy(engine, tmp_path / "edited")
    meta = json.loads(sidecar_path(edited).read_text())
    _edit_sidecar(edited, model_config={**meta["model_config"], "quantization_config": {**FP8_ON_THE_FLY, "activation_scheme": "static"}})
    with pytest.raises(EngineFileError) as err:
        LLM(engine=edited, progress=False)
    assert err.value.field == "model_config.quantization_config" and "is not the engine's" in str(err.value)


def test_float_engine_refuses_a_quantization(engine_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"quantization='fp8', but .*tiny\.engine was built without quantization"):
        LLM(engine=engine_path, quantization="fp8", progress=False)
    assert load_engine_file(engine_path).quantization is None


def test_engine_of_another_quantization_is_refused(hf_models: ModelStore, tmp_path: Path) -> None:  # noqa: F811
    """A sidecar whose model config names a quantization the folder's config.json cannot give
    (a GPTQ config, where the folder is a float checkpoint without AutoGPTQ's file): refused as
    another model's config, naming the field."""
    engine = _copy(_write_engine(hf_models.dir(NAME), tmp_path / "a" / "e.engine"), tmp_path / "b")
    meta = json.loads(sidecar_path(engine).read_text())
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
    _edit_sidecar(engine, model_config={**meta["model_config"], "quantization_config": gptq})
    with pytest.raises(EngineFileError) as err:
        LLM(engine=engine, progress=False)
    assert err.value.field == "model_config.quantization_config" and "no quantization_config" in str(err.value)
