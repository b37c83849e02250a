"""``trtcore quantize --method gptq`` (trtcore/gptq.py) against GPTQ written here from the paper.

Reference: Frantar et al. 2022 (arXiv:2210.17323), section 3, in its Optimal Brain Surgeon form
(equations 2 and 3), not the Cholesky form the code under test uses: with ``Hinv`` the inverse
of the damped Hessian ``2 X^T X / T + 0.01 mean(diag) I`` over the columns not yet quantized (a
feature that is 0 on every token gets the other features' mean diagonal, which the damping's
mean is taken over),
column ``j`` is rounded to ``q``, the others take ``-(w_j - q) / Hinv[j, j] * Hinv[j, :]``, and
``j`` leaves ``Hinv`` by ``Hinv - Hinv[:, j] Hinv[j, :] / Hinv[j, j]``. A group's RTN parameters
(min-max, test_quantizer's ``group_scale_zero``) come from its weights as updated when
its first column is reached. The checkpoint is read back by transformers' compressed-tensors
decompressor, and the inputs of every linear are captured from transformers running the float model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import VARIANTS, hf_greedy, load_hf, random_prompt, write_checkpoint
from safetensors.numpy import load_file, save_file
from test_quantizer import group_scale_zero

from trtcore import LLM, SamplingParams
from trtcore.errors import InvalidArgumentError
from trtcore.gptq import FIRST_TOKEN_WEIGHT, first_token_weights, gptq_quantize, hessian, inverse_hessian_factor
from trtcore.quantizer import group_params, quantize_checkpoint, quantize_rtn

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def obs_reference(w: np.ndarray, x: np.ndarray, bits: int, group_size: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """GPTQ of ``w [N, K]`` for inputs ``x [T, K]`` by the OBS recursion (module docstring),
    float64: ``(codes, dequantized weight)``."""
    w = np.array(w, np.float64)
    n, k = w.shape
    h = 2.0 * x.T @ x / x.shape[0]
    dead = np.diag(h) == 0
    live = float(np.mean(np.diag(h)[~dead]))
    h[dead, dead] = live
    hinv = np.linalg.inv(h + 0.01 * live * np.eye(k))
    gs = group_size or k
    top = 2**bits - 1
    codes = np.zeros((n, k), np.int64)
    deq = np.zeros((n, k))
    params: list[tuple[float, float]] = []
    for j in range(k):
        if j % gs == 0:
            params = [group_scale_zero(w[r, j : j + gs], bits, symmetric) for r in range(n)]
        for r in range(n):
            s, z = params[r]
            q = min(max(round(w[r, j] / s) + z, 0), top)
            codes[r, j] = q
            deq[r, j] = (q - z) * s
            err = w[r, j] - (q - z) * s
            w[r, j:] -= err / hinv[j, j] * hinv[j, j:]
        hinv = hinv - np.outer(hinv[:, j], hinv[j, :]) / hinv[j, j]
    return codes, deq


def _inputs(rng: np.random.Generator, t: int, k: int) -> np.ndarray:
    """Correlated inputs with a common offset and a few large channels (what LLM activations look like)."""
    mix = np.eye(k) + 2.0 * rng.standard_normal((k, k)) / np.sqrt(k)
    x = rng.standard_normal((t, k)) @ mix + rng.standard_normal(k)
    x[:, rng.choice(k, 3, replace=False)] *= 8.0
    return x


@pytest.mark.parametrize(
    ("bits", "group_size", "symmetric", "block"),
    [(4, 32, False, 128), (4, 16, True, 32), (8, 0, True, 128), (8, 0, True, 32), (4, 64, False, 32), (8, 32, False, 48), (4, 48, False, 32)],
)
def test_gptq_equals_the_obs_recursion(bits: int, group_size: int, symmetric: bool, block: int) -> None:
    """Codes and scales equal the paper's recursion, for groups inside a lazy block, groups over
    several blocks (per channel with K = 192 over blocks of 128 and 32, 64 over blocks of 32), a
    group that is no multiple of the block (48: it grows to one group), and a feature never seen."""
    rng = np.random.default_rng()
    n, k = 12, 192
    x = _inputs(rng, 200, k)
    x[:, 5] = 0.0  # a dead feature: its weights are rounded and stay
    w = rng.standard_normal((n, k)) * rng.uniform(0.05, 1.0, (n, 1))
    qw = gptq_quantize(w, inverse_hessian_factor(hessian(x)), lambda g: group_params(g, bits, symmetric), bits, group_size, symmetric, block)
    want, deq = obs_reference(w, x, bits, group_size, symmetric)
    np.testing.assert_array_equal(qw.codes.astype(np.int64), want)
    np.testing.assert_array_equal(qw.dequantize(), deq)
    assert qw.group_size == (group_size or k) and (qw.zeros is None) == symmetric


def test_gptq_lowers_the_output_error_of_rtn() -> None:
    """On its calibration inputs GPTQ's output error is well below RTN's (the paper's point)."""
    rng = np.random.default_rng()
    x = _inputs(rng, 400, 256)
    w = rng.standard_normal((64, 256))
    for bits, gs in ((4, 32), (4, 0), (8, 64)):
        g = gptq_quantize(w, inverse_hessian_factor(hessian(x)), lambda grp, b=bits: group_params(grp, b, False), bits, gs, False).dequantize()
        r = quantize_rtn(w, bits, gs, False).dequantize()
        assert np.linalg.norm(x @ (g - w).T) < 0.85 * np.linalg.norm(x @ (r - w).T), (bits, gs)


def test_gptq_damping_does_not_depend_on_the_activations_scale() -> None:
    """Inputs scaled by any factor give the same codes, with a feature never seen among them
    (the damping is a fraction of the live features' mean diagonal)."""
    rng = np.random.default_rng()
    x = _inputs(rng, 100, 64)
    x[:, [3, 40]] = 0.0
    w = rng.standard_normal((8, 64))
    p = lambda g: group_params(g, 4, False)  # noqa: E731
    want = gptq_quantize(w, inverse_hessian_factor(hessian(x)), p, 4, 32, False).codes
    for c in (1e-4, 1e3):
        np.testing.assert_array_equal(gptq_quantize(w, inverse_hessian_factor(hessian(c * x)), p, 4, 32, False).codes, want)


def test_gptq_refuses_bad_inputs() -> None:
    w = np.ones((4, 32))
    p = lambda g: group_params(g, 4, False)  # noqa: E731
    with pytest.raises(InvalidArgumentError, match=r"inverse Hessian factor must be \[32, 32\] for K=32, got \(16, 16\)"):
        gptq_quantize(w, np.eye(16), p, 4, 16, False)
    with pytest.raises(InvalidArgumentError, match="positive divisor of K=32"):
        gptq_quantize(w, np.eye(32), p, 4, 12, False)
    with pytest.raises(InvalidArgumentError, match="weight holds a NaN"):
        gptq_quantize(np.full((4, 32), np.inf), np.eye(32), p, 4, 16, False)
    with pytest.raises(InvalidArgumentError, match="Hessian holds a NaN"):
        inverse_hessian_factor(np.full((32, 32), np.nan))
    with pytest.raises(InvalidArgumentError, match=r"square \[K, K\] matrix, got shape \(4, 32\)"):
        inverse_hessian_factor(w)
    with pytest.raises(InvalidArgumentError, match="at least one calibration token"):
        hessian(np.ones((0, 32)))
    with pytest.raises(
        InvalidArgumentError, match=r"not positive definite even with dampening_frac 100 \(given 0.01\); give a larger dampening_frac"
    ):
        inverse_hessian_factor(-np.eye(32) * 1e9)


def _hf_linear_inputs(src: Path, calib: list[list[int]]) -> dict[str, np.ndarray]:
    """Every decoder linear's input over the calibration sequences (one forward each), from
    transformers running the float checkpoint in float64: ``{weight name: [T, K]}``."""
    import torch

    model = load_hf(src)
    got: dict[str, list[np.ndarray]] = {}
    hooks = []
    for name, mod in model.named_modules():
        if name.rsplit(".", 1)[-1] in LINEARS:

            def hook(m: Any, args: Any, out: Any, key: str = name + ".weight") -> None:
                got.setdefault(key, []).append(args[0].detach().reshape(-1, args[0].shape[-1]).numpy())

            hooks.append(mod.register_forward_hook(hook))
    with torch.no_grad():
        for ids in calib:
            model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return {k: np.concatenate(v) for k, v in got.items()}


def test_gptq_checkpoint_holds_gptq_of_the_models_inputs_and_runs_as_transformers(tmp_path: Path) -> None:
    """``quantize_checkpoint(method="gptq")``: transformers (compressed-tensors) reads back codes
    that are the recursion's on the inputs transformers computes for each linear (float32
    against float64 activations can flip a near tie, which then moves the rest of its row: 97%
    of the codes must agree), and trtcore's greedy tokens equal transformers' on the decompressed
    weights."""
    pytest.importorskip("compressed_tensors")
    import torch
    from transformers import AutoModelForCausalLM

    from trtcore.check import decompressing_config

    v = VARIANTS["llama3_rope"]
    src = write_checkpoint(v, tmp_path / "src")
    rng = np.random.default_rng()
    calib = [random_prompt(rng, 40, v.vocab_size) for _ in range(3)]
    out = quantize_checkpoint(src, tmp_path / "q", method="gptq", bits=4, group_size=32, calibration_ids=calib)
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["format"] == "pack-quantized" and cfg["config_groups"]["group_0"]["weights"]["group_size"] == 32

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64, quantization_config=decompressing_config())
    state = {n: t.double().numpy() for n, t in model.state_dict().items()}
    original = load_file(str(src / "model.safetensors"))
    inputs = _hf_linear_inputs(src, calib)
    assert len(inputs) == len(LINEARS) * json.loads((src / "config.json").read_text())["num_hidden_layers"]
    # each sequence's first token counts FIRST_TOKEN_WEIGHT times in H: here its row repeated
    copies = int(FIRST_TOKEN_WEIGHT)
    assert copies == FIRST_TOKEN_WEIGHT
    starts = np.cumsum([0] + [len(c) for c in calib[:-1]])
    for name, x in inputs.items():
        w = original[name].astype(np.float64)
        _, want = obs_reference(w, np.concatenate([x] + [x[starts]] * (copies - 1)), 4, 32, False)
        got = state[name]
        assert not np.allclose(got, quantize_rtn(w, 4, 32, False).dequantize()), name  # not plain RTN
        # a float32 scale one ulp apart (activations in float32 there) still counts as the same
        same = np.isclose(got, want, rtol=1e-6, atol=0)
        assert same.mean() >= 0.97, (name, same.mean())

    dense = {n: (state[n] if n in inputs else original[n]).astype(np.float32) for n in original}
    ddir = tmp_path / "dense"
    ddir.mkdir()
    save_file(dense, str(ddir / "model.safetensors"))
    (ddir / "config.json").write_text((src / "config.json").read_text())
    llm = LLM(out, backend="reference", dtype="float32", progress=False)
    prompt = random_prompt(rng, 10, v.vocab_size)
    [res] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert res.outputs[0].token_ids == hf_greedy(load_hf(ddir), prompt, 12)[0]


