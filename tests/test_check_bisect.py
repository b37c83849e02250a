"""``trtcore check --bisect`` / :func:`trtcore.check.compare`: module-by-module agreement
with transformers on the reference backend (float32, CPU).

The reference is transformers itself, hooked at each module: a correct tiny Llama (written
by transformers, :mod:`hf_models`) agrees at every module with both KV cache modes; a copy
whose layer-1 ``o_proj`` weight the test perturbed (written with safetensors), run by
trtcore against the original (``reference=``), first diverges at layer 1's attention
output while layer 0 stays within tolerance. The CLI is run in-process on a checkpoint
with a tokenizer (a synthetic GGUF converted by ``trtcore convert``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from hf_models import hf_models, random_prompt  # noqa: F401  (session fixture)
from safetensors.numpy import load_file, save_file

from trtcore.check import FIRST_DIVERGENCE, OK, bisect_points, compare
from trtcore.cli import main
from trtcore.errors import InvalidArgumentError, UnsupportedArchitectureError
from trtcore.gpu import NoGPUError, gpu_status

PERTURBED = "model.layers.1.self_attn.o_proj.weight"


def _perturbed_copy(src: Path, dst: Path, seed: int = 0) -> Path:
    """``src`` copied to ``dst`` with noise (std 0.05) added to :data:`PERTURBED`."""
    shutil.copytree(src, dst)
    [f] = [p for p in dst.glob("*.safetensors") if PERTURBED in load_file(p)]
    tensors = load_file(f)
    w = tensors[PERTURBED]
    tensors[PERTURBED] = (w + np.random.default_rng(seed).normal(0, 0.05, w.shape)).astype(w.dtype)
    save_file(tensors, f, metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def llama(hf_models) -> Path:  # noqa: F811
    return hf_models.dir("llama3_rope")


@pytest.mark.parametrize("kv_cache", ["contiguous", "paged"])
def test_a_correct_model_is_within_tolerance_at_every_module(llama: Path, kv_cache: str) -> None:
    ids = random_prompt(np.random.default_rng(1), 19, 160)
    report = compare(llama, ids, kv_cache=kv_cache, tolerance=1e-4)
    assert report.ok and report.first_divergence is None
    assert report.num_tokens == 19
    modules = [m.module for m in report.modules]
    assert modules == [
        "model.embed_tokens",
        *[f"model.layers.{i}{s}" for i in range(2) for s in (".self_attn", ".mlp", "")],
        "model.norm",
        "lm_head",
    ]
    assert all(m.status == OK and m.rel_error is not None and m.rel_error <= 1e-4 for m in report.modules), report.table()


def test_a_perturbed_o_proj_is_named_as_the_first_divergence(llama: Path, tmp_path: Path) -> None:
    bad = _perturbed_copy(llama, tmp_path / "perturbed")
    ids = random_prompt(np.random.default_rng(2), 13, 160)
    report = compare(bad, ids, reference=llama)
    first = report.first_divergence
    assert first is not None and first.module == "model.layers.1.self_attn", report.table()
    assert first.tensor == "model.layers.1.self_attn.o_proj"
    by_module = {m.module: m for m in report.modules}
    for name in ("model.embed_tokens", "model.layers.0.self_attn", "model.layers.0.mlp", "model.layers.0"):
        assert by_module[name].status == OK, report.table()
    assert [m.status for m in report.modules].count(FIRST_DIVERGENCE) == 1
    assert not report.ok


def test_an_unknown_family_and_bad_arguments_are_refused(llama: Path) -> None:
    with pytest.raises(UnsupportedArchitectureError, match="'nope'"):
        bisect_points("nope", 2)
    with pytest.raises(InvalidArgumentError, match="tolerance"):
        compare(llama, [3, 4], tolerance=0)
    if not gpu_status()[0]:  # the cuda leg is tests/cuda/test_check_bisect_gpu.py
        with pytest.raises(NoGPUError):
            compare(llama, [3, 4], backend="cuda")


def test_capture_keeps_the_names_the_network_defines(llama: Path) -> None:
    """``LLM(capture=...)`` records the names its network defines (a typo is left out and
    :func:`capture_prefill` then names it); the kept tensors equal what the reference reads at
    run time."""
    from trtcore import LLM
    from trtcore.calibration import capture_prefill

    keep = ["model.layers.1.mlp.down_proj", "model.layers.0.self_attn.o_proj"]
    llm = LLM(llama, backend="reference", dtype="float32", max_batch_size=1, kv_cache="contiguous", progress=False, capture=[*keep, "model.layers.0.nope", keep[0]])
    assert llm.captured == tuple(keep)
    ids = random_prompt(np.random.default_rng(3), 7, 160)
    got = capture_prefill(llm, ids, keep)
    assert sorted(got) == sorted(keep) and all(got[n].shape[-1] == llm.config.hidden_size for n in keep)
    with pytest.raises(InvalidArgumentError, match="model.layers.0.nope"):
        capture_prefill(llm, ids, ["model.layers.0.nope"])
    with pytest.raises(InvalidArgumentError, match="capture must be tensor names"):
        LLM(llama, backend="reference", dtype="float32", progress=False, capture=[3])


def test_cli_bisect_options_need_bisect(converted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--model", str(converted), "--backend", "cuda", "--kv-cache", "paged"]) == 2
    assert "--backend, --kv-cache needs --bisect" in capsys.readouterr().err


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_gguf import write_synthetic_gguf

    from trtcore.gguf_convert import convert_gguf

    root = tmp_path_factory.mktemp("bisect_cli")
    write_synthetic_gguf(root / "tiny.gguf", "llama", tokenizer="gpt2", pre="llama-bpe", seed=5)
    return convert_gguf(root / "tiny.gguf", root / "hf")


def test_cli_bisect_exit_status_and_table(converted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--bisect", "--model", str(converted), "--prompt", "the theory of"]) == 0
    good = capsys.readouterr().out
    assert "every module within" in good and "FIRST DIVERGENCE" not in good
    for name in ("model.embed_tokens", "model.layers.1.self_attn.o_proj", "model.layers.1.mlp", "model.norm", "lm_head"):
        assert name in good
    bad = _perturbed_copy(converted, tmp_path / "perturbed")
    assert main(["check", "--bisect", "--model", str(bad), "--reference", str(converted), "--prompt", "the theory of"]) == 1
    out = capsys.readouterr().out
    [line] = [ln for ln in out.splitlines() if "FIRST DIVERGENCE" in ln]
    assert line.split()[0] == "model.layers.1.self_attn"
    assert "first divergence: model.layers.1.self_attn" in out


def test_cli_reference_needs_bisect(converted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--model", str(converted), "--reference", str(converted)]) == 2
    assert "--reference needs --bisect" in capsys.readouterr().err
