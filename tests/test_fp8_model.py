"""Tiny FP8 Llamas end to end (reference backend): ``trtcore quantize --method fp8`` writes a
compressed-tensors ``float-quantized`` checkpoint that transformers (with the compressed-tensors
package) loads and runs with its own fake quantization of weights and activations -- the judge
of the greedy tokens trtcore generates from it; the Hugging Face / vLLM ``quant_method: "fp8"``
layout and ``LLM(quantization="fp8")`` on a float checkpoint; ``tensorrt_rtx`` builds the Q/DQ
network of the whole model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import VARIANTS, hf_greedy, hf_logits, load_hf, log_softmax, random_prompt, torch_one_thread, write_checkpoint
from safetensors.numpy import save_file
from safetensors.torch import load_file as load_torch

from trtcore import LLM, SamplingParams
from trtcore import bench as bench_mod
from trtcore.config import load_config
from trtcore.errors import InvalidArgumentError, UnsupportedQuantizationError
from trtcore.quantizer import quantize_checkpoint

V = VARIANTS["llama3_rope"]
LINEARS = 7 * 2  # q/k/v/o/gate/up/down x 2 layers


def _calibration(seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [random_prompt(rng, 24, V.vocab_size) for _ in range(3)]


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(V, tmp_path_factory.mktemp("fp8") / "src")


def _hf_fp8(path: Path) -> Any:
    """transformers' model of an FP8 compressed-tensors checkpoint, float32 (its linears
    fake-quantize their weights and inputs)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def _layer_kinds(network: Any) -> list[str]:
    kinds = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        plugin = getattr(layer, "plugin", None)
        kinds.append(type(plugin).__name__ if plugin is not None else str(layer.type).rsplit(".", 1)[-1])
    return kinds


@pytest.mark.filterwarnings("error::UserWarning")  # every checkpoint tensor is read
@pytest.mark.parametrize("strategy", ["channel", "tensor"])
def test_fp8_checkpoint_greedy_equals_transformers(src: Path, tmp_path: Path, strategy: str) -> None:
    out = quantize_checkpoint(src, tmp_path / "fp8", method="fp8", strategy=strategy, calibration_ids=_calibration())
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "float-quantized" and qc["config_groups"]["group_0"]["weights"]["strategy"] == strategy
    llm = LLM(out, backend="reference", dtype="float32", progress=False)
    assert llm.quantization == "compressed-tensors"
    assert _layer_kinds(llm.executor.network).count("Fp8GemmPlugin") == LINEARS
    prompt = random_prompt(np.random.default_rng(7), 10, V.vocab_size)
    [res] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    expected, _ = hf_greedy(_hf_fp8(out), prompt, 12)
    assert res.outputs[0].token_ids == expected


def test_per_tensor_checkpoint_gives_each_packed_module_one_scale(src: Path, tmp_path: Path) -> None:
    """``--strategy tensor``: q/k/v share one weight scale, gate/up another (the largest
    ``max|w| / 448`` of the float weights, as ModelOpt's export and vLLM's loading unify them),
    o and down keep their own."""
    from trtcore.checkpoint import Checkpoint

    out = quantize_checkpoint(src, tmp_path / "t", method="fp8", strategy="tensor", activations="dynamic")
    got = load_torch(str(out / "model.safetensors"))
    with Checkpoint(src) as ck:
        for i in range(2):  # the tiny model's layers (LINEARS)
            for module, parts in (("self_attn", "qkv"), ("self_attn", "o"), ("mlp", ("gate", "up")), ("mlp", ("down",))):
                names = [f"model.layers.{i}.{module}.{p}_proj" for p in parts]
                amax = max(float(np.abs(np.asarray(ck.get(f"{n}.weight"), np.float64)).max()) for n in names)
                for n in names:
                    assert got[f"{n}.weight_scale"].reshape(-1).tolist() == [np.float32(amax / 448)], n


