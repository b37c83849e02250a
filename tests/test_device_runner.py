"""The device executor (trtcore/runtime/device_runner.py) on the CPU: its buffer binding, batch
buckets, padding rows, staging and graph replay driven through TensorRT's runtime API over the
reference backend on a stand-in device (:class:`HostDevice`: host memory for device memory, a
graph that records the captured work and runs it only at replay).

References: transformers' greedy tokens (float64, tests/hf_models.py); for padding, the pool
bytes written by the same steps without padding; formulas for the buckets and the KV pool size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hf_models import VARIANTS, hf_greedy, hf_models, random_prompt  # noqa: F401  (fixture)

from trtcore import SamplingParams
from trtcore.builder import build_reference_engine, define_network
from trtcore.checkpoint import Checkpoint
from trtcore.config import load_config
from trtcore.errors import InvalidArgumentError
from trtcore.kv_modes import BLOCK_TABLES, INPUT_IDS, LAST_TOKEN_IDS, POSITION_IDS, QUERY_START_LOC, ROPE_SEQ_LENS, SEQ_LENS, kv_mode
from trtcore.plan import BuildConfig, resolve_plan
from trtcore.runtime.device_memory import HostDevice
from trtcore.runtime.device_runner import (
    PAD_BLOCK_ID,
    PAD_ROW,
    DeviceRunner,
    DeviceRunnerError,
    StepLayout,
    batch_buckets,
    bucket_for,
    fill_decode,
    fill_step,
    kv_pool_blocks,
    padded_step_shape,
    padding_row_tokens,
    token_buckets,
)
from trtcore.runtime.generate import make_device_engine
from trtcore.runtime.host_engine import HostEngine
from trtcore.runtime.request import Request
from trtcore.trt import load_trt

NAME = "qwen2_bias"  # GQA 4:1, biases; any variant runs on the reference


def _runner(
    hf_models: Any,  # noqa: F811
    name: str = NAME,
    *,
    max_batch_size: int = 8,
    enforce_eager: bool = False,
    num_blocks: int | None = 64,
    deferred: bool = False,
    pad_eager_steps: bool = True,
    eager_graphs: bool | None = None,
    capture_eager_shapes: bool = True,
    max_seq_len: int = 128,
    max_num_tokens: int = 64,
    **plan: Any,
) -> DeviceRunner:
    d = hf_models.dir(name)
    config = load_config(d)
    trt = load_trt("reference")
    p = resolve_plan(config, BuildConfig(kv_cache="paged", max_batch_size=max_batch_size, max_seq_len=max_seq_len, max_num_tokens=max_num_tokens, **plan), "reference")
    with Checkpoint(d) as weights:
        net = define_network(trt, config, weights, p)
    device = HostDevice(deferred=deferred)
    engine = HostEngine(build_reference_engine(net), device)
    return DeviceRunner(
        engine,
        device,
        kv_mode(p, config),
        num_blocks=num_blocks,
        enforce_eager=enforce_eager,
        pad_eager_steps=pad_eager_steps,
        eager_graphs=eager_graphs,
        capture_eager_shapes=capture_eager_shapes,
    )


def _generate(runner: DeviceRunner, prompts: list[list[int]], steps: int, async_scheduling: bool = True) -> list[list[int]]:
    core = make_device_engine(runner, runner.mode, async_scheduling=async_scheduling)
    reqs = [Request(i, p, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True), frozenset()) for i, p in enumerate(prompts)]
    list(core.generate(reqs))
    return [list(r.output_token_ids) for r in reqs]


# ---------------------------------------------------------------------------------------
# buckets, layout, padding (formulas)


@pytest.mark.parametrize(("max_batch", "expected"), [(1, (1,)), (8, (1, 2, 4, 8)), (12, (1, 2, 4, 8, 12)), (32, (1, 2, 4, 8, 16, 32))])
def test_batch_buckets(max_batch: int, expected: tuple[int, ...]) -> None:
    assert batch_buckets(max_batch) == expected
    for n in range(1, max_batch + 1):
        b = bucket_for(n, expected)
        assert b >= n and all(x < n for x in expected if x < b)
    with pytest.raises(InvalidArgumentError, match="bucket"):
        bucket_for(max_batch + 1, expected)


@pytest.mark.parametrize(
    ("max_tokens", "expected"), [(2048, (16, 32, 64, 128, 256, 512, 1024, 2048)), (100, (16, 32, 64, 100)), (16, (16,)), (8, (8,))]
)
def test_token_buckets(max_tokens: int, expected: tuple[int, ...]) -> None:
    assert token_buckets(max_tokens) == expected


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        ((128, 1), (128, 1)),  # both sizes are buckets: unpadded
        ((129, 1), (256, 2)),  # a padding row for the 127 padding tokens
        ((128, 3), (256, 4)),  # 4 sequences: the padding row needs a token
        ((40, 3), (64, 4)),
        ((5, 1), (16, 2)),
        ((2040, 2), (2048, 4)),
        ((40, 8), (40, 8)),  # no padding row left (8 is the largest bucket)
        ((2047, 7), (2048, 8)),
        ((2048, 7), (2048, 7)),  # the padding row's token would pass max_num_tokens
    ],
)
def test_padded_step_shape(step: tuple[int, int], expected: tuple[int, int]) -> None:
    assert padded_step_shape(*step, token_buckets(2048), (1, 2, 4, 8), 512) == expected


def test_padded_step_shape_rules_on_random_steps() -> None:
    """Every padded shape holds the step (a token per padding row, at most max_row_tokens a
    row) and is a pair of buckets; with room to spare (a bucket of more sequences, tokens far
    below the largest bucket, long padding rows) every step is padded."""
    rng = np.random.default_rng()
    tokens, seqs = token_buckets(1000), batch_buckets(12)
    for _ in range(500):
        n = int(rng.integers(1, 13))
        t = int(rng.integers(n, 1001))
        cap = int(rng.choice([16, 64, 1024]))
        T, B = padded_step_shape(t, n, tokens, seqs, cap)
        if (T, B) != (t, n):
            assert T in tokens and B in seqs and T >= t and B > n and B - n <= T - t <= (B - n) * cap
        if n < 8 and 2 * t + 16 <= 1000 and cap == 1024:
            assert T in tokens and B in seqs, (t, n)


@pytest.mark.parametrize(
    ("tokens", "rows", "cap", "expected"), [(10, 3, None, [8, 1, 1]), (10, 3, 4, [4, 4, 2]), (3, 3, 1, [1, 1, 1]), (0, 0, None, [])]
)
def test_padding_row_tokens(tokens: int, rows: int, cap: int | None, expected: list[int]) -> None:
    assert padding_row_tokens(tokens, rows, cap) == expected


@pytest.mark.parametrize(("tokens", "rows", "cap"), [(2, 3, None), (13, 3, 4), (1, 0, None)])
def test_padding_row_tokens_refuses_what_does_not_fit(tokens: int, rows: int, cap: int | None) -> None:
    with pytest.raises(InvalidArgumentError, match="padding"):
        padding_row_tokens(tokens, rows, cap)


class _Seq:
    def __init__(self, tokens: list[int], cached: int, table: list[int]) -> None:
        self.token_ids = tokens
        self.positions = list(range(cached, cached + len(tokens)))
        self.num_cached_tokens = cached
        self.block_table = table
        self.is_prefill = len(tokens) > 1

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)


class _Batch:
    def __init__(self, seqs: list[_Seq]) -> None:
        self.seqs = seqs


def test_fill_step_pads_rows_onto_the_scratch_block() -> None:
    rng = np.random.default_rng()
    seqs = [_Seq([int(rng.integers(100))], int(c), [int(b) for b in rng.choice(50, size=c // 16 + 1, replace=False)]) for c in (3, 16, 40)]
    layout = StepLayout.make(4, 4, 8, rope_seq_lens=False)
    buf = np.full(layout.nbytes, 0xAB, np.uint8)
    views = layout.views(buf)
    fill_step(views, _Batch(seqs), scratch_block=63)
    assert views[INPUT_IDS].tolist() == [s.token_ids[0] for s in seqs] + [0]
    assert views[POSITION_IDS].tolist() == [s.num_cached_tokens for s in seqs] + [0]
    assert views[SEQ_LENS].tolist() == [s.num_cached_tokens + 1 for s in seqs] + [1]
    assert views[QUERY_START_LOC].tolist() == [0, 1, 2, 3, 4]
    assert views[LAST_TOKEN_IDS].tolist() == [0, 1, 2, 3]
    bt = views[BLOCK_TABLES]
    for i, s in enumerate(seqs):
        assert bt[i, : len(s.block_table)].tolist() == s.block_table
        assert (bt[i, len(s.block_table) :] == PAD_BLOCK_ID).all()
    assert bt[3].tolist() == [63] + [PAD_BLOCK_ID] * 7
    # fields do not overlap: each is 256-byte aligned and inside nbytes
    spans = sorted((off, off + 4 * int(np.prod(shape))) for off, shape in layout.fields.values())
    assert all(a % 256 == 0 for a, _ in spans) and all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:])) and spans[-1][1] <= layout.nbytes
    with pytest.raises(InvalidArgumentError, match="pad"):
        fill_step(views, _Batch([_Seq([1, 2], 0, [0])] + seqs), scratch_block=63)


@pytest.mark.parametrize("rope", [False, True])
def test_fill_step_spreads_padding_tokens_over_padding_rows(rope: bool) -> None:
    """A layout with more padding tokens than padding rows: the first padding rows take the
    surplus (at most max_row_tokens each), at positions 0.. with the scratch block in every
    column of their block table."""
    layout = StepLayout.make(14, 4, 3, rope_seq_lens=rope)
    views = layout.views(np.full(layout.nbytes, 0xAB, np.uint8))
    fill_step(views, _Batch([_Seq([11, 12, 13], 5, [7])]), scratch_block=63, max_row_tokens=6)
    assert views[INPUT_IDS].tolist() == [11, 12, 13] + [0] * 11
    assert views[POSITION_IDS].tolist() == [5, 6, 7] + list(range(6)) + list(range(4)) + [0]
    assert views[SEQ_LENS].tolist() == [8, 6, 4, 1]
    assert views[QUERY_START_LOC].tolist() == [0, 3, 9, 13, 14]
    assert views[LAST_TOKEN_IDS].tolist() == [2, 8, 12, 13]
    assert views[BLOCK_TABLES].tolist() == [[7, -1, -1], [63, 63, 63], [63, 63, 63], [63, -1, -1]]
    if rope:
        assert views[ROPE_SEQ_LENS].tolist() == [8] * 3 + [6] * 6 + [4] * 4 + [1]
    with pytest.raises(InvalidArgumentError, match="padding"):  # 11 padding tokens, 3 rows of at most 3
        fill_step(views, _Batch([_Seq([11, 12, 13], 5, [7])]), scratch_block=63, max_row_tokens=3)


@pytest.mark.parametrize("rope", [False, True])
def test_fill_decode_writes_what_fill_step_writes(rope: bool) -> None:
    """After a decode step of one batch size filled the layout (fill_step), fill_decode of any
    other decode batch leaves the staging bytes exactly as fill_step writes them (the formulas
    of the test above), placeholders included."""
    rng = np.random.default_rng()
    layout = StepLayout.make(12, 12, 6, rope_seq_lens=rope)

    def batch(n: int) -> _Batch:
        seqs = []
        for c in rng.integers(0, 90, size=n):
            tok = -1 if rng.random() < 0.5 else int(rng.integers(100))  # -1: a placeholder (token in flight)
            s = _Seq([tok], int(c), [int(b) for b in rng.choice(50, size=int(c) // 16 + 1, replace=False)])
            s.request_id = len(seqs)  # type: ignore[attr-defined]
            seqs.append(s)
        return _Batch(seqs)

    a, b = np.full(layout.nbytes, 0xAB, np.uint8), np.full(layout.nbytes, 0xCD, np.uint8)
    va, vb = layout.views(a), layout.views(b)
    fed = {i: int(r) for i, r in enumerate(rng.permutation(12))}
    fill_step(va, batch(5), 63, fed)
    fill_step(vb, batch(2), 63, fed)
    for n in (3, 8, 1, 12, 9, 6):  # a few rows (scalar writes) and many (slices)
        step = batch(n)
        fill_step(va, step, 63, fed)
        fill_decode(vb, step.seqs, 63, fed)
        for name in layout.fields:
            np.testing.assert_array_equal(va[name], vb[name], err_msg=name)
        ph = [i for i, q in enumerate(step.seqs) if q.token_ids[0] < 0]
        assert vb[INPUT_IDS][ph].tolist() == [-(fed[i] + 1) for i in ph]
    for n in (2, 10):  # no step in flight: every token as given
        step = batch(n)
        fill_step(va, step, 63)
        fill_decode(vb, step.seqs, 63)
        assert vb[INPUT_IDS][:n].tolist() == [q.token_ids[0] for q in step.seqs]
        for name in layout.fields:
            np.testing.assert_array_equal(va[name], vb[name], err_msg=name)


def test_fill_decode_rewrites_only_block_table_rows_that_changed() -> None:
    """With the rows it wrote remembered (the device runner's steady decode), fill_decode over a
    run of decode steps -- tables growing by a block now and then, requests leaving so that rows
    shift, the batch shrinking onto padding rows -- leaves the staging exactly as fill_step
    writes each step from scratch."""
    rng = np.random.default_rng()
    layout = StepLayout.make(8, 8, 8, rope_seq_lens=False)  # tables reach 99 // 16 + 1 = 7 blocks
    free = list(rng.permutation(60).tolist())
    live = {rid: (int(c), [free.pop() for _ in range(int(c) // 16 + 1)]) for rid, c in enumerate(rng.integers(0, 40, size=8))}

    def batch() -> _Batch:
        seqs = []
        for rid, (c, table) in live.items():
            s = _Seq([int(rng.integers(100))], c, list(table))
            s.request_id = rid  # type: ignore[attr-defined]
            seqs.append(s)
        return _Batch(seqs)

    a, b = np.full(layout.nbytes, 0xAB, np.uint8), np.full(layout.nbytes, 0xCD, np.uint8)
    va, vb = layout.views(a), layout.views(b)
    first = batch()
    fill_step(vb, first, 63)
    rows = [(q.request_id, len(q.block_table)) for q in first.seqs] + [PAD_ROW] * (8 - len(first.seqs))  # type: ignore[attr-defined]
    for _ in range(60):
        for rid in list(live):
            c, table = live[rid]
            c += 1
            if c // 16 + 1 > len(table):  # crosses a block boundary: one more block
                table = [*table, free.pop()]
            live[rid] = (c, table)
        if len(live) > 1 and rng.random() < 0.15:  # a request finishes: the rows after it move up
            del live[int(rng.choice(list(live)))]
        step = batch()
        fill_step(va, step, 63)
        fill_decode(vb, step.seqs, 63, None, rows)
        for name in layout.fields:
            np.testing.assert_array_equal(va[name], vb[name], err_msg=name)
    assert len(live) < 8  # rows did move


def test_kv_pool_size_follows_gpu_memory_utilization() -> None:
    gib = 1 << 30
    # 80 GiB device, 60 GiB free, 0.9: the pool gets 60 - 8 = 52 GiB
    assert kv_pool_blocks(gib // 4, 60 * gib, 80 * gib, 0.9, None, 10**6) == 52 * 4
    assert kv_pool_blocks(gib // 4, 60 * gib, 80 * gib, 0.9, None, 100) == 100
    assert kv_pool_blocks(gib // 4, 60 * gib, 80 * gib, 0.9, 3 * gib, 10**6) == 12
    with pytest.raises(DeviceRunnerError, match="gpu_memory_utilization=0.2"):
        kv_pool_blocks(gib // 4, 10 * gib, 80 * gib, 0.2, None, 10**6)
    with pytest.raises(InvalidArgumentError, match="gpu_memory_utilization"):
        kv_pool_blocks(1, 1, 1, 1.5, None, 10)


# ---------------------------------------------------------------------------------------
# the runner on the reference backend


def test_start_up_allocates_every_pool_once_and_binds_each_bucket(hf_models: Any) -> None:  # noqa: F811
    runner = _runner(hf_models, max_batch_size=8)
    dev = runner.device
    assert set(dev.pools) == {"activations", "logits", "staging", "kv_cache"}
    assert set(dev.host_pools) == {"logits", "staging"}
    c = runner.mode.config
    block_bytes = c.num_hidden_layers * 2 * c.num_key_value_heads * runner.mode.plan.block_size * c.head_dim * 4
    assert dev.pools["kv_cache"] >= 64 * block_bytes and runner.num_blocks == 63 and runner.scratch_block == 63
    assert list(runner.graphs) == [1, 2, 4, 8]
    for size, g in runner.graphs.items():
        ctx = g.context
        assert ctx._shapes[INPUT_IDS] == (size,) and ctx._shapes[BLOCK_TABLES] == (size, runner.max_blocks)
        for name, (offset, _) in g.layout.fields.items():
            assert ctx._addresses[name] == runner.staging_ptr + offset
        assert ctx._addresses["kv_cache_pool"] == runner.pool_ptr and ctx._addresses["logits"] == runner.logits_ptr
        # per host side: the staging copy, the feed of tokens in flight, the execution and the
        # sampling, recorded (not run) while captured
        assert len(g.graphs) == 2 and all(len(graph) == 4 for graph in g.graphs)
    report = "\n".join(runner.memory_report())
    for word in ("activations", "kv_cache", "staging", "logits", "scratch", "[1, 2, 4, 8]"):
        assert word in report


def test_greedy_tokens_match_transformers_with_graphs_and_padding(hf_models: Any) -> None:  # noqa: F811
    """Three prompts decode in bucket 4 (one padding row) from replayed graphs, then fewer as
    they finish; each gets transformers' greedy tokens."""
    runner = _runner(hf_models)
    v = VARIANTS[NAME]
    rng = np.random.default_rng()
    prompts = [random_prompt(rng, n, v.vocab_size) for n in (5, 17, 33)]
    steps = 6
    got = _generate(runner, prompts, steps)
    assert runner.num_graph_replays >= steps - 1
    assert runner.device.num_graph_launches == runner.num_graph_replays + 2 * len(runner.buckets)  # + one replay per side at start-up
    for p, toks in zip(prompts, got):
        assert toks == hf_greedy(hf_models.hf(NAME), p, steps)[0]


def test_graph_replay_equals_eager_and_decode_allocates_nothing(hf_models: Any) -> None:  # noqa: F811
    v = VARIANTS[NAME]
    rng = np.random.default_rng()
    prompts = [random_prompt(rng, int(n), v.vocab_size) for n in rng.integers(1, 40, size=5)]
    graphed, eager = _runner(hf_models), _runner(hf_models, enforce_eager=True)
    assert all(not g.graphs for g in eager.graphs.values())
    before = graphed.device.num_allocations
    a = _generate(graphed, prompts, 8)
    assert graphed.device.num_allocations == before, "the step loop allocated device or pinned memory"
    b = _generate(eager, prompts, 8)
    assert a == b and graphed.num_graph_replays > 0 and eager.num_graph_replays == 0
    np.testing.assert_array_equal(graphed.logits_rows(len(prompts)), eager.logits_rows(len(prompts)))


def test_padding_rows_touch_only_the_scratch_block(hf_models: Any) -> None:  # noqa: F811
    """Decode steps of 3 sequences padded to bucket 4 write the pool as the same steps without
    padding (bucket 3 of max_batch_size 3) do, outside the scratch block (within float32
    rounding: the GEMMs see 4 rows instead of 3), give the same logits, and write the padding
    row's key/value into slot 0 of the scratch block only (the prefill unpadded: its padding
    rows write more of the scratch block, test_padded_eager_steps_equal_unpadded)."""
    v = VARIANTS[NAME]
    rng = np.random.default_rng()
    prompts = [random_prompt(rng, n, v.vocab_size) for n in (4, 16, 21)]
    pools, logits, scratch = [], [], []
    for max_batch in (4, 3):
        runner = _runner(hf_models, max_batch_size=max_batch, pad_eager_steps=False)
        assert bucket_for(3, runner.buckets) == (4 if max_batch == 4 else 3)
        _generate(runner, prompts, 3)  # prefill, then two decode steps
        dev = runner.device
        assert isinstance(dev, HostDevice)
        pool = dev.view(runner.pool_ptr, runner.pool_shape, runner.pool_dtype)
        pools.append(pool[:, : runner.scratch_block].copy())
        scratch.append(pool[:, runner.scratch_block].copy())  # [layers, 2, heads, block_size, head_dim]
        logits.append(runner.logits_rows(3).copy())
    np.testing.assert_allclose(pools[0], pools[1], rtol=1e-5, atol=1e-5)  # as the logits: float32 sums of O(1) terms, another order
    np.testing.assert_allclose(logits[0], logits[1], rtol=1e-5, atol=1e-5)
    used = np.flatnonzero(np.abs(pools[1]).sum(axis=(0, 2, 3, 4, 5)))
    assert len(used) == sum(-(-(len(p) + 2) // 16) for p in prompts)  # only the sequences' blocks were written
    for sc in scratch:  # the start-up warm-ups pad every bucket too
        assert np.abs(sc[:, :, :, 0]).sum() > 0 and not sc[:, :, :, 1:].any()


def _serve_arrivals(core: Any, reqs: list[Request], arrivals: tuple[list[int], ...]) -> list[list[int]]:
    """Add ``reqs[i]`` for the indices of ``arrivals[j]`` before step ``j``, step until every
    request finished; each request's output tokens."""
    for batch in arrivals:
        for i in batch:
            core.add_request(reqs[i])
        core.step()
    while core.has_unfinished_requests():
        core.step()
    return [list(r.output_token_ids) for r in reqs]


@pytest.mark.parametrize(("enforce_eager", "capture"), [(False, False), (False, True), (True, True)])
def test_padded_eager_steps_equal_unpadded(hf_models: Any, enforce_eager: bool, capture: bool) -> None:  # noqa: F811
    """Prefill and mixed steps padded to token / sequence buckets (padding rows of several
    tokens on the scratch block, poisoned with NaN first) give the real sequences the logits
    and tokens of the same steps unpadded (within float32 rounding: the GEMMs see more rows),
    write the pool outside the scratch block as those do, and meet only the runner's
    ``eager_shapes``, three times over the same arrivals. Graphs (none with ``enforce_eager``):
    captured at start-up (``capture``), every padded step replays one from the first time
    on; else a padded step is captured at its second run and replayed from the third on."""
    v = VARIANTS[NAME]
    rng = np.random.default_rng()
    prompts = [random_prompt(rng, int(n), v.vocab_size) for n in rng.integers(2, 30, size=5)]
    # 3 and 4 arrive together beside the decodes of 0-2: 61 tokens, over the padded run's budget
    # (64 less its token_headroom 4): a chunked prefill, in both runs
    prompts[3:5] = [random_prompt(rng, 29, v.vocab_size) for _ in range(2)]
    runs = []
    budget = 0
    for pad in (True, False):
        runner = _runner(
            hf_models, pad_eager_steps=pad, enforce_eager=enforce_eager, eager_graphs=True, capture_eager_shapes=capture
        )  # asked: HostEngine's contexts are TensorRT-like
        dev = runner.device
        assert isinstance(dev, HostDevice)
        pool = dev.view(runner.pool_ptr, runner.pool_shape, runner.pool_dtype)
        pool[:, runner.scratch_block] = np.nan
        logits: list[np.ndarray] = []
        eager: list[tuple[int, int, bool]] = []  # (tokens, sequences) staged, mixed
        execute, sample = runner.execute, runner.sample

        def run(batch: Any, execute: Any = execute, runner: DeviceRunner = runner, eager: list[Any] = eager) -> int:
            rows = execute(batch)
            if not runner.is_decode(batch):
                mixed = any(s.is_prefill for s in batch.seqs) and not all(s.is_prefill for s in batch.seqs)
                assert runner.last_eager_shape is not None
                eager.append((*runner.last_eager_shape, mixed))
            return rows

        def read(batch: Any, sample: Any = sample, runner: DeviceRunner = runner, logits: list[Any] = logits) -> Any:
            logits.append(runner.logits_rows(len(batch.seqs)).copy())
            return sample(batch)

        runner.execute, runner.sample = run, read  # type: ignore[method-assign]
        core = make_device_engine(runner, runner.mode, async_scheduling=False)
        if pad:
            budget = core.scheduler.max_num_batched_tokens
        else:  # the padded run's budget (less its token_headroom): the same steps, else a step of
            # more tokens than that budget is one step here and two chunks there
            assert core.scheduler.max_num_batched_tokens > budget
            core.scheduler.max_num_batched_tokens = budget
        tokens, replays = [], []  # eager graph replays after each pass
        for again in range(3):
            params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
            reqs = [Request((again, i), p, params, frozenset()) for i, p in enumerate(prompts)]
            tokens += _serve_arrivals(core, reqs, ([0, 1], [], [2], [3, 4]))  # arrivals between steps: mixed prefill + decode steps
            replays.append(runner.num_eager_graph_replays)
        runs.append((runner, logits, eager, tokens, pool[:, : runner.scratch_block].copy()))
        graphs = pad and not enforce_eager
        if capture:  # every padded eager step that samples replays its graph, from the first pass on
            assert replays[0] == replays[1] - replays[0] == replays[2] - replays[1] and (replays[0] > 0) == graphs
            assert len(runner._eager_graphs) == (len(runner.eager_shapes) if graphs else 0)
        elif graphs:  # captured at its second run (the first its warm-up), replayed from the third on:
            # every padded step of the third pass, fewer of the first (only a shape met twice before in it)
            assert replays[2] - replays[1] > replays[0]
        else:
            assert replays[2] == 0
    (padded, lp, ep, tp, pp), (plain, lu, eu, tu, pu) = runs
    assert tp == tu and tp[:5] == tp[5:10] == tp[10:]
    assert len(lp) == len(lu) and all(np.isfinite(a).all() for a in lp)
    for a, b in zip(lp, lu):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pp, pu, rtol=1e-5, atol=1e-5)  # as the logits: float32 sums of O(1) terms, another order
    assert any(m for *_, m in eu), "no mixed step"
    assert [(t, n) for t, n, _ in ep] != [(t, n) for t, n, _ in eu], "nothing was padded"
    assert {(t, n) for t, n, _ in ep} <= set(padded.eager_shapes)


def test_a_step_that_fills_the_token_budget_still_pads(hf_models: Any) -> None:  # noqa: F811
    """The step loop's token budget leaves the padding rows' tokens free: max_num_tokens 64 and
    batch buckets 1, 2, 4, 8 need up to 4 padding rows (4 sequences pad to 8), so the budget
    is 60, and a step of 60 tokens of any number of sequences below 8 pads to a bucket pair."""
    runner = _runner(hf_models, max_batch_size=8)
    assert runner.token_headroom == 4
    assert make_device_engine(runner, runner.mode).scheduler.max_num_batched_tokens == 60
    for n in range(1, 8):
        T, B = padded_step_shape(60, n, runner.token_buckets, runner.buckets, runner.max_row_tokens)
        assert (T, B) in runner.eager_shapes and T == 64 and B > n
    assert _runner(hf_models, max_batch_size=8, pad_eager_steps=False).token_headroom == 0


def test_a_mixed_step_of_max_batch_size_sequences_pads_into_the_spare_row(hf_models: Any) -> None:  # noqa: F811
    """max_batch_size 4: the engine's profile admits a fifth row (``SPARE_ROWS``), so a mixed
    step of 4 sequences pads its tokens with one padding row, shape ``(T, 5)``, replays the
    graph captured for it at start-up, and gives every request the tokens of the same
    arrivals with unpadded eager steps."""
    v = VARIANTS[NAME]
    rng = np.random.default_rng()
    # the third step: prompt 3's 11 tokens and 3 decodes, 14 tokens of 4 sequences (no bucket)
    prompts = [random_prompt(rng, n, v.vocab_size) for n in (5, 7, 9, 11, 6)]
    got, shapes = [], []
    for pad in (True, False):
        runner = _runner(hf_models, max_batch_size=4, pad_eager_steps=pad, eager_graphs=True)
        assert runner.max_rows == 5 and runner.eager_buckets == (1, 2, 4, 5)
        execute, seen = runner.execute, []

        def run(batch: Any, execute: Any = execute, runner: DeviceRunner = runner, seen: list[Any] = seen) -> int:
            replays = runner.num_eager_graph_replays
            rows = execute(batch)
            if not runner.is_decode(batch):
                seen.append((len(batch.seqs), runner.last_eager_shape, runner.num_eager_graph_replays > replays))
            return rows

        runner.execute = run  # type: ignore[method-assign]
        core = make_device_engine(runner, runner.mode, async_scheduling=True)
        reqs = [Request(i, p, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), frozenset()) for i, p in enumerate(prompts)]
        got.append(_serve_arrivals(core, reqs, ([0, 1], [2], [3], [], [], [4])))
        shapes.append(seen)
    padded, plain = shapes
    full = [(shape, replayed) for n, shape, replayed in padded if n == 4]
    assert full and full[0] == ((16, 5), True), padded
    assert all(shape is not None and shape[1] == n for n, shape, _ in plain)  # unpadded: its own rows
    assert got[0] == got[1]


def test_start_up_captures_every_eager_shape_a_step_can_have(hf_models: Any) -> None:  # noqa: F811
    """max_num_tokens (64) beyond what one sequence holds (max_seq_len 32, max_row_tokens 32):
    the shapes no step can have (more tokens than their rows hold, e.g. one sequence of 64
    tokens) are not among ``eager_shapes``; every other shape is captured at start-up, its
    staging all padding rows; each shape a step can have is among them (1..8 sequences of
    1..32 tokens each, up to 64 in all)."""
    runner = _runner(hf_models, eager_graphs=True, max_seq_len=32, max_num_tokens=64)
    assert runner.max_row_tokens == 32
    shapes = set(runner.eager_shapes)
    assert shapes and all(T <= B * 32 for T, B in shapes) and set(runner._eager_graphs) == shapes
    for n in range(1, 9):
        for t in range(n, min(64 - runner.token_headroom, 32 * n) + 1):
            shape = padded_step_shape(t, n, runner.token_buckets, runner.buckets, runner.max_row_tokens)
            assert shape in shapes or shape == (t, n), (t, n, shape)


@pytest.mark.parametrize("capture", [False, True])
def test_eager_graph_replays_under_asynchronous_scheduling_on_a_lagging_device(hf_models: Any, capture: bool) -> None:  # noqa: F811
    """Requests arriving between steps with two steps in flight on a device that runs work
    only when waited for (a host buffer rewritten too early shows up as wrong tokens): padded
    eager steps replayed from their graphs give the tokens of the unpadded eager steps."""
    v = VARIANTS[NAME]
    rng = np.random.default_rng()
    prompts = [random_prompt(rng, int(n), v.vocab_size) for n in rng.integers(2, 30, size=6)]
    got = []
    for pad in (True, False):
        runner = _runner(hf_models, pad_eager_steps=pad, deferred=True, eager_graphs=True, capture_eager_shapes=capture)
        core = make_device_engine(runner, runner.mode, async_scheduling=True)
        tokens = []
        for again in range(3):
            reqs = [Request((again, i), p, SamplingParams(temperature=0, max_tokens=7, ignore_eos=True), frozenset()) for i, p in enumerate(prompts)]
            tokens += _serve_arrivals(core, reqs, ([0], [1, 2], [], [3], [4, 5]))
        assert (runner.num_eager_graph_replays > 0) == pad
        got.append(tokens)
    assert got[0] == got[1]


def test_a_step_beyond_the_engine_bounds_is_refused(hf_models: Any) -> None:  # noqa: F811
    runner = _runner(hf_models, max_batch_size=2)
    seqs = [_Seq([1], 0, [0]) for _ in range(3)]
    with pytest.raises(InvalidArgumentError, match="max_batch_size=2"):
        runner.execute(_Batch(seqs))  # type: ignore[arg-type]
    with pytest.raises(DeviceRunnerError, match="num_blocks"):
        _runner(hf_models, num_blocks=1)


def test_paged_is_the_default_where_the_plugin_and_its_kernels_run(hf_models: Any) -> None:  # noqa: F811
    """Paged on the backends that host plugins (the cuda and tensorrt GPU backends when the
    model's head_dim is a multiple of 32, the paged kernels' rule; the reference always);
    contiguous on tensorrt_rtx (no add_plugin_v3) and for other head dims on a GPU."""
    from trtcore.cuda import synthetic

    smol = synthetic.config("SmolLM2-135M")  # head_dim 64
    assert resolve_plan(smol, BuildConfig(), "cuda").kv_cache == "paged"
    assert resolve_plan(smol, BuildConfig(), "tensorrt_rtx").kv_cache == "contiguous"
    assert resolve_plan(smol, BuildConfig(), "reference").kv_cache == "paged"
    tiny = load_config(hf_models.dir("llama3_rope"))  # head_dim 16
    assert resolve_plan(tiny, BuildConfig(), "cuda").kv_cache == "contiguous"
    assert resolve_plan(tiny, BuildConfig(), "reference").kv_cache == "paged"
    assert resolve_plan(smol, BuildConfig(attention="native"), "cuda").kv_cache == "contiguous"


def test_eager_graphs_default_off_where_a_context_does_not_keep_its_launches(hf_models: Any) -> None:  # noqa: F811
    """By default eager steps are captured only on contexts that keep their prepared launches
    (the cuda engine's ``prepare_launches``): one eager context meets every shape, and TensorRT's
    rule is one execution context per graph; asked for, they are on."""
    runner = _runner(hf_models)
    assert not hasattr(runner.eager, "prepare_launches") and runner.eager_graphs is False
    assert _runner(hf_models, eager_graphs=True).eager_graphs is True
