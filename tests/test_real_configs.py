"""Real-world ``config.json`` / ``generation_config.json`` files of popular checkpoints.

The texts live in ``tests/data/real_configs/`` as ``<name>.config.json`` (and
``<name>.generation_config.json`` where the checkpoint ships one). A ``_github`` name marks a
file whose field values were taken from a public copy found on GitHub; ``_from_memory``
marks one written from knowledge of the Hugging Face hub file (same fields and values as
far as known, but not copied from a fetched file).

For each config:

1. ``trtcore.config.load_config`` parses it and agrees with what ``transformers`` makes of
   the same file: ``AutoConfig`` (rope theta / type / parameters, head_dim, GQA, tie, eos
   and bos ids) and the modules of the model built on the ``meta`` device from it (q/k/v/o
   and MLP biases, q/k norms, the effective sliding window of every layer).
2. The config is shrunk to a tiny model that keeps every semantic field (RoPE type and
   parameters with ``original_max_position_embeddings`` scaled down so the prompt crosses
   it, GQA ratio, biases, tie, q/k norm, head_dim larger than hidden/heads where the real
   one is, sliding window scaled down to 8 so it bites); random weights are written with
   transformers and trtcore's greedy tokens (reference backend, float32, paged and
   contiguous KV cache) must equal transformers' float64 greedy argmax loop (eager).
3. The (remapped) ``generation_config.json`` eos list stops generation at the first eos.

The tiny model's ``config.json`` is the real file's text with only the sizes changed (so
trtcore parses the real-world dialect, v4 ``rope_scaling`` with ``type``/``rope_type``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hf_models import hf_greedy, load_hf, redraw_weights
from trtcore import LLM, SamplingParams
from trtcore.config import load_config, load_generation_config

DATA = Path(__file__).parent / "data" / "real_configs"
NAMES = sorted(p.name[: -len(".config.json")] for p in DATA.glob("*.config.json"))
GEN_NAMES = sorted(p.name[: -len(".generation_config.json")] for p in DATA.glob("*.generation_config.json"))

STEPS = 32
PROMPT_LEN = 72
TINY_VOCAB = 256
TINY_ORIGINAL_MAX = 64  # original_max_position_embeddings of llama3 / yarn after shrinking
TINY_WINDOW = 8

#: Known failures: name -> reason (strict xfail). Empty: no config failed when this file was written.
XFAIL_PARSE: dict[str, str] = {}
XFAIL_GREEDY: dict[str, str] = {}
XFAIL_EOS: dict[str, str] = {}


def _real(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.config.json").read_text())


def _real_gen(name: str) -> dict[str, Any] | None:
    p = DATA / f"{name}.generation_config.json"
    return json.loads(p.read_text()) if p.is_file() else None


def _params(names: list[str], xfails: dict[str, str]) -> list[Any]:
    return [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=xfails[n])) if n in xfails else n
        for n in names
    ]


def _ids(v: Any) -> tuple[int, ...]:
    if v is None:
        return ()
    if isinstance(v, int):
        return (v,)
    return tuple(v)


# ---------------------------------------------------------------------------------------
# 1. parsing against transformers


def _hf_meta_model(cfg_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_cfg = AutoConfig.from_pretrained(cfg_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager")
    return hf_cfg, model


def _hf_rope(hf_cfg: Any) -> tuple[float, dict[str, Any] | None]:
    rp = dict(getattr(hf_cfg, "rope_parameters", None) or {})
    theta = float(rp.pop("rope_theta"))
    rp.pop("partial_rotary_factor", None)
    rp.pop("type", None)
    rtype = rp.get("rope_type", "default")
    if rtype == "default":
        return theta, None
    return theta, rp


@pytest.mark.parametrize("name", _params(NAMES, XFAIL_PARSE))
def test_parse_matches_transformers(name: str, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_real(name)))
    gen = _real_gen(name)
    if gen is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    ours = load_config(tmp_path)
    hf_cfg, model = _hf_meta_model(tmp_path)
    problems: list[str] = []

    def eq(field: str, a: Any, b: Any) -> None:
        if a != b:
            problems.append(f"{field}: trtcore {a!r} != transformers {b!r}")

    for f in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
              "pad_token_id"):
        eq(f, getattr(ours, f), getattr(hf_cfg, f, None))
    eq("rms_norm_eps", ours.rms_norm_eps, float(hf_cfg.rms_norm_eps))
    eq("eos_token_id", ours.eos_token_id, _ids(hf_cfg.eos_token_id))
    theta, scaling = _hf_rope(hf_cfg)
    eq("rope_theta", ours.rope_theta, theta)
    eq("rope_scaling", ours.rope_scaling, scaling)

    layer0 = model.model.layers[0]
    attn, mlp = layer0.self_attn, layer0.mlp
    H, Hkv = ours.num_attention_heads, ours.num_key_value_heads
    eq("head_dim (q_proj rows / heads)", ours.head_dim, attn.q_proj.weight.shape[0] // H)
    eq("head_dim (k_proj rows / kv heads)", ours.head_dim, attn.k_proj.weight.shape[0] // Hkv)
    eq("qkv_bias", ours.qkv_bias, attn.q_proj.bias is not None)
    eq("k bias", ours.qkv_bias, attn.k_proj.bias is not None)
    eq("o_bias", ours.o_bias, attn.o_proj.bias is not None)
    eq("mlp_bias", ours.mlp_bias, mlp.gate_proj.bias is not None)
    eq("q/k norm (qwen3)", ours.model_type == "qwen3", hasattr(attn, "q_norm"))
    eq("tied lm_head", ours.tie_word_embeddings, model.lm_head.weight is model.model.embed_tokens.weight)
    for i, layer in enumerate(model.model.layers):
        if hasattr(layer.self_attn, "sliding_window"):  # Qwen2/Qwen3: per layer
            hf_window = layer.self_attn.sliding_window
        elif ours.model_type == "mistral":  # MistralAttention reads config.sliding_window
            hf_window = hf_cfg.sliding_window
        else:
            hf_window = None
        our_window = ours.sliding_window if ours.layer_types[i] == "sliding_attention" else None
        eq(f"effective sliding window of layer {i}", our_window, hf_window)

    from transformers import GenerationConfig

    ours_gen = load_generation_config(tmp_path, ours)
    if gen is not None:
        hf_gen = GenerationConfig.from_pretrained(tmp_path)
        eq("generation eos_token_id", ours_gen.eos_token_id, _ids(hf_gen.eos_token_id))
        eq("generation bos_token_id", ours_gen.bos_token_id, hf_gen.bos_token_id)
        eq("generation pad_token_id", ours_gen.pad_token_id, hf_gen.pad_token_id)
        # transformers v5 leaves unset sampling fields None and fills them at generate() time
        hf_defaults = {"do_sample": False, "temperature": 1.0, "top_p": 1.0, "top_k": 50}
        for f, dflt in hf_defaults.items():
            v = getattr(hf_gen, f)
            eq(f"generation {f}", getattr(ours_gen, f), dflt if v is None else v)
    else:
        eq("generation eos (from config.json)", ours_gen.eos_token_id, _ids(hf_cfg.eos_token_id))
    # the same config as transformers v5 writes it back (rope_parameters, dtype, layer_types)
    v5 = tmp_path / "v5"
    hf_cfg.save_pretrained(v5)
    eq("config re-saved by transformers v5", load_config(v5), ours)
    assert not problems, f"{name}:\n  " + "\n  ".join(problems)


# ---------------------------------------------------------------------------------------
# 2. shrunk tiny models against transformers


def _remap_ids(real: dict[str, Any], gen: dict[str, Any] | None) -> dict[int, int]:
    """Special token ids (bos/eos/pad of both files) -> distinct ids near the top of TINY_VOCAB."""
    seen: list[int] = []
    for d in (real, gen or {}):
        for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
            for t in _ids(d.get(k)):
                if t not in seen:
                    seen.append(t)
    return {t: TINY_VOCAB - 1 - i for i, t in enumerate(seen)}


def _map_ids(v: Any, m: dict[int, int]) -> Any:
    if v is None:
        return None
    if isinstance(v, int):
        return m[v]
    return [m[t] for t in v]


def shrink(real: dict[str, Any], gen: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The tiny version of a real config (and generation config); see the module docstring."""
    d = json.loads(json.dumps(real))
    H, Hkv = real["num_attention_heads"], real.get("num_key_value_heads") or real["num_attention_heads"]
    ratio = H // Hkv
    kv = max(1, 4 // ratio)
    heads = kv * ratio
    derived = real["hidden_size"] // H
    real_hd = real.get("head_dim")
    if real.get("model_type") == "qwen3" and "head_dim" not in real:
        real_hd = 128
    if real_hd is None or real_hd == derived:
        head_dim = 16
        hidden = heads * 16
        if real_hd is not None:
            d["head_dim"] = head_dim
    else:  # head_dim deliberately != hidden / heads (Qwen3): keep that, in proportion
        hidden = 64
        head_dim = int(round(hidden / heads * real_hd / derived / 2)) * 2
        d["head_dim"] = head_dim
    d.update(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=96,
             num_hidden_layers=2, vocab_size=TINY_VOCAB, torch_dtype="float32")
    if "num_key_value_heads" not in real:
        d.pop("num_key_value_heads")
        assert ratio == 1
    # lengths: the tiny max length leaves room for prompt + STEPS
    max_pos = 256
    rs = d.get("rope_scaling")
    if rs:
        rtype = rs.get("rope_type") or rs.get("type")
        if "original_max_position_embeddings" in rs:
            ratio_len = real["max_position_embeddings"] / rs["original_max_position_embeddings"]
            rs["original_max_position_embeddings"] = TINY_ORIGINAL_MAX
            max_pos = max(256, int(TINY_ORIGINAL_MAX * ratio_len))
        if rtype == "dynamic":
            max_pos = PROMPT_LEN + STEPS  # dynamic NTK only acts beyond this, which LLM refuses
    d["max_position_embeddings"] = max_pos
    if "max_window_layers" in d:
        d["max_window_layers"] = 1  # layer 1 would slide if use_sliding_window were honoured
    if d.get("sliding_window") is not None:
        d["sliding_window"] = TINY_WINDOW
    m = _remap_ids(real, gen)
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if k in d:
            d[k] = _map_ids(d[k], m)
    g = None
    if gen is not None:
        g = dict(gen)
        for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if k in g:
                g[k] = _map_ids(g[k], m)
    return d, g


_TINY: dict[str, Path] = {}
_HF: dict[str, Any] = {}


def tiny_dir(name: str, root: Path) -> Path:
    """Write the tiny checkpoint of ``name`` once per session; its config.json is the shrunk real text."""
    if name in _TINY:
        return _TINY[name]
    from transformers import AutoConfig, AutoModelForCausalLM

    d, g = shrink(_real(name), _real_gen(name))
    path = root / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(d, indent=2))
    hf_cfg = AutoConfig.from_pretrained(path)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager", dtype=torch.float32)
    redraw_weights(model, seed=sum(map(ord, name)))
    model.save_pretrained(path)
    (path / "config.json").write_text(json.dumps(d, indent=2))  # keep the real-world dialect
    for f in ("generation_config.json",):
        (path / f).unlink(missing_ok=True)
    if g is not None:
        (path / "generation_config.json").write_text(json.dumps(g, indent=2))
    _TINY[name] = path
    return path


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real_tiny")