def test_check_judges_a_checkpoint_with_a_scale_per_linear(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A per-tensor checkpoint whose q/k/v and gate/up have their own scales (llm-compressor's
    static FP8 layout): trtcore requantizes each packed module to its largest scale, and
    ``trtcore check`` gives transformers' model the same scales, so the two agree to float32
    rounding; transformers' own per-linear model would not (by more than FP8's rounding)."""
    import trtcore.quantizer as quantizer
    from trtcore import check

    monkeypatch.setattr(quantizer, "packed_siblings", lambda name, packed: [name])  # each linear its own amax
    out = quantize_checkpoint(src, tmp_path / "per-linear", method="fp8", strategy="tensor", calibration_ids=_calibration())
    got = load_torch(str(out / "model.safetensors"))
    scales = {n: float(got[f"model.layers.0.self_attn.{n}_proj.weight_scale"]) for n in "qkv"}
    assert len(set(scales.values())) == 3
    prompt = random_prompt(np.random.default_rng(3), 9, V.vocab_size)
    report = check.compare_with_transformers(out, prompt, steps=4)
    assert report["max_rel_error"] < 1e-4 and report["fp8_activations"]
    monkeypatch.setattr(check, "share_hf_fp8_scales", lambda model, torch: 0)  # transformers as it reads the file
    assert check.compare_with_transformers(out, prompt, steps=4)["max_rel_error"] > 1e-3


def _assert_input_scales_are_amax(src: Path, sequences: list[list[int]], out: Path) -> None:
    """Every decoder linear's ``input_scale`` in ``out`` is ``max|x| / 448`` of its input over
    ``sequences`` run through transformers' float model of ``src`` (forward pre-hooks)."""
    import torch

    model = load_hf(src, "float32")
    amax: dict[str, float] = {}

    def hook(name: str) -> Any:
        def fn(mod: Any, args: Any) -> None:
            amax[name] = max(amax.get(name, 0.0), float(args[0].abs().max()))

        return fn

    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in name:
            mod.register_forward_pre_hook(hook(name))
    for seq in sequences:
        hf_logits(model, seq)
    got = load_torch(str(out / "model.safetensors"))
    assert len(amax) == LINEARS
    for name, a in amax.items():
        np.testing.assert_allclose(float(got[f"{name}.input_scale"]), a / 448, rtol=1e-5)


@pytest.mark.filterwarnings("error::UserWarning")  # an input_scale dropped as "dynamic" warns
def test_static_fp8_config_with_fields_left_out_reads_its_input_scales(src: Path, tmp_path: Path) -> None:
    """The FP8 config as transformers' compressed-tensors page shows it (for
    nm-testing/Meta-Llama-3.1-8B-Instruct-FP8-hf): ``input_activations`` ``{"num_bits": 8,
    "strategy": "tensor", "type": "float"}``, no ``dynamic``, which compressed-tensors reads as
    static (its default, false). trtcore read it as dynamic and dropped every input_scale (a
    helper's trial); now its greedy tokens equal transformers' on the same folder."""
    out = quantize_checkpoint(src, tmp_path / "fp8", method="fp8", strategy="tensor", calibration_ids=_calibration())
    config = json.loads((out / "config.json").read_text())
    group = config["quantization_config"]["config_groups"]["group_0"]
    group["weights"] = {"num_bits": 8, "strategy": "tensor", "type": "float"}
    group["input_activations"] = {"num_bits": 8, "strategy": "tensor", "type": "float"}
    (out / "config.json").write_text(json.dumps(config))
    llm = LLM(out, backend="reference", dtype="float32", progress=False)
    prompt = random_prompt(np.random.default_rng(17), 10, V.vocab_size)
    [res] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    expected, _ = hf_greedy(_hf_fp8(out), prompt, 12)
    assert res.outputs[0].token_ids == expected


def test_calibrated_input_scales_are_amax_over_448(src: Path, tmp_path: Path) -> None:
    """Each linear's input_scale is max|x| / 448 of its input over the calibration tokens,
    captured here with forward pre-hooks on transformers' float model."""

    ids = _calibration(1)
    out = quantize_checkpoint(src, tmp_path / "fp8", method="fp8", calibration_ids=ids)
    _assert_input_scales_are_amax(src, ids, out)


