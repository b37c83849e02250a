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

from trtcore import ops
from trtcore.config import ModelConfig
from trtcore.families import family_of
from trtcore.ops import Graph
from trtcore.quant_formats import linear_weight
from trtcore.rope import rope_spec


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
    c, fam = config, family_of(config.model_type)
    E, H, Hkv, D, I = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size
    inputs = ops.model_inputs(g)
    spec = rope_spec(c, fam.partial_rotary_factor)  # the family's rule: rotate what transformers rotates

    lazy = getattr(weights, "lazy", weights.get)  # unread: the ops read the slice a tensor-parallel rank holds

    def w(role: str, layer: int | None, *shape: int, suffix: str = ".weight", read: Any = weights.get) -> Any:
        return read(fam.tensor(role, layer, suffix), shape=tuple(shape))

    def lw(role: str, layer: int | None, out: int, inp: int) -> Any:
        # a linear's weight; a quantized checkpoint's stays quantized (ops.linear then builds the
        # weight-only GEMM: the plugin, or TensorRT's dequantize layer where plugins cannot be hosted)
        return linear_weight(weights, fam.tensor(role, layer, ".weight"), (out, inp), lazy=True)

    embed = w("embed_tokens", None, c.vocab_size, E, read=lazy)
    with g.scope("model"):
        h = ops.embedding(g, inputs.input_ids, embed, "embed_tokens")
        for i in range(c.num_hidden_layers):
            with g.scope(f"layers.{i}"):
                x = ops.rms_norm(g, h, w("input_layernorm", i, E), c.rms_norm_eps, "input_layernorm")
                with g.scope("self_attn"):
                    roles = {"q_proj": H * D, "k_proj": Hkv * D, "v_proj": Hkv * D}
                    qkv_w = [lw(r, i, n, E) for r, n in roles.items()]
                    qkv_b = [w(r, i, n, suffix=".bias", read=lazy) for r, n in roles.items()] if c.qkv_bias else None
                    # Qwen3: RMSNorm on each query/key head before RoPE
                    norms = (w("q_norm", i, D), w("k_norm", i, D), c.rms_norm_eps) if c.model_type == "qwen3" else None
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
                    o_bias = w("o_proj", i, E, suffix=".bias") if c.o_bias else None
                    o = ops.linear(g, ctx, lw("o_proj", i, E, H * D), o_bias, "o_proj", parallel="row")
                h = ops.add(g, h, o, "attn_residual")
                x = ops.rms_norm(g, h, w("post_attention_layernorm", i, E), c.rms_norm_eps, "post_attention_layernorm")
                mlp_shapes = {"gate_proj": (I, E), "up_proj": (I, E), "down_proj": (E, I)}
                biases = tuple(w(r, i, n, suffix=".bias", read=lazy) if c.mlp_bias else None for r, (n, _) in mlp_shapes.items())
                gate, up, down = (lw(r, i, *shape) for r, shape in mlp_shapes.items())
                mlp = ops.swiglu_mlp(g, x, gate, up, down, biases, "mlp")  # type: ignore[arg-type]
                h = ops.add(g, h, mlp, "mlp_residual")
        last = ops.rms_norm(g, ops.last_token_hidden(g, h), w("norm", None, E), c.rms_norm_eps, "norm")
    head_name = fam.tensor("lm_head", None, ".weight")
    lm_head = embed if c.tie_word_embeddings else linear_weight(weights, head_name, (c.vocab_size, E), quantized=False, lazy=True)
    ops.logits_output(g, ops.linear(g, last, lm_head, None, "lm_head", parallel="vocab"))


ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
#: the family builds tensor-parallel ranks (``Graph.mapping``; o_proj row-, lm_head vocabulary-parallel here, the rest in the ops)
TENSOR_PARALLEL = True
