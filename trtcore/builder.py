"""From a checkpoint to a TensorRT network, and from a network to a serialized engine.

One code path for every backend: :func:`define_network` builds the model's
``INetworkDefinition`` with whichever TensorRT module it is given (``tensorrt``,
``tensorrt_rtx`` or :mod:`trtcore.reference`), and :func:`build_engine` hands it to that
module's ``Builder.build_serialized_network`` with one optimization profile. Engines are
strongly typed (TensorRT 10.12+ / 11); TF32 is cleared for float32 engines so that float32
means float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import ops
from .checkpoint import LoadReport, kv_cache_scales
from .config import ModelConfig
from .engine_file import save_engine, sidecar
from .errors import EngineBuildError, InvalidArgumentError
from .families import family_of
from .fileio import check_writable, write_atomic
from .kv_modes import Profile, kv_mode
from .log import trt_logger
from .models import family_for
from .parallel import Mapping, check_tensor_parallel, local_kv_heads
from .plan import DTYPES, BuildConfig, BuildPlan, resolve_plan
from .plan import implementations as plan_implementations
from .quant_formats import check_kv_cache_scheme, check_quantized_load, check_unquantized, quantized_weights
from .trt import backend_name

__all__ = [
    "DTYPES",
    "BuildConfig",
    "BuildPlan",
    "DefinedNetwork",
    "build_engine",
    "build_reference_engine",
    "check_tensor_parallel_family",
    "check_writable",
    "define_network",
    "implementations",
    "profile_shapes",
    "save_engine",
    "tensor_names",
    "sidecar",
    "trt_logger",
    "write_atomic",
]


def profile_shapes(config: ModelConfig, plan: BuildPlan | BuildConfig, trt: Any = None) -> dict[str, Profile]:
    """min / opt / max shape of every network input (one optimization profile) of
    ``plan``'s KV cache mode (:meth:`trtcore.kv_modes.KVMode.profile_shapes`); a
    :class:`BuildConfig` is resolved first (:func:`resolve_plan`, on ``trt``'s backend)."""
    return kv_mode(_as_plan(config, plan, trt), config).profile_shapes()


def _as_plan(config: ModelConfig, plan: BuildPlan | BuildConfig, trt: Any) -> BuildPlan:
    if isinstance(plan, BuildPlan):
        return plan
    # options handed to the builder directly are taken literally (max_seq_len not capped), as before plans
    return resolve_plan(config, plan, backend_name(trt) if trt is not None else "reference", trt=trt, fit_model=False)


@dataclass
class DefinedNetwork:
    """A network defined from a checkpoint: its builder, network and graph (keep all alive),
    and the load report of the weights it read."""

    trt: Any
    builder: Any
    network: Any
    graph: ops.Graph
    config: ModelConfig
    plan: BuildPlan
    report: LoadReport | None = None

    @property
    def bytes_read(self) -> dict[str, int]:
        """Bytes read from the checkpoint per tensor name for the tensors read by slice
        (:attr:`trtcore.checkpoint.LoadReport.bytes_read`; a tensor-parallel rank's slices)."""
        return dict(self.report.bytes_read) if self.report is not None else {}

    @property
    def build_config(self) -> BuildPlan:
        """The plan (its former name)."""
        return self.plan


def implementations(trt: Any, build_config: BuildConfig) -> dict[str, str]:
    """The implementation of each fused op for this module and build config
    (:attr:`BuildPlan.implementations` of :func:`resolve_plan` on ``trt``'s backend).

    Raises:
        InvalidArgumentError: a plugin was asked for on a module that cannot host plugins.
    """
    return plan_implementations(build_config, backend_name(trt), trt)


def define_network(trt: Any, config: ModelConfig, weights: Any, plan: BuildPlan | BuildConfig, mapping: Mapping | None = None) -> DefinedNetwork:
    """Define ``config``'s model in a strongly typed network of the module ``trt``.

    Args:
        trt: the TensorRT module (see :func:`trtcore.trt.load_trt`).
        config: the model config.
        weights: a :class:`trtcore.checkpoint.Checkpoint` (or anything with ``get(name, shape=)``).
        plan: the resolved plan, or user options (resolved here with :func:`resolve_plan`
            for ``trt``'s backend).
        mapping: the tensor-parallel rank to build (:class:`trtcore.parallel.Mapping`;
            default: the whole model on one rank). A rank's network holds its slices of the
            weights (read alone from the checkpoint), its KV heads in the cache I/O, and the
            collectives; families whose module sets ``TENSOR_PARALLEL = True`` build ranks.

    Raises:
        UnsupportedArchitectureError: the architecture has no model family.
        MissingTensorError: tensors the network needs are absent (all of them listed).
        TensorShapeError: a checkpoint tensor does not fit the config.
        UnsupportedQuantizationError: the tensors and the config disagree on quantization: quantized
            linears under a config that declares none (:func:`trtcore.quant_formats.check_unquantized`),
            or a declared format no linear is stored in (:func:`trtcore.quant_formats.check_quantized_load`).
        InvalidArgumentError: the plan does not fit ``trt`` (a plugin it cannot host); a
            tensor-parallel ``mapping`` for a family that cannot build ranks, or for a
            quantized checkpoint.
        ConfigError: ``mapping.tp_size`` does not divide the model's heads or
            ``intermediate_size`` (:func:`trtcore.parallel.check_tensor_parallel`).
        CheckpointError: with the FP8 KV cache (``plan.kv_cache_dtype == "fp8_e4m3"``), a KV
            cache scale tensor that is not one finite float32 normal number > 0, or two that give one
            layer's scale different values (:func:`trtcore.checkpoint.kv_cache_scales`, which
            also logs a warning when the checkpoint has none: every layer then uses 1.0).

    Warns:
        UserWarning: checkpoint tensors no layer reads (listed by name; rotary ``inv_freq``
            buffers excepted), as transformers' load report.
    """
    plan = _as_plan(config, plan, trt)
    family = family_for(config.architecture)
    mapping = mapping or Mapping()
    if mapping.parallel:
        check_tensor_parallel_family(config, mapping.tp_size)
    builder = trt.Builder(trt_logger(trt))
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    network.name = config.architecture
    mode = kv_mode(plan, config, local_kv_heads(config.num_key_value_heads, mapping.tp_size))
    graph = ops.Graph(trt, network, plan.dtype, plan.implementations, plan.block_size, plan.max_seq_len, kv_mode=mode, mapping=mapping)
    fam = family_of(config.model_type)
    report = LoadReport(quantized_weights(weights, config.quantization_config, packed_modules=fam.packed_modules), fam.is_ignored)
    if plan.kv_fp8:  # the FP8 KV cache's per-layer scales (1.0 where the checkpoint has none, with a warning)
        check_kv_cache_scheme(config.quantization_config)
        graph.kv_scales = kv_cache_scales(report, config.num_hidden_layers)
    family.build(graph, config, report)
    check_unquantized(report, config.quantization_config)  # before the missing tensors: a lost quantization_config is the cause
    report.check(f"the {config.architecture} network")
    check_quantized_load(report.checkpoint, config.architecture)
    return DefinedNetwork(trt, builder, network, graph, config, plan, report)


def check_tensor_parallel_family(config: ModelConfig, tp_size: int) -> None:
    """Check that ``config``'s model can be split over ``tp_size`` ranks: its family builds
    ranks (``TENSOR_PARALLEL`` in its module), its checkpoint is not quantized, and
    ``tp_size`` divides its heads and ``intermediate_size``.

    Raises:
        InvalidArgumentError: a family without tensor parallelism, a quantized checkpoint, or
            a bad ``tp_size``.
        ConfigError: ``tp_size`` does not fit the model (:func:`trtcore.parallel.check_tensor_parallel`).
    """
    check_tensor_parallel(config, tp_size)
    if tp_size == 1:
        return
    if not getattr(family_for(config.architecture), "TENSOR_PARALLEL", False):
        raise InvalidArgumentError(
            f"tensor_parallel_size {tp_size}: the {config.architecture} family does not support tensor parallelism yet "
            "(the Llama family does: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM); use tensor_parallel_size=1"
        )
    if config.quantization_config:
        raise InvalidArgumentError(f"tensor_parallel_size {tp_size}: quantized checkpoints are not split over ranks yet; use tensor_parallel_size=1")


def _profile(d: DefinedNetwork) -> dict[str, Profile]:
    assert d.graph.kv_mode is not None
    return d.graph.kv_mode.profile_shapes()


def _builder_config(d: DefinedNetwork, compute_capability: str | None) -> Any:
    trt = d.trt
    cfg = d.builder.create_builder_config()
    profile = d.builder.create_optimization_profile()
    for name, (lo, opt, hi) in _profile(d).items():
        profile.set_shape(name, lo, opt, hi)
    cfg.add_optimization_profile(profile)
    if d.plan.dtype == "float32" and hasattr(trt, "BuilderFlag") and hasattr(trt.BuilderFlag, "TF32"):
        cfg.clear_flag(trt.BuilderFlag.TF32)
    if compute_capability is not None:
        if not hasattr(trt, "ComputeCapability"):
            raise InvalidArgumentError(
                f"compute capability {compute_capability!r} can only be chosen with tensorrt_rtx; TensorRT builds for the GPU it runs on"
            )
        key = "SM" + compute_capability.lower().removeprefix("sm").removeprefix("_")
        if key not in trt.ComputeCapability.__members__:
            choices = [m.lower() for m in trt.ComputeCapability.__members__ if m.startswith("SM")]
            raise InvalidArgumentError(f"compute capability {compute_capability!r} is not supported; expected one of {choices}")
        cfg.num_compute_capabilities = 1
        cfg.set_compute_capability(trt.ComputeCapability.__members__[key], 0)
    return cfg


def tensor_names(network: Any) -> set[str]:
    """The name of every layer output of ``network`` (an ``INetworkDefinition`` of any
    backend's module): what ``capture=`` can name."""
    return {network.get_layer(k).get_output(j).name for k in range(network.num_layers) for j in range(network.get_layer(k).num_outputs)}


def _mark_captured(d: DefinedNetwork, capture: Sequence[str]) -> None:
    """Mark the tensors ``capture`` as network outputs (TensorRT's way of keeping an
    intermediate tensor: ``INetworkDefinition.mark_output``)."""
    wanted = set(capture)
    for k in range(d.network.num_layers):
        layer = d.network.get_layer(k)
        for j in range(layer.num_outputs):
            t = layer.get_output(j)
            if t.name in wanted and not t.is_network_output:
                d.network.mark_output(t)


def build_engine(d: DefinedNetwork, compute_capability: str | None = None, capture: Sequence[str] = ()) -> bytes:
    """Build ``d.network`` into a serialized engine with one optimization profile.

    Args:
        d: from :func:`define_network`.
        compute_capability: ``"sm89"`` etc., tensorrt_rtx only (ahead-of-time, no GPU needed).
        capture: layer outputs (tensor names, :func:`tensor_names`) the engine returns as
            extra outputs, a debugging aid (``trtcore check --bisect``): the cuda backend
            keeps them through its fusions (:func:`trtcore.cuda.builder.keep_captured`: a fused
            kernel writes the value as one more output); TensorRT marks them as network outputs
            (``INetworkDefinition.mark_output``, which may stop some of its fusions there).

    Raises:
        EngineBuildError: the TensorRT builder returned no engine (its log says why).
        InvalidArgumentError: a compute capability was given where it cannot be used; a
            ``capture`` name that is no layer output of the network.
    """
    cfg = _builder_config(d, compute_capability)
    logger = trt_logger(d.trt)
    errors = getattr(logger, "errors", [])
    seen = len(errors)
    extra: dict[str, Any] = {}
    if capture:
        missing = sorted(set(capture) - tensor_names(d.network))
        if missing:
            raise InvalidArgumentError(
                f"capture: no layer output named {missing[:4]}{' ...' if len(missing) > 4 else ''} in the {d.config.architecture} network"
            )
        if backend_name(d.trt) == "cuda":
            extra["capture"] = list(capture)
        else:
            _mark_captured(d, capture)
    serialized = d.builder.build_serialized_network(d.network, cfg, **extra)
    if serialized is None:
        why = "; ".join(errors[seen:]) or "see TensorRT's log above"
        raise EngineBuildError(f"TensorRT failed to build the {d.config.architecture} network: {why}")
    return bytes(memoryview(serialized))


def build_reference_engine(d: DefinedNetwork) -> Any:
    """Validate ``d`` (a :mod:`trtcore.reference` network) with the same builder config and
    optimization profile a TensorRT build gets, without serializing; returns its ``ICudaEngine``."""
    return d.builder.build_engine(d.network, _builder_config(d, None))
