"""The GPU sampler (kernels/sampling.cu through trtcore.runtime.sampling_gpu.GpuSampler)
against its NumPy reference, trtcore.runtime.sampling.sample_rows, token for token: each
parameter alone and all together, in float32 / float16 / bfloat16 logits (bfloat16 rounds
random logits into many exact ties: the tie rules are exercised too), seeded draws that do
not depend on the batch, NaN / inf rows, a padded vocabulary, penalty counts kept on the
device across steps and re-seeded after a preemption, and a CUDA-graph replay that equals
the eager step.

Run on a GPU machine: ``pytest -m gpu tests/cuda/test_sampling_gpu.py``.
"""

from __future__ import annotations

import zlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from trtcore.gpu import gpu_status
from trtcore.runtime.sampling import SamplingParams, SamplingRow, philox_uniform, sample_rows

_OK, _WHY = gpu_status()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _OK, reason=_WHY)]

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
VOCAB, WIDTH = 1000, 1024  # WIDTH > VOCAB: the embedding's padding, never sampled


def _rt() -> Any:
    from cuda.bindings import runtime

    return runtime


def _ok(res: tuple) -> Any:
    assert int(res[0]) == 0, res[0]
    return res[1] if len(res) == 2 else (None if len(res) == 1 else res[1:])


