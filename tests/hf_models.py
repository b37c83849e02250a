"""Tiny random Hugging Face checkpoints for tests, written with ``transformers`` itself.

Not a conftest: test modules import what they need::

    from hf_models import VARIANTS, hf_models  # hf_models is a session-scoped fixture

Each :class:`Variant` describes one checkpoint (family, attention layout, RoPE scaling,
tied embeddings, dtype, shards, config dialect). :func:`write_checkpoint` builds the model
with ``*Config`` + ``*ForCausalLM``, re-draws every weight so that a wrong transpose, a
missing bias or a mis-rotated head changes the logits a lot (projections and embeddings
``std >= 0.1``, norm weights ``1 + 0.1 * randn``, biases ``0.1 * randn``), and saves it
with ``save_pretrained``. For the ``"v4"`` dialect ``config.json`` is then rewritten the
way transformers 4.x wrote it: top-level ``rope_theta``, ``rope_scaling`` (with ``"type"``
or ``"rope_type"``) and ``torch_dtype`` instead of ``rope_parameters`` / ``dtype``.

The session fixture :func:`hf_models` returns a :class:`ModelStore` that writes each
variant once per session (lazily) and hands out its folder and the transformers model
loaded back from that folder (float64, eager attention), the reference the tests compare
trtcore with.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

HIDDEN = 64
LAYERS = 2
INTERMEDIATE = 96


@dataclass(frozen=True)
class Variant:
    """One tiny checkpoint.

    Attributes:
        name: id used in test ids and folder names.
        family: ``"llama"``, ``"mistral"``, ``"qwen2"`` or ``"qwen3"``.
        num_attention_heads / num_key_value_heads: the GQA ratio.
        head_dim: explicit ``head_dim`` (None: ``hidden_size // num_attention_heads``).
        vocab_size: vocabulary size.
        max_position_embeddings: the model's length limit.
        rope_theta: RoPE base (not 10000, so that a dropped value shows).
        rope: the RoPE scaling parameters without ``rope_theta`` (``{"rope_type": ...}``)
            or None for plain RoPE.
        tie_word_embeddings: lm_head shares the embedding matrix.
        sliding_window: Mistral's window; for Qwen2/Qwen3 together with ``use_sliding_window``.
        extra: more config kwargs (e.g. ``use_sliding_window``, ``max_window_layers``).
        dtype: ``"float32"`` or ``"bfloat16"`` (the saved weights' dtype).
        max_shard_size: ``save_pretrained``'s ``max_shard_size`` (None: one file).
        config_style: ``"v5"`` (as transformers 5 writes) or ``"v4"`` (rewritten).
        v4_rope_key: in the v4 dialect, ``"type"`` or ``"rope_type"`` inside ``rope_scaling``.
        seed: torch seed of the weights.
    """

    name: str
    family: str = "llama"
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None
    vocab_size: int = 160
    max_position_embeddings: int = 256
    rope_theta: float = 5000.0
    rope: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    max_shard_size: str | None = None
    config_style: str = "v5"
    v4_rope_key: str = "rope_type"
    seed: int = 0

    @property
    def gqa(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def __hash__(self) -> int:
        return hash(self.name)


#: The variants the model tests run; the GQA ratios 4:1, 2:1 and 1:1, tied and untied
#: embeddings and both config dialects are each covered at least once.
VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in [
        # Llama 3.x RoPE: original length 32, prompts up to 80 tokens cross it.
        Variant(
            "llama3_rope",
            rope={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 32},
            rope_theta=500000.0,
            num_attention_heads=4, num_key_value_heads=2, seed=1,
        ),
        # linear scaling, v4 dialect with "type", tied embeddings, GQA 4:1
        Variant(
            "llama_linear_v4",
            rope={"rope_type": "linear", "factor": 4.0},
            num_attention_heads=8, num_key_value_heads=2, head_dim=None,
            tie_word_embeddings=True, config_style="v4", v4_rope_key="type", seed=2,
        ),
        # dynamic NTK, v4 dialect with "rope_type", MHA (1:1); short max length
        Variant(
            "llama_dynamic_v4",
            rope={"rope_type": "dynamic", "factor": 2.0},
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=160,
            config_style="v4", v4_rope_key="rope_type", seed=3,
        ),
        # Mistral: sliding window 8, much shorter than the sequences
        Variant("mistral_sw8", family="mistral", sliding_window=8, num_attention_heads=4, num_key_value_heads=2, seed=4),
        # Qwen2: q/k/v bias, tied, GQA 4:1, v4 dialect
        Variant("qwen2_bias", family="qwen2", num_attention_heads=4, num_key_value_heads=1,
                tie_word_embeddings=True, config_style="v4", seed=5),
        # Qwen3: explicit head_dim 24 != 64 / 4, q/k RMSNorm, untied, MHA
        Variant("qwen3_qknorm", family="qwen3", num_attention_heads=4, num_key_value_heads=4, head_dim=24, seed=6),
        # Qwen2 with sliding-window layers above max_window_layers=1 (layer 0 full, layer 1 sliding)
        Variant("qwen2_mixed_swa", family="qwen2", num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
                extra={"use_sliding_window": True, "max_window_layers": 1}, seed=7),
        # bfloat16, sharded, v4 dialect (torch_dtype), GQA 2:1
        Variant("llama_bf16_sharded", dtype="bfloat16", max_shard_size="40KB", config_style="v4",
                num_attention_heads=4, num_key_value_heads=2, seed=8),
    ]
}


def _config(v: Variant) -> Any:
    import transformers

    cls = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
    }[v.family]
    kwargs: dict[str, Any] = dict(
        vocab_size=v.vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=v.num_attention_heads,
        num_key_value_heads=v.num_key_value_heads,
        max_position_embeddings=v.max_position_embeddings,
        rms_norm_eps=1e-5,
        tie_word_embeddings=v.tie_word_embeddings,
        rope_parameters={"rope_type": "default", **(v.rope or {}), "rope_theta": v.rope_theta},
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        **v.extra,
    )
    if v.head_dim is not None:
        kwargs["head_dim"] = v.head_dim
    if v.family in ("mistral", "qwen2", "qwen3"):
        kwargs["sliding_window"] = v.sliding_window
    return cls(**kwargs)


def _model_class(family: str) -> Any:
    import transformers

    return {
        "llama": transformers.LlamaForCausalLM,
        "mistral": transformers.MistralForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "qwen3": transformers.Qwen3ForCausalLM,
    }[family]


def redraw_weights(model: Any, seed: int) -> None:
    """Re-draw every parameter so that bugs show: matrices ``std`` 0.125-0.2 (embeddings 1.0,
    or 0.1 when tied to lm_head),
    norm weights ``1 + 0.1 * randn``, biases ``0.1 * randn``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * r)
            elif name.endswith(".bias"):
                p.copy_(0.1 * r)
            elif "embed_tokens" in name:
                # tied: the embedding is also lm_head; with std 1 the logits are so peaked that
                # greedy decoding just repeats the last token and hides every bug
                p.copy_((0.1 if tied else 1.0) * r)
            elif "lm_head" in name:
                p.copy_(0.2 * r)
            else:
                # std 1/sqrt(fan_in) * 1.0 ~= 0.125 for fan_in 64: activations stay O(1)
                p.copy_(max(0.1, p.shape[-1] ** -0.5) * r)


def _v4_rewrite(path: Path, v: Variant) -> None:
    """Rewrite ``config.json`` the way transformers 4.x wrote it."""
    cfg_file = path / "config.json"
    d = json.loads(cfg_file.read_text())
    rp = d.pop("rope_parameters")
    d["rope_theta"] = rp.pop("rope_theta")
    rope_type = rp.pop("rope_type", "default")
    d["rope_scaling"] = None if rope_type == "default" else {v.v4_rope_key: rope_type, **rp}
    if "dtype" in d:
        d["torch_dtype"] = d.pop("dtype")
    d["transformers_version"] = "4.56.2"
    cfg_file.write_text(json.dumps(d, indent=2) + "\n")


def write_checkpoint(v: Variant, path: Path) -> Path:
    """Write variant ``v`` to the folder ``path`` (created); returns ``path``."""
    import torch

    torch.manual_seed(v.seed)
    model = _model_class(v.family)(_config(v))
    redraw_weights(model, v.seed)
    if v.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if v.dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    kwargs: dict[str, Any] = {}
    if v.max_shard_size is not None:
        kwargs["max_shard_size"] = v.max_shard_size
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, **kwargs)
    if v.config_style == "v4":
        _v4_rewrite(path, v)
    if v.max_shard_size is not None:
        assert (path / "model.safetensors.index.json").is_file(), "expected a sharded checkpoint"
        assert len(list(path.glob("model-*.safetensors"))) > 1
    return path


