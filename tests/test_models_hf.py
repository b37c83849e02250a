"""trtcore (reference backend, float32) against Hugging Face transformers (eager, float64)
on tiny random checkpoints of every supported family (see ``hf_models.VARIANTS``).

Reference values always come from transformers, never from trtcore:

* log-probabilities: ``log_softmax`` in float64 of one transformers forward (no KV cache,
  explicit all-ones attention mask) over prompt + trtcore's generated tokens;
  tolerance ``|trtcore - hf| <= 1e-4 * max(1, |hf|)`` for every token of the vocabulary
  (``SamplingParams(logprobs=vocab_size)``), at the last prompt position and at every one
  of the 31 decode steps that follow;
* greedy tokens: transformers' argmax by repeated full forwards in float64, 32 steps.

The variants cover llama3 / linear / dynamic RoPE scaling, Mistral's sliding window (8,
much shorter than the 80-token prompts), Qwen2 q/k/v biases and mixed full / sliding
layers, Qwen3 q/k norms with an explicit head_dim, tied and untied embeddings, GQA 4:1,
2:1 and 1:1, bfloat16 sharded weights, and config.json in the transformers v4 and v5
dialects.

Dynamic NTK RoPE only changes anything beyond ``max_position_embeddings``, and trtcore's
``LLM`` caps sequences at that length, so generation through ``LLM`` cannot exercise it.
It is tested through the network directly (``llm.executor.run``) with position ids past
the limit: one forward, and a cached prefill + decode that crosses the limit, each against
transformers given the same explicit ``position_ids`` (and a ``DynamicCache``).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hf_models import (  # noqa: F401  (hf_models is a fixture)
    VARIANTS,
    ModelStore,
    hf_greedy,
    hf_logits,
    hf_models,
    load_hf,
    log_softmax,
    random_prompt,
    torch_one_thread,
)
from trtcore import LLM, SamplingParams
from trtcore.errors import InvalidRequestError

STEPS = 32
PROMPT_LEN = 80
RTOL = 1e-4
NAMES = list(VARIANTS)


def _close(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Elementwise ``|ours - ref| <= RTOL * max(1, |ref|)``."""
    return np.abs(ours - ref) <= RTOL * np.maximum(1.0, np.abs(ref))


class _LLMs:
    def __init__(self, store: ModelStore):
        self.store = store
        self._cache: dict[tuple[Any, ...], LLM] = {}

    def get(self, name: str, **kwargs: Any) -> LLM:
        key = (name, tuple(sorted(kwargs.items())))
        if key not in self._cache:
            self._cache[key] = LLM(self.store.dir(name), backend="reference", dtype="float32", progress=False, **kwargs)
        return self._cache[key]


@pytest.fixture(scope="module")
def llms(hf_models: ModelStore) -> _LLMs:
    return _LLMs(hf_models)


def _prompt(name: str, n: int = PROMPT_LEN, salt: int = 0) -> list[int]:
    v = VARIANTS[name]
    return random_prompt(np.random.default_rng([v.seed, n, salt]), n, v.vocab_size)


def _greedy(n: int, logprobs: int | None = None) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=logprobs)


# ---------------------------------------------------------------------------------------
# the variants are what they claim to be (so the comparisons below mean something)


def test_variants_cover_the_brief() -> None:
    vs = list(VARIANTS.values())
    assert {v.gqa for v in vs} >= {1, 2, 4}
    assert {v.tie_word_embeddings for v in vs} == {True, False}
    assert {v.config_style for v in vs} == {"v4", "v5"}
    assert {v.v4_rope_key for v in vs if v.config_style == "v4" and v.rope} == {"type", "rope_type"}
    assert {v.family for v in vs} == {"llama", "mistral", "qwen2", "qwen3"}
    assert {(v.rope or {}).get("rope_type") for v in vs} >= {"llama3", "linear", "dynamic"}


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_files_and_config_dialect(hf_models: ModelStore, name: str) -> None:
    """config.json is written in the intended dialect and transformers reads it back as intended."""
    v = VARIANTS[name]
    d = json.loads((hf_models.dir(name) / "config.json").read_text())
    if v.config_style == "v4":
        assert "rope_parameters" not in d and "dtype" not in d
        assert d["rope_theta"] == v.rope_theta
        assert d["torch_dtype"] == v.dtype
        if v.rope:
            assert d["rope_scaling"][v.v4_rope_key] == v.rope["rope_type"]
            assert ("type" in d["rope_scaling"]) != ("rope_type" in d["rope_scaling"])
        else:
            assert d["rope_scaling"] is None
    else:
        assert "rope_scaling" not in d and "rope_theta" not in d
        assert d["rope_parameters"]["rope_theta"] == v.rope_theta
        assert d["dtype"] == v.dtype
    hf = hf_models.hf(name)
    rp = hf.config.rope_parameters
    assert rp["rope_theta"] == v.rope_theta
    assert rp.get("rope_type", rp.get("type")) == (v.rope or {}).get("rope_type", "default")
    assert hf.config.num_key_value_heads == v.num_key_value_heads
    assert hf.config.tie_word_embeddings == v.tie_word_embeddings
    if v.max_shard_size:
        assert (hf_models.dir(name) / "model.safetensors.index.json").is_file()
    if v.dtype == "bfloat16":
        from safetensors import safe_open

        shard = sorted(hf_models.dir(name).glob("model-*.safetensors"))[0]
        with safe_open(str(shard), "pt") as f:
            assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in f.keys())


