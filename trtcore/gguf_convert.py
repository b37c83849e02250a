"""Convert a llama.cpp GGUF file into a Hugging Face-style model directory.

:func:`convert_gguf` reads a GGUF file of architecture ``llama`` or ``qwen2`` and writes::

    config.json              LlamaForCausalLM / Qwen2ForCausalLM, Hugging Face field names
    generation_config.json   bos / eos / pad ids
    model.safetensors        every tensor dequantized to float16, Hugging Face tensor names
                             (``keep_quantized``: linear weights of the types in
                             :data:`trtcore.quant_formats.gguf_blocks.GGUF_TYPES` keep their
                             raw ggml blocks, ``uint8 [rows, row bytes]``, and config.json gets
                             ``quantization_config = {"quant_method": "gguf", "ggml_types":
                             {name: type}}``; :mod:`trtcore.quant_formats` reads them)
    tokenizer.json           rebuilt with the ``tokenizers`` library from the GGUF metadata
    tokenizer_config.json    bos / eos / unk / pad tokens, add_bos_token, chat_template

so the rest of trtcore (and ``transformers``) can load it like any checkpoint.

What the conversion undoes or rebuilds:

* **Quantized blocks** are dequantized with the ``gguf`` package (``gguf.quants.dequantize``),
  which knows every ggml type (Q4_0 ... Q8_0, K-quants, IQ types, BF16, F16, F32).
* **q/k row permutation** (``llama`` only): llama.cpp's ``convert_hf_to_gguf.py`` reorders the
  rows of ``q_proj`` / ``k_proj`` (weights and biases) of each head from the Hugging Face
  "rotate half" layout ``[half, pair-index]`` to the interleaved GPT-J layout
  ``[pair-index, half]``; :func:`unpermute_qk` reverses it. ``qwen2`` files are not permuted.
* **Llama 3 RoPE scaling**: llama.cpp drops ``rope_scaling`` from the metadata and stores the
  per-frequency factors as a ``rope_freqs.weight`` tensor instead; the ``llama3`` parameters are
  recovered from those factors (and checked to reproduce them).
* **Tokenizer**: ``tokenizer.ggml.model == "gpt2"`` becomes a byte-level BPE whose pre-tokenizer
  follows ``tokenizer.ggml.pre``; ``"llama"`` becomes a SentencePiece-style BPE with byte
  fallback (merges from the file, or rebuilt from the token scores). Tokens marked CONTROL become
  special added tokens, USER_DEFINED ones plain added tokens. The result gives the same token ids
  as ``transformers``' own GGUF tokenizer converter, except where llama.cpp differs from it: the
  Llama-3 and Tekken pre-tokenizers take a whole-vocabulary pre-token as one token
  (``ignore_merges``, as Meta's own tokenizer.json) and add BOS where the file does not say.

Tensors are processed one at a time (large ones in row chunks) and streamed into the
safetensors file, so peak memory stays near one dequantized tensor, not the whole model.
Everything is written to a temporary directory next to ``output_dir`` that is renamed into
place at the end: a failed conversion leaves nothing half-written behind.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConversionError
from .families import GGUFMapping, gguf_families
from .fileio import atomic_folder, check_folder_free
from .gguf_pretokenizers import DEFAULT_BOS_PRE, IGNORE_MERGES_PRE, byte_level_pre_tokenizer
from .quant_formats.gguf_blocks import GGUF_TYPES
from .token_bytes import bytes_to_unicode

__all__ = ["SUPPORTED_ARCHITECTURES", "convert_gguf", "unpermute_qk"]

logger = logging.getLogger(__name__)

#: GGUF ``general.architecture`` -> Hugging Face ``architectures`` entry (the families whose
#: registry record has a GGUF mapping, :func:`trtcore.families.gguf_families`).
SUPPORTED_ARCHITECTURES: dict[str, str] = {arch: f.architecture for arch, f in gguf_families().items()}

# gguf TokenType values (gguf.constants.TokenType)
_TOKEN_CONTROL = 3
_TOKEN_USER_DEFINED = 4

# rows of a large tensor dequantized at once (bounded by element count, see _iter_rows)
_CHUNK_ELEMENTS = 1 << 24

_REQUIRED_LAYER_TENSORS = (
    "attn_norm.weight",
    "ffn_norm.weight",
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
)
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


# ---------------------------------------------------------------------------------------------
# public API


def convert_gguf(
    gguf_path: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    *,
    progress: bool = True,
    overwrite: bool = False,
    keep_quantized: bool = False,
) -> Path:
    """Convert ``gguf_path`` into a Hugging Face-style model directory at ``output_dir``.

    ``keep_quantized``: linear weights (not the embedding) of a kept GGUF type
    (:data:`~trtcore.quant_formats.gguf_blocks.GGUF_TYPES`) stay in their blocks (module
    docstring); other tensors are dequantized to float16 as without it, and a warning (logger
    ``trtcore.gguf_convert``) counts the quantized linear weights of other types written so, or
    says that the file has none to keep.

    Returns ``output_dir`` as a :class:`~pathlib.Path`. Raises :class:`ConversionError` if the
    file is not GGUF, its architecture is not one of :data:`SUPPORTED_ARCHITECTURES`, a tensor
    or the tokenizer cannot be converted, or ``output_dir`` exists, is not empty and
    ``overwrite`` is false. On any failure nothing is left at or next to ``output_dir``.
    """
    reader = _open_gguf(Path(gguf_path))  # first: a folder or a non-GGUF file is the more specific mistake
    check_folder_free(output_dir, overwrite, ConversionError, source=gguf_path)  # as given: "" is not "."
    gguf_path = Path(gguf_path)
    output_dir = Path(output_dir)

    meta = _Metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConversionError(
            f"{gguf_path.name}: GGUF architecture {arch!r} is not supported; supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )
    tensors = {t.name: t for t in reader.tensors}
    config = _build_config(meta, arch, tensors)
    plan = _plan_tensors(tensors, config, arch, keep_quantized)
    kept = {p.hf_name: p.gguf.tensor_type.name for p in plan if p.keep}
    if kept:
        config["quantization_config"] = {"quant_method": "gguf", "ggml_types": kept}
    if keep_quantized:
        _warn_not_kept(gguf_path.name, plan, len(kept))
    tokenizer, tokenizer_config = _build_tokenizer(meta, config)
    generation_config = _build_generation_config(meta, config)

    with atomic_folder(output_dir, overwrite=overwrite, error=ConversionError) as tmp:
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", generation_config)
        tokenizer.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "tokenizer_config.json", tokenizer_config)
        _write_safetensors(tmp / "model.safetensors", plan, progress=progress)
    return output_dir


def unpermute_qk(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation along axis 0.

    ``convert_hf_to_gguf.py`` does ``w.reshape(n_head, 2, rows // n_head // 2, *rest)
    .swapaxes(1, 2)``: each head's rows go from ``[half][i]`` (Hugging Face's rotate-half
    order) to ``[i][half]`` (interleaved pairs). The inverse reshapes to
    ``(n_head, rows // n_head // 2, 2, *rest)`` and swaps the same two axes back. ``n_head``
    is the number of query heads for ``q_proj`` and of key/value heads for ``k_proj``; works
    for weights (2-D) and biases (1-D).
    """
    rows = weight.shape[0]
    if rows % (2 * n_head):
        raise ConversionError(f"cannot un-permute {rows} rows over {n_head} heads")
    rest = weight.shape[1:]
    return weight.reshape(n_head, rows // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(weight.shape)


# ---------------------------------------------------------------------------------------------
# reading


def _open_gguf(path: Path) -> Any:
    import gguf

    if path.is_dir():
        raise ConversionError(f"{path} is a folder; give the path of a .gguf file")
    if not path.is_file():
        raise ConversionError(f"GGUF file not found: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ConversionError(f"{path} is not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    try:
        return gguf.GGUFReader(str(path), "r")
    except Exception as exc:  # truncated or corrupt file, unknown value type ...
        # gguf's reader fails on a cut-off file with a NumPy view / reshape message: say what it means
        raise ConversionError(
            f"cannot read GGUF file {path} ({path.stat().st_size:,} bytes): {exc}. A truncated or corrupt file (an interrupted "
            "download, a partial copy) fails this way: compare its size or SHA-256 with the source's and download it again"
        ) from exc


class _Metadata:
    """GGUF key/value metadata with Python values."""

    def __init__(self, reader: Any) -> None:
        self._fields = reader.fields

    def __contains__(self, key: str) -> bool:
        return key in self._fields

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        if field is None:
            return default
        try:
            value = field.contents()
        except Exception as exc:
            raise ConversionError(f"cannot read GGUF metadata {key!r}: {exc}") from exc
        return value

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ConversionError(f"GGUF metadata {key!r} is missing")
        return value


def _clean_float(value: float) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not
    9.999999747378752e-06)."""
    return float(str(np.float32(value)))


def _numpy_shape(tensor: Any) -> tuple[int, ...]:
    # ggml lists dimensions fastest-moving first; numpy / torch the other way round
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


# ---------------------------------------------------------------------------------------------
# config


def _mapping(arch: str) -> GGUFMapping:
    mapping = gguf_families()[arch].gguf
    assert mapping is not None
    return mapping


def _build_config(meta: _Metadata, arch: str, tensors: dict[str, Any]) -> dict[str, Any]:
    def key(name: str) -> str:
        return f"{arch}.{name}"

    if "token_embd.weight" not in tensors:
        raise ConversionError("GGUF file has no token_embd.weight tensor")
    if "blk.0.attn_q.weight" not in tensors:
        raise ConversionError("GGUF file has no blk.0.attn_q.weight tensor")
    vocab_size, hidden = _numpy_shape(tensors["token_embd.weight"])
    n_layers = int(meta.require(key("block_count")))
    n_heads = int(meta.require(key("attention.head_count")))
    n_kv = meta.get(key("attention.head_count_kv"), n_heads)
    if isinstance(n_kv, list):  # per-layer counts; only uniform ones are supported
        if len(set(n_kv)) != 1:
            raise ConversionError(f"per-layer attention.head_count_kv {n_kv} is not supported")
        n_kv = n_kv[0]
    n_kv = int(n_kv)
    embedding_length = int(meta.require(key("embedding_length")))
    if embedding_length != hidden:
        raise ConversionError(f"token_embd.weight has width {hidden}, metadata says embedding_length={embedding_length}")
    q_rows = _numpy_shape(tensors["blk.0.attn_q.weight"])[0]
    if q_rows % n_heads:
        raise ConversionError(f"attn_q has {q_rows} rows, not a multiple of head_count={n_heads}")
    head_dim = q_rows // n_heads
    key_length = meta.get(key("attention.key_length"))
    if key_length is not None and int(key_length) != head_dim:
        raise ConversionError(f"attention.key_length={key_length} but attn_q implies head_dim={head_dim}")
    rope_dims = meta.get(key("rope.dimension_count"))
    if rope_dims is not None and int(rope_dims) != head_dim:
        raise ConversionError(f"partial rotary embedding (rope.dimension_count={rope_dims}, head_dim={head_dim}) is not supported")
    intermediate = meta.get(key("feed_forward_length"))
    if intermediate is None:
        intermediate = _numpy_shape(tensors["blk.0.ffn_gate.weight"])[0] if "blk.0.ffn_gate.weight" in tensors else None
    if intermediate is None:
        raise ConversionError(f"GGUF metadata {key('feed_forward_length')!r} is missing")
    if isinstance(intermediate, list):
        raise ConversionError("per-layer feed_forward_length is not supported")

    rope_theta = _clean_float(meta.get(key("rope.freq_base"), 10000.0))
    has_bias = any(n.endswith((".attn_q.bias", ".attn_k.bias", ".attn_v.bias")) for n in tensors)
    config: dict[str, Any] = {
        "architectures": [SUPPORTED_ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": int(intermediate),
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "max_position_embeddings": int(meta.get(key("context_length"), 2048)),
        "rms_norm_eps": _clean_float(meta.get(key("attention.layer_norm_rms_epsilon"), 1e-6)),
        "rope_theta": rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in tensors,
        "torch_dtype": "float16",
    }
    if _mapping(arch).bias_from_tensors:  # the family's modeling code reads attention_bias
        config["attention_bias"] = has_bias
        config["mlp_bias"] = False
    rope_scaling = _rope_scaling(meta, arch, tensors, head_dim, rope_theta)
    if rope_scaling is not None:
        config["rope_scaling"] = rope_scaling
    for name, meta_key in (
        ("bos_token_id", "tokenizer.ggml.bos_token_id"),
        ("eos_token_id", "tokenizer.ggml.eos_token_id"),
        ("pad_token_id", "tokenizer.ggml.padding_token_id"),
    ):
        value = meta.get(meta_key)
        if value is not None:
            config[name] = int(value)
    return config


def _rope_scaling(meta: _Metadata, arch: str, tensors: dict[str, Any], head_dim: int, rope_theta: float) -> dict[str, Any] | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if factor is None:
        factor = meta.get(f"{arch}.rope.scale_linear")  # convert.py's key of Aug-Oct 2023 (llama.cpp still reads it)
    if factor is None or not math.isfinite(float(factor)) or float(factor) <= 0.0:
        if kind not in (None, "none"):  # llama.cpp reads a scaling type without a factor as factor 1: no scaling
            logger.warning("GGUF %s.rope.scaling.type %r has no usable factor (%r); read as no RoPE scaling, as llama.cpp does", arch, kind, factor)
        kind, factor = "none", None
    if kind in (None, "none") and factor is not None and float(factor) != 1.0:
        kind = "linear"  # old files: a factor without a type
    if kind == "linear":
        return {"rope_type": "linear", "factor": _clean_float(factor)}
    if kind == "yarn":
        out: dict[str, Any] = {"rope_type": "yarn", "factor": _clean_float(factor)}
        orig = meta.get(f"{arch}.rope.scaling.original_context_length")
        if orig is not None:
            out["original_max_position_embeddings"] = int(orig)
        for meta_name, hf_name in (
            ("yarn_beta_fast", "beta_fast"),
            ("yarn_beta_slow", "beta_slow"),
            ("attn_factor", "attention_factor"),
        ):
            value = meta.get(f"{arch}.rope.scaling.{meta_name}")
            if value is not None:
                out[hf_name] = _clean_float(value)
        return out
    if kind not in (None, "none"):
        raise ConversionError(f"RoPE scaling type {kind!r} is not supported")
    if "rope_freqs.weight" in tensors:
        import gguf

        t = tensors["rope_freqs.weight"]
        freqs = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(-1)
        return _llama3_rope_from_factors(freqs, head_dim, rope_theta)
    return None


def _llama3_factors(params: dict[str, Any], head_dim: int, theta: float) -> np.ndarray:
    """llama.cpp's ``rope_freqs`` for Llama 3 RoPE scaling (same formula as convert_hf_to_gguf)."""
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    orig = params["original_max_position_embeddings"]
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / freqs
    smooth = (orig / wavelen - low) / (high - low)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < orig / high, 1.0, np.where(wavelen > orig / low, factor, mid))