def load_hf(path: Path, dtype: str = "float64", **config_overrides: Any) -> Any:
    """The transformers model in ``path`` (eager attention), cast to ``dtype``, eval mode.

    ``config_overrides`` change config fields before the model is built (e.g.
    ``sliding_window=None``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    for k, val in config_overrides.items():
        setattr(config, k, val)
    # eager experts: transformers 5's grouped_mm (MoE) takes no float64
    model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager")
    model = model.to(getattr(torch, dtype)).eval()
    return model


@contextlib.contextmanager
def torch_one_thread() -> Iterator[None]:
    """Run torch on one thread meanwhile: these models are so small that torch's thread pool
    only costs time (30x slower on a busy 2-core CI machine); restored afterwards."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_num_threads(n)


def hf_logits(model: Any, ids: list[int], position_ids: list[int] | None = None) -> np.ndarray:
    """float64 logits ``[len(ids), vocab]`` of one forward (no cache) over ``ids``.

    An explicit all-ones attention mask is passed (transformers would otherwise infer one).
    """
    import torch

    with torch_one_thread():
        kwargs: dict[str, Any] = {"attention_mask": torch.ones(1, len(ids), dtype=torch.long), "use_cache": False}
        if position_ids is not None:
            kwargs["position_ids"] = torch.tensor([position_ids])
        out = model(torch.tensor([ids]), **kwargs)
    return out.logits[0].double().numpy()


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def hf_greedy(model: Any, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Greedy continuation by repeated full forwards (float64 if the model is), argmax each step.

    Returns the tokens and the log-softmax rows ``[steps, vocab]`` at the positions that
    chose them (the last prompt position, then each generated token but the last)."""
    seq = list(prompt)
    rows = []
    for _ in range(steps):
        logits = hf_logits(model, seq)[-1]
        rows.append(log_softmax(logits))
        seq.append(int(np.argmax(logits)))
    return seq[len(prompt):], np.stack(rows)


def hf_greedy_cached(model: Any, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Greedy continuation as ``generate`` runs it: one forward over the prompt, then one
    forward per new token with transformers' KV cache (``past_key_values``), explicit
    ``position_ids``. Returns what :func:`hf_greedy` returns.

    Differs from :func:`hf_greedy` where the RoPE frequencies depend on the length of each
    forward call (``longrope``: the cached keys keep the rotation of the call that wrote them)."""
    import warnings

    import torch

    seq: list[int] = []
    rows = []
    with torch_one_thread(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # past_key_values' new name differs across 5.x
        out = model(torch.tensor([prompt]), position_ids=torch.arange(len(prompt))[None], use_cache=True)
        for i in range(steps):
            logits = out.logits[0, -1].double().numpy()
            rows.append(log_softmax(logits))
            seq.append(int(np.argmax(logits)))
            if i + 1 < steps:
                pos = torch.tensor([[len(prompt) + i]])
                out = model(torch.tensor([[seq[-1]]]), past_key_values=out.past_key_values, position_ids=pos, use_cache=True)
    return seq, np.stack(rows)


def assert_matches_hf(out: Any, want_tokens: list[int], want_rows: np.ndarray, logprob_steps: int, rtol: float = 1e-4) -> None:
    """One greedy ``LLM.generate`` output with full-vocabulary logprobs against transformers'
    greedy tokens and log-probability rows (:func:`hf_greedy`): the tokens equal, and every
    log-probability of the first ``logprob_steps`` steps (the last prompt position, then the
    decode steps) within ``rtol`` relative (of ``max(1, |reference|)``)."""
    assert out.error is None, out.error
    comp = out.outputs[0]
    assert list(comp.token_ids) == list(want_tokens)
    vocab = want_rows.shape[1]
    ours = np.array([[comp.logprobs[s][t].logprob for t in range(vocab)] for s in range(logprob_steps)])
    ref = want_rows[:logprob_steps]
    ok = np.abs(ours - ref) <= rtol * np.maximum(1.0, np.abs(ref))
    assert ok.all(), f"{(~ok).sum()} log-probs beyond {rtol} relative; max abs diff {np.abs(ours - ref).max():.3g}"


class ModelStore:
    """Writes each checkpoint once (lazily) under a temp folder -- ``write(name, path) -> folder``,
    by default the :data:`VARIANTS` above -- and caches the transformers models loaded back and
    the LLMs built on them (one store per test module or session)."""

    def __init__(self, root: Path, write: Callable[[str, Path], Path] | None = None):
        self.root = root
        self._write = write or (lambda name, path: write_checkpoint(VARIANTS[name], path))
        self._dirs: dict[str, Path] = {}
        self._hf: dict[tuple[str, str], Any] = {}
        self._llm: dict[tuple[Any, ...], Any] = {}

    def dir(self, name: str) -> Path:
        if name not in self._dirs:
            self._dirs[name] = self._write(name, self.root / name)
        return self._dirs[name]

    def hf(self, name: str, dtype: str = "float64") -> Any:
        key = (name, dtype)
        if key not in self._hf:
            self._hf[key] = load_hf(self.dir(name), dtype)
        return self._hf[key]

    def llm(self, name: str, kv_cache: str, **options: Any) -> Any:
        """``LLM(self.dir(name), kv_cache=..., **options)``, built once (default: the reference
        backend in float32)."""
        key = (name, kv_cache, tuple(sorted(options.items())))
        if key not in self._llm:
            from trtcore import LLM

            self._llm[key] = LLM(self.dir(name), kv_cache=kv_cache, **{"backend": "reference", "dtype": "float32", "progress": False, **options})
        return self._llm[key]

    def variant(self, name: str) -> Variant:
        return VARIANTS[name]


_STORE: ModelStore | None = None


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    """Session-wide :class:`ModelStore` of the tiny checkpoints in :data:`VARIANTS`.

    Every test module that imports this fixture gets the same store (pytest would otherwise
    make one per importing module), so each checkpoint is written once per session."""
    global _STORE
    if _STORE is None:
        _STORE = ModelStore(tmp_path_factory.mktemp("hf_models"))
    return _STORE


def random_prompt(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    """``n`` random token ids in ``[3, vocab)`` (no pad/bos/eos ids)."""
    return [int(t) for t in rng.integers(3, vocab, size=n)]


__all__ = [
    "VARIANTS",
    "Variant",
    "ModelStore",
    "hf_models",
    "write_checkpoint",
    "redraw_weights",
    "load_hf",
    "hf_logits",
    "torch_one_thread",
    "hf_greedy",
    "hf_greedy_cached",
    "log_softmax",
    "random_prompt",
    "replace",
]