@pytest.mark.parametrize("name", [n for n in NAMES if VARIANTS[n].rope and VARIANTS[n].rope["rope_type"] != "dynamic"])
def test_rope_scaling_changes_hf_logits(hf_models: ModelStore, name: str) -> None:
    """The scaled RoPE matters on the test prompt (else the comparisons would not test it)."""
    p = _prompt(name)
    plain = load_hf(hf_models.dir(name), rope_parameters={"rope_type": "default", "rope_theta": VARIANTS[name].rope_theta})
    diff = np.abs(hf_logits(hf_models.hf(name), p) - hf_logits(plain, p))
    assert diff[-1].max() > 0.1


def test_hf_applies_mistral_sliding_window(hf_models: ModelStore) -> None:
    name = "mistral_sw8"
    p = _prompt(name)
    full = load_hf(hf_models.dir(name), sliding_window=None)
    windowed = hf_logits(hf_models.hf(name), p)
    unwindowed = hf_logits(full, p)
    assert np.abs(windowed[:8] - unwindowed[:8]).max() < 1e-9  # identical while inside the window
    assert np.abs(windowed[-1] - unwindowed[-1]).max() > 0.1


def test_hf_applies_qwen2_per_layer_window(hf_models: ModelStore) -> None:
    name = "qwen2_mixed_swa"
    p = _prompt(name)
    ref = hf_logits(hf_models.hf(name), p)
    assert list(hf_models.hf(name).config.layer_types) == ["full_attention", "sliding_attention"]
    for lt in (["full_attention"] * 2, ["sliding_attention"] * 2):
        other = hf_logits(load_hf(hf_models.dir(name), layer_types=lt), p)
        assert np.abs(other[-1] - ref[-1]).max() > 0.1, lt


# ---------------------------------------------------------------------------------------
# (a) log-probabilities and (b) greedy tokens against transformers


