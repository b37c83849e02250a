"""Continuous-batching scheduler, driven by a fake deterministic model with a fake KV store.

The fake model's next token is a hash of the sequence's whole token history. It sees that
history only through the KV pool: each step it writes the fed tokens into their slots
(from ``block_table``, as the paged attention plugin does), then reads every sequence's first ``seq_len`` tokens back through its
``block_table``. So a block shared by two live sequences, a wrong slot, a stale block or a
wrong ``num_cached_tokens`` changes the history it reads and therefore the tokens; a
request that finishes with exactly the tokens of running it alone was not corrupted.
"""

from __future__ import annotations

import math
import random
from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtcore.errors import InvalidArgumentError, InvalidRequestError
from trtcore.runtime.kv_cache import BlockManager
from trtcore.runtime.request import Request
from trtcore.runtime.sampling import SamplingParams
from trtcore.runtime.scheduler import (
    PLACEHOLDER_TOKEN_ID,
    RequestStatus,
    Scheduler,
    SchedulerError,
    SchedulerOutput,
)

VOCAB = 50  # small, so EOS tokens actually occur


def add(sched, request_id, prompt, max_tokens, eos_token_ids=()) -> Request:
    """Queue a request record that ends only by ``max_tokens`` or an EOS id."""
    return sched.add_request(Request(request_id, prompt, SamplingParams(max_tokens=max_tokens), eos_token_ids))


def step(sched, model) -> list:
    """schedule -> the fake model -> update (skipping the model on an empty step)."""
    out = sched.schedule()
    return sched.update(model(out) if out.seqs else {})


def next_token(history) -> int:
    """Deterministic 'model': a polynomial hash of the full token history."""
    h = 0
    for t in history:
        h = (h * 1_000_003 + int(t) + 1) % 2_147_483_647
    return h % VOCAB


def reference(prompt, max_tokens, eos=()) -> tuple[list[int], str]:
    """Tokens (and finish reason) of a request run alone, without any scheduler or cache."""
    hist, out = list(prompt), []
    while True:
        t = next_token(hist)
        out.append(t)
        hist.append(t)
        if t in eos:
            return out, "stop"
        if len(out) == max_tokens:
            return out, "length"


