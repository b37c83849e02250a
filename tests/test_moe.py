"""``MixtralForCausalLM``, ``Qwen2MoeForCausalLM``, ``Qwen3MoeForCausalLM`` against transformers on
tiny random checkpoints.

The checkpoints are written by transformers itself (``*Config`` + ``*ForCausalLM``, every
parameter re-drawn with std >= 0.1 by :func:`hf_models.redraw_weights`, saved with
``save_pretrained``, which writes the Hub's per-expert layout); the variants cover top-1 and
top-2 (and top-3) routing, ``norm_topk_prob`` on and off, Qwen2-MoE's gated shared expert,
``mlp_only_layers`` and ``decoder_sparse_step`` (dense layers among sparse ones), Qwen3-MoE's
q/k norms with an explicit ``head_dim``, Mixtral's sliding window, and transformers 5's fused
expert tensors (``mlp.experts.gate_up_proj`` / ``down_proj``, ``mlp.gate``), rewritten from
the saved checkpoint.

References come from transformers (eager attention and experts, float64): log-probabilities of
every vocabulary token within 1e-4 relative (``|ours - hf| <= 1e-4 * max(1, |hf|)``) at the
last prompt position and the 16 decode steps after it, greedy tokens equal for 32 steps, with
both KV cache modes on the reference backend (the experts plugin's NumPy contract), and once
with the dense-layers experts; ``tensorrt_rtx`` builds each in float16 (dense-layers experts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import ModelStore, assert_matches_hf, hf_greedy, hf_logits, load_hf, random_prompt, redraw_weights

from trtcore import LLM, SamplingParams
from trtcore.config import ModelConfig, load_config
from trtcore.errors import ConfigError

PROMPT_LEN = 40
LOGPROB_STEPS = 17  # the last prompt position + 16 decode steps
GREEDY_STEPS = 32
RTOL = 1e-4
KV_CACHES = ("paged", "contiguous")
CLASSES = {"mixtral": "Mixtral", "qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe"}


@dataclass(frozen=True)
class Moe:
    name: str
    family: str
    experts: int
    top_k: int
    fields: dict[str, Any] = field(default_factory=dict)
    fused: bool = False  # rewrite the experts into transformers 5's fused tensors
    seed: int = 0
    vocab_size: int = 160

    def __hash__(self) -> int:
        return hash(self.name)


MOE = {
    v.name: v
    for v in [
        Moe("mixtral_top2", "mixtral", 4, 2, seed=31),
        Moe("mixtral_top1_sw8_fused", "mixtral", 4, 1, {"sliding_window": 8}, fused=True, seed=32),
        Moe("qwen2_moe_shared_dense1", "qwen2_moe", 4, 2, {"norm_topk_prob": False, "mlp_only_layers": [1]}, seed=33),
        Moe("qwen2_moe_norm_step2_fused", "qwen2_moe", 6, 3, {"norm_topk_prob": True, "decoder_sparse_step": 2, "qkv_bias": False}, fused=True, seed=34),
        Moe("qwen3_moe_top2_norm_hd24", "qwen3_moe", 8, 2, {"norm_topk_prob": True, "head_dim": 24}, seed=35),
        Moe("qwen3_moe_top1_dense0", "qwen3_moe", 4, 1, {"norm_topk_prob": False, "mlp_only_layers": [0]}, seed=36),
    ]
}


def hf_config(v: Moe) -> Any:
    import transformers

    kwargs: dict[str, Any] = dict(
        vocab_size=v.vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5, num_experts_per_tok=v.top_k,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0}, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    if v.family == "mixtral":
        kwargs["num_local_experts"] = v.experts
    else:
        kwargs.update(num_experts=v.experts, moe_intermediate_size=40)
    if v.family == "qwen2_moe":
        kwargs["shared_expert_intermediate_size"] = 56
    kwargs.update(v.fields)
    return getattr(transformers, f"{CLASSES[v.family]}Config")(**kwargs)


def fuse_experts(path: Path, v: Moe) -> None:
    """Rewrite the saved per-expert tensors as transformers 5's in-memory ones."""
    from safetensors.numpy import load_file, save_file

    from trtcore.families import MOE_EXPERT_LINEARS

    f = path / "model.safetensors"
    t = load_file(f)
    gate, up, down = MOE_EXPERT_LINEARS[v.family]
    for i in range(2):
        old = f"model.layers.{i}.block_sparse_moe" if v.family == "mixtral" else f"model.layers.{i}.mlp"
        if f"{old}.gate.weight" not in t:
            continue  # a dense layer
        stack = {p: np.stack([t.pop(f"{old}.experts.{e}.{p}.weight") for e in range(v.experts)]) for p in (gate, up, down)}
        t[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.concatenate([stack[gate], stack[up]], axis=1)
        t[f"model.layers.{i}.mlp.experts.down_proj"] = stack[down]
        t[f"model.layers.{i}.mlp.gate.weight"] = t.pop(f"{old}.gate.weight")
    save_file(t, f, metadata={"format": "pt"})


def write(v: Moe, path: Path) -> Path:
    import torch
    import transformers

    torch.manual_seed(v.seed)
    model = getattr(transformers, f"{CLASSES[v.family]}ForCausalLM")(hf_config(v))
    redraw_weights(model, v.seed)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    return path


class _Store(ModelStore):
    """The module's checkpoints: transformers loads the Hub layout, trtcore runs the variant's."""

    def hub_dir(self, name: str) -> Path:
        """The checkpoint as save_pretrained wrote it (transformers loads it)."""
        key = name + "/hub"
        if key not in self._dirs:
            self._dirs[key] = write(MOE[name], self.root / name / "hub")
        return self._dirs[key]

    def dir(self, name: str) -> Path:
        """What trtcore runs: the saved checkpoint, or its fused rewrite."""
        v = MOE[name]
        if not v.fused:
            return self.hub_dir(name)
        if name not in self._dirs:
            import shutil

            d = self.root / name / "fused"
            shutil.copytree(self.hub_dir(name), d)
            fuse_experts(d, v)
            self._dirs[name] = d
        return self._dirs[name]

    def hf(self, name: str, dtype: str = "float64") -> Any:
        if (name, dtype) not in self._hf:
            self._hf[name, dtype] = load_hf(self.hub_dir(name), dtype)
        return self._hf[name, dtype]



@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> _Store:
    return _Store(tmp_path_factory.mktemp("moe"), lambda name, path: write(MOE[name], path))


def _prompt(name: str) -> list[int]:
    v = MOE[name]
    return random_prompt(np.random.default_rng([v.seed, PROMPT_LEN]), PROMPT_LEN, v.vocab_size)


def _check_against_hf(llm: LLM, store: _Store, name: str) -> None:
    p = _prompt(name)
    params = SamplingParams(temperature=0, max_tokens=GREEDY_STEPS, ignore_eos=True, logprobs=MOE[name].vocab_size)
    [out] = llm.generate(p, params)
    assert_matches_hf(out, *hf_greedy(store.hf(name), p, GREEDY_STEPS), LOGPROB_STEPS, RTOL)


# ---------------------------------------------------------------------------------------
# the checkpoints are what they claim to be


@pytest.mark.parametrize("name", list(MOE))
def test_checkpoint_is_the_variant(store: _Store, name: str) -> None:
    from trtcore.models.moe import is_sparse, num_experts

    v = MOE[name]
    hf = store.hf(name)
    cfg = load_config(store.dir(name))
    assert num_experts(cfg) == v.experts and cfg.family_fields["num_experts_per_tok"] == v.top_k
    assert all(p.std() >= 0.09 for n, p in hf.named_parameters() if "norm" not in n and p.dim() > 1)
    sparse = [type(layer.mlp).__name__.endswith("SparseMoeBlock") for layer in hf.model.layers]
    assert sparse == [is_sparse(cfg, i) for i in range(2)] and any(sparse)
    if v.family != "mixtral":
        assert cfg.family_fields["norm_topk_prob"] == v.fields["norm_topk_prob"] == hf.config.norm_topk_prob
    names = set(__import__("safetensors").safe_open(str(store.dir(name) / "model.safetensors"), "np").keys())
    assert any(n.endswith("experts.gate_up_proj") for n in names) == v.fused
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


def test_routing_fields_change_hf_logits(store: _Store) -> None:
    """norm_topk_prob, num_experts_per_tok and the shared expert's gate matter on the test prompt
    (so the comparisons test them)."""
    name = "qwen2_moe_shared_dense1"
    p = _prompt(name)
    ref = hf_logits(store.hf(name), p)[-1]
    for override in ({"norm_topk_prob": True}, {"num_experts_per_tok": 1}, {"mlp_only_layers": []}):
        other = hf_logits(load_hf(store.hub_dir(name), **override), p)[-1]
        assert np.abs(other - ref).max() > 0.05, override


# ---------------------------------------------------------------------------------------
# log-probabilities and greedy tokens against transformers


@pytest.mark.parametrize("kv_cache", KV_CACHES)
@pytest.mark.parametrize("name", list(MOE))
def test_logprobs_and_greedy_match_hf(store: _Store, name: str, kv_cache: str) -> None:
    _check_against_hf(store.llm(name, kv_cache), store, name)


@pytest.mark.parametrize("name", ["mixtral_top2", "qwen2_moe_norm_step2_fused"])
def test_dense_layers_experts_match_hf(store: _Store, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The composed fallback (every expert on every token, masked by the routing weights), as
    tensorrt_rtx builds it, on the reference backend."""
    from trtcore.plan import BuildPlan

    plain = BuildPlan.implementations.fget  # type: ignore[attr-defined]
    monkeypatch.setattr(BuildPlan, "implementations", property(lambda self: {**plain(self), "moe_experts": "layers"}))
    llm = LLM(store.dir(name), backend="reference", dtype="float32", kv_cache="contiguous", progress=False)
    from trtcore.calibration import network_tensor_names

    sparse = 0 if name == "mixtral_top2" else 1
    block = "output" if name == "mixtral_top2" else "experts"
    assert f"model.layers.{sparse}.mlp.{block}.routed" in network_tensor_names(llm)  # the dense path's weighting
    _check_against_hf(llm, store, name)


# ---------------------------------------------------------------------------------------
# config fields: honoured or refused


def _config(family: str, **fields: Any) -> dict[str, Any]:
    d = {"architectures": [f"{CLASSES[family]}ForCausalLM"], "model_type": family, "vocab_size": 100, "hidden_size": 64,
         "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}  # fmt: skip
    d.update(fields)
    return d


@pytest.mark.parametrize("family", list(CLASSES))
def test_config_defaults_are_transformers(family: str) -> None:
    import transformers

    hf = getattr(transformers, f"{CLASSES[family]}Config")(
        vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    cfg = ModelConfig.from_dict(_config(family))
    for k, v in cfg.family_fields.items():
        assert getattr(hf, k) == v, k
    assert cfg.rope_theta == hf.rope_parameters["rope_theta"] and cfg.rms_norm_eps == hf.rms_norm_eps
    assert cfg.num_key_value_heads == hf.num_key_value_heads and cfg.max_position_embeddings == hf.max_position_embeddings
    assert (cfg.bos_token_id, cfg.eos_token_id) == (hf.bos_token_id, tuple(np.atleast_1d(hf.eos_token_id or [])))
    assert cfg.head_dim == 16 and cfg.sliding_window is None and cfg.hidden_act == hf.hidden_act
    assert cfg.qkv_bias == {"mixtral": False, "qwen2_moe": True, "qwen3_moe": False}[family] and not cfg.mlp_bias
    assert cfg.o_bias == (family == "qwen3_moe" and hf.attention_bias)


def test_config_spellings_and_window_rules() -> None:
    # transformers' attribute_map: Mixtral's num_experts, Qwen3-MoE's num_local_experts
    assert ModelConfig.from_dict(_config("mixtral", num_experts=3)).family_fields["num_local_experts"] == 3
    assert ModelConfig.from_dict(_config("qwen3_moe", num_local_experts=5, num_experts_per_tok=2)).family_fields["num_experts"] == 5
    # Qwen2-MoE's qkv_bias; its sliding window on the even layers below max_window_layers
    assert not ModelConfig.from_dict(_config("qwen2_moe", qkv_bias=False)).qkv_bias
    q2 = ModelConfig.from_dict(_config("qwen2_moe", num_hidden_layers=4, use_sliding_window=True, sliding_window=8, max_window_layers=2))
    assert q2.layer_types == ("sliding_attention", "full_attention", "full_attention", "full_attention") and q2.sliding_window == 8
    # Qwen3-MoE: one window for every layer; Mixtral: the window when set
    q3 = ModelConfig.from_dict(_config("qwen3_moe", use_sliding_window=True, sliding_window=8))
    assert q3.layer_types == ("sliding_attention",) * 2 and q3.sliding_window == 8
    assert ModelConfig.from_dict(_config("mixtral", sliding_window=16)).layer_types == ("sliding_attention",) * 2
    # training-only fields are accepted and change nothing
    assert ModelConfig.from_dict(_config("mixtral", router_jitter_noise=0.1, output_router_logits=True)).family_fields["router_jitter_noise"] == 0.1


def test_layer_types_follow_transformers() -> None:
    import transformers

    hf = transformers.Qwen2MoeConfig(num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=5, use_sliding_window=True, max_window_layers=3, sliding_window=8)
    cfg = ModelConfig.from_dict(_config("qwen2_moe", num_hidden_layers=5, use_sliding_window=True, max_window_layers=3, sliding_window=8))
    assert list(cfg.layer_types) == hf.layer_types


@pytest.mark.parametrize(
    "family, fields, match",
    [
        ("mixtral", {"num_experts_per_tok": 5, "num_local_experts": 4}, "num_experts_per_tok"),
        ("mixtral", {"num_local_experts": 0}, "num_local_experts"),
        ("qwen2_moe", {"hidden_act": "gelu"}, "hidden_act"),
        ("qwen3_moe", {"mlp_only_layers": "0"}, "mlp_only_layers"),
        ("qwen3_moe", {"norm_topk_prob": 1}, "norm_topk_prob"),
        ("qwen2_moe", {"decoder_sparse_step": 0}, "decoder_sparse_step"),
        ("qwen3_moe", {"moe_intermediate_size": -1}, "moe_intermediate_size"),
    ],
)
def test_config_fields_trtcore_cannot_honour_are_refused(family: str, fields: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_dict(_config(family, **fields))


def test_no_experts_is_all_dense(tmp_path: Path) -> None:
    from trtcore.models.moe import is_sparse

    cfg = ModelConfig.from_dict(_config("qwen3_moe", num_experts=0))
    assert not any(is_sparse(cfg, i) for i in range(2))


def test_family_records() -> None:
    from trtcore.families import family_of
    from trtcore.models import SUPPORTED_ARCHITECTURES, family_for

    assert family_of("mixtral").tensor("experts", 3, ".1.w2.weight") == "model.layers.3.block_sparse_moe.experts.1.w2.weight"
    assert family_of("mixtral").tensor("router_fused", 0) == "model.layers.0.mlp.gate.weight"
    assert family_of("qwen2_moe").tensor("shared_expert_gate", 1) == "model.layers.1.mlp.shared_expert_gate.weight"
    for arch in ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"):
        assert arch in SUPPORTED_ARCHITECTURES and arch in family_for(arch).ARCHITECTURES


# ---------------------------------------------------------------------------------------
# tensorrt_rtx builds it; trtcore check --bisect aligns it


@pytest.mark.parametrize("name", list(MOE))
def test_rtx_builds_float16(store: _Store, name: str) -> None:
    pytest.importorskip("tensorrt_rtx")
    import tensorrt_rtx as trt

    from trtcore.builder import BuildConfig, build_engine, define_network
    from trtcore.checkpoint import Checkpoint

    with Checkpoint(store.dir(name)) as weights:
        d = define_network(trt, load_config(store.dir(name)), weights, BuildConfig(dtype="float16", max_batch_size=2, max_seq_len=64))
        engine = build_engine(d, "sm89")
    assert len(engine) > 1000


@pytest.mark.parametrize("name", ["mixtral_top2", "qwen2_moe_shared_dense1", "qwen3_moe_top2_norm_hd24"])
def test_bisect_is_within_tolerance(store: _Store, name: str) -> None:
    from trtcore.check import NOT_CAPTURED, OK, compare

    report = compare(store.dir(name), _prompt(name)[:12])
    assert report.first_divergence is None, report.table()
    statuses = {m.module: m.status for m in report.modules}
    assert set(statuses.values()) <= {OK, NOT_CAPTURED}
    from trtcore.models.moe import is_sparse

    cfg = load_config(store.dir(name))
    for i in range(2):  # every sparse block is compared; a dense one has no mlp.output
        assert statuses[f"model.layers.{i}.mlp"] == (OK if is_sparse(cfg, i) else NOT_CAPTURED)


def test_bench_shape_is_a_mixtral_config() -> None:
    """bench/bench_moe.py's shape parses for trtcore and for transformers (the lead runs it on the GPU)."""
    import importlib.util

    import transformers

    spec = importlib.util.spec_from_file_location("bench_moe", Path(__file__).parents[1] / "bench" / "bench_moe.py")
    bench = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(bench)  # type: ignore[union-attr]
    shape = {**bench.MIXTRAL_8X7B, "num_hidden_layers": 2}
    cfg = ModelConfig.from_dict(shape)
    assert cfg.family_fields["num_local_experts"] == 8 and cfg.head_dim == 128
    fields = {k: v for k, v in shape.items() if k not in ("architectures", "model_type", "rope_theta")}
    hf = transformers.MixtralConfig(**fields, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    assert hf.num_local_experts == 8 and hf.num_experts_per_tok == 2
    # two layers: attention 2 * 4096 * (4096 + 1024) values, router 8 * 4096, two experts 3 * 4096 * 14336
    per_layer = 2 * 4096 * 5120 + 8 * 4096 + 2 * 3 * 4096 * 14336
    assert bench.active_bytes(shape) == 2 * (2 * per_layer + 32000 * 4096)


def perturbed_experts(store: _Store, name: str, dst: Path) -> Path:
    """``store.dir(name)`` (a Mixtral) copied to ``dst`` with layer 1's experts' ``w2`` scaled by 1.01."""
    import shutil

    from safetensors.numpy import load_file, save_file

    shutil.copytree(store.dir(name), dst)
    t = load_file(dst / "model.safetensors")
    for e in range(MOE[name].experts):
        key = f"model.layers.1.block_sparse_moe.experts.{e}.w2.weight"
        t[key] = t[key] * np.float32(1.01)
    save_file(t, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_bisect_names_a_perturbed_expert_layer(store: _Store, tmp_path: Path) -> None:
    """trtcore runs a copy whose layer-1 experts' ``w2`` are scaled by 1.01, transformers the
    original (``--reference``): the first divergence is layer 1's MoE block."""
    from trtcore.check import compare

    name = "mixtral_top2"
    d = perturbed_experts(store, name, tmp_path / "perturbed")
    report = compare(d, _prompt(name)[:12], reference=store.dir(name))
    assert report.first_divergence is not None and report.first_divergence.module == "model.layers.1.mlp", report.table()


def test_quantized_experts_are_refused_by_name(store: _Store, tmp_path: Path) -> None:
    """A GPTQ checkpoint whose experts are quantized too (Qwen1.5-MoE-A2.7B-Chat-GPTQ-Int4,
    vllm-project/vllm#4331) is refused with what to do (trtcore reads experts as float tensors):
    keep them unquantized or load the float checkpoint. It stopped with an internal
    "read it with quantized()" before."""
    import json

    from quant_packers import pack_gptq, quantize
    from safetensors.numpy import load_file, save_file

    from trtcore.errors import CheckpointError

    src = store.dir("mixtral_top2")
    tensors = load_file(str(src / "model.safetensors"))
    rng = np.random.default_rng(5)
    out: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        prefix = name.removesuffix(".weight")
        if name.endswith(".weight") and ".experts." in name:
            qz = quantize(value.astype(np.float64), 4, 32, sym=True, rng=rng, min_zero=1)
            out |= {f"{prefix}.{k}": np.ascontiguousarray(v) for k, v in pack_gptq(qz, 4, "gptq").items()}
        else:
            out[name] = value
    dst = tmp_path / "gptq_experts"
    dst.mkdir()
    save_file(out, str(dst / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True, "desc_act": False, "checkpoint_format": "gptq"}
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"experts\.0\.w1\.weight' is gptq-quantized .* not MoE experts .* modules_to_not_convert"):
        LLM(dst, backend="reference", device="cpu", dtype="float32", max_batch_size=1, max_seq_len=64, progress=False)
