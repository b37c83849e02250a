"""The new sampling parameters and the GPU oracle (trtcore.runtime.sampling: min_p,
repetition / presence / frequency penalties, min_tokens, vocab_size, sample_rows with
Philox draws) against independent references:

* transformers' logits processors (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
  MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper) in float64, applied in vLLM v1's
  order, plus the OpenAI presence / frequency formula written here;
* vLLM's documented SamplingParams ranges;
* distribution tests: >= 100k draws, total-variation distance to transformers' processed
  distribution < 0.01.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from trtcore.errors import InvalidRequestError
from trtcore.runtime.sampling import (
    Sampler,
    SamplingParams,
    SamplingRow,
    _draw_weights,
    _keep_mask,
    _penalize,
    _sanitize,
    _scaled,
    make_generator,
    philox_uniform,
    sample,
    sample_rows,
)

# ---------------------------------------------------------------------------
# independent reference: transformers' processors in vLLM's order
# ---------------------------------------------------------------------------


def hf_probs(row, p: SamplingParams, prompt=(), output=(), banned=()) -> np.ndarray:
    """float64 probabilities of the processed distribution (one-hot argmax when greedy)."""
    scores = torch.from_numpy(np.asarray(row, dtype=np.float64)).reshape(1, -1).clone()
    scores[torch.isnan(scores)] = -math.inf
    vocab = scores.shape[1]
    for b in banned:
        scores[0, b] = -math.inf
    if p.repetition_penalty != 1.0 and len(prompt) + len(output):
        ids = torch.tensor([list(prompt) + list(output)], dtype=torch.long)
        scores = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, scores)
    counts = torch.from_numpy(np.bincount(np.asarray(output, dtype=np.int64), minlength=vocab).astype(np.float64))[None]
    scores = scores - (p.frequency_penalty * counts + p.presence_penalty * (counts > 0).double())  # OpenAI's formula
    if p.greedy:
        out = np.zeros(vocab)
        out[int(torch.argmax(scores))] = 1.0
        return out
    scores = TemperatureLogitsWarper(p.temperature)(None, scores)
    if p.min_p > 0:
        scores = MinPLogitsWarper(p.min_p)(None, scores)
    if p.top_k > 0:
        scores = TopKLogitsWarper(p.top_k)(None, scores)
    if p.top_p < 1.0:
        scores = TopPLogitsWarper(p.top_p)(None, scores)
    return torch.softmax(scores, dim=-1)[0].numpy()


def ref_probs(row, p: SamplingParams, prompt=(), output=(), banned=()) -> np.ndarray:
    """The code under test's processed distribution (weights of the kept tokens, normalized)."""
    x, _ = _sanitize(np.asarray(row))
    l = _penalize(x, p, prompt, output, banned)
    if p.greedy:
        out = np.zeros(x.shape[0])
        out[int(np.argmax(l))] = 1.0
        return out
    z = _scaled(l, p.temperature)
    with np.errstate(over="ignore"):
        w = np.exp(z - z.max())
    keep = _keep_mask(z, w, p.top_k, p.top_p, p.min_p)
    probs = np.where(keep, w, 0.0)
    return probs / probs.sum()


params_st = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.5]),
    top_k=st.sampled_from([0, -1, 1, 3, 10]),
    top_p=st.sampled_from([1.0, 0.95, 0.6, 0.2]),
    min_p=st.sampled_from([0.0, 0.05, 0.3]),
    repetition_penalty=st.sampled_from([1.0, 1.3, 0.7, 2.0]),
    presence_penalty=st.sampled_from([0.0, 0.5, -1.0, 2.0]),
    frequency_penalty=st.sampled_from([0.0, 0.4, -0.8, 2.0]),
    seed=st.integers(0, 2**64 - 1),
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    p=params_st,
    data_seed=st.integers(0, 2**32 - 1),
    vocab=st.integers(2, 40),
)
def test_pipeline_matches_transformers_processors(p: SamplingParams, data_seed: int, vocab: int) -> None:
    rng = np.random.default_rng(data_seed)
    row = (rng.standard_normal(vocab) * 3).astype(np.float32)
    prompt = rng.integers(0, vocab, rng.integers(0, 6)).tolist()
    output = rng.integers(0, vocab, rng.integers(0, 8)).tolist()
    want = hf_probs(row, p, prompt, output)
    got = ref_probs(row, p, prompt, output)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    # and the sampled token (Philox draw) is one the processed distribution allows
    res = sample_rows(row[None], [SamplingRow(p, prompt, output)])
    assert want[res.token_ids[0]] > 0 and not res.fallback[0]


