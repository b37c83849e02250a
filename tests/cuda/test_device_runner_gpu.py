"""The device executor on the GPU (marker ``gpu``): ``LLM(backend="cuda")`` with the paged KV
cache (the default where the paged kernels take the model's head_dim) runs on
:class:`trtcore.runtime.device_runner.DeviceRunner` -- the pool in device memory, inputs through
pinned staging buffers, decode steps replayed from CUDA graphs per batch bucket.

* greedy tokens equal transformers' (float32, its KV cache, TF32 off) for a batch of 5, which
  decodes in bucket 8 with three padding rows, and for each prompt alone (bucket 1);
* a graph-replayed decode step gives bit for bit the logits of the same step run eagerly on
  the same context; whole generations with and without graphs give the same tokens;
* prefill and mixed steps padded to token / sequence buckets give the real sequences the
  logits of the same steps unpadded (the scratch block poisoned with NaN), with no launch list
  prepared while serving;
* 100 decode steps allocate nothing on the device (CuPy's allocator hooks, the runner's own
  allocation count, and ``cudaMemGetInfo``'s free bytes, which do not fall);
* where a graphed decode step's time goes at batch 1 is measured and printed (wall time of
  ``LLM.step``, the host's own work, the device time, the exposed host time), with
  asynchronous scheduling and without.

The model: a tiny Llama of head_dim 64 (the paged kernels take multiples of 32; the tiny models
of tests/hf_models.py have 16 or 24), written by transformers with random weights.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hf_models import Variant, load_hf, random_prompt, write_checkpoint
from test_gpu_backend import cp, torch_cuda  # noqa: F401  (fixtures)

from trtcore import LLM, SamplingParams
from trtcore.runtime.device_runner import DeviceRunner, bucket_for

pytestmark = pytest.mark.gpu

HD64 = Variant("llama_hd64", family="llama", num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024, seed=21)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, cp: Any) -> Path:  # noqa: F811
    return write_checkpoint(HD64, tmp_path_factory.mktemp("hd64") / HD64.name)


def _prompts(n: int, seed: int, lo: int = 3, hi: int = 60) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [random_prompt(rng, int(k), HD64.vocab_size) for k in rng.integers(lo, hi, size=n)]


def _hf_greedy(torch: Any, model: Any, prompt: list[int], steps: int) -> list[int]:
    seq: list[int] = []
    with torch.no_grad():
        res = model(torch.tensor([prompt], device="cuda"), use_cache=True)
        for _ in range(steps):
            tok = int(res.logits[0, -1].argmax())
            seq.append(tok)
            res = model(torch.tensor([[tok]], device="cuda"), past_key_values=res.past_key_values, use_cache=True)
    return seq


def _llm(model_dir: Path, **kw: Any) -> LLM:
    kw = {"backend": "cuda", "max_batch_size": 8, "max_seq_len": 256, "progress": False, **kw}
    llm = LLM(model_dir, **kw)
    assert llm.plan.kv_cache == "paged" and isinstance(llm.executor, DeviceRunner), (llm.plan.kv_cache, type(llm.executor))
    return llm


def test_paged_cuda_greedy_matches_transformers_between_buckets(model_dir: Path, torch_cuda: Any) -> None:  # noqa: F811
    torch = torch_cuda
    llm = _llm(model_dir, dtype="float32")
    runner = llm.executor
    assert isinstance(runner, DeviceRunner)
    print("\n" + "\n".join(runner.memory_report()))
    hf = load_hf(model_dir, "float32").to("cuda")
    prompts = _prompts(5, seed=1)
    assert bucket_for(5, runner.buckets) == 8
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    together = llm.generate(prompts, params)
    assert runner.num_graph_replays >= 15
    for p, out in zip(prompts, together):
        assert out.error is None
        solo = llm.generate([p], params)[0]
        expected = _hf_greedy(torch, hf, p, 16)
        assert out.outputs[0].token_ids == solo.outputs[0].token_ids, f"prompt of {len(p)} tokens: batch (bucket 8) != solo"
        assert out.outputs[0].token_ids == expected, f"prompt of {len(p)} tokens: trtcore {out.outputs[0].token_ids} != transformers {expected}"
    llm.close()


def test_graph_replayed_step_equals_eager(model_dir: Path, cp: Any) -> None:  # noqa: F811
    """One decode step of 3 sequences (bucket 4): the graph's logits, then the same step run
    eagerly on the bucket's context with the inputs the replay copied and fed (its k/v writes
    go to the same slots with the same values): equal bit for bit. Then whole generations with
    ``enforce_eager=True`` give the graphs' tokens."""
    llm = _llm(model_dir, dtype="bfloat16")
    runner = llm.executor
    assert isinstance(runner, DeviceRunner)
    prompts = _prompts(3, seed=2)
    for p in prompts:
        llm.add_request(p, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    for _ in range(4):  # prefill, then decodes
        llm.step()
    replays = runner.num_graph_replays
    assert replays >= 3
    g = runner.graphs[4]
    assert len(g.graphs) == 2
    runner.device.launch_graph(g.graphs[runner._side])  # the last step's staged inputs, copied again
    graphed = runner.logits_rows(3).copy()
    runner._run(g.context)  # the engine alone, on the staging the graph copied (its placeholders already fed)
    eager = runner.logits_rows(3).copy()
    assert np.isfinite(graphed).all()
    np.testing.assert_array_equal(graphed, eager)
    llm.close()

    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3)
    prompts = _prompts(6, seed=3)
    outs = {}
    for enforce_eager in (False, True):
        llm = _llm(model_dir, dtype="bfloat16", enforce_eager=enforce_eager)
        outs[enforce_eager] = llm.generate(prompts, params)
        assert (llm.executor.num_graph_replays > 0) != enforce_eager
        llm.close()
    worst = 0.0
    for a, b in zip(outs[False], outs[True]):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for da, db in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            worst = max([worst] + [abs(da[t].logprob - db[t].logprob) for t in db if t in da])
    print(f"\ngraphs vs enforce_eager: largest log-probability difference {worst:.3g}")
    assert worst <= 1e-3