def _to_hf_fp8(ct: Path, dst: Path, suffix: str) -> Path:
    """The compressed-tensors FP8 checkpoint ``ct`` rewritten in the Hugging Face / vLLM
    ``quant_method: "fp8"`` layout (weight scales named ``suffix``, flat)."""
    import ml_dtypes
    import torch

    tensors = {}
    for k, t in load_torch(str(ct / "model.safetensors")).items():
        if t.dtype == torch.float8_e4m3fn:
            tensors[k] = t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
        elif k.endswith(".weight_scale"):
            tensors[k.replace(".weight_scale", suffix)] = t.float().reshape(-1).numpy()
        else:
            tensors[k] = t.float().numpy()
    dst.mkdir()
    save_file(tensors, str(dst / "model.safetensors"))
    config = json.loads((ct / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize("suffix", [".weight_scale", ".weight_scale_inv"])
def test_hf_fp8_layout_reads_the_same_weights(src: Path, tmp_path: Path, suffix: str) -> None:
    ct = quantize_checkpoint(src, tmp_path / "ct", method="fp8", strategy="tensor", calibration_ids=_calibration())
    hf = _to_hf_fp8(ct, tmp_path / "hf", suffix)
    prompt = random_prompt(np.random.default_rng(8), 10, V.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    a = LLM(ct, backend="reference", dtype="float32", progress=False).generate([prompt], params)[0]
    llm = LLM(hf, backend="reference", dtype="float32", progress=False, quantization="fp8")
    assert llm.quantization == "fp8"
    assert llm.generate([prompt], params)[0].outputs[0].token_ids == a.outputs[0].token_ids


def _prefill_logprobs(llm: LLM, prompt: list[int], k: int) -> dict[int, float]:
    [res] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, logprobs=k))
    return {t: lp.logprob for t, lp in res.outputs[0].logprobs[0].items()}


def test_dynamic_activations_prefill_equals_transformers(src: Path, tmp_path: Path) -> None:
    """Dynamic per-tensor activation scales (max|x| / 448 of each call): one prefill of one
    prompt is one call in both, so its log-probabilities agree."""
    out = quantize_checkpoint(src, tmp_path / "dyn", method="fp8", activations="dynamic")
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["config_groups"]["group_0"]["input_activations"]["dynamic"] is True
    assert not any(k.endswith(".input_scale") for k in load_torch(str(out / "model.safetensors")))
    prompt = random_prompt(np.random.default_rng(9), 12, V.vocab_size)
    got = _prefill_logprobs(LLM(out, backend="reference", dtype="float32", progress=False), prompt, 5)
    want = log_softmax(hf_logits(_hf_fp8(out), prompt)[-1])
    for t, lp in got.items():
        assert abs(lp - want[t]) < 2e-4, (t, lp, want[t])


def test_on_the_fly_fp8_equals_per_tensor_fake_quantization(src: Path) -> None:
    """``LLM(quantization="fp8")`` on a float checkpoint (vLLM's meaning): per-tensor E4M3
    weights, one scale per packed module (q/k/v, gate/up: vLLM quantizes its fused
    ``qkv_proj`` / ``gate_up_proj`` weight as one tensor) and dynamic per-tensor activations,
    here against transformers' float model with both fake-quantized by torch's own
    float8_e4m3fn casts."""
    import torch

    model = load_hf(src, "float32")
    packed = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}
    amax: dict[str, float] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in name:
            parent, leaf = name.rsplit(".", 1)
            key = f"{parent.rsplit('.', 1)[0]}.{packed.get(leaf, leaf)}"  # the layer's packed module
            amax[key] = max(amax.get(key, 0.0), float(mod.weight.detach().abs().max()))
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and ".layers." in name:
                w = mod.weight.float()
                parent, leaf = name.rsplit(".", 1)
                s = torch.tensor(amax[f"{parent.rsplit('.', 1)[0]}.{packed.get(leaf, leaf)}"] / 448)
                mod.weight.copy_((w / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s)

                def fake_quant(mod: Any, args: Any) -> Any:
                    x = args[0].float()
                    s = x.abs().max() / 448
                    return ((x / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s,)

                mod.register_forward_pre_hook(fake_quant)
    llm = LLM(src, backend="reference", dtype="float32", progress=False, quantization="fp8")
    assert llm.quantization == "fp8"
    assert _layer_kinds(llm.executor.network).count("Fp8GemmPlugin") == LINEARS
    prompt = random_prompt(np.random.default_rng(10), 12, V.vocab_size)
    got = _prefill_logprobs(llm, prompt, 5)
    with torch_one_thread():
        want = log_softmax(hf_logits(model, prompt)[-1])
    for t, lp in got.items():
        assert abs(lp - want[t]) < 2e-4, (t, lp, want[t])


def test_tensorrt_rtx_builds_the_fp8_model(src: Path, tmp_path: Path) -> None:
    rtx = pytest.importorskip("tensorrt_rtx")
    from trtcore.builder import BuildConfig, build_engine, define_network
    from trtcore.checkpoint import Checkpoint
    from trtcore.config import load_config

    out = quantize_checkpoint(src, tmp_path / "fp8", method="fp8", calibration_ids=_calibration())
    config = load_config(out)
    with Checkpoint(out) as weights:
        d = define_network(rtx, config, weights, BuildConfig(dtype="bfloat16", max_batch_size=2, max_seq_len=64))
    kinds = _layer_kinds(d.network)
    assert kinds.count("QUANTIZE") == LINEARS and kinds.count("DEQUANTIZE") == 2 * LINEARS
    assert len(build_engine(d, "sm89")) > 1000


@pytest.mark.parametrize(
    ("qc", "match"),
    [
        ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, "weight_block_size"),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "float-quantized",
                "config_groups": {
                    "g": {
                        "targets": ["Linear"],
                        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": False},
                    }
                },
            },
            "static per-token scales cannot exist",
        ),
        (  # a preset's shorthand where an object belongs: refused by name, not AttributeError
            {
                "quant_method": "compressed-tensors",
                "format": "float-quantized",
                "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}, "input_activations": "dynamic"}},
            },
            r"input_activations 'dynamic' \(group 'g'; an object",
        ),
    ],
)
def test_unsupported_fp8_variants_are_refused(qc: dict, match: str) -> None:
    from trtcore.quant_formats import detect_quantization

    with pytest.raises(UnsupportedQuantizationError, match=match):
        detect_quantization(qc)


