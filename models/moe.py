"""Mixture-of-experts decoders: ``MixtralForCausalLM`` (Jiang et al., arXiv:2401.04088),
``Qwen2MoeForCausalLM``, ``Qwen3MoeForCausalLM``.

The attention is the Llama family's (:func:`trtcore.models.llama.attention_block`: Mistral's
sliding window for Mixtral, q/k/v bias for Qwen2-MoE, q/k head norms for Qwen3-MoE); the MLP of
a sparse layer is a sparse MoE block (transformers' ``*SparseMoeBlock``):

* the router ``gate`` (a linear to ``num_experts`` logits), then top-k routing
  (:func:`trtcore.ops.topk_routing`): softmax in float32, the ``num_experts_per_tok`` largest,
  renormalized to sum 1 always for Mixtral and when ``norm_topk_prob`` for Qwen;
* the routed SwiGLU experts (:func:`trtcore.ops.moe_experts`, the grouped-GEMM plugin or dense
  layers), ``intermediate_size`` wide for Mixtral, ``moe_intermediate_size`` for Qwen;
* Qwen2-MoE only: a shared expert (a SwiGLU MLP ``shared_expert_intermediate_size`` wide)
  scaled by ``sigmoid(shared_expert_gate(x))``, added to the routed experts' sum.

Qwen's dense layers (``mlp_only_layers``, or ``(i + 1) % decoder_sparse_step != 0``, or no
experts at all) are the Llama MLP ``intermediate_size`` wide. ``router_jitter_noise`` acts only
in training and ``output_router_logits`` / ``router_aux_loss_coef`` only on the training loss:
none changes inference.

Expert weights are read in either layout (:data:`trtcore.families.MOE_TENSOR_NAMES`): the
Hub's per-expert linears, or transformers 5's fused ``experts.gate_up_proj`` / ``down_proj``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtcore import ops
from trtcore.config import ModelConfig
from trtcore.families import MOE_EXPERT_LINEARS, family_of
from trtcore.ops import Graph

from .llama import decoder, dense_mlp, tensor


def num_experts(c: ModelConfig) -> int:
    """The number of routed experts (``num_local_experts`` for Mixtral, ``num_experts`` for Qwen)."""
    return int(c.family_fields["num_local_experts" if c.model_type == "mixtral" else "num_experts"])


def is_sparse(c: ModelConfig, layer: int) -> bool:
    """Whether layer ``layer`` has a sparse MoE block (transformers' ``*DecoderLayer``): every
    Mixtral layer; a Qwen layer not in ``mlp_only_layers`` with ``(layer + 1) %
    decoder_sparse_step == 0`` when there are experts."""
    if c.model_type == "mixtral":
        return True
    f = c.family_fields
    return layer not in f["mlp_only_layers"] and num_experts(c) > 0 and (layer + 1) % int(f["decoder_sparse_step"]) == 0


def expert_weights(c: ModelConfig, weights: Any, layer: int, inter: int) -> tuple[np.ndarray, np.ndarray]:
    """Layer ``layer``'s routed experts as ``gate_up [X, 2 I, E]`` and ``down [X, E, I]``: the
    fused tensors when the checkpoint has them, else the per-expert linears stacked.

    Raises:
        MissingTensorError / TensorShapeError: through ``weights.get``.
    """
    fam = family_of(c.model_type)
    x, e = num_experts(c), c.hidden_size
    fused = fam.tensor("experts_fused", layer, ".gate_up_proj")
    if fused in weights:
        gate_up = weights.get(fused, shape=(x, 2 * inter, e))
        return gate_up, weights.get(fam.tensor("experts_fused", layer, ".down_proj"), shape=(x, e, inter))
    gate, up, down = MOE_EXPERT_LINEARS[c.model_type]
    per = [
        [weights.get(fam.tensor("experts", layer, f".{j}.{p}.weight"), shape=s) for j in range(x)] for p, s in ((gate, (inter, e)), (up, (inter, e)))
    ]
    gate_up = np.concatenate([np.stack(per[0]), np.stack(per[1])], axis=1)
    return gate_up, np.stack([weights.get(fam.tensor("experts", layer, f".{j}.{down}.weight"), shape=(e, inter)) for j in range(x)])


def router_weight(c: ModelConfig, weights: Any, layer: int) -> np.ndarray:
    """The router ``gate`` ``[X, E]``: the Hub's name, or transformers 5's (Mixtral's ``mlp.gate``)."""
    fam = family_of(c.model_type)
    name = fam.tensor("router", layer)
    if name not in weights and fam.tensor("router_fused", layer) in weights:
        name = fam.tensor("router_fused", layer)
    return weights.get(name, shape=(num_experts(c), c.hidden_size))


def sparse_moe_block(g: Graph, c: ModelConfig, weights: Any, layer: int, x: Any) -> Any:
    """Layer ``layer``'s sparse MoE block on ``x [..., hidden]`` (module docstring), scope ``mlp``;
    its output is named ``mlp.output``."""
    fam, f = family_of(c.model_type), c.family_fields
    mixtral = c.model_type == "mixtral"
    inter = c.intermediate_size if mixtral else int(f["moe_intermediate_size"])
    with g.scope("mlp"):
        logits = ops.linear(g, x, router_weight(c, weights, layer), None, "gate")
        routing = ops.topk_routing(g, logits, int(f["num_experts_per_tok"]), normalize=mixtral or bool(f["norm_topk_prob"]), name="router")
        gate_up, down = expert_weights(c, weights, layer, inter)
        if c.model_type != "qwen2_moe":
            return ops.moe_experts(g, x, routing, gate_up, down, "output")
        routed = ops.moe_experts(g, x, routing, gate_up, down, "experts")
        shared = dense_mlp(g, c, fam, weights, layer, x, int(f["shared_expert_intermediate_size"]), "shared_expert", "shared_expert.")
        gate = ops.linear(g, x, tensor(weights, fam, "shared_expert_gate", layer, 1, c.hidden_size), None, "shared_expert_gate")
        scaled = ops.mul(g, ops.sigmoid(g, gate, "shared_expert_gate.sigmoid"), shared, "shared_expert_scaled")
        return ops.add(g, routed, scaled, "output")


def build(g: Graph, config: ModelConfig, weights: Any) -> None:
    """Add the whole decoder to ``g.network``: inputs, layers, outputs (I/O: ``g.kv_mode``).

    Args:
        g: the graph (TensorRT module, network, dtype, KV cache contract).
        config: the model config; ``config.family_fields`` carries the MoE fields.
        weights: ``get(name, shape=...)`` (a :class:`trtcore.checkpoint.LoadReport`); names from
            the family's ``tensor_names``.

    Raises:
        MissingTensorError / TensorShapeError: a checkpoint tensor is absent or mis-shaped.
    """

    def mlp(g: Graph, c: ModelConfig, fam: Any, w: Any, i: int, x: Any) -> Any:
        return sparse_moe_block(g, c, w, i, x) if is_sparse(c, i) else dense_mlp(g, c, fam, w, i, x, c.intermediate_size)

    decoder(g, config, weights, mlp)


ARCHITECTURES = ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")