def test_penalties_formulas_by_hand() -> None:
    x = np.array([2.0, -2.0, 1.0, 0.5, -1.0], np.float32)
    p = SamplingParams(temperature=0, repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    l = _penalize(x.astype(np.float64), p, prompt_token_ids=[0, 1], output_token_ids=[1, 2, 2, 2], banned=[])
    # repetition over prompt + output (0, 1, 2); presence/frequency over the output only (1: once, 2: 3 times)
    np.testing.assert_array_equal(l, [1.0, -4.0 - 0.75, 0.5 - 1.25, 0.5, -1.0])


def test_presence_and_frequency_ignore_the_prompt() -> None:
    x = np.zeros(4)
    p = SamplingParams(presence_penalty=1.0, frequency_penalty=1.0)
    np.testing.assert_array_equal(_penalize(x, p, [0, 1, 2, 3], [], []), x)


# ---------------------------------------------------------------------------
# parameters
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("min_p", -0.1), ("min_p", 1.1), ("min_p", float("nan")), ("min_p", "x"),
        ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", float("inf")),
        ("presence_penalty", 2.5), ("presence_penalty", -2.01), ("frequency_penalty", 3.0), ("frequency_penalty", -2.5),
        ("min_tokens", -1), ("min_tokens", 17), ("min_tokens", 1.0), ("stop", 5), ("stop", [""]),
    ],
)  # fmt: skip
def test_new_params_validated_like_vllm(field: str, value) -> None:
    with pytest.raises(InvalidRequestError, match=f"SamplingParams.{field} must be"):
        SamplingParams(**{field: value})


def test_new_params_defaults_and_normalization() -> None:
    p = SamplingParams()
    assert (p.min_p, p.repetition_penalty, p.presence_penalty, p.frequency_penalty, p.stop, p.min_tokens) == (0.0, 1.0, 0.0, 0.0, [], 0)
    assert not p.has_penalties
    q = SamplingParams(min_p=np.float32(0.5), repetition_penalty=np.int64(2), stop=("a", "b"), min_tokens=np.int32(3), max_tokens=3)
    assert type(q.min_p) is float and type(q.repetition_penalty) is float and q.stop == ["a", "b"] and type(q.min_tokens) is int
    assert q.has_penalties and SamplingParams(presence_penalty=-2.0).has_penalties and SamplingParams(frequency_penalty=2).has_penalties


# ---------------------------------------------------------------------------
# min_tokens, vocab_size, robustness
# ---------------------------------------------------------------------------


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    row = np.array([[0.0, 9.0, 8.0, 1.0]], np.float32)  # EOS = 1, stop id 2
    p = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[2])
    for n_out, want in [(0, 3), (1, 3), (2, 1)]:
        got = sample(row, [p], prompt_token_ids=[[0]], output_token_ids=[[0] * n_out], eos_token_ids=[[1]]).token_ids[0]
        assert got == want
        assert sample_rows(row, [SamplingRow(p, [0], [0] * n_out, [1])]).token_ids[0] == want
    ignore = SamplingParams(temperature=0, min_tokens=2, ignore_eos=True)  # ignore_eos: EOS is not a stop id
    assert sample(row, [ignore], eos_token_ids=[[1]]).token_ids[0] == 1


def test_min_tokens_with_nothing_left_is_a_fallback_not_a_made_up_token() -> None:
    row = np.array([[9.0, -np.inf, np.nan]], np.float32)
    res = sample_rows(row, [SamplingRow(SamplingParams(temperature=0, min_tokens=1), eos_token_ids=[0])])
    assert res.fallback[0]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_vocab_size_never_returns_a_padded_id(temperature: float) -> None:
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((64, 48)).astype(np.float32)
    logits[:, 40:] = 1e30  # the embedding's padding: huge, +inf and NaN
    logits[::3, 44] = np.inf
    logits[::5, 45] = np.nan
    rows = [SamplingRow(SamplingParams(temperature=temperature, seed=i, logprobs=3)) for i in range(64)]
    res = sample_rows(logits, rows, vocab_size=40)
    assert (res.token_ids < 40).all() and not res.fallback.any()
    assert all(max(t for t, _ in lp.top) < 40 for lp in res.logprobs)
    gens = [make_generator(r.params) for r in rows] if temperature else None
    host = sample(logits, [r.params for r in rows], gens, vocab_size=40)
    assert (host.token_ids < 40).all()
    with pytest.raises(ValueError, match="vocab_size"):
        sample_rows(logits, rows, vocab_size=49)