def test_cli_quantize_fp8_and_bench_random_fp8_weights(src: Path, tmp_path: Path) -> None:
    from trtcore import cli

    out = tmp_path / "cli"
    argv = ["quantize", "--model", str(src), "--output", str(out), "--method", "fp8", "--strategy", "tensor", "--activations", "dynamic"]
    assert cli.main(argv) == 0
    group = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]
    assert group["weights"]["strategy"] == "tensor" and group["input_activations"]["dynamic"] is True
    report = tmp_path / "bench.json"
    argv = ["bench", "throughput", "--random-weights", str(src / "config.json"), "--backend", "reference", "--quantization", "fp8",
            "--num-prompts", "2", "--input-len", "4", "--output-len", "3", "--num-iters-warmup", "0", "--json", str(report)]  # fmt: skip
    assert cli.main(argv) == 0
    got = json.loads(report.read_text())
    assert got["results"][0]["output_throughput"] > 0
    assert got["quantization"] == "fp8"  # the decoder projections stream one byte per weight
    assert got["streamed_weight_bytes"] < bench_mod.streamed_weight_bytes(load_config(src), "bfloat16")
    assert got["streamed_weight_bytes"] == bench_mod.streamed_weight_bytes(load_config(src), "bfloat16", 8)


def test_random_fp8_weights_build_fp8_gemms(src: Path) -> None:
    from trtcore import bench

    llm, _ = bench._random_weights_llm(str(src / "config.json"), "reference", "bfloat16", {"max_batch_size": 2, "max_seq_len": 16}, 0, "fp8")
    assert _layer_kinds(llm.executor.network).count("Fp8GemmPlugin") == LINEARS


def _per_token_checkpoint(src: Path, dst: Path, strategy: str) -> Path:
    """An FP8-dynamic checkpoint (llm-compressor's FP8_DYNAMIC: E4M3 weights with ``strategy``
    scales, per-token dynamic activations) as ``trtcore quantize --method fp8 --activations
    token`` writes it: no input scales, the activations' strategy ``token`` as RedHatAI's
    ``*-FP8-dynamic`` models have it."""
    from trtcore.cli import main

    assert main(["quantize", "--model", str(src), "--output", str(dst), "--method", "fp8", "--strategy", strategy, "--activations", "token"]) == 0
    config = json.loads((dst / "config.json").read_text())
    acts = config["quantization_config"]["config_groups"]["group_0"]["input_activations"]
    assert acts["dynamic"] is True and acts["strategy"] == "token" and acts["observer"] is None
    assert not any(k.endswith(".input_scale") for k in load_torch(str(dst / "model.safetensors")))
    return dst


@pytest.mark.filterwarnings("error::UserWarning")  # every checkpoint tensor is read
@pytest.mark.parametrize("strategy", ["channel", "tensor"])
def test_per_token_fp8_dynamic_checkpoint_greedy_equals_transformers(src: Path, tmp_path: Path, strategy: str) -> None:
    """Per-token activation scales depend on the token only, so prefill and every decode step
    agree with transformers (compressed-tensors fake-quantizes each token of each linear's
    input with ``max|x[token]| / 448``) over the whole greedy generation."""
    out = _per_token_checkpoint(src, tmp_path / "fp8dyn", strategy)
    llm = LLM(out, backend="reference", dtype="float32", progress=False)
    assert llm.quantization == "compressed-tensors"
    plugins = [
        layer.plugin for layer in (llm.executor.network.get_layer(i) for i in range(llm.executor.network.num_layers)) if hasattr(layer, "plugin")
    ]
    assert sum(type(p).__name__ == "Fp8GemmPlugin" and p.per_token for p in plugins) == LINEARS
    prompt = random_prompt(np.random.default_rng(11), 10, V.vocab_size)
    [res] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    hf = _hf_fp8(out)
    expected, _ = hf_greedy(hf, prompt, 12)
    assert res.outputs[0].token_ids == expected
    got = _prefill_logprobs(llm, prompt, 5)
    want = log_softmax(hf_logits(hf, prompt)[-1])
    for t, lp in got.items():
        assert abs(lp - want[t]) < 2e-4, (t, lp, want[t])
    # the same tensors with per-tensor dynamic activations: transformers' log-probabilities differ
    per_tensor = quantize_checkpoint(src, tmp_path / "fp8tensor", method="fp8", strategy=strategy, activations="dynamic")
    other = log_softmax(hf_logits(_hf_fp8(per_tensor), prompt)[-1])
    assert max(abs(lp - other[t]) for t, lp in got.items()) > 1e-2


