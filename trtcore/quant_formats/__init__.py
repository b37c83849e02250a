"""Quantized checkpoints as they are published: GPTQ, AWQ, compressed-tensors
``pack-quantized`` and GGUF block types, read into :class:`trtcore.quantization.QuantizedWeight`;
FP8 (compressed-tensors ``float-quantized``, ``quant_method: "fp8"``, or a float checkpoint
quantized at load with ``quantization="fp8"``), read into :class:`trtcore.fp8.Fp8Weight`.

* :func:`detect_quantization` reads ``config.json``'s ``quantization_config`` (and checks it
  against ``LLM(quantization=...)``, vLLM's argument) into a :class:`QuantScheme`;
* :class:`QuantizedCheckpoint` wraps a :class:`~trtcore.checkpoint.Checkpoint`: each
  quantized linear ``X`` appears as one tensor ``X.weight`` that :meth:`~QuantizedCheckpoint.quantized`
  returns as a QuantizedWeight (its packed tensors are hidden); everything else reads through;
* :func:`linear_weight` is what a model asks for a linear layer's weight: the
  QuantizedWeight itself for a quantized linear (the model then builds
  :func:`trtcore.ops.weight_only_linear`, the weight-only GEMM plugin or TensorRT's
  dequantize layer), the float array otherwise; :func:`dequantize_for_network` turns a
  QuantizedWeight into a float weight where a float one is needed.

One module per format: :mod:`.gptq`, :mod:`.awq`, :mod:`.compressed_tensors`, :mod:`.gguf_blocks`,
:mod:`.fp8`.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trtcore.errors import CheckpointError, ConfigError, InvalidArgumentError, TensorShapeError, UnsupportedQuantizationError
from trtcore.fp8 import E4M3, Fp8Weight, quantize_weight
from trtcore.quantization import QuantizedWeight

from .awq import AWQ_VERSIONS, awq_version, read_awq
from .compressed_tensors import FORMATS, STRATEGIES, read_pack_quantized, weight_args, with_defaults
from .fp8 import (
    FLOAT_FORMATS,
    FP8_SUFFIXES,
    check_compressed_fp8,
    check_hf_fp8,
    compressed_per_token,
    fp8_weight_args,
    inverse_scales,
    read_fp8,
    static_activations,
)
from .gguf_blocks import BLOCKS, GGUF_TYPES, gguf_weight
from .gptq import ZERO_OFFSETS, checkpoint_format, dynamic_pattern, read_gptq
from .groups import reset_warnings

_log = logging.getLogger("trtcore.quant_formats")

#: ``quantization`` values (vLLM's names) and ``quantization_config.quant_method`` values read here
QUANTIZATION_METHODS = ("gptq", "awq", "compressed-tensors", "gguf", "fp8")

SUPPORTED_FORMATS = (
    f"gptq (checkpoint_format {' / '.join(ZERO_OFFSETS)}, bits 4/8, any group_size, sym, desc_act with g_idx, dynamic per-module bits); "
    f"awq (version {' / '.join(AWQ_VERSIONS)}, bits 4); "
    f"compressed-tensors (format {' / '.join(FORMATS)}, int weights, num_bits 4/8, strategy {' / '.join(STRATEGIES)}); "
    f"gguf ({' / '.join(GGUF_TYPES)}, from trtcore convert --gguf --keep-quantized); "
    f"FP8 E4M3: compressed-tensors (format {' / '.join(FLOAT_FORMATS)}, float weights per tensor / channel, "
    "activations per tensor static / dynamic or per token dynamic) "
    "and fp8 (weight_scale or weight_scale_inv per tensor / channel, activation_scheme static / dynamic)"
)

#: per method: the suffix that marks a quantized linear, and every tensor suffix it owns
_TENSORS = {
    "gptq": (".qweight", (".qweight", ".qzeros", ".scales", ".g_idx")),
    "awq": (".qweight", (".qweight", ".qzeros", ".scales")),
    "compressed-tensors": (".weight_packed", (".weight_packed", ".weight_scale", ".weight_zero_point", ".weight_g_idx", ".weight_shape")),
}


#: the ``quantization_config`` of a float checkpoint quantized to FP8 at load (``quantization="fp8"``
#: without a quantization_config, as vLLM: per-tensor weight scales, dynamic activation scales)
FP8_ON_THE_FLY = {"quant_method": "fp8", "activation_scheme": "dynamic", "on_the_fly": True}


@dataclass(frozen=True)
class QuantScheme:
    """A checkpoint's quantization: ``method`` (one of :data:`QUANTIZATION_METHODS`) and the
    ``quantization_config`` object it came from."""

    method: str
    config: dict[str, Any] = field(compare=False)

    @property
    def fp8(self) -> bool:
        """Whether the linears are FP8 (:class:`~trtcore.fp8.Fp8Weight`)."""
        return self.method == "fp8" or (self.method == "compressed-tensors" and fp8_weight_args(weight_args(self.config)))

    @property
    def on_the_fly(self) -> bool:
        """Whether a float checkpoint's linears are quantized at load (:data:`FP8_ON_THE_FLY`)."""
        return bool(self.config.get("on_the_fly"))


