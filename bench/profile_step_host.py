"""The host's Python work per graphed decode step at batch 1, on the CPU: the real step loop
(``LLM.step`` -> :class:`~trtcore.runtime.generate.EngineCore` -> the scheduler -> the device
executor's staging -> :class:`~trtcore.runtime.request_sampler.RequestSampler` over
:class:`~trtcore.runtime.sampling_gpu.GpuSampler` -> the scheduler's update -> the
detokenizer and the stream outputs) with every CUDA call stubbed out.

What runs for real: all of trtcore's Python, NumPy, the status checks of every CUDA call
(:func:`trtcore.gpu.call` / :func:`trtcore.gpu.check`). What is stubbed: the ``cuda.bindings``
runtime module (:class:`FakeCudart`: each call returns ``(0, value)`` at once; ``cudaMallocHost``
gives real host memory, ``cudaGraphLaunch`` writes the step's sampled token into the sampler's
pinned results, as the captured sampling kernel would), the NVRTC kernels (a launch does
nothing) and the TensorRT engine (:class:`FakeEngine`: contexts that accept every shape and
address). So the time per step here is the host work of
:func:`trtcore.bench.host_time_per_step` minus what the real CUDA calls cost on the GPU machine
(``cudaGraphLaunch`` 14-19 us for the 224-node graph of SmolLM2-135M on the H200, plus
about 1-2 us for each of the few other runtime calls of a step).

The model is a config only (the ``bench_e2e`` shapes, default SmolLM2-135M, as the H200
measurement), without a tokenizer unless ``--tokenizer DIR`` names a folder with a
``tokenizer.json`` (then every token is detokenized, as a server does).

    python bench/profile_step_host.py --out DIR [--steps 5000] [--model SmolLM2-135M] [--label before]

Prints, and writes to ``DIR/profile_step_host[_LABEL].json``: microseconds per ``LLM.step()``
(median of ``--repeats`` runs of ``--steps`` steps), then cProfile's functions by own time per
step (inflated by the profiler; the ranking is what matters).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_host import profile_steps  # noqa: E402  (the cProfile table of the GPU tool, the same rows)


class _Enum:
    """An enum namespace of the stub runtime (attributes are ints)."""

    def __init__(self, **values: int) -> None:
        self.__dict__.update(values)


class FakeCudart:
    """The ``cuda.bindings.runtime`` calls the device executor and the sampler make, each
    returning ``(0, value)`` without doing anything; host allocations are real memory."""

    cudaMemcpyKind = _Enum(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2, cudaMemcpyDefault=4)
    cudaStreamCaptureMode = _Enum(cudaStreamCaptureModeRelaxed=2)
    cudaStreamCaptureStatus = _Enum(cudaStreamCaptureStatusNone=0, cudaStreamCaptureStatusActive=1)
    cudaEventDisableTiming = 2
    cudaEventRecordExternal = 1
    cudaStreamNonBlocking = 1

    def __init__(self) -> None:
        self._host: dict[int, Any] = {}
        self._next = 1 << 40
        self.capturing = False
        self.on_graph_launch: Any = None  # exe -> None, set by the harness
        self.num_graph_launches = 0

    def _fake_ptr(self, n: int) -> int:
        ptr = self._next
        self._next += -(-max(int(n), 1) // 4096) * 4096
        return ptr

    def cudaSetDevice(self, device: int) -> tuple[int]:
        return (0,)

    def cudaStreamCreateWithFlags(self, flags: int) -> tuple[int, int]:
        return (0, 7)

    def cudaEventCreateWithFlags(self, flags: int) -> tuple[int, object]:
        return (0, object())

    def cudaMalloc(self, n: int) -> tuple[int, int]:
        return (0, self._fake_ptr(n))

    def cudaMallocHost(self, n: int) -> tuple[int, int]:
        buf = (ctypes.c_uint8 * max(int(n), 1))()
        ptr = ctypes.addressof(buf)
        self._host[ptr] = buf
        return (0, ptr)

    def cudaHostGetDevicePointer(self, ptr: int, flags: int) -> tuple[int, int]:
        return (0, int(ptr))  # unified addressing: the host pointer

    def cudaMemGetInfo(self) -> tuple[int, int, int]:
        return (0, 100 << 30, 141 << 30)

    def cudaMemcpyAsync(self, *args: Any) -> tuple[int]:
        return (0,)

    def cudaMemcpy(self, *args: Any) -> tuple[int]:
        return (0,)

    def cudaMemsetAsync(self, *args: Any) -> tuple[int]:
        return (0,)

    def cudaEventRecord(self, *args: Any) -> tuple[int]:
        return (0,)

    def cudaEventRecordWithFlags(self, *args: Any) -> tuple[int]:
        return (0,)

    def cudaEventSynchronize(self, event: Any) -> tuple[int]:
        return (0,)

    def cudaEventQuery(self, event: Any) -> tuple[int]:
        return (0,)

    def cudaStreamSynchronize(self, stream: Any) -> tuple[int]:
        return (0,)

    def cudaStreamIsCapturing(self, stream: Any) -> tuple[int, int]:
        return (0, 1 if self.capturing else 0)

    def cudaStreamBeginCapture(self, stream: Any, mode: Any) -> tuple[int]:
        self.capturing = True
        return (0,)

    def cudaStreamEndCapture(self, stream: Any) -> tuple[int, object]:
        self.capturing = False
        return (0, object())

    def cudaGraphInstantiate(self, graph: Any, flags: int) -> tuple[int, object]:
        return (0, object())

    def cudaGraphLaunch(self, exe: Any, stream: Any) -> tuple[int]:
        self.num_graph_launches += 1
        if self.on_graph_launch is not None:
            self.on_graph_launch(exe)
        return (0,)

    def cudaFree(self, ptr: int) -> tuple[int]:
        return (0,)

    def cudaFreeHost(self, ptr: int) -> tuple[int]:
        self._host.pop(int(ptr), None)
        return (0,)

    def cudaEventDestroy(self, ev: Any) -> tuple[int]:
        return (0,)

    def cudaStreamDestroy(self, s: Any) -> tuple[int]:
        return (0,)

    def cudaGraphExecDestroy(self, e: Any) -> tuple[int]:
        return (0,)

    def cudaGraphDestroy(self, g: Any) -> tuple[int]:
        return (0,)


class _FakeFunction:
    def launch(self, *args: Any, **kwargs: Any) -> None:
        """A kernel launch that does nothing."""


class _FakeCompiled:
    def function(self, name: str) -> _FakeFunction:
        return _FakeFunction()


class _FakeContext:
    """``IExecutionContext``: accepts every shape and address; ``execute_async_v3`` does nothing."""

    def set_device_memory(self, ptr: int, size: int) -> None:
        pass

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        return True

    def set_input_shape(self, name: str, shape: Any) -> bool:
        return True

    def execute_async_v3(self, stream: int) -> bool:
        return True


class FakeEngine:
    """``ICudaEngine`` with the paged KV mode's I/O tensors and no activation memory."""

    device_memory_size_v2 = 1 << 20

    def __init__(self, names: list[str]) -> None:
        self._names = names
        self.num_io_tensors = len(names)

    def get_tensor_name(self, i: int) -> str:
        return self._names[i]

    def create_execution_context_without_device_memory(self) -> _FakeContext:
        return _FakeContext()


