"""Tests of trtcore.checkpoint against torch / safetensors.torch (the reference)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from trtcore.checkpoint import Checkpoint, read_safetensors_header
from trtcore.errors import CheckpointError, MissingTensorError, TensorShapeError

REPO_ROOT = Path(__file__).resolve().parents[1]


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))


def _bits(t: torch.Tensor) -> np.ndarray:
    """The raw bytes of a torch tensor as an unsigned-int NumPy array (bit-exact compare)."""
    t = t.contiguous()
    if t.dtype == torch.bool:
        return t.numpy().view(np.uint8)
    itemsize = t.element_size()
    signed = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[itemsize]
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize]
    return t.view(signed).numpy().view(unsigned)


def _np_bits(a: np.ndarray) -> np.ndarray:
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return np.ascontiguousarray(a).view(unsigned)


def _random_tensors(g: torch.Generator) -> dict[str, torch.Tensor]:
    def shape():
        return tuple(int(s) for s in torch.randint(1, 9, (int(torch.randint(1, 4, (1,), generator=g)),), generator=g))

    return {
        "model.embed_tokens.weight": torch.randn(shape(), generator=g, dtype=torch.float32),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(shape(), generator=g).to(torch.float16),
        "model.layers.0.self_attn.k_proj.weight": torch.randn(shape(), generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.randn(shape(), generator=g, dtype=torch.float64),
        "ids32": torch.randint(-(2**31), 2**31 - 1, shape(), generator=g, dtype=torch.int32),
        "ids64": torch.randint(-(2**62), 2**62, shape(), generator=g, dtype=torch.int64),
        "u8": torch.randint(0, 256, shape(), generator=g, dtype=torch.uint8),
        "i8": torch.randint(-128, 128, shape(), generator=g, dtype=torch.int8),
        "mask": torch.rand(shape(), generator=g) > 0.5,
        "scalar": torch.randn((), generator=g),
        "empty": torch.zeros((0, 3)),
    }


EXPECTED_NP = {
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.bfloat16: ml_dtypes.bfloat16,
    torch.float64: np.float64,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.uint8: np.uint8,
    torch.int8: np.int8,
    torch.bool: np.bool_,
}


def test_single_file_all_dtypes_bit_exact(tmp_path):
    tensors = _random_tensors(_gen())
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with Checkpoint(tmp_path) as ck:
        assert ck.names == sorted(tensors)
        assert len(ck) == len(tensors) and list(ck) == sorted(tensors)
        assert ck.metadata == {"format": "pt"}
        assert ck.files == [tmp_path / "model.safetensors"]
        for name, t in tensors.items():
            assert name in ck
            assert ck.shape(name) == tuple(t.shape)
            assert ck.dtype(name) == np.dtype(EXPECTED_NP[t.dtype])
            a = ck.get(name, shape=tuple(t.shape))
            assert a.shape == tuple(t.shape) and a.dtype == np.dtype(EXPECTED_NP[t.dtype])
            assert a.flags.writeable and a.flags.c_contiguous
            np.testing.assert_array_equal(_np_bits(a), _bits(t))
        assert "nope" not in ck


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # f32 -> f16 inf
def test_dtype_conversions_match_torch(tmp_path):
    g = _gen()
    # all 65536 bf16 bit patterns (inf, nan, subnormals included) and random f32/f16
    all_bf16 = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(256, 256)
    f32 = torch.randn(64, 33, generator=g) * 10.0 ** torch.randint(-6, 6, (64, 33), generator=g)
    f16 = torch.randn(17, 5, generator=g).half()
    save_file({"bf16": all_bf16, "f32": f32, "f16": f16}, tmp_path / "model.safetensors")
    with Checkpoint(tmp_path) as ck:
        np.testing.assert_array_equal(_np_bits(ck.get("bf16", dtype=np.float32)), _bits(all_bf16.float()))
        np.testing.assert_array_equal(_np_bits(ck.get("bf16", dtype="float32")), _bits(all_bf16.float()))
        np.testing.assert_array_equal(_np_bits(ck.get("f32", dtype=np.float16)), _bits(f32.half()))
        np.testing.assert_array_equal(_np_bits(ck.get("f32", dtype="bf16")), _bits(f32.bfloat16()))
        np.testing.assert_array_equal(_np_bits(ck.get("f16", dtype="fp32")), _bits(f16.float()))
        b = ck.get("f32", dtype=ml_dtypes.bfloat16)
        assert b.dtype == np.dtype(ml_dtypes.bfloat16)
        # no conversion asked: stored dtype, and copy=False gives a read-only mmap view
        v = ck.get("f32", copy=False)
        assert not v.flags.writeable
        np.testing.assert_array_equal(_np_bits(v), _bits(f32))
        with pytest.raises(CheckpointError, match="not a NumPy dtype"):
            ck.get("f32", dtype="not-a-dtype")


def test_sharded_hf_save_pretrained(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert not (tmp_path / "model.safetensors").exists()
    state = model.state_dict()
    with Checkpoint(tmp_path) as ck:
        assert len(ck.files) > 1
        assert ck.index_file == tmp_path / "model.safetensors.index.json"
        assert ck.names == sorted(state)
        index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
        for name, t in state.items():
            assert ck.file_of(name).name == index["weight_map"][name]
            a = ck.get(name, shape=t.shape)
            assert a.dtype == np.dtype(ml_dtypes.bfloat16)
            np.testing.assert_array_equal(_np_bits(a), _bits(t))
            np.testing.assert_array_equal(_np_bits(ck.get(name, dtype=np.float32)), _bits(t.float()))
    # the index file itself may be passed
    with Checkpoint(tmp_path / "model.safetensors.index.json") as ck2:
        assert ck2.names == sorted(state)


def test_single_other_safetensors_file_and_file_path(tmp_path):
    t = {"w": torch.randn(3, 7, generator=_gen())}
    save_file(t, tmp_path / "consolidated.safetensors")
    for path in (tmp_path, tmp_path / "consolidated.safetensors"):
        with Checkpoint(path) as ck:
            assert ck.names == ["w"]
            np.testing.assert_array_equal(ck.get("w"), t["w"].numpy())


def test_bf16_without_torch_subprocess(tmp_path):
    g = _gen()
    tensors = {
        "a": torch.randn(37, 11, generator=g).bfloat16(),
        "b.all_patterns": torch.arange(0, 65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16),
    }
    save_file(tensors, tmp_path / "model.safetensors")
    for k, t in tensors.items():
        np.save(tmp_path / f"{k}.f32.npy", t.float().numpy())
        np.save(tmp_path / f"{k}.bits.npy", _bits(t))
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None  # any `import torch` now raises ImportError
        import numpy as np
        from trtcore.checkpoint import Checkpoint
        d = {str(tmp_path)!r}
        with Checkpoint(d) as ck:
            for k in ck.names:
                a = ck.get(k)
                assert a.dtype.name == "bfloat16", a.dtype
                assert (a.view(np.uint16) == np.load(f"{{d}}/{{k}}.bits.npy")).all(), k
                f = ck.get(k, dtype=np.float32)
                ref = np.load(f"{{d}}/{{k}}.f32.npy")
                assert (f.view(np.uint32) == ref.view(np.uint32)).all(), k
        assert sys.modules["torch"] is None
        print("OK", len(ck.names))
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "OK 2"


# --------------------------------------------------------------------------- errors


def test_missing_tensor_message_and_suggestion(tmp_path):
    save_file({"model.layers.0.self_attn.q_proj.weight": torch.zeros(2, 2)}, tmp_path / "model.safetensors")
    with Checkpoint(tmp_path) as ck:
        with pytest.raises(MissingTensorError) as ei:
            ck.get("model.layers.0.self_attn.q_prj.weight")
        msg = str(ei.value)
        assert "'model.layers.0.self_attn.q_prj.weight'" in msg
        assert str(tmp_path) in msg
        assert "did you mean 'model.layers.0.self_attn.q_proj.weight'" in msg
        with pytest.raises(MissingTensorError) as ei:
            ck.shape("zzz")
        assert "did you mean" not in str(ei.value)
        with pytest.raises(KeyError):  # MissingTensorError is also a KeyError
            ck.dtype("zzz")


def test_wrong_shape_is_checked_before_reading(tmp_path, monkeypatch):
    g = _gen()
    rows, cols = (int(x) for x in torch.randint(2, 9, (2,), generator=g))
    save_file({"w": torch.randn(rows, cols, generator=g)}, tmp_path / "model.safetensors")
    with Checkpoint(tmp_path) as ck:

        def no_read(*a, **k):
            raise AssertionError("data was read before the shape check")

        monkeypatch.setattr(Checkpoint, "_view", no_read)
        with pytest.raises(TensorShapeError) as ei:
            ck.get("w", shape=(cols + 1, rows))
        assert str(ei.value) == (
            f"tensor 'w' has shape ({rows}, {cols}) in {tmp_path / 'model.safetensors'}, "
            f"expected ({cols + 1}, {rows})"
        )
        assert isinstance(ei.value, CheckpointError)


def _good_file(tmp_path: Path) -> Path:
    p = tmp_path / "model.safetensors"
    save_file({"a": torch.randn(4, 4, generator=_gen()), "b": torch.randn(8, generator=_gen())}, p)
    return p


def _write_raw(p: Path, header: bytes | dict, data: bytes = b"", length: int | None = None) -> None:
    if isinstance(header, dict):
        header = json.dumps(header).encode()
    n = len(header) if length is None else length
    p.write_bytes(struct.pack("<Q", n) + header + data)


def test_corrupted_truncated_file(tmp_path):
    p = _good_file(tmp_path)
    p.write_bytes(p.read_bytes()[:5])
    with pytest.raises(CheckpointError) as ei:
        Checkpoint(tmp_path)
    assert str(p) in str(ei.value) and "5 bytes" in str(ei.value)


def test_corrupted_truncated_data(tmp_path):
    p = _good_file(tmp_path)
    p.write_bytes(p.read_bytes()[:-7])
    with pytest.raises(CheckpointError) as ei:
        Checkpoint(tmp_path)
    msg = str(ei.value)
    assert str(p) in msg and "beyond the end of the data section" in msg


def test_corrupted_header_length_larger_than_file(tmp_path):
    p = tmp_path / "model.safetensors"
    _write_raw(p, b'{"a": 1}', length=10**9)
    with pytest.raises(CheckpointError) as ei:
        Checkpoint(tmp_path)
    msg = str(ei.value)
    assert str(p) in msg and str(10**9) in msg and "header length" in msg


def test_corrupted_garbage_header(tmp_path):
    p = tmp_path / "model.safetensors"
    _write_raw(p, os.urandom(16).replace(b"{", b"x") + b"\xff")
    with pytest.raises(CheckpointError) as ei:
        Checkpoint(tmp_path)
    assert str(p) in str(ei.value) and "not valid UTF-8 JSON" in str(ei.value)
    _write_raw(p, b"[1, 2, 3]")
    with pytest.raises(CheckpointError, match="expected a JSON object"):
        Checkpoint(tmp_path)


def test_corrupted_offsets_beyond_file(tmp_path):
    p = tmp_path / "model.safetensors"
    _write_raw(p, {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                   "x": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}}, data=bytes(20))
    with pytest.raises(CheckpointError) as ei:
        Checkpoint(tmp_path)
    msg = str(ei.value)
    assert str(p) in msg and "'x'" in msg and "[16, 32]" in msg and "20 bytes" in msg


def test_corrupted_entries(tmp_path):
    p = tmp_path / "model.safetensors"
    cases = [
        ({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}, "needs 16 bytes"),
        ({"w": {"dtype": "F32", "shape": [2, -2], "data_offsets": [0, 16]}}, "shape"),
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [8, 4]}}, "data_offsets"),
        ({"w": {"shape": [4], "data_offsets": [0, 16]}}, "dtype"),
        ({"w": [1, 2]}, "expected an object"),
    ]
    for header, needle in cases:
        _write_raw(p, header, data=bytes(16))
        with pytest.raises(CheckpointError) as ei:
            read_safetensors_header(p)
        assert needle in str(ei.value) and str(p) in str(ei.value), (header, str(ei.value))


def test_unknown_dtype_fails_only_for_that_tensor(tmp_path):
    p = tmp_path / "model.safetensors"
    _write_raw(p, {"q": {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]},
                   "w": {"dtype": "I32", "shape": [2], "data_offsets": [2, 10]}},
               data=bytes([0, 0]) + np.array([7, -3], np.int32).tobytes())
    with Checkpoint(tmp_path) as ck:
        assert ck.shape("q") == (4,)
        np.testing.assert_array_equal(ck.get("w"), [7, -3])
        with pytest.raises(CheckpointError, match="'F4'"):
            ck.get("q")


def test_no_safetensors_in_dir(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError) as ei:
        Checkpoint(tmp_path)
    msg = str(ei.value)
    assert str(tmp_path) in msg and "model.safetensors" in msg and "model.safetensors.index.json" in msg
    with pytest.raises(CheckpointError, match="does not exist"):
        Checkpoint(tmp_path / "nowhere")


def test_several_files_without_index(tmp_path):
    save_file({"a": torch.zeros(1)}, tmp_path / "x.safetensors")
    save_file({"b": torch.zeros(1)}, tmp_path / "y.safetensors")
    with pytest.raises(CheckpointError) as ei:
        Checkpoint(tmp_path)
    assert "x.safetensors" in str(ei.value) and "y.safetensors" in str(ei.value)


def test_index_shard_missing_or_incomplete(tmp_path):
    save_file({"a": torch.zeros(2)}, tmp_path / "model-00001-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError) as ei:
        Checkpoint(tmp_path)
    msg = str(ei.value)
    assert "model-00002-of-00002.safetensors" in msg and "missing" in msg and "'b'" in msg
    assert "model.safetensors.index.json" in msg
    # a shard that exists but lacks a tensor the index maps to it
    index["weight_map"]["b"] = "model-00001-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="does not contain them, e.g. 'b'"):
        Checkpoint(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot read checkpoint index"):
        Checkpoint(tmp_path)


def test_close_and_context_manager(tmp_path):
    t = torch.randn(5, generator=_gen())
    save_file({"w": t}, tmp_path / "model.safetensors")
    with Checkpoint(tmp_path) as ck:
        view = ck.get("w", copy=False)
        copy = ck.get("w")
    with pytest.raises(CheckpointError, match="closed"):
        ck.get("w")
    # arrays handed out before close() stay valid
    np.testing.assert_array_equal(view, t.numpy())
    np.testing.assert_array_equal(copy, t.numpy())
    assert ck.shape("w") == (5,)  # header queries still work