def _llama3_rope_from_factors(factors: np.ndarray, head_dim: int, theta: float) -> dict[str, Any] | None:
    """Recover Hugging Face's ``llama3`` rope_scaling from llama.cpp's ``rope_freqs`` tensor.

    Per frequency, llama.cpp stores ``1 / ((1 - s) / factor + s)`` with
    ``s = (orig / wavelen - low) / (high - low)`` clipped to [0, 1]. ``factor`` is the largest
    value; ``s`` is linear in ``1 / wavelen`` and the factors only depend on its slope and
    intercept, so ``low_freq_factor = 1`` is assumed (as in every Llama 3.x) and ``high`` /
    ``orig`` are fitted from the partially scaled frequencies. The result is checked to
    reproduce the tensor.
    """
    if factors.shape != (head_dim // 2,):
        raise ConversionError(f"rope_freqs.weight has shape {factors.shape}, expected ({head_dim // 2},)")
    if np.allclose(factors, 1.0):
        return None
    factor = float(factors.max())
    candidates = []
    inv_wavelen = (1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)) / (2 * math.pi)
    mid = (factors > 1.0 + 1e-6) & (factors < factor * (1 - 1e-6))
    if mid.sum() >= 2:
        s = (1.0 / factors[mid] - 1.0 / factor) / (1.0 - 1.0 / factor)
        slope, intercept = np.polyfit(inv_wavelen[mid], s, 1)
        if intercept < 0 and slope > 0:
            high = 1.0 - 1.0 / intercept
            orig = -slope / intercept
            candidates.append((round(high, 4), float(round(orig))))
    candidates.append((4.0, 8192.0))  # Llama 3.1 / 3.2 defaults
    for high, orig in candidates:
        params = {
            "rope_type": "llama3",
            "factor": _clean_float(factor),
            "low_freq_factor": 1.0,
            "high_freq_factor": float(high),
            "original_max_position_embeddings": int(orig),
        }
        if np.allclose(_llama3_factors(params, head_dim, theta), factors, rtol=1e-4, atol=1e-5):
            return params
    raise ConversionError("rope_freqs.weight does not match Llama 3 RoPE scaling; this RoPE variant is not supported")