def test_calibration_text_longer_than_the_model_positions(src: Path, tmp_path: Path) -> None:
    """A calibration text cut into sequences the model can hold: this model's
    max_position_embeddings (256) is below the default seq_len + 1 (257), so each sequence is
    at most 255 tokens (its prefill and one new token). Before, the 256-token sequences were
    refused inside ``generate``'s list, nothing was captured, and ``quantize`` died in
    ``np.concatenate``. The input scales are transformers' ``max|x| / 448`` over the same
    sequences; a prompt that does not fit is an error of ``capture_prefill``, not ``{}``."""
    import shutil

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    from trtcore.calibration import capture_prefill
    from trtcore.errors import InvalidArgumentError

    model_dir = tmp_path / "m"
    shutil.copytree(src, model_dir)
    chars = "abcdefghijklmnopqrstuvwxyz ."
    tok = Tokenizer(models.WordLevel({"<unk>": 0, **{c: i + 3 for i, c in enumerate(chars)}}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.save(str(model_dir / "tokenizer.json"))
    rng = np.random.default_rng(5)
    text = "".join(rng.choice(list(chars), 300))
    (tmp_path / "calib.txt").write_text(text)
    out = quantize_checkpoint(model_dir, tmp_path / "fp8", method="fp8", calibration=tmp_path / "calib.txt")
    ids = tok.encode(text).ids
    assert len(ids) == 300
    _assert_input_scales_are_amax(src, [ids[i : i + 255] for i in range(0, len(ids), 255)], out)
    llm = LLM(src, backend="reference", dtype="float32", kv_cache="contiguous", progress=False)
    with pytest.raises(InvalidArgumentError, match="256 tokens; at most 255 fit"):
        capture_prefill(llm, [5] * 256, ["model.layers.0.input_layernorm"])


@pytest.mark.parametrize("activations", ["static", "dynamic"])
def test_check_compares_an_fp8_checkpoint_with_transformers(src: Path, tmp_path: Path, activations: str) -> None:
    """``trtcore check`` on what ``quantize --method fp8`` wrote: transformers reads the FP8
    checkpoint as it is (its linears quantize their inputs; decompressed they ran float inputs,
    a 4-5% logit error), and runs the decode steps through its KV cache one call per step,
    so that dynamic per-tensor scales cover the same tokens as trtcore's steps."""
    pytest.importorskip("compressed_tensors")
    from trtcore.check import compare_with_transformers

    kwargs: dict[str, Any] = {"calibration_ids": _calibration()} if activations == "static" else {}
    out = quantize_checkpoint(src, tmp_path / "fp8", method="fp8", activations=activations, **kwargs)
    prompt = random_prompt(np.random.default_rng(3), 9, V.vocab_size)
    report = compare_with_transformers(out, prompt, steps=4)
    assert report["greedy_equal"] and report["max_rel_error"] <= 1e-4, report


@pytest.mark.parametrize("layout", ["fp8 weight_scale", "fp8 weight_scale_inv", "naive-quantized"])
def test_check_judges_other_fp8_layouts_with_quantized_inputs(src: Path, tmp_path: Path, layout: str) -> None:
    """A helper's trial: the same E4M3 tensors under the Hugging Face / vLLM ``quant_method:
    "fp8"`` config (AutoFP8's) and compressed-tensors ``naive-quantized`` gave trtcore the same
    tokens, but ``trtcore check`` FAILed the first (transformers on the CPU drops weight_scale and
    input_scale and ran the raw codes: error 1.38) and passed the others only under the FP8
    allowance (it ran float inputs: 0.055). Now transformers quantizes the inputs in each, as with
    ``float-quantized``."""
    pytest.importorskip("compressed_tensors")
    from trtcore.check import compare_with_transformers

    ct = quantize_checkpoint(src, tmp_path / "ct", method="fp8", strategy="tensor", calibration_ids=_calibration())
    if layout == "naive-quantized":
        config = json.loads((ct / "config.json").read_text())
        config["quantization_config"]["format"] = "naive-quantized"
        (ct / "config.json").write_text(json.dumps(config))
        folder = ct
    else:
        folder = _to_hf_fp8(ct, tmp_path / "hf", "." + layout.split()[1])
    prompt = random_prompt(np.random.default_rng(5), 9, V.vocab_size)
    report = compare_with_transformers(folder, prompt, steps=4)
    assert report["greedy_equal"] and report["max_rel_error"] <= 1e-4, report


def test_check_judges_an_fp8_checkpoint_mixing_tensor_and_channel_scales(src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """q/k/v and gate/up per tensor with a scale per linear (trtcore gives each packed module
    the largest), down_proj per channel, in the ``quant_method: "fp8"`` layout: check's copy once
    made every scale per channel, so transformers' scales went unshared and a correct checkpoint
    scored 0.05-0.09 (a reviewing helper's find). Each strategy now has its config group."""
    pytest.importorskip("compressed_tensors")
    import trtcore.quantizer as quantizer
    from trtcore.check import compare_with_transformers

    monkeypatch.setattr(quantizer, "packed_siblings", lambda name, packed: [name])  # a scale per linear
    ct = quantize_checkpoint(src, tmp_path / "ct", method="fp8", strategy="tensor", calibration_ids=_calibration())
    monkeypatch.undo()
    hf = _to_hf_fp8(ct, tmp_path / "hf", ".weight_scale")
    from safetensors.torch import save_file as save_torch

    tensors = load_torch(str(hf / "model.safetensors"))
    for k in [k for k in tensors if ".down_proj.weight_scale" in k]:  # per channel, every row the same: the same weights
        tensors[k] = tensors[k].reshape(-1)[:1].expand(tensors[k.replace("weight_scale", "weight")].shape[0]).clone()
    save_torch(tensors, str(hf / "model.safetensors"))
    qkv = [float(tensors[f"model.layers.0.self_attn.{p}_proj.weight_scale"].reshape(-1)[0]) for p in "qkv"]
    assert len(set(qkv)) == 3  # scales that differ: sharing them changes the codes
    prompt = random_prompt(np.random.default_rng(5), 9, V.vocab_size)
    report = compare_with_transformers(hf, prompt, steps=6)
    assert report["greedy_equal"] and report["max_rel_error"] <= 1e-4, report


@pytest.mark.parametrize("family", ["phi3", "gpt_neox", "mixtral"])
def test_on_the_fly_fp8_of_families_that_read_fused_or_router_weights(tmp_path: Path, family: str, caplog: pytest.LogCaptureFixture) -> None:
    """``quantization="fp8"`` on a float checkpoint of a family whose network reads linears as
    float tensors: Phi-3 (fused qkv / gate_up, split by the family) and GPT-NeoX (fused
    query_key_value) read every linear so, and are refused (FP8 would be silently ignored);
    Mixtral reads its attention linears quantized and its router gates and experts as float:
    it builds, warns once with the counts (26 of 34 stay float), and generates. Both stopped with an internal
    "'...' is fp8-quantized ...; read it with quantized()", though the quantizer points
    non-Llama families here."""
    import logging

    import transformers

    from trtcore.errors import UnsupportedQuantizationError

    common = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 128}
    cfg = {
        "phi3": lambda: transformers.Phi3Config(num_key_value_heads=2, pad_token_id=0, **common),
        "gpt_neox": lambda: transformers.GPTNeoXConfig(**common),
        "mixtral": lambda: transformers.MixtralConfig(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, **common),
    }[family]()
    with torch_one_thread():
        transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / family)
    options = {"backend": "reference", "dtype": "float32", "max_batch_size": 1, "max_seq_len": 64, "progress": False, "quantization": "fp8"}
    if family != "mixtral":
        with pytest.raises(UnsupportedQuantizationError, match=r"quantization='fp8' \(FP8 at load\) quantizes no linear of .*ForCausalLM"):
            LLM(tmp_path / family, **options)
        return
    with caplog.at_level(logging.WARNING, logger="trtcore.quant_formats"):
        llm = LLM(tmp_path / family, **options)
        try:
            [out] = llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
        finally:
            llm.close()
    assert len(out.outputs[0].token_ids) == 3 and out.outputs[0].finish_reason == "length"
    warned = [r.getMessage() for r in caplog.records if "stay in the model dtype" in r.getMessage()]
    assert len(warned) == 1 and "26 of 34 linears of MixtralForCausalLM" in warned[0], warned


@pytest.fixture(scope="module")
def dynamic_fp8(src: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return quantize_checkpoint(src, tmp_path_factory.mktemp("fp8dyn") / "ck", method="fp8", strategy="channel", activations="dynamic")


def _edited(ck: Path, dst: Path, edit: Any) -> Path:
    """A copy of the FP8 checkpoint ``ck`` whose tensors ``edit`` (a dict of torch tensors) changed."""
    import shutil

    from safetensors.torch import save_file

    shutil.copytree(ck, dst)
    tensors = load_torch(str(dst / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_an_fp8_weight_without_its_scale_is_refused_not_run_as_float(dynamic_fp8: Path, tmp_path: Path) -> None:
    """An E4M3 weight whose scale is missing is refused naming the linear (it was read as a
    float weight of the raw E4M3 values, and the model generated other text without a word)."""
    from trtcore.errors import CheckpointError

    lin = "model.layers.1.self_attn.k_proj"

    def drop(t: dict) -> None:
        del t[f"{lin}.weight_scale"]

    bad = _edited(dynamic_fp8, tmp_path / "bad", drop)
    with pytest.raises(CheckpointError, match=f"FP8 linear '{lin}' has neither weight_scale nor weight_scale_inv"):
        LLM(bad, backend="reference", dtype="float32", progress=False)


def test_bad_fp8_values_name_the_linear_and_the_index(dynamic_fp8: Path, tmp_path: Path, src: Path) -> None:
    import torch

    from trtcore.errors import CheckpointError, InvalidArgumentError

    lin = "model.layers.0.mlp.down_proj"

    def nan_row(t: dict) -> None:
        t[f"{lin}.weight_scale"][3] = float("nan")

    with pytest.raises(CheckpointError, match=rf"FP8 linear '{lin}': Fp8Weight.weight_scale must be positive and finite, got nan at index 3 \(1 of"):
        LLM(_edited(dynamic_fp8, tmp_path / "nan", nan_row), backend="reference", dtype="float32", progress=False)

    def nan_code(t: dict) -> None:
        w = t[f"{lin}.weight"].view(torch.uint8).clone()
        w[2, 5] = 0x7F
        t[f"{lin}.weight"] = w.view(torch.float8_e4m3fn)

    with pytest.raises(CheckpointError, match=rf"FP8 linear '{lin}': .*NaN pattern .* at \(2, 5\) \(1 such\)"):
        LLM(_edited(dynamic_fp8, tmp_path / "code", nan_code), backend="reference", dtype="float32", progress=False)

    def nan_float(t: dict) -> None:
        t[f"{lin}.weight"][0, 0] = float("nan")

    import shutil

    from safetensors.torch import save_file

    fl = tmp_path / "float"
    shutil.copytree(src, fl)
    tensors = load_torch(str(fl / "model.safetensors"))
    nan_float(tensors)
    save_file(tensors, str(fl / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InvalidArgumentError, match=rf"{lin}.weight: the weight holds a NaN"):
        quantize_checkpoint(fl, tmp_path / "q", method="fp8", strategy="tensor", activations="dynamic")
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("activations", ["static", "dynamic"])
def test_kv_cache_scales_are_amax_of_the_cached_keys_and_values_over_448(src: Path, tmp_path: Path, activations: str, caplog: Any) -> None:
    """``kv_cache_scales=True`` writes each layer's ``self_attn.k_scale`` / ``v_scale`` as
    ``max|k| / 448`` and ``max|v| / 448`` of what the layer caches over the calibration tokens:
    the keys after RoPE, as transformers' own cache holds them after its forward (the
    reference here), and the config's ``kv_cache_scheme``; the FP8 KV cache then loads them
    (no "scaling factor 1.0" warning) and the input scales are as without it."""
    import logging

    import torch

    ids = _calibration(2)
    out = quantize_checkpoint(src, tmp_path / "fp8kv", method="fp8", activations=activations, kv_cache_scales=True, calibration_ids=ids)
    model = load_hf(src, "float32")
    amax: dict[str, float] = {}
    for seq in ids:
        with torch.no_grad():
            res = model(torch.tensor([seq]), use_cache=True)
        cache = getattr(res, "cache", None) or res.past_key_values  # transformers 5.25 renamed it
        for i, layer in enumerate(cache.layers):
            for kind, t in (("k", layer.keys), ("v", layer.values)):
                name = f"model.layers.{i}.self_attn.{kind}_scale"
                amax[name] = max(amax.get(name, 0.0), float(t.abs().max()))
    got = load_torch(str(out / "model.safetensors"))
    assert sorted(n for n in got if n.endswith(("k_scale", "v_scale"))) == sorted(amax)
    for name, a in amax.items():
        assert got[name].dtype == torch.float32 and got[name].numel() == 1, name
        np.testing.assert_allclose(float(got[name]), a / 448, rtol=1e-5, err_msg=name)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["kv_cache_scheme"] == {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
    if activations == "static":
        _assert_input_scales_are_amax(src, ids, out)
    with caplog.at_level(logging.WARNING, logger="trtcore"):
        caplog.clear()
        llm = LLM(out, dtype="bfloat16", kv_cache_dtype="fp8", max_batch_size=1, max_seq_len=64)
        assert not [r for r in caplog.records if "scaling factor 1.0" in r.getMessage()]
    assert llm.generate([random_prompt(np.random.default_rng(3), 8, V.vocab_size)], SamplingParams(max_tokens=4))[0].outputs[0].token_ids
    if activations == "dynamic":  # without kv_cache_dtype="fp8" the scales go unread: the warning says what reads them
        n = len(amax)  # k_scale and v_scale of each layer
        with pytest.warns(UserWarning, match=rf"{n} tensors .* \(unexpected; {n} of them are FP8 KV cache scales, which kv_cache_dtype='fp8'"):
            LLM(out, dtype="bfloat16", max_batch_size=1, max_seq_len=64)


def test_kv_cache_scales_belong_to_fp8(src: Path, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"kv_cache_scales \(--kv-cache-scales\) = True does not apply to method 'rtn'"):
        quantize_checkpoint(src, tmp_path / "rtn", method="rtn", kv_cache_scales=True)
    assert not (tmp_path / "rtn").exists()


def test_fp8_weights_under_a_config_without_quantization_are_refused(src: Path, tmp_path: Path) -> None:
    """An FP8 checkpoint whose config.json lost its quantization_config would read its E4M3 codes
    as the weights (garbage text, no error): it is refused, naming an E4M3 weight, and a ModelOpt
    export (hf_quant_config.json beside it) is named as such."""
    from trtcore.errors import UnsupportedQuantizationError

    out = quantize_checkpoint(src, tmp_path / "fp8", method="fp8", strategy="tensor", activations="dynamic")
    config = json.loads((out / "config.json").read_text())
    del config["quantization_config"]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedQuantizationError, match=r"holds quantized linears \(FP8 \(float8_e4m3fn weights\): e\.g\. 'model\.layers\.0\..*restore"):
        LLM(out, backend="reference", dtype="bfloat16", progress=False)
    # an NVIDIA ModelOpt export before transformers read them: its format is in hf_quant_config.json
    # (vllm-project/vllm#22073), so there is nothing to restore; the message says what it is
    (out / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}}))
    with pytest.raises(UnsupportedQuantizationError, match=r"hf_quant_config\.json says it is an NVIDIA ModelOpt export, which trtcore does not read"):
        LLM(out, backend="reference", dtype="bfloat16", progress=False)


#: llm-compressor's FP8 KV cache alone: a compressed-tensors config whose groups quantize no weights
_KV_ONLY = {
    "quant_method": "compressed-tensors",
    "config_groups": {},
    "format": "dense",
    "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True},
}


def test_quantized_weights_under_a_config_that_quantizes_none_are_refused(src: Path, tmp_path: Path) -> None:
    """A compressed-tensors config that quantizes no weights is read as a float checkpoint; FP8
    or int8 ``X.weight`` tensors under it (an int-quantized W8A16 folder, whose weights are int8
    ``X.weight`` beside ``X.weight_scale``, with its groups lost) would be read as float weights:
    garbage, no error. Refused at the build, naming the weight and saying what the config lacks."""
    import torch
    from safetensors.torch import save_file as save_torch

    fp8 = quantize_checkpoint(src, tmp_path / "fp8", method="fp8", strategy="tensor", activations="dynamic")
    int8 = tmp_path / "int8"
    int8.mkdir()
    tensors = load_torch(str(src / "model.safetensors"))
    for name in [n for n in tensors if n.endswith("_proj.weight")]:
        w = tensors[name].float()
        scale = w.abs().amax(dim=1, keepdim=True) / 127
        tensors[name] = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
        tensors[name.removesuffix("weight") + "weight_scale"] = scale
    save_torch(tensors, str(int8 / "model.safetensors"))
    for ck, kind in ((fp8, r"FP8 \(float8_e4m3fn weights\)"), (int8, r"integer \(int8 weights\)")):
        config = json.loads((src / "config.json").read_text()) | {"quantization_config": _KV_ONLY}
        (ck / "config.json").write_text(json.dumps(config))
        with pytest.raises(
            UnsupportedQuantizationError,
            match=rf"holds quantized linears \({kind}: e\.g\. 'model\.layers\.0\..*quantization_config describes no quantized weights",
        ):
            LLM(ck, backend="reference", dtype="bfloat16", progress=False)