def test_100_decode_steps_allocate_nothing_on_the_device(model_dir: Path, cp: Any) -> None:  # noqa: F811
    from netutil import allocation_counter

    llm = _llm(model_dir, dtype="bfloat16", max_batch_size=4)
    runner = llm.executor
    assert isinstance(runner, DeviceRunner)
    for p in _prompts(3, seed=4):
        llm.add_request(p, SamplingParams(temperature=0, max_tokens=150, ignore_eos=True))
    for _ in range(3):
        llm.step()
    gc.collect()  # earlier tests' objects freed now, not while counting
    gc.disable()
    try:
        cp.cuda.runtime.deviceSynchronize()
        allocations = runner.device.num_allocations
        free0 = runner.device.mem_get_info()[0]
        replays0 = runner.num_graph_replays
        hook = allocation_counter()
        with hook:
            for _ in range(100):
                outs = llm.step()
                assert len(outs) == 3 and all(o.finish_reason is None for o in outs)
        cp.cuda.runtime.deviceSynchronize()
        free1 = runner.device.mem_get_info()[0]
    finally:
        gc.enable()
    print(f"\n100 decode steps: {hook.n} CuPy allocations, {runner.device.num_allocations - allocations} runner allocations, "
          f"free device memory {free0} -> {free1}")  # fmt: skip
    assert runner.num_graph_replays - replays0 == 100
    assert hook.n == 0, f"{hook.n} CuPy allocations in 100 decode steps"
    assert runner.device.num_allocations == allocations
    assert free1 >= free0, f"free device memory fell by {free0 - free1} bytes over 100 decode steps"
    llm.close()


def test_host_time_per_graphed_decode_step_batch_1(model_dir: Path, cp: Any) -> None:  # noqa: F811
    """Where a graphed decode step's time goes at batch 1 (:func:`trtcore.bench.host_time_per_step`:
    wall time per ``LLM.step()``, the host's own work, the device time of the step replayed back
    to back, the exposed host time), with asynchronous scheduling and one step at a time,
    printed (the acceptance's 50 us is judged from the print; the assertions only catch a host
    path gone badly wrong, and that every timed step was a graph replay)."""
    from trtcore.bench import host_time_per_step

    llm = _llm(model_dir, dtype="bfloat16", max_batch_size=1, max_seq_len=512)
    for ahead in (True, False):
        llm.engine.async_scheduling = ahead
        ht = host_time_per_step(llm, steps=300)
        mode = "async" if ahead else "one step at a time"
        print(
            f"\nbatch-1 graphed decode step ({mode}): {ht['step_us']:.1f} us wall, {ht['host_us']:.1f} us host work, "
            f"{ht['gpu_us']:.1f} us GPU, {ht['exposed_host_us']:.1f} us exposed host time"
        )
        assert ht["graph_replays"] == ht["steps"] == 300
        assert ht["host_us"] < 2000
    llm.close()