class FakePagedModel:
    """Reads and writes token ids (instead of keys/values) in a pool of slots."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.kv = np.full(num_blocks * block_size, -1, dtype=np.int64)  # never cleared: stale data stays

        self.last: dict = {}  # request id -> the token it sampled in the last step run ("device" state)

    def __call__(self, out: SchedulerOutput) -> dict:
        bs = self.block_size
        # write phase for the whole batch first (as a layer writes K/V before attention); a
        # placeholder is the token the request sampled in the step before (the device's feed)
        for s in out.seqs:
            fed = [self.last[s.request_id] if t == PLACEHOLDER_TOKEN_ID else t for t in s.token_ids]
            self.kv[[s.block_table[p // bs] * bs + p % bs for p in s.positions]] = fed
        result = {}
        for s in out.seqs:
            slots = [s.block_table[p // bs] * bs + p % bs for p in range(s.seq_len)]
            if s.produces_token:
                result[s.request_id] = next_token(self.kv[slots])
        self.last = result
        return result


def check_step(sched: Scheduler, out: SchedulerOutput) -> None:
    """Per-step properties of a schedule."""
    assert out.num_batched_tokens == sum(s.num_new_tokens for s in out.seqs)
    assert out.num_batched_tokens <= sched.max_num_batched_tokens
    assert sched.num_running <= sched.max_num_seqs
    assert len(set(out.request_ids)) == len(out.seqs)
    bs = out.block_size
    used = set()
    for s in out.seqs:
        assert s.num_new_tokens >= 1
        assert s.positions == list(range(s.num_cached_tokens, s.seq_len))
        assert len(s.block_table) == math.ceil(s.seq_len / bs)
        assert used.isdisjoint(s.block_table), "two scheduled sequences share a block"
        used.update(s.block_table)
        req = sched.get_request(s.request_id)
        assert req is not None and req.status is RequestStatus.RUNNING
        # the tokens it has once this step's (and an earlier step's in-flight) tokens land
        assert s.produces_token == (s.seq_len == req.num_tokens + req.num_output_placeholders - s.produces_token)
        if not sched.chunked_prefill:
            assert s.produces_token
    sched.check_invariants()


def drive(sched, model, arrivals, max_steps=100_000):
    """Run to completion. ``arrivals``: step -> list of (request_id, prompt, max_tokens, eos).
    With ``sched.max_pending == 2`` (asynchronous scheduling) each next step is scheduled and
    run before the one in flight is updated, as the device engine loop does.

    Returns (states, streamed tokens per request, stats)."""
    arrivals = {k: list(v) for k, v in arrivals.items()}
    states, streamed = {}, {}
    stats = {"steps": 0, "partial_prefills": 0, "preempted": 0, "max_batch": 0, "recomputes": 0, "run_ahead": 0, "placeholders": 0}
    in_flight: deque = deque()

    def run_one():
        out = sched.schedule()
        check_step(sched, out)
        stats["preempted"] += len(out.preempted_request_ids)
        stats["partial_prefills"] += sum(1 for s in out.seqs if not s.produces_token)
        stats["recomputes"] += sum(
            1 for s in out.seqs if s.is_prefill and s.seq_len > sched.get_request(s.request_id).num_prompt_tokens
        )
        stats["placeholders"] += sum(t == PLACEHOLDER_TOKEN_ID for s in out.seqs for t in s.token_ids)
        stats["max_batch"] = max(stats["max_batch"], len(out.seqs))
        in_flight.append((out, model(out) if out.seqs else {}))

    def update(result):
        for ev in sched.update(result):
            streamed.setdefault(ev.request_id, []).extend(ev.new_token_ids)
            if ev.finished and ev.request_id in states:
                assert states[ev.request_id].is_finished

    step = 0
    while arrivals or sched.has_unfinished_requests() or in_flight:
        for rid, prompt, max_tokens, eos in arrivals.pop(step, []):
            states[rid] = add(sched, rid, prompt, max_tokens, eos_token_ids=eos)
            streamed[rid] = []
        if not in_flight:
            run_one()
        if sched.max_pending > 1 and in_flight[0][0].seqs:
            run_one()
            stats["run_ahead"] += 1
        update(in_flight.popleft()[1])
        if in_flight and not in_flight[0][0].seqs:
            update(in_flight.popleft()[1])
        step += 1
        assert step < max_steps, "scheduler made no progress"
    stats["steps"] = step
    assert sched.block_manager.num_free_blocks == sched.block_manager.num_blocks  # nothing leaked
    return states, streamed, stats


def make_requests(rng: random.Random, n: int, max_prompt: int, max_new: int, eos_share=0.3):
    reqs = []
    for i in range(n):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, max_prompt))]
        eos = (rng.randrange(VOCAB),) if rng.random() < eos_share else ()
        reqs.append((f"r{i}", prompt, rng.randint(1, max_new), eos))
    return reqs


def assert_matches_reference(reqs, states, streamed):
    for rid, prompt, max_tokens, eos in reqs:
        st_ = states[rid]
        assert st_.status is RequestStatus.FINISHED, (rid, st_.status, st_.error)
        want, reason = reference(prompt, max_tokens, eos)
        assert st_.output_token_ids == want, f"{rid}: corrupted tokens"
        assert st_.finish_reason == reason
        assert streamed[rid] == want


# ---- end to end -------------------------------------------------------------------------


@pytest.mark.parametrize("chunked", [True, False])
def test_64_requests_through_a_small_pool(chunked):
    rng = random.Random(1234)
    reqs = make_requests(rng, 64, max_prompt=40, max_new=30)
    block_size, num_blocks = 4, 24  # 96 token slots; one request needs at most 69
    # half at once, the rest arriving over time while others decode
    arrivals: dict[int, list] = {0: reqs[:32]}
    for i, r in enumerate(reqs[32:]):
        arrivals.setdefault(3 + 4 * i, []).append(r)
    bm = BlockManager(num_blocks, block_size)
    budget = 16 if chunked else 80
    sched = Scheduler(bm, max_num_batched_tokens=budget, max_num_seqs=12, chunked_prefill=chunked)
    states, streamed, stats = drive(sched, FakePagedModel(num_blocks, block_size), arrivals)
    assert_matches_reference(reqs, states, streamed)
    assert stats["preempted"] > 0 and sched.num_preemptions == stats["preempted"]
    assert sum(s.num_preemptions for s in states.values()) == stats["preempted"]
    assert stats["recomputes"] > 0  # preempted requests were re-prefilled with their generated tokens
    assert stats["max_batch"] > 1
    if chunked:
        assert stats["partial_prefills"] > 0
    else:
        assert stats["partial_prefills"] == 0
    assert any(s.finish_reason == "stop" for s in states.values())
    assert any(s.finish_reason == "length" for s in states.values())


@pytest.mark.parametrize("chunked", [True, False])
def test_async_scheduling_runs_one_step_ahead_and_every_request_matches_running_alone(chunked):
    """The workload of the test above with each step scheduled before the one in flight is
    updated: decodes feed placeholders (the fake model substitutes the token it sampled the
    step before, as the device does), requests that finish on a token in flight waste one
    step, preempted requests with a token in flight wait for it; every request still gets
    exactly its tokens run alone, and nothing leaks."""
    rng = random.Random(4321)
    reqs = make_requests(rng, 64, max_prompt=40, max_new=30)
    arrivals: dict[int, list] = {0: reqs[:32]}
    for i, r in enumerate(reqs[32:]):
        arrivals.setdefault(3 + 4 * i, []).append(r)
    block_size, num_blocks = 4, 24
    sched = Scheduler(BlockManager(num_blocks, block_size), 16 if chunked else 80, 12, chunked_prefill=chunked, async_scheduling=True)
    states, streamed, stats = drive(sched, FakePagedModel(num_blocks, block_size), arrivals)
    assert_matches_reference(reqs, states, streamed)
    assert stats["run_ahead"] > stats["steps"] // 2 and stats["placeholders"] > 0
    assert stats["preempted"] > 0 and stats["recomputes"] > 0
    assert all(s.num_output_placeholders == 0 for s in states.values() if s.finish_reason == "length")


def test_async_scheduling_placeholders_and_the_last_token_in_flight():
    """A decode scheduled while its token is in flight feeds PLACEHOLDER_TOKEN_ID at the next
    position; a request whose max_tokens-th token is in flight is not scheduled again; the
    updates apply in scheduling order; a third pending step is refused."""
    sched = Scheduler(BlockManager(8, 4), 16, 4, async_scheduling=True)
    r = add(sched, "a", [1, 2, 3], max_tokens=2)
    first = sched.schedule()  # prefill: produces token 0
    assert first.seqs[0].token_ids == [1, 2, 3] and r.num_output_placeholders == 1
    second = sched.schedule()  # its token 0 is in flight
    (s,) = second.seqs
    assert s.token_ids == [PLACEHOLDER_TOKEN_ID] and s.positions == [3] and not s.is_prefill and s.produces_token
    assert r.num_output_placeholders == 2
    with pytest.raises(SchedulerError, match="before update"):
        sched.schedule()
    sched.update({"a": 7})
    assert r.output_token_ids == [7] and r.num_output_placeholders == 1
    third = sched.schedule()  # token 1 (its last, max_tokens=2) is in flight: nothing to run
    assert third.is_empty
    (ev,) = sched.update({"a": 9})
    assert ev.finish_reason == "length" and r.output_token_ids == [7, 9]
    assert sched.update({}) == [] and not sched.has_unfinished_requests()
    assert sched.block_manager.num_free_blocks == 8


def test_run_alone_through_the_scheduler_matches_reference():
    rng = random.Random(7)
    for rid, prompt, max_tokens, eos in make_requests(rng, 5, 30, 20):
        bm = BlockManager(64, 4)
        sched = Scheduler(bm, 8, 4)
        states, streamed, _ = drive(sched, FakePagedModel(64, 4), {0: [(rid, prompt, max_tokens, eos)]})
        assert_matches_reference([(rid, prompt, max_tokens, eos)], states, streamed)


def test_corruption_is_detected_by_the_fake_model():
    """Sanity check of the harness: a scheduler that hands out a wrong slot is caught."""
    rng = random.Random(3)
    reqs = make_requests(rng, 6, 12, 10, eos_share=0)
    bm = BlockManager(32, 2)
    sched = Scheduler(bm, 8, 4)
    real = bm.block_table
    bm.block_table = lambda sid: real(sid)[::-1]  # blocks out of token order
    states, _, _ = drive(sched, FakePagedModel(32, 2), {0: reqs})
    assert any(states[r[0]].output_token_ids != reference(r[1], r[2])[0] for r in reqs)


def test_rejection_names_the_asked_max_tokens_and_the_max_seq_len_that_capped_it():
    sched = Scheduler(BlockManager(2, 4), 16, 8)  # 8 slots
    capped = sched.add_request(Request("c", [1, 2, 3], SamplingParams(max_tokens=9999999), max_seq_len=64))
    assert capped.status is RequestStatus.REJECTED
    assert "(3-token prompt + max_tokens 61 - 1, max_tokens=9999999 being capped by max_seq_len=64) = 16 blocks of 4" in capped.error
    plain = add(sched, "p", [1, 2, 3], max_tokens=20)
    assert "(3-token prompt + max_tokens 20 - 1) = 6 blocks of 4" in plain.error and "capped" not in plain.error


def test_impossible_request_is_rejected_without_affecting_others():
    rng = random.Random(5)
    reqs = make_requests(rng, 10, 20, 10)
    bm = BlockManager(12, 4)  # 48 slots
    sched = Scheduler(bm, 16, 8)
    huge = add(sched, "huge", list(range(40)), max_tokens=10)  # 49 KV tokens > 48 slots
    assert huge.status is RequestStatus.REJECTED and huge.finish_reason == "rejected"
    assert "13 blocks" in huge.error and "12 blocks" in huge.error and "'huge'" in huge.error
    assert sched.get_request("huge") is None
    # exactly the whole pool is fine: 40 + 9 - 1 = 48 tokens
    states, streamed, _ = drive(sched, FakePagedModel(12, 4), {0: reqs + [("edge", list(range(40)), 9, ())]})
    assert_matches_reference(reqs + [("edge", list(range(40)), 9, ())], states, streamed)
    # the rejection was reported once through update()'s outputs
    sched2 = Scheduler(BlockManager(2, 2), 4, 2)
    add(sched2, "x", [1, 2, 3, 4, 5], 1)
    sched2.schedule()
    [ev] = sched2.update({})
    assert ev.request_id == "x" and ev.finished and ev.finish_reason == "rejected" and "whole KV pool" in ev.error
    sched2.schedule()
    assert sched2.update({}) == []


def test_unchunked_and_max_model_len_rejections():
    sched = Scheduler(BlockManager(100, 4), max_num_batched_tokens=10, max_num_seqs=4, chunked_prefill=False)
    assert add(sched, "ok", [1] * 5, 6).status is RequestStatus.WAITING  # 10 tokens
    r = add(sched, "long", [1] * 5, 7)
    assert r.status is RequestStatus.REJECTED and "max_num_batched_tokens=10" in r.error
    sched = Scheduler(BlockManager(100, 4), 10, 4, max_model_len=16)
    assert add(sched, "ok", [1] * 10, 6).status is RequestStatus.WAITING
    r = add(sched, "long", [1] * 10, 7)
    assert r.status is RequestStatus.REJECTED and "max_model_len 16" in r.error


def test_preempts_the_most_recently_admitted_and_recomputes():
    bm = BlockManager(num_blocks=4, block_size=2)
    model = FakePagedModel(4, 2)
    sched = Scheduler(bm, max_num_batched_tokens=16, max_num_seqs=4)
    a = add(sched, "a", [1, 2, 3], max_tokens=4)  # up to 6 KV tokens = 3 blocks
    b = add(sched, "b", [4, 5, 6], max_tokens=3)
    out = sched.schedule()
    assert [s.request_id for s in out.seqs] == ["a", "b"] and bm.num_free_blocks == 0
    sched.update(model(out))
    c = add(sched, "c", [7], max_tokens=2)  # waits: no free block
    out = sched.schedule()  # both decode at position 3: still in their second block
    assert out.preempted_request_ids == [] and all(not s.is_prefill for s in out.seqs)
    sched.update(model(out))
    out = sched.schedule()  # a needs a third block: b (admitted last) is preempted
    assert out.preempted_request_ids == ["b"] and out.request_ids == ["a"]
    assert b.status is RequestStatus.PREEMPTED and b.num_preemptions == 1 and len(b.output_token_ids) == 2
    assert list(sched.waiting) == [b, c] and "b" not in bm  # back at the front of the queue
    sched.update(model(out))
    kept = list(b.output_token_ids)
    while a.status is RequestStatus.RUNNING:
        out = sched.schedule()
        sched.update(model(out))
    out = sched.schedule()  # b comes back first: prompt + its generated tokens are prefilled again
    assert out.request_ids == ["b", "c"]
    s = out.seqs[0]
    assert s.request_id == "b" and s.is_prefill and s.num_cached_tokens == 0
    assert s.token_ids == [4, 5, 6] + kept and s.produces_token
    sched.update(model(out))
    assert b.status is RequestStatus.FINISHED
    drive(sched, model, {})
    assert c.output_token_ids == reference([7], 2)[0]
    assert a.output_token_ids == reference([1, 2, 3], 4)[0]
    assert b.output_token_ids == reference([4, 5, 6], 3)[0]


def test_running_request_preempts_itself_when_it_is_the_newest():
    bm = BlockManager(num_blocks=3, block_size=1)
    sched = Scheduler(bm, 8, 4)
    model = FakePagedModel(3, 1)
    a = add(sched, "a", [1], max_tokens=3)
    out = sched.schedule()
    sched.update(model(out))
    b = add(sched, "b", [2], max_tokens=3)
    # a decodes (2 slots), b prefills (1 slot): pool full
    out = sched.schedule()
    assert out.request_ids == ["a", "b"]
    sched.update(model(out))
    out = sched.schedule()  # a needs a slot: the newest, b, goes; then a runs
    assert out.preempted_request_ids == ["b"] and out.request_ids == ["a"]
    sched.update(model(out))
    assert a.status is RequestStatus.FINISHED
    drive(sched, model, {})
    assert b.output_token_ids == reference([2], 3)[0]


def test_chunked_prefill_under_a_tiny_budget_with_decodes_first():
    bm = BlockManager(64, 4)
    model = FakePagedModel(64, 4)
    sched = Scheduler(bm, max_num_batched_tokens=5, max_num_seqs=4)
    short = add(sched, "short", [3, 1], max_tokens=6)
    out = sched.schedule()
    sched.update(model(out))
    long_prompt = list(range(1, 18))  # 17 tokens
    long = add(sched, "long", long_prompt, max_tokens=2)
    chunks = []
    while long.num_output_tokens == 0:
        out = sched.schedule()
        assert out.seqs[0].request_id == "short" and out.seqs[0].num_new_tokens == 1  # the decode comes first
        ls = [s for s in out.seqs if s.request_id == "long"]
        if ls:
            chunks.append((ls[0].num_cached_tokens, ls[0].num_new_tokens, ls[0].produces_token))
        sched.update(model(out))
    assert chunks == [(0, 4, False), (4, 4, False), (8, 4, False), (12, 4, False), (16, 1, True)]
    drive(sched, model, {})
    assert long.output_token_ids == reference(long_prompt, 2)[0]
    assert short.output_token_ids == reference([3, 1], 6)[0]


def test_budget_smaller_than_the_batch_still_progresses():
    rng = random.Random(11)
    reqs = make_requests(rng, 12, 6, 8)
    sched = Scheduler(BlockManager(64, 2), max_num_batched_tokens=3, max_num_seqs=8)
    states, streamed, _ = drive(sched, FakePagedModel(64, 2), {0: reqs})
    assert_matches_reference(reqs, states, streamed)


def test_max_num_seqs_limits_admission():
    sched = Scheduler(BlockManager(64, 4), max_num_batched_tokens=100, max_num_seqs=2)
    for i in range(4):
        add(sched, i, [1, 2], 5)
    out = sched.schedule()
    assert out.request_ids == [0, 1] and sched.num_waiting == 2


def test_finish_abort_and_predicate():
    model = FakePagedModel(32, 4)
    stops = []

    def predicate(state, token):
        if state.request_id == "p" and state.num_output_tokens == 2:
            stops.append(token)
            return "stop_string"
        return None

    sched = Scheduler(BlockManager(32, 4), 16, 8, finish_predicate=predicate)
    a = add(sched, "a", [1, 2, 3], 10)
    w = add(sched, "w", [4, 5], 10)
    p = add(sched, "p", [6], 10)
    out = sched.schedule()
    sched.update(model(out))
    # abort between schedule() and update(): its token is ignored, its blocks freed
    out = sched.schedule()
    assert sched.finish("a", "abort") is True
    assert "a" not in sched.block_manager and a.status is RequestStatus.FINISHED
    events = sched.update(model(out))  # still contains a's token: ignored
    assert [e.request_id for e in events] == ["a", "w", "p"]
    assert events[0].finished and events[0].finish_reason == "abort" and events[0].new_token_ids == []
    assert len(a.output_token_ids) == 1
    assert p.finish_reason == "stop_string" and stops == [p.output_token_ids[-1]] and len(p.output_token_ids) == 2
    assert sched.finish("a") is False and sched.finish("nobody") is False
    # abort a waiting request
    q = add(sched, "q", [9], 3)
    assert sched.finish("q", "cancelled") and q.finish_reason == "cancelled" and sched.num_waiting == 0
    drive(sched, model, {})
    assert w.output_token_ids == reference([4, 5], 10)[0]
    sched.check_invariants()


def test_streaming_take_new_token_ids():
    model = FakePagedModel(16, 4)
    sched = Scheduler(BlockManager(16, 4), 8, 2)
    r = add(sched, "s", [1, 2, 3], 4)
    seen = []
    while sched.has_unfinished_requests():
        step(sched, model)
        seen.append(r.take_new_token_ids())
    assert seen == [[t] for t in reference([1, 2, 3], 4)[0]]
    assert r.take_new_token_ids() == []


def test_output_arrays():
    bm = BlockManager(16, 4)
    sched = Scheduler(bm, 8, 4)
    add(sched, "a", [1, 2, 3, 4, 5, 6], 2)
    add(sched, "b", [7, 8, 9, 10, 11], 2)  # only 2 tokens of budget left: a chunk
    out = sched.schedule()
    assert out.input_ids().tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert out.positions().tolist() == [0, 1, 2, 3, 4, 5, 0, 1]
    assert out.query_start_loc().tolist() == [0, 6, 8]
    assert out.last_token_indices().tolist() == [5, 7]
    assert out.seq_lens().tolist() == [6, 2] and out.num_cached_tokens().tolist() == [0, 0]
    assert out.block_tables().tolist() == [[0, 1], [2, 0]]
    assert out.block_tables(max_blocks=4, pad_value=-1).tolist() == [[0, 1, -1, -1], [2, -1, -1, -1]]
    with pytest.raises(InvalidArgumentError):
        out.block_tables(max_blocks=1)
    assert out.sampling_request_ids == ["a"] and out.sampling_indices().tolist() == [0]
    for arr in (out.input_ids(), out.positions(), out.seq_lens(), out.query_start_loc()):
        assert arr.dtype == np.int32
    sched.update({"a": 1})
    out = sched.schedule()
    assert [(s.request_id, s.num_cached_tokens, s.num_new_tokens, s.is_prefill) for s in out.seqs] == [
        ("a", 6, 1, False),
        ("b", 2, 3, True),
    ]
    assert out.seq_lens().tolist() == [7, 5]


def test_misuse_raises_clear_errors():
    sched = Scheduler(BlockManager(16, 4), 8, 4)
    with pytest.raises(SchedulerError, match="without a pending"):
        sched.update({})
    add(sched, "a", [1, 2], 3)
    sched.schedule()
    with pytest.raises(SchedulerError, match="before update"):
        sched.schedule()
    with pytest.raises(SchedulerError, match=r"no sampled token for requests \['a'\]"):
        sched.update({})
    with pytest.raises(SchedulerError, match="produce none"):
        sched.update({"a": 1, "zz": 2})
    with pytest.raises(SchedulerError, match="not an integer"):
        sched.update({"a": -3})
    assert sched.update({"a": 4})[0].new_token_ids == [4]  # the step stayed pending after the errors
    with pytest.raises(InvalidRequestError, match="already queued"):
        add(sched, "a", [1], 1)
    with pytest.raises(InvalidRequestError, match="empty"):
        add(sched, "e", [], 1)
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        add(sched, "m", [1], 0)
    with pytest.raises(InvalidRequestError, match="integers"):
        add(sched, "n", [1, -2], 1)
    with pytest.raises(InvalidRequestError, match="hashable"):
        add(sched, ["x"], [1], 1)
    for bad in ({"max_num_batched_tokens": 0}, {"max_num_seqs": 0}):
        kw = {"max_num_batched_tokens": 8, "max_num_seqs": 4} | bad
        with pytest.raises(InvalidArgumentError):
            Scheduler(BlockManager(4, 4), **kw)


# ---- property test ----------------------------------------------------------------------


@st.composite
def workloads(draw):
    block_size = draw(st.integers(1, 5))
    num_blocks = draw(st.integers(1, 16))
    budget = draw(st.integers(1, 24))
    max_num_seqs = draw(st.integers(1, 6))
    chunked = draw(st.booleans())
    n = draw(st.integers(1, 10))
    reqs, arrivals = [], {}
    for i in range(n):
        prompt = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24))
        max_tokens = draw(st.integers(1, 12))
        eos = tuple(draw(st.lists(st.integers(0, VOCAB - 1), max_size=1)))
        step = draw(st.integers(0, 15))
        r = (i, prompt, max_tokens, eos)
        reqs.append(r)
        arrivals.setdefault(step, []).append(r)
    return block_size, num_blocks, budget, max_num_seqs, chunked, reqs, arrivals


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(workloads(), st.booleans())
def test_property_every_admitted_request_matches_running_alone(w, async_scheduling):
    block_size, num_blocks, budget, max_num_seqs, chunked, reqs, arrivals = w
    sched = Scheduler(BlockManager(num_blocks, block_size), budget, max_num_seqs, chunked_prefill=chunked, async_scheduling=async_scheduling)
    states, streamed, _ = drive(sched, FakePagedModel(num_blocks, block_size), arrivals, max_steps=20_000)
    for rid, prompt, max_tokens, eos in reqs:
        kv = len(prompt) + max_tokens - 1
        impossible = math.ceil(kv / block_size) > num_blocks or (not chunked and kv > budget)
        if impossible:
            assert states[rid].status is RequestStatus.REJECTED and states[rid].error
            assert streamed[rid] == []
        else:
            assert_matches_reference([(rid, prompt, max_tokens, eos)], states, streamed)
