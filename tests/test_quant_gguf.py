"""GGUF block types kept quantized: every listed type's blocks (random bytes, and where
gguf-py can quantize, quantized random weights) dequantize through QuantizedWeight to what
the ``gguf`` package's own dequantizer (``gguf.quants``) gives; ``convert --gguf
--keep-quantized`` keeps the blocks and the model runs from them."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from trtcore.checkpoint import Checkpoint
from trtcore.config import load_config
from trtcore.errors import CheckpointError
from trtcore.quant_formats import quantized_weights
from trtcore.quant_formats.gguf_blocks import GGUF_TYPES, gguf_weight

#: byte offsets of each type's float16 block scales (d, dmin / m), from ggml-common.h
F16_FIELDS = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
N, K = 6, 512


def _random_blocks(ggml_type: str, rng: np.random.Generator) -> np.ndarray:
    """Random blocks ``uint8 [N, K / block * bytes]``: every code and sub-scale bit random,
    float16 fields random normal (about one in six 0: the constant-block case)."""
    qt = gguf.GGMLQuantizationType[ggml_type]
    per, nbytes = gguf.GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, (N, K // per, nbytes), dtype=np.uint8)
    for off in F16_FIELDS[ggml_type]:
        d = (rng.standard_normal((N, K // per)) * 0.01).astype(np.float16)
        d[rng.random(d.shape) < 1 / 6] = 0
        raw[..., off : off + 2] = d.view(np.uint8).reshape(N, K // per, 2)
    return raw.reshape(N, -1)


def test_the_listed_types() -> None:
    assert GGUF_TYPES == ("Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")


@pytest.mark.parametrize("ggml_type", GGUF_TYPES)
def test_random_blocks_dequantize_as_gguf(ggml_type: str) -> None:
    raw = _random_blocks(ggml_type, np.random.default_rng(list(ggml_type.encode())))
    qw = gguf_weight(raw, ggml_type, K)
    assert qw.bits == (4 if ggml_type in ("Q4_0", "Q4_1", "Q4_K") else 8)
    assert qw.group_size == {"Q8_0": 32, "Q4_0": 32, "Q4_1": 32, "Q4_K": 32, "Q5_K": 32, "Q6_K": 16}[ggml_type]
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[ggml_type]).astype(np.float64)
    assert ref.shape == (N, K) and np.isfinite(ref).all()
    # gguf computes in float32; ours in float64 from float32 scales (and fractional zeros)
    np.testing.assert_allclose(qw.dequantize(), ref, rtol=2e-6, atol=1e-7 * np.abs(ref).max())


@pytest.mark.parametrize("ggml_type", ["Q8_0", "Q4_0", "Q4_1"])
def test_gguf_quantized_weights_dequantize_as_gguf(ggml_type: str) -> None:
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((N, K)) * 0.1 + rng.uniform(-0.1, 0.1, (N, 1))).astype(np.float32)
    qt = gguf.GGMLQuantizationType[ggml_type]
    raw = gguf.quants.quantize(w, qt)
    ref = gguf.quants.dequantize(raw, qt).astype(np.float64)
    np.testing.assert_allclose(gguf_weight(raw, ggml_type, K).dequantize(), ref, rtol=2e-6, atol=1e-7 * np.abs(ref).max())


def test_exact_for_symmetric_types() -> None:
    """Q8_0 / Q4_0 / Q6_K have integer zero points: ours equals gguf's exactly."""
    for t in ("Q8_0", "Q4_0", "Q6_K"):
        raw = _random_blocks(t, np.random.default_rng(9))
        np.testing.assert_array_equal(gguf_weight(raw, t, K).dequantize(), gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[t]))


def test_bad_gguf_data_is_refused() -> None:
    with pytest.raises(CheckpointError, match="IQ2_XS"):
        gguf_weight(np.zeros((2, 10), np.uint8), "IQ2_XS", 256)
    with pytest.raises(CheckpointError, match="expected uint8"):
        gguf_weight(np.zeros((2, 10), np.uint8), "Q4_K", 256)


