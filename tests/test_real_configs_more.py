"""More real-world ``config.json`` blocks, beyond :mod:`test_real_configs`: the ones that
showed a defect, each against the behaviour of the reference implementation.

GPTQ ``quantization_config.dynamic`` (GPTQModel; AutoRound's GPTQ export writes it too):
per-module overrides keyed by a regular expression, ``"+:<re>"`` (or a bare ``"<re>"``) to
change a module's ``bits`` / ``group_size`` / ..., ``"-:<re>"`` to leave it unquantized;
the first pattern that ``re.match``-es the module's name wins (vLLM's
``get_dynamic_override``). The config text below is the one a public AutoRound export script
writes (``"lm_head": true`` with ``"+:.*lm_head$": {"bits": 8}`` next to ``"-:"`` rules), and
the per-layer form vLLM's ``GPTQConfig`` docstring (vllm-project/vllm,
``vllm/model_executor/layers/quantization/gptq.py``) documents,
``r"+:.*\\.(?:1[0-5])\\..*": {"bits": 8}``, moved to layer 1 of the tiny Llama.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import VARIANTS, hf_greedy, load_hf, random_prompt, write_checkpoint
from quant_packers import pack_gptq, quantize
from safetensors.numpy import load_file, save_file

from trtcore import LLM, SamplingParams
from trtcore.errors import UnsupportedQuantizationError
from trtcore.quant_formats import detect_quantization

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

#: an AutoRound / GPTQModel GPTQ export: 4-bit by default, layer 1 in 8 bits, attention of
#: layer 0 left in bfloat16 (``"-:"``)
GPTQ_DYNAMIC: dict[str, Any] = {
    "quant_method": "gptq",
    "bits": 4,
    "group_size": 32,
    "desc_act": False,
    "sym": True,
    "lm_head": False,
    "checkpoint_format": "gptq",
    "dynamic": {
        "-:.*\\.layers\\.0\\.self_attn.*": {},
        "+:.*\\.layers\\.1\\..*": {"bits": 8},
        "-:.*embed.*": {},
    },
}


#: AutoRound's GPTQ export as written: a quantized lm_head in 8 bits
GPTQ_DYNAMIC_LM_HEAD: dict[str, Any] = GPTQ_DYNAMIC | {
    "lm_head": True,
    "dynamic": {"+:.*lm_head$": {"bits": 8}, "-:.*self_attn.*": {}, "-:.*embed.*": {}},
}


def _bits_of(config: dict[str, Any], module: str) -> int | None:
    """What the two configs' rules make of ``module`` (None: not quantized)."""
    if config is GPTQ_DYNAMIC:
        if module == "lm_head" or ".layers.0.self_attn." in module:
            return None
        return 8 if ".layers.1." in module else 4
    if ".self_attn." in module:
        return None
    return 8 if module == "lm_head" else 4


def _checkpoints(tmp_path: Path, config: dict[str, Any], with_g_idx: bool) -> tuple[Path, Path]:
    v = VARIANTS["llama3_rope"]
    src = write_checkpoint(v, tmp_path / "src")
    rng = np.random.default_rng(11)
    packed: dict[str, np.ndarray] = {}
    dense: dict[str, np.ndarray] = {}
    for name, value in load_file(str(src / "model.safetensors")).items():
        prefix = name.removesuffix(".weight")
        bits = _bits_of(config, prefix) if prefix.rsplit(".", 1)[-1] in (*LINEARS, "lm_head") else None
        if bits is None:
            packed[name] = dense[name] = value
            continue
        qz = quantize(value.astype(np.float64), bits, 32, sym=True, rng=rng, act_order=False, min_zero=1)
        packed |= {f"{prefix}.{k}": np.ascontiguousarray(t) for k, t in pack_gptq(qz, bits, "gptq", with_g_idx=with_g_idx).items()}
        dense[name] = qz.dequantize().astype(np.float32)
    model_config = json.loads((src / "config.json").read_text())
    assert not model_config["tie_word_embeddings"]  # lm_head is a tensor of its own
    qdir, ddir = tmp_path / "quantized", tmp_path / "dense"
    for d, tensors, cfg in ((qdir, packed, model_config | {"quantization_config": config}), (ddir, dense, model_config)):
        d.mkdir()
        save_file(tensors, str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps(cfg))
    return qdir, ddir