def _padding_scenario(llm: LLM, prompts: list[list[int]]) -> tuple[list[np.ndarray], list[tuple[int, int, int]], dict[int, list[int]]]:
    """Requests arriving between steps (prefills, then mixed prefill + decode steps), one step
    in flight at a time: the logits rows of the real sequences of every step, the ``(tokens,
    sequences, real sequences)`` of each eager step, and each request's tokens."""
    runner = llm.executor
    assert isinstance(runner, DeviceRunner)
    logits: list[np.ndarray] = []
    eager: list[tuple[int, int, int]] = []
    execute, sample = runner.execute, runner.sample

    def run(batch: Any) -> int:
        rows = execute(batch)
        if not runner.is_decode(batch):
            assert runner.last_eager_shape is not None
            eager.append((*runner.last_eager_shape, len(batch.seqs)))
        return rows

    def read(batch: Any) -> Any:
        logits.append(runner.logits_rows(len(batch.seqs)).copy())
        return sample(batch)

    runner.execute, runner.sample = run, read  # type: ignore[method-assign]
    tokens: dict[int, list[int]] = {}
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    try:
        ids = []
        for arrivals in ([0, 1], [], [2], [3, 4]):
            ids += [llm.add_request(prompts[i], params) for i in arrivals]
            for out in llm.step():
                tokens.setdefault(out.index, []).append(out.token_id)
        while llm.has_unfinished_requests():
            for out in llm.step():
                tokens.setdefault(out.index, []).append(out.token_id)
    finally:
        del runner.execute, runner.sample
    return logits, eager, {i - ids[0]: tokens[i] for i in ids}


@pytest.mark.parametrize(("dtype", "tol"), [("float32", 1e-4), ("bfloat16", 5e-2)])
def test_padded_eager_steps_equal_unpadded(model_dir: Path, cp: Any, dtype: str, tol: float) -> None:  # noqa: F811
    """Prefill and mixed steps padded to token / sequence buckets (the padding rows' tokens on
    the scratch block, which is poisoned with NaN first) give the real sequences the logits of
    the same steps unpadded (the GEMMs see more rows, so cuBLAS may pick another kernel:
    within ``tol``; float32 runs the CUDA-core attention kernels, bfloat16 the tensor-core
    ones) on the same runner, and in float32 the same greedy tokens (in bfloat16 the logits
    are compared up to the first step whose greedy tokens differ, a near tie); every padded
    step has one of the runner's ``eager_shapes``, warmed at start-up (no launch list is
    prepared while serving). Every padded shape was captured into CUDA graphs at start-up;
    those are dropped here, so that the first pass runs eagerly: the same arrivals twice
    more, the padded steps are captured at their second run and replayed at the third, the
    same logits bit for bit."""
    llm = _llm(model_dir, dtype=dtype, async_scheduling=False)
    runner = llm.executor
    assert isinstance(runner, DeviceRunner) and runner.pad_eager_steps
    assert set(runner._eager_graphs) == set(runner.eager_shapes)
    runner._eager_graphs.clear()  # the eager path first (the graphs' device memory stays with the device)
    warmed = runner.eager.num_prepares
    assert warmed >= len(runner.eager_shapes)
    pool_bytes = int(np.prod(runner.pool_shape)) * np.dtype(runner.pool_dtype).itemsize
    pool = cp.ndarray(runner.pool_shape, runner.pool_dtype, cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(runner.pool_ptr, pool_bytes, runner), 0))
    pool[:, runner.scratch_block] = cp.nan
    cp.cuda.runtime.deviceSynchronize()
    prompts = _prompts(5, seed=6, lo=2, hi=40)
    padded = _padding_scenario(llm, prompts)
    assert runner.eager.num_prepares == warmed, "a padded eager step prepared a launch list while serving"
    _padding_scenario(llm, prompts)  # the shapes recur: captured into graphs after their eager run
    replays = runner.num_eager_graph_replays
    again = _padding_scenario(llm, prompts)
    assert runner.num_eager_graph_replays > replays, "no eager step was replayed from a graph"
    runner.pad_eager_steps = runner.eager_graphs = False
    plain = _padding_scenario(llm, prompts)
    llm.close()
    (lp, ep, tp), (lu, eu, tu) = padded, plain
    assert again[1] == ep and again[2] == tp
    for a, b in zip(padded[0], again[0]):  # graph replays: the eager runs' launches, bit for bit
        np.testing.assert_array_equal(a, b)
    print(f"\neager steps padded {ep}\nunpadded {eu}")
    assert all(n == r for _, n, r in eu) and any(t != r and r > 1 for t, _, r in eu)  # a mixed or multi-sequence prefill
    assert [r for *_, r in ep] == [r for *_, r in eu] and any((t, n) != (tu_, nu) for (t, n, _), (tu_, nu, _) in zip(ep, eu))
    assert all((t, n) in runner.eager_shapes for t, n, _ in ep)
    if dtype == "float32":
        assert tp == tu
    assert len(lp) >= 3 and len(lu) == len(lp) == len(again[0])
    worst, compared = 0.0, 0
    for steps in (lp, again[0]):  # the first run (eager), the third (graphs)
        for a, b in zip(steps, lu):
            assert np.isfinite(a).all() and np.isfinite(b).all()
            worst = max(worst, float(np.abs(a - b).max()))
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
            compared += 1
            if (a.argmax(axis=-1) != b.argmax(axis=-1)).any():
                break
    print(f"largest logit difference padded / unpadded over {compared} steps: {worst:.3g}")
