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

from typing import Any

import numpy as np

from trtcore import ops
from trtcore.config import ModelConfig
from trtcore.ops import Graph
from trtcore.rope import rope_spec


def _bias(weights: Any, name: str, size: int, present: bool) -> np.ndarray | None:
    return weights.get(name, shape=(size,)) if present else None


def build(g: Graph, config: ModelConfig, weights: Any) -> None:
    """Add the whole decoder to ``g.network``: inputs, layers, outputs (I/O: ``g.kv_mode``).

    Args:
        g: the graph (TensorRT module, network, dtype).
        config: the model config (Hugging Face field names).
        weights: a :class:`trtcore.checkpoint.Checkpoint` (``get(name, shape=...)``).

    Raises:
        MissingTensorError / TensorShapeError: a checkpoint tensor is absent or mis-shaped.
    """
    c = config
    E, H, Hkv, D = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    inputs = ops.model_inputs(g)
    spec = rope_spec(c)
    qk_norm = c.model_type == "qwen3"

    def w(name: str, *shape: int) -> np.ndarray:
        return weights.get(name, shape=tuple(shape))

    embed = w("model.embed_tokens.weight", c.vocab_size, E)
    with g.scope("model"):
        h = ops.embedding(g, inputs.input_ids, embed, "embed_tokens")
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}"
            with g.scope(f"layers.{i}"):
                x = ops.rms_norm(g, h, w(f"{p}.input_layernorm.weight", E), c.rms_norm_eps, "input_layernorm")
                with g.scope("self_attn"):
                    a = f"{p}.self_attn"
                    q = ops.linear(g, x, w(f"{a}.q_proj.weight", H * D, E), _bias(weights, f"{a}.q_proj.bias", H * D, c.qkv_bias), "q_proj")
                    k = ops.linear(g, x, w(f"{a}.k_proj.weight", Hkv * D, E), _bias(weights, f"{a}.k_proj.bias", Hkv * D, c.qkv_bias), "k_proj")
                    v = ops.linear(g, x, w(f"{a}.v_proj.weight", Hkv * D, E), _bias(weights, f"{a}.v_proj.bias", Hkv * D, c.qkv_bias), "v_proj")
                    q = ops.split_heads(g, q, H, D, "q_heads")
                    k = ops.split_heads(g, k, Hkv, D, "k_heads")
                    v = ops.split_heads(g, v, Hkv, D, "v_heads")
                    if qk_norm:
                        q = ops.rms_norm(g, q, w(f"{a}.q_norm.weight", D), c.rms_norm_eps, "q_norm")
                        k = ops.rms_norm(g, k, w(f"{a}.k_norm.weight", D), c.rms_norm_eps, "k_norm")
                    q, k = ops.rotary(g, q, k, inputs.position_ids, spec, seq_lens=inputs.rope_seq_lens)
                    ctx = ops.cached_attention(
                        g, i, q, k, v, num_kv_heads=Hkv, head_dim=D, scale=D**-0.5, layer_type=c.layer_types[i],
                        sliding_window=c.sliding_window,
                    )
                    o = ops.linear(g, ctx, w(f"{a}.o_proj.weight", E, H * D), _bias(weights, f"{a}.o_proj.bias", E, c.o_bias), "o_proj")
                h = ops.add(g, h, o, "attn_residual")
                x = ops.rms_norm(g, h, w(f"{p}.post_attention_layernorm.weight", E), c.rms_norm_eps, "post_attention_layernorm")
                m = f"{p}.mlp"
                mlp_biases = tuple(_bias(weights, f"{m}.{n}.bias", size, c.mlp_bias) for n, size in (("gate_proj", c.intermediate_size), ("up_proj", c.intermediate_size), ("down_proj", E)))
                mlp = ops.swiglu_mlp(
                    g, x,
                    w(f"{m}.gate_proj.weight", c.intermediate_size, E),
                    w(f"{m}.up_proj.weight", c.intermediate_size, E),
                    w(f"{m}.down_proj.weight", E, c.intermediate_size),
                    mlp_biases,  # type: ignore[arg-type]
                    "mlp",
                )
                h = ops.add(g, h, mlp, "mlp_residual")
        last = ops.last_token_hidden(g, h)
        last = ops.rms_norm(g, last, w("model.norm.weight", E), c.rms_norm_eps, "norm")
    lm_head = embed if c.tie_word_embeddings else w("lm_head.weight", c.vocab_size, E)
    logits = ops.linear(g, last, lm_head, None, "lm_head")
    ops.logits_output(g, logits)


ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
