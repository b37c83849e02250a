"""Bad input gives a clear, documented exception; the CLI prints one line and exits 2.

Each case checks the exception class (from :mod:`trtcore.errors`), that the message names
the offending value, and for the CLI: one ``trtcore: error:`` line on stderr, no
traceback, exit status 2 (run in a subprocess, as a user would).
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hf_models import VARIANTS, write_checkpoint
from safetensors.numpy import load_file, save_file

from trtcore import LLM, SamplingParams
from trtcore.errors import (
    CheckpointError,
    InvalidArgumentError,
    InvalidRequestError,
    MissingTensorError,
    TensorShapeError,
    TrtcoreError,
    UnsupportedArchitectureError,
)

BASE = VARIANTS["llama3_rope"]


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = write_checkpoint(BASE, tmp_path_factory.mktemp("good") / "m")
    _add_char_tokenizer(d, BASE.vocab_size)
    return d


def _add_char_tokenizer(d: Path, vocab_size: int) -> None:
    """A character-level tokenizer.json (ids < vocab_size), so the CLI can take text."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,!?"
    vocab = {"<unk>": 0, **{c: i + 3 for i, c in enumerate(chars)}}
    assert max(vocab.values()) < vocab_size
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.save(str(d / "tokenizer.json"))


def _copy(good: Path, tmp_path: Path) -> Path:
    d = tmp_path / "model"
    shutil.copytree(good, d)
    return d


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trtcore.cli", *args], capture_output=True, text=True, timeout=300)


def _assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("trtcore: error:")]
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


# --- checkpoint problems -----------------------------------------------------------------


def test_missing_tensor(good: Path, tmp_path: Path) -> None:
    d = _copy(good, tmp_path)
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(MissingTensorError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        LLM(d, backend="reference", progress=False)
    _assert_one_line_error(_cli("generate", "hi", "--model", str(d)), "model.layers.1.mlp.up_proj.weight")


def test_wrong_shape_names_tensor_expected_and_found(good: Path, tmp_path: Path) -> None:
    d = _copy(good, tmp_path)
    tensors = load_file(d / "model.safetensors")
    name = "model.layers.0.self_attn.k_proj.weight"
    found = tensors[name].shape
    tensors[name] = np.zeros((found[0] + 16, found[1]), np.float32)
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(TensorShapeError) as err:
        LLM(d, backend="reference", progress=False)
    msg = str(err.value)
    assert name in msg and str(found[0] + 16) in msg and str(found[0]) in msg, msg
    _assert_one_line_error(_cli("generate", "hi", "--model", str(d)), name)


def test_unknown_architecture(good: Path, tmp_path: Path) -> None:
    d = _copy(good, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["FalconForCausalLM"], "falcon"  # GPT-NeoX is supported now
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError, match="LlamaForCausalLM") as err:
        LLM(d, backend="reference", progress=False)
    assert "falcon" in str(err.value) and "Qwen3ForCausalLM" in str(err.value)
    _assert_one_line_error(_cli("generate", "hi", "--model", str(d)), "falcon", "LlamaForCausalLM")


def test_unsupported_architecture_of_a_known_model_type(good: Path, tmp_path: Path) -> None:
    d = _copy(good, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["LlamaForSequenceClassification"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError, match="LlamaForSequenceClassification.*LlamaForCausalLM"):
        LLM(d, backend="reference", progress=False)


@pytest.mark.parametrize("damage", ["truncated", "garbage_header", "huge_length"])
def test_corrupted_safetensors_header(good: Path, tmp_path: Path, damage: str) -> None:
    d = _copy(good, tmp_path)
    f = d / "model.safetensors"
    data = f.read_bytes()
    if damage == "truncated":
        f.write_bytes(data[: len(data) // 2])
    elif damage == "garbage_header":
        (n,) = struct.unpack("<Q", data[:8])
        f.write_bytes(data[:8] + b"\xff" * n + data[8 + n :])
    else:
        f.write_bytes(struct.pack("<Q", 1 << 40) + data[8:])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        LLM(d, backend="reference", progress=False)
    _assert_one_line_error(_cli("generate", "hi", "--model", str(d)), "model.safetensors")


def test_missing_model_folder(tmp_path: Path) -> None:
    _assert_one_line_error(_cli("generate", "hi", "--model", str(tmp_path / "nope")), "nope")


# --- request problems ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm(good: Path) -> LLM:
    return LLM(good, backend="reference", progress=False)


def test_prompt_longer_than_max_position_embeddings(llm: LLM) -> None:
    n = llm.config.max_position_embeddings + 1
    with pytest.raises(InvalidRequestError, match=f"{n} tokens.*max_position_embeddings={n - 1}"):
        llm.generate([5] * n, SamplingParams(max_tokens=1))


def test_empty_prompt(llm: LLM) -> None:
    assert llm.generate([], SamplingParams(max_tokens=1)) == []  # no prompts at all
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.generate({"prompt_token_ids": []}, SamplingParams(max_tokens=1))
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.generate("", SamplingParams(max_tokens=1))


def test_token_ids_outside_vocabulary(llm: LLM) -> None:
    with pytest.raises(InvalidRequestError, match=str(llm.config.vocab_size)):
        llm.generate([1, llm.config.vocab_size], SamplingParams(max_tokens=1))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"max_tokens": 0}, "max_tokens"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"temperature": -0.5}, "temperature")],
)
def test_bad_sampling_params(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidRequestError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-tokens", "0"], "max_tokens"),
        (["--top-p", "1.5"], "top_p"),
        (["--top-p", "0"], "top_p"),
        (["--temperature", "-1"], "temperature"),
    ],
)
def test_cli_bad_sampling(good: Path, args: list[str], needle: str) -> None:
    _assert_one_line_error(_cli("generate", "hi", "--model", str(good), *args), needle)