def test_nan_rows_are_an_error_for_that_row_only() -> None:
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((4, 16)).astype(np.float32)
    good = logits.copy()
    logits[1] = np.nan
    logits[2, 5] = np.inf
    rows = [SamplingRow(SamplingParams(seed=9, repetition_penalty=1.5, min_p=0.1), [1, 2], [3]) for _ in range(4)]
    res = sample_rows(logits, rows)
    assert res.fallback.tolist() == [False, True, True, False]
    alone = sample_rows(good[[0, 3]], [rows[0], rows[3]])
    assert res.token_ids[[0, 3]].tolist() == alone.token_ids.tolist()


@pytest.mark.parametrize(
    "p",
    [
        SamplingParams(temperature=1e-300, seed=1),
        SamplingParams(temperature=1e300, seed=1),
        SamplingParams(repetition_penalty=1e-300, seed=1),
        SamplingParams(repetition_penalty=1e300, seed=1, temperature=1e-300),
        SamplingParams(top_p=1e-12, seed=1),
        SamplingParams(min_p=1.0, seed=1),
        SamplingParams(top_k=1, top_p=1e-9, min_p=0.999, seed=1),
        SamplingParams(presence_penalty=2, frequency_penalty=-2, seed=1),
    ],
)
def test_extreme_parameters_give_an_allowed_token_without_warnings(p: SamplingParams) -> None:
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal((8, 32)) * 1e4).astype(np.float32)
    logits[0, :4] = 3.4e38
    rows = [SamplingRow(p, [0, 1, 2], [3, 3, 4], step=s) for s in range(8)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = sample_rows(logits, rows)
    assert not res.fallback.any()
    for i in range(8):
        l = _penalize(logits[i].astype(np.float64), p, [0, 1, 2], [3, 3, 4], [])
        assert np.isfinite(l).all()  # penalties clamp, never overflow to inf
        assert 0 <= res.token_ids[i] < 32
        assert ref_probs(logits[i], p, [0, 1, 2], [3, 3, 4])[res.token_ids[i]] > 0


# ---------------------------------------------------------------------------
# seeds and the host Sampler
# ---------------------------------------------------------------------------


def test_sample_rows_draw_is_the_philox_uniform_of_seed_and_step() -> None:
    rng = np.random.default_rng(6)
    row = rng.standard_normal(32).astype(np.float32)
    p = SamplingParams(temperature=0.9, top_p=0.9, seed=123)
    x, _ = _sanitize(row)
    z = _scaled(x, p.temperature)
    w = np.exp(z - z.max())
    keep = _keep_mask(z, w, p.top_k, p.top_p, p.min_p)
    for step in range(200):
        got = sample_rows(row[None], [SamplingRow(p, step=step)]).token_ids[0]
        assert got == _draw_weights(w, keep, float(philox_uniform(123, step)))


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    rng = np.random.default_rng(7)
    a = SamplingParams(temperature=1.0, top_k=20, min_p=0.01, repetition_penalty=1.2, seed=2**63 + 5)
    others = [SamplingParams(temperature=0.5, seed=1), SamplingParams(temperature=0), SamplingParams(seed=3, top_p=0.5)]
    out: list[int] = []
    alone: list[int] = []
    for step in range(40):
        row = rng.standard_normal(50).astype(np.float32)
        alone.append(int(sample_rows(row[None], [SamplingRow(a, [1], alone.copy())]).token_ids[0]))
        k = step % 4
        batch = [np.roll(row, j + 1) for j in range(k)]
        batch.insert(step % (k + 1), row)
        rows = [SamplingRow(o) for o in others[:k]]
        rows.insert(step % (k + 1), SamplingRow(a, [1], out.copy()))
        res = sample_rows(np.stack(batch), rows)
        out.append(int(res.token_ids[step % (k + 1)]))
    assert out == alone


def test_sampled_row_without_seed_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="needs a seed"):
        sample_rows(np.zeros((1, 4)), [SamplingRow(SamplingParams())])
    assert sample_rows(np.arange(4.0)[None], [SamplingRow(SamplingParams(temperature=0))]).token_ids[0] == 3


