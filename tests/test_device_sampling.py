"""Sampling on the device for the device executor (trtcore/runtime/request_sampler.py), on the
CPU: the runner over the reference backend on the stand-in device, whose sampling kernel runs the
NumPy reference on the records the step staged (seed, Philox step, min_tokens mask, penalty
slot), so what is checked here is the per-request state and its packing.

References: the NumPy reference sampler (:func:`trtcore.runtime.sampling.sample_rows`) applied
by the test to the step's logits, read back from the device; the same request run alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hf_models import VARIANTS, hf_models, random_prompt  # noqa: F401  (fixture)
from sampling_check import SAMPLING_PARAMS as PARAMS
from sampling_check import check_each_step_against_the_reference
from test_device_runner import NAME, _runner

from trtcore import SamplingParams
from trtcore.errors import InvalidRequestError
from trtcore.runtime.device_memory import HostDevice
from trtcore.runtime.generate import make_device_engine
from trtcore.runtime.request import Request
from trtcore.runtime.request_sampler import HostSamplerKernel, RequestSampler


def _requests(params: list[SamplingParams], prompts: list[list[int]], eos: frozenset[int] = frozenset({2})) -> list[Request]:
    return [Request(i, p, sp, eos) for i, (p, sp) in enumerate(zip(prompts, params))]


def test_every_step_samples_what_the_numpy_reference_draws_from_its_logits(hf_models: Any) -> None:  # noqa: F811
    """Each step's logits are read back from the device and sampled by the reference with the
    request's seed and its own step (the tokens it generated so far); the runner's tokens and
    logprobs equal those, for every parameter kind at once in one batch."""
    runner = _runner(hf_models)
    v = VARIANTS[NAME]
    rng = np.random.default_rng()
    prompts = [random_prompt(rng, int(n), v.vocab_size) for n in rng.integers(2, 30, size=len(PARAMS))]
    reqs = _requests(PARAMS, prompts)
    checked = check_each_step_against_the_reference(runner, reqs)
    core = make_device_engine(runner, runner.mode, async_scheduling=False)  # the check reads each step's logits
    list(core.generate(reqs))
    assert checked[0] == sum(len(r.output_token_ids) for r in reqs) > len(PARAMS)
    # min_tokens: no EOS / stop id before the fourth token
    assert not set(reqs[-1].output_token_ids[:4]) & {2, 7, 8}
    assert runner.sampler._states == {}  # finished requests are forgotten


def test_a_seeded_request_draws_the_same_tokens_alone_and_beside_others(hf_models: Any) -> None:  # noqa: F811
    runner = _runner(hf_models)
    v = VARIANTS[NAME]
    rng = np.random.default_rng()
    prompt = random_prompt(rng, 9, v.vocab_size)
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=10, ignore_eos=True)
    core = make_device_engine(runner, runner.mode)
    alone = _requests([seeded], [prompt])
    list(core.generate(alone))
    others = [SamplingParams(temperature=1.0, max_tokens=int(k), ignore_eos=True) for k in rng.integers(2, 12, size=4)]
    mixed = _requests(
        others[:2] + [seeded] + others[2:],
        [random_prompt(rng, int(n), v.vocab_size) for n in (3, 20)] + [prompt] + [random_prompt(rng, 5, v.vocab_size)] * 2,
    )
    list(core.generate(mixed))
    assert mixed[2].output_token_ids == alone[0].output_token_ids
    # unseeded requests draw their own seeds: two of the same prompt differ (probability of a
    # tie over 10 draws from a near-uniform random model is negligible)
    twins = _requests([SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)] * 2, [prompt, prompt])
    list(core.generate(twins))
    assert twins[0].output_token_ids != twins[1].output_token_ids


def test_a_request_beyond_the_kernels_limits_is_sampled_on_the_host(hf_models: Any) -> None:  # noqa: F811
    """logprobs=60 (the kernel returns 20) and min_tokens masking 40 ids (the kernel masks 32):
    their rows come back to the host and get the reference's tokens and logprobs; without a
    way to read logits back such a request is refused, alone."""
    runner = _runner(hf_models)
    v = VARIANTS[NAME]
    rng = np.random.default_rng()
    params = [
        SamplingParams(temperature=0, max_tokens=3, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=3, logprobs=60, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=4, min_tokens=2, stop_token_ids=list(range(10, 50)), max_tokens=4),
    ]
    reqs = _requests(params, [random_prompt(rng, 4, v.vocab_size) for _ in params])
    checked = check_each_step_against_the_reference(runner, reqs)
    core = make_device_engine(runner, runner.mode, async_scheduling=False)  # the check reads each step's logits
    list(core.generate(reqs))
    lens = [len(r.output_token_ids) for r in reqs]
    # the third may stop on a stop id once min_tokens=2 allows it (its draws are random)
    assert lens[:2] == [3, 3] and 2 <= lens[2] <= 4 and checked[0] == sum(lens)
    assert not set(reqs[2].output_token_ids[:2]) & set(range(10, 50))
    assert all(len(lp.top) == 60 for lp in reqs[1].logprobs)
    assert runner.sampler._states == {}

    sampler = RequestSampler(HostSamplerKernel(HostDevice(), 2, v.vocab_size))
    with pytest.raises(InvalidRequestError, match="max_logprobs=20"):
        sampler.add_request(reqs[1])


def _host_sampler(vocab: int, rows: int, num_slots: int | None = None) -> tuple[HostDevice, RequestSampler, np.ndarray, int]:
    dev = HostDevice()
    kernel = HostSamplerKernel(dev, rows, vocab)
    if num_slots is not None:
        kernel.num_slots = num_slots
    ptr = dev.malloc(rows * vocab * 4, "logits")
    return dev, RequestSampler(kernel), dev.view(ptr, (rows, vocab), np.float32), ptr


def test_a_row_with_nan_or_inf_gets_an_error_and_the_others_their_tokens() -> None:
    V = 50
    _, sampler, logits, ptr = _host_sampler(V, 4)
    rng = np.random.default_rng()
    logits[:] = rng.normal(size=(4, V))
    logits[1, 7] = np.nan
    logits[2, 3] = -np.inf
    reqs = _requests([SamplingParams(temperature=0)] * 4, [[3, 4]] * 4)
    for r in reqs:
        sampler.add_request(r)
    tokens, _, errors = sampler.collect(sampler.enqueue([0, 1, 2, 3], ptr, V))
    assert set(errors) == {1, 2} and all("non-finite" in e for e in errors.values())
    assert tokens == {0: int(np.argmax(logits[0])), 3: int(np.argmax(logits[3]))}


def test_penalty_slots_are_taken_from_requests_not_in_the_step_and_refilled() -> None:
    """Two slots, three requests with penalties sampled in turns: each step's rows hold
    distinct slots (the staged records name them), a request whose slot was taken refills it
    (from its prompt and outputs) when it is sampled again; requests without penalties take none."""
    V = 40
    _, sampler, logits, ptr = _host_sampler(V, 4, num_slots=2)
    logits[:] = np.random.default_rng().normal(size=(4, V))
    pen = SamplingParams(temperature=0, repetition_penalty=1.5, max_tokens=50)
    reqs = _requests([pen, pen, pen, SamplingParams(temperature=0, max_tokens=50)], [[3, 4], [5], [6, 7, 8], [9]])
    for r in reqs:
        sampler.add_request(r)
    fills = []
    for step_rows in ([0, 1], [2, 3], [0, 2], [1, 3], [1, 0]):
        step = sampler.enqueue(step_rows, ptr, V)
        staged = sampler.kernel._staged
        slots = [int(staged[i]["slot"]) for i, rid in enumerate(step_rows) if reqs[rid].params.has_penalties]
        assert len(set(slots)) == len(slots) and all(0 <= s < 2 for s in slots)
        for i, rid in enumerate(step_rows):
            if reqs[rid].params.has_penalties:
                assert sampler._states[rid].slot == int(staged[i]["slot"])
        tokens, _, errors = sampler.collect(step)
        assert not errors
        for rid, tok in tokens.items():
            reqs[rid].output_token_ids.append(tok)
        fills.append(sampler.num_slot_fills)
    assert fills == [2, 3, 4, 5, 5]  # [1, 0]: both still hold the slots they took in the steps before
    assert sampler._states[3].slot is None
    for r in reqs:
        sampler.remove_request(r.request_id)
    assert sampler._slot_owner == [None, None]


@pytest.mark.parametrize("min_tokens", [0, 3])
def test_the_min_tokens_mask_lifts_at_min_tokens(min_tokens: int) -> None:
    """EOS carries all the probability mass; it is drawn first at output index ``min_tokens``."""
    V = 30
    _, sampler, logits, ptr = _host_sampler(V, 1)
    logits[:] = 0.0
    logits[0, 2] = 50.0  # EOS
    r = _requests([SamplingParams(temperature=1.0, seed=1, min_tokens=min_tokens, max_tokens=10)], [[4, 5]])[0]
    sampler.add_request(r)
    while True:
        tok = sampler.collect(sampler.enqueue([0], ptr, V))[0][0]
        r.output_token_ids.append(tok)
        if tok == 2:
            break
    assert len(r.output_token_ids) == min_tokens + 1


def test_async_scheduling_gives_every_request_the_tokens_of_one_step_at_a_time(hf_models: Any) -> None:  # noqa: F811
    """The device engine loop scheduling each step before the one in flight is sampled, on a
    device that runs nothing until the host waits (so a host buffer rewritten before its
    copy ran, or a token fed from the wrong row, changes the tokens): every request -- each
    sampling kind, early stops (a stop id finishes a request with a step in flight),
    arrivals while others decode, preemptions in a small pool -- gets the tokens of the
    same engine run one step at a time; the greedy ones are transformers' too."""
    from hf_models import hf_greedy

    v = VARIANTS[NAME]
    rng = np.random.default_rng()
    # 29-31 tokens: two blocks each, so three running requests fill the pool and the third
    # block any of them needs soon after preempts one
    prompts = [random_prompt(rng, n, v.vocab_size) for n in (31, 30, 31, 29, 31, 30, 31, 29)]
    stop = SamplingParams(temperature=1.0, seed=21, max_tokens=12, stop_token_ids=list(range(0, v.vocab_size, 3)))
    params = [*PARAMS, stop, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)]
    params = [p if p.seed is not None or p.greedy else SamplingParams(**{**p.__dict__, "seed": 77}) for p in params]  # reproducible
    runs = []
    for async_scheduling, deferred in ((False, False), (True, True)):
        runner = _runner(hf_models, num_blocks=7, max_batch_size=4, deferred=deferred)  # 6 usable blocks of 16: preemptions
        core = make_device_engine(runner, runner.mode, async_scheduling=async_scheduling)
        reqs = _requests(params, prompts)
        for r in reqs[:5]:
            core.add_request(r)
        steps = run_ahead = 0
        while core.has_unfinished_requests():
            if steps == 3:
                for r in reqs[5:]:
                    core.add_request(r)
            core.step()
            steps += 1
            run_ahead += len(core._in_flight)  # a step left in flight: enqueued before this one's update
        runs.append(([list(r.output_token_ids) for r in reqs], [r.finish_reason for r in reqs], core.scheduler.num_preemptions, run_ahead))
    (sync_tokens, sync_reasons, sync_preempted, none_ahead), (tokens, reasons, preempted, ahead) = runs
    assert none_ahead == 0 and ahead > len(params)
    assert sync_preempted > 0 and preempted > 0
    assert tokens == sync_tokens and reasons == sync_reasons
    assert reasons[len(PARAMS)] == "stop" or len(tokens[len(PARAMS)]) == 12
    for i in (0, len(params) - 1):  # the greedy requests
        assert tokens[i] == hf_greedy(hf_models.hf(NAME), prompts[i], len(tokens[i]))[0]


