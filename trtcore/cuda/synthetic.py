"""Random-weight checkpoints in real models' shapes, for the engine's tests and benchmark.

:data:`SHAPES` holds the configs (Hugging Face field names) of SmolLM2-135M, Llama-3.2-1B
and Llama-3-8B; :class:`RandomWeights` answers ``get(name, shape=...)`` like
:class:`trtcore.checkpoint.Checkpoint` with random values that are cheap to make at 8B scale:
every tensor is a slice of one pool of random bfloat16 bit patterns (normal, std 0.02; norm
weights near 1), drawn once, at a random offset per tensor. Values repeat across tensors,
which changes nothing for timing and keeps numerics finite.
"""

from __future__ import annotations

import zlib
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


#: the linear layers of a Llama decoder layer: name suffix -> (rows, columns) as config fields
_LINEARS = {
    "self_attn.q_proj.weight": ("q", "hidden"),
    "self_attn.k_proj.weight": ("kv", "hidden"),
    "self_attn.v_proj.weight": ("kv", "hidden"),
    "self_attn.o_proj.weight": ("hidden", "q"),
    "mlp.gate_proj.weight": ("inter", "hidden"),
    "mlp.up_proj.weight": ("inter", "hidden"),
    "mlp.down_proj.weight": ("hidden", "inter"),
}


class RandomQuantizedWeights(RandomWeights):
    """:class:`RandomWeights` whose decoder linear layers are weight-only quantized: the
    checkpoint interface of :class:`trtcore.quant_formats.QuantizedCheckpoint`
    (``is_quantized(name)``, ``quantized(name)``) with random codes (uniform, symmetric) and
    scales ``0.004 .. 0.006`` (so ``(q - 2^(bits-1)) * s`` has about the pool's std 0.02 at 4
    bits). Embeddings and norms stay bfloat16; ``lm_head`` too, as in published GPTQ / AWQ
    models, unless ``lm_head`` (GPTQModel's ``lm_head=True``).

    Args:
        config: the model's :class:`ModelConfig` (the layers' shapes).
        bits: 4 or 8. group_size: K-elements per scale (0: one per output channel).
        seed: seed of the pool and the codes.
        lm_head: quantize the (untied) ``lm_head`` as well.
    """

    def __init__(self, config: ModelConfig, bits: int = 4, group_size: int = 128, seed: int = 0, lm_head: bool = False):
        super().__init__(seed=seed)
        q = config.num_attention_heads * config.head_dim
        self._dims = {"q": q, "kv": config.num_key_value_heads * config.head_dim, "hidden": config.hidden_size, "inter": config.intermediate_size}
        self.bits, self.group_size = int(bits), int(group_size)
        self._code_rng = np.random.default_rng(seed + 1)
        self._lm_head = (config.vocab_size, config.hidden_size) if lm_head and not config.tie_word_embeddings else None

    def _linear(self, name: str) -> tuple[int, int] | None:
        if name == "lm_head.weight":
            return self._lm_head
        if not name.startswith("model.layers."):
            return None
        suffix = name.split(".", 3)[3]
        dims = _LINEARS.get(suffix)
        return None if dims is None else (self._dims[dims[0]], self._dims[dims[1]])

    def is_quantized(self, name: str) -> bool:
        return self._linear(name) is not None

    def quantized(self, name: str) -> Any:
        """A fresh random :class:`~trtcore.quantization.QuantizedWeight` for linear ``name``
        (every layer its own codes, so no two layers share device memory)."""
        from ..quantization import QuantizedWeight

        shape = self._linear(name)
        if shape is None:
            raise KeyError(name)
        self._given.append(name)
        n, k = shape
        gs = self.group_size or k
        codes = self._code_rng.integers(0, 1 << self.bits, (n, k), dtype=np.uint8)
        scale = 0.005 * 2.0 ** (4 - self.bits)
        scales = self._code_rng.uniform(0.8 * scale, 1.2 * scale, (n, k // gs)).astype(np.float32)
        return QuantizedWeight(codes, scales, None, self.bits, gs)


class RandomFp8Weights(RandomQuantizedWeights):
    """:class:`RandomWeights` whose decoder linear layers are FP8 (E4M3): ``quantized(name)``
    gives a :class:`~trtcore.fp8.Fp8Weight` of uniformly random E4M3 bit patterns (NaN
    patterns replaced by zero) with weight scales ``0.8 .. 1.2 x 3e-4`` (about the pool's std
    0.02; per tensor, one scale for the linears of a packed module, q/k/v and gate/up, as
    ``trtcore quantize`` and ModelOpt write them, so that the build has nothing to requantize:
    :func:`trtcore.fp8.share_tensor_scale`) and, when ``static``, an input scale of ``0.02``
    (else dynamic activation scales).
    Embeddings, norms and ``lm_head`` stay bfloat16, as in published FP8 checkpoints.

    Args:
        config: the model's :class:`ModelConfig` (the layers' shapes).
        strategy: ``"tensor"`` or ``"channel"`` weight scales.
        static: a static input scale per linear (else dynamic).
        seed: seed of the pool and the codes.
    """

    def __init__(self, config: ModelConfig, strategy: str = "tensor", static: bool = True, seed: int = 0):
        super().__init__(config, 8, 0, seed)
        self.strategy, self.static = strategy, bool(static)

    def quantized(self, name: str) -> Any:
        """A fresh random :class:`~trtcore.fp8.Fp8Weight` for linear ``name``."""
        from ..families import LLAMA_PACKED_MODULES
        from ..fp8 import Fp8Weight
        from ..quant_formats import packed_siblings

        shape = self._linear(name)
        if shape is None:
            raise KeyError(name)
        self._given.append(name)
        n, k = shape
        codes = self._code_rng.integers(0, 256, (n, k), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0
        if self.strategy == "channel":
            scales = self._code_rng.uniform(0.8 * 3e-4, 1.2 * 3e-4, n).astype(np.float32)
        else:  # drawn from the packed module's name: its linears share it
            module = packed_siblings(name, LLAMA_PACKED_MODULES)[0]
            scales = np.random.default_rng(zlib.crc32(module.encode())).uniform(0.8 * 3e-4, 1.2 * 3e-4, 1).astype(np.float32)
        return Fp8Weight(codes, scales, np.full(1, 0.02, np.float32) if self.static else None)