def _prompt(name: str) -> list[int]:
    rng = np.random.default_rng(sum(map(ord, name)))
    return [int(t) for t in rng.integers(3, TINY_VOCAB - 8, size=PROMPT_LEN)]


def _hf_greedy(name: str, path: Path) -> tuple[list[int], np.ndarray]:
    """transformers' greedy tokens and the float64 log-softmax rows that chose them."""
    if name not in _HF:
        model = load_hf(path, "float64")
        _HF[name] = hf_greedy(model, _prompt(name), STEPS)
    return _HF[name]


def _hf_tokens(name: str, path: Path) -> list[int]:
    return _hf_greedy(name, path)[0]


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
@pytest.mark.parametrize("name", _params(NAMES, XFAIL_GREEDY))
def test_tiny_greedy_matches_transformers(name: str, kv_cache: str, tiny_root: Path) -> None:
    path = tiny_dir(name, tiny_root)
    ref, ref_lp = _hf_greedy(name, path)
    llm = LLM(path, backend="reference", dtype="float32", progress=False, kv_cache=kv_cache, max_batch_size=1)
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, logprobs=TINY_VOCAB)
    out = llm.generate([_prompt(name)], params)[0]
    assert out.error is None, out.error
    got = list(out.outputs[0].token_ids)
    first = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), None)
    assert got == ref, f"{name} ({kv_cache}): first difference at step {first}\n trtcore {got}\n hf      {ref}"
    # greedy continuations of random models often loop; the full distributions still differ
    # at every position if anything is off
    ours = np.full_like(ref_lp, np.nan)
    for step, d in enumerate(out.outputs[0].logprobs):
        for tok, lp in d.items():
            ours[step, tok] = lp.logprob
    ok = np.abs(ours - ref_lp) <= 1e-4 * np.maximum(1.0, np.abs(ref_lp))
    bad = np.argwhere(~ok)
    assert ok.all(), (
        f"{name} ({kv_cache}): {len(bad)} log-probs differ; first (step, token) {bad[:5].tolist()}; "
        f"max abs diff {np.nanmax(np.abs(ours - ref_lp)):.3g}"
    )