@pytest.mark.filterwarnings("error::UserWarning")  # every packed tensor is read (none unexpected)
@pytest.mark.parametrize("with_g_idx", [True, False])
@pytest.mark.parametrize("config", [GPTQ_DYNAMIC, GPTQ_DYNAMIC_LM_HEAD], ids=["layer1_8bit", "lm_head_8bit"])
def test_gptq_dynamic_per_module_bits_are_honoured(tmp_path: Path, config: dict[str, Any], with_g_idx: bool) -> None:
    """Layer 1's linears (or the lm_head) are 8-bit by the ``dynamic`` override: read as 4-bit
    they failed with a g_idx / shape error that did not name ``dynamic``."""
    qdir, ddir = _checkpoints(tmp_path, config, with_g_idx)
    llm = LLM(qdir, backend="reference", dtype="float32", progress=False)
    prompt = random_prompt(np.random.default_rng(3), 12, VARIANTS["llama3_rope"].vocab_size)
    [out] = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    expected, _ = hf_greedy(load_hf(ddir), prompt, 16)
    assert out.outputs[0].token_ids == expected


@pytest.mark.parametrize(
    ("dynamic", "match"),
    [
        ({"+:.*\\.layers\\.1\\..*": {"bits": 3}}, r"GPTQ dynamic override '\+:\.\*\\\\\.layers.*' bits=3"),
        ({"+:.*lm_head(": {"bits": 8}}, r"GPTQ dynamic pattern '\+:\.\*lm_head\(' "),
        (["+:.*"], r"GPTQ dynamic \['\+:\.\*'\]"),
    ],
)
def test_gptq_dynamic_overrides_trtcore_cannot_read_are_refused(dynamic: Any, match: str) -> None:
    with pytest.raises(UnsupportedQuantizationError, match=match):
        detect_quantization(GPTQ_DYNAMIC | {"dynamic": dynamic})


def test_gptq_dynamic_null_or_empty_is_plain_gptq() -> None:
    for dynamic in (None, {}):
        assert detect_quantization(GPTQ_DYNAMIC | {"dynamic": dynamic}).method == "gptq"


# ---------------------------------------------------------------------------------------
# YaRN ``attn_factor`` (deepseek-ai/DeepSeek-R1-0528-Qwen3-8B's config.json, the text as public
# copies of it on GitHub show it): transformers does not know the key (it logs "Unrecognized
# keys" and keeps the YaRN attention factor 0.1 ln(4) + 1 = 1.139), vLLM multiplies that factor
# by it (1.139 * 0.878 = 1.0). trtcore dropped it without a word; it must ask which is meant.

DEEPSEEK_R1_0528_QWEN3_8B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "max_position_embeddings": 131072,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "attn_factor": 0.8782488562869419},
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def test_yarn_attn_factor_is_refused_naming_it(tmp_path: Path) -> None:
    from trtcore.config import load_config
    from trtcore.errors import ConfigError

    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK_R1_0528_QWEN3_8B))
    with pytest.raises(ConfigError, match=r"'attn_factor' \(0\.8782488562869419\).*'attention_factor'"):
        load_config(tmp_path)


def test_yarn_with_attention_factor_instead_loads(tmp_path: Path) -> None:
    """The spelling transformers and trtcore read: the attention factor itself."""
    from trtcore.config import load_config

    d = json.loads(json.dumps(DEEPSEEK_R1_0528_QWEN3_8B))
    d["rope_scaling"]["attention_factor"] = 1.0
    del d["rope_scaling"]["attn_factor"]
    (tmp_path / "config.json").write_text(json.dumps(d))
    assert load_config(tmp_path).rope_scaling == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32768,
        "attention_factor": 1.0,
    }