# ---------------------------------------------------------------------------------------------
# tensors


@dataclass
class _PlannedTensor:
    hf_name: str
    gguf: Any  # gguf.ReaderTensor
    shape: tuple[int, ...]
    unpermute_heads: int  # 0: no q/k un-permutation
    keep: bool = False  # raw ggml blocks, uint8 [rows, row bytes] (keep_quantized)

    @property
    def stored_shape(self) -> tuple[int, ...]:
        return tuple(self.gguf.data.shape) if self.keep else self.shape


#: GGUF tensor types that are not quantized (converted to float16 with or without keep_quantized)
_FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


def _warn_not_kept(file: str, plan: list[_PlannedTensor], kept: int) -> None:
    """A warning (``keep_quantized``) naming the quantized linear weights written as float16
    after all (types outside :data:`GGUF_TYPES`), or saying that nothing was kept."""
    from collections import Counter

    lost = Counter(
        p.gguf.tensor_type.name
        for p in plan
        if not p.keep and len(p.shape) == 2 and p.gguf.name != "token_embd.weight" and p.gguf.tensor_type.name not in _FLOAT_TYPES
    )
    types = ", ".join(f"{n} {t}" for t, n in sorted(lost.items()))
    if lost:
        logger.warning(
            "%s: kept %d linear weights quantized; %s of types trtcore does not keep (it keeps %s) are written as float16",
            file, kept, types, ", ".join(GGUF_TYPES),
        )  # fmt: skip
    elif not kept:
        logger.warning("%s: no linear weight is quantized (nothing to keep); written as float16 as without --keep-quantized", file)