def _refuse(what: str) -> UnsupportedQuantizationError:
    return UnsupportedQuantizationError(f"quantization_config: {what} is not supported; supported formats: {SUPPORTED_FORMATS}")


def _integer(c: dict[str, Any], key: str, default: int | None, what: str) -> int | None:
    """``c[key]`` as an int (an int, or a string of one), ``default`` when absent or null
    (``bits`` has no null: its default is for an absent key only).

    Raises:
        UnsupportedQuantizationError: the value is no integer (named with the key).
    """
    if key not in c or (c[key] is None and default is None):
        return default
    value = c[key]
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise _refuse(f"{what} {key}={value!r} (expected an integer)")


def _check(method: str, c: dict[str, Any]) -> None:
    if method == "gptq":
        fmt = checkpoint_format(c)
        if fmt not in ZERO_OFFSETS:
            raise _refuse(f"GPTQ checkpoint_format {fmt!r}")
        if c.get("is_marlin_format"):  # AutoGPTQ <= 0.7.1's checkpoint_format "marlin"
            raise _refuse(f"GPTQ is_marlin_format={c['is_marlin_format']!r} (AutoGPTQ's Marlin-serialized layout, checkpoint_format 'marlin')")
        if c.get("rotation"):  # GPTQModel's QuaRot / SpinQuant-style rotated checkpoints
            raise _refuse(
                f"GPTQ rotation={c['rotation']!r} (GPTQModel rotates the weights and re-applies the rotation to activations at "
                "run time, before down_proj; trtcore does not, so the weights would be read without it)"
            )
        pack = str(c.get("pack_dtype", "int32")).removeprefix("torch.")
        if pack != "int32":  # GPTQModel's pack_dtype: the codes' container words
            raise _refuse(f"GPTQ pack_dtype={c['pack_dtype']!r} (codes packed in {pack} words; trtcore reads int32 qweight / qzeros)")
        if _integer(c, "bits", 4, "GPTQ") not in (4, 8):
            raise _refuse(f"GPTQ bits={c.get('bits')!r}")
        _integer(c, "group_size", None, "GPTQ")
        dynamic = c.get("dynamic") or {}
        if not isinstance(dynamic, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in dynamic.items()):
            raise _refuse(f"GPTQ dynamic {dynamic!r} (expected an object of pattern -> override object)")
        for pattern, values in dynamic.items():
            negative, expression = dynamic_pattern(pattern)
            try:
                re.compile(expression)
            except re.error as e:
                raise _refuse(f"GPTQ dynamic pattern {pattern!r} ({e})") from None
            if negative:
                continue
            if _integer(values, "bits", 4, f"GPTQ dynamic override {pattern!r}") not in (4, 8):
                raise _refuse(f"GPTQ dynamic override {pattern!r} bits={values.get('bits')!r}")
            _integer(values, "group_size", None, f"GPTQ dynamic override {pattern!r}")
    elif method == "awq":
        version = awq_version(c)
        if version not in AWQ_VERSIONS:
            raise _refuse(f"AWQ version {version!r}")
        bits_key = "bits" if "bits" in c else "w_bit"
        if _integer(c, bits_key, 4, "AWQ") != 4:
            raise _refuse(f"AWQ {bits_key}={c.get(bits_key)!r}")
        _integer(c, "group_size" if "group_size" in c else "q_group_size", None, "AWQ")
    elif method == "compressed-tensors":
        # compressed-tensors writes "sparsity_config": {} and "transform_config": {} when there is none
        # (ModelCompressor.update_config) and reads {} as None: so does trtcore
        sparsity = c.get("sparsity_config")
        if sparsity:
            sparse_format = sparsity.get("format") if isinstance(sparsity, dict) else sparsity
            if sparse_format != "dense":
                raise _refuse(
                    f"compressed-tensors sparsity_config format {sparse_format!r} (sparse compressors store a linear as "
                    "X.compressed / X.bitmask instead of X.weight; only sparsity_config null, {} or format 'dense' is read)"
                )
        online = _online_transforms(c.get("transform_config"))
        if online:
            raise _refuse(
                f"compressed-tensors transform_config applied at run time at {online} (QuIP / SpinQuant rotations of activations: "
                "trtcore does not apply them, so the weights would be read without their inverse; only transforms merged into the "
                "weights, weight_input / weight_output, are read)"
            )
        config_groups = c.get("config_groups") or {}
        if not isinstance(config_groups, dict) or not all(isinstance(g, dict) for g in config_groups.values()):
            raise _refuse(
                f"compressed-tensors config_groups {config_groups!r} (a preset name's shorthand, e.g. {{'W8A16': ['Linear']}}, "
                "or not an object of groups; trtcore reads groups written out with their 'weights')"
            )
        # the checkpoint's format, or (newer files) each config group's
        groups = list(config_groups.values())
        for where, f in [("quantization_config", c.get("format")), *((f"config group {n!r}", g.get("format")) for n, g in config_groups.items())]:
            if f is not None and not isinstance(f, str):
                raise _refuse(f"compressed-tensors format {f!r} ({where}; a format name, a string, is read)")
        if not weight_args(c):
            # no group quantizes weights: float linears (an FP8 KV cache's kv_cache_scheme alone,
            # merged transforms, dense sparsity), as vLLM's unquantized fallback reads them --
            # unless a quantized format is named or a group quantizes activations, which float
            # weights cannot have been written with
            named = sorted({str(f) for f in [c.get("format"), *(g.get("format") for g in groups)] if f and f != "dense"})
            if named:
                raise _refuse(f"compressed-tensors format {named} with no config group describing its weights")
            quantized = [name for name, g in config_groups.items() if g.get("input_activations") or g.get("output_activations")]
            if quantized:
                raise _refuse(f"compressed-tensors activations quantized without quantized weights (groups {quantized})")
            return
        # "mixed-precision" (compressed-tensors): each group names its own format
        formats = {c["format"]} if c.get("format") and c["format"] != "mixed-precision" else {g.get("format") for g in groups}
        shown = (
            f"'mixed-precision' with config groups in formats {sorted(map(str, formats))} (pack-quantized groups of any bits are read; "
            "float and int groups together are not)"
            if c.get("format") == "mixed-precision"
            else repr(c.get("format") or sorted(map(str, formats)))
        )
        if formats <= {None}:
            raise _refuse(
                "compressed-tensors without a format (neither quantization_config nor its config_groups has 'format'; "
                f"a packed int checkpoint says {FORMATS[0]!r}, an FP8 one {FLOAT_FORMATS[0]!r})"
            )
        if fp8_weight_args(weight_args(c)):  # float weights: FP8 E4M3 when 8 bits (check_compressed_fp8)
            if not formats or not formats <= set(FLOAT_FORMATS):
                bits = sorted({str(a.get("num_bits")) for a in weight_args(c)})
                raise _refuse(f"compressed-tensors format {shown} with {'/'.join(bits)}-bit float weights")
            problem = check_compressed_fp8(c)
            if problem:
                raise _refuse(problem)
            return
        if not formats or not formats <= set(FORMATS):
            raise _refuse(f"compressed-tensors format {shown}")
        for a in weight_args(c):
            for key, value, allowed in (
                ("type", a.get("type", "int"), ("int",)),
                ("num_bits", a.get("num_bits"), (4, 8)),
                ("strategy", a.get("strategy"), STRATEGIES),
            ):
                if value not in allowed:
                    raise _refuse(f"compressed-tensors weights {key}={value!r} (of {a!r}; int weights read: {key} one of {list(allowed)})")
            if a.get("dynamic") not in (None, False):
                raise _refuse(
                    f"compressed-tensors int weights with dynamic={a['dynamic']!r} (of {a!r}; weights quantized at run time: "
                    "stored int weights have static scales, dynamic false)"
                )
        for name, g in (c.get("config_groups") or {}).items():
            if isinstance(g, dict) and g.get("input_activations") is not None:
                raise _refuse(
                    f"compressed-tensors int weights with quantized input_activations {g['input_activations']!r} "
                    f"(group {name!r}; W4A8 / W8A8 activation quantization is not read: int weights are weight-only, input_activations null)"
                )
            if isinstance(g, dict) and g.get("output_activations") is not None:
                raise _refuse(
                    f"compressed-tensors quantized output_activations {g['output_activations']!r} (group {name!r}; "
                    "trtcore reads weight-only int checkpoints: output_activations null)"
                )
    elif method == "fp8":
        problem = check_hf_fp8(c)
        if problem:
            raise _refuse(problem)
    elif method == "gguf":
        types = c.get("ggml_types")
        if not isinstance(types, dict) or any(t not in GGUF_TYPES for t in types.values()):
            raise _refuse(f"GGUF ggml_types {types!r}")