def test_gptq_damping_reaches_the_quantizer_and_bad_options_are_refused(tmp_path: Path) -> None:
    """``dampening_frac`` is GPTQ's: damping that swamps every correlation leaves each column's
    error where it is, so the checkpoint is RTN's, tensor for tensor; other methods and values
    that are not positive numbers are refused before anything is written."""
    v = VARIANTS["llama3_rope"]
    src = write_checkpoint(v, tmp_path / "src")
    calib = [random_prompt(np.random.default_rng(), 30, v.vocab_size) for _ in range(2)]
    damped = quantize_checkpoint(src, tmp_path / "g", method="gptq", group_size=32, calibration_ids=calib, dampening_frac=1e12)
    rtn = quantize_checkpoint(src, tmp_path / "r", method="rtn", group_size=32)
    want, got = load_file(str(rtn / "model.safetensors")), load_file(str(damped / "model.safetensors"))
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    with pytest.raises(InvalidArgumentError, match=r"dampening_frac \(--dampening-frac\) = 0.1 does not apply to method 'rtn'; it is used by gptq"):
        quantize_checkpoint(src, tmp_path / "x", method="rtn", dampening_frac=0.1)
    quantize_checkpoint(src, tmp_path / "n", method="gptq", group_size=32, calibration_ids=calib, dampening_frac=np.float32(0.05))  # a NumPy number
    for bad in (0, -0.5, float("nan"), float("inf"), 1e13, 10**400, "0.1", True):
        with pytest.raises(InvalidArgumentError, match=r"dampening_frac \(--dampening-frac\) must be a number > 0 and <= 1e\+12, got"):
            quantize_checkpoint(src, tmp_path / "x", method="gptq", group_size=32, calibration_ids=calib, dampening_frac=bad)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g", "n", "r", "src"]