@contextlib.contextmanager
def stubbed_cuda() -> Any:
    """While inside: :class:`~trtcore.runtime.device_memory.CudaDevice` and the sampler use a
    :class:`FakeCudart`, NVRTC compiles nothing, and ``LLM(backend="cuda")`` on a paged cache
    starts the real device executor over a :class:`FakeEngine` (no network is built).
    Yields the stub runtime."""
    import cuda.bindings.runtime as real_rt

    import trtcore.kernels as kernels
    import trtcore.llm as llm_module
    import trtcore.runtime.sampling_gpu as sampling_gpu
    from trtcore.kv_modes import LOGITS
    from trtcore.runtime.device_memory import CudaDevice
    from trtcore.runtime.device_runner import DeviceRunner

    fake = FakeCudart()
    saved = (CudaDevice.__init__, kernels.compile_kernel, sampling_gpu._RUNTIME, llm_module.LLM._make_executor)

    def device_init(self: Any, device: int = 0) -> None:
        saved[0](self, device)
        self._rt = fake

    def make_executor(self: Any, progress: bool) -> Any:
        names = [spec.name for spec in self.kv_mode.inputs] + [LOGITS]
        dev = CudaDevice(0)
        return DeviceRunner(FakeEngine(names), dev, self.kv_mode, **self._runner_options)

    real_module = sys.modules["cuda.bindings.runtime"]
    # CudaDevice imports the runtime inside __init__: point it at the stub there
    try:
        CudaDevice.__init__ = device_init  # type: ignore[method-assign]
        sys.modules["cuda.bindings.runtime"] = fake  # type: ignore[assignment]
        import cuda.bindings as cb

        cb.runtime = fake  # type: ignore[attr-defined]
        kernels.compile_kernel = lambda *a, **k: _FakeCompiled()  # type: ignore[assignment]
        sampling_gpu._RUNTIME = fake
        llm_module.LLM._make_executor = make_executor  # type: ignore[method-assign]
        yield fake
    finally:
        CudaDevice.__init__ = saved[0]  # type: ignore[method-assign]
        kernels.compile_kernel = saved[1]  # type: ignore[assignment]
        sampling_gpu._RUNTIME = saved[2]
        llm_module.LLM._make_executor = saved[3]  # type: ignore[method-assign]
        sys.modules["cuda.bindings.runtime"] = real_module
        cb.runtime = real_rt  # type: ignore[attr-defined]