def test_cli_empty_and_too_long_prompt(good: Path) -> None:
    _assert_one_line_error(_cli("generate", "", "--model", str(good)), "empty")
    _assert_one_line_error(_cli("generate", "a" * (BASE.max_position_embeddings + 5), "--model", str(good)), "max_position_embeddings")



@pytest.mark.parametrize("tolerance", ["-1", "nan"])
def test_cli_check_refuses_a_tolerance_no_error_can_meet(good: Path, tolerance: str) -> None:
    """Refused before the model runs, not a FAIL (exit 1) of every comparison."""
    _assert_one_line_error(_cli("check", "--model", str(good), "--tolerance", tolerance), "--tolerance", tolerance)

def test_cli_unknown_backend_and_dtype(good: Path) -> None:
    _assert_one_line_error(_cli("generate", "hi", "--model", str(good), "--backend", "onnx"), "onnx", "reference")


def test_bad_request_in_a_batch_spares_the_others(llm: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    good_prompt = [7, 8, 9, 10]
    alone = llm.generate(good_prompt, params)[0].outputs[0].token_ids
    outs = llm.generate([[], good_prompt, [1] * 10_000, "x" * 0, good_prompt], params)
    assert [o.error is not None for o in outs] == [True, False, True, True, False]
    for o in outs:
        if o.error is not None:
            assert isinstance(o.error, InvalidRequestError) and o.outputs[0].finish_reason == "error"
        else:
            assert o.outputs[0].token_ids == alone



@pytest.mark.parametrize(("bad", "name"), [({"temperature": 0}, "dict"), (5, "int"), ("greedy", "str")])
def test_sampling_params_of_another_type_names_it(llm: LLM, bad: object, name: str) -> None:
    """Not iterated as if it were a list of SamplingParams: a dict's keys made it "got str",
    an int a TypeError, a string "got 6 SamplingParams for 1 prompts"."""
    with pytest.raises(InvalidRequestError, match=rf"sampling_params must be SamplingParams or a list of them .*, got {name}$"):
        llm.generate(["ab"], bad)  # type: ignore[arg-type]


def test_a_prompt_dict_without_a_prompt_key_names_its_keys(llm: LLM) -> None:
    with pytest.raises(InvalidRequestError, match=r"prompt 0 is a dict without 'prompt_token_ids' or 'prompt', got keys \['token_ids'\]"):
        llm.generate({"token_ids": [3, 4]}, SamplingParams(max_tokens=1))
    [out, ok] = llm.generate([{"token_ids": [3, 4]}, {"prompt_token_ids": [3, 4]}], SamplingParams(max_tokens=1))
    assert isinstance(out.error, InvalidRequestError) and "without 'prompt_token_ids'" in str(out.error) and ok.error is None

def test_every_error_is_a_trtcore_error() -> None:
    for cls in (CheckpointError, InvalidArgumentError, InvalidRequestError, MissingTensorError, TensorShapeError, UnsupportedArchitectureError):
        assert issubclass(cls, TrtcoreError)


@pytest.mark.parametrize("bad", [1.5, True, "7", None])
def test_prompt_with_a_non_integer_token_names_it(llm: LLM, bad: object) -> None:
    want = rf"prompt 0: token ids must be integers, got {re.escape(repr(bad))}"
    with pytest.raises(InvalidRequestError, match=want):
        llm.generate({"prompt_token_ids": [3, bad]}, SamplingParams(max_tokens=1))
    [out, ok] = llm.generate([[3, bad], [3, 4]], SamplingParams(max_tokens=1))  # in a list: that request only
    assert isinstance(out.error, InvalidRequestError) and re.search(want, str(out.error)) and ok.error is None


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_batch_size", "8"), ("max_seq_len", "64"), ("block_size", "16"), ("max_batch_size", 2.5), ("max_num_tokens", True)],
)
def test_size_arguments_must_be_integers(good: Path, field: str, value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"{field} must be an integer, got {re.escape(repr(value))}"):
        LLM(good, backend="reference", progress=False, **{field: value})


def test_model_must_be_a_path(good: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="model must be a model folder.*got 123"):
        LLM(123, backend="reference", progress=False)  # type: ignore[arg-type]


def test_max_tokens_beyond_the_kv_pool_names_the_asked_value_once(good: Path) -> None:
    """max_tokens far beyond max_seq_len, on a pool too small: the message gives the caller's
    max_tokens and the max_seq_len that capped it, and names the prompt once (it said "prompt 0:
    request 0 needs ... max_tokens 125 - 1", the capped value only)."""
    llm = LLM(good, kv_cache="paged", max_seq_len=128, kv_cache_memory=20000, progress=False)
    want = (
        r"^prompt 0 needs up to 127 KV tokens \(3-token prompt \+ max_tokens 125 - 1, max_tokens=9999999 being capped by "
        r"max_seq_len=128\) = 8 blocks of 16, but the whole KV pool has 2 blocks"
    )
    with pytest.raises(InvalidRequestError, match=want):
        llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=9999999))