#: compressed-tensors transform locations merged into the stored weights (``TransformLocation``'s
#: offline ones); the others (input, output, k_cache, q_attn) run on activations at run time
_OFFLINE_TRANSFORMS = ("weight_input", "weight_output")


def _online_transforms(transform_config: Any) -> list[str]:
    """The run-time locations of a compressed-tensors ``transform_config`` (``config_groups`` ->
    scheme -> ``apply`` -> ``location``), sorted; [] for none, ``{}`` or only weight locations.
    A config that is not that shape counts as run time (``"?"``): it cannot be shown harmless."""
    if not transform_config:
        return []
    groups = transform_config.get("config_groups") if isinstance(transform_config, dict) else None
    if not isinstance(groups, dict):
        return ["?"]
    found = set()
    for scheme in groups.values():
        applies = scheme.get("apply") if isinstance(scheme, dict) else None
        if not isinstance(applies, list):
            return ["?"]
        for a in applies:
            location = a.get("location") if isinstance(a, dict) else None
            if location not in _OFFLINE_TRANSFORMS:
                found.add(str(location))
    return sorted(found)


#: per method, the files AutoGPTQ / AutoAWQ keep a checkpoint's quantization in, read (as vLLM's
#: ``get_config_filenames``) where config.json has no ``quantization_config``
CONFIG_FILES = {"gptq": ("quantize_config.json",), "awq": ("quant_config.json", "quantize_config.json")}


def _file_method(data: dict[str, Any], method: str) -> str:
    """The method a quantization config file is written for: its ``quant_method``, else
    ``"awq"`` for AutoAWQ's keys (``w_bit`` / ``q_group_size``: vLLM reads AWQ's config from
    ``quantize_config.json`` too), else ``method`` (the file's name's)."""
    if data.get("quant_method"):
        return str(data["quant_method"]).lower()
    return "awq" if "w_bit" in data or "q_group_size" in data else method


