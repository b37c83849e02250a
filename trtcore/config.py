"""``config.json`` / ``generation_config.json`` -> typed, frozen configs.

Field names are Hugging Face's (``hidden_size``, ``num_key_value_heads``, ``rope_theta``,
``rope_scaling``, ...). Defaults for fields a ``config.json`` leaves out are the per-model
defaults of ``transformers`` (``LlamaConfig``, ``MistralConfig``, ``Qwen2Config``,
``Qwen3Config``); they are the same in transformers v4 (4.5x) and v5. Both on-disk dialects
are read:

* v4: ``rope_theta`` at top level plus ``rope_scaling`` (with ``"type"`` or
  ``"rope_type"``), ``torch_dtype``;
* v5: ``rope_parameters`` (carrying ``rope_theta`` and optionally
  ``partial_rotary_factor``; possibly nested per layer type, e.g.
  ``{"full_attention": {...}, "sliding_attention": {...}}``), ``dtype``.

Where the Hugging Face *modeling* code ignores a config field, the derived fields here
follow the modeling code: e.g. Qwen2's q/k/v projections always have a bias and its o_proj
never does (``qkv_bias`` / ``o_bias``), Mistral's attention and MLP never have biases.

Public API: :class:`ModelConfig` (``from_dict``, ``to_dict``), :func:`load_config`,
:class:`GenerationConfig`, :func:`load_generation_config`, :func:`register_model_type`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtcore.errors import ConfigError, UnsupportedArchitectureError
from trtcore.families import MODEL_FAMILIES, ModelFamily, register_model_type
from trtcore.rope import ROPE_TYPES

__all__ = [
    "ModelConfig",
    "GenerationConfig",
    "ModelFamily",
    "load_config",
    "load_generation_config",
    "register_model_type",
    "MODEL_FAMILIES",
    "ROPE_TYPES",
]

CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"


# RoPE types for which transformers v5 fills ``original_max_position_embeddings`` from
# ``max_position_embeddings`` when absent (``standardize_rope_params``).
_ROPE_TYPES_WITH_ORIGINAL_MAX = ("llama3", "yarn", "longrope")

LAYER_TYPES = ("full_attention", "sliding_attention")

# Fields that must be present in config.json: Hugging Face has defaults for them (a 7B
# model's), but a checkpoint whose config omits them is broken, and silently building a
# 4096-wide network for it would only fail later with a confusing shape error.
REQUIRED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)


# ---------------------------------------------------------------------------------------
# small validators; each raises ConfigError naming the field, the value and the expectation


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive_int(name: str, v: Any) -> int:
    if not _is_int(v) or v <= 0:
        raise ConfigError(f"field '{name}' is {v!r}, expected a positive integer")
    return v


def _optional_int(name: str, v: Any) -> int | None:
    if v is None:
        return None
    if not _is_int(v):
        raise ConfigError(f"field '{name}' is {v!r}, expected an integer or null")
    return v


def _optional_object(name: str, v: Any) -> dict[str, Any] | None:
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise ConfigError(f"field '{name}' is {v!r}, expected a JSON object or null")
    return dict(v)


def _flattened(q: dict[str, Any] | None) -> dict[str, Any] | None:
    """A quantization config in compressed-tensors' early nested layout -- ``{"quantization_config":
    {...}, "sparsity_config": {...}}`` -- as the flat object every later checkpoint stores: the
    inner object with the outer ``sparsity_config`` (and the outer ``quant_method`` where the inner
    has none), as transformers' ``CompressedTensorsConfig.from_dict`` unwraps it. Anything else as
    it is."""
    inner = q.get("quantization_config") if q is not None else None
    if q is None or not isinstance(inner, Mapping):
        return q
    flat = dict(inner)
    if "quant_method" not in flat and "quant_method" in q:
        flat["quant_method"] = q["quant_method"]
    if q.get("sparsity_config") is not None:
        flat["sparsity_config"] = q["sparsity_config"]
    return flat


def _positive_float(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f"field '{name}' is {v!r}, expected a positive number")
    return float(v)


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"field '{name}' is {v!r}, expected true or false")
    return v


def _token_ids(name: str, v: Any) -> tuple[int, ...]:
    """``int | list[int] | None`` (Hugging Face's ``eos_token_id``) -> ``tuple[int, ...]``."""
    if v is None:
        return ()
    if _is_int(v):
        return (v,)
    if isinstance(v, (list, tuple)) and all(_is_int(x) for x in v):
        return tuple(v)
    raise ConfigError(f"field '{name}' is {v!r}, expected an integer, a list of integers or null")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    """Read a JSON object from ``path``; ConfigError naming the file on any failure."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {what} {path}: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top level, got {type(data).__name__}")
    return data


# ---------------------------------------------------------------------------------------
# RoPE


def _parse_rope(d: Mapping[str, Any], defaults: Mapping[str, Any], max_position_embeddings: int):
    """Return ``(rope_theta, rope_scaling, partial_rotary_factor)`` from either dialect.

    Precedence (as in transformers v5 ``convert_rope_params_to_dict``): v4 ``rope_scaling``
    if set, else v5 ``rope_parameters``; inside it, its own ``rope_theta`` /
    ``partial_rotary_factor`` win over top-level ones, which win over the defaults.
    """
    params: Any = d.get("rope_scaling")
    key = "rope_scaling"
    if params is None:
        params = d.get("rope_parameters")
        key = "rope_parameters"
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ConfigError(f"field '{key}' is {params!r}, expected an object or null")
    if any(isinstance(v, dict) for v in params.values()):  # nested per layer type (v5)
        if not isinstance(params.get("full_attention"), dict):
            raise ConfigError(
                f"field '{key}' is nested per layer type ({sorted(params)}) but has no "
                f"'full_attention' entry; expected {{'full_attention': {{...}}, ...}}"
            )
        params = params["full_attention"]
    p = dict(params)
    type_alias = p.pop("type", None)
    rope_type = p.pop("rope_type", None) or type_alias or "default"
    theta = p.pop("rope_theta", None)
    if theta is None:
        theta = d.get("rope_theta")
    if theta is None:
        theta = defaults["rope_theta"]
    theta = _positive_float("rope_theta", theta)
    prf = p.pop("partial_rotary_factor", None)
    if prf is None:
        prf = d.get("partial_rotary_factor")
    if prf is None:
        prf = 1.0
    prf = _positive_float("partial_rotary_factor", prf)
    if prf > 1.0:
        raise ConfigError(f"field 'partial_rotary_factor' is {prf!r}, expected a number in (0, 1]")
    if rope_type == "default":
        return theta, None, prf
    if rope_type not in ROPE_TYPES:
        raise ConfigError(f"field '{key}' has rope_type {rope_type!r}, expected one of {['default', *ROPE_TYPES]}")
    if rope_type in _ROPE_TYPES_WITH_ORIGINAL_MAX:
        # v5 standardize_rope_params: a top-level original_max_position_embeddings (Phi-3
        # style) wins; otherwise it defaults to max_position_embeddings.
        if d.get("original_max_position_embeddings") is not None:
            p["original_max_position_embeddings"] = d["original_max_position_embeddings"]
        p.setdefault("original_max_position_embeddings", max_position_embeddings)
    missing = [k for k in ROPE_TYPES[rope_type] if p.get(k) is None]
    if missing:
        raise ConfigError(f"field '{key}' with rope_type {rope_type!r} lacks {missing}; got {dict(params)!r}")
    if rope_type == "yarn" and p.get("attn_factor") is not None and p.get("attention_factor") is None:
        # DeepSeek-R1-0528-Qwen3-8B's spelling: transformers ignores it (keeping 0.1 ln(factor) + 1),
        # vLLM multiplies that factor by it; the two disagree, so the config must say which it means
        raise ConfigError(
            f"field '{key}' has 'attn_factor' ({p['attn_factor']!r}), which transformers ignores and vLLM "
            f"multiplies the YaRN attention factor by; expected 'attention_factor' (the factor itself: "
            f"{(0.1 * math.log(float(p['factor'])) + 1) * float(p['attn_factor'])!r} as vLLM reads it) or no 'attn_factor'"
        )
    return theta, {"rope_type": rope_type, **p}, prf


# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A decoder-only model's ``config.json``, typed, validated, immutable.

    Build it with :meth:`from_dict` or :func:`load_config`; constructing it directly
    validates too. All sizes are Python ``int``; field names and meanings are Hugging
    Face's (``transformers.LlamaConfig`` & co.).

    Attributes:
        architectures: ``config.architectures``, e.g. ``("LlamaForCausalLM",)``.
        model_type: ``"llama"``, ``"mistral"``, ``"qwen2"``, ``"qwen3"`` (or registered).
        vocab_size, hidden_size, intermediate_size, num_hidden_layers,
        num_attention_heads, num_key_value_heads, head_dim, max_position_embeddings:
            positive ints. ``head_dim`` is explicit when config.json has a non-null
            value, else ``hidden_size // num_attention_heads`` (Qwen3: default 128).
        rms_norm_eps: RMSNorm epsilon.
        rope_theta: RoPE base.
        rope_scaling: ``None`` for plain RoPE, else a normalized dict that always has
            ``"rope_type"`` (one of :data:`ROPE_TYPES`) and never ``"type"``,
            ``"rope_theta"`` or ``"partial_rotary_factor"`` (those are separate fields);
            for llama3/yarn/longrope ``original_max_position_embeddings`` is filled in.
        partial_rotary_factor: fraction of ``head_dim`` that is rotated, in (0, 1].
        tie_word_embeddings: ``lm_head.weight`` is ``model.embed_tokens.weight``.
        attention_bias: the raw config value (default False).
        qkv_bias, o_bias: whether q/k/v and o projections have a bias *in the Hugging
            Face modeling code* (Llama/Qwen3: ``attention_bias``; Qwen2: True/False;
            Mistral: False/False). Model builders use these, not ``attention_bias``.
        mlp_bias: whether gate/up/down have a bias (only Llama reads it from the config).
        hidden_act: activation of the gated MLP, e.g. ``"silu"``.
        sliding_window: the effective attention window (Mistral: ``sliding_window``;
            Qwen2/Qwen3: only when ``use_sliding_window`` and at least one layer is a
            sliding layer), else ``None``.
        layer_types: per layer ``"full_attention"`` or ``"sliding_attention"`` (Hugging
            Face v5's ``layer_types``), length ``num_hidden_layers``; all
            ``"full_attention"`` when ``sliding_window`` is None.
        dtype: the checkpoint's dtype name (v5 ``dtype`` / v4 ``torch_dtype``), e.g.
            ``"bfloat16"``, or None.
        bos_token_id, pad_token_id: int or None.
        eos_token_id: tuple of ints (config.json may hold an int or a list), maybe empty.
        quantization_config: config.json's ``quantization_config`` object as stored
            (GPTQ / AWQ / compressed-tensors / GGUF), or None; interpreted by
            :func:`trtcore.quant_formats.detect_quantization`. Where config.json has no
            ``quantization_config``, its ``compression_config`` (compressed-tensors checkpoints
            saved in 2024).
        family_fields: the fields only this family reads
            (:attr:`trtcore.families.ModelFamily.family_fields`, e.g. GPT-NeoX's
            ``use_parallel_residual``), their transformers defaults filled in.

    Raises:
        ConfigError: on construction, when a field has the wrong type or value (the
            message names the field, its value and what was expected).
    """

    architectures: tuple[str, ...]
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None = None
    partial_rotary_factor: float = 1.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = field(default=())
    dtype: str | None = None
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    quantization_config: dict[str, Any] | None = field(default=None, compare=False)
    family_fields: dict[str, Any] = field(default_factory=dict)

    # -- validation ---------------------------------------------------------------------

    def __post_init__(self) -> None:
        if not self.layer_types:
            kind = "full_attention" if self.sliding_window is None else "sliding_attention"
            object.__setattr__(self, "layer_types", (kind,) * _positive_int("num_hidden_layers", self.num_hidden_layers))
        for name in ("architectures", "layer_types", "eos_token_id"):
            v = getattr(self, name)
            if isinstance(v, list):
                object.__setattr__(self, name, tuple(v))
        if self.rope_scaling is not None:
            object.__setattr__(self, "rope_scaling", dict(self.rope_scaling))
        self._validate()

    def _validate(self) -> None:
        if not isinstance(self.architectures, tuple) or not self.architectures or not all(isinstance(a, str) and a for a in self.architectures):
            raise ConfigError(
                f"field 'architectures' is {self.architectures!r}, expected a non-empty list of class names such as ['LlamaForCausalLM']"
            )
        if not isinstance(self.model_type, str) or not self.model_type:
            raise ConfigError(f"field 'model_type' is {self.model_type!r}, expected a non-empty string")
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            _positive_int(name, getattr(self, name))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"field 'num_key_value_heads' is {self.num_key_value_heads}, expected a divisor "
                f"of num_attention_heads ({self.num_attention_heads}) for grouped-query attention"
            )
        _positive_float("rms_norm_eps", self.rms_norm_eps)
        _positive_float("rope_theta", self.rope_theta)
        prf = _positive_float("partial_rotary_factor", self.partial_rotary_factor)
        if prf > 1.0:
            raise ConfigError(f"field 'partial_rotary_factor' is {prf!r}, expected a number in (0, 1]")
        if self.rope_scaling is not None:
            rs = self.rope_scaling
            rt = rs.get("rope_type")
            if rt not in ROPE_TYPES:
                raise ConfigError(f"field 'rope_scaling' is {rs!r}, expected None or a dict whose 'rope_type' is one of {list(ROPE_TYPES)}")
            missing = [k for k in ROPE_TYPES[rt] if rs.get(k) is None]
            if missing:
                raise ConfigError(f"field 'rope_scaling' with rope_type {rt!r} lacks {missing}; got {rs!r}")
        for name in ("tie_word_embeddings", "attention_bias", "qkv_bias", "o_bias", "mlp_bias"):
            _bool(name, getattr(self, name))
        if not isinstance(self.hidden_act, str) or not self.hidden_act:
            raise ConfigError(f"field 'hidden_act' is {self.hidden_act!r}, expected a string such as 'silu'")
        if self.sliding_window is not None:
            _positive_int("sliding_window", self.sliding_window)
        if len(self.layer_types) != self.num_hidden_layers or not all(t in LAYER_TYPES for t in self.layer_types):
            raise ConfigError(
                f"field 'layer_types' is {list(self.layer_types)!r}, expected "
                f"num_hidden_layers ({self.num_hidden_layers}) entries from {list(LAYER_TYPES)}"
            )
        if self.sliding_window is None and "sliding_attention" in self.layer_types:
            raise ConfigError("field 'layer_types' has 'sliding_attention' layers but sliding_window is None")
        if self.dtype is not None and not isinstance(self.dtype, str):
            raise ConfigError(f"field 'dtype' is {self.dtype!r}, expected a string such as 'bfloat16'")
        _optional_int("bos_token_id", self.bos_token_id)
        _optional_int("pad_token_id", self.pad_token_id)
        _token_ids("eos_token_id", self.eos_token_id)

    def __hash__(self) -> int:  # rope_scaling is a dict; hash a canonical form
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    # -- derived --------------------------------------------------------------------------

    @property
    def architecture(self) -> str:
        """``architectures[0]``, e.g. ``"LlamaForCausalLM"``."""
        return self.architectures[0]

    @property
    def num_kv_groups(self) -> int:
        """Query heads per KV head: ``num_attention_heads // num_key_value_heads`` (GQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def rotary_dim(self) -> int:
        """Rotated channels per head: ``int(head_dim * partial_rotary_factor)`` (as in HF)."""
        return int(self.head_dim * self.partial_rotary_factor)

    # -- (de)serialization ----------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "config.json") -> ModelConfig:
        """Parse a Hugging Face ``config.json`` dict (v4 or v5 dialect).

        Args:
            d: the JSON object.
            source: how to name the origin in error messages (load_config passes the path).

        Returns:
            a validated :class:`ModelConfig`; absent optional fields take the Hugging Face
            defaults of the config class for ``model_type`` (see :data:`MODEL_FAMILIES`).

        Raises:
            ConfigError: a required field (:data:`REQUIRED_FIELDS`, and ``model_type`` when
                it cannot be inferred from ``architectures``) is missing, or a field has a
                bad type/value; the message starts with ``source`` and names the field.
            UnsupportedArchitectureError: ``model_type`` is not in :data:`MODEL_FAMILIES`.
        """
        try:
            return cls._from_dict(d)
        except ConfigError as e:
            raise type(e)(f"{source}: {e}") from None

    @classmethod
    def _from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        if not isinstance(d, Mapping):
            raise ConfigError(f"expected a JSON object, got {type(d).__name__}")
        archs = d.get("architectures")
        if archs is not None and (not isinstance(archs, (list, tuple)) or not all(isinstance(a, str) for a in archs)):
            raise ConfigError(f"field 'architectures' is {archs!r}, expected a list of strings")
        model_type = d.get("model_type")
        if model_type is None:
            by_arch = {f.architecture: f.model_type for f in MODEL_FAMILIES.values()}
            model_type = next((by_arch[a] for a in archs or () if a in by_arch), None)
            if model_type is None:
                raise ConfigError(
                    "missing required field 'model_type' (and 'architectures' "
                    f"{archs!r} does not name a known class); expected one of {sorted(MODEL_FAMILIES)}"
                )
        if not isinstance(model_type, str):
            raise ConfigError(f"field 'model_type' is {model_type!r}, expected a string")
        family = MODEL_FAMILIES.get(model_type)
        if family is None:
            archs = sorted(f.architecture for f in MODEL_FAMILIES.values())
            raise UnsupportedArchitectureError(
                f"model_type {model_type!r} (architectures {list(d.get('architectures') or [])}) is not supported; "
                f"supported model types: {sorted(MODEL_FAMILIES)}; architectures: {', '.join(archs)}"
            )
        if family.prepare_config is not None:  # the family's own dialect onto the common names
            d = family.prepare_config(d)
        defaults = family.defaults
        for name in REQUIRED_FIELDS:
            if d.get(name) is None:
                raise ConfigError(f"missing required field '{name}' (model_type {model_type!r})")

        def get(name: str) -> Any:
            v = d.get(name)
            return defaults[name] if v is None else v

        hidden_size = _positive_int("hidden_size", d["hidden_size"])
        num_heads = _positive_int("num_attention_heads", d["num_attention_heads"])
        num_layers = _positive_int("num_hidden_layers", d["num_hidden_layers"])
        # num_key_value_heads: absent -> family default; null -> num_attention_heads
        # (v4 "for backward compatibility" / v5 __post_init__).
        if "num_key_value_heads" in d:
            num_kv = d["num_key_value_heads"]
        else:
            num_kv = defaults["num_key_value_heads"]
        if num_kv is None:
            num_kv = num_heads
        # head_dim: an explicit non-null value wins; null -> hidden_size // heads;
        # absent -> family default (Qwen3: 128) or hidden_size // heads.
        head_dim = d["head_dim"] if "head_dim" in d else defaults["head_dim"]
        if head_dim is None:
            if hidden_size % num_heads:
                raise ConfigError(
                    f"field 'hidden_size' is {hidden_size}, expected a multiple of num_attention_heads ({num_heads}) since 'head_dim' is not given"
                )
            head_dim = hidden_size // num_heads
        max_pos = _positive_int("max_position_embeddings", get("max_position_embeddings"))
        rope_theta, rope_scaling, prf = _parse_rope(d, defaults, max_pos)

        attention_bias = _bool("attention_bias", get("attention_bias"))
        mlp_bias = _bool("mlp_bias", get("mlp_bias")) if family.mlp_bias is None else family.mlp_bias
        qkv_bias = attention_bias if family.qkv_bias is None else family.qkv_bias
        o_bias = attention_bias if family.o_bias is None else family.o_bias

        # sliding window, the effective one (see ModelFamily.sliding_window_rule)
        sliding_window: int | None = None
        layer_types: tuple[str, ...]
        if family.sliding_window_rule == "always":
            sliding_window = d["sliding_window"] if "sliding_window" in d else defaults["sliding_window"]
            kind = "full_attention" if sliding_window is None else "sliding_attention"
            layer_types = (kind,) * num_layers
        elif family.sliding_window_rule == "use_sliding_window" and _bool("use_sliding_window", get("use_sliding_window")):
            # an explicit null disables the window, as in HF (field stays None)
            sliding_window = d["sliding_window"] if "sliding_window" in d else defaults["sliding_window"]
            lt = d.get("layer_types")
            if lt is None:
                mwl = get("max_window_layers")
                if not _is_int(mwl):
                    raise ConfigError(f"field 'max_window_layers' is {mwl!r}, expected an integer")
                lt = ["sliding_attention" if i >= mwl else "full_attention" for i in range(num_layers)]
            if not isinstance(lt, (list, tuple)):
                raise ConfigError(f"field 'layer_types' is {lt!r}, expected a list")
            layer_types = tuple(lt)
            if "sliding_attention" not in layer_types:
                sliding_window = None  # no layer slides: the window has no effect
        elif family.sliding_window_rule == "layer_types":
            # the window applies on the layers config.layer_types marks (the family's
            # prepare_config fills the list its config class derives when it is absent)
            sliding_window = d["sliding_window"] if "sliding_window" in d else defaults["sliding_window"]
            lt = d.get("layer_types")
            if not isinstance(lt, (list, tuple)):
                raise ConfigError(f"field 'layer_types' is {lt!r}, expected a list")
            layer_types = tuple(lt)
            if "sliding_attention" not in layer_types:
                sliding_window = None
        else:
            layer_types = ("full_attention",) * num_layers
        if sliding_window is None:
            layer_types = ("full_attention",) * num_layers

        dtype = d.get("dtype")
        if dtype is None:
            dtype = d.get("torch_dtype")

        return cls(
            architectures=tuple(archs) if archs else (family.architecture,),
            model_type=model_type,
            vocab_size=d["vocab_size"],
            hidden_size=hidden_size,
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv,
            head_dim=head_dim,
            max_position_embeddings=max_pos,
            rms_norm_eps=_positive_float("rms_norm_eps", get("rms_norm_eps")),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            partial_rotary_factor=prf,
            tie_word_embeddings=_bool("tie_word_embeddings", get("tie_word_embeddings")),
            attention_bias=attention_bias,
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=mlp_bias,
            hidden_act=get("hidden_act"),
            sliding_window=sliding_window,
            layer_types=layer_types,
            dtype=dtype,
            bos_token_id=_optional_int("bos_token_id", d.get("bos_token_id", defaults["bos_token_id"])),
            eos_token_id=_token_ids("eos_token_id", d.get("eos_token_id", defaults["eos_token_id"])),
            pad_token_id=_optional_int("pad_token_id", d.get("pad_token_id", defaults["pad_token_id"])),
            # compressed-tensors checkpoints of 2024 (llm-compressor) keep it as compression_config, read
            # where quantization_config is absent, as vLLM does
            quantization_config=_flattened(
                _optional_object("quantization_config", d["quantization_config"])
                if d.get("quantization_config") is not None
                else _optional_object("compression_config", d.get("compression_config"))
            ),
            # an explicit null is kept (Gemma 2's attn_logit_softcapping: null turns it off)
            family_fields={k: d[k] if k in d else v for k, v in family.family_fields.items()},
        )

    def to_dict(self) -> dict[str, Any]:
        """A Hugging Face style ``config.json`` dict that ``transformers.AutoConfig`` loads back.

        Written in both dialects at once: v4 ``rope_theta`` + ``rope_scaling`` and
        ``torch_dtype``, v5 ``rope_parameters`` and ``dtype``; Qwen2/Qwen3 get
        ``use_sliding_window`` / ``max_window_layers`` / ``layer_types``. Round trip:
        ``ModelConfig.from_dict(cfg.to_dict()) == cfg``.

        Returns:
            a JSON-serializable dict (only built-in types).
        """
        family = MODEL_FAMILIES.get(self.model_type)
        rope_parameters = {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta}
        # written where the family reads it (its default may not be 1.0: GPT-NeoX's is 0.25)
        write_prf = self.partial_rotary_factor != 1.0 or (family is not None and family.partial_rotary_factor is None)
        if write_prf:
            rope_parameters["partial_rotary_factor"] = self.partial_rotary_factor
        eos: Any = list(self.eos_token_id)
        eos = None if not eos else eos[0] if len(eos) == 1 else eos
        d: dict[str, Any] = {
            "architectures": list(self.architectures),
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "rope_parameters": rope_parameters,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "hidden_act": self.hidden_act,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": self.pad_token_id,
        }
        if write_prf:
            d["partial_rotary_factor"] = self.partial_rotary_factor
        if self.rope_scaling and self.rope_scaling.get("original_max_position_embeddings") is not None:
            # also at the top level, where Phi-3 keeps it (and where it wins when read back)
            d["original_max_position_embeddings"] = self.rope_scaling["original_max_position_embeddings"]
        d.update(self.family_fields)
        if self.dtype is not None:
            d["dtype"] = self.dtype
            d["torch_dtype"] = self.dtype
        if self.quantization_config is not None:
            d["quantization_config"] = dict(self.quantization_config)
        rule = family.sliding_window_rule if family else "always"
        if rule == "always":
            d["sliding_window"] = self.sliding_window
        elif rule == "layer_types":
            d["sliding_window"] = self.sliding_window
            d["layer_types"] = list(self.layer_types)
        elif rule == "use_sliding_window":
            d["use_sliding_window"] = self.sliding_window is not None
            d["sliding_window"] = self.sliding_window
            d["layer_types"] = list(self.layer_types)
            first_sliding = next(
                (i for i, t in enumerate(self.layer_types) if t == "sliding_attention"),
                self.num_hidden_layers,
            )
            d["max_window_layers"] = first_sliding
        if family is not None and family.export_config is not None:
            d = family.export_config(d)
        return d


def _config_path(model_dir_or_config_json: str | os.PathLike[str]) -> Path:
    p = Path(model_dir_or_config_json)
    return p / CONFIG_NAME if p.is_dir() else p


def load_config(model_dir_or_config_json: str | os.PathLike[str]) -> ModelConfig:
    """Read ``config.json`` from a model directory (or the given JSON file).

    Args:
        model_dir_or_config_json: a Hugging Face model directory, or a path to a config JSON.

    Returns:
        the parsed :class:`ModelConfig`.

    Raises:
        ConfigError: the file is missing, unreadable, not valid JSON, not an object, or a
            field is missing/invalid; every message names the file. A GGUF file is named as
            one, with the ``trtcore convert --gguf`` that makes a model folder of it; a
            safetensors file as one, with the folder to pass.
        UnsupportedArchitectureError: unknown ``model_type``.
    """
    if not Path(model_dir_or_config_json).exists():  # nothing there: not a missing config.json in a folder
        raise ConfigError(f"model folder not found: {model_dir_or_config_json}")
    path = _config_path(model_dir_or_config_json)
    other_file = path.name != CONFIG_NAME and path.is_file()  # not a config.json: say what it is and what was expected
    if other_file:
        try:
            with path.open("rb") as f:
                magic = f.read(9)
        except OSError:
            magic = b""
        # safetensors: an 8-byte little-endian header length (a text file's first 8 bytes read
        # as one are above 2^56), then the JSON header
        if path.suffix == ".safetensors" or (len(magic) == 9 and magic[8:9] == b"{" and int.from_bytes(magic[:8], "little") < 2**32):
            folder = path.parent
            hint = f"pass {folder}" if (folder / CONFIG_NAME).is_file() else f"pass the model folder that holds it and its {CONFIG_NAME}"
            raise ConfigError(f"{path} is a safetensors weights file, not a model folder; {hint}")
        if magic[:4] == b"GGUF":
            raise ConfigError(
                f"{path} is a GGUF file, not a model folder; make a Hugging Face model folder from it with "
                f"`trtcore convert --gguf {path} --output DIR` and pass DIR"
            )
    try:
        data = _read_json(path, "model config")
    except ConfigError as e:
        if not other_file:
            raise
        raise ConfigError(f"{e} (expected a Hugging Face model folder with {CONFIG_NAME}, or its {CONFIG_NAME})") from None
    return ModelConfig.from_dict(data, source=str(path))


# ---------------------------------------------------------------------------------------
# generation_config.json


@dataclass(frozen=True, kw_only=True)
class GenerationConfig:
    """The generation defaults a checkpoint ships (``generation_config.json``).

    Field names and defaults are ``transformers.GenerationConfig``'s
    (``_get_default_generation_params``: ``do_sample=False``, ``temperature=1.0``,
    ``top_k=50``, ``top_p=1.0``, ``max_length=20``; ``max_new_tokens=None``).

    Attributes:
        bos_token_id, pad_token_id: int or None.
        eos_token_id: tuple of stop token ids (possibly empty).
        do_sample: False means greedy decoding.
        temperature: >= 0.
        top_k: >= 0 (0 disables top-k).
        top_p: in (0, 1].
        max_new_tokens: positive int or None.
        max_length: total length cap (prompt + new tokens) Hugging Face uses when
            ``max_new_tokens`` is None.

    Raises:
        ConfigError: on construction with an out-of-range value.
    """

    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    max_new_tokens: int | None = None
    max_length: int = 20

    def __post_init__(self) -> None:
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        _optional_int("bos_token_id", self.bos_token_id)
        _optional_int("pad_token_id", self.pad_token_id)
        _token_ids("eos_token_id", self.eos_token_id)
        _bool("do_sample", self.do_sample)
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ConfigError(f"field 'temperature' is {t!r}, expected a number >= 0")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ConfigError(f"field 'top_k' is {self.top_k!r}, expected an integer >= 0")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ConfigError(f"field 'top_p' is {p!r}, expected a number in (0, 1]")
        if self.max_new_tokens is not None:
            _positive_int("max_new_tokens", self.max_new_tokens)
        _positive_int("max_length", self.max_length)


def load_generation_config(model_dir: str | os.PathLike[str], model_config: ModelConfig | None = None) -> GenerationConfig:
    """Read ``model_dir/generation_config.json`` if present, falling back to the model config.

    Token ids absent (or null) in the file, or the whole file absent, come from
    ``model_config`` (``bos_token_id``, ``eos_token_id``, ``pad_token_id``); an
    ``eos_token_id`` present in the file replaces the model config's (no union). Other
    absent fields take transformers' defaults.

    Args:
        model_dir: the model directory.
        model_config: the parsed ``config.json`` (None: no fallback ids).

    Returns:
        a :class:`GenerationConfig`.

    Raises:
        ConfigError: the file exists but is unreadable, not valid JSON, or has a bad
            value; the message names the file and the field.
    """
    path = Path(model_dir) / GENERATION_CONFIG_NAME
    d: dict[str, Any] = _read_json(path, "generation config") if path.is_file() else {}
    mc = model_config
    fallback = {
        "bos_token_id": mc.bos_token_id if mc else None,
        "eos_token_id": mc.eos_token_id if mc else (),
        "pad_token_id": mc.pad_token_id if mc else None,
    }
    defaults = {f.name: f.default for f in dataclasses.fields(GenerationConfig)}
    kwargs: dict[str, Any] = {}
    try:
        for name in defaults:
            v = d.get(name)
            if v is None:
                v = fallback.get(name, defaults[name])
            elif name == "eos_token_id":
                v = _token_ids(name, v)
            kwargs[name] = v
        return GenerationConfig(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