def test_async_scheduling_can_be_switched_between_steps_only(hf_models: Any) -> None:  # noqa: F811
    from trtcore.runtime.scheduler import SchedulerError

    runner = _runner(hf_models)
    core = make_device_engine(runner, runner.mode)
    assert core.async_scheduling
    core.add_request(_requests([SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)], [[3, 4, 5]])[0])
    core.step()
    assert core._in_flight  # the next step was enqueued behind the prefill
    with pytest.raises(SchedulerError, match="in flight"):
        core.async_scheduling = False
    while core.has_unfinished_requests():
        core.step()
    core.async_scheduling = False
    assert not core.async_scheduling and core.scheduler.max_pending == 1


@pytest.mark.parametrize("n", [1, 3, 8, 9, 32])
def test_stage_records_writes_the_gathered_records_with_their_steps(n: int) -> None:
    """stage_records (a row at a time for a few rows, np.take beyond) leaves the buffer's first
    rows equal to ``table[index]`` with ``step`` replaced, field by field, and the rows past
    them untouched."""
    from trtcore.runtime.sampling_gpu import row_params_dtype, stage_records

    dt = row_params_dtype(32)
    rng = np.random.default_rng()
    table = np.frombuffer(rng.integers(0, 256, size=64 * dt.itemsize, dtype=np.uint8).tobytes(), dt).copy()
    index = rng.integers(0, 64, size=n).tolist()
    steps = rng.integers(0, 2**40, size=n).tolist()
    dst = np.frombuffer(rng.integers(0, 256, size=40 * dt.itemsize, dtype=np.uint8).tobytes(), dt).copy()
    before = dst.copy()
    stage_records(
        dst.view(np.uint8).reshape(40, -1),
        dst.view(np.uint64).reshape(40, -1),
        table.view(np.uint8).reshape(64, -1),
        index,
        steps,
        dt.fields["step"][1] // 8,
    )
    want = table[index]
    want["step"] = steps
    assert dst[:n].tobytes() == want.tobytes()
    assert dst["step"][:n].tolist() == steps
    assert dst[n:].tobytes() == before[n:].tobytes()