def test_first_token_weight_reaches_the_hessian_and_bad_values_are_refused(tmp_path: Path) -> None:
    """``first_token_weight=3`` on sequences ``[a, b, ...]`` is the unweighted Hessian of the
    same sequences plus two more of the first token alone (a causal model's position 0 sees only
    itself): the two checkpoints agree; the weight changes the result against the unweighted one;
    other methods and values below 1 are refused before anything is written."""
    v = VARIANTS["llama3_rope"]
    src = write_checkpoint(v, tmp_path / "src")
    rng = np.random.default_rng()
    calib = [random_prompt(rng, 50, v.vocab_size) for _ in range(2)]  # 100 tokens: K is 96 at most
    alone = [[seq[0]] for seq in calib for _ in range(2)]
    weighted = quantize_checkpoint(src, tmp_path / "w", method="gptq", group_size=32, calibration_ids=calib, first_token_weight=3)
    repeated = quantize_checkpoint(src, tmp_path / "r", method="gptq", group_size=32, calibration_ids=calib + alone, first_token_weight=1)
    plain = quantize_checkpoint(src, tmp_path / "p", method="gptq", group_size=32, calibration_ids=calib, first_token_weight=1)
    want, got, unweighted = (load_file(str(d / "model.safetensors")) for d in (repeated, weighted, plain))
    packed = [n for n in want if n.endswith(".weight_packed")]
    assert packed and sorted(got) == sorted(want)
    # float32 sums in another order can flip a code at a rounding tie: nearly all agree
    same = np.mean([np.mean(got[n] == want[n]) for n in packed])
    differs = np.mean([np.mean(unweighted[n] != want[n]) for n in packed])
    assert same >= 0.995, same
    assert differs > 0.01, differs
    with pytest.raises(InvalidArgumentError, match=r"first_token_weight \(--first-token-weight\) = 2 does not apply to method 'awq'; it is used by gptq"):
        quantize_checkpoint(src, tmp_path / "x", method="awq", calibration_ids=calib, first_token_weight=2)
    for bad in (0.5, 0, -1, float("nan"), float("inf"), 1e7, 10**400, "4", True, np.bool_(True)):
        with pytest.raises(InvalidArgumentError, match=r"first_token_weight \(--first-token-weight\) must be a number >= 1 and <= 1e\+06, got"):
            quantize_checkpoint(src, tmp_path / "x", method="gptq", group_size=32, calibration_ids=calib, first_token_weight=bad)  # type: ignore[arg-type]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p", "r", "src", "w"]


