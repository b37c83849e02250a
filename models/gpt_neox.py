"""GPT-NeoX decoders: ``GPTNeoXForCausalLM`` (Pythia, GPT-NeoX-20B; Black et al., arXiv:2204.06745).

Where it differs from the Llama family (transformers' ``modeling_gpt_neox.py``):

* LayerNorm with bias (``input_layernorm``, ``post_attention_layernorm``, ``final_layer_norm``;
  epsilon ``layer_norm_eps``) instead of RMSNorm;
* one fused ``attention.query_key_value`` projection whose output rows are interleaved per
  head, ``[H, 3, D]`` (``view(..., H, 3 * D)`` then ``chunk(3, -1)``): split here, on the host,
  into q/k/v weights for :func:`trtcore.ops.self_attention`;
* partial rotary (``rotary_pct`` / ``partial_rotary_factor``, default 0.25), neox pairing;
* ``use_parallel_residual``: ``h + attn(ln1(h)) + mlp(ln2(h))``, else the sequential
  ``h' = h + attn(ln1(h)); h' + mlp(ln2(h'))``;
* an ungated GELU MLP with biases (``dense_h_to_4h`` -> ``hidden_act`` -> ``dense_4h_to_h``);
* an untied output projection ``embed_out`` (tied to ``embed_in`` when ``tie_word_embeddings``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtcore import ops
from trtcore.config import ModelConfig
from trtcore.families import family_of
from trtcore.ops import Graph
from trtcore.rope import rope_spec


def split_query_key_value(weight: np.ndarray, num_heads: int, head_dim: int) -> list[np.ndarray]:
    """GPT-NeoX's fused ``query_key_value`` weight ``[H * 3 * D, E]`` (or bias ``[H * 3 * D]``),
    rows interleaved per head ``[H, 3, D]``, as ``[q, k, v]``, each ``[H * D, E]`` (``[H * D]``)."""
    per_head = np.asarray(weight).reshape((num_heads, 3, head_dim) + weight.shape[1:])
    return [np.ascontiguousarray(per_head[:, j].reshape((num_heads * head_dim,) + weight.shape[1:])) for j in range(3)]


def build(g: Graph, config: ModelConfig, weights: Any) -> None:
    """Add the whole decoder to ``g.network``: inputs, layers, outputs (I/O: ``g.kv_mode``).

    Args:
        g: the graph (TensorRT module, network, dtype, KV cache contract).
        config: the model config; ``config.family_fields`` carries ``use_parallel_residual``
            and ``layer_norm_eps``.
        weights: ``get(name, shape=...)`` (a :class:`trtcore.checkpoint.LoadReport`); names
            from the family's ``tensor_names``.

    Raises:
        MissingTensorError / TensorShapeError: a checkpoint tensor is absent or mis-shaped.
    """
    c, fam = config, family_of(config.model_type)
    E, H, D, I = c.hidden_size, c.num_attention_heads, c.head_dim, c.intermediate_size
    eps, parallel = float(c.family_fields["layer_norm_eps"]), bool(c.family_fields["use_parallel_residual"])
    inputs = ops.model_inputs(g)
    spec = rope_spec(c, fam.partial_rotary_factor)

    def w(role: str, layer: int | None, *shape: int, suffix: str = ".weight") -> np.ndarray:
        return weights.get(fam.tensor(role, layer, suffix), shape=tuple(shape))

    def linear_of(role: str, i: int, out: int, inp: int, bias: bool) -> tuple[np.ndarray, np.ndarray | None]:
        return w(role, i, out, inp), (w(role, i, out, suffix=".bias") if bias else None)

    def norm(role: str, i: int | None, x: Any) -> Any:
        return ops.layer_norm(g, x, w(role, i, E), w(role, i, E, suffix=".bias"), eps, role)

    embed = w("embed_in", None, c.vocab_size, E)
    with g.scope("gpt_neox"):
        h = ops.embedding(g, inputs.input_ids, embed, "embed_in")
        for i in range(c.num_hidden_layers):
            with g.scope(f"layers.{i}"):
                with g.scope("attention"):
                    qkv_w, qkv_b = linear_of("query_key_value", i, 3 * H * D, E, c.qkv_bias)
                    ctx = ops.self_attention(
                        g,
                        i,
                        norm("input_layernorm", i, h),
                        split_query_key_value(qkv_w, H, D),
                        split_query_key_value(qkv_b, H, D) if qkv_b is not None else None,
                        spec,
                        num_heads=H,
                        num_kv_heads=H,
                        head_dim=D,
                        scale=D**-0.5,
                    )
                    dense_w, dense_b = linear_of("dense", i, E, H * D, c.o_bias)
                    attn = ops.linear(g, ctx, dense_w, dense_b, "dense")
                if not parallel:
                    h = ops.add(g, h, attn, "attn_residual")
                mlp = ops.gelu_mlp(
                    g,
                    norm("post_attention_layernorm", i, h),
                    linear_of("dense_h_to_4h", i, I, E, c.mlp_bias),
                    linear_of("dense_4h_to_h", i, E, I, c.mlp_bias),
                    c.hidden_act,
                )
                h = ops.add(g, ops.add(g, mlp, attn, "parallel_sum"), h, "residual") if parallel else ops.add(g, h, mlp, "mlp_residual")
        last = norm("final_layer_norm", None, ops.last_token_hidden(g, h))
    # the checkpoint's name (embed_out; transformers v5 calls the module lm_head and maps the two)
    out_role = "lm_head" if fam.tensor("embed_out") not in weights and fam.tensor("lm_head") in weights else "embed_out"
    lm_head = embed if c.tie_word_embeddings else w(out_role, None, c.vocab_size, E)
    ops.logits_output(g, ops.linear(g, last, lm_head, None, "embed_out"))


ARCHITECTURES = ("GPTNeoXForCausalLM",)
