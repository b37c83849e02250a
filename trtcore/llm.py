"""The Python API, shaped like vLLM's: ``LLM(...).generate(prompts, SamplingParams(...))``.

Example::

    from trtcore import LLM, SamplingParams
    llm = LLM()                          # SmolLM2-135M-Instruct, fetched and converted once
    [out] = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=32))
    print(out.outputs[0].text)

Errors in a batch: when ``generate`` is given a *list* of prompts, a bad prompt (empty,
too long, token ids outside the vocabulary) does not stop the others: its
:class:`RequestOutput` has ``error`` set (an :class:`~trtcore.errors.InvalidRequestError`)
and ``finish_reason == "error"``. A single prompt passed on its own raises instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .builder import build_engine, build_reference_engine, check_tensor_parallel_family, define_network, tensor_names
from .checkpoint import Checkpoint
from .config import GenerationConfig, ModelConfig, load_config, load_generation_config
from .engine_file import EngineFile, load_engine_file
from .errors import GenerationError, InvalidArgumentError, InvalidRequestError, TrtcoreError
from .kv_modes import kv_mode
from .parallel import Mapping, local_kv_heads
from .plan import BuildConfig, BuildPlan, default_backend, resolve_plan
from .quant_formats import resolve_quantization
from .runtime.affinity import pin_thread, resolve_cpus
from .runtime.detokenizer import IncrementalDetokenizer
from .runtime.device import resolve_device
from .runtime.executor import Executor
from .runtime.generate import make_engine
from .runtime.request import Request, RequestEvent, metrics
from .runtime.sampling import Logprob, SamplingParams
from .runtime.stop import StopStringMatcher
from .token_bytes import token_text
from .trt import load_trt, normalize_backend


@dataclass
class CompletionOutput:
    """One completion of a request (vLLM's ``CompletionOutput``).

    Attributes:
        index: 0 (one completion per request).
        text: the generated text (special tokens skipped); "" without a tokenizer.
        token_ids: generated token ids, including a final EOS / stop token.
        cumulative_logprob: sum of the generated tokens' log-probabilities, when requested.
        logprobs: per generated token, ``{token_id: Logprob}`` with the top-k and the
            sampled token, when ``SamplingParams(logprobs=k)``; else None.
        finish_reason: ``"stop"``, ``"length"``, or ``"error"``.
        stop_reason: the stop token id or stop string that ended it, if any.
    """

    index: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    """The result for one prompt (vLLM's ``RequestOutput``).

    Attributes:
        request_id: position of the prompt in the ``generate`` call, as a string.
        prompt: the prompt text (None when given as token ids).
        prompt_token_ids: the prompt's token ids.
        outputs: ``[CompletionOutput]``.
        finished: True.
        error: the exception that rejected this request, or None.
        metrics: ``{"ttft_s": time to first token, "e2e_s": time to last token,
            "tpot_s": mean time per output token after the first}`` in seconds, from the
            request record's timestamps (:func:`trtcore.runtime.request.metrics`; times
            count from the request's arrival); ``{}`` when it produced no token.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    error: Exception | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class StreamOutput:
    """One new token of one request, from :meth:`LLM.stream`.

    Attributes:
        index: the prompt's position in the ``stream`` call.
        token_id: the new token.
        text: the text it adds to the completion (possibly "" while a multi-byte character
            is incomplete); concatenating a request's ``text`` gives its completion's text.
        logprobs: ``{token_id: Logprob}`` (top-k plus the token) when requested, else None.
        finish_reason: None while running; ``"stop"`` or ``"length"`` on the last token;
            ``"error"`` when the request failed (then ``token_id == -1`` and ``error`` is set).
        stop_reason: the stop token id or stop string that ended it, if any.
        error: why the request failed: an :class:`~trtcore.errors.InvalidRequestError`
            (bad prompt, a request the KV cache can never hold) or a
            :class:`~trtcore.errors.GenerationError` (non-finite logits); None otherwise.
    """

    index: int
    token_id: int
    text: str
    logprobs: dict[int, Logprob] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: Exception | None = None


#: default KV pool bytes on the CPU: the pool is touched once when allocated (the block
#: manager cycles through all free blocks, so an untouched pool costs page faults in the first
#: generate calls), and far less than the 2 GiB it once was keeps the peak memory near the weights'.
CPU_KV_CACHE_MEMORY = 256 << 20


def _is_single_prompt(prompts: Any) -> bool:
    """A string, a dict, or a non-empty list of token ids is one prompt; a list of those is many."""
    return isinstance(prompts, (str, dict)) or (
        isinstance(prompts, (list, tuple)) and len(prompts) > 0 and all(isinstance(t, (int, np.integer)) for t in prompts)
    )


class _IncrementalText:
    """Incremental detokenization of one request
    (:class:`~trtcore.runtime.detokenizer.IncrementalDetokenizer`: each token's text delta in
    time independent of the output's length), with its stop strings
    (:class:`~trtcore.runtime.stop.StopStringMatcher`): a match finishes the request in the
    engine (``finish_reason="stop"``, ``stop_reason`` = the string)."""

    def __init__(self, llm: LLM, params: SamplingParams | None = None):
        self.llm = llm
        self.detokenizer = IncrementalDetokenizer(llm.tokenizer)
        self.stop = StopStringMatcher(
            params.stop if params else [], params.min_tokens if params else 0, params.include_stop_str_in_output if params else False
        )

    def output(self, index: int, event: RequestEvent) -> StreamOutput | None:
        """The stream's output for ``event``; None for the engine's finish event after a stop string."""
        if self.stop.stop_reason is not None:  # stopped
            return None
        final = event.finish_reason is not None
        if final:
            error = _request_error(index, event.finish_reason, event.error)
            if error is not None:
                return StreamOutput(index, -1, "", finish_reason="error", error=error)
        detokenizer = self.detokenizer
        delta, stop = self.stop.feed(detokenizer.step(event.token_id, final), len(detokenizer.token_ids), final)
        logprobs = event.logprobs.as_dict() if event.logprobs is not None else None
        if stop is not None:
            self.llm.engine.scheduler.finish(event.request_id, "stop")  # no-op if it just finished
            return StreamOutput(index, event.token_id, delta, logprobs, "stop", stop)
        return StreamOutput(index, event.token_id, delta, logprobs, event.finish_reason, event.stop_reason)


def _index(request_id: Any) -> int:
    """The prompt index a request id of this API stands for (ids are the prompts' indices)."""
    return int(request_id)


def _request_error(index: int, finish_reason: str | None, error: str | None) -> TrtcoreError | None:
    """The exception of a failed request (None for a token or a normal finish): rejected
    (it can never fit the KV cache) or ended in error (non-finite logits)."""
    if finish_reason == "rejected":
        return InvalidRequestError(_for_prompt(index, error))
    if finish_reason == "error":
        return GenerationError(_for_prompt(index, error))
    return None


def _for_prompt(index: int, error: str | None) -> str:
    """``error`` as prompt ``index``'s: the scheduler's ``"request <id>"`` (the id is the
    index) becomes ``"prompt <index>"`` rather than following it (said once)."""
    rest = (error or "").removeprefix(f"request {index!r}")
    return f"prompt {index}{rest}" if error and rest != error else f"prompt {index}: {error}"


class LLM:
    """A model ready to generate.

    Args:
        model: a Hugging Face model folder (``config.json``, ``*.safetensors``, optionally
            ``tokenizer.json`` / ``generation_config.json``); None for the default model
            (SmolLM2-135M-Instruct, see :func:`trtcore.default_model.default_model_dir`).
        backend: ``"reference"`` (the NumPy oracle, on the CPU), ``"tensorrt"``, ``"tensorrt_rtx"`` (a
            TensorRT engine built at start-up) or ``"cuda"`` (trtcore's own engine, :mod:`trtcore.cuda`,
            run through the same TensorRT runtime API); default ``$TRTCORE_BACKEND``, else
            ``tensorrt`` where its runtime starts on a GPU here, else ``cuda`` where a CUDA GPU,
            CuPy and nvmath-python are, else ``reference`` (:func:`trtcore.plan.default_backend`).
        dtype: ``"float32"``, ``"float16"`` or ``"bfloat16"``; default float32 on the
            reference backend, the checkpoint's dtype (float16 for float32 checkpoints)
            on TensorRT. A float16 engine from a bfloat16 checkpoint warns (range 65504).
        max_batch_size: sequences per engine call.
        max_seq_len: most tokens (prompt + generated) per sequence; default and upper
            bound: the model's ``max_position_embeddings``.
        progress: show progress bars while loading and building.
        rope: RoPE implementation, ``"plugin"`` (fused kernel) or ``"layers"``; default:
            the plugin where the backend hosts plugins (reference, tensorrt).
        kv_cache: ``"paged"`` (continuous batching over one block pool, paged attention
            plugin) or ``"contiguous"`` (padded static batches); default paged on every
            backend that hosts plugins (reference, tensorrt, cuda; on a GPU where the paged
            kernels take the model's ``head_dim``, a multiple of 32), else contiguous. On a GPU
            the paged cache runs on the device executor
            (:class:`~trtcore.runtime.device_runner.DeviceRunner`: memory pools allocated once,
            decode steps replayed from CUDA graphs).
        block_size: tokens per KV block (paged).
        max_num_tokens: token budget per step (paged; chunked prefill splits longer prompts).
        kv_cache_memory: bytes for the KV pool (paged); default 256 MiB on the CPU; on a GPU
            what ``gpu_memory_utilization`` leaves.
        gpu_memory_utilization: fraction of the GPU's memory this LLM may use (vLLM's name):
            the paged KV pool gets what is left of it after the weights, activations and
            staging buffers (at most what ``max_batch_size`` full-length sequences need).
        enforce_eager: run every step eagerly (no CUDA graphs for decode steps).
        async_scheduling: on the device executor, schedule and enqueue step n+1 while the
            GPU runs step n (vLLM's ``async_scheduling``; :mod:`trtcore.runtime.generate`);
            False runs one step at a time.
        quantization: the checkpoint's weight quantization (vLLM's argument): None to take
            it from ``config.json``'s ``quantization_config``, else ``"gptq"``, ``"awq"``,
            ``"compressed-tensors"``, ``"gguf"`` or ``"fp8"``, which must be what the config says
            (:func:`trtcore.quant_formats.detect_quantization`); ``"gptq"`` / ``"awq"`` on a
            checkpoint whose config.json has no ``quantization_config`` read AutoGPTQ's
            ``quantize_config.json`` / AutoAWQ's ``quant_config.json``, as vLLM does
            (:func:`trtcore.quant_formats.quantization_config_file`); ``"fp8"`` on a float
            checkpoint quantizes the decoder linears to FP8 at load, as vLLM does (E4M3
            weights with one scale each, activations with dynamic per-tensor scales;
            :mod:`trtcore.fp8`). With ``engine``, None takes the engine's (what ``trtcore
            build --quantization`` built it with). The result is :attr:`quantization`.
        kv_cache_dtype: the KV cache's element type (vLLM's argument and values): ``"auto"``
            (the engine dtype, the default) or ``"fp8"`` / ``"fp8_e4m3"``: the paged pool holds
            E4M3 codes ``e4m3(x / scale)`` (saturating) read back as ``code * scale``, with one
            float32 scale per layer for keys and one for values taken from the checkpoint's
            ``model.layers.N.self_attn.k_scale`` / ``v_scale`` (or ``k_proj.output_scale`` /
            ``v_proj.output_scale``), else 1.0 with a logged warning (vLLM's default and
            warning); the pool then holds twice the tokens in the same memory. Needs the paged
            KV cache and a float16/bfloat16 engine (on the reference backend pass
            ``dtype="bfloat16"``); other values are refused naming the accepted ones
            (:func:`trtcore.plan.normalize_kv_cache_dtype`). Resolved into
            ``plan.kv_cache_dtype`` (``"auto"`` or ``"fp8_e4m3"``).
        attention: contiguous mode's attention: ``"layers"`` (composed standard layers) or
            ``"native"`` (TensorRT's ``IAttention`` + ``IKVCacheUpdateLayer`` over a fixed
            ``[batch, num_kv_heads, max_seq_len, head_dim]`` cache; implies
            ``kv_cache="contiguous"``).
        engine: an engine file written by ``trtcore build`` (or an
            :class:`~trtcore.engine_file.EngineFile`), run without rebuilding; its sidecar is
            checked first (:func:`trtcore.engine_file.load_engine_file`: SHA-256, trtcore and
            TensorRT versions, GPU target, plugin versions, model files). ``model`` then is the
            folder of its config and tokenizer (default: the one the sidecar records); build
            options left at their defaults take the engine's values, others must equal them.
        device: ``"cpu"``, ``"cuda"`` / ``"gpu"`` or None; a check, not a choice
            (:func:`trtcore.runtime.device.resolve_device`): the reference backend runs on the
            CPU (``"cuda"`` is refused, pointing to ``backend="cuda"``), the others on the
            GPU (``"cpu"`` is refused). The result is :attr:`device`.
        tensor_parallel_size: ranks each layer is split over (vLLM's name; Megatron-style:
            column-parallel q/k/v and gate/up, row-parallel o_proj and down_proj with an
            all-reduce, vocabulary-parallel embedding and LM head, KV heads split or
            replicated; :mod:`trtcore.parallel`). Llama family only; must divide
            ``num_attention_heads`` and ``intermediate_size``. Today the ranks are simulated
            in this process on the reference backend
            (:class:`~trtcore.runtime.tensor_parallel.TensorParallelExecutor`), each rank's
            network reading only its slices of the checkpoint; one process per GPU over NCCL
            is not there yet.
        capture: network tensors (layer outputs by name, e.g.
            ``"model.layers.0.mlp.down_proj"``) a GPU backend's engine keeps as extra outputs,
            for :func:`trtcore.calibration.capture_prefill` and ``trtcore check --bisect`` (a
            debugging aid, as TensorRT-LLM's debug outputs; :func:`trtcore.builder.build_engine`).
            Names the network does not define are left out; :attr:`captured` lists those kept.
            Such an LLM runs on host arrays (no device runner, no CUDA graphs) and needs
            ``kv_cache="contiguous"`` there. The reference backend reads any tensor at run time
            and needs no ``capture``.
        cpu_affinity: pin the thread that constructs this LLM, the one expected to step it
            (:meth:`generate`, :meth:`step`; in ``trtcore serve`` the engine process), to CPUs
            once the engine is built: ``"auto"`` (one CPU of those allowed, on the GPU's NUMA
            node where Linux says which), a CPU list such as ``"2,5-7"`` or CPU numbers, or None
            (default) to leave it (:mod:`trtcore.runtime.affinity`: why, and what was measured).
            Threads that thread starts afterwards inherit the set. The result is :attr:`cpu_affinity`.

    The defaults of ``backend`` ... ``attention`` are resolved once into :attr:`plan` by
    :func:`trtcore.plan.resolve_plan`, the same rules as ``trtcore build``'s.

    Attributes:
        device: ``"cpu"`` or ``"cuda"``, where the network executes.
        plan: the resolved :class:`~trtcore.plan.BuildPlan` (``build_config``: the same object).
        bytes_read: per rank, the bytes its network read from the checkpoint per tensor name, for
            the tensors read by slice (:attr:`trtcore.checkpoint.LoadReport.bytes_read`; empty
            lists for an engine file).
        captured: the ``capture`` names the engine keeps as outputs (those the network defines).
        cpu_affinity: the CPUs the constructing thread was pinned to (sorted), or None.

    Raises:
        ConfigError / UnsupportedArchitectureError / CheckpointError: bad model folder.
        UnsupportedQuantizationError: ``quantization_config`` names a format trtcore does not
            read (the message lists the supported ones).
        BackendNotAvailableError: the backend's module is not installed.
        InvalidArgumentError: an unknown ``device``, ``device="cuda"`` with the reference
            backend (use ``backend="cuda"``), or ``device="cpu"`` with a GPU backend; a
            ``quantization`` that is unknown or differs from the config's; a
            build option or backend that differs from the ``engine``'s.
        ConfigError: ``tensor_parallel_size`` does not divide the model's heads or
            ``intermediate_size``; InvalidArgumentError: ``tensor_parallel_size > 1`` on
            another backend than ``reference``, with an engine file, for another family or a
            quantized checkpoint.
        EngineFileError: the engine file or its sidecar is missing, corrupted, or built for
            another trtcore / TensorRT version, GPU target, plugin version or model files
            (the message names the field, the engine's value and the value found).
        InvalidArgumentError: ``capture`` with an engine file, or on a GPU backend with the
            paged KV cache (it runs on the device runner, which returns no captured tensors);
            a ``cpu_affinity`` that is not ``"auto"``, a CPU list or CPU numbers this thread may
            use (checked before the build).
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        backend: str | None = None,
        dtype: str | None = None,
        max_batch_size: int = 8,
        max_seq_len: int | None = None,
        progress: bool = True,
        rope: str | None = None,
        device: str | None = None,
        kv_cache: str | None = None,
        block_size: int = 16,
        max_num_tokens: int = 2048,
        kv_cache_memory: int | None = None,
        attention: str = "layers",
        gpu_memory_utilization: float = 0.9,
        enforce_eager: bool = False,
        async_scheduling: bool = True,
        engine: str | os.PathLike[str] | EngineFile | None = None,
        quantization: str | None = None,
        tensor_parallel_size: int = 1,
        capture: Sequence[str] = (),
        cpu_affinity: str | Sequence[int] | None = None,
        kv_cache_dtype: str = "auto",
    ):
        if cpu_affinity is not None:  # a bad value fails before the build
            resolve_cpus(cpu_affinity)
        #: the engine file this LLM runs (``engine=``), checked on load; None: built at start-up
        self.engine_file: EngineFile | None = None
        if engine is not None:
            self.engine_file = engine if isinstance(engine, EngineFile) else load_engine_file(engine, model)
            model = self.engine_file.model_dir
        if model is None:
            from .default_model import default_model_dir

            model = default_model_dir(progress=progress)
        if not isinstance(model, (str, os.PathLike)):
            raise InvalidArgumentError(f"model must be a model folder (a str or os.PathLike), got {model!r} ({type(model).__name__})")
        self.model_dir = Path(model)
        if self.engine_file is not None:  # the engine's quantization, unless the caller names another
            quantization = self.engine_file.quantization_for(quantization)
        self.config: ModelConfig
        self.config, scheme = resolve_quantization(self.model_dir, load_config(self.model_dir), quantization)
        #: the checkpoint's quantization method (``"gptq"`` ...), or None
        self.quantization: str | None = scheme.method if scheme else None
        self.generation_config: GenerationConfig = load_generation_config(self.model_dir, self.config)
        options = BuildConfig(
            dtype=dtype,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            rope=rope,
            kv_cache=kv_cache,
            block_size=block_size,
            max_num_tokens=max_num_tokens,
            attention=attention,
            kv_cache_dtype=kv_cache_dtype,
        )
        if self.engine_file is not None:  # the engine's plan; options that contradict it are refused
            self.plan: BuildPlan = self.engine_file.plan_for(options, backend)
            self.device = resolve_device(self.plan.backend, device)
        else:
            backend_name = normalize_backend(backend) if backend else default_backend()
            self.device = resolve_device(backend_name, device)  # before loading the backend's module
            #: every build choice, resolved once (:func:`trtcore.plan.resolve_plan`)
            self.plan = resolve_plan(self.config, options, backend_name)
        self.backend = self.plan.backend
        self.build_config = self.plan  # its former name
        #: ranks each layer is split over (simulated in this process, reference backend)
        self.tensor_parallel_size = self._check_tensor_parallel(tensor_parallel_size)
        self.tokenizer = _load_tokenizer(self.model_dir)
        self.kv_cache = self.plan.kv_cache
        #: the network's KV cache contract (:func:`trtcore.kv_modes.kv_mode` of the plan)
        tp = self.tensor_parallel_size
        self.kv_mode = kv_mode(self.plan, self.config, tp * local_kv_heads(self.config.num_key_value_heads, tp))  # every rank's KV heads
        #: the paged cache on a GPU backend runs on the device executor (device-resident pool,
        #: CUDA graphs); the reference backend and contiguous caches on host arrays
        self.device_executor = self.backend != "reference" and self.kv_cache == "paged"
        self._capture = self._check_capture(capture)
        self.captured: tuple[str, ...] = ()
        self._runner_options: dict[str, Any] = {
            "gpu_memory_utilization": float(gpu_memory_utilization),
            "kv_cache_memory": kv_cache_memory,
            "enforce_eager": bool(enforce_eager),
        }
        self.bytes_read: list[dict[str, int]] = []
        self.executor = self._make_executor(progress)
        self.cpu_affinity: tuple[int, ...] | None = pin_thread(cpu_affinity) if cpu_affinity is not None else None
        self._next_request_id = 0
        self._texts: dict[int, _IncrementalText] = {}
        if self.device_executor:
            from .runtime.generate import make_device_engine

            #: the step loop (:class:`~trtcore.runtime.generate.EngineCore`) over the device executor
            self.engine = make_device_engine(self.executor, self.kv_mode, async_scheduling=bool(async_scheduling))
            return
        num_blocks = None
        if self.kv_cache == "paged":
            from .runtime.kv_cache import KVCacheSpec

            c = self.config
            spec = KVCacheSpec(c.num_hidden_layers, self.kv_mode.num_kv_heads, c.head_dim, self.plan.block_size, self.kv_mode.pool_dtype)
            num_blocks = self._num_kv_blocks(spec, kv_cache_memory)
        #: the step loop (:class:`~trtcore.runtime.generate.EngineCore`): its scheduler and KV cache
        self.engine = make_engine(self.executor, self.kv_mode, num_blocks)

    def _num_kv_blocks(self, spec: Any, budget: int | None) -> int:
        """Pool size: blocks for ``max_batch_size`` full-length sequences, capped by the byte
        budget ``kv_cache_memory`` (default: :data:`CPU_KV_CACHE_MEMORY` on the CPU, 40% of
        the free GPU memory)."""
        bc = self.build_config
        wanted = bc.max_batch_size * (-(-bc.max_seq_len // spec.block_size))
        if budget is None:
            if self.device == "cuda":
                from . import gpu

                free, _ = gpu.call("cudaMemGetInfo", gpu.cuda_bindings("runtime").cudaMemGetInfo)
                budget = int(0.4 * free)
            else:
                budget = CPU_KV_CACHE_MEMORY
        return max(1, min(wanted, spec.num_blocks_for_budget(budget), bc.max_num_blocks))

    # construction -----------------------------------------------------------------------
    def _check_capture(self, capture: Any) -> tuple[str, ...]:
        names = (capture,) if isinstance(capture, str) else tuple(capture)
        if not all(isinstance(n, str) for n in names):
            raise InvalidArgumentError(f"capture must be tensor names (str), got {capture!r}")
        if names and self.engine_file is not None:
            raise InvalidArgumentError("capture needs a build (the tensors to keep are chosen when the engine is built), not an engine file")
        if names and self.device_executor:
            raise InvalidArgumentError(
                f"capture on backend {self.backend!r} needs kv_cache='contiguous' (the paged cache runs on the device runner, which returns no captured tensors)"
            )
        return names

    def _check_tensor_parallel(self, tp_size: Any) -> int:
        check_tensor_parallel_family(self.config, tp_size)
        if tp_size > 1 and (self.backend != "reference" or self.engine_file is not None):
            raise InvalidArgumentError(
                f"tensor_parallel_size {tp_size} runs its ranks simulated in one process on the reference backend only "
                f"(got backend {self.backend!r}{' and an engine file' if self.engine_file is not None else ''}); "
                "one process per GPU over NCCL is not there yet"
            )
        return int(tp_size)

    def _tensor_parallel_executor(self, trt: Any, weights: Checkpoint) -> Executor:
        """The rank networks, each from its slices of ``weights``, as one executor."""
        from .runtime.reference_executor import ReferenceExecutor
        from .runtime.tensor_parallel import TensorParallelExecutor, new_group_name

        n, group = self.tensor_parallel_size, new_group_name()
        ranks: list[Executor] = []
        for r in range(n):
            net = define_network(trt, self.config, weights, self.plan, Mapping(n, r, group))
            self.bytes_read.append(net.bytes_read)
            ranks.append(ReferenceExecutor(build_reference_engine(net)))
        return TensorParallelExecutor(ranks, group, self.kv_mode, local_kv_heads(self.config.num_key_value_heads, n))

    def _make_executor(self, progress: bool) -> Executor:
        from tqdm.auto import tqdm

        trt = load_trt(self.backend)
        if self.backend != "reference":
            from .runtime.trt_executor import require_gpu

            advice = self.engine_file.cpu_advice() if self.engine_file is not None else None  # no backend to switch to
            require_gpu(backend=self.backend, purpose=advice)  # before a long engine build
        if self.engine_file is not None:
            return self._engine_executor(trt, self.engine_file.serialized)
        with Checkpoint(self.model_dir) as weights, tqdm(total=2, desc="build", disable=not progress, leave=False) as bar:
            bar.set_postfix_str(f"defining {self.config.architecture} network ({self.backend})")
            if self.tensor_parallel_size > 1:
                return self._tensor_parallel_executor(trt, weights)
            net = define_network(trt, self.config, weights, self.plan)
            self.bytes_read = [net.bytes_read]
            bar.update()
            if self._capture:
                present = tensor_names(net.network)
                self.captured = tuple(n for n in dict.fromkeys(self._capture) if n in present)
            if self.backend == "reference":
                from .runtime.reference_executor import ReferenceExecutor

                executor: Executor = ReferenceExecutor(build_reference_engine(net))
            else:
                bar.set_postfix_str("building TensorRT engine")
                blob = build_engine(net, capture=self.captured)
                bar.set_postfix_str("allocating memory pools, capturing CUDA graphs" if self.device_executor else "loading the engine")
                executor = self._engine_executor(trt, blob)
            bar.update()
        return executor

    def _engine_executor(self, trt: Any, serialized: bytes) -> Executor:
        """The executor of a serialized engine (module ``trt``): the device executor for a
        paged cache on a GPU backend, else host arrays (:func:`_deserialized_executor`)."""
        if self.device_executor:
            from .runtime.trt_executor import open_device_runner

            return open_device_runner(trt, serialized, self.kv_mode, **self._runner_options)  # type: ignore[no-any-return]
        return _deserialized_executor(trt, self.backend, serialized)

    def close(self) -> None:
        """Release the executor's device memory, streams and graphs (safe to call twice);
        the LLM cannot generate afterwards."""
        self.executor.close()

    # text ---------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (with the tokenizer's own special-token rules; without the
        special tokens its post-processor adds, such as a BOS, for ``add_special_tokens=False``:
        the encoding of a rendered chat template, :func:`encode_text`).

        Raises:
            InvalidRequestError: the model folder has no ``tokenizer.json``.
        """
        return encode_text(self.tokenizer, self.model_dir, text, add_special_tokens)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``, special tokens skipped ("" without a tokenizer)."""
        if self.tokenizer is None:
            return ""
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render ``messages`` (``[{"role": ..., "content": ...}]``) with the model's chat template.

        The template is the Jinja2 ``chat_template`` of ``tokenizer_config.json``, rendered
        as transformers renders it (``messages``, ``add_generation_prompt``, special tokens).

        Raises:
            InvalidRequestError: the model has no chat template.
        """
        from .chat import render_chat_template

        return render_chat_template(self.model_dir, messages, add_generation_prompt)

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Complete one conversation (``[{"role": ..., "content": ...}]``) or a list of them
        (vLLM's ``LLM.chat``): each rendered with the model's chat template
        (:meth:`apply_chat_template`) and encoded without the tokenizer's added special tokens
        (the template writes its own BOS, as transformers' ``apply_chat_template(tokenize=True)``),
        then :meth:`generate`.

        Returns:
            One :class:`RequestOutput` per conversation (``prompt`` is the rendered text).

        Raises:
            InvalidRequestError: no chat template or tokenizer, the template raised, or
                ``messages`` is not a conversation or a list of them; as :meth:`generate`.
        """
        single = bool(messages) and isinstance(messages[0], dict)
        conversations = [messages] if single else list(messages)
        if not conversations or not all(isinstance(c, list) and c and all(isinstance(m, dict) for m in c) for c in conversations):
            raise InvalidRequestError(f"messages must be a conversation ([{{'role': ..., 'content': ...}}, ...]) or a list of them, got {messages!r}")
        texts = [self.apply_chat_template(c, add_generation_prompt) for c in conversations]  # type: ignore[arg-type]
        prompts = [{"prompt_token_ids": self.encode(t, add_special_tokens=False)} for t in texts]
        outputs = self.generate(prompts[0] if single else prompts, sampling_params, use_tqdm=use_tqdm)
        for out, text in zip(outputs, texts):
            out.prompt = text
        return outputs

    # generation ---------------------------------------------------------------------------
    def _request(self, index: int, prompt: Any, params: SamplingParams) -> tuple[Request, str | None]:
        text: str | None = None
        if isinstance(prompt, dict):
            if "prompt_token_ids" not in prompt and "prompt" not in prompt:
                raise InvalidRequestError(f"prompt {index} is a dict without 'prompt_token_ids' or 'prompt', got keys {sorted(map(str, prompt))}")
            prompt = prompt.get("prompt_token_ids", prompt.get("prompt"))
        if prompt is None:
            raise InvalidRequestError(f"prompt {index} is None; expected a string or a list of token ids")
        if isinstance(prompt, str):
            text = prompt
            ids = self.encode(prompt)
        elif isinstance(prompt, (list, tuple, np.ndarray)) and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in prompt):
            ids = [int(t) for t in prompt]
        elif isinstance(prompt, (list, tuple, np.ndarray)):
            bad = next(t for t in prompt if isinstance(t, bool) or not isinstance(t, (int, np.integer)))
            raise InvalidRequestError(f"prompt {index}: token ids must be integers, got {bad!r} ({type(bad).__name__})")
        else:
            raise InvalidRequestError(f"prompt {index} must be a string or a list of token ids, got {type(prompt).__name__}")
        if not ids:
            raise InvalidRequestError(f"prompt {index} is empty; give at least one token")
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise InvalidRequestError(f"prompt {index} has token ids outside [0, {self.config.vocab_size}): {bad[:5]}")
        bad = [t for t in params.stop_token_ids or [] if t >= self.config.vocab_size]
        if bad:  # never sampled, so never a stop; past int64 it broke the sampler's ban list for every request
            raise InvalidRequestError(f"request {index}: stop_token_ids has ids outside the vocabulary [0, {self.config.vocab_size}): {bad[:5]}")
        limit = self.build_config.max_seq_len
        if len(ids) >= limit:
            raise InvalidRequestError(
                f"prompt {index} has {len(ids)} tokens; at most {limit - 1} fit "
                f"(max_seq_len={limit}, max_position_embeddings={self.config.max_position_embeddings})"
            )
        eos = frozenset(self.generation_config.eos_token_id or self.config.eos_token_id)
        return Request(index, ids, params, eos, max_seq_len=limit), text

    def stream(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[StreamOutput]:
        """Like :meth:`generate`, but yields each request's new tokens as they are made.

        Yields:
            :class:`StreamOutput` per generated token: the prompt's index, the token id, the
            text it adds (detokenized incrementally: a token that ends inside a multi-byte
            character adds "" and its bytes come with the next one), its log-probabilities
            when requested, and the finish reason on the last one. A failed request of a
            list (invalid prompt, too large for the KV cache, non-finite logits) yields one
            output with ``finish_reason="error"`` and ``error``; the others run on, as in
            :meth:`generate`.

        Raises:
            InvalidRequestError: a single (unlisted) invalid prompt (before anything runs)
                or one the KV cache can never hold; parameters that do not match the prompts.
            GenerationError: a single prompt whose logits became non-finite.
        """
        single = _is_single_prompt(prompts)
        items, params = self._normalize(prompts, sampling_params)
        requests: list[Request] = []
        for i, (p, sp) in enumerate(zip(items, params)):
            try:
                requests.append(self._request(i, p, sp)[0])
            except TrtcoreError as exc:
                if single:
                    raise
                yield StreamOutput(i, -1, "", finish_reason="error", error=exc)
        texts: dict[int, _IncrementalText] = {}
        for event in self.engine.generate(requests):
            i = _index(event.request_id)
            out = texts.setdefault(i, _IncrementalText(self, params[i])).output(i, event)
            if out is None:
                continue
            if out.error is not None and single:
                raise out.error
            yield out

    # online serving (paged KV cache) -------------------------------------------------------------
    def add_request(self, prompt: Any, sampling_params: SamplingParams | None = None) -> int:
        """Queue one request for :meth:`step` (vLLM's ``LLMEngine.add_request``); it joins
        the running batch at the next step with room (continuous batching).

        Returns:
            The request id that :meth:`step`'s outputs carry as ``index``.

        Raises:
            InvalidRequestError: the prompt or parameters are invalid, the request can never
                fit the KV pool, or the LLM does not use the paged KV cache.
        """
        if self.kv_cache != "paged":
            raise InvalidRequestError("add_request()/step() need kv_cache='paged' (continuous batching)")
        params = sampling_params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"sampling_params must be SamplingParams, got {type(params).__name__}")
        rid = self._next_request_id
        req, _ = self._request(rid, prompt, params)
        self.engine.add_request(req)
        self._next_request_id += 1
        if req.error is not None:  # the scheduler's reason names the request
            raise InvalidRequestError(req.error)
        self._texts[rid] = _IncrementalText(self, params)
        return rid

    def step(self) -> list[StreamOutput]:
        """Run one engine step for the requests added with :meth:`add_request`; return
        their new tokens (``index`` = request id; a request that failed gives one output
        with ``finish_reason="error"`` and ``error``)."""
        outs = []
        texts = self._texts
        for event in self.engine.step():
            rid = int(event.request_id)  # _index
            text = texts.get(rid)
            if text is None:
                continue  # rejected: add_request raised already
            out = text.output(rid, event)
            if out is not None:
                outs.append(out)
            if out is None or out.finish_reason is not None:
                del texts[rid]
        return outs

    def abort_request(self, request_id: int) -> bool:
        """Finish a request added with :meth:`add_request` now (vLLM's ``abort_request``):
        it leaves the queues, its KV blocks are freed at once, and :meth:`step` reports
        nothing more for it.

        Returns:
            True if it was live; False if it had finished already or the id is unknown.
        """
        self._texts.pop(request_id, None)
        return self.kv_cache == "paged" and self.engine.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        """Whether requests added with :meth:`add_request` still wait or run."""
        return self.kv_cache == "paged" and self.engine.has_unfinished_requests()

    def _normalize(self, prompts: Any, sampling_params: Any) -> tuple[list[Any], list[SamplingParams]]:
        single = _is_single_prompt(prompts)
        if not single and not isinstance(prompts, (list, tuple)):
            raise InvalidRequestError(
                f"prompts must be a string, a list of token ids, a dict with 'prompt_token_ids', or a list of those; got {type(prompts).__name__}"
            )
        items = [prompts] if single else list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(items)
        elif not isinstance(sampling_params, (list, tuple)):  # a dict's keys, a string's characters, an int
            raise InvalidRequestError(
                f"sampling_params must be SamplingParams or a list of them (one per prompt), got {type(sampling_params).__name__}"
            )
        else:
            params = list(sampling_params)
            if len(params) != len(items):
                raise InvalidRequestError(f"got {len(params)} SamplingParams for {len(items)} prompts")
        for p in params:
            if not isinstance(p, SamplingParams):
                raise InvalidRequestError(f"sampling_params must be SamplingParams, got {type(p).__name__}")
        return items, params

    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Complete every prompt.

        Args:
            prompts: a string, a list of token ids, ``{"prompt_token_ids": [...]}``, or a
                list of those.
            sampling_params: one for all prompts or one per prompt (default
                ``SamplingParams()``, vLLM's defaults: temperature 1, 16 tokens).
            use_tqdm: a progress bar of the finished prompts on standard error (vLLM's
                ``use_tqdm``), shown only on a terminal (tqdm's ``disable=None``); False: none.

        Returns:
            One :class:`RequestOutput` per prompt, in order.

        Raises:
            InvalidRequestError: a single (unlisted) prompt is invalid or can never fit the
                KV cache, or the parameters do not match the prompts. Failed requests
                inside a list are reported in their output's ``error`` instead.
            GenerationError: a single prompt whose logits became non-finite.
        """
        single = _is_single_prompt(prompts)
        items, params = self._normalize(prompts, sampling_params)
        outputs: list[RequestOutput] = []
        requests: list[Request] = []
        for i, (p, sp) in enumerate(zip(items, params)):
            try:
                req, text = self._request(i, p, sp)
            except TrtcoreError as exc:
                if single:
                    raise
                outputs.append(RequestOutput(str(i), p if isinstance(p, str) else None, [], [CompletionOutput(finish_reason="error")], error=exc))
                continue
            requests.append(req)
            outputs.append(RequestOutput(str(i), text, req.prompt_token_ids, [CompletionOutput(logprobs=[] if sp.logprobs is not None else None)]))
        stops = {i: _IncrementalText(self, sp) for i, sp in enumerate(params) if sp.stop}
        from tqdm.auto import tqdm

        with tqdm(total=len(items), desc="Processed prompts", unit="prompt", disable=None if use_tqdm else True) as bar:
            bar.update(len(items) - len(requests))  # refused before they ran
            done: set[Any] = set()
            for event in self.engine.generate(requests):
                error = _request_error(_index(event.request_id), event.finish_reason, event.error)
                if error is not None and single:
                    raise error
                i = _index(event.request_id)
                if i in stops:
                    stops[i].output(i, event)  # a stop string finishes the request
                if event.finish_reason is not None and event.request_id not in done:
                    done.add(event.request_id)
                    bar.update(1)
        for req in requests:  # the records hold each request's result
            out = outputs[_index(req.request_id)]
            comp = out.outputs[0]
            comp.token_ids = list(req.output_token_ids)
            out.error = _request_error(_index(req.request_id), req.finish_reason, req.error)
            comp.finish_reason = "error" if out.error is not None else req.finish_reason
            comp.stop_reason = req.stop_reason
            matched = stops[_index(req.request_id)].stop if _index(req.request_id) in stops else None
            if matched is not None and matched.stopped and out.error is None:
                comp.finish_reason, comp.stop_reason = "stop", matched.stop_reason
                comp.text = matched.shown  # vLLM: the stop string is not in the output
            if comp.logprobs is not None:
                comp.logprobs = [lp.as_dict() for lp in req.logprobs if lp is not None]
                if comp.logprobs:
                    comp.cumulative_logprob = float(sum(lp.logprob for lp in req.logprobs if lp is not None))
            out.metrics = metrics(req)
        for out in outputs:
            if out.error is None:
                comp = out.outputs[0]
                if not isinstance(comp.stop_reason, str):  # a stop string set the text already
                    comp.text = self.decode(comp.token_ids)
                if comp.logprobs and self.tokenizer is not None:
                    for d in comp.logprobs:
                        for tok, lp in d.items():
                            lp.decoded_token = token_text(self.tokenizer, tok)  # " in", not the vocabulary's "Ġin"
        return outputs


def _deserialized_executor(trt: Any, backend: str, serialized: bytes) -> Executor:
    """The executor of a serialized engine of ``backend`` (module ``trt``): no build."""
    if backend == "reference":
        from .runtime.reference_executor import ReferenceExecutor

        return ReferenceExecutor(trt.Runtime().deserialize_cuda_engine(serialized))
    from .runtime.trt_executor import TensorRTExecutor

    return TensorRTExecutor(trt, serialized)


def encode_text(tokenizer: Any, model_dir: str | os.PathLike[str], text: str, add_special_tokens: bool = True) -> list[int]:
    """Token ids of ``text`` with ``tokenizer`` (a :class:`tokenizers.Tokenizer`, or None for a
    model folder ``model_dir`` without ``tokenizer.json``); :meth:`LLM.encode`, and the server's
    (:class:`trtcore.serve.core.ServedModel`). ``add_special_tokens=False`` leaves out what the
    tokenizer's post-processor adds (a BOS): a rendered chat template holds its own, as
    transformers' ``apply_chat_template(tokenize=True)`` and vLLM's chat completions encode it.

    Raises:
        InvalidRequestError: ``tokenizer`` is None.
    """
    if tokenizer is None:
        raise InvalidRequestError(
            f"{model_dir} has no tokenizer.json, so a text cannot be tokenized; give token ids instead (LLM.generate takes prompts as lists of ids)"
        )
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)


def _load_tokenizer(model_dir: Path) -> Any:
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))
