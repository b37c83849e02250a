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