class _Dev:
    """A device copy of a host array (cudaMalloc + synchronous copies)."""

    def __init__(self, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        self.nbytes = host.nbytes
        self.ptr = int(_ok(_rt().cudaMalloc(self.nbytes)))
        self.upload(host)

    def upload(self, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        assert host.nbytes == self.nbytes
        _ok(_rt().cudaMemcpy(self.ptr, host.ctypes.data, self.nbytes, _rt().cudaMemcpyKind.cudaMemcpyHostToDevice))

    def download(self, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        out = np.empty(shape, dtype)
        _ok(_rt().cudaMemcpy(out.ctypes.data, self.ptr, out.nbytes, _rt().cudaMemcpyKind.cudaMemcpyDeviceToHost))
        return out

    def free(self) -> None:
        _rt().cudaFree(self.ptr)


@pytest.fixture
def stream():
    s = _ok(_rt().cudaStreamCreate())
    yield int(s)
    _rt().cudaStreamDestroy(s)


def _sampler(stream: int, batch: int, dtype: str = "float32", **kw: Any):
    from trtcore.runtime.sampling_gpu import GpuSampler

    return GpuSampler(batch, VOCAB, dtype, stream, **kw)


def _logits(rng: np.random.Generator, batch: int, dtype: str) -> np.ndarray:
    """[batch, WIDTH] logits of ``dtype``; the padded columns hold +inf, NaN and huge values."""
    x = (rng.standard_normal((batch, WIDTH)) * 3).astype(np.float32)
    x[:, VOCAB:] = 1e4
    x[:, VOCAB] = np.inf
    x[:, VOCAB + 1] = np.nan
    return x.astype(DTYPES[dtype])


def _gpu_step(sampler, logits: np.ndarray, rows, slots=None):
    dev = _Dev(logits)
    try:
        sampler.set_params(rows, slots)
        sampler.sample(dev.ptr, row_stride=logits.shape[1])
        return sampler.result()
    finally:
        dev.free()


def _assert_same(got, want, rows) -> None:
    assert got.token_ids.tolist() == want.token_ids.tolist()
    assert got.fallback.tolist() == want.fallback.tolist()
    for g, w, r in zip(got.logprobs, want.logprobs, rows):
        if r is None or r.params.logprobs is None:
            assert g is None
            continue
        assert g.token_id == w.token_id and g.rank == w.rank
        assert g.logprob == pytest.approx(w.logprob, rel=1e-6, abs=1e-6)
        assert [t for t, _ in g.top] == [t for t, _ in w.top]
        np.testing.assert_allclose([lp.logprob for _, lp in g.top], [lp.logprob for _, lp in w.top], rtol=1e-6, atol=1e-6)
        assert [lp.rank for _, lp in g.top] == [lp.rank for _, lp in w.top]


PARAMS = {
    "greedy": dict(temperature=0.0),
    "temperature": dict(temperature=0.8),
    "top_k": dict(temperature=1.0, top_k=5),
    "top_p": dict(temperature=1.0, top_p=0.7),
    "min_p": dict(temperature=1.2, min_p=0.1),
    "repetition": dict(temperature=0.9, repetition_penalty=1.5),
    "repetition_greedy": dict(temperature=0.0, repetition_penalty=1.8),
    "presence": dict(temperature=1.0, presence_penalty=1.5),
    "frequency": dict(temperature=1.0, frequency_penalty=0.9),
    "min_tokens": dict(temperature=1.0, min_tokens=8, stop_token_ids=[7, 8]),
    "logprobs": dict(temperature=1.0, logprobs=5),
    "everything": dict(temperature=0.7, top_k=40, top_p=0.9, min_p=0.02, repetition_penalty=1.3, presence_penalty=0.5,
                       frequency_penalty=0.4, min_tokens=3, logprobs=20),
    "extreme": dict(temperature=1e-300, top_p=1e-12, repetition_penalty=1e-300, frequency_penalty=-2.0),
    "top_p_cold": dict(temperature=0.45, top_p=0.95),
    "top_p_wide": dict(temperature=1.7, top_p=0.999),
    "top_k_wide": dict(temperature=1.3, top_k=700),
    "top_k_top_p_min_p": dict(temperature=0.9, top_k=300, top_p=0.8, min_p=0.001),
}  # fmt: skip


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name", sorted(PARAMS))
def test_kernel_equals_reference_token_for_token(stream, dtype: str, name: str) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{dtype}:{name}".encode()))
    batch, steps = 6, 25
    params = [SamplingParams(seed=int(rng.integers(0, 2**64, dtype=np.uint64)), max_tokens=64, **PARAMS[name]) for _ in range(batch)]
    prompts = [rng.integers(0, VOCAB, 20).tolist() for _ in range(batch)]
    eos = [0, 1]
    outputs: list[list[int]] = [[] for _ in range(batch)]
    with _sampler(stream, batch, dtype) as s:
        for i in range(batch):
            s.add_request(i, prompts[i])
        for _ in range(steps):
            logits = _logits(rng, batch, dtype)
            logits[:, eos] = logits[:, eos].astype(np.float32) + 4  # EOS likely: min_tokens must mask it
            rows = [SamplingRow(p, prompts[i], list(outputs[i]), eos) for i, p in enumerate(params)]
            got = _gpu_step(s, logits, rows)
            want = sample_rows(logits.astype(np.float32), rows, vocab_size=VOCAB)
            _assert_same(got, want, rows)
            assert (got.token_ids < VOCAB).all() and not got.fallback.any()
            for i in range(batch):
                outputs[i].append(int(got.token_ids[i]))


def test_layout_of_the_parameter_struct(stream) -> None:
    from trtcore.runtime.sampling_gpu import ROW_RESULT_DTYPE

    with _sampler(stream, 2) as s:
        d = s.params_dtype
        names = ["temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "step",
                 "top_k", "slot", "flags", "num_logprobs", "num_banned", "reserved", "banned"]  # fmt: skip
        want = [d.itemsize, *(d.fields[n][1] for n in names), ROW_RESULT_DTYPE.itemsize, 0, 4, 8, 12]
        assert s.layout() == want


def test_philox_kernel_draws_the_reference_bits(stream) -> None:
    from trtcore import kernels

    fn = kernels.compile_kernel("sampling", defines={"DTYPE": 0}).function("sampling_philox")
    rng = np.random.default_rng(1)
    n = 4096
    seeds = rng.integers(0, 2**64, n, dtype=np.uint64)
    steps = rng.integers(0, 2**64, n, dtype=np.uint64)
    steps[:100] = np.arange(100)
    ds, dt, out = _Dev(seeds), _Dev(steps), _Dev(np.zeros(n, np.float64))
    try:
        fn.launch(-(-n // 256), 256, [(ds.ptr, "ptr"), (dt.ptr, "ptr"), (out.ptr, "ptr"), (n, "i32")], stream=stream)
        _ok(_rt().cudaStreamSynchronize(stream))
        np.testing.assert_array_equal(out.download(np.float64, (n,)), philox_uniform(seeds, steps))
    finally:
        for b in (ds, dt, out):
            b.free()


def test_seeded_request_draws_the_same_alone_and_in_any_batch(stream) -> None:
    rng = np.random.default_rng(2)
    a = SamplingParams(temperature=1.0, top_p=0.95, repetition_penalty=1.3, frequency_penalty=0.5, seed=42, max_tokens=64)
    others = [
        SamplingParams(temperature=0.6, seed=7, presence_penalty=1.0),
        SamplingParams(temperature=0),
        SamplingParams(top_k=3, seed=9, logprobs=2),
    ]
    prompt = [3, 4, 5]
    mine_alone: list[int] = []
    mine_batched: list[int] = []
    with _sampler(stream, 1, "bfloat16") as solo, _sampler(stream, 5, "bfloat16") as many:
        solo.add_request(0, prompt)
        many.add_request(3, prompt)  # a's slot; the others use slots 0..2
        for j in range(3):
            many.add_request(j, [1])
        for step in range(30):
            row = _logits(rng, 1, "bfloat16")
            got = _gpu_step(solo, row, [SamplingRow(a, prompt, list(mine_alone))])
            mine_alone.append(int(got.token_ids[0]))
            k = step % 4  # the batch changes every step: 0..3 others, a at a moving position
            pos = step % (k + 1)
            batch = [_logits(rng, 1, "bfloat16")[0] for _ in range(k)]
            batch.insert(pos, row[0])
            rows = [SamplingRow(o, [1], [], seed=None) for o in others[:k]]
            slots = list(range(k))
            rows.insert(pos, SamplingRow(a, prompt, list(mine_batched)))
            slots.insert(pos, 3)
            got = _gpu_step(many, np.stack(batch), rows, slots)
            mine_batched.append(int(got.token_ids[pos]))
    assert mine_batched == mine_alone


def test_nan_and_inf_rows_are_errors_of_their_row_only(stream) -> None:
    rng = np.random.default_rng(3)
    logits = _logits(rng, 4, "float32")
    logits[1, :VOCAB] = np.nan
    logits[2, 17] = np.inf
    logits[3, : VOCAB // 2] = np.nan  # NaN counts as -inf: the row is usable
    rows = [SamplingRow(SamplingParams(seed=i, logprobs=3, top_k=50)) for i in range(4)]
    with _sampler(stream, 4) as s:
        got = _gpu_step(s, logits, rows)
    want = sample_rows(logits, rows, vocab_size=VOCAB)
    _assert_same(got, want, rows)
    assert got.fallback.tolist() == [False, True, True, False]
    assert got.token_ids[1] == 0 and got.token_ids[3] >= VOCAB // 2


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("vocab", [3, 13, 50257])
def test_raw_scan_at_every_row_alignment(stream, dtype: str, vocab: int) -> None:
    """Rows without penalties or bans take the kernel's vectorized raw scan (16-byte loads,
    a scalar head to the first 16-byte boundary and a scalar tail): rows starting at every
    element offset from that boundary, vocabularies shorter than one vector and a large
    one, ties (the lowest id wins) between the head, the vectors and the tail, and NaN /
    +-inf in each part; greedy, logprob and seeded rows against the reference."""
    rng = np.random.default_rng(zlib.crc32(f"scan:{dtype}:{vocab}".encode()))
    per_vec = 16 // np.dtype(DTYPES[dtype]).itemsize
    batch, stride = 2 * per_vec, vocab + 1  # row r starts r elements past a 16-byte boundary (mod per_vec)
    x = rng.integers(-8, 8, (batch, stride)).astype(np.float32)  # few values: many exact ties
    for r in range(batch):
        ids = sorted(rng.choice(vocab, size=min(vocab, 3), replace=False).tolist())
        x[r, ids] = 9.0  # a three-way tie for the maximum: the lowest id must win
        if r % 4 == 1:
            x[r, rng.integers(0, vocab, 2)] = [np.nan, -np.inf]
        if r % 4 == 2:
            x[r, vocab - 1] = np.nan
            x[r, 0] = -np.inf
    x[:, vocab] = 1e4  # the padding column, never read
    if batch > 5:
        x[5, : vocab // 2] = np.nan  # the maximum in the second half only
        x[6, 1 % vocab] = np.inf  # +inf: the row falls back
    logits = x.astype(DTYPES[dtype])
    kinds = [dict(temperature=0.0), dict(temperature=0.0, logprobs=4), dict(temperature=1.0, seed=11), dict(top_k=2, seed=3)]
    rows = [SamplingRow(SamplingParams(**kinds[r % len(kinds)])) for r in range(batch)]
    flat = np.concatenate([np.zeros(1, logits.dtype), logits.ravel()])  # rows start one element past the allocation
    from trtcore.runtime.sampling_gpu import GpuSampler

    with GpuSampler(batch, vocab, dtype, stream) as s:
        dev = _Dev(flat)
        try:
            s.set_params(rows)
            s.sample(dev.ptr + flat.itemsize, row_stride=stride)
            got = s.result()
        finally:
            dev.free()
    want = sample_rows(logits.astype(np.float32), rows, vocab_size=vocab)
    _assert_same(got, want, rows)


LARGE_VOCAB_PARAMS = [
    dict(temperature=1.0, top_p=0.9),
    dict(temperature=0.7, top_k=50, top_p=0.9),
    dict(temperature=1.0, top_k=50),
    dict(temperature=1.3, top_k=20000),
    dict(temperature=0.8, top_p=0.5, min_p=0.01),
    dict(temperature=1.0, top_p=0.99, repetition_penalty=1.3),
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_top_k_and_top_p_at_a_large_vocabulary(stream, dtype: str) -> None:
    """Llama-3's 128,256 tokens: the radix descents of top-k and top-p with their early stop
    (a chosen bin holding one value), the per-warp histogram updates and the lazy weights,
    against the reference token for token, on Gaussian logits (bfloat16: thousands of exact
    ties) and on peaked ones (a few tokens hold most of the mass, as a trained model's do)."""
    rng = np.random.default_rng(zlib.crc32(f"large:{dtype}".encode()))
    vocab, batch = 128256, len(LARGE_VOCAB_PARAMS)
    prompt = rng.integers(0, vocab, 30).tolist()
    rows = [SamplingRow(SamplingParams(seed=int(rng.integers(0, 2**63)), **kw), prompt, []) for kw in LARGE_VOCAB_PARAMS]
    from trtcore.runtime.sampling_gpu import GpuSampler

    with GpuSampler(batch, vocab, dtype, stream) as s:
        for i in range(batch):
            s.add_request(i, prompt)
        for step in range(4):
            x = (rng.standard_normal((batch, vocab)) * 3).astype(np.float32)
            if step % 2:
                x[:, rng.integers(0, vocab, 8)] += 12.0  # peaked
            logits = x.astype(DTYPES[dtype])
            got = _gpu_step(s, logits, rows)
            want = sample_rows(logits.astype(np.float32), rows, vocab_size=vocab)
            _assert_same(got, want, rows)
            rows = [SamplingRow(r.params, prompt, [*r.output_token_ids, int(t)]) for r, t in zip(rows, got.token_ids)]


def test_top_p_over_runs_of_equal_tokens(stream) -> None:
    """Rows of exactly tied logits, where the mass before a token is j/n and top_p can equal
    it: the whole vocabulary equal, and a run of ten equal tokens far above the rest. The
    kernel divides the summed weights by the total; the reference once summed rounded
    probabilities and kept one token more (an adversarial review, session 30)."""
    batch = 8
    x = np.zeros((batch, WIDTH), np.float32)
    x[4:, :VOCAB] = -60.0
    x[4:, 100:110] = 5.0  # ten tied maxima; the rest weigh exp(-65) each, below one ulp of the total
    x[:, VOCAB:] = 1e4
    tops = [0.8, 0.1, 0.9, 0.25, 0.8, 0.1, 0.9, 0.3]
    with _sampler(stream, batch) as s:
        for step in range(25):
            rows = [SamplingRow(SamplingParams(top_p=t, seed=1000 * step + i)) for i, t in enumerate(tops)]
            got = _gpu_step(s, x, rows)
            want = sample_rows(x, rows, vocab_size=VOCAB)
            _assert_same(got, want, rows)


def test_padding_rows_and_a_padded_vocabulary(stream) -> None:
    rng = np.random.default_rng(4)
    logits = _logits(rng, 4, "float16")
    logits[:, VOCAB:] = np.float16(60000.0)  # padding far above every real logit
    rows = [SamplingRow(SamplingParams(seed=5)), None, SamplingRow(SamplingParams(temperature=0)), None]
    with _sampler(stream, 4, "float16") as s:
        got = _gpu_step(s, logits, rows)
    assert got.token_ids[[1, 3]].tolist() == [-1, -1]
    want = sample_rows(logits[[0, 2]].astype(np.float32), [rows[0], rows[2]], vocab_size=VOCAB)
    assert got.token_ids[[0, 2]].tolist() == want.token_ids.tolist()
    assert not got.fallback.any()


def test_penalty_slot_reseeded_after_a_preemption(stream) -> None:
    """A request re-admitted with its outputs so far (add_request(slot, prompt, outputs))
    continues exactly as if it had never left."""
    rng = np.random.default_rng(5)
    p = SamplingParams(temperature=0, repetition_penalty=1.6, presence_penalty=1.2, frequency_penalty=0.8)
    prompt = rng.integers(0, VOCAB, 10).tolist()
    out: list[int] = []
    with _sampler(stream, 2) as s:
        s.add_request(1, prompt)
        for step in range(12):
            logits = np.tile(_logits(rng, 1, "float32"), (2, 1))
            if step == 6:  # preempted: slot 1 is reused by someone else, the request comes back in slot 0
                s.add_request(1, [5, 6, 7])
                s.add_request(0, prompt, out)
            slot = 1 if step < 6 else 0
            rows = [SamplingRow(p, prompt, list(out)), None]
            got = _gpu_step(s, logits, rows, [slot, None])
            want = sample_rows(logits[:1], rows[:1], vocab_size=VOCAB)
            assert got.token_ids[0] == want.token_ids[0], step
            out.append(int(got.token_ids[0]))


def test_graph_replay_equals_eager_step(stream) -> None:
    rt = _rt()
    rng = np.random.default_rng(6)
    batch = 4
    params = [
        SamplingParams(seed=11, top_p=0.8),
        SamplingParams(temperature=0, logprobs=4),
        SamplingParams(seed=12, top_k=7, min_p=0.05, logprobs=2),
        SamplingParams(seed=13),
    ]
    with _sampler(stream, batch, "bfloat16") as s:
        dev = _Dev(_logits(rng, batch, "bfloat16"))
        try:
            s.set_params([SamplingRow(p, step=0) for p in params])
            s.sample(dev.ptr, row_stride=WIDTH)  # eager warm-up (loads the module, sets attributes)
            s.result()
            _ok(rt.cudaStreamBeginCapture(stream, rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal))
            s.sample(dev.ptr, row_stride=WIDTH)
            graph = _ok(rt.cudaStreamEndCapture(stream))
            exe = _ok(rt.cudaGraphInstantiate(graph, 0))
            for step in range(1, 8):
                logits = _logits(rng, batch, "bfloat16")
                dev.upload(logits)
                rows = [SamplingRow(p, step=step) for p in params]
                s.set_params(rows)
                _ok(rt.cudaGraphLaunch(exe, stream))
                replayed = s.result()
                s.set_params(rows)
                s.sample(dev.ptr, row_stride=WIDTH)
                eager = s.result()
                _assert_same(replayed, eager, rows)
                _assert_same(replayed, sample_rows(logits.astype(np.float32), rows, vocab_size=VOCAB), rows)
            rt.cudaGraphExecDestroy(exe)
            rt.cudaGraphDestroy(graph)
        finally:
            dev.free()


@pytest.mark.parametrize("offset", [0, 4, 12])
def test_stage_inputs_copies_pinned_words_and_feeds_the_tokens_in_flight(stream, offset: int) -> None:
    """stage_inputs: the kernel reads the staged words from pinned host memory (vector and
    word paths: a 16-byte aligned buffer, or one 4 or 12 bytes past it, and a count that
    is not a multiple of 4), writes them to the device, and replaces each placeholder
    ``-(row + 1)`` inside the input_ids words only by the token the last step drew for that
    row (0 for the inactive row); words outside input_ids keep their negative values, and
    nothing outside the staged bytes is written."""
    from trtcore.runtime.sampling_gpu import _Pinned

    rt = _rt()
    rng = np.random.default_rng(8)
    batch, words, ids_at, ntok = 4, 1031, 100, 37
    with _sampler(stream, batch) as s:
        rows = [SamplingRow(SamplingParams(temperature=0)) for _ in range(batch - 1)] + [None]
        logits = _logits(rng, batch, "float32")
        got = _gpu_step(s, logits, rows)
        drawn = got.token_ids.tolist()  # the last step's tokens; row 3 inactive (-1)
        host = _Pinned((words + 8,), np.dtype(np.int32))
        dev = _Dev(np.full(words + 8, -7, np.int32))
        try:
            base = offset // 4
            staged = rng.integers(-3, 1000, words).astype(np.int32)
            staged[ids_at : ids_at + 8] = [-1, -2, -3, -4, 5, -1, 0, 9]  # placeholders of rows 0..3
            staged[[3, 50, ids_at + ntok, words - 1]] = [-1, -2, -3, -4]  # negative words outside input_ids
            host.array[base : base + words] = staged
            src, dst = host.ptr + offset, dev.ptr + offset
            s.stage_inputs(dst, src, 4 * words, dst + 4 * ids_at, ntok)
            _ok(rt.cudaStreamSynchronize(stream))
            out = dev.download(np.int32, (words + 8,))
        finally:
            host.free()
            dev.free()
    want = staged.copy()
    ids = want[ids_at : ids_at + ntok]
    fed = ids < 0
    tok = np.array([drawn[-(v + 1)] if v < 0 else v for v in ids])
    ids[fed] = np.where(tok[fed] >= 0, tok[fed], 0)
    np.testing.assert_array_equal(out[base : base + words], want)
    assert (out[:base] == -7).all() and (out[base + words :] == -7).all()  # nothing written outside
    assert (want[:ids_at] < 0).any()  # negative words outside input_ids were copied as they are


def test_stage_and_result_status_equal_set_packed_and_result(stream) -> None:
    """GpuSampler.stage (records gathered from a table straight into pinned memory: a row at a
    time for 3 rows, np.take for 12) and result_status (tokens and status codes, no arrays)
    give what set_packed of ``table[index]`` with its steps and result() give, and the
    reference's tokens; the two steps are in flight together on the two host sides; a NaN
    row has the non-finite bit, a padding row is inactive."""
    from trtcore.runtime.sampling_gpu import STATUS_FALLBACK, STATUS_INACTIVE, STATUS_NONFINITE_BIT

    rng = np.random.default_rng(21)
    with _sampler(stream, 12, "float32", host_sides=2) as s:
        for n in (3, 12):
            params = [SamplingParams(seed=100 + i, top_k=int(rng.integers(0, 50)), top_p=0.9) for i in range(n)]
            steps = rng.integers(0, 50, size=n).tolist()
            table = np.zeros(20, s.params_dtype)
            index = (1 + rng.permutation(19)[:n]).tolist()
            rows: list[Any] = []
            for i, p in enumerate(params):
                table[index[i]] = s.pack_row(SamplingRow(p, step=0))[0]
                rows.append(SamplingRow(p, step=steps[i]))
            index[-1], rows[-1] = 0, None  # a padding row: the zero record
            logits = _logits(rng, n, "float32")
            logits[0, 5] = np.nan
            dev = _Dev(logits)
            try:
                t_staged = s.stage(table, index, steps, rows)
                s.sample(dev.ptr, row_stride=WIDTH)
                packed = table[index]
                packed["step"] = steps
                t_packed = s.set_packed(packed, rows)
                s.sample(dev.ptr, row_stride=WIDTH)
                assert t_staged != t_packed  # both sides in flight
                status = s.result_status(t_staged)
                res = s.result(t_packed)
            finally:
                dev.free()
            codes = [c for _, c in status]
            assert [bool(c & STATUS_NONFINITE_BIT) for c in codes] == res.nonfinite.tolist()
            assert [(c & ~STATUS_NONFINITE_BIT) == STATUS_FALLBACK for c in codes] == res.fallback.tolist()
            assert [(c & ~STATUS_NONFINITE_BIT) == STATUS_INACTIVE for c in codes] == [r is None for r in rows]
            assert codes[0] & STATUS_NONFINITE_BIT
            live = list(range(1, n - 1))
            want = sample_rows(logits[live], [rows[i] for i in live], vocab_size=VOCAB)
            assert [status[i][0] for i in live] == res.token_ids[live].tolist() == want.token_ids.tolist()


def test_bad_rows_are_refused(stream) -> None:
    from trtcore.errors import InvalidArgumentError, InvalidRequestError

    with _sampler(stream, 2, max_logprobs=4) as s:
        with pytest.raises(InvalidRequestError, match="max_logprobs=4"):
            s.set_params([SamplingRow(SamplingParams(temperature=0, logprobs=5))])
        with pytest.raises(InvalidArgumentError, match="has penalties but slot"):
            s.set_params([SamplingRow(SamplingParams(temperature=0, repetition_penalty=1.1))], [None])
        with pytest.raises(InvalidArgumentError, match="1 to max_batch_size=2"):
            s.set_params([None] * 3)
        with pytest.raises(InvalidRequestError, match="needs a seed"):
            s.set_params([SamplingRow(SamplingParams())])