@pytest.mark.parametrize("name", NAMES)
def test_logprobs_match_hf(hf_models: ModelStore, llms: _LLMs, name: str) -> None:
    v = VARIANTS[name]
    llm = llms.get(name)
    p = _prompt(name)
    [out] = llm.generate(p, _greedy(STEPS, logprobs=v.vocab_size))
    assert out.error is None
    comp = out.outputs[0]
    toks = comp.token_ids
    assert len(toks) == STEPS and len(comp.logprobs) == STEPS
    ref = log_softmax(hf_logits(hf_models.hf(name), p + toks[:-1])[len(p) - 1 :])
    ours = np.full_like(ref, np.nan)
    for step, d in enumerate(comp.logprobs):
        assert set(d) == set(range(v.vocab_size)), f"step {step}: logprobs=vocab_size must return every token"
        for tok, lp in d.items():
            ours[step, tok] = lp.logprob
        assert d[toks[step]].rank == 1, f"step {step}: greedy token {toks[step]} is not ranked first"
    ok = _close(ours, ref)
    bad = np.argwhere(~ok)
    assert ok.all(), (
        f"{len(bad)} log-probs differ from transformers beyond {RTOL} relative; first (step, token) "
        f"{bad[:5].tolist()}: ours {ours[~ok][:5]} hf {ref[~ok][:5]}; max abs diff {np.abs(ours - ref).max():.3g}"
    )
    # the top-1 ordering matches transformers where it is not a near tie
    top2 = np.sort(ref, -1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-3
    assert (np.argmax(ref, -1)[clear] == np.array(toks)[clear]).all()


@pytest.mark.parametrize("name", ["qwen3_qknorm", "llama_linear_v4"])
def test_top_k_logprobs_match_hf(hf_models: ModelStore, llms: _LLMs, name: str) -> None:
    """logprobs=3: the three most likely tokens of transformers' distribution, ranks 1..3,
    plus the sampled token (greedy: one of them)."""
    llm = llms.get(name)
    p = _prompt(name, 33, salt=12)
    [out] = llm.generate(p, _greedy(16, logprobs=3))
    comp = out.outputs[0]
    ref = log_softmax(hf_logits(hf_models.hf(name), p + comp.token_ids[:-1])[len(p) - 1 :])
    for step, (tok, d) in enumerate(zip(comp.token_ids, comp.logprobs)):
        order = np.argsort(-ref[step], kind="stable")
        assert len(d) == 3 and tok in d, (step, d)
        ranked = sorted(d.items(), key=lambda kv: kv[1].rank)
        assert [lp.rank for _, lp in ranked] == [1, 2, 3]
        gaps = -np.diff(ref[step][order[:4]])
        for r, (t, lp) in enumerate(ranked):
            if gaps[max(r - 1, 0):r + 1].min() > 1e-4:  # not a near tie with a neighbour
                assert t == order[r], (step, r)
            assert _close(np.array(lp.logprob), ref[step, t])
    assert abs(comp.cumulative_logprob - sum(ref[i, t] for i, t in enumerate(comp.token_ids))) < RTOL * len(comp.token_ids)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_matches_hf(hf_models: ModelStore, llms: _LLMs, name: str) -> None:
    p = _prompt(name, salt=1)
    [out] = llms.get(name).generate(p, _greedy(STEPS))
    expected, _ = hf_greedy(hf_models.hf(name), p, STEPS)
    assert out.outputs[0].token_ids == expected
    assert out.outputs[0].finish_reason == "length"
    assert out.outputs[0].logprobs is None


@pytest.mark.parametrize("name", ["llama3_rope", "mistral_sw8"])
def test_check_compare_with_transformers(hf_models: ModelStore, name: str) -> None:
    from trtcore.check import compare_with_transformers

    p = _prompt(name, salt=2)
    r = compare_with_transformers(hf_models.dir(name), p, steps=8)
    assert r["max_rel_error"] < RTOL
    assert r["greedy_equal"] is True
    assert r["num_tokens"] == len(p)
    assert r["transformers_token"] == int(np.argmax(hf_logits(hf_models.hf(name), p)[-1]))


# ---------------------------------------------------------------------------------------
# (c) batching: every prompt gets what it gets alone, and what transformers gets

BATCH_LENS = (1, 15, 16, 17, 80)


@pytest.mark.parametrize("name", NAMES)
def test_batch_equals_solo_and_hf(hf_models: ModelStore, llms: _LLMs, name: str) -> None:
    llm = llms.get(name)
    prompts = [_prompt(name, n, salt=3) for n in BATCH_LENS]
    batch = llm.generate(prompts, _greedy(STEPS))
    assert [o.prompt_token_ids for o in batch] == prompts
    for p, out in zip(prompts, batch):
        assert out.error is None
        [solo] = llm.generate(p, _greedy(STEPS))
        expected, _ = hf_greedy(hf_models.hf(name), p, STEPS)
        assert out.outputs[0].token_ids == solo.outputs[0].token_ids, f"prompt of {len(p)} tokens: batch != solo"
        assert out.outputs[0].token_ids == expected, f"prompt of {len(p)} tokens: trtcore != transformers"


@pytest.mark.parametrize("name", ["mistral_sw8", "qwen2_mixed_swa"])
def test_batch_split_over_small_max_batch_size(hf_models: ModelStore, llms: _LLMs, name: str) -> None:
    """Five prompts through an engine of max_batch_size 2 (three batches), sliding window on."""
    llm = llms.get(name, max_batch_size=2)
    prompts = [_prompt(name, n, salt=4) for n in BATCH_LENS]
    outs = llm.generate(prompts, _greedy(STEPS))
    for p, out in zip(prompts, outs):
        expected, _ = hf_greedy(hf_models.hf(name), p, STEPS)
        assert out.outputs[0].token_ids == expected, f"prompt of {len(p)} tokens"


# ---------------------------------------------------------------------------------------
# (d) bad requests inside a batch


@pytest.mark.parametrize("name", ["llama3_rope", "qwen3_qknorm", "mistral_sw8"])
def test_bad_requests_in_batch(hf_models: ModelStore, llms: _LLMs, name: str) -> None:
    v = VARIANTS[name]
    llm = llms.get(name)
    good = [_prompt(name, n, salt=5) for n in (17, 3, 40)]
    too_long = _prompt(name, v.max_position_embeddings, salt=6)
    out_of_vocab = [5, v.vocab_size, 7]
    prompts = [good[0], [], good[1], too_long, out_of_vocab, good[2]]
    outs = llm.generate(prompts, _greedy(STEPS))
    assert len(outs) == len(prompts)
    for i in (1, 3, 4):
        assert isinstance(outs[i].error, InvalidRequestError), f"prompt {i}"
        assert outs[i].outputs[0].finish_reason == "error"
        assert outs[i].outputs[0].token_ids == []
    for i, p in zip((0, 2, 5), good):
        assert outs[i].error is None
        [solo] = llm.generate(p, _greedy(STEPS))
        assert outs[i].outputs[0].token_ids == solo.outputs[0].token_ids
        assert outs[i].outputs[0].token_ids == hf_greedy(hf_models.hf(name), p, STEPS)[0]
    # alone, a bad prompt raises
    for bad in (too_long, out_of_vocab):
        with pytest.raises(InvalidRequestError):
            llm.generate(bad, _greedy(STEPS))


def test_longest_prompt_that_fits(hf_models: ModelStore, llms: _LLMs) -> None:
    """max_position_embeddings - 1 prompt tokens are accepted; one token fits after them."""
    name = "llama_dynamic_v4"
    v = VARIANTS[name]
    p = _prompt(name, v.max_position_embeddings - 1, salt=7)
    [out] = llms.get(name).generate(p, _greedy(STEPS))
    assert out.outputs[0].finish_reason == "length"
    assert out.outputs[0].token_ids == hf_greedy(hf_models.hf(name), p, 1)[0]


def test_short_max_seq_len_generates_to_the_limit(hf_models: ModelStore) -> None:
    """LLM(max_seq_len=64), below the default opt_seq_len of 128: builds, and stops at 64 tokens."""
    name = "llama3_rope"
    llm = LLM(hf_models.dir(name), backend="reference", dtype="float32", max_seq_len=64, progress=False)
    p = _prompt(name, 40, salt=8)
    [out] = llm.generate(p, _greedy(STEPS))
    assert out.outputs[0].finish_reason == "length"
    assert out.outputs[0].token_ids == hf_greedy(hf_models.hf(name), p, 64 - 40)[0]


# ---------------------------------------------------------------------------------------
# dynamic NTK RoPE beyond max_position_embeddings, through the network itself


#: transformers 5.x renamed forward's ``past_key_values`` to ``cache``
_CACHE_KWARG = "cache" if "cache" in inspect.signature(__import__("transformers").LlamaForCausalLM.forward).parameters else "past_key_values"


def _feeds(llm: LLM, ids: np.ndarray, pos: np.ndarray, key_pos: np.ndarray, last: np.ndarray, past: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from trtcore.kv_modes import mask_feeds

    return {
        "input_ids": ids.astype(np.int32),
        "position_ids": pos.astype(np.int32),
        **mask_feeds(llm.config, key_pos, pos),
        "last_token_ids": last.astype(np.int32),
        **past,
    }


def _empty_past(llm: LLM, batch: int) -> dict[str, np.ndarray]:
    c = llm.config
    z = np.zeros((batch, c.num_key_value_heads, 0, c.head_dim), np.float32)
    return {f"past_key_values.{i}.{k}": z for i in range(c.num_hidden_layers) for k in ("key", "value")}


def test_dynamic_rope_one_forward_past_the_limit(hf_models: ModelStore, llms: _LLMs) -> None:
    name = "llama_dynamic_v4"
    v = VARIANTS[name]
    llm = llms.get(name, kv_cache="contiguous")  # drives the contiguous network directly
    n, start = 80, 2 * v.max_position_embeddings - 80  # positions 240..319, twice the limit
    p = _prompt(name, n, salt=9)
    positions = np.arange(start, start + n)
    rows = [0, 7, 40, n - 1]
    B = len(rows)
    ids = np.tile(np.array(p), (B, 1))
    pos = np.tile(positions, (B, 1))
    out = llm.executor.run(_feeds(llm, ids, pos, pos, np.arange(B) * n + np.array(rows), _empty_past(llm, B)))
    ours = log_softmax(np.asarray(out["logits"], np.float64))
    hf = load_hf(hf_models.dir(name))  # fresh: transformers' dynamic RoPE keeps state between calls
    ref = log_softmax(hf_logits(hf, p, positions.tolist())[rows])
    assert _close(ours, ref).all(), np.abs(ours - ref).max()
    # and the scaling matters here: plain RoPE at these positions gives other numbers
    plain = load_hf(hf_models.dir(name), rope_parameters={"rope_type": "default", "rope_theta": v.rope_theta})
    assert np.abs(log_softmax(hf_logits(plain, p, positions.tolist())[rows]) - ref).max() > 0.05


def test_dynamic_rope_cached_decode_crossing_the_limit(hf_models: ModelStore, llms: _LLMs) -> None:
    """Prefill at positions ending at the limit, then 40 decode steps beyond it, with the
    KV cache, against transformers with a DynamicCache and the same position ids."""
    from transformers import DynamicCache

    name = "llama_dynamic_v4"
    v = VARIANTS[name]
    llm = llms.get(name, kv_cache="contiguous")  # drives the contiguous network directly
    L = v.max_position_embeddings
    n, steps = 40, 40
    start = L - n  # prefill positions L-40 .. L-1; decode positions L .. L+39
    p = _prompt(name, n, salt=10)
    hf = load_hf(hf_models.dir(name))
    cache = DynamicCache(config=hf.config)
    seq = list(p)
    ours_rows, ref_rows = [], []
    past = _empty_past(llm, 1)
    chunk = list(p)
    pos0 = start
    for step in range(steps):
        pos = np.arange(pos0, pos0 + len(chunk))[None]
        key_pos = np.arange(start, pos0 + len(chunk))[None]
        out = llm.executor.run(_feeds(llm, np.array([chunk]), pos, key_pos, np.array([len(chunk) - 1]), past))
        past = {k: out[k.replace("past_key_values", "present")] for k in past}
        ours_rows.append(log_softmax(np.asarray(out["logits"][0], np.float64)))
        with torch_one_thread():
            r = hf(
                torch.tensor([chunk]),
                position_ids=torch.tensor(pos),
                attention_mask=torch.ones(1, len(seq), dtype=torch.long),
                use_cache=True,
                **{_CACHE_KWARG: cache},
            )
        ref_rows.append(log_softmax(r.logits[0, -1].double().numpy()))
        tok = int(np.argmax(ref_rows[-1]))  # follow transformers' greedy path
        pos0 += len(chunk)
        chunk = [tok]
        seq.append(tok)
    ours, ref = np.stack(ours_rows), np.stack(ref_rows)
    assert _close(ours, ref).all(), (np.abs(ours - ref).max(axis=1), np.argwhere(~_close(ours, ref))[:5])
    assert (np.argmax(ours, -1) == np.argmax(ref, -1)).all()
    # the scaling matters beyond the limit: plain RoPE (stateless, so one forward equals a
    # cached run) gives other numbers there, and the same numbers before it
    plain = load_hf(hf_models.dir(name), rope_parameters={"rope_type": "default", "rope_theta": v.rope_theta})
    plain_rows = log_softmax(hf_logits(plain, seq[:-1], list(range(start, start + len(seq) - 1)))[n - 1 :])
    assert np.abs(plain_rows[0] - ref[0]).max() < 1e-9
    assert np.abs(plain_rows[1:] - ref[1:]).max(axis=1).min() > 1e-3


# ---------------------------------------------------------------------------------------
# bfloat16 sharded checkpoint, end to end, with torch unimportable in the trtcore process

_NO_TORCH = textwrap.dedent(
    """
    import json, sys
    sys.modules["torch"] = None          # `import torch` now raises ImportError
    from trtcore import LLM, SamplingParams
    model_dir, prompt, steps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    llm = LLM(model_dir, backend="reference", dtype="float32", progress=False)
    [out] = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
    print(json.dumps({"tokens": out.outputs[0].token_ids,
                      "torch_loaded": any(m.split(".")[0] == "torch" and v is not None for m, v in sys.modules.items()),
                      "transformers_loaded": "transformers" in sys.modules}))
    """
)


def test_bf16_sharded_without_torch(hf_models: ModelStore) -> None:
    name = "llama_bf16_sharded"
    d = hf_models.dir(name)
    p = _prompt(name, 30, salt=11)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [sys.executable, "-c", _NO_TORCH, str(d), json.dumps(p), str(STEPS)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["torch_loaded"] is False and got["transformers_loaded"] is False
    # transformers in this process, from the same bfloat16 weights upcast to float32 (then float64)
    hf = hf_models.hf(name)
    w = hf.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(w, w.to(torch.bfloat16).to(w.dtype))  # the weights are bfloat16 values
    expected, _ = hf_greedy(hf, p, STEPS)
    assert got["tokens"] == expected