def quantization_config_file(model_dir: str | os.PathLike[str], quantization: str | None) -> dict[str, Any] | None:
    """The quantization config of a checkpoint whose config.json has none, from AutoGPTQ's
    ``quantize_config.json`` or AutoAWQ's ``quant_config.json`` (:data:`CONFIG_FILES`), with
    ``quant_method`` set to ``quantization`` where the file has none; None when
    ``quantization`` has no such file (or is not ``"gptq"`` / ``"awq"``).

    As vLLM, the file is read only when ``quantization`` names the method.

    Raises:
        ConfigError: the file is not a JSON object.
        InvalidArgumentError: ``quantization`` is None and such a file exists, or the file is
            written for another method (an AutoAWQ config in ``quantize_config.json`` read as
            ``"gptq"``): the message names the file and the ``quantization`` that reads it.
    """
    for method, names in CONFIG_FILES.items():
        if quantization is not None and quantization != method:
            continue
        for name in names:
            path = Path(model_dir) / name
            if not path.is_file():
                continue
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ConfigError(f"cannot read the quantization config {path}: {e}") from None
            if not isinstance(data, dict):
                raise ConfigError(f"{path} is {type(data).__name__}, expected a JSON object (the {method} quantization config)")
            found = _file_method(data, method)
            if found not in CONFIG_FILES:  # e.g. quant_method "fp8": no quantization= reads it from this file
                raise InvalidArgumentError(
                    f"{path} holds a quant_method {found!r} config; trtcore reads only GPTQ and AWQ configs from "
                    f"{' / '.join(sorted({n for names in CONFIG_FILES.values() for n in names}))}, others from config.json's quantization_config"
                )
            if quantization is not None and found != quantization:
                raise InvalidArgumentError(
                    f"{path} holds a {found} quantization config, not {quantization}; pass quantization={found!r} (--quantization {found}) to read it"
                )
            if quantization is None:
                raise InvalidArgumentError(
                    f"config.json has no quantization_config, but {path} holds a quantization config (quant_method {found!r}); pass quantization={found!r} "
                    f"(--quantization {found}) to read it, as vLLM"
                )
            return {"quant_method": method} | data
    return None


def detect_quantization(quantization_config: dict[str, Any] | None, quantization: str | None = None) -> QuantScheme | None:
    """The checkpoint's quantization scheme, from ``config.json``'s ``quantization_config``.

    Args:
        quantization_config: the config object (``ModelConfig.quantization_config``), or None.
        quantization: what the user asked for (``LLM(quantization=...)``, vLLM's name): None
            to take the config's, else one of :data:`QUANTIZATION_METHODS` (case-insensitive,
            as ``kv_cache_dtype`` and config.json's ``quant_method``).

    Returns:
        None for an unquantized checkpoint (also a compressed-tensors config whose groups
        quantize no weights: an FP8 KV cache's ``kv_cache_scheme`` alone, as llm-compressor
        writes it), else the :class:`QuantScheme`.

    Raises:
        UnsupportedQuantizationError: the config names another method or an unsupported
            variant (the message lists :data:`SUPPORTED_FORMATS`).
        InvalidArgumentError: ``quantization`` is unknown, or differs from the config's
            (also when the checkpoint is not quantized).
    """
    given = quantization
    quantization = quantization.lower() if isinstance(quantization, str) else quantization
    if quantization is not None and quantization not in QUANTIZATION_METHODS:
        raise InvalidArgumentError(f"quantization={given!r} is not supported; expected None or one of {list(QUANTIZATION_METHODS)}")
    if quantization_config is None:
        if quantization == "fp8":
            return QuantScheme("fp8", dict(FP8_ON_THE_FLY))
        if quantization is not None:
            files = " / ".join(CONFIG_FILES.get(quantization, ()))
            raise InvalidArgumentError(
                f"quantization={given!r}, but config.json has no quantization_config{f' and there is no {files}' if files else ''} "
                "(the checkpoint is not quantized)"
            )
        return None
    method = str(quantization_config.get("quant_method") or "").lower()
    if not method and (quantization_config.get("load_in_4bit") or quantization_config.get("load_in_8bit")):
        raise _refuse("bitsandbytes (load_in_4bit / load_in_8bit without quant_method, which transformers reads as bitsandbytes)")
    if not method:
        raise _refuse("a config without quant_method")
    if method not in QUANTIZATION_METHODS:
        raise _refuse(f"quant_method {quantization_config.get('quant_method')!r}")
    if method == "compressed-tensors":  # fields left out mean compressed-tensors' defaults (e.g. dynamic: false)
        quantization_config = with_defaults(quantization_config)
    _check(method, quantization_config)
    float_weights = method == "compressed-tensors" and not weight_args(quantization_config)
    if quantization is not None and quantization != method:
        raise InvalidArgumentError(
            f"quantization={given!r}, but config.json's quantization_config has quant_method {method!r}; leave quantization "
            f"out (it is read from config.json) or pass {method!r}"
            + (" (trtcore quantize writes compressed-tensors for every method)" if method == "compressed-tensors" else "")
        )
    # float linears: no scheme (the builder still reads the config's kv_cache_scheme, and
    # check_unquantized refuses quantized tensors the config does not describe)
    # the config's quant_method as the method (case-insensitive, as detected): the readers compare it
    return None if float_weights else QuantScheme(method, dict(quantization_config) | {"quant_method": method})


