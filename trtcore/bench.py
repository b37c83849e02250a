"""``trtcore bench latency`` and ``trtcore bench throughput``: end-to-end serving numbers.

* ``latency``: for each batch size ``1 .. N`` (``--batch-sizes``), ``--num-iters`` runs of
  that many random prompts of ``--input-len`` tokens generating ``--output-len`` tokens each
  (greedy, EOS ignored), after ``--num-iters-warmup`` untimed runs;
* ``throughput``: ``--num-prompts`` such requests submitted at once and run through the
  LLM's scheduler (continuous batching with the paged KV cache; padded static batches with
  the contiguous one), like ``vllm bench throughput`` and ``trtllm-bench throughput``.

Times are taken on the caller's side of :meth:`trtcore.llm.LLM.stream`, when each token
reaches it; the metrics are named as vLLM's benchmark scripts name them
(``vllm/benchmarks/serve.py`` ``BenchmarkMetrics``): ``output_throughput`` (output tokens/s),
``total_token_throughput``, ``request_throughput``; ``mean_`` / ``median_`` (= p50) /
``p99_`` of ``ttft_ms`` (time to first token), ``tpot_ms`` (per request: (last token time -
first token time) / (output tokens - 1)), ``itl_ms`` (every gap between two tokens of a
request) and ``e2el_ms`` (submission to last token).

Weight streaming: a decode step reads every weight once (the embedding only where tied to
the LM head: :func:`streamed_weight_bytes`), so ``weight_GBps = streamed bytes / median
TPOT``; it is printed against ``copy_GBps``, a device-to-device copy timed with CUDA events
in the same process (bytes read + written / time; ``None``, printed "n/a", on the CPU), and
``weight_streaming_fraction`` is their ratio.

The model comes from ``--model`` (a checkpoint, built at start-up), ``--engine`` (an engine
file, :mod:`trtcore.engine_file`) or ``--random-weights SHAPE`` (random bfloat16 weights in
the shape of a Hugging Face config: a name of :data:`trtcore.cuda.synthetic.SHAPES` or a
``config.json`` path; built in memory, no checkpoint). ``--peer transformers`` times
transformers' ``generate`` with its static cache (``cache_implementation="static"``, greedy,
the same lengths and batch sizes, warmed up first) on the same weights in the same process,
and prints trtcore's decode tokens/s over transformers' (``decode_speedup``: transformers'
TPOT / trtcore's) and the ratio of output throughputs; its TPOT is (time of ``output_len``
new tokens - time of 1) / (``output_len`` - 1).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .checkout import drop_checkout_root
from .errors import InvalidArgumentError, TrtcoreError
from .runtime.affinity import pinned

__all__ = [
    "add_bench_parsers",
    "copy_bandwidth",
    "latency",
    "linear_weight_bits",
    "request_metrics",
    "streamed_weight_bytes",
    "throughput",
]

#: the metrics summarized per request quantity (vLLM's names, milliseconds)
QUANTITIES = ("ttft", "tpot", "itl", "e2el")


def linear_weight_bits(quantization: str | None, quantization_config: dict[str, Any] | None) -> float | None:
    """Bits one decoder-linear weight takes in the engine, scales and zero points included;
    None where the weights are not quantized (they are in the engine's dtype).

    * ``"fp8"``: 8 (E4M3; per-tensor or per-channel scales, negligible).
    * ``"gptq"`` / ``"awq"`` / ``"compressed-tensors"``: ``bits + (16 + bits) / group_size``
      (a float16 scale and a packed zero point per group; ``group_size`` -1 / absent: per output
      channel, counted as ``bits``). compressed-tensors config groups of different widths
      (mixed precision): the first group's figure, an estimate (which linears each group
      targets is not resolved here).

    Raises:
        InvalidArgumentError: ``"gguf"`` (its block types differ from tensor to tensor, so no one
            figure holds) or another method.
    """
    if quantization is None:
        return None
    if quantization == "fp8":
        return 8.0
    c = quantization_config or {}
    if quantization in ("gptq", "awq", "compressed-tensors"):
        if quantization == "compressed-tensors":
            from .quant_formats.compressed_tensors import quantization_args

            groups: dict[str, Any] = c.get("config_groups") or {}
            first: dict[str, Any] = next(iter(groups.values()), {})
            group: dict[str, Any] = quantization_args(first.get("weights") or {})  # fields left out: compressed-tensors' defaults
            bits, size = int(group["num_bits"]), group["group_size"]
        else:
            bits, size = int(c.get("bits", c.get("w_bit", 4))), c.get("group_size", c.get("q_group_size"))
        return float(bits) + ((16 + bits) / int(size) if size and int(size) > 0 else 0.0)
    raise InvalidArgumentError(f"no bits-per-weight figure for quantization {quantization!r}; expected fp8, gptq, awq or compressed-tensors")


def streamed_weight_bytes(config: Any, dtype: str, linear_bits: float | None = None) -> int:
    """Bytes of weights one decode step reads: every decoder layer's projections, norms and
    biases (the family's rules, :mod:`trtcore.families`), the final norm and the LM head (the embedding table itself is only
    gathered from, so an untied one is not counted).

    Args:
        config: a :class:`trtcore.config.ModelConfig`.
        dtype: the engine's dtype (``"float32"``, ``"float16"``, ``"bfloat16"``).
        linear_bits: bits per decoder-projection weight when they are quantized
            (:func:`linear_weight_bits`); norms, biases and the LM head stay in ``dtype``.
    """
    from .dtypes import numpy_dtype
    from .families import family_of

    family = family_of(config.model_type)  # bias rules: hard-coded by the modeling code, or the config's

    def has(rule: bool | None, configured: bool) -> bool:
        return configured if rule is None else rule

    h, i = config.hidden_size, config.intermediate_size
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    projections = h * q + 2 * h * kv + q * h + 3 * h * i
    layer = 2 * h + (q + 2 * kv) * has(family.qkv_bias, config.attention_bias) + h * has(family.o_bias, config.attention_bias)
    layer += (2 * i + h) * has(family.mlp_bias, config.mlp_bias)
    if config.model_type == "qwen3":  # per-head q/k RMSNorm (as models/llama.py builds it)
        layer += 2 * config.head_dim
    itemsize = np.dtype(numpy_dtype(dtype)).itemsize
    projection_bytes = projections * (itemsize if linear_bits is None else linear_bits / 8)
    other = config.num_hidden_layers * layer + h + config.vocab_size * h
    return int(round(config.num_hidden_layers * projection_bytes)) + other * itemsize


def copy_bandwidth(device: str, nbytes: int = 1 << 30, reps: int = 20) -> float | None:
    """Bytes/s of a device-to-device copy of ``nbytes`` (read + written: ``2 * nbytes`` per
    copy), median of ``reps`` copies timed with CUDA events after a warm-up; None on the CPU
    or without CuPy."""
    if device != "cuda":
        return None
    try:
        import cupy as cp
    except ImportError:
        return None
    src = cp.zeros(nbytes // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    stream = cp.cuda.Stream(non_blocking=True)
    times = []
    with stream:
        for rep in range(reps + 3):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            dst[...] = src
            b.record(stream)
            b.synchronize()
            if rep >= 3:
                times.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
    del src, dst
    cp.get_default_memory_pool().free_all_blocks()
    return 2 * nbytes / statistics.median(times)


def host_time_per_step(llm: Any, steps: int = 200, prompt_len: int = 16, cpu_affinity: str | Sequence[int] | None = None) -> dict[str, Any]:
    """Where the time of a graphed decode step at batch 1 goes on the device executor, in
    microseconds (one request of ``prompt_len`` tokens, greedy, ``steps`` timed steps after 20
    warm-up steps):

    * ``step_us``: wall time per :meth:`LLM.step() <trtcore.llm.LLM.step>` (the TPOT a caller sees);
    * ``host_us``: of it, the host's own work: wall time minus the time blocked waiting for
      the GPU's sampled ids (:attr:`RequestSampler.wait_seconds
      <trtcore.runtime.request_sampler.RequestSampler.wait_seconds>`), the mean over the steps;
    * ``host_p50_us``, ``host_p90_us``, ``host_p99_us``, ``host_max_us``: the same per step,
      its distribution (a rare stall of the process, such as the OS preempting it, moves the
      mean but not the median);
    * ``host_cpu_us``, ``host_cpu_p50_us``: the host work in the stepping thread's CPU time
      (:func:`time.thread_time`, less the CPU time of its waits), the mean and the per-step
      median: what the thread itself computed, without the time the system or the hypervisor
      ran something else in its place;
    * ``steal_ms``: the machine's steal time during the timed steps, summed over its CPUs
      (``/proc/stat``, 10 ms resolution; None where unavailable): a virtual machine's CPUs
      given to other guests;
    * ``gpu_us``: the device time of one step, the step's graph and sampling replayed back to
      back (:meth:`DeviceRunner.replay_seconds <trtcore.runtime.device_runner.DeviceRunner.replay_seconds>`);
    * ``exposed_host_us``: ``step_us - gpu_us``, the host time the device waits for (near 0
      when asynchronous scheduling overlaps the host's work with the device's step; the
      whole ``host_us`` when it does not).

    Also ``steps``, ``graph_replays`` (of the timed steps) and ``cpus``: with ``cpu_affinity``
    (``"auto"``, a CPU list or numbers; :func:`trtcore.runtime.affinity.pinned`) the calling
    thread is pinned for the measurement and set free after it, and ``cpus`` names the CPUs
    (None: not pinned).

    Raises:
        InvalidArgumentError: ``llm`` does not run on the device executor (a paged cache on
            a GPU backend), or already has requests.
    """
    from .runtime.device_runner import DeviceRunner

    runner = getattr(llm, "executor", None)
    if not isinstance(runner, DeviceRunner):
        raise InvalidArgumentError(
            f"host_time_per_step needs an LLM on the device executor (paged KV cache, GPU backend); got {type(runner).__name__}"
        )
    if llm.has_unfinished_requests():
        raise InvalidArgumentError("host_time_per_step needs an LLM without requests")
    with pinned(cpu_affinity) as pin:
        result = _host_time(llm, runner, steps, prompt_len)
    return {**result, "cpus": list(pin.cpus) if pin.cpus else None}


def _steal_seconds() -> float | None:
    """The machine's steal time so far, summed over its CPUs (``/proc/stat``: time a virtual
    CPU was ready but the hypervisor ran something else), seconds; None where unavailable."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") if fields[0] == "cpu" and len(fields) > 8 else None
    except (OSError, ValueError, IndexError):
        return None


def _host_time(llm: Any, runner: Any, steps: int, prompt_len: int) -> dict[str, Any]:
    from .runtime.sampling import SamplingParams

    steps = max(1, min(int(steps), llm.build_config.max_seq_len - prompt_len - 30))
    llm.add_request([5] * prompt_len, SamplingParams(temperature=0, max_tokens=steps + 25, ignore_eos=True))
    for _ in range(20):  # prefill, warm decode steps
        llm.step()
    sampler = runner.sampler
    replays, waited = runner.num_graph_replays, sampler.wait_seconds
    per_step = np.empty(steps)  # each step's host work (wall minus blocked), seconds
    per_step_cpu = np.empty(steps)  # the same in the thread's CPU time (minus the waits' CPU time)
    clock, cpu_clock, step = time.perf_counter, time.thread_time, llm.step
    sampler.cpu_clock = cpu_clock
    steal0 = _steal_seconds()
    try:
        t0 = last = clock()
        cpu_last = cpu_clock()
        for i in range(steps):
            w, wc = sampler.wait_seconds, sampler.wait_cpu_seconds
            step()
            now, cpu_now = clock(), cpu_clock()
            per_step[i] = (now - last) - (sampler.wait_seconds - w)
            per_step_cpu[i] = (cpu_now - cpu_last) - (sampler.wait_cpu_seconds - wc)
            last, cpu_last = now, cpu_now
    finally:
        sampler.cpu_clock = None
    steal1 = _steal_seconds()
    total = last - t0
    waited = sampler.wait_seconds - waited
    replays = runner.num_graph_replays - replays
    while llm.has_unfinished_requests():
        llm.step()
    step_us = total / steps * 1e6
    gpu_us = runner.replay_seconds(1, steps) * 1e6
    host = per_step * 1e6
    return {
        "step_us": step_us,
        "host_us": (total - waited) / steps * 1e6,
        "host_p50_us": float(np.percentile(host, 50)),
        "host_p90_us": float(np.percentile(host, 90)),
        "host_p99_us": float(np.percentile(host, 99)),
        "host_max_us": float(host.max()),
        "host_cpu_us": float(per_step_cpu.mean() * 1e6),
        "host_cpu_p50_us": float(np.percentile(per_step_cpu, 50) * 1e6),
        "steal_ms": None if steal0 is None or steal1 is None else (steal1 - steal0) * 1e3,
        "gpu_us": gpu_us,
        "exposed_host_us": step_us - gpu_us,
        "steps": steps,
        "graph_replays": replays,
    }


def _summary(name: str, values_s: Sequence[float], percentiles: Sequence[float] = (99,)) -> dict[str, float]:
    """``mean_``, ``median_`` and ``p<q>_`` ``<name>_ms`` of ``values_s`` (seconds; 0.0 when
    empty); percentiles by NumPy's default linear interpolation, as vLLM's benchmarks."""
    ms = np.asarray(values_s, dtype=np.float64) * 1e3
    out = {f"mean_{name}_ms": float(ms.mean()) if ms.size else 0.0, f"median_{name}_ms": float(np.median(ms)) if ms.size else 0.0}
    for q in percentiles:
        out[f"p{q:g}_{name}_ms"] = float(np.percentile(ms, q)) if ms.size else 0.0
    return out


def request_metrics(token_times: Sequence[Sequence[float]], start: float, input_lens: Sequence[int]) -> dict[str, Any]:
    """vLLM's metrics (module docstring) of requests all submitted at ``start``.

    Args:
        token_times: per request, the ``time.perf_counter()`` seconds at which each output
            token arrived.
        start: submission time (seconds, same clock).
        input_lens: per request, its prompt's token count.
    """
    per: dict[str, list[float]] = {q: [] for q in QUANTITIES}
    for times in token_times:
        if not times:
            continue
        per["ttft"].append(times[0] - start)
        per["e2el"].append(times[-1] - start)
        if len(times) > 1:
            per["tpot"].append((times[-1] - times[0]) / (len(times) - 1))
            per["itl"].extend(np.diff(times).tolist())
    duration = max((t[-1] for t in token_times if t), default=start) - start
    total_output = sum(len(t) for t in token_times)
    out: dict[str, Any] = {
        "completed": sum(1 for t in token_times if t),
        "total_input": int(sum(input_lens)),
        "total_output": total_output,
        "duration_s": duration,
        "request_throughput": len(token_times) / duration if duration else 0.0,
        "output_throughput": total_output / duration if duration else 0.0,
        "total_token_throughput": (total_output + sum(input_lens)) / duration if duration else 0.0,
    }
    for q in QUANTITIES:
        out.update(_summary(q, per[q]))
    return out


def _prompts(rng: np.random.Generator, n: int, input_len: int, vocab_size: int) -> list[list[int]]:
    return [rng.integers(0, vocab_size, size=input_len).tolist() for _ in range(n)]


def _timed_run(llm: Any, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    """Stream ``prompts`` (greedy, ``output_len`` tokens each, EOS ignored) and time every token."""
    from .runtime.sampling import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    times: list[list[float]] = [[] for _ in prompts]
    start = time.perf_counter()
    for out in llm.stream(prompts, params):
        if out.error is not None:
            raise out.error
        times[out.index].append(time.perf_counter())
    return request_metrics(times, start, [len(p) for p in prompts])


class _Recorded:
    """The weights a network definition reads (``get`` / ``in`` / iteration, like
    :class:`trtcore.checkpoint.Checkpoint`), kept by name for the transformers peer."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.arrays: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: Sequence[int] | None = None, dtype: Any = None, **kw: Any) -> np.ndarray:
        self.arrays[name] = self.inner.get(name, shape=shape, dtype=dtype, **kw)
        return self.arrays[name]

    def __contains__(self, name: object) -> bool:
        return name in self.inner

    def __iter__(self) -> Any:
        return iter(self.inner)

    def is_quantized(self, name: str) -> bool:  # quantized random weights (RandomFp8Weights ...)
        test = getattr(self.inner, "is_quantized", None)
        return bool(test is not None and test(name))

    def quantized(self, name: str) -> Any:
        return self.inner.quantized(name)


def _random_weights_llm(
    shape: str, backend: str | None, dtype: str, options: dict[str, Any], seed: int, quantization: str | None = None
) -> tuple[Any, dict[str, np.ndarray]]:
    """An LLM of random weights in ``shape``'s config, built in memory; and the weights
    (``quantization="fp8"``: the decoder linears FP8, :class:`trtcore.cuda.synthetic.RandomFp8Weights`).

    Raises:
        InvalidArgumentError: an unknown shape, or a quantization other than ``"fp8"``.
    """
    from .builder import build_engine, define_network
    from .config import load_config
    from .cuda import synthetic
    from .engine_file import EngineFile
    from .llm import LLM
    from .plan import BuildConfig, resolve_plan
    from .trt import load_trt

    if shape in synthetic.SHAPES:
        config = synthetic.config(shape)
    elif Path(shape).is_file() or Path(shape).is_dir():
        config = load_config(shape)
    else:
        raise InvalidArgumentError(f"--random-weights {shape!r}: expected one of {sorted(synthetic.SHAPES)} or a config.json path")
    folder = Path(tempfile.mkdtemp(prefix="trtcore-bench-"))
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    plan = resolve_plan(config, BuildConfig(dtype=dtype, **options), backend)
    if quantization not in (None, "fp8"):
        raise InvalidArgumentError(f"--random-weights takes --quantization fp8 or none, got {quantization!r}")
    weights = _Recorded(synthetic.RandomFp8Weights(config, seed=seed) if quantization == "fp8" else synthetic.RandomWeights(seed=seed))
    d = define_network(load_trt(plan.backend), config, weights, plan)
    engine = EngineFile.from_network(d, build_engine(d), folder)
    del d
    gc.collect()
    llm = LLM(engine=engine, progress=False)
    engine.serialized = b""  # deserialized by now: do not keep a second host copy of the weights
    return llm, weights.arrays


def _make_llm(args: argparse.Namespace, max_batch_size: int, max_seq_len: int) -> tuple[Any, Any]:
    """The LLM of ``--model`` / ``--engine`` / ``--random-weights``, and what the peer loads
    (the model folder, or the random weights by name)."""
    from .llm import LLM

    options: dict[str, Any] = {"max_batch_size": max_batch_size, "max_seq_len": max_seq_len}
    if args.kv_cache:
        options["kv_cache"] = args.kv_cache
    if getattr(args, "kv_cache_dtype", None) is not None:
        options["kv_cache_dtype"] = args.kv_cache_dtype
    if getattr(args, "max_num_tokens", None) is not None:
        if args.max_num_tokens < 1:
            raise InvalidArgumentError(f"--max-num-tokens must be >= 1, got {args.max_num_tokens}")
        if args.engine:
            raise InvalidArgumentError("--max-num-tokens is fixed by the engine file (trtcore build --max-num-tokens); leave it out with --engine")
        options["max_num_tokens"] = args.max_num_tokens
    if args.random_weights:
        if getattr(args, "quantization", None) and args.peer:
            raise InvalidArgumentError("--peer transformers runs float weights; leave out --quantization")
        return _random_weights_llm(
            args.random_weights, args.backend, args.dtype or "bfloat16", options, args.seed, getattr(args, "quantization", None)
        )
    if args.engine:
        # the KV cache options given go to the engine file's check (refused where the engine differs)
        kv = {k: options[k] for k in ("kv_cache", "kv_cache_dtype") if k in options}
        llm = LLM(args.model, engine=args.engine, backend=args.backend, dtype=args.dtype, progress=False, **kv)
        if llm.plan.max_batch_size < max_batch_size or llm.plan.max_seq_len < max_seq_len:
            raise InvalidArgumentError(
                f"the engine takes batches up to {llm.plan.max_batch_size} and {llm.plan.max_seq_len} tokens per sequence; "
                f"the benchmark needs {max_batch_size} and {max_seq_len}"
            )
        return llm, llm.model_dir
    if not args.model:
        raise InvalidArgumentError("give --model, --engine or --random-weights")
    llm = LLM(args.model, backend=args.backend, dtype=args.dtype, progress=False, quantization=getattr(args, "quantization", None), **options)
    return llm, llm.model_dir


def _transformers_model(llm: Any, weights: Any) -> Any:
    """transformers' model of ``llm``'s config in its dtype on its device: loaded from the
    model folder, or made from the config and given the random ``weights`` by name."""
    drop_checkout_root()  # trtcore's kernels/ would shadow the package transformers imports
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError as exc:
        raise TrtcoreError(f"--peer transformers needs torch and transformers ({exc})") from exc
    dtype = getattr(torch, llm.plan.dtype)
    device = "cuda" if llm.device == "cuda" else "cpu"
    if isinstance(weights, Path):
        return AutoModelForCausalLM.from_pretrained(str(weights), dtype=dtype).to(device).eval()  # type: ignore[arg-type]
    config = AutoConfig.from_pretrained(str(llm.model_dir))
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # initialized in the engine's dtype on the device (8B in seconds)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config).eval()
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # copied at once, never written
        for name, p in model.named_parameters():
            if name not in weights:
                raise TrtcoreError(f"--peer transformers: trtcore's network read no tensor {name!r}")
            a = np.ascontiguousarray(weights[name])
            t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if a.dtype.name == "bfloat16" else torch.from_numpy(a)
            p.copy_(t.to(p.dtype))
    return model


def _transformers_run(model: Any, batch: int, input_len: int, output_len: int, vocab_size: int, seed: int) -> dict[str, Any]:
    """transformers' static-cache ``generate`` of ``batch`` random prompts (module docstring)."""
    import torch

    device = next(model.parameters()).device
    ids = torch.as_tensor(np.random.default_rng(seed).integers(0, vocab_size, size=(batch, input_len)), device=device)

    def gen(n: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           cache_implementation="static", pad_token_id=0)  # fmt: skip
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    gen(output_len), gen(1)  # warm-up (and compilation, where transformers compiles)
    one = statistics.median(gen(1) for _ in range(3))
    full = statistics.median(gen(output_len) for _ in range(2))
    tpot = (full - one) / max(output_len - 1, 1)
    return {"ttft_ms": one * 1e3, "tpot_ms": tpot * 1e3, "e2el_ms": full * 1e3, "output_throughput": batch * output_len / full}


def _peer(args: argparse.Namespace, llm: Any, weights: Any, rows: list[dict[str, Any]]) -> None:
    """Add transformers' numbers and the ratios to each row (one per batch size)."""
    model = _transformers_model(llm, weights)
    for row in rows:
        hf = _transformers_run(model, row["batch_size"], args.input_len, args.output_len, llm.config.vocab_size, args.seed)
        row["transformers"] = hf
        row["decode_speedup"] = hf["tpot_ms"] / row["median_tpot_ms"] if row["median_tpot_ms"] else None
        row["output_throughput_ratio"] = row["output_throughput"] / hf["output_throughput"]
    del model
    gc.collect()


def _bandwidth(row: dict[str, Any], weight_bytes: int | None, copy_Bps: float | None) -> None:
    """``weight_GBps`` (streamed weight bytes / median TPOT) and, on a GPU, its fraction of
    the copy bandwidth (``weight_streaming_fraction``; None on the CPU or where the weight bytes
    are unknown)."""
    row["weight_GBps"] = weight_bytes / (row["median_tpot_ms"] * 1e-3) / 1e9 if weight_bytes and row["median_tpot_ms"] else None
    row["weight_streaming_fraction"] = row["weight_GBps"] * 1e9 / copy_Bps if copy_Bps and row["weight_GBps"] else None


def latency(args: argparse.Namespace) -> dict[str, Any]:
    """``trtcore bench latency`` (module docstring); returns the JSON report."""
    try:
        sizes = sorted({int(b) for b in args.batch_sizes.split(",")})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1:
        raise InvalidArgumentError(f"--batch-sizes must be comma-separated positive integers such as 1,2,4,8; got {args.batch_sizes!r}")
    if args.num_iters < 1:
        raise InvalidArgumentError(f"--num-iters must be >= 1 (timed runs per batch size), got {args.num_iters}")
    return _run(args, "latency", sizes, max(sizes))


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    """``trtcore bench throughput`` (module docstring); returns the JSON report."""
    if args.num_prompts < 1:
        raise InvalidArgumentError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    return _run(args, "throughput", [args.num_prompts], args.max_batch_size or args.num_prompts)


def _run(args: argparse.Namespace, kind: str, sizes: list[int], max_batch_size: int) -> dict[str, Any]:
    if args.input_len < 1 or args.output_len < 1:
        raise InvalidArgumentError(f"--input-len and --output-len must be >= 1, got {args.input_len}, {args.output_len}")
    if args.num_iters_warmup < 0:
        raise InvalidArgumentError(f"--num-iters-warmup must be >= 0, got {args.num_iters_warmup}")
    if args.random_weights and (args.model or args.engine):
        given = "--model" if args.model else "--engine"
        raise InvalidArgumentError(f"--random-weights {args.random_weights} and {given} name two models; give one of them")
    llm, weights = _make_llm(args, max_batch_size, args.input_len + args.output_len)
    bw = copy_bandwidth(llm.device)
    quantization = llm.quantization or getattr(args, "quantization", None)
    wbytes: int | None = None
    if quantization != "gguf":  # GGUF's block types differ from tensor to tensor: no one figure
        wbytes = streamed_weight_bytes(llm.config, llm.plan.dtype, linear_weight_bits(quantization, llm.config.quantization_config))
    rng = np.random.default_rng(args.seed)
    rows = []
    for size in sizes:
        prompts = _prompts(rng, size, args.input_len, llm.config.vocab_size)
        for _ in range(args.num_iters_warmup):
            _timed_run(llm, prompts, args.output_len)
        runs = [_timed_run(llm, prompts, args.output_len) for _ in range(args.num_iters if kind == "latency" else 1)]
        row = {"batch_size": size, **_merge(runs)}
        _bandwidth(row, wbytes, bw)
        rows.append(row)
    if args.peer == "transformers":
        _peer(args, llm, weights, rows)
    report = {
        "benchmark": kind,
        "model": args.random_weights or str(args.engine or llm.model_dir),
        "random_weights": bool(args.random_weights),
        "backend": llm.backend,
        "device": llm.device,
        "dtype": llm.plan.dtype,
        "quantization": quantization,
        "kv_cache": llm.kv_cache,
        "kv_cache_dtype": llm.plan.kv_cache_dtype,
        "max_batch_size": llm.plan.max_batch_size,
        "max_num_tokens": llm.plan.max_num_tokens,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "num_iters": args.num_iters if kind == "latency" else 1,
        "streamed_weight_bytes": wbytes,
        "copy_GBps": bw / 1e9 if bw else None,
        "results": rows,
    }
    return report


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from several timed runs of the same batch: counts summed; each time metric
    the median over the runs (their own means, medians, p99s)."""
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [r[key] for r in runs]
        out[key] = sum(values) if key in ("completed", "total_input", "total_output") else float(statistics.median(values))
    return out


def print_report(report: dict[str, Any], file: Any = None) -> None:
    """The report as a table: one line per batch size, then the bandwidth and the peer."""
    file = file or sys.stdout
    bw = report["copy_GBps"]
    kv_dtype = f" {report['kv_cache_dtype']}" if report.get("kv_cache_dtype", "auto") != "auto" else ""
    print(
        f"{report['benchmark']}: {report['model']} on {report['backend']} ({report['dtype']}{', ' + report['quantization'] if report.get('quantization') else ''}, "
        f"{report['kv_cache']}{kv_dtype} KV cache), "
        f"input {report['input_len']}, output {report['output_len']} tokens",
        file=file,
    )
    head = f"{'batch':>6} {'output tok/s':>12} {'TTFT p50/p99 ms':>18} {'TPOT p50/p99 ms':>18} {'ITL p50/p99 ms':>18} {'weights GB/s':>12}"
    print(head, file=file)
    for r in report["results"]:
        gbps = f"{r['weight_GBps']:.4g}" if r.get("weight_GBps") else "n/a"
        if r.get("weight_streaming_fraction"):
            gbps += f" ({100 * r['weight_streaming_fraction']:.0f}%)"
        line = (
            f"{r['batch_size']:>6} {r['output_throughput']:>12.1f} {r['median_ttft_ms']:>8.2f}/{r['p99_ttft_ms']:<9.2f} "
            f"{r['median_tpot_ms']:>8.3f}/{r['p99_tpot_ms']:<9.3f} {r['median_itl_ms']:>8.3f}/{r['p99_itl_ms']:<9.3f} {gbps:>12}"
        )
        if "transformers" in r:
            line += f"  transformers {r['transformers']['output_throughput']:.1f} tok/s, decode x{r['decode_speedup']:.2f}"
        print(line, file=file)
    limit = f"{bw:.0f} GB/s" if bw else "n/a (CPU)"
    streamed = report["streamed_weight_bytes"]
    per_step = f"{streamed / 1e9:.4g} GB per decode step" if streamed else "bytes per decode step unknown (GGUF blocks)"
    print(f"weight streaming: {per_step}; device copy bandwidth {limit}", file=file)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend.

    Raises:
        TrtcoreError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise TrtcoreError(f"--plot needs matplotlib ({exc}); install it with: pip install matplotlib") from exc
    return plt


def plot(report: dict[str, Any], path: str) -> None:
    """Output tokens/s against batch size (trtcore, and transformers when run) into ``path``.

    Raises:
        TrtcoreError: matplotlib is not installed.
    """
    plt = pyplot()
    rows = report["results"]
    fig, ax = plt.subplots(figsize=(6, 4))
    x = [r["batch_size"] for r in rows]
    ax.plot(x, [r["output_throughput"] for r in rows], "o-", label=f"trtcore {report['backend']}")
    if all("transformers" in r for r in rows):
        ax.plot(x, [r["transformers"]["output_throughput"] for r in rows], "s--", label="transformers (static cache)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size" if report["benchmark"] == "latency" else "requests")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{report['model']}: {report['input_len']} in, {report['output_len']} out")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _main(run: Callable[[argparse.Namespace], dict[str, Any]]) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        report = run(args)
        print_report(report)
        if args.json:
            from .fileio import write_atomic

            write_atomic(args.json, (json.dumps(report, indent=1) + "\n").encode())
        if args.plot:
            plot(report, args.plot)
        return 0

    return handler


def add_bench_parsers(bench: argparse.ArgumentParser, add_engine: Callable[[argparse.ArgumentParser], None]) -> Any:
    """The ``latency`` and ``throughput`` subcommands of ``trtcore bench`` (their handler is
    the ``handler`` default); ``add_engine`` adds the CLI's ``--engine`` option. Returns the
    subparsers action, for more subcommands (``serve``: :mod:`trtcore.bench_serve`)."""
    sub = bench.add_subparsers(dest="bench", required=True)
    lat = sub.add_parser("latency", help="TTFT / TPOT / ITL per batch size (1..N)")
    lat.add_argument("--batch-sizes", default="1,2,4,8", help="comma-separated (default 1,2,4,8)")
    lat.add_argument("--num-iters", type=int, default=3, help="timed runs per batch size (default 3)")
    lat.set_defaults(handler=_main(latency))
    thr = sub.add_parser("throughput", help="N requests through continuous batching: output tokens/s")
    thr.add_argument("--num-prompts", type=int, default=256, help="requests (default 256)")
    thr.add_argument("--max-batch-size", type=int, help="sequences per step (default: --num-prompts)")
    thr.set_defaults(handler=_main(throughput))
    for p in (lat, thr):
        p.add_argument("--model", help="Hugging Face model folder (built at start-up)")
        add_engine(p)
        p.add_argument(
            "--random-weights", metavar="SHAPE", help="random bfloat16 weights of a config: SmolLM2-135M, Llama-3.2-1B, Llama-3-8B or a config.json"
        )
        p.add_argument("--backend", help="reference | tensorrt | tensorrt_rtx | cuda")
        p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), help="default: bfloat16 for random weights, else the backend's")
        p.add_argument("--kv-cache", choices=("paged", "contiguous"), help="default: the backend's")
        p.add_argument("--max-num-tokens", type=int, help="most tokens per step, prefill chunks included (paged; TensorRT-LLM's name; default 2048)")
        p.add_argument("--input-len", type=int, default=128, help="prompt tokens (default 128)")
        p.add_argument("--output-len", type=int, default=128, help="generated tokens per request (default 128)")
        p.add_argument("--num-iters-warmup", type=int, default=1, help="untimed runs first (default 1)")
        p.add_argument("--seed", type=int, default=0, help="seed of the prompts and random weights")
        p.add_argument("--peer", choices=("transformers",), help="also time transformers' static-cache generate on the same weights")
        p.add_argument("--json", help="write the report to this JSON file")
        p.add_argument("--plot", help="plot output tokens/s against batch size into this image file (matplotlib)")
    return sub
