"""Gemma decoders: ``GemmaForCausalLM``, ``Gemma2ForCausalLM``, ``Gemma3ForCausalLM`` (text).

Gemma (Team Gemma, arXiv:2403.08295), Gemma 2 (arXiv:2408.00118) and Gemma 3 (arXiv:2503.19786),
as transformers' ``modeling_gemma.py`` / ``modeling_gemma2.py`` / ``modeling_gemma3.py``
compute them. Where they differ from the Llama family:

* every RMSNorm scales by ``(1 + weight)`` in float32 before rounding to the dtype
  (:func:`trtcore.ops.rms_norm` with ``offset=1``);
* GeGLU MLP: ``down(gelu_tanh(gate(x)) * up(x))`` (``hidden_act`` / ``hidden_activation``);
* the embeddings are multiplied by ``sqrt(hidden_size)`` rounded to the dtype
  (``*ScaledWordEmbedding``); the output projection is tied to them by default;
* Gemma 2/3: the query scale ``query_pre_attn_scalar ** -0.5``; a norm after the attention
  (``post_attention_layernorm``, on its output) and around the MLP
  (``pre_feedforward_layernorm`` / ``post_feedforward_layernorm``); sliding-window attention
  on the layers ``layer_types`` marks (Gemma 2: every other layer, Gemma 3: five of six);
  final logit soft-capping ``final_logit_softcapping`` (Gemma 2 on by default, Gemma 3 off);
* Gemma 2: attention logit soft-capping ``attn_logit_softcapping`` (transformers' Gemma 3
  attention keeps the field but never applies it, so neither does trtcore);
* Gemma 3: RMSNorm of each query/key head (``q_norm`` / ``k_norm``, offset 1) before RoPE,
  and the sliding layers' own RoPE base ``rope_local_base_freq``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from trtcore import ops
from trtcore.config import ModelConfig
from trtcore.families import family_of
from trtcore.ops import Graph
from trtcore.quant_formats import linear_weight
from trtcore.rope import rope_spec

#: Gemma's RMSNorm weight offset: ``x_normed * (1 + weight)``
NORM_OFFSET = 1.0


def build(g: Graph, config: ModelConfig, weights: Any) -> None:
    """Add the whole decoder to ``g.network``: inputs, layers, outputs (I/O: ``g.kv_mode``).

    Args:
        g: the graph (TensorRT module, network, dtype, KV cache contract).
        config: the model config; ``config.family_fields`` carries Gemma 2/3's
            ``query_pre_attn_scalar``, ``final_logit_softcapping``, Gemma 2
            ``attn_logit_softcapping``, Gemma 3 ``rope_local_base_freq``.
        weights: ``get(name, shape=...)`` (a :class:`trtcore.checkpoint.LoadReport`); names
            from the family's ``tensor_names``.

    Raises:
        MissingTensorError / TensorShapeError: a checkpoint tensor is absent or mis-shaped.
        InvalidArgumentError: attention soft-capping with ``attention='native'``.
    """
    c, fam, ff = config, family_of(config.model_type), config.family_fields
    E, H, Hkv, D, I = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size
    gemma1, gemma3 = c.model_type == "gemma", c.model_type == "gemma3_text"
    inputs = ops.model_inputs(g)
    spec = rope_spec(c, fam.partial_rotary_factor)
    # Gemma 3's sliding layers: the default RoPE of base rope_local_base_freq
    local_spec = rope_spec(dataclasses.replace(c, rope_theta=float(ff["rope_local_base_freq"]), rope_scaling=None)) if gemma3 else spec
    scale = D**-0.5 if gemma1 else float(ff["query_pre_attn_scalar"]) ** -0.5
    attn_cap = ff.get("attn_logit_softcapping")  # Gemma 2 only (Gemma 3's attention does not apply it)
    final_cap = None if gemma1 else ff["final_logit_softcapping"]

    def w(role: str, layer: int | None, *shape: int) -> np.ndarray:
        return weights.get(fam.tensor(role, layer), shape=tuple(shape))

    def lw(role: str, layer: int, out: int, inp: int) -> Any:
        return linear_weight(weights, fam.tensor(role, layer), (out, inp))

    def norm(role: str, i: int | None, x: Any) -> Any:
        return ops.rms_norm(g, x, w(role, i, E), c.rms_norm_eps, role, offset=NORM_OFFSET)

    embed = w("embed_tokens", None, c.vocab_size, E)
    with g.scope("model"):
        h = ops.embedding(g, inputs.input_ids, embed, "embed_tokens", scale=E**0.5)
        for i in range(c.num_hidden_layers):
            sliding = c.layer_types[i] == "sliding_attention"
            with g.scope(f"layers.{i}"):
                x = norm("input_layernorm", i, h)
                with g.scope("self_attn"):
                    roles = {"q_proj": H * D, "k_proj": Hkv * D, "v_proj": Hkv * D}
                    qkv_b = [weights.get(fam.tensor(r, i, ".bias"), shape=(n,)) for r, n in roles.items()] if c.qkv_bias else None
                    ctx = ops.self_attention(
                        g,
                        i,
                        x,
                        [lw(r, i, n, E) for r, n in roles.items()],
                        qkv_b,
                        local_spec if sliding else spec,
                        num_heads=H,
                        num_kv_heads=Hkv,
                        head_dim=D,
                        scale=scale,
                        layer_type=c.layer_types[i],
                        sliding_window=c.sliding_window,
                        head_norms=(w("q_norm", i, D), w("k_norm", i, D), c.rms_norm_eps) if gemma3 else None,
                        head_norm_offset=NORM_OFFSET,
                        softcap=attn_cap,
                    )
                    o_b = weights.get(fam.tensor("o_proj", i, ".bias"), shape=(E,)) if c.o_bias else None
                    attn = ops.linear(g, ctx, lw("o_proj", i, E, H * D), o_b, "o_proj")
                if gemma1:  # Llama's order: post_attention_layernorm normalizes the MLP's input
                    h = ops.add(g, h, attn, "attn_residual")
                    x = norm("post_attention_layernorm", i, h)
                else:
                    h = ops.add(g, h, norm("post_attention_layernorm", i, attn), "attn_residual")
                    x = norm("pre_feedforward_layernorm", i, h)
                gate, up, down = lw("gate_proj", i, I, E), lw("up_proj", i, I, E), lw("down_proj", i, E, I)
                mlp = ops.swiglu_mlp(g, x, gate, up, down, name="mlp", hidden_act=c.hidden_act)
                if not gemma1:
                    mlp = norm("post_feedforward_layernorm", i, mlp)
                h = ops.add(g, h, mlp, "mlp_residual")
        last = norm("norm", None, ops.last_token_hidden(g, h))
    lm_head = embed if c.tie_word_embeddings else linear_weight(weights, fam.tensor("lm_head"), (c.vocab_size, E))  # a quantized one stays so
    logits = ops.linear(g, last, lm_head, None, "lm_head")
    if final_cap:
        logits = ops.soft_cap(g, logits, final_cap, "final_logit_softcapping")
    ops.logits_output(g, logits)


ARCHITECTURES = ("GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM")