def make_llm(model_dir: Path, fake: FakeCudart, token_ids: list[int]) -> Any:
    """``LLM(backend="cuda", max_batch_size=1)`` on the stubs, whose graph launches "sample"
    ``token_ids`` in turn (written into the side's pinned results, status ok)."""
    from trtcore import LLM

    llm = LLM(model_dir, backend="cuda", dtype="bfloat16", max_batch_size=1, max_seq_len=8192, progress=False)
    runner = llm.executor
    sides = {id(exe): side for g in runner.graphs.values() for side, exe in enumerate(g.graphs)}
    kernel = runner.sampler.kernel
    state = {"i": 0}

    def on_launch(exe: Any) -> None:
        res = kernel._sides[sides[id(exe)]].results.array
        res[0]["token"] = token_ids[state["i"] % len(token_ids)]
        res[0]["status"] = 0
        state["i"] += 1

    fake.on_graph_launch = on_launch
    return llm


def time_steps(llm: Any, steps: int, repeats: int) -> dict[str, Any]:
    """Median / min microseconds per ``LLM.step()`` over ``repeats`` runs of ``steps``
    graphed decode steps of one greedy request (after 20 warm-up steps each)."""
    from trtcore import SamplingParams

    runs = []
    replays = 0
    for _ in range(repeats):
        llm.add_request([5] * 16, SamplingParams(temperature=0, max_tokens=steps + 25, ignore_eos=True))
        for _ in range(20):
            llm.step()
        r0 = llm.executor.num_graph_replays
        t0 = time.perf_counter()
        for _ in range(steps):
            llm.step()
        runs.append((time.perf_counter() - t0) / steps * 1e6)
        replays = llm.executor.num_graph_replays - r0
        while llm.has_unfinished_requests():
            llm.step()
    return {"us_per_step_median": statistics.median(runs), "us_per_step_min": min(runs), "runs_us": runs, "steps": steps, "graph_replays": replays}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--model", default="SmolLM2-135M")
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile-steps", type=int, default=3000)
    ap.add_argument("--tokenizer", default=None, help="a folder with tokenizer.json: detokenize every token")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    from bench_e2e import _model_dir

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, stubbed_cuda() as fake:
        d = _model_dir(Path(tmp), args.model)
        token_ids = list(range(1000, 1064))
        if args.tokenizer:
            import shutil

            shutil.copy(Path(args.tokenizer) / "tokenizer.json", d / "tokenizer.json")
        llm = make_llm(d, fake, token_ids)
        if llm.tokenizer is not None:
            text = "The quick brown fox jumps over the lazy dog, and then it runs away into the forest. " * 4
            token_ids[:] = llm.encode(text)
        timing = time_steps(llm, args.steps, args.repeats)
        print(
            f"{args.model}: {timing['us_per_step_median']:.1f} us per LLM.step() (median of {args.repeats} x {args.steps}; "
            f"min {timing['us_per_step_min']:.1f}), {timing['graph_replays']} graph replays, stubbed CUDA",
            flush=True,
        )
        prof = profile_steps(llm, args.profile_steps, top=40)
        print("cProfile, us per step (inflated by the profiler):")
        for r in prof:
            print(f"  {r['own_us_per_step']:7.2f} own {r['cum_us_per_step']:7.2f} cum {r['calls_per_step']:5.1f}x  {r['function']}")
        llm.close()
    result = {
        "model": args.model,
        "tokenizer": bool(args.tokenizer),
        "numpy": np.__version__,
        "python": sys.version.split()[0],
        "timing": timing,
        "profile": prof,
    }
    name = f"profile_step_host{'_' + args.label if args.label else ''}.json"
    (out / name).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