def test_gptq_warns_when_a_linear_has_more_inputs_than_calibration_tokens(tmp_path: Path, recwarn: pytest.WarningsRecorder) -> None:
    """``X^T X`` of ``T`` tokens has rank at most ``T``: below a linear's K (the tiny model's
    down_proj reads INTERMEDIATE = 96 features) the fit carries over less, and the user is told
    how many tokens to give; from K tokens on nothing is said."""
    from hf_models import INTERMEDIATE

    v = VARIANTS["llama3_rope"]
    src = write_checkpoint(v, tmp_path / "src")
    rng = np.random.default_rng()
    few = [random_prompt(rng, 30, v.vocab_size) for _ in range(2)]
    with pytest.warns(UserWarning, match=rf"GPTQ on 60 calibration tokens: a linear with K={INTERMEDIATE} inputs .* rank at most 60.* at least {INTERMEDIATE} tokens"):
        quantize_checkpoint(src, tmp_path / "few", method="gptq", group_size=32, calibration_ids=few)
    recwarn.clear()
    enough = [random_prompt(rng, 48, v.vocab_size) for _ in range(2)]
    quantize_checkpoint(src, tmp_path / "enough", method="gptq", group_size=32, calibration_ids=enough)
    assert not [w for w in recwarn if "calibration tokens" in str(w.message)]


def test_weighted_hessian_counts_an_integer_weight_as_repeated_rows() -> None:
    """``hessian(x, row_weights)`` is ``2 X^T D X / sum(D)``: a row of weight 3 counts as that row
    three times (the unweighted Hessian of the rows repeated, float64); ``first_token_weights``
    puts the weight on each sequence's first row; bad weights are refused."""
    rng = np.random.default_rng()
    x = rng.standard_normal((9, 5))
    lengths = [3, 2, 4]
    r = first_token_weights(lengths, 3.0)
    np.testing.assert_array_equal(r, [3, 1, 1, 3, 1, 3, 1, 1, 1])
    repeated = np.concatenate([x, x[[0, 3, 5]], x[[0, 3, 5]]])
    np.testing.assert_allclose(hessian(x, r), 2.0 * repeated.T @ repeated / repeated.shape[0], rtol=1e-12)
    np.testing.assert_allclose(hessian(x, np.ones(9)), hessian(x), rtol=1e-12)
    for bad in (np.ones(8), -np.ones(9), np.zeros(9), np.full(9, np.nan)):
        with pytest.raises(InvalidArgumentError, match="row weights must be 9 non-negative finite numbers"):
            hessian(x, bad)