def test_sampler_records_outputs_for_penalties() -> None:
    rng = np.random.default_rng(8)
    p = SamplingParams(temperature=0, repetition_penalty=1.7, frequency_penalty=0.6, min_tokens=3, stop_token_ids=[5])
    s = Sampler()
    s.add_request("a", p, prompt_token_ids=[1, 2], eos_token_ids=[0])
    outputs: list[int] = []
    for _ in range(6):
        logits = rng.standard_normal((1, 12)).astype(np.float32)
        logits[0, [0, 5]] += 3.0  # EOS and the stop id are likely
        got = int(s.sample(logits, ["a"]).token_ids[0])
        want = int(sample(logits, [p], prompt_token_ids=[[1, 2]], output_token_ids=[outputs], eos_token_ids=[[0]]).token_ids[0])
        assert got == want == int(np.argmax(hf_probs(logits[0], p, [1, 2], outputs, [0, 5] if len(outputs) < 3 else [])))
        outputs.append(got)


# ---------------------------------------------------------------------------
# distribution: >= 100k draws, TV distance < 0.01
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "p",
    [
        SamplingParams(temperature=1.0, seed=11),
        SamplingParams(temperature=0.7, top_k=12, seed=12),
        SamplingParams(temperature=1.3, top_p=0.8, seed=13),
        SamplingParams(temperature=0.9, min_p=0.05, repetition_penalty=1.4, presence_penalty=0.5, frequency_penalty=0.3, seed=14),
        SamplingParams(temperature=1.1, top_k=20, top_p=0.9, min_p=0.02, repetition_penalty=0.8, frequency_penalty=-0.5, seed=15),
    ],
)
def test_philox_draws_follow_the_processed_distribution(p: SamplingParams) -> None:
    """200k Philox draws (steps 0..199999 of one seed) through the reference's inverse CDF over
    its processed row: total-variation distance to transformers' distribution < 0.01. The
    full path (sample_rows) is that same inverse CDF of the same uniforms, token for token
    (checked on the first steps)."""
    rng = np.random.default_rng(p.seed)
    row = (rng.standard_normal(32) * 2).astype(np.float32)
    prompt, output = [1, 2, 3], [4, 4, 5, 9]
    want = hf_probs(row, p, prompt, output)
    x, _ = _sanitize(row)
    z = _scaled(_penalize(x, p, prompt, output, []), p.temperature)
    w = np.exp(z - z.max())
    keep = _keep_mask(z, w, p.top_k, p.top_p, p.min_p)
    n = 200_000
    u = philox_uniform(p.seed, np.arange(n, dtype=np.uint64))
    kept = np.flatnonzero(keep & (w > 0))
    cdf = np.cumsum(w[kept])
    tokens = kept[np.minimum(np.searchsorted(cdf, u * cdf[-1], side="right"), kept.size - 1)]
    freq = np.bincount(tokens, minlength=row.size) / n
    assert 0.5 * np.abs(freq - want).sum() < 0.01
    first = sample_rows(np.broadcast_to(row, (300, row.size)), [SamplingRow(p, prompt, output, step=s) for s in range(300)])
    assert first.token_ids.tolist() == tokens[:300].tolist()


def test_host_sampler_draws_follow_the_processed_distribution() -> None:
    """The host path (numpy.random.Generator) with the new parameters: 100k draws of
    ``sample`` over a batch of identical rows, TV < 0.01 against transformers."""
    p = SamplingParams(temperature=0.8, top_k=10, min_p=0.03, repetition_penalty=1.3, presence_penalty=0.4, seed=21)
    row = (np.random.default_rng(21).standard_normal(16) * 2).astype(np.float32)
    want = hf_probs(row, p, [0], [1, 1])
    n = 100_000
    g = make_generator(p)
    x, _ = _sanitize(row)
    z = _scaled(_penalize(x, p, [0], [1, 1], []), p.temperature)
    w = np.exp(z - z.max())
    keep = _keep_mask(z, w, p.top_k, p.top_p, p.min_p)
    tokens = np.array([_draw_weights(w, keep, u) for u in g.random(n)])
    freq = np.bincount(tokens, minlength=row.size) / n
    assert 0.5 * np.abs(freq - want).sum() < 0.01
    g2 = make_generator(p)
    res = sample(np.broadcast_to(row, (200, 16)), [p] * 200, [g2] * 200, prompt_token_ids=[[0]] * 200, output_token_ids=[[1, 1]] * 200)
    assert res.token_ids.tolist() == tokens[:200].tolist()
