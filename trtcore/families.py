"""The model-family registry: each family's rules in one record (:class:`ModelFamily`).

A family (Hugging Face ``model_type``) declares here, once:

* its config defaults (those of transformers' ``*Config`` class) and which config fields
  its transformers *modeling* code really reads: bias rules (``qkv_bias`` / ``o_bias`` /
  ``mlp_bias``), the sliding-window rule, whether ``partial_rotary_factor`` is applied;
* its Hugging Face tensor names (:attr:`ModelFamily.tensor_names`), the buffers a
  checkpoint may carry that no layer reads (:attr:`ModelFamily.ignored_tensors`, e.g.
  ``rotary_emb.inv_freq``), and its fused/packed modules (vLLM's
  ``packed_modules_mapping``);
* its GGUF mapping (:class:`GGUFMapping`: llama.cpp architecture name, tensor names,
  whether q/k rows are permuted);
* the module that builds its network (``builder``, a family file under ``models/``).

This module is data only, at the bottom of the layering: :mod:`trtcore.config`,
:mod:`trtcore.gguf_convert`, :mod:`trtcore.models` and the checkpoint report read it.
A new architecture adds a family file under ``models/`` and a record here
(:func:`register_model_type`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trtcore.errors import ConfigError

#: Hugging Face's ``RotaryEmbeddingConfigMixin.default_theta``.
DEFAULT_ROPE_THETA = 10_000.0

#: Llama-style Hugging Face module names: role -> name (``{i}``: the layer index); a tensor's
#: name adds ``.weight`` / ``.bias``.
LLAMA_TENSOR_NAMES: Mapping[str, str] = {
    "embed_tokens": "model.embed_tokens",
    "norm": "model.norm",
    "lm_head": "lm_head",
    "input_layernorm": "model.layers.{i}.input_layernorm",
    "post_attention_layernorm": "model.layers.{i}.post_attention_layernorm",
    "q_proj": "model.layers.{i}.self_attn.q_proj",
    "k_proj": "model.layers.{i}.self_attn.k_proj",
    "v_proj": "model.layers.{i}.self_attn.v_proj",
    "o_proj": "model.layers.{i}.self_attn.o_proj",
    "q_norm": "model.layers.{i}.self_attn.q_norm",
    "k_norm": "model.layers.{i}.self_attn.k_norm",
    "gate_proj": "model.layers.{i}.mlp.gate_proj",
    "up_proj": "model.layers.{i}.mlp.up_proj",
    "down_proj": "model.layers.{i}.mlp.down_proj",
}

#: vLLM's ``packed_modules_mapping`` of the Llama-style families: the modules an inference
#: engine may fuse (trtcore builds them unfused; Hugging Face checkpoints store them apart).
LLAMA_PACKED_MODULES: Mapping[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}

#: Buffers that transformers' older checkpoints saved and no layer reads (the rotary
#: embedding's ``inv_freq``): not reported as unexpected (transformers'
#: ``_keys_to_ignore_on_load_unexpected``).
ROTARY_BUFFERS: tuple[str, ...] = (r"(^|\.)rotary_emb\.inv_freq$",)

#: GGUF tensor-name suffix -> Hugging Face name suffix, inside ``blk.N.`` / ``model.layers.N.``
LLAMA_GGUF_LAYER_TENSORS: Mapping[str, str] = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

#: GGUF global tensors -> Hugging Face names
LLAMA_GGUF_GLOBAL_TENSORS: Mapping[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


@dataclass(frozen=True)
class GGUFMapping:
    """How a llama.cpp GGUF file of this family maps onto its Hugging Face checkpoint.

    Attributes:
        architecture: GGUF ``general.architecture`` (``"llama"``, ``"qwen2"``).
        layer_tensors / global_tensors: GGUF tensor name (suffix) -> Hugging Face name.
        permute_qk: llama.cpp's ``convert_hf_to_gguf.py`` reorders q/k rows (``llama``);
            the converter undoes it.
        bias_from_tensors: the converter sets ``attention_bias`` from the presence of q/k/v
            bias tensors (families whose modeling code reads ``attention_bias``).
    """

    architecture: str
    layer_tensors: Mapping[str, str] = field(default_factory=lambda: LLAMA_GGUF_LAYER_TENSORS)
    global_tensors: Mapping[str, str] = field(default_factory=lambda: LLAMA_GGUF_GLOBAL_TENSORS)
    permute_qk: bool = False
    bias_from_tensors: bool = False


@dataclass(frozen=True)
class ModelFamily:
    """Per-``model_type`` rules: Hugging Face defaults and what its modeling code reads.

    Attributes:
        model_type: Hugging Face ``model_type`` (``"llama"``, ``"qwen2"``, ...).
        architecture: the ``architectures[0]`` to assume when config.json has none
            (the ``*ForCausalLM`` class).
        defaults: Hugging Face's ``__init__``/dataclass defaults of the config class for
            the optional fields (``num_key_value_heads``, ``max_position_embeddings``,
            ``rms_norm_eps``, ``rope_theta``, ``head_dim``, token ids, ...). ``None`` for
            ``num_key_value_heads`` / ``head_dim`` means "derive" (``num_attention_heads``,
            ``hidden_size // num_attention_heads``).
        qkv_bias, o_bias, mlp_bias: ``None`` when the modeling code reads the config
            (``attention_bias`` / ``mlp_bias``); a bool when it hard-codes ``bias=...``.
        sliding_window_rule: ``"none"`` (no sliding window, Llama), ``"always"``
            (``config.sliding_window`` applies to every layer, Mistral),
            ``"use_sliding_window"`` (only when ``use_sliding_window`` is true, and only on
            the layers whose ``layer_types`` entry is ``"sliding_attention"``, Qwen2/Qwen3) or
            ``"layer_types"`` (on the layers ``layer_types`` marks, a list the family's
            ``prepare_config`` fills when config.json has none; Gemma 2/3).
        partial_rotary_factor: ``None`` when the modeling code rotates
            ``head_dim * partial_rotary_factor`` features; a number when it hard-codes the
            fraction (the four Llama-style families: 1.0, their default RoPE computes
            ``inv_freq`` over the whole ``head_dim`` whatever the config says).
        builder: the module that builds the network (``build(graph, config, weights)``).
        tensor_names: role -> Hugging Face module name (``{i}``: layer); tensor names add
            ``.weight`` / ``.bias``.
        packed_modules: fused module -> the modules it packs (vLLM's ``packed_modules_mapping``).
        ignored_tensors: regular expressions of checkpoint tensors no layer reads that are
            not reported as unexpected (rotary ``inv_freq`` buffers).
        gguf: the GGUF mapping, or None when GGUF files of this family are not converted.
        family_fields: config fields only this family's modeling code reads -> their
            transformers defaults (GPT-NeoX: ``use_parallel_residual``, ``layer_norm_eps``);
            parsed into :attr:`trtcore.config.ModelConfig.family_fields`.
        prepare_config: maps the family's config.json dialect onto the common field names
            (GPT-NeoX: ``rotary_emb_base`` -> ``rope_theta``) and refuses fields trtcore cannot
            honour (raising ConfigError), before :meth:`trtcore.config.ModelConfig.from_dict`
            parses it; None when the dialect is the common one.
        export_config: the inverse for :meth:`trtcore.config.ModelConfig.to_dict`: the common
            dict onto the family's dialect, so that its transformers config class loads it
            (Gemma 3: ``rope_parameters`` per layer type); None when the common one does.
    """

    model_type: str
    architecture: str
    defaults: Mapping[str, Any]
    qkv_bias: bool | None = None
    o_bias: bool | None = None
    mlp_bias: bool | None = None
    sliding_window_rule: str = "none"
    partial_rotary_factor: float | None = 1.0
    builder: str = "trtcore.models.llama"
    tensor_names: Mapping[str, str] = field(default_factory=lambda: LLAMA_TENSOR_NAMES)
    packed_modules: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: LLAMA_PACKED_MODULES)
    ignored_tensors: tuple[str, ...] = ROTARY_BUFFERS
    gguf: GGUFMapping | None = None
    family_fields: Mapping[str, Any] = field(default_factory=dict)
    prepare_config: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    export_config: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def tensor(self, role: str, layer: int | None = None, suffix: str = ".weight") -> str:
        """The Hugging Face name of ``role`` (of ``layer``), plus ``suffix`` (``".weight"``).

        Raises:
            ConfigError: the family declares no such role.
        """
        if role not in self.tensor_names:
            raise ConfigError(f"model family {self.model_type!r} has no tensor role {role!r}; it has {sorted(self.tensor_names)}")
        return self.tensor_names[role].format(i=layer) + suffix

    def is_ignored(self, name: str) -> bool:
        """Whether the checkpoint tensor ``name`` is a buffer no layer is expected to read."""
        return any(re.search(p, name) for p in self.ignored_tensors)


_COMMON_DEFAULTS: dict[str, Any] = {
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": DEFAULT_ROPE_THETA,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "pad_token_id": None,
    "head_dim": None,
    "sliding_window": None,
    "use_sliding_window": False,
    "max_window_layers": 28,
}

#: Families trtcore knows, keyed by ``model_type``. Defaults transcribed from
#: transformers' ``configuration_{llama,mistral,qwen2,qwen3}.py`` (identical in v4.56 and v5);
#: bias / sliding-window / rotary rules from ``modeling_{llama,mistral,qwen2,qwen3}.py``.
MODEL_FAMILIES: dict[str, ModelFamily] = {
    "llama": ModelFamily(
        "llama",
        "LlamaForCausalLM",
        {
            **_COMMON_DEFAULTS,
            "num_key_value_heads": None,
            "max_position_embeddings": 2048,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        gguf=GGUFMapping("llama", permute_qk=True, bias_from_tensors=True),
    ),
    "mistral": ModelFamily(
        "mistral",
        "MistralForCausalLM",
        {
            **_COMMON_DEFAULTS,
            "num_key_value_heads": 8,
            "max_position_embeddings": 4096 * 32,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "sliding_window": 4096,
        },
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        sliding_window_rule="always",
    ),
    "qwen2": ModelFamily(
        "qwen2",
        "Qwen2ForCausalLM",
        {
            **_COMMON_DEFAULTS,
            "num_key_value_heads": 32,
            "max_position_embeddings": 32768,
            "bos_token_id": None,
            "eos_token_id": None,
            "sliding_window": 4096,
        },
        qkv_bias=True,
        o_bias=False,
        mlp_bias=False,
        sliding_window_rule="use_sliding_window",
        gguf=GGUFMapping("qwen2"),
    ),
    "qwen3": ModelFamily(
        "qwen3",
        "Qwen3ForCausalLM",
        {
            **_COMMON_DEFAULTS,
            "num_key_value_heads": 32,
            "head_dim": 128,
            "max_position_embeddings": 32768,
            "bos_token_id": None,
            "eos_token_id": None,
            "sliding_window": 4096,
        },
        mlp_bias=False,
        sliding_window_rule="use_sliding_window",
    ),
}


#: GPT-NeoX (Pythia) module names, from transformers' ``modeling_gpt_neox.py``; q/k/v are one
#: fused ``query_key_value`` whose rows are interleaved per head ``[H, 3, D]``.
GPT_NEOX_TENSOR_NAMES: Mapping[str, str] = {
    "embed_in": "gpt_neox.embed_in",
    "final_layer_norm": "gpt_neox.final_layer_norm",
    "embed_out": "embed_out",  # as saved (transformers v5 loads it as lm_head)
    "lm_head": "lm_head",  # the name inside transformers v5, accepted too
    "input_layernorm": "gpt_neox.layers.{i}.input_layernorm",
    "post_attention_layernorm": "gpt_neox.layers.{i}.post_attention_layernorm",
    "query_key_value": "gpt_neox.layers.{i}.attention.query_key_value",
    "dense": "gpt_neox.layers.{i}.attention.dense",
    "dense_h_to_4h": "gpt_neox.layers.{i}.mlp.dense_h_to_4h",
    "dense_4h_to_h": "gpt_neox.layers.{i}.mlp.dense_4h_to_h",
}

#: ``hidden_act`` values of GPT-NeoX that trtcore builds (:data:`trtcore.ops.GELU_ACTIVATIONS`)
GPT_NEOX_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh")


def _gpt_neox_config(d: Mapping[str, Any]) -> dict[str, Any]:
    """GPT-NeoX's config.json onto the common names, as ``GPTNeoXConfig.convert_rope_params_to_dict``:
    ``rotary_emb_base`` -> ``rope_theta`` and ``rotary_pct`` -> ``partial_rotary_factor``
    (default 0.25; ``rope_parameters``' own entries win, as there).

    Raises:
        ConfigError: a field GPT-NeoX's attention cannot have (``num_key_value_heads`` other
            than ``num_attention_heads``: the fused ``query_key_value`` is ``3 * hidden_size``
            wide; a ``head_dim`` other than ``hidden_size // num_attention_heads``), or a
            ``hidden_act`` trtcore does not build.
    """
    out = dict(d)
    for v4, common in (("rotary_emb_base", "rope_theta"), ("rotary_pct", "partial_rotary_factor")):
        if out.get(v4) is not None:
            out[common] = out[v4]
    out.setdefault("partial_rotary_factor", 0.25)
    heads, hidden = out.get("num_attention_heads"), out.get("hidden_size")
    kv = out.get("num_key_value_heads")
    if kv is not None and kv != heads:
        raise ConfigError(f"field 'num_key_value_heads' is {kv!r}; GPT-NeoX attention has one key/value head per query head ({heads!r})")
    hd = out.get("head_dim")
    if hd is not None and isinstance(hidden, int) and isinstance(heads, int) and heads and hd != hidden // heads:
        raise ConfigError(f"field 'head_dim' is {hd!r}; GPT-NeoX's head size is hidden_size // num_attention_heads = {hidden // heads}")
    act = out.get("hidden_act", "gelu")
    if act not in GPT_NEOX_ACTIVATIONS:
        raise ConfigError(f"field 'hidden_act' is {act!r}; GPT-NeoX is built with one of {list(GPT_NEOX_ACTIVATIONS)}")
    return out


#: ``GPTNeoXForCausalLM`` (Pythia, GPT-NeoX-20B): defaults from transformers'
#: ``configuration_gpt_neox.py``; LayerNorm with bias, fused per-head qkv, partial rotary,
#: parallel or sequential residual, an ungated GELU MLP with biases (``modeling_gpt_neox.py``).
MODEL_FAMILIES["gpt_neox"] = ModelFamily(
    "gpt_neox",
    "GPTNeoXForCausalLM",
    {
        **_COMMON_DEFAULTS,
        "hidden_act": "gelu",
        "attention_bias": True,
        "num_key_value_heads": None,
        "max_position_embeddings": 2048,
        "bos_token_id": 0,
        "eos_token_id": 2,
    },
    mlp_bias=True,
    partial_rotary_factor=None,
    builder="trtcore.models.gpt_neox",
    tensor_names=GPT_NEOX_TENSOR_NAMES,
    packed_modules={},
    # buffers of older checkpoints (transformers' _keys_to_ignore_on_load_unexpected)
    ignored_tensors=(*ROTARY_BUFFERS, r"\.attention\.bias$", r"\.attention\.masked_bias$"),
    family_fields={"use_parallel_residual": True, "layer_norm_eps": 1e-5},
    prepare_config=_gpt_neox_config,
)


#: Mixture-of-experts module names (transformers' ``modeling_{mixtral,qwen2_moe,qwen3_moe}.py``) on
#: top of the Llama-style ones. Two layouts of the routed experts exist: the per-expert linears
#: that checkpoints on the Hub hold and ``save_pretrained`` writes (``experts.{e}.w1`` in Mixtral's
#: ``block_sparse_moe``; ``experts.{e}.gate_proj`` in Qwen's ``mlp``), and transformers 5's fused
#: in-memory parameters ``mlp.experts.gate_up_proj`` ``[X, 2 I, E]`` (gate rows, then up rows) and
#: ``mlp.experts.down_proj`` ``[X, E, I]`` (no ``.weight`` suffix), with the router at ``mlp.gate``.
MOE_TENSOR_NAMES: Mapping[str, str] = {
    **LLAMA_TENSOR_NAMES,
    "router": "model.layers.{i}.mlp.gate",
    "experts": "model.layers.{i}.mlp.experts",
    "router_fused": "model.layers.{i}.mlp.gate",
    "experts_fused": "model.layers.{i}.mlp.experts",
    "shared_expert.gate_proj": "model.layers.{i}.mlp.shared_expert.gate_proj",
    "shared_expert.up_proj": "model.layers.{i}.mlp.shared_expert.up_proj",
    "shared_expert.down_proj": "model.layers.{i}.mlp.shared_expert.down_proj",
    "shared_expert_gate": "model.layers.{i}.mlp.shared_expert_gate",
}

#: ``model_type`` -> the per-expert linears' names in the Hub layout: (gate, up, down)
MOE_EXPERT_LINEARS: Mapping[str, tuple[str, str, str]] = {
    "mixtral": ("w1", "w3", "w2"),
    "qwen2_moe": ("gate_proj", "up_proj", "down_proj"),
    "qwen3_moe": ("gate_proj", "up_proj", "down_proj"),
}

#: the MoE config fields only these families read -> transformers' defaults
#: (``configuration_{mixtral,qwen2_moe,qwen3_moe}.py``)
_MIXTRAL_FIELDS: dict[str, Any] = {"num_local_experts": 8, "num_experts_per_tok": 2, "router_jitter_noise": 0.0}
_QWEN_MOE_FIELDS: dict[str, Any] = {
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "norm_topk_prob": False,
    "moe_intermediate_size": 1408,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}


def _moe_int(out: dict[str, Any], name: str, minimum: int) -> int:
    v = out[name]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(f"field {name!r} is {v!r}, expected an integer >= {minimum}")
    return v


def _moe_config(d: Mapping[str, Any], experts_field: str, alias: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The checks and spellings common to the MoE families: ``alias`` (transformers'
    ``attribute_map``) read as ``experts_field``, defaults filled, types checked.

    Raises:
        ConfigError: a count that is not a positive integer, ``num_experts_per_tok`` above the
            number of experts, a ``hidden_act`` other than ``silu`` (the experts are SwiGLU).
    """
    out = dict(d)
    if out.get(experts_field) is None and out.get(alias) is not None:
        out[experts_field] = out[alias]
    out.pop(alias, None)
    for k, v in fields.items():
        if out.get(k) is None:
            out[k] = list(v) if isinstance(v, list) else v
    experts = _moe_int(out, experts_field, 0)
    top_k = _moe_int(out, "num_experts_per_tok", 1)
    if experts and top_k > experts:
        raise ConfigError(f"field 'num_experts_per_tok' is {top_k}, expected at most {experts_field} = {experts}")
    act = out.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"field 'hidden_act' is {act!r}; trtcore builds the experts as SwiGLU MLPs ('silu')")
    for name in ("moe_intermediate_size", "shared_expert_intermediate_size", "decoder_sparse_step"):
        if name in fields:
            _moe_int(out, name, 1)
    if "norm_topk_prob" in fields and not isinstance(out["norm_topk_prob"], bool):
        raise ConfigError(f"field 'norm_topk_prob' is {out['norm_topk_prob']!r}, expected true or false")
    if "mlp_only_layers" in fields:
        layers = out["mlp_only_layers"]
        if not isinstance(layers, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
            raise ConfigError(f"field 'mlp_only_layers' is {layers!r}, expected a list of layer indices")
        out["mlp_only_layers"] = sorted(set(layers))
    return out


def _mixtral_config(d: Mapping[str, Any]) -> dict[str, Any]:
    """Mixtral: ``num_experts`` (its ``attribute_map``) is ``num_local_experts``; at least one
    expert. ``router_jitter_noise`` only acts in training (ignored); ``output_router_logits`` and
    ``router_aux_loss_coef`` only concern the training loss."""
    out = _moe_config(d, "num_local_experts", "num_experts", _MIXTRAL_FIELDS)
    _moe_int(out, "num_local_experts", 1)
    return out


def _qwen2_moe_config(d: Mapping[str, Any]) -> dict[str, Any]:
    """Qwen2-MoE: the q/k/v bias is ``qkv_bias`` (default true; transformers 4 hard-coded it),
    read here as ``attention_bias``; without ``layer_types``, a sliding window applies to the
    even-numbered layers (``(i + 1) % 2``) below ``max_window_layers`` (``Qwen2MoeConfig``)."""
    out = _moe_config(d, "num_experts", "num_local_experts", {**_QWEN_MOE_FIELDS, "shared_expert_intermediate_size": 5632})
    if "qkv_bias" in out:
        out["attention_bias"] = out.pop("qkv_bias")
    if out.get("use_sliding_window") is True and out.get("layer_types") is None:
        mwl = out.get("max_window_layers", 28)
        out["layer_types"] = ["sliding_attention" if (i + 1) % 2 and i < mwl else "full_attention" for i in range(out.get("num_hidden_layers") or 0)]
    return out


def _qwen3_moe_config(d: Mapping[str, Any]) -> dict[str, Any]:
    """Qwen3-MoE: ``num_local_experts`` (what its ``attribute_map`` writes) is ``num_experts``; a
    sliding window, when ``use_sliding_window``, applies to every layer (one mask for all)."""
    out = _moe_config(
        d, "num_experts", "num_local_experts", {**_QWEN_MOE_FIELDS, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768}
    )
    if out.get("use_sliding_window") is True and out.get("layer_types") is None:
        out["layer_types"] = ["sliding_attention"] * (out.get("num_hidden_layers") or 0)
    return out


#: ``MixtralForCausalLM`` / ``Qwen2MoeForCausalLM`` / ``Qwen3MoeForCausalLM``: Llama-style attention
#: (Mistral's window; Qwen2's q/k/v bias; Qwen3's q/k norms) and a sparse MoE block of SwiGLU experts
#: (models/moe.py). Defaults from transformers' ``configuration_{mixtral,qwen2_moe,qwen3_moe}.py``.
MODEL_FAMILIES["mixtral"] = ModelFamily(
    "mixtral",
    "MixtralForCausalLM",
    {
        **_COMMON_DEFAULTS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e6,
        "num_key_value_heads": 8,
        "max_position_embeddings": 4096 * 32,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    qkv_bias=False,
    o_bias=False,
    mlp_bias=False,
    sliding_window_rule="always",
    builder="trtcore.models.moe",
    tensor_names={
        **MOE_TENSOR_NAMES,
        "router": "model.layers.{i}.block_sparse_moe.gate",
        "experts": "model.layers.{i}.block_sparse_moe.experts",
    },
    packed_modules={"qkv_proj": ("q_proj", "k_proj", "v_proj")},
    family_fields=_MIXTRAL_FIELDS,
    prepare_config=_mixtral_config,
)
MODEL_FAMILIES["qwen2_moe"] = ModelFamily(
    "qwen2_moe",
    "Qwen2MoeForCausalLM",
    {
        **_COMMON_DEFAULTS,
        "attention_bias": True,
        "num_key_value_heads": 16,
        "max_position_embeddings": 32768,
        "bos_token_id": None,
        "eos_token_id": None,
        "sliding_window": 4096,
    },
    o_bias=False,
    mlp_bias=False,
    sliding_window_rule="use_sliding_window",
    builder="trtcore.models.moe",
    tensor_names=MOE_TENSOR_NAMES,
    family_fields={**_QWEN_MOE_FIELDS, "shared_expert_intermediate_size": 5632},
    prepare_config=_qwen2_moe_config,
)
MODEL_FAMILIES["qwen3_moe"] = ModelFamily(
    "qwen3_moe",
    "Qwen3MoeForCausalLM",
    {
        **_COMMON_DEFAULTS,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "bos_token_id": None,
        "eos_token_id": None,
        "sliding_window": 4096,
    },
    mlp_bias=False,
    sliding_window_rule="use_sliding_window",
    builder="trtcore.models.moe",
    tensor_names=MOE_TENSOR_NAMES,
    family_fields={**_QWEN_MOE_FIELDS, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768},
    prepare_config=_qwen3_moe_config,
)


#: Phi-3 module names, from transformers' ``modeling_phi3.py``: the checkpoint holds the fused
#: ``qkv_proj`` (rows q | k | v) and ``gate_up_proj`` (rows gate | up); the Llama roles
#: ``q_proj`` ... ``up_proj`` name their parts, which :mod:`trtcore.models.phi3` splits off on
#: the host (:attr:`ModelFamily.packed_modules` says which fused module holds which parts).
PHI3_TENSOR_NAMES: Mapping[str, str] = {
    **LLAMA_TENSOR_NAMES,
    "qkv_proj": "model.layers.{i}.self_attn.qkv_proj",
    "gate_up_proj": "model.layers.{i}.mlp.gate_up_proj",
}

#: Phi-3's default ``original_max_position_embeddings`` (``Phi3Config``), which
#: ``standardize_rope_params`` puts into the RoPE parameters over their own value
PHI3_ORIGINAL_MAX_POSITION_EMBEDDINGS = 4096

#: RoPE type names Phi-3's config maps onto ``longrope`` (``Phi3Config.convert_rope_params_to_dict``)
PHI3_LONGROPE_ALIASES = ("su", "yarn")

#: ``hidden_act`` values of Phi-3 that trtcore builds (the gate of its SwiGLU MLP is SiLU)
PHI3_ACTIVATIONS = ("silu", "swish")


def _phi3_config(d: Mapping[str, Any]) -> dict[str, Any]:
    """Phi-3's config.json onto the common names, as ``Phi3Config`` reads it:

    * a RoPE ``type`` / ``rope_type`` of ``"su"`` or ``"yarn"`` is ``"longrope"``
      (``convert_rope_params_to_dict``; transformers 5.x then still requires
      ``original_max_position_embeddings`` for ``"su"``, trtcore fills it as for
      ``"longrope"``, as transformers 4.x did);
    * the top-level ``original_max_position_embeddings`` (default 4096, a ``Phi3Config``
      field) wins over the one inside the RoPE parameters (``standardize_rope_params``).

    Raises:
        ConfigError: a RoPE type other than default / longrope (``Phi3Config.validate_rope``
            refuses them too), a ``hidden_act`` other than SiLU, or a quantized checkpoint
            (its fused ``qkv_proj`` / ``gate_up_proj`` are not split quantized).
    """
    out = dict(d)
    out.setdefault("original_max_position_embeddings", PHI3_ORIGINAL_MAX_POSITION_EMBEDDINGS)
    for key in ("rope_scaling", "rope_parameters"):
        params = out.get(key)
        if isinstance(params, Mapping):
            p = dict(params)
            rope_type = p.get("rope_type") or p.get("type") or "default"
            if rope_type in PHI3_LONGROPE_ALIASES:
                rope_type = "longrope"
                p.pop("type", None)
                p["rope_type"] = rope_type
            if rope_type not in ("default", "longrope"):
                raise ConfigError(
                    f"field '{key}' has rope_type {rope_type!r}; Phi-3 takes 'default' or 'longrope' (or its aliases {list(PHI3_LONGROPE_ALIASES)})"
                )
            out[key] = p
            break  # the first set one is the one read (rope_scaling over rope_parameters)
    act = out.get("hidden_act", "silu")
    if act not in PHI3_ACTIVATIONS:
        raise ConfigError(f"field 'hidden_act' is {act!r}; Phi-3's gated MLP is built with one of {list(PHI3_ACTIVATIONS)}")
    if out.get("quantization_config") is not None:
        raise ConfigError("field 'quantization_config' is set; trtcore does not split Phi-3's fused qkv_proj / gate_up_proj when quantized")
    return out


#: ``Phi3ForCausalLM`` (Phi-3 / Phi-3.5 mini): defaults from transformers'
#: ``configuration_phi3.py``; a Llama-style decoder with fused ``qkv_proj`` / ``gate_up_proj``
#: (no biases), partial rotary and ``longrope`` scaling from the config, and a sliding window on
#: every layer when ``sliding_window`` is set (``modeling_phi3.py``).
MODEL_FAMILIES["phi3"] = ModelFamily(
    "phi3",
    "Phi3ForCausalLM",
    {
        **_COMMON_DEFAULTS,
        "num_key_value_heads": None,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "bos_token_id": 1,
        "eos_token_id": 32000,
        "pad_token_id": 32000,
    },
    qkv_bias=False,
    o_bias=False,
    mlp_bias=False,
    sliding_window_rule="always",
    partial_rotary_factor=None,
    builder="trtcore.models.phi3",
    tensor_names=PHI3_TENSOR_NAMES,
    packed_modules=LLAMA_PACKED_MODULES,
    prepare_config=_phi3_config,
)


#: Gemma module names (transformers' ``modeling_gemma{,2,3}.py``): the Llama names plus Gemma 2/3's
#: norms around the MLP (``pre_feedforward_layernorm`` / ``post_feedforward_layernorm``).
GEMMA_TENSOR_NAMES: Mapping[str, str] = {
    **LLAMA_TENSOR_NAMES,
    "pre_feedforward_layernorm": "model.layers.{i}.pre_feedforward_layernorm",
    "post_feedforward_layernorm": "model.layers.{i}.post_feedforward_layernorm",
}

#: MLP activations trtcore builds for Gemma (GeGLU with these GELUs, or SwiGLU)
GEMMA_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_new", "gelu", "silu")

_GEMMA_DEFAULTS: dict[str, Any] = {
    **_COMMON_DEFAULTS,
    "hidden_act": "gelu_pytorch_tanh",
    "head_dim": 256,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
}


def _gemma_common(d: Mapping[str, Any], act_field: str) -> dict[str, Any]:
    """The checks every Gemma shares; ``hidden_act`` set from ``act_field`` (the field the
    family's MLP reads: Gemma ``hidden_act``, Gemma 2/3 ``hidden_activation``)."""
    out = dict(d)
    if out.get("use_bidirectional_attention"):
        raise ConfigError(
            "field 'use_bidirectional_attention' is true; trtcore builds causal decoders only (Gemma's bidirectional variant is an encoder)"
        )
    act = out.get(act_field, "gelu_pytorch_tanh")
    if act not in GEMMA_ACTIVATIONS:
        raise ConfigError(f"field '{act_field}' is {act!r}; Gemma is built with one of {list(GEMMA_ACTIVATIONS)}")
    out["hidden_act"] = act
    return out


def _gemma_config(d: Mapping[str, Any]) -> dict[str, Any]:
    """``GemmaConfig``: the MLP reads ``hidden_act``, whose legacy ``"gelu"`` means the tanh
    approximation (``GemmaConfig.__post_init__`` rewrites it to ``"gelu_pytorch_tanh"``)."""
    out = dict(d)
    if out.get("hidden_act") == "gelu":
        out["hidden_act"] = "gelu_pytorch_tanh"
    return _gemma_common(out, "hidden_act")


def _positive_or_null(out: Mapping[str, Any], name: str) -> None:
    v = out.get(name)
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
        raise ConfigError(f"field {name!r} is {v!r}, expected a positive number or null")


def _gemma2_config(d: Mapping[str, Any], sliding_every: Any = 2) -> dict[str, Any]:
    """``Gemma2Config``: ``hidden_activation``; ``layer_types`` absent -> sliding on even
    layers (``Gemma2Config.__post_init__``: ``(i + 1) % 2``), or with ``sliding_every`` = n
    (Gemma 3's ``sliding_window_pattern``) on all but every n-th layer."""
    out = _gemma_common(d, "hidden_activation")
    for name in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"):  # Gemma 3 does not read the second
        _positive_or_null(out, name)
    if out.get("query_pre_attn_scalar", 1) is None:
        raise ConfigError("field 'query_pre_attn_scalar' is null, expected a positive number (the query scale is its -0.5 power)")
    n = out.get("num_hidden_layers")
    if out.get("layer_types") is None and isinstance(n, int):
        if isinstance(sliding_every, bool) or not isinstance(sliding_every, int) or sliding_every < 1:
            raise ConfigError(f"field 'sliding_window_pattern' is {sliding_every!r}, expected a positive integer")
        out["layer_types"] = ["sliding_attention" if (i + 1) % sliding_every else "full_attention" for i in range(n)]
    return out


def _gemma3_config(d: Mapping[str, Any]) -> dict[str, Any]:
    """``Gemma3TextConfig``: as Gemma 2 with ``sliding_window_pattern`` (default 6), and a
    second RoPE for the sliding layers: ``rope_parameters["sliding_attention"]["rope_theta"]``
    (v5), else ``rope_local_base_freq`` (v4), else 10000 -- read into the family field
    ``rope_local_base_freq``; the global RoPE is ``rope_parameters["full_attention"]`` (or
    v4 ``rope_theta`` / ``rope_scaling``; default theta 1e6).

    Raises:
        ConfigError: the sliding layers' RoPE has a scaling (trtcore builds their default RoPE
            only), or a field as for Gemma 2.
    """
    out = _gemma2_config(d, d.get("sliding_window_pattern", 6))
    rp = out.get("rope_parameters")
    local = rp.get("sliding_attention") if isinstance(rp, Mapping) else None
    if isinstance(local, Mapping):
        kind = local.get("rope_type", local.get("type", "default"))
        if kind != "default":
            raise ConfigError(f"field 'rope_parameters' gives the sliding layers rope_type {kind!r}; trtcore builds their default RoPE only")
        if local.get("rope_theta") is not None:
            out["rope_local_base_freq"] = local["rope_theta"]
    _positive_or_null(out, "rope_local_base_freq")
    if out.get("rope_local_base_freq", 1) is None:
        out.pop("rope_local_base_freq")
    return out


def _gemma3_export(d: dict[str, Any]) -> dict[str, Any]:
    """``rope_parameters`` per layer type, as ``Gemma3TextConfig`` writes it (the global RoPE for
    ``full_attention``, the default RoPE of ``rope_local_base_freq`` for ``sliding_attention``)."""
    out = dict(d)
    out["rope_parameters"] = {
        "full_attention": dict(d["rope_parameters"]),
        "sliding_attention": {"rope_type": "default", "rope_theta": d["rope_local_base_freq"]},
    }
    out.pop("rope_scaling", None)  # inside full_attention now (Gemma3TextConfig would apply it there again)
    return out


#: Gemma (Team Gemma, arXiv:2403.08295), Gemma 2 (arXiv:2408.00118) and Gemma 3 text
#: (arXiv:2503.19786): defaults from transformers' ``configuration_gemma{,2,3}.py``; RMSNorm
#: with a (1 + weight) offset, GeGLU, embeddings scaled by sqrt(hidden_size), head_dim 256;
#: Gemma 2/3 add norms after attention and around the MLP, ``query_pre_attn_scalar``,
#: alternating sliding windows and final logit soft-capping; Gemma 2 attention logit
#: soft-capping; Gemma 3 q/k norms and a local RoPE.
MODEL_FAMILIES["gemma"] = ModelFamily(
    "gemma",
    "GemmaForCausalLM",
    {**_GEMMA_DEFAULTS, "num_key_value_heads": 16},
    mlp_bias=False,
    builder="trtcore.models.gemma",
    tensor_names=GEMMA_TENSOR_NAMES,
    prepare_config=_gemma_config,
)
MODEL_FAMILIES["gemma2"] = ModelFamily(
    "gemma2",
    "Gemma2ForCausalLM",
    {**_GEMMA_DEFAULTS, "num_key_value_heads": 4, "sliding_window": 4096},
    mlp_bias=False,
    sliding_window_rule="layer_types",
    builder="trtcore.models.gemma",
    tensor_names=GEMMA_TENSOR_NAMES,
    family_fields={
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": 256,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    },
    prepare_config=_gemma2_config,
)
MODEL_FAMILIES["gemma3_text"] = ModelFamily(
    "gemma3_text",
    "Gemma3ForCausalLM",
    {**_GEMMA_DEFAULTS, "num_key_value_heads": 4, "sliding_window": 4096, "max_position_embeddings": 131_072, "rope_theta": 1_000_000.0},
    mlp_bias=False,
    sliding_window_rule="layer_types",
    builder="trtcore.models.gemma",
    tensor_names=GEMMA_TENSOR_NAMES,
    family_fields={
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": 256,
        # attn_logit_softcapping is not read: Gemma3Attention keeps it but never passes it to
        # the attention function (transformers 5.x), so a Gemma 3 config's value has no effect
        "final_logit_softcapping": None,
        "rope_local_base_freq": 10_000.0,
    },
    prepare_config=_gemma3_config,
    export_config=_gemma3_export,
)


#: the values of :attr:`ModelFamily.sliding_window_rule`
SLIDING_WINDOW_RULES = ("none", "always", "use_sliding_window", "layer_types")


def register_model_type(family: ModelFamily) -> None:
    """Teach trtcore a new ``model_type`` (for a new architecture file).

    Args:
        family: the family's Hugging Face defaults and rules. Its ``defaults`` must contain
            every key of the built-in families' defaults.

    Raises:
        ConfigError: ``defaults`` lacks a key, or ``sliding_window_rule`` is unknown.
    """
    missing = sorted(set(MODEL_FAMILIES["llama"].defaults) - set(family.defaults))
    if missing:
        raise ConfigError(f"register_model_type({family.model_type!r}): defaults lack {missing}")
    if family.sliding_window_rule not in SLIDING_WINDOW_RULES:
        raise ConfigError(
            f"register_model_type({family.model_type!r}): sliding_window_rule is "
            f"{family.sliding_window_rule!r}, expected one of {list(SLIDING_WINDOW_RULES)}"
        )
    MODEL_FAMILIES[family.model_type] = family


def family_of(model_type: str) -> ModelFamily:
    """The registered family of ``model_type``.

    Raises:
        ConfigError: no family has that ``model_type`` (the message lists those known).
    """
    if model_type not in MODEL_FAMILIES:
        raise ConfigError(f"model_type {model_type!r} has no registered family; known: {sorted(MODEL_FAMILIES)}")
    return MODEL_FAMILIES[model_type]


def gguf_families() -> dict[str, ModelFamily]:
    """GGUF ``general.architecture`` -> the family whose files trtcore converts."""
    return {f.gguf.architecture: f for f in MODEL_FAMILIES.values() if f.gguf is not None}