def resolve_quantization(model_dir: str | os.PathLike[str], config: Any, quantization: str | None) -> tuple[Any, QuantScheme | None]:
    """The config a model folder builds with under ``quantization`` (``LLM(quantization=...)``,
    ``--quantization``; vLLM's name) and its scheme: where config.json has no
    ``quantization_config``, AutoGPTQ's / AutoAWQ's own file (:func:`quantization_config_file`)
    or, for ``"fp8"`` on a float checkpoint, :data:`FP8_ON_THE_FLY` becomes the config's; else
    the config as it is. What ``LLM`` and ``trtcore build`` build, and what an engine file's
    sidecar is checked against.

    Args:
        model_dir: the model folder.
        config: its :class:`~trtcore.config.ModelConfig` (``load_config``).
        quantization: None (config.json's), or one of :data:`QUANTIZATION_METHODS`.

    Returns:
        ``(config, scheme)``: the config (a copy where it changed) and
        :func:`detect_quantization`'s scheme (None: not quantized).

    Raises:
        the errors of :func:`quantization_config_file` and :func:`detect_quantization`.
    """
    import dataclasses

    quantization = quantization.lower() if isinstance(quantization, str) and quantization else quantization
    if config.quantization_config is None and quantization in (None, *CONFIG_FILES):
        from_file = quantization_config_file(model_dir, quantization)
        if from_file is not None:
            config = dataclasses.replace(config, quantization_config=from_file)
    scheme = detect_quantization(config.quantization_config, quantization)
    if scheme is not None and scheme.on_the_fly:  # the build reads the scheme from the config
        config = dataclasses.replace(config, quantization_config=scheme.config)
    return config, scheme


