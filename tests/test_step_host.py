"""The device executor's host path with the GPU sampler's host side (trtcore.runtime.sampling_gpu:
``GpuSampler.stage`` / ``result_status``, the pinned records and results) on the CPU, through
bench/profile_step_host.py's stubs (CUDA runtime calls that do nothing, NVRTC kernels that do
nothing, a TensorRT engine that accepts every binding), so that the harness the host-time
numbers come from keeps running and what it runs is right.

References: the tokens the stub "device" writes into the pinned results at each graph replay
(random), and the Philox step of each replayed step, which is the count of tokens the request
generated before it (vLLM / the sampler's contract, trtcore.runtime.request_sampler).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trtcore import SamplingParams

pytest.importorskip("cuda.bindings.runtime", reason="the harness stubs cuda-python's runtime module")

BENCH = Path(__file__).parents[1] / "bench"


def _harness() -> Any:
    spec = importlib.util.spec_from_file_location("profile_step_host", BENCH / "profile_step_host.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stubbed_graph_replays_stream_the_devices_tokens_with_their_philox_steps(tmp_path: Path) -> None:
    """One greedy request, asynchronous scheduling: every decode step is one graph replay whose
    staged record (GpuSampler.stage, straight into pinned memory) carries the request's seed and
    Philox step = tokens generated before it, and LLM.step streams the tokens the device wrote
    (GpuSampler.result_status), in order, then finishes on max_tokens."""
    psh = _harness()
    from bench_e2e import _model_dir  # on sys.path once the harness is loaded

    rng = np.random.default_rng()
    tokens = rng.integers(3, 1000, size=37).tolist()
    with psh.stubbed_cuda() as fake:
        llm = psh.make_llm(_model_dir(tmp_path, "SmolLM2-135M"), fake, tokens)
        kernel = llm.executor.sampler.kernel
        device_write = fake.on_graph_launch
        staged: list[tuple[int, int]] = []

        def launch(exe: Any) -> None:
            record = kernel._sides[kernel._turn].params.array[0]  # the side staged last is the one replayed
            staged.append((int(record["seed"]), int(record["step"])))
            device_write(exe)

        fake.on_graph_launch = launch
        max_tokens = 30
        llm.add_request([5] * 16, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        outs = []
        while llm.has_unfinished_requests():
            outs += llm.step()
        llm.close()
    # the prefill samples eagerly (its token is the stub kernel's untouched result, 0), then decodes replay
    assert [o.token_id for o in outs[1:]] == tokens[: max_tokens - 1]
    assert outs[-1].finish_reason == "length" and all(o.finish_reason is None for o in outs[:-1])
    # running ahead, the step after the last token is staged and replayed before it is known
    assert staged[: max_tokens - 1] == [(0, k) for k in range(1, max_tokens)]
    assert llm.executor.num_graph_replays == len(staged) >= max_tokens - 1


def test_steady_staging_writes_what_a_full_restage_writes() -> None:
    """RequestSampler.enqueue with its steady path (the same requests on the same rows of a
    side: GpuSampler.restage_steps writes the steps only) and GpuSampler.stage's in-place
    records (the table's version) against the same calls with neither (every record gathered
    and copied each step): random arrivals, finishes, batch changes, rows without a token,
    min_tokens (records repacked while they mask) and penalties (slots taken from others), on
    both host sides; after every step the pinned parameters of the replayed rows are byte for
    byte the same, and so are the enqueued steps; the steady path did run."""
    psh = _harness()
    from trtcore.runtime.device_memory import CudaDevice
    from trtcore.runtime.request import Request
    from trtcore.runtime.request_sampler import RequestSampler, make_sampler_kernel

    rng = np.random.default_rng()
    with psh.stubbed_cuda():
        dev = CudaDevice(0)
        kernels = [make_sampler_kernel(dev, 8, 512, 256) for _ in range(2)]
        slow_stage = kernels[1].stage
        kernels[1].stage = lambda table, index, steps, rows, side=None, version=None: slow_stage(table, index, steps, rows, side)
        kernels[1].restage_steps = None  # no steady path
        restaged = []
        fast_restage = kernels[0].restage_steps
        kernels[0].restage_steps = lambda *a: restaged.append(fast_restage(*a)) or restaged[-1]
        samplers = [RequestSampler(k) for k in kernels]
        live: dict[str, list[Request]] = {}
        next_id = 0
        side = 0
        for _ in range(300):
            if rng.random() < 0.15 or not live:  # an arrival
                rid = f"r{next_id}"
                next_id += 1
                kw: dict[str, Any] = {"temperature": float(rng.choice([0.0, 0.8])), "seed": int(rng.integers(1 << 30)), "max_tokens": 64}
                if rng.random() < 0.3:
                    kw["min_tokens"] = int(rng.integers(1, 6))
                if rng.random() < 0.3:
                    kw["presence_penalty"] = 0.5
                prompt = rng.integers(3, 500, size=int(rng.integers(1, 8))).tolist()
                live[rid] = [Request(rid, prompt, SamplingParams(**kw), eos_token_ids={2}) for _ in samplers]
                for s, req in zip(samplers, live[rid]):
                    s.add_request(req)
            if len(live) > 1 and rng.random() < 0.1:  # a finish
                rid = str(rng.choice(sorted(live)))
                for s in samplers:
                    s.remove_request(rid)
                del live[rid]
            ids = sorted(live)[:8]
            if rng.random() < 0.2:  # a step where some rows produce no token
                ids = [r if rng.random() < 0.7 else None for r in ids]
            for reqs in live.values():  # tokens in flight (asynchronous scheduling): 0 to 2
                in_flight = int(rng.integers(0, 3))
                for req in reqs:
                    req.num_output_placeholders = in_flight
            side ^= 1
            staged, steps = [], []
            for s, kern in zip(samplers, kernels):
                steps.append(s.enqueue(ids, 0, 512, side=side, rows=8))
                staged.append(kern._sides[side].params.array[:8].tobytes())
                kern.result_status(side)
            assert staged[0] == staged[1]
            assert steps[0] == steps[1]
            for reqs in live.values():  # every live request's step produced a token
                tok = int(rng.integers(3, 500))
                for req in reqs:
                    req.output_token_ids.append(tok)
        assert sum(t is not None for t in restaged) > 50
        for k in kernels:
            k.close()
        dev.close()


def test_host_time_per_step_takes_the_waits_out_on_both_clocks(tmp_path: Path) -> None:
    """trtcore.bench.host_time_per_step on the stubbed executor, with known times injected: each
    wait for a step's tokens busy-spins WAIT seconds (CPU time that is not host work), each graph
    launch sleeps LAUNCH seconds (host wall time, no CPU time). So the wall-clock host work is at
    least LAUNCH and at most LAUNCH + the harness's own work, the CPU-time host work is well below
    LAUNCH (the sleep is not computed), the wall per step is at least WAIT + LAUNCH, and the steal
    time is a number on Linux. The injected times are milliseconds, so that the harness's own work
    per step (tens of microseconds here, some hundreds on a loaded CI machine: a margin of 250 us
    failed there once) stays a small part of them; the bounds are fractions of LAUNCH."""
    import sys
    import time

    from trtcore.bench import host_time_per_step

    WAIT, LAUNCH = 4e-3, 6e-3
    psh = _harness()
    from bench_e2e import _model_dir

    with psh.stubbed_cuda() as fake:
        llm = psh.make_llm(_model_dir(tmp_path, "SmolLM2-135M"), fake, list(range(1000, 1064)))
        write = fake.on_graph_launch

        def launch(exe: Any) -> None:
            write(exe)
            time.sleep(LAUNCH)

        def spin(event: Any) -> tuple[int]:
            end = time.perf_counter() + WAIT
            while time.perf_counter() < end:
                pass
            return (0,)

        fake.on_graph_launch = launch
        fake.cudaEventSynchronize = spin
        ht = host_time_per_step(llm, steps=60)
        llm.close()
    assert ht["graph_replays"] == ht["steps"] == 60
    assert LAUNCH * 1e6 <= ht["host_p50_us"] < LAUNCH * 1e6 * 1.5, ht
    assert ht["host_cpu_p50_us"] < LAUNCH * 1e6 * 0.5, ht  # the sleep's 6 ms are not CPU time
    assert ht["step_us"] >= (WAIT + LAUNCH) * 1e6, ht
    assert ht["host_us"] <= ht["step_us"] - WAIT * 1e6 + 1, ht
    if sys.platform == "linux":
        assert isinstance(ht["steal_ms"], float) and ht["steal_ms"] >= 0
