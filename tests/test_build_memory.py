"""Building a network costs about its weights once (issue 7, "Also" 3: the default model in
float32 peaked at 1.8 GB for 540 MB of weights).

A float16 checkpoint (as the converted default model) with tied embeddings, ~65 MB of
float32 weights, so that the copies dominate Python's own allocations; the peak of all
allocations that tracemalloc sees (NumPy's included; the memory-mapped checkpoint is not
an allocation) while ``LLM(...)`` defines and builds the float32 reference network must stay
under twice the float32 weight bytes.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from trtcore import LLM

E, I, LAYERS, VOCAB, H, HKV = 512, 1536, 4, 8000, 8, 4


def _checkpoint(path: Path) -> int:
    """A tied Llama checkpoint of random float16 weights; returns its float32 byte count."""
    rng = np.random.default_rng(0)
    D = E // H
    shapes = {"model.embed_tokens.weight": (VOCAB, E), "model.norm.weight": (E,)}
    for i in range(LAYERS):
        p = f"model.layers.{i}"
        shapes |= {
            f"{p}.input_layernorm.weight": (E,), f"{p}.post_attention_layernorm.weight": (E,),
            f"{p}.self_attn.q_proj.weight": (H * D, E), f"{p}.self_attn.k_proj.weight": (HKV * D, E),
            f"{p}.self_attn.v_proj.weight": (HKV * D, E), f"{p}.self_attn.o_proj.weight": (E, H * D),
            f"{p}.mlp.gate_proj.weight": (I, E), f"{p}.mlp.up_proj.weight": (I, E), f"{p}.mlp.down_proj.weight": (E, I),
        }
    path.mkdir()
    save_file({n: (0.02 * rng.standard_normal(s)).astype(np.float16) for n, s in shapes.items()}, str(path / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB, "hidden_size": E,
        "intermediate_size": I, "num_hidden_layers": LAYERS, "num_attention_heads": H, "num_key_value_heads": HKV,
        "max_position_embeddings": 256, "tie_word_embeddings": True, "torch_dtype": "float16",
    }
    (path / "config.json").write_text(json.dumps(config))
    return sum(int(np.prod(s)) for s in shapes.values()) * 4


def test_float32_build_peaks_under_twice_the_weights(tmp_path: Path) -> None:
    weights = _checkpoint(tmp_path / "m")
    assert weights > 60e6
    tracemalloc.start()
    try:
        llm = LLM(tmp_path / "m", backend="reference", dtype="float32", device="cpu", kv_cache="contiguous",
                  max_seq_len=32, progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * weights, f"peak {peak / 1e6:.0f} MB for {weights / 1e6:.0f} MB of float32 weights"
    assert llm.build_config.dtype == "float32"
