"""A check shared by the CPU and GPU tests of the device executor's sampling: every step's
device logits, read back, sampled by the NumPy reference (:func:`trtcore.runtime.sampling.sample_rows`)
with each request's seed and its own step, give the runner's tokens (and top logprobs)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from trtcore import SamplingParams
from trtcore.runtime.request import Request
from trtcore.runtime.sampling import SamplingRow, sample_rows


#: one request of each parameter kind (greedy; seeded and unseeded draws; top-k, top-p, min-p;
#: the three penalties; min_tokens with stop ids and logprobs)
SAMPLING_PARAMS = [
    SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=0.8, seed=11, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=1.0, top_k=5, max_tokens=8, ignore_eos=True),  # unseeded: a seed is drawn
    SamplingParams(temperature=0.9, top_p=0.8, min_p=0.05, seed=3, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=0.7, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.4, seed=5, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=1.0, seed=9, min_tokens=4, max_tokens=8, stop_token_ids=[7, 8], logprobs=3),
]


def check_each_step_against_the_reference(runner: Any, requests: list[Request], logprob_tol: float = 0.0) -> list[int]:
    """Wrap ``runner.sampler.collect`` so that each step is checked (assertions inside): its
    logits, read back from the device when it is collected, sampled by the reference on the
    outputs the host knows then. The engine must run one step at a time
    (``async_scheduling=False``: a step run ahead would overwrite the logits first). Returns
    a one-element list counting the checked tokens."""
    by_id: dict[Hashable, Request] = {r.request_id: r for r in requests}
    collect = runner.sampler.collect
    checked = [0]

    def checked_collect(step: Any) -> Any:
        assert not runner._in_flight, "check_each_step_against_the_reference needs async_scheduling=False"
        ids = step.request_ids
        logits = runner.logits_rows(len(ids)).copy()  # this step's logits, from the device
        got = collect(step)
        sampled, logprobs, errors = got
        assert not errors, errors
        for i, rid in enumerate(ids):
            if rid is None:
                continue
            r = by_id[rid]
            seed = runner.sampler._states[rid].row.seed
            row = SamplingRow(r.params, r.prompt_token_ids, list(r.output_token_ids), sorted(r.eos_token_ids), seed=seed)
            ref = sample_rows(logits[i : i + 1], [row])
            assert sampled[rid] == int(ref.token_ids[0]), f"request {rid} at its step {len(r.output_token_ids)}: {sampled[rid]} != {int(ref.token_ids[0])}"
            if r.params.logprobs is not None:
                got_top, ref_top = logprobs[rid].top, ref.logprobs[0].top
                assert [t for t, _ in got_top] == [t for t, _ in ref_top]
                assert all(abs(a.logprob - b.logprob) <= logprob_tol for (_, a), (_, b) in zip(got_top, ref_top))
            checked[0] += 1
        return got

    runner.sampler.collect = checked_collect
    return checked