def _plan_tensors(tensors: dict[str, Any], config: dict[str, Any], arch: str, keep_quantized: bool = False) -> list[_PlannedTensor]:
    n_layers = config["num_hidden_layers"]
    n_heads, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    hidden, head_dim, inter = config["hidden_size"], config["head_dim"], config["intermediate_size"]
    vocab = config["vocab_size"]
    expected = {
        "attn_norm.weight": (hidden,),
        "ffn_norm.weight": (hidden,),
        "attn_q.weight": (n_heads * head_dim, hidden),
        "attn_q.bias": (n_heads * head_dim,),
        "attn_k.weight": (n_kv * head_dim, hidden),
        "attn_k.bias": (n_kv * head_dim,),
        "attn_v.weight": (n_kv * head_dim, hidden),
        "attn_v.bias": (n_kv * head_dim,),
        "attn_output.weight": (hidden, n_heads * head_dim),
        "attn_output.bias": (hidden,),
        "ffn_gate.weight": (inter, hidden),
        "ffn_up.weight": (inter, hidden),
        "ffn_down.weight": (hidden, inter),
        "token_embd.weight": (vocab, hidden),
        "output_norm.weight": (hidden,),
        "output.weight": (vocab, hidden),
    }
    mapping = _mapping(arch)
    plan: list[_PlannedTensor] = []
    seen_layers: dict[int, set[str]] = {i: set() for i in range(n_layers)}
    for name, t in tensors.items():
        shape = _numpy_shape(t)
        if name == "rope_freqs.weight":
            continue  # folded into config["rope_scaling"]
        if name in mapping.global_tensors:
            hf_name, suffix = mapping.global_tensors[name], name
        else:
            m = _LAYER_RE.match(name)
            if not m or m.group(2) not in mapping.layer_tensors:
                raise ConversionError(f"GGUF tensor {name!r} is not supported for architecture {arch!r}")
            layer, suffix = int(m.group(1)), m.group(2)
            if layer >= n_layers:
                raise ConversionError(f"GGUF tensor {name!r} is beyond block_count={n_layers}")
            seen_layers[layer].add(suffix)
            hf_name = f"model.layers.{layer}.{mapping.layer_tensors[suffix]}"
        if shape != expected[suffix]:
            raise ConversionError(f"GGUF tensor {name!r} has shape {shape}, expected {expected[suffix]}")
        heads = 0
        if mapping.permute_qk and suffix.startswith("attn_q."):
            heads = n_heads
        elif mapping.permute_qk and suffix.startswith("attn_k."):
            heads = n_kv
        keep = keep_quantized and len(shape) == 2 and suffix != "token_embd.weight" and t.tensor_type.name in GGUF_TYPES
        plan.append(_PlannedTensor(hf_name, t, shape, heads, keep))
    for layer, present in seen_layers.items():
        missing = [s for s in _REQUIRED_LAYER_TENSORS if s not in present]
        if missing:
            raise ConversionError(f"GGUF file lacks blk.{layer}.{missing[0]}")
    if "output_norm.weight" not in tensors:
        raise ConversionError("GGUF file lacks output_norm.weight")
    return plan


