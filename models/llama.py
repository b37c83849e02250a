"""Llama-family decoders: ``LlamaForCausalLM``, ``MistralForCausalLM``, ``Qwen2ForCausalLM``,
``Qwen3ForCausalLM``.

One pre-norm decoder (Touvron et al., arXiv:2302.13971) covers all four; they differ only
in config fields that the ops already take:

* Mistral: sliding-window attention (applied through the attention mask by the runtime);
* Qwen2: bias on the q/k/v projections (``ModelConfig.qkv_bias``);
* Qwen3: RMSNorm on each query/key head before RoPE (``q_norm``/``k_norm``), explicit
  ``head_dim``;
* Llama 3.x: ``llama3`` RoPE scaling (and ``linear`` / ``dynamic`` / ``yarn``).

The network's I/O (contiguous KV cache mode) is described by :func:`io_spec`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtcore import ops
from trtcore.config import ModelConfig
from trtcore.ops import Graph, Tensor
from trtcore.rope import rope_spec


def io_spec(
    config: ModelConfig, dtype: Any, kv_cache: str = "contiguous", block_size: int = 16, attention: str = "layers",
    max_seq_len: int | None = None,
) -> list[tuple[str, Any, tuple[int, ...]]]:
    """Network inputs as ``(name, numpy dtype, shape)``; -1 marks dynamic dimensions.

    ``kv_cache="paged"`` (DESIGN.md, "KV cache modes"): ``T`` packed tokens of ``B``
    sequences, no padding:

    * ``input_ids``, ``position_ids`` int32 ``[T]``;
    * ``kv_cache_pool`` ``[num_layers, num_blocks, 2, num_key_value_heads, block_size,
      head_dim]`` (:mod:`trtcore.runtime.kv_cache`; written in place by the attention plugins);
    * ``block_tables`` int32 ``[B, max_blocks_per_seq]``, ``seq_lens`` int32 ``[B]`` (cached +
      new tokens), ``query_start_loc`` int32 ``[B + 1]`` (offsets of each sequence's tokens);
    * ``last_token_ids`` int32 ``[B]``: packed index of each sequence's last token;
    * with ``dynamic`` RoPE scaling, ``rope_seq_lens`` int32 ``[T]``: each token's sequence
      length in this step (transformers recomputes the frequencies per forward call).

    Output: ``logits`` float32 ``[B, vocab_size]``.

    ``kv_cache="contiguous"``: ``B`` batch, ``S`` new tokens per sequence (padded), ``P`` cached tokens, ``T = P + S``:

    * ``input_ids`` int32 ``[B, S]``, ``position_ids`` int32 ``[B, S]``;
    * ``attention_mask`` float32 ``[B, 1, 1, S, T]``: 0 where query may attend, else a large
      negative number (causal and padding folded in by the runtime), when some layer is
      ``full_attention`` in ``config.layer_types``; ``sliding_attention_mask``, the same with
      the sliding window, when some layer is ``sliding_attention``;
    * ``last_token_ids`` int32 ``[B]``: flat index (``b * S + s``) of each sequence's last
      token, whose logits are returned;
    * ``past_key_values.{i}.key`` / ``.value`` ``[B, num_key_value_heads, P, head_dim]``.

    Outputs: ``logits`` float32 ``[B, vocab_size]``; ``present.{i}.key`` / ``.value``
    ``[B, num_key_value_heads, T, head_dim]`` (past then new, in the engine dtype).

    ``kv_cache="contiguous", attention="native"`` (TensorRT's ``IKVCacheUpdateLayer`` +
    ``IAttention``): a fixed-size cache of ``L = max_seq_len`` slots per sequence (static in
    the network, as ``IKVCacheUpdateLayer`` requires), ``B`` batch, ``S`` new tokens (padded):

    * ``input_ids``, ``position_ids`` int32 ``[B, S]``; ``last_token_ids`` int32 ``[B]`` as above;
    * ``cache_write_positions`` int32 ``[B]``: the slot where sequence ``b``'s first new token
      is written; its ``S`` tokens go to slots ``w[b] .. w[b] + S - 1`` (``w[b] + S <= L``);
    * ``attention_mask`` bool ``[B, 1, S, L]``: True where query ``s`` may read slot ``j``
      (the slot holds a real token at a position not after the query's; padding and
      unwritten slots False), when some layer is ``full_attention``; ``sliding_attention_mask``, the
      same with the sliding window, when some layer is ``sliding_attention``. The mask
      covers the slots written in this step (the cache is updated before attending);
    * ``kv_cache.{i}.key`` / ``.value`` ``[B, num_key_value_heads, L, head_dim]`` (engine dtype).

    Outputs: ``logits`` as above; ``present.{i}.key`` / ``.value``, the updated caches,
    ``[B, num_key_value_heads, L, head_dim]``. They alias ``kv_cache.{i}.*``: TensorRT writes
    the cache in place (bind both to one buffer; ``ICudaEngine.get_aliased_input_tensor``),
    and so does the reference backend.
    """
    if kv_cache == "paged":
        c = config
        paged: list[tuple[str, Any, tuple[int, ...]]] = [
            ("input_ids", np.int32, (-1,)),
            ("position_ids", np.int32, (-1,)),
            ("kv_cache_pool", dtype, (c.num_hidden_layers, -1, 2, c.num_key_value_heads, block_size, c.head_dim)),
            ("block_tables", np.int32, (-1, -1)),
            ("seq_lens", np.int32, (-1,)),
            ("query_start_loc", np.int32, (-1,)),
            ("last_token_ids", np.int32, (-1,)),
        ]
        if rope_spec(c).rope_type == "dynamic":
            paged.append(("rope_seq_lens", np.int32, (-1,)))
        return paged
    if attention == "native":
        if max_seq_len is None:
            raise ValueError("attention='native' needs max_seq_len (the static length of the KV cache inputs)")
        L = int(max_seq_len)
        native: list[tuple[str, Any, tuple[int, ...]]] = [
            ("input_ids", np.int32, (-1, -1)),
            ("position_ids", np.int32, (-1, -1)),
        ]
        for name, kind in (("attention_mask", "full_attention"), ("sliding_attention_mask", "sliding_attention")):
            if kind in config.layer_types:
                native.append((name, np.bool_, (-1, 1, -1, L)))
        native.append(("last_token_ids", np.int32, (-1,)))
        native.append(("cache_write_positions", np.int32, (-1,)))
        for i in range(config.num_hidden_layers):
            for kind in ("key", "value"):
                native.append((f"kv_cache.{i}.{kind}", dtype, (-1, config.num_key_value_heads, L, config.head_dim)))
        return native
    kv = (-1, config.num_key_value_heads, -1, config.head_dim)
    spec: list[tuple[str, Any, tuple[int, ...]]] = [
        ("input_ids", np.int32, (-1, -1)),
        ("position_ids", np.int32, (-1, -1)),
    ]
    for name, kind in (("attention_mask", "full_attention"), ("sliding_attention_mask", "sliding_attention")):
        if kind in config.layer_types:
            spec.append((name, np.float32, (-1, 1, 1, -1, -1)))
    spec.append(("last_token_ids", np.int32, (-1,)))
    for i in range(config.num_hidden_layers):
        spec.append((f"past_key_values.{i}.key", dtype, kv))
        spec.append((f"past_key_values.{i}.value", dtype, kv))
    return spec


def _bias(weights: Any, name: str, size: int, present: bool) -> np.ndarray | None:
    return weights.get(name, shape=(size,)) if present else None


def build(g: Graph, config: ModelConfig, weights: Any) -> None:
    """Add the whole decoder to ``g.network``: inputs (:func:`io_spec`), layers, outputs.

    Args:
        g: the graph (TensorRT module, network, dtype).
        config: the model config (Hugging Face field names).
        weights: a :class:`trtcore.checkpoint.Checkpoint` (``get(name, shape=...)``).

    Raises:
        MissingTensorError / TensorShapeError: a checkpoint tensor is absent or mis-shaped.
    """
    c = config
    E, H, Hkv, D = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    paged = g.implementations.get("kv_cache") == "paged"
    attention = "plugin" if paged else g.implementations.get("attention", "layers")
    block_size = g.block_size
    inputs = {
        name: g.input(name, dt, shape)
        for name, dt, shape in io_spec(c, g.np_dtype, "paged" if paged else "contiguous", block_size, attention, g.max_seq_len)
    }
    heads = (0, H, D) if paged else (0, 0, H, D)
    kv_heads = (0, Hkv, D) if paged else (0, 0, Hkv, D)
    spec = rope_spec(c)
    qk_norm = c.model_type == "qwen3"

    def w(name: str, *shape: int) -> np.ndarray:
        return weights.get(name, shape=tuple(shape))

    embed = w("model.embed_tokens.weight", c.vocab_size, E)
    with g.scope("model"):
        h = ops.embedding(g, inputs["input_ids"], embed, "embed_tokens")
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}"
            with g.scope(f"layers.{i}"):
                x = ops.rms_norm(g, h, w(f"{p}.input_layernorm.weight", E), c.rms_norm_eps, "input_layernorm")
                with g.scope("self_attn"):
                    a = f"{p}.self_attn"
                    q = ops.linear(g, x, w(f"{a}.q_proj.weight", H * D, E), _bias(weights, f"{a}.q_proj.bias", H * D, c.qkv_bias), "q_proj")
                    k = ops.linear(g, x, w(f"{a}.k_proj.weight", Hkv * D, E), _bias(weights, f"{a}.k_proj.bias", Hkv * D, c.qkv_bias), "k_proj")
                    v = ops.linear(g, x, w(f"{a}.v_proj.weight", Hkv * D, E), _bias(weights, f"{a}.v_proj.bias", Hkv * D, c.qkv_bias), "v_proj")
                    q = ops.reshape(g, q, heads, "q_heads")
                    k = ops.reshape(g, k, kv_heads, "k_heads")
                    v = ops.reshape(g, v, kv_heads, "v_heads")
                    if qk_norm:
                        q = ops.rms_norm(g, q, w(f"{a}.q_norm.weight", D), c.rms_norm_eps, "q_norm")
                        k = ops.rms_norm(g, k, w(f"{a}.k_norm.weight", D), c.rms_norm_eps, "k_norm")
                    q, k = ops.rotary(g, q, k, inputs["position_ids"], spec, seq_lens=inputs.get("rope_seq_lens"))
                    if paged:
                        window = c.sliding_window if c.layer_types[i] == "sliding_attention" else 0
                        ctx = ops.paged_attention(
                            g, q, k, v, inputs["kv_cache_pool"], inputs["block_tables"], inputs["seq_lens"],
                            inputs["query_start_loc"], layer_idx=i, num_kv_heads=Hkv, head_dim=D,
                            block_size=block_size, sliding_window=window or 0, scale=D**-0.5,
                        )
                    elif attention == "native":
                        ctx = _native_attention(g, c, i, q, k, v, inputs)
                    else:
                        ctx = _contiguous_attention(g, c, i, q, k, v, inputs)
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
        flat = h if paged else ops.reshape(g, h, (-1, E), "flat_hidden")
        last = ops.gather(g, flat, inputs["last_token_ids"], 0, "last_hidden")
        last = ops.rms_norm(g, last, w("model.norm.weight", E), c.rms_norm_eps, "norm")
    lm_head = embed if c.tie_word_embeddings else w("lm_head.weight", c.vocab_size, E)
    logits = ops.linear(g, last, lm_head, None, "lm_head")
    g.output(ops.cast(g, logits, np.float32, "logits_float"), "logits")


def _contiguous_attention(g: Graph, c: ModelConfig, i: int, q: Tensor, k: Tensor, v: Tensor, inputs: dict[str, Tensor]) -> Tensor:
    """Composed-layers attention of layer ``i`` over the contiguous cache: appends the new
    k/v ``[B, S, Hkv, D]`` to ``past_key_values.{i}.*`` (outputs ``present.{i}.*``)."""
    D = c.head_dim
    k_new = ops.transpose(g, k, (0, 2, 1, 3), "k_bhsd")
    v_new = ops.transpose(g, v, (0, 2, 1, 3), "v_bhsd")
    k_all = ops.concat(g, [inputs[f"past_key_values.{i}.key"], k_new], 2, "k_cache")
    v_all = ops.concat(g, [inputs[f"past_key_values.{i}.value"], v_new], 2, "v_cache")
    g.output(k_all, f"present.{i}.key")
    g.output(v_all, f"present.{i}.value")
    mask = inputs["sliding_attention_mask" if c.layer_types[i] == "sliding_attention" else "attention_mask"]
    return ops.attention(g, q, k_all, v_all, mask, c.num_key_value_heads, D, D**-0.5, "attention")


def _native_attention(g: Graph, c: ModelConfig, i: int, q: Tensor, k: Tensor, v: Tensor, inputs: dict[str, Tensor]) -> Tensor:
    """Native attention of layer ``i`` (``IKVCacheUpdateLayer`` + ``IAttention``): writes the
    new k/v ``[B, S, Hkv, D]`` into ``kv_cache.{i}.*`` at ``cache_write_positions`` (outputs
    ``present.{i}.*``), then attends over all ``max_seq_len`` slots through the bool mask."""
    D = c.head_dim
    mask = inputs["sliding_attention_mask" if c.layer_types[i] == "sliding_attention" else "attention_mask"]
    ctx, k_all, v_all = ops.native_attention(
        g, q, k, v, inputs[f"kv_cache.{i}.key"], inputs[f"kv_cache.{i}.value"], inputs["cache_write_positions"], mask,
        head_dim=D, scale=D**-0.5, name="attention",
    )
    g.output(k_all, f"present.{i}.key")
    g.output(v_all, f"present.{i}.value")
    return ctx


ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