class _StatusKernel:
    """A kernel whose step results are given per row as the GPU kernel's status codes, read
    either way: ``result_status`` (the step loop's path) or ``result`` (arrays)."""

    num_slots = 1

    def __init__(self, tokens: list[int], codes: list[int]) -> None:
        from trtcore.runtime.sampling_gpu import ROW_PARAMS_DTYPE

        self.params_dtype = ROW_PARAMS_DTYPE
        self.tokens, self.codes = tokens, codes

    def result_status(self, ticket: int) -> list[list[int]]:
        return [[t, c] for t, c in zip(self.tokens, self.codes)]

    def result(self, ticket: int) -> Any:
        from trtcore.runtime.sampling import SampleResult
        from trtcore.runtime.sampling_gpu import STATUS_FALLBACK, STATUS_INACTIVE, STATUS_NONFINITE_BIT

        codes = np.array(self.codes)
        status = codes & ~STATUS_NONFINITE_BIT
        tokens = np.where(status == STATUS_INACTIVE, -1, self.tokens).astype(np.int64)
        return SampleResult(tokens, [None] * len(codes), status == STATUS_FALLBACK, (codes & STATUS_NONFINITE_BIT) != 0)


def test_collect_without_logprobs_reads_the_status_codes_as_the_arrays_say() -> None:
    """Every status code (ok, fallback, inactive, each with and without the non-finite bit)
    on rows of requests and on rows of none: collect's path without logprobs (tokens and codes
    only) gives the tokens and errors its path through the result arrays gives, and the
    documented outcome: a non-finite row an error naming it, a fallback an error, else the token."""
    from trtcore.runtime.request_sampler import SamplingStep
    from trtcore.runtime.sampling_gpu import STATUS_FALLBACK, STATUS_INACTIVE, STATUS_NONFINITE_BIT, STATUS_OK

    rng = np.random.default_rng()
    codes = [c | bit for c in (STATUS_OK, STATUS_FALLBACK, STATUS_INACTIVE) for bit in (0, STATUS_NONFINITE_BIT)] * 2
    order = rng.permutation(len(codes)).tolist()
    codes = [codes[i] for i in order]
    tokens = rng.integers(0, 1000, size=len(codes)).tolist()
    ids: list[Any] = [f"r{i}" if i < len(codes) // 2 or i % 3 else None for i in range(len(codes))]
    sampler = RequestSampler(_StatusKernel(tokens, codes))
    fast = sampler.collect(SamplingStep(ids, [], 0, False))
    arrays = sampler.collect(SamplingStep(ids, [], 0, True))
    assert fast == arrays
    sampled, logprobs, errors = fast
    for i, rid in enumerate(ids):
        if rid is None:
            assert rid not in sampled and rid not in errors
        elif codes[i] & STATUS_NONFINITE_BIT:
            assert "non-finite" in errors[rid] and rid not in sampled
        elif codes[i] == STATUS_FALLBACK:
            assert "no token" in errors[rid] and rid not in sampled
        else:
            assert sampled[rid] == (-1 if codes[i] == STATUS_INACTIVE else tokens[i]) and logprobs[rid] is None
