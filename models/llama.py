"""Llama-family decoders: ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``,
``Qwen3ForCausalLM``.

One pre-norm decoder (Touvron et al., arXiv:2302.13971) covers all four; they differ only
in config fields that the ops already take:

* Mistral: sliding-window attention (applied through the attention mask by the runtime);
* Qwen2: bias on the q/k/v projections (``ModelConfig.qkv_bias``);
* Qwen3: RMSNorm on each query/key head before RoPE (``q_norm``/``k_norm``), explicit
  ``head_dim``;
* Llama 3.x: ``llama3`` RoPE scaling (and ``linear`` / ``dynamic`` / ``yarn``).

The network's I/O (token inputs, KV cache, logits) comes from the plan's KV cache mode
(:mod:`trtcore.kv_modes`), declared by :func:`trtcore.ops.model_inputs` and
:func:`trtcore.ops.cached_attention`; nothing here depends on the mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trtcore import ops
from trtcore.config import ModelConfig
from trtcore.families import family_of
from trtcore.ops import Graph
from trtcore.quant_formats import linear_weight
from trtcore.rope import rope_spec

#: families whose attention normalizes each query/key head (RMSNorm) before RoPE
QK_NORM_TYPES = ("qwen3", "qwen3_moe")


def tensor(weights: Any, fam: Any, role: str, layer: int | None, *shape: int, suffix: str = ".weight", lazy: bool = False) -> Any:
    """The checkpoint tensor of ``role`` (of ``layer``), checked to be ``shape``; ``lazy``: unread
    (a :class:`~trtcore.checkpoint.LazyTensor` where ``weights`` has ``lazy``), for the ops to
    read the slice a tensor-parallel rank holds."""
    read = getattr(weights, "lazy", weights.get) if lazy else weights.get
    return read(fam.tensor(role, layer, suffix), shape=tuple(shape))


def linear_tensor(weights: Any, fam: Any, role: str, layer: int | None, out: int, inp: int) -> Any:
    """A linear's weight ``[out, inp]``; a quantized checkpoint's stays quantized (ops.linear then
    builds the weight-only GEMM: the plugin, or TensorRT's dequantize layer where plugins cannot be hosted)."""
    return linear_weight(weights, fam.tensor(role, layer, ".weight"), (out, inp), lazy=True)


def attention_block(g: Graph, c: ModelConfig, fam: Any, weights: Any, i: int, x: Any, spec: Any) -> Any:
    """Layer ``i``'s ``self_attn`` (scope ``self_attn``): q/k/v (biases per ``c.qkv_bias``), the
    Qwen3 q/k head norms, RoPE and attention (:func:`trtcore.ops.self_attention`), ``o_proj``.
    ``x`` is the normalized hidden state; returns the attention output ``[..., hidden]``."""
    E, H, Hkv, D = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    with g.scope("self_attn"):
        roles = {"q_proj": H * D, "k_proj": Hkv * D, "v_proj": Hkv * D}
        qkv_w = [linear_tensor(weights, fam, r, i, n, E) for r, n in roles.items()]
        qkv_b = [tensor(weights, fam, r, i, n, suffix=".bias", lazy=True) for r, n in roles.items()] if c.qkv_bias else None
        # Qwen3: RMSNorm on each query/key head before RoPE
        norms = None
        if c.model_type in QK_NORM_TYPES:
            norms = (tensor(weights, fam, "q_norm", i, D), tensor(weights, fam, "k_norm", i, D), c.rms_norm_eps)
        ctx = ops.self_attention(
            g,
            i,
            x,
            qkv_w,
            qkv_b,
            spec,
            num_heads=H,
            num_kv_heads=Hkv,
            head_dim=D,
            scale=D**-0.5,
            layer_type=c.layer_types[i],
            sliding_window=c.sliding_window,
            head_norms=norms,
        )
        o_b = tensor(weights, fam, "o_proj", i, E, suffix=".bias") if c.o_bias else None
        return ops.linear(g, ctx, linear_tensor(weights, fam, "o_proj", i, E, H * D), o_b, "o_proj", parallel="row")


def dense_mlp(
    g: Graph, c: ModelConfig, fam: Any, weights: Any, i: int, x: Any, intermediate_size: int, name: str = "mlp", role_prefix: str = ""
) -> Any:
    """Layer ``i``'s SwiGLU MLP (the family's ``{role_prefix}gate_proj`` / ``up_proj`` /
    ``down_proj`` roles, biases per ``c.mlp_bias``), scope ``name``."""
    E, I = c.hidden_size, intermediate_size
    mlp_shapes = {f"{role_prefix}gate_proj": (I, E), f"{role_prefix}up_proj": (I, E), f"{role_prefix}down_proj": (E, I)}
    biases = tuple(tensor(weights, fam, r, i, n, suffix=".bias", lazy=True) if c.mlp_bias else None for r, (n, _) in mlp_shapes.items())
    gate, up, down = (linear_tensor(weights, fam, r, i, *shape) for r, shape in mlp_shapes.items())
    return ops.swiglu_mlp(g, x, gate, up, down, biases, name)  # type: ignore[arg-type]


def final_norm(g: Graph, c: ModelConfig, fam: Any, weights: Any, h: Any) -> Any:
    """The final ``norm`` of each sequence's last token (``[B, hidden]``)."""
    return ops.rms_norm(g, ops.last_token_hidden(g, h), tensor(weights, fam, "norm", None, c.hidden_size), c.rms_norm_eps, "norm")


def lm_head_logits(g: Graph, c: ModelConfig, fam: Any, weights: Any, last: Any, embed: Any) -> None:
    """``lm_head`` (tied to ``embed`` when ``tie_word_embeddings``; vocabulary-parallel over
    tensor-parallel ranks) and the logits output. A quantized ``lm_head`` (GPTQModel's
    ``"lm_head": true``, a GGUF's ``output.weight``) stays quantized, as the decoder's linears."""
    lm_head = (
        embed if c.tie_word_embeddings else linear_weight(weights, fam.tensor("lm_head", None, ".weight"), (c.vocab_size, c.hidden_size), lazy=True)
    )
    ops.logits_output(g, ops.linear(g, last, lm_head, None, "lm_head", parallel="vocab"))


#: ``mlp(g, config, family, weights, layer, x) -> [..., hidden]``: one decoder layer's MLP block
MlpBlock = Callable[[Graph, ModelConfig, Any, Any, int, Any], Any]


def dense_mlp_block(g: Graph, c: ModelConfig, fam: Any, weights: Any, i: int, x: Any) -> Any:
    """The Llama MLP of layer ``i`` (:func:`dense_mlp` at ``intermediate_size``), an :data:`MlpBlock`."""
    return dense_mlp(g, c, fam, weights, i, x, c.intermediate_size)


def decoder(g: Graph, config: ModelConfig, weights: Any, mlp: MlpBlock = dense_mlp_block) -> None:
    """The Llama-style decoder with each layer's MLP block from ``mlp`` (a mixture of experts
    swaps it: :mod:`trtcore.models.moe`): inputs, embeddings, per layer RMSNorm, attention,
    residual, RMSNorm, ``mlp``, residual; the final norm and the LM head (I/O: ``g.kv_mode``).

    Raises:
        MissingTensorError / TensorShapeError: a checkpoint tensor is absent or mis-shaped.
    """
    c, fam = config, family_of(config.model_type)
    E = c.hidden_size
    inputs = ops.model_inputs(g)
    spec = rope_spec(c, fam.partial_rotary_factor)  # the family's rule: rotate what transformers rotates
    embed = tensor(weights, fam, "embed_tokens", None, c.vocab_size, E, lazy=True)
    with g.scope("model"):
        h = ops.embedding(g, inputs.input_ids, embed, "embed_tokens")
        for i in range(c.num_hidden_layers):
            with g.scope(f"layers.{i}"):
                x = ops.rms_norm(g, h, tensor(weights, fam, "input_layernorm", i, E), c.rms_norm_eps, "input_layernorm")
                h = ops.add(g, h, attention_block(g, c, fam, weights, i, x, spec), "attn_residual")
                x = ops.rms_norm(g, h, tensor(weights, fam, "post_attention_layernorm", i, E), c.rms_norm_eps, "post_attention_layernorm")
                h = ops.add(g, h, mlp(g, c, fam, weights, i, x), "mlp_residual")
        last = final_norm(g, c, fam, weights, h)
    lm_head_logits(g, c, fam, weights, last, embed)


def build(g: Graph, config: ModelConfig, weights: Any) -> None:
    """Add the whole decoder to ``g.network``: inputs, layers, outputs (I/O: ``g.kv_mode``).

    Args:
        g: the graph (TensorRT module, network, dtype, KV cache contract).
        config: the model config (Hugging Face field names).
        weights: a :class:`trtcore.checkpoint.LoadReport` or :class:`~trtcore.checkpoint.Checkpoint`
            (``get(name, shape=...)``); names from the family's ``tensor_names``.

    Raises:
        MissingTensorError / TensorShapeError: a checkpoint tensor is absent or mis-shaped.
    """
    decoder(g, config, weights)


ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
#: the family builds tensor-parallel ranks (``Graph.mapping``; o_proj row-, lm_head vocabulary-parallel here, the rest in the ops)
TENSOR_PARALLEL = True