# ---------------------------------------------------------------------------------------
# 3. eos lists stop generation


@pytest.mark.parametrize("name", _params(GEN_NAMES, XFAIL_EOS))
def test_generation_config_eos_stops(name: str, tiny_root: Path) -> None:
    """Rewrite the tiny generation_config.json eos list so that its *second* id is a token the
    greedy continuation produces at step k (first occurrence, k >= 1); generation (no
    ignore_eos) must stop right there, with the eos kept and finish_reason 'stop'."""
    path = tiny_dir(name, tiny_root)
    ref = _hf_tokens(name, path)
    k = next(i for i in range(1, STEPS) if ref[i] not in ref[:i])
    gen = json.loads((path / "generation_config.json").read_text())
    eos = _ids(gen.get("eos_token_id"))
    unused = [t for t in range(TINY_VOCAB - 1, 0, -1) if t not in ref]
    new = [unused[0], ref[k], *unused[1 : len(eos) - 1]] if len(eos) > 1 else [ref[k]]
    gdir = path.parent / f"{name}-eos"
    if not gdir.exists():
        gdir.mkdir()
        for f in path.iterdir():
            (gdir / f.name).symlink_to(f)
        (gdir / "generation_config.json").unlink()
        gen["eos_token_id"] = new if isinstance(gen.get("eos_token_id"), list) or len(new) > 1 else new[0]
        (gdir / "generation_config.json").write_text(json.dumps(gen))
    for kv_cache in ("paged", "contiguous"):
        llm = LLM(gdir, backend="reference", dtype="float32", progress=False, kv_cache=kv_cache, max_batch_size=1)
        out = llm.generate([_prompt(name)], SamplingParams(temperature=0, max_tokens=STEPS))[0].outputs[0]
        assert list(out.token_ids) == ref[: k + 1], (name, kv_cache, new, out.token_ids, ref)
        assert out.finish_reason == "stop", (name, kv_cache, out.finish_reason)


