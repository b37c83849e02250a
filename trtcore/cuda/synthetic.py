"""Random-weight checkpoints in real models' shapes, for the engine's tests and benchmark.

:data:`SHAPES` holds the configs (Hugging Face field names) of SmolLM2-135M, Llama-3.2-1B
and Llama-3-8B; :class:`RandomWeights` answers ``get(name, shape=...)`` like
:class:`trtcore.checkpoint.Checkpoint` with random values that are cheap to make at 8B scale:
every tensor is a slice of one pool of random bfloat16 bit patterns (normal, std 0.02; norm
weights near 1), drawn once, at a random offset per tensor. Values repeat across tensors,
which changes nothing for timing and keeps numerics finite.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from ..config import ModelConfig

_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "rms_norm_eps": 1e-5}

#: real models' shapes (their config.json fields that matter for shapes)
SHAPES: dict[str, dict[str, Any]] = {
    "SmolLM2-135M": {
        **_LLAMA,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
    },
    "Llama-3.2-1B": {
        **_LLAMA,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "head_dim": 64,
    },
    "Llama-3-8B": {
        **_LLAMA,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    },
}


def config(name: str, **overrides: Any) -> ModelConfig:
    """The :class:`ModelConfig` of ``SHAPES[name]`` (fields overridden by ``overrides``)."""
    return ModelConfig.from_dict({**SHAPES[name], **overrides}, source=name)


class RandomWeights:
    """``get(name, shape=..., dtype=...)`` of random values (see the module docstring).

    Args:
        seed: seed of the pool.
        pool_size: number of random bfloat16 values in the pool.
        dtype: the NumPy dtype handed out (``ml_dtypes.bfloat16`` by default).
    """

    def __init__(self, seed: int = 0, pool_size: int = 1 << 24, dtype: Any = ml_dtypes.bfloat16):
        rng = np.random.default_rng(seed)
        self._rng = rng
        self.dtype = np.dtype(dtype)
        self._pool = (rng.standard_normal(pool_size, dtype=np.float32) * 0.02).astype(self.dtype)
        self._ones = (1.0 + 0.1 * rng.standard_normal(pool_size // 16, dtype=np.float32)).astype(self.dtype)
        self._given: list[str] = []

    def __iter__(self) -> Iterator[str]:
        """The names handed out so far (a load report finds none unexpected)."""
        return iter(list(self._given))

    def get(self, name: str, shape: Sequence[int] | None = None, dtype: Any = None, *, copy: bool = True) -> np.ndarray:
        """A read-only view of the pool (``copy`` is ignored: the network copies constants anyway)."""
        shape = tuple(int(d) for d in (shape or ()))
        self._given.append(name)
        pool = self._ones if name.endswith("norm.weight") else self._pool
        n = int(np.prod(shape))
        if n <= pool.size:
            start = int(self._rng.integers(0, pool.size - n + 1))
            out = pool[start : start + n]
        else:
            reps = -(-n // pool.size)
            out = np.tile(pool, reps)[:n]
        out = out.reshape(shape)
        if dtype is not None and np.dtype(dtype) != out.dtype:
            out = out.astype(dtype)
        out.flags.writeable = False
        return out

    def __contains__(self, name: str) -> bool:
        return not name.endswith(".bias")