def _dequantize(data: np.ndarray, tensor_type: Any, name: str) -> np.ndarray:
    import gguf

    try:
        return np.asarray(gguf.quants.dequantize(data, tensor_type), dtype=np.float32)
    except NotImplementedError as exc:
        raise ConversionError(f"tensor {name!r}: {exc}") from exc


def _iter_rows(p: _PlannedTensor) -> Iterator[np.ndarray]:
    """The tensor dequantized to float32 in numpy shape, in row chunks (whole if it needs
    un-permuting, is 1-D, or is small). Quantization blocks never span rows, so chunking rows
    of the raw data is exact."""
    t = p.gguf
    data = t.data
    if p.keep:  # blocks never span rows: q/k rows un-permute as raw bytes
        yield unpermute_qk(np.asarray(data), p.unpermute_heads) if p.unpermute_heads else np.asarray(data)
        return
    if p.unpermute_heads or len(p.shape) == 1 or math.prod(p.shape) <= _CHUNK_ELEMENTS:
        w = _dequantize(data, t.tensor_type, t.name).reshape(p.shape)
        if p.unpermute_heads:
            w = unpermute_qk(w, p.unpermute_heads)
        yield w
        return
    rows = data.shape[0]
    if rows != p.shape[0]:
        raise ConversionError(f"tensor {t.name!r}: unexpected raw data layout {data.shape} for shape {p.shape}")
    step = max(1, _CHUNK_ELEMENTS // math.prod(p.shape[1:]))
    for start in range(0, rows, step):
        chunk = _dequantize(data[start : start + step], t.tensor_type, t.name)
        yield chunk.reshape((-1, *p.shape[1:]))


def _write_safetensors(path: Path, plan: list[_PlannedTensor], *, progress: bool) -> None:
    """Stream the planned tensors into a float16 safetensors file, one tensor (chunk) at a time.

    safetensors' own ``save_file`` wants every tensor in memory at once; its format is simple
    enough (u64 header size, JSON header, raw little-endian data) to write incrementally.
    """
    from tqdm.auto import tqdm

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for p in plan:
        nbytes = (1 if p.keep else 2) * math.prod(p.stored_shape)
        header[p.hf_name] = {"dtype": "U8" if p.keep else "F16", "shape": list(p.stored_shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for p in tqdm(plan, desc="Converting GGUF", unit="tensor", disable=not progress):
            written = 0
            for chunk in _iter_rows(p):
                half = chunk.astype(np.uint8 if p.keep else "<f2")
                if not p.keep and not np.isfinite(half).all():
                    raise ConversionError(f"tensor {p.gguf.name!r} overflows float16 (|value| > 65504)")
                f.write(half.tobytes())
                written += half.size
            if written != math.prod(p.stored_shape):
                raise ConversionError(f"tensor {p.gguf.name!r}: wrote {written} values, expected {math.prod(p.stored_shape)}")
        if f.tell() != 8 + len(blob) + offset:
            raise ConversionError("internal error: safetensors size mismatch")


# ---------------------------------------------------------------------------------------------
# tokenizer


def _sentencepiece_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: every split of a token into two
    tokens, best score first (ties: shorter left, then shorter right piece; as transformers'
    ``generate_merges``)."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    score_of = dict(zip(tokens, scores))
    merges: list[tuple[str, str, float]] = []
    for piece, score in score_of.items():
        local = [(piece[:i], piece[i:], score) for i in range(1, len(piece)) if piece[:i] in vocab and piece[i:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _build_tokenizer(meta: _Metadata, config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if kind is None or tokens is None:
        raise ConversionError("GGUF file has no tokenizer (tokenizer.ggml.model / tokenizer.ggml.tokens)")
    tokens = list(tokens)
    token_types = list(meta.get("tokenizer.ggml.token_type") or [])
    merges_meta = meta.get("tokenizer.ggml.merges")
    merges: list[tuple[str, str]] | None = None
    if merges_meta is not None:
        merges = []
        for m in merges_meta:
            left, sep, right = m.partition(" ")
            if not sep:
                raise ConversionError(f"malformed merge {m!r} in tokenizer.ggml.merges")
            merges.append((left, right))

    def token_of(key: str) -> str | None:
        idx = meta.get(f"tokenizer.ggml.{key}")
        if idx is None:
            return None
        if not 0 <= int(idx) < len(tokens):
            raise ConversionError(f"tokenizer.ggml.{key}={idx} is outside the vocabulary")
        return tokens[int(idx)]

    named = {
        "bos_token": token_of("bos_token_id"),
        "eos_token": token_of("eos_token_id"),
        "unk_token": token_of("unknown_token_id"),
        "pad_token": token_of("padding_token_id"),
    }
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))

    if kind == "gpt2":
        if merges is None:
            raise ConversionError("byte-level BPE tokenizer without tokenizer.ggml.merges")
        spelling = bytes_to_unicode()
        alphabet = set(spelling.values())
        # a CONTROL or USER_DEFINED token spelled outside the byte alphabet is kept under its own
        # text (DeepSeek-R1-Distill's "<｜begin▁of▁sentence｜>", "<｜User｜>"), as llama.cpp keeps it
        # one token: it becomes an added token at its GGUF id below
        raw = {i for i, ty in enumerate(token_types) if ty in (_TOKEN_CONTROL, _TOKEN_USER_DEFINED)}
        vocab = {(tok if set(tok) <= alphabet or i in raw else "".join(spelling[b] for b in tok.encode("utf-8"))): i for i, tok in enumerate(tokens)}
        pre = meta.get("tokenizer.ggml.pre", "default")
        bpe = models.BPE(
            vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
            ignore_merges=pre in IGNORE_MERGES_PRE,
        )  # fmt: skip
        tok = Tokenizer(bpe)
        tok.pre_tokenizer = byte_level_pre_tokenizer(pre)
        tok.decoder = decoders.ByteLevel()
        add_bos = bool(add_bos) if add_bos is not None else pre in DEFAULT_BOS_PRE  # llama.cpp's default
        add_prefix_space = False
    elif kind == "llama":
        vocab = {t: i for i, t in enumerate(tokens)}
        if merges is None:
            scores = meta.get("tokenizer.ggml.scores")
            if scores is None:
                raise ConversionError("SentencePiece tokenizer without tokenizer.ggml.scores or merges")
            merges = _sentencepiece_merges(tokens, [float(s) for s in scores])
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=named["unk_token"], fuse_unk=True, byte_fallback=True))
        add_prefix_space = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first" if add_prefix_space else "never", split=False)
        steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        if add_prefix_space:
            steps.append(decoders.Strip(content=" ", left=1, right=0))
        tok.decoder = decoders.Sequence(steps)
        add_bos = bool(add_bos) if add_bos is not None else True  # llama.cpp's default for SPM
    else:
        raise ConversionError(f"tokenizer model {kind!r} is not supported; supported: 'gpt2', 'llama'")

    # CONTROL tokens are special added tokens at their GGUF ids (llama.cpp's control tokens; one
    # spelled outside a byte-level alphabet too: transformers' GGUF reader skipped those, and
    # DeepSeek-R1-Distill's BOS then got an id past the vocabulary)
    control = [t for t, ty in zip(tokens, token_types) if ty == _TOKEN_CONTROL]
    if control:
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    user = [t for t, ty in zip(tokens, token_types) if ty == _TOKEN_USER_DEFINED]
    vocab_now = tok.get_vocab()
    user = [t for t in user if t in vocab_now]
    if user:
        tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    extra = [t for t in named.values() if t is not None and t not in control]
    if extra:
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in dict.fromkeys(extra)])

    add_bos = add_bos and named["bos_token"] is not None
    add_eos = add_eos and named["eos_token"] is not None
    bos, eos = named["bos_token"] or "", named["eos_token"] or ""
    single = f"{bos + ':0 ' if add_bos else ''}$A:0{' ' + eos + ':0' if add_eos else ''}"
    pair = f"{single}{' ' + bos + ':1' if add_bos else ''} $B:1{' ' + eos + ':1' if add_eos else ''}"
    special = []
    if add_bos:
        special.append((bos, tok.token_to_id(bos)))
    if add_eos and eos != bos:
        special.append((eos, tok.token_to_id(eos)))
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)

    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **named,
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "add_prefix_space": add_prefix_space,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
    }
    chat_template = meta.get("tokenizer.chat_template")
    if chat_template is not None:
        tokenizer_config["chat_template"] = chat_template
    return tok, tokenizer_config


def _build_generation_config(meta: _Metadata, config: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "bos_token_id" in config:
        out["bos_token_id"] = config["bos_token_id"]
    # generation stops at any end-of-generation token llama.cpp knows of: eos, end-of-turn,
    # end-of-message
    eos = [config["eos_token_id"]] if "eos_token_id" in config else []
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = meta.get(key)
        if value is not None and int(value) not in eos:
            eos.append(int(value))
    if eos:
        out["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    if "pad_token_id" in config:
        out["pad_token_id"] = config["pad_token_id"]
    return out


# ---------------------------------------------------------------------------------------------
# writing


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