class QuantizedCheckpoint:
    """A checkpoint whose quantized linears appear as single tensors ``X.weight``.

    Args:
        checkpoint: a :class:`~trtcore.checkpoint.Checkpoint` (``get``, ``in``, iteration).
        scheme: from :func:`detect_quantization`.

    :meth:`get` reads the other tensors through; a quantized ``X.weight`` is read with
    :meth:`quantized` (``get`` refuses it, so that no layer reads it unknowingly).
    """

    def __init__(self, checkpoint: Any, scheme: QuantScheme, packed_modules: Mapping[str, Sequence[str]] | None = None):
        self.checkpoint = checkpoint
        self.scheme = scheme
        self.packed_modules = dict(packed_modules or {})
        self._amax: dict[str, float] = {}
        self.model_dir = getattr(checkpoint, "model_dir", None)
        raw = set(checkpoint)
        if scheme.method == "gguf":
            self._linears = {n[: -len(".weight")] for n in scheme.config["ggml_types"] if n in raw}
            hidden = {f"{p}.weight" for p in self._linears}
        elif scheme.on_the_fly:  # the decoder layers' 2-D weights (norms are 1-D; embeddings and lm_head outside)
            self._linears = {n[: -len(".weight")] for n in raw if n.endswith(".weight") and ".layers." in n and len(checkpoint.shape(n)) == 2}
            hidden = set()
        elif scheme.fp8:  # a linear has a scale; an E4M3 weight without one is read too, so that it is refused, not run as float
            self._linears = {
                n.rsplit(".", 1)[0] for n in raw if n.endswith((".weight_scale", ".weight_scale_inv")) and f"{n.rsplit('.', 1)[0]}.weight" in raw
            }
            dtype_of = getattr(checkpoint, "dtype", None)
            if dtype_of is not None:
                self._linears |= {n[: -len(".weight")] for n in raw if n.endswith(".weight") and dtype_of(n) == E4M3}
            hidden = {p + s for p in self._linears for s in FP8_SUFFIXES if p + s in raw}
        else:
            marker, owned = _TENSORS[scheme.method]
            self._linears = {n[: -len(marker)] for n in raw if n.endswith(marker)}
            hidden = {p + s for p in self._linears for s in owned}
        self._names = sorted((raw - hidden) | {f"{p}.weight" for p in self._linears})
        #: FP8 at load: the linears' weights read quantized (:meth:`quantized`) and those a family
        #: read as float tensors (:meth:`get`)
        self.read_fp8: set[str] = set()
        self.kept_float: set[str] = set()
        #: the quantized linears a build read (:meth:`quantized`; :func:`check_quantized_load`)
        self.read_quantized: set[str] = set()

    @property
    def names(self) -> list[str]:
        """Every tensor name, quantized linears as ``X.weight``, sorted (a new list)."""
        return list(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def is_quantized(self, name: str) -> bool:
        """Whether ``name`` (``X.weight``) is a quantized linear's weight."""
        return name.endswith(".weight") and name[: -len(".weight")] in self._linears

    def quantized(self, name: str) -> QuantizedWeight | Fp8Weight:
        """The quantized linear weight ``name`` (``X.weight``) in canonical form
        (:class:`~trtcore.fp8.Fp8Weight` for FP8 schemes).

        Raises:
            CheckpointError: ``name`` is not a quantized weight, or its tensors are inconsistent.
        """
        if not self.is_quantized(name):
            raise CheckpointError(f"'{name}' is not a quantized weight of {self.model_dir} ({self.scheme.method})")
        self.read_quantized.add(name)
        prefix = name[: -len(".weight")]
        c = self.scheme.config
        if self.scheme.on_the_fly:  # one scale per packed module (vLLM quantizes the fused qkv_proj / gate_up_proj weight)
            self.read_fp8.add(name)
            amax = max(self._amax_of(n) for n in packed_siblings(name, self.packed_modules) if self.is_quantized(n))
            return quantize_weight(self.checkpoint.get(name, copy=False), "tensor", amax=amax)
        if self.scheme.fp8:
            return read_fp8(
                self.checkpoint,
                prefix,
                self.scheme.method == "compressed-tensors" and compressed_per_token(c),
                static_activations(c),
                inverse_scales(c),
            )
        if self.scheme.method == "gguf":
            raw = self.checkpoint.get(name, copy=False)
            per_block, nbytes = BLOCKS[c["ggml_types"][name]]
            return gguf_weight(np.asarray(raw), c["ggml_types"][name], raw.shape[1] // nbytes * per_block, name)
        read: Callable[[Any, str, dict[str, Any]], QuantizedWeight] = {
            "gptq": read_gptq,
            "awq": read_awq,
            "compressed-tensors": read_pack_quantized,
        }[self.scheme.method]
        return read(self.checkpoint, prefix, c)

    def _amax_of(self, name: str) -> float:
        if name not in self._amax:
            self._amax[name] = float(np.abs(np.asarray(self.checkpoint.get(name, copy=False), np.float64)).max(initial=0.0))
        return self._amax[name]

    def get(self, name: str, shape: Sequence[int] | None = None, dtype: Any = None, *, copy: bool = True) -> np.ndarray:
        """A tensor that is not a quantized weight (see :meth:`trtcore.checkpoint.Checkpoint.get`).

        With ``quantization="fp8"`` on a float checkpoint (quantized at load), a linear's weight
        read here -- by a family that reads it as a float tensor (fused projections it splits
        itself, MoE router gates and experts) -- is that float tensor: the linear stays in the
        model dtype (:func:`check_fp8_at_load` then reports it).

        Raises:
            CheckpointError: ``name`` is a quantized weight (:meth:`quantized` reads it); the
                message is for a family that reads it as a float tensor (MoE experts and routers,
                GPT-NeoX's fused query_key_value): trtcore runs quantized weights only where a
                model's linears are read as linears.
        """
        if self.is_quantized(name):
            if not self.scheme.on_the_fly:
                raise CheckpointError(
                    f"'{name}' is {self.scheme.method}-quantized in {self.model_dir}, but trtcore reads this weight as a float tensor: "
                    "quantized weights run only where a model's linears are read as linears (attention and dense MLP projections, "
                    "lm_head), not MoE experts or routers nor fused projections a family splits itself (GPT-NeoX query_key_value); "
                    "keep those layers unquantized (GPTQ / AWQ modules_to_not_convert, compressed-tensors ignore) or load the float checkpoint"
                )
            self.kept_float.add(name)
        return self.checkpoint.get(name, shape=shape, dtype=dtype, copy=copy)

    def close(self) -> None:
        """Close the underlying checkpoint."""
        self.checkpoint.close()


#: the ``kv_cache_scheme`` (compressed-tensors ``QuantizationArgs``, llm-compressor's FP8 KV cache)
#: trtcore's FP8 KV cache reads: 8-bit floats, one static scale per layer for keys and for
#: values; a missing key takes compressed-tensors' default (``type`` "int", ``strategy`` None:
#: per tensor, ``dynamic`` False)
KV_CACHE_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}


def check_kv_cache_scheme(quantization_config: dict[str, Any] | None) -> None:
    """Refuse a checkpoint's ``kv_cache_scheme`` other than :data:`KV_CACHE_SCHEME` for an FP8
    KV cache (``kv_cache_dtype="fp8"``): its scales would be read as what they are not. The
    string ``"static"`` (AutoFP8's ``save_quantized_model``: one static scale per layer for the
    k_proj / v_proj outputs, which vLLM reads as the KV cache's) is that scheme.

    Raises:
        UnsupportedQuantizationError: naming the first field that differs, with its value and
            the one read.
    """
    scheme = (quantization_config or {}).get("kv_cache_scheme")
    if scheme is None or scheme == "static":  # "static": AutoFP8's per-tensor static FP8 scales (k_proj / v_proj output_scale)
        return
    if not isinstance(scheme, dict):
        raise UnsupportedQuantizationError(
            f"quantization_config kv_cache_scheme {scheme!r}: expected an object (compressed-tensors QuantizationArgs) or "
            "'static' (AutoFP8's per-tensor FP8 scales)"
        )
    defaults = {"num_bits": 8, "type": "int", "strategy": None, "dynamic": False}
    for key, want in KV_CACHE_SCHEME.items():
        got = scheme.get(key, defaults[key])
        if got != want and not (key == "strategy" and got is None):
            raise UnsupportedQuantizationError(
                f"quantization_config kv_cache_scheme {key}={got!r} is not supported: trtcore's FP8 KV cache (kv_cache_dtype='fp8') "
                f"reads {KV_CACHE_SCHEME} (E4M3 codes, one static k_scale / v_scale per layer); run with kv_cache_dtype='auto'"
            )


#: tensor suffixes only a quantized linear has (the packed codes of GPTQ / AWQ and of
#: compressed-tensors ``pack-quantized``): a checkpoint declaring no quantization that holds one
#: lost its ``quantization_config``
_PACKED_SUFFIXES = {".qweight": "GPTQ or AWQ (qweight)", ".weight_packed": "compressed-tensors pack-quantized (weight_packed)"}


def check_unquantized(report: Any, quantization_config: dict[str, Any] | None = None) -> None:
    """After a network build (before its missing tensors are reported) from a checkpoint whose
    config declares no quantized weights (no ``quantization_config``, no ``quantization=``, or
    a compressed-tensors one whose groups quantize no weights): refuse one whose linears the
    build needed are stored quantized all the same -- a missing ``X.weight`` whose packed codes
    ``X.qweight`` / ``X.weight_packed`` are there, or a read ``X.weight`` of a float8 or integer
    dtype --, as a ``config.json`` that lost its ``quantization_config`` gives: the float path
    would report the packed linears missing (all of them), or read E4M3 / int8 codes as if they
    were the weights (garbage text, no error). Tensors the build does not need are not looked at.

    Args:
        report: the build's :class:`trtcore.checkpoint.LoadReport` (``checkpoint``, ``missing``, ``used``).
        quantization_config: the config's, for the message (None: config.json has none).

    Raises:
        UnsupportedQuantizationError: naming a quantized tensor, what it is, and the fix.
    """
    weights = report.checkpoint
    if isinstance(weights, QuantizedCheckpoint):
        return
    found: tuple[str, str] | None = None
    for name in report.missing:
        prefix = name.removesuffix(".weight")
        hit = next(
            ((prefix + suffix, what) for suffix, what in _PACKED_SUFFIXES.items() if name.endswith(".weight") and prefix + suffix in weights), None
        )
        if hit is not None:
            found = hit
            break
    dtype_of = getattr(weights, "dtype", None)
    if found is None and callable(dtype_of):  # a Checkpoint's per-tensor dtype (synthetic weights hold one dtype attribute)
        for name in sorted(report.used):
            if name.endswith(".weight") and name in weights:
                dt = np.dtype(dtype_of(name))
                if dt.name.startswith("float8") or dt.kind in "iu":
                    found = (name, f"{'FP8' if dt.name.startswith('float8') else 'integer'} ({dt.name} weights)")
                    break
    if found is not None:
        name, kind = found
        where = getattr(weights, "model_dir", None) or "the checkpoint"
        declared = (
            "its config.json's quantization_config describes no quantized weights"
            if quantization_config
            else "its config.json has no quantization_config"
        )
        modelopt = isinstance(where, (str, os.PathLike)) and (Path(where) / "hf_quant_config.json").is_file()
        fix = (
            # ModelOpt's exports before transformers read them keep the format in hf_quant_config.json
            # (vllm-project/vllm#22073): nothing to restore into config.json, and not a format read here
            f"its hf_quant_config.json says it is an NVIDIA ModelOpt export, which trtcore does not read; supported formats: {SUPPORTED_FORMATS}"
            if modelopt
            else "restore the quantization_config the quantizer wrote (or, for an AutoGPTQ / AutoAWQ folder with quantize_config.json / "
            "quant_config.json, pass quantization='gptq' / 'awq', --quantization on the command line)"
        )
        raise UnsupportedQuantizationError(
            f"{where} holds quantized linears ({kind}: e.g. {name!r}) but {declared}, so they cannot be read as the float weights "
            f"the network takes; {fix}"
        )


def check_quantized_load(weights: Any, architecture: str) -> None:
    """After a network build from a checkpoint whose config declares a quantized format
    (GPTQ, AWQ, compressed-tensors, GGUF, FP8): refuse one none of whose linears the build read
    quantized -- the declared format is then not what the tensors are (a quantization_config
    copied over a float checkpoint, a stray quantize_config.json read with
    ``quantization='gptq'``), and the model would silently run in float. FP8 at load:
    :func:`check_fp8_at_load`.

    Raises:
        UnsupportedQuantizationError: no linear of ``architecture`` was read quantized.
    """
    if not isinstance(weights, QuantizedCheckpoint) or weights.scheme.on_the_fly:
        check_fp8_at_load(weights, architecture)
        return
    if not weights.read_quantized:
        scheme = weights.scheme
        marker = (
            "*.weight_scale" if scheme.fp8 else "the GGUF blocks its ggml_types name" if scheme.method == "gguf" else f"*{_TENSORS[scheme.method][0]}"
        )
        raise UnsupportedQuantizationError(
            f"{weights.model_dir or 'the checkpoint'} declares {scheme.method} quantization, but no linear of {architecture} is stored "
            f"quantized there (no {marker}): its quantization_config does not describe these weights; remove it to run them as float, "
            "or load the quantized checkpoint"
        )


def check_fp8_at_load(weights: Any, architecture: str) -> None:
    """After a network build from ``weights``: with ``quantization="fp8"`` on a float checkpoint,
    refuse a model none of whose linears the family read quantized (it reads them all as float
    tensors: FP8 would be silently ignored), and warn once, with the counts, where some stayed
    in the model dtype. Nothing for other checkpoints.

    Raises:
        UnsupportedQuantizationError: no linear of ``architecture`` was quantized.
    """
    if not isinstance(weights, QuantizedCheckpoint) or not weights.scheme.on_the_fly:
        return
    kept = sorted(weights.kept_float - weights.read_fp8)
    if not weights.read_fp8:
        raise UnsupportedQuantizationError(
            f"quantization='fp8' (FP8 at load) quantizes no linear of {architecture}: its network reads every linear as a float "
            f"tensor (e.g. {kept[0] if kept else 'none read'}); load it without quantization"
        )
    if kept:
        _log.warning(
            f"quantization='fp8': {len(kept)} of {len(kept) + len(weights.read_fp8)} linears of {architecture} stay in the model dtype "
            f"(its network reads them as float tensors: fused projections it splits, MoE router gates and experts), e.g. {kept[0]}"
        )


def quantized_weights(
    weights: Any,
    quantization_config: dict[str, Any] | None,
    quantization: str | None = None,
    packed_modules: Mapping[str, Sequence[str]] | None = None,
) -> Any:
    """``weights`` as a :class:`QuantizedCheckpoint` when the config says it is quantized
    (unchanged otherwise, or when it already is one); ``packed_modules``: the family's
    (vLLM's ``packed_modules_mapping``), whose linears FP8 at load gives one scale.

    Raises:
        UnsupportedQuantizationError / InvalidArgumentError: see :func:`detect_quantization`.
    """
    scheme = detect_quantization(quantization_config, quantization)
    if scheme is None or isinstance(weights, QuantizedCheckpoint):
        return weights
    reset_warnings()  # each checkpoint's config / tensor disagreements are warned about once
    return QuantizedCheckpoint(weights, scheme, packed_modules)


def packed_siblings(name: str, packed_modules: Mapping[str, Sequence[str]]) -> list[str]:
    """The weights packed with the linear weight ``name`` (``PARENT.X.weight``, or the module
    ``PARENT.X`` itself: the result then names modules) into one module (``packed_modules``,
    vLLM's ``packed_modules_mapping``: fused module -> the modules it packs, e.g. ``qkv_proj``
    -> ``q_proj, k_proj, v_proj``), ``name`` among them, in the mapping's order; ``[name]``
    when ``X`` is in none.

    Example: ``model.layers.0.self_attn.k_proj.weight`` -> the q/k/v weights of that layer.
    """
    suffix = ".weight" if name.endswith(".weight") else ""
    parent, _, leaf = name.removesuffix(suffix).rpartition(".")
    for parts in packed_modules.values():
        if leaf in parts:
            return [f"{parent}.{m}{suffix}" if parent else f"{m}{suffix}" for m in parts]
    return [name]


def dequantize_for_network(weight: QuantizedWeight | Fp8Weight) -> np.ndarray:
    """THE HOOK the weight-only GEMM plugin path replaces: a QuantizedWeight as the float
    weight the ops take today (``float32 [N, K]``, input features in their own order; the
    ops convert it to the engine dtype)."""
    return weight.dequantize().astype(np.float32)


def linear_weight(weights: Any, name: str, shape: tuple[int, int], *, quantized: bool = True, lazy: bool = False) -> Any:
    """A linear layer's ``[N, K]`` weight ``name`` for the network: a quantized weight
    (``weights.quantized``, e.g. :meth:`trtcore.checkpoint.LoadReport.quantized`) as its
    :class:`~trtcore.quantization.QuantizedWeight` or :class:`~trtcore.fp8.Fp8Weight`
    (``quantized=False``: dequantized, :func:`dequantize_for_network`), others read as they
    are (``lazy=True``: unread, a
    :class:`~trtcore.checkpoint.LazyTensor` from ``weights.lazy`` where it has one, so that a
    tensor-parallel rank reads only its slice).

    Raises:
        MissingTensorError / TensorShapeError: see the checkpoint's ``get``.
    """
    find = getattr(weights, "quantized", None)
    q = find(name) if find is not None else None
    if q is None:
        return (getattr(weights, "lazy", weights.get) if lazy else weights.get)(name, shape=shape)
    if q.shape != tuple(shape):
        raise TensorShapeError(f"quantized weight '{name}' has shape {q.shape}, expected {tuple(shape)}")
    return q if quantized else dequantize_for_network(q)


__all__ = [
    "CONFIG_FILES",
    "FP8_ON_THE_FLY",
    "QUANTIZATION_METHODS",
    "SUPPORTED_FORMATS",
    "QuantScheme",
    "QuantizedCheckpoint",
    "check_fp8_at_load",
    "dequantize_for_network",
    "detect_quantization",
    "linear_weight",
    "packed_siblings",
    "quantization_config_file",
    "quantized_weights",
]
