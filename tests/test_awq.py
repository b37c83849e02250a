"""``trtcore quantize --method awq`` (trtcore/awq.py, trtcore/calibration.py) on tiny transformers
models.

References, written here from the AWQ paper (Lin et al. 2023, arXiv:2306.00978, section 3.2)
and the module docstring, not from the code under test:

* the search: ``s = max(mean|x|, 1e-4)^alpha / sqrt(max s * min s)`` for ``alpha = i / 20``, the
  output MSE of ``x @ (Q(W diag(s)) / s)^T`` against ``x @ W^T``; the kept alpha is the grid's
  minimum, and never worse than RTN (``alpha = 0``);
* the folding: the scales multiply the columns of each group's linears and divide the op that
  feeds them (the norm weight, or up_proj's / v_proj's rows and bias), so the float model is
  the same function (transformers' logits, float64);
* the checkpoint: trtcore's greedy tokens equal transformers' on the dense weights this test
  builds from the original, the plan's scales and ``rtn_reference`` (test_quantizer).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import VARIANTS, hf_greedy, hf_logits, load_hf, random_prompt, write_checkpoint
from safetensors.numpy import load_file, save_file
from test_quantizer import rtn_reference

from trtcore import LLM, SamplingParams
from trtcore.awq import awq_plan, search_scale
from trtcore.checkpoint import Checkpoint
from trtcore.cli import main
from trtcore.errors import InvalidArgumentError
from trtcore.quantizer import quantize_checkpoint, quantize_rtn

#: (linears sharing an input, the tensor that takes 1 / s, how) of a Llama layer; o_proj only
#: with as many key/value heads as heads
GROUPS = [
    (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "input_layernorm", "norm"),
    (("self_attn.o_proj",), "self_attn.v_proj", "rows"),
    (("mlp.gate_proj", "mlp.up_proj"), "post_attention_layernorm", "norm"),
    (("mlp.down_proj",), "mlp.up_proj", "rows"),
]


def _calibration(v: Any, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [random_prompt(rng, 48, v.vocab_size) for _ in range(3)]


def _rtn(bits: int, gs: int) -> Any:
    return lambda w: quantize_rtn(w, bits, gs, False).dequantize()


def test_search_keeps_the_grid_minimum_and_beats_rtn_on_salient_channels() -> None:
    rng = np.random.default_rng(7)
    k = 128
    x = rng.standard_normal((256, k))
    x[:, :4] *= 30.0  # a few salient input channels, as in the paper's Figure 2
    ws = [rng.standard_normal((48, k)) * 0.05, rng.standard_normal((32, k)) * 0.05]
    quantize = _rtn(4, 32)
    s, alpha, mse_rtn, mse_awq = search_scale(x, ws, quantize)

    w = np.concatenate(ws)
    ref = x @ w.T
    mean_abs = np.abs(x).mean(axis=0)

    def mse(a: float) -> float:
        sc = np.maximum(mean_abs, 1e-4) ** a
        sc = sc / np.sqrt(sc.max() * sc.min())
        return float(np.mean((x @ (quantize(w * sc) / sc).T - ref) ** 2))

    grid = {i / 20: mse(i / 20) for i in range(20)}
    assert alpha == min(grid, key=grid.__getitem__)
    assert mse_awq == pytest.approx(grid[alpha], rel=1e-12) and mse_rtn == pytest.approx(grid[0.0], rel=1e-12)
    assert mse_awq < 0.8 * mse_rtn  # protecting the salient channels pays
    want = np.maximum(mean_abs, 1e-4) ** alpha
    np.testing.assert_allclose(s, want / np.sqrt(want.max() * want.min()), rtol=1e-12)
    # no salient channel: never worse than RTN, whatever alpha it keeps
    flat = rng.standard_normal((64, k))
    _, _, r0, r1 = search_scale(flat, ws, quantize)
    assert r1 <= r0


def test_search_refuses_bad_shapes() -> None:
    with pytest.raises(InvalidArgumentError, match=r"\[N, K=8\]"):
        search_scale(np.ones((4, 8)), [np.ones((2, 6))], _rtn(4, 8))
    with pytest.raises(InvalidArgumentError, match="T >= 1"):
        search_scale(np.ones((0, 8)), [np.ones((2, 8))], _rtn(4, 8))


def _fold(original: dict[str, np.ndarray], scales: dict[str, np.ndarray], layers: int, mha: bool, quantize: Any = None) -> dict[str, np.ndarray]:
    """The original tensors with each group's scale applied (columns times s, the feeding op
    divided by s), and the linears replaced by ``quantize`` of the scaled weight."""
    out = {n: v.astype(np.float64) for n, v in original.items()}
    for i in range(layers):
        p = f"model.layers.{i}."
        for linears, feeder, how in GROUPS:
            if linears == ("self_attn.o_proj",) and not mha:
                continue
            s = scales.get(p + linears[0] + ".weight")
            if s is None:
                continue
            for lin in linears:
                out[p + lin + ".weight"] = out[p + lin + ".weight"] * s[None, :]
            if how == "norm":
                out[p + feeder + ".weight"] = out[p + feeder + ".weight"] / s
            else:
                out[p + feeder + ".weight"] = out[p + feeder + ".weight"] / s[:, None]
                if p + feeder + ".bias" in out:
                    out[p + feeder + ".bias"] = out[p + feeder + ".bias"] / s
    if quantize is not None:
        for name in out:
            if name.endswith("proj.weight"):
                out[name] = quantize(out[name])
    return out


def _write(tensors: dict[str, np.ndarray], src: Path, path: Path) -> Path:
    path.mkdir()
    save_file({n: np.ascontiguousarray(v, np.float32) for n, v in tensors.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text((src / "config.json").read_text())
    return path


@pytest.mark.parametrize("variant", ["llama_dynamic_v4", "qwen2_bias"])  # MHA (o_proj scaled); GQA with biases
def test_the_scales_leave_the_float_model_unchanged(tmp_path: Path, variant: str) -> None:
    v = VARIANTS[variant]
    src = write_checkpoint(v, tmp_path / "src")
    with Checkpoint(src) as weights:
        plan = awq_plan(src, weights, _rtn(4, 32), seq_len=64, token_ids=_calibration(v))
    cfg = json.loads((src / "config.json").read_text())
    mha = cfg["num_key_value_heads"] == cfg["num_attention_heads"]
    assert len(plan.groups) == cfg["num_hidden_layers"] * (4 if mha else 3)
    assert any(g.alpha > 0 for g in plan.groups)
    assert all(g.mse_awq <= g.mse_rtn for g in plan.groups)
    original = load_file(str(src / "model.safetensors"))
    scaled = _write(_fold(original, plan.column_scales, cfg["num_hidden_layers"], mha), src, tmp_path / "scaled")
    prompt = random_prompt(np.random.default_rng(3), 12, v.vocab_size)
    want = hf_logits(load_hf(src), prompt)
    got = hf_logits(load_hf(scaled), prompt)
    np.testing.assert_allclose(got, want, rtol=0, atol=np.abs(want).max() * 1e-5)


def test_awq_checkpoint_runs_and_equals_transformers_on_its_grid(tmp_path: Path) -> None:
    v = VARIANTS["llama_dynamic_v4"]
    src = write_checkpoint(v, tmp_path / "src")
    calib = _calibration(v, seed=1)
    out = quantize_checkpoint(src, tmp_path / "q", method="awq", bits=4, group_size=32, calibration_ids=calib)
    assert json.loads((out / "config.json").read_text())["quantization_config"]["format"] == "pack-quantized"
    with Checkpoint(src) as weights:  # the same search, for its scales (deterministic)
        plan = awq_plan(src, weights, _rtn(4, 32), seq_len=256, token_ids=calib)
    cfg = json.loads((src / "config.json").read_text())
    original = load_file(str(src / "model.safetensors"))
    dense = _fold(original, plan.column_scales, cfg["num_hidden_layers"], True, lambda w: rtn_reference(w, 4, 32, False))
    ddir = _write(dense, src, tmp_path / "dense")
    llm = LLM(out, backend="reference", dtype="float32", progress=False)
    prompt = random_prompt(np.random.default_rng(), 10, v.vocab_size)
    [res] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert res.outputs[0].token_ids == hf_greedy(load_hf(ddir), prompt, 12)[0]


def test_awq_bad_inputs_are_refused(tmp_path: Path, capsys: Any) -> None:
    v = VARIANTS["llama3_rope"]
    src = write_checkpoint(v, tmp_path / "src")
    with pytest.raises(InvalidArgumentError, match="calibration file '.*nope.txt' does not exist"):
        quantize_checkpoint(src, tmp_path / "q", method="awq", group_size=32, calibration=tmp_path / "nope.txt")
    with pytest.raises(InvalidArgumentError, match=r"sequences of 1 to seq_len=\d+ ids; sequence 1 has 0"):
        quantize_checkpoint(src, tmp_path / "q", method="awq", group_size=32, calibration_ids=[[1, 2], []])
    with pytest.raises(InvalidArgumentError, match=r"calibration token_ids is empty: give at least one sequence"):
        quantize_checkpoint(src, tmp_path / "q", method="awq", group_size=32, calibration_ids=[])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # nothing half written
    # the tiny checkpoint has no tokenizer: the text cannot be tokenized, and the CLI says so
    assert main(["quantize", "--model", str(src), "--output", str(tmp_path / "q"), "--method", "awq", "--group-size", "32"]) != 0
    assert "tokenizer" in capsys.readouterr().err
