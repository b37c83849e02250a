"""Phi-3 decoders: ``Phi3ForCausalLM`` (Phi-3 / Phi-3.5 mini; Abdin et al., arXiv:2404.14219).

Phi-3 is the Llama decoder (:mod:`trtcore.models.llama`) with, per transformers'
``modeling_phi3.py``:

* one fused ``self_attn.qkv_proj`` whose output rows are ``q | k | v``
  (``num_attention_heads * head_dim``, then ``num_key_value_heads * head_dim`` twice), and one
  fused ``mlp.gate_up_proj`` whose rows are ``gate | up`` (``chunk(2, dim=-1)``): split here, on
  the host, into the q/k/v and gate/up weights the Llama decoder reads (:class:`SplitFused`);
* no biases anywhere; ``hidden_act`` gates the MLP (SiLU);
* RoPE with ``partial_rotary_factor`` from the config and ``longrope`` scaling (short and long
  factors, chosen per forward call by the sequence length against
  ``original_max_position_embeddings``, with LongRoPE's attention factor on cos and sin; see
  :func:`trtcore.rope.longrope_uses_long` for the behaviour over decode steps with a KV cache);
* ``sliding_window`` (when set) on every layer.

Config rules (defaults, ``su`` / ``yarn`` -> ``longrope``, refusals) are the family's record
in :mod:`trtcore.families`.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from trtcore.config import ModelConfig
from trtcore.families import family_of
from trtcore.ops import Graph

from . import llama


def split_rows(weight: np.ndarray, sizes: tuple[int, ...]) -> list[np.ndarray]:
    """A fused linear weight ``[sum(sizes), in]`` (or bias ``[sum(sizes)]``) as its parts,
    consecutive row blocks of ``sizes`` rows each (``torch.split(sizes, dim=0)``).

    Raises:
        ValueError: the weight does not have ``sum(sizes)`` rows.
    """
    w = np.asarray(weight)
    if w.shape[0] != sum(sizes):
        raise ValueError(f"fused weight has {w.shape[0]} rows, expected {sum(sizes)} = {' + '.join(map(str, sizes))}")
    bounds = np.cumsum((0, *sizes))
    return [w[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


class SplitFused:
    """The checkpoint as the Llama decoder reads it: Phi-3's fused modules served as their parts.

    ``get("model.layers.3.self_attn.k_proj.weight", shape=...)`` reads the fused
    ``model.layers.3.self_attn.qkv_proj.weight`` (``[(H + 2 Hkv) * D, E]``) and returns its k
    rows; ``gate_proj`` / ``up_proj`` come from ``gate_up_proj`` (``[2 I, E]``) alike. Which fused
    module holds which parts is the family's ``packed_modules``; every other name is passed
    through to ``weights``. The last fused tensor read is kept, so each is read once.

    Args:
        weights: a :class:`trtcore.checkpoint.LoadReport` (or anything with ``get(name,
            shape=...)`` and ``in``).
        config: the model config (row counts of each part).
    """

    def __init__(self, weights: Any, config: ModelConfig):
        c, fam = config, family_of(config.model_type)
        self.weights = weights
        self.family = fam
        qd, kvd, inter = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, c.intermediate_size
        rows = {"q_proj": qd, "k_proj": kvd, "v_proj": kvd, "gate_proj": inter, "up_proj": inter}
        self.in_features = c.hidden_size
        #: part role -> (fused role, part sizes of the fused module, index of the part)
        self.parts: dict[str, tuple[str, tuple[int, ...], int]] = {}
        for fused, members in fam.packed_modules.items():
            sizes = tuple(rows[m] for m in members)
            for j, m in enumerate(members):
                self.parts[m] = (fused, sizes, j)
        roles = "|".join(re.escape(r) for r in self.parts)
        self._pattern = re.compile(rf"^model\.layers\.(\d+)\.(?:self_attn|mlp)\.({roles})\.weight$")
        self._last: tuple[str, list[np.ndarray]] | None = None

    def get(self, name: str, shape: Any = None, dtype: Any = None) -> np.ndarray:
        """The tensor ``name``; a part of a fused module is that module's rows (``shape`` is
        the part's, checked by the fused tensor's shape)."""
        m = self._pattern.match(name)
        if m is None:
            return self.weights.get(name, shape=shape, dtype=dtype)
        layer, role = int(m.group(1)), m.group(2)
        fused, sizes, j = self.parts[role]
        fused_name = self.family.tensor(fused, layer)
        if self._last is None or self._last[0] != fused_name:
            self._last = (fused_name, split_rows(self.weights.get(fused_name, shape=(sum(sizes), self.in_features), dtype=dtype), sizes))
        return self._last[1][j]

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str) and self._pattern.match(name):
            return True
        return name in self.weights


def build(g: Graph, config: ModelConfig, weights: Any) -> None:
    """Add the whole decoder to ``g.network``: the Llama decoder over :class:`SplitFused`
    weights (I/O: ``g.kv_mode``; module and tensor names those of the Llama family, so
    ``trtcore check --bisect`` aligns them with transformers' Phi-3 modules).

    Args:
        g: the graph (TensorRT module, network, dtype, KV cache contract).
        config: the model config (``model_type`` ``"phi3"``).
        weights: ``get(name, shape=...)`` (a :class:`trtcore.checkpoint.LoadReport`); names
            from the family's ``tensor_names``.

    Raises:
        MissingTensorError / TensorShapeError: a checkpoint tensor is absent or mis-shaped.
    """
    llama.build(g, config, SplitFused(weights, config))


ARCHITECTURES = ("Phi3ForCausalLM",)
