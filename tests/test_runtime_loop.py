"""The one step loop (EngineCore) in both KV modes, the request record's finish rule and
metrics, per-request errors (non-finite logits, bad prompts in stream()), the CPU KV pool,
and the package's public names.

A fake network drives the loop where exact control is needed: its next token is the last
fed token + 1 (mod the vocabulary) and its logits row is NaN (or +inf) when the fed token
is a poison id, so every expected token follows from that formula, not from trtcore.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from hf_models import VARIANTS, hf_models, random_prompt  # noqa: F401  (fixture)

import trtcore
from trtcore import LLM, SamplingParams
from trtcore.config import load_config
from trtcore.errors import GenerationError, InvalidRequestError
from trtcore.runtime.executor import Executor
from trtcore.kv_modes import kv_mode
from trtcore.plan import BuildConfig, resolve_plan
from trtcore.runtime.generate import make_engine
from trtcore.runtime.request import Request, RequestStatus, metrics

V = 100
NAN_TOKEN, INF_TOKEN = 50, 90
MAX_SEQ = 40


class FakeLM(Executor):
    """next token = fed token + 1 (mod V); NaN logits after NAN_TOKEN, +inf after INF_TOKEN.
    Contiguous caches grow by the step's tokens (``present`` = past + new) or are returned
    as given (the native fixed cache); the paged pool is left alone."""

    input_names: list[str] = []
    output_names: list[str] = []

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = np.asarray(feeds["input_ids"])
        tok = ids.reshape(-1)[np.asarray(feeds["last_token_ids"])]
        logits = np.full((tok.shape[0], V), -1.0, np.float32)
        logits[np.arange(tok.shape[0]), (tok + 1) % V] = 1.0
        logits[tok == NAN_TOKEN] = np.nan
        logits[tok == INF_TOKEN, 3] = np.inf
        out: dict[str, Any] = {"logits": logits}
        for name, v in feeds.items():
            if name.startswith("past_key_values."):
                new = np.zeros(v.shape[:2] + (ids.shape[1],) + v.shape[3:], v.dtype)
                out["present." + name.removeprefix("past_key_values.")] = np.concatenate([v, new], axis=2)
            elif name.startswith("kv_cache."):
                out["present." + name.removeprefix("kv_cache.")] = v
        return out


def _chain(prompt: list[int], n: int) -> list[int]:
    return [(prompt[-1] + 1 + i) % V for i in range(n)]


MODES = [("paged", "layers"), ("contiguous", "layers"), ("contiguous", "native")]


def _engine(hf_models: Any, kv_cache: str, attention: str) -> Any:  # noqa: F811
    config = load_config(hf_models.dir("llama3_rope"))
    options = BuildConfig(dtype="float32", max_batch_size=4, max_seq_len=MAX_SEQ, kv_cache=kv_cache, attention=attention,
                          block_size=4, max_num_tokens=16)
    plan = resolve_plan(config, options, "reference")
    return make_engine(FakeLM(), kv_mode(plan, config), num_blocks=64 if kv_cache == "paged" else None)


@pytest.mark.parametrize(("kv_cache", "attention"), MODES)
def test_non_finite_logits_end_only_that_request(hf_models: Any, kv_cache: str, attention: str) -> None:  # noqa: F811
    eng = _engine(hf_models, kv_cache, attention)
    p = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = {"nan": [7, NAN_TOKEN - 3], "inf": [5, 6, INF_TOKEN - 1], "ok": [10], "ok2": [1, 2, 3, 20]}
    reqs = {rid: Request(rid, pr, p) for rid, pr in prompts.items()}
    events: dict[str, list[Any]] = {rid: [] for rid in reqs}
    for ev in eng.generate(list(reqs.values())):
        events[ev.request_id].append(ev)
    # NaN after 3 tokens (..., 49, 50 fed), inf after 1 token (90 fed)
    for rid, n in (("nan", 3), ("inf", 1)):
        *tokens, last = events[rid]
        assert [e.token_id for e in tokens] == _chain(prompts[rid], n) and all(e.finish_reason is None for e in tokens)
        assert last.token_id == -1 and last.finish_reason == "error" and "non-finite logits" in last.error
        r = reqs[rid]
        assert r.status is RequestStatus.FINISHED and r.finish_reason == "error" and r.output_token_ids == _chain(prompts[rid], n)
    assert "1 NaN" not in events["nan"][-1].error and f"{V} NaN" in events["nan"][-1].error
    assert "1 inf" in events["inf"][-1].error
    for rid in ("ok", "ok2"):
        assert [e.token_id for e in events[rid]] == _chain(prompts[rid], 8)
        assert [e.finish_reason for e in events[rid]] == [None] * 7 + ["length"]
    assert not eng.has_unfinished_requests() and len(eng.runner.sampler) == 0


@pytest.mark.parametrize(("kv_cache", "attention"), MODES)
def test_one_finish_rule_in_every_mode(hf_models: Any, kv_cache: str, attention: str) -> None:  # noqa: F811
    """stop_token_ids, EOS (and ignore_eos), max_tokens and max_seq_len, the same in each mode."""
    eng = _engine(hf_models, kv_cache, attention)
    reqs = [
        Request("stop", [10], SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[14])),
        Request("eos", [20], SamplingParams(temperature=0, max_tokens=20), eos_token_ids={23}),
        Request("ignore", [20], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), eos_token_ids={23}),
        Request("seq", list(range(1, 31)), SamplingParams(temperature=0, max_tokens=30)),  # 40 - 30 = 10 fit
        Request("many", [1, 2], SamplingParams(temperature=0, max_tokens=3)),  # a second static batch
    ]
    got: dict[str, list[Any]] = {}
    for ev in eng.generate(reqs):
        got.setdefault(ev.request_id, []).append(ev)
    want = {"stop": (_chain([10], 4), "stop", 14), "eos": (_chain([20], 3), "stop", None), "ignore": (_chain([20], 5), "length", None),
            "seq": (_chain([30], 10), "length", None), "many": (_chain([2], 3), "length", None)}
    for rid, (tokens, reason, stop) in want.items():
        assert [e.token_id for e in got[rid]] == tokens, rid
        assert got[rid][-1].finish_reason == reason and got[rid][-1].stop_reason == stop, rid
    for r in reqs:
        assert r.finish_reason == want[r.request_id][1] and r.arrival_time <= r.first_token_time <= r.finished_time


def test_metrics_come_from_the_record() -> None:
    r = Request("a", [1, 2], SamplingParams(max_tokens=4), arrival_time=10.0)
    assert metrics(r) == {}
    for t, now in zip((3, 4, 5), (10.5, 11.0, 12.5)):
        r.append_token(t, now=now)
    r.finish("length")
    r.finished_time = 12.5
    assert metrics(r) == {"ttft_s": 0.5, "e2e_s": 2.5, "tpot_s": 1.0}


def _poison_prefill(llm: LLM, position: int) -> None:
    """NaN logits for the row whose last fed token sits at ``position`` (a prompt's end)."""
    real = llm.executor.run

    def run(feeds: Mapping[str, Any], *args: Any) -> dict[str, Any]:
        out = dict(real(feeds, *args))
        pos = np.asarray(feeds["position_ids"]).reshape(-1)[np.asarray(feeds["last_token_ids"])]
        logits = np.array(out["logits"], np.float32)
        logits[pos == position] = np.nan
        out["logits"] = logits
        return out

    llm.executor.run = run  # type: ignore[method-assign]


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
def test_non_finite_logits_through_generate_and_stream(hf_models: Any, kv_cache: str) -> None:  # noqa: F811
    v = VARIANTS["qwen2_bias"]
    d = hf_models.dir("qwen2_bias")
    rng = np.random.default_rng()
    prompts = [random_prompt(rng, n, v.vocab_size) for n in (5, 37, 9)]  # others never reach position 36
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    clean = LLM(d, backend="reference", kv_cache=kv_cache, device="cpu", progress=False).generate(prompts, params)
    llm = LLM(d, backend="reference", kv_cache=kv_cache, device="cpu", progress=False)
    _poison_prefill(llm, 36)
    outs = llm.generate(prompts, params)
    assert outs[1].outputs[0].finish_reason == "error" and isinstance(outs[1].error, GenerationError)
    assert "non-finite" in str(outs[1].error) and outs[1].outputs[0].token_ids == []
    for i in (0, 2):
        assert outs[i].error is None and outs[i].outputs[0].token_ids == clean[i].outputs[0].token_ids
    pieces = list(llm.stream(prompts, params))
    [bad] = [p for p in pieces if p.index == 1]
    assert bad.finish_reason == "error" and isinstance(bad.error, GenerationError) and bad.token_id == -1
    for i in (0, 2):
        assert [p.token_id for p in pieces if p.index == i] == clean[i].outputs[0].token_ids
    with pytest.raises(GenerationError, match="non-finite"):
        llm.generate(prompts[1], params)
    with pytest.raises(GenerationError, match="non-finite"):
        list(llm.stream(prompts[1], params))


def test_stream_isolates_a_bad_prompt_like_generate(hf_models: Any) -> None:  # noqa: F811
    v = VARIANTS["qwen2_bias"]
    d = hf_models.dir("qwen2_bias")
    rng = np.random.default_rng()
    llm = LLM(d, backend="reference", kv_cache="paged", device="cpu", max_seq_len=64, progress=False)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    good = [random_prompt(rng, n, v.vocab_size) for n in (4, 11)]
    prompts = [good[0], [], [5] * 200, good[1]]
    outs = llm.generate(prompts, params)
    pieces = list(llm.stream(prompts, params))
    for i in (1, 2):
        [bad] = [p for p in pieces if p.index == i]
        assert bad.finish_reason == "error" and isinstance(bad.error, InvalidRequestError) and bad.token_id == -1
        assert outs[i].outputs[0].finish_reason == "error" and isinstance(outs[i].error, InvalidRequestError)
    for i in (0, 3):
        assert [p.token_id for p in pieces if p.index == i] == outs[i].outputs[0].token_ids
        assert len(outs[i].outputs[0].token_ids) == 6
    with pytest.raises(InvalidRequestError, match="200 tokens"):
        list(llm.stream([5] * 200, params))


def _resident_fraction(a: np.ndarray) -> float:
    """Share of ``a``'s memory pages that are resident (``mincore(2)``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    start = a.ctypes.data // page * page
    length = a.ctypes.data + a.nbytes - start
    vec = (ctypes.c_ubyte * (-(-length // page)))()
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec) / len(vec)


def test_default_cpu_pool_is_sized_for_the_work_and_touched(hf_models: Any) -> None:  # noqa: F811
    d = hf_models.dir("qwen2_bias")
    llm = LLM(d, backend="reference", kv_cache="paged", device="cpu", max_batch_size=64, block_size=16, progress=False)
    c, pool = llm.config, llm.engine.kv_cache.pool
    per_token = c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * 4  # float32 K and V
    need = 64 * -(-llm.build_config.max_seq_len // 16) * 16 * per_token  # max_batch_size full sequences
    assert pool.nbytes <= min(need, 256 << 20)
    assert _resident_fraction(pool) == 1.0  # no page faults left for the first generate calls


def test_dir_lists_the_public_api() -> None:
    names = dir(trtcore)
    assert "LLM" in names and "SamplingParams" in names
    assert set(trtcore.__all__) <= set(names)