def test_checkpoint_of_every_type(tmp_path: Path) -> None:
    """A safetensors checkpoint of raw blocks + ``quantization_config`` (as ``convert
    --keep-quantized`` writes) gives each tensor as QuantizedWeight."""
    rng = np.random.default_rng(11)
    tensors = {f"model.layers.{i}.mlp.up_proj.weight": _random_blocks(t, rng) for i, t in enumerate(GGUF_TYPES)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    config = {"quant_method": "gguf", "ggml_types": {n: GGUF_TYPES[i] for i, n in enumerate(tensors)}}
    ck = quantized_weights(Checkpoint(tmp_path), config)
    for name, raw in tensors.items():
        t = config["ggml_types"][name]
        qw = ck.quantized(name)
        assert qw.shape == (N, K)
        ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[t])
        np.testing.assert_allclose(qw.dequantize(), ref, rtol=2e-6, atol=1e-7 * np.abs(ref).max())


@pytest.mark.filterwarnings("error::UserWarning")  # no tensor left unread
def test_convert_keep_quantized_names_what_it_does_not_keep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """``--keep-quantized`` warns with the count and type of the quantized linear weights it
    writes as float16 after all (the synthetic file's Q5_1 ones: trtcore keeps Q8_0 / Q4_0 /
    Q4_1 / Q4_K / Q5_K / Q6_K), and says so when the file has no quantized linear to keep; before,
    both converted silently (found by a new-user trial). Counted here from the file itself."""
    from test_gguf import write_synthetic_gguf

    from trtcore.gguf_convert import convert_gguf
    from trtcore.quant_formats.gguf_blocks import GGUF_TYPES

    write_synthetic_gguf(tmp_path / "m.gguf")
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    linears = [t for t in reader.tensors if len(t.shape) == 2 and t.name != "token_embd.weight"]
    lost = sorted({t.tensor_type.name for t in linears if t.tensor_type.name not in (*GGUF_TYPES, "F16", "BF16", "F32")})
    assert lost == ["Q5_1"]  # the file's own mix, so that the warning has something to name
    n_lost = sum(t.tensor_type.name == "Q5_1" for t in linears)
    n_kept = sum(t.tensor_type.name in GGUF_TYPES for t in linears)
    with caplog.at_level("WARNING", logger="trtcore.gguf_convert"):
        convert_gguf(tmp_path / "m.gguf", tmp_path / "q", progress=False, keep_quantized=True)
    assert f"m.gguf: kept {n_kept} linear weights quantized; {n_lost} Q5_1 of types trtcore does not keep" in caplog.text
    caplog.clear()
    add_tensor = gguf.GGUFWriter.add_tensor

    def as_float16(self: gguf.GGUFWriter, name: str, tensor: np.ndarray, *args: object, **kwargs: object) -> None:
        if "raw_dtype" in kwargs:  # a quantized tensor: float16 values of the same shape instead
            shape = tensor.shape[:-1] + (tensor.shape[-1] * gguf.GGML_QUANT_SIZES[kwargs["raw_dtype"]][0] // gguf.GGML_QUANT_SIZES[kwargs["raw_dtype"]][1],)
            return add_tensor(self, name, np.zeros(shape, np.float16))
        return add_tensor(self, name, tensor, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", as_float16)
    write_synthetic_gguf(tmp_path / "f.gguf")
    monkeypatch.undo()
    with caplog.at_level("WARNING", logger="trtcore.gguf_convert"):
        convert_gguf(tmp_path / "f.gguf", tmp_path / "f", progress=False, keep_quantized=True)
    assert "f.gguf: no linear weight is quantized (nothing to keep)" in caplog.text
    assert load_config(tmp_path / "f").quantization_config is None


def test_convert_keep_quantized_runs_from_the_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``trtcore convert --gguf --keep-quantized``: the kept tensors are the GGUF file's own
    blocks (q/k rows un-permuted as bytes), config.json names them; greedy tokens from the
    blocks equal transformers running gguf-py's dequantization of the same blocks; ``trtcore
    check`` runs the folder (transformers on the same dequantized weights) and agrees."""
    from hf_models import hf_greedy, load_hf
    from test_gguf import write_synthetic_gguf

    from trtcore import LLM, SamplingParams
    from trtcore.cli import main

    add_tensor = gguf.GGUFWriter.add_tensor

    def quantized_qk(self: gguf.GGUFWriter, name: str, tensor: np.ndarray, *args: object, **kwargs: object) -> None:
        # the synthetic file keeps q/k float; quantize them here so that llama.cpp's q/k row
        # permutation is undone on raw blocks
        qtype = {"attn_q.weight": gguf.GGMLQuantizationType.Q8_0, "attn_k.weight": gguf.GGMLQuantizationType.Q4_1}
        t = next((t for suffix, t in qtype.items() if name.endswith(suffix)), None)
        if t is None:
            return add_tensor(self, name, tensor, *args, **kwargs)
        return add_tensor(self, name, gguf.quants.quantize(tensor.astype(np.float32), t), raw_dtype=t)

    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor", quantized_qk)
    original = write_synthetic_gguf(tmp_path / "m.gguf")  # Hugging Face layout, before quantization
    monkeypatch.undo()
    out = tmp_path / "q"
    assert main(["convert", "--gguf", str(tmp_path / "m.gguf"), "--output", str(out), "--keep-quantized"]) == 0
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    qc = load_config(out).quantization_config
    assert qc is not None and qc["quant_method"] == "gguf"
    want = {
        **{f"model.layers.{i}.self_attn.q_proj.weight": "Q8_0" for i in range(2)},
        **{f"model.layers.{i}.self_attn.k_proj.weight": "Q4_1" for i in range(2)},
        "model.layers.0.self_attn.v_proj.weight": types["blk.0.attn_v.weight"],
        "model.layers.0.self_attn.o_proj.weight": types["blk.0.attn_output.weight"],
        "model.layers.1.self_attn.v_proj.weight": types["blk.1.attn_v.weight"],
        "lm_head.weight": types["output.weight"],
    }
    assert qc["ggml_types"] == want and "model.embed_tokens.weight" not in qc["ggml_types"]
    stored = load_file(str(out / "model.safetensors"))
    for name, t in want.items():  # in Hugging Face's row order again: within quantization error
        deq = gguf.quants.dequantize(stored[name], gguf.GGMLQuantizationType[t])
        step = np.abs(original[name]).max() / (7 if t.startswith("Q4") else 127)
        np.testing.assert_allclose(deq, original[name], atol=step, rtol=0, err_msg=name)
    raw = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert np.array_equal(stored["lm_head.weight"], raw["output.weight"])
    assert stored["model.embed_tokens.weight"].dtype == np.float16  # embedding gathers stay float

    # the float reference: every kept tensor dequantized by gguf-py, as a plain checkpoint
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    dense = {
        n: (gguf.quants.dequantize(v, gguf.GGMLQuantizationType[qc["ggml_types"][n]]) if n in qc["ggml_types"] else v).astype(np.float32)
        for n, v in stored.items()
    }
    save_file(dense, str(ref_dir / "model.safetensors"))
    cfg = json.loads((out / "config.json").read_text())
    del cfg["quantization_config"]
    (ref_dir / "config.json").write_text(json.dumps(cfg))

    llm = LLM(out, backend="reference", dtype="float32", progress=False, quantization="gguf")
    assert llm.quantization == "gguf"
    prompt = [1, 5, 17, 60, 100, 3, 250, 7]
    [res] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    expected, _ = hf_greedy(load_hf(ref_dir), prompt, 12)
    assert res.outputs[0].token_ids == expected

    # trtcore check on the kept blocks: transformers cannot read them, so check runs them as
    # their dequantized float weights -- the same weights as gguf-py's dequantization above
    import torch

    from trtcore import check

    torch_, auto_model = check._transformers()
    hf_kept = check._load_hf(auto_model, torch_, out).state_dict()
    hf_ref = load_hf(ref_dir, "float32").state_dict()
    assert sorted(hf_kept) == sorted(hf_ref)
    for name, w in hf_ref.items():
        torch.testing.assert_close(hf_kept[name], w, rtol=2e-6, atol=1e-7 * float(w.abs().max()), msg=name)
    report = check.compare_with_transformers(out, prompt)
    assert report["max_rel_error"] < 1e-4 and report["greedy_equal"], report