def test_config_json_eos_list_stops_without_generation_config(tiny_root: Path) -> None:
    """Llama-3.1-8B-Instruct's config.json itself carries the eos list; with no
    generation_config.json present any of its ids must stop generation."""
    name = "llama-3.1-8b-instruct_from_memory"
    path = tiny_dir(name, tiny_root)
    ref = _hf_tokens(name, path)
    k = next(i for i in range(1, STEPS) if ref[i] not in ref[:i])
    d = json.loads((path / "config.json").read_text())
    unused = [t for t in range(TINY_VOCAB - 1, 0, -1) if t not in ref]
    d["eos_token_id"] = [unused[0], unused[1], ref[k]]
    cdir = path.parent / f"{name}-cfg-eos"
    if not cdir.exists():
        cdir.mkdir()
        for f in path.iterdir():
            if f.name not in ("config.json", "generation_config.json"):
                (cdir / f.name).symlink_to(f)
        (cdir / "config.json").write_text(json.dumps(d))
    llm = LLM(cdir, backend="reference", dtype="float32", progress=False, kv_cache="paged", max_batch_size=1)
    out = llm.generate([_prompt(name)], SamplingParams(temperature=0, max_tokens=STEPS))[0].outputs[0]
    assert list(out.token_ids) == ref[: k + 1]
    assert out.finish_reason == "stop"


BATCH_NAMES = ["mistral-7b-v0.1_from_memory", "llama-3.2-1b-instruct_github", "qwen2.5-7b-instruct-yarn_from_memory",
               "qwen3-4b-yarn_from_memory"]


@pytest.mark.parametrize("name", BATCH_NAMES)
def test_tiny_batched_chunked_prefill(name: str, tiny_root: Path) -> None:
    """Four prompts of different lengths through the paged cache with 4-token blocks, a
    16-token budget (chunked prefill) and two sequences at a time, against transformers."""
    path = tiny_dir(name, tiny_root)
    model = load_hf(path, "float64")
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(3, TINY_VOCAB - 8, size=n)] for n in (5, 40, 72, 17)]
    refs = [hf_greedy(model, p, 16)[0] for p in prompts]
    llm = LLM(path, backend="reference", dtype="float32", progress=False, kv_cache="paged", block_size=4,
              max_num_tokens=16, max_batch_size=2)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    assert [list(o.outputs[0].token_ids) for o in outs] == refs
